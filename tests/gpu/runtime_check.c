/* The runtime API on a real GPU: what CI cannot run. Kernels obtained through a context are
 * checked against the CPU reference (outputs poisoned first) when compiled, found in the disk
 * cache by a second context, and preloaded from a bundle (statistics must show no compile);
 * block maps built once, reused, and rebuilt for new aux contents; launches from 8 threads at
 * once. Exits 77 (skip) without a CUDA device.
 *
 *     runtime_check [--verbose] */
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <kpt/kpt.h>

#include "base/numeric.h"
#include "runtime/bundle.h"
#include "runtime/context.h"
#include "tests/gpu/api_common.h"

enum { B = 2, HQ = 4, HKV = 2, S = 777, D = 128, THREADS = 8 };
#define NQ ((size_t)B * HQ * S * D)
#define NK ((size_t)B * HKV * S * D)

typedef struct problem {
    uint16_t q[NQ], k[NK], v[NK], o[NQ];
    int32_t doc[B * S];
    double ref[NQ];
} problem;

static problem pr;

typedef struct device_tensors {
    kpt_buffer *q, *k, *v, *o, *doc;
} device_tensors;

static kpt_tensor t4(void *data, int64_t h)
{
    return kpt_tensor_contiguous(data, KPT_DTYPE_BF16, 4, (int64_t[]){B, h, S, D});
}

static kpt_attention_args args_for(void *q, void *k, void *v, void *o, void *doc,
                                   kpt_aux_tensor *aux, kpt_scalar_value *w)
{
    kpt_attention_args a = {.q = t4(q, HQ), .k = t4(k, HKV), .v = t4(v, HKV), .o = t4(o, HQ),
                            .scalars = w, .num_scalars = 1};
    aux[0] = (kpt_aux_tensor){"doc_q", kpt_tensor_contiguous(doc, KPT_DTYPE_I32, 2,
                                                             (int64_t[]){B, S})};
    aux[1] = (kpt_aux_tensor){"doc_kv", aux[0].tensor};
    a.aux = aux;
    a.num_aux = 2;
    return a;
}

/* Reference for pattern p on the host data; scalars/aux the pattern does not use are dropped. */
static void reference(const kpt_pattern *p)
{
    kpt_aux_tensor aux[2];
    kpt_scalar_value w = {"w", 200};
    kpt_attention_args a = args_for(pr.q, pr.k, pr.v, NULL, pr.doc, aux, &w);
    a.o = kpt_tensor_contiguous(pr.ref, KPT_DTYPE_F64, 4, (int64_t[]){B, HQ, S, D});
    a.num_aux = kpt_pattern_aux_count(p) ? 2 : 0;
    a.num_scalars = kpt_pattern_scalar_count(p) ? 1 : 0;
    kpt_diag d = {0};
    kpt_status st = kpt_reference_attention(p, &a, &d);
    CHECK(!st, "reference: %s", d.message);
}

static double compare(const uint16_t *o)
{
    double err = 0, scale = 1e-30;
    for (size_t i = 0; i < NQ; i++) {
        double x = kpt_bf16_to_f32(o[i]);
        if (isnan(x))
            return INFINITY; /* poison left, or NaN produced */
        err = fmax(err, fabs(x - pr.ref[i]));
        scale = fmax(scale, fabs(pr.ref[i]));
    }
    return err / scale;
}

static void poison(kpt_buffer *o)
{
    static uint16_t nan_bits[NQ];
    for (size_t i = 0; i < NQ; i++)
        nan_bits[i] = 0x7fc1;
    kpt_buffer_write(o, 0, nan_bits, sizeof(nan_bits), NULL);
}

static device_tensors upload_all(kpt_context *ctx)
{
    return (device_tensors){upload(ctx, pr.q, sizeof(pr.q)), upload(ctx, pr.k, sizeof(pr.k)),
                            upload(ctx, pr.v, sizeof(pr.v)), upload(ctx, pr.o, sizeof(pr.o)),
                            upload(ctx, pr.doc, sizeof(pr.doc))};
}

static void free_all(device_tensors *t)
{
    kpt_buffer_destroy(&t->q);
    kpt_buffer_destroy(&t->k);
    kpt_buffer_destroy(&t->v);
    kpt_buffer_destroy(&t->o);
    kpt_buffer_destroy(&t->doc);
}

