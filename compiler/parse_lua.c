/* Running a Lua pattern script: load it, run it, check that it returned kpt.pattern{...},
 * declare its aux tensors, apply param overrides, then call mask(b, h, q, k, p) and
 * score(s, b, h, q, k, p) once each on symbolic values (docs/lua.md). */
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lauxlib.h>

#include "compiler/lua_expr.h"
#include "compiler/lua_sandbox.h"
#include "compiler/parse_lua.h"
#include "compiler/pipeline.h"
#include "base/diag.h"
#include "base/file.h"

typedef struct run_ctx {
    kpt_lua_host h; /* first: the sandbox's user pointer points here */
    const char *src;
    size_t len;
    const kpt_lua_params *prm;
    /* fill mode (kpt_lua_fill_aux) */
    const char *fill_aux;
    int rank;
    const int64_t *shape;
    uint64_t seed;
    double *out;
    int *made_line; /* kpt_lua_host.made_line while mask and score are traced */
} run_ctx;

static run_ctx *ctx_of(lua_State *L)
{
    return (run_ctx *)kpt_sandbox_of(L)->user;
}

/* An error about the script as a whole, at `line` (0: no line). */
#define FAIL_AT(L, line, st, fmt, ...)                                                          \
    ((line) > 0 ? kpt_sandbox_raise(L, -1, st, "%s:%d: " fmt, ctx_of(L)->h.display, line,      \
                                    __VA_ARGS__)                                                \
                : kpt_sandbox_raise(L, -1, st, "%s: " fmt, ctx_of(L)->h.display, __VA_ARGS__))

static void declare_aux(lua_State *L, const kpt_lua_spec *spec)
{
    kpt_pattern *p = ctx_of(L)->h.p;
    for (int i = 0; i < spec->naux; i++) {
        char err[200];
        if (kpt_pattern_add_aux(p, &spec->aux[i], err, sizeof(err)) < 0)
            FAIL_AT(L, spec->line, KPT_ERR_INVALID_ARGUMENT, "%s", err);
    }
}

static void param_names(lua_State *L, int params, char *buf, size_t n)
{
    size_t len = 0;
    buf[0] = 0;
    lua_pushnil(L);
    while (lua_next(L, params)) {
        if (len < n)
            len += (size_t)snprintf(buf + len, n - len, "%s%s", len ? ", " : "",
                                    lua_tostring(L, -2));
        lua_pop(L, 1);
    }
    if (!buf[0])
        snprintf(buf, n, "none");
}

