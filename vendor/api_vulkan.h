/* The Vulkan API, loaded with dlopen("libvulkan.so.1") so libkpt loads on machines without a
 * Vulkan loader: the entry points kpt calls, resolved once per instance and device. */
#ifndef KPT_VENDOR_API_VULKAN_H
#define KPT_VENDOR_API_VULKAN_H

#define VK_NO_PROTOTYPES
#include <vulkan/vulkan.h>

#include <kpt/status.h>

/* Instance-level entry points. */
#define KPT_VK_INSTANCE_FNS(X)                                                                     \
    X(DestroyInstance) X(EnumeratePhysicalDevices) X(GetPhysicalDeviceProperties)                  \
    X(GetPhysicalDeviceFeatures2) X(GetPhysicalDeviceQueueFamilyProperties)                        \
    X(GetPhysicalDeviceMemoryProperties) X(CreateDevice) X(GetDeviceProcAddr)                     \
    X(EnumerateDeviceExtensionProperties) X(GetPhysicalDeviceProperties2)

/* Device-level entry points. */
#define KPT_VK_DEVICE_FNS(X)                                                                       \
    X(DestroyDevice) X(GetDeviceQueue) X(CreateBuffer) X(DestroyBuffer)                            \
    X(GetBufferMemoryRequirements) X(AllocateMemory) X(FreeMemory) X(BindBufferMemory)             \
    X(MapMemory) X(UnmapMemory) X(CreateShaderModule) X(DestroyShaderModule)                       \
    X(CreateDescriptorSetLayout) X(DestroyDescriptorSetLayout) X(CreatePipelineLayout)             \
    X(DestroyPipelineLayout) X(CreateComputePipelines) X(DestroyPipeline) X(CreatePipelineCache)   \
    X(DestroyPipelineCache) X(CreateDescriptorPool) X(DestroyDescriptorPool)                       \
    X(AllocateDescriptorSets) X(ResetDescriptorPool) X(UpdateDescriptorSets) X(CreateCommandPool)  \
    X(DestroyCommandPool) X(AllocateCommandBuffers) X(ResetCommandBuffer) X(BeginCommandBuffer)    \
    X(EndCommandBuffer) X(CmdBindPipeline) X(CmdBindDescriptorSets) X(CmdPushConstants)            \
    X(CmdDispatch) X(CmdPipelineBarrier) X(CmdCopyBuffer) X(CmdFillBuffer) X(CmdWriteTimestamp)   \
    X(CmdResetQueryPool) X(CreateQueryPool) X(DestroyQueryPool) X(GetQueryPoolResults)            \
    X(QueueSubmit) X(CreateFence) X(DestroyFence) X(WaitForFences) X(ResetFences)                 \
    X(DeviceWaitIdle)

typedef struct kpt_vk_api {
    PFN_vkGetInstanceProcAddr GetInstanceProcAddr;
    PFN_vkCreateInstance CreateInstance;
    PFN_vkEnumerateInstanceVersion EnumerateInstanceVersion; /* NULL on a Vulkan 1.0 loader */
#define KPT_VK_DECLARE(name) PFN_vk##name name;
    KPT_VK_INSTANCE_FNS(KPT_VK_DECLARE)
    KPT_VK_DEVICE_FNS(KPT_VK_DECLARE)
#undef KPT_VK_DECLARE
} kpt_vk_api;

/* Loads the loader ($KPT_VULKAN, else libvulkan.so.1) and its global entry points into `api`.
 * KPT_ERR_NO_DEVICE when there is no loader. */
kpt_status kpt_vk_load(kpt_vk_api *api, kpt_diag *diag);
/* Resolves the instance- and device-level entry points (device: VK_NULL_HANDLE for the
 * instance's only). KPT_ERR_DEVICE when one is missing. */
kpt_status kpt_vk_load_instance(kpt_vk_api *api, VkInstance instance, kpt_diag *diag);
kpt_status kpt_vk_load_device(kpt_vk_api *api, VkDevice device, kpt_diag *diag);

/* A VkResult as a diag: "vkCreateDevice failed: VK_ERROR_... (-3)". */
kpt_status kpt_vk_fail(kpt_diag *diag, const char *what, VkResult r);

#endif
