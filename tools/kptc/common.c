/* What kptc's commands share: messages and exit codes, option parsing (getopt_long), numbers
 * and assignments, and loading a PATTERN (a pattern string or a Lua script). */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/diag.h"
#include "compiler/parse_lua.h"
#include "compiler/parse_pattern.h"
#include "tools/kptc/kptc.h"

bool kptc_parse_only;

int kptc_usage_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("kptc: ", stderr);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputs("\n(kptc --help shows the usage)\n", stderr);
    return KPTC_EXIT_USAGE;
}

int kptc_report(const kpt_diag *d, kpt_status st)
{
    fprintf(stderr, "kptc: %s\n", d->message[0] ? d->message : kpt_status_string(st));
    switch (st) {
    /* not the input's fault: this machine (no driver, device or compiler), or kpt itself */
    case KPT_ERR_NO_MEMORY:
    case KPT_ERR_INTERNAL:
    case KPT_ERR_NO_DEVICE:
    case KPT_ERR_COMPILE:
    case KPT_ERR_DEVICE:
        return 1;
    default:
        return KPTC_EXIT_USAGE;
    }
}


/* ---- options -------------------------------------------------------------------------------- */

/* Where each option's value goes (the codes are those of kptc.h's long options). */
static const char **slot(kptc_options *o, int code)
{
    switch (code) {
    case KPTC_OPT_EMIT: return &o->emit;
    case KPTC_OPT_DUMP_AFTER: return &o->dump_after;
    case KPTC_OPT_TARGET: return &o->target;
    case KPTC_OPT_HEAD_DIM: return &o->head_dim;
    case KPTC_OPT_VERBOSE: return &o->verbose;
    case KPTC_OPT_BACKEND: return &o->backend;
    case KPTC_OPT_SHAPE: return &o->shape;
    case KPTC_OPT_DTYPE: return &o->dtype;
    case KPTC_OPT_LAYOUT: return &o->layout;
    case KPTC_OPT_SEED: return &o->seed;
    case KPTC_OPT_TILE: return &o->tile;
    case KPTC_OPT_SAVE: return &o->save;
    case KPTC_OPT_SMEM: return &o->smem;
    case KPTC_OPT_BLOCKMAP: return &o->blockmap;
    case KPTC_OPT_BACKWARD: return &o->backward;
    case KPTC_OPT_PAGED: return &o->paged;
    case KPTC_OPT_PAGE_SIZE: return &o->page_size;
    case KPTC_OPT_SEQLENS: return &o->seqlens;
    case KPTC_OPT_SINKS: return &o->sinks;
    case KPTC_OPT_TALL: return &o->tall;
    case 'o': return &o->output;
    case 'j': return &o->jobs;
    default: return NULL;
    }
}

/* The option argv[optind - 1] names, without a "=value". */
static const char *option_name(char **argv, char *buf, size_t n)
{
    const char *a = argv[optind - 1];
    size_t len = strcspn(a, "=");
    snprintf(buf, n, "%.*s", (int)(len < n ? len : n - 1), a);
    return buf;
}

static bool takes_no_value(const struct option *longopts, const char *name)
{
    for (int i = 0; longopts[i].name; i++)
        if (name[0] == '-' && name[1] == '-' && !strcmp(longopts[i].name, name + 2))
            return longopts[i].has_arg == no_argument;
    return false;
}

int kptc_parse_options(int argc, char **argv, const struct option *longopts, const char *help,
                       kptc_options *o)
{
    /* short options: -o FILE and -j N where a command has them; ':' reports missing values */
    char shortopts[8] = ":h";
    for (int i = 0; longopts[i].name; i++)
        if (longopts[i].val == 'o' || longopts[i].val == 'j')
            strcat(shortopts, longopts[i].val == 'o' ? "o:" : "j:");
    optind = 0; /* 0, not 1: glibc then forgets the last parse (it may have stopped mid-argument) */
    opterr = 0;
    char name[64];
    for (;;) {
        int idx = -1;
        int c = getopt_long(argc, argv, shortopts, longopts, &idx);
        if (c == -1)
            break;
        if (c == 'h') {
            fputs(help, stdout);
            return -1;
        }
        if (c == ':')
            return kptc_usage_error("option '%s' needs a value",
                                    option_name(argv, name, sizeof(name)));
        if (c == '?') {
            option_name(argv, name, sizeof(name));
            if (takes_no_value(longopts, name))
                return kptc_usage_error("%s takes no value", name);
            return kptc_usage_error("unknown option '%s' for this command", name);
        }
        const char *v = optarg ? optarg : "1";
        /* the option as written, for messages (argv[optind - 1] may be its value) */
        if (idx >= 0)
            snprintf(name, sizeof(name), "--%s", longopts[idx].name);
        else
            snprintf(name, sizeof(name), "-%c", c);
        int *count = c == KPTC_OPT_SCALAR ? &o->nscalars : c == KPTC_OPT_AUX ? &o->naux
                   : c == KPTC_OPT_PARAM  ? &o->nparams : NULL;
        if (count) {
            const char **list = c == KPTC_OPT_SCALAR ? o->scalars
                              : c == KPTC_OPT_AUX    ? o->aux : o->params;
            if (*count == KPTC_MAX_KV)
                return kptc_usage_error("too many %s options", name);
            list[(*count)++] = v;
            continue;
        }
        const char **s = slot(o, c);
        if (!s)
            return kptc_usage_error("unknown option '%s' for this command", name);
        if (*s)
            return kptc_usage_error("option '%s' given twice", name);
        *s = v;
    }
    for (int i = optind; i < argc; i++) {
        if (o->npatterns == KPTC_MAX_PATTERNS)
            return kptc_usage_error("too many PATTERNs");
        o->patterns[o->npatterns++] = argv[i];
    }
    o->pattern = o->npatterns ? o->patterns[0] : NULL;
    return 0;
}

