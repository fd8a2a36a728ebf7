/* The Vulkan backend behind the backend interface (backend.h): generated GLSL compiled in process
 * to SPIR-V (spirv.c), compute pipelines, storage buffers and push constants, through a Vulkan
 * loader opened with dlopen (vulkan_api.c).
 *
 * Memory: Vulkan has no device pointers without optional features, so kpt hands out addresses of
 * its own: each allocation gets a range of a private 64-bit address space, and a tensor's `data`
 * is an address inside one (kpt_buffer_data plus a byte offset). A launch finds the allocation
 * of each tensor, binds its whole VkBuffer and passes the element offset in the geometry block.
 *
 * Launches are synchronous: each records one command buffer (block map, then attention),
 * submits it on the backend's queue and waits, timing the attention dispatch with timestamps.
 * One lock guards the queue, the command buffer, the descriptor pool, the geometry buffer and the
 * allocation table, so a context may still be shared by threads. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "codegen/glsl_source.h"
#include "base/diag.h"
#include "runtime/attention_args.h"
#include "runtime/backend.h"
#include "runtime/backend_vulkan.h"
#include "runtime/paged_args.h"
#include "vendor/rtc_glslang.h"
#include "vendor/api_vulkan.h"
#include "runtime/vulkan_args.h"

#define KPT_VK_VA_BASE 0x100000000000ull
#define KPT_VK_VA_ALIGN 0x10000ull
#define KPT_VK_WAIT_NS 600000000000ull /* a launch that takes ten minutes is reported, not awaited */
#define KPT_VK_MAX_BINDINGS (KPT_GLSL_BIND_AUX0 + KPT_MAX_AUX)

typedef struct vk_alloc {
    uint64_t va;
    VkDeviceSize size;
    VkBuffer buf;
    VkDeviceMemory mem;
    void *map; /* persistently mapped when the memory is host-visible and coherent */
} vk_alloc;

typedef struct vk_backend {
    kpt_backend base;
    kpt_vk_api vk;
    VkInstance inst;
    VkPhysicalDevice phys;
    VkDevice dev;
    VkQueue queue;
    VkPhysicalDeviceMemoryProperties memprops;
    VkPhysicalDeviceLimits limits;
    bool f16_storage;
    bool coopmat; /* f16 kernels on VK_NV_cooperative_matrix (kpt_kernel_config.coopmat) */
    bool timestamps;
    bool llvmpipe; /* Mesa's CPU driver: its loop limit bounds Skv (loop_budget) */
    int64_t slots;  /* serving workgroups the device runs at once (device_slots) */
    int smem_limit;
    VkPipelineCache pcache;
    pthread_mutex_t lock;
    VkCommandPool cpool;
    VkCommandBuffer cmd;
    VkFence fence;
    VkDescriptorPool dpool;
    VkQueryPool qpool;
    vk_alloc geom;  /* host-visible: the geometry block of the launch being recorded */
    vk_alloc dummy; /* bound where a launch has no LSE or block map */
    vk_alloc *allocs;
    size_t nallocs, cap;
    uint64_t next_va;
    double last_ms;
    char matrix_support[512]; /* kpt_backend_vulkan_matrix_support */
} vk_backend;

typedef struct vk_kernel {
    const kpt_pattern *pattern;
    kpt_kernel_plan plan;
    VkShaderModule mod[2]; /* attention, block map */
    VkDescriptorSetLayout dsl;
    VkPipelineLayout layout;
    VkPipeline pipe[2];
    uint32_t push_size, nbind;
} vk_kernel;

static vk_backend *vb(kpt_backend *b)
{
    return (vk_backend *)b;
}

/* ---- memory ---------------------------------------------------------------------------------- */

static int find_memtype(const vk_backend *v, uint32_t bits, VkMemoryPropertyFlags want)
{
    for (uint32_t i = 0; i < v->memprops.memoryTypeCount; i++)
        if ((bits & (1u << i)) && (v->memprops.memoryTypes[i].propertyFlags & want) == want)
            return (int)i;
    return -1;
}

static void free_buffer(vk_backend *v, vk_alloc *a)
{
    if (a->map)
        v->vk.UnmapMemory(v->dev, a->mem);
    if (a->buf)
        v->vk.DestroyBuffer(v->dev, a->buf, NULL);
    if (a->mem)
        v->vk.FreeMemory(v->dev, a->mem, NULL);
    memset(a, 0, sizeof(*a));
}

/* `bytes` rounded up to whole 32-bit words: the size of every buffer and binding (the shaders
 * address storage buffers in 32-bit words). */
static uint64_t whole_words(uint64_t bytes)
{
    return (bytes + 3) / 4 * 4;
}

/* A storage buffer of `bytes`: device-local unless `host` (then host-visible and coherent). */
static kpt_status alloc_buffer(vk_backend *v, VkDeviceSize bytes, bool host, vk_alloc *a,
                               kpt_diag *diag)
{
    memset(a, 0, sizeof(*a));
    a->size = bytes ? bytes : 4;
    const VkBufferCreateInfo bi = {
        .sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO,
        .size = whole_words(a->size),
        .usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
                 VK_BUFFER_USAGE_TRANSFER_DST_BIT,
        .sharingMode = VK_SHARING_MODE_EXCLUSIVE,
    };
    VkResult r = v->vk.CreateBuffer(v->dev, &bi, NULL, &a->buf);
    if (r)
        return kpt_vk_fail(diag, "vkCreateBuffer", r);
    VkMemoryRequirements req;
    v->vk.GetBufferMemoryRequirements(v->dev, a->buf, &req);
    const VkMemoryPropertyFlags hv =
        VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
    int t = host ? find_memtype(v, req.memoryTypeBits, hv)
                 : find_memtype(v, req.memoryTypeBits, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT);
    if (t < 0)
        t = find_memtype(v, req.memoryTypeBits, 0);
    if (t < 0) {
        free_buffer(v, a);
        return kpt_diag_set(diag, KPT_ERR_DEVICE, "no Vulkan memory type for a storage buffer");
    }
    const VkMemoryAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO,
                                     .allocationSize = req.size,
                                     .memoryTypeIndex = (uint32_t)t};
    if ((r = v->vk.AllocateMemory(v->dev, &ai, NULL, &a->mem)) ||
        (r = v->vk.BindBufferMemory(v->dev, a->buf, a->mem, 0))) {
        free_buffer(v, a);
        return kpt_vk_fail(diag, "vkAllocateMemory", r);
    }
    if ((v->memprops.memoryTypes[t].propertyFlags & hv) == hv &&
        (r = v->vk.MapMemory(v->dev, a->mem, 0, VK_WHOLE_SIZE, 0, &a->map))) {
        free_buffer(v, a);
        return kpt_vk_fail(diag, "vkMapMemory", r);
    }
    if (host && !a->map) {
        free_buffer(v, a);
        return kpt_diag_set(diag, KPT_ERR_DEVICE, "no host-visible Vulkan memory");
    }
    return KPT_OK;
}

/* The allocation holding bytes [addr, addr + n) (lock held), or NULL. */
static vk_alloc *find_alloc(vk_backend *v, uint64_t addr, uint64_t n)
{
    for (size_t i = 0; i < v->nallocs; i++) {
        vk_alloc *a = &v->allocs[i];
        if (addr >= a->va && addr - a->va <= a->size && n <= a->size - (addr - a->va))
            return a;
    }
    return NULL;
}

/* Records with `rec`, submits, waits (lock held). */
typedef void (*recorder)(vk_backend *v, void *user);

static kpt_status submit(vk_backend *v, recorder rec, void *user, kpt_diag *diag)
{
    VkResult r = v->vk.ResetCommandBuffer(v->cmd, 0);
    const VkCommandBufferBeginInfo bi = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
                                         .flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT};
    if (r || (r = v->vk.BeginCommandBuffer(v->cmd, &bi)))
        return kpt_vk_fail(diag, "vkBeginCommandBuffer", r);
    rec(v, user);
    if ((r = v->vk.EndCommandBuffer(v->cmd)))
        return kpt_vk_fail(diag, "vkEndCommandBuffer", r);
    const VkSubmitInfo si = {.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO,
                             .commandBufferCount = 1,
                             .pCommandBuffers = &v->cmd};
    if ((r = v->vk.QueueSubmit(v->queue, 1, &si, v->fence)))
        return kpt_vk_fail(diag, "vkQueueSubmit", r);
    r = v->vk.WaitForFences(v->dev, 1, &v->fence, VK_TRUE, KPT_VK_WAIT_NS);
    if (r == VK_TIMEOUT) /* the fence stays pending: wait for the device before reusing it */
        v->vk.DeviceWaitIdle(v->dev);
    v->vk.ResetFences(v->dev, 1, &v->fence);
    return r ? kpt_vk_fail(diag, "vkWaitForFences", r) : KPT_OK;
}

typedef struct copy_job {
    VkBuffer src, dst;
    VkBufferCopy region;
} copy_job;

static void record_copy(vk_backend *v, void *user)
{
    copy_job *j = user;
    v->vk.CmdCopyBuffer(v->cmd, j->src, j->dst, 1, &j->region);
}

/* Host <-> device copies through a staging buffer, for memory the host cannot map. */
static kpt_status staged_copy(vk_backend *v, vk_alloc *a, uint64_t off, void *host, size_t n,
                              bool to_device, kpt_diag *diag)
{
    vk_alloc st;
    kpt_status s = alloc_buffer(v, n, true, &st, diag);
    if (s)
        return s;
    if (to_device)
        memcpy(st.map, host, n);
    copy_job j = {.src = to_device ? st.buf : a->buf, .dst = to_device ? a->buf : st.buf,
                  .region = {.srcOffset = to_device ? 0 : off, .dstOffset = to_device ? off : 0,
                             .size = n}};
    s = submit(v, record_copy, &j, diag);
    if (!s && !to_device)
        memcpy(host, st.map, n);
    free_buffer(v, &st);
    return s;
}

