/* kptc emit: a pattern's IR, or its kernel for one target (source, PTX or binary). */
#include <errno.h>
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/diag.h"
#include "compiler/pipeline.h"
#include "target/target.h"
#include "tools/kptc/kptc.h"
#include "vendor/rtc_glslang.h"

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
        if (!kptc_parse_int(buf, 1, 1024, &a) || (comma && !kptc_parse_int(comma + 1, 1, 1024, &b)))
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
        return KPTC_EXIT_USAGE;
    }
    return fwrite(data, 1, n, stdout) == n ? 0 : 1;
}

/* --emit cuda|ptx|cubin|hip|hsaco|glsl|spirv: the kernel for one target, through the same path
 * the runtime takes (target/: planner, source generator, runtime compiler). */
static int emit_target(const kptc_options *o, kpt_pattern *p, const char *what, kpt_backend_kind be,
                       const char *default_target)
{
    char list[256];
    const char *name = o->target ? o->target : default_target;
    const kpt_target *t = kpt_target_find(name);
    if (!t || t->backend != be)
        return kptc_usage_error("--target '%s': --emit %s takes %s", name, what,
                                kpt_target_list(be, list, sizeof(list)));
    kpt_kernel_request rq = {.kind = o->backward ? KPT_KERNEL_BACKWARD
                                     : o->paged  ? KPT_KERNEL_PAGED
                                                 : KPT_KERNEL_FORWARD,
                             .dtype = t->default_dtype, .tall = o->tall != NULL};
    if (parse_head_dims(o->head_dim, &rq.dqk, &rq.dv))
        return kptc_usage_error("--head-dim wants D or Dqk,Dv, got '%s'", o->head_dim);
    if (o->dtype) {
        rq.dtype = kpt_dtype_from_name(o->dtype);
        if (!(t->dtypes & (1u << rq.dtype)))
            return kptc_usage_error("--dtype '%s': %s takes %s", o->dtype, t->name,
                                    kpt_dtype_list(t->dtypes, list, sizeof(list)));
    }
    int64_t smem = t->smem_default;
    if (o->smem && !kptc_parse_int(o->smem, 1024, 1 << 30, &smem))
        return kptc_usage_error("--smem wants a byte count from 1024, got '%s'", o->smem);
    rq.smem_limit = (int)smem;
    kpt_diag d = {0};
    kpt_kernel_plan plan;
    char *src = NULL;
    kpt_status st = kpt_kernel_generate(t, p, &rq, &plan, &src, &d);
    if (st)
        return kptc_report(&d, st);
    if (o->tall && !plan.cfg.tall) {
        free(src);
        fprintf(stderr, "kptc: pattern '%s' has no tall variant on %s at this head dim (a "
                "masked forward on cuda:sm_90a, head dims up to 64, no block map)\n", p->name,
                t->name);
        return 1;
    }
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
        rc = o->blockmap ? write_binary(bm, nb * 4, "SPIR-V")
                         : write_binary(attn, na * 4, "SPIR-V");
    } else {
        rc = write_binary(out.binary, out.size, t->binary_kind);
    }
    kpt_rtc_output_free(&out);
    return rc;
}

int kptc_cmd_emit(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"emit", required_argument, NULL, KPTC_OPT_EMIT},
        {"dump-after", required_argument, NULL, KPTC_OPT_DUMP_AFTER},
        {"target", required_argument, NULL, KPTC_OPT_TARGET},
        {"head-dim", required_argument, NULL, KPTC_OPT_HEAD_DIM},
        {"dtype", required_argument, NULL, KPTC_OPT_DTYPE},
        {"verbose", no_argument, NULL, KPTC_OPT_VERBOSE},
        {"param", required_argument, NULL, KPTC_OPT_PARAM},
        {"smem", required_argument, NULL, KPTC_OPT_SMEM},
        {"blockmap", no_argument, NULL, KPTC_OPT_BLOCKMAP},
        {"backward", no_argument, NULL, KPTC_OPT_BACKWARD},
        {"paged", no_argument, NULL, KPTC_OPT_PAGED},
        {"tall", no_argument, NULL, KPTC_OPT_TALL},
        {"output", required_argument, NULL, 'o'},
        {"help", no_argument, NULL, 'h'},
        {0},
    };
    kptc_options o = {0};
    int rc = kptc_parse_options(argc, argv, longopts, kptc_usage_emit, &o);
    if (!rc)
        rc = kptc_one_pattern(&o, "emit");
    if (rc)
        return rc;
    const char *what = o.emit ? o.emit : "ir";
    bool cuda = !strcmp(what, "cuda") || !strcmp(what, "ptx") || !strcmp(what, "cubin");
    bool spirv = !strcmp(what, "glsl") || !strcmp(what, "spirv");
    bool hip = !strcmp(what, "hip") || !strcmp(what, "hsaco");
    if (strcmp(what, "ir") != 0 && !cuda && !spirv && !hip)
        return kptc_usage_error("unknown --emit '%s' (expected ir, cuda, ptx, cubin, glsl, "
                                "spirv, hip or hsaco)", what);
    if (!cuda && !spirv && !hip && (o.target || o.head_dim || o.dtype || o.verbose))
        return kptc_usage_error("--target, --head-dim, --dtype and --verbose go with --emit "
                                "cuda|ptx|cubin|glsl|spirv|hip|hsaco");
    if (!spirv && (o.smem || o.blockmap))
        return kptc_usage_error("--smem and --blockmap go with --emit glsl|spirv");
    if (o.tall && (!cuda || o.backward || o.paged))
        return kptc_usage_error("--tall goes with --emit cuda|ptx|cubin of a forward kernel");
    if ((cuda || spirv || hip) && o.dump_after)
        return kptc_usage_error("--dump-after goes with --emit ir");
    if (o.dump_after && !kpt_pipeline_is_stage(o.dump_after))
        return kptc_usage_error("unknown stage '%s' for --dump-after (parse, opt_fold, "
                                "opt_simplify, all)", o.dump_after);
    kpt_diag d = {0};
    kptc_script sc;
    kpt_pattern *p;
    rc = kptc_load_pattern(&o, &sc, &p);
    free(sc.src);
    if (rc)
        return rc;
    kpt_pipeline_opts popts = {.dump_after = o.dump_after, .dump = print_dump};
    kpt_status st = kpt_pipeline_run(p, &popts, &d);
    if (st || kptc_parse_only) {
        kpt_pattern_destroy(&p);
        return st ? kptc_report(&d, st) : 0;
    }
    /* the output is opened once the input is known to be good: a bad pattern leaves no file */
    if (o.output && !freopen(o.output, "wb", stdout)) {
        kpt_pattern_destroy(&p);
        fprintf(stderr, "kptc: cannot write '%s': %s\n", o.output, strerror(errno));
        return 1;
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

