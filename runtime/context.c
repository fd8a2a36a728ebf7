/* The runtime's public API (include/kpt/runtime.h): contexts, kernels through the caches,
 * launches, block maps, bundles and statistics. Backends sit behind runtime/backend.h. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/diag.h"
#include "ir/pattern.h"
#include "base/strbuf.h"
#include "kpt_version.h"
#include "runtime/backend.h"
#include "runtime/backend_vulkan.h"
#include "runtime/bundle.h"
#include "base/clock.h"
#include "runtime/context.h"
#include "runtime/disk_cache.h"
#include "runtime/kernel_cache.h"
#include "base/log.h"

#define DEFAULT_CACHE_BYTES ((uint64_t)1 << 30)

/* Where a module's code came from; also how a request was served. */
typedef enum origin { FROM_NONE, FROM_MEMORY, FROM_BUNDLE, FROM_DISK, FROM_COMPILER } origin;
static const char *const origin_names[] = {"none", "memory", "bundle", "disk", "compiled"};

/* A compiled and loaded kernel: one per (pattern IR, dtype, head dims) in a context. */
typedef struct module {
    kpt_context *ctx;
    kpt_pattern *pattern; /* the context's own copy */
    kpt_kernel_plan plan;
    void *impl;           /* the backend's kernel; NULL offline */
    origin how;           /* FROM_NONE: the backend compiles nothing (CPU) */
    kpt_key bundle_key;
    void *binary;         /* kept offline, for bundles */
    size_t binary_size;
} module;

/* What kpt_kernel_get returns: a module and the shape class it was asked for. (Where the module's
 * plan has a tall variant, the backend's kernel holds that module's too: build_kernel.) */
struct kpt_kernel {
    module *mod;
    kpt_kernel_desc desc;
};

struct kpt_blockmap {
    const module *mod;
    uint64_t mem;
    size_t bytes;
    int64_t B, Hq, Sq, Skv;
};

struct kpt_context {
    kpt_backend *backend;
    kpt_logger log;
    kpt_disk_cache *disk;
    kpt_kcache *modules; /* by pattern IR + dtype + head dims */
    kpt_kcache *kernels; /* by pattern IR + the whole kpt_kernel_desc */
    pthread_mutex_t lock; /* stats and bundles */
    kpt_stats stats;
    kpt_bundle *bundles;
    int num_bundles;
};

/* ---- context -------------------------------------------------------------------------------- */

const char *kpt_backend_name(kpt_backend_kind kind)
{
    switch (kind) {
    case KPT_BACKEND_AUTO: return "auto";
    case KPT_BACKEND_CUDA: return "cuda";
    case KPT_BACKEND_HIP: return "hip";
    case KPT_BACKEND_VULKAN: return "vulkan";
    case KPT_BACKEND_CPU: return "cpu";
    }
    return "unknown";
}

static void module_free(void *value)
{
    module *m = value;
    if (m->impl)
        m->ctx->backend->ops->unload(m->ctx->backend, m->impl);
    kpt_pattern_destroy(&m->pattern);
    free(m->binary);
    free(m);
}

static kpt_status check_params(const kpt_context_params *p, kpt_diag *diag)
{
    if ((unsigned)p->backend > KPT_BACKEND_CPU)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT, "unknown backend %d",
                            (int)p->backend);
    if (p->device < 0)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT, "device index %d is negative",
                            p->device);
    if ((unsigned)p->log_level > KPT_LOG_DEBUG)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT, "unknown log level %d",
                            (int)p->log_level);
    if (p->flags & ~(unsigned)(KPT_CONTEXT_NO_DISK_CACHE | KPT_CONTEXT_OFFLINE))
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT, "unknown context flags 0x%x",
                            p->flags);
    return KPT_OK;
}

static kpt_status open_backend(kpt_context *ctx, const kpt_context_params *p, kpt_diag *diag)
{
    switch (p->backend) {
    case KPT_BACKEND_CUDA:
        return kpt_backend_cuda_open(p, &ctx->backend, diag);
    case KPT_BACKEND_CPU:
        return kpt_backend_cpu_open(p, &ctx->backend, diag);
    case KPT_BACKEND_VULKAN:
        return kpt_backend_vulkan_open(p, false, &ctx->backend, diag);
    case KPT_BACKEND_HIP:
        return kpt_backend_hip_open(p, &ctx->backend, diag);
    case KPT_BACKEND_AUTO:
        break;
    }
    /* auto: the first GPU backend that opens, else the CPU reference (said loudly: it is slow) */
    kpt_context_params q = *p;
    q.backend = KPT_BACKEND_CUDA;
    kpt_diag why = {0};
    kpt_status st = kpt_backend_cuda_open(&q, &ctx->backend, &why);
    if (!st || (p->flags & KPT_CONTEXT_OFFLINE)) {
        if (st && diag)
            *diag = why;
        return st;
    }
    kpt_diag why_hip = {0}, why_vk = {0};
    q.backend = KPT_BACKEND_HIP;
    q.target = NULL;
    if (!kpt_backend_hip_open(&q, &ctx->backend, &why_hip))
        return KPT_OK;
    q.backend = KPT_BACKEND_VULKAN;
    if (!kpt_backend_vulkan_open(&q, true, &ctx->backend, &why_vk))
        return KPT_OK;
    kpt_log(&ctx->log, KPT_LOG_WARN,
            "no GPU backend (CUDA: %s; HIP: %s; Vulkan: %s); using the CPU reference",
            why.message, why_hip.message, why_vk.message);
    q.backend = KPT_BACKEND_CPU;
    q.target = NULL;
    return kpt_backend_cpu_open(&q, &ctx->backend, diag);
}

