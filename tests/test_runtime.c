/* The runtime API (include/kpt/runtime.h): contexts, kernels, launches on the CPU backend against
 * a hand-written attention, misuse of every entry point, and, where NVRTC is installed, offline
 * CUDA contexts: memory and disk cache hits (also across processes), an unwritable cache
 * directory, bundle round trips and every refusal, and `kptc bundle`; offline HIP contexts
 * (hipRTC or clang) and bundles for the HIP and Vulkan targets.
 *
 * Usage: test_runtime KPTC  (or test_runtime --child CACHE_DIR, used by the test itself) */
#include <dirent.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <kpt/kpt.h>

#include "runtime/bundle.h"
#include "runtime/context.h"
#include "runtime/disk_cache.h"
#include "vendor/rtc_nvrtc.h"
#include "tools/rng.h"
#include "tests/runtool.h"

static const char *kptc_path, *self_path;

typedef struct logbook {
    int warnings;
    char last[1024];
} logbook;

static void record(void *user, kpt_log_level level, const char *msg)
{
    logbook *lb = user;
    if (level <= KPT_LOG_WARN) {
        lb->warnings++;
        snprintf(lb->last, sizeof(lb->last), "%s", msg);
    }
}

static bool have_nvrtc(void)
{
    return kpt_nvrtc_version(NULL) > 0;
}

#define NEED_NVRTC()                                        \
    do {                                                    \
        if (!have_nvrtc()) {                                \
            print_message("NVRTC not found, skipping\n");   \
            skip();                                         \
        }                                                   \
    } while (0)

static char *temp_dir(void)
{
    char *d = strdup("/tmp/kpt_rt_XXXXXX");
    assert_non_null(mkdtemp(d));
    return d;
}

static void remove_dir(char *d)
{
    char cmd[256];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", d);
    assert_int_equal(system(cmd), 0);
    free(d);
}

static kpt_pattern *parse(const char *text)
{
    kpt_pattern *p = NULL;
    kpt_diag d = {0};
    if (kpt_pattern_parse(text, &p, &d))
        fail_msg("%s", d.message);
    return p;
}

static kpt_context *offline(const char *target, const char *cache_dir, logbook *lb)
{
    kpt_context_params cp = {.backend = KPT_BACKEND_CUDA, .target = target,
                             .flags = KPT_CONTEXT_OFFLINE | (cache_dir ? 0 : KPT_CONTEXT_NO_DISK_CACHE),
                             .cache_dir = cache_dir, .log = lb ? record : NULL, .log_user = lb};
    kpt_context *ctx = NULL;
    kpt_diag d = {0};
    if (kpt_context_create(&cp, &ctx, &d))
        fail_msg("%s", d.message);
    return ctx;
}

static kpt_stats stats(const kpt_context *ctx)
{
    kpt_stats s;
    assert_int_equal(kpt_context_get_stats(ctx, &s), KPT_OK);
    return s;
}

static kpt_kernel *get(kpt_context *ctx, kpt_pattern *p, kpt_dtype dt, int d)
{
    kpt_kernel_desc desc = {.dtype = dt, .head_dim = d};
    kpt_kernel *k = NULL;
    kpt_diag diag = {0};
    if (kpt_kernel_get(ctx, p, &desc, &k, &diag))
        fail_msg("%s", diag.message);
    return k;
}

/* ---- the CPU backend ------------------------------------------------------------------------ */

enum { B = 2, HQ = 4, HKV = 2, S = 37, D = 16 };

typedef struct problem {
    float q[B * HQ * S * D], k[B * HKV * S * D], v[B * HKV * S * D], o[B * HQ * S * D];
    float lse[B * HQ * S];
    kpt_attention_args a;
} problem;

static void problem_init(problem *pr, uint64_t seed)
{
    kpt_rng rng;
    kpt_rng_seed(&rng, seed);
    for (size_t i = 0; i < sizeof(pr->q) / 4; i++) pr->q[i] = (float)kpt_rng_normal(&rng);
    for (size_t i = 0; i < sizeof(pr->k) / 4; i++) pr->k[i] = (float)kpt_rng_normal(&rng);
    for (size_t i = 0; i < sizeof(pr->v) / 4; i++) pr->v[i] = (float)kpt_rng_normal(&rng);
    for (size_t i = 0; i < sizeof(pr->o) / 4; i++) pr->o[i] = NAN; /* poison */
    for (size_t i = 0; i < sizeof(pr->lse) / 4; i++) pr->lse[i] = NAN;
    pr->a = (kpt_attention_args){
        .q = kpt_tensor_contiguous(pr->q, KPT_DTYPE_F32, 4, (int64_t[]){B, HQ, S, D}),
        .k = kpt_tensor_contiguous(pr->k, KPT_DTYPE_F32, 4, (int64_t[]){B, HKV, S, D}),
        .v = kpt_tensor_contiguous(pr->v, KPT_DTYPE_F32, 4, (int64_t[]){B, HKV, S, D}),
        .o = kpt_tensor_contiguous(pr->o, KPT_DTYPE_F32, 4, (int64_t[]){B, HQ, S, D}),
        .lse = kpt_tensor_contiguous(pr->lse, KPT_DTYPE_F32, 3, (int64_t[]){B, HQ, S}),
    };
}

/* Causal attention written out plainly: the independent check of the CPU backend's launch. */
static void check_causal(const problem *pr)
{
    for (int b = 0; b < B; b++)
        for (int h = 0; h < HQ; h++)
            for (int i = 0; i < S; i++) {
                int hk = h / (HQ / HKV);
                const float *q = &pr->q[((b * HQ + h) * S + i) * D];
                double s[S], m = -INFINITY, sum = 0;
                for (int j = 0; j <= i; j++) {
                    const float *k = &pr->k[((b * HKV + hk) * S + j) * D];
                    s[j] = 0;
                    for (int d = 0; d < D; d++)
                        s[j] += (double)q[d] * k[d];
                    s[j] /= sqrt(D);
                    m = fmax(m, s[j]);
                }
                for (int j = 0; j <= i; j++)
                    sum += exp(s[j] - m);
                for (int d = 0; d < D; d++) {
                    double o = 0;
                    for (int j = 0; j <= i; j++)
                        o += exp(s[j] - m) / sum * pr->v[((b * HKV + hk) * S + j) * D + d];
                    assert_float_equal(pr->o[((b * HQ + h) * S + i) * D + d], o, 1e-5);
                }
                assert_float_equal(pr->lse[(b * HQ + h) * S + i], m + log(sum), 1e-5);
            }
}

