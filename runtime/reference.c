/* The CPU reference attention (DESIGN §2), in double precision, one worker thread per core.
 *
 * The work is cut into items, each a run of query rows of one (batch row, kv head) pair, so that
 * B = 1 with one kv head (MQA) uses every core too; each worker takes a contiguous run of items
 * and converts the keys and values of a pair to contiguous doubles when it reaches the pair.
 * Each query row then classifies its keys in tiles with the exact mask analysis (tiles the
 * analysis proves empty are skipped, full ones kept without evaluating the mask), evaluates the
 * mask of the rest, the score mod, and a two-pass softmax (max, then exp-sum and weighted V
 * sum). The mask and score programs are the pattern's IR run by the interpreter: the same
 * definition every backend is checked against. Every row is computed the same way whatever the
 * split, so results do not depend on the number of threads.
 */
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <kpt/reference.h>

#include "base/diag.h"
#include "base/numeric.h"
#include "compiler/analyze_mask.h"
#include "runtime/attention_args.h"
#include "runtime/reference_util.h"

typedef struct ref_state {
    const kpt_pattern *p;
    const kpt_attention_args *args;
    kpt_attn_binding bind;
    kpt_ir_prog mask_prog, score_prog;
    const kpt_mask_analysis *analysis; /* NULL: no mask, or no analysis */
    kpt_ir_value *vals;
    double *kd, *vd, *qd, *sc, *od;
    uint8_t *kept;
    kpt_tile_class *tiles; /* a row's key tiles */
} ref_state;

int64_t kpt_ref_off4(const kpt_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3)
{
    return i0 * t->stride[0] + i1 * t->stride[1] + i2 * t->stride[2] + i3 * t->stride[3];
}

double kpt_ref_dot(const double *a, const double *b, int64_t n)
{
    double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        s0 += a[i] * b[i];
        s1 += a[i + 1] * b[i + 1];
        s2 += a[i + 2] * b[i + 2];
        s3 += a[i + 3] * b[i + 3];
    }
    for (; i < n; i++)
        s0 += a[i] * b[i];
    return (s0 + s1) + (s2 + s3);
}

/* The class of key tile t of the row: from the analysis, or PARTIAL (FULL without a mask). */
static kpt_tile_class tile_class(const kpt_ref_scorer *sc, int64_t t)
{
    if (!sc->p->mask)
        return KPT_TILE_FULL;
    return sc->analysis ? sc->tiles[t] : KPT_TILE_PARTIAL;
}

double kpt_ref_row_scores(const kpt_ref_scorer *sc, kpt_ir_env *env, kpt_ir_value *vals,
                          const double *qd, const double *kd, uint8_t *kept, double *raw,
                          double *out)
{
    const kpt_pattern *p = sc->p;
    double m = -INFINITY;
    bool nan_seen = false;
    if (p->mask && sc->analysis)
        kpt_mask_classify_row(sc->analysis, env->q, (int64_t)env->q + 1, KPT_REF_TILE_K,
                              sc->tiles);
    for (int64_t k0 = 0; k0 < sc->Skv; k0 += KPT_REF_TILE_K) {
        int64_t k1 = k0 + KPT_REF_TILE_K < sc->Skv ? k0 + KPT_REF_TILE_K : sc->Skv;
        kpt_tile_class cls = tile_class(sc, k0 / KPT_REF_TILE_K);
        if (cls == KPT_TILE_EMPTY) {
            memset(kept + k0, 0, (size_t)(k1 - k0));
            continue;
        }
        for (int64_t k = k0; k < k1; k++) {
            env->k = (int32_t)k;
            if (cls == KPT_TILE_PARTIAL) {
                kpt_ir_prog_run(sc->mask_prog, env, vals);
                if (!vals[p->mask].i) {
                    kept[k] = 0;
                    continue;
                }
            }
            double x = sc->scale * kpt_ref_dot(qd, kd + k * sc->Dqk, sc->Dqk);
            if (raw)
                raw[k] = x;
            if (p->score) {
                env->s = x;
                kpt_ir_prog_run(sc->score_prog, env, vals);
                x = vals[p->score].f;
            }
            kept[k] = 1;
            out[k] = x;
            if (x > m)
                m = x;
            nan_seen |= isnan(x) != 0;
        }
    }
    return nan_seen ? NAN : m; /* a NaN score makes its row NaN, never a silent zero */
}

kpt_mask_analysis *kpt_ref_analyze(const kpt_pattern *p, const kpt_attn_binding *bind)
{
    if (!p->mask)
        return NULL;
    const kpt_mask_env env = {.sq = (int32_t)bind->shape.Sq, .skv = (int32_t)bind->shape.Skv,
                              .hq = (int32_t)bind->shape.Hq, .scalars = bind->scalars};
    return kpt_analyze_mask(p, &env); /* NULL (out of memory): every tile is evaluated */
}

