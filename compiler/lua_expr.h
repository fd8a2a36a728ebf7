/* The `kpt` module Lua pattern scripts see: symbolic values that record what a script computes
 * as IR (tracing), aux tensor handles, the expression functions, kpt.pattern and kpt.runtime.
 * docs/lua.md is the user's reference; this file's .c is the executable one. */
#ifndef KPT_COMPILER_LUA_EXPR_H
#define KPT_COMPILER_LUA_EXPR_H

#include <lua.h>

#include "compiler/lua_sandbox.h"
#include "ir/pattern.h"

#define KPT_LUA_MAX_NODES (1u << 16) /* IR nodes a script may build */

/* A pattern script's declaration, made by kpt.pattern{...}. Its Lua values live in the
 * userdata's user values (SPEC_PARAMS, SPEC_SCORE, SPEC_MASK, SPEC_FILLS). */
typedef struct kpt_lua_spec {
    int line; /* of the kpt.pattern call */
    char name[64];
    int naux;
    kpt_aux_decl aux[KPT_MAX_AUX]; /* sorted by name */
} kpt_lua_spec;

enum { SPEC_PARAMS = 1, SPEC_SCORE, SPEC_MASK, SPEC_FILLS, SPEC_NVALUES = SPEC_FILLS };

/* What the module needs from its host (the sandbox's user pointer): the pattern being built. */
typedef struct kpt_lua_host {
    kpt_pattern *p;
    const char *display;
    /* While mask() or score() is traced: the script line that first made each node (indexed by
     * node, 0 when none; KPT_LUA_MAX_NODES + 1 entries), so that expressions built and never
     * used can be reported (Lua's `and`/`or`/`if` drop them silently). NULL: not recorded. */
    int *made_line;
} kpt_lua_host;

/* Sets the global `kpt`. The host is reached through kpt_sandbox_of(L)->user. */
void kpt_lua_open(lua_State *L);

/* The spec at idx, or NULL when the value is not one. */
kpt_lua_spec *kpt_lua_to_spec(lua_State *L, int idx);

/* Pushes a symbolic value for node r. */
void kpt_lua_push_expr(lua_State *L, kpt_ir_ref r);
/* The node of the symbolic value at idx, or 0 if it is not one. */
kpt_ir_ref kpt_lua_to_expr(lua_State *L, int idx);

/* Pushes the `p` argument of score and mask: params (the table at params_idx) and aux tensors
 * by name. */
void kpt_lua_push_env(lua_State *L, int params_idx);

/* A short description of the value at idx for messages ("an i32 expression", "the number 2"). */
const char *kpt_lua_describe(lua_State *L, int idx, char *buf, size_t n);

#endif
