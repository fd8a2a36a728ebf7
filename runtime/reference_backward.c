/* The CPU reference backward (docs/architecture.md, "Backward"), in double precision.
 *
 * Per query row: the scores again (mask, scale, score mod), P = softmax, dP = dO V^T,
 * dS' = P (dP - sum(P dP)) (the gradient at the score mod's output), dS = dS' * d s'/d s (the
 * derivative the IR pass kpt_diff_score built), then dq = scale dS K, dk += scale dS^T q,
 * dv += P^T dO, and each float aux load of the score mod adds dS' * d s'/d load to its element's
 * gradient. Workers take whole (batch row, kv head) pairs, so dk and dv of a pair are summed by
 * one thread in row order; aux gradients are summed per worker and then over workers in worker
 * order, so results never depend on scheduling.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <kpt/reference.h>

#include "base/diag.h"
#include "base/numeric.h"
#include "compiler/passes.h"
#include "runtime/attention_args.h"
#include "runtime/reference_util.h"

typedef struct bwd_ctx {
    const kpt_pattern *p; /* derived: has the gradient roots */
    const kpt_attention_args *args;
    const kpt_attention_grads *grads;
    kpt_attn_binding bind;
    kpt_grad_binding gb;
    kpt_ir_prog mask_prog, score_prog;
    kpt_ir_prog grad_prog; /* the score and its gradient roots */
    const kpt_mask_analysis *analysis; /* for skipping key tiles; NULL: none */
    int64_t daux_len[KPT_MAX_AUX];     /* elements of each aux gradient wanted; 0 = none */
    const kpt_tensor *o_delta; /* delta = dO . O from this O (kpt_ref_backward_stored_o); NULL:
                                  sum(P dP), the exact gradient */
    bool qkv; /* dq, dk or dv wanted (else only aux gradients and the sinks') */
} bwd_ctx;

typedef struct bwd_worker {
    kpt_ref_worker_base base;
    const bwd_ctx *c;
    int index, count;
    kpt_ir_value *vals;
    double *kd, *vd, *dkd, *dvd, *qd, *dod, *dqd, *sraw, *p, *dp;
    uint8_t *kept;
    kpt_tile_class *tiles;
    double *daux[KPT_MAX_AUX]; /* this worker's sums, dense in the aux tensor's index order */
    double *dsinks;            /* this worker's sums per query head, or NULL */
} bwd_worker;

/* The dense position of an aux load's indices, or -1 when out of range (a load that read 0
 * has no element to send a gradient to). */
static int64_t dense_index(const kpt_ir_auxview *v, const kpt_ir_node *load, const kpt_ir_value *vals)
{
    int64_t at = 0;
    for (int d = 0; d < v->rank; d++) {
        int64_t i = vals[load->arg[d]].i;
        if (i < 0 || i >= v->shape[d])
            return -1;
        at = at * v->shape[d] + i;
    }
    return at;
}

/* The score mod's derivatives at pair (q, k): returns d s'/d s and adds g * d s'/d load to the
 * aux gradients wanted. */
static double score_grad(bwd_worker *w, kpt_ir_env *env, int64_t k, double g)
{
    const bwd_ctx *c = w->c;
    const kpt_pattern *p = c->p;
    if (!p->score)
        return 1.0;
    env->k = (int32_t)k;
    env->s = w->sraw[k];
    kpt_ir_prog_run(&c->grad_prog, env, w->vals);
    for (int j = 0; j < p->num_dloads; j++) {
        const kpt_ir_node *ld = kpt_ir_node_get(&p->g, p->dloads[j].load);
        int a = (int)ld->imm.index;
        if (!w->daux[a])
            continue;
        int64_t at = dense_index(&c->bind.aux[a], ld, w->vals);
        if (at >= 0)
            w->daux[a][at] += g * w->vals[p->dloads[j].deriv].f;
    }
    return p->dscore ? w->vals[p->dscore].f : 1.0;
}

static void store_row(const kpt_tensor *t, int64_t b, int64_t h, int64_t r, const double *x,
                      int64_t n)
{
    for (int64_t d = 0; d < n; d++)
        kpt_store_double(t->data, t->dtype, kpt_ref_off4(t, b, h, r, d), x[d]);
}

