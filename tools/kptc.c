/* kptc — kpt's command-line compiler.
 *
 *   kptc patterns                         the built-in pattern terms
 *   kptc emit --emit ir [--dump-after STAGE] PATTERN
 *   kptc emit --emit cuda|ptx|cubin|hip|hsaco|glsl|spirv [--target T] [--head-dim D[,Dv]]
 *             [--dtype T] [--smem BYTES] [--blockmap] [--verbose] PATTERN
 *             (targets and their limits: target/target.c; the kernel comes from the same
 *             generation path the runtime takes)
 *   kptc check PATTERN [--backend cpu] [--shape B,Hq,Hkv,Sq,Skv,Dqk[,Dv]] [--dtype T]
 *              [--layout bhsd|bshd] [--seed N] [--scalar NAME=V]... [--aux NAME=FILE.npy]...
 *              [--tile QxK] [--save DIR]
 *   kptc bundle -o FILE --target T[,T...] [--head-dim D[:Dv][,...]] [--dtype T[,T...]] [-j N]
 *              PATTERN...
 *
 * PATTERN is a built-in pattern string or a Lua script (a path ending in .lua); scripts take
 * --param NAME=VALUE (repeatable) in every command.
 *
 * Exit status: 0 success, 2 bad input (usage, pattern, files), 1 anything else.
 * See docs/kptc.md.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <kpt/kpt.h>

#include "compiler/analyze_mask.h"
#include "compiler/builtins.h"
#include "compiler/parse_lua.h"
#include "compiler/parse_pattern.h"
#include "compiler/pipeline.h"
#include "compiler/plan_tiles.h"
#include "base/diag.h"
#include "base/numeric.h"
#include "runtime/attention_args.h"
#include "tools/npy.h"
#include "base/clock.h"
#include "vendor/rtc_glslang.h"
#include "tools/rng.h"
#include "target/target.h"
#include "tools/kptc.h"


static const char usage_text[] =
    "usage: kptc <command> [options] PATTERN...\n"
    "\n"
    "commands:\n"
    "  patterns            list the built-in pattern terms\n"
    "  emit                compile PATTERN and print it\n"
    "      --emit ir|cuda|ptx|cubin|glsl|spirv|hip|hsaco  what to print: the IR; the CUDA\n"
    "                                kernel as source, PTX or CUBIN (NVRTC); the Vulkan kernel\n"
    "                                as GLSL or SPIR-V (validated); the AMD kernel as HIP or a\n"
    "                                code object (hipRTC, else clang); binaries only to a file\n"
    "                                or pipe\n"
    "      --dump-after STAGE        print the IR after STAGE: parse, opt_fold, opt_simplify, all\n"
    "      --target T                cuda:sm_80 (default for cuda), cuda:sm_86, cuda:sm_89,\n"
    "                                cuda:sm_90 (mma.sync); cuda:sm_90a (Hopper: TMA, wgmma);\n"
    "                                spirv (default for glsl and spirv);\n"
    "                                hip:gfx90a (default for hip), hip:gfx940, hip:gfx942;\n"
    "                                spirv:coopmat (Vulkan, cooperative-matrix kernel)\n"
    "      --head-dim D[,Dv]         head dims (default 128): 32, 64, 96, 128, 256 (CUDA, HIP);\n"
    "                                1 to 256 (spirv)\n"
    "      --dtype T                 input dtype of the kernel: f16 or bf16 (CUDA and HIP,\n"
    "                                default bf16); f16 or f32 (spirv, default f16)\n"
    "      --smem BYTES              spirv: the device's shared memory (default 32768; 49152\n"
    "                                for spirv:coopmat); portable kernels use at most 32768\n"
    "      --blockmap                spirv: print the block-map kernel's SPIR-V instead\n"
    "      --verbose                 print the compiler's time and log (ptxas's register/spill\n"
    "                                report for CUDA) to stderr\n"
    "  check               run PATTERN on random inputs and check the result\n"
    "      --backend cpu|cuda|hip|vulkan  cpu: the double-precision reference only (default);\n"
    "                                the others: also that backend's kernel on this machine,\n"
    "                                compared with it\n"
    "      --shape B,Hq,Hkv,Sq,Skv,Dqk[,Dv]   default 1,4,2,512,512,64\n"
    "      --dtype f16|bf16|f32      input dtype (default bf16)\n"
    "      --layout bhsd|bshd        memory layout of q, k, v, o (default bhsd)\n"
    "      --seed N                  random seed (default 1)\n"
    "      --scalar NAME=VALUE       value of a runtime scalar $NAME (repeatable)\n"
    "      --aux NAME=FILE.npy       data of an aux tensor (repeatable; default: generated)\n"
    "      --tile QxK                tile size for the mask-analysis report (default 64x64)\n"
    "      --save DIR                write q, k, v, o, lse and the aux tensors there as .npy\n"
    "                                (f64, [B, H, S, D] order whatever the layout)\n"
    "  bundle              pregenerate kernels into one file the runtime preloads\n"
    "      -o FILE                   the bundle to write (required)\n"
    "      --target T[,T...]         cuda:sm_80, cuda:sm_86, cuda:sm_89, cuda:sm_90,\n"
    "                                cuda:sm_90a (what H100 contexts run by default),\n"
    "                                hip:gfx90a, hip:gfx940, hip:gfx942, spirv (required)\n"
    "      --head-dim D[:Dv][,...]   head dims (default 64,128); 128:64 is Dqk 128, Dv 64\n"
    "      --dtype T[,T...]          f16, bf16, f32 (spirv) (default bf16,f16; spirv f32,f16)\n"
    "      -j N                      compile with N threads (default: the CPUs online)\n"
    "      (several PATTERNs may be given)\n"
    "  --param NAME=VALUE  (emit, check, bundle) set a param of a Lua script (repeatable)\n"
    "\n"
    "  --help, -h          this text        --version   kpt's version\n"
    "\n"
    "PATTERN is a built-in pattern string, e.g. 'causal', 'sliding_window(1024)',\n"
    "'document+causal+softcap(30)', 'sliding_window($w=256)' (docs/patterns.md), or a Lua\n"
    "pattern script: a path ending in .lua (docs/lua.md, examples/patterns/).\n";

int usage_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("kptc: ", stderr);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputs("\n(kptc --help shows the usage)\n", stderr);
    return EXIT_USAGE;
}

int report(const kpt_diag *d, kpt_status st)
{
    fprintf(stderr, "kptc: %s\n", d->message[0] ? d->message : kpt_status_string(st));
    return st == KPT_ERR_NO_MEMORY || st == KPT_ERR_INTERNAL ? 1 : EXIT_USAGE;
}

/* ---- options -------------------------------------------------------------------------------- */

