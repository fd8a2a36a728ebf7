/* The pattern-string parser: built-in terms joined with '+'.
 *
 *   pattern := term ('+' term)*
 *   term    := name [ '(' [arg (',' arg)*] ')' ]
 *   arg     := number | '$' name [ '=' number ]      -- '$' makes a runtime scalar
 *   number  := ['-'] digits ['.' digits] [('e'|'E') ['+'|'-'] digits]
 *
 * Whitespace may surround any token. Every error points at a column of the text with a caret.
 */
#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/builtins.h"
#include "compiler/parse_pattern.h"
#include "compiler/pipeline.h"
#include "base/diag.h"
#include "base/strbuf.h"

#define MAX_PATTERN_LEN 4096

typedef struct parser {
    const char *src;
    size_t pos;
    kpt_diag *diag;
    bool failed;
    kpt_pattern *p;
    kpt_build_ctx ctx;
    kpt_strbuf name; /* the normalised text */
} parser;

__attribute__((format(printf, 3, 4))) static bool error_at(parser *ps, size_t at, const char *fmt,
                                                           ...)
{
    if (ps->failed)
        return false;
    ps->failed = true;
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    int line = 1, col = 1;
    for (size_t i = 0; i < at && ps->src[i]; i++) {
        if (ps->src[i] == '\n') {
            line++;
            col = 1;
        } else {
            col++;
        }
    }
    kpt_diag_at(ps->diag, KPT_ERR_PARSE, "pattern", ps->src, line, col, "%s", msg);
    return false;
}

static void skip_space(parser *ps)
{
    while (isspace((unsigned char)ps->src[ps->pos]))
        ps->pos++;
}

static bool ident_char(char c, bool first)
{
    return isalpha((unsigned char)c) || c == '_' || (!first && isdigit((unsigned char)c));
}

/* Shows a byte of the text in a message: printable as itself, others as a code. */
static const char *show_char(char c, char buf[8])
{
    if (c == 0)
        return "the end of the pattern";
    if (isprint((unsigned char)c))
        snprintf(buf, 8, "'%c'", c);
    else
        snprintf(buf, 8, "0x%02x", (unsigned char)c);
    return buf;
}