static void test_cpu_backend(void **state)
{
    (void)state;
    kpt_context_params cp = {.backend = KPT_BACKEND_CPU};
    kpt_context *ctx = NULL;
    kpt_diag d = {0};
    assert_int_equal(kpt_context_create(&cp, &ctx, &d), KPT_OK);
    assert_int_equal(kpt_context_backend(ctx), KPT_BACKEND_CPU);
    assert_string_equal(kpt_context_target(ctx), "cpu");
    assert_string_equal(kpt_backend_name(KPT_BACKEND_CPU), "cpu");
    kpt_pattern *p = parse("causal");
    kpt_kernel *k = get(ctx, p, KPT_DTYPE_F32, D);
    kpt_pattern_destroy(&p); /* the kernel keeps its own copy */
    assert_int_equal(kpt_kernel_needs_blockmap(k), 0);
    static problem pr;
    problem_init(&pr, 7);
    assert_int_equal(kpt_kernel_launch(k, &pr.a, NULL, NULL, &d), KPT_OK);
    check_causal(&pr);
    kpt_kernel_info info;
    assert_int_equal(kpt_kernel_get_info(k, &info), KPT_OK);
    assert_string_equal(info.pattern, "causal");
    assert_string_equal(info.source, "none");
    assert_int_equal(info.desc.head_dim_v, D);
    /* the same request again: a memory hit, the same kernel */
    p = parse("causal");
    assert_ptr_equal(get(ctx, p, KPT_DTYPE_F32, D), k);
    kpt_pattern_destroy(&p);
    kpt_stats s = stats(ctx);
    assert_int_equal(s.requests, 2);
    assert_int_equal(s.memory_hits, 1);
    assert_int_equal(s.compiles, 0);
    assert_float_equal(s.hit_rate, 0.5, 1e-12);
    /* sizes whose rounding wraps are refused, not allocated small */
    kpt_buffer *huge = NULL;
    assert_int_equal(kpt_buffer_create(ctx, SIZE_MAX - 10, &huge, &d), KPT_ERR_NO_MEMORY);
    assert_null(huge);
    /* shapes whose element count overflows int64 give rank 0 */
    const int64_t big[4] = {1 << 24, 1 << 24, 1 << 24, 1 << 24};
    assert_int_equal(kpt_tensor_contiguous(NULL, KPT_DTYPE_F32, 4, big).rank, 0);
    const int64_t neg[2] = {4, -1};
    assert_int_equal(kpt_tensor_contiguous(NULL, KPT_DTYPE_F32, 2, neg).rank, 0);
    kpt_context_destroy(&ctx);
    assert_null(ctx);
}

static void test_auto_backend(void **state)
{
    (void)state;
    logbook lb = {0};
    kpt_context_params cp = {.log = record, .log_user = &lb,
                             .flags = KPT_CONTEXT_NO_DISK_CACHE};
    kpt_context *ctx = NULL;
    kpt_diag d = {0};
    assert_int_equal(kpt_context_create(&cp, &ctx, &d), KPT_OK);
    if (kpt_context_backend(ctx) == KPT_BACKEND_CPU) {
        assert_int_equal(lb.warnings, 1); /* says it fell back, once */
        assert_non_null(strstr(lb.last, "no GPU backend"));
    } else {
        assert_int_equal(kpt_context_backend(ctx), KPT_BACKEND_CUDA);
    }
    kpt_context_destroy(&ctx);
    kpt_context_destroy(&ctx); /* NULL is fine */
    kpt_context_destroy(NULL);
}

#define EXPECT(status, call, text)                                                     \
    do {                                                                               \
        kpt_diag d_ = {0};                                                             \
        kpt_status st_ = (call);                                                       \
        if (st_ != (status) || !strstr(d_.message, (text)))                            \
            fail_msg("%s: got %d '%s', expected %d '%s'", #call, st_, d_.message,      \
                     (status), (text));                                                \
    } while (0)
#define DIAG (&d_)

static void test_context_misuse(void **state)
{
    (void)state;
    kpt_context *ctx = (kpt_context *)1;
    EXPECT(KPT_ERR_INVALID_ARGUMENT, kpt_context_create(NULL, NULL, DIAG), "out is NULL");
    kpt_context_params bad = {.backend = (kpt_backend_kind)42};
    EXPECT(KPT_ERR_INVALID_ARGUMENT, kpt_context_create(&bad, &ctx, DIAG), "unknown backend");
    assert_null(ctx);
    bad = (kpt_context_params){.device = -1};
    EXPECT(KPT_ERR_INVALID_ARGUMENT, kpt_context_create(&bad, &ctx, DIAG), "negative");
    bad = (kpt_context_params){.flags = 1u << 9};
    EXPECT(KPT_ERR_INVALID_ARGUMENT, kpt_context_create(&bad, &ctx, DIAG), "flags");
    bad = (kpt_context_params){.log_level = (kpt_log_level)9};
    EXPECT(KPT_ERR_INVALID_ARGUMENT, kpt_context_create(&bad, &ctx, DIAG), "log level");
    /* no ROCm, ROCm without an AMD GPU (CI), or no device 99: the same status */
    bad = (kpt_context_params){.backend = KPT_BACKEND_HIP, .device = 99};
    EXPECT(KPT_ERR_NO_DEVICE, kpt_context_create(&bad, &ctx, DIAG), "HIP");
    bad = (kpt_context_params){.backend = KPT_BACKEND_HIP, .target = "hip:gfx1100"};
    EXPECT(KPT_ERR_INVALID_ARGUMENT, kpt_context_create(&bad, &ctx, DIAG),
           "expected hip:gfx90a");
    bad = (kpt_context_params){.backend = KPT_BACKEND_HIP, .flags = KPT_CONTEXT_OFFLINE};
    EXPECT(KPT_ERR_INVALID_ARGUMENT, kpt_context_create(&bad, &ctx, DIAG), "needs a target");
    bad = (kpt_context_params){.backend = KPT_BACKEND_VULKAN, .target = "cuda:sm_90"};
    EXPECT(KPT_ERR_INVALID_ARGUMENT, kpt_context_create(&bad, &ctx, DIAG), "('spirv')");
    /* no loader, no driver, or (lavapipe in CI) no device 99: the same status */
    bad = (kpt_context_params){.backend = KPT_BACKEND_VULKAN, .device = 99};
    EXPECT(KPT_ERR_NO_DEVICE, kpt_context_create(&bad, &ctx, DIAG), "Vulkan");
    bad = (kpt_context_params){.backend = KPT_BACKEND_CPU, .flags = KPT_CONTEXT_OFFLINE};
    EXPECT(KPT_ERR_INVALID_ARGUMENT, kpt_context_create(&bad, &ctx, DIAG), "OFFLINE");
    bad = (kpt_context_params){.backend = KPT_BACKEND_CPU, .device = 3};
    EXPECT(KPT_ERR_NO_DEVICE, kpt_context_create(&bad, &ctx, DIAG), "one device");
    bad = (kpt_context_params){.backend = KPT_BACKEND_CPU, .target = "cuda:sm_90"};
    EXPECT(KPT_ERR_INVALID_ARGUMENT, kpt_context_create(&bad, &ctx, DIAG), "target");
    bad = (kpt_context_params){.backend = KPT_BACKEND_CUDA, .flags = KPT_CONTEXT_OFFLINE};
    EXPECT(KPT_ERR_INVALID_ARGUMENT, kpt_context_create(&bad, &ctx, DIAG), "needs a target");
    bad = (kpt_context_params){.backend = KPT_BACKEND_CUDA, .flags = KPT_CONTEXT_OFFLINE,
                               .target = "cuda:sm_75"};
    EXPECT(KPT_ERR_INVALID_ARGUMENT, kpt_context_create(&bad, &ctx, DIAG), "sm_75");
    assert_null(ctx);
    kpt_stats s;
    assert_int_equal(kpt_context_get_stats(NULL, &s), KPT_ERR_INVALID_ARGUMENT);
    assert_int_equal(kpt_kernel_get_info(NULL, NULL), KPT_ERR_INVALID_ARGUMENT);
    assert_int_equal(kpt_kernel_needs_blockmap(NULL), 0);
    EXPECT(KPT_ERR_INVALID_ARGUMENT, kpt_context_load_bundle(NULL, "x", NULL, DIAG), "NULL");
    kpt_blockmap_destroy(NULL);
    for (int i = -12; i <= 0; i++)
        assert_non_null(kpt_status_string((kpt_status)i));
}