/* Applies the caller's param values to the params table at `params`. */
static void override_params(lua_State *L, const kpt_lua_spec *spec, int params)
{
    const kpt_lua_params *prm = ctx_of(L)->prm;
    kpt_pattern *p = ctx_of(L)->h.p;
    if (prm && (prm->num_params < 0 || (prm->num_params > 0 && !prm->params)))
        FAIL_AT(L, 0, KPT_ERR_INVALID_ARGUMENT, "params: %d given in a %s array",
                prm->num_params, prm->params ? "non-NULL" : "NULL");
    for (int i = 0; prm && i < prm->num_params; i++) {
        const char *name = prm->params[i].name;
        double v = prm->params[i].value;
        if (!name)
            FAIL_AT(L, 0, KPT_ERR_INVALID_ARGUMENT, "param %d has no name", i);
        for (int j = 0; j < i; j++)
            if (prm->params[j].name && !strcmp(prm->params[j].name, name))
                FAIL_AT(L, 0, KPT_ERR_INVALID_ARGUMENT, "param '%.40s' given twice", name);
        if (!isfinite(v))
            FAIL_AT(L, 0, KPT_ERR_INVALID_ARGUMENT, "param '%s': the value is not finite", name);
        int t = lua_getfield(L, params, name);
        kpt_ir_ref r = kpt_lua_to_expr(L, -1);
        lua_pop(L, 1);
        if (t == LUA_TNIL) {
            char names[300];
            param_names(L, params, names, sizeof(names));
            FAIL_AT(L, spec->line, KPT_ERR_NOT_FOUND, "the pattern has no param '%.40s' (its "
                    "params: %s)", name, names);
        }
        if (r) {
            const kpt_ir_node *n = kpt_ir_node_get(&p->g, r);
            if (n->op != KPT_IR_SCALAR)
                FAIL_AT(L, spec->line, KPT_ERR_TYPE, "param '%s' is an expression; only numbers, "
                        "booleans and kpt.runtime(...) params can be set", name);
            kpt_scalar_decl *s = &p->scalars[n->imm.index];
            if (s->type == KPT_IR_I32 && (v != floor(v) || fabs(v) > INT32_MAX))
                FAIL_AT(L, spec->line, KPT_ERR_TYPE, "param '%s' is an i32 runtime scalar; %g is "
                        "not an i32", name, v);
            if (s->type == KPT_IR_F32 && fabs(v) > FLT_MAX)
                FAIL_AT(L, spec->line, KPT_ERR_TYPE, "param '%s' is an f32 runtime scalar; %g is "
                        "beyond the f32 range", name, v);
            s->has_default = true;
            s->def = v;
            continue;
        }
        if (t == LUA_TBOOLEAN) {
            lua_pushboolean(L, v != 0);
        } else {
            lua_getfield(L, params, name);
            bool integer = lua_isinteger(L, -1);
            lua_pop(L, 1);
            if (integer && (v != floor(v) || fabs(v) > 9.0e15))
                FAIL_AT(L, spec->line, KPT_ERR_TYPE, "param '%s' is an integer; %g is not", name,
                        v);
            if (integer)
                lua_pushinteger(L, (lua_Integer)v);
            else
                lua_pushnumber(L, v);
        }
        lua_setfield(L, params, name);
    }
}

static kpt_ir_ref var(lua_State *L, kpt_ir_op op)
{
    kpt_ir_graph *g = &ctx_of(L)->h.p->g;
    kpt_ir_ref r = kpt_ir_var(g, op);
    if (!r)
        FAIL_AT(L, 0, KPT_ERR_LIMIT, "%s", g->error);
    return r;
}

/* Calls the function at fn_idx with the symbolic arguments; returns the one result's stack
 * index, or fails naming the function's line. */
static int call_traced(lua_State *L, int fn_idx, const char *what, bool with_s, int env_idx,
                       int *line)
{
    lua_Debug ar;
    lua_pushvalue(L, fn_idx);
    lua_getinfo(L, ">S", &ar);
    *line = ar.linedefined;
    int base = lua_gettop(L);
    lua_pushvalue(L, fn_idx);
    int nargs = 0;
    if (with_s) {
        kpt_lua_push_expr(L, var(L, KPT_IR_S));
        nargs++;
    }
    static const kpt_ir_op vars[] = {KPT_IR_B, KPT_IR_H, KPT_IR_Q, KPT_IR_K};
    for (int i = 0; i < 4; i++)
        kpt_lua_push_expr(L, var(L, vars[i]));
    lua_pushvalue(L, env_idx);
    nargs += 5;
    kpt_sandbox_call(L, nargs, LUA_MULTRET);
    int nres = lua_gettop(L) - base;
    if (nres != 1)
        FAIL_AT(L, *line, KPT_ERR_TYPE, "%s must return one value, it returned %d", what, nres);
    return lua_gettop(L);
}

static kpt_ir_ref run_mask(lua_State *L, int spec_idx, int env_idx)
{
    if (lua_getiuservalue(L, spec_idx, SPEC_MASK) != LUA_TFUNCTION)
        return 0;
    int line;
    int r = call_traced(L, lua_gettop(L), "mask", false, env_idx, &line);
    kpt_pattern *p = ctx_of(L)->h.p;
    /* a Lua constant is fine when a param chose it; one that came from testing a traced value
     * leaves that value unused, which refuse_unused reports */
    if (lua_type(L, r) == LUA_TBOOLEAN)
        return lua_toboolean(L, r) ? 0 : kpt_ir_const_bool(&p->g, false);
    kpt_ir_ref e = kpt_lua_to_expr(L, r);
    if (!e || kpt_ir_type_of(&p->g, e) != KPT_IR_BOOL) {
        char buf[120];
        FAIL_AT(L, line, KPT_ERR_TYPE, "mask must return a boolean expression (such as "
                "q:ge(k)), it returned %s", kpt_lua_describe(L, r, buf, sizeof(buf)));
    }
    return e;
}

