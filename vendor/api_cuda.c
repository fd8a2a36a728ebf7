/* libcuda through dlopen (see cuda_driver.h). */
#include <dlfcn.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/diag.h"
#include "vendor/api_cuda.h"

/* the layouts of cuda.h's CUlaunchAttribute and CUlaunchConfig (64-bit: NVIDIA's drivers are) */
#if UINTPTR_MAX > 0xffffffffu
_Static_assert(sizeof(kpt_cu_launch_attr) == 72 && offsetof(kpt_cu_launch_attr, value) == 8,
               "CUlaunchAttribute");
_Static_assert(sizeof(kpt_cu_launch_config) == 56 &&
               offsetof(kpt_cu_launch_config, stream) == 32 &&
               offsetof(kpt_cu_launch_config, num_attrs) == 48, "CUlaunchConfig");
#endif

static kpt_cu_api api;
static bool api_ok;
static char api_why[256];
static pthread_once_t api_once = PTHREAD_ONCE_INIT;

static bool bind(void *lib)
{
#define SYM(field, name)                                \
    do {                                                \
        *(void **)&api.field = dlsym(lib, name);        \
        if (!api.field) {                               \
            snprintf(api_why, sizeof(api_why), "libcuda lacks %s", name); \
            return false;                               \
        }                                               \
    } while (0)
    SYM(Init, "cuInit");
    SYM(DriverGetVersion, "cuDriverGetVersion");
    SYM(GetErrorString, "cuGetErrorString");
    SYM(DeviceGetCount, "cuDeviceGetCount");
    SYM(DeviceGet, "cuDeviceGet");
    SYM(DeviceGetAttribute, "cuDeviceGetAttribute");
    SYM(DeviceGetName, "cuDeviceGetName");
    SYM(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
    SYM(DevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2");
    SYM(CtxSetCurrent, "cuCtxSetCurrent");
    SYM(CtxGetCurrent, "cuCtxGetCurrent");
    SYM(CtxSynchronize, "cuCtxSynchronize");
    SYM(ModuleLoadData, "cuModuleLoadData");
    SYM(ModuleUnload, "cuModuleUnload");
    SYM(ModuleGetFunction, "cuModuleGetFunction");
    SYM(FuncSetAttribute, "cuFuncSetAttribute");
    SYM(LaunchKernel, "cuLaunchKernel");
    SYM(MemAlloc, "cuMemAlloc_v2");
    SYM(MemFree, "cuMemFree_v2");
    SYM(MemAllocAsync, "cuMemAllocAsync");
    SYM(MemFreeAsync, "cuMemFreeAsync");
    SYM(MemcpyHtoD, "cuMemcpyHtoD_v2");
    SYM(MemcpyDtoH, "cuMemcpyDtoH_v2");
    SYM(MemsetD8, "cuMemsetD8_v2");
    SYM(MemsetD8Async, "cuMemsetD8Async");
    SYM(StreamSynchronize, "cuStreamSynchronize");
    SYM(EventCreate, "cuEventCreate");
    SYM(EventDestroy, "cuEventDestroy_v2");
    SYM(EventRecord, "cuEventRecord");
    SYM(EventSynchronize, "cuEventSynchronize");
    SYM(EventElapsedTime, "cuEventElapsedTime_v2");
#undef SYM
    /* optional: only the sm_90a kernel needs it, and it says so when it is missing */
    *(void **)&api.TensorMapEncodeTiled = dlsym(lib, "cuTensorMapEncodeTiled");
    /* optional: without it the serving combine is launched the plain way */
    *(void **)&api.LaunchKernelEx = dlsym(lib, "cuLaunchKernelEx");
    /* optional: without it the serving plans assume one CTA an SM */
    *(void **)&api.OccupancyMaxActiveBlocksPerMultiprocessor =
        dlsym(lib, "cuOccupancyMaxActiveBlocksPerMultiprocessor");
    return true;
}

static void load_once(void)
{
    const char *path = getenv("KPT_LIBCUDA");
    if (!path || !*path)
        path = "libcuda.so.1";
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        snprintf(api_why, sizeof(api_why), "no NVIDIA driver: %s could not be loaded", path);
        return;
    }
    if (!bind(lib)) {
        dlclose(lib);
        return;
    }
    CUresult r = api.Init(0);
    if (r != 0) {
        const char *msg = NULL;
        api.GetErrorString(r, &msg);
        snprintf(api_why, sizeof(api_why), "cuInit failed: %s (%d)%s", msg ? msg : "?", r,
                 r == 34 ? " (the CUDA toolkit's stub libcuda, not a driver)" : "");
        return; /* the library stays loaded: unloading a half-initialised driver is not safe */
    }
    api_ok = true;
}

const kpt_cu_api *kpt_cu_load(kpt_diag *diag)
{
    pthread_once(&api_once, load_once);
    if (!api_ok) {
        kpt_diag_set(diag, KPT_ERR_NO_DEVICE, "CUDA unavailable: %s", api_why);
        return NULL;
    }
    return &api;
}

kpt_status kpt_cu_fail(kpt_diag *diag, const char *what, CUresult r)
{
    const char *msg = NULL;
    if (api.GetErrorString)
        api.GetErrorString(r, &msg);
    return kpt_diag_set(diag, r == 2 ? KPT_ERR_NO_MEMORY : KPT_ERR_DEVICE, "%s failed: %s (%d)",
                        what, msg ? msg : "unknown CUDA error", r);
}