static kpt_status vk_mem_alloc(kpt_backend *b, size_t bytes, uint64_t *mem, kpt_diag *diag)
{
    vk_backend *v = vb(b);
    if (b->offline)
        return kpt_diag_set(diag, KPT_ERR_UNSUPPORTED, "this context compiles offline: no device");
    pthread_mutex_lock(&v->lock);
    kpt_status st = KPT_OK;
    if (v->nallocs == v->cap) {
        size_t cap = v->cap ? 2 * v->cap : 16;
        vk_alloc *n = realloc(v->allocs, cap * sizeof(*n));
        if (!n)
            st = kpt_diag_set(diag, KPT_ERR_NO_MEMORY, "out of memory");
        else
            v->allocs = n, v->cap = cap;
    }
    vk_alloc a;
    if (!st)
        st = alloc_buffer(v, bytes, false, &a, diag);
    if (!st) {
        a.size = bytes;
        a.va = v->next_va;
        v->next_va += (bytes + 2 * KPT_VK_VA_ALIGN - 1) / KPT_VK_VA_ALIGN * KPT_VK_VA_ALIGN;
        v->allocs[v->nallocs++] = a;
        *mem = a.va;
    }
    pthread_mutex_unlock(&v->lock);
    return st;
}

static void vk_mem_free(kpt_backend *b, uint64_t mem)
{
    vk_backend *v = vb(b);
    if (!mem || b->offline)
        return;
    pthread_mutex_lock(&v->lock);
    for (size_t i = 0; i < v->nallocs; i++)
        if (v->allocs[i].va == mem) {
            free_buffer(v, &v->allocs[i]);
            v->allocs[i] = v->allocs[--v->nallocs];
            break;
        }
    pthread_mutex_unlock(&v->lock);
}

static kpt_status mem_copy(kpt_backend *b, uint64_t mem, void *host, size_t n, bool to_device,
                           kpt_diag *diag)
{
    vk_backend *v = vb(b);
    if (b->offline)
        return kpt_diag_set(diag, KPT_ERR_UNSUPPORTED, "this context compiles offline: no device");
    pthread_mutex_lock(&v->lock);
    vk_alloc *a = find_alloc(v, mem, n);
    kpt_status st = KPT_OK;
    if (!a)
        st = kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                          "address 0x%llx (%zu bytes) is not in memory of this Vulkan context",
                          (unsigned long long)mem, n);
    else if (a->map && to_device)
        memcpy((char *)a->map + (mem - a->va), host, n);
    else if (a->map)
        memcpy(host, (const char *)a->map + (mem - a->va), n);
    else
        st = staged_copy(v, a, mem - a->va, host, n, to_device, diag);
    pthread_mutex_unlock(&v->lock);
    return st;
}

static kpt_status vk_mem_write(kpt_backend *b, uint64_t mem, const void *src, size_t n,
                               kpt_diag *diag)
{
    return mem_copy(b, mem, (void *)src, n, true, diag);
}

static kpt_status vk_mem_read(kpt_backend *b, void *dst, uint64_t mem, size_t n, kpt_diag *diag)
{
    return mem_copy(b, mem, dst, n, false, diag);
}

static kpt_status vk_synchronize(kpt_backend *b, kpt_diag *diag)
{
    return KPT_OK; /* every submission is waited for */
}

/* ---- kernels --------------------------------------------------------------------------------- */

/* The target plans and generates; only this device's own gaps are refused here. */
static kpt_status vk_accepts(kpt_backend *b, const kpt_kernel_desc *d, kpt_diag *diag)
{
    bool bits16 = d->dtype == KPT_DTYPE_F16 || d->dtype == KPT_DTYPE_BF16;
    if (!b->offline && bits16 && !vb(b)->f16_storage)
        return kpt_diag_set(diag, KPT_ERR_UNSUPPORTED,
                            "%s lacks storageBuffer16BitAccess: use f32 on this device",
                            b->device_name);
    return KPT_OK;
}

static void vk_unload(kpt_backend *b, void *kernel)
{
    vk_backend *v = vb(b);
    vk_kernel *k = kernel;
    if (!k)
        return;
    for (int i = 0; i < 2; i++) {
        if (k->pipe[i])
            v->vk.DestroyPipeline(v->dev, k->pipe[i], NULL);
        if (k->mod[i])
            v->vk.DestroyShaderModule(v->dev, k->mod[i], NULL);
    }
    if (k->layout)
        v->vk.DestroyPipelineLayout(v->dev, k->layout, NULL);
    if (k->dsl)
        v->vk.DestroyDescriptorSetLayout(v->dev, k->dsl, NULL);
    free(k);
}

static kpt_status make_pipeline(vk_backend *v, vk_kernel *k, int i, const uint32_t *words,
                                size_t n, kpt_diag *diag)
{
    const VkShaderModuleCreateInfo mi = {.sType = VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO,
                                         .codeSize = n * sizeof(uint32_t),
                                         .pCode = words};
    VkResult r = v->vk.CreateShaderModule(v->dev, &mi, NULL, &k->mod[i]);
    if (r)
        return kpt_vk_fail(diag, "vkCreateShaderModule", r);
    const VkComputePipelineCreateInfo pi = {
        .sType = VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO,
        .stage = {.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO,
                  .stage = VK_SHADER_STAGE_COMPUTE_BIT,
                  .module = k->mod[i],
                  .pName = "main"},
        .layout = k->layout,
    };
    if ((r = v->vk.CreateComputePipelines(v->dev, v->pcache, 1, &pi, NULL, &k->pipe[i])))
        return kpt_vk_fail(diag, "vkCreateComputePipelines", r);
    return KPT_OK;
}

static kpt_status vk_load(kpt_backend *b, const kpt_pattern *p, const kpt_kernel_plan *plan,
                          const void *binary, size_t size, void **kernel, kpt_diag *diag)
{
    vk_backend *v = vb(b);
    if (b->offline)
        return kpt_diag_set(diag, KPT_ERR_UNSUPPORTED,
                            "this context compiles offline for %s: it cannot load kernels",
                            b->target);
    const uint32_t *w[2];
    size_t n[2];
    if (!kpt_spirv_unpack(binary, size, &w[0], &n[0], &w[1], &n[1]) ||
        ((plan->has_blockmap || plan->cfg.kind == KPT_KERNEL_PAGED) && !w[1]))
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT, "not a kpt Vulkan kernel binary");
    vk_kernel *k = calloc(1, sizeof(*k));
    if (!k)
        return kpt_diag_set(diag, KPT_ERR_NO_MEMORY, "out of memory");
    k->pattern = p;
    k->plan = *plan;
    k->nbind = KPT_GLSL_BIND_AUX0 + (uint32_t)p->num_aux;
    k->push_size = KPT_VK_PUSH_FIXED + 4 * (uint32_t)(p->num_scalars > 0 ? p->num_scalars : 1);
    kpt_status st = KPT_OK;
    if (k->push_size > v->limits.maxPushConstantsSize)
        st = kpt_diag_set(diag, KPT_ERR_LIMIT,
                          "pattern '%s' needs %u bytes of push constants; %s allows %u", p->name,
                          k->push_size, b->device_name, v->limits.maxPushConstantsSize);
    /* the spec's floor is 4; phones give 24 or so, desktop GPUs thousands */
    const uint32_t most = v->limits.maxPerStageDescriptorStorageBuffers <
                                  v->limits.maxDescriptorSetStorageBuffers
                              ? v->limits.maxPerStageDescriptorStorageBuffers
                              : v->limits.maxDescriptorSetStorageBuffers;
    if (!st && k->nbind > most)
        st = kpt_diag_set(diag, KPT_ERR_LIMIT,
                          "pattern '%s' binds %u storage buffers (%d, and one per aux tensor); "
                          "%s allows %u", p->name, k->nbind, KPT_GLSL_BIND_AUX0, b->device_name,
                          most);
    VkDescriptorSetLayoutBinding binds[KPT_VK_MAX_BINDINGS];
    for (uint32_t i = 0; i < k->nbind; i++)
        binds[i] = (VkDescriptorSetLayoutBinding){.binding = i,
                                                  .descriptorType =
                                                      VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                                  .descriptorCount = 1,
                                                  .stageFlags = VK_SHADER_STAGE_COMPUTE_BIT};
    const VkDescriptorSetLayoutCreateInfo di = {
        .sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO,
        .bindingCount = k->nbind,
        .pBindings = binds};
    VkResult r;
    if (!st && (r = v->vk.CreateDescriptorSetLayout(v->dev, &di, NULL, &k->dsl)))
        st = kpt_vk_fail(diag, "vkCreateDescriptorSetLayout", r);
    const VkPushConstantRange pr = {.stageFlags = VK_SHADER_STAGE_COMPUTE_BIT,
                                    .size = k->push_size};
    const VkPipelineLayoutCreateInfo li = {.sType = VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO,
                                           .setLayoutCount = 1,
                                           .pSetLayouts = &k->dsl,
                                           .pushConstantRangeCount = 1,
                                           .pPushConstantRanges = &pr};
    if (!st && (r = v->vk.CreatePipelineLayout(v->dev, &li, NULL, &k->layout)))
        st = kpt_vk_fail(diag, "vkCreatePipelineLayout", r);
    for (int i = 0; i < 2 && !st; i++)
        if (w[i])
            st = make_pipeline(v, k, i, w[i], n[i], diag);
    if (st) {
        vk_unload(b, k);
        return st;
    }
    *kernel = k;
    return KPT_OK;
}

/* ---- launches -------------------------------------------------------------------------------- */

