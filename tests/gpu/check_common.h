/* What gpu_check (CUDA) and vulkan_check share: a case, its inputs and the comparison of a
 * backend's output with the CPU reference. Header-only; each checker includes it once. */
#ifndef KPT_TESTS_GPU_CHECK_COMMON_H
#define KPT_TESTS_GPU_CHECK_COMMON_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kpt/kpt.h>

#include "compiler/parse_lua.h"
#include "ir/numeric.h"

typedef struct gcase {
    const char *pattern;
    kpt_dtype dtype;
    int dqk, dv;
    int B, Hq, Hkv, Sq, Skv;
    const char *scalar; /* "name=value" or NULL */
    bool bshd;
} gcase;

/* A [B, H, S, D] tensor, bhsd or bshd. */
static kpt_tensor tensor4(void *data, kpt_dtype dt, const gcase *c, int H, int S, int D)
{
    int64_t shape[4] = {c->B, H, S, D};
    kpt_tensor t = kpt_tensor_contiguous(data, dt, 4, shape);
    if (c->bshd) {
        t.stride[3] = 1;
        t.stride[1] = D;
        t.stride[2] = (int64_t)H * D;
        t.stride[0] = (int64_t)S * H * D;
    }
    return t;
}

/* Sorted document ids: 1 to 5 cut points at random fractions, shared by doc_q and doc_kv so the
 * documents line up when Sq == Skv. */
static void fill_docs(int32_t *ids, int B, int S, const double *cuts, int ncuts)
{
    for (int b = 0; b < B; b++)
        for (int i = 0; i < S; i++) {
            int id = 0;
            for (int k = 0; k < ncuts; k++)
                id += cuts[k] <= (double)i / (double)S;
            ids[(int64_t)b * S + i] = id;
        }
}

typedef struct result {
    double rel, lse_err;
    int64_t nan, empty_bad;
    bool pass;
    char why[160];
} result;

/* An aux tensor filled by the script's own fill function (run again in a fresh sandbox). */
static int fill_from_script(const char *path, const kpt_aux_decl *ad, const int64_t *shape,
                            int64_t count, uint64_t seed, void *out, result *res)
{
    kpt_diag d = {0};
    size_t len;
    char *src = kpt_lua_read_file(path, &len, &d);
    double *vals = malloc((size_t)count * sizeof(double));
    kpt_lua_params prm = {.name = path};
    kpt_status st = src && vals ? kpt_lua_fill_aux(src, len, &prm, ad->name, ad->rank, shape,
                                                   seed, vals, &d)
                                : KPT_ERR_NO_MEMORY;
    for (int64_t i = 0; st == KPT_OK && i < count; i++)
        kpt_store_double(out, ad->dtype, i, vals[i]);
    if (st)
        snprintf(res->why, sizeof(res->why), "aux fill: %.140s", d.message);
    free(src);
    free(vals);
    return st != KPT_OK;
}

/* Compares a backend's o (laid out as o_layout, dtype c->dtype) and f32 lse ([B, Hq, Sq]) with
 * the reference's (f64, the same layout); fills res and sets res->pass. Tolerances: relative RMS
 * error 1e-2 (bf16), 5e-3 (f16), 1e-4 (f32); LSE 1e-3 relative; no NaN (the outputs were
 * poisoned, so NaN also means "not written"); rows with nothing kept exactly 0 and -inf. */
static void check_compare(const gcase *c, const kpt_tensor *o_layout, const void *o,
                          const float *lse, const double *ref_o, const double *ref_l, result *res)
{
    double num = 0, den = 0;
    const float *gl = lse;
    for (int b = 0; b < c->B; b++)
        for (int h = 0; h < c->Hq; h++)
            for (int s = 0; s < c->Sq; s++) {
                int64_t row = ((int64_t)b * c->Hq + h) * c->Sq + s;
                double rl = ref_l[row], g = gl[row];
                bool empty = rl == -INFINITY;
                if (isnan(g))
                    res->nan++;
                else if (empty ? g != -INFINITY : fabs(g - rl) > 1e-3 * fmax(1.0, fabs(rl)))
                    res->lse_err = fmax(res->lse_err, empty ? INFINITY : fabs(g - rl) / fmax(1.0, fabs(rl)));
                for (int e = 0; e < c->dv; e++) {
                    int64_t off = b * o_layout->stride[0] + h * o_layout->stride[1] + s * o_layout->stride[2] + e;
                    double x = kpt_load_as_double(o, c->dtype, off), y = ref_o[off];
                    if (isnan(x)) {
                        res->nan++;
                        continue;
                    }
                    if (empty && x != 0)
                        res->empty_bad++;
                    num += (x - y) * (x - y);
                    den += y * y;
                }
            }
    res->rel = den > 0 ? sqrt(num / den) : sqrt(num);
    double tol = c->dtype == KPT_DTYPE_BF16 ? 1e-2 : c->dtype == KPT_DTYPE_F16 ? 5e-3 : 1e-4;
    res->pass = res->nan == 0 && res->empty_bad == 0 && res->rel <= tol && res->lse_err <= 1e-3;
    if (!res->pass)
        snprintf(res->why, sizeof(res->why), "rel %.3g (tol %.0e), lse %.3g, NaN/unwritten %lld, "
                 "nonzero empty rows %lld", res->rel, tol, res->lse_err, (long long)res->nan,
                 (long long)res->empty_bad);
}

#endif
