#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/diag.h"
#include "runtime/attention_args.h"

static bool is_float(kpt_dtype t)
{
    return t == KPT_DTYPE_F16 || t == KPT_DTYPE_BF16 || t == KPT_DTYPE_F32 || t == KPT_DTYPE_F64;
}

static kpt_status check_tensor(const char *name, const kpt_tensor *t, int rank, kpt_diag *diag)
{
    if (!t->data)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT, "tensor %s has no data", name);
    if (t->rank != rank)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT, "tensor %s must have rank %d, not %d",
                            name, rank, t->rank);
    if (!is_float(t->dtype))
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                            "tensor %s has dtype %s; expected f16, bf16, f32 or f64", name,
                            kpt_dtype_name(t->dtype));
    for (int d = 0; d < rank; d++) {
        if (t->shape[d] <= 0 || t->shape[d] > INT32_MAX)
            return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                                "tensor %s: dimension %d has size %lld (must be 1..%d)", name, d,
                                (long long)t->shape[d], INT32_MAX);
        if (t->stride[d] < 0)
            return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                                "tensor %s: stride %d is %lld; strides must be >= 0 (elements)",
                                name, d, (long long)t->stride[d]);
    }
    return KPT_OK;
}

static kpt_status same(const char *what, int64_t a, const char *an, int64_t b, const char *bn,
                       kpt_diag *diag)
{
    if (a == b)
        return KPT_OK;
    return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT, "%s differs: %s has %lld, %s has %lld",
                        what, an, (long long)a, bn, (long long)b);
}

static kpt_status check_shapes(const kpt_attention_args *a, kpt_attn_shape *s, kpt_diag *diag)
{
    kpt_status st;
    if ((st = check_tensor("q", &a->q, 4, diag)) || (st = check_tensor("k", &a->k, 4, diag)) ||
        (st = check_tensor("v", &a->v, 4, diag)) || (st = check_tensor("o", &a->o, 4, diag)))
        return st;
    s->B = a->q.shape[0];
    s->Hq = a->q.shape[1];
    s->Sq = a->q.shape[2];
    s->Dqk = a->q.shape[3];
    s->Hkv = a->k.shape[1];
    s->Skv = a->k.shape[2];
    s->Dv = a->v.shape[3];
    if ((st = same("batch", s->B, "q", a->k.shape[0], "k", diag)) ||
        (st = same("batch", s->B, "q", a->v.shape[0], "v", diag)) ||
        (st = same("batch", s->B, "q", a->o.shape[0], "o", diag)) ||
        (st = same("kv heads", s->Hkv, "k", a->v.shape[1], "v", diag)) ||
        (st = same("query heads", s->Hq, "q", a->o.shape[1], "o", diag)) ||
        (st = same("kv length", s->Skv, "k", a->v.shape[2], "v", diag)) ||
        (st = same("query length", s->Sq, "q", a->o.shape[2], "o", diag)) ||
        (st = same("head dim Dqk", s->Dqk, "q", a->k.shape[3], "k", diag)) ||
        (st = same("head dim Dv", s->Dv, "v", a->o.shape[3], "o", diag)))
        return st;
    if (s->Hq % s->Hkv != 0)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                            "query heads (%lld) must be a multiple of kv heads (%lld)",
                            (long long)s->Hq, (long long)s->Hkv);
    if (a->lse.data) {
        if (a->lse.rank != 3 || (a->lse.dtype != KPT_DTYPE_F32 && a->lse.dtype != KPT_DTYPE_F64))
            return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                                "tensor lse must be rank 3 [B, Hq, Sq] of f32 or f64");
        for (int d = 0; d < 3; d++)
            if (a->lse.stride[d] < 0)
                return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                                    "tensor lse: stride %d is %lld; strides must be >= 0", d,
                                    (long long)a->lse.stride[d]);
        if ((st = same("batch", s->B, "q", a->lse.shape[0], "lse", diag)) ||
            (st = same("query heads", s->Hq, "q", a->lse.shape[1], "lse", diag)) ||
            (st = same("query length", s->Sq, "q", a->lse.shape[2], "lse", diag)))
            return st;
    }
    return KPT_OK;
}

