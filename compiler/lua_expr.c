/* The `kpt` module: tracing Lua into IR.
 *
 * A symbolic value (EXPR) is a userdata holding one IR node. Operators and kpt's functions build
 * nodes through the hash-consing builder, so what a script computes becomes the same IR the
 * built-ins produce. Plain Lua numbers stay Lua numbers (Lua folds them); they become constants
 * only when they meet a symbolic value. Typing (docs/lua.md, "Types"):
 *   - i32 meets f32 (or a number with a fraction): the i32 side converts to f32;
 *   - `/` and `^` always give f32; `//` and `%` keep the operands' type;
 *   - booleans never mix with numbers; & | ~ take booleans only;
 *   - indices of aux tensors are i32 (or integral numbers).
 * Every error is raised at the script's line (level 1: the Lua code that applied the operator).
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lauxlib.h>

#include "compiler/builtins.h"
#include "compiler/lua_expr.h"
#include "compiler/parse_pattern.h"

#define EXPR_MT "kpt.expr"
#define AUX_MT "kpt.aux"
#define ENV_MT "kpt.env"
#define SPEC_MT "kpt.pattern"

typedef struct lexpr {
    kpt_ir_ref ref;
} lexpr;

/* An aux tensor with some of its indices given. */
typedef struct laux {
    uint32_t aux;
    int n;
    kpt_ir_ref idx[KPT_AUX_MAX_RANK];
} laux;

static kpt_lua_host *host(lua_State *L)
{
    kpt_lua_host *h = kpt_sandbox_of(L)->user;
    if (!h) /* a finalizer running while the state closes: the pattern is finished */
        luaL_error(L, "kpt cannot be used while the script is being closed");
    return h;
}

static kpt_ir_graph *graph(lua_State *L)
{
    return &host(L)->p->g;
}

#define KPT_LUA_COST_BUILTIN 500 /* budget steps per kpt.builtin call, besides its text */
#define RAISE(L, st, ...) kpt_sandbox_raise(L, 1, st, __VA_ARGS__)

/* Checks a builder result: 0 means the graph failed (node limit, out of memory). */
static kpt_ir_ref built(lua_State *L, kpt_ir_ref r)
{
    kpt_ir_graph *g = graph(L);
    if (!r || g->failed)
        RAISE(L, g->out_of_memory ? KPT_ERR_NO_MEMORY : KPT_ERR_LIMIT, "%s", g->error);
    return r;
}

/* Records the script line that made node r when it is an operation (not a variable, constant
 * or scalar, which a script may well leave unused). */
static void note_made(lua_State *L, kpt_ir_ref r)
{
    kpt_lua_host *h = kpt_sandbox_of(L)->user;
    if (!h || !h->made_line || r > KPT_LUA_MAX_NODES || h->made_line[r])
        return;
    const kpt_ir_node *n = &h->p->g.nodes[r];
    if (n->nargs == 0)
        return;
    lua_Debug ar;
    for (int level = 1; lua_getstack(L, level, &ar); level++)
        if (lua_getinfo(L, "Sl", &ar) && ar.currentline > 0) {
            h->made_line[r] = ar.currentline;
            return;
        }
}

void kpt_lua_push_expr(lua_State *L, kpt_ir_ref r)
{
    note_made(L, r);
    lexpr *e = lua_newuserdatauv(L, sizeof(*e), 0);
    e->ref = r;
    luaL_setmetatable(L, EXPR_MT);
}

kpt_ir_ref kpt_lua_to_expr(lua_State *L, int idx)
{
    lexpr *e = luaL_testudata(L, idx, EXPR_MT);
    return e ? e->ref : 0;
}

static kpt_ir_type type_of(lua_State *L, kpt_ir_ref r)
{
    return kpt_ir_type_of(graph(L), r);
}

static const char *type_words(kpt_ir_type t)
{
    switch (t) {
    case KPT_IR_I32: return "an i32 expression";
    case KPT_IR_F32: return "an f32 expression";
    case KPT_IR_BOOL: return "a boolean expression";
    default: return "a value without a type";
    }
}

const char *kpt_lua_describe(lua_State *L, int idx, char *buf, size_t n)
{
    kpt_ir_ref r = kpt_lua_to_expr(L, idx);
    if (r)
        return type_words(type_of(L, r));
    laux *a = luaL_testudata(L, idx, AUX_MT);
    if (a) {
        snprintf(buf, n, "aux tensor '%s' with %d of its %d indices",
                 host(L)->p->aux[a->aux].name, a->n, host(L)->p->aux[a->aux].rank);
        return buf;
    }
    switch (lua_type(L, idx)) {
    case LUA_TNUMBER:
        if (lua_isinteger(L, idx))
            snprintf(buf, n, "the number %lld", (long long)lua_tointeger(L, idx));
        else
            snprintf(buf, n, "the number %.17g", (double)lua_tonumber(L, idx));
        return buf;
    case LUA_TBOOLEAN: return lua_toboolean(L, idx) ? "the boolean true" : "the boolean false";
    case LUA_TNIL: return "nil";
    case LUA_TSTRING: return "a string";
    default: snprintf(buf, n, "a %s", luaL_typename(L, idx)); return buf;
    }
}

/* ---- operands ---------------------------------------------------------------------------- */

typedef enum { OP_EXPR, OP_INT, OP_FLOAT, OP_BOOL } operand_kind;

typedef struct operand {
    operand_kind kind;
    kpt_ir_ref ref;   /* OP_EXPR */
    kpt_ir_type type; /* OP_EXPR: the node's type; literals: the type they have on their own */
    lua_Integer i;
    lua_Number f;
    bool b;
    int idx; /* stack index, for messages */
} operand;

/* The value at idx as an operand, or an error naming `what` (the operation). */
static operand get_operand(lua_State *L, int idx, const char *what)
{
    operand o = {.idx = idx};
    char buf[120];
    o.ref = kpt_lua_to_expr(L, idx);
    if (o.ref) {
        o.kind = OP_EXPR;
        o.type = type_of(L, o.ref);
        return o;
    }
    switch (lua_type(L, idx)) {
    case LUA_TNUMBER:
        if (lua_isinteger(L, idx)) {
            o.kind = OP_INT;
            o.i = lua_tointeger(L, idx);
            o.type = KPT_IR_I32;
        } else {
            o.kind = OP_FLOAT;
            o.f = lua_tonumber(L, idx);
            o.type = KPT_IR_F32;
        }
        return o;
    case LUA_TBOOLEAN:
        o.kind = OP_BOOL;
        o.b = lua_toboolean(L, idx);
        o.type = KPT_IR_BOOL;
        return o;
    default: break;
    }
    laux *a = luaL_testudata(L, idx, AUX_MT);
    if (a)
        RAISE(L, KPT_ERR_TYPE, "%s: aux tensor '%s' has rank %d but was given %d ind%s",
              what, host(L)->p->aux[a->aux].name, host(L)->p->aux[a->aux].rank, a->n,
              a->n == 1 ? "ex" : "ices");
    RAISE(L, KPT_ERR_TYPE, "%s: expected a number, a boolean or a kpt expression, got %s", what,
          kpt_lua_describe(L, idx, buf, sizeof(buf)));
    return o;
}

