/* The Lua sandbox (lua_sandbox.h says what it allows and why). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lauxlib.h>
#include <lualib.h>

#include "compiler/lua_sandbox.h"

#define HOOK_EVERY 1000 /* instructions between budget checks */

/* The allocator: every byte the state holds counts against the limit. */
static void *sandbox_alloc(void *ud, void *ptr, size_t osize, size_t nsize)
{
    kpt_sandbox *sb = ud;
    size_t old = ptr ? osize : 0; /* without ptr, osize is an object type, not a size */
    if (nsize == 0) {
        free(ptr);
        sb->used -= old;
        return NULL;
    }
    if (nsize > old && nsize - old > sb->limit - sb->used)
        return NULL; /* Lua collects garbage and tries once more before it fails */
    void *p = realloc(ptr, nsize);
    if (!p)
        return NULL;
    sb->used = sb->used - old + nsize;
    return p;
}

kpt_sandbox *kpt_sandbox_of(lua_State *L)
{
    return *(kpt_sandbox **)lua_getextraspace(L);
}

/* Adds `steps` to the budget's count; raises once it is exhausted. `level` names the script's
 * line (as luaL_where). */
static void charge(lua_State *L, uint64_t steps, int level)
{
    kpt_sandbox *sb = kpt_sandbox_of(L);
    sb->steps = steps > UINT64_MAX - sb->steps ? UINT64_MAX : sb->steps + steps;
    if (sb->steps <= sb->budget && !sb->budget_hit)
        return;
    kpt_sandbox_raise(L, level, KPT_ERR_LIMIT,
                      "instruction budget exhausted (%llu instructions): the script runs too long "
                      "or loops forever",
                      (unsigned long long)sb->budget);
}

static void hook(lua_State *L, lua_Debug *ar)
{
    kpt_sandbox *sb = kpt_sandbox_of(L);
    if (lua_getinfo(L, "l", ar) && ar->currentline > 0)
        sb->last_line = ar->currentline;
    charge(L, HOOK_EVERY, 0);
}

/* The library functions of string and table work in C, where the hook does not count: a loop
 * of a few instructions could make them repeat a long job (string.rep("", 1e15), sorting a
 * large table again and again). Each is wrapped to charge its work to the budget first, before
 * it starts: one instruction per 32 bytes of its string arguments, per element of its table
 * arguments, per repetition of string.rep and per comparison of table.sort. */
enum { COST_PLAIN, COST_REP, COST_SORT };

static int metered(lua_State *L)
{
    int n = lua_gettop(L), kind = (int)lua_tointeger(L, lua_upvalueindex(2));
    double bytes = 0, items = 1;
    for (int i = 1; i <= n; i++) {
        if (lua_type(L, i) == LUA_TSTRING)
            bytes += (double)lua_rawlen(L, i);
        else if (lua_type(L, i) == LUA_TTABLE)
            items += (double)lua_rawlen(L, i);
    }
    if (kind == COST_REP && lua_type(L, 2) == LUA_TNUMBER && lua_tonumber(L, 2) > 0) {
        double reps = (double)lua_tonumber(L, 2);
        double each = (double)(lua_type(L, 1) == LUA_TSTRING ? lua_rawlen(L, 1) : 0) +
                      (double)(lua_type(L, 3) == LUA_TSTRING ? lua_rawlen(L, 3) : 0);
        items += reps;
        bytes += reps * each;
    }
    if (kind == COST_SORT && lua_type(L, 1) == LUA_TTABLE) {
        double m = (double)lua_rawlen(L, 1);
        items += m * log2(m + 2);
    }
    double steps = items + bytes / 32;
    charge(L, steps > 1e18 ? UINT64_MAX : (uint64_t)steps, 1);
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 1);
    lua_call(L, n, LUA_MULTRET);
    return lua_gettop(L);
}

