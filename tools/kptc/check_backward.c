/* kptc check --backward: the gradients of a random dO through the reference backward, checked
 * against finite differences of the reference forward (--backend cpu), or against a backend's
 * backward kernels (--backend cuda). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/diag.h"
#include "base/numeric.h"
#include "ir/pattern.h"
#include "runtime/reference_util.h"
#include "tools/kptc/kptc.h"
#include "tools/rng.h"

typedef struct bwd_check {
    const kpt_pattern *p;
    const kpt_attention_args *ref;
    kpt_dtype dtype;
    kpt_rng rng;
    void *dout;               /* dO in the input dtype, o's strides */
    double *dq, *dk, *dv;     /* the reference's gradients, q's, k's and v's strides */
    double *dsinks;           /* the sinks' gradient ([Hq]) where the call has sinks, else NULL */
    double *daux[KPT_MAX_AUX]; /* float aux tensors' gradients, contiguous */
    kpt_aux_tensor daux_t[KPT_MAX_AUX];
    int ndaux;
    kpt_attention_grads g;
} bwd_check;

static int64_t count_of(const kpt_tensor *t)
{
    int64_t n = 1;
    for (int d = 0; d < t->rank; d++)
        n *= t->shape[d];
    return n;
}

/* Elements spanned (largest offset + 1). */
static int64_t elems(const kpt_tensor *t)
{
    return (int64_t)(kptc_span(t) / (size_t)kpt_dtype_size(t->dtype));
}

static kpt_tensor like(const kpt_tensor *t, void *data, kpt_dtype dt)
{
    kpt_tensor r = *t;
    r.data = data;
    r.dtype = dt;
    return r;
}

static bool setup(bwd_check *c)
{
    const kpt_attention_args *r = c->ref;
    int64_t no = elems(&r->o);
    c->dout = malloc((size_t)no * (size_t)kpt_dtype_size(c->dtype));
    c->dq = calloc((size_t)elems(&r->q), sizeof(double));
    c->dk = calloc((size_t)elems(&r->k), sizeof(double));
    c->dv = calloc((size_t)elems(&r->v), sizeof(double));
    if (!c->dout || !c->dq || !c->dk || !c->dv)
        return false;
    for (int64_t i = 0; i < no; i++)
        kpt_store_double(c->dout, c->dtype, i, kpt_rng_normal(&c->rng));
    c->g.dout = like(&r->o, c->dout, c->dtype);
    c->g.dq = like(&r->q, c->dq, KPT_DTYPE_F64);
    c->g.dk = like(&r->k, c->dk, KPT_DTYPE_F64);
    c->g.dv = like(&r->v, c->dv, KPT_DTYPE_F64);
    for (int a = 0; a < r->num_aux; a++) {
        const kpt_tensor *t = &r->aux[a].tensor;
        if (t->dtype != KPT_DTYPE_F32 && t->dtype != KPT_DTYPE_F16 && t->dtype != KPT_DTYPE_BF16)
            continue;
        if (!(c->daux[c->ndaux] = calloc((size_t)count_of(t), sizeof(double))))
            return false;
        c->daux_t[c->ndaux].name = r->aux[a].name;
        c->daux_t[c->ndaux].tensor =
            kpt_tensor_contiguous(c->daux[c->ndaux], KPT_DTYPE_F64, t->rank, t->shape);
        c->ndaux++;
    }
    c->g.daux = c->daux_t;
    c->g.num_daux = c->ndaux;
    if (r->sinks.data) {
        const int64_t hq = r->sinks.shape[0];
        if (!(c->dsinks = calloc((size_t)hq, sizeof(double))))
            return false;
        c->g.dsinks = kpt_tensor_contiguous(c->dsinks, KPT_DTYPE_F64, 1, &hq);
    }
    return true;
}

static void teardown(bwd_check *c)
{
    free(c->dout);
    free(c->dq);
    free(c->dk);
    free(c->dv);
    free(c->dsinks);
    for (int a = 0; a < c->ndaux; a++)
        free(c->daux[a]);
}

/* ---- finite differences (cpu) ------------------------------------------------------------ */