/* Lua's `and`, `or`, `not` and `if` cannot be overloaded: every traced expression is true to
 * them, so `q:ge(k) and (q - k):lt(8)` is just the second term and `if q:ge(k) then return true
 * end` a constant. Both leave the same trace: an expression the script built (the `q:ge(k)`)
 * that the pattern never uses. A Lua constant alone is no sign: a param may have chosen it. */
static void refuse_unused(lua_State *L, kpt_ir_ref mask, kpt_ir_ref score)
{
    run_ctx *c = ctx_of(L);
    const kpt_ir_graph *g = &c->h.p->g;
    uint8_t *live = calloc(g->count ? g->count : 1, 1);
    if (!live)
        FAIL_AT(L, 0, KPT_ERR_NO_MEMORY, "%s", "out of memory");
    kpt_ir_ref roots[2];
    int n = 0;
    if (mask)
        roots[n++] = mask;
    if (score)
        roots[n++] = score;
    kpt_ir_mark_live(g, roots, n, live);
    int line = 0;
    for (kpt_ir_ref r = 1; r < g->count && r <= KPT_LUA_MAX_NODES && !line; r++)
        if (c->made_line[r] && !live[r])
            line = c->made_line[r];
    free(live);
    if (line)
        FAIL_AT(L, line, KPT_ERR_TYPE, "%s",
                "an expression built here is never used by the mask or score: Lua's `and`, `or`, "
                "`not` and `if` treat every kpt expression as true, so a condition written with "
                "them is dropped; combine conditions with & | ~ and choose with "
                "kpt.where(c, a, b)");
}

static kpt_ir_ref run_score(lua_State *L, int spec_idx, int env_idx)
{
    if (lua_getiuservalue(L, spec_idx, SPEC_SCORE) != LUA_TFUNCTION)
        return 0;
    int line;
    int r = call_traced(L, lua_gettop(L), "score", true, env_idx, &line);
    kpt_ir_graph *g = &ctx_of(L)->h.p->g;
    kpt_ir_ref e = kpt_lua_to_expr(L, r);
    kpt_ir_ref out = 0;
    if (lua_type(L, r) == LUA_TNUMBER && !isnan(lua_tonumber(L, r)))
        out = kpt_ir_const_f32(g, (float)lua_tonumber(L, r));
    else if (e && kpt_ir_type_of(g, e) == KPT_IR_F32)
        out = e;
    else if (e && kpt_ir_type_of(g, e) == KPT_IR_I32)
        out = kpt_ir_unop(g, KPT_IR_TO_F32, e);
    else {
        char buf[120];
        FAIL_AT(L, line, KPT_ERR_TYPE, "score must return a number expression (such as s + 1), "
                "it returned %s", kpt_lua_describe(L, r, buf, sizeof(buf)));
    }
    if (!out)
        FAIL_AT(L, line, KPT_ERR_LIMIT, "%s", g->error);
    return out == kpt_ir_var(g, KPT_IR_S) ? 0 : out;
}