static void open_disk_cache(kpt_context *ctx, const kpt_context_params *p)
{
    if ((p->flags & KPT_CONTEXT_NO_DISK_CACHE) || !ctx->backend->tgt)
        return;
    char dir[4096];
    if (p->cache_dir)
        snprintf(dir, sizeof(dir), "%s", p->cache_dir);
    else if (!kpt_disk_cache_default_dir(dir, sizeof(dir))) {
        kpt_log(&ctx->log, KPT_LOG_WARN,
                "disk cache disabled: no $KPT_CACHE_DIR, $XDG_CACHE_HOME or $HOME");
        return;
    }
    ctx->disk = kpt_disk_cache_open(dir, p->cache_max_bytes ? p->cache_max_bytes
                                                           : DEFAULT_CACHE_BYTES, &ctx->log);
    if (ctx->disk)
        kpt_log(&ctx->log, KPT_LOG_INFO, "disk cache: %s", dir);
}

kpt_status kpt_context_create(const kpt_context_params *params, kpt_context **out,
                              kpt_diag *diag)
{
    if (!out)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT, "kpt_context_create: out is NULL");
    *out = NULL;
    kpt_context_params p = params ? *params : (kpt_context_params){0};
    kpt_status st = check_params(&p, diag);
    if (st)
        return st;
    kpt_context *ctx = calloc(1, sizeof(*ctx));
    if (!ctx)
        return kpt_diag_set(diag, KPT_ERR_NO_MEMORY, "out of memory");
    ctx->log = (kpt_logger){.fn = p.log, .user = p.log_user,
                            .level = p.log_level ? p.log_level : KPT_LOG_WARN};
    pthread_mutex_init(&ctx->lock, NULL);
    ctx->modules = kpt_kcache_new(module_free);
    ctx->kernels = kpt_kcache_new(free);
    if (!ctx->modules || !ctx->kernels)
        st = kpt_diag_set(diag, KPT_ERR_NO_MEMORY, "out of memory");
    if (!st)
        st = open_backend(ctx, &p, diag);
    if (st) {
        kpt_context_destroy(&ctx);
        return st;
    }
    kpt_backend *b = ctx->backend;
    kpt_log(&ctx->log, KPT_LOG_INFO, "kpt %s: backend %s, target %s%s%s, compiler %s",
            KPT_VERSION_STRING, kpt_backend_name(b->ops->kind), b->target,
            *b->device_name ? ", device " : "", b->device_name,
            *b->compiler ? b->compiler : "none");
    open_disk_cache(ctx, &p);
    *out = ctx;
    return KPT_OK;
}

void kpt_context_destroy(kpt_context **cp)
{
    kpt_context *ctx = cp ? *cp : NULL;
    if (!ctx)
        return;
    kpt_kcache_free(&ctx->kernels);
    kpt_kcache_free(&ctx->modules); /* unloads through the backend: before it closes */
    if (ctx->backend)
        ctx->backend->ops->destroy(ctx->backend);
    kpt_disk_cache_close(&ctx->disk);
    for (int i = 0; i < ctx->num_bundles; i++)
        kpt_bundle_free(&ctx->bundles[i]);
    free(ctx->bundles);
    pthread_mutex_destroy(&ctx->lock);
    free(ctx);
    *cp = NULL;
}

kpt_backend *kpt_context_backend_impl(kpt_context *ctx)
{
    return ctx ? ctx->backend : NULL;
}

kpt_backend_kind kpt_context_backend(const kpt_context *ctx)
{
    return ctx ? ctx->backend->ops->kind : KPT_BACKEND_AUTO;
}

const char *kpt_context_target(const kpt_context *ctx)
{
    return ctx ? ctx->backend->target : "";
}

const char *kpt_context_device_name(const kpt_context *ctx)
{
    return ctx ? ctx->backend->device_name : "";
}

/* ---- kernels -------------------------------------------------------------------------------- */

typedef struct request {
    kpt_context *ctx;
    const kpt_pattern *pattern;
    const char *ir;         /* the pattern's IR text */
    kpt_kernel_desc desc;   /* defaults filled in */
    bool tall;              /* the plan's tall variant (plan.tall_variant) */
    origin module_how;      /* how this request got its module (FROM_NONE: not yet) */
    double compile_ms;
} request;

