/* kptc check: a pattern on random inputs through the CPU reference (and optionally a backend's
 * kernel on this machine), with the mask analysis checked against the brute-force mask. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/diag.h"
#include "base/numeric.h"
#include "compiler/analyze_mask.h"
#include "compiler/pipeline.h"
#include "runtime/attention_args.h"
#include "target/target.h"
#include "tools/kptc/kptc.h"
#include "tools/npy.h"
#include "tools/rng.h"

typedef struct check_ctx {
    kptc_options o;
    kpt_backend_kind backend; /* --backend (default cpu) */
    kpt_pattern *p;
    int64_t B, Hq, Hkv, Sq, Skv, Dqk, Dv;
    kpt_dtype dtype;
    bool bshd;
    uint64_t seed;
    int64_t tile_q, tile_k;
    kpt_scalar_value scalars[KPT_MAX_SCALARS];
    int nscalars;
    kptc_script sc;
    kpt_aux_tensor aux[KPT_MAX_AUX];
    void *aux_data[KPT_MAX_AUX];
    char aux_desc[KPT_MAX_AUX][96];
    int naux;
    kpt_context *dev; /* the device backend's context; NULL for the CPU reference alone */
} check_ctx;

/* the most elements kptc check fills an aux tensor with (a script may declare any size) */
#define KPTC_MAX_AUX_ELEMENTS ((int64_t)1 << 31)

static int parse_shape(check_ctx *c)
{
    c->B = 1, c->Hq = 4, c->Hkv = 2, c->Sq = 512, c->Skv = 512, c->Dqk = 64, c->Dv = -1;
    if (c->o.shape) {
        int64_t v[7];
        int n = 0;
        const char *s = c->o.shape;
        while (n < 7) {
            char buf[24];
            size_t len = strcspn(s, ",");
            if (len == 0 || len >= sizeof(buf))
                break;
            memcpy(buf, s, len);
            buf[len] = 0;
            if (!kptc_parse_int(buf, 1, 1 << 24, &v[n]))
                return kptc_usage_error(
                    "--shape: '%s' is not a positive integer (up to 16777216)", buf);
            n++;
            s += len;
            if (*s != ',')
                break;
            s++;
        }
        if ((n != 6 && n != 7) || *s)
            return kptc_usage_error("--shape wants B,Hq,Hkv,Sq,Skv,Dqk[,Dv], got '%s'", c->o.shape);
        c->B = v[0], c->Hq = v[1], c->Hkv = v[2], c->Sq = v[3], c->Skv = v[4], c->Dqk = v[5];
        c->Dv = n == 7 ? v[6] : -1;
    }
    if (c->Dv < 0)
        c->Dv = c->Dqk;
    if (c->Hq % c->Hkv)
        return kptc_usage_error("--shape: Hq (%lld) must be a multiple of Hkv (%lld)",
                                (long long)c->Hq, (long long)c->Hkv);
    if ((double)c->Sq * (double)c->Skv > (double)(1 << 30))
        return kptc_usage_error("--shape: Sq x Skv is too large for check's brute-force mask "
                                "(at most 2^30)");
    double work = (double)c->B * c->Hq * c->Sq * c->Skv * (c->Dqk + c->Dv);
    if (work > 4e11)
        return kptc_usage_error("--shape: too large for the CPU reference (%.3g multiply-adds)",
                                work);
    c->dtype = KPT_DTYPE_BF16;
    if (c->o.dtype) {
        c->dtype = kpt_dtype_from_name(c->o.dtype);
        if (c->dtype != KPT_DTYPE_F16 && c->dtype != KPT_DTYPE_BF16 && c->dtype != KPT_DTYPE_F32)
            return kptc_usage_error("--dtype '%s': expected f16, bf16 or f32", c->o.dtype);
    }
    const char *layout = c->o.layout ? c->o.layout : "bhsd";
    if (strcmp(layout, "bhsd") && strcmp(layout, "bshd"))
        return kptc_usage_error("--layout '%s': expected bhsd or bshd", layout);
    c->bshd = layout[1] == 's';
    int64_t seed = 1;
    if (c->o.seed && !kptc_parse_int(c->o.seed, 0, INT64_MAX, &seed))
        return kptc_usage_error("--seed '%s' is not a non-negative integer", c->o.seed);
    c->seed = (uint64_t)seed;
    c->tile_q = c->tile_k = 64;
    if (c->o.tile) {
        char *x = strchr(c->o.tile, 'x');
        char qb[16];
        size_t ql = x ? (size_t)(x - c->o.tile) : 0;
        if (!x || ql == 0 || ql >= sizeof(qb))
            return kptc_usage_error("--tile wants QxK, e.g. 128x64");
        memcpy(qb, c->o.tile, ql);
        qb[ql] = 0;
        if (!kptc_parse_int(qb, 1, 4096, &c->tile_q) || !kptc_parse_int(x + 1, 1, 4096, &c->tile_k))
            return kptc_usage_error("--tile wants QxK with sizes 1..4096, got '%s'", c->o.tile);
    }
    return 0;
}

