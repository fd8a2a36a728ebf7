/* The Lua sandbox (lua_sandbox.h says what it allows and why). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lauxlib.h>
#include <lualib.h>

#include "base/clock.h"
#include "compiler/lua_sandbox.h"

/* Instructions between budget and clock checks. Some single instructions take long (comparing
 * two 32 MiB strings), so the clock is read often enough that even a loop of those passes the
 * deadline by well under a second. */
#define HOOK_EVERY 500
#define ALLOC_BYTES_PER_STEP 32 /* what an allocation costs, as string functions are charged */

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
    /* Building a string copies it (`s .. s`, tostring of a long __name): charged here, checked
     * at the next hook or charge, since an allocator must not raise. */
    if (nsize > old)
        sb->steps += (nsize - old) / ALLOC_BYTES_PER_STEP;
    return p;
}

kpt_sandbox *kpt_sandbox_of(lua_State *L)
{
    return *(kpt_sandbox **)lua_getextraspace(L);
}

/* Pushes "x.lua:3: message" (the place when `level`, as luaL_where, names a line of the script)
 * and records it as the last error kpt raised. */
static void push_raised(lua_State *L, int level, kpt_status status, const char *fmt, va_list ap)
{
    char msg[800];
    vsnprintf(msg, sizeof(msg), fmt, ap);
    if (level >= 0)
        luaL_where(L, level);
    else
        lua_pushliteral(L, "");
    lua_pushstring(L, msg);
    lua_concat(L, 2);
    kpt_sandbox *sb = kpt_sandbox_of(L);
    sb->raised_status = status;
    snprintf(sb->raised_text, sizeof(sb->raised_text), "%s", lua_tostring(L, -1));
}

/* Raises the first end of the budget or the time: its message is the one reported, whatever the
 * script does with the error (from here on every check fails again). */
static int raise_limit(lua_State *L, int level, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    push_raised(L, level, KPT_ERR_LIMIT, fmt, ap);
    va_end(ap);
    kpt_sandbox *sb = kpt_sandbox_of(L);
    sb->budget_hit = true;
    snprintf(sb->budget_text, sizeof(sb->budget_text), "%s", sb->raised_text);
    return lua_error(L);
}

/* Adds `steps` to the budget's count; raises once it is exhausted or the deadline has passed.
 * `level` names the script's line (as luaL_where). */
static void charge(lua_State *L, uint64_t steps, int level)
{
    kpt_sandbox *sb = kpt_sandbox_of(L);
    sb->steps = steps > UINT64_MAX - sb->steps ? UINT64_MAX : sb->steps + steps;
    if (sb->budget_hit) /* reported already: budget_text is the message that counts */
        kpt_sandbox_raise(L, level, KPT_ERR_LIMIT, "%s", "the script's limits were exhausted");
    if (sb->steps > sb->budget)
        raise_limit(L, level,
                    "instruction budget exhausted (%llu instructions): the script runs too long "
                    "or loops forever",
                    (unsigned long long)sb->budget);
    if (kpt_now_ms() > sb->deadline_ms)
        raise_limit(L, level,
                    "time limit exhausted (%g s of wall-clock time): the script runs too long or "
                    "loops forever",
                    sb->seconds);
}

void kpt_sandbox_charge(lua_State *L, uint64_t steps)
{
    charge(L, steps, 1);
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
 * large table again and again, table.move over 2^50 indices). Each is wrapped to charge its
 * work to the budget first, before it starts: one instruction per 32 bytes of its string
 * arguments, per element of its table arguments, per repetition of string.rep, per comparison
 * of table.sort and per index of the range that table.concat, move and unpack walk. */
enum { COST_PLAIN, COST_REP, COST_SORT, COST_RANGE_2, COST_RANGE_3 };