typedef struct options {
    const char *pattern;
    const char *emit;
    const char *dump_after;
    const char *target;
    const char *head_dim;
    const char *verbose;
    const char *backend;
    const char *shape;
    const char *dtype;
    const char *layout;
    const char *seed;
    const char *tile;
    const char *save;
    const char *smem;
    const char *blockmap;
    const char *params[MAX_KV];
    int nparams;
    const char *scalars[MAX_KV];
    int nscalars;
    const char *aux[MAX_KV];
    int naux;
} options;

static const char *const check_opts[] = {"--backend", "--shape", "--dtype", "--layout", "--seed",
                                         "--scalar", "--aux", "--tile", "--save", "--param",
                                         NULL};
static const char *const emit_opts[] = {"--emit", "--dump-after", "--target", "--head-dim",
                                        "--dtype", "--verbose", "--param", "--smem",
                                        "--blockmap", NULL};

static const char **slot(options *o, const char *name)
{
    if (!strcmp(name, "--emit")) return &o->emit;
    if (!strcmp(name, "--dump-after")) return &o->dump_after;
    if (!strcmp(name, "--target")) return &o->target;
    if (!strcmp(name, "--head-dim")) return &o->head_dim;
    if (!strcmp(name, "--verbose")) return &o->verbose;
    if (!strcmp(name, "--backend")) return &o->backend;
    if (!strcmp(name, "--shape")) return &o->shape;
    if (!strcmp(name, "--dtype")) return &o->dtype;
    if (!strcmp(name, "--layout")) return &o->layout;
    if (!strcmp(name, "--seed")) return &o->seed;
    if (!strcmp(name, "--tile")) return &o->tile;
    if (!strcmp(name, "--save")) return &o->save;
    if (!strcmp(name, "--smem")) return &o->smem;
    if (!strcmp(name, "--blockmap")) return &o->blockmap;
    return NULL;
}

static int parse_options(int argc, char **argv, const char *const *allowed, options *o)
{
    for (int i = 0; i < argc; i++) {
        const char *arg = argv[i];
        if (arg[0] != '-' || arg[1] == 0 || (arg[1] >= '0' && arg[1] <= '9')) {
            if (o->pattern)
                return usage_error("more than one PATTERN given ('%s' and '%s'); quote patterns "
                                   "that contain spaces", o->pattern, arg);
            o->pattern = arg;
            continue;
        }
        char name[32];
        const char *value = strchr(arg, '=');
        size_t n = value ? (size_t)(value - arg) : strlen(arg);
        if (n >= sizeof(name))
            return usage_error("unknown option '%s'", arg);
        memcpy(name, arg, n);
        name[n] = 0;
        bool known = false;
        for (int k = 0; allowed[k]; k++)
            known |= strcmp(allowed[k], name) == 0;
        if (!known)
            return usage_error("unknown option '%s' for this command", name);
        if (!strcmp(name, "--verbose") || !strcmp(name, "--blockmap")) { /* flags: no value */
            if (value)
                return usage_error("%s takes no value", name);
            value = "1";
        } else if (value) {
            value++;
        } else {
            if (i + 1 >= argc)
                return usage_error("option '%s' needs a value", name);
            value = argv[++i];
        }
        if (!strcmp(name, "--scalar") || !strcmp(name, "--aux") || !strcmp(name, "--param")) {
            int *count = name[2] == 's' ? &o->nscalars : name[2] == 'a' ? &o->naux : &o->nparams;
            const char **list = name[2] == 's' ? o->scalars : name[2] == 'a' ? o->aux : o->params;
            if (*count == MAX_KV)
                return usage_error("too many %s options", name);
            list[(*count)++] = value;
            continue;
        }
        const char **s = slot(o, name);
        if (*s)
            return usage_error("option '%s' given twice", name);
        *s = value;
    }
    return 0;
}

bool parse_int(const char *s, int64_t lo, int64_t hi, int64_t *out)
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
int parse_assignment(const char *opt, const char *arg, bool booleans,
                            char name[KPT_NAME_MAX], double *value)
{
    const char *eq = strchr(arg, '=');
    size_t n = eq ? (size_t)(eq - arg) : 0;
    if (!eq || n == 0 || n >= KPT_NAME_MAX)
        return usage_error("%s wants NAME=VALUE (a name of at most %d characters), got '%s'", opt,
                           KPT_NAME_MAX - 1, arg);
    if (booleans && (!strcmp(eq + 1, "true") || !strcmp(eq + 1, "false"))) {
        *value = eq[1] == 't';
    } else {
        char *end;
        *value = strtod(eq + 1, &end);
        if (end == eq + 1 || *end || !isfinite(*value))
            return usage_error("%s %s: '%s' is not a number", opt, arg, eq + 1);
    }
    memcpy(name, arg, n);
    name[n] = 0;
    return 0;
}

/* ---- patterns ------------------------------------------------------------------------------- */

static int cmd_patterns(void)
{
    for (int i = 0; i < kpt_builtin_count(); i++) {
        const kpt_builtin_info *b = kpt_builtin_get(i);
        printf("%-22s %s\n", b->signature, b->meaning);
    }
    printf("\nCompose with '+' (masks AND, score mods apply left to right); write $name (or\n"
           "$name=default) for a runtime scalar argument. Example: document+causal+softcap(30)\n");
    return 0;
}

/* ---- loading patterns: built-in strings and Lua scripts ------------------------------------ */

