/* The CPU reference of serving calls (include/kpt/serving.h): each (sequence, kv head)'s keys
 * and values gathered from the cache's pages into contiguous doubles, then every query row of
 * its heads scored by kpt_ref_row_scores (the forward's own definition of a score) at its
 * logical position, with Sq = Skv = the sequence's kv length, and a two-pass softmax whose
 * denominator includes the head's sink. One thread per worker takes whole (sequence, kv head)
 * pairs, so results do not depend on the thread count. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/diag.h"
#include "base/numeric.h"
#include "runtime/paged_args.h"
#include "runtime/reference_util.h"

typedef struct paged_ref {
    const kpt_pattern *p;
    const kpt_paged_args *a;
    const kpt_paged_binding *pb;
    const kpt_ir_prog *mask_prog, *score_prog;
} paged_ref;

typedef struct paged_worker {
    kpt_ref_worker_base base; /* first: kpt_ref_run_workers starts it */
    const paged_ref *r;
    int64_t first, end; /* (sequence, kv head) pairs */
    double *kd, *vd, *qd, *sc, *od;
    uint8_t *kept;
    kpt_ir_value *vals;
    bool ok;
} paged_worker;

static int32_t i32_at(const kpt_tensor *t, int64_t i)
{
    return ((const int32_t *)t->data)[i * t->stride[0]];
}

/* Key j of sequence b: the cache row (page, row in page), or page -1 when the table does not
 * hold it (it then reads as zeros, as in the kernels). */
static int64_t locate(const paged_ref *r, int64_t b, int64_t j, int64_t *row)
{
    const kpt_paged_binding *pb = r->pb;
    if (!pb->paged) {
        *row = j;
        return j < pb->page_size ? b : -1;
    }
    int64_t pi = j / pb->page_size;
    *row = j % pb->page_size;
    if (pi >= pb->max_pages)
        return -1;
    const kpt_tensor *t = &r->a->page_table;
    int32_t page = ((const int32_t *)t->data)[b * t->stride[0] + pi * t->stride[1]];
    return page >= 0 && page < pb->num_pages ? page : -1;
}

static void gather(const paged_ref *r, const kpt_tensor *t, int64_t b, int64_t hk, int64_t n,
                   int64_t d, double *out)
{
    for (int64_t j = 0; j < n; j++) {
        int64_t row, page = locate(r, b, j, &row);
        for (int64_t c = 0; c < d; c++)
            out[j * d + c] = page < 0 ? 0.0
                                      : kpt_load_as_double(t->data, t->dtype,
                                                           page * t->stride[0] + row * t->stride[1] +
                                                               hk * t->stride[2] + c * t->stride[3]);
    }
}

static int64_t off3(const kpt_tensor *t, int64_t i0, int64_t i1, int64_t i2)
{
    return i0 * t->stride[0] + i1 * t->stride[1] + i2 * t->stride[2];
}

/* Query row t (position qpos of sequence b) of head h, against the gathered keys. */
static void run_row(paged_worker *w, kpt_ir_env *env, int64_t t, int64_t h, int64_t kv_len)
{
    const paged_ref *r = w->r;
    const kpt_paged_args *a = r->a;
    const kpt_paged_binding *pb = r->pb;
    for (int64_t d = 0; d < pb->Dqk; d++)
        w->qd[d] = kpt_load_as_double(a->q.data, a->q.dtype, off3(&a->q, t, h, d));
    const kpt_ref_scorer sc = {r->p, r->mask_prog, r->score_prog, NULL, NULL, pb->bind.scale,
                               kv_len, pb->Dqk};
    double m = kpt_ref_row_scores(&sc, env, w->vals, w->qd, w->kd, w->kept, NULL, w->sc);
    double sink = kpt_ref_sink(&a->sinks, h);
    double mm = m > sink ? m : sink; /* NaN m stays NaN below */
    if (isnan(m))
        mm = m;
    memset(w->od, 0, (size_t)pb->Dv * sizeof(double));
    double lse = -INFINITY;
    if (mm != -INFINITY) {
        double sum = sink == -INFINITY ? 0.0 : exp(sink - mm);
        for (int64_t k = 0; m != -INFINITY && k < kv_len; k++) {
            if (!w->kept[k])
                continue;
            double p = exp(w->sc[k] - mm);
            sum += p;
            for (int64_t d = 0; d < pb->Dv; d++)
                w->od[d] += p * w->vd[k * pb->Dv + d];
        }
        for (int64_t d = 0; d < pb->Dv; d++)
            w->od[d] /= sum;
        lse = mm + log(sum);
    }
    for (int64_t d = 0; d < pb->Dv; d++)
        kpt_store_double(a->o.data, a->o.dtype, off3(&a->o, t, h, d), w->od[d]);
    if (a->lse.data)
        kpt_store_double(a->lse.data, a->lse.dtype, t * a->lse.stride[0] + h * a->lse.stride[1],
                         lse);
}

