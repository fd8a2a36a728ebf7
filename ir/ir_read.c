/* The IR reader: parses the text ir_print.c writes (format described there). Labels may be any
 * positive numbers, each defined once and before its use; nodes go through the interning builder,
 * so the result is canonical. Errors give line and column. '#' starts a comment. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/diag.h"
#include "ir/pattern.h"

#define MAX_LABEL (1u << 22)

typedef struct reader {
    const char *src;
    const char *pos;
    int line;
    const char *line_start;
    kpt_diag *diag;
    bool failed;
    kpt_pattern *p;
    kpt_ir_ref *labels; /* label -> ref */
    uint32_t labels_cap;
} reader;

static int column(const reader *rd)
{
    return (int)(rd->pos - rd->line_start) + 1;
}

__attribute__((format(printf, 2, 3))) static bool error(reader *rd, const char *fmt, ...)
{
    if (rd->failed)
        return false;
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    kpt_diag_at(rd->diag, KPT_ERR_PARSE, "ir", rd->src, rd->line, column(rd), "%s", msg);
    rd->failed = true;
    return false;
}

static void skip_space(reader *rd)
{
    while (*rd->pos == ' ' || *rd->pos == '\t' || *rd->pos == '\r')
        rd->pos++;
    if (*rd->pos == '#')
        while (*rd->pos && *rd->pos != '\n')
            rd->pos++;
}

static bool at_eol(reader *rd)
{
    skip_space(rd);
    return *rd->pos == '\n' || *rd->pos == 0;
}

static bool is_ident(char c, bool first)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
           (!first && c >= '0' && c <= '9');
}

/* Reads an identifier into buf; false (with an error) if there is none or it is too long. */
static bool ident(reader *rd, char *buf, size_t size, const char *what)
{
    skip_space(rd);
    const char *s = rd->pos;
    if (!is_ident(*s, true))
        return error(rd, "expected %s", what);
    while (is_ident(*rd->pos, false))
        rd->pos++;
    size_t n = (size_t)(rd->pos - s);
    if (n >= size) {
        rd->pos = s;
        return error(rd, "%s is too long (at most %zu characters)", what, size - 1);
    }
    memcpy(buf, s, n);
    buf[n] = 0;
    return true;
}

static bool expect(reader *rd, char c)
{
    skip_space(rd);
    if (*rd->pos != c)
        return error(rd, "expected '%c'", c);
    rd->pos++;
    return true;
}

static bool number(reader *rd, double *out)
{
    skip_space(rd);
    char *end;
    errno = 0;
    double v = strtod(rd->pos, &end);
    if (end == rd->pos)
        return error(rd, "expected a number");
    rd->pos = end;
    *out = v;
    return true;
}

static bool integer(reader *rd, int64_t lo, int64_t hi, int64_t *out)
{
    skip_space(rd);
    const char *s = rd->pos;
    double v = 0;
    if (!number(rd, &v))
        return false;
    if (v != floor(v) || v < (double)lo || v > (double)hi) {
        rd->pos = s;
        return error(rd, "expected an integer in [%lld, %lld]", (long long)lo, (long long)hi);
    }
    *out = (int64_t)v;
    return true;
}

static bool quoted(reader *rd, char **out)
{
    skip_space(rd);
    if (*rd->pos != '"')
        return error(rd, "expected a quoted string");
    rd->pos++;
    size_t cap = strlen(rd->pos) + 1, n = 0;
    char *buf = malloc(cap);
    if (!buf)
        return error(rd, "out of memory");
    while (*rd->pos != '"') {
        char c = *rd->pos;
        if (c == 0 || c == '\n') {
            free(buf);
            return error(rd, "unterminated string");
        }
        if (c == '\\') {
            rd->pos++;
            if (*rd->pos == 'x' && rd->pos[1] && rd->pos[2]) {
                char hex[3] = {rd->pos[1], rd->pos[2], 0};
                char *e;
                long v = strtol(hex, &e, 16);
                if (*e || v == 0) {
                    free(buf);
                    return error(rd, "bad \\x escape");
                }
                c = (char)v;
                rd->pos += 2;
            } else if (*rd->pos == '"' || *rd->pos == '\\') {
                c = *rd->pos;
            } else {
                free(buf);
                return error(rd, "bad escape");
            }
        }
        buf[n++] = c;
        rd->pos++;
    }
    rd->pos++;
    buf[n] = 0;
    *out = buf;
    return true;
}