/* Fill mode: fill(shape, seed) must return a flat list of shape's element count. */
static void run_fill(lua_State *L, int spec_idx)
{
    run_ctx *c = ctx_of(L);
    kpt_lua_spec *spec = kpt_lua_to_spec(L, spec_idx);
    lua_getiuservalue(L, spec_idx, SPEC_FILLS);
    if (lua_getfield(L, -1, c->fill_aux) != LUA_TFUNCTION)
        FAIL_AT(L, spec->line, KPT_ERR_NOT_FOUND, "aux '%s' has no fill function", c->fill_aux);
    int64_t count = 1;
    lua_createtable(L, c->rank, 0);
    for (int i = 0; i < c->rank; i++) {
        count *= c->shape[i];
        lua_pushinteger(L, c->shape[i]);
        lua_rawseti(L, -2, i + 1);
    }
    lua_pushinteger(L, (lua_Integer)(c->seed & 0x7fffffffffffffffull));
    int base = lua_gettop(L) - 3;
    kpt_sandbox_call(L, 2, LUA_MULTRET);
    if (lua_gettop(L) != base + 1 || !lua_istable(L, -1))
        FAIL_AT(L, spec->line, KPT_ERR_TYPE, "the fill function of aux '%s' must return one "
                "list of %lld numbers", c->fill_aux, (long long)count);
    if (luaL_len(L, -1) != count)
        FAIL_AT(L, spec->line, KPT_ERR_TYPE, "the fill function of aux '%s' returned %lld values "
                "for a shape of %lld elements", c->fill_aux, (long long)luaL_len(L, -1),
                (long long)count);
    for (int64_t i = 0; i < count; i++) {
        int t = lua_rawgeti(L, -1, (lua_Integer)i + 1);
        if (t == LUA_TBOOLEAN)
            c->out[i] = lua_toboolean(L, -1);
        else if (t == LUA_TNUMBER && isfinite(lua_tonumber(L, -1)))
            c->out[i] = (double)lua_tonumber(L, -1);
        else
            FAIL_AT(L, spec->line, KPT_ERR_TYPE, "the fill function of aux '%s': element %lld is "
                    "not a finite number", c->fill_aux, (long long)i + 1);
        lua_pop(L, 1);
    }
}

static void set_name(lua_State *L, const kpt_lua_spec *spec)
{
    run_ctx *c = ctx_of(L);
    char name[64];
    if (spec->name[0]) {
        snprintf(name, sizeof(name), "%s", spec->name);
    } else { /* the script's base name without ".lua" */
        const char *base = strrchr(c->h.display, '/');
        base = base ? base + 1 : c->h.display;
        snprintf(name, sizeof(name), "%s", base);
        size_t n = strlen(name);
        if (n > 4 && !strcmp(name + n - 4, ".lua"))
            name[n - 4] = 0;
        for (char *s = name; *s; s++)
            if (*s <= 0x20 || *s >= 0x7f)
                *s = '_';
    }
    if (!kpt_pattern_set_name(c->h.p, name))
        FAIL_AT(L, 0, KPT_ERR_NO_MEMORY, "%s", "out of memory");
}

static int run_script(lua_State *L)
{
    run_ctx *c = ctx_of(L);
    kpt_lua_open(L);
    kpt_sandbox_load(L, c->src, c->len);
    int base = lua_gettop(L);
    kpt_sandbox_call(L, 0, LUA_MULTRET);
    int nres = lua_gettop(L) - base + 1;
    if (nres != 1 || !kpt_lua_to_spec(L, -1)) {
        char buf[120];
        FAIL_AT(L, 0, KPT_ERR_INVALID_ARGUMENT, "the script must end with `return kpt.pattern{...}`"
                "; it returned %s", nres == 0 ? "nothing"
                : nres > 1 ? "several values" : kpt_lua_describe(L, -1, buf, sizeof(buf)));
    }
    int spec_idx = lua_gettop(L);
    kpt_lua_spec *spec = kpt_lua_to_spec(L, spec_idx);
    declare_aux(L, spec);
    if (c->fill_aux) {
        run_fill(L, spec_idx);
        return 0;
    }
    set_name(L, spec);
    lua_getiuservalue(L, spec_idx, SPEC_PARAMS);
    int params = lua_gettop(L);
    override_params(L, spec, params);
    kpt_lua_push_env(L, params);
    int env = lua_gettop(L);
    c->h.made_line = c->made_line;
    kpt_ir_ref mask = run_mask(L, spec_idx, env);
    kpt_ir_ref score = run_score(L, spec_idx, env);
    c->h.made_line = NULL;
    kpt_pattern *p = c->h.p;
    if (p->g.failed) /* the script caught an error and went on */
        FAIL_AT(L, 0, p->g.out_of_memory ? KPT_ERR_NO_MEMORY : KPT_ERR_LIMIT, "%s", p->g.error);
    refuse_unused(L, mask, score);
    p->mask = mask;
    p->score = score;
    return 0;
}