static size_t edit_distance(const char *a, size_t la, const char *b, size_t lb)
{
    size_t row[64];
    if (la >= 63 || lb >= 63)
        return 99;
    for (size_t j = 0; j <= lb; j++)
        row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t up = row[j];
            size_t cost = tolower((unsigned char)a[i - 1]) == tolower((unsigned char)b[j - 1]) ? 0 : 1;
            size_t best = diag + cost;
            if (up + 1 < best)
                best = up + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

const char *kpt_builtin_suggest(const char *name, size_t len)
{
    const char *best = NULL;
    size_t best_d = 99;
    for (int i = 0; i < kpt_num_builtins; i++) {
        const char *n = kpt_builtins[i].info.name;
        size_t d = edit_distance(name, len, n, strlen(n));
        /* a prefix of a longer name ("sliding") is a good guess too */
        if (len >= 3 && strncmp(n, name, len) == 0)
            d = d < 2 ? d : 2;
        if (d < best_d) {
            best_d = d;
            best = n;
        }
    }
    size_t limit = len <= 4 ? 1 : len <= 8 ? 2 : 3;
    return best_d <= limit ? best : NULL;
}

/* number := ['-'] digits ['.' digits] [('e'|'E') ['+'|'-'] digits] */
static bool number(parser *ps, double *out)
{
    size_t start = ps->pos, i = ps->pos;
    const char *s = ps->src;
    if (s[i] == '-')
        i++;
    size_t digits = i;
    while (isdigit((unsigned char)s[i]))
        i++;
    if (i == digits) {
        char b[8];
        return error_at(ps, start, "expected a number or a runtime scalar ($name), found %s",
                        show_char(s[start], b));
    }
    if (s[i] == '.') {
        i++;
        size_t frac = i;
        while (isdigit((unsigned char)s[i]))
            i++;
        if (i == frac)
            return error_at(ps, i, "expected digits after the decimal point");
    }
    if (s[i] == 'e' || s[i] == 'E') {
        i++;
        if (s[i] == '+' || s[i] == '-')
            i++;
        size_t exp = i;
        while (isdigit((unsigned char)s[i]))
            i++;
        if (i == exp)
            return error_at(ps, i, "expected digits in the exponent");
    }
    if (ident_char(s[i], false) || s[i] == '.')
        return error_at(ps, i, "malformed number");
    char buf[64];
    if (i - start >= sizeof(buf))
        return error_at(ps, start, "number is too long");
    memcpy(buf, s + start, i - start);
    buf[i - start] = 0;
    double v = strtod(buf, NULL);
    if (!isfinite(v))
        return error_at(ps, start, "number is out of range");
    ps->pos = i;
    *out = v;
    return true;
}

static bool check_constant(parser *ps, size_t at, const kpt_builtin *b, const kpt_param_spec *spec,
                           double v)
{
    if (spec->kind == KPT_PARAM_INT) {
        if (v != floor(v))
            return error_at(ps, at, "%s of %s must be an integer, got %g", spec->name,
                            b->info.name, v);
        if (v < spec->min || v > INT32_MAX)
            return error_at(ps, at, "%s of %s must be an integer in [%g, %d], got %g", spec->name,
                            b->info.name, spec->min, INT32_MAX, v);
        return true;
    }
    if (spec->min_exclusive ? v <= spec->min : v < spec->min)
        return error_at(ps, at, "%s of %s must be %s %g, got %g", spec->name, b->info.name,
                        spec->min_exclusive ? ">" : ">=", spec->min, v);
    if (fabs(v) > 3.0e38)
        return error_at(ps, at, "%s of %s is out of the f32 range", spec->name, b->info.name);
    return true;
}

/* arg := number | '$' name [ '=' number ] */
static bool argument(parser *ps, const kpt_builtin *b, const kpt_param_spec *spec,
                     kpt_term_arg *arg)
{
    kpt_ir_graph *g = &ps->p->g;
    kpt_ir_type type = spec->kind == KPT_PARAM_INT ? KPT_IR_I32 : KPT_IR_F32;
    size_t at = ps->pos;
    if (ps->src[ps->pos] != '$') {
        if (!number(ps, &arg->value) || !check_constant(ps, at, b, spec, arg->value))
            return false;
        arg->is_scalar = false;
        arg->ref = type == KPT_IR_I32 ? kpt_ir_const_i32(g, (int32_t)arg->value)
                                      : kpt_ir_const_f32(g, (float)arg->value);
        kpt_sb_printf(&ps->name, "%.9g", arg->value);
        return true;
    }
    ps->pos++;
    size_t name_at = ps->pos;
    while (ident_char(ps->src[ps->pos], ps->pos == name_at))
        ps->pos++;
    size_t len = ps->pos - name_at;
    if (len == 0) {
        char c[8];
        return error_at(ps, name_at, "expected a scalar name after '$', found %s",
                        show_char(ps->src[name_at], c));
    }
    if (len >= KPT_NAME_MAX)
        return error_at(ps, name_at, "scalar name is too long (at most %d characters)",
                        KPT_NAME_MAX - 1);
    char name[KPT_NAME_MAX];
    memcpy(name, ps->src + name_at, len);
    name[len] = 0;
    bool has_def = false;
    double def = 0;
    skip_space(ps);
    size_t def_at = ps->pos;
    if (ps->src[ps->pos] == '=') {
        ps->pos++;
        skip_space(ps);
        def_at = ps->pos;
        if (!number(ps, &def) || !check_constant(ps, def_at, b, spec, def))
            return false;
        has_def = true;
    }
    char err[200];
    int idx = kpt_pattern_scalar(ps->p, name, type, has_def, def, err, sizeof(err));
    if (idx < 0)
        return error_at(ps, at, "%s", err);
    arg->is_scalar = true;
    arg->ref = kpt_ir_scalar(g, (uint32_t)idx, type);
    kpt_sb_printf(&ps->name, "$%s", name);
    if (has_def)
        kpt_sb_printf(&ps->name, "=%.9g", def);
    return true;
}

static bool term(parser *ps)
{
    skip_space(ps);
    size_t at = ps->pos;
    const char *s = ps->src;
    if (!ident_char(s[at], true)) {
        char c[8];
        if (s[at] == 0 || s[at] == '+')
            return error_at(ps, at, "expected a pattern name such as 'causal' before %s",
                            show_char(s[at], c));
        return error_at(ps, at, "expected a pattern name such as 'causal', found %s",
                        show_char(s[at], c));
    }
    while (ident_char(s[ps->pos], false))
        ps->pos++;
    size_t len = ps->pos - at;
    const kpt_builtin *b = kpt_builtin_find(s + at, len);
    if (!b) {
        const char *hint = kpt_builtin_suggest(s + at, len);
        if (hint)
            return error_at(ps, at, "unknown pattern '%.*s'; did you mean '%s'?", (int)len, s + at,
                            hint);
        return error_at(ps, at, "unknown pattern '%.*s' (kptc patterns lists the built-ins)",
                        (int)len, s + at);
    }
    kpt_sb_puts(&ps->name, b->info.name);
    skip_space(ps);
    kpt_term_arg args[2];
    memset(args, 0, sizeof(args));
    int nargs = 0;
    if (s[ps->pos] == '(') {
        size_t open = ps->pos++;
        kpt_sb_puts(&ps->name, "(");
        skip_space(ps);
        if (s[ps->pos] != ')') {
            for (;;) {
                skip_space(ps);
                if (nargs == b->nparams) {
                    if (b->nparams == 0)
                        return error_at(ps, open, "'%s' takes no arguments", b->info.name);
                    return error_at(ps, ps->pos, "'%s' takes %d argument%s (%s), got more",
                                    b->info.name, b->nparams, b->nparams == 1 ? "" : "s",
                                    b->info.signature);
                }
                if (nargs)
                    kpt_sb_puts(&ps->name, ",");
                if (!argument(ps, b, &b->params[nargs], &args[nargs]))
                    return false;
                nargs++;
                skip_space(ps);
                if (s[ps->pos] == ',') {
                    ps->pos++;
                    continue;
                }
                break;
            }
        }
        if (s[ps->pos] != ')') {
            char c[8];
            return error_at(ps, ps->pos, "expected ',' or ')' in the arguments of '%s', found %s",
                            b->info.name, show_char(s[ps->pos], c));
        }
        if (nargs < b->nparams)
            return error_at(ps, ps->pos, "'%s' takes %d argument%s (%s), got %d", b->info.name,
                            b->nparams, b->nparams == 1 ? "" : "s", b->info.signature, nargs);
        ps->pos++;
        kpt_sb_puts(&ps->name, ")");
    } else if (b->nparams) {
        return error_at(ps, ps->pos, "'%s' takes %d argument%s: write %s", b->info.name,
                        b->nparams, b->nparams == 1 ? "" : "s", b->info.signature);
    }
    ps->ctx.err[0] = 0;
    if (!b->build(&ps->ctx, args)) {
        if (ps->ctx.err[0])
            return error_at(ps, at, "%s", ps->ctx.err);
        return error_at(ps, at, "%s", ps->p->g.error);
    }
    return true;
}

/* pattern := term ('+' term)* */
static void terms(parser *ps)
{
    const char *text = ps->src;
    skip_space(ps);
    if (text[ps->pos] == 0) {
        error_at(ps, ps->pos, "empty pattern: expected a pattern name such as 'causal' or 'full'");
        return;
    }
    while (term(ps)) {
        skip_space(ps);
        if (text[ps->pos] == 0)
            break;
        if (text[ps->pos] != '+') {
            char c[8];
            error_at(ps, ps->pos, "unexpected %s after '%s'; terms are joined with '+'",
                     show_char(text[ps->pos], c), ps->name.data ? ps->name.data : "");
            break;
        }
        ps->pos++;
        kpt_sb_puts(&ps->name, "+");
    }
}

bool kpt_parse_pattern_into(kpt_pattern *p, const char *text, kpt_ir_ref score_in,
                            kpt_ir_ref *score_out, kpt_ir_ref *mask_out, kpt_diag *diag)
{
    if (strnlen(text, MAX_PATTERN_LEN + 1) > MAX_PATTERN_LEN) {
        kpt_diag_set(diag, KPT_ERR_LIMIT, "pattern text is longer than %d characters",
                     MAX_PATTERN_LEN);
        return false;
    }
    parser ps = {.src = text, .diag = diag, .p = p};
    ps.ctx.p = p;
    ps.ctx.score = score_in ? score_in : kpt_ir_var(&p->g, KPT_IR_S);
    if (!ps.ctx.score) {
        kpt_diag_set(diag, KPT_ERR_LIMIT, "%s", p->g.error);
        return false;
    }
    terms(&ps);
    kpt_sb_free(&ps.name);
    *score_out = ps.ctx.score;
    *mask_out = ps.ctx.mask;
    return !ps.failed;
}

kpt_pattern *kpt_parse_pattern(const char *text, kpt_diag *diag)
{
    if (!text) {
        kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT, "pattern text is NULL");
        return NULL;
    }
    parser ps = {.src = text, .diag = diag};
    size_t n = strnlen(text, MAX_PATTERN_LEN + 1);
    if (n > MAX_PATTERN_LEN) {
        kpt_diag_set(diag, KPT_ERR_LIMIT, "pattern text is longer than %d characters",
                     MAX_PATTERN_LEN);
        return NULL;
    }
    ps.p = kpt_pattern_new("");
    if (!ps.p) {
        kpt_diag_set(diag, KPT_ERR_NO_MEMORY, "out of memory");
        return NULL;
    }
    ps.ctx.p = ps.p;
    ps.ctx.score = kpt_ir_var(&ps.p->g, KPT_IR_S);
    kpt_ir_ref s_var = ps.ctx.score;
    terms(&ps);
    char *name = ps.failed ? NULL : kpt_sb_take(&ps.name);
    kpt_sb_free(&ps.name);
    if (!ps.failed && (!name || !kpt_pattern_set_name(ps.p, name))) {
        kpt_diag_set(diag, KPT_ERR_NO_MEMORY, "out of memory");
        ps.failed = true;
    }
    free(name);
    if (ps.failed) {
        kpt_pattern_destroy(&ps.p);
        return NULL;
    }
    ps.p->score = ps.ctx.score == s_var ? 0 : ps.ctx.score;
    ps.p->mask = ps.ctx.mask;
    return ps.p;
}

kpt_status kpt_pattern_parse(const char *text, kpt_pattern **out, kpt_diag *diag)
{
    kpt_diag local;
    if (!diag)
        diag = &local; /* the status travels in the diag */
    if (!out)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT, "kpt_pattern_parse: out is NULL");
    *out = NULL;
    return kpt_pipeline_finish(kpt_parse_pattern(text, diag), out, diag);
}
