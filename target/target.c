/* The target table (see target.h). */
#include <stdio.h>
#include <string.h>

#include "codegen/cuda_source.h"
#include "codegen/glsl_source.h"
#include "codegen/hip_source.h"
#include "target/target.h"

extern const kpt_rtc kpt_rtc_nvrtc, kpt_rtc_hip, kpt_rtc_glslang; /* generate.c */

#define DT(t) (1u << KPT_DTYPE_##t)
#define KIND(k) (1u << KPT_KERNEL_##k)
#define CUDA_DIMS "32, 64, 96, 128 and 256"
#define CUDA(nm, sm_, wg) \
    {nm, KPT_BACKEND_CUDA, &kpt_dialect_cuda, {.sm = sm_, .wgmma = wg}, kpt_plan_tiles_cuda, \
     kpt_cuda_source, &kpt_rtc_nvrtc, KIND(FORWARD) | KIND(BACKWARD) | KIND(PAGED), DT(F16) | DT(BF16), \
     KPT_DTYPE_BF16, 0, CUDA_DIMS, "CUBIN"}
#define HIP(nm, gfx_) \
    {nm, KPT_BACKEND_HIP, &kpt_dialect_hip, {.gfx = gfx_}, kpt_plan_tiles_hip, kpt_hip_source, \
     &kpt_rtc_hip, KIND(FORWARD), DT(F16) | DT(BF16), KPT_DTYPE_BF16, 0, CUDA_DIMS, "code object"}
#define SPIRV(nm, coop, smem) \
    {nm, KPT_BACKEND_VULKAN, &kpt_dialect_glsl, {.coopmat = coop}, kpt_plan_tiles_glsl, \
     kpt_glsl_source, &kpt_rtc_glslang, KIND(FORWARD) | KIND(PAGED), \
     DT(F16) | DT(BF16) | DT(F32), KPT_DTYPE_F16, smem, "1 to 256", "SPIR-V"}

/* spirv:coopmat is spirv on a device with cooperative matrices (NVIDIA's 48 KiB of shared
 * memory without a device): Vulkan contexts call both "spirv", and bundles hold spirv. */
static const kpt_target targets[] = {
    CUDA("cuda:sm_80", 80, false),
    CUDA("cuda:sm_86", 86, false),
    CUDA("cuda:sm_89", 89, false),
    CUDA("cuda:sm_90", 90, false),
    CUDA("cuda:sm_90a", 90, true),
    HIP("hip:gfx90a", 0x90a),
    HIP("hip:gfx940", 0x940),
    HIP("hip:gfx942", 0x942),
    SPIRV("spirv", false, KPT_GLSL_PLAN_SMEM),
    SPIRV("spirv:coopmat", true, 49152),
};

#define NUM_TARGETS ((int)(sizeof(targets) / sizeof(targets[0])))

int kpt_target_count(void)
{
    return NUM_TARGETS;
}

const kpt_target *kpt_target_get(int i)
{
    return i >= 0 && i < NUM_TARGETS ? &targets[i] : NULL;
}

const kpt_target *kpt_target_find(const char *name)
{
    for (int i = 0; name && i < NUM_TARGETS; i++)
        if (!strcmp(targets[i].name, name))
            return &targets[i];
    return NULL;
}

const kpt_target *kpt_target_for(kpt_backend_kind backend, const kpt_kernel_config *cfg)
{
    for (int i = 0; i < NUM_TARGETS; i++) {
        const kpt_kernel_config *b = &targets[i].base;
        if (targets[i].backend == backend && b->sm == cfg->sm && b->wgmma == cfg->wgmma &&
            b->gfx == cfg->gfx && b->coopmat == cfg->coopmat)
            return &targets[i];
    }
    return NULL;
}

const char *kpt_target_list(kpt_backend_kind backend, char *buf, size_t size)
{
    int n = 0, total = 0;
    for (int i = 0; i < NUM_TARGETS; i++)
        total += backend == KPT_BACKEND_AUTO || targets[i].backend == backend;
    buf[0] = 0;
    for (int i = 0; i < NUM_TARGETS; i++) {
        if (backend != KPT_BACKEND_AUTO && targets[i].backend != backend)
            continue;
        size_t len = strlen(buf);
        snprintf(buf + len, size - len, "%s%s", n == 0 ? "" : n == total - 1 ? " or " : ", ",
                 targets[i].name);
        n++;
    }
    return buf;
}

unsigned kpt_backend_dtypes(kpt_backend_kind backend)
{
    unsigned dtypes = 0;
    for (int i = 0; i < NUM_TARGETS; i++)
        if (targets[i].backend == backend)
            dtypes |= targets[i].dtypes;
    return dtypes;
}

const char *kpt_dtype_list(unsigned dtypes, char *buf, size_t size)
{
    int total = 0, n = 0;
    for (int t = 0; t < 32; t++)
        total += (dtypes >> t) & 1;
    buf[0] = 0;
    for (int t = 0; t < 32; t++) {
        if (!((dtypes >> t) & 1))
            continue;
        size_t len = strlen(buf);
        snprintf(buf + len, size - len, "%s%s", n == 0 ? "" : n == total - 1 ? " or " : ", ",
                 kpt_dtype_name((kpt_dtype)t));
        n++;
    }
    return buf;
}