/* sum(o * dO) of the reference forward at args (o f64 scratch). */
static double loss(bwd_check *c, const kpt_attention_args *args, kpt_status *st)
{
    kpt_diag d = {0};
    *st = kpt_reference_attention(c->p, args, &d);
    const kpt_tensor *o = &args->o;
    double l = 0;
    for (int64_t b = 0; b < o->shape[0]; b++)
        for (int64_t h = 0; h < o->shape[1]; h++)
            for (int64_t q = 0; q < o->shape[2]; q++)
                for (int64_t e = 0; e < o->shape[3]; e++)
                    l += kptc_element(o, o->data, b, h, q, e) *
                         kptc_element(&c->g.dout, c->dout, b, h, q, e);
    return l;
}

/* The directional derivative along a random u of tensor x (a copy the check may change, in
 * x's own dtype): (L(x + hu) - L(x - hu)) / 2h against sum(g * (x+ - x-)) / 2h, where x+ and
 * x- are the perturbed values as stored (rounded to the dtype). Returns the error relative to
 * sum |g * 2hu|. */
static double directional(bwd_check *c, kpt_attention_args *args, kpt_tensor *x, const double *g,
                          const kpt_tensor *gt, kpt_status *st)
{
    const double h = x->dtype == KPT_DTYPE_F64 || x->dtype == KPT_DTYPE_F32 ? 3e-3 : 3e-2;
    int64_t n = count_of(x), idx[4] = {0};
    double *x0 = malloc((size_t)n * sizeof(double)), *u = malloc((size_t)n * sizeof(double));
    int64_t *off = malloc((size_t)n * sizeof(int64_t)), *goff = malloc((size_t)n * sizeof(int64_t));
    if (!x0 || !u || !off || !goff) {
        free(x0), free(u), free(off), free(goff);
        *st = KPT_ERR_NO_MEMORY;
        return INFINITY;
    }
    for (int64_t i = 0; i < n; i++) {
        off[i] = goff[i] = 0;
        for (int d = 0; d < x->rank; d++) {
            off[i] += idx[d] * x->stride[d];
            goff[i] += idx[d] * gt->stride[d];
        }
        for (int d = x->rank - 1; d >= 0 && ++idx[d] == x->shape[d]; d--)
            idx[d] = 0;
        x0[i] = kpt_load_as_double(x->data, x->dtype, off[i]);
        u[i] = kpt_rng_normal(&c->rng);
    }
    double an = 0, mag = 0, lp, lm = 0;
    for (int64_t i = 0; i < n; i++)
        kpt_store_double(x->data, x->dtype, off[i], x0[i] + h * u[i]);
    for (int64_t i = 0; i < n; i++) {
        an += g[goff[i]] * kpt_load_as_double(x->data, x->dtype, off[i]);
        mag += fabs(g[goff[i]] * 2 * h * u[i]);
    }
    lp = loss(c, args, st);
    for (int64_t i = 0; i < n; i++)
        kpt_store_double(x->data, x->dtype, off[i], x0[i] - h * u[i]);
    for (int64_t i = 0; i < n; i++)
        an -= g[goff[i]] * kpt_load_as_double(x->data, x->dtype, off[i]);
    if (!*st)
        lm = loss(c, args, st);
    for (int64_t i = 0; i < n; i++)
        kpt_store_double(x->data, x->dtype, off[i], x0[i]);
    free(x0), free(u), free(off), free(goff);
    if (*st)
        return INFINITY;
    double fd = lp - lm;
    /* relative to the sum of the terms' magnitudes: a random direction can make the sum itself
     * cancel to almost nothing */
    return fabs(fd - an) / fmax(mag, 1e-12);
}

/* A writable f64 copy of t (same strides). */
static double *copy_f64(const kpt_tensor *t)
{
    int64_t n = elems(t);
    double *x = malloc((size_t)n * sizeof(double));
    for (int64_t i = 0; x && i < n; i++)
        x[i] = kpt_load_as_double(t->data, t->dtype, i);
    return x;
}