/* Everything one launch binds: the buffers of each binding and the two argument blocks. */
typedef struct vk_launch {
    const vk_kernel *k;
    VkBuffer bufs[KPT_VK_MAX_BINDINGS];
    /* each binding's window of its buffer: a tensor's bytes from an aligned start (range 0: the
     * whole buffer, for the backend's own, which fit maxStorageBufferRange) */
    VkDeviceSize win_off[KPT_VK_MAX_BINDINGS], win_range[KPT_VK_MAX_BINDINGS];
    kpt_vk_push push;
    kpt_vk_geom geom;
    uint32_t groups[3], bm_groups[3]; /* bm_groups: the block map's grid, or the combine's */
    bool attention, blockmap, combine; /* what to dispatch */
    VkDescriptorSet set;
} vk_launch;

/* Whether `bytes`, rounded up to whole words (whole_words), fit one storage-buffer binding of
 * the device (maxStorageBufferRange); a KPT_ERR_LIMIT naming `kind` `name` if not. */
static kpt_status fits_binding(const vk_backend *v, const char *kind, const char *name,
                               uint64_t bytes, kpt_diag *diag)
{
    if (whole_words(bytes) <= v->limits.maxStorageBufferRange)
        return KPT_OK;
    return kpt_diag_set(diag, KPT_ERR_LIMIT,
                        "%s%s spans %llu bytes, past this Vulkan device's storage-buffer range "
                        "(maxStorageBufferRange, %u bytes)", kind, name,
                        (unsigned long long)bytes, v->limits.maxStorageBufferRange);
}

/* Binds a tensor whose elements up to `span` (the largest offset its shape and strides reach)
 * lie in one allocation: binding `binding` gets the window of that buffer from the tensor's
 * first byte, rounded down to the device's descriptor alignment, to its last, and *off the
 * tensor's element offset within it. Any buffer size works; the window must fit the device's
 * maxStorageBufferRange (a descriptor's range), which also keeps the kernels' 32-bit element
 * offsets in range. */
static kpt_status resolve(vk_backend *v, const char *name, const void *data, int64_t esize,
                          int64_t span, vk_launch *L, int binding, uint32_t *off,
                          kpt_diag *diag)
{
    uint64_t addr = (uint64_t)(uintptr_t)data;
    vk_alloc *a = find_alloc(v, addr, (uint64_t)(span + 1) * (uint64_t)esize);
    if (!a)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                            "tensor %s: its data is not (wholly) inside one buffer of this Vulkan "
                            "context (use kpt_buffer_data plus an offset)", name);
    uint64_t byte = addr - a->va;
    if (byte % (uint64_t)esize)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                            "tensor %s: offset %llu in its buffer is not a multiple of its element "
                            "size", name, (unsigned long long)byte);
    /* the start a multiple of 4 too, so that the range rounded up to whole words (as the
     * buffers' sizes are) stays inside the buffer */
    const uint64_t align = v->limits.minStorageBufferOffsetAlignment > 4
                               ? v->limits.minStorageBufferOffsetAlignment
                               : 4;
    const uint64_t start = byte - byte % align;
    const uint64_t range = byte + (uint64_t)(span + 1) * (uint64_t)esize - start;
    kpt_status st = fits_binding(v, "tensor ", name, range, diag);
    if (st)
        return st;
    L->bufs[binding] = a->buf;
    L->win_off[binding] = start;
    L->win_range[binding] = whole_words(range);
    *off = (uint32_t)((byte - start) / (uint64_t)esize);
    return KPT_OK;
}

/* The largest element offset the tensor reaches; -1 when a stride is negative. */
static int64_t span_of(const kpt_tensor *t)
{
    int64_t s = 0;
    for (int i = 0; i < t->rank; i++) {
        if (t->stride[i] < 0 || t->stride[i] > UINT32_MAX)
            return -1;
        s += (t->shape[i] - 1) * t->stride[i];
    }
    return s;
}

static kpt_status check_io(const kpt_tensor *t, const char *name, kpt_dtype dt, int d,
                           kpt_diag *diag)
{
    if (t->dtype != dt)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                            "tensor %s is %s; this kernel was made for %s", name,
                            kpt_dtype_name(t->dtype), kpt_dtype_name(dt));
    if (t->shape[t->rank - 1] != d)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                            "tensor %s has head dim %lld; this kernel was made for %d", name,
                            (long long)t->shape[t->rank - 1], d);
    if (span_of(t) < 0)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                            "tensor %s: the Vulkan backend needs strides from 0 to 2^32", name);
    return KPT_OK;
}

static uint32_t float_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
}

/* Q, K, V and O against the kernel's dtype and head dims. */
static kpt_status check_ios(const kpt_kernel_plan *pl, const kpt_tensor *const io[4],
                            kpt_diag *diag)
{
    static const char *const names[4] = {"q", "k", "v", "o"};
    for (int i = 0; i < 4; i++) {
        kpt_status st =
            check_io(io[i], names[i], pl->cfg.dtype, i < 2 ? pl->cfg.dqk : pl->cfg.dv, diag);
        if (st)
            return st;
    }
    return KPT_OK;
}

/* Q, K, V and O (their dtype and head dims checked) and the LSE into their bindings, offsets
 * and strides (as many as each has). */
static kpt_status pack_io(vk_backend *v, const kpt_tensor *const io[4], int64_t es,
                          const kpt_tensor *lse, vk_launch *L, kpt_diag *diag)
{
    uint32_t *offs[4] = {&L->geom.qo, &L->geom.ko, &L->geom.vo, &L->geom.oo};
    uint32_t *strides[4] = {L->geom.qs, L->geom.ks, L->geom.vs, L->geom.os};
    static const char *const names[4] = {"q", "k", "v", "o"};
    kpt_status st;
    for (int i = 0; i < 4; i++) {
        if ((st = resolve(v, names[i], io[i]->data, es, span_of(io[i]), L, i, offs[i], diag)))
            return st;
        for (int d = 0; d < io[i]->rank; d++)
            strides[i][d] = (uint32_t)io[i]->stride[d];
    }
    L->geom.lo = KPT_VK_NO_LSE;
    if (!lse->data)
        return KPT_OK;
    if (lse->dtype != KPT_DTYPE_F32 || span_of(lse) < 0)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                            "tensor lse must be f32 with strides from 0 to 2^32 on Vulkan");
    if ((st = resolve(v, "lse", lse->data, 4, span_of(lse), L, KPT_GLSL_BIND_LSE, &L->geom.lo,
                      diag)))
        return st;
    for (int d = 0; d < lse->rank; d++)
        L->geom.ls[d] = (uint32_t)lse->stride[d];
    return KPT_OK;
}

static kpt_status pack_tensors(vk_backend *v, const vk_kernel *k, const kpt_attention_args *a,
                               vk_launch *L, kpt_diag *diag)
{
    const kpt_tensor *io[4] = {&a->q, &a->k, &a->v, &a->o};
    kpt_status st = check_ios(&k->plan, io, diag);
    return st ? st : pack_io(v, io, kpt_dtype_size(k->plan.cfg.dtype), &a->lse, L, diag);
}

static kpt_status pack_aux(vk_backend *v, const vk_kernel *k, const kpt_attn_binding *bind,
                           vk_launch *L, kpt_diag *diag)
{
    const kpt_pattern *p = k->pattern;
    for (int i = 0; i < p->num_aux; i++) {
        const kpt_ir_auxview *av = &bind->aux[i];
        kpt_tensor t = {.data = (void *)av->data, .dtype = av->dtype, .rank = av->rank};
        for (int d = 0; d < av->rank; d++) {
            t.shape[d] = av->shape[d];
            t.stride[d] = av->stride[d];
        }
        int64_t es = kpt_dtype_size(av->dtype), span = span_of(&t);
        if (span < 0 || (span + 1) * es > UINT32_MAX)
            return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                                "aux tensor '%s': the Vulkan backend needs strides from 0 and "
                                "under 4 GiB of data", p->aux[i].name);
        uint32_t eoff;
        kpt_status st = resolve(v, p->aux[i].name, av->data, es, span, L,
                                KPT_GLSL_BIND_AUX0 + i, &eoff, diag);
        if (st)
            return st;
        L->geom.aux[i].off = eoff * (uint32_t)es;
        for (int d = 0; d < KPT_AUX_MAX_RANK; d++) {
            L->geom.aux[i].dim[d] = d < av->rank ? (uint32_t)av->shape[d] : 1;
            L->geom.aux[i].stride[d] = d < av->rank ? (uint32_t)av->stride[d] : 0;
        }
    }
    return KPT_OK;
}

/* Mesa's llvmpipe ends every loop of a shader invocation once all its loops together have run
 * this many iterations (gallivm's LP_MAX_TGSI_LOOP_ITERATIONS, one counter for all loops), and
 * says nothing: the kernel then writes garbage. */
#define KPT_VK_LLVMPIPE_LOOPS 65535

/* On llvmpipe, refuses a launch whose kernel would pass the loop limit: `once` + `per_tile`
 * iterations per kv tile (the scalar kernels' counts, kpt_glsl_loop_iterations and
 * kpt_glsl_paged_loop_iterations: upper bounds; 2 bn + 3 iterations per tile measured on Mesa
 * 22.3 with the head-dim loops unrolled whole) over `keys` keys, named `what` in the message.
 * Block-map kernels loop over one tile pair, whatever the lengths; kpt_check_loops catches the
 * rest. */
static kpt_status loop_budget(const vk_backend *v, const vk_kernel *k, int64_t keys,
                              int64_t once, int64_t per_tile, const char *what, kpt_diag *diag)
{
    if (!v->llvmpipe || k->plan.cfg.coopmat)
        return KPT_OK;
    const int64_t n_kt = (keys + k->plan.bn - 1) / k->plan.bn, need = once + per_tile * n_kt;
    if (need <= KPT_VK_LLVMPIPE_LOOPS)
        return KPT_OK;
    const int64_t max_tiles =
        once < KPT_VK_LLVMPIPE_LOOPS ? (KPT_VK_LLVMPIPE_LOOPS - once) / per_tile : 0;
    return kpt_diag_set(diag, KPT_ERR_LIMIT,
                        "%s = %lld is too long for %s: Mesa's llvmpipe stops a shader's loops "
                        "after %d iterations in all, and this kernel (head dims %d/%d) would need "
                        "%lld; it takes at most %lld keys on this device (docs/vulkan.md)",
                        what, (long long)keys, v->base.device_name, KPT_VK_LLVMPIPE_LOOPS,
                        k->plan.cfg.dqk, k->plan.cfg.dv, (long long)need,
                        (long long)(max_tiles * k->plan.bn));
}