static int parse_scalars(check_ctx *c)
{
    static char names[KPT_MAX_SCALARS][KPT_NAME_MAX];
    for (int i = 0; i < c->o.nscalars; i++) {
        if (c->nscalars == KPT_MAX_SCALARS)
            return kptc_usage_error("--scalar '%s': too many scalars", c->o.scalars[i]);
        const char *arg = c->o.scalars[i];
        int rc = kptc_parse_assignment("--scalar", arg[0] == '$' ? arg + 1 : arg, false,
                                       names[c->nscalars], &c->scalars[c->nscalars].value);
        if (rc)
            return rc;
        c->scalars[c->nscalars].name = names[c->nscalars];
        c->nscalars++;
    }
    return 0;
}

/* Generated aux tensors take their declared sizes; a free dimension gets 64 entries. */
static int64_t dim_value(const check_ctx *c, int64_t dim)
{
    kpt_attn_shape s = {c->B, c->Hq, c->Hkv, c->Sq, c->Skv, c->Dqk, c->Dv};
    int64_t n = kpt_attn_dim_size(dim, &s);
    return n > 0 ? n : 64;
}

/* Sorted segment ids along the last dimension: the same random cut points (as fractions of the
 * length) for every tensor filled this way, so doc_q and doc_kv agree when Sq == Skv. */
static void fill_segments(check_ctx *c, const kpt_aux_decl *d, const int64_t *shape, void *data)
{
    int64_t len = shape[d->rank - 1], rows = 1;
    for (int i = 0; i < d->rank - 1; i++)
        rows *= shape[i];
    for (int64_t r = 0; r < rows; r++) {
        kpt_rng rng;
        kpt_rng_seed(&rng, c->seed * 7919 + (uint64_t)r);
        int ncuts = (int)kpt_rng_range(&rng, 2, 5); /* 3 to 6 documents */
        double cuts[6];
        for (int i = 0; i < ncuts; i++)
            cuts[i] = kpt_rng_uniform(&rng);
        for (int64_t i = 0; i < len; i++) {
            int id = 0;
            for (int k = 0; k < ncuts; k++)
                id += cuts[k] <= (double)i / (double)len;
            kpt_store_double(data, d->dtype, r * len + i, id);
        }
    }
}