static void test_kernel_misuse(void **state)
{
    (void)state;
    kpt_context_params cp = {.backend = KPT_BACKEND_CPU};
    kpt_context *ctx = NULL;
    assert_int_equal(kpt_context_create(&cp, &ctx, NULL), KPT_OK);
    kpt_pattern *p = parse("causal");
    kpt_kernel *k = (kpt_kernel *)1;
    kpt_kernel_desc desc = {.dtype = KPT_DTYPE_F32, .head_dim = D};
    EXPECT(KPT_ERR_INVALID_ARGUMENT, kpt_kernel_get(NULL, p, &desc, &k, DIAG), "ctx is NULL");
    assert_null(k);
    EXPECT(KPT_ERR_INVALID_ARGUMENT, kpt_kernel_get(ctx, NULL, &desc, &k, DIAG), "pattern");
    EXPECT(KPT_ERR_INVALID_ARGUMENT, kpt_kernel_get(ctx, p, NULL, &k, DIAG), "desc");
    EXPECT(KPT_ERR_INVALID_ARGUMENT, kpt_kernel_get(ctx, p, &desc, NULL, DIAG), "out");
    kpt_kernel_desc bad = {.dtype = KPT_DTYPE_I32, .head_dim = D};
    EXPECT(KPT_ERR_INVALID_ARGUMENT, kpt_kernel_get(ctx, p, &bad, &k, DIAG), "dtype");
    bad = (kpt_kernel_desc){.dtype = KPT_DTYPE_F32};
    EXPECT(KPT_ERR_INVALID_ARGUMENT, kpt_kernel_get(ctx, p, &bad, &k, DIAG), "head_dim");
    bad = (kpt_kernel_desc){.dtype = KPT_DTYPE_F32, .head_dim = D, .num_heads_q = 6,
                            .num_heads_kv = 4};
    EXPECT(KPT_ERR_INVALID_ARGUMENT, kpt_kernel_get(ctx, p, &bad, &k, DIAG), "multiple");
    bad = (kpt_kernel_desc){.dtype = KPT_DTYPE_F32, .head_dim = D, .options = 4};
    EXPECT(KPT_ERR_INVALID_ARGUMENT, kpt_kernel_get(ctx, p, &bad, &k, DIAG), "options");
    kpt_stats s = stats(ctx);
    assert_int_equal(s.failures, 4); /* the NULL-argument calls are not requests */

    /* launches: every argument checked */
    k = get(ctx, p, KPT_DTYPE_F32, D);
    static problem pr;
    problem_init(&pr, 3);
    EXPECT(KPT_ERR_INVALID_ARGUMENT, kpt_kernel_launch(NULL, &pr.a, NULL, NULL, DIAG), "NULL");
    EXPECT(KPT_ERR_INVALID_ARGUMENT, kpt_kernel_launch(k, NULL, NULL, NULL, DIAG), "NULL");
    kpt_attention_args a = pr.a;
    a.q.dtype = KPT_DTYPE_F16;
    EXPECT(KPT_ERR_INVALID_ARGUMENT, kpt_kernel_launch(k, &a, NULL, NULL, DIAG), "tensor q");
    a = pr.a;
    a.k.shape[3] = 8;
    a.k.stride[2] = 8;
    EXPECT(KPT_ERR_INVALID_ARGUMENT, kpt_kernel_launch(k, &a, NULL, NULL, DIAG), "head dim");
    a = pr.a;
    a.q.shape[1] = 3; /* 3 query heads over 2 kv heads */
    EXPECT(KPT_ERR_INVALID_ARGUMENT, kpt_kernel_launch(k, &a, NULL, NULL, DIAG), "");
    a = pr.a;
    a.v.data = NULL;
    EXPECT(KPT_ERR_INVALID_ARGUMENT, kpt_kernel_launch(k, &a, NULL, NULL, DIAG), "v");
    a = pr.a;
    kpt_scalar_value sv = {"nope", 1};
    a.scalars = &sv;
    a.num_scalars = 1;
    EXPECT(KPT_ERR_NOT_FOUND, kpt_kernel_launch(k, &a, NULL, NULL, DIAG), "nope");
    kpt_blockmap *map = (kpt_blockmap *)1;
    EXPECT(KPT_ERR_INVALID_ARGUMENT, kpt_blockmap_create(k, &pr.a, NULL, &map, DIAG),
           "needs no block map");
    assert_null(map);
    for (size_t i = 0; i < sizeof(pr.o) / 4; i++) /* nothing was written by failed launches */
        assert_true(isnan(pr.o[i]));

    /* a kernel made for fixed head counts checks them */
    kpt_kernel_desc fixed = {.dtype = KPT_DTYPE_F32, .head_dim = D, .num_heads_q = 8,
                             .num_heads_kv = 2};
    kpt_kernel *kf;
    assert_int_equal(kpt_kernel_get(ctx, p, &fixed, &kf, NULL), KPT_OK);
    assert_ptr_not_equal(kf, k);
    EXPECT(KPT_ERR_INVALID_ARGUMENT, kpt_kernel_launch(kf, &pr.a, NULL, NULL, DIAG),
           "made for 8");

    /* aux tensors and scalars: missing, mismatched, unknown */
    kpt_pattern *doc = parse("document+sliding_window($w)");
    kpt_kernel *kd = get(ctx, doc, KPT_DTYPE_F32, D);
    EXPECT(KPT_ERR_INVALID_ARGUMENT, kpt_kernel_launch(kd, &pr.a, NULL, NULL, DIAG), "'$w'");
    int32_t ids[B * S] = {0};
    kpt_aux_tensor aux[2] = {
        {"doc_q", kpt_tensor_contiguous(ids, KPT_DTYPE_I32, 2, (int64_t[]){B, S})},
        {"doc_kv", kpt_tensor_contiguous(ids, KPT_DTYPE_I32, 2, (int64_t[]){B, S - 1})},
    };
    kpt_scalar_value w = {"w", 8};
    a = pr.a;
    a.scalars = &w;
    a.num_scalars = 1;
    kpt_diag miss = {0};
    assert_int_not_equal(kpt_kernel_launch(kd, &a, NULL, NULL, &miss), KPT_OK);
    assert_non_null(strstr(miss.message, "doc_"));
    a.aux = aux;
    a.num_aux = 2;
    EXPECT(KPT_ERR_INVALID_ARGUMENT, kpt_kernel_launch(kd, &a, NULL, NULL, DIAG), "doc_kv");
    aux[1].tensor.shape[1] = S;
    aux[0].tensor.dtype = KPT_DTYPE_F32;
    EXPECT(KPT_ERR_INVALID_ARGUMENT, kpt_kernel_launch(kd, &a, NULL, NULL, DIAG), "doc_q");
    aux[0].tensor.dtype = KPT_DTYPE_I32;
    assert_int_equal(kpt_kernel_launch(kd, &a, NULL, NULL, NULL), KPT_OK);
    kpt_pattern_destroy(&doc);
    kpt_pattern_destroy(&p);
    kpt_context_destroy(&ctx);
}

/* ---- offline CUDA contexts: caches and bundles (NVRTC only, no GPU) --------------------------- */