static bool label_ref(reader *rd, kpt_ir_ref *out)
{
    skip_space(rd);
    if (*rd->pos != '%')
        return error(rd, "expected a node label like %%3");
    const char *s = rd->pos++;
    int64_t v;
    if (!integer(rd, 1, MAX_LABEL - 1, &v))
        return false;
    if ((uint32_t)v >= rd->labels_cap || !rd->labels[v]) {
        rd->pos = s;
        return error(rd, "node %%%lld is used before it is defined", (long long)v);
    }
    *out = rd->labels[v];
    return true;
}

static bool read_type(reader *rd, kpt_ir_type *t)
{
    char name[8];
    const char *s = (skip_space(rd), rd->pos);
    if (!ident(rd, name, sizeof(name), "a type (i32, f32, bool)"))
        return false;
    for (int i = KPT_IR_I32; i <= KPT_IR_BOOL; i++)
        if (strcmp(name, kpt_ir_type_name((kpt_ir_type)i)) == 0) {
            *t = (kpt_ir_type)i;
            return true;
        }
    rd->pos = s;
    return error(rd, "unknown type '%s' (expected i32, f32 or bool)", name);
}

static bool read_scalar(reader *rd)
{
    char name[KPT_NAME_MAX];
    kpt_ir_type t = KPT_IR_VOID; /* set by read_type() when it succeeds */
    if (!ident(rd, name, sizeof(name), "a scalar name") || !read_type(rd, &t))
        return false;
    double def = 0;
    bool has_def = false;
    skip_space(rd);
    if (*rd->pos == '=') {
        rd->pos++;
        if (!number(rd, &def))
            return false;
        has_def = true;
    }
    if (kpt_pattern_find_scalar(rd->p, name) >= 0)
        return error(rd, "scalar '%s' is declared twice", name);
    char err[160];
    if (kpt_pattern_scalar(rd->p, name, t, has_def, def, err, sizeof(err)) < 0)
        return error(rd, "%s", err);
    return true;
}

static bool read_dim(reader *rd, int64_t *dim)
{
    skip_space(rd);
    if (*rd->pos >= '0' && *rd->pos <= '9')
        return integer(rd, 1, INT32_MAX, dim);
    char name[8];
    const char *s = rd->pos;
    if (!ident(rd, name, sizeof(name), "a dimension (any, b, hq, hkv, sq, skv or a size)"))
        return false;
    for (int64_t d = KPT_DIM_ANY; d >= KPT_DIM_SKV; d--)
        if (strcmp(name, kpt_dim_name(d)) == 0) {
            *dim = d;
            return true;
        }
    rd->pos = s;
    return error(rd, "unknown dimension '%s' (expected any, b, hq, hkv, sq, skv or a size)", name);
}

static bool read_aux(reader *rd)
{
    kpt_aux_decl a;
    memset(&a, 0, sizeof(a));
    char dt[8];
    if (!ident(rd, a.name, sizeof(a.name), "an aux tensor name"))
        return false;
    const char *s = (skip_space(rd), rd->pos);
    if (!ident(rd, dt, sizeof(dt), "a dtype"))
        return false;
    a.dtype = kpt_dtype_from_name(dt);
    if (kpt_aux_ir_type(a.dtype) == KPT_IR_VOID) {
        rd->pos = s;
        return error(rd, "unsupported aux dtype '%s' (i32, f32, bool, f16, bf16)", dt);
    }
    if (!expect(rd, '['))
        return false;
    do {
        if (a.rank == KPT_AUX_MAX_RANK)
            return error(rd, "aux tensors have at most %d dimensions", KPT_AUX_MAX_RANK);
        if (!read_dim(rd, &a.dims[a.rank++]))
            return false;
        skip_space(rd);
    } while (*rd->pos == ',' && rd->pos++);
    if (!expect(rd, ']'))
        return false;
    char fill[10];
    if (!ident(rd, fill, sizeof(fill), "a fill rule (segments, range LO HI or script)"))
        return false;
    if (strcmp(fill, "segments") == 0) {
        a.fill = KPT_FILL_SEGMENTS;
    } else if (strcmp(fill, "script") == 0) {
        a.fill = KPT_FILL_SCRIPT;
    } else if (strcmp(fill, "range") == 0) {
        a.fill = KPT_FILL_RANGE;
        if (!number(rd, &a.fill_lo) || !number(rd, &a.fill_hi))
            return false;
    } else {
        return error(rd, "unknown fill rule '%s' (segments, range LO HI or script)", fill);
    }
    char err[160];
    if (kpt_pattern_add_aux(rd->p, &a, err, sizeof(err)) < 0)
        return error(rd, "%s", err);
    return true;
}