static kpt_status forward_budget(const vk_backend *v, const vk_kernel *k, const kpt_vk_push *P,
                                 kpt_diag *diag)
{
    const int64_t once = kpt_glsl_loop_iterations(&k->plan, 0);
    return loop_budget(v, k, P->Skv, once, kpt_glsl_loop_iterations(&k->plan, 1) - once, "Skv",
                       diag);
}

/* Whether the serving kernel and its combine stay within llvmpipe's loop limit for n_kt tiles
 * split into `splits` parts (always true elsewhere). */
static bool paged_fits(const vk_backend *v, const vk_kernel *k, int64_t n_kt, int splits,
                       int group)
{
    if (!v->llvmpipe)
        return true;
    return kpt_glsl_paged_loop_iterations(&k->plan, n_kt, splits, group) <=
               KPT_VK_LLVMPIPE_LOOPS &&
           (splits == 1 || kpt_glsl_combine_loop_iterations(&k->plan, splits) <=
                               KPT_VK_LLVMPIPE_LOOPS);
}

/* The serving kernel's, for a plan's longest sequence (max_kv keys) in `splits` parts. */
static kpt_status paged_budget(const vk_backend *v, const vk_kernel *k, int max_kv, int group,
                               int splits, kpt_diag *diag)
{
    const int64_t bn = k->plan.bn;
    if (paged_fits(v, k, (max_kv + bn - 1) / bn, splits, group))
        return KPT_OK;
    int64_t lo = 0, hi = (max_kv + bn - 1) / bn; /* the most tiles that fit: in [lo, hi) */
    while (hi - lo > 1) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (paged_fits(v, k, mid, splits, group))
            lo = mid;
        else
            hi = mid;
    }
    return kpt_diag_set(diag, KPT_ERR_LIMIT,
                        "the plan's kv length = %d is too long for %s: Mesa's llvmpipe stops a "
                        "shader's loops after %d iterations in all, and this serving kernel (head "
                        "dims %d/%d, keys in %d part%s) takes at most %lld keys on this device "
                        "(docs/vulkan.md)",
                        max_kv, v->base.device_name, KPT_VK_LLVMPIPE_LOOPS, k->plan.cfg.dqk,
                        k->plan.cfg.dv, splits, splits == 1 ? "" : "s", (long long)(lo * bn));
}

static kpt_status check_groups(const vk_backend *v, const uint32_t g[3], const char *what,
                               kpt_diag *diag)
{
    for (int i = 0; i < 3; i++)
        if (g[i] > v->limits.maxComputeWorkGroupCount[i])
            return kpt_diag_set(diag, KPT_ERR_LIMIT,
                                "the %s needs %u workgroups along %c; the device allows %u", what,
                                g[i], "xyz"[i], v->limits.maxComputeWorkGroupCount[i]);
    return KPT_OK;
}

/* The sinks (f32 [Hq], checked against the shapes by kpt_attn_bind), or the dummy buffer. */
static kpt_status pack_sinks(vk_backend *v, const kpt_tensor *sinks, vk_launch *L,
                             kpt_diag *diag)
{
    L->bufs[KPT_GLSL_BIND_SINKS] = v->dummy.buf;
    L->geom.so = KPT_VK_NO_SINK;
    L->geom.ss = 0;
    if (!sinks->data)
        return KPT_OK;
    if (sinks->dtype != KPT_DTYPE_F32 || span_of(sinks) < 0 || sinks->stride[0] > UINT32_MAX)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                            "tensor sinks must be f32 with a stride from 0 to 2^32 on Vulkan");
    L->geom.ss = (uint32_t)sinks->stride[0];
    return resolve(v, "sinks", sinks->data, 4, span_of(sinks), L, KPT_GLSL_BIND_SINKS,
                   &L->geom.so, diag);
}

/* The push constants every kernel shares: the scale and the runtime scalars. */
static void pack_scalars(const vk_kernel *k, const kpt_attn_binding *bind, kpt_vk_push *P)
{
    P->scale = (float)bind->scale;
    P->scale_log2 = (float)(bind->scale * 1.4426950408889634);
    for (int i = 0; i < k->pattern->num_scalars; i++)
        P->scalars[i] = k->pattern->scalars[i].type == KPT_IR_F32
                            ? float_bits((float)bind->scalars[i].f)
                            : (uint32_t)bind->scalars[i].i;
}

/* Bindings a kernel does not read get the dummy buffer. */
static void bind_dummies(vk_backend *v, vk_launch *L)
{
    for (uint32_t i = 0; i < KPT_VK_MAX_BINDINGS; i++)
        L->bufs[i] = v->dummy.buf;
    L->bufs[KPT_GLSL_BIND_GEOMETRY] = v->geom.buf;
}

/* Validates the call and fills L (lock held: it looks up allocations). */
static kpt_status pack(vk_backend *v, const vk_kernel *k, const kpt_attention_args *a,
                       vk_launch *L, kpt_diag *diag)
{
    if (!a)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT, "attention args are NULL");
    memset(L, 0, sizeof(*L));
    L->k = k;
    bind_dummies(v, L);
    kpt_attn_binding bind;
    kpt_status st = kpt_attn_bind(k->pattern, a, &bind, diag);
    if (!st)
        st = pack_tensors(v, k, a, L, diag);
    if (!st)
        st = pack_aux(v, k, &bind, L, diag);
    if (!st)
        st = pack_sinks(v, &a->sinks, L, diag);
    if (st)
        return st;
    const kpt_attn_shape *s = &bind.shape;
    const kpt_kernel_plan *pl = &k->plan;
    kpt_vk_push *P = &L->push;
    P->B = (int32_t)s->B;
    P->Hq = (int32_t)s->Hq;
    P->Hkv = (int32_t)s->Hkv;
    P->Sq = (int32_t)s->Sq;
    P->Skv = (int32_t)s->Skv;
    P->group = (int32_t)(s->Hq / s->Hkv);
    P->n_qt = (int32_t)((s->Sq + pl->bm - 1) / pl->bm);
    P->n_kt = (int32_t)((s->Skv + pl->bn - 1) / pl->bn);
    pack_scalars(k, &bind, P);
    /* block map layout [b?][h?][q tile][kv tile], one u32 per entry */
    uint64_t per_h = (uint64_t)P->n_qt * (uint64_t)P->n_kt;
    uint64_t per_b = per_h * (pl->bm_per_h ? (uint64_t)s->Hq : 1);
    L->geom.bms[0] = pl->bm_per_b ? (uint32_t)per_b : 0;
    L->geom.bms[1] = pl->bm_per_h ? (uint32_t)per_h : 0;
    L->geom.bms[2] = (uint32_t)P->n_kt;
    if (per_b * (pl->bm_per_b ? (uint64_t)s->B : 1) > UINT32_MAX / 4)
        return kpt_diag_set(diag, KPT_ERR_LIMIT, "the block map would exceed 4 GiB");
    L->groups[0] = (uint32_t)P->n_qt;
    L->groups[1] = (uint32_t)s->Hq;
    L->groups[2] = (uint32_t)s->B;
    L->bm_groups[0] = (uint32_t)((per_h + KPT_GLSL_BLOCKMAP_GROUP - 1) / KPT_GLSL_BLOCKMAP_GROUP);
    L->bm_groups[1] = pl->bm_per_h ? (uint32_t)s->Hq : 1;
    L->bm_groups[2] = pl->bm_per_b ? (uint32_t)s->B : 1;
    if ((st = check_groups(v, L->groups, "attention kernel", diag)) ||
        (st = forward_budget(v, k, P, diag)))
        return st;
    return pl->has_blockmap ? check_groups(v, L->bm_groups, "block-map kernel", diag) : KPT_OK;
}

static size_t map_bytes(const vk_kernel *k, const vk_launch *L)
{
    if (!k->plan.has_blockmap)
        return 0;
    return (size_t)L->push.n_qt * (size_t)L->push.n_kt * (k->plan.bm_per_h ? L->groups[1] : 1) *
           (k->plan.bm_per_b ? L->groups[2] : 1) * 4;
}

static kpt_status bind_set(vk_backend *v, vk_launch *L, kpt_diag *diag)
{
    const vk_kernel *k = L->k;
    VkResult r = v->vk.ResetDescriptorPool(v->dev, v->dpool, 0);
    const VkDescriptorSetAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO,
                                            .descriptorPool = v->dpool,
                                            .descriptorSetCount = 1,
                                            .pSetLayouts = &k->dsl};
    if (r || (r = v->vk.AllocateDescriptorSets(v->dev, &ai, &L->set)))
        return kpt_vk_fail(diag, "vkAllocateDescriptorSets", r);
    VkDescriptorBufferInfo info[KPT_VK_MAX_BINDINGS];
    VkWriteDescriptorSet w[KPT_VK_MAX_BINDINGS];
    for (uint32_t i = 0; i < k->nbind; i++) {
        info[i] = (VkDescriptorBufferInfo){.buffer = L->bufs[i], .offset = L->win_off[i],
                                           .range = L->win_range[i] ? L->win_range[i]
                                                                    : VK_WHOLE_SIZE};
        w[i] = (VkWriteDescriptorSet){.sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET,
                                      .dstSet = L->set,
                                      .dstBinding = i,
                                      .descriptorCount = 1,
                                      .descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                      .pBufferInfo = &info[i]};
    }
    v->vk.UpdateDescriptorSets(v->dev, k->nbind, w, 0, NULL);
    L->geom.n_check = KPT_VK_LOOP_CHECK;
    L->geom.status = 0;
    memcpy(v->geom.map, &L->geom, sizeof(L->geom));
    return KPT_OK;
}