typedef struct script {
    char *src; /* the script's text; NULL for a pattern string */
    size_t len;
    kpt_lua_params prm;
    kpt_param_value values[MAX_KV];
    char names[MAX_KV][KPT_NAME_MAX];
} script;

bool is_script(const char *pattern)
{
    size_t n = strlen(pattern);
    return n > 4 && !strcmp(pattern + n - 4, ".lua");
}

static void print_from_script(void *ud, const char *text)
{
    fprintf(stderr, "%s: %s\n", (const char *)ud, text);
}

static int parse_params(const options *o, script *sc)
{
    for (int i = 0; i < o->nparams; i++) {
        int rc = parse_assignment("--param", o->params[i], true, sc->names[i], &sc->values[i].value);
        if (rc)
            return rc;
        sc->values[i].name = sc->names[i];
    }
    return 0;
}

/* The pattern before any pass runs: a pattern string, or a script (its text kept in sc). */
static int load_pattern(const options *o, script *sc, kpt_pattern **out)
{
    memset(sc, 0, sizeof(*sc));
    *out = NULL;
    kpt_diag d = {0};
    if (!is_script(o->pattern)) {
        if (o->nparams)
            return usage_error("--param goes with Lua scripts (.lua); a pattern string takes its "
                               "values in the text, e.g. sliding_window(256)");
        *out = kpt_parse_pattern(o->pattern, &d);
        return *out ? 0 : report(&d, d.status);
    }
    int rc = parse_params(o, sc);
    if (rc)
        return rc;
    sc->src = kpt_lua_read_file(o->pattern, &sc->len, &d);
    if (!sc->src)
        return report(&d, d.status);
    sc->prm = (kpt_lua_params){.name = o->pattern, .params = sc->values,
                               .num_params = o->nparams, .print = print_from_script,
                               .print_user = (void *)o->pattern};
    *out = kpt_parse_lua(sc->src, sc->len, &sc->prm, &d);
    return *out ? 0 : report(&d, d.status);
}

/* ---- emit ----------------------------------------------------------------------------------- */

static void print_dump(void *ud, const char *pass, int round, const char *text)
{
    (void)ud;
    if (round)
        printf("# after %s (round %d)\n%s", pass, round, text);
    else
        printf("# after %s\n%s", pass, text);
}

static int parse_head_dims(const char *s, int *dqk, int *dv)
{
    int64_t a = 128, b = -1;
    if (s) {
        const char *comma = strchr(s, ',');
        char buf[16];
        size_t n = comma ? (size_t)(comma - s) : strlen(s);
        if (n == 0 || n >= sizeof(buf))
            return -1;
        memcpy(buf, s, n);
        buf[n] = 0;
        if (!parse_int(buf, 1, 1024, &a) || (comma && !parse_int(comma + 1, 1, 1024, &b)))
            return -1;
    }
    *dqk = (int)a;
    *dv = (int)(b > 0 ? b : a);
    return 0;
}

/* Writes a binary to stdout, never to a terminal. */
static int write_binary(const void *data, size_t n, const char *what)
{
    if (isatty(fileno(stdout))) {
        fprintf(stderr, "kptc: not writing %s to a terminal; redirect stdout to a file\n", what);
        return EXIT_USAGE;
    }
    return fwrite(data, 1, n, stdout) == n ? 0 : 1;
}

/* --emit cuda|ptx|cubin|hip|hsaco|glsl|spirv: the kernel for one target, through the same path
 * the runtime takes (target/: planner, source generator, runtime compiler). */
static int emit_target(const options *o, kpt_pattern *p, const char *what, kpt_backend_kind be,
                       const char *default_target)
{
    char list[256];
    const char *name = o->target ? o->target : default_target;
    const kpt_target *t = kpt_target_find(name);
    if (!t || t->backend != be)
        return usage_error("--target '%s': --emit %s takes %s", name, what,
                           kpt_target_list(be, list, sizeof(list)));
    kpt_kernel_request rq = {.kind = KPT_KERNEL_FORWARD, .dtype = t->default_dtype};
    if (parse_head_dims(o->head_dim, &rq.dqk, &rq.dv))
        return usage_error("--head-dim wants D or Dqk,Dv, got '%s'", o->head_dim);
    if (o->dtype) {
        rq.dtype = kpt_dtype_from_name(o->dtype);
        if (rq.dtype < 0 || !(t->dtypes & (1u << rq.dtype)))
            return usage_error("--dtype '%s': %s takes %s", o->dtype, t->name,
                               be == KPT_BACKEND_VULKAN ? "f16 or f32" : "f16 or bf16");
    }
    int64_t smem = t->smem_default;
    if (o->smem && !parse_int(o->smem, 1024, 1 << 30, &smem))
        return usage_error("--smem wants a byte count from 1024, got '%s'", o->smem);
    rq.smem_limit = (int)smem;
    kpt_diag d = {0};
    kpt_kernel_plan plan;
    char *src = NULL;
    kpt_status st = kpt_kernel_generate(t, p, &rq, &plan, &src, &d);
    if (st)
        return report(&d, st);
    if (o->blockmap && !plan.has_blockmap) {
        free(src);
        fprintf(stderr, "kptc: pattern '%s' needs no block map\n", p->name);
        return 1;
    }
    if (!strcmp(what, "cuda") || !strcmp(what, "hip") || !strcmp(what, "glsl")) {
        fputs(src, stdout);
        free(src);
        return 0;
    }
    bool ptx = !strcmp(what, "ptx");
    unsigned flags = (ptx ? KPT_RTC_TEXT_ONLY : 0) | (o->verbose ? KPT_RTC_VERBOSE : 0);
    kpt_rtc_output out;
    double t0 = kpt_now_ms();
    st = kpt_kernel_compile(t, src, &plan, flags, &out, &d);
    free(src);
    if (st) {
        kpt_rtc_output_free(&out);
        fprintf(stderr, "kptc: %s\n", d.message);
        return 1;
    }
    if (o->verbose)
        fprintf(stderr, "kptc: %s %.1f ms for %s, %zu bytes%s%s\n%s", out.route,
                out.ms > 0 ? out.ms : kpt_now_ms() - t0, t->name, out.size,
                out.why_not_rtc[0] ? "; not hipRTC: " : "", out.why_not_rtc,
                out.log ? out.log : "");
    int rc;
    if (ptx) {
        fputs(out.text, stdout);
        rc = 0;
    } else if (be == KPT_BACKEND_VULKAN) { /* one entry point's module, not the packed pair */
        const uint32_t *attn, *bm;
        size_t na, nb;
        kpt_spirv_unpack(out.binary, out.size, &attn, &na, &bm, &nb);
        rc = o->blockmap ? write_binary(bm, nb * 4, "SPIR-V") : write_binary(attn, na * 4, "SPIR-V");
    } else {
        rc = write_binary(out.binary, out.size, t->binary_kind);
    }
    kpt_rtc_output_free(&out);
    return rc;
}

