/* The HIP runtime (ROCm's libamdhip64), loaded with dlopen so libkpt loads and runs everywhere;
 * only the calls below touch it. Types are declared here (the ABI of hip_runtime_api.h, stable
 * from ROCm 5 to 6 for these calls), so building needs no ROCm headers. */
#ifndef KPT_VENDOR_API_HIP_H
#define KPT_VENDOR_API_HIP_H

#include <stddef.h>

#include <kpt/status.h>

typedef int hipError_t;
typedef struct ihipModule_t *hipModule_t;
typedef struct ihipModuleSymbol_t *hipFunction_t;
typedef struct ihipStream_t *hipStream_t;

enum {
    KPT_HIP_ERR_OUT_OF_MEMORY = 2,     /* hipErrorOutOfMemory */
    KPT_HIP_ERR_NO_DEVICE = 100,       /* hipErrorNoDevice */
};

typedef struct kpt_hip_api {
    hipError_t (*Init)(unsigned);
    hipError_t (*RuntimeGetVersion)(int *);
    const char *(*GetErrorName)(hipError_t);
    const char *(*GetErrorString)(hipError_t);
    hipError_t (*GetDeviceCount)(int *);
    hipError_t (*SetDevice)(int);
    hipError_t (*DeviceGet)(int *, int);
    hipError_t (*DeviceGetName)(char *, int, int);
    /* hipGetDeviceProperties; its struct's layout changed in ROCm 6, so kpt reads only the
     * architecture name out of it (kpt_hip_device_arch) */
    hipError_t (*GetDeviceProperties)(void *, int);
    hipError_t (*ModuleLoadData)(hipModule_t *, const void *);
    hipError_t (*ModuleUnload)(hipModule_t);
    hipError_t (*ModuleGetFunction)(hipFunction_t *, hipModule_t, const char *);
    hipError_t (*ModuleLaunchKernel)(hipFunction_t, unsigned, unsigned, unsigned, unsigned,
                                     unsigned, unsigned, unsigned, hipStream_t, void **, void **);
    hipError_t (*Malloc)(void **, size_t);
    hipError_t (*Free)(void *);
    hipError_t (*MemcpyHtoD)(void *, void *, size_t);
    hipError_t (*MemcpyDtoH)(void *, void *, size_t);
    hipError_t (*DeviceSynchronize)(void);
    hipError_t (*StreamSynchronize)(hipStream_t);
} kpt_hip_api;

/* dlopen(name) on the loader's path, then under $ROCM_PATH/lib and /opt/rocm/lib (names with a
 * '/' are opened as given). NULL when none opens. */
void *kpt_rocm_dlopen(const char *name);

/* Loads libamdhip64 ($KPT_LIBHIP, else libamdhip64.so.6, .so.5, .so) and runs hipInit once;
 * thread-safe. NULL with KPT_ERR_NO_DEVICE and the reason (no ROCm, no AMD GPU) on failure. */
const kpt_hip_api *kpt_hip_load(kpt_diag *diag);

/* The architecture of device `ordinal` as the compiler names it ("gfx90a"; features such as
 * ":sramecc+:xnack-" dropped) into arch[n]. $KPT_HIP_ARCH overrides it. */
kpt_status kpt_hip_device_arch(const kpt_hip_api *hip, int ordinal, char *arch, size_t n,
                               kpt_diag *diag);

/* Turns a failed call into a diag: "what failed: hipErrorX (code): message". */
kpt_status kpt_hip_fail(kpt_diag *diag, const char *what, hipError_t r);

#define KPT_HIP_TRY(diag, call)                             \
    do {                                                    \
        hipError_t kpt_hip_r_ = (call);                     \
        if (kpt_hip_r_ != 0)                                \
            return kpt_hip_fail((diag), #call, kpt_hip_r_); \
    } while (0)

#endif