static void shader_barrier(vk_backend *v)
{
    const VkMemoryBarrier mb = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER,
                                .srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT,
                                .dstAccessMask = VK_ACCESS_SHADER_READ_BIT};
    v->vk.CmdPipelineBarrier(v->cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                             VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, 0, 1, &mb, 0, NULL, 0, NULL);
}

/* The block map (when asked for), then attention, then the combine of a split serving run;
 * each reads what the one before wrote. */
static void record_launch(vk_backend *v, void *user)
{
    vk_launch *L = user;
    const vk_kernel *k = L->k;
    VkCommandBuffer c = v->cmd;
    v->vk.CmdBindDescriptorSets(c, VK_PIPELINE_BIND_POINT_COMPUTE, k->layout, 0, 1, &L->set, 0,
                                NULL);
    v->vk.CmdPushConstants(c, k->layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, k->push_size, &L->push);
    if (L->blockmap) {
        v->vk.CmdBindPipeline(c, VK_PIPELINE_BIND_POINT_COMPUTE, k->pipe[1]);
        v->vk.CmdDispatch(c, L->bm_groups[0], L->bm_groups[1], L->bm_groups[2]);
        shader_barrier(v);
    }
    if (!L->attention)
        return;
    if (v->timestamps) {
        v->vk.CmdResetQueryPool(c, v->qpool, 0, 2);
        v->vk.CmdWriteTimestamp(c, VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, v->qpool, 0);
    }
    v->vk.CmdBindPipeline(c, VK_PIPELINE_BIND_POINT_COMPUTE, k->pipe[0]);
    v->vk.CmdDispatch(c, L->groups[0], L->groups[1], L->groups[2]);
    if (L->combine) {
        shader_barrier(v);
        v->vk.CmdBindPipeline(c, VK_PIPELINE_BIND_POINT_COMPUTE, k->pipe[1]);
        v->vk.CmdDispatch(c, L->bm_groups[0], L->bm_groups[1], L->bm_groups[2]);
    }
    if (v->timestamps)
        v->vk.CmdWriteTimestamp(c, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, v->qpool, 1);
}

static void read_timestamps(vk_backend *v)
{
    uint64_t t[2];
    if (v->timestamps &&
        !v->vk.GetQueryPoolResults(v->dev, v->qpool, 0, 2, sizeof(t), t, sizeof(t[0]),
                                   VK_QUERY_RESULT_64_BIT))
        v->last_ms = (double)(t[1] - t[0]) * v->limits.timestampPeriod * 1e-6;
}

/* What the kernels reported through the geometry block's status word (after the fence). */
static kpt_status check_status(vk_backend *v, kpt_diag *diag)
{
    const kpt_vk_geom *g = v->geom.map;
    if (!(g->status & 1u))
        return KPT_OK;
    return kpt_diag_set(diag, KPT_ERR_LIMIT,
                        "%s cut the kernel's loops short (a driver limit on loop iterations, as "
                        "Mesa's llvmpipe has): its output is not valid; shorten Skv",
                        v->base.device_name);
}

/* What every launch refuses: a context that compiles offline, and streams. */
static kpt_status launchable(const kpt_backend *b, const void *stream, kpt_diag *diag)
{
    if (b->offline)
        return kpt_diag_set(diag, KPT_ERR_UNSUPPORTED, "this context compiles offline: no device");
    if (stream)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                            "the Vulkan backend has no streams: launches run synchronously on its "
                            "own queue (pass stream NULL)");
    return KPT_OK;
}

/* The end of a launch (st: packing's status), under v->lock, which it releases: L's buffers bound,
 * its dispatches submitted and waited for (none where a grid dimension is 0), the timestamps read
 * where `timed`; then the temporary buffer and L freed. */
static kpt_status finish_launch(vk_backend *v, vk_launch *L, vk_alloc *tmp, bool timed,
                                kpt_status st, kpt_diag *diag)
{
    if (!st && L->groups[0] && L->groups[1] && L->groups[2]) {
        st = bind_set(v, L, diag);
        if (!st)
            st = submit(v, record_launch, L, diag);
        if (!st && timed)
            read_timestamps(v);
        if (!st)
            st = check_status(v, diag);
    }
    if (tmp->buf)
        free_buffer(v, tmp);
    pthread_mutex_unlock(&v->lock);
    free(L);
    return st;
}

/* The block map's binding: the caller's map at `map` (at its buffer's start), or a temporary
 * buffer in *tmp when `map` is 0; the launch builds it unless attention reads the caller's. */
static kpt_status bind_blockmap(vk_backend *v, const vk_kernel *k, vk_launch *L, uint64_t map,
                                bool attention, vk_alloc *tmp, kpt_diag *diag)
{
    const size_t bytes = map_bytes(k, L);
    kpt_status st = fits_binding(v, "", "the block map", bytes, diag);
    if (st)
        return st;
    vk_alloc *m = map ? find_alloc(v, map, bytes) : NULL;
    if (map && !m)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT, "the block map's memory is gone");
    if (m && m->va != map)
        return kpt_diag_set(diag, KPT_ERR_INTERNAL, "block map not at its buffer's start");
    if (!m) {
        if ((st = alloc_buffer(v, bytes, false, tmp, diag)))
            return st;
        m = tmp;
    }
    L->bufs[KPT_GLSL_BIND_BLOCKMAP] = m->buf;
    L->win_range[KPT_GLSL_BIND_BLOCKMAP] = whole_words(bytes);
    L->blockmap = !attention || !map; /* build it unless the caller's map is given */
    return KPT_OK;
}

/* One submission: the block map (into `map`, or a temporary one when `map` is 0 and the pattern
 * needs one) and/or attention. */
static kpt_status run(kpt_backend *b, void *kernel, const kpt_attention_args *args, uint64_t map,
                      bool attention, void *stream, kpt_diag *diag)
{
    vk_backend *v = vb(b);
    const vk_kernel *k = kernel;
    kpt_status st = launchable(b, stream, diag);
    if (st)
        return st;
    vk_launch *L = malloc(sizeof(*L));
    if (!L)
        return kpt_diag_set(diag, KPT_ERR_NO_MEMORY, "out of memory");
    pthread_mutex_lock(&v->lock);
    st = pack(v, k, args, L, diag);
    vk_alloc tmp = {0};
    L->attention = attention;
    if (!st && k->plan.has_blockmap)
        st = bind_blockmap(v, k, L, map, attention, &tmp, diag);
    return finish_launch(v, L, &tmp, attention, st, diag);
}

static kpt_status vk_launch_fn(kpt_backend *b, void *kernel, const kpt_attention_args *args,
                               uint64_t blockmap, void *stream, kpt_diag *diag)
{
    return run(b, kernel, args, blockmap, true, stream, diag);
}

static kpt_status vk_blockmap_size(kpt_backend *b, void *kernel, const kpt_attention_args *args,
                                   size_t *bytes, kpt_diag *diag)
{
    vk_backend *v = vb(b);
    vk_launch *L = malloc(sizeof(*L));
    if (!L)
        return kpt_diag_set(diag, KPT_ERR_NO_MEMORY, "out of memory");
    pthread_mutex_lock(&v->lock);
    kpt_status st = pack(v, kernel, args, L, diag);
    pthread_mutex_unlock(&v->lock);
    if (!st)
        *bytes = map_bytes(kernel, L);
    free(L);
    return st;
}

static kpt_status vk_blockmap_build(kpt_backend *b, void *kernel, const kpt_attention_args *args,
                                    uint64_t mem, void *stream, kpt_diag *diag)
{
    return run(b, kernel, args, mem, false, stream, diag);
}

/* ---- serving --------------------------------------------------------------------------------- */

/* The serving kernel's workgroups hold KPT_BM rows of (query token, query head) of one sequence
 * and kv head: a plan is how many such row blocks cover a sequence's queries, and how many parts
 * each sequence's keys are split into. Splits fill the device as on CUDA (kpt_paged_split_work,
 * for the device's slots) and, on llvmpipe, go past that where a part must be shorter to stay
 * within its loop limit. */
static int paged_splits(const vk_backend *v, const vk_kernel *k, const kpt_paged_shape *shape,
                        const kpt_paged_plan *pl)
{
    const int64_t bn = k->plan.bn, n_kt = ((int64_t)pl->max_kv + bn - 1) / bn;
    const int group = pl->num_heads_q / pl->num_heads_kv;
    kpt_paged_work work;
    kpt_paged_plan_work(shape, pl, (int)bn, &work);
    int splits = kpt_paged_split_work(&work, pl->num_heads_kv, v->slots);
    while (splits < KPT_PAGED_MAX_SPLITS && splits < n_kt &&
           !paged_fits(v, k, n_kt, splits, group))
        splits++;
    const char *cap = getenv("KPT_VK_MAX_SPLITS"); /* for comparisons; 1: never split */
    if (cap && atoi(cap) >= 1 && splits > atoi(cap))
        splits = atoi(cap);
    /* the grid's x (row blocks times splits) and the workspace's 32-bit float offsets */
    const int64_t x_max = v->limits.maxComputeWorkGroupCount[0];
    while (splits > 1) {
        kpt_paged_plan t = *pl;
        t.splits = splits;
        if ((int64_t)pl->q_blocks * splits <= x_max &&
            kpt_paged_workspace_bytes(&t, k->plan.bm, k->plan.cfg.dv, NULL) / 4 <= UINT32_MAX)
            break;
        splits--;
    }
    return splits;
}