static int check_fd(bwd_check *c)
{
    const kpt_attention_args *r = c->ref;
    kpt_attention_args a = *r;
    kpt_aux_tensor aux[KPT_MAX_AUX];
    memcpy(aux, r->aux, (size_t)r->num_aux * sizeof(*aux));
    a.aux = aux;
    double *q = copy_f64(&r->q), *k = copy_f64(&r->k), *v = copy_f64(&r->v);
    double *o = malloc((size_t)elems(&r->o) * sizeof(double));
    double *sk = r->sinks.data ? copy_f64(&r->sinks) : NULL;
    void *auxc[KPT_MAX_AUX] = {0};
    bool ok = q && k && v && o && (sk || !r->sinks.data);
    a.q = like(&r->q, q, KPT_DTYPE_F64);
    a.k = like(&r->k, k, KPT_DTYPE_F64);
    a.v = like(&r->v, v, KPT_DTYPE_F64);
    a.o = like(&r->o, o, KPT_DTYPE_F64);
    if (sk)
        a.sinks = like(&r->sinks, sk, KPT_DTYPE_F64);
    a.lse.data = NULL;
    const double tol = 2e-3;
    double worst = 0;
    kpt_status st = ok ? KPT_OK : KPT_ERR_NO_MEMORY;
    const char *names[3] = {"dq", "dk", "dv"};
    kpt_tensor *xs[3] = {&a.q, &a.k, &a.v};
    const kpt_tensor *gs[3] = {&c->g.dq, &c->g.dk, &c->g.dv};
    for (int i = 0; !st && i < 3; i++) {
        double e = directional(c, &a, xs[i], gs[i]->data, gs[i], &st);
        printf("  gradient   %s: finite differences agree to %.2g (tolerance %g)\n", names[i], e,
               tol);
        worst = fmax(worst, e);
    }
    if (!st && sk) {
        double e = directional(c, &a, &a.sinks, c->dsinks, &c->g.dsinks, &st);
        printf("  gradient   dsinks: finite differences agree to %.2g (tolerance %g)\n", e, tol);
        worst = fmax(worst, e);
    }
    for (int j = 0; !st && j < c->ndaux; j++) {
        int a_i = kpt_pattern_find_aux(c->p, c->daux_t[j].name);
        kpt_tensor *t = &aux[a_i].tensor;
        size_t bytes = kptc_span(t);
        if (!(auxc[a_i] = malloc(bytes))) {
            st = KPT_ERR_NO_MEMORY;
            break;
        }
        memcpy(auxc[a_i], t->data, bytes);
        t->data = auxc[a_i];
        double e = directional(c, &a, t, c->daux[j], &c->daux_t[j].tensor, &st);
        printf("  gradient   d%s (aux): finite differences agree to %.2g (tolerance %g)\n",
               c->daux_t[j].name, e, tol);
        worst = fmax(worst, e);
    }
    free(q), free(k), free(v), free(o), free(sk);
    for (int i = 0; i < KPT_MAX_AUX; i++)
        free(auxc[i]);
    if (st) {
        fprintf(stderr, "kptc: %s\n", kpt_status_string(st));
        return 1;
    }
    if (!(worst <= tol)) {
        fprintf(stderr, "kptc: the reference gradients disagree with finite differences\n");
        return 1;
    }
    return 0;
}

/* ---- a device's backward ---------------------------------------------------------------- */

/* max |got - want| / max(max |want|, 0.01) over a gradient tensor (any rank; want has t's
 * strides). The floor: inputs and dO are standard normal, so a gradient that is zero (one kept
 * key per row gives dS = 0 exactly) is compared in absolute terms, where the kernels' 16-bit O
 * (delta = dO . O) leaves ~1e-6. */
static double grad_error(const kpt_tensor *t, const void *got, const double *want)
{
    double err = 0, scale = 1e-2;
    int64_t n = count_of(t), idx[4] = {0};
    for (int64_t i = 0; i < n; i++) {
        int64_t off = 0;
        for (int d = 0; d < t->rank; d++)
            off += idx[d] * t->stride[d];
        for (int d = t->rank - 1; d >= 0 && ++idx[d] == t->shape[d]; d--)
            idx[d] = 0;
        double g = kpt_load_as_double(got, t->dtype, off), w = want[off];
        if (isnan(g))
            return INFINITY;
        err = fmax(err, fabs(g - w));
        scale = fmax(scale, fabs(w));
    }
    return err / scale;
}