static const char *operand_words(lua_State *L, const operand *o, char *buf, size_t n)
{
    return kpt_lua_describe(L, o->idx, buf, n);
}

/* The operand as a node of type t (t is what unify chose, so the conversions below are the only
 * ones needed). */
static kpt_ir_ref materialize(lua_State *L, const operand *o, kpt_ir_type t, const char *what)
{
    kpt_ir_graph *g = graph(L);
    char buf[120];
    switch (o->kind) {
    case OP_EXPR:
        if (o->type == t)
            return o->ref;
        if (o->type == KPT_IR_I32 && t == KPT_IR_F32)
            return built(L, kpt_ir_unop(g, KPT_IR_TO_F32, o->ref));
        break;
    case OP_INT:
        if (t == KPT_IR_F32)
            return built(L, kpt_ir_const_f32(g, (float)o->i));
        if (t == KPT_IR_I32) {
            if (o->i < INT32_MIN || o->i > INT32_MAX)
                RAISE(L, KPT_ERR_TYPE, "%s: the integer %lld does not fit in i32", what,
                      (long long)o->i);
            return built(L, kpt_ir_const_i32(g, (int32_t)o->i));
        }
        break;
    case OP_FLOAT:
        if (isnan(o->f))
            RAISE(L, KPT_ERR_TYPE, "%s: the number is NaN", what);
        if (t == KPT_IR_F32)
            return built(L, kpt_ir_const_f32(g, (float)o->f));
        if (t == KPT_IR_I32 && o->f == floor(o->f) && o->f >= INT32_MIN && o->f <= INT32_MAX)
            return built(L, kpt_ir_const_i32(g, (int32_t)o->f));
        break;
    case OP_BOOL:
        if (t == KPT_IR_BOOL)
            return built(L, kpt_ir_const_bool(g, o->b));
        break;
    }
    RAISE(L, KPT_ERR_TYPE, "%s: %s where %s is needed", what, operand_words(L, o, buf, sizeof(buf)),
          t == KPT_IR_I32 ? "an integer" : t == KPT_IR_F32 ? "a number" : "a boolean");
    return 0;
}

/* The common numeric type of two operands: f32 if either is, else i32; booleans are refused. */
static kpt_ir_type unify(lua_State *L, const operand *a, const operand *b, const char *what)
{
    char b1[120], b2[120];
    if (a->type == KPT_IR_BOOL || b->type == KPT_IR_BOOL)
        RAISE(L, KPT_ERR_TYPE, "cannot %s %s and %s (booleans do not mix with numbers; convert "
              "with kpt.int(x) or kpt.float(x))", what, operand_words(L, a, b1, sizeof(b1)),
              operand_words(L, b, b2, sizeof(b2)));
    return a->type == KPT_IR_F32 || b->type == KPT_IR_F32 ? KPT_IR_F32 : KPT_IR_I32;
}

/* ---- arithmetic ---------------------------------------------------------------------------- */

static const char *op_verb(kpt_ir_op op)
{
    switch (op) {
    case KPT_IR_ADD: return "add";
    case KPT_IR_SUB: return "subtract";
    case KPT_IR_MUL: return "multiply";
    case KPT_IR_DIV: return "divide (/)";
    case KPT_IR_IDIV: return "floor-divide (//)";
    case KPT_IR_MOD: return "take the remainder (%) of";
    case KPT_IR_POW: return "raise (^)";
    case KPT_IR_MIN: return "take kpt.min of";
    case KPT_IR_MAX: return "take kpt.max of";
    case KPT_IR_LT: return "compare (lt)";
    case KPT_IR_LE: return "compare (le)";
    case KPT_IR_GT: return "compare (gt)";
    case KPT_IR_GE: return "compare (ge)";
    case KPT_IR_EQ: return "compare (eq)";
    case KPT_IR_NE: return "compare (ne)";
    default: return kpt_ir_op_name(op);
    }
}

/* Builds a op b for numeric ops and comparisons, values at stack indices ia, ib. */
static kpt_ir_ref binary(lua_State *L, kpt_ir_op op, int ia, int ib)
{
    const char *what = op_verb(op);
    operand a = get_operand(L, ia, what), b = get_operand(L, ib, what);
    kpt_ir_type t;
    if ((op == KPT_IR_EQ || op == KPT_IR_NE) && a.type == KPT_IR_BOOL && b.type == KPT_IR_BOOL)
        t = KPT_IR_BOOL;
    else
        t = unify(L, &a, &b, what);
    if (op == KPT_IR_DIV || op == KPT_IR_POW)
        t = KPT_IR_F32; /* Lua: / and ^ always give floats */
    kpt_ir_ref x = materialize(L, &a, t, what);
    kpt_ir_ref y = materialize(L, &b, t, what);
    return built(L, kpt_ir_binop(graph(L), op, x, y));
}

static int push_binary(lua_State *L, kpt_ir_op op)
{
    kpt_lua_push_expr(L, binary(L, op, 1, 2));
    return 1;
}

static int m_add(lua_State *L) { return push_binary(L, KPT_IR_ADD); }
static int m_sub(lua_State *L) { return push_binary(L, KPT_IR_SUB); }
static int m_mul(lua_State *L) { return push_binary(L, KPT_IR_MUL); }
static int m_div(lua_State *L) { return push_binary(L, KPT_IR_DIV); }
static int m_idiv(lua_State *L) { return push_binary(L, KPT_IR_IDIV); }
static int m_mod(lua_State *L) { return push_binary(L, KPT_IR_MOD); }
static int m_pow(lua_State *L) { return push_binary(L, KPT_IR_POW); }
static int m_lt(lua_State *L) { return push_binary(L, KPT_IR_LT); }
static int m_le(lua_State *L) { return push_binary(L, KPT_IR_LE); }
static int m_gt(lua_State *L) { return push_binary(L, KPT_IR_GT); }
static int m_ge(lua_State *L) { return push_binary(L, KPT_IR_GE); }
static int m_eq(lua_State *L) { return push_binary(L, KPT_IR_EQ); }
static int m_ne(lua_State *L) { return push_binary(L, KPT_IR_NE); }

