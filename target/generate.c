/* The one generation path (see target.h): planner, source generator and runtime compiler of a
 * target, and the adapters that give the three vendor compilers one interface. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/diag.h"
#include "compiler/passes.h"
#include "target/target.h"
#include "vendor/rtc_glslang.h"
#include "vendor/rtc_hiprtc.h"
#include "vendor/rtc_nvrtc.h"

const char *kpt_kernel_kind_name(kpt_kernel_kind kind)
{
    switch (kind) {
    case KPT_KERNEL_FORWARD: return "forward";
    case KPT_KERNEL_BACKWARD: return "backward";
    case KPT_KERNEL_PAGED: return "paged";
    default: return "?";
    }
}

void kpt_rtc_output_free(kpt_rtc_output *out)
{
    free(out->binary);
    free(out->text);
    free(out->log);
    memset(out, 0, sizeof(*out));
}

/* ---- NVRTC ---------------------------------------------------------------------------------- */

static void nvrtc_identity(char *out, size_t n)
{
    int v = kpt_nvrtc_version(NULL);
    if (v > 0)
        snprintf(out, n, "nvrtc %d.%d", v / 1000, v % 1000 / 10);
    else if (n)
        out[0] = 0;
}

unsigned kpt_nvrtc_flags(const kpt_kernel_plan *plan, unsigned flags)
{
    unsigned nv = (plan->cfg.wgmma ? KPT_NVRTC_ARCH_SPECIFIC : 0) |
                  (plan->has_blockmap ? KPT_NVRTC_PARALLEL : 0);
    if (!(flags & KPT_RTC_TEXT_ONLY) || (flags & KPT_RTC_VERBOSE))
        nv |= KPT_NVRTC_CUBIN; /* ptxas runs only when there is machine code to make */
    if (flags & KPT_RTC_VERBOSE)
        nv |= KPT_NVRTC_PTXAS_VERBOSE;
    return nv;
}

static kpt_status nvrtc_compile(const kpt_target *t, const char *source,
                                const kpt_kernel_plan *plan, unsigned flags, kpt_rtc_output *out,
                                kpt_diag *diag)
{
    kpt_nvrtc_output o = {0};
    kpt_status st = kpt_nvrtc_compile(source, plan->cfg.sm, kpt_nvrtc_flags(plan, flags), &o, diag);
    out->route = "nvrtc";
    out->ms = o.ms;
    if (!st) {
        if (!(flags & KPT_RTC_TEXT_ONLY)) {
            out->binary = o.cubin;
            out->size = o.cubin_size;
            o.cubin = NULL;
        }
        out->text = o.ptx;
        o.ptx = NULL;
        out->log = o.log;
        o.log = NULL;
    }
    kpt_nvrtc_output_free(&o);
    return st;
}

const kpt_rtc kpt_rtc_nvrtc = {"nvrtc", nvrtc_identity, nvrtc_compile};

/* ---- HIP: hipRTC where it lists the arch, else clang ---------------------------------------- */

static void hip_identity(char *out, size_t n)
{
    int v = kpt_hiprtc_version(NULL);
    if (v > 0)
        snprintf(out, n, "hiprtc %d.%d", v / 1000, v % 1000 / 10);
    else
        snprintf(out, n, "clang");
}

static kpt_status hip_compile(const kpt_target *t, const char *source,
                              const kpt_kernel_plan *plan, unsigned flags, kpt_rtc_output *out,
                              kpt_diag *diag)
{
    char arch[16];
    snprintf(arch, sizeof(arch), "gfx%x", (unsigned)plan->cfg.gfx);
    kpt_diag why = {0};
    kpt_hip_output o = {0};
    kpt_status st = kpt_hip_compile(source, arch, &o, &why, diag);
    out->route = o.route;
    out->ms = o.ms;
    snprintf(out->why_not_rtc, sizeof(out->why_not_rtc), "%.255s", why.message);
    if (!st) {
        out->binary = o.code;
        out->size = o.size;
        o.code = NULL;
        out->log = o.log;
        o.log = NULL;
    }
    kpt_hip_output_free(&o);
    return st;
}

const kpt_rtc kpt_rtc_hip = {"hip", hip_identity, hip_compile};

/* ---- glslang + SPIRV-Tools, linked in ------------------------------------------------------- */

static void glslang_identity(char *out, size_t n)
{
    snprintf(out, n, "%s", kpt_spirv_compiler());
}

/* The attention kernel's SPIR-V and, for masks with a block map, the block-map kernel's (for
 * serving kernels: the combine of split results), packed into one binary (kpt_spirv_unpack). */
static kpt_status glslang_compile(const kpt_target *t, const char *source,
                                  const kpt_kernel_plan *plan, unsigned flags,
                                  kpt_rtc_output *out, kpt_diag *diag)
{
    out->route = "glslang";
    const bool second = plan->has_blockmap || plan->cfg.kind == KPT_KERNEL_PAGED;
    return kpt_spirv_build(source, second, &out->binary, &out->size, diag);
}

const kpt_rtc kpt_rtc_glslang = {"glslang", glslang_identity, glslang_compile};

/* ---- the path ------------------------------------------------------------------------------- */

kpt_status kpt_kernel_generate(const kpt_target *t, const kpt_pattern *p,
                               const kpt_kernel_request *rq, kpt_kernel_plan *plan, char **source,
                               kpt_diag *diag)
{
    *source = NULL;
    if ((unsigned)rq->kind >= KPT_KERNEL_NUM_KINDS || !(t->kinds & (1u << rq->kind)))
        return kpt_diag_set(diag, KPT_ERR_UNSUPPORTED, "%s: no %s kernel for this target",
                            t->name, kpt_kernel_kind_name(rq->kind));
    if (rq->kind == KPT_KERNEL_BACKWARD && !p->derived) {
        /* backward kernels are generated from the derived pattern (the score's derivatives) */
        kpt_pattern *dp = kpt_pattern_clone(p);
        if (!dp)
            return kpt_diag_set(diag, KPT_ERR_NO_MEMORY, "out of memory");
        kpt_status st = kpt_diff_score(dp, diag);
        if (!st)
            st = kpt_kernel_generate(t, dp, rq, plan, source, diag);
        kpt_pattern_destroy(&dp);
        return st;
    }
    kpt_kernel_config cfg = t->base;
    cfg.kind = rq->kind;
    cfg.dtype = rq->dtype;
    cfg.dqk = rq->dqk;
    cfg.dv = rq->dv ? rq->dv : rq->dqk;
    cfg.tall = rq->tall && rq->kind == KPT_KERNEL_FORWARD;
    int smem = rq->smem_limit > 0 ? rq->smem_limit : t->smem_default;
    kpt_status st = t->plan(p, &cfg, smem, plan, diag);
    if (st)
        return st;
    if (smem > 0 && plan->smem_bytes > (size_t)smem)
        return kpt_diag_set(diag, KPT_ERR_UNSUPPORTED,
                            "the kernel needs %zu bytes of shared memory; the device allows %d",
                            plan->smem_bytes, smem);
    return t->source(p, plan, t->dialect, source, diag);
}

kpt_status kpt_kernel_compile(const kpt_target *t, const char *source,
                              const kpt_kernel_plan *plan, unsigned flags, kpt_rtc_output *out,
                              kpt_diag *diag)
{
    memset(out, 0, sizeof(*out));
    return t->rtc->compile(t, source, plan, flags, out, diag);
}
