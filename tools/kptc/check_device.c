/* kptc check --backend cuda|hip|vulkan: the pattern's kernel, through the runtime API, on this
 * machine's GPU (or lavapipe), on the same inputs as the CPU reference, compared with it
 * (outputs poisoned first). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/numeric.h"
#include "tools/kptc/kptc.h"

/* Bytes spanned by a tensor (its largest offset + 1 element). */
size_t kptc_span(const kpt_tensor *t)
{
    int64_t last = 0;
    for (int i = 0; i < t->rank; i++)
        last += (t->shape[i] - 1) * t->stride[i];
    return (size_t)(last + 1) * (size_t)kpt_dtype_size(t->dtype);
}

kpt_status kptc_upload(kptc_device_run *r, kpt_tensor *t, bool copy, kpt_diag *d)
{
    kpt_buffer **b = &r->bufs[r->nbufs++];
    size_t n = kptc_span(t);
    kpt_status st = kpt_buffer_create(r->ctx, n, b, d);
    if (!st && copy)
        st = kpt_buffer_write(*b, 0, t->data, n, d);
    if (!st && !copy) { /* outputs: NaN everywhere (0xff bytes) so unwritten elements show */
        void *poison = malloc(n);
        if (!poison)
            return KPT_ERR_NO_MEMORY;
        memset(poison, 0xff, n);
        st = kpt_buffer_write(*b, 0, poison, n, d);
        free(poison);
    }
    if (!st)
        t->data = kpt_buffer_data(*b);
    return st;
}

double kptc_element(const kpt_tensor *t, const void *data, int64_t i0, int64_t i1, int64_t i2,
                      int64_t i3)
{
    int64_t off = i0 * t->stride[0] + i1 * t->stride[1] + i2 * t->stride[2] +
                  (t->rank > 3 ? i3 * t->stride[3] : 0);
    return kpt_load_as_double(data, t->dtype, off);
}

/* Compares the device's o and lse with the reference's; returns the relative error of o. */
static double compare(const kpt_attention_args *ref, const kpt_tensor *o, const void *od,
                      const float *lse, double *lse_err)
{
    const kpt_tensor *ro = &ref->o;
    double err = 0, scale = 1e-30;
    *lse_err = 0;
    for (int64_t b = 0; b < ro->shape[0]; b++)
        for (int64_t h = 0; h < ro->shape[1]; h++)
            for (int64_t q = 0; q < ro->shape[2]; q++) {
                for (int64_t e = 0; e < ro->shape[3]; e++) {
                    double want = kptc_element(ro, ref->o.data, b, h, q, e);
                    double got = kptc_element(o, od, b, h, q, e);
                    if (isnan(got))
                        return INFINITY;
                    err = fmax(err, fabs(got - want));
                    scale = fmax(scale, fabs(want));
                }
                double wl = kptc_element(&ref->lse, ref->lse.data, b, h, q, 0);
                double gl = lse[(b * ro->shape[1] + h) * ro->shape[2] + q];
                if (isinf(wl) ? gl != wl : !(fabs(gl - wl) <= 1e30))
                    *lse_err = INFINITY;
                else if (!isinf(wl))
                    *lse_err = fmax(*lse_err, fabs(gl - wl));
            }
    return err / scale;
}

