/* The sandbox every Lua pattern script runs in (docs/lua.md, "Sandbox").
 *
 * One Lua state per script run, with:
 *   - only the base, string, table and math libraries, minus everything that reaches outside the
 *     state or runs unbounded C code: dofile, loadfile, load, collectgarbage, warn, string.dump
 *     and string pattern matching (its backtracking runs in C, where no budget can stop it);
 *     print goes to a host callback (or nowhere);
 *   - text chunks only (precompiled bytecode is refused: it can crash the VM);
 *   - a memory limit enforced by the allocator, and an instruction budget and a wall-clock
 *     deadline enforced by a count hook; C library work and allocations are charged to the
 *     budget by size. Once a limit is exhausted the error cannot be caught: pcall and xpcall
 *     re-raise it, and an xpcall message handler is not run for it;
 *   - protected metatables for strings and for kpt's own values, and no finalizers (__gc):
 *     Lua runs them with hooks off, out of the budget's reach;
 *   - math.random seeded with a constant, so scripts are deterministic.
 *
 * All Lua API calls that can raise an error run inside kpt_sandbox_run's protected call, so a
 * Lua error never unwinds through host code.
 */
#ifndef KPT_COMPILER_LUA_SANDBOX_H
#define KPT_COMPILER_LUA_SANDBOX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <lua.h>

#include <kpt/status.h>

#define KPT_LUA_DEFAULT_MEMORY ((size_t)64 << 20)
#define KPT_LUA_DEFAULT_INSTRUCTIONS ((uint64_t)200000000)
#define KPT_LUA_DEFAULT_SECONDS 5.0

typedef struct kpt_sandbox {
    lua_State *L;
    const char *display; /* the script's name in messages ("examples/patterns/x.lua") */
    size_t used, limit;  /* bytes */
    uint64_t steps, budget; /* instructions, allocated bytes / 32, C library work */
    double seconds, deadline_ms; /* the wall-clock limit, and when it ends (kpt_now_ms) */
    bool budget_hit;   /* the budget or the time ran out: every later check fails too */
    bool memory_error; /* a memory error was seen (and re-raised) by pcall */
    int last_line; /* the line the hook last saw: where a memory error happened, roughly */
    void (*print)(void *ud, const char *text);
    void *print_ud;
    void *user;         /* the front end's context */
    lua_CFunction main; /* what kpt_sandbox_run runs */
    kpt_status raised_status; /* the last error kpt raised, to classify the final one */
    char raised_text[900];
    char budget_text[900]; /* the message of the budget's end */
    /* The outcome of the last error: a status and a message ("script.lua:12: ..."). */
    kpt_status status;
    char message[900];
} kpt_sandbox;

/* Opens a state (limits of 0 take the defaults). Returns false when out of memory. */
bool kpt_sandbox_open(kpt_sandbox *sb, const char *display, size_t max_memory,
                      uint64_t max_instructions, double max_seconds);
/* Closes the state (runs pending finalizers under the same limits). Idempotent. */
void kpt_sandbox_close(kpt_sandbox *sb);

/* The sandbox of a state, and the front end's context. */
kpt_sandbox *kpt_sandbox_of(lua_State *L);

/* Runs fn(L) protected, after opening the safe libraries. fn reports failure by raising a Lua
 * error (kpt_sandbox_raise or any Lua error). Returns KPT_OK, or the error's status with
 * sb->message set. */
kpt_status kpt_sandbox_run(kpt_sandbox *sb, lua_CFunction fn);

/* Loads a text chunk named sb->display (bytecode refused) and pushes it; raises on a syntax
 * error (status KPT_ERR_PARSE). */
void kpt_sandbox_load(lua_State *L, const char *src, size_t len);

/* Calls the function below nargs arguments with a message handler that adds the script's line
 * to non-string errors; results as lua_call. Errors propagate. */
void kpt_sandbox_call(lua_State *L, int nargs, int nresults);

/* Charges `steps` of work done in C to the budget (called by kpt's own library functions, as
 * the string and table functions are charged); raises when a limit is exhausted. */
void kpt_sandbox_charge(lua_State *L, uint64_t steps);

/* Raises an error with the status, prefixed with the script and current line ("x.lua:3: ")
 * when `level` (as in luaL_where) names a line of the script. Never returns. */
int kpt_sandbox_raise(lua_State *L, int level, kpt_status status, const char *fmt, ...);

#endif