/* Launches k (with `map` or none), reads o back and compares it with pr.ref. */
static void run_and_check(kpt_context *ctx, kpt_kernel *k, device_tensors *t,
                          const kpt_blockmap *map, const char *what)
{
    kpt_aux_tensor aux[2];
    kpt_scalar_value w = {"w", 200};
    kpt_attention_args a = args_for(kpt_buffer_data(t->q), kpt_buffer_data(t->k),
                                    kpt_buffer_data(t->v), kpt_buffer_data(t->o),
                                    kpt_buffer_data(t->doc), aux, &w);
    kpt_kernel_info info;
    kpt_kernel_get_info(k, &info);
    a.num_aux = kpt_kernel_needs_blockmap(k) ? 2 : 0;
    a.num_scalars = strstr(info.pattern, "$w") ? 1 : 0;
    poison(t->o);
    kpt_diag d = {0};
    kpt_status st = kpt_kernel_launch(k, &a, map, NULL, &d);
    if (!st)
        st = kpt_context_synchronize(ctx, &d);
    if (!st)
        st = kpt_buffer_read(t->o, 0, pr.o, sizeof(pr.o), &d);
    CHECK(!st, "%s: %s", what, d.message);
    double rel = compare(pr.o);
    CHECK(rel <= 1e-2, "%s: relative error %.3g", what, rel);
    printf("%-44s %-9s rel err %.2e\n", what, info.source, rel);
}

static kpt_kernel *get(kpt_context *ctx, kpt_pattern *p)
{
    kpt_kernel_desc desc = {.dtype = KPT_DTYPE_BF16, .head_dim = D};
    kpt_kernel *k = NULL;
    kpt_diag d = {0};
    kpt_status st = kpt_kernel_get(ctx, p, &desc, &k, &d);
    CHECK(!st, "kernel_get %s: %s", kpt_pattern_name(p), d.message);
    return k;
}

static kpt_context *context(const char *cache, unsigned flags, const char *target)
{
    kpt_context_params cp = {.cache_dir = cache, .flags = flags, .target = target,
                             .backend = target ? KPT_BACKEND_CUDA : KPT_BACKEND_AUTO};
    kpt_context *ctx = NULL;
    kpt_diag d = {0};
    kpt_status st = kpt_context_create(&cp, &ctx, &d);
    CHECK(!st, "context: %s", d.message);
    return ctx;
}

static kpt_stats stats(kpt_context *ctx)
{
    kpt_stats s;
    kpt_context_get_stats(ctx, &s);
    return s;
}

typedef struct thread_job {
    kpt_kernel *k;
    device_tensors *t;
    kpt_buffer *o;
    kpt_status st;
} thread_job;

static void *launcher(void *arg)
{
    thread_job *j = arg;
    kpt_aux_tensor aux[2];
    kpt_attention_args a = args_for(kpt_buffer_data(j->t->q), kpt_buffer_data(j->t->k),
                                    kpt_buffer_data(j->t->v), kpt_buffer_data(j->o), NULL, aux,
                                    NULL);
    a.num_aux = a.num_scalars = 0;
    for (int rep = 0; rep < 5 && !j->st; rep++)
        j->st = kpt_kernel_launch(j->k, &a, NULL, NULL, NULL);
    return NULL;
}

static void collect_entry(void *user, const kpt_bundle_entry *e)
{
    kpt_bundle_entry *out = user;
    void *copy = malloc(e->size);
    memcpy(copy, e->payload, e->size);
    *out = *e;
    out->payload = copy;
}