/* Wraps every function of the library table at the stack top. */
static void meter_library(lua_State *L)
{
    lua_pushnil(L);
    while (lua_next(L, -2)) {
        if (lua_type(L, -2) == LUA_TSTRING && lua_iscfunction(L, -1)) {
            const char *name = lua_tostring(L, -2);
            int kind = !strcmp(name, "rep") ? COST_REP : !strcmp(name, "sort") ? COST_SORT
                                                                              : COST_PLAIN;
            lua_pushinteger(L, kind);
            lua_pushcclosure(L, metered, 2); /* the original function and the kind */
            lua_pushvalue(L, -2);            /* the key */
            lua_insert(L, -2);
            lua_rawset(L, -4);
        } else {
            lua_pop(L, 1);
        }
    }
}

bool kpt_sandbox_open(kpt_sandbox *sb, const char *display, size_t max_memory,
                      uint64_t max_instructions)
{
    memset(sb, 0, sizeof(*sb));
    sb->display = display;
    sb->limit = max_memory ? max_memory : KPT_LUA_DEFAULT_MEMORY;
    sb->budget = max_instructions ? max_instructions : KPT_LUA_DEFAULT_INSTRUCTIONS;
    sb->L = lua_newstate(sandbox_alloc, sb);
    if (!sb->L)
        return false;
    *(kpt_sandbox **)lua_getextraspace(sb->L) = sb;
    lua_sethook(sb->L, hook, LUA_MASKCOUNT, HOOK_EVERY);
    return true;
}

void kpt_sandbox_close(kpt_sandbox *sb)
{
    if (sb->L)
        lua_close(sb->L); /* finalizers run under the hook and the memory limit */
    sb->L = NULL;
}

int kpt_sandbox_raise(lua_State *L, int level, kpt_status status, const char *fmt, ...)
{
    char msg[800];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (level >= 0)
        luaL_where(L, level);
    else
        lua_pushliteral(L, "");
    lua_pushstring(L, msg);
    lua_concat(L, 2);
    kpt_sandbox *sb = kpt_sandbox_of(L);
    sb->raised_status = status;
    snprintf(sb->raised_text, sizeof(sb->raised_text), "%s", lua_tostring(L, -1));
    if (status == KPT_ERR_LIMIT && !sb->budget_hit && sb->steps > sb->budget) {
        /* the first time the budget runs out: this message is the one reported, whatever the
         * script does with the error (from here on every hook call fails again) */
        sb->budget_hit = true;
        snprintf(sb->budget_text, sizeof(sb->budget_text), "%s", sb->raised_text);
    }
    return lua_error(L);
}

/* Describes an error object without running script code (no __tostring). */
static const char *describe_error(lua_State *L, int idx, char *buf, size_t n)
{
    if (lua_type(L, idx) == LUA_TSTRING)
        return lua_tostring(L, idx);
    snprintf(buf, n, "error object is a %s value, not a message", luaL_typename(L, idx));
    return buf;
}

/* Message handler: gives non-string error objects a message and the script's line. */
static int message_handler(lua_State *L)
{
    if (lua_type(L, 1) == LUA_TSTRING)
        return 1;
    char buf[120];
    describe_error(L, 1, buf, sizeof(buf));
    lua_Debug ar;
    for (int level = 1; lua_getstack(L, level, &ar); level++) {
        if (lua_getinfo(L, "l", &ar) && ar.currentline > 0) {
            luaL_where(L, level);
            lua_pushstring(L, buf);
            lua_concat(L, 2);
            return 1;
        }
    }
    lua_pushstring(L, buf);
    return 1;
}

void kpt_sandbox_call(lua_State *L, int nargs, int nresults)
{
    int base = lua_gettop(L) - nargs; /* the function */
    lua_pushcfunction(L, message_handler);
    lua_insert(L, base);
    int st = lua_pcall(L, nargs, nresults, base);
    lua_remove(L, base);
    if (st != LUA_OK)
        lua_error(L); /* the handled message, on to the outer protected call */
}

/* pcall and xpcall that cannot catch the end of the budget or of memory. */
static int finish_pcall(lua_State *L, int status, lua_KContext extra)
{
    kpt_sandbox *sb = kpt_sandbox_of(L);
    if (status != LUA_OK && status != LUA_YIELD) {
        sb->memory_error |= status == LUA_ERRMEM;
        if (sb->budget_hit || sb->memory_error)
            return lua_error(L);
        lua_pushboolean(L, 0);
        lua_pushvalue(L, -2);
        return 2;
    }
    return lua_gettop(L) - (int)extra;
}