void kpt_ref_load_rows(const kpt_tensor *t, int64_t b, int64_t h, int64_t rows, int64_t cols,
                       double *out)
{
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            out[r * cols + c] = kpt_load_as_double(t->data, t->dtype, kpt_ref_off4(t, b, h, r, c));
}

static void run_row(ref_state *st, kpt_ir_env *env, int64_t b, int64_t h, int64_t q)
{
    const kpt_attention_args *a = st->args;
    const kpt_attn_shape *s = &st->bind.shape;
    const kpt_pattern *p = st->p;
    for (int64_t d = 0; d < s->Dqk; d++)
        st->qd[d] = kpt_load_as_double(a->q.data, a->q.dtype, kpt_ref_off4(&a->q, b, h, q, d));
    env->q = (int32_t)q;
    const kpt_ref_scorer sc = {p,      &st->mask_prog, &st->score_prog, st->analysis,
                               st->tiles, st->bind.scale, s->Skv, s->Dqk};
    double m = kpt_ref_row_scores(&sc, env, st->vals, st->qd, st->kd, st->kept, NULL, st->sc);
    /* the sink joins the denominator with no value; a NaN row stays NaN */
    double sink = kpt_ref_sink(&a->sinks, h), mm = isnan(m) || m > sink ? m : sink;
    memset(st->od, 0, (size_t)s->Dv * sizeof(double));
    double lse = -INFINITY;
    if (mm != -INFINITY) { /* some key kept with a score above -inf, or a sink */
        double sum = sink == -INFINITY ? 0.0 : exp(sink - mm);
        for (int64_t k = 0; m != -INFINITY && k < s->Skv; k++) {
            if (!st->kept[k])
                continue;
            double w = exp(st->sc[k] - mm);
            sum += w;
            const double *vr = st->vd + k * s->Dv;
            for (int64_t d = 0; d < s->Dv; d++)
                st->od[d] += w * vr[d];
        }
        for (int64_t d = 0; d < s->Dv; d++)
            st->od[d] /= sum;
        lse = mm + log(sum);
    }
    for (int64_t d = 0; d < s->Dv; d++)
        kpt_store_double(a->o.data, a->o.dtype, kpt_ref_off4(&a->o, b, h, q, d), st->od[d]);
    if (a->lse.data)
        kpt_store_double(a->lse.data, a->lse.dtype,
                         b * a->lse.stride[0] + h * a->lse.stride[1] + q * a->lse.stride[2], lse);
}

static void free_state(ref_state *st)
{
    free(st->vals);
    free(st->kd);
    free(st->vd);
    free(st->qd);
    free(st->sc);
    free(st->od);
    free(st->kept);
    free(st->tiles);
}

static bool alloc_state(ref_state *st)
{
    const kpt_attn_shape *s = &st->bind.shape;
    st->vals = calloc(st->p->g.count ? st->p->g.count : 1, sizeof(*st->vals));
    st->kd = malloc((size_t)(s->Skv * s->Dqk + 1) * sizeof(double));
    st->vd = malloc((size_t)(s->Skv * s->Dv + 1) * sizeof(double));
    st->qd = malloc((size_t)s->Dqk * sizeof(double));
    st->od = malloc((size_t)s->Dv * sizeof(double));
    st->sc = malloc((size_t)(s->Skv + 1) * sizeof(double));
    st->kept = malloc((size_t)s->Skv + 1);
    st->tiles = malloc((size_t)(s->Skv / KPT_REF_TILE_K + 1) * sizeof(*st->tiles));
    return st->vals && st->kd && st->vd && st->qd && st->od && st->sc && st->kept && st->tiles;
}

/* One worker: the items [first, end), an item being the part `item % per_pair` (of per_pair
 * equal parts) of the query rows (h, q) of the pair `item / per_pair`. */
typedef struct ref_worker {
    kpt_ref_worker_base base; /* first: kpt_ref_run_workers starts it */
    ref_state st;
    int64_t first, end, per_pair;
} ref_worker;

static void *run_worker(void *arg)
{
    ref_worker *w = arg;
    ref_state *st = &w->st;
    const kpt_attn_shape *s = &st->bind.shape;
    const kpt_attention_args *args = st->args;
    kpt_ir_env env = {.sq = (int32_t)s->Sq, .skv = (int32_t)s->Skv, .hq = (int32_t)s->Hq,
                      .scalars = st->bind.scalars, .aux = st->bind.aux};
    int64_t group = s->Hq / s->Hkv, rows = group * s->Sq, loaded = -1;
    for (int64_t item = w->first; item < w->end; item++) {
        int64_t pair = item / w->per_pair, part = item % w->per_pair;
        int64_t b = pair / s->Hkv, hk = pair % s->Hkv;
        if (pair != loaded) {
            kpt_ref_load_rows(&args->k, b, hk, s->Skv, s->Dqk, st->kd);
            kpt_ref_load_rows(&args->v, b, hk, s->Skv, s->Dv, st->vd);
            loaded = pair;
        }
        env.b = (int32_t)b;
        for (int64_t r = rows * part / w->per_pair; r < rows * (part + 1) / w->per_pair; r++) {
            int64_t h = hk * group + r / s->Sq;
            env.h = (int32_t)h;
            run_row(st, &env, b, h, r % s->Sq);
        }
    }
    return NULL;
}