static void *run_worker(void *arg)
{
    paged_worker *w = arg;
    const paged_ref *r = w->r;
    const kpt_paged_args *a = r->a;
    const kpt_paged_binding *pb = r->pb;
    int64_t group = pb->Hq / pb->Hkv;
    kpt_ir_env env = {.hq = (int32_t)pb->Hq, .scalars = pb->bind.scalars, .aux = pb->bind.aux};
    for (int64_t pair = w->first; pair < w->end; pair++) {
        int64_t b = pair / pb->Hkv, hk = pair % pb->Hkv;
        int64_t t0 = i32_at(&a->cu_seqlens_q, b), q_len = i32_at(&a->cu_seqlens_q, b + 1) - t0;
        int64_t kv_len = i32_at(&a->kv_lens, b);
        if (q_len <= 0)
            continue;
        gather(r, &a->k, b, hk, kv_len, pb->Dqk, w->kd);
        gather(r, &a->v, b, hk, kv_len, pb->Dv, w->vd);
        env.b = (int32_t)b;
        env.sq = env.skv = (int32_t)kv_len;
        for (int64_t g = 0; g < group; g++) {
            env.h = (int32_t)(hk * group + g);
            for (int64_t i = 0; i < q_len; i++) {
                env.q = (int32_t)(kv_len - q_len + i);
                run_row(w, &env, t0 + i, env.h, kv_len);
            }
        }
    }
    return NULL;
}

/* The lengths, read on the host and checked as kpt_paged_plan_make checks them. */
static kpt_status scan(const kpt_paged_args *a, const kpt_paged_binding *pb, int64_t *max_kv,
                       kpt_diag *diag)
{
    *max_kv = 0;
    if (i32_at(&a->cu_seqlens_q, 0) != 0)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT, "cu_seqlens_q[0] must be 0");
    for (int64_t b = 0; b < pb->B; b++) {
        int64_t t0 = i32_at(&a->cu_seqlens_q, b), t1 = i32_at(&a->cu_seqlens_q, b + 1);
        int64_t kv = i32_at(&a->kv_lens, b);
        if (t1 < t0 || t1 > pb->T)
            return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                                "cu_seqlens_q[%lld..%lld] = %lld, %lld: it must not decrease or "
                                "pass the %lld rows of q", (long long)b, (long long)b + 1,
                                (long long)t0, (long long)t1, (long long)pb->T);
        if (kv < t1 - t0)
            return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                                "sequence %lld has %lld queries but %lld keys (kv_lens[b] >= "
                                "q_len)", (long long)b, (long long)(t1 - t0), (long long)kv);
        if (!pb->paged && kv > pb->page_size)
            return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                                "sequence %lld has %lld keys; the cache holds %lld",
                                (long long)b, (long long)kv, (long long)pb->page_size);
        if (pb->paged && (kv + pb->page_size - 1) / pb->page_size > pb->max_pages)
            return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                                "sequence %lld has %lld keys; its page-table row holds %lld "
                                "pages of %lld", (long long)b, (long long)kv,
                                (long long)pb->max_pages, (long long)pb->page_size);
        *max_kv = kv > *max_kv ? kv : *max_kv;
    }
    return KPT_OK;
}

kpt_status kpt_reference_paged_attention(const kpt_pattern *p, const kpt_paged_args *args,
                                         kpt_diag *diag)
{
    kpt_paged_binding pb;
    kpt_status st = kpt_paged_bind_tensors(args, &pb, diag);
    int64_t max_kv = 0;
    if (!st)
        st = scan(args, &pb, &max_kv, diag);
    if (!st) /* aux sizes Sq and Skv are the longest kv length */
        st = kpt_paged_bind_extras(p, args, max_kv, &pb, diag);
    kpt_attn_shape shape = pb.bind.shape;
    shape.Skv = max_kv;
    if (!st)
        st = kpt_ref_check_scratch(&shape, diag);
    if (st)
        return st;
    kpt_ir_prog mask_prog = {0}, score_prog = {0};
    paged_ref r = {p, args, &pb, &mask_prog, &score_prog};
    int64_t pairs = pb.B * pb.Hkv;
    shape.Sq = pb.T;
    int n = pairs ? kpt_ref_workers(&shape, pairs) : 1;
    paged_worker *w = calloc((size_t)n, sizeof(*w));
    bool ok = w && kpt_ir_prog_init(&mask_prog, &p->g, &p->mask, 1) &&
              kpt_ir_prog_init(&score_prog, &p->g, &p->score, 1);
    for (int i = 0; ok && i < n; i++) {
        paged_worker *x = &w[i];
        x->r = &r;
        x->first = pairs * i / n;
        x->end = pairs * (i + 1) / n;
        x->kd = malloc((size_t)(max_kv * pb.Dqk + 1) * sizeof(double));
        x->vd = malloc((size_t)(max_kv * pb.Dv + 1) * sizeof(double));
        x->qd = malloc((size_t)pb.Dqk * sizeof(double));
        x->od = malloc((size_t)pb.Dv * sizeof(double));
        x->sc = malloc((size_t)(max_kv + 1) * sizeof(double));
        x->kept = malloc((size_t)max_kv + 1);
        x->vals = calloc(p->g.count ? p->g.count : 1, sizeof(*x->vals));
        ok = x->kd && x->vd && x->qd && x->od && x->sc && x->kept && x->vals;
    }
    if (ok)
        kpt_ref_run_workers(w, sizeof(*w), n, run_worker);
    for (int i = 0; w && i < n; i++) {
        free(w[i].kd);
        free(w[i].vd);
        free(w[i].qd);
        free(w[i].od);
        free(w[i].sc);
        free(w[i].kept);
        free(w[i].vals);
    }
    free(w);
    kpt_ir_prog_free(&mask_prog);
    kpt_ir_prog_free(&score_prog);
    if (!ok)
        return kpt_diag_set(diag, KPT_ERR_NO_MEMORY, "out of memory (paged reference)");
    return KPT_OK;
}