static const kpt_bundle_entry *find_in_bundles(kpt_context *ctx, const kpt_key *key)
{
    const kpt_bundle_entry *found = NULL;
    pthread_mutex_lock(&ctx->lock);
    for (int i = 0; i < ctx->num_bundles && !found; i++)
        for (int j = 0; j < ctx->bundles[i].count && !found; j++)
            if (kpt_key_equal(&ctx->bundles[i].entries[j].key, key) &&
                !strcmp(ctx->bundles[i].entries[j].target, ctx->backend->target))
                found = &ctx->bundles[i].entries[j];
    pthread_mutex_unlock(&ctx->lock);
    return found; /* bundles are never unloaded while the context lives */
}

static void describe(const module *m, char *out, size_t n)
{
    const kpt_kernel_config *c = &m->plan.cfg;
    snprintf(out, n, "%s d%d/%d %.24s", kpt_dtype_name(c->dtype), c->dqk, c->dv,
             m->pattern->name);
}

/* The binary of a module: from a bundle, the disk cache, or the compiler. */
static kpt_status obtain_binary(request *rq, module *m, const char *src, bool use_disk,
                                void **bin, size_t *size, bool *owned, kpt_diag *diag)
{
    kpt_context *ctx = rq->ctx;
    kpt_backend *b = ctx->backend;
    const char *version = KPT_VERSION_STRING;
    kpt_key_part parts[] = {
        {"bundle", 6}, {src, strlen(src)}, {b->target, strlen(b->target)},
        {version, strlen(version)}, {b->compiler, strlen(b->compiler)},
        {b->driver, strlen(b->driver)},
    };
    m->bundle_key = kpt_key_of(parts, 4);
    const kpt_bundle_entry *be = find_in_bundles(ctx, &m->bundle_key);
    if (be) {
        *bin = (void *)be->payload;
        *size = be->size;
        *owned = false;
        m->how = FROM_BUNDLE;
        return KPT_OK;
    }
    parts[0] = (kpt_key_part){"disk", 4};
    kpt_key disk_key = kpt_key_of(parts, 6);
    *owned = true;
    if (use_disk && kpt_disk_cache_get(ctx->disk, &disk_key, bin, size)) {
        m->how = FROM_DISK;
        return KPT_OK;
    }
    double t0 = kpt_now_ms();
    kpt_rtc_output out;
    kpt_status st = kpt_kernel_compile(b->tgt, src, &m->plan, 0, &out, diag);
    *bin = out.binary;
    *size = out.size;
    out.binary = NULL;
    kpt_rtc_output_free(&out);
    if (st)
        return st;
    rq->compile_ms = kpt_now_ms() - t0;
    m->how = FROM_COMPILER;
    kpt_disk_cache_put(ctx->disk, &disk_key, *bin, *size);
    return KPT_OK;
}

/* The kernel kind a desc asks for. */
static kpt_kernel_kind desc_kind(const kpt_kernel_desc *d)
{
    return d->options & KPT_DESC_BACKWARD ? KPT_KERNEL_BACKWARD
           : d->options & KPT_DESC_PAGED  ? KPT_KERNEL_PAGED
                                          : KPT_KERNEL_FORWARD;
}

/* The plan and source of a kernel (no source for the CPU backend, which runs the reference). */
static kpt_status generate(kpt_backend *b, const kpt_pattern *p, const kpt_kernel_desc *d,
                           bool tall, kpt_kernel_plan *plan, char **src, kpt_diag *diag)
{
    *src = NULL;
    kpt_status st = b->ops->accepts ? b->ops->accepts(b, d, diag) : KPT_OK;
    if (st)
        return st;
    kpt_kernel_kind kind = desc_kind(d);
    if (!b->tgt) {
        memset(plan, 0, sizeof(*plan));
        plan->cfg = (kpt_kernel_config){.kind = kind, .dtype = d->dtype, .dqk = d->head_dim,
                                        .dv = d->head_dim_v};
        return KPT_OK;
    }
    kpt_kernel_request rq = {.kind = kind, .dtype = d->dtype, .dqk = d->head_dim,
                             .dv = d->head_dim_v, .smem_limit = b->smem_limit, .tall = tall};
    return kpt_kernel_generate(b->tgt, p, &rq, plan, src, diag);
}