/* The gradients a device computes: dq, dk, dv, then the aux gradients (f32, contiguous). */
typedef struct dev_grads {
    int n;
    kpt_tensor t[3 + KPT_MAX_AUX];
    kpt_buffer *buf[3 + KPT_MAX_AUX];
    /* the default run, then two deterministic ones; where the score has aux gradients, a
     * default run without asking for them (dq, dk, dv only: the kernels without their terms) */
    void *host[3 + KPT_MAX_AUX], *det[3 + KPT_MAX_AUX], *copy2[3 + KPT_MAX_AUX], *noaux[3];
    const double *want[3 + KPT_MAX_AUX];
    kpt_aux_tensor daux[KPT_MAX_AUX];
    /* the forward's O as the device stored it, and the aux gradients of the reference whose
     * delta comes from it (kpt_ref_backward_stored_o), which the device's are checked against */
    kpt_tensor o;
    void *o_host;
    double *stored[KPT_MAX_AUX];
    /* the sinks' gradient (f32 [Hq]) where the call has sinks: the first three runs' */
    kpt_tensor ds;
    kpt_buffer *ds_buf;
    void *ds_out[3];
} dev_grads;

static bool dev_grads_init(bwd_check *c, dev_grads *dg)
{
    const kpt_attention_args *ref = c->ref;
    const kpt_tensor *shapes[3] = {&ref->q, &ref->k, &ref->v};
    const double *want[3] = {c->dq, c->dk, c->dv};
    for (int i = 0; i < 3 + c->ndaux; i++) {
        if (i < 3) {
            dg->t[i] = like(shapes[i], NULL, c->dtype);
            dg->want[i] = want[i];
        } else {
            dg->t[i] = like(&c->daux_t[i - 3].tensor, NULL, KPT_DTYPE_F32);
            dg->want[i] = c->daux[i - 3];
        }
        dg->host[i] = malloc(kptc_span(&dg->t[i]));
        dg->det[i] = malloc(kptc_span(&dg->t[i]));
        dg->copy2[i] = malloc(kptc_span(&dg->t[i]));
        if (i < 3)
            dg->noaux[i] = malloc(kptc_span(&dg->t[i]));
        if (i >= 3)
            dg->stored[i - 3] = calloc((size_t)count_of(&dg->t[i]), sizeof(double));
        dg->n = i + 1;
        if (!dg->host[i] || !dg->det[i] || !dg->copy2[i] || (i < 3 && !dg->noaux[i]) ||
            (i >= 3 && !dg->stored[i - 3]))
            return false;
    }
    if (c->dsinks) {
        dg->ds = like(&c->g.dsinks, NULL, KPT_DTYPE_F32);
        for (int i = 0; i < 3; i++)
            if (!(dg->ds_out[i] = malloc(kptc_span(&dg->ds))))
                return false;
    }
    dg->o = like(&ref->o, NULL, c->dtype);
    return (dg->o_host = malloc(kptc_span(&dg->o))) != NULL;
}

static void dev_grads_free(dev_grads *dg)
{
    for (int i = 0; i < dg->n; i++)
        free(dg->host[i]), free(dg->det[i]), free(dg->copy2[i]),
            free(i < 3 ? dg->noaux[i] : dg->stored[i - 3]);
    for (int i = 0; i < 3; i++)
        free(dg->ds_out[i]);
    free(dg->o_host);
}

/* The forward, then the backward three times, outputs poisoned before each: in the default mode
 * with a temporary workspace, then deterministic twice with one of
 * kpt_kernel_backward_workspace's size; a fourth, in the default mode, without the aux
 * gradients where there are some. */