static int m_unm(lua_State *L)
{
    operand a = get_operand(L, 1, "negate");
    char buf[120];
    if (a.type == KPT_IR_BOOL)
        RAISE(L, KPT_ERR_TYPE, "cannot negate %s (use ~ for boolean not)",
              operand_words(L, &a, buf, sizeof(buf)));
    kpt_lua_push_expr(L, built(L, kpt_ir_unop(graph(L), KPT_IR_NEG, a.ref)));
    return 1;
}

/* ---- booleans and integer bits ------------------------------------------------------------ */

/* An operand of & | ~ << >>: booleans (masks) or integers (i32 expressions, or numbers with an
 * integral value, as Lua's own bitwise operators take them). */
static operand bits_operand(lua_State *L, int idx, const char *sym)
{
    char buf[120];
    operand o = get_operand(L, idx, sym);
    bool integral = o.type == KPT_IR_I32 || (o.kind == OP_FLOAT && o.f == floor(o.f));
    if (o.type != KPT_IR_BOOL && !integral)
        RAISE(L, KPT_ERR_TYPE, "%s takes booleans (masks) or integers, got %s%s", sym,
              operand_words(L, &o, buf, sizeof(buf)),
              o.type == KPT_IR_F32 ? " (convert with kpt.int(x))" : "");
    return o;
}

/* a op b: the logic op on booleans, the bit op on integers (logic KPT_IR_OP_COUNT: shifts,
 * integers only). */
static int push_bits(lua_State *L, kpt_ir_op logic, kpt_ir_op bits, const char *sym)
{
    char b1[120], b2[120];
    operand a = bits_operand(L, 1, sym), b = bits_operand(L, 2, sym);
    bool ab = a.type == KPT_IR_BOOL, bb = b.type == KPT_IR_BOOL;
    if (ab != bb || (logic == KPT_IR_OP_COUNT && ab))
        RAISE(L, KPT_ERR_TYPE, "%s takes %s, got %s and %s", sym,
              logic == KPT_IR_OP_COUNT ? "integers" : "two booleans (masks) or two integers",
              operand_words(L, &a, b1, sizeof(b1)), operand_words(L, &b, b2, sizeof(b2)));
    kpt_ir_type t = ab ? KPT_IR_BOOL : KPT_IR_I32;
    kpt_ir_ref x = materialize(L, &a, t, sym), y = materialize(L, &b, t, sym);
    kpt_lua_push_expr(L, built(L, kpt_ir_binop(graph(L), t == KPT_IR_BOOL ? logic : bits, x, y)));
    return 1;
}

static int m_band(lua_State *L) { return push_bits(L, KPT_IR_AND, KPT_IR_BAND, "&"); }
static int m_bor(lua_State *L) { return push_bits(L, KPT_IR_OR, KPT_IR_BOR, "|"); }
static int m_bxor(lua_State *L) { return push_bits(L, KPT_IR_NE, KPT_IR_BXOR, "~ (exclusive or)"); }
/* Lua's >> is logical (zeros shift in); x:ashr(n) is the arithmetic shift */
static int m_shl(lua_State *L) { return push_bits(L, KPT_IR_OP_COUNT, KPT_IR_SHL, "<<"); }
static int m_shr(lua_State *L) { return push_bits(L, KPT_IR_OP_COUNT, KPT_IR_SHRU, ">>"); }
static int m_ashr(lua_State *L) { return push_bits(L, KPT_IR_OP_COUNT, KPT_IR_SHR, "ashr"); }

static int m_bnot(lua_State *L)
{
    operand a = bits_operand(L, 1, "~ (not)");
    bool b = a.type == KPT_IR_BOOL;
    kpt_ir_ref x = materialize(L, &a, b ? KPT_IR_BOOL : KPT_IR_I32, "~ (not)");
    kpt_lua_push_expr(L, built(L, kpt_ir_unop(graph(L), b ? KPT_IR_NOT : KPT_IR_BNOT, x)));
    return 1;
}

/* ---- what Lua cannot turn into values ------------------------------------------------------ */

static int m_no_eq(lua_State *L)
{
    return RAISE(L, KPT_ERR_TYPE, "'==' and '~=' compare Lua values, not expressions: write "
                 "a:eq(b) or a:ne(b)");
}
static int m_no_lt(lua_State *L)
{
    return RAISE(L, KPT_ERR_TYPE, "'<' and '>' cannot build expressions in Lua: write a:lt(b) or "
                 "a:gt(b)");
}
static int m_no_le(lua_State *L)
{
    return RAISE(L, KPT_ERR_TYPE, "'<=' and '>=' cannot build expressions in Lua: write a:le(b) "
                 "or a:ge(b)");
}
static int m_no_concat(lua_State *L)
{
    return RAISE(L, KPT_ERR_TYPE, "cannot concatenate (..) a kpt expression");
}
static int m_no_len(lua_State *L)
{
    return RAISE(L, KPT_ERR_TYPE, "a kpt expression has no length (#)");
}
static int m_no_call(lua_State *L)
{
    return RAISE(L, KPT_ERR_TYPE, "a kpt expression is not a function");
}
static int m_no_newindex(lua_State *L)
{
    return RAISE(L, KPT_ERR_TYPE, "kpt expressions and aux tensors are read-only");
}

static int m_tostring(lua_State *L)
{
    lua_pushfstring(L, "kpt.expr(%s)", kpt_ir_type_name(type_of(L, kpt_lua_to_expr(L, 1))));
    return 1;
}

/* ---- casts and functions ----------------------------------------------------------------- */

static int f_float(lua_State *L)
{
    operand a = get_operand(L, 1, "kpt.float");
    if (a.kind != OP_EXPR) {
        lua_pushnumber(L, a.kind == OP_INT ? (lua_Number)a.i : a.kind == OP_FLOAT ? a.f : a.b);
        return 1;
    }
    kpt_ir_ref r = a.type == KPT_IR_F32 ? a.ref : built(L, kpt_ir_unop(graph(L), KPT_IR_TO_F32, a.ref));
    kpt_lua_push_expr(L, r);
    return 1;
}

static int f_int(lua_State *L)
{
    operand a = get_operand(L, 1, "kpt.int");
    switch (a.kind) {
    case OP_INT: lua_pushinteger(L, a.i); return 1;
    case OP_BOOL: lua_pushinteger(L, a.b); return 1;
    case OP_FLOAT: {
        /* the IR's rule: floor, saturate to i32, NaN gives 0 */
        double v = isnan(a.f) ? 0 : floor(a.f);
        v = v < INT32_MIN ? INT32_MIN : v > INT32_MAX ? INT32_MAX : v;
        lua_pushinteger(L, (lua_Integer)v);
        return 1;
    }
    case OP_EXPR: break;
    }
    kpt_ir_ref r = a.type == KPT_IR_I32 ? a.ref : built(L, kpt_ir_unop(graph(L), KPT_IR_TO_I32, a.ref));
    kpt_lua_push_expr(L, r);
    return 1;
}

