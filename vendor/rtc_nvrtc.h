/* NVRTC, loaded with dlopen: compiles generated CUDA C in memory to PTX and CUBIN. Works on a
 * machine without a GPU (CI compiles every pattern this way). Thread-safe. */
#ifndef KPT_VENDOR_RTC_NVRTC_H
#define KPT_VENDOR_RTC_NVRTC_H

#include <stdbool.h>
#include <stddef.h>

#include <kpt/status.h>

typedef struct kpt_nvrtc_output {
    char *ptx;        /* NUL-terminated */
    size_t ptx_size;
    void *cubin;      /* NULL unless asked for */
    size_t cubin_size;
    char *log;        /* the compiler's log (warnings; ptxas -v figures when asked); may be "" */
    double ms;        /* wall time of the compilation */
} kpt_nvrtc_output;

/* What kpt_nvrtc_compile makes and how. */
enum {
    KPT_NVRTC_ARCH_SPECIFIC = 1 << 0, /* sm_XXa (sm_90a: the wgmma kernel) */
    KPT_NVRTC_CUBIN = 1 << 1,         /* machine code too, not only PTX */
    KPT_NVRTC_PTXAS_VERBOSE = 1 << 2, /* the log holds ptxas's register, spill and smem figures */
    /* The module has several kernels (the block-map ones beside attention): they are optimised
     * and assembled concurrently (--split-compile=0, all cores). Not for one kernel: the threads
     * cost more than they save there. */
    KPT_NVRTC_PARALLEL = 1 << 3,
};

/* Compiles `src` for sm_`sm` (80, 86, 89, 90) as `flags` (KPT_NVRTC_*) say. On a compilation
 * error the status is KPT_ERR_COMPILE and the diag holds the start of the log. */
kpt_status kpt_nvrtc_compile(const char *src, int sm, unsigned flags, kpt_nvrtc_output *out,
                             kpt_diag *diag);
void kpt_nvrtc_output_free(kpt_nvrtc_output *out);

/* NVRTC's version as major * 1000 + minor * 10 (13000 for 13.0), or a negative status when the
 * library cannot be loaded (the diag says where it looked). */
int kpt_nvrtc_version(kpt_diag *diag);

#endif