static int make_aux(check_ctx *c)
{
    kpt_rng rng;
    kpt_rng_seed(&rng, c->seed ^ 0xa5a5a5a5ull);
    const char *files[KPT_MAX_AUX] = {NULL}; /* by aux index; the last --aux for a name wins */
    for (int i = 0; i < c->o.naux; i++) {
        const char *eq = strchr(c->o.aux[i], '=');
        char name[KPT_NAME_MAX];
        size_t n = eq ? (size_t)(eq - c->o.aux[i]) : 0;
        if (!eq || n == 0 || n >= sizeof(name))
            return kptc_usage_error("--aux wants NAME=FILE.npy, got '%s'", c->o.aux[i]);
        memcpy(name, c->o.aux[i], n);
        name[n] = 0;
        int idx = kpt_pattern_find_aux(c->p, name);
        if (idx < 0)
            return kptc_usage_error("--aux %s: the pattern has no aux tensor '%s'", c->o.aux[i],
                                    name);
        files[idx] = eq + 1;
    }
    for (int a = 0; a < c->p->num_aux; a++) {
        const kpt_aux_decl *d = &c->p->aux[a];
        const char *file = files[a];
        int64_t shape[KPT_AUX_MAX_RANK] = {1, 1, 1, 1}, count = 1;
        kpt_npy npy = {0};
        if (file) {
            kpt_diag diag = {0};
            kpt_status st = kpt_npy_load(file, &npy, &diag);
            if (st)
                return kptc_report(&diag, st);
            if (npy.rank != d->rank) {
                int rank = npy.rank; /* kpt_npy_free clears it */
                kpt_npy_free(&npy);
                return kptc_usage_error("--aux %s: %s has rank %d, the pattern wants %d", d->name,
                                        file, rank, d->rank);
            }
            if (d->dtype == KPT_DTYPE_I32 || d->dtype == KPT_DTYPE_BOOL)
                for (int64_t i = 0; i < npy.count; i++)
                    if (npy.values[i] != floor(npy.values[i]) || fabs(npy.values[i]) > INT32_MAX) {
                        kpt_npy_free(&npy);
                        return kptc_usage_error("--aux %s: element %lld of %s is not an i32",
                                                d->name, (long long)i, file);
                    }
        }
        for (int k = 0; k < d->rank; k++) {
            shape[k] = file ? npy.shape[k] : dim_value(c, d->dims[k]);
            /* a script may declare any fixed size: check before multiplying, never wrap */
            if (shape[k] > 0 && count > KPTC_MAX_AUX_ELEMENTS / shape[k]) {
                kpt_npy_free(&npy);
                return kptc_usage_error("aux tensor %s: more than %lld elements (a dimension of "
                                        "%lld): kptc check makes at most that many",
                                        d->name, (long long)KPTC_MAX_AUX_ELEMENTS,
                                        (long long)shape[k]);
            }
            count *= shape[k];
        }
        void *data = calloc((size_t)(count ? count : 1), (size_t)kpt_dtype_size(d->dtype));
        if (!data) {
            kpt_npy_free(&npy);
            fprintf(stderr, "kptc: out of memory\n");
            return 1;
        }
        c->aux_data[a] = data;
        if (file) {
            for (int64_t i = 0; i < count; i++)
                kpt_store_double(data, d->dtype, i, npy.values[i]);
            snprintf(c->aux_desc[a], sizeof(c->aux_desc[a]), "from %.60s (%s)", file, npy.descr);
            kpt_npy_free(&npy);
        } else if (d->fill == KPT_FILL_SCRIPT) {
            double *vals = malloc((size_t)(count ? count : 1) * sizeof(double));
            kpt_diag diag = {0};
            kpt_status st = vals ? kpt_lua_fill_aux(c->sc.src, c->sc.len, &c->sc.prm, d->name,
                                                    d->rank, shape, c->seed, vals, &diag)
                                 : kpt_diag_set(&diag, KPT_ERR_NO_MEMORY, "out of memory");
            if (st) {
                free(vals);
                return kptc_report(&diag, st);
            }
            for (int64_t i = 0; i < count; i++)
                kpt_store_double(data, d->dtype, i, vals[i]);
            free(vals);
            snprintf(c->aux_desc[a], sizeof(c->aux_desc[a]), "generated by the script's fill");
        } else if (d->fill == KPT_FILL_SEGMENTS) {
            fill_segments(c, d, shape, data);
            snprintf(c->aux_desc[a], sizeof(c->aux_desc[a]),
                     "generated: sorted segments of random lengths");
        } else {
            for (int64_t i = 0; i < count; i++) {
                double v = d->dtype == KPT_DTYPE_F32 || d->dtype == KPT_DTYPE_F16 ||
                                   d->dtype == KPT_DTYPE_BF16
                               ? d->fill_lo + (d->fill_hi - d->fill_lo) * kpt_rng_uniform(&rng)
                               : (double)kpt_rng_range(&rng, (int64_t)d->fill_lo, (int64_t)d->fill_hi);
                kpt_store_double(data, d->dtype, i, v);
            }
            snprintf(c->aux_desc[a], sizeof(c->aux_desc[a]), "generated: uniform in [%g, %g]",
                     d->fill_lo, d->fill_hi);
        }
        c->aux[a].name = d->name;
        c->aux[a].tensor = kpt_tensor_contiguous(data, d->dtype, d->rank, shape);
        c->naux = a + 1;
    }
    return 0;
}

