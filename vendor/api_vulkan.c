/* The Vulkan loader, loaded with dlopen (see vulkan_api.h). */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/diag.h"
#include "vendor/api_vulkan.h"

static pthread_once_t once = PTHREAD_ONCE_INIT;
static void *lib;
static char why[200];

static void open_loader(void)
{
    const char *env = getenv("KPT_VULKAN");
    const char *name = env && *env ? env : "libvulkan.so.1";
    lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *e = dlerror();
        snprintf(why, sizeof(why), "%.180s", e ? e : name);
    }
}

kpt_status kpt_vk_load(kpt_vk_api *api, kpt_diag *diag)
{
    pthread_once(&once, open_loader);
    if (!lib)
        return kpt_diag_set(diag, KPT_ERR_NO_DEVICE,
                            "no Vulkan loader (install libvulkan1, or set KPT_VULKAN): %s", why);
    /* POSIX guarantees a function pointer round-trips through dlsym's void * */
    void *sym = dlsym(lib, "vkGetInstanceProcAddr");
    memcpy(&api->GetInstanceProcAddr, &sym, sizeof(sym));
    if (!api->GetInstanceProcAddr)
        return kpt_diag_set(diag, KPT_ERR_NO_DEVICE,
                            "the Vulkan loader has no vkGetInstanceProcAddr");
    api->CreateInstance =
        (PFN_vkCreateInstance)api->GetInstanceProcAddr(VK_NULL_HANDLE, "vkCreateInstance");
    api->EnumerateInstanceVersion = (PFN_vkEnumerateInstanceVersion)api->GetInstanceProcAddr(
        VK_NULL_HANDLE, "vkEnumerateInstanceVersion");
    if (!api->CreateInstance)
        return kpt_diag_set(diag, KPT_ERR_NO_DEVICE, "the Vulkan loader has no vkCreateInstance");
    return KPT_OK;
}

kpt_status kpt_vk_load_instance(kpt_vk_api *api, VkInstance instance, kpt_diag *diag)
{
#define KPT_VK_LOAD(name)                                                                          \
    if (!(api->name = (PFN_vk##name)api->GetInstanceProcAddr(instance, "vk" #name)))              \
        return kpt_diag_set(diag, KPT_ERR_DEVICE, "the Vulkan instance has no vk" #name);
    KPT_VK_INSTANCE_FNS(KPT_VK_LOAD)
#undef KPT_VK_LOAD
    return KPT_OK;
}

kpt_status kpt_vk_load_device(kpt_vk_api *api, VkDevice device, kpt_diag *diag)
{
#define KPT_VK_LOAD(name)                                                                          \
    if (!(api->name = (PFN_vk##name)api->GetDeviceProcAddr(device, "vk" #name)))                  \
        return kpt_diag_set(diag, KPT_ERR_DEVICE, "the Vulkan device has no vk" #name);
    KPT_VK_DEVICE_FNS(KPT_VK_LOAD)
#undef KPT_VK_LOAD
    return KPT_OK;
}

static const char *result_name(VkResult r)
{
    switch (r) {
    case VK_NOT_READY: return "VK_NOT_READY";
    case VK_TIMEOUT: return "VK_TIMEOUT";
    case VK_ERROR_OUT_OF_HOST_MEMORY: return "VK_ERROR_OUT_OF_HOST_MEMORY";
    case VK_ERROR_OUT_OF_DEVICE_MEMORY: return "VK_ERROR_OUT_OF_DEVICE_MEMORY";
    case VK_ERROR_INITIALIZATION_FAILED: return "VK_ERROR_INITIALIZATION_FAILED";
    case VK_ERROR_DEVICE_LOST: return "VK_ERROR_DEVICE_LOST";
    case VK_ERROR_MEMORY_MAP_FAILED: return "VK_ERROR_MEMORY_MAP_FAILED";
    case VK_ERROR_LAYER_NOT_PRESENT: return "VK_ERROR_LAYER_NOT_PRESENT";
    case VK_ERROR_EXTENSION_NOT_PRESENT: return "VK_ERROR_EXTENSION_NOT_PRESENT";
    case VK_ERROR_FEATURE_NOT_PRESENT: return "VK_ERROR_FEATURE_NOT_PRESENT";
    case VK_ERROR_INCOMPATIBLE_DRIVER: return "VK_ERROR_INCOMPATIBLE_DRIVER";
    case VK_ERROR_TOO_MANY_OBJECTS: return "VK_ERROR_TOO_MANY_OBJECTS";
    case VK_ERROR_FRAGMENTED_POOL: return "VK_ERROR_FRAGMENTED_POOL";
    case VK_ERROR_OUT_OF_POOL_MEMORY: return "VK_ERROR_OUT_OF_POOL_MEMORY";
    case VK_ERROR_INVALID_SHADER_NV: return "VK_ERROR_INVALID_SHADER_NV";
    default: return "VkResult";
    }
}

kpt_status kpt_vk_fail(kpt_diag *diag, const char *what, VkResult r)
{
    kpt_status st = r == VK_ERROR_OUT_OF_HOST_MEMORY || r == VK_ERROR_OUT_OF_DEVICE_MEMORY
                        ? KPT_ERR_NO_MEMORY
                        : KPT_ERR_DEVICE;
    return kpt_diag_set(diag, st, "%s failed: %s (%d)", what, result_name(r), (int)r);
}