static void list_scalars(const kpt_pattern *p, char *buf, size_t size)
{
    buf[0] = 0;
    for (int i = 0; i < p->num_scalars; i++) {
        size_t n = strlen(buf);
        snprintf(buf + n, size - n, "%s$%s", i ? ", " : "", p->scalars[i].name);
    }
    if (!p->num_scalars)
        snprintf(buf, size, "none");
}

static kpt_status bind_scalars(const kpt_pattern *p, const kpt_attention_args *a,
                               kpt_attn_binding *out, kpt_diag *diag)
{
    bool set[KPT_MAX_SCALARS] = {false};
    char names[400];
    if (a->num_scalars < 0 || (a->num_scalars > 0 && !a->scalars))
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT, "scalars: bad array or count");
    for (int i = 0; i < a->num_scalars; i++) {
        const kpt_scalar_value *sv = &a->scalars[i];
        if (!sv->name)
            return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT, "scalar %d has no name", i);
        const char *name = sv->name[0] == '$' ? sv->name + 1 : sv->name;
        int idx = kpt_pattern_find_scalar(p, name);
        if (idx < 0) {
            list_scalars(p, names, sizeof(names));
            return kpt_diag_set(diag, KPT_ERR_NOT_FOUND,
                                "unknown runtime scalar '$%.40s' (pattern '%.80s' has: %s)", name,
                                p->name, names);
        }
        if (set[idx])
            return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT, "runtime scalar '$%s' given twice",
                                name);
        if (!isfinite(sv->value))
            return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT, "runtime scalar '$%s' is not finite",
                                name);
        if (p->scalars[idx].type == KPT_IR_I32) {
            if (sv->value != floor(sv->value) || sv->value < INT32_MIN || sv->value > INT32_MAX)
                return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                                    "runtime scalar '$%s' is i32 but the value %g is not an i32",
                                    name, sv->value);
            out->scalars[idx].i = (int32_t)sv->value;
        } else {
            if (fabs(sv->value) > FLT_MAX) /* would become inf in the kernels' f32 */
                return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                                    "runtime scalar '$%s' is f32 but %g is beyond its range",
                                    name, sv->value);
            out->scalars[idx].f = (double)(float)sv->value; /* kernels hold it as f32 */
        }
        set[idx] = true;
    }
    for (int i = 0; i < p->num_scalars; i++) {
        const kpt_scalar_decl *d = &p->scalars[i];
        if (set[i])
            continue;
        if (!d->has_default)
            return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                                "runtime scalar '$%s' has no value and no default", d->name);
        if (d->type == KPT_IR_I32)
            out->scalars[i].i = (int32_t)d->def;
        else
            out->scalars[i].f = (double)(float)d->def;
    }
    return KPT_OK;
}

int64_t kpt_attn_dim_size(int64_t dim, const kpt_attn_shape *s)
{
    switch (dim) {
    case KPT_DIM_B: return s->B;
    case KPT_DIM_HQ: return s->Hq;
    case KPT_DIM_HKV: return s->Hkv;
    case KPT_DIM_SQ: return s->Sq;
    case KPT_DIM_SKV: return s->Skv;
    case KPT_DIM_ANY: return -1;
    default: return dim;
    }
}

