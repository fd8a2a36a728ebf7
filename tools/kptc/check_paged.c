/* kptc check --page-size / --seqlens / --sinks: a serving batch (ragged sequences over a paged
 * or contiguous KV cache) through the serving reference, checked for consistency, and with a
 * device backend through the serving kernels, compared with it (outputs poisoned). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/numeric.h"
#include "tools/kptc/kptc.h"
#include "tools/paged_batch.h"

int kptc_parse_seqlens(const char *s, int *q, int *kv, int max, int *n)
{
    *n = 0;
    while (s && *s) {
        char *end;
        long a = strtol(s, &end, 10), b;
        if (end == s || *end != ':' || a < 0 || a > 1 << 20)
            return kptc_usage_error("--seqlens wants Q:KV[,Q:KV...], got '%s'", s);
        s = end + 1;
        b = strtol(s, &end, 10);
        if (end == s || b < a || b > 1 << 24)
            return kptc_usage_error("--seqlens: each KV must be >= its Q and at most 2^24 ('%s')",
                                    s);
        if (*n == max)
            return kptc_usage_error("--seqlens: at most %d sequences", max);
        q[*n] = (int)a;
        kv[(*n)++] = (int)b;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',')
            return kptc_usage_error("--seqlens: unexpected '%s'", end);
    }
    return *n ? 0 : kptc_usage_error("--seqlens: no sequence given");
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The device run: inputs copied, outputs poisoned, the plan from the host lengths, a workspace
 * of the plan's size; o and lse read back into o_host (dtype) and l_host (f32). */
static kpt_status device_run(kpt_context *ctx, const kpt_pattern *p, const kpt_paged_batch *pb,
                             kpt_paged_args a, void *o_host, float *l_host, kpt_paged_plan *plan,
                             kpt_diag *d)
{
    kptc_device_run r = {.ctx = ctx};
    kpt_tensor *in[] = {&a.q, &a.k, &a.v, &a.page_table, &a.cu_seqlens_q, &a.kv_lens, &a.sinks};
    kpt_aux_tensor aux[KPT_MAX_AUX];
    kpt_status st = KPT_OK;
    for (size_t i = 0; !st && i < sizeof(in) / sizeof(in[0]); i++)
        if (in[i]->data)
            st = kptc_upload(&r, in[i], true, d);
    for (int i = 0; !st && i < a.num_aux; i++) {
        aux[i] = a.aux[i];
        st = kptc_upload(&r, &aux[i].tensor, true, d);
    }
    a.aux = aux;
    a.o.dtype = pb->dtype;
    a.lse.dtype = KPT_DTYPE_F32;
    if (!st)
        st = kptc_upload(&r, &a.o, false, d);
    kpt_buffer *ob = st ? NULL : r.bufs[r.nbufs - 1];
    if (!st)
        st = kptc_upload(&r, &a.lse, false, d);
    kpt_buffer *lb = st ? NULL : r.bufs[r.nbufs - 1];
    kpt_kernel *k = NULL;
    kpt_kernel_desc desc = {.dtype = pb->dtype, .head_dim = pb->d, .head_dim_v = pb->dv,
                            .options = KPT_DESC_PAGED};
    kpt_paged_shape shape = {.batch = pb->B, .cu_seqlens_q = pb->cu, .kv_lens = pb->kv,
                             .num_heads_q = pb->hq, .num_heads_kv = pb->hkv};
    if (!st)
        st = kpt_kernel_get(ctx, p, &desc, &k, d);
    if (!st)
        st = kpt_paged_plan_make(k, &shape, plan, d);
    kpt_buffer *ws = NULL;
    if (!st && plan->workspace_bytes)
        st = kpt_buffer_create(ctx, plan->workspace_bytes, &ws, d);
    if (!st)
        st = kpt_paged_run(k, plan, &a, ws ? kpt_buffer_data(ws) : NULL, plan->workspace_bytes,
                           NULL, d);
    if (!st)
        st = kpt_context_synchronize(ctx, d);
    if (!st)
        st = kpt_buffer_read(ob, 0, o_host, kptc_span(&a.o), d);
    if (!st)
        st = kpt_buffer_read(lb, 0, l_host, kptc_span(&a.lse), d);
    kpt_buffer_destroy(&ws);
    kptc_device_close(&r);
    return st;
}