/* The serving calls' refusals through the public API (CPU backend). */
static void test_paged_misuse(void **state)
{
    (void)state;
    kpt_context_params cp = {.backend = KPT_BACKEND_CPU};
    kpt_context *ctx = NULL;
    assert_int_equal(kpt_context_create(&cp, &ctx, NULL), KPT_OK);
    kpt_pattern *p = parse("causal");
    kpt_kernel *pk = NULL, *fk = get(ctx, p, KPT_DTYPE_F32, D);
    kpt_kernel_desc desc = {.dtype = KPT_DTYPE_F32, .head_dim = D,
                            .options = KPT_DESC_PAGED | KPT_DESC_BACKWARD};
    EXPECT(KPT_ERR_UNSUPPORTED, kpt_kernel_get(ctx, p, &desc, &pk, DIAG), "no backward");
    desc.options = KPT_DESC_PAGED;
    assert_int_equal(kpt_kernel_get(ctx, p, &desc, &pk, NULL), KPT_OK);
    int32_t cu[3] = {0, 1, 3}, kv[2] = {5, 2};
    kpt_paged_shape sh = {.batch = 2, .cu_seqlens_q = cu, .kv_lens = kv, .num_heads_q = 4,
                          .num_heads_kv = 2};
    kpt_paged_plan plan;
    EXPECT(KPT_ERR_INVALID_ARGUMENT, kpt_paged_plan_make(fk, &sh, &plan, DIAG),
           "not a serving kernel");
    kv[1] = 1;
    EXPECT(KPT_ERR_INVALID_ARGUMENT, kpt_paged_plan_make(pk, &sh, &plan, DIAG),
           "sequence 1 has 2 queries but 1 keys");
    kv[1] = 2;
    cu[0] = 1;
    EXPECT(KPT_ERR_INVALID_ARGUMENT, kpt_paged_plan_make(pk, &sh, &plan, DIAG), "must be 0");
    cu[0] = 0;
    sh.num_heads_q = 5;
    EXPECT(KPT_ERR_INVALID_ARGUMENT, kpt_paged_plan_make(pk, &sh, &plan, DIAG), "multiple");
    sh.num_heads_q = 4;
    assert_int_equal(kpt_paged_plan_make(pk, &sh, &plan, NULL), KPT_OK);
    EXPECT(KPT_ERR_INVALID_ARGUMENT, kpt_paged_run(pk, &plan, NULL, NULL, 0, NULL, DIAG),
           "args is NULL");
    /* a call of another batch size than the plan's */
    static float q[3 * 4 * D], o[3 * 4 * D], kc[2 * 8 * 2 * D];
    int32_t cu1[2] = {0, 3}, kv1[1] = {5};
    kpt_paged_args a = {
        .q = kpt_tensor_contiguous(q, KPT_DTYPE_F32, 3, (int64_t[]){3, 4, D}),
        .o = kpt_tensor_contiguous(o, KPT_DTYPE_F32, 3, (int64_t[]){3, 4, D}),
        .k = kpt_tensor_contiguous(kc, KPT_DTYPE_F32, 4, (int64_t[]){2, 8, 2, D}),
        .v = kpt_tensor_contiguous(kc, KPT_DTYPE_F32, 4, (int64_t[]){2, 8, 2, D}),
        .cu_seqlens_q = kpt_tensor_contiguous(cu1, KPT_DTYPE_I32, 1, (int64_t[]){2}),
        .kv_lens = kpt_tensor_contiguous(kv1, KPT_DTYPE_I32, 1, (int64_t[]){1}),
    };
    EXPECT(KPT_ERR_INVALID_ARGUMENT, kpt_paged_run(pk, &plan, &a, NULL, 0, NULL, DIAG),
           "the plan is for B=2");
    EXPECT(KPT_ERR_INVALID_ARGUMENT, kpt_paged_run(fk, &plan, &a, NULL, 0, NULL, DIAG),
           "not a serving kernel");
    static problem pr;
    problem_init(&pr, 4);
    EXPECT(KPT_ERR_INVALID_ARGUMENT, kpt_kernel_launch(pk, &pr.a, NULL, NULL, DIAG),
           "serving kernel");
    kpt_pattern_destroy(&p);
    kpt_context_destroy(&ctx);
}

/* A Vulkan context without the disk cache (lavapipe in CI); the test is skipped without one. */
static kpt_context *vulkan_or_skip(void)
{
    kpt_context_params cp = {.backend = KPT_BACKEND_VULKAN, .flags = KPT_CONTEXT_NO_DISK_CACHE};
    kpt_context *ctx = NULL;
    if (kpt_context_create(&cp, &ctx, NULL))
        skip();
    return ctx;
}

/* Vulkan binds each tensor's own window of its buffer (skipped without a device): tensors past
 * the device's storage-buffer range from their buffer's start (lavapipe's is 128 MiB) run and
 * match the CPU reference; on lavapipe, a tensor whose own span is past the range is refused
 * saying so. */
static void test_vulkan_buffer_windows(void **state)
{
    (void)state;
    kpt_context *ctx = vulkan_or_skip();
    enum { WS = 64, WD = 64, N = WS * WD };
    const size_t at = (size_t)150 << 20, bytes = at + 4 * N * sizeof(float);
    kpt_buffer *b = NULL;
    assert_int_equal(kpt_buffer_create(ctx, bytes, &b, NULL), KPT_OK);
    float *h = malloc(4 * N * sizeof(float));
    double *ref = malloc(N * sizeof(double));
    assert_non_null(h);
    assert_non_null(ref);
    for (int i = 0; i < 3 * N; i++)
        h[i] = (float)((unsigned)i * 2654435761u % 1000u) / 500.0f - 1.0f;
    assert_int_equal(kpt_buffer_write(b, at, h, 3 * N * sizeof(float), NULL), KPT_OK);
    char *base = kpt_buffer_data(b);
    const int64_t shape[4] = {1, 1, WS, WD};
    kpt_attention_args a = {0}, r = {0};
    kpt_tensor *dev[4] = {&a.q, &a.k, &a.v, &a.o}, *host[3] = {&r.q, &r.k, &r.v};
    for (int i = 0; i < 4; i++)
        *dev[i] = kpt_tensor_contiguous(base + at + (size_t)i * N * sizeof(float), KPT_DTYPE_F32,
                                        4, shape);
    for (int i = 0; i < 3; i++)
        *host[i] = kpt_tensor_contiguous(h + i * N, KPT_DTYPE_F32, 4, shape);
    r.o = kpt_tensor_contiguous(ref, KPT_DTYPE_F64, 4, shape);
    kpt_pattern *p = parse("causal");
    kpt_kernel *k = NULL;
    kpt_kernel_desc desc = {.dtype = KPT_DTYPE_F32, .head_dim = WD};
    assert_int_equal(kpt_kernel_get(ctx, p, &desc, &k, NULL), KPT_OK);
    assert_int_equal(kpt_kernel_launch(k, &a, NULL, NULL, NULL), KPT_OK);
    assert_int_equal(kpt_buffer_read(b, at + 3 * N * sizeof(float), h + 3 * N,
                                     N * sizeof(float), NULL),
                     KPT_OK);
    assert_int_equal(kpt_reference_attention(p, &r, NULL), KPT_OK);
    for (int i = 0; i < N; i++)
        assert_true(fabs(h[3 * N + i] - ref[i]) < 1e-4);
    if (strstr(kpt_context_device_name(ctx), "llvmpipe")) {
        /* two rows 144 MiB apart: one tensor wider than one binding can reach */
        a.q = kpt_tensor_contiguous(base, KPT_DTYPE_F32, 4, (const int64_t[]){1, 1, 2, WD});
        a.q.stride[2] = (int64_t)36 << 20;
        a.k = a.v = a.o = a.q;
        EXPECT(KPT_ERR_LIMIT, kpt_kernel_launch(k, &a, NULL, NULL, DIAG),
               "maxStorageBufferRange");
    }
    free(h);
    free(ref);
    kpt_buffer_destroy(&b);
    kpt_pattern_destroy(&p);
    kpt_context_destroy(&ctx);
}

/* Vulkan serving plans (lavapipe in CI; skipped without a device): long sequences split over the
 * keys with a workspace, and on llvmpipe, lengths past what its loop limit allows in 256 parts
 * refused at plan time with the number it takes. */