static void run_row(bwd_worker *w, kpt_ir_env *env, int64_t b, int64_t h, int64_t q)
{
    const bwd_ctx *c = w->c;
    const kpt_attention_args *a = c->args;
    const kpt_attention_grads *gr = c->grads;
    const kpt_attn_shape *s = &c->bind.shape;
    const double scale = c->bind.scale;
    for (int64_t d = 0; d < s->Dqk; d++)
        w->qd[d] = kpt_load_as_double(a->q.data, a->q.dtype, kpt_ref_off4(&a->q, b, h, q, d));
    for (int64_t d = 0; d < s->Dv; d++)
        w->dod[d] =
            kpt_load_as_double(gr->dout.data, gr->dout.dtype, kpt_ref_off4(&gr->dout, b, h, q, d));
    memset(w->dqd, 0, (size_t)s->Dqk * sizeof(double));
    env->q = (int32_t)q;
    const kpt_ref_scorer sc = {c->p,     &c->mask_prog, &c->score_prog, c->analysis,
                               w->tiles, scale,         s->Skv,         s->Dqk};
    double m = kpt_ref_row_scores(&sc, env, w->vals, w->qd, w->kd, w->kept, w->sraw, w->p);
    /* the sink joins the denominator (P of the keys shrinks) and has no value: dP_sink = 0 */
    const double sink = kpt_ref_sink(&a->sinks, h), mm = m > sink ? m : sink;
    if (m != -INFINITY) { /* else nothing is kept: every gradient of the row is zero */
        double sum = sink == -INFINITY ? 0.0 : exp(sink - mm), dsum = 0;
        for (int64_t k = 0; k < s->Skv; k++)
            if (w->kept[k]) {
                w->p[k] = exp(w->p[k] - mm);
                sum += w->p[k];
            }
        for (int64_t k = 0; k < s->Skv; k++)
            if (w->kept[k]) {
                w->p[k] /= sum;
                w->dp[k] = kpt_ref_dot(w->dod, w->vd + k * s->Dv, s->Dv);
                dsum += w->p[k] * w->dp[k];
            }
        if (c->o_delta) { /* as the kernels take it: from the O they stored */
            dsum = 0;
            for (int64_t d = 0; d < s->Dv; d++)
                dsum += w->dod[d] * kpt_load_as_double(c->o_delta->data, c->o_delta->dtype,
                                                       kpt_ref_off4(c->o_delta, b, h, q, d));
        }
        if (w->dsinks && sink != -INFINITY) /* d LSE / d sink = P_sink; dO . dO/dsink = -P_sink dsum */
            w->dsinks[h] -= exp(sink - mm) / sum * dsum;
        for (int64_t k = 0; k < s->Skv; k++) {
            if (!w->kept[k])
                continue;
            double g = w->p[k] * (w->dp[k] - dsum); /* at the score mod's output */
            double ds = scale * g * score_grad(w, env, k, g);
            if (!c->qkv) /* aux gradients only (score_grad adds them) */
                continue;
            double *dk = w->dkd + k * s->Dqk, *dv = w->dvd + k * s->Dv;
            const double *kr = w->kd + k * s->Dqk;
            for (int64_t d = 0; d < s->Dqk; d++) {
                w->dqd[d] += ds * kr[d];
                dk[d] += ds * w->qd[d];
            }
            for (int64_t d = 0; d < s->Dv; d++)
                dv[d] += w->p[k] * w->dod[d];
        }
    }
    if (gr->dq.data)
        store_row(&gr->dq, b, h, q, w->dqd, s->Dqk);
}

static void *run_worker(void *arg)
{
    bwd_worker *w = arg;
    const bwd_ctx *c = w->c;
    const kpt_attn_shape *s = &c->bind.shape;
    const kpt_attention_args *args = c->args;
    kpt_ir_env env = {.sq = (int32_t)s->Sq, .skv = (int32_t)s->Skv, .hq = (int32_t)s->Hq,
                      .scalars = c->bind.scalars, .aux = c->bind.aux};
    int64_t group = s->Hq / s->Hkv;
    for (int64_t pair = w->index; pair < s->B * s->Hkv; pair += w->count) {
        int64_t b = pair / s->Hkv, hk = pair % s->Hkv;
        env.b = (int32_t)b;
        kpt_ref_load_rows(&args->k, b, hk, s->Skv, s->Dqk, w->kd);
        kpt_ref_load_rows(&args->v, b, hk, s->Skv, s->Dv, w->vd);
        memset(w->dkd, 0, (size_t)(s->Skv * s->Dqk) * sizeof(double));
        memset(w->dvd, 0, (size_t)(s->Skv * s->Dv) * sizeof(double));
        for (int64_t h = hk * group; h < (hk + 1) * group; h++) {
            env.h = (int32_t)h;
            for (int64_t q = 0; q < s->Sq; q++)
                run_row(w, &env, b, h, q);
        }
        for (int64_t k = 0; k < s->Skv; k++) {
            if (c->grads->dk.data)
                store_row(&c->grads->dk, b, hk, k, w->dkd + k * s->Dqk, s->Dqk);
            if (c->grads->dv.data)
                store_row(&c->grads->dv, b, hk, k, w->dvd + k * s->Dv, s->Dv);
        }
    }
    return NULL;
}