static kpt_status vk_paged_plan(kpt_backend *b, void *kernel, const kpt_paged_shape *shape,
                                kpt_paged_plan *out, kpt_diag *diag)
{
    const vk_backend *v = vb(b);
    const vk_kernel *k = kernel;
    if (!k || k->plan.cfg.kind != KPT_KERNEL_PAGED)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                            "not a serving kernel (get it with KPT_DESC_PAGED)");
    kpt_status st = kpt_paged_plan_compute(shape, 0, 0, k->plan.cfg.dv, out, diag);
    if (st)
        return st;
    const int64_t group = out->num_heads_q / out->num_heads_kv, bm = k->plan.bm;
    const int64_t rows = (int64_t)out->max_q * group, blocks = (rows + bm - 1) / bm;
    if (blocks > INT32_MAX)
        return kpt_diag_set(diag, KPT_ERR_LIMIT, "%lld query rows in one sequence",
                            (long long)rows);
    out->rows = (int)bm;
    out->q_blocks = blocks > 0 ? (int)blocks : 1;
    out->q_per_block = group < bm ? (int)(bm / group) : 1;
    if ((int64_t)out->batch * out->q_blocks > INT32_MAX)
        return kpt_diag_set(diag, KPT_ERR_LIMIT, "%lld query blocks in one launch",
                            (long long)out->batch * out->q_blocks);
    out->blocks = out->batch * out->q_blocks;
    out->splits = paged_splits(v, k, shape, out);
    if ((st = paged_budget(v, k, out->max_kv, (int)group, out->splits, diag)))
        return st;
    out->workspace_bytes = kpt_paged_plan_workspace(out, (int)bm, k->plan.cfg.dv);
    return KPT_OK;
}

/* A serving call's i32 array (cu_seqlens_q, kv_lens, the page table) into its binding. */
static kpt_status pack_index(vk_backend *v, const char *name, const kpt_tensor *t, int binding,
                             vk_launch *L, uint32_t *off, kpt_diag *diag)
{
    int64_t span = span_of(t);
    if (span < 0)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                            "tensor %s: the Vulkan backend needs strides from 0 to 2^32", name);
    return resolve(v, name, t->data, 4, span, L, binding, off, diag);
}

/* A split run's workspace into its binding: the caller's `ws` (checked against the plan's
 * size), or a temporary buffer *tmp that the caller frees after the run. */
static kpt_status pack_workspace(vk_backend *v, const kpt_paged_plan *plan, uint64_t ws,
                                 vk_launch *L, vk_alloc *tmp, kpt_diag *diag)
{
    L->geom.splits = (uint32_t)plan->splits;
    if (plan->splits == 1)
        return KPT_OK;
    const size_t need = plan->workspace_bytes;
    size_t lse_off;
    kpt_paged_workspace_bytes(plan, L->k->plan.bm, L->k->plan.cfg.dv, &lse_off);
    uint32_t off = 0;
    kpt_status st;
    if (ws)
        st = resolve(v, "workspace", (const void *)(uintptr_t)ws, 4, (int64_t)(need / 4) - 1, L,
                     KPT_GLSL_BIND_WORKSPACE, &off, diag);
    else if (!(st = fits_binding(v, "", "the workspace", need, diag)) &&
             !(st = alloc_buffer(v, need, false, tmp, diag)))
        L->bufs[KPT_GLSL_BIND_WORKSPACE] = tmp->buf;
    L->geom.wso = off;
    L->geom.wlo = off + (uint32_t)(lse_off / 4);
    return st;
}

/* Validates a serving call against `plan` and fills L (lock held). Returns with L->groups all
 * 0 when the batch is empty. */
static kpt_status pack_paged(vk_backend *v, const vk_kernel *k, const kpt_paged_plan *plan,
                             const kpt_paged_args *a, uint64_t ws, vk_launch *L,
                             vk_alloc *tmp, kpt_diag *diag)
{
    memset(L, 0, sizeof(*L));
    L->k = k;
    bind_dummies(v, L);
    kpt_paged_binding pb;
    kpt_status st = kpt_paged_bind(k->pattern, a, plan ? plan->max_kv : 0, &pb, diag);
    if (!st)
        st = kpt_paged_check_plan(plan, &pb, diag);
    if (st)
        return st;
    const kpt_kernel_plan *pl = &k->plan;
    if (plan->rows != pl->bm || plan->q_blocks < 1 || /* never packed here */
        !kpt_paged_plan_ok(plan, (int)pl->bm, pl->cfg.dv))
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                            "the plan was not made by kpt_paged_plan_make for this kernel");
    const kpt_tensor *io[4] = {&a->q, &a->k, &a->v, &a->o};
    if ((st = check_ios(pl, io, diag)))
        return st;
    if (!pb.B)
        return KPT_OK;
    if ((st = pack_io(v, io, kpt_dtype_size(pl->cfg.dtype), &a->lse, L, diag)) ||
        (st = pack_aux(v, k, &pb.bind, L, diag)) || (st = pack_sinks(v, &a->sinks, L, diag)) ||
        (st = pack_index(v, "cu_seqlens_q", &a->cu_seqlens_q, KPT_GLSL_BIND_CU_Q, L,
                         &L->geom.cuo, diag)) ||
        (st = pack_index(v, "kv_lens", &a->kv_lens, KPT_GLSL_BIND_KV_LENS, L, &L->geom.kvo,
                         diag)) ||
        (pb.paged && (st = pack_index(v, "page_table", &a->page_table,
                                      KPT_GLSL_BIND_PAGE_TABLE, L, &L->geom.po, diag))))
        return st;
    if ((st = pack_workspace(v, plan, ws, L, tmp, diag)))
        return st;
    if (pb.paged)
        L->geom.ps = (uint32_t)a->page_table.stride[0];
    L->geom.page_size = (uint32_t)pb.page_size;
    L->geom.num_pages = (uint32_t)pb.num_pages;
    L->geom.max_pages = (uint32_t)pb.max_pages;
    L->geom.T = (uint32_t)pb.T;
    kpt_vk_push *P = &L->push;
    P->B = (int32_t)pb.B;
    P->Hq = (int32_t)pb.Hq;
    P->Hkv = (int32_t)pb.Hkv;
    P->Sq = P->Skv = plan->max_kv; /* each workgroup sets its sequence's own */
    P->group = (int32_t)(pb.Hq / pb.Hkv);
    P->n_qt = plan->q_blocks;
    pack_scalars(k, &pb.bind, P);
    L->groups[0] = (uint32_t)plan->q_blocks * (uint32_t)plan->splits;
    L->groups[1] = (uint32_t)pb.Hkv;
    L->groups[2] = (uint32_t)pb.B;
    L->attention = true;
    L->combine = plan->splits > 1;
    L->bm_groups[0] = (uint32_t)plan->q_blocks; /* the combine's grid */
    L->bm_groups[1] = L->groups[1];
    L->bm_groups[2] = L->groups[2];
    if ((st = check_groups(v, L->groups, "serving kernel", diag)))
        return st;
    return paged_budget(v, k, plan->max_kv, (int)(pb.Hq / pb.Hkv), plan->splits, diag);
}

static kpt_status vk_launch_paged(kpt_backend *b, void *kernel, const kpt_paged_plan *plan,
                                  const kpt_paged_args *args, uint64_t workspace, void *stream,
                                  kpt_diag *diag)
{
    vk_backend *v = vb(b);
    const vk_kernel *k = kernel;
    kpt_status st = launchable(b, stream, diag);
    if (st)
        return st;
    if (!k || k->plan.cfg.kind != KPT_KERNEL_PAGED)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                            "not a serving kernel (get it with KPT_DESC_PAGED)");
    if (!args)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT, "args is NULL");
    vk_launch *L = malloc(sizeof(*L));
    if (!L)
        return kpt_diag_set(diag, KPT_ERR_NO_MEMORY, "out of memory");
    pthread_mutex_lock(&v->lock);
    vk_alloc tmp = {0};
    st = pack_paged(v, k, plan, args, workspace, L, &tmp, diag);
    return finish_launch(v, L, &tmp, true, st, diag);
}

double kpt_backend_vulkan_last_ms(const kpt_backend *b)
{
    return b && b->ops->kind == KPT_BACKEND_VULKAN ? ((const vk_backend *)b)->last_ms : -1.0;
}

const char *kpt_backend_vulkan_matrix_support(const kpt_backend *b)
{
    return b && b->ops->kind == KPT_BACKEND_VULKAN ? ((const vk_backend *)b)->matrix_support : "";
}

/* ---- the device ------------------------------------------------------------------------------ */

static const char *component_name(VkComponentTypeNV t)
{
    static const char *const names[] = {"f16", "f32", "f64", "s8", "s16", "s32", "s64",
                                        "u8", "u16", "u32", "u64"};
    return (unsigned)t < sizeof(names) / sizeof(names[0]) ? names[t] : "?";
}

/* Whether the device has Vulkan extension `name`. */
static bool has_extension(vk_backend *v, const char *name)
{
    uint32_t count = 0;
    VkExtensionProperties *ext = NULL;
    bool found = false;
    if (!v->vk.EnumerateDeviceExtensionProperties(v->phys, NULL, &count, NULL) && count &&
        (ext = calloc(count, sizeof(*ext))) &&
        !v->vk.EnumerateDeviceExtensionProperties(v->phys, NULL, &count, ext))
        for (uint32_t i = 0; i < count && !found; i++)
            found = !strcmp(ext[i].extensionName, name);
    free(ext);
    return found;
}

/* What the device offers for the cooperative-matrix kernel: the extensions it needs, and whether
 * VK_NV_cooperative_matrix has the shape the kernel uses (16x16x16, f16 inputs, f32
 * accumulators, subgroup scope). Also written out for reports (v->matrix_support). */
typedef struct vk_matrix_caps {
    bool nv, khr, f16i8, shape;
} vk_matrix_caps;