static void test_vulkan_paged_plans(void **state)
{
    (void)state;
    kpt_context *ctx = vulkan_or_skip();
    kpt_pattern *p = parse("causal");
    kpt_kernel *k = NULL;
    kpt_kernel_desc desc = {.dtype = KPT_DTYPE_F16, .head_dim = 64, .options = KPT_DESC_PAGED};
    assert_int_equal(kpt_kernel_get(ctx, p, &desc, &k, NULL), KPT_OK);
    kpt_paged_shape sh = {.batch = 1, .max_q = 1, .max_kv = 300000, .num_heads_q = 32,
                          .num_heads_kv = 8};
    kpt_paged_plan plan;
    assert_int_equal(kpt_paged_plan_make(k, &sh, &plan, NULL), KPT_OK);
    assert_true(plan.splits > 1 && plan.splits <= 256);
    /* f32 O of 64 columns and an LSE per row (32 a block) and part, the LSEs 256-aligned */
    const size_t slots = (size_t)plan.splits * 8 * 32;
    assert_int_equal(plan.workspace_bytes, ((slots * 64 * 4 + 255) & ~(size_t)255) + slots * 4);
    sh.max_kv = 4;
    assert_int_equal(kpt_paged_plan_make(k, &sh, &plan, NULL), KPT_OK);
    assert_int_equal(plan.splits, 1);
    assert_int_equal(plan.workspace_bytes, 0);
    if (strstr(kpt_context_device_name(ctx), "llvmpipe")) {
        sh.max_kv = 2000000000;
        EXPECT(KPT_ERR_LIMIT, kpt_paged_plan_make(k, &sh, &plan, DIAG), "takes at most");
    }
    /* a split run: a workspace short of the plan's is refused before anything runs; without one
     * the backend takes a temporary buffer (paged_check checks the results) */
    sh.max_kv = 300000;
    assert_int_equal(kpt_paged_plan_make(k, &sh, &plan, NULL), KPT_OK);
    kpt_buffer *q, *kv, *o, *cu, *lens, *ws;
    const int32_t cu_h[2] = {0, 1}, kv_h[1] = {8};
    assert_int_equal(kpt_buffer_create(ctx, 32 * 64 * 2, &q, NULL), KPT_OK);
    assert_int_equal(kpt_buffer_create(ctx, 8 * 8 * 64 * 2, &kv, NULL), KPT_OK);
    assert_int_equal(kpt_buffer_create(ctx, 32 * 64 * 2, &o, NULL), KPT_OK);
    assert_int_equal(kpt_buffer_create(ctx, sizeof(cu_h), &cu, NULL), KPT_OK);
    assert_int_equal(kpt_buffer_create(ctx, sizeof(kv_h), &lens, NULL), KPT_OK);
    assert_int_equal(kpt_buffer_create(ctx, plan.workspace_bytes, &ws, NULL), KPT_OK);
    assert_int_equal(kpt_buffer_write(cu, 0, cu_h, sizeof(cu_h), NULL), KPT_OK);
    assert_int_equal(kpt_buffer_write(lens, 0, kv_h, sizeof(kv_h), NULL), KPT_OK);
    const kpt_tensor cache = kpt_tensor_contiguous(kpt_buffer_data(kv), KPT_DTYPE_F16, 4,
                                                   (int64_t[]){1, 8, 8, 64});
    const kpt_paged_args a = {
        .q = kpt_tensor_contiguous(kpt_buffer_data(q), KPT_DTYPE_F16, 3, (int64_t[]){1, 32, 64}),
        .o = kpt_tensor_contiguous(kpt_buffer_data(o), KPT_DTYPE_F16, 3, (int64_t[]){1, 32, 64}),
        .k = cache,
        .v = cache,
        .cu_seqlens_q = kpt_tensor_contiguous(kpt_buffer_data(cu), KPT_DTYPE_I32, 1,
                                              (int64_t[]){2}),
        .kv_lens = kpt_tensor_contiguous(kpt_buffer_data(lens), KPT_DTYPE_I32, 1,
                                         (int64_t[]){1}),
    };
    EXPECT(KPT_ERR_INVALID_ARGUMENT,
           kpt_paged_run(k, &plan, &a, kpt_buffer_data(ws), plan.workspace_bytes - 4, NULL, DIAG),
           "workspace of");
    assert_int_equal(kpt_paged_run(k, &plan, &a, NULL, 0, NULL, NULL), KPT_OK);
    kpt_buffer *all[] = {q, kv, o, cu, lens, ws};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
        kpt_buffer_destroy(&all[i]);
    kpt_pattern_destroy(&p);
    kpt_context_destroy(&ctx);
}

static void test_offline_caches(void **state)
{
    (void)state;
    NEED_NVRTC();
    char *dir = temp_dir();
    logbook lb = {0};
    kpt_pattern *p = parse("causal+softcap($c=30)");
    kpt_context *ctx = offline("cuda:sm_80", dir, &lb);
    assert_string_equal(kpt_context_target(ctx), "cuda:sm_80");
    kpt_kernel *k = get(ctx, p, KPT_DTYPE_BF16, 64);
    assert_ptr_equal(get(ctx, p, KPT_DTYPE_BF16, 64), k);
    kpt_stats s = stats(ctx);
    assert_int_equal(s.compiles, 1);
    assert_int_equal(s.memory_hits, 1);
    assert_true(s.compile_ms_total > 0 && s.compile_ms_max == s.compile_ms_total);
    kpt_kernel_info info;
    kpt_kernel_get_info(k, &info);
    assert_string_equal(info.source, "compiled");
    assert_true(info.tile_q > 0 && info.shared_bytes > 0);
    /* compiled offline: cannot run */
    static problem pr;
    problem_init(&pr, 1);
    EXPECT(KPT_ERR_UNSUPPORTED, kpt_kernel_launch(k, &pr.a, NULL, NULL, DIAG), "offline");
    kpt_context_destroy(&ctx);

    /* a new context (and a new process) finds it on disk */
    ctx = offline("cuda:sm_80", dir, &lb);
    k = get(ctx, p, KPT_DTYPE_BF16, 64);
    kpt_kernel_get_info(k, &info);
    assert_string_equal(info.source, "disk");
    s = stats(ctx);
    assert_int_equal(s.disk_hits, 1);
    assert_int_equal(s.compiles, 0);
    /* another target, dtype or head dim is another kernel */
    get(ctx, p, KPT_DTYPE_F16, 64);
    assert_int_equal(stats(ctx).compiles, 1);
    kpt_context_destroy(&ctx);
    const char *argv[] = {self_path, "--child", dir, NULL};
    static tool_result r; /* large */
    assert_true(tool_run(&r, argv));
    if (r.status || !strstr(r.out, "compiles=0 disk_hits=1"))
        fail_msg("child: %d %s %s", r.status, r.out, r.err);
    assert_int_equal(lb.warnings, 0);
    kpt_pattern_destroy(&p);
    remove_dir(dir);
}

/* The child process of test_offline_caches: the same request through the disk cache. */
static int child(const char *dir)
{
    kpt_pattern *p = NULL;
    kpt_context *ctx = NULL;
    kpt_context_params cp = {.backend = KPT_BACKEND_CUDA, .target = "cuda:sm_80",
                             .flags = KPT_CONTEXT_OFFLINE, .cache_dir = dir};
    kpt_kernel_desc desc = {.dtype = KPT_DTYPE_BF16, .head_dim = 64};
    kpt_kernel *k;
    if (kpt_pattern_parse("causal+softcap($c=30)", &p, NULL) ||
        kpt_context_create(&cp, &ctx, NULL) || kpt_kernel_get(ctx, p, &desc, &k, NULL))
        return 1;
    kpt_stats s;
    kpt_context_get_stats(ctx, &s);
    printf("compiles=%llu disk_hits=%llu\n", (unsigned long long)s.compiles,
           (unsigned long long)s.disk_hits);
    kpt_context_destroy(&ctx);
    kpt_pattern_destroy(&p);
    return 0;
}