static kpt_status build_module(void *user, void **value, kpt_diag *diag)
{
    request *rq = user;
    kpt_context *ctx = rq->ctx;
    kpt_backend *b = ctx->backend;
    module *m = calloc(1, sizeof(*m));
    if (!m)
        return kpt_diag_set(diag, KPT_ERR_NO_MEMORY, "out of memory");
    m->ctx = ctx;
    m->how = FROM_NONE;
    kpt_status st = KPT_OK;
    if (!(m->pattern = kpt_pattern_read(rq->ir, diag)))
        st = diag && diag->status ? diag->status : KPT_ERR_NO_MEMORY;
    else if (!kpt_pattern_set_name(m->pattern, rq->pattern->name))
        st = kpt_diag_set(diag, KPT_ERR_NO_MEMORY, "out of memory");
    char *src = NULL;
    if (!st)
        st = generate(b, m->pattern, &rq->desc, rq->tall, &m->plan, &src, diag);
    void *bin = NULL;
    size_t size = 0;
    bool owned = false;
    if (!st && src)
        st = obtain_binary(rq, m, src, true, &bin, &size, &owned, diag);
    if (!st && !b->offline)
        st = b->ops->load(b, m->pattern, &m->plan, bin, size, &m->impl, diag);
    if (st && m->how == FROM_DISK) {
        /* Sound checksums but a payload the driver refuses (written by a broken build, or a
         * driver that changed under the same version string): compile afresh and replace the
         * entry, rather than fail in every process from now on. */
        kpt_log(&ctx->log, KPT_LOG_WARN, "disk cache: an entry would not load (%s); recompiling",
                diag && diag->message[0] ? diag->message : kpt_status_string(st));
        free(bin);
        bin = NULL;
        st = obtain_binary(rq, m, src, false, &bin, &size, &owned, diag);
        if (!st)
            st = b->ops->load(b, m->pattern, &m->plan, bin, size, &m->impl, diag);
    }
    free(src);
    if (!st && b->offline && bin) {
        if (owned) {
            m->binary = bin;
        } else if ((m->binary = malloc(size))) {
            memcpy(m->binary, bin, size);
        } else {
            st = kpt_diag_set(diag, KPT_ERR_NO_MEMORY, "out of memory");
        }
        m->binary_size = size;
        owned = false;
    }
    if (owned)
        free(bin);
    if (st) {
        module_free(m);
        return st;
    }
    rq->module_how = m->how;
    char what[128];
    describe(m, what, sizeof(what));
    kpt_log(&ctx->log, KPT_LOG_DEBUG, "kernel %s: %s%s", what, origin_names[m->how],
            rq->compile_ms > 0 ? " now" : "");
    *value = m;
    return KPT_OK;
}

/* The module key: what the generated code depends on, its kernel kind first. (The disk and
 * bundle keys hash the source itself, which differs between kinds: each has its own template
 * and entry points.) */
static char *module_key(const request *rq, size_t *n, bool with_heads)
{
    kpt_strbuf sb = {0};
    kpt_sb_printf(&sb, "%s\n%s\n%d %d %d%s", kpt_kernel_kind_name(desc_kind(&rq->desc)), rq->ir,
                  (int)rq->desc.dtype, rq->desc.head_dim, rq->desc.head_dim_v,
                  rq->tall ? " tall" : "");
    if (with_heads)
        kpt_sb_printf(&sb, " %d %d %u", rq->desc.num_heads_q, rq->desc.num_heads_kv,
                      rq->desc.options);
    *n = sb.len;
    return kpt_sb_take(&sb);
}

/* The module of a request (from the context's modules, or built). */
static kpt_status get_module(request *rq, module **out, kpt_diag *diag)
{
    size_t n;
    char *key = module_key(rq, &n, false);
    if (!key)
        return kpt_diag_set(diag, KPT_ERR_NO_MEMORY, "out of memory");
    void *m = NULL;
    bool hit = false;
    kpt_status st = kpt_kcache_get(rq->ctx->modules, key, n, build_module, rq, &m, &hit, diag);
    free(key);
    if (!st && hit && rq->module_how == FROM_NONE)
        rq->module_how = FROM_MEMORY;
    *out = m;
    return st;
}

static kpt_status build_kernel(void *user, void **value, kpt_diag *diag)
{
    request *rq = user;
    module *m = NULL, *tall = NULL;
    kpt_status st = get_module(rq, &m, diag);
    if (st)
        return st;
    /* Both modules are made now, so that no launch compiles (nor a CUDA graph's capture). The
     * tall one only speeds some calls up: where it cannot be had (a bundle without it and no
     * compiler here), the kernel runs every call on the default one. */
    if (m->plan.tall_variant && desc_kind(&rq->desc) == KPT_KERNEL_FORWARD) {
        request trq = *rq;
        trq.tall = true;
        trq.module_how = FROM_NONE;
        trq.compile_ms = 0;
        kpt_diag td = {0};
        if (get_module(&trq, &tall, &td)) {
            kpt_log(&rq->ctx->log, KPT_LOG_WARN,
                    "pattern '%s': its tall variant (192-row q tiles) is not available (%s); "
                    "every call takes 128-row tiles", rq->pattern->name, td.message);
        } else {
            rq->compile_ms += trq.compile_ms;
            kpt_backend *b = rq->ctx->backend;
            if (m->impl && tall->impl && b->ops->pair)
                b->ops->pair(b, m->impl, tall->impl);
        }
    }
    kpt_kernel *k = calloc(1, sizeof(*k));
    if (!k)
        return kpt_diag_set(diag, KPT_ERR_NO_MEMORY, "out of memory");
    k->mod = m;
    k->desc = rq->desc;
    *value = k;
    return KPT_OK;
}