/* A [B, H, S, D] tensor in the chosen layout. */
static kpt_tensor make_tensor(const check_ctx *c, void *data, kpt_dtype dt, int64_t H, int64_t S,
                              int64_t D)
{
    int64_t shape[4] = {c->B, H, S, D};
    kpt_tensor t = kpt_tensor_contiguous(data, dt, 4, shape);
    if (c->bshd) {
        t.stride[3] = 1;
        t.stride[1] = D;
        t.stride[2] = H * D;
        t.stride[0] = S * H * D;
    }
    return t;
}

static void *random_tensor(kpt_rng *rng, kpt_dtype dt, int64_t n)
{
    void *p = malloc((size_t)n * (size_t)kpt_dtype_size(dt));
    if (p)
        for (int64_t i = 0; i < n; i++)
            kpt_store_double(p, dt, i, kpt_rng_normal(rng));
    return p;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct mask_stats {
    double kept_fraction;
    int64_t empty_rows;
    int64_t tiles[3];
    bool exact, agrees;
    const char *summary;
} mask_stats;

/* The brute-force mask: kept pairs over every (b, h), and for (b=0, h=0) each tile's true class
 * compared with the analysis (ms->agrees is false if the analysis ever contradicts it). */
static int mask_stats_compute(check_ctx *c, const kpt_ir_value *scalars,
                              const kpt_ir_auxview *aux, mask_stats *ms)
{
    kpt_pattern *p = c->p;
    memset(ms, 0, sizeof(*ms));
    ms->agrees = true;
    kpt_ir_value *vals = calloc(p->g.count ? p->g.count : 1, sizeof(*vals));
    uint8_t *bits = malloc((size_t)(c->Sq * c->Skv));
    kpt_ir_prog prog = {0};
    if (!vals || !bits || !kpt_ir_prog_init(&prog, &p->g, &p->mask, 1)) {
        free(vals);
        free(bits);
        return 1;
    }
    kpt_ir_env env = {.sq = (int32_t)c->Sq, .skv = (int32_t)c->Skv, .hq = (int32_t)c->Hq,
                      .scalars = scalars, .aux = aux};
    int64_t kept = 0;
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t h = 0; h < c->Hq; h++) {
            env.b = (int32_t)b;
            env.h = (int32_t)h;
            for (int64_t q = 0; q < c->Sq; q++) {
                env.q = (int32_t)q;
                int64_t row = 0;
                for (int64_t k = 0; k < c->Skv; k++) {
                    env.k = (int32_t)k;
                    bool keep = true;
                    if (p->mask) {
                        kpt_ir_prog_run(&prog, &env, vals);
                        keep = vals[p->mask].i != 0;
                    }
                    row += keep;
                    if (b == 0 && h == 0)
                        bits[q * c->Skv + k] = keep;
                }
                kept += row;
                ms->empty_rows += row == 0;
            }
        }
    ms->kept_fraction = (double)kept / ((double)c->B * c->Hq * c->Sq * c->Skv);
    kpt_mask_env menv = {.sq = (int32_t)c->Sq, .skv = (int32_t)c->Skv, .hq = (int32_t)c->Hq,
                         .b = 0, .h = 0, .b_known = true, .h_known = true, .scalars = scalars};
    kpt_mask_analysis *an = kpt_analyze_mask(p, &menv);
    bool analysed = an != NULL;
    if (an) {
        ms->exact = kpt_mask_analysis_exact(an);
        static char summary[160];
        snprintf(summary, sizeof(summary), "%s", kpt_mask_analysis_summary(an));
        ms->summary = summary;
        for (int64_t q0 = 0; q0 < c->Sq; q0 += c->tile_q)
            for (int64_t k0 = 0; k0 < c->Skv; k0 += c->tile_k) {
                kpt_tile_class cls = kpt_mask_classify(an, q0, q0 + c->tile_q, k0, k0 + c->tile_k);
                ms->tiles[cls]++;
                bool any = false, all = true;
                for (int64_t q = q0; q < q0 + c->tile_q && q < c->Sq; q++)
                    for (int64_t k = k0; k < k0 + c->tile_k && k < c->Skv; k++) {
                        any |= bits[q * c->Skv + k];
                        all &= bits[q * c->Skv + k];
                    }
                kpt_tile_class truth = !any ? KPT_TILE_EMPTY : all ? KPT_TILE_FULL : KPT_TILE_PARTIAL;
                if (cls != KPT_TILE_PARTIAL && cls != truth)
                    ms->agrees = false;
                if (ms->exact && cls != truth)
                    ms->agrees = false;
            }
        kpt_mask_analysis_free(&an);
    }
    kpt_ir_prog_free(&prog);
    free(vals);
    free(bits);
    return analysed ? 0 : 1;
}

