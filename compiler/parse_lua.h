/* The Lua pattern-script front end: runs a script in the sandbox (lua_sandbox.h) with the kpt
 * module (lua_expr.h) and turns what it returns into a pattern, before any pass runs. */
#ifndef KPT_COMPILER_PARSE_LUA_H
#define KPT_COMPILER_PARSE_LUA_H

#include "ir/pattern.h"

#define KPT_LUA_MAX_SOURCE ((size_t)1 << 20)

/* Runs the script; NULL on error (diag names the script and line). params may be NULL. */
kpt_pattern *kpt_parse_lua(const char *source, size_t length, const kpt_lua_params *params,
                           kpt_diag *diag);

/* Runs the script again and calls the fill function of aux tensor `aux` (declared with
 * fill = function(shape, seed)) for a tensor of the given shape, writing its
 * shape[0]*...*shape[rank-1] values (row-major) to out. The sandbox's limits are params' (or
 * the defaults) plus, per element of the tensor, 48 bytes, 256 instructions and 1 us. */
kpt_status kpt_lua_fill_aux(const char *source, size_t length, const kpt_lua_params *params,
                            const char *aux, int rank, const int64_t *shape, uint64_t seed,
                            double *out, kpt_diag *diag);

/* Reads a script file (at most KPT_LUA_MAX_SOURCE bytes) into a malloc'ed, NUL-terminated
 * buffer. NULL on error (diag). */
char *kpt_lua_read_file(const char *path, size_t *length, kpt_diag *diag);

#endif