static void print_to(void *ud, const char *text)
{
    const kpt_lua_params *prm = ud;
    prm->print(prm->print_user, text);
}

/* Turns the sandbox's message into a diag, with the line when it names one of the script. */
static kpt_status report(const kpt_sandbox *sb, const char *src, size_t len, kpt_diag *diag)
{
    const char *msg = sb->message;
    size_t n = strlen(sb->display);
    if (strncmp(msg, sb->display, n) == 0 && msg[n] == ':') {
        char *end;
        long line = strtol(msg + n + 1, &end, 10);
        if (end > msg + n + 1 && *end == ':' && line > 0 && line < 1000000000) {
            const char *rest = end + 1;
            while (*rest == ' ')
                rest++;
            return kpt_diag_at_len(diag, sb->status, sb->display, src, len, (int)line, 0, "%s",
                                   rest);
        }
    }
    return kpt_diag_set(diag, sb->status, "%s", msg);
}

static kpt_status run(run_ctx *c, kpt_diag *diag)
{
    const kpt_lua_params *prm = c->prm;
    kpt_sandbox sb;
    if (!kpt_sandbox_open(&sb, c->h.display, prm ? prm->max_memory : 0,
                          prm ? prm->max_instructions : 0, prm ? prm->max_seconds : 0))
        return kpt_diag_set(diag, KPT_ERR_NO_MEMORY, "out of memory");
    sb.user = c;
    if (prm && prm->print) {
        sb.print = print_to;
        sb.print_ud = (void *)prm;
    }
    kpt_status st = kpt_sandbox_run(&sb, run_script);
    sb.user = NULL; /* finalizers that run while the state closes find no kpt to call */
    kpt_sandbox_close(&sb);
    return st ? report(&sb, c->src, c->len, diag) : KPT_OK;
}

static const char *display_name(const kpt_lua_params *prm)
{
    return prm && prm->name && prm->name[0] ? prm->name : "script";
}

kpt_pattern *kpt_parse_lua(const char *source, size_t length, const kpt_lua_params *params,
                           kpt_diag *diag)
{
    if (!source) {
        kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT, "Lua source is NULL");
        return NULL;
    }
    if (length > KPT_LUA_MAX_SOURCE) {
        kpt_diag_set(diag, KPT_ERR_LIMIT, "%s: the script is larger than %zu bytes",
                     display_name(params), KPT_LUA_MAX_SOURCE);
        return NULL;
    }
    run_ctx c = {.src = source, .len = length, .prm = params};
    c.h.display = display_name(params);
    c.h.p = kpt_pattern_new("");
    if (!c.h.p) {
        kpt_diag_set(diag, KPT_ERR_NO_MEMORY, "out of memory");
        return NULL;
    }
    c.h.p->g.max_nodes = KPT_LUA_MAX_NODES;
    c.made_line = calloc(KPT_LUA_MAX_NODES + 1, sizeof(int));
    if (!c.made_line) {
        kpt_pattern_destroy(&c.h.p);
        kpt_diag_set(diag, KPT_ERR_NO_MEMORY, "out of memory");
        return NULL;
    }
    if (run(&c, diag) != KPT_OK)
        kpt_pattern_destroy(&c.h.p);
    free(c.made_line);
    return c.h.p;
}

/* A fill function returns a list of the tensor's size: the limits of params (or the defaults)
 * plus what such a list takes, 48 bytes (a Lua value is 16, and a list grows by doubling), 256
 * instructions and a microsecond an element. Graphormer's distances over 2000 nodes (4 million
 * values) ran out of the 64 MiB a script has. */