/* The length of the range [i, j] of arguments i_arg and i_arg + 1 (defaults 1 and #t). */
static double range_length(lua_State *L, int i_arg)
{
    double first = lua_type(L, i_arg) == LUA_TNUMBER ? lua_tonumber(L, i_arg) : 1;
    double last = lua_type(L, i_arg + 1) == LUA_TNUMBER ? lua_tonumber(L, i_arg + 1)
                  : lua_type(L, 1) == LUA_TTABLE          ? (double)lua_rawlen(L, 1)
                                                         : 0;
    return last >= first ? last - first + 1 : 0;
}

static double call_cost(lua_State *L, int n, int kind)
{
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
    if (kind == COST_RANGE_2) /* table.move(a, f, e, ...), table.unpack(t, i, j) */
        items += range_length(L, 2);
    if (kind == COST_RANGE_3) { /* table.concat(t, sep, i, j) */
        double m = range_length(L, 3);
        items += m;
        bytes += m * (double)(lua_type(L, 2) == LUA_TSTRING ? lua_rawlen(L, 2) : 0);
    }
    return items + bytes / 32;
}

/* Whether a message already starts with a place in the script ("x.lua:3:"). */
static bool has_place(const kpt_sandbox *sb, const char *msg)
{
    size_t n = strlen(sb->display);
    return !strncmp(msg, sb->display, n) && msg[n] == ':';
}

/* Passes on an error a wrapped library function raised. Lua names neither the function (it was
 * called from C) nor the script's line (luaL_where looks one level up, at the wrapper), so both
 * are added; the sandbox's own limits pass unchanged. */
static int pass_on(lua_State *L, int status)
{
    kpt_sandbox *sb = kpt_sandbox_of(L);
    sb->memory_error |= status == LUA_ERRMEM;
    if (status != LUA_ERRRUN || sb->budget_hit || lua_type(L, -1) != LUA_TSTRING ||
        has_place(sb, lua_tostring(L, -1)))
        return lua_error(L);
    const char *msg = lua_tostring(L, -1);
    const char *unnamed = strstr(msg, " to '?'");
    luaL_where(L, 1);
    if (unnamed && !strncmp(msg, "bad argument #", 14)) {
        lua_pushlstring(L, msg, (size_t)(unnamed - msg));
        lua_pushfstring(L, " to '%s'%s", lua_tostring(L, lua_upvalueindex(3)), unnamed + 7);
        lua_concat(L, 3);
    } else {
        lua_pushvalue(L, -2);
        lua_concat(L, 2);
    }
    return lua_error(L);
}

static int metered(lua_State *L)
{
    int n = lua_gettop(L), kind = (int)lua_tointeger(L, lua_upvalueindex(2));
    double steps = call_cost(L, n, kind);
    charge(L, steps > 1e18 ? UINT64_MAX : (uint64_t)steps, 1);
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 1);
    int status = lua_pcall(L, n, LUA_MULTRET, 0);
    return status == LUA_OK ? lua_gettop(L) : pass_on(L, status);
}

static int cost_kind(const char *name)
{
    static const struct {
        const char *name;
        int kind;
    } kinds[] = {{"rep", COST_REP},       {"sort", COST_SORT},     {"move", COST_RANGE_2},
                 {"unpack", COST_RANGE_2}, {"concat", COST_RANGE_3}};
    for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++)
        if (!strcmp(name, kinds[i].name))
            return kinds[i].kind;
    return COST_PLAIN;
}

/* Replaces the C function t[name] of the table at the stack top with its metered wrapper;
 * `lib` prefixes its name in messages ("string.rep"). */
static void meter_function(lua_State *L, const char *lib, const char *name)
{
    if (lua_getfield(L, -1, name) != LUA_TFUNCTION || !lua_iscfunction(L, -1)) {
        lua_pop(L, 1);
        return;
    }
    lua_pushinteger(L, cost_kind(name));
    if (lib)
        lua_pushfstring(L, "%s.%s", lib, name);
    else
        lua_pushstring(L, name);
    lua_pushcclosure(L, metered, 3); /* the original function, the cost kind, the name */
    lua_setfield(L, -2, name);
}