/* exp, log, tanh, erf, sqrt: f32 functions; plain numbers are computed here (constants fold). */
static int float_fn(lua_State *L, kpt_ir_op op, const char *name, double (*fn)(double))
{
    char what[32], buf[120];
    snprintf(what, sizeof(what), "kpt.%s", name);
    operand a = get_operand(L, 1, what);
    if (a.type == KPT_IR_BOOL)
        RAISE(L, KPT_ERR_TYPE, "%s takes a number, got %s", what, operand_words(L, &a, buf, sizeof(buf)));
    if (a.kind != OP_EXPR) {
        lua_pushnumber(L, fn(a.kind == OP_INT ? (double)a.i : a.f));
        return 1;
    }
    kpt_ir_ref x = materialize(L, &a, KPT_IR_F32, what);
    kpt_lua_push_expr(L, built(L, kpt_ir_unop(graph(L), op, x)));
    return 1;
}

static int f_exp(lua_State *L) { return float_fn(L, KPT_IR_EXP, "exp", exp); }
static int f_log(lua_State *L) { return float_fn(L, KPT_IR_LOG, "log", log); }
static int f_tanh(lua_State *L) { return float_fn(L, KPT_IR_TANH, "tanh", tanh); }
static int f_sqrt(lua_State *L) { return float_fn(L, KPT_IR_SQRT, "sqrt", sqrt); }
static int f_erf(lua_State *L) { return float_fn(L, KPT_IR_ERF, "erf", erf); }

static int f_abs(lua_State *L)
{
    char buf[120];
    operand a = get_operand(L, 1, "kpt.abs");
    switch (a.kind) {
    case OP_INT: lua_pushinteger(L, a.i < 0 ? (lua_Integer)(0u - (lua_Unsigned)a.i) : a.i); return 1;
    case OP_FLOAT: lua_pushnumber(L, fabs(a.f)); return 1;
    case OP_BOOL:
        RAISE(L, KPT_ERR_TYPE, "kpt.abs takes a number, got %s", operand_words(L, &a, buf, sizeof(buf)));
        return 0;
    case OP_EXPR: break;
    }
    if (a.type == KPT_IR_BOOL)
        RAISE(L, KPT_ERR_TYPE, "kpt.abs takes a number, got %s", operand_words(L, &a, buf, sizeof(buf)));
    kpt_lua_push_expr(L, built(L, kpt_ir_unop(graph(L), KPT_IR_ABS, a.ref)));
    return 1;
}

static int f_floor(lua_State *L)
{
    char buf[120];
    operand a = get_operand(L, 1, "kpt.floor");
    switch (a.kind) {
    case OP_INT: lua_pushinteger(L, a.i); return 1;
    case OP_FLOAT: {
        double v = floor(a.f);
        if (v >= -9.2e18 && v <= 9.2e18)
            lua_pushinteger(L, (lua_Integer)v); /* as math.floor */
        else
            lua_pushnumber(L, v);
        return 1;
    }
    case OP_BOOL:
    case OP_EXPR: break;
    }
    if (a.type == KPT_IR_BOOL)
        RAISE(L, KPT_ERR_TYPE, "kpt.floor takes a number, got %s", operand_words(L, &a, buf, sizeof(buf)));
    if (a.type == KPT_IR_I32)
        kpt_lua_push_expr(L, a.ref);
    else
        kpt_lua_push_expr(L, built(L, kpt_ir_unop(graph(L), KPT_IR_FLOOR, a.ref)));
    return 1;
}

/* min/max of the values at ia and ib, left on the stack top. */
static void min_max2(lua_State *L, kpt_ir_op op, int ia, int ib)
{
    if (lua_type(L, ia) == LUA_TNUMBER && lua_type(L, ib) == LUA_TNUMBER) {
        bool a_less = lua_compare(L, ia, ib, LUA_OPLT);
        lua_pushvalue(L, (op == KPT_IR_MIN) == a_less ? ia : ib);
        return;
    }
    kpt_lua_push_expr(L, binary(L, op, ia, ib));
}

static int min_max(lua_State *L, kpt_ir_op op)
{
    int n = lua_gettop(L);
    if (n < 2)
        return RAISE(L, KPT_ERR_TYPE, "kpt.%s needs at least two values", op == KPT_IR_MIN ? "min" : "max");
    lua_pushvalue(L, 1);
    for (int i = 2; i <= n; i++) {
        min_max2(L, op, n + 1, i);
        lua_replace(L, n + 1);
    }
    return 1;
}

static int f_min(lua_State *L) { return min_max(L, KPT_IR_MIN); }
static int f_max(lua_State *L) { return min_max(L, KPT_IR_MAX); }

static int f_clamp(lua_State *L)
{
    lua_settop(L, 3);
    min_max2(L, KPT_IR_MAX, 1, 2); /* 4 */
    min_max2(L, KPT_IR_MIN, 4, 3); /* 5 */
    return 1;
}

static int f_where(lua_State *L)
{
    lua_settop(L, 3);
    char buf[120];
    operand c = get_operand(L, 1, "kpt.where");
    if (c.type != KPT_IR_BOOL)
        RAISE(L, KPT_ERR_TYPE, "kpt.where(c, a, b): c must be a boolean, got %s",
              operand_words(L, &c, buf, sizeof(buf)));
    if (c.kind == OP_BOOL) { /* decided now */
        get_operand(L, c.b ? 2 : 3, "kpt.where"); /* still must be a value */
        lua_pushvalue(L, c.b ? 2 : 3);
        return 1;
    }
    operand a = get_operand(L, 2, "kpt.where"), b = get_operand(L, 3, "kpt.where");
    kpt_ir_type t = a.type == KPT_IR_BOOL && b.type == KPT_IR_BOOL
                        ? KPT_IR_BOOL
                        : unify(L, &a, &b, "select (kpt.where) between");
    kpt_ir_ref x = materialize(L, &a, t, "kpt.where"), y = materialize(L, &b, t, "kpt.where");
    kpt_lua_push_expr(L, built(L, kpt_ir_select(graph(L), c.ref, x, y)));
    return 1;
}