static int cmd_emit(int argc, char **argv)
{
    options o = {0};
    int rc = parse_options(argc, argv, emit_opts, &o);
    if (rc)
        return rc;
    if (!o.pattern)
        return usage_error("emit needs a PATTERN");
    const char *what = o.emit ? o.emit : "ir";
    bool cuda = !strcmp(what, "cuda") || !strcmp(what, "ptx") || !strcmp(what, "cubin");
    bool spirv = !strcmp(what, "glsl") || !strcmp(what, "spirv");
    bool hip = !strcmp(what, "hip") || !strcmp(what, "hsaco");
    if (strcmp(what, "ir") != 0 && !cuda && !spirv && !hip)
        return usage_error("unknown --emit '%s' (expected ir, cuda, ptx, cubin, glsl, spirv, hip "
                           "or hsaco)", what);
    if (!cuda && !spirv && !hip && (o.target || o.head_dim || o.dtype || o.verbose))
        return usage_error("--target, --head-dim, --dtype and --verbose go with --emit "
                           "cuda|ptx|cubin|glsl|spirv|hip|hsaco");
    if (!spirv && (o.smem || o.blockmap))
        return usage_error("--smem and --blockmap go with --emit glsl|spirv");
    if ((cuda || spirv || hip) && o.dump_after)
        return usage_error("--dump-after goes with --emit ir");
    if (o.dump_after && !kpt_pipeline_is_stage(o.dump_after))
        return usage_error("unknown stage '%s' for --dump-after (parse, opt_fold, opt_simplify, all)",
                           o.dump_after);
    kpt_diag d = {0};
    script sc;
    kpt_pattern *p;
    rc = load_pattern(&o, &sc, &p);
    free(sc.src);
    if (rc)
        return rc;
    kpt_pipeline_opts popts = {.dump_after = o.dump_after, .dump = print_dump};
    kpt_status st = kpt_pipeline_run(p, &popts, &d);
    if (st) {
        kpt_pattern_destroy(&p);
        return report(&d, st);
    }
    if (cuda) {
        rc = emit_target(&o, p, what, KPT_BACKEND_CUDA, "cuda:sm_80");
    } else if (spirv) {
        rc = emit_target(&o, p, what, KPT_BACKEND_VULKAN, "spirv");
    } else if (hip) {
        rc = emit_target(&o, p, what, KPT_BACKEND_HIP, "hip:gfx90a");
    } else if (!o.dump_after) {
        char *text = kpt_pattern_ir_text(p);
        if (!text) {
            kpt_pattern_destroy(&p);
            fprintf(stderr, "kptc: out of memory\n");
            return 1;
        }
        fputs(text, stdout);
        kpt_free(text);
    }
    kpt_pattern_destroy(&p);
    return rc;
}

/* ---- check ---------------------------------------------------------------------------------- */

typedef struct check_ctx {
    options o;
    kpt_pattern *p;
    int64_t B, Hq, Hkv, Sq, Skv, Dqk, Dv;
    kpt_dtype dtype;
    bool bshd;
    uint64_t seed;
    int64_t tile_q, tile_k;
    kpt_scalar_value scalars[KPT_MAX_SCALARS];
    int nscalars;
    script sc;
    kpt_aux_tensor aux[KPT_MAX_AUX];
    void *aux_data[KPT_MAX_AUX];
    char aux_desc[KPT_MAX_AUX][96];
    int naux;
} check_ctx;

static int parse_shape(check_ctx *c)
{
    c->B = 1, c->Hq = 4, c->Hkv = 2, c->Sq = 512, c->Skv = 512, c->Dqk = 64, c->Dv = -1;
    if (c->o.shape) {
        int64_t v[7];
        int n = 0;
        const char *s = c->o.shape;
        while (n < 7) {
            char buf[24];
            size_t len = strcspn(s, ",");
            if (len == 0 || len >= sizeof(buf))
                break;
            memcpy(buf, s, len);
            buf[len] = 0;
            if (!parse_int(buf, 1, 1 << 24, &v[n]))
                return usage_error("--shape: '%s' is not a positive integer (up to 16777216)", buf);
            n++;
            s += len;
            if (*s != ',')
                break;
            s++;
        }
        if ((n != 6 && n != 7) || *s)
            return usage_error("--shape wants B,Hq,Hkv,Sq,Skv,Dqk[,Dv], got '%s'", c->o.shape);
        c->B = v[0], c->Hq = v[1], c->Hkv = v[2], c->Sq = v[3], c->Skv = v[4], c->Dqk = v[5];
        c->Dv = n == 7 ? v[6] : -1;
    }
    if (c->Dv < 0)
        c->Dv = c->Dqk;
    if (c->Hq % c->Hkv)
        return usage_error("--shape: Hq (%lld) must be a multiple of Hkv (%lld)", (long long)c->Hq,
                           (long long)c->Hkv);
    if ((double)c->Sq * (double)c->Skv > (double)(1 << 30))
        return usage_error("--shape: Sq x Skv is too large for check's brute-force mask (at most 2^30)");
    double work = (double)c->B * c->Hq * c->Sq * c->Skv * (c->Dqk + c->Dv);
    if (work > 4e11)
        return usage_error("--shape: too large for the CPU reference (%.3g multiply-adds)", work);
    c->dtype = KPT_DTYPE_BF16;
    if (c->o.dtype) {
        c->dtype = kpt_dtype_from_name(c->o.dtype);
        if (c->dtype != KPT_DTYPE_F16 && c->dtype != KPT_DTYPE_BF16 && c->dtype != KPT_DTYPE_F32)
            return usage_error("--dtype '%s': expected f16, bf16 or f32", c->o.dtype);
    }
    const char *layout = c->o.layout ? c->o.layout : "bhsd";
    if (strcmp(layout, "bhsd") && strcmp(layout, "bshd"))
        return usage_error("--layout '%s': expected bhsd or bshd", layout);
    c->bshd = layout[1] == 's';
    int64_t seed = 1;
    if (c->o.seed && !parse_int(c->o.seed, 0, INT64_MAX, &seed))
        return usage_error("--seed '%s' is not a non-negative integer", c->o.seed);
    c->seed = (uint64_t)seed;
    c->tile_q = c->tile_k = 64;
    if (c->o.tile) {
        char *x = strchr(c->o.tile, 'x');
        char qb[16];
        size_t ql = x ? (size_t)(x - c->o.tile) : 0;
        if (!x || ql == 0 || ql >= sizeof(qb))
            return usage_error("--tile wants QxK, e.g. 128x64");
        memcpy(qb, c->o.tile, ql);
        qb[ql] = 0;
        if (!parse_int(qb, 1, 4096, &c->tile_q) || !parse_int(x + 1, 1, 4096, &c->tile_k))
            return usage_error("--tile wants QxK with sizes 1..4096, got '%s'", c->o.tile);
    }
    return 0;
}

