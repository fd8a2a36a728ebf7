/* AMD GPU code objects from generated HIP C++: hipRTC in process (loaded with dlopen), or clang
 * as a separate program for archs the local hipRTC lacks. Both work without an AMD GPU.
 *
 * hipRTC lives in libamdhip64.so.5 in ROCm 5.x and in libhiprtc.so.6 / libhiprtc.so in ROCm 6.
 * Its code-object manager (comgr) aborts the whole process when asked for an ISA it does not
 * know (ROCm 5.2: gfx940, gfx942), so kpt compiles only for archs comgr lists
 * (amd_comgr_get_isa_name) and refuses the others with KPT_ERR_UNSUPPORTED. Thread-safe. */
#ifndef KPT_VENDOR_RTC_HIPRTC_H
#define KPT_VENDOR_RTC_HIPRTC_H

#include <stdbool.h>
#include <stddef.h>

#include <kpt/status.h>

typedef struct kpt_hip_output {
    void *code;  /* the code object: an AMDGPU ELF (HSA code object v4/v5) */
    size_t size;
    char *log;   /* the compiler's log; may be "" */
    double ms;   /* wall time of the compilation */
    const char *route; /* "hipRTC" or "clang" (kpt_hip_compile) */
} kpt_hip_output;

/* Compiles `src` for `arch` ("gfx90a", ...) with hipRTC. KPT_ERR_NO_DEVICE when hipRTC cannot be
 * loaded, KPT_ERR_UNSUPPORTED when its comgr does not list the arch, KPT_ERR_COMPILE (log in
 * the diag) when the source is rejected. */
kpt_status kpt_hiprtc_compile(const char *src, const char *arch, kpt_hip_output *out,
                              kpt_diag *diag);

/* Compiles `src` for `arch` by running clang (`clang` is $KPT_HIP_CLANG, else clang++-15, else
 * clang++) with -x hip --cuda-device-only -nogpulib -nogpuinc: no ROCm needed at all. */
kpt_status kpt_hip_clang_compile(const char *src, const char *arch, kpt_hip_output *out,
                                 kpt_diag *diag);

/* hipRTC when its comgr lists `arch`, else clang: out->route says which. `why_not_rtc` (may be
 * NULL) receives the reason hipRTC was passed over; a failure of clang's says it too. */
kpt_status kpt_hip_compile(const char *src, const char *arch, kpt_hip_output *out,
                           kpt_diag *why_not_rtc, kpt_diag *diag);

/* Whether the local hipRTC can compile for `arch` (false, with the reason in the diag, when
 * hipRTC is missing or its comgr does not list the arch). */
bool kpt_hiprtc_has_arch(const char *arch, kpt_diag *diag);

/* hipRTC's version as major * 1000 + minor * 10, or a negative status (the diag says where it
 * looked). */
int kpt_hiprtc_version(kpt_diag *diag);

void kpt_hip_output_free(kpt_hip_output *out);

#endif