int kptc_check_paged(kpt_context *dev, const kpt_pattern *p, const kptc_paged_opts *po,
                     const kpt_scalar_value *scalars, int nscalars, const kpt_aux_tensor *aux,
                     int naux)
{
    kpt_rng rng;
    kpt_rng_seed(&rng, po->seed);
    kpt_paged_batch pb;
    kpt_diag d = {0};
    if (!kpt_paged_batch_make(&pb, po->n, po->q, po->kv, po->page, false, po->dtype, po->hq,
                              po->hkv, po->d, po->dv, &rng)) {
        kpt_paged_batch_free(&pb);
        fprintf(stderr, "kptc: out of memory\n");
        return 1;
    }
    size_t rows = (size_t)pb.T * pb.hq;
    double *o = calloc(rows * pb.dv + 1, sizeof(double)), *lse = calloc(rows + 1, sizeof(double));
    kpt_paged_batch_mem m = {pb.q, pb.k, pb.v, o, lse, pb.pt, pb.cu, pb.kv,
                             po->sinks ? pb.sinks : NULL, KPT_DTYPE_F64, KPT_DTYPE_F64};
    kpt_paged_args a = kpt_paged_batch_args(&pb, &m, aux, naux);
    a.scalars = scalars;
    a.num_scalars = nscalars;
    double t0 = now_s();
    kpt_status st = o && lse ? kpt_reference_paged_attention(p, &a, &d) : KPT_ERR_NO_MEMORY;
    double t1 = now_s();
    int rc = 0;
    if (st) {
        rc = kptc_report(&d, st);
        goto out;
    }
    /* consistency: finite rows where a key is kept (or a sink joins), 0 and -inf where none */
    int64_t bad = 0, empty = 0;
    for (int b = 0; b < pb.B; b++)
        for (size_t r = (size_t)pb.cu[b] * pb.hq; r < (size_t)pb.cu[b + 1] * pb.hq; r++) {
            bool zero = true, finite = true;
            for (int e = 0; e < pb.dv; e++) {
                zero &= o[r * pb.dv + e] == 0;
                finite &= isfinite(o[r * pb.dv + e]) != 0;
            }
            empty += lse[r] == -INFINITY;
            bad += lse[r] == -INFINITY ? !zero : !finite || !isfinite(lse[r]);
        }
    printf("kptc check: pattern '%s', serving batch on the cpu reference (double precision)\n",
           p->name);
    printf("  batch      %d sequences (queries:keys", pb.B);
    for (int b = 0; b < pb.B && b < 8; b++)
        printf("%s%d:%d", b ? ", " : " ", po->q[b], po->kv[b]);
    printf("%s), Hq=%d Hkv=%d D=%d", pb.B > 8 ? ", ..." : "", pb.hq, pb.hkv, pb.d);
    if (pb.dv != pb.d)
        printf(" Dv=%d", pb.dv);
    printf(", %s\n", kpt_dtype_name(pb.dtype));
    if (pb.page)
        printf("  cache      %d pages of %d rows, shuffled; page table [%d, %d]\n", pb.P, pb.page,
               pb.B, pb.maxp);
    else
        printf("  cache      contiguous [%d, %d, %d, %d]\n", pb.P, pb.rows, pb.hkv, pb.d);
    printf("  sinks      %s\n", po->sinks ? "random, one per query head" : "none");
    printf("  output     %lld rows with nothing kept; %s\n", (long long)empty,
           bad ? "INCONSISTENT rows found" : "all rows consistent");
    printf("  time       %.3f s for the reference\n", t1 - t0);
    fflush(stdout);
    if (bad) {
        fprintf(stderr, "kptc: check failed\n");
        rc = 1;
        goto out;
    }
    if (dev) {
        size_t es = (size_t)kpt_dtype_size(pb.dtype);
        void *go = malloc(rows * pb.dv * es + 16);
        float *gl = malloc(rows * sizeof(float) + 16);
        kpt_paged_plan plan;
        st = go && gl ? device_run(dev, p, &pb, a, go, gl, &plan, &d) : KPT_ERR_NO_MEMORY;
        if (st) {
            rc = kptc_report(&d, st);
        } else {
            double num = 0, den = 0, lerr = 0;
            int64_t nan = 0;
            for (int b = 0; b < pb.B; b++)
                for (size_t r = (size_t)pb.cu[b] * pb.hq; r < (size_t)pb.cu[b + 1] * pb.hq; r++) {
                    nan += isnan(gl[r]) != 0;
                    if (lse[r] == -INFINITY)
                        lerr = gl[r] == -INFINITY ? lerr : INFINITY;
                    else
                        lerr = fmax(lerr, fabs(gl[r] - lse[r]) / fmax(1.0, fabs(lse[r])));
                    for (int e = 0; e < pb.dv; e++) {
                        double x = kpt_load_as_double(go, pb.dtype, (int64_t)(r * pb.dv + e));
                        double y = o[r * pb.dv + e];
                        nan += isnan(x) != 0;
                        num += (x - y) * (x - y);
                        den += y * y;
                    }
                }
            double rel = den > 0 ? sqrt(num / den) : sqrt(num);
            double tol = pb.dtype == KPT_DTYPE_BF16 ? 1e-2 : 5e-3;
            bool pass = nan == 0 && rel <= tol && !(lerr > 1e-3);
            printf("  %-10s %s: plan %d split%s, %d query rows a CTA; relative RMS error %.3g "
                   "(tolerance %g), LSE %.3g; %s\n", kpt_context_target(dev),
                   kpt_context_device_name(dev), plan.splits, plan.splits == 1 ? "" : "s",
                   plan.rows, rel, tol, lerr, nan ? "NaN or unwritten outputs" : "all written");
            if (!pass) {
                fprintf(stderr, "kptc: the device disagrees with the reference\n");
                rc = 1;
            }
        }
        free(go);
        free(gl);
    }
out:
    free(o);
    free(lse);
    kpt_paged_batch_free(&pb);
    return rc;
}