/* Workers: $KPT_REFERENCE_THREADS, else one per online core (at most 64), never more than
 * `units` (what can run in parallel). Small problems stay on the calling thread. */
int kpt_ref_workers(const kpt_attn_shape *s, int64_t units)
{
    const char *env = getenv("KPT_REFERENCE_THREADS");
    long n = env && *env ? strtol(env, NULL, 10) : sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1)
        n = 1;
    if (n > 64)
        n = 64;
    double work = (double)s->B * s->Hq * s->Sq * s->Skv * (double)(s->Dqk + s->Dv);
    if (work < 1e7)
        n = 1;
    if (n > units)
        n = (long)units;
    return n < 1 ? 1 : (int)n;
}

kpt_status kpt_reference_attention(const kpt_pattern *p, const kpt_attention_args *args,
                                   kpt_diag *diag)
{
    ref_state base;
    memset(&base, 0, sizeof(base));
    base.p = p;
    base.args = args;
    kpt_status status = kpt_attn_bind(p, args, &base.bind, diag);
    if (!status)
        status = kpt_ref_check_scratch(&base.bind.shape, diag);
    if (status)
        return status;
    const kpt_attn_shape *s = &base.bind.shape;
    /* items: about four per worker, so that rows of unequal cost (causal) even out */
    int64_t pairs = s->B * s->Hkv, rows = s->Hq / s->Hkv * s->Sq;
    int n = kpt_ref_workers(s, pairs * rows);
    int64_t per_pair = (4 * (int64_t)n + pairs - 1) / pairs;
    if (per_pair > rows)
        per_pair = rows;
    int64_t items = pairs * per_pair;
    ref_worker *w = calloc((size_t)n, sizeof(*w));
    kpt_ir_prog mask_prog = {0}, score_prog = {0};
    kpt_mask_analysis *analysis = kpt_ref_analyze(p, &base.bind);
    bool ok = w && kpt_ir_prog_init(&mask_prog, &p->g, &p->mask, 1) &&
              kpt_ir_prog_init(&score_prog, &p->g, &p->score, 1);
    for (int i = 0; ok && i < n; i++) {
        w[i].st = base;
        w[i].st.mask_prog = mask_prog;
        w[i].st.score_prog = score_prog;
        w[i].st.analysis = analysis;
        w[i].first = items * i / n;
        w[i].end = items * (i + 1) / n;
        w[i].per_pair = per_pair;
        ok = alloc_state(&w[i].st);
    }
    if (ok)
        kpt_ref_run_workers(w, sizeof(*w), n, run_worker);
    for (int i = 0; w && i < n; i++)
        free_state(&w[i].st);
    free(w);
    kpt_ir_prog_free(&mask_prog);
    kpt_ir_prog_free(&score_prog);
    kpt_mask_analysis_free(&analysis);
    if (!ok)
        return kpt_diag_set(diag, KPT_ERR_NO_MEMORY, "out of memory (reference, Skv = %lld)",
                            (long long)s->Skv);
    return KPT_OK;
}

double kpt_ref_sink(const kpt_tensor *sinks, int64_t h)
{
    return sinks->data ? kpt_load_as_double(sinks->data, sinks->dtype, h * sinks->stride[0])
                       : -INFINITY;
}

kpt_status kpt_ref_check_scratch(const kpt_attn_shape *s, kpt_diag *diag)
{
    /* each factor is at most INT32_MAX (kpt_attn_bind), so the product fits 64 bits */
    uint64_t n = (uint64_t)s->Skv * (uint64_t)(s->Dqk + s->Dv);
    if (n > (uint64_t)1 << 40)
        return kpt_diag_set(diag, KPT_ERR_LIMIT,
                            "the CPU reference keeps K and V of a (batch, kv head) in double "
                            "precision: Skv x (Dqk + Dv) = %llu is past its limit of 2^40",
                            (unsigned long long)n);
    return KPT_OK;
}

void kpt_ref_run_workers(void *workers, size_t size, int n, void *(*fn)(void *))
{
    unsigned char *w = workers;
    int started = 1;
    for (int i = 1; i < n; i++, started++) {
        kpt_ref_worker_base *b = (kpt_ref_worker_base *)(w + (size_t)i * size);
        if (pthread_create(&b->thread, NULL, fn, b) != 0)
            break;
    }
    /* Workers that could not start have their share done here, after our own. */
    for (int i = started; i < n; i++)
        fn(w + (size_t)i * size);
    fn(w);
    for (int i = 1; i < started; i++)
        pthread_join(((kpt_ref_worker_base *)(w + (size_t)i * size))->thread, NULL);
}