static vk_matrix_caps probe_matrix_support(vk_backend *v)
{
    vk_matrix_caps mc = {0};
    char *s = v->matrix_support;
    size_t n = sizeof(v->matrix_support), at = 0;
    mc.nv = has_extension(v, "VK_NV_cooperative_matrix");
    mc.khr = has_extension(v, "VK_KHR_cooperative_matrix");
    mc.f16i8 = has_extension(v, "VK_KHR_shader_float16_int8");
    at += (size_t)snprintf(s + at, n - at, "cooperative matrix: %s%s%s", mc.nv ? "NV" : "",
                           mc.nv && mc.khr ? " and " : "",
                           mc.khr ? "KHR" : !mc.nv ? "none" : "");
    PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesNV props =
        mc.nv ? (PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesNV)v->vk.GetInstanceProcAddr(
                    v->inst, "vkGetPhysicalDeviceCooperativeMatrixPropertiesNV")
              : NULL;
    VkCooperativeMatrixPropertiesNV cm[32];
    uint32_t ncm = 32;
    for (uint32_t i = 0; i < ncm; i++)
        cm[i] = (VkCooperativeMatrixPropertiesNV){
            .sType = VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_NV};
    if (!props || (props(v->phys, &ncm, cm) < 0))
        ncm = 0;
    for (uint32_t i = 0; i < ncm; i++) {
        const VkCooperativeMatrixPropertiesNV *c = &cm[i];
        mc.shape |= c->MSize == 16 && c->NSize == 16 && c->KSize == 16 &&
                    c->AType == VK_COMPONENT_TYPE_FLOAT16_NV &&
                    c->BType == VK_COMPONENT_TYPE_FLOAT16_NV &&
                    c->CType == VK_COMPONENT_TYPE_FLOAT32_NV &&
                    c->DType == VK_COMPONENT_TYPE_FLOAT32_NV && c->scope == VK_SCOPE_SUBGROUP_NV;
        if (at < n)
            at += (size_t)snprintf(s + at, n - at, "%s %ux%ux%u %s*%s+%s", i ? "," : ";",
                                   c->MSize, c->NSize, c->KSize, component_name(c->AType),
                                   component_name(c->BType), component_name(c->CType));
    }
    return mc;
}

/* Whether f16 kernels run on cooperative matrices: the NV extension with the kernel's shape,
 * shaderFloat16, 16-bit storage, and subgroups of exactly 32 with shuffles and votes in compute
 * shaders (the kernel's layout assumes 4 subgroups of 32). KPT_VK_COOPMAT=0 turns it off. */
static bool want_coopmat(vk_backend *v, const vk_matrix_caps *mc, bool cm_feature, bool f16,
                         bool storage16)
{
    const char *env = getenv("KPT_VK_COOPMAT");
    if ((env && !strcmp(env, "0")) || !mc->nv || !mc->shape || !mc->f16i8 || !cm_feature ||
        !f16 || !storage16)
        return false;
    VkPhysicalDeviceSubgroupProperties sg = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES};
    VkPhysicalDeviceProperties2 p2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2,
                                      .pNext = &sg};
    v->vk.GetPhysicalDeviceProperties2(v->phys, &p2);
    const VkSubgroupFeatureFlags ops = VK_SUBGROUP_FEATURE_BASIC_BIT |
                                       VK_SUBGROUP_FEATURE_VOTE_BIT |
                                       VK_SUBGROUP_FEATURE_SHUFFLE_BIT;
    return sg.subgroupSize == 32 && (sg.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) &&
           (sg.supportedOperations & ops) == ops;
}

static void vk_destroy(kpt_backend *b)
{
    vk_backend *v = vb(b);
    if (!v)
        return;
    if (v->dev) {
        v->vk.DeviceWaitIdle(v->dev);
        for (size_t i = 0; i < v->nallocs; i++)
            free_buffer(v, &v->allocs[i]);
        free_buffer(v, &v->geom);
        free_buffer(v, &v->dummy);
        if (v->qpool)
            v->vk.DestroyQueryPool(v->dev, v->qpool, NULL);
        if (v->dpool)
            v->vk.DestroyDescriptorPool(v->dev, v->dpool, NULL);
        if (v->fence)
            v->vk.DestroyFence(v->dev, v->fence, NULL);
        if (v->cpool)
            v->vk.DestroyCommandPool(v->dev, v->cpool, NULL);
        if (v->pcache)
            v->vk.DestroyPipelineCache(v->dev, v->pcache, NULL);
        v->vk.DestroyDevice(v->dev, NULL);
    }
    if (v->inst)
        v->vk.DestroyInstance(v->inst, NULL);
    free(v->allocs);
    pthread_mutex_destroy(&v->lock);
    free(v);
}

static const kpt_backend_ops vk_ops = {
    .kind = KPT_BACKEND_VULKAN,
    .destroy = vk_destroy,
    .accepts = vk_accepts,
    .load = vk_load,
    .unload = vk_unload,
    .launch = vk_launch_fn,
    .mem_alloc = vk_mem_alloc,
    .mem_free = vk_mem_free,
    .mem_write = vk_mem_write,
    .mem_read = vk_mem_read,
    .synchronize = vk_synchronize,
    .blockmap_size = vk_blockmap_size,
    .blockmap_build = vk_blockmap_build,
    .paged_plan = vk_paged_plan,
    .launch_paged = vk_launch_paged,
};

static int type_rank(VkPhysicalDeviceType t)
{
    switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return 0;
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return 1;
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return 2;
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return 3;
    default: return 4;
    }
}

static int compute_family(const vk_backend *v, VkPhysicalDevice pd, uint32_t *ts_bits)
{
    VkQueueFamilyProperties qf[16];
    uint32_t n = 16;
    v->vk.GetPhysicalDeviceQueueFamilyProperties(pd, &n, qf);
    for (uint32_t i = 0; i < n; i++)
        if (qf[i].queueFlags & VK_QUEUE_COMPUTE_BIT) {
            *ts_bits = qf[i].timestampValidBits;
            return (int)i;
        }
    return -1;
}

/* Devices with Vulkan 1.1 and a compute queue, best first: discrete, integrated, virtual, CPU
 * (stable within a kind), and the `index`-th of them. */
static kpt_status pick_device(vk_backend *v, int index, bool gpu_only, kpt_diag *diag)
{
    VkPhysicalDevice pds[16];
    uint32_t n = 16;
    VkResult r = v->vk.EnumeratePhysicalDevices(v->inst, &n, pds);
    if (r && r != VK_INCOMPLETE)
        return kpt_vk_fail(diag, "vkEnumeratePhysicalDevices", r);
    VkPhysicalDevice ok[16];
    int rank[16], m = 0;
    for (uint32_t i = 0; i < n; i++) {
        VkPhysicalDeviceProperties pr;
        uint32_t ts;
        v->vk.GetPhysicalDeviceProperties(pds[i], &pr);
        if (pr.apiVersion < VK_API_VERSION_1_1 || compute_family(v, pds[i], &ts) < 0 ||
            (gpu_only && pr.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU))
            continue;
        int j = m++;
        for (; j > 0 && rank[j - 1] > type_rank(pr.deviceType); j--) {
            ok[j] = ok[j - 1];
            rank[j] = rank[j - 1];
        }
        ok[j] = pds[i];
        rank[j] = type_rank(pr.deviceType);
    }
    if (m == 0)
        return kpt_diag_set(diag, KPT_ERR_NO_DEVICE,
                            "no Vulkan %sdevice with Vulkan 1.1 and a compute queue (%u found)",
                            gpu_only ? "GPU " : "", n);
    if (index < 0 || index >= m)
        return kpt_diag_set(diag, KPT_ERR_NO_DEVICE, "Vulkan device %d does not exist (%d found)",
                            index, m);
    v->phys = ok[index];
    return KPT_OK;
}

/* Mesa's llvmpipe (lavapipe): by driver ID where the device reports one (Vulkan 1.2), else by
 * the name it has always had. */
static bool is_llvmpipe(vk_backend *v, const VkPhysicalDeviceProperties *pr)
{
    if (pr->apiVersion >= VK_API_VERSION_1_2) {
        VkPhysicalDeviceDriverProperties dp = {
            .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES};
        VkPhysicalDeviceProperties2 p2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2,
                                          .pNext = &dp};
        v->vk.GetPhysicalDeviceProperties2(v->phys, &p2);
        return dp.driverID == VK_DRIVER_ID_MESA_LLVMPIPE;
    }
    return !strncmp(pr->deviceName, "llvmpipe", 8);
}

/* How many serving workgroups the device runs at once, which the plans split the keys to fill:
 * four per SM (VK_NV_shader_sm_builtins) or compute unit (VK_AMD_shader_core_properties), two
 * per llvmpipe thread (LP_NUM_THREADS, else the CPUs online), else 256 (a mid-sized GPU). */
static int64_t device_slots(vk_backend *v)
{
    if (v->llvmpipe) {
        const char *env = getenv("LP_NUM_THREADS");
        long n = env ? strtol(env, NULL, 10) : sysconf(_SC_NPROCESSORS_ONLN);
        return 2 * (n > 0 ? n : 1);
    }
    VkPhysicalDeviceShaderSMBuiltinsPropertiesNV sm = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_SM_BUILTINS_PROPERTIES_NV};
    VkPhysicalDeviceShaderCorePropertiesAMD amd = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_CORE_PROPERTIES_AMD};
    VkPhysicalDeviceProperties2 p2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2};
    if (has_extension(v, VK_NV_SHADER_SM_BUILTINS_EXTENSION_NAME))
        p2.pNext = &sm;
    else if (has_extension(v, VK_AMD_SHADER_CORE_PROPERTIES_EXTENSION_NAME))
        p2.pNext = &amd;
    else
        return 256;
    v->vk.GetPhysicalDeviceProperties2(v->phys, &p2);
    const int64_t units = p2.pNext == &sm ? (int64_t)sm.shaderSMCount
                                          : (int64_t)amd.shaderEngineCount *
                                                amd.shaderArraysPerEngineCount *
                                                amd.computeUnitsPerShaderArray;
    return units > 0 ? 4 * units : 256;
}