/* kpt.lt(a, b) ... as functions: they accept a number on the left. Two numbers compare now. */
static int compare_fn(lua_State *L, kpt_ir_op op, int lua_op, bool swap, bool negate)
{
    lua_settop(L, 2);
    if (lua_type(L, 1) == LUA_TNUMBER && lua_type(L, 2) == LUA_TNUMBER) {
        bool r = op == KPT_IR_EQ || op == KPT_IR_NE ? lua_compare(L, 1, 2, LUA_OPEQ)
                 : swap                          ? lua_compare(L, 2, 1, lua_op)
                                                 : lua_compare(L, 1, 2, lua_op);
        lua_pushboolean(L, r != negate);
        return 1;
    }
    return push_binary(L, op);
}

static int f_lt(lua_State *L) { return compare_fn(L, KPT_IR_LT, LUA_OPLT, false, false); }
static int f_le(lua_State *L) { return compare_fn(L, KPT_IR_LE, LUA_OPLE, false, false); }
static int f_gt(lua_State *L) { return compare_fn(L, KPT_IR_GT, LUA_OPLT, true, false); }
static int f_ge(lua_State *L) { return compare_fn(L, KPT_IR_GE, LUA_OPLE, true, false); }
static int f_eq(lua_State *L) { return compare_fn(L, KPT_IR_EQ, LUA_OPEQ, false, false); }
static int f_ne(lua_State *L) { return compare_fn(L, KPT_IR_NE, LUA_OPEQ, false, true); }

/* ---- expression methods ---------------------------------------------------------------------- */

static const luaL_Reg expr_methods[] = {
    {"lt", m_lt}, {"le", m_le}, {"gt", m_gt}, {"ge", m_ge}, {"eq", m_eq}, {"ne", m_ne},
    {"float", f_float}, {"int", f_int}, {"ashr", m_ashr}, {NULL, NULL},
};

static int m_index(lua_State *L)
{
    if (lua_type(L, 2) == LUA_TSTRING) {
        const char *k = lua_tostring(L, 2);
        for (const luaL_Reg *m = expr_methods; m->name; m++)
            if (!strcmp(m->name, k)) {
                lua_pushcfunction(L, m->func);
                return 1;
            }
        return RAISE(L, KPT_ERR_NOT_FOUND, "kpt expressions have no method '%s' (methods: lt le "
                     "gt ge eq ne float int ashr)", k);
    }
    kpt_ir_ref r = kpt_lua_to_expr(L, 1);
    const kpt_ir_node *n = kpt_ir_node_get(graph(L), r);
    if (n->op == KPT_IR_LOAD) {
        const kpt_aux_decl *d = &host(L)->p->aux[n->imm.index];
        return RAISE(L, KPT_ERR_TYPE, "too many indices: aux tensor '%s' has rank %d", d->name,
                     d->rank);
    }
    return RAISE(L, KPT_ERR_TYPE, "cannot index %s (only aux tensors are indexed)",
                 type_words(type_of(L, r)));
}

/* ---- aux tensors ----------------------------------------------------------------------------- */

static void push_aux(lua_State *L, const laux *src)
{
    laux *a = lua_newuserdatauv(L, sizeof(*a), 0);
    *a = *src;
    luaL_setmetatable(L, AUX_MT);
}

static int aux_index(lua_State *L)
{
    laux *a = luaL_checkudata(L, 1, AUX_MT);
    const kpt_aux_decl *d = &host(L)->p->aux[a->aux];
    char what[80], buf[120];
    snprintf(what, sizeof(what), "index %d of aux tensor '%s'", a->n + 1, d->name);
    if (lua_type(L, 2) == LUA_TSTRING)
        return RAISE(L, KPT_ERR_TYPE, "aux tensor '%s' is indexed with the string '%.40s'; index "
                     "it with integer expressions: %s[q]", d->name, lua_tostring(L, 2), d->name);
    operand o = get_operand(L, 2, what);
    if (o.type != KPT_IR_I32 && !(o.kind == OP_FLOAT && o.f == floor(o.f)))
        return RAISE(L, KPT_ERR_TYPE, "%s must be an integer, got %s%s", what,
                     operand_words(L, &o, buf, sizeof(buf)),
                     o.type == KPT_IR_F32 ? " (convert with kpt.int(x) or use //)" : "");
    laux next = *a;
    next.idx[next.n++] = materialize(L, &o, KPT_IR_I32, what);
    if (next.n < d->rank) {
        push_aux(L, &next);
        return 1;
    }
    kpt_lua_push_expr(L, built(L, kpt_ir_load(graph(L), next.aux, next.n, next.idx)));
    return 1;
}

static int aux_tostring(lua_State *L)
{
    laux *a = luaL_checkudata(L, 1, AUX_MT);
    lua_pushfstring(L, "kpt.aux(%s)", host(L)->p->aux[a->aux].name);
    return 1;
}

/* ---- the `p` argument: params and aux tensors by name ------------------------------------- */

void kpt_lua_push_env(lua_State *L, int params_idx)
{
    params_idx = lua_absindex(L, params_idx);
    lua_newuserdatauv(L, 1, 1);
    lua_pushvalue(L, params_idx);
    lua_setiuservalue(L, -2, 1);
    luaL_setmetatable(L, ENV_MT);
}

static void list_names(lua_State *L, char *buf, size_t n)
{
    kpt_pattern *p = host(L)->p;
    size_t len = 0;
    buf[0] = 0;
    lua_getiuservalue(L, 1, 1);
    lua_pushnil(L);
    while (lua_next(L, -2)) {
        if (lua_type(L, -2) == LUA_TSTRING && len < n)
            len += (size_t)snprintf(buf + len, n - len, "%s%s", len ? ", " : "", lua_tostring(L, -2));
        lua_pop(L, 1);
    }
    lua_pop(L, 1);
    for (int i = 0; i < p->num_aux && len < n; i++)
        len += (size_t)snprintf(buf + len, n - len, "%s%s", len ? ", " : "", p->aux[i].name);
    if (!buf[0])
        snprintf(buf, n, "none");
}

static int env_index(lua_State *L)
{
    lua_getiuservalue(L, 1, 1);
    lua_pushvalue(L, 2);
    if (lua_rawget(L, -2) != LUA_TNIL)
        return 1;
    lua_pop(L, 2);
    if (lua_type(L, 2) == LUA_TSTRING) {
        int i = kpt_pattern_find_aux(host(L)->p, lua_tostring(L, 2));
        if (i >= 0) {
            laux a = {.aux = (uint32_t)i};
            push_aux(L, &a);
            return 1;
        }
    }
    char names[400], buf[120];
    list_names(L, names, sizeof(names));
    if (lua_type(L, 2) == LUA_TSTRING)
        return RAISE(L, KPT_ERR_NOT_FOUND, "unknown aux tensor or param '%.40s' (this pattern "
                     "declares: %s)", lua_tostring(L, 2), names);
    return RAISE(L, KPT_ERR_NOT_FOUND, "params and aux tensors are named by strings, got %s",
                 kpt_lua_describe(L, 2, buf, sizeof(buf)));
}