static int parse_scalars(check_ctx *c)
{
    static char names[KPT_MAX_SCALARS][KPT_NAME_MAX];
    for (int i = 0; i < c->o.nscalars; i++) {
        if (c->nscalars == KPT_MAX_SCALARS)
            return usage_error("--scalar '%s': too many scalars", c->o.scalars[i]);
        const char *arg = c->o.scalars[i];
        int rc = parse_assignment("--scalar", arg[0] == '$' ? arg + 1 : arg, false,
                                  names[c->nscalars], &c->scalars[c->nscalars].value);
        if (rc)
            return rc;
        c->scalars[c->nscalars].name = names[c->nscalars];
        c->nscalars++;
    }
    return 0;
}

/* Generated aux tensors take their declared sizes; a free dimension gets 64 entries. */
static int64_t dim_value(const check_ctx *c, int64_t dim)
{
    kpt_attn_shape s = {c->B, c->Hq, c->Hkv, c->Sq, c->Skv, c->Dqk, c->Dv};
    int64_t n = kpt_attn_dim_size(dim, &s);
    return n > 0 ? n : 64;
}

/* Sorted segment ids along the last dimension: the same random cut points (as fractions of the
 * length) for every tensor filled this way, so doc_q and doc_kv agree when Sq == Skv. */
static void fill_segments(check_ctx *c, const kpt_aux_decl *d, const int64_t *shape, void *data)
{
    int64_t len = shape[d->rank - 1], rows = 1;
    for (int i = 0; i < d->rank - 1; i++)
        rows *= shape[i];
    for (int64_t r = 0; r < rows; r++) {
        kpt_rng rng;
        kpt_rng_seed(&rng, c->seed * 7919 + (uint64_t)r);
        int ncuts = (int)kpt_rng_range(&rng, 2, 5); /* 3 to 6 documents */
        double cuts[6];
        for (int i = 0; i < ncuts; i++)
            cuts[i] = kpt_rng_uniform(&rng);
        for (int64_t i = 0; i < len; i++) {
            int id = 0;
            for (int k = 0; k < ncuts; k++)
                id += cuts[k] <= (double)i / (double)len;
            kpt_store_double(data, d->dtype, r * len + i, id);
        }
    }
}