static bool read_imm(reader *rd, kpt_ir_op op, kpt_ir_type t, uint32_t *bits)
{
    char name[KPT_NAME_MAX];
    const char *s = (skip_space(rd), rd->pos);
    if (op == KPT_IR_CONST) {
        if (t == KPT_IR_BOOL) {
            if (!ident(rd, name, sizeof(name), "true or false"))
                return false;
            if (strcmp(name, "true") && strcmp(name, "false")) {
                rd->pos = s;
                return error(rd, "expected true or false");
            }
            *bits = name[0] == 't';
        } else if (t == KPT_IR_I32) {
            int64_t v;
            if (!integer(rd, INT32_MIN, INT32_MAX, &v))
                return false;
            int32_t i = (int32_t)v;
            memcpy(bits, &i, sizeof(i));
        } else {
            double v = 0;
            if (!number(rd, &v))
                return false;
            float f = (float)v;
            memcpy(bits, &f, sizeof(f));
        }
        return true;
    }
    if (!ident(rd, name, sizeof(name), op == KPT_IR_SCALAR ? "a scalar name" : "an aux name"))
        return false;
    int idx = op == KPT_IR_SCALAR ? kpt_pattern_find_scalar(rd->p, name)
                                  : kpt_pattern_find_aux(rd->p, name);
    if (idx < 0) {
        rd->pos = s;
        return error(rd, "unknown %s '%s'", op == KPT_IR_SCALAR ? "scalar" : "aux tensor", name);
    }
    if (op == KPT_IR_SCALAR && rd->p->scalars[idx].type != t) {
        rd->pos = s;
        return error(rd, "scalar '%s' is %s, not %s", name,
                     kpt_ir_type_name(rd->p->scalars[idx].type), kpt_ir_type_name(t));
    }
    *bits = (uint32_t)idx;
    return true;
}

static bool read_node(reader *rd)
{
    const char *start = rd->pos;
    rd->pos++; /* '%' */
    int64_t label;
    if (!integer(rd, 1, MAX_LABEL - 1, &label) || !expect(rd, '='))
        return false;
    if ((uint32_t)label < rd->labels_cap && rd->labels[label]) {
        rd->pos = start;
        return error(rd, "node %%%lld is defined twice", (long long)label);
    }
    kpt_ir_type t = KPT_IR_VOID; /* set by read_type() when it succeeds */
    if (!read_type(rd, &t))
        return false;
    char opname[16];
    const char *ops = (skip_space(rd), rd->pos);
    if (!ident(rd, opname, sizeof(opname), "an operation"))
        return false;
    kpt_ir_op op = kpt_ir_op_from_name(opname, strlen(opname));
    if (op == KPT_IR_OP_COUNT) {
        rd->pos = ops;
        return error(rd, "unknown operation '%s'", opname);
    }
    uint32_t bits = 0;
    if ((op == KPT_IR_CONST || op == KPT_IR_SCALAR || op == KPT_IR_LOAD) &&
        !read_imm(rd, op, t, &bits))
        return false;
    kpt_ir_ref args[KPT_IR_MAX_ARGS];
    int nargs = 0;
    while (!at_eol(rd)) {
        if (nargs == KPT_IR_MAX_ARGS)
            return error(rd, "too many operands");
        if (!label_ref(rd, &args[nargs++]))
            return false;
    }
    if (op == KPT_IR_LOAD && bits < (uint32_t)rd->p->num_aux &&
        nargs != rd->p->aux[bits].rank) {
        rd->pos = ops;
        return error(rd, "'load' of aux tensor '%s' takes %d indices (its rank), not %d",
                     rd->p->aux[bits].name, rd->p->aux[bits].rank, nargs);
    }
    kpt_ir_graph *g = &rd->p->g;
    kpt_ir_ref r = kpt_ir_build(g, op, t, bits, nargs, args);
    if (!r) {
        rd->pos = ops;
        char msg[KPT_IR_ERROR_MAX];
        memcpy(msg, g->error, sizeof(msg));
        g->failed = false; /* report through the diag instead */
        return error(rd, "%s", msg);
    }
    if (g->nodes[r].type != t) {
        rd->pos = ops;
        return error(rd, "'%s' here has type %s, not %s", opname,
                     kpt_ir_type_name((kpt_ir_type)g->nodes[r].type), kpt_ir_type_name(t));
    }
    if ((uint32_t)label >= rd->labels_cap) {
        uint32_t cap = rd->labels_cap ? rd->labels_cap : 64;
        while (cap <= (uint32_t)label)
            cap *= 2;
        kpt_ir_ref *l = realloc(rd->labels, cap * sizeof(*l));
        if (!l)
            return error(rd, "out of memory");
        memset(l + rd->labels_cap, 0, (cap - rd->labels_cap) * sizeof(*l));
        rd->labels = l;
        rd->labels_cap = cap;
    }
    rd->labels[label] = r;
    return true;
}