static kpt_status run_device(bwd_check *c, kptc_device_run *r, kpt_kernel *fwd, kpt_kernel *bwd,
                             dev_grads *dg, kpt_diag *d)
{
    kpt_attention_args a;
    kpt_attention_grads g = {.dout = c->g.dout, .daux = dg->daux, .num_daux = c->ndaux};
    kpt_status st = kptc_device_args(r, c->ref, c->dtype, &a, d);
    kpt_buffer *o_buf = st ? NULL : r->bufs[r->nbufs - 2]; /* o, then lse: the last two */
    if (!st)
        st = kptc_upload(r, &g.dout, true, d);
    for (int i = 0; !st && i < dg->n; i++) {
        st = kptc_upload(r, &dg->t[i], false, d);
        dg->buf[i] = r->bufs[r->nbufs - 1];
        if (i >= 3)
            dg->daux[i - 3] = (kpt_aux_tensor){.name = c->daux_t[i - 3].name, .tensor = dg->t[i]};
    }
    g.dq = dg->t[0], g.dk = dg->t[1], g.dv = dg->t[2];
    if (!st && c->dsinks) {
        st = kptc_upload(r, &dg->ds, false, d);
        dg->ds_buf = r->bufs[r->nbufs - 1];
        g.dsinks = dg->ds;
    }
    size_t ws_bytes = 0;
    g.deterministic = 1;
    if (!st)
        st = kpt_kernel_backward_workspace(bwd, &a, &g, &ws_bytes, d);
    kpt_buffer *ws = NULL;
    if (!st && ws_bytes)
        st = kpt_buffer_create(r->ctx, ws_bytes, &ws, d);
    if (!st)
        st = kpt_kernel_launch(fwd, &a, NULL, NULL, d);
    if (!st)
        st = kpt_context_synchronize(r->ctx, d);
    if (!st)
        st = kpt_buffer_read(o_buf, 0, dg->o_host, kptc_span(&dg->o), d);
    for (int run = 0; run < (c->ndaux ? 4 : 3) && !st; run++) {
        void **out = run == 0 ? dg->host : run == 1 ? dg->det : run == 2 ? dg->copy2 : dg->noaux;
        const int n_out = run == 3 ? 3 : dg->n;
        for (int i = 0; i < n_out && !st && run > 0; i++) {
            size_t n = kptc_span(&dg->t[i]);
            memset(out[i], 0xff, n);
            st = kpt_buffer_write(dg->buf[i], 0, out[i], n, d);
        }
        if (!st && run > 0 && run < 3 && dg->ds_buf) { /* (the upload poisoned run 0's) */
            memset(dg->ds_out[run], 0xff, kptc_span(&dg->ds));
            st = kpt_buffer_write(dg->ds_buf, 0, dg->ds_out[run], kptc_span(&dg->ds), d);
        }
        g.deterministic = run == 1 || run == 2;
        g.num_daux = run == 3 ? 0 : c->ndaux;
        const bool own_ws = g.deterministic && ws;
        if (!st)
            st = kpt_kernel_launch_backward(bwd, &a, &g, NULL, own_ws ? kpt_buffer_data(ws) : NULL,
                                            own_ws ? ws_bytes : 0, NULL, d);
        if (!st)
            st = kpt_context_synchronize(r->ctx, d);
        for (int i = 0; i < n_out && !st; i++)
            st = kpt_buffer_read(dg->buf[i], 0, out[i], kptc_span(&dg->t[i]), d);
        if (!st && run < 3 && dg->ds_buf)
            st = kpt_buffer_read(dg->ds_buf, 0, dg->ds_out[run], kptc_span(&dg->ds), d);
    }
    kpt_buffer_destroy(&ws);
    return st;
}

/* The reference's aux gradients with delta from the O the device stored (dg->stored). */
static kpt_status stored_o_reference(const bwd_check *c, dev_grads *dg, kpt_diag *d)
{
    kpt_aux_tensor daux[KPT_MAX_AUX];
    for (int j = 0; j < c->ndaux; j++) {
        daux[j] = c->daux_t[j];
        daux[j].tensor.data = dg->stored[j];
    }
    kpt_attention_grads g = {.dout = c->g.dout, .daux = daux, .num_daux = c->ndaux};
    kpt_tensor o = dg->o;
    o.data = dg->o_host;
    return kpt_ref_backward_stored_o(c->p, c->ref, &o, &g, d);
}

static double worse(double worst, double e)
{
    return fmax(worst, isnan(e) ? INFINITY : e);
}

/* dq, dk and dv against the exact reference; aux gradients against the one whose delta comes
 * from the O the device stored (their error against the exact one printed beside). */