int main(void)
{
    char cache[] = "/tmp/kpt_gpu_cache_XXXXXX";
    if (!mkdtemp(cache))
        return 1;
    kpt_context *ctx = context(cache, 0, NULL);
    if (!ctx || kpt_context_backend(ctx) != KPT_BACKEND_CUDA) {
        printf("SKIP: no CUDA device\n");
        kpt_context_destroy(&ctx);
        rmdir(cache);
        return 77;
    }
    printf("device: %s (%s)\n", kpt_context_device_name(ctx), kpt_context_target(ctx));
    srand(1);
    for (size_t i = 0; i < NQ; i++) pr.q[i] = kpt_f32_to_bf16(uniform());
    for (size_t i = 0; i < NK; i++) pr.k[i] = kpt_f32_to_bf16(uniform());
    for (size_t i = 0; i < NK; i++) pr.v[i] = kpt_f32_to_bf16(uniform());
    for (int i = 0; i < B * S; i++) pr.doc[i] = (i % S) / 250; /* four documents a row */
    device_tensors t = upload_all(ctx);

    /* compiled now, then the block-map life cycle */
    const char *names[] = {"causal", "sliding_window($w)+softcap(30)", "document+causal"};
    kpt_pattern *pats[3];
    for (int i = 0; i < 3; i++) {
        kpt_diag d = {0};
        CHECK(!kpt_pattern_parse(names[i], &pats[i], &d), "%s", d.message);
        kpt_kernel *k = get(ctx, pats[i]);
        reference(pats[i]);
        run_and_check(ctx, k, &t, NULL, names[i]);
        if (!kpt_kernel_needs_blockmap(k))
            continue;
        kpt_aux_tensor aux[2];
        kpt_attention_args a = args_for(kpt_buffer_data(t.q), kpt_buffer_data(t.k),
                                        kpt_buffer_data(t.v), kpt_buffer_data(t.o),
                                        kpt_buffer_data(t.doc), aux, NULL);
        a.num_scalars = 0;
        kpt_blockmap *map = NULL;
        kpt_status st = kpt_blockmap_create(k, &a, NULL, &map, &d);
        CHECK(!st, "blockmap: %s", d.message);
        run_and_check(ctx, k, &t, map, "document+causal, block map");
        run_and_check(ctx, k, &t, map, "document+causal, block map reused");
        for (int j = 0; j < B * S; j++) /* new documents: rebuild the map in place */
            pr.doc[j] = (j % S) / 100 + (j / S);
        kpt_buffer_write(t.doc, 0, pr.doc, sizeof(pr.doc), NULL);
        st = kpt_blockmap_update(map, &a, NULL, &d);
        CHECK(!st, "blockmap update: %s", d.message);
        reference(pats[i]);
        run_and_check(ctx, k, &t, map, "document+causal, block map rebuilt");
        kpt_blockmap_destroy(&map);
    }
    kpt_stats s = stats(ctx);
    CHECK(s.compiles == 3, "compiles %llu", (unsigned long long)s.compiles);
    printf("first context: %llu compiles, %.0f ms total, %.0f ms max\n",
           (unsigned long long)s.compiles, s.compile_ms_total, s.compile_ms_max);

    /* 8 threads launch one kernel at once into their own outputs */
    reference(pats[0]);
    kpt_kernel *kc = get(ctx, pats[0]);
    thread_job jobs[THREADS];
    pthread_t th[THREADS];
    for (int i = 0; i < THREADS; i++) {
        jobs[i] = (thread_job){kc, &t, upload(ctx, pr.o, sizeof(pr.o)), KPT_OK};
        poison(jobs[i].o);
        pthread_create(&th[i], NULL, launcher, &jobs[i]);
    }
    for (int i = 0; i < THREADS; i++)
        pthread_join(th[i], NULL);
    kpt_context_synchronize(ctx, NULL);
    for (int i = 0; i < THREADS; i++) {
        CHECK(jobs[i].st == KPT_OK, "thread %d: status %d", i, jobs[i].st);
        kpt_buffer_read(jobs[i].o, 0, pr.o, sizeof(pr.o), NULL);
        double rel = compare(pr.o);
        CHECK(rel <= 1e-2, "thread %d: relative error %.3g", i, rel);
        kpt_buffer_destroy(&jobs[i].o);
    }
    printf("%d threads x 5 launches: done\n", THREADS);
    char target[32];
    snprintf(target, sizeof(target), "%s", kpt_context_target(ctx));
    free_all(&t);
    kpt_context_destroy(&ctx);

    /* a second context finds the kernels on disk */
    ctx = context(cache, 0, NULL);
    t = upload_all(ctx);
    run_and_check(ctx, get(ctx, pats[0]), &t, NULL, "causal, second context");
    s = stats(ctx);
    CHECK(s.disk_hits == 1 && s.compiles == 0, "disk hits %llu, compiles %llu",
          (unsigned long long)s.disk_hits, (unsigned long long)s.compiles);
    free_all(&t);
    kpt_context_destroy(&ctx);

    /* a bundle made offline serves a context with no disk cache: nothing compiles */
    kpt_context *maker = context(NULL, KPT_CONTEXT_OFFLINE | KPT_CONTEXT_NO_DISK_CACHE, target);
    get(maker, pats[0]);
    kpt_bundle_entry e = {0};
    kpt_context_foreach_binary(maker, collect_entry, &e);
    kpt_context_destroy(&maker);
    char path[64];
    snprintf(path, sizeof(path), "%s/app.kpt", cache);
    kpt_diag d = {0};
    CHECK(!kpt_bundle_write(path, &e, 1, &d), "bundle: %s", d.message);
    free((void *)e.payload);
    ctx = context(NULL, KPT_CONTEXT_NO_DISK_CACHE, NULL);
    int loaded = 0;
    CHECK(!kpt_context_load_bundle(ctx, path, &loaded, &d) && loaded == 1, "load: %s",
          d.message);
    t = upload_all(ctx);
    run_and_check(ctx, get(ctx, pats[0]), &t, NULL, "causal, from a bundle");
    s = stats(ctx);
    CHECK(s.bundle_hits == 1 && s.compiles == 0, "bundle hits %llu, compiles %llu",
          (unsigned long long)s.bundle_hits, (unsigned long long)s.compiles);
    free_all(&t);
    kpt_context_destroy(&ctx);
    for (int i = 0; i < 3; i++)
        kpt_pattern_destroy(&pats[i]);
    char cmd[96];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", cache);
    if (system(cmd))
        failures++;
    printf("%s: %d failure(s)\n", failures ? "FAILED" : "passed", failures);
    return failures ? 1 : 0;
}