static kpt_status check_desc(const kpt_kernel_desc *d, kpt_diag *diag)
{
    if (d->dtype != KPT_DTYPE_F16 && d->dtype != KPT_DTYPE_BF16 && d->dtype != KPT_DTYPE_F32)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                            "kernel desc: dtype %s (%d): expected f16, bf16 or f32",
                            kpt_dtype_name(d->dtype), (int)d->dtype);
    if (d->head_dim <= 0 || d->head_dim_v < 0 || d->head_dim > 65536 || d->head_dim_v > 65536)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                            "kernel desc: head dims %d, %d: head_dim must be positive",
                            d->head_dim, d->head_dim_v);
    if (d->num_heads_q < 0 || d->num_heads_kv < 0)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                            "kernel desc: negative head count (%d, %d)", d->num_heads_q,
                            d->num_heads_kv);
    if (d->num_heads_q && d->num_heads_kv && d->num_heads_q % d->num_heads_kv)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                            "kernel desc: %d query heads are not a multiple of %d kv heads",
                            d->num_heads_q, d->num_heads_kv);
    if (d->options & ~(unsigned)(KPT_DESC_BACKWARD | KPT_DESC_PAGED))
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                            "kernel desc: unknown options 0x%x (KPT_DESC_BACKWARD is 0x%x, "
                            "KPT_DESC_PAGED 0x%x)", d->options, (unsigned)KPT_DESC_BACKWARD,
                            (unsigned)KPT_DESC_PAGED);
    if ((d->options & KPT_DESC_BACKWARD) && (d->options & KPT_DESC_PAGED))
        return kpt_diag_set(diag, KPT_ERR_UNSUPPORTED,
                            "kernel desc: KPT_DESC_BACKWARD and KPT_DESC_PAGED together: the "
                            "serving kernels have no backward");
    return KPT_OK;
}

kpt_status kpt_kernel_get(kpt_context *ctx, const kpt_pattern *p, const kpt_kernel_desc *desc,
                          kpt_kernel **out, kpt_diag *diag)
{
    if (out)
        *out = NULL;
    if (!ctx || !p || !desc || !out)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                            "kpt_kernel_get: %s is NULL",
                            !ctx ? "ctx" : !p ? "pattern" : !desc ? "desc" : "out");
    request rq = {.ctx = ctx, .pattern = p, .desc = *desc};
    if (!rq.desc.head_dim_v)
        rq.desc.head_dim_v = rq.desc.head_dim;
    kpt_status st = check_desc(&rq.desc, diag);
    char *ir = st ? NULL : kpt_pattern_print(p);
    if (!st && !ir)
        st = kpt_diag_set(diag, KPT_ERR_NO_MEMORY, "out of memory");
    size_t n = 0;
    char *key = NULL;
    if (!st) {
        rq.ir = ir;
        if (!(key = module_key(&rq, &n, true)))
            st = kpt_diag_set(diag, KPT_ERR_NO_MEMORY, "out of memory");
    }
    void *k = NULL;
    bool hit = false;
    if (!st)
        st = kpt_kcache_get(ctx->kernels, key, n, build_kernel, &rq, &k, &hit, diag);
    free(key);
    free(ir);
    pthread_mutex_lock(&ctx->lock);
    kpt_stats *s = &ctx->stats;
    s->requests++;
    if (st)
        s->failures++;
    else if (hit || rq.module_how == FROM_MEMORY)
        s->memory_hits++;
    else if (rq.module_how == FROM_BUNDLE)
        s->bundle_hits++;
    else if (rq.module_how == FROM_DISK)
        s->disk_hits++;
    else if (rq.module_how == FROM_COMPILER) {
        s->compiles++;
        s->compile_ms_total += rq.compile_ms;
        if (rq.compile_ms > s->compile_ms_max)
            s->compile_ms_max = rq.compile_ms;
    }
    pthread_mutex_unlock(&ctx->lock);
    *out = k;
    return st;
}

int kpt_kernel_needs_blockmap(const kpt_kernel *k)
{
    return k && k->mod->plan.has_blockmap;
}

kpt_status kpt_kernel_get_info(const kpt_kernel *k, kpt_kernel_info *out)
{
    if (!k || !out)
        return KPT_ERR_INVALID_ARGUMENT;
    const module *m = k->mod;
    *out = (kpt_kernel_info){
        .pattern = m->pattern->name,
        .target = m->ctx->backend->target,
        .desc = k->desc,
        .tile_q = m->plan.bm,
        .tile_kv = m->plan.bn,
        .shared_bytes = m->plan.smem_bytes,
        .source = origin_names[m->how],
    };
    return KPT_OK;
}

/* ---- launches and block maps ------------------------------------------------------------------ */

/* Checks what the kernel desc fixed (head counts) and that the kernel can run here. */
static kpt_status check_launch(const kpt_kernel *k, const kpt_attention_args *a, kpt_diag *diag)
{
    if (!k || !a)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT, "%s is NULL",
                            !k ? "kernel" : "args");
    if (!k->mod->impl)
        return kpt_diag_set(diag, KPT_ERR_UNSUPPORTED,
                            "this kernel was compiled offline for %s and cannot run",
                            k->mod->ctx->backend->target);
    const kpt_kernel_desc *d = &k->desc;
    if (d->num_heads_q && a->q.rank == 4 && a->q.shape[1] != d->num_heads_q)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                            "tensor q has %lld heads; this kernel was made for %d",
                            (long long)a->q.shape[1], d->num_heads_q);
    if (d->num_heads_kv && a->k.rank == 4 && a->k.shape[1] != d->num_heads_kv)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                            "tensor k has %lld heads; this kernel was made for %d",
                            (long long)a->k.shape[1], d->num_heads_kv);
    return KPT_OK;
}