/* ---- kpt.runtime, kpt.builtin ------------------------------------------------------------- */

static int f_runtime(lua_State *L)
{
    const char *name = luaL_checkstring(L, 1);
    kpt_ir_type type = KPT_IR_VOID;
    bool has_def = !lua_isnoneornil(L, 2);
    if (has_def && lua_type(L, 2) != LUA_TNUMBER)
        return RAISE(L, KPT_ERR_TYPE, "kpt.runtime('%s', default): the default must be a number",
                     name);
    if (!lua_isnoneornil(L, 3)) {
        const char *t = luaL_checkstring(L, 3);
        type = !strcmp(t, "int") || !strcmp(t, "i32")     ? KPT_IR_I32
               : !strcmp(t, "float") || !strcmp(t, "f32") ? KPT_IR_F32
                                                           : KPT_IR_VOID;
        if (!type)
            return RAISE(L, KPT_ERR_TYPE, "kpt.runtime: type '%.20s' is not 'int' or 'float'", t);
    } else if (has_def) {
        type = lua_isinteger(L, 2) ? KPT_IR_I32 : KPT_IR_F32;
    } else {
        return RAISE(L, KPT_ERR_TYPE, "kpt.runtime('%s'): give a default or a type ('int' or "
                     "'float')", name);
    }
    double def = has_def ? (double)lua_tonumber(L, 2) : 0;
    if (has_def && (!isfinite(def) || (type == KPT_IR_F32 && fabs(def) > FLT_MAX)))
        return RAISE(L, KPT_ERR_TYPE, "kpt.runtime('%s'): the default %g is not a finite %s", name,
                     def, type == KPT_IR_F32 ? "f32" : "number");
    if (has_def && type == KPT_IR_I32 && (def != floor(def) || fabs(def) > INT32_MAX))
        return RAISE(L, KPT_ERR_TYPE, "kpt.runtime('%s'): the default %g is not an i32", name, def);
    char err[200];
    int idx = kpt_pattern_scalar(host(L)->p, name, type, has_def, def, err, sizeof(err));
    if (idx < 0)
        return RAISE(L, KPT_ERR_INVALID_ARGUMENT, "kpt.runtime: %s", err);
    kpt_lua_push_expr(L, built(L, kpt_ir_scalar(graph(L), (uint32_t)idx, type)));
    return 1;
}

/* kpt.builtin(text) -> the mask of a built-in pattern string;
 * kpt.builtin_score(text, s) -> s with the string's score modifications applied. */
static int builtin_common(lua_State *L, bool score)
{
    size_t len;
    const char *text = luaL_checklstring(L, 1, &len);
    /* parsing and building the IR runs in C, out of the hook's sight: charged as about as many
     * instructions as it takes time, with room to spare (measured: 0.6 us, ~120 instructions, for
     * kpt.builtin("causal")) */
    kpt_sandbox_charge(L, KPT_LUA_COST_BUILTIN + 4 * (uint64_t)len);
    kpt_ir_ref s_in = 0;
    if (score) {
        operand s = get_operand(L, 2, "kpt.builtin_score");
        s_in = materialize(L, &s, KPT_IR_F32, "kpt.builtin_score(text, s)");
    }
    kpt_diag d = {0};
    kpt_ir_ref s_out = 0, mask = 0;
    if (!kpt_parse_pattern_into(host(L)->p, text, s_in, &s_out, &mask, &d))
        return RAISE(L, d.status ? d.status : KPT_ERR_PARSE, "kpt.%s: %s",
                     score ? "builtin_score" : "builtin", d.message);
    if (score && mask)
        return RAISE(L, KPT_ERR_TYPE, "kpt.builtin_score('%.60s') has a mask; take masks with "
                     "kpt.builtin", text);
    if (!score && s_out != kpt_ir_var(graph(L), KPT_IR_S))
        return RAISE(L, KPT_ERR_TYPE, "kpt.builtin('%.60s') modifies the score; apply it with "
                     "kpt.builtin_score(text, s)", text);
    if (score) {
        kpt_lua_push_expr(L, s_out);
        return 1;
    }
    if (mask)
        kpt_lua_push_expr(L, mask);
    else
        lua_pushboolean(L, 1); /* "full": keeps everything */
    return 1;
}

static int f_builtin(lua_State *L) { return builtin_common(L, false); }
static int f_builtin_score(lua_State *L) { return builtin_common(L, true); }

/* ---- fill rules --------------------------------------------------------------------------- */

static int f_range(lua_State *L)
{
    lua_Number lo = luaL_checknumber(L, 1), hi = luaL_checknumber(L, 2);
    if (!(lo <= hi))
        return RAISE(L, KPT_ERR_INVALID_ARGUMENT, "kpt.range(lo, hi) needs lo <= hi");
    lua_createtable(L, 0, 1);
    lua_createtable(L, 2, 0);
    lua_pushvalue(L, 1);
    lua_rawseti(L, -2, 1);
    lua_pushvalue(L, 2);
    lua_rawseti(L, -2, 2);
    lua_setfield(L, -2, "range");
    return 1;
}

static int f_segments(lua_State *L)
{
    lua_pushliteral(L, "segments");
    return 1;
}

/* ---- kpt.pattern{...} ------------------------------------------------------------------------ */

kpt_lua_spec *kpt_lua_to_spec(lua_State *L, int idx)
{
    return luaL_testudata(L, idx, SPEC_MT);
}

/* Reads a dimension of an aux shape at the stack top. */
static int64_t read_dim(lua_State *L, const char *aux, int k)
{
    static const struct {
        const char *name;
        int64_t dim;
    } dims[] = {{"b", KPT_DIM_B},     {"hq", KPT_DIM_HQ},   {"hkv", KPT_DIM_HKV},
                {"sq", KPT_DIM_SQ},   {"skv", KPT_DIM_SKV}, {"any", KPT_DIM_ANY}};
    if (lua_type(L, -1) == LUA_TSTRING) {
        const char *s = lua_tostring(L, -1);
        for (size_t i = 0; i < sizeof(dims) / sizeof(dims[0]); i++)
            if (!strcmp(dims[i].name, s))
                return dims[i].dim;
    } else if (lua_isinteger(L, -1) && lua_tointeger(L, -1) > 0 &&
               lua_tointeger(L, -1) <= (1 << 24)) {
        return lua_tointeger(L, -1);
    }
    RAISE(L, KPT_ERR_INVALID_ARGUMENT, "aux '%s': dimension %d of shape must be \"b\", \"hq\", "
          "\"hkv\", \"sq\", \"skv\", \"any\" or a size from 1 to 16777216", aux, k + 1);
    return 0;
}

