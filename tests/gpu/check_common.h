/* What gpu_check (CUDA) and api_check (any backend) share: a case, its inputs and the comparison
 * of a backend's output with the CPU reference. Header-only; each checker includes it once. */
#ifndef KPT_TESTS_GPU_CHECK_COMMON_H
#define KPT_TESTS_GPU_CHECK_COMMON_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kpt/kpt.h>

#include "compiler/parse_lua.h"
#include "base/numeric.h"
#include "runtime/attention_args.h"
#include "tools/rng.h"

typedef struct gcase {
    const char *pattern;
    kpt_dtype dtype;
    int dqk, dv;
    int B, Hq, Hkv, Sq, Skv;
    const char *scalar; /* "name=value" or NULL */
    bool bshd;
    double scale; /* the softmax scale; 0: the default, 1/sqrt(Dqk) */
    bool sinks;   /* with attention sinks (one f32 logit per query head, -2 to 3) */
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

/* A case's host inputs and its reference result: q, k, v standard normal in c->dtype, aux
 * tensors (documents from 1 to 5 shared cut points, script fills, or uniform in the declared
 * range), the runtime scalar, and the reference's o and lse (f64, o in the case's layout). The
 * same seed gives the same data in every checker. `ref` points into the struct: do not copy it. */
typedef struct check_inputs {
    void *q, *k, *v;
    size_t q_bytes, k_bytes, v_bytes;
    void *aux[KPT_MAX_AUX];
    size_t aux_bytes[KPT_MAX_AUX];
    kpt_aux_tensor host_aux[KPT_MAX_AUX];
    kpt_scalar_value sv;
    char sname[32];
    double *ref_o, *ref_l;
    float sinks[64]; /* c->sinks: per query head */
    kpt_attention_args ref;
} check_inputs;

static void check_inputs_free(check_inputs *in)
{
    free(in->q);
    free(in->k);
    free(in->v);
    for (int a = 0; a < KPT_MAX_AUX; a++)
        free(in->aux[a]);
    free(in->ref_o);
    free(in->ref_l);
    memset(in, 0, sizeof(*in));
}

static void *check_normal(size_t n, kpt_dtype dt, kpt_rng *rng, size_t *bytes)
{
    *bytes = (n ? n : 1) * (size_t)kpt_dtype_size(dt);
    void *p = malloc(*bytes);
    for (size_t i = 0; p && i < n; i++)
        kpt_store_double(p, dt, (int64_t)i, kpt_rng_normal(rng));
    return p;
}

static bool check_fill_aux(const gcase *c, const kpt_pattern *p, kpt_rng *rng, uint64_t seed,
                           check_inputs *in, result *res)
{
    double cuts[5];
    int ncuts = (int)kpt_rng_range(rng, 1, 5);
    for (int i = 0; i < ncuts; i++)
        cuts[i] = kpt_rng_uniform(rng);
    for (int a = 0; a < p->num_aux; a++) {
        const kpt_aux_decl *ad = &p->aux[a];
        int64_t shape[KPT_AUX_MAX_RANK] = {1, 1, 1, 1}, count = 1;
        kpt_attn_shape s = {c->B, c->Hq, c->Hkv, c->Sq, c->Skv, c->dqk, c->dv};
        for (int i = 0; i < ad->rank; i++) {
            int64_t n = kpt_attn_dim_size(ad->dims[i], &s);
            shape[i] = n > 0 ? n : 64;
            count *= shape[i];
        }
        in->aux_bytes[a] = (size_t)count * (size_t)kpt_dtype_size(ad->dtype);
        if (!(in->aux[a] = calloc(1, in->aux_bytes[a]))) {
            snprintf(res->why, sizeof(res->why), "out of memory (aux)");
            return false;
        }
        if (ad->fill == KPT_FILL_SEGMENTS && ad->dtype == KPT_DTYPE_I32 && ad->rank == 2)
            fill_docs(in->aux[a], (int)shape[0], (int)shape[1], cuts, ncuts);
        else if (ad->fill == KPT_FILL_SCRIPT) {
            if (fill_from_script(c->pattern, ad, shape, count, seed, in->aux[a], res))
                return false;
        } else
            for (int64_t i = 0; i < count; i++)
                kpt_store_double(in->aux[a], ad->dtype, i,
                                 ad->fill_lo + (ad->fill_hi - ad->fill_lo) * kpt_rng_uniform(rng));
        in->host_aux[a].name = ad->name;
        in->host_aux[a].tensor = kpt_tensor_contiguous(in->aux[a], ad->dtype, ad->rank, shape);
    }
    return true;
}

/* Makes the inputs of case c and runs the reference; false with res->why on failure (in is
 * then freed). */
static bool check_inputs_make(const gcase *c, const kpt_pattern *p, uint64_t seed,
                              check_inputs *in, result *res)
{
    memset(in, 0, sizeof(*in));
    kpt_rng rng;
    kpt_rng_seed(&rng, seed);
    size_t no = (size_t)c->B * c->Hq * c->Sq * c->dv, nl = (size_t)c->B * c->Hq * c->Sq;
    in->q = check_normal((size_t)c->B * c->Hq * c->Sq * c->dqk, c->dtype, &rng, &in->q_bytes);
    in->k = check_normal((size_t)c->B * c->Hkv * c->Skv * c->dqk, c->dtype, &rng, &in->k_bytes);
    in->v = check_normal((size_t)c->B * c->Hkv * c->Skv * c->dv, c->dtype, &rng, &in->v_bytes);
    in->ref_o = malloc((no + 1) * sizeof(double));
    in->ref_l = malloc((nl + 1) * sizeof(double));
    if (!in->q || !in->k || !in->v || !in->ref_o || !in->ref_l) {
        snprintf(res->why, sizeof(res->why), "out of memory");
        check_inputs_free(in);
        return false;
    }
    if (!check_fill_aux(c, p, &rng, seed, in, res)) {
        check_inputs_free(in);
        return false;
    }
    if (c->scalar) {
        const char *eq = strchr(c->scalar, '=');
        snprintf(in->sname, sizeof(in->sname), "%.*s", (int)(eq - c->scalar), c->scalar);
        in->sv.name = in->sname;
        in->sv.value = atof(eq + 1);
    }
    in->ref = (kpt_attention_args){
        .q = tensor4(in->q, c->dtype, c, c->Hq, c->Sq, c->dqk),
        .k = tensor4(in->k, c->dtype, c, c->Hkv, c->Skv, c->dqk),
        .v = tensor4(in->v, c->dtype, c, c->Hkv, c->Skv, c->dv),
        .o = tensor4(in->ref_o, KPT_DTYPE_F64, c, c->Hq, c->Sq, c->dv),
        .lse = kpt_tensor_contiguous(in->ref_l, KPT_DTYPE_F64, 3, (int64_t[]){c->B, c->Hq, c->Sq}),
        .scalars = c->scalar ? &in->sv : NULL, .num_scalars = c->scalar ? 1 : 0,
        .aux = in->host_aux, .num_aux = p->num_aux, .scale = c->scale,
    };
    if (c->sinks) {
        for (int h = 0; h < c->Hq && h < 64; h++)
            in->sinks[h] = (float)(5.0 * kpt_rng_uniform(&rng) - 2.0);
        in->ref.sinks = kpt_tensor_contiguous(in->sinks, KPT_DTYPE_F32, 1, (int64_t[]){c->Hq});
    }
    kpt_diag d = {0};
    if (kpt_reference_attention(p, &in->ref, &d)) {
        snprintf(res->why, sizeof(res->why), "reference: %.140s", d.message);
        check_inputs_free(in);
        return false;
    }
    return true;
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
                /* the measured error of every row (the report's "lse err" column), not only
                 * of rows past the tolerance; an empty row must give exactly -inf */
                if (isnan(g))
                    res->nan++;
                else if (empty)
                    res->lse_err = g != -INFINITY ? INFINITY : res->lse_err;
                else
                    res->lse_err = fmax(res->lse_err, fabs(g - rl) / fmax(1.0, fabs(rl)));
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