/* A live Vulkan context (lavapipe in CI) with a disk cache in `dir`, or NULL without a device. */
static kpt_context *vulkan_with_cache(const char *dir, logbook *lb)
{
    kpt_context_params cp = {.backend = KPT_BACKEND_VULKAN, .cache_dir = dir, .log = record,
                             .log_user = lb};
    kpt_context *ctx = NULL;
    return kpt_context_create(&cp, &ctx, NULL) ? NULL : ctx;
}

/* The key of the only entry in a cache directory (from its name). */
static kpt_key only_entry(const char *dir)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    kpt_key k;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strlen(e->d_name) != 36 || strcmp(e->d_name + 32, ".kpt"))
            continue;
        for (int i = 0; i < 16; i++) {
            unsigned v;
            sscanf(e->d_name + 2 * i, "%2x", &v);
            k.b[i] = (uint8_t)v;
        }
        n++;
    }
    closedir(d);
    assert_int_equal(n, 1);
    return k;
}

/* A disk entry with sound checksums whose payload the backend refuses is recompiled and
 * replaced, not an error in every process from then on. */
static void test_disk_entry_that_will_not_load(void **state)
{
    (void)state;
    char *dir = temp_dir();
    logbook lb = {0};
    kpt_context *ctx = vulkan_with_cache(dir, &lb);
    if (!ctx) {
        remove_dir(dir);
        skip();
    }
    kpt_pattern *p = parse("causal");
    get(ctx, p, KPT_DTYPE_F32, 16);
    assert_int_equal(stats(ctx).compiles, 1);
    kpt_context_destroy(&ctx);
    kpt_key key = only_entry(dir);
    kpt_disk_cache *c = kpt_disk_cache_open(dir, 1 << 30, NULL);
    kpt_disk_cache_put(c, &key, "no kernel in here", 17);
    kpt_disk_cache_close(&c);
    ctx = vulkan_with_cache(dir, &lb);
    kpt_kernel *k = get(ctx, p, KPT_DTYPE_F32, 16);
    kpt_kernel_info info;
    kpt_kernel_get_info(k, &info);
    assert_string_equal(info.source, "compiled");
    assert_int_equal(stats(ctx).compiles, 1);
    assert_non_null(strstr(lb.last, "would not load"));
    kpt_context_destroy(&ctx);
    /* the entry was replaced: the next context finds a good one */
    ctx = vulkan_with_cache(dir, &lb);
    get(ctx, p, KPT_DTYPE_F32, 16);
    assert_int_equal(stats(ctx).disk_hits, 1);
    assert_int_equal(stats(ctx).compiles, 0);
    kpt_context_destroy(&ctx);
    kpt_pattern_destroy(&p);
    remove_dir(dir);
}

static void test_unwritable_cache(void **state)
{
    (void)state;
    NEED_NVRTC();
    char *dir = temp_dir(), file[128], cache[160];
    snprintf(file, sizeof(file), "%s/file", dir);
    fclose(fopen(file, "w"));
    snprintf(cache, sizeof(cache), "%s/cache", file);
    logbook lb = {0};
    kpt_context *ctx = offline("cuda:sm_80", cache, &lb);
    kpt_pattern *p = parse("causal");
    get(ctx, p, KPT_DTYPE_BF16, 64);
    get(ctx, p, KPT_DTYPE_F16, 64);
    assert_int_equal(stats(ctx).compiles, 2);
    assert_int_equal(lb.warnings, 1); /* said once */
    assert_non_null(strstr(lb.last, "disk cache disabled"));
    kpt_context_destroy(&ctx);
    kpt_pattern_destroy(&p);
    remove_dir(dir);
}

typedef struct entries {
    kpt_bundle_entry v[16];
    void *copies[16];
    int n;
} entries;

static void keep(void *user, const kpt_bundle_entry *e)
{
    entries *es = user;
    assert_true(es->n < 16);
    es->copies[es->n] = malloc(e->size);
    memcpy(es->copies[es->n], e->payload, e->size);
    es->v[es->n] = *e;
    es->v[es->n].payload = es->copies[es->n];
    es->n++;
}

static uint8_t *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc(*n + 1);
    assert_int_equal(fread(b, 1, *n, f), *n);
    fclose(f);
    return b;
}

static void spit(const char *path, const uint8_t *b, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_int_equal(fwrite(b, 1, n, f), n);
    fclose(f);
}

/* Recomputes the bundle's checksums after an edit, so the edit itself is what gets refused. */
static void reseal(uint8_t *b, size_t n)
{
    kpt_put_u64le(b + 40, kpt_checksum(b + KPT_BUNDLE_HEADER, n - KPT_BUNDLE_HEADER));
    kpt_put_u64le(b + 48, kpt_checksum(b, 48));
}

static void refuse(kpt_context *ctx, const char *path, const uint8_t *good, size_t n,
                   void (*edit)(uint8_t *b, size_t *n), const char *why)
{
    uint8_t *b = malloc(n + 16);
    memcpy(b, good, n);
    size_t m = n;
    edit(b, &m);
    spit(path, b, m);
    free(b);
    int loaded = -1;
    EXPECT(why[0] == '!' ? KPT_ERR_UNSUPPORTED : KPT_ERR_INVALID_ARGUMENT,
           kpt_context_load_bundle(ctx, path, &loaded, DIAG), why[0] == '!' ? why + 1 : why);
    assert_int_equal(loaded, 0);
}

static void e_magic(uint8_t *b, size_t *n) { b[3] = 'X'; (void)n; }
static void e_hsum(uint8_t *b, size_t *n) { b[20] ^= 1; (void)n; }
static void e_version(uint8_t *b, size_t *n) { kpt_put_u32le(b + 8, 2); reseal(b, *n); }
static void e_kpt(uint8_t *b, size_t *n) { memcpy(b + 16, "0.0.1", 6); reseal(b, *n); }
static void e_size(uint8_t *b, size_t *n) { kpt_put_u64le(b + 32, *n + 1); reseal(b, *n); }
static void e_truncate(uint8_t *b, size_t *n) { *n -= 100; (void)b; }
static void e_payload(uint8_t *b, size_t *n) { b[*n - 10] ^= 1; }
static void e_payload_resealed(uint8_t *b, size_t *n) { b[*n - 10] ^= 1; reseal(b, *n); }
static void e_count(uint8_t *b, size_t *n) { kpt_put_u32le(b + 12, 1000000); reseal(b, *n); }
static void e_offset(uint8_t *b, size_t *n)
{
    kpt_put_u64le(b + KPT_BUNDLE_HEADER + 104, *n - 4);
    reseal(b, *n);
}
static void e_string(uint8_t *b, size_t *n)
{
    memset(b + KPT_BUNDLE_HEADER + 16, 'x', 16);
    reseal(b, *n);
}
static void e_short(uint8_t *b, size_t *n) { *n = 10; (void)b; }