static kpt_status create_device(vk_backend *v, kpt_diag *diag)
{
    VkPhysicalDeviceProperties pr;
    v->vk.GetPhysicalDeviceProperties(v->phys, &pr);
    v->limits = pr.limits;
    v->smem_limit = (int)(pr.limits.maxComputeSharedMemorySize > 1u << 30
                              ? 1u << 30
                              : pr.limits.maxComputeSharedMemorySize);
    snprintf(v->base.device_name, sizeof(v->base.device_name), "%.127s", pr.deviceName);
    v->llvmpipe = is_llvmpipe(v, &pr);
    v->slots = device_slots(v);
    snprintf(v->base.driver, sizeof(v->base.driver), "vulkan %u.%u, driver 0x%x",
             VK_API_VERSION_MAJOR(pr.apiVersion), VK_API_VERSION_MINOR(pr.apiVersion),
             pr.driverVersion);
    v->vk.GetPhysicalDeviceMemoryProperties(v->phys, &v->memprops);
    const vk_matrix_caps mc = probe_matrix_support(v);
    /* feature structs of extensions are chained only when the device has the extension */
    VkPhysicalDeviceCooperativeMatrixFeaturesNV cmf = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV};
    VkPhysicalDeviceShaderFloat16Int8Features f16f = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_FLOAT16_INT8_FEATURES,
        .pNext = mc.nv ? &cmf : NULL};
    VkPhysicalDevice16BitStorageFeatures s16 = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_16BIT_STORAGE_FEATURES,
        .pNext = mc.f16i8 ? &f16f : NULL};
    VkPhysicalDeviceFeatures2 f2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2,
                                    .pNext = &s16};
    v->vk.GetPhysicalDeviceFeatures2(v->phys, &f2);
    if (!f2.features.shaderInt64)
        return kpt_diag_set(diag, KPT_ERR_UNSUPPORTED,
                            "%s lacks shaderInt64, which kpt's kernels need", pr.deviceName);
    v->f16_storage = s16.storageBuffer16BitAccess;
    v->coopmat = want_coopmat(v, &mc, cmf.cooperativeMatrix, f16f.shaderFloat16,
                              s16.storageBuffer16BitAccess);
    size_t ms = strlen(v->matrix_support);
    snprintf(v->matrix_support + ms, sizeof(v->matrix_support) - ms, "; f16 kernels %s",
             v->coopmat ? "use it" : "do not use it");
    VkPhysicalDeviceCooperativeMatrixFeaturesNV encm = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV,
        .cooperativeMatrix = VK_TRUE};
    VkPhysicalDeviceShaderFloat16Int8Features enf16 = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_FLOAT16_INT8_FEATURES,
        .pNext = &encm,
        .shaderFloat16 = VK_TRUE};
    VkPhysicalDevice16BitStorageFeatures en16 = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_16BIT_STORAGE_FEATURES,
        .pNext = v->coopmat ? &enf16 : NULL,
        .storageBuffer16BitAccess = s16.storageBuffer16BitAccess};
    VkPhysicalDeviceFeatures2 en = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2,
                                    .pNext = &en16,
                                    .features = {.shaderInt64 = VK_TRUE}};
    static const char *const coopmat_exts[] = {"VK_NV_cooperative_matrix",
                                               "VK_KHR_shader_float16_int8"};
    uint32_t ts_bits = 0;
    int fam = compute_family(v, v->phys, &ts_bits);
    v->timestamps = ts_bits > 0 && pr.limits.timestampPeriod > 0;
    const float prio = 1.0f;
    const VkDeviceQueueCreateInfo qi = {.sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO,
                                        .queueFamilyIndex = (uint32_t)fam,
                                        .queueCount = 1,
                                        .pQueuePriorities = &prio};
    const VkDeviceCreateInfo di = {.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO,
                                   .pNext = &en,
                                   .queueCreateInfoCount = 1,
                                   .pQueueCreateInfos = &qi,
                                   .enabledExtensionCount = v->coopmat ? 2 : 0,
                                   .ppEnabledExtensionNames = coopmat_exts};
    VkResult r = v->vk.CreateDevice(v->phys, &di, NULL, &v->dev);
    if (r)
        return kpt_vk_fail(diag, "vkCreateDevice", r);
    kpt_status st = kpt_vk_load_device(&v->vk, v->dev, diag);
    if (st)
        return st;
    v->vk.GetDeviceQueue(v->dev, (uint32_t)fam, 0, &v->queue);
    const VkCommandPoolCreateInfo ci = {.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO,
                                        .flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT,
                                        .queueFamilyIndex = (uint32_t)fam};
    if ((r = v->vk.CreateCommandPool(v->dev, &ci, NULL, &v->cpool)))
        return kpt_vk_fail(diag, "vkCreateCommandPool", r);
    const VkCommandBufferAllocateInfo cai = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO,
                                             .commandPool = v->cpool,
                                             .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY,
                                             .commandBufferCount = 1};
    if ((r = v->vk.AllocateCommandBuffers(v->dev, &cai, &v->cmd)))
        return kpt_vk_fail(diag, "vkAllocateCommandBuffers", r);
    const VkFenceCreateInfo fi = {.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    if ((r = v->vk.CreateFence(v->dev, &fi, NULL, &v->fence)))
        return kpt_vk_fail(diag, "vkCreateFence", r);
    const VkDescriptorPoolSize ps = {.type = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                     .descriptorCount = KPT_VK_MAX_BINDINGS};
    const VkDescriptorPoolCreateInfo dpi = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO,
                                            .maxSets = 1,
                                            .poolSizeCount = 1,
                                            .pPoolSizes = &ps};
    if ((r = v->vk.CreateDescriptorPool(v->dev, &dpi, NULL, &v->dpool)))
        return kpt_vk_fail(diag, "vkCreateDescriptorPool", r);
    const VkPipelineCacheCreateInfo pci = {.sType = VK_STRUCTURE_TYPE_PIPELINE_CACHE_CREATE_INFO};
    if ((r = v->vk.CreatePipelineCache(v->dev, &pci, NULL, &v->pcache)))
        return kpt_vk_fail(diag, "vkCreatePipelineCache", r);
    const VkQueryPoolCreateInfo qpi = {.sType = VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO,
                                       .queryType = VK_QUERY_TYPE_TIMESTAMP,
                                       .queryCount = 2};
    if (v->timestamps && v->vk.CreateQueryPool(v->dev, &qpi, NULL, &v->qpool))
        v->timestamps = false;
    if ((st = alloc_buffer(v, sizeof(kpt_vk_geom), true, &v->geom, diag)) ||
        (st = alloc_buffer(v, 256, false, &v->dummy, diag)))
        return st;
    return KPT_OK;
}

static kpt_status open_device(vk_backend *v, const kpt_context_params *p, bool gpu_only,
                              kpt_diag *diag)
{
    kpt_status st = kpt_vk_load(&v->vk, diag);
    if (st)
        return st;
    uint32_t ver = VK_API_VERSION_1_0;
    if (v->vk.EnumerateInstanceVersion)
        v->vk.EnumerateInstanceVersion(&ver);
    if (ver < VK_API_VERSION_1_1)
        return kpt_diag_set(diag, KPT_ERR_NO_DEVICE, "the Vulkan loader is older than 1.1");
    const VkApplicationInfo app = {.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO,
                                   .pEngineName = "kpt",
                                   .apiVersion = VK_API_VERSION_1_1};
    const VkInstanceCreateInfo ii = {.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO,
                                     .pApplicationInfo = &app};
    VkResult r = v->vk.CreateInstance(&ii, NULL, &v->inst);
    if (r)
        return r == VK_ERROR_INCOMPATIBLE_DRIVER
                   ? kpt_diag_set(diag, KPT_ERR_NO_DEVICE, "no Vulkan driver (ICD) found")
                   : kpt_vk_fail(diag, "vkCreateInstance", r);
    if ((st = kpt_vk_load_instance(&v->vk, v->inst, diag)) ||
        (st = pick_device(v, p->device, gpu_only, diag)))
        return st;
    return create_device(v, diag);
}

kpt_status kpt_backend_vulkan_open(const kpt_context_params *p, bool gpu_only, kpt_backend **out,
                                   kpt_diag *diag)
{
    *out = NULL;
    if (p->target && strcmp(p->target, "spirv"))
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                            "target '%s' is not the Vulkan backend's ('spirv')", p->target);
    vk_backend *v = calloc(1, sizeof(*v));
    if (!v)
        return kpt_diag_set(diag, KPT_ERR_NO_MEMORY, "out of memory");
    pthread_mutex_init(&v->lock, NULL);
    v->base.ops = &vk_ops;
    v->base.offline = p->flags & KPT_CONTEXT_OFFLINE;
    v->next_va = KPT_VK_VA_BASE;
    snprintf(v->base.target, sizeof(v->base.target), "spirv");
    kpt_status st = KPT_OK;
    if (v->base.offline)
        snprintf(v->base.driver, sizeof(v->base.driver), "none");
    else
        st = open_device(v, p, gpu_only, diag);
    if (st) {
        vk_destroy(&v->base);
        return st;
    }
    /* a device with cooperative matrices runs spirv:coopmat, planned for all its shared memory;
     * the context still calls its target spirv (target/target.c) */
    v->base.tgt = kpt_target_find(v->coopmat ? "spirv:coopmat" : "spirv");
    v->base.smem_limit = v->base.offline ? 0 : v->smem_limit;
    v->base.tgt->rtc->identity(v->base.compiler, sizeof(v->base.compiler));
    *out = &v->base;
    return KPT_OK;
}