static int safe_pcall(lua_State *L)
{
    luaL_checkany(L, 1);
    lua_pushboolean(L, 1);
    lua_insert(L, 1);
    int status = lua_pcallk(L, lua_gettop(L) - 2, LUA_MULTRET, 0, 0, finish_pcall);
    return finish_pcall(L, status, 0);
}

static int safe_xpcall(lua_State *L)
{
    int n = lua_gettop(L);
    luaL_checktype(L, 2, LUA_TFUNCTION);
    lua_pushboolean(L, 1);
    lua_pushvalue(L, 1);
    lua_rotate(L, 3, 2); /* f, handler, true, f, args... -> handler first */
    int status = lua_pcallk(L, n - 2, LUA_MULTRET, 2, 2, finish_pcall);
    return finish_pcall(L, status, 2);
}

/* setmetatable without finalizers: Lua runs __gc metamethods with hooks off, so a finalizer
 * could loop forever out of the budget's reach. Lua marks an object for finalization only if its
 * metatable has __gc when it is set, so checking here is enough. */
static int safe_setmetatable(lua_State *L)
{
    if (lua_type(L, 2) == LUA_TTABLE && lua_getfield(L, 2, "__gc") != LUA_TNIL)
        return kpt_sandbox_raise(L, 1, KPT_ERR_INVALID_ARGUMENT,
                                 "finalizers (__gc) are not allowed in pattern scripts");
    lua_settop(L, 2);
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 1);
    lua_call(L, 2, 1);
    return 1;
}

static int sandbox_print(lua_State *L)
{
    kpt_sandbox *sb = kpt_sandbox_of(L);
    int n = lua_gettop(L); /* before the buffer takes a stack slot */
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    for (int i = 1; i <= n; i++) {
        if (i > 1)
            luaL_addchar(&b, '\t');
        luaL_tolstring(L, i, NULL); /* may run __tostring: under the same budget */
        luaL_addvalue(&b);
    }
    luaL_pushresult(&b);
    if (sb->print)
        sb->print(sb->print_ud, lua_tostring(L, -1));
    return 0;
}

static void remove_field(lua_State *L, const char *name)
{
    lua_pushnil(L);
    lua_setfield(L, -2, name);
}

static void open_libs(lua_State *L)
{
    static const luaL_Reg libs[] = {
        {LUA_GNAME, luaopen_base},
        {LUA_STRLIBNAME, luaopen_string},
        {LUA_TABLIBNAME, luaopen_table},
        {LUA_MATHLIBNAME, luaopen_math},
    };
    for (size_t i = 0; i < sizeof(libs) / sizeof(libs[0]); i++) {
        luaL_requiref(L, libs[i].name, libs[i].func, 1);
        lua_pop(L, 1);
    }
    lua_pushglobaltable(L);
    static const char *const banned[] = {"dofile", "loadfile", "load", "collectgarbage", "warn",
                                         "require"};
    for (size_t i = 0; i < sizeof(banned) / sizeof(banned[0]); i++)
        remove_field(L, banned[i]);
    lua_pushcfunction(L, safe_pcall);
    lua_setfield(L, -2, "pcall");
    lua_pushcfunction(L, safe_xpcall);
    lua_setfield(L, -2, "xpcall");
    lua_pushcfunction(L, sandbox_print);
    lua_setfield(L, -2, "print");
    lua_getfield(L, -1, "setmetatable");
    lua_pushcclosure(L, safe_setmetatable, 1);
    lua_setfield(L, -2, "setmetatable");
    /* package.loaded would hand out the real libraries' tables; there is no package library,
     * but luaL_requiref keeps LOADED in the registry only, out of the script's reach. */
    lua_getfield(L, -1, "string");
    static const char *const str_banned[] = {"dump", "find", "match", "gmatch", "gsub"};
    for (size_t i = 0; i < sizeof(str_banned) / sizeof(str_banned[0]); i++)
        remove_field(L, str_banned[i]);
    meter_library(L); /* also what s:rep(n) finds: the string metatable's __index is this table */
    lua_pop(L, 1);
    lua_getfield(L, -1, "table");
    meter_library(L);
    lua_pop(L, 1);
    lua_getfield(L, -1, "math");
    lua_getfield(L, -1, "randomseed");
    lua_pushinteger(L, 20261121);
    lua_call(L, 1, 0);
    lua_pop(L, 1);
    lua_pop(L, 1); /* the globals */
    /* strings share one metatable: make it unreadable and unchangeable from the script */
    lua_pushliteral(L, "");
    if (lua_getmetatable(L, -1)) {
        lua_pushboolean(L, 0);
        lua_setfield(L, -2, "__metatable");
        lua_pop(L, 1);
    }
    lua_pop(L, 1);
}