int kptc_check_device(kpt_context *ctx, const kpt_pattern *p, const kpt_attention_args *ref,
                      kpt_dtype dtype)
{
    const char *backend = kpt_backend_name(kpt_context_backend(ctx));
    kptc_device_run r = {0};
    kpt_diag d = {0};
    kpt_kernel *k = NULL;
    kpt_status st = kptc_device_open(&r, ctx, p, ref, dtype, &k, NULL, &d);
    kpt_attention_args a = *ref; /* sizes the reads below even when nothing ran */
    if (!st)
        st = kptc_device_args(&r, ref, dtype, &a, &d);
    if (!st)
        st = kpt_kernel_launch(k, &a, NULL, NULL, &d);
    if (!st)
        st = kpt_context_synchronize(r.ctx, &d);
    size_t on = kptc_span(&a.o), ln = kptc_span(&a.lse);
    void *o = malloc(on);
    float *lse = malloc(ln);
    if (!st && (!o || !lse))
        st = KPT_ERR_NO_MEMORY;
    if (!st)
        st = kpt_buffer_read(r.bufs[r.nbufs - 2], 0, o, on, &d);
    if (!st)
        st = kpt_buffer_read(r.bufs[r.nbufs - 1], 0, lse, ln, &d);
    int rc = 0;
    if (st) {
        rc = kptc_report(&d, st);
    } else {
        double lse_err, rel = compare(ref, &a.o, o, lse, &lse_err);
        double tol = dtype == KPT_DTYPE_BF16 ? 1e-2 : dtype == KPT_DTYPE_F16 ? 5e-3 : 1e-4;
        kpt_stats s;
        kpt_context_get_stats(r.ctx, &s);
        printf("  %-10s %s on %s: max relative error %.3g (tolerance %g), LSE max error "
               "%.3g; compiled in %.0f ms\n", backend, kpt_context_target(r.ctx),
               kpt_context_device_name(r.ctx), rel, tol, lse_err, s.compile_ms_total);
        if (!(rel <= tol) || !(lse_err <= 1e-2)) {
            fprintf(stderr, "kptc: the %s kernel disagrees with the reference\n", backend);
            rc = 1;
        }
    }
    free(o);
    free(lse);
    kptc_device_close(&r);
    return rc;
}

kpt_status kptc_device_args(kptc_device_run *r, const kpt_attention_args *ref, kpt_dtype dtype,
                            kpt_attention_args *a, kpt_diag *d)
{
    *a = *ref;
    a->o.dtype = dtype;
    a->o.data = NULL;
    a->lse = kpt_tensor_contiguous(NULL, KPT_DTYPE_F32, 3,
                                   (int64_t[]){ref->o.shape[0], ref->o.shape[1], ref->o.shape[2]});
    memcpy(r->aux, ref->aux, (size_t)ref->num_aux * sizeof(*r->aux));
    a->aux = r->aux;
    kpt_status st = KPT_OK;
    for (int i = 0; !st && i < 3; i++)
        st = kptc_upload(r, i == 0 ? &a->q : i == 1 ? &a->k : &a->v, true, d);
    for (int i = 0; !st && i < a->num_aux; i++)
        st = kptc_upload(r, &r->aux[i].tensor, true, d);
    if (!st && a->sinks.data)
        st = kptc_upload(r, &a->sinks, true, d);
    if (!st)
        st = kptc_upload(r, &a->o, false, d);
    if (!st)
        st = kptc_upload(r, &a->lse, false, d);
    return st;
}

kpt_status kptc_device_open(kptc_device_run *r, kpt_context *ctx, const kpt_pattern *p,
                            const kpt_attention_args *ref, kpt_dtype dtype, kpt_kernel **fwd,
                            kpt_kernel **bwd, kpt_diag *d)
{
    kpt_kernel_desc desc = {.dtype = dtype, .head_dim = (int)ref->q.shape[3],
                            .head_dim_v = (int)ref->v.shape[3]};
    r->ctx = ctx;
    kpt_status st = kpt_kernel_get(r->ctx, p, &desc, fwd, d);
    desc.options = KPT_DESC_BACKWARD;
    if (!st && bwd)
        st = kpt_kernel_get(r->ctx, p, &desc, bwd, d);
    return st;
}

int kptc_device_context(kpt_backend_kind kind, kpt_context **ctx)
{
    kpt_context_params cp = {.backend = kind, .flags = KPT_CONTEXT_NO_DISK_CACHE};
    kpt_diag d = {0};
    kpt_status st = kpt_context_create(&cp, ctx, &d);
    return st ? kptc_report(&d, st) : 0;
}

void kptc_device_close(kptc_device_run *r)
{
    for (int i = 0; i < r->nbufs; i++)
        kpt_buffer_destroy(&r->bufs[i]);
}