/* The sizes a block map depends on (valid after the backend validated the args). */
static void map_dims(const kpt_attention_args *a, int64_t dims[4])
{
    dims[0] = a->q.shape[0];
    dims[1] = a->q.shape[1];
    dims[2] = a->q.shape[2];
    dims[3] = a->k.shape[2];
}

static kpt_status check_map(const kpt_kernel *k, const kpt_attention_args *args,
                            const kpt_blockmap *map, kpt_diag *diag)
{
    int64_t d[4];
    map_dims(args, d);
    if (map->mod != k->mod)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                            "the block map was made for another kernel");
    if (args->q.rank == 4 && args->k.rank == 4 &&
        (d[0] != map->B || d[1] != map->Hq || d[2] != map->Sq || d[3] != map->Skv))
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                            "the block map was made for B=%lld Hq=%lld Sq=%lld Skv=%lld, "
                            "not B=%lld Hq=%lld Sq=%lld Skv=%lld",
                            (long long)map->B, (long long)map->Hq, (long long)map->Sq,
                            (long long)map->Skv, (long long)d[0], (long long)d[1],
                            (long long)d[2], (long long)d[3]);
    return KPT_OK;
}

static bool is_backward(const kpt_kernel *k)
{
    return desc_kind(&k->desc) == KPT_KERNEL_BACKWARD;
}

kpt_status kpt_kernel_launch(const kpt_kernel *k, const kpt_attention_args *args,
                             const kpt_blockmap *map, void *stream, kpt_diag *diag)
{
    kpt_status st = check_launch(k, args, diag);
    if (st)
        return st;
    kpt_backend *b = k->mod->ctx->backend;
    if (desc_kind(&k->desc) != KPT_KERNEL_FORWARD)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                            is_backward(k)
                                ? "this is a backward kernel: launch it with kpt_kernel_launch_backward"
                                : "this is a serving kernel: run it with kpt_paged_run");
    if (map && (st = check_map(k, args, map, diag)))
        return st;
    return b->ops->launch(b, k->mod->impl, args, map ? map->mem : 0, stream, diag);
}

kpt_status kpt_kernel_backward_workspace(const kpt_kernel *k, const kpt_attention_args *args,
                                         const kpt_attention_grads *grads, size_t *bytes,
                                         kpt_diag *diag)
{
    if (bytes)
        *bytes = 0;
    kpt_status st = check_launch(k, args, diag);
    if (st)
        return st;
    kpt_backend *b = k->mod->ctx->backend;
    if (!bytes || !is_backward(k) || !b->ops->backward_workspace)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                            !bytes ? "bytes is NULL"
                                   : "not a backward kernel (get it with KPT_DESC_BACKWARD)");
    return b->ops->backward_workspace(b, k->mod->impl, args, grads, bytes, diag);
}

kpt_status kpt_kernel_launch_backward(const kpt_kernel *k, const kpt_attention_args *args,
                                      const kpt_attention_grads *grads, const kpt_blockmap *map,
                                      void *workspace, size_t workspace_bytes, void *stream,
                                      kpt_diag *diag)
{
    kpt_status st = check_launch(k, args, diag);
    if (st)
        return st;
    kpt_backend *b = k->mod->ctx->backend;
    if (!is_backward(k) || !b->ops->launch_backward)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                            "not a backward kernel (get it with KPT_DESC_BACKWARD)");
    if (!grads)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT, "grads is NULL");
    if (map && (st = check_map(k, args, map, diag)))
        return st;
    return b->ops->launch_backward(b, k->mod->impl, args, grads, map ? map->mem : 0,
                                   (uint64_t)(uintptr_t)workspace, workspace_bytes, stream, diag);
}

/* ---- serving ------------------------------------------------------------------------------- */

static kpt_status check_paged(const kpt_kernel *k, kpt_diag *diag)
{
    if (!k)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT, "kernel is NULL");
    kpt_backend *b = k->mod->ctx->backend;
    if (desc_kind(&k->desc) != KPT_KERNEL_PAGED || !b->ops->launch_paged)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                            "not a serving kernel (get it with KPT_DESC_PAGED)");
    if (!k->mod->impl)
        return kpt_diag_set(diag, KPT_ERR_UNSUPPORTED,
                            "this kernel was compiled offline for %s and cannot run",
                            b->target);
    return KPT_OK;
}