static int make_aux(check_ctx *c)
{
    kpt_rng rng;
    kpt_rng_seed(&rng, c->seed ^ 0xa5a5a5a5ull);
    const char *files[KPT_MAX_AUX] = {NULL}; /* by aux index; the last --aux for a name wins */
    for (int i = 0; i < c->o.naux; i++) {
        const char *eq = strchr(c->o.aux[i], '=');
        char name[KPT_NAME_MAX];
        size_t n = eq ? (size_t)(eq - c->o.aux[i]) : 0;
        if (!eq || n == 0 || n >= sizeof(name))
            return usage_error("--aux wants NAME=FILE.npy, got '%s'", c->o.aux[i]);
        memcpy(name, c->o.aux[i], n);
        name[n] = 0;
        int idx = kpt_pattern_find_aux(c->p, name);
        if (idx < 0)
            return usage_error("--aux %s: the pattern has no aux tensor '%s'", c->o.aux[i], name);
        files[idx] = eq + 1;
    }
    for (int a = 0; a < c->p->num_aux; a++) {
        const kpt_aux_decl *d = &c->p->aux[a];
        const char *file = files[a];
        int64_t shape[3] = {1, 1, 1}, count = 1;
        kpt_npy npy = {0};
        if (file) {
            kpt_diag diag = {0};
            kpt_status st = kpt_npy_load(file, &npy, &diag);
            if (st)
                return report(&diag, st);
            if (npy.rank != d->rank) {
                kpt_npy_free(&npy);
                return usage_error("--aux %s: %s has rank %d, the pattern wants %d", d->name, file,
                                   npy.rank, d->rank);
            }
            if (d->dtype == KPT_DTYPE_I32 || d->dtype == KPT_DTYPE_BOOL)
                for (int64_t i = 0; i < npy.count; i++)
                    if (npy.values[i] != floor(npy.values[i]) || fabs(npy.values[i]) > INT32_MAX) {
                        kpt_npy_free(&npy);
                        return usage_error("--aux %s: element %lld of %s is not an i32", d->name,
                                           (long long)i, file);
                    }
        }
        for (int k = 0; k < d->rank; k++) {
            shape[k] = file ? npy.shape[k] : dim_value(c, d->dims[k]);
            count *= shape[k];
        }
        void *data = calloc((size_t)(count ? count : 1), (size_t)kpt_dtype_size(d->dtype));
        if (!data) {
            kpt_npy_free(&npy);
            fprintf(stderr, "kptc: out of memory\n");
            return 1;
        }
        c->aux_data[a] = data;
        if (file) {
            for (int64_t i = 0; i < count; i++)
                kpt_store_double(data, d->dtype, i, npy.values[i]);
            snprintf(c->aux_desc[a], sizeof(c->aux_desc[a]), "from %.60s (%s)", file, npy.descr);
            kpt_npy_free(&npy);
        } else if (d->fill == KPT_FILL_SCRIPT) {
            double *vals = malloc((size_t)(count ? count : 1) * sizeof(double));
            kpt_diag diag = {0};
            kpt_status st = vals ? kpt_lua_fill_aux(c->sc.src, c->sc.len, &c->sc.prm, d->name,
                                                    d->rank, shape, c->seed, vals, &diag)
                                 : kpt_diag_set(&diag, KPT_ERR_NO_MEMORY, "out of memory");
            if (st) {
                free(vals);
                return report(&diag, st);
            }
            for (int64_t i = 0; i < count; i++)
                kpt_store_double(data, d->dtype, i, vals[i]);
            free(vals);
            snprintf(c->aux_desc[a], sizeof(c->aux_desc[a]), "generated by the script's fill");
        } else if (d->fill == KPT_FILL_SEGMENTS) {
            fill_segments(c, d, shape, data);
            snprintf(c->aux_desc[a], sizeof(c->aux_desc[a]),
                     "generated: sorted segments of random lengths");
        } else {
            for (int64_t i = 0; i < count; i++) {
                double v = d->dtype == KPT_DTYPE_F32 || d->dtype == KPT_DTYPE_F16 ||
                                   d->dtype == KPT_DTYPE_BF16
                               ? d->fill_lo + (d->fill_hi - d->fill_lo) * kpt_rng_uniform(&rng)
                               : (double)kpt_rng_range(&rng, (int64_t)d->fill_lo, (int64_t)d->fill_hi);
                kpt_store_double(data, d->dtype, i, v);
            }
            snprintf(c->aux_desc[a], sizeof(c->aux_desc[a]), "generated: uniform in [%g, %g]",
                     d->fill_lo, d->fill_hi);
        }
        c->aux[a].name = d->name;
        c->aux[a].tensor = kpt_tensor_contiguous(data, d->dtype, d->rank, shape);
        c->naux = a + 1;
    }
    return 0;
}

/* A [B, H, S, D] tensor in the chosen layout. */
static kpt_tensor make_tensor(const check_ctx *c, void *data, kpt_dtype dt, int64_t H, int64_t S,
                              int64_t D)
{
    int64_t shape[4] = {c->B, H, S, D};
    kpt_tensor t = kpt_tensor_contiguous(data, dt, 4, shape);
    if (c->bshd) {
        t.stride[3] = 1;
        t.stride[1] = D;
        t.stride[2] = H * D;
        t.stride[0] = S * H * D;
    }
    return t;
}

static void *random_tensor(kpt_rng *rng, kpt_dtype dt, int64_t n)
{
    void *p = malloc((size_t)n * (size_t)kpt_dtype_size(dt));
    if (p)
        for (int64_t i = 0; i < n; i++)
            kpt_store_double(p, dt, i, kpt_rng_normal(rng));
    return p;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct mask_stats {
    double kept_fraction;
    int64_t empty_rows;
    int64_t tiles[3];
    bool exact, agrees;
    const char *summary;
} mask_stats;

/* The brute-force mask: kept pairs over every (b, h), and for (b=0, h=0) each tile's true class
 * compared with the analysis (ms->agrees is false if the analysis ever contradicts it). */
static int mask_stats_compute(check_ctx *c, const kpt_ir_value *scalars,
                              const kpt_ir_auxview *aux, mask_stats *ms)
{
    kpt_pattern *p = c->p;
    memset(ms, 0, sizeof(*ms));
    ms->agrees = true;
    kpt_ir_value *vals = calloc(p->g.count ? p->g.count : 1, sizeof(*vals));
    uint8_t *bits = malloc((size_t)(c->Sq * c->Skv));
    kpt_ir_prog prog = {0};
    if (!vals || !bits || !kpt_ir_prog_init(&prog, &p->g, &p->mask, 1)) {
        free(vals);
        free(bits);
        return 1;
    }
    kpt_ir_env env = {.sq = (int32_t)c->Sq, .skv = (int32_t)c->Skv, .hq = (int32_t)c->Hq,
                      .scalars = scalars, .aux = aux};
    int64_t kept = 0;
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t h = 0; h < c->Hq; h++) {
            env.b = (int32_t)b;
            env.h = (int32_t)h;
            for (int64_t q = 0; q < c->Sq; q++) {
                env.q = (int32_t)q;
                int64_t row = 0;
                for (int64_t k = 0; k < c->Skv; k++) {
                    env.k = (int32_t)k;
                    bool keep = true;
                    if (p->mask) {
                        kpt_ir_prog_run(&prog, &env, vals);
                        keep = vals[p->mask].i != 0;
                    }
                    row += keep;
                    if (b == 0 && h == 0)
                        bits[q * c->Skv + k] = keep;
                }
                kept += row;
                ms->empty_rows += row == 0;
            }
        }
    ms->kept_fraction = (double)kept / ((double)c->B * c->Hq * c->Sq * c->Skv);
    kpt_mask_env menv = {.sq = (int32_t)c->Sq, .skv = (int32_t)c->Skv, .hq = (int32_t)c->Hq,
                         .b = 0, .h = 0, .b_known = true, .h_known = true, .scalars = scalars};
    kpt_mask_analysis *an = kpt_analyze_mask(p, &menv);
    bool analysed = an != NULL;
    if (an) {
        ms->exact = kpt_mask_analysis_exact(an);
        static char summary[160];
        snprintf(summary, sizeof(summary), "%s", kpt_mask_analysis_summary(an));
        ms->summary = summary;
        for (int64_t q0 = 0; q0 < c->Sq; q0 += c->tile_q)
            for (int64_t k0 = 0; k0 < c->Skv; k0 += c->tile_k) {
                kpt_tile_class cls = kpt_mask_classify(an, q0, q0 + c->tile_q, k0, k0 + c->tile_k);
                ms->tiles[cls]++;
                bool any = false, all = true;
                for (int64_t q = q0; q < q0 + c->tile_q && q < c->Sq; q++)
                    for (int64_t k = k0; k < k0 + c->tile_k && k < c->Skv; k++) {
                        any |= bits[q * c->Skv + k];
                        all &= bits[q * c->Skv + k];
                    }
                kpt_tile_class truth = !any ? KPT_TILE_EMPTY : all ? KPT_TILE_FULL : KPT_TILE_PARTIAL;
                if (cls != KPT_TILE_PARTIAL && cls != truth)
                    ms->agrees = false;
                if (ms->exact && cls != truth)
                    ms->agrees = false;
            }
        kpt_mask_analysis_free(&an);
    }
    kpt_ir_prog_free(&prog);
    free(vals);
    free(bits);
    return analysed ? 0 : 1;
}