/* Writes t (rank 3 or 4, any strides and dtype) in logical order as f64 .npy. */
static int save_tensor(const char *dir, const char *name, const kpt_tensor *t)
{
    int64_t count = 1, idx[4] = {0};
    for (int d = 0; d < t->rank; d++)
        count *= t->shape[d];
    double *v = malloc((size_t)count * sizeof(double));
    if (!v) {
        fprintf(stderr, "kptc: out of memory\n");
        return 1;
    }
    for (int64_t i = 0; i < count; i++) {
        int64_t off = 0;
        for (int d = 0; d < t->rank; d++)
            off += idx[d] * t->stride[d];
        v[i] = kpt_load_as_double(t->data, t->dtype, off);
        for (int d = t->rank - 1; d >= 0 && ++idx[d] == t->shape[d]; d--)
            idx[d] = 0;
    }
    char path[1200];
    snprintf(path, sizeof(path), "%s/%s.npy", dir, name);
    kpt_diag d = {0};
    kpt_status st = kpt_npy_save_f64(path, v, t->rank, t->shape, &d);
    free(v);
    return st ? kptc_report(&d, st) : 0;
}

static int save_all(const check_ctx *c, const kpt_attention_args *args)
{
    const struct {
        const char *name;
        const kpt_tensor *t;
    } list[] = {{"q", &args->q}, {"k", &args->k}, {"v", &args->v}, {"o", &args->o},
                {"lse", &args->lse}};
    for (size_t i = 0; i < sizeof(list) / sizeof(list[0]); i++)
        if (save_tensor(c->o.save, list[i].name, list[i].t))
            return 1;
    for (int a = 0; a < c->naux; a++) {
        char name[KPT_NAME_MAX + 8];
        snprintf(name, sizeof(name), "aux_%s", c->aux[a].name);
        if (save_tensor(c->o.save, name, &c->aux[a].tensor))
            return 1;
    }
    return 0;
}

/* The dense check's host buffers: q, k, v, o, lse, and the sinks (--sinks --backward). */
#define NBUFS 6

static void free_check(check_ctx *c, void **bufs, int nbufs)
{
    for (int i = 0; i < nbufs; i++)
        free(bufs[i]);
    for (int a = 0; a < KPT_MAX_AUX; a++)
        free(c->aux_data[a]);
    kpt_pattern_destroy(&c->p);
    free(c->sc.src);
    c->sc.src = NULL;
    kpt_context_destroy(&c->dev);
}

/* A dtype the backend's targets cannot take is refused before the reference runs. */
static int check_backend_dtype(const check_ctx *c)
{
    if (c->backend == KPT_BACKEND_CPU)
        return 0;
    unsigned dtypes = kpt_backend_dtypes(c->backend);
    if (dtypes & (1u << c->dtype))
        return 0;
    char list[64];
    const char *title = c->backend == KPT_BACKEND_CUDA ? "CUDA"
                        : c->backend == KPT_BACKEND_HIP ? "HIP"
                                                        : "Vulkan";
    return kptc_usage_error("dtype %s is not supported by the %s backend (%s); use --dtype",
                            kpt_dtype_name(c->dtype), title,
                            kpt_dtype_list(dtypes, list, sizeof(list)));
}

