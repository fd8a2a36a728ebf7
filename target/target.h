/* Targets: what kpt generates kernels for, as one table (target.c), and the one path that turns
 * (pattern, shape class, target, kernel kind) into source and binary (generate.c). The backends
 * (runtime/backend_*.c) and kptc go through here; none of them plans, emits or compiles on its
 * own.
 *
 * A target row names its backend, the C dialect of its source, its tile planner, its source
 * generator and its runtime compiler, and its limits. Adding a target is a row here (and, for a
 * new kernel family, a planner and a generator); adding a kernel kind is a value of
 * kpt_kernel_kind that the planners and generators learn. */
#ifndef KPT_TARGET_TARGET_H
#define KPT_TARGET_TARGET_H

#include <stdbool.h>
#include <stddef.h>

#include <kpt/runtime.h>

#include "codegen/emit_c.h"
#include "compiler/plan_tiles.h"

typedef struct kpt_target kpt_target;

/* What a runtime compiler returns: the binary the backend loads (CUBIN, AMD code object, or the
 * packed SPIR-V of runtime/backend_vulkan.c), and for --emit the intermediate text (PTX). */
typedef struct kpt_rtc_output {
    void *binary;      /* malloc'ed; NULL with KPT_RTC_TEXT_ONLY */
    size_t size;
    char *text;        /* NVRTC: the PTX; NULL for the others */
    char *log;         /* the compiler's log; may be NULL */
    double ms;         /* wall time of the compilation */
    const char *route; /* which compiler ran: "nvrtc", "hipRTC", "clang", "glslang" */
    char why_not_rtc[256]; /* HIP: why hipRTC was not used, when clang compiled */
} kpt_rtc_output;

void kpt_rtc_output_free(kpt_rtc_output *out);

enum {
    KPT_RTC_TEXT_ONLY = 1 << 0, /* NVRTC: PTX only, no CUBIN */
    KPT_RTC_VERBOSE = 1 << 1,   /* NVRTC: ptxas's register and spill report in the log */
};

/* The KPT_NVRTC_* flags (vendor/rtc_nvrtc.h) for a plan's source and KPT_RTC_* flags: sm_90a for
 * the Hopper kernel, the block-map kernels compiled beside attention rather than after it, a
 * CUBIN unless only the PTX is wanted. */
unsigned kpt_nvrtc_flags(const kpt_kernel_plan *plan, unsigned flags);

/* A runtime compiler: the vendor library behind a target's binaries. */
typedef struct kpt_rtc {
    const char *name; /* "nvrtc", "hip", "glslang" */
    /* Writes the compiler as cache keys must know it ("nvrtc 13.0", "hiprtc 6.0", "clang",
     * "glslang 11.13 / SPIRV-Tools v2022.4"): a binary is only ever reused under the compiler
     * that made it. "" when none is installed here. */
    void (*identity)(char *out, size_t n);
    kpt_status (*compile)(const kpt_target *t, const char *source, const kpt_kernel_plan *plan,
                          unsigned flags, kpt_rtc_output *out, kpt_diag *diag);
} kpt_rtc;

struct kpt_target {
    const char *name;            /* "cuda:sm_90a": what contexts, kptc and bundles call it */
    kpt_backend_kind backend;
    const kpt_c_dialect *dialect;
    kpt_kernel_config base;      /* sm, wgmma, gfx, coopmat of this target */
    kpt_planner plan;
    kpt_status (*source)(const kpt_pattern *p, const kpt_kernel_plan *plan,
                         const kpt_c_dialect *d, char **out, kpt_diag *diag);
    const kpt_rtc *rtc;
    unsigned kinds;              /* 1 << kpt_kernel_kind for each kind it generates */
    unsigned dtypes;             /* 1 << kpt_dtype for each input dtype it takes */
    kpt_dtype default_dtype;     /* kptc's default */
    int smem_default;            /* the shared memory planned for without a device (0: none) */
    const char *head_dims;       /* for messages and --help: "32, 64, 96, 128, 256" */
    const char *binary_kind;     /* what the binary is, for messages: "CUBIN" */
};

int kpt_target_count(void);
const kpt_target *kpt_target_get(int i);
/* The target named `name`, or NULL. */
const kpt_target *kpt_target_find(const char *name);
/* The target of `backend` with base config matching cfg's sm/wgmma/gfx/coopmat, or NULL. */
const kpt_target *kpt_target_for(kpt_backend_kind backend, const kpt_kernel_config *cfg);
/* Writes "cuda:sm_80, cuda:sm_86, ... or cuda:sm_90a", the targets of `backend`
 * (KPT_BACKEND_AUTO: all), into buf for messages; returns buf. 256 bytes hold every list. */
const char *kpt_target_list(kpt_backend_kind backend, char *buf, size_t size);

/* The input dtypes some target of `backend` takes (1 << kpt_dtype each). */
unsigned kpt_backend_dtypes(kpt_backend_kind backend);
/* Writes "f16, bf16 or f32" for a dtype mask into buf (for messages); returns buf. */
const char *kpt_dtype_list(unsigned dtypes, char *buf, size_t size);

/* A kernel request: the shape class and kind, and the device's shared memory. */
typedef struct kpt_kernel_request {
    kpt_kernel_kind kind;
    kpt_dtype dtype;
    int dqk, dv;
    int smem_limit; /* bytes a workgroup may use on the device; 0: the target's default */
    bool tall;      /* the plan's tall variant (plan.tall_variant), where it offers one */
} kpt_kernel_request;

/* Plans the kernel and writes its source (malloc'ed, the caller frees). Deterministic: the same
 * pattern IR, request and target give the same text, which is what the caches key on. */
kpt_status kpt_kernel_generate(const kpt_target *t, const kpt_pattern *p,
                               const kpt_kernel_request *rq, kpt_kernel_plan *plan, char **source,
                               kpt_diag *diag);
/* Source (from kpt_kernel_generate for `plan`) -> binary with the target's runtime compiler. */
kpt_status kpt_kernel_compile(const kpt_target *t, const char *source,
                              const kpt_kernel_plan *plan, unsigned flags, kpt_rtc_output *out,
                              kpt_diag *diag);

#endif