static int protected_main(lua_State *L)
{
    open_libs(L);
    lua_pushcfunction(L, kpt_sandbox_of(L)->main);
    lua_call(L, 0, 0);
    return 0;
}

kpt_status kpt_sandbox_run(kpt_sandbox *sb, lua_CFunction fn)
{
    lua_State *L = sb->L;
    sb->raised_status = KPT_OK;
    sb->raised_text[0] = 0;
    sb->main = fn;
    lua_pushcfunction(L, protected_main);
    int st = lua_pcall(L, 0, 0, 0);
    if (st == LUA_OK) {
        sb->status = KPT_OK;
        sb->message[0] = 0;
        return KPT_OK;
    }
    char buf[120];
    const char *msg = describe_error(L, -1, buf, sizeof(buf));
    if (sb->memory_error || st == LUA_ERRMEM) {
        sb->status = KPT_ERR_LIMIT;
        if (sb->last_line > 0)
            snprintf(sb->message, sizeof(sb->message),
                     "%s:%d: memory limit exhausted (%zu bytes) near this line", sb->display,
                     sb->last_line, sb->limit);
        else
            snprintf(sb->message, sizeof(sb->message), "%s: memory limit exhausted (%zu bytes)",
                     sb->display, sb->limit);
    } else {
        /* kpt's own errors carry a status; anything else is the script's own error */
        sb->status = sb->budget_hit                       ? KPT_ERR_LIMIT
                     : strcmp(msg, sb->raised_text) == 0 ? sb->raised_status
                                                          : KPT_ERR_INVALID_ARGUMENT;
        if (sb->status == KPT_OK)
            sb->status = KPT_ERR_INVALID_ARGUMENT;
        snprintf(sb->message, sizeof(sb->message), "%s", sb->budget_hit ? sb->budget_text : msg);
    }
    lua_pop(L, 1);
    return sb->status;
}

/* lua_Reader over one string */
typedef struct chunk {
    const char *src;
    size_t len;
} chunk;

static const char *read_chunk(lua_State *L, void *ud, size_t *size)
{
    chunk *c = ud;
    (void)L;
    *size = c->len;
    c->len = 0;
    return *size ? c->src : NULL;
}

void kpt_sandbox_load(lua_State *L, const char *src, size_t len)
{
    kpt_sandbox *sb = kpt_sandbox_of(L);
    if (len > 0 && src[0] == LUA_SIGNATURE[0])
        kpt_sandbox_raise(L, -1, KPT_ERR_PARSE,
                          "%s: precompiled Lua bytecode is refused; give the script's text",
                          sb->display);
    char name[300];
    snprintf(name, sizeof(name), "=%s", sb->display);
    chunk c = {src, len};
    int st = lua_load(L, read_chunk, &c, name, "t");
    if (st != LUA_OK) {
        char buf[120];
        char msg[800];
        snprintf(msg, sizeof(msg), "%s", describe_error(L, -1, buf, sizeof(buf)));
        lua_pop(L, 1);
        kpt_sandbox_raise(L, -1, st == LUA_ERRSYNTAX ? KPT_ERR_PARSE : KPT_ERR_LIMIT, "%s", msg);
    }
}