/* Serving mode: the sequences' lengths and the page size; aux tensors are then made for B =
 * the sequences and Sq = Skv = the longest kv length (what logical positions index). */
static int parse_paged(check_ctx *c, kptc_paged_opts *po)
{
    int rc = kptc_parse_seqlens(c->o.seqlens ? c->o.seqlens : "1:1000,4:3000,0:17,16:700", po->q,
                                po->kv, KPTC_MAX_SEQS, &po->n);
    int64_t page = 16;
    if (!rc && c->o.page_size && !kptc_parse_int(c->o.page_size, 0, 256, &page))
        rc = kptc_usage_error("--page-size wants 0 (contiguous) to 256, got '%s'", c->o.page_size);
    if (!rc && c->o.backward)
        rc = kptc_usage_error("serving mode has no --backward");
    if (rc)
        return rc;
    po->page = (int)page;
    po->sinks = c->o.sinks != NULL;
    po->hq = (int)c->Hq, po->hkv = (int)c->Hkv, po->d = (int)c->Dqk, po->dv = (int)c->Dv;
    po->dtype = c->dtype;
    po->seed = c->seed;
    int maxkv = 1;
    for (int i = 0; i < po->n; i++)
        maxkv = po->kv[i] > maxkv ? po->kv[i] : maxkv;
    c->B = po->n;
    c->Sq = c->Skv = maxkv;
    return 0;
}