static void test_bundles(void **state)
{
    (void)state;
    NEED_NVRTC();
    char *dir = temp_dir(), path[128], bad[128];
    snprintf(path, sizeof(path), "%s/app.kpt", dir);
    snprintf(bad, sizeof(bad), "%s/bad.kpt", dir);
    kpt_pattern *p = parse("causal"), *q = parse("sliding_window($w)");

    /* make: an offline context's kernels, written as a bundle */
    kpt_context *maker = offline("cuda:sm_80", NULL, NULL);
    get(maker, p, KPT_DTYPE_BF16, 64);
    get(maker, q, KPT_DTYPE_BF16, 64);
    entries es = {0};
    kpt_context_foreach_binary(maker, keep, &es);
    assert_int_equal(es.n, 2);
    kpt_diag d = {0};
    assert_int_equal(kpt_bundle_write(path, es.v, es.n, &d), KPT_OK);
    kpt_bundle rb;
    assert_int_equal(kpt_bundle_read(path, &rb, &d), KPT_OK);
    assert_int_equal(rb.count, 2);
    for (int i = 0; i < 2; i++) {
        assert_true(kpt_key_equal(&rb.entries[i].key, &es.v[i].key));
        assert_string_equal(rb.entries[i].target, "cuda:sm_80");
        assert_int_equal(rb.entries[i].size, es.v[i].size);
        assert_memory_equal(rb.entries[i].payload, es.v[i].payload, es.v[i].size);
    }
    kpt_bundle_free(&rb);
    for (int i = 0; i < es.n; i++)
        free(es.copies[i]);
    kpt_context_destroy(&maker);

    /* use: after preloading, those kernels compile nothing */
    kpt_context *user = offline("cuda:sm_80", NULL, NULL);
    int loaded = 0;
    assert_int_equal(kpt_context_load_bundle(user, path, &loaded, &d), KPT_OK);
    assert_int_equal(loaded, 2);
    kpt_kernel *k = get(user, p, KPT_DTYPE_BF16, 64);
    get(user, q, KPT_DTYPE_BF16, 64);
    kpt_kernel_info info;
    kpt_kernel_get_info(k, &info);
    assert_string_equal(info.source, "bundle");
    kpt_stats s = stats(user);
    assert_int_equal(s.bundle_hits, 2);
    assert_int_equal(s.compiles, 0);
    get(user, p, KPT_DTYPE_BF16, 128); /* not bundled: compiled */
    assert_int_equal(stats(user).compiles, 1);
    kpt_context_destroy(&user);

    /* refusals: another target, other kpt or format versions, any damage */
    kpt_context *other = offline("cuda:sm_90", NULL, NULL);
    EXPECT(KPT_ERR_UNSUPPORTED, kpt_context_load_bundle(other, path, NULL, DIAG),
           "no kernel for cuda:sm_90 (it is for cuda:sm_80");
    kpt_context_destroy(&other);
    kpt_context_params cpu = {.backend = KPT_BACKEND_CPU};
    assert_int_equal(kpt_context_create(&cpu, &other, NULL), KPT_OK);
    EXPECT(KPT_ERR_UNSUPPORTED, kpt_context_load_bundle(other, path, NULL, DIAG), "cpu");
    kpt_context_destroy(&other);

    size_t n;
    uint8_t *good = slurp(path, &n);
    user = offline("cuda:sm_80", NULL, NULL);
    refuse(user, bad, good, n, e_magic, "not a kpt bundle");
    refuse(user, bad, good, n, e_short, "not a kpt bundle");
    refuse(user, bad, good, n, e_hsum, "header checksum");
    refuse(user, bad, good, n, e_version, "format version 2");
    refuse(user, bad, good, n, e_kpt, "made by kpt 0.0.1");
    refuse(user, bad, good, n, e_size, "truncated");
    refuse(user, bad, good, n, e_truncate, "truncated");
    refuse(user, bad, good, n, e_payload, "checksum mismatch");
    refuse(user, bad, good, n, e_payload_resealed, "entry 1 checksum mismatch");
    refuse(user, bad, good, n, e_count, "entries do not fit");
    refuse(user, bad, good, n, e_offset, "outside the file");
    refuse(user, bad, good, n, e_string, "unterminated");
    EXPECT(KPT_ERR_IO, kpt_context_load_bundle(user, "/nonexistent/x.kpt", NULL, DIAG),
           "cannot open");
    /* nothing of the refused bundles was kept: the kernel compiles */
    get(user, p, KPT_DTYPE_BF16, 64);
    assert_int_equal(stats(user).compiles, 1);
    assert_int_equal(stats(user).bundle_hits, 0);
    kpt_context_destroy(&user);
    free(good);
    kpt_pattern_destroy(&p);
    kpt_pattern_destroy(&q);
    remove_dir(dir);
}

static void test_kptc_bundle(void **state)
{
    (void)state;
    NEED_NVRTC();
    char *dir = temp_dir(), path[128], path2[128];
    snprintf(path, sizeof(path), "%s/b.kpt", dir);
    snprintf(path2, sizeof(path2), "%s/b2.kpt", dir);
    static tool_result r; /* large */
    const char *argv[] = {kptc_path, "bundle", "-o", path, "--target", "cuda:sm_80,cuda:sm_90a",
                          "--head-dim", "64", "--dtype", "bf16", "-j", "2", "causal",
                          "alibi+causal", NULL};
    assert_true(tool_run(&r, argv));
    if (r.status)
        fail_msg("kptc bundle: %s", r.err);
    /* sm_80 and sm_90a, each pattern; and at sm_90a causal's tall variant (192-row q tiles,
     * plan.tall_variant), which its kernel holds beside the default one */
    assert_non_null(strstr(r.out, "5 kernels for 2 targets"));
    assert_string_equal(r.err, ""); /* quiet when stderr is not a terminal */
    /* deterministic: the same command writes the same bytes */
    argv[3] = path2;
    assert_true(tool_run(&r, argv));
    size_t n1, n2;
    uint8_t *b1 = slurp(path, &n1), *b2 = slurp(path2, &n2);
    assert_int_equal(n1, n2);
    assert_memory_equal(b1, b2, n1);
    free(b1);
    free(b2);
    /* the runtime takes it: both kernels found for sm_90a (the Hopper kernel, what H100
     * contexts run); an sm_90 context is another target */
    kpt_context *ctx = offline("cuda:sm_90", NULL, NULL);
    EXPECT(KPT_ERR_UNSUPPORTED, kpt_context_load_bundle(ctx, path, NULL, DIAG),
           "no kernel for cuda:sm_90 ");
    kpt_context_destroy(&ctx);
    ctx = offline("cuda:sm_90a", NULL, NULL);
    assert_string_equal(kpt_context_target(ctx), "cuda:sm_90a");
    int loaded = 0;
    assert_int_equal(kpt_context_load_bundle(ctx, path, &loaded, NULL), KPT_OK);
    assert_int_equal(loaded, 3);
    kpt_pattern *p = parse("alibi+causal");
    get(ctx, p, KPT_DTYPE_BF16, 64);
    assert_int_equal(stats(ctx).bundle_hits, 1);
    kpt_pattern_destroy(&p);
    p = parse("causal"); /* both its modules from the bundle */
    get(ctx, p, KPT_DTYPE_BF16, 64);
    assert_int_equal(stats(ctx).bundle_hits, 2);
    assert_int_equal(stats(ctx).compiles, 0);
    kpt_pattern_destroy(&p);
    kpt_context_destroy(&ctx);
    /* usage errors */
    const char *no_o[] = {kptc_path, "bundle", "--target", "cuda:sm_80", "causal", NULL};
    assert_true(tool_run(&r, no_o));
    assert_int_equal(r.status, 2);
    assert_non_null(strstr(r.err, "-o FILE is required"));
    const char *bad_dim[] = {kptc_path, "bundle", "-o", path, "--target", "cuda:sm_80",
                             "--head-dim", "48", "causal", NULL};
    assert_true(tool_run(&r, bad_dim));
    assert_int_equal(r.status, 2);
    assert_non_null(strstr(r.err, "bf16 d48/48"));
    remove_dir(dir);
}

