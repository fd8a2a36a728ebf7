/* The CUDA driver API, loaded with dlopen("libcuda.so.1"), so libkpt loads and runs (CPU paths,
 * code generation, NVRTC) on machines without an NVIDIA driver; only the calls below touch it.
 * Types are declared here (the ABI of cuda.h) so building needs no CUDA toolkit. */
#ifndef KPT_VENDOR_API_CUDA_H
#define KPT_VENDOR_API_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include <kpt/status.h>

typedef int CUresult;
typedef int CUdevice;
typedef uint64_t CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;

enum {
    KPT_CU_ATTR_SM_COUNT = 16,          /* CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT */
    KPT_CU_ATTR_CC_MAJOR = 75,          /* CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR */
    KPT_CU_ATTR_CC_MINOR = 76,
    KPT_CU_ATTR_SMEM_PER_SM = 81,       /* CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR */
    KPT_CU_ATTR_SMEM_OPTIN = 97,        /* CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN */
    KPT_CU_FUNC_MAX_DYNAMIC_SMEM = 8,   /* CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES */
    KPT_CU_LAUNCH_PROGRAMMATIC = 6,     /* CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION */
    KPT_CU_LAUNCH_CLUSTER_DIM = 4,      /* CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION */
    KPT_CU_FUNC_NON_PORTABLE_CLUSTER = 14, /* CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED */
};

/* CUlaunchAttribute and CUlaunchConfig (cuLaunchKernelEx): the value is a 64-byte union whose
 * members include a pointer, hence the alignment. */
typedef struct kpt_cu_launch_attr {
    int id;
    char pad[4];
    union {
        char bytes[64];
        int i;
        unsigned dim[3]; /* clusterDim */
        void *align;
    } value;
} kpt_cu_launch_attr;

typedef struct kpt_cu_launch_config {
    unsigned grid[3], block[3];
    unsigned shared_bytes;
    CUstream stream;
    kpt_cu_launch_attr *attrs;
    unsigned num_attrs;
} kpt_cu_launch_config;

typedef struct kpt_cu_api {
    CUresult (*Init)(unsigned);
    CUresult (*DriverGetVersion)(int *);
    CUresult (*GetErrorString)(CUresult, const char **);
    CUresult (*DeviceGetCount)(int *);
    CUresult (*DeviceGet)(CUdevice *, int);
    CUresult (*DeviceGetAttribute)(int *, int, CUdevice);
    CUresult (*DeviceGetName)(char *, int, CUdevice);
    CUresult (*DevicePrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*DevicePrimaryCtxRelease)(CUdevice);
    CUresult (*CtxSetCurrent)(CUcontext);
    CUresult (*CtxGetCurrent)(CUcontext *);
    CUresult (*CtxSynchronize)(void);
    CUresult (*ModuleLoadData)(CUmodule *, const void *);
    CUresult (*ModuleUnload)(CUmodule);
    CUresult (*ModuleGetFunction)(CUfunction *, CUmodule, const char *);
    CUresult (*FuncSetAttribute)(CUfunction, int, int);
    CUresult (*LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, CUstream, void **, void **);
    CUresult (*MemAlloc)(CUdeviceptr *, size_t);
    CUresult (*MemFree)(CUdeviceptr);
    CUresult (*MemAllocAsync)(CUdeviceptr *, size_t, CUstream);
    CUresult (*MemFreeAsync)(CUdeviceptr, CUstream);
    CUresult (*MemcpyHtoD)(CUdeviceptr, const void *, size_t);
    CUresult (*MemcpyDtoH)(void *, CUdeviceptr, size_t);
    CUresult (*MemsetD8)(CUdeviceptr, unsigned char, size_t);
    CUresult (*MemsetD8Async)(CUdeviceptr, unsigned char, size_t, CUstream);
    CUresult (*StreamSynchronize)(CUstream);
    CUresult (*EventCreate)(CUevent *, unsigned);
    CUresult (*EventDestroy)(CUevent);
    CUresult (*EventRecord)(CUevent, CUstream);
    CUresult (*EventSynchronize)(CUevent);
    CUresult (*EventElapsedTime)(float *, CUevent, CUevent);
    /* cuTensorMapEncodeTiled (CUDA 12+ drivers; NULL on older ones): the sm_90a kernel's TMA
     * maps. The enum arguments are ints here; kpt_tensor_map is CUtensorMap's size and
     * alignment. */
    CUresult (*TensorMapEncodeTiled)(void *, int, unsigned, void *, const uint64_t *,
                                     const uint64_t *, const unsigned *, const unsigned *, int,
                                     int, int, int);
    /* cuLaunchKernelEx (CUDA 12+ drivers; NULL on older ones): launches with attributes, here
     * programmatic dependent launch on sm_90 */
    CUresult (*LaunchKernelEx)(const kpt_cu_launch_config *, CUfunction, void **, void **);
    /* cuOccupancyMaxActiveBlocksPerMultiprocessor (NULL where missing): how many CTAs of a
     * kernel an SM holds at once, for the serving plans */
    CUresult (*OccupancyMaxActiveBlocksPerMultiprocessor)(int *, CUfunction, int, size_t);
} kpt_cu_api;

/* Loads libcuda.so.1 ($KPT_LIBCUDA overrides) and runs cuInit once; thread-safe. Returns NULL
 * with KPT_ERR_NO_DEVICE and a reason (no driver, no device, the toolkit's stub) on failure. */
const kpt_cu_api *kpt_cu_load(kpt_diag *diag);

/* Turns a failed call into a diag: "what: CUDA_ERROR_... (code): the driver's message". */
kpt_status kpt_cu_fail(kpt_diag *diag, const char *what, CUresult r);

#define KPT_CU_TRY(diag, call)                            \
    do {                                                  \
        CUresult kpt_cu_r_ = (call);                      \
        if (kpt_cu_r_ != 0)                               \
            return kpt_cu_fail((diag), #call, kpt_cu_r_); \
    } while (0)

#endif