static void free_worker(bwd_worker *w)
{
    free(w->vals);
    free(w->kd);
    free(w->vd);
    free(w->dkd);
    free(w->dvd);
    free(w->qd);
    free(w->dod);
    free(w->dqd);
    free(w->sraw);
    free(w->p);
    free(w->dp);
    free(w->kept);
    free(w->tiles);
    for (int a = 0; a < KPT_MAX_AUX; a++)
        free(w->daux[a]);
    free(w->dsinks);
}

static bool alloc_worker(bwd_worker *w)
{
    const bwd_ctx *c = w->c;
    const kpt_attn_shape *s = &c->bind.shape;
    size_t kv = (size_t)s->Skv + 1;
    w->vals = calloc(c->p->g.count ? c->p->g.count : 1, sizeof(*w->vals));
    w->kd = malloc(kv * (size_t)s->Dqk * sizeof(double));
    w->vd = malloc(kv * (size_t)s->Dv * sizeof(double));
    w->dkd = malloc(kv * (size_t)s->Dqk * sizeof(double));
    w->dvd = malloc(kv * (size_t)s->Dv * sizeof(double));
    w->qd = malloc((size_t)s->Dqk * sizeof(double));
    w->dqd = malloc((size_t)s->Dqk * sizeof(double));
    w->dod = malloc((size_t)s->Dv * sizeof(double));
    w->sraw = malloc(kv * sizeof(double));
    w->p = malloc(kv * sizeof(double));
    w->dp = malloc(kv * sizeof(double));
    w->kept = malloc(kv);
    w->tiles = malloc((size_t)(s->Skv / KPT_REF_TILE_K + 1) * sizeof(*w->tiles));
    bool ok = w->vals && w->kd && w->vd && w->dkd && w->dvd && w->qd && w->dqd && w->dod &&
              w->sraw && w->p && w->dp && w->kept && w->tiles;
    for (int a = 0; ok && a < KPT_MAX_AUX; a++)
        if (c->daux_len[a])
            ok = (w->daux[a] = calloc((size_t)c->daux_len[a], sizeof(double))) != NULL;
    if (ok && c->grads->dsinks.data)
        ok = (w->dsinks = calloc((size_t)s->Hq, sizeof(double))) != NULL;
    return ok;
}

/* The aux gradients: each worker's sums added in worker order, then stored. */
static void store_daux(const bwd_ctx *c, bwd_worker *w, int n)
{
    for (int a = 0; a < KPT_MAX_AUX; a++) {
        const kpt_ir_auxview *v = &c->gb.daux[a];
        if (!c->daux_len[a])
            continue;
        for (int64_t e = 0; e < c->daux_len[a]; e++) {
            double sum = 0;
            for (int i = 0; i < n; i++)
                sum += w[i].daux[a][e];
            int64_t off = 0, rest = e;
            for (int d = v->rank - 1; d >= 0; d--) {
                off += (rest % v->shape[d]) * v->stride[d];
                rest /= v->shape[d];
            }
            kpt_store_double((void *)v->data, v->dtype, off, sum);
        }
    }
}

/* The sinks' gradient: each worker's sums added in worker order. */
static void store_dsinks(const bwd_ctx *c, bwd_worker *w, int n)
{
    const kpt_tensor *t = &c->grads->dsinks;
    for (int64_t h = 0; t->data && h < c->bind.shape.Hq; h++) {
        double sum = 0;
        for (int i = 0; i < n; i++)
            sum += w[i].dsinks[h];
        kpt_store_double(t->data, t->dtype, h * t->stride[0], sum);
    }
}