/* ---- the HIP backend offline (no AMD GPU here): compile, bundle, preload --------------------- */

static kpt_context *offline_on(kpt_backend_kind backend, const char *target)
{
    kpt_context_params cp = {.backend = backend, .target = target,
                             .flags = KPT_CONTEXT_OFFLINE | KPT_CONTEXT_NO_DISK_CACHE};
    kpt_context *ctx = NULL;
    kpt_diag d = {0};
    if (kpt_context_create(&cp, &ctx, &d))
        fail_msg("%s", d.message);
    return ctx;
}

static void test_hip_offline(void **state)
{
    (void)state;
    kpt_context *ctx = offline_on(KPT_BACKEND_HIP, "hip:gfx90a");
    assert_string_equal(kpt_context_target(ctx), "hip:gfx90a");
    assert_int_equal(kpt_context_backend(ctx), KPT_BACKEND_HIP);
    kpt_pattern *p = parse("document+causal");
    kpt_kernel_desc desc = {.dtype = KPT_DTYPE_BF16, .head_dim = 64};
    kpt_kernel *k = NULL;
    kpt_diag d = {0};
    kpt_status st = kpt_kernel_get(ctx, p, &desc, &k, &d);
    if (st == KPT_ERR_NO_DEVICE) { /* neither hipRTC nor clang on this machine */
        print_message("no HIP compiler (%s), skipping\n", d.message);
        kpt_pattern_destroy(&p);
        kpt_context_destroy(&ctx);
        skip();
    }
    if (st)
        fail_msg("%s", d.message);
    kpt_kernel_info info;
    kpt_kernel_get_info(k, &info);
    assert_string_equal(info.source, "compiled");
    assert_int_equal(info.tile_q, 64);
    static problem pr;
    problem_init(&pr, 3);
    EXPECT(KPT_ERR_UNSUPPORTED, kpt_kernel_launch(k, &pr.a, NULL, NULL, DIAG), "offline");
    desc.dtype = KPT_DTYPE_F32;
    EXPECT(KPT_ERR_UNSUPPORTED, kpt_kernel_get(ctx, p, &desc, &k, DIAG), "f16 or bf16");
    /* the binary is an AMDGPU code object (ELF, e_machine EM_AMDGPU = 224) */
    entries es = {0};
    kpt_context_foreach_binary(ctx, keep, &es);
    assert_int_equal(es.n, 1);
    assert_string_equal(es.v[0].target, "hip:gfx90a");
    assert_true(es.v[0].size > 64);
    assert_memory_equal(es.v[0].payload, "\x7f" "ELF", 4);
    assert_int_equal(es.v[0].payload[18] | es.v[0].payload[19] << 8, 224);
    char *dir = temp_dir(), path[128];
    snprintf(path, sizeof(path), "%s/hip.kpt", dir);
    assert_int_equal(kpt_bundle_write(path, es.v, es.n, &d), KPT_OK);
    free(es.copies[0]);
    kpt_context_destroy(&ctx);
    /* preloaded: the same kernel compiles nothing; another arch's context takes none of it */
    ctx = offline_on(KPT_BACKEND_HIP, "hip:gfx90a");
    int loaded = 0;
    assert_int_equal(kpt_context_load_bundle(ctx, path, &loaded, &d), KPT_OK);
    assert_int_equal(loaded, 1);
    desc.dtype = KPT_DTYPE_BF16;
    assert_int_equal(kpt_kernel_get(ctx, p, &desc, &k, &d), KPT_OK);
    kpt_kernel_get_info(k, &info);
    assert_string_equal(info.source, "bundle");
    assert_int_equal(stats(ctx).compiles, 0);
    kpt_context_destroy(&ctx);
    ctx = offline_on(KPT_BACKEND_HIP, "hip:gfx940");
    EXPECT(KPT_ERR_UNSUPPORTED, kpt_context_load_bundle(ctx, path, NULL, DIAG),
           "no kernel for hip:gfx940");
    kpt_context_destroy(&ctx);
    kpt_pattern_destroy(&p);
    remove_dir(dir);
}

/* kptc bundle for the Vulkan and HIP targets; the runtime preloads them. */
static void test_kptc_bundle_other_targets(void **state)
{
    (void)state;
    char *dir = temp_dir(), path[128];
    snprintf(path, sizeof(path), "%s/o.kpt", dir);
    static tool_result r; /* large */
    /* spirv with the default dtypes: f32 and f16 (Vulkan has no bf16) */
    const char *argv[] = {kptc_path, "bundle", "-o", path, "--target", "spirv", "--head-dim",
                          "64", "causal", "document", NULL};
    assert_true(tool_run(&r, argv));
    if (r.status)
        fail_msg("kptc bundle: %s", r.err);
    assert_non_null(strstr(r.out, "4 kernels for 1 target"));
    kpt_context *ctx = offline_on(KPT_BACKEND_VULKAN, "spirv");
    int loaded = 0;
    assert_int_equal(kpt_context_load_bundle(ctx, path, &loaded, NULL), KPT_OK);
    assert_int_equal(loaded, 4);
    kpt_pattern *p = parse("document");
    get(ctx, p, KPT_DTYPE_F32, 64);
    get(ctx, p, KPT_DTYPE_F16, 64);
    assert_int_equal(stats(ctx).bundle_hits, 2);
    assert_int_equal(stats(ctx).compiles, 0);
    kpt_context_destroy(&ctx);
    /* hip:gfx90a where a HIP compiler is installed */
    const char *hip[] = {kptc_path, "bundle", "-o", path, "--target", "hip:gfx90a",
                         "--head-dim", "64", "--dtype", "f16", "document", NULL};
    assert_true(tool_run(&r, hip));
    if (r.status == 0) {
        ctx = offline_on(KPT_BACKEND_HIP, "hip:gfx90a");
        assert_int_equal(kpt_context_load_bundle(ctx, path, &loaded, NULL), KPT_OK);
        assert_int_equal(loaded, 1);
        get(ctx, p, KPT_DTYPE_F16, 64);
        assert_int_equal(stats(ctx).bundle_hits, 1);
        kpt_context_destroy(&ctx);
    } else if (!strstr(r.err, "hipRTC") && !strstr(r.err, "clang")) {
        fail_msg("kptc bundle --target hip:gfx90a: %s", r.err);
    }
    kpt_pattern_destroy(&p);
    remove_dir(dir);
}

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "--child"))
        return child(argv[2]);
    if (argc != 2) {
        fprintf(stderr, "usage: test_runtime KPTC\n");
        return 2;
    }
    kptc_path = argv[1];
    self_path = "/proc/self/exe";
    static char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n > 0) {
        self[n] = 0;
        self_path = self;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpu_backend),
        cmocka_unit_test(test_auto_backend),
        cmocka_unit_test(test_context_misuse),
        cmocka_unit_test(test_kernel_misuse),
        cmocka_unit_test(test_paged_misuse),
        cmocka_unit_test(test_vulkan_buffer_windows),
        cmocka_unit_test(test_vulkan_paged_plans),
        cmocka_unit_test(test_offline_caches),
        cmocka_unit_test(test_disk_entry_that_will_not_load),
        cmocka_unit_test(test_unwritable_cache),
        cmocka_unit_test(test_bundles),
        cmocka_unit_test(test_kptc_bundle),
        cmocka_unit_test(test_hip_offline),
        cmocka_unit_test(test_kptc_bundle_other_targets),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