static int report_device(bwd_check *c, kptc_device_run *r, const char *backend, dev_grads *dg)
{
    double tol = c->dtype == KPT_DTYPE_BF16 ? 1e-2 : 5e-3, e[3 + KPT_MAX_AUX], worst = 0;
    double det_worst = 0, noaux_worst = 0, exact[KPT_MAX_AUX];
    bool same = true;
    for (int i = 0; i < dg->n; i++) {
        const double *want = i < 3 ? dg->want[i] : dg->stored[i - 3];
        e[i] = grad_error(&dg->t[i], dg->host[i], want);
        worst = worse(worst, e[i]);
        det_worst = worse(det_worst, grad_error(&dg->t[i], dg->det[i], want));
        same &= memcmp(dg->det[i], dg->copy2[i], kptc_span(&dg->t[i])) == 0;
        if (i >= 3)
            exact[i - 3] = grad_error(&dg->t[i], dg->host[i], dg->want[i]);
        else if (c->ndaux)
            noaux_worst = worse(noaux_worst, grad_error(&dg->t[i], dg->noaux[i], want));
    }
    double eds = 0;
    if (dg->ds_buf) { /* the sinks' gradient, as dq's */
        eds = grad_error(&dg->ds, dg->ds_out[0], c->dsinks);
        worst = worse(worst, eds);
        det_worst = worse(det_worst, grad_error(&dg->ds, dg->ds_out[1], c->dsinks));
        same &= memcmp(dg->ds_out[1], dg->ds_out[2], kptc_span(&dg->ds)) == 0;
    }
    kpt_stats s;
    kpt_context_get_stats(r->ctx, &s);
    printf("  %-10s %s backward on %s: max relative error dq %.3g, dk %.3g, dv %.3g", backend,
           kpt_context_target(r->ctx), kpt_context_device_name(r->ctx), e[0], e[1], e[2]);
    if (dg->ds_buf)
        printf(", dsinks %.3g", eds);
    for (int i = 3; i < dg->n; i++)
        printf(", d%s %.3g (with the exact delta %.3g)", c->daux_t[i - 3].name, e[i],
               exact[i - 3]);
    printf(" (tolerance %g); deterministic mode: max relative error %.3g, %s on a second run",
           tol, det_worst, same ? "bitwise identical" : "DIFFERENT BITS");
    if (c->ndaux)
        printf("; without the aux gradients: max relative error %.3g", noaux_worst);
    printf("; compiled in %.0f ms (forward and backward)\n", s.compile_ms_total);
    if (!(worst <= tol) || !(det_worst <= tol) || !same || !(noaux_worst <= tol)) {
        fprintf(stderr, "kptc: the %s backward disagrees with the reference\n", backend);
        return 1;
    }
    return 0;
}

static int check_device(bwd_check *c, kpt_context *ctx)
{
    const char *backend = kpt_backend_name(kpt_context_backend(ctx));
    const kpt_attention_args *ref = c->ref;
    kptc_device_run r = {0};
    kpt_diag d = {0};
    kpt_kernel *fwd = NULL, *bwd = NULL;
    kpt_status st = kptc_device_open(&r, ctx, c->p, ref, c->dtype, &fwd, &bwd, &d);
    dev_grads dg = {0};
    if (!st && !dev_grads_init(c, &dg))
        st = kpt_diag_set(&d, KPT_ERR_NO_MEMORY, "out of memory");
    if (!st)
        st = run_device(c, &r, fwd, bwd, &dg, &d);
    if (!st && c->ndaux)
        st = stored_o_reference(c, &dg, &d);
    int rc = st ? kptc_report(&d, st) : report_device(c, &r, backend, &dg);
    dev_grads_free(&dg);
    kptc_device_close(&r);
    return rc;
}

int kptc_check_backward(kpt_context *ctx, const kpt_pattern *p, const kpt_attention_args *ref,
                        kpt_dtype dtype, uint64_t seed)
{
    bwd_check c = {.p = p, .ref = ref, .dtype = dtype};
    kpt_rng_seed(&c.rng, seed * 7919 + 17);
    if (!setup(&c)) {
        teardown(&c);
        fprintf(stderr, "kptc: out of memory\n");
        return 1;
    }
    kpt_diag d = {0};
    kpt_status st = kpt_reference_attention_backward(p, ref, &c.g, &d);
    int rc;
    if (st) {
        rc = kptc_report(&d, st);
    } else {
        printf("  backward   reference gradients for a standard normal dO (%s); %d aux "
               "gradient%s\n", kpt_dtype_name(dtype), c.ndaux, c.ndaux == 1 ? "" : "s");
        fflush(stdout);
        rc = ctx ? check_device(&c, ctx) : check_fd(&c);
    }
    teardown(&c);
    return rc;
}