static kpt_status bind_aux(const kpt_pattern *p, const kpt_attention_args *a,
                           kpt_attn_binding *out, kpt_diag *diag)
{
    bool set[KPT_MAX_AUX] = {false};
    if (a->num_aux < 0 || (a->num_aux > 0 && !a->aux))
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT, "aux: bad array or count");
    for (int i = 0; i < a->num_aux; i++) {
        const kpt_aux_tensor *at = &a->aux[i];
        if (!at->name)
            return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT, "aux tensor %d has no name", i);
        int idx = kpt_pattern_find_aux(p, at->name);
        if (idx < 0)
            return kpt_diag_set(diag, KPT_ERR_NOT_FOUND,
                                "unknown aux tensor '%.40s' (pattern '%.80s' declares %d)", at->name,
                                p->name, p->num_aux);
        if (set[idx])
            return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT, "aux tensor '%s' given twice",
                                at->name);
        const kpt_aux_decl *d = &p->aux[idx];
        const kpt_tensor *t = &at->tensor;
        if (!t->data)
            return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT, "aux tensor '%s' has no data",
                                d->name);
        if (t->dtype != d->dtype)
            return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                                "aux tensor '%s' must be %s, not %s", d->name,
                                kpt_dtype_name(d->dtype), kpt_dtype_name(t->dtype));
        if (t->rank != d->rank)
            return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                                "aux tensor '%s' must have rank %d, not %d", d->name, d->rank,
                                t->rank);
        kpt_ir_auxview *v = &out->aux[idx];
        v->data = t->data;
        v->dtype = t->dtype;
        v->rank = t->rank;
        for (int k = 0; k < d->rank; k++) {
            int64_t want = kpt_attn_dim_size(d->dims[k], &out->shape);
            if (t->shape[k] <= 0 || (want > 0 && t->shape[k] != want))
                return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                                    "aux tensor '%s': dimension %d has size %lld, expected %lld (%s)",
                                    d->name, k, (long long)t->shape[k], (long long)want,
                                    kpt_dim_name(d->dims[k]) ? kpt_dim_name(d->dims[k]) : "fixed");
            if (t->stride[k] < 0)
                return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                                    "aux tensor '%s': stride %d is %lld; strides must be >= 0",
                                    d->name, k, (long long)t->stride[k]);
            v->shape[k] = t->shape[k];
            v->stride[k] = t->stride[k];
        }
        set[idx] = true;
    }
    for (int i = 0; i < p->num_aux; i++)
        if (!set[i])
            return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                                "pattern '%.80s' needs aux tensor '%s' (%s, rank %d)", p->name,
                                p->aux[i].name, kpt_dtype_name(p->aux[i].dtype), p->aux[i].rank);
    return KPT_OK;
}

/* A sinks tensor (or its gradient): none, or [Hq] of f32 or f64. */
static kpt_status check_sinks(const char *name, const kpt_tensor *t, int64_t hq, kpt_diag *diag)
{
    if (!t->data)
        return KPT_OK;
    if (t->rank != 1 || t->shape[0] != hq ||
        (t->dtype != KPT_DTYPE_F32 && t->dtype != KPT_DTYPE_F64) || t->stride[0] < 0)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                            "tensor %s must be [Hq] = [%lld] of f32 (f64 in the reference), "
                            "strides >= 0", name, (long long)hq);
    return KPT_OK;
}

kpt_status kpt_attn_bind(const kpt_pattern *p, const kpt_attention_args *args,
                         kpt_attn_binding *out, kpt_diag *diag)
{
    if (!p || !args || !out)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT, "pattern or args is NULL");
    memset(out, 0, sizeof(*out));
    kpt_attn_shape shape;
    kpt_status st = check_shapes(args, &shape, diag);
    return st ? st : kpt_attn_bind_shaped(p, args, &shape, out, diag);
}

kpt_status kpt_attn_bind_shaped(const kpt_pattern *p, const kpt_attention_args *args,
                                const kpt_attn_shape *shape, kpt_attn_binding *out,
                                kpt_diag *diag)
{
    memset(out, 0, sizeof(*out));
    out->shape = *shape;
    kpt_status st;
    if (!isfinite(args->scale))
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT, "scale is not finite");
    /* GPU kernels fold the scale into the exponent in float; a magnitude outside this range
     * would underflow or overflow there */
    if (args->scale != 0 && (fabs(args->scale) < 1e-30 || fabs(args->scale) > 1e30))
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                            "scale %g is out of range: its magnitude must lie in [1e-30, 1e30]",
                            args->scale);
    out->scale = args->scale != 0 ? args->scale : 1.0 / sqrt((double)out->shape.Dqk);
    if ((st = check_sinks("sinks", &args->sinks, out->shape.Hq, diag)))
        return st;
    if ((st = bind_scalars(p, args, out, diag)))
        return st;
    return bind_aux(p, args, out, diag);
}

