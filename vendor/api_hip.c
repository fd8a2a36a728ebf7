/* libamdhip64 through dlopen (see hip_driver.h). */
#include <ctype.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/diag.h"
#include "vendor/api_hip.h"

static kpt_hip_api api;
static bool api_ok;
static char api_why[512];
static pthread_once_t api_once = PTHREAD_ONCE_INIT;

void *kpt_rocm_dlopen(const char *name)
{
    void *lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    const char *roots[] = {getenv("ROCM_PATH"), "/opt/rocm"};
    for (int r = 0; !lib && r < 2; r++) {
        if (!roots[r] || !*roots[r] || strchr(name, '/'))
            continue;
        char path[1024];
        snprintf(path, sizeof(path), "%s/lib/%s", roots[r], name);
        lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    }
    return lib;
}

static bool bind(void *lib, const char *where)
{
#define SYM(field, name)                                                          \
    do {                                                                          \
        *(void **)&api.field = dlsym(lib, name);                                  \
        if (!api.field) {                                                         \
            snprintf(api_why, sizeof(api_why), "%s lacks %s", where, name);       \
            return false;                                                         \
        }                                                                         \
    } while (0)
    SYM(Init, "hipInit");
    SYM(RuntimeGetVersion, "hipRuntimeGetVersion");
    SYM(GetErrorName, "hipGetErrorName");
    SYM(GetErrorString, "hipGetErrorString");
    SYM(GetDeviceCount, "hipGetDeviceCount");
    SYM(SetDevice, "hipSetDevice");
    SYM(DeviceGet, "hipDeviceGet");
    SYM(DeviceGetName, "hipDeviceGetName");
    SYM(ModuleLoadData, "hipModuleLoadData");
    SYM(ModuleUnload, "hipModuleUnload");
    SYM(ModuleGetFunction, "hipModuleGetFunction");
    SYM(ModuleLaunchKernel, "hipModuleLaunchKernel");
    SYM(Malloc, "hipMalloc");
    SYM(Free, "hipFree");
    SYM(MemcpyHtoD, "hipMemcpyHtoD");
    SYM(MemcpyDtoH, "hipMemcpyDtoH");
    SYM(DeviceSynchronize, "hipDeviceSynchronize");
    SYM(StreamSynchronize, "hipStreamSynchronize");
#undef SYM
    /* ROCm 6 names the current layout's entry point; ROCm 5 has only the plain one */
    *(void **)&api.GetDeviceProperties = dlsym(lib, "hipGetDevicePropertiesR0600");
    if (!api.GetDeviceProperties)
        *(void **)&api.GetDeviceProperties = dlsym(lib, "hipGetDeviceProperties");
    if (!api.GetDeviceProperties) {
        snprintf(api_why, sizeof(api_why), "%s lacks hipGetDeviceProperties", where);
        return false;
    }
    return true;
}

static void load_once(void)
{
    static const char *const names[] = {"libamdhip64.so.6", "libamdhip64.so.5", "libamdhip64.so"};
    const char *env = getenv("KPT_LIBHIP");
    void *lib = NULL;
    const char *where = NULL;
    for (int i = env && *env ? -1 : 0; i < 3 && !lib; i++)
        lib = kpt_rocm_dlopen(where = i < 0 ? env : names[i]);
    if (!lib) {
        snprintf(api_why, sizeof(api_why),
                 "no ROCm: looked for %s%slibamdhip64.so.6, .so.5 and .so on the loader path, "
                 "$ROCM_PATH/lib and /opt/rocm/lib", env && *env ? env : "",
                 env && *env ? ", " : "");
        return;
    }
    if (!bind(lib, where)) {
        dlclose(lib);
        return;
    }
    hipError_t r = api.Init(0);
    if (r != 0) {
        /* ROCm without an AMD GPU (or without access to /dev/kfd) fails here:
         * hipErrorInvalidDevice (101) or hipErrorNoDevice (100) */
        snprintf(api_why, sizeof(api_why), "hipInit failed: %s (%d): no usable AMD GPU",
                 api.GetErrorName(r), r);
        return; /* the library stays loaded: unloading a half-initialised runtime is not safe */
    }
    api_ok = true;
}

const kpt_hip_api *kpt_hip_load(kpt_diag *diag)
{
    pthread_once(&api_once, load_once);
    if (!api_ok) {
        kpt_diag_set(diag, KPT_ERR_NO_DEVICE, "HIP unavailable: %s", api_why);
        return NULL;
    }
    return &api;
}

/* Whether s is an arch name: "gfx" and hex digits, ending at NUL or ':'. */
static size_t arch_len(const char *s, size_t room)
{
    if (room < 5 || strncmp(s, "gfx", 3))
        return 0;
    size_t n = 3;
    while (n < room && isxdigit((unsigned char)s[n]))
        n++;
    return n > 3 && n < room && (s[n] == 0 || s[n] == ':') ? n : 0;
}

kpt_status kpt_hip_device_arch(const kpt_hip_api *hip, int ordinal, char *arch, size_t n,
                               kpt_diag *diag)
{
    const char *env = getenv("KPT_HIP_ARCH");
    if (env && *env) {
        snprintf(arch, n, "%s", env);
        return KPT_OK;
    }
    /* hipDeviceProp_t is about 1.5 KiB in ROCm 5 and 6 but laid out differently; a generous
     * zeroed buffer is filled whatever the version, and the one field holding "gfx..." (the
     * architecture name; the device's name is a marketing name) is found by its content. */
    enum { PROPS = 16384 };
    unsigned char *props = calloc(1, PROPS);
    if (!props)
        return kpt_diag_set(diag, KPT_ERR_NO_MEMORY, "out of memory");
    hipError_t r = hip->GetDeviceProperties(props, ordinal);
    size_t len = 0, at = 0;
    for (size_t i = 0; !r && i < PROPS && !len; i++) {
        if (props[i] == 'g' && (i == 0 || props[i - 1] == 0)) {
            len = arch_len((const char *)props + i, PROPS - i);
            at = i;
        }
    }
    if (len && len < n) {
        memcpy(arch, props + at, len);
        arch[len] = 0;
    }
    free(props);
    if (r)
        return kpt_hip_fail(diag, "hipGetDeviceProperties", r);
    if (!len || len >= n)
        return kpt_diag_set(diag, KPT_ERR_DEVICE,
                            "HIP device %d: no architecture name (gfx...) in its properties; "
                            "set KPT_HIP_ARCH", ordinal);
    return KPT_OK;
}

kpt_status kpt_hip_fail(kpt_diag *diag, const char *what, hipError_t r)
{
    const char *name = api.GetErrorName ? api.GetErrorName(r) : NULL;
    const char *msg = api.GetErrorString ? api.GetErrorString(r) : NULL;
    return kpt_diag_set(diag, r == KPT_HIP_ERR_OUT_OF_MEMORY ? KPT_ERR_NO_MEMORY : KPT_ERR_DEVICE,
                        "%s failed: %s (%d): %s", what, name ? name : "hipError", r,
                        msg ? msg : "unknown HIP error");
}