kpt_status kpt_paged_plan_make(const kpt_kernel *k, const kpt_paged_shape *shape,
                               kpt_paged_plan *out, kpt_diag *diag)
{
    kpt_status st = check_paged(k, diag);
    if (st)
        return st;
    if (!shape || !out)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT, "%s is NULL",
                            !shape ? "shape" : "out");
    const kpt_kernel_desc *d = &k->desc;
    if ((d->num_heads_q && shape->num_heads_q != d->num_heads_q) ||
        (d->num_heads_kv && shape->num_heads_kv != d->num_heads_kv))
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                            "the shape has %d:%d heads; this kernel was made for %d:%d",
                            shape->num_heads_q, shape->num_heads_kv, d->num_heads_q,
                            d->num_heads_kv);
    kpt_backend *b = k->mod->ctx->backend;
    return b->ops->paged_plan(b, k->mod->impl, shape, out, diag);
}

kpt_status kpt_paged_run(const kpt_kernel *k, const kpt_paged_plan *plan,
                         const kpt_paged_args *args, void *workspace, size_t workspace_bytes,
                         void *stream, kpt_diag *diag)
{
    kpt_status st = check_paged(k, diag);
    if (st)
        return st;
    if (!plan || !args)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT, "%s is NULL", !plan ? "plan" : "args");
    if (workspace && workspace_bytes < plan->workspace_bytes)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                            "workspace of %zu bytes; the plan needs %zu", workspace_bytes,
                            plan->workspace_bytes);
    kpt_backend *b = k->mod->ctx->backend;
    return b->ops->launch_paged(b, k->mod->impl, plan, args, (uint64_t)(uintptr_t)workspace,
                                stream, diag);
}

kpt_status kpt_blockmap_create(const kpt_kernel *k, const kpt_attention_args *args, void *stream,
                               kpt_blockmap **out, kpt_diag *diag)
{
    if (out)
        *out = NULL;
    if (!out)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT, "kpt_blockmap_create: out is NULL");
    kpt_status st = check_launch(k, args, diag);
    if (st)
        return st;
    kpt_backend *b = k->mod->ctx->backend;
    if (!k->mod->plan.has_blockmap || !b->ops->blockmap_build)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                            "pattern '%s' needs no block map on %s", k->mod->pattern->name,
                            b->target);
    kpt_blockmap *m = calloc(1, sizeof(*m));
    if (!m)
        return kpt_diag_set(diag, KPT_ERR_NO_MEMORY, "out of memory");
    m->mod = k->mod;
    st = b->ops->blockmap_size(b, k->mod->impl, args, &m->bytes, diag);
    if (!st)
        st = b->ops->mem_alloc(b, m->bytes, &m->mem, diag);
    if (!st) {
        int64_t d[4];
        map_dims(args, d);
        m->B = d[0], m->Hq = d[1], m->Sq = d[2], m->Skv = d[3];
        st = kpt_blockmap_update(m, args, stream, diag);
    }
    if (st) {
        kpt_blockmap_destroy(&m);
        return st;
    }
    *out = m;
    return KPT_OK;
}

kpt_status kpt_blockmap_update(kpt_blockmap *m, const kpt_attention_args *args, void *stream,
                               kpt_diag *diag)
{
    if (!m || !args)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT, "%s is NULL", !m ? "map" : "args");
    kpt_backend *b = m->mod->ctx->backend;
    size_t bytes = 0;
    kpt_status st = b->ops->blockmap_size(b, m->mod->impl, args, &bytes, diag);
    if (st)
        return st;
    int64_t d[4];
    map_dims(args, d);
    if (bytes != m->bytes || d[0] != m->B || d[1] != m->Hq || d[2] != m->Sq || d[3] != m->Skv)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                            "the block map was made for B=%lld Hq=%lld Sq=%lld Skv=%lld; make a "
                            "new one for other sizes", (long long)m->B, (long long)m->Hq,
                            (long long)m->Sq, (long long)m->Skv);
    return b->ops->blockmap_build(b, m->mod->impl, args, m->mem, stream, diag);
}

void kpt_blockmap_destroy(kpt_blockmap **mp)
{
    kpt_blockmap *m = mp ? *mp : NULL;
    if (!m)
        return;
    if (m->mem)
        m->mod->ctx->backend->ops->mem_free(m->mod->ctx->backend, m->mem);
    free(m);
    *mp = NULL;
}

/* ---- buffers -------------------------------------------------------------------------------- */

struct kpt_buffer {
    kpt_context *ctx;
    uint64_t mem;
    size_t size;
};

kpt_status kpt_buffer_create(kpt_context *ctx, size_t bytes, kpt_buffer **out, kpt_diag *diag)
{
    if (out)
        *out = NULL;
    if (!ctx || !out)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT, "kpt_buffer_create: %s is NULL",
                            !ctx ? "ctx" : "out");
    kpt_buffer *b = calloc(1, sizeof(*b));
    if (!b)
        return kpt_diag_set(diag, KPT_ERR_NO_MEMORY, "out of memory");
    kpt_status st = ctx->backend->ops->mem_alloc(ctx->backend, bytes, &b->mem, diag);
    if (st) {
        free(b);
        return st;
    }
    b->ctx = ctx;
    b->size = bytes;
    *out = b;
    return KPT_OK;
}