/* Parses aux[name] = {dtype=, shape=, fill=} (at the stack top) into d; a fill function is put
 * into the fills table at fills_idx. */
static void read_aux(lua_State *L, const char *name, kpt_aux_decl *d, int fills_idx)
{
    memset(d, 0, sizeof(*d));
    if (strlen(name) >= sizeof(d->name))
        RAISE(L, KPT_ERR_INVALID_ARGUMENT, "aux name '%.40s' is too long (at most %d characters)",
              name, KPT_NAME_MAX - 1);
    snprintf(d->name, sizeof(d->name), "%s", name);
    if (!lua_istable(L, -1))
        RAISE(L, KPT_ERR_INVALID_ARGUMENT, "aux '%s' must be a table {dtype=..., shape={...}}",
              name);
    lua_getfield(L, -1, "dtype");
    const char *dt = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : "";
    d->dtype = kpt_dtype_from_name(dt);
    if (kpt_aux_ir_type(d->dtype) == KPT_IR_VOID)
        RAISE(L, KPT_ERR_INVALID_ARGUMENT, "aux '%s': dtype must be \"int32\", \"float32\", "
              "\"bool\", \"float16\" or \"bfloat16\"", name);
    lua_pop(L, 1);
    lua_getfield(L, -1, "shape");
    if (!lua_istable(L, -1))
        RAISE(L, KPT_ERR_INVALID_ARGUMENT, "aux '%s': shape must be a list of 1 to %d "
              "dimensions, e.g. {\"b\", \"sq\"}", name, KPT_AUX_MAX_RANK);
    lua_Integer rank = luaL_len(L, -1);
    if (rank < 1 || rank > KPT_AUX_MAX_RANK)
        RAISE(L, KPT_ERR_INVALID_ARGUMENT, "aux '%s': rank %lld is not supported (1 to %d)", name,
              (long long)rank, KPT_AUX_MAX_RANK);
    d->rank = (int)rank;
    for (int k = 0; k < d->rank; k++) {
        lua_rawgeti(L, -1, k + 1);
        d->dims[k] = read_dim(L, name, k);
        lua_pop(L, 1);
    }
    lua_pop(L, 1);
    /* fill: how kptc check makes data when no file is given */
    bool real = d->dtype != KPT_DTYPE_I32 && d->dtype != KPT_DTYPE_BOOL;
    d->fill = KPT_FILL_RANGE;
    d->fill_lo = real ? -1 : 0;
    d->fill_hi = d->dtype == KPT_DTYPE_BOOL ? 1 : real ? 1 : 7;
    lua_getfield(L, -1, "fill");
    int ft = lua_type(L, -1);
    if (ft == LUA_TFUNCTION) {
        d->fill = KPT_FILL_SCRIPT;
        lua_pushvalue(L, -1);
        lua_setfield(L, fills_idx, name);
    } else if (ft == LUA_TSTRING && !strcmp(lua_tostring(L, -1), "segments")) {
        d->fill = KPT_FILL_SEGMENTS;
    } else if (ft == LUA_TTABLE && lua_getfield(L, -1, "range") == LUA_TTABLE) {
        lua_rawgeti(L, -1, 1);
        lua_rawgeti(L, -2, 2);
        if (!lua_isnumber(L, -2) || !lua_isnumber(L, -1) || !(lua_tonumber(L, -2) <= lua_tonumber(L, -1)))
            RAISE(L, KPT_ERR_INVALID_ARGUMENT, "aux '%s': fill = kpt.range(lo, hi) needs numbers "
                  "lo <= hi", name);
        d->fill_lo = lua_tonumber(L, -2);
        d->fill_hi = lua_tonumber(L, -1);
        lua_pop(L, 3);
    } else if (ft != LUA_TNIL) {
        RAISE(L, KPT_ERR_INVALID_ARGUMENT, "aux '%s': fill must be kpt.range(lo, hi), "
              "kpt.segments() or a function(shape, seed)", name);
    }
    lua_pop(L, 1);
}

static int compare_names(const void *a, const void *b)
{
    return strcmp(((const kpt_aux_decl *)a)->name, ((const kpt_aux_decl *)b)->name);
}

static void check_fields(lua_State *L)
{
    static const char *const known[] = {"name", "params", "aux", "score", "mask", NULL};
    lua_pushnil(L);
    while (lua_next(L, 1)) {
        lua_pop(L, 1);
        bool ok = false;
        if (lua_type(L, -1) == LUA_TSTRING)
            for (int i = 0; known[i]; i++)
                ok |= !strcmp(known[i], lua_tostring(L, -1));
        if (!ok) {
            char buf[120];
            RAISE(L, KPT_ERR_INVALID_ARGUMENT, "kpt.pattern{...}: unknown field %s%s%s (fields: "
                  "name, params, aux, score, mask)",
                  lua_type(L, -1) == LUA_TSTRING ? "'" : "",
                  lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1)
                                                 : kpt_lua_describe(L, -1, buf, sizeof(buf)),
                  lua_type(L, -1) == LUA_TSTRING ? "'" : "");
        }
    }
}

static void read_params(lua_State *L, int spec_idx)
{
    lua_newtable(L);
    int copy = lua_gettop(L);
    if (lua_getfield(L, 1, "params") != LUA_TNIL) {
        if (!lua_istable(L, -1))
            RAISE(L, KPT_ERR_INVALID_ARGUMENT, "kpt.pattern{...}: params must be a table "
                  "{name = value, ...}");
        lua_pushnil(L);
        while (lua_next(L, -2)) {
            char buf[120];
            if (lua_type(L, -2) != LUA_TSTRING)
                RAISE(L, KPT_ERR_INVALID_ARGUMENT, "params: names must be strings, got %s",
                      kpt_lua_describe(L, -2, buf, sizeof(buf)));
            int t = lua_type(L, -1);
            if (t != LUA_TNUMBER && t != LUA_TBOOLEAN && !kpt_lua_to_expr(L, -1))
                RAISE(L, KPT_ERR_INVALID_ARGUMENT, "param '%s' must be a number, a boolean or "
                      "kpt.runtime(...), got %s", lua_tostring(L, -2),
                      kpt_lua_describe(L, -1, buf, sizeof(buf)));
            lua_pushvalue(L, -2);
            lua_insert(L, -2);
            lua_rawset(L, copy);
        }
    }
    lua_pop(L, 1);
    lua_setiuservalue(L, spec_idx, SPEC_PARAMS);
}