static kpt_status daux_sizes(bwd_ctx *c, kpt_diag *diag)
{
    for (int a = 0; a < KPT_MAX_AUX; a++) {
        const kpt_ir_auxview *v = &c->gb.daux[a];
        if (!v->data)
            continue;
        int64_t n = 1;
        for (int d = 0; d < v->rank; d++) {
            if (v->shape[d] > INT64_MAX / 8 / n)
                return kpt_diag_set(diag, KPT_ERR_LIMIT, "aux tensor '%s' is too large",
                                    c->p->aux[a].name);
            n *= v->shape[d];
        }
        c->daux_len[a] = n;
    }
    return KPT_OK;
}

static kpt_status run(bwd_ctx *c, kpt_diag *diag)
{
    const kpt_attn_shape *s = &c->bind.shape;
    int n = kpt_ref_workers(s, s->B * s->Hkv); /* a worker sums dK and dV of whole pairs */
    bwd_worker *w = calloc((size_t)n, sizeof(*w));
    kpt_mask_analysis *analysis = kpt_ref_analyze(c->p, &c->bind);
    c->analysis = analysis;
    kpt_ir_ref roots[2 + KPT_MAX_DLOADS] = {c->p->score, c->p->dscore};
    for (int j = 0; j < c->p->num_dloads; j++)
        roots[2 + j] = c->p->dloads[j].deriv; /* the load's indices are its operands: live too */
    bool ok = w && kpt_ir_prog_init(&c->mask_prog, &c->p->g, &c->p->mask, 1) &&
              kpt_ir_prog_init(&c->score_prog, &c->p->g, &c->p->score, 1) &&
              kpt_ir_prog_init(&c->grad_prog, &c->p->g, roots, 2 + c->p->num_dloads);
    for (int i = 0; ok && i < n; i++) {
        w[i].c = c;
        w[i].index = i;
        w[i].count = n;
        ok = alloc_worker(&w[i]);
    }
    if (ok) {
        kpt_ref_run_workers(w, sizeof(*w), n, run_worker);
        store_daux(c, w, n);
        store_dsinks(c, w, n);
    }
    for (int i = 0; w && i < n; i++)
        free_worker(&w[i]);
    free(w);
    kpt_ir_prog_free(&c->mask_prog);
    kpt_ir_prog_free(&c->score_prog);
    kpt_ir_prog_free(&c->grad_prog);
    kpt_mask_analysis_free(&analysis);
    c->analysis = NULL;
    if (!ok)
        return kpt_diag_set(diag, KPT_ERR_NO_MEMORY,
                            "out of memory (reference backward, Skv = %lld)", (long long)s->Skv);
    return KPT_OK;
}

kpt_status kpt_reference_attention_backward(const kpt_pattern *p, const kpt_attention_args *args,
                                            const kpt_attention_grads *grads, kpt_diag *diag)
{
    return kpt_ref_backward_stored_o(p, args, NULL, grads, diag);
}

kpt_status kpt_ref_backward_stored_o(const kpt_pattern *p, const kpt_attention_args *args,
                                     const kpt_tensor *o, const kpt_attention_grads *grads,
                                     kpt_diag *diag)
{
    bwd_ctx c;
    memset(&c, 0, sizeof(c));
    kpt_status st = kpt_attn_bind(p, args, &c.bind, diag);
    if (!st)
        st = kpt_attn_bind_grads(p, args, &c.bind, grads, true, &c.gb, diag);
    if (!st)
        st = kpt_ref_check_scratch(&c.bind.shape, diag);
    if (!st && o)
        st = kpt_attn_check_like("stored O", o, &args->o, "o", diag);
    if (st)
        return st;
    kpt_pattern *dp = kpt_pattern_clone(p);
    if (!dp)
        return kpt_diag_set(diag, KPT_ERR_NO_MEMORY, "out of memory");
    st = kpt_diff_score(dp, diag);
    c.p = dp;
    c.args = args;
    c.grads = grads;
    c.o_delta = o;
    c.qkv = grads->dq.data || grads->dk.data || grads->dv.data;
    if (!st)
        st = daux_sizes(&c, diag);
    if (!st)
        st = run(&c, diag);
    kpt_pattern_destroy(&dp);
    return st;
}