void kpt_buffer_destroy(kpt_buffer **bp)
{
    kpt_buffer *b = bp ? *bp : NULL;
    if (!b)
        return;
    b->ctx->backend->ops->mem_free(b->ctx->backend, b->mem);
    free(b);
    *bp = NULL;
}

void *kpt_buffer_data(const kpt_buffer *b)
{
    return b ? (void *)(uintptr_t)b->mem : NULL;
}

static kpt_status check_range(const kpt_buffer *b, size_t offset, const void *p, size_t n,
                              kpt_diag *diag)
{
    if (!b || (!p && n))
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT, "%s is NULL",
                            !b ? "buffer" : "host pointer");
    if (offset > b->size || n > b->size - offset)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                            "bytes %zu..%zu are outside the buffer of %zu bytes", offset,
                            offset + n, b->size);
    return KPT_OK;
}

kpt_status kpt_buffer_write(kpt_buffer *b, size_t offset, const void *src, size_t n,
                            kpt_diag *diag)
{
    kpt_status st = check_range(b, offset, src, n, diag);
    if (st || !n)
        return st;
    return b->ctx->backend->ops->mem_write(b->ctx->backend, b->mem + offset, src, n, diag);
}

kpt_status kpt_buffer_read(const kpt_buffer *b, size_t offset, void *dst, size_t n,
                           kpt_diag *diag)
{
    kpt_status st = check_range(b, offset, dst, n, diag);
    if (st || !n)
        return st;
    return b->ctx->backend->ops->mem_read(b->ctx->backend, dst, b->mem + offset, n, diag);
}

kpt_status kpt_context_synchronize(kpt_context *ctx, kpt_diag *diag)
{
    if (!ctx)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT, "ctx is NULL");
    return ctx->backend->ops->synchronize(ctx->backend, diag);
}

/* ---- bundles and statistics ------------------------------------------------------------------- */

kpt_status kpt_context_load_bundle(kpt_context *ctx, const char *path, int *loaded,
                                   kpt_diag *diag)
{
    if (loaded)
        *loaded = 0;
    if (!ctx || !path)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT, "kpt_context_load_bundle: %s is NULL",
                            !ctx ? "ctx" : "path");
    kpt_bundle b;
    kpt_status st = kpt_bundle_read(path, &b, diag);
    if (st)
        return st;
    int usable = 0;
    char other[64] = "";
    for (int i = 0; i < b.count; i++) {
        if (!strcmp(b.entries[i].target, ctx->backend->target))
            usable++;
        else if (!*other)
            snprintf(other, sizeof(other), "%s", b.entries[i].target);
    }
    if (!usable) {
        kpt_bundle_free(&b);
        return kpt_diag_set(diag, KPT_ERR_UNSUPPORTED,
                            "bundle '%s' holds no kernel for %s%s%s", path, ctx->backend->target,
                            *other ? " (it is for " : "", *other ? other : "");
    }
    pthread_mutex_lock(&ctx->lock);
    kpt_bundle *nb = realloc(ctx->bundles, (size_t)(ctx->num_bundles + 1) * sizeof(*nb));
    if (nb) {
        ctx->bundles = nb;
        ctx->bundles[ctx->num_bundles++] = b;
    }
    pthread_mutex_unlock(&ctx->lock);
    if (!nb) {
        kpt_bundle_free(&b);
        return kpt_diag_set(diag, KPT_ERR_NO_MEMORY, "out of memory");
    }
    kpt_log(&ctx->log, KPT_LOG_INFO, "bundle %s: %d kernels for %s", path, usable,
            ctx->backend->target);
    if (loaded)
        *loaded = usable;
    return KPT_OK;
}

kpt_status kpt_context_get_stats(const kpt_context *ctx, kpt_stats *out)
{
    if (!ctx || !out)
        return KPT_ERR_INVALID_ARGUMENT;
    kpt_context *c = (kpt_context *)ctx; /* the lock is not part of the logical state */
    pthread_mutex_lock(&c->lock);
    *out = c->stats;
    pthread_mutex_unlock(&c->lock);
    uint64_t hits = out->memory_hits + out->bundle_hits + out->disk_hits;
    out->hit_rate = out->requests ? (double)hits / (double)out->requests : 0;
    return KPT_OK;
}

typedef struct export_ctx {
    void (*fn)(void *user, const kpt_bundle_entry *entry);
    void *user;
} export_ctx;

static void export_one(void *user, void *value)
{
    export_ctx *e = user;
    module *m = value;
    if (!m->binary)
        return;
    kpt_bundle_entry be = {.key = m->bundle_key, .payload = m->binary, .size = m->binary_size};
    snprintf(be.target, sizeof(be.target), "%.15s", m->ctx->backend->target);
    snprintf(be.compiler, sizeof(be.compiler), "%.31s", m->ctx->backend->compiler);
    describe(m, be.description, sizeof(be.description));
    e->fn(e->user, &be);
}

void kpt_context_foreach_binary(kpt_context *ctx,
                                void (*fn)(void *user, const kpt_bundle_entry *entry), void *user)
{
    export_ctx e = {fn, user};
    kpt_kcache_foreach(ctx->modules, export_one, &e);
}