/* Wraps every C function of the library table `lib` at the stack top. */
static void meter_library(lua_State *L, const char *lib)
{
    char names[64][16];
    int n = 0;
    lua_pushnil(L);
    while (lua_next(L, -2)) {
        if (lua_type(L, -2) == LUA_TSTRING && lua_rawlen(L, -2) < sizeof(names[0]) && n < 64)
            snprintf(names[n++], sizeof(names[0]), "%s", lua_tostring(L, -2));
        lua_pop(L, 1);
    }
    for (int i = 0; i < n; i++)
        meter_function(L, lib, names[i]);
}

bool kpt_sandbox_open(kpt_sandbox *sb, const char *display, size_t max_memory,
                      uint64_t max_instructions, double max_seconds)
{
    memset(sb, 0, sizeof(*sb));
    sb->display = display;
    sb->limit = max_memory ? max_memory : KPT_LUA_DEFAULT_MEMORY;
    sb->budget = max_instructions ? max_instructions : KPT_LUA_DEFAULT_INSTRUCTIONS;
    sb->seconds = max_seconds > 0 ? max_seconds : KPT_LUA_DEFAULT_SECONDS;
    sb->deadline_ms = kpt_now_ms() + 1e3 * sb->seconds;
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
    va_list ap;
    va_start(ap, fmt);
    push_raised(L, level, status, fmt, ap);
    va_end(ap);
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

/* The place of the innermost script line on the stack ("x.lua:3: "), pushed; "" when none. */
static void push_script_place(lua_State *L)
{
    lua_Debug ar;
    for (int level = 1; lua_getstack(L, level, &ar); level++) {
        if (lua_getinfo(L, "l", &ar) && ar.currentline > 0) {
            luaL_where(L, level);
            return;
        }
    }
    lua_pushliteral(L, "");
}

/* Message handler: gives non-string error objects a message, and messages that Lua raised
 * outside the script's own code ("C stack overflow", errors of library functions) the script's
 * line. */
static int message_handler(lua_State *L)
{
    kpt_sandbox *sb = kpt_sandbox_of(L);
    if (lua_type(L, 1) == LUA_TSTRING && (sb->budget_hit || has_place(sb, lua_tostring(L, 1))))
        return 1;
    char buf[120];
    const char *msg = describe_error(L, 1, buf, sizeof(buf));
    push_script_place(L);
    lua_pushstring(L, msg);
    lua_concat(L, 2);
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

/* The message handler xpcall installs: the script's handler, except for the end of a limit.
 * The budget's end is raised from the count hook, where Lua runs the handler with hooks off:
 * a handler that loops would never be stopped, so it does not run at all. */
static int guarded_handler(lua_State *L)
{
    kpt_sandbox *sb = kpt_sandbox_of(L);
    if (sb->budget_hit || sb->memory_error)
        return 1;
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 1);
    lua_call(L, lua_gettop(L) - 1, 1);
    return 1;
}

static int safe_xpcall(lua_State *L)
{
    int n = lua_gettop(L);
    luaL_checktype(L, 2, LUA_TFUNCTION);
    lua_pushvalue(L, 2);
    lua_pushcclosure(L, guarded_handler, 1);
    lua_replace(L, 2);
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
    meter_library(L, "string"); /* also what s:rep(n) finds: the string metatable's __index */
    lua_pop(L, 1);
    lua_getfield(L, -1, "table");
    meter_library(L, "table");
    lua_pop(L, 1);
    /* base functions whose C work grows with their arguments: parsing or comparing long
     * strings (error, assert and the rest are cheap, and wrapping error would move its level) */
    meter_function(L, NULL, "tonumber");
    meter_function(L, NULL, "tostring");
    meter_function(L, NULL, "rawequal");
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