static bool read_root(reader *rd, kpt_ir_ref *root, kpt_ir_type want, const char *what)
{
    if (*root)
        return error(rd, "the %s root is given twice", what);
    const char *s = (skip_space(rd), rd->pos);
    if (!label_ref(rd, root))
        return false;
    if (kpt_ir_type_of(&rd->p->g, *root) != want) {
        rd->pos = s;
        return error(rd, "the %s must be %s, not %s", what, kpt_ir_type_name(want),
                     kpt_ir_type_name(kpt_ir_type_of(&rd->p->g, *root)));
    }
    return true;
}

static bool read_line(reader *rd)
{
    skip_space(rd);
    if (*rd->pos == '\n' || *rd->pos == 0)
        return true;
    if (*rd->pos == '%')
        return read_node(rd);
    char kw[16];
    const char *s = rd->pos;
    if (!ident(rd, kw, sizeof(kw), "a declaration or a node"))
        return false;
    if (strcmp(kw, "pattern") == 0) {
        char *name = NULL;
        if (!quoted(rd, &name))
            return false;
        bool ok = kpt_pattern_set_name(rd->p, name);
        free(name);
        return ok || error(rd, "out of memory");
    }
    if (strcmp(kw, "scalar") == 0)
        return read_scalar(rd);
    if (strcmp(kw, "aux") == 0)
        return read_aux(rd);
    if (strcmp(kw, "score") == 0)
        return read_root(rd, &rd->p->score, KPT_IR_F32, "score");
    if (strcmp(kw, "mask") == 0)
        return read_root(rd, &rd->p->mask, KPT_IR_BOOL, "mask");
    rd->pos = s;
    return error(rd, "unknown keyword '%s' (pattern, scalar, aux, score, mask or %%N = ...)", kw);
}

kpt_pattern *kpt_pattern_read(const char *text, kpt_diag *diag)
{
    reader rd = {.src = text, .pos = text, .line = 1, .line_start = text, .diag = diag};
    rd.p = kpt_pattern_new("");
    if (!rd.p) {
        kpt_diag_set(diag, KPT_ERR_NO_MEMORY, "out of memory");
        return NULL;
    }
    /* header */
    skip_space(&rd);
    if (strncmp(rd.pos, "kpt-ir", 6) != 0) {
        error(&rd, "expected the header 'kpt-ir 1'");
    } else {
        rd.pos += 6;
        skip_space(&rd);
        const char *vpos = rd.pos;
        int64_t version;
        if (integer(&rd, 0, 1000, &version) && version != 1) {
            rd.pos = vpos; /* the caret goes under the version number */
            error(&rd, "unsupported IR version %lld (this kpt reads version 1)",
                  (long long)version);
        }
    }
    while (!rd.failed) {
        if (!at_eol(&rd))
            error(&rd, "unexpected text at the end of the line");
        if (rd.failed || *rd.pos == 0)
            break;
        rd.pos++;
        rd.line++;
        rd.line_start = rd.pos;
        read_line(&rd);
    }
    free(rd.labels);
    if (rd.failed) {
        kpt_pattern_destroy(&rd.p);
        return NULL;
    }
    return rd.p;
}