static int f_pattern(lua_State *L)
{
    luaL_checktype(L, 1, LUA_TTABLE);
    lua_settop(L, 1);
    check_fields(L);
    kpt_lua_spec *spec = lua_newuserdatauv(L, sizeof(*spec), SPEC_NVALUES); /* 2 */
    memset(spec, 0, sizeof(*spec));
    luaL_setmetatable(L, SPEC_MT);
    lua_Debug ar;
    if (lua_getstack(L, 1, &ar) && lua_getinfo(L, "l", &ar))
        spec->line = ar.currentline;
    if (lua_getfield(L, 1, "name") != LUA_TNIL) {
        size_t n;
        const char *s = lua_tolstring(L, -1, &n);
        bool ok = lua_type(L, -1) == LUA_TSTRING && n > 0 && n < sizeof(spec->name);
        for (size_t i = 0; ok && i < n; i++)
            ok = s[i] > 0x20 && s[i] < 0x7f;
        if (!ok)
            RAISE(L, KPT_ERR_INVALID_ARGUMENT, "kpt.pattern{...}: name must be a string of 1 to "
                  "%d printable characters without spaces", (int)sizeof(spec->name) - 1);
        memcpy(spec->name, s, n);
    }
    lua_pop(L, 1);
    read_params(L, 2);
    static const char *const fns[] = {"score", "mask"};
    for (int i = 0; i < 2; i++) {
        int t = lua_getfield(L, 1, fns[i]);
        if (t != LUA_TNIL && t != LUA_TFUNCTION)
            RAISE(L, KPT_ERR_INVALID_ARGUMENT, "kpt.pattern{...}: %s must be a function", fns[i]);
        lua_setiuservalue(L, 2, i == 0 ? SPEC_SCORE : SPEC_MASK);
    }
    lua_newtable(L); /* fills */
    int fills = lua_gettop(L);
    if (lua_getfield(L, 1, "aux") != LUA_TNIL) {
        if (!lua_istable(L, -1))
            RAISE(L, KPT_ERR_INVALID_ARGUMENT, "kpt.pattern{...}: aux must be a table "
                  "{name = {dtype=..., shape={...}}, ...}");
        lua_pushnil(L);
        while (lua_next(L, -2)) {
            char buf[120];
            if (lua_type(L, -2) != LUA_TSTRING)
                RAISE(L, KPT_ERR_INVALID_ARGUMENT, "aux: names must be strings, got %s",
                      kpt_lua_describe(L, -2, buf, sizeof(buf)));
            if (spec->naux == KPT_MAX_AUX)
                RAISE(L, KPT_ERR_LIMIT, "too many aux tensors (at most %d)", KPT_MAX_AUX);
            read_aux(L, lua_tostring(L, -2), &spec->aux[spec->naux++], fills);
            lua_pop(L, 1);
        }
    }
    lua_pop(L, 1);
    lua_setiuservalue(L, 2, SPEC_FILLS);
    /* Lua's table order is not stable: sort, so equal scripts give equal kernels */
    qsort(spec->aux, (size_t)spec->naux, sizeof(spec->aux[0]), compare_names);
    return 1;
}

static int spec_tostring(lua_State *L)
{
    lua_pushliteral(L, "kpt.pattern");
    return 1;
}

/* ---- registration ------------------------------------------------------------------------- */

/* The operators of symbolic values. Aux handles have them too, so `doc + 1` says how many
 * indices are missing instead of Lua's "arithmetic on a userdata value". */
static const luaL_Reg operators[] = {
    {"__add", m_add},   {"__sub", m_sub}, {"__mul", m_mul},   {"__div", m_div},
    {"__idiv", m_idiv}, {"__mod", m_mod}, {"__pow", m_pow},   {"__unm", m_unm},
    {"__band", m_band}, {"__bor", m_bor}, {"__bxor", m_bxor}, {"__bnot", m_bnot},
    {"__shl", m_shl},   {"__shr", m_shr}, {NULL, NULL},
};

static void new_metatable(lua_State *L, const char *name, const luaL_Reg *fns, bool with_operators)
{
    luaL_newmetatable(L, name);
    if (with_operators)
        luaL_setfuncs(L, operators, 0);
    luaL_setfuncs(L, fns, 0);
    lua_pushboolean(L, 0);
    lua_setfield(L, -2, "__metatable"); /* scripts can neither read nor change it */
    lua_pop(L, 1);
}

void kpt_lua_open(lua_State *L)
{
    static const luaL_Reg expr_mt[] = {
        {"__eq", m_no_eq},     {"__lt", m_no_lt},     {"__le", m_no_le},
        {"__concat", m_no_concat}, {"__len", m_no_len}, {"__call", m_no_call},
        {"__index", m_index},  {"__newindex", m_no_newindex}, {"__tostring", m_tostring},
        {NULL, NULL},
    };
    static const luaL_Reg aux_mt[] = {
        {"__index", aux_index}, {"__newindex", m_no_newindex}, {"__tostring", aux_tostring},
        {NULL, NULL},
    };
    static const luaL_Reg env_mt[] = {
        {"__index", env_index}, {"__newindex", m_no_newindex}, {NULL, NULL},
    };
    static const luaL_Reg spec_mt[] = {{"__tostring", spec_tostring}, {NULL, NULL}};
    new_metatable(L, EXPR_MT, expr_mt, true);
    new_metatable(L, AUX_MT, aux_mt, true);
    new_metatable(L, ENV_MT, env_mt, false);
    new_metatable(L, SPEC_MT, spec_mt, false);

    static const luaL_Reg fns[] = {
        {"pattern", f_pattern}, {"runtime", f_runtime}, {"builtin", f_builtin},
        {"builtin_score", f_builtin_score}, {"where", f_where}, {"exp", f_exp}, {"log", f_log},
        {"tanh", f_tanh}, {"erf", f_erf}, {"sqrt", f_sqrt}, {"abs", f_abs}, {"floor", f_floor}, {"min", f_min},
        {"max", f_max}, {"clamp", f_clamp}, {"float", f_float}, {"int", f_int}, {"lt", f_lt},
        {"le", f_le}, {"gt", f_gt}, {"ge", f_ge}, {"eq", f_eq}, {"ne", f_ne}, {"range", f_range},
        {"segments", f_segments}, {NULL, NULL},
    };
    luaL_newlib(L, fns);
    static const struct {
        const char *name;
        kpt_ir_op var;
    } vars[] = {{"sq", KPT_IR_SQ}, {"skv", KPT_IR_SKV}, {"hq", KPT_IR_HQ}};
    for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
        kpt_lua_push_expr(L, built(L, kpt_ir_var(graph(L), vars[i].var)));
        lua_setfield(L, -2, vars[i].name);
    }
    lua_setglobal(L, "kpt");
}