/* Writes t (rank 3 or 4, any strides and dtype) in logical order as f64 .npy. */
static int save_tensor(const char *dir, const char *name, const kpt_tensor *t)
{
    int64_t count = 1, idx[4] = {0};
    for (int d = 0; d < t->rank; d++)
        count *= t->shape[d];
    double *v = malloc((size_t)count * sizeof(double));
    if (!v) {
        fprintf(stderr, "kptc: out of memory\n");
        return 1;
    }
    for (int64_t i = 0; i < count; i++) {
        int64_t off = 0;
        for (int d = 0; d < t->rank; d++)
            off += idx[d] * t->stride[d];
        v[i] = kpt_load_as_double(t->data, t->dtype, off);
        for (int d = t->rank - 1; d >= 0 && ++idx[d] == t->shape[d]; d--)
            idx[d] = 0;
    }
    char path[1200];
    snprintf(path, sizeof(path), "%s/%s.npy", dir, name);
    kpt_diag d = {0};
    kpt_status st = kpt_npy_save_f64(path, v, t->rank, t->shape, &d);
    free(v);
    return st ? report(&d, st) : 0;
}

static int save_all(const check_ctx *c, const kpt_attention_args *args)
{
    const struct {
        const char *name;
        const kpt_tensor *t;
    } list[] = {{"q", &args->q}, {"k", &args->k}, {"v", &args->v}, {"o", &args->o},
                {"lse", &args->lse}};
    for (size_t i = 0; i < sizeof(list) / sizeof(list[0]); i++)
        if (save_tensor(c->o.save, list[i].name, list[i].t))
            return 1;
    for (int a = 0; a < c->naux; a++) {
        char name[KPT_NAME_MAX + 8];
        snprintf(name, sizeof(name), "aux_%s", c->aux[a].name);
        if (save_tensor(c->o.save, name, &c->aux[a].tensor))
            return 1;
    }
    return 0;
}

static void free_check(check_ctx *c, void **bufs, int nbufs)
{
    for (int i = 0; i < nbufs; i++)
        free(bufs[i]);
    for (int a = 0; a < KPT_MAX_AUX; a++)
        free(c->aux_data[a]);
    kpt_pattern_destroy(&c->p);
    free(c->sc.src);
    c->sc.src = NULL;
}

