/* A random serving batch (see paged_batch.h). */
#include <stdlib.h>
#include <string.h>

#include "base/numeric.h"
#include "tools/paged_batch.h"

static void *normal(size_t n, kpt_dtype dt, kpt_rng *r)
{
    void *p = malloc((n ? n : 1) * (size_t)kpt_dtype_size(dt));
    for (size_t i = 0; p && i < n; i++)
        kpt_store_double(p, dt, (int64_t)i, kpt_rng_normal(r));
    return p;
}

/* The page table: each sequence's pages drawn from a shuffled pool, never shared; columns a
 * sequence does not reach hold -1. */
static bool make_pages(kpt_paged_batch *pb, kpt_rng *r)
{
    pb->maxp = (pb->maxkv + pb->page - 1) / pb->page + 1;
    pb->P = 3;
    for (int b = 0; b < pb->B; b++)
        pb->P += (pb->kv[b] + pb->page - 1) / pb->page;
    pb->pt = malloc(sizeof(int32_t) * (size_t)(pb->B ? pb->B : 1) * (size_t)pb->maxp);
    int *perm = malloc(sizeof(int) * (size_t)pb->P);
    if (!pb->pt || !perm) {
        free(perm);
        return false;
    }
    for (int i = 0; i < pb->P; i++)
        perm[i] = i;
    for (int i = pb->P - 1; i > 0; i--) {
        int j = (int)kpt_rng_range(r, 0, i), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    int next = 0;
    for (int b = 0; b < pb->B; b++)
        for (int i = 0; i < pb->maxp; i++)
            pb->pt[b * pb->maxp + i] = i < (pb->kv[b] + pb->page - 1) / pb->page ? perm[next++] : -1;
    free(perm);
    return true;
}

bool kpt_paged_batch_make(kpt_paged_batch *pb, int B, const int *q, const int *kv, int page,
                          bool head_major, kpt_dtype dtype, int hq, int hkv, int d, int dv,
                          kpt_rng *r)
{
    memset(pb, 0, sizeof(*pb));
    *pb = (kpt_paged_batch){.B = B, .hq = hq, .hkv = hkv, .d = d, .dv = dv ? dv : d,
                            .dtype = dtype, .page = page, .head_major = head_major};
    pb->cu = malloc(sizeof(int32_t) * (size_t)(B + 1));
    pb->kv = malloc(sizeof(int32_t) * (size_t)(B ? B : 1));
    if (!pb->cu || !pb->kv)
        return false;
    pb->cu[0] = 0;
    for (int b = 0; b < B; b++) {
        pb->cu[b + 1] = pb->cu[b] + q[b];
        pb->kv[b] = kv[b];
        pb->maxkv = kv[b] > pb->maxkv ? kv[b] : pb->maxkv;
    }
    pb->T = pb->cu[B] + 3;
    pb->rows = page ? page : (pb->maxkv ? pb->maxkv : 1);
    if (page && !make_pages(pb, r))
        return false;
    if (!page)
        pb->P = B ? B : 1;
    size_t cache = (size_t)pb->P * pb->rows * hkv;
    pb->q = normal((size_t)pb->T * hq * d, dtype, r);
    pb->k = normal(cache * d, dtype, r);
    pb->v = normal(cache * pb->dv, dtype, r);
    pb->sinks = malloc(sizeof(float) * (size_t)hq);
    pb->docs = malloc(kpt_paged_batch_doc_bytes(pb));
    if (!pb->q || !pb->k || !pb->v || !pb->sinks || !pb->docs)
        return false;
    for (int i = 0; i < hq; i++)
        pb->sinks[i] = (float)kpt_rng_normal(r);
    for (int b = 0; b < B; b++) { /* sorted segments, about 250 keys each */
        int id = 0;
        for (int s = 0; s < pb->maxkv; s++) {
            id += kpt_rng_uniform(r) < 0.004;
            pb->docs[(size_t)b * pb->maxkv + s] = id;
        }
    }
    return true;
}

void kpt_paged_batch_free(kpt_paged_batch *pb)
{
    free(pb->cu);
    free(pb->kv);
    free(pb->pt);
    free(pb->docs);
    free(pb->sinks);
    free(pb->q);
    free(pb->k);
    free(pb->v);
    memset(pb, 0, sizeof(*pb));
}

size_t kpt_paged_batch_q_bytes(const kpt_paged_batch *pb)
{
    return (size_t)pb->T * pb->hq * pb->d * (size_t)kpt_dtype_size(pb->dtype);
}

size_t kpt_paged_batch_cache_bytes(const kpt_paged_batch *pb)
{
    return (size_t)pb->P * pb->rows * pb->hkv * pb->d * (size_t)kpt_dtype_size(pb->dtype);
}

size_t kpt_paged_batch_v_bytes(const kpt_paged_batch *pb)
{
    return (size_t)pb->P * pb->rows * pb->hkv * pb->dv * (size_t)kpt_dtype_size(pb->dtype);
}

size_t kpt_paged_batch_pt_bytes(const kpt_paged_batch *pb)
{
    return pb->pt ? sizeof(int32_t) * (size_t)pb->B * pb->maxp : 0;
}

size_t kpt_paged_batch_doc_bytes(const kpt_paged_batch *pb)
{
    return sizeof(int32_t) * (size_t)(pb->B ? pb->B : 1) * (size_t)(pb->maxkv ? pb->maxkv : 1);
}

static kpt_tensor cache_view(const kpt_paged_batch *pb, void *data, int64_t d)
{
    kpt_tensor t = {.data = data, .dtype = pb->dtype, .rank = 4,
                    .shape = {pb->P, pb->rows, pb->hkv, d}};
    int64_t rows = pb->rows, hkv = pb->hkv;
    t.stride[3] = 1;
    t.stride[2] = pb->head_major ? rows * d : d;
    t.stride[1] = pb->head_major ? d : hkv * d;
    t.stride[0] = rows * hkv * d;
    return t;
}

kpt_paged_args kpt_paged_batch_args(const kpt_paged_batch *pb, const kpt_paged_batch_mem *m,
                                    const kpt_aux_tensor *aux, int naux)
{
    kpt_paged_args a = {0};
    int64_t q3[3] = {pb->T, pb->hq, pb->d}, o3[3] = {pb->T, pb->hq, pb->dv};
    int64_t l2[2] = {pb->T, pb->hq};
    int64_t pt2[2] = {pb->B, pb->maxp}, cu1[1] = {pb->B + 1}, kv1[1] = {pb->B}, s1[1] = {pb->hq};
    a.q = kpt_tensor_contiguous(m->q, pb->dtype, 3, q3);
    a.o = kpt_tensor_contiguous(m->o, m->o_dtype, 3, o3);
    if (m->lse)
        a.lse = kpt_tensor_contiguous(m->lse, m->lse_dtype, 2, l2);
    a.k = cache_view(pb, m->k, pb->d);
    a.v = cache_view(pb, m->v, pb->dv);
    if (pb->page)
        a.page_table = kpt_tensor_contiguous(m->pt, KPT_DTYPE_I32, 2, pt2);
    a.cu_seqlens_q = kpt_tensor_contiguous(m->cu, KPT_DTYPE_I32, 1, cu1);
    a.kv_lens = kpt_tensor_contiguous(m->kv, KPT_DTYPE_I32, 1, kv1);
    if (m->sinks)
        a.sinks = kpt_tensor_contiguous(m->sinks, KPT_DTYPE_F32, 1, s1);
    a.aux = aux;
    a.num_aux = naux;
    return a;
}