int kptc_parse_backend(const char *name, kpt_backend_kind *kind)
{
    static const kpt_backend_kind kinds[] = {KPT_BACKEND_CPU, KPT_BACKEND_CUDA, KPT_BACKEND_HIP,
                                             KPT_BACKEND_VULKAN};
    for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++)
        if (!strcmp(name, kpt_backend_name(kinds[i]))) {
            *kind = kinds[i];
            return 0;
        }
    return kptc_usage_error("--backend %s: expected cpu, cuda, hip or vulkan", name);
}

int kptc_one_pattern(const kptc_options *o, const char *cmd)
{
    if (o->npatterns > 1)
        return kptc_usage_error("more than one PATTERN given ('%s' and '%s'); quote patterns "
                                "that contain spaces", o->patterns[0], o->patterns[1]);
    if (!o->pattern)
        return kptc_usage_error("%s needs a PATTERN", cmd);
    return 0;
}

bool kptc_parse_int(const char *s, int64_t lo, int64_t hi, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (end == s || *end || errno || v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

/* NAME=VALUE of --scalar and --param: a name of 1 to KPT_NAME_MAX-1 characters and a finite
 * number (or true/false when `booleans`). */
int kptc_parse_assignment(const char *opt, const char *arg, bool booleans,
                          char name[KPT_NAME_MAX], double *value)
{
    const char *eq = strchr(arg, '=');
    size_t n = eq ? (size_t)(eq - arg) : 0;
    if (!eq || n == 0 || n >= KPT_NAME_MAX)
        return kptc_usage_error("%s wants NAME=VALUE (a name of at most %d characters), got '%s'",
                                opt, KPT_NAME_MAX - 1, arg);
    if (booleans && (!strcmp(eq + 1, "true") || !strcmp(eq + 1, "false"))) {
        *value = eq[1] == 't';
    } else {
        char *end;
        *value = strtod(eq + 1, &end);
        if (end == eq + 1 || *end || !isfinite(*value))
            return kptc_usage_error("%s %s: '%s' is not a number", opt, arg, eq + 1);
    }
    memcpy(name, arg, n);
    name[n] = 0;
    return 0;
}


/* ---- loading patterns: built-in strings and Lua scripts ------------------------------------ */

bool kptc_is_script(const char *pattern)
{
    size_t n = strlen(pattern);
    return n > 4 && !strcmp(pattern + n - 4, ".lua");
}

static void print_from_script(void *ud, const char *text)
{
    fprintf(stderr, "%s: %s\n", (const char *)ud, text);
}

static int parse_params(const kptc_options *o, kptc_script *sc)
{
    for (int i = 0; i < o->nparams; i++) {
        int rc = kptc_parse_assignment("--param", o->params[i], true, sc->names[i],
                                       &sc->values[i].value);
        if (rc)
            return rc;
        sc->values[i].name = sc->names[i];
    }
    return 0;
}

/* The pattern before any pass runs: a pattern string, or a script (its text kept in sc). */
int kptc_load_pattern(const kptc_options *o, kptc_script *sc, kpt_pattern **out)
{
    memset(sc, 0, sizeof(*sc));
    *out = NULL;
    kpt_diag d = {0};
    if (!kptc_is_script(o->pattern)) {
        if (o->nparams)
            return kptc_usage_error("--param goes with Lua scripts (.lua); a pattern string "
                                    "takes its values in the text, e.g. sliding_window(256)");
        *out = kpt_parse_pattern(o->pattern, &d);
        return *out ? 0 : kptc_report(&d, d.status);
    }
    int rc = parse_params(o, sc);
    if (rc)
        return rc;
    sc->src = kpt_lua_read_file(o->pattern, &sc->len, &d);
    if (!sc->src)
        return kptc_report(&d, d.status);
    sc->prm = (kpt_lua_params){.name = o->pattern, .params = sc->values,
                               .num_params = o->nparams, .print = print_from_script,
                               .print_user = (void *)o->pattern};
    *out = kpt_parse_lua(sc->src, sc->len, &sc->prm, &d);
    if (*out)
        return 0;
    /* the diag quotes the script's line itself: its text is no longer needed */
    free(sc->src);
    sc->src = NULL;
    return kptc_report(&d, d.status);
}