static int cmd_check(int argc, char **argv)
{
    check_ctx c;
    memset(&c, 0, sizeof(c));
    int rc = parse_options(argc, argv, check_opts, &c.o);
    if (rc)
        return rc;
    if (!c.o.pattern)
        return usage_error("check needs a PATTERN");
    if (c.o.backend && strcmp(c.o.backend, "cpu") && strcmp(c.o.backend, "cuda") &&
        strcmp(c.o.backend, "hip") && strcmp(c.o.backend, "vulkan"))
        return usage_error("--backend %s: expected cpu, cuda, hip or vulkan", c.o.backend);
    if ((rc = parse_shape(&c)) || (rc = parse_scalars(&c)))
        return rc;
    kpt_diag d = {0};
    if ((rc = load_pattern(&c.o, &c.sc, &c.p)))
        return rc;
    kpt_status st = kpt_pipeline_run(c.p, NULL, &d);
    if (st) {
        free_check(&c, NULL, 0);
        return report(&d, st);
    }
    void *bufs[5] = {0};
    if ((rc = make_aux(&c))) {
        free_check(&c, bufs, 0);
        return rc;
    }
    kpt_rng rng;
    kpt_rng_seed(&rng, c.seed);
    bufs[0] = random_tensor(&rng, c.dtype, c.B * c.Hq * c.Sq * c.Dqk);
    bufs[1] = random_tensor(&rng, c.dtype, c.B * c.Hkv * c.Skv * c.Dqk);
    bufs[2] = random_tensor(&rng, c.dtype, c.B * c.Hkv * c.Skv * c.Dv);
    bufs[3] = malloc((size_t)(c.B * c.Hq * c.Sq * c.Dv) * sizeof(double));
    bufs[4] = malloc((size_t)(c.B * c.Hq * c.Sq) * sizeof(double));
    if (!bufs[0] || !bufs[1] || !bufs[2] || !bufs[3] || !bufs[4]) {
        free_check(&c, bufs, 5);
        fprintf(stderr, "kptc: out of memory\n");
        return 1;
    }
    kpt_attention_args args = {
        .q = make_tensor(&c, bufs[0], c.dtype, c.Hq, c.Sq, c.Dqk),
        .k = make_tensor(&c, bufs[1], c.dtype, c.Hkv, c.Skv, c.Dqk),
        .v = make_tensor(&c, bufs[2], c.dtype, c.Hkv, c.Skv, c.Dv),
        .o = make_tensor(&c, bufs[3], KPT_DTYPE_F64, c.Hq, c.Sq, c.Dv),
        .lse = kpt_tensor_contiguous(bufs[4], KPT_DTYPE_F64, 3, (int64_t[]){c.B, c.Hq, c.Sq}),
        .scalars = c.scalars,
        .num_scalars = c.nscalars,
        .aux = c.aux,
        .num_aux = c.naux,
    };
    kpt_attn_binding bind;
    st = kpt_attn_bind(c.p, &args, &bind, &d);
    if (st) {
        free_check(&c, bufs, 5);
        return report(&d, st);
    }
    double t0 = now();
    st = kpt_reference_attention(c.p, &args, &d);
    double t1 = now();
    if (st) {
        free_check(&c, bufs, 5);
        return report(&d, st);
    }
    mask_stats ms;
    if (mask_stats_compute(&c, bind.scalars, bind.aux, &ms)) {
        free_check(&c, bufs, 5);
        fprintf(stderr, "kptc: out of memory\n");
        return 1;
    }
    /* consistency of the output: finite where rows keep keys, zero and -inf where none */
    const double *o = bufs[3], *lse = bufs[4];
    int64_t rows = c.B * c.Hq * c.Sq, bad = 0, masked = 0;
    double sum_abs = 0, lse_lo = INFINITY, lse_hi = -INFINITY;
    for (int64_t r = 0; r < rows; r++) {
        int64_t b = r / (c.Hq * c.Sq), h = r / c.Sq % c.Hq, q = r % c.Sq;
        const kpt_tensor *ot = &args.o;
        bool zero = true, finite = true;
        for (int64_t e = 0; e < c.Dv; e++) {
            double v = o[b * ot->stride[0] + h * ot->stride[1] + q * ot->stride[2] + e];
            zero &= v == 0;
            finite &= isfinite(v) != 0;
            sum_abs += fabs(v);
        }
        if (lse[r] == -INFINITY) {
            masked++;
            bad += !zero;
        } else {
            bad += !finite || !isfinite(lse[r]);
            if (lse[r] < lse_lo) lse_lo = lse[r];
            if (lse[r] > lse_hi) lse_hi = lse[r];
        }
    }
    bad += masked != ms.empty_rows;
    if (c.o.save && save_all(&c, &args)) {
        free_check(&c, bufs, 5);
        return 1;
    }
    printf("kptc check: pattern '%s' on the cpu reference (double precision)\n", c.p->name);
    printf("  shape      B=%lld Hq=%lld Hkv=%lld Sq=%lld Skv=%lld Dqk=%lld Dv=%lld\n",
           (long long)c.B, (long long)c.Hq, (long long)c.Hkv, (long long)c.Sq, (long long)c.Skv,
           (long long)c.Dqk, (long long)c.Dv);
    printf("  inputs     %s, layout %s, seed %llu, standard normal\n", kpt_dtype_name(c.dtype),
           c.bshd ? "bshd" : "bhsd", (unsigned long long)c.seed);
    for (int i = 0; i < c.p->num_scalars; i++) {
        const kpt_scalar_decl *s = &c.p->scalars[i];
        double v = s->type == KPT_IR_I32 ? bind.scalars[i].i : bind.scalars[i].f;
        bool given = false;
        for (int k = 0; k < c.nscalars; k++)
            given |= !strcmp(c.scalars[k].name, s->name);
        printf("  scalar     $%s = %g (%s)\n", s->name, v, given ? "--scalar" : "default");
    }
    for (int a = 0; a < c.p->num_aux; a++) {
        const kpt_tensor *t = &c.aux[a].tensor;
        printf("  aux        %s %s [", c.p->aux[a].name, kpt_dtype_name(t->dtype));
        for (int k = 0; k < t->rank; k++)
            printf("%s%lld", k ? ", " : "", (long long)t->shape[k]);
        printf("]: %s\n", c.aux_desc[a]);
    }
    printf("  mask       %.2f%% of (q, k) pairs kept; %lld fully masked rows\n",
           100 * ms.kept_fraction, (long long)ms.empty_rows);
    if (ms.summary)
        printf("  analysis   %s\n", ms.summary);
    printf("  tiles      %lldx%lld (b=0, h=0): %lld empty, %lld full, %lld partial; %s\n",
           (long long)c.tile_q, (long long)c.tile_k, (long long)ms.tiles[KPT_TILE_EMPTY],
           (long long)ms.tiles[KPT_TILE_FULL], (long long)ms.tiles[KPT_TILE_PARTIAL],
           ms.agrees ? "agrees with the brute-force mask" : "CONTRADICTS the brute-force mask");
    printf("  output     mean |O| = %.4g; LSE in [%.4g, %.4g]; %s\n",
           sum_abs / (double)(rows * c.Dv), lse_lo, lse_hi,
           bad ? "INCONSISTENT rows found" : "all rows consistent");
    printf("  time       %.3f s for the reference attention\n", t1 - t0);
    fflush(stdout);
    if (c.o.backend && strcmp(c.o.backend, "cpu") && !bad && ms.agrees)
        rc = kptc_check_device(c.o.backend, c.p, &args, c.dtype);
    free_check(&c, bufs, 5);
    if (rc)
        return rc;
    if (bad || !ms.agrees) {
        fprintf(stderr, "kptc: check failed\n");
        return 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return usage_error("no command given");
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
        fputs(usage_text, stdout);
        return 0;
    }
    if (!strcmp(cmd, "--version")) {
        printf("kptc %s\n", kpt_version());
        return 0;
    }
    for (int i = 2; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(usage_text, stdout);
            return 0;
        }
    if (!strcmp(cmd, "patterns"))
        return argc == 2 ? cmd_patterns() : usage_error("patterns takes no arguments");
    if (!strcmp(cmd, "emit"))
        return cmd_emit(argc - 2, argv + 2);
    if (!strcmp(cmd, "check"))
        return cmd_check(argc - 2, argv + 2);
    if (!strcmp(cmd, "bundle"))
        return kptc_bundle(argc - 2, argv + 2);
    return usage_error("unknown command '%s' (patterns, emit, check, bundle)", cmd);
}