int kptc_cmd_check(int argc, char **argv)
{
    check_ctx c;
    memset(&c, 0, sizeof(c));
    static const struct option longopts[] = {
        {"backend", required_argument, NULL, KPTC_OPT_BACKEND},
        {"shape", required_argument, NULL, KPTC_OPT_SHAPE},
        {"dtype", required_argument, NULL, KPTC_OPT_DTYPE},
        {"layout", required_argument, NULL, KPTC_OPT_LAYOUT},
        {"seed", required_argument, NULL, KPTC_OPT_SEED},
        {"scalar", required_argument, NULL, KPTC_OPT_SCALAR},
        {"aux", required_argument, NULL, KPTC_OPT_AUX},
        {"tile", required_argument, NULL, KPTC_OPT_TILE},
        {"save", required_argument, NULL, KPTC_OPT_SAVE},
        {"param", required_argument, NULL, KPTC_OPT_PARAM},
        {"backward", no_argument, NULL, KPTC_OPT_BACKWARD},
        {"page-size", required_argument, NULL, KPTC_OPT_PAGE_SIZE},
        {"seqlens", required_argument, NULL, KPTC_OPT_SEQLENS},
        {"sinks", no_argument, NULL, KPTC_OPT_SINKS},
        {"help", no_argument, NULL, 'h'},
        {0},
    };
    int rc = kptc_parse_options(argc, argv, longopts, kptc_usage_check, &c.o);
    if (!rc)
        rc = kptc_one_pattern(&c.o, "check");
    if (rc)
        return rc;
    c.backend = KPT_BACKEND_CPU;
    if (c.o.backend && (rc = kptc_parse_backend(c.o.backend, &c.backend)))
        return rc;
    if ((rc = parse_shape(&c)) || (rc = parse_scalars(&c)) || (rc = check_backend_dtype(&c)))
        return rc;
    kptc_paged_opts po = {0};
    /* --sinks alone asks for serving mode; with --backward, sinks on the dense shape */
    bool paged = c.o.page_size || c.o.seqlens || (c.o.sinks && !c.o.backward);
    if (paged && (rc = parse_paged(&c, &po)))
        return rc;
    kpt_diag d = {0};
    if ((rc = kptc_load_pattern(&c.o, &c.sc, &c.p)))
        return rc;
    kpt_status st = kpt_pipeline_run(c.p, NULL, &d);
    if (st || kptc_parse_only) {
        free_check(&c, NULL, 0);
        return st ? kptc_report(&d, st) : 0;
    }
    /* the device first: a missing driver or GPU is said before the reference runs */
    if (c.backend != KPT_BACKEND_CPU && (rc = kptc_device_context(c.backend, &c.dev))) {
        free_check(&c, NULL, 0);
        return rc;
    }
    void *bufs[NBUFS] = {0};
    if ((rc = make_aux(&c))) {
        free_check(&c, bufs, 0);
        return rc;
    }
    if (paged) {
        rc = kptc_check_paged(c.dev, c.p, &po, c.scalars, c.nscalars, c.aux, c.naux);
        free_check(&c, bufs, 0);
        return rc;
    }
    kpt_rng rng;
    kpt_rng_seed(&rng, c.seed);
    bufs[0] = random_tensor(&rng, c.dtype, c.B * c.Hq * c.Sq * c.Dqk);
    bufs[1] = random_tensor(&rng, c.dtype, c.B * c.Hkv * c.Skv * c.Dqk);
    bufs[2] = random_tensor(&rng, c.dtype, c.B * c.Hkv * c.Skv * c.Dv);
    bufs[3] = malloc((size_t)(c.B * c.Hq * c.Sq * c.Dv) * sizeof(double));
    bufs[4] = malloc((size_t)(c.B * c.Hq * c.Sq) * sizeof(double));
    bufs[5] = c.o.sinks ? random_tensor(&rng, KPT_DTYPE_F32, c.Hq) : NULL;
    if (!bufs[0] || !bufs[1] || !bufs[2] || !bufs[3] || !bufs[4] || (c.o.sinks && !bufs[5])) {
        free_check(&c, bufs, NBUFS);
        fprintf(stderr, "kptc: out of memory\n");
        return 1;
    }
    kpt_attention_args args = {
        .q = make_tensor(&c, bufs[0], c.dtype, c.Hq, c.Sq, c.Dqk),
        .k = make_tensor(&c, bufs[1], c.dtype, c.Hkv, c.Skv, c.Dqk),
        .v = make_tensor(&c, bufs[2], c.dtype, c.Hkv, c.Skv, c.Dv),
        .o = make_tensor(&c, bufs[3], KPT_DTYPE_F64, c.Hq, c.Sq, c.Dv),
        .lse = kpt_tensor_contiguous(bufs[4], KPT_DTYPE_F64, 3, (int64_t[]){c.B, c.Hq, c.Sq}),
        .scalars = c.scalars,
        .num_scalars = c.nscalars,
        .aux = c.aux,
        .num_aux = c.naux,
    };
    if (bufs[5])
        args.sinks = kpt_tensor_contiguous(bufs[5], KPT_DTYPE_F32, 1, (int64_t[]){c.Hq});
    kpt_attn_binding bind;
    st = kpt_attn_bind(c.p, &args, &bind, &d);
    if (st) {
        free_check(&c, bufs, NBUFS);
        return kptc_report(&d, st);
    }
    double t0 = now();
    st = kpt_reference_attention(c.p, &args, &d);
    double t1 = now();
    if (st) {
        free_check(&c, bufs, NBUFS);
        return kptc_report(&d, st);
    }
    mask_stats ms;
    if (mask_stats_compute(&c, bind.scalars, bind.aux, &ms)) {
        free_check(&c, bufs, NBUFS);
        fprintf(stderr, "kptc: out of memory\n");
        return 1;
    }
    /* consistency of the output: finite where rows keep keys, zero and -inf where none */
    const double *o = bufs[3], *lse = bufs[4];
    int64_t rows = c.B * c.Hq * c.Sq, bad = 0, masked = 0;
    double sum_abs = 0, lse_lo = INFINITY, lse_hi = -INFINITY;
    for (int64_t r = 0; r < rows; r++) {
        int64_t b = r / (c.Hq * c.Sq), h = r / c.Sq % c.Hq, q = r % c.Sq;
        const kpt_tensor *ot = &args.o;
        bool zero = true, finite = true;
        for (int64_t e = 0; e < c.Dv; e++) {
            double v = o[b * ot->stride[0] + h * ot->stride[1] + q * ot->stride[2] + e];
            zero &= v == 0;
            finite &= isfinite(v) != 0;
            sum_abs += fabs(v);
        }
        if (lse[r] == -INFINITY) {
            masked++;
            bad += !zero;
        } else {
            bad += !finite || !isfinite(lse[r]);
            if (lse[r] < lse_lo) lse_lo = lse[r];
            if (lse[r] > lse_hi) lse_hi = lse[r];
        }
    }
    bad += masked != (bufs[5] ? 0 : ms.empty_rows); /* a sink keeps every row's LSE finite */
    if (c.o.save && save_all(&c, &args)) {
        free_check(&c, bufs, NBUFS);
        return 1;
    }
    printf("kptc check: pattern '%s' on the cpu reference (double precision)\n", c.p->name);
    printf("  shape      B=%lld Hq=%lld Hkv=%lld Sq=%lld Skv=%lld Dqk=%lld Dv=%lld\n",
           (long long)c.B, (long long)c.Hq, (long long)c.Hkv, (long long)c.Sq, (long long)c.Skv,
           (long long)c.Dqk, (long long)c.Dv);
    printf("  inputs     %s, layout %s, seed %llu, standard normal\n", kpt_dtype_name(c.dtype),
           c.bshd ? "bshd" : "bhsd", (unsigned long long)c.seed);
    if (bufs[5])
        printf("  sinks      standard normal, one per query head (f32)\n");
    for (int i = 0; i < c.p->num_scalars; i++) {
        const kpt_scalar_decl *s = &c.p->scalars[i];
        double v = s->type == KPT_IR_I32 ? bind.scalars[i].i : bind.scalars[i].f;
        bool given = false;
        for (int k = 0; k < c.nscalars; k++)
            given |= !strcmp(c.scalars[k].name, s->name);
        printf("  scalar     $%s = %g (%s)\n", s->name, v, given ? "--scalar" : "default");
    }
    for (int a = 0; a < c.p->num_aux; a++) {
        const kpt_tensor *t = &c.aux[a].tensor;
        printf("  aux        %s %s [", c.p->aux[a].name, kpt_dtype_name(t->dtype));
        for (int k = 0; k < t->rank; k++)
            printf("%s%lld", k ? ", " : "", (long long)t->shape[k]);
        printf("]: %s\n", c.aux_desc[a]);
    }
    printf("  mask       %.2f%% of (q, k) pairs kept; %lld fully masked rows\n",
           100 * ms.kept_fraction, (long long)ms.empty_rows);
    if (ms.summary)
        printf("  analysis   %s\n", ms.summary);
    printf("  tiles      %lldx%lld (b=0, h=0): %lld empty, %lld full, %lld partial; %s\n",
           (long long)c.tile_q, (long long)c.tile_k, (long long)ms.tiles[KPT_TILE_EMPTY],
           (long long)ms.tiles[KPT_TILE_FULL], (long long)ms.tiles[KPT_TILE_PARTIAL],
           ms.agrees ? "agrees with the brute-force mask" : "CONTRADICTS the brute-force mask");
    printf("  output     mean |O| = %.4g; LSE in [%.4g, %.4g]; %s\n",
           sum_abs / (double)(rows * c.Dv), lse_lo, lse_hi,
           bad ? "INCONSISTENT rows found" : "all rows consistent");
    printf("  time       %.3f s for the reference attention\n", t1 - t0);
    fflush(stdout);
    if (c.dev && !bad && ms.agrees)
        rc = kptc_check_device(c.dev, c.p, &args, c.dtype);
    if (!rc && c.o.backward && !bad && ms.agrees)
        rc = kptc_check_backward(c.dev, c.p, &args, c.dtype, c.seed);
    free_check(&c, bufs, NBUFS);
    if (rc)
        return rc;
    if (bad || !ms.agrees) {
        fprintf(stderr, "kptc: check failed\n");
        return 1;
    }
    return 0;
}