kpt_status kpt_attn_check_like(const char *name, const kpt_tensor *t, const kpt_tensor *like,
                               const char *like_name, kpt_diag *diag)
{
    kpt_status st = check_tensor(name, t, 4, diag);
    for (int d = 0; !st && d < 4; d++)
        if (t->shape[d] != like->shape[d])
            st = kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                              "tensor %s must have the shape of %s: dimension %d is %lld, not %lld",
                              name, like_name, d, (long long)t->shape[d],
                              (long long)like->shape[d]);
    return st;
}

static kpt_status bind_daux(const kpt_pattern *p, const kpt_attn_binding *bind,
                            const kpt_aux_tensor *at, bool allow_f64, kpt_grad_binding *out,
                            kpt_diag *diag)
{
    if (!at->name)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT, "an aux gradient has no name");
    int idx = kpt_pattern_find_aux(p, at->name);
    if (idx < 0)
        return kpt_diag_set(diag, KPT_ERR_NOT_FOUND,
                            "gradient of unknown aux tensor '%.40s' (pattern '%.80s')", at->name,
                            p->name);
    const kpt_aux_decl *d = &p->aux[idx];
    const kpt_tensor *t = &at->tensor;
    const kpt_ir_auxview *v = &bind->aux[idx];
    if (kpt_aux_ir_type(d->dtype) != KPT_IR_F32)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                            "aux tensor '%s' is %s: only float aux tensors have gradients",
                            d->name, kpt_dtype_name(d->dtype));
    if (out->daux[idx].data)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                            "the gradient of aux tensor '%s' is given twice", d->name);
    if (!t->data)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                            "the gradient of aux tensor '%s' has no data", d->name);
    if (t->dtype != KPT_DTYPE_F32 && !(allow_f64 && t->dtype == KPT_DTYPE_F64))
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                            "the gradient of aux tensor '%s' must be f32%s, not %s", d->name,
                            allow_f64 ? " or f64" : "", kpt_dtype_name(t->dtype));
    if (t->rank != v->rank)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                            "the gradient of aux tensor '%s' must have rank %d, not %d", d->name,
                            v->rank, t->rank);
    for (int k = 0; k < v->rank; k++)
        if (t->shape[k] != v->shape[k])
            return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                                "the gradient of aux tensor '%s': dimension %d has size %lld, "
                                "expected %lld (the aux tensor's)",
                                d->name, k, (long long)t->shape[k], (long long)v->shape[k]);
    kpt_ir_auxview *o = &out->daux[idx];
    o->data = t->data;
    o->dtype = t->dtype;
    o->rank = t->rank;
    for (int k = 0; k < t->rank; k++) {
        o->shape[k] = t->shape[k];
        o->stride[k] = t->stride[k];
    }
    return KPT_OK;
}

kpt_status kpt_attn_check_grads(const kpt_attention_args *args, const kpt_attention_grads *g,
                                kpt_diag *diag)
{
    if (!g)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT, "grads is NULL");
    kpt_status st = kpt_attn_check_like("dout", &g->dout, &args->o, "o", diag);
    if (!st && g->dq.data)
        st = kpt_attn_check_like("dq", &g->dq, &args->q, "q", diag);
    if (!st && g->dk.data)
        st = kpt_attn_check_like("dk", &g->dk, &args->k, "k", diag);
    if (!st && g->dv.data)
        st = kpt_attn_check_like("dv", &g->dv, &args->v, "v", diag);
    if (!st && (g->num_daux < 0 || (g->num_daux > 0 && !g->daux)))
        st = kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT, "daux: bad array or count");
    if (!st && g->dsinks.data && !args->sinks.data)
        st = kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                          "dsinks is given but the arguments have no sinks");
    if (!st)
        st = check_sinks("dsinks", &g->dsinks, args->q.shape[1], diag);
    return st;
}

kpt_status kpt_attn_bind_grads(const kpt_pattern *p, const kpt_attention_args *args,
                               const kpt_attn_binding *bind, const kpt_attention_grads *g,
                               bool allow_f64, kpt_grad_binding *out, kpt_diag *diag)
{
    memset(out, 0, sizeof(*out));
    kpt_status st = kpt_attn_check_grads(args, g, diag);
    for (int i = 0; !st && i < g->num_daux; i++)
        st = bind_daux(p, bind, &g->daux[i], allow_f64, out, diag);
    return st;
}