static const kpt_lua_params *fill_limits(const kpt_lua_params *params, int rank,
                                         const int64_t *shape, kpt_lua_params *out)
{
    double n = 1;
    for (int i = 0; i < rank; i++)
        n *= (double)(shape[i] > 0 ? shape[i] : 0);
    n = n < 1e12 ? n : 1e12;
    *out = params ? *params : (kpt_lua_params){0};
    out->max_memory = (out->max_memory ? out->max_memory : KPT_LUA_DEFAULT_MEMORY) +
                      (size_t)(48 * n);
    out->max_instructions =
        (out->max_instructions ? out->max_instructions : KPT_LUA_DEFAULT_INSTRUCTIONS) +
        (uint64_t)(256 * n);
    out->max_seconds =
        (out->max_seconds > 0 ? out->max_seconds : KPT_LUA_DEFAULT_SECONDS) + n * 1e-6;
    return out;
}

kpt_status kpt_lua_fill_aux(const char *source, size_t length, const kpt_lua_params *params,
                            const char *aux, int rank, const int64_t *shape, uint64_t seed,
                            double *out, kpt_diag *diag)
{
    if (!source || !aux || !shape || !out || rank < 1 || rank > KPT_AUX_MAX_RANK)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT, "kpt_lua_fill_aux: bad arguments");
    kpt_lua_params prm;
    run_ctx c = {.src = source, .len = length, .prm = fill_limits(params, rank, shape, &prm),
                 .fill_aux = aux, .rank = rank, .shape = shape, .seed = seed, .out = out};
    c.h.display = display_name(params);
    c.h.p = kpt_pattern_new("");
    if (!c.h.p)
        return kpt_diag_set(diag, KPT_ERR_NO_MEMORY, "out of memory");
    c.h.p->g.max_nodes = KPT_LUA_MAX_NODES;
    kpt_status st = run(&c, diag);
    kpt_pattern_destroy(&c.h.p);
    return st;
}

char *kpt_lua_read_file(const char *path, size_t *length, kpt_diag *diag)
{
    long long size = 0;
    FILE *f = kpt_open_regular(path, "script", &size, diag);
    if (!f)
        return NULL;
    if (size > (long long)KPT_LUA_MAX_SOURCE) {
        fclose(f);
        kpt_diag_set(diag, KPT_ERR_LIMIT, "%s is larger than %zu bytes", path, KPT_LUA_MAX_SOURCE);
        return NULL;
    }
    char *buf = malloc(KPT_LUA_MAX_SOURCE + 2);
    size_t n = buf ? fread(buf, 1, KPT_LUA_MAX_SOURCE + 1, f) : 0;
    bool err = ferror(f) != 0;
    fclose(f);
    if (!buf) {
        kpt_diag_set(diag, KPT_ERR_NO_MEMORY, "out of memory");
        return NULL;
    }
    if (err || n > KPT_LUA_MAX_SOURCE) {
        free(buf);
        if (err)
            kpt_diag_set(diag, KPT_ERR_IO, "cannot read %s", path);
        else
            kpt_diag_set(diag, KPT_ERR_LIMIT, "%s is larger than %zu bytes", path,
                         KPT_LUA_MAX_SOURCE);
        return NULL;
    }
    buf[n] = 0;
    *length = n;
    return buf;
}

kpt_status kpt_pattern_from_lua(const char *source, size_t length, const kpt_lua_params *params,
                                kpt_pattern **out, kpt_diag *diag)
{
    kpt_diag local;
    if (!diag)
        diag = &local;
    if (!out)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT, "kpt_pattern_from_lua: out is NULL");
    *out = NULL;
    return kpt_pipeline_finish(kpt_parse_lua(source, length, params, diag), out, diag);
}

kpt_status kpt_pattern_from_lua_file(const char *path, const kpt_lua_params *params,
                                     kpt_pattern **out, kpt_diag *diag)
{
    kpt_diag local;
    if (!diag)
        diag = &local;
    if (!out || !path)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                            "kpt_pattern_from_lua_file: path or out is NULL");
    *out = NULL;
    size_t len;
    char *src = kpt_lua_read_file(path, &len, diag);
    if (!src)
        return diag->status;
    kpt_lua_params prm = params ? *params : (kpt_lua_params){0};
    if (!prm.name)
        prm.name = path;
    kpt_status st = kpt_pipeline_finish(kpt_parse_lua(src, len, &prm, diag), out, diag);
    free(src);
    return st;
}
