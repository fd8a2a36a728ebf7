/* paged_check: the serving kernels (include/kpt/serving.h) through the public API against the
 * CPU reference, on fresh random inputs with poisoned outputs: patterns x page sizes (1, 16, 64,
 * 256, no paging; token-major and head-major caches) x GQA ratios (1, 4, 8) x queries per
 * sequence (1, 4, 16, ragged with 0 and 1) x kv lengths (short to 20k, split and unsplit) x head
 * dims (64, 128, 256, Dqk != Dv), with and without sinks, a plan made from bounds reused for
 * shorter lengths, one made for 50 times the longest kv length (most parts of the split empty)
 * run without a workspace, one made for fewer queries than a sequence has (the rows past what
 * it covers must be NaN, never wrong), O with padded rows (unaligned for vector stores; the
 * pads must stay unwritten), and a batch too small to fill the GPU one CTA an SM (split for
 * several an SM: kpt_paged_plan_sms). Workspaces start as random bytes, and each split case
 * runs a second time over the workspace the first left: its o and lse must repeat bit for bit.
 *
 *   paged_check [--backend cuda|vulkan|cpu] [--quick] [--filter TEXT] [--shard K/N] [--seed N]
 *               [--repeat N]
 *
 * --shard K/N: only the cases whose index is K modulo N (0 <= K < N), so that N processes
 * share the matrix (the CPU reference of the long cases dominates a run's time).
 * --repeat N: after a case passes, runs it N times more and prints the median wall time of a
 * run (launch to synchronisation) and the GB/s of K and V read: a rough timing, for backends
 * (Vulkan) that bench/ does not cover.
 *
 * Prints a line per failing case and a summary; exits 0 when every case passes, 1 when one
 * fails, 77 (skip) when the backend has no device. On the CPU backend the kernels are the
 * reference itself: that run checks the API's plumbing only. Vulkan has a matrix of its own:
 * its kernel takes f32 too and any head dim, and on Mesa's llvmpipe (CI) a plan splits long kv
 * lengths for the driver's loop limit. A run fails when no case of its matrix split the keys
 * (the combine would go unchecked). */
#include <getopt.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kpt/kpt.h>

#include "base/clock.h"
#include "base/numeric.h"
#include "tools/paged_batch.h"
#include "tools/rng.h"
#include "tests/gpu/shard.h"

typedef struct pcase {
    const char *pattern;
    kpt_dtype dtype;
    int d, hq, hkv, dv; /* dv: V's and O's head dim */
    int page;        /* rows per page; 0: no page table */
    bool head_major; /* cache [pages, Hkv, page, D] */
    bool sinks;
    int B;
    int q[8], kv[8]; /* per sequence (the first B) */
    int bounds; /* plan from bounds (max_q, max_kv): 0 none, 1 above the real lengths, 2 with
                   max_q 1 (below them), 3 with max_kv 50 times the longest (the keys split
                   into parts most of which hold none) and no workspace (the run's own); 4:
                   from host lengths whose first sequence has half its queries (a packed plan
                   for fewer queries than the run's) */
    bool o_pad; /* O's rows padded by an element ([T, Hq, Dv + 1] strides): rows of most heads
                   start unaligned for vector stores, and the pads must stay unwritten */
    float scale; /* the scores' scale; 0: the default, 1 / sqrt(Dqk) */
} pcase;

static kpt_context *ctx;
static bool on_cpu;
static int repeat;

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median wall time (µs) of `repeat` runs of the call, each synchronised. */
static double time_runs(const kpt_kernel *k, const kpt_paged_plan *plan, const kpt_paged_args *a,
                        void *ws)
{
    double t[64];
    int n = repeat < 64 ? repeat : 64;
    for (int i = 0; i < n; i++) {
        double t0 = kpt_now_ms();
        if (kpt_paged_run(k, plan, a, ws, ws ? plan->workspace_bytes : 0, NULL, NULL) ||
            kpt_context_synchronize(ctx, NULL))
            return 0;
        t[i] = (kpt_now_ms() - t0) * 1e3;
    }
    qsort(t, (size_t)n, sizeof(t[0]), cmp_double);
    return n ? t[n / 2] : 0;
}

static kpt_buffer *upload(const void *src, size_t n)
{
    kpt_buffer *b = NULL;
    if (kpt_buffer_create(ctx, n ? n : 16, &b, NULL) || (n && kpt_buffer_write(b, 0, src, n, NULL)))
        kpt_buffer_destroy(&b);
    return b;
}

/* Random bytes into a fresh workspace: a run must not depend on what it held (a kernel that kept
 * state there between runs, or read a partial result no split wrote, shows here). */
static kpt_status garble(kpt_buffer *ws, size_t n, kpt_diag *d)
{
    unsigned char *g = malloc(n);
    if (!g) {
        snprintf(d->message, sizeof(d->message), "out of memory");
        return KPT_ERR_NO_MEMORY;
    }
    uint64_t x = 0x9e3779b97f4a7c15ull ^ n;
    for (size_t i = 0; i < n; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        g[i] = (unsigned char)(x >> 56);
    }
    kpt_status st = kpt_buffer_write(ws, 0, g, n, d);
    free(g);
    return st;
}

/* A split run again, outputs poisoned, over the workspace the first run left: the same bits as
 * the first's o and lse (what a CUDA graph's replays do: the combine's order is fixed). */
static bool same_again(kpt_kernel *k, const kpt_paged_plan *plan, const kpt_paged_args *da,
                       kpt_buffer *ws, kpt_buffer *dout, kpt_buffer *dl, const void *o,
                       const void *lse, size_t obytes, size_t lbytes, int poison)
{
    unsigned char *o2 = malloc(obytes), *l2 = malloc(lbytes);
    bool same = o2 && l2;
    if (same) {
        memset(o2, poison, obytes);
        memset(l2, poison, lbytes);
        same = !kpt_buffer_write(dout, 0, o2, obytes, NULL) &&
               !kpt_buffer_write(dl, 0, l2, lbytes, NULL) &&
               !kpt_paged_run(k, plan, da, ws ? kpt_buffer_data(ws) : NULL,
                              ws ? plan->workspace_bytes : 0, NULL, NULL) &&
               !kpt_context_synchronize(ctx, NULL) &&
               !kpt_buffer_read(dout, 0, o2, obytes, NULL) &&
               !kpt_buffer_read(dl, 0, l2, lbytes, NULL) && !memcmp(o, o2, obytes) &&
               !memcmp(lse, l2, lbytes);
    }
    free(o2);
    free(l2);
    return same;
}

static int naux_of(const kpt_pattern *p, const kpt_paged_batch *pb, void *docs,
                   kpt_aux_tensor *aux)
{
    int n = kpt_pattern_aux_count(p);
    int64_t shape[2] = {pb->B, pb->maxkv};
    for (int i = 0; i < n && i < 4; i++) {
        kpt_aux_info info;
        kpt_pattern_aux_info(p, i, &info);
        aux[i].name = info.name;
        aux[i].tensor = kpt_tensor_contiguous(docs, KPT_DTYPE_I32, 2, shape);
    }
    return n < 4 ? n : 4;
}

typedef struct outcome {
    double rel, lse_err;
    long nan, touched;
    int splits; /* the plan's */
    double us;  /* the median run's wall time (--repeat), or 0 */
    char why[200];
} outcome;

/* Whether token t is a query the plan does not reach: past the first max_q of its sequence,
 * or under a packed plan, past the queries the plan's blocks hold in cu_seqlens_q's order
 * (sequence b's from block (cu[b] + b (p - 1)) / p: include/kpt/serving.h). */
static bool past_plan(const kpt_paged_batch *h, const pcase *c, int t, const kpt_paged_plan *pl)
{
    for (int b = 0; b < c->B; b++) {
        if (t < h->cu[b] || t >= h->cu[b + 1])
            continue;
        if (pl->q_blocks)
            return t - h->cu[b] >= pl->max_q;
        const int p = pl->q_per_block, first = (int)(((int64_t)h->cu[b] + b * (p - 1)) / p);
        return t - h->cu[b] >= (pl->blocks - first) * p;
    }
    return false;
}

/* Elements between O's rows (one head's Dv values): Dv, or Dv + 1 where they are padded. */
static int o_row_stride(const pcase *c)
{
    return c->dv + (c->o_pad ? 1 : 0);
}

/* Whether output row `row` (O and its LSE gl) is NaN throughout. */
static bool nan_row(const void *o, const pcase *c, size_t row, float gl)
{
    for (int e = 0; e < c->dv; e++)
        if (!isnan(kpt_load_as_double(o, c->dtype, (int64_t)(row * o_row_stride(c) + e))))
            return false;
    return isnan(gl);
}

static bool run_case(const pcase *c, uint64_t seed, outcome *res)
{
    memset(res, 0, sizeof(*res));
    kpt_rng r;
    kpt_rng_seed(&r, seed);
    kpt_paged_batch h;
    kpt_diag d = {0};
    kpt_pattern *p = NULL;
    kpt_kernel *k = NULL;
    bool ok = kpt_paged_batch_make(&h, c->B, c->q, c->kv, c->page, c->head_major, c->dtype, c->hq,
                                   c->hkv, c->d, c->dv, &r);
    size_t plen = strlen(c->pattern);
    kpt_status pst = plen > 4 && !strcmp(c->pattern + plen - 4, ".lua")
                         ? kpt_pattern_from_lua_file(c->pattern, NULL, &p, &d)
                         : kpt_pattern_parse(c->pattern, &p, &d);
    if (ok && pst) {
        snprintf(res->why, sizeof(res->why), "pattern: %.150s", d.message);
        ok = false;
    }
    kpt_aux_tensor aux[4];
    int naux = ok ? naux_of(p, &h, h.docs, aux) : 0;
    /* the reference, in double precision */
    size_t orows = (size_t)h.T * c->hq;
    double *ref_o = calloc(orows * c->dv + 1, sizeof(double)), *ref_l = calloc(orows + 1, 8);
    if (ok) {
        kpt_paged_batch_mem hm = {h.q, h.k, h.v, ref_o, ref_l, h.pt, h.cu, h.kv,
                                  c->sinks ? h.sinks : NULL, KPT_DTYPE_F64, KPT_DTYPE_F64};
        kpt_paged_args ra = kpt_paged_batch_args(&h, &hm, aux, naux);
        ra.scale = c->scale;
        if (kpt_reference_paged_attention(p, &ra, &d)) {
            snprintf(res->why, sizeof(res->why), "reference: %.150s", d.message);
            ok = false;
        }
    }
    /* the device, outputs poisoned */
    size_t es = (size_t)kpt_dtype_size(c->dtype), obytes = orows * o_row_stride(c) * es;
    void *o = malloc(obytes), *lse = malloc(orows * 4 + 4);
    /* poison: NaN, or under a short plan a finite value (NaN there is the kernel's answer) */
    const bool short_plan = c->bounds == 2 || c->bounds == 4;
    const int poison = short_plan ? 0x7b : 0xff;
    memset(o, poison, obytes);
    memset(lse, poison, orows * 4);
    kpt_buffer *dq = NULL, *dk = NULL, *dv = NULL, *dout = NULL, *dl = NULL, *dpt = NULL,
               *dcu = NULL, *dkv = NULL, *ds = NULL, *ddoc = NULL, *ws = NULL;
    if (ok) {
        dq = upload(h.q, kpt_paged_batch_q_bytes(&h));
        dk = upload(h.k, kpt_paged_batch_cache_bytes(&h));
        dv = upload(h.v, kpt_paged_batch_v_bytes(&h));
        dout = upload(o, obytes);
        dl = upload(lse, orows * 4);
        dpt = upload(h.pt, kpt_paged_batch_pt_bytes(&h));
        dcu = upload(h.cu, sizeof(int32_t) * (size_t)(c->B + 1));
        dkv = upload(h.kv, sizeof(int32_t) * (size_t)c->B);
        ds = upload(h.sinks, sizeof(float) * (size_t)c->hq);
        ddoc = upload(h.docs, kpt_paged_batch_doc_bytes(&h));
        ok = dq && dk && dv && dout && dl && dpt && dcu && dkv && ds && ddoc;
        if (!ok)
            snprintf(res->why, sizeof(res->why), "device memory");
    }
    kpt_kernel_desc desc = {.dtype = c->dtype, .head_dim = c->d, .head_dim_v = c->dv,
                            .options = KPT_DESC_PAGED};
    if (ok && kpt_kernel_get(ctx, p, &desc, &k, &d)) {
        snprintf(res->why, sizeof(res->why), "kernel: %.150s", d.message);
        ok = false;
    }
    kpt_paged_shape shape = {.batch = c->B, .cu_seqlens_q = h.cu, .kv_lens = h.kv,
                             .num_heads_q = c->hq, .num_heads_kv = c->hkv};
    if (c->bounds) {
        shape.cu_seqlens_q = NULL;
        shape.kv_lens = NULL;
        shape.max_q = c->bounds == 2 ? 1 : 16;
        shape.max_kv = c->bounds == 3 ? 50 * h.maxkv : h.maxkv;
        for (int b = 0; b < c->B && c->bounds != 2; b++)
            shape.max_q = c->q[b] > shape.max_q ? c->q[b] : shape.max_q;
    }
    int32_t cut[9];
    if (c->bounds == 4) {
        shape.cu_seqlens_q = cut;
        shape.kv_lens = h.kv;
        cut[0] = 0;
        for (int b = 0; b < c->B; b++)
            cut[b + 1] = h.cu[b + 1] - c->q[0] / 2;
    }
    kpt_paged_plan plan;
    if (ok && kpt_paged_plan_make(k, &shape, &plan, &d)) {
        snprintf(res->why, sizeof(res->why), "plan: %.150s", d.message);
        ok = false;
    }
    res->splits = ok ? plan.splits : 0;
    if (ok && plan.workspace_bytes && c->bounds != 3 &&
        (kpt_buffer_create(ctx, plan.workspace_bytes, &ws, &d) ||
         garble(ws, plan.workspace_bytes, &d))) {
        snprintf(res->why, sizeof(res->why), "workspace: %.150s", d.message);
        ok = false;
    }
    if (ok) {
        kpt_aux_tensor daux[4];
        int nd = naux_of(p, &h, kpt_buffer_data(ddoc), daux);
        kpt_paged_batch_mem dm = {kpt_buffer_data(dq), kpt_buffer_data(dk), kpt_buffer_data(dv),
                                  kpt_buffer_data(dout), kpt_buffer_data(dl),
                                  kpt_buffer_data(dpt), kpt_buffer_data(dcu),
                                  kpt_buffer_data(dkv), c->sinks ? kpt_buffer_data(ds) : NULL,
                                  c->dtype, KPT_DTYPE_F32};
        kpt_paged_args da = kpt_paged_batch_args(&h, &dm, daux, nd);
        da.scale = c->scale;
        if (c->o_pad) {
            da.o.stride[1] = o_row_stride(c);
            da.o.stride[0] = (int64_t)c->hq * o_row_stride(c);
        }
        if (kpt_paged_run(k, &plan, &da, ws ? kpt_buffer_data(ws) : NULL,
                          ws ? plan.workspace_bytes : 0, NULL, &d) ||
            kpt_context_synchronize(ctx, &d) || kpt_buffer_read(dout, 0, o, obytes, &d) ||
            kpt_buffer_read(dl, 0, lse, orows * 4, &d)) {
            snprintf(res->why, sizeof(res->why), "run: %.150s", d.message);
            ok = false;
        }
        if (ok && plan.splits > 1 &&
            !same_again(k, &plan, &da, ws, dout, dl, o, lse, obytes, orows * 4, poison)) {
            snprintf(res->why, sizeof(res->why),
                     "a second run (over the workspace the first left) differs from the first");
            ok = false;
        }
        if (ok && repeat)
            res->us = time_runs(k, &plan, &da, ws ? kpt_buffer_data(ws) : NULL);
    }
    if (ok) { /* compare the sequences' rows; the rest must be untouched */
        double num = 0, den = 0;
        long past = 0; /* rows past the plan's queries that are wholly NaN */
        for (size_t row = 0; row < orows; row++) {
            bool owned = (int)(row / c->hq) < h.cu[c->B];
            float gl = ((float *)lse)[row];
            if (!owned) {
                unsigned char pb[4];
                memcpy(pb, &gl, 4);
                res->touched += pb[0] != poison || pb[1] != poison || pb[2] != poison ||
                                pb[3] != poison;
                continue;
            }
            if (short_plan && past_plan(&h, c, (int)(row / c->hq), &plan) &&
                nan_row(o, c, row, gl)) {
                past++;
                continue;
            }
            double rl = ref_l[row];
            if (isnan(gl))
                res->nan++;
            else if (rl == -INFINITY)
                res->lse_err = gl != -INFINITY ? INFINITY : res->lse_err;
            else
                res->lse_err = fmax(res->lse_err, fabs(gl - rl) / fmax(1.0, fabs(rl)));
            if (c->o_pad) { /* the pad after the row */
                const unsigned char *pb =
                    (const unsigned char *)o + (row * o_row_stride(c) + c->dv) * es;
                for (size_t i = 0; i < es; i++)
                    res->touched += pb[i] != poison;
            }
            for (int e = 0; e < c->dv; e++) {
                double x = kpt_load_as_double(o, c->dtype, (int64_t)(row * o_row_stride(c) + e));
                double y = ref_o[row * c->dv + e];
                if (isnan(x)) {
                    res->nan++;
                    continue;
                }
                num += (x - y) * (x - y);
                den += y * y;
            }
        }
        res->rel = den > 0 ? sqrt(num / den) : sqrt(num);
        double tol = c->dtype == KPT_DTYPE_BF16 ? 1e-2 : c->dtype == KPT_DTYPE_F16 ? 5e-3 : 1e-4;
        ok = res->nan == 0 && res->touched == 0 && res->rel <= tol && res->lse_err <= 1e-3;
        if (ok && short_plan && !past && !on_cpu) { /* the CPU computes those rows */
            snprintf(res->why, sizeof(res->why), "no NaN row past the plan's %d queries",
                     plan.q_blocks ? plan.max_q : plan.max_tokens);
            ok = false;
        } else if (!ok)
            snprintf(res->why, sizeof(res->why),
                     "rel %.3g (tol %.0e), lse %.3g, NaN/unwritten %ld, foreign rows written %ld",
                     res->rel, tol, res->lse_err, res->nan, res->touched);
    }
    kpt_buffer *all[] = {dq, dk, dv, dout, dl, dpt, dcu, dkv, ds, ddoc, ws};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
        kpt_buffer_destroy(&all[i]);
    free(o);
    free(lse);
    free(ref_o);
    free(ref_l);
    kpt_pattern_destroy(&p);
    kpt_paged_batch_free(&h);
    return ok;
}

static pcase cases[2048];
static int ncases;

static void add(const char *pat, kpt_dtype dt, int d, int hq, int hkv, int page, bool hm,
                bool sinks, int B, const int *q, const int *kv, int bounds)
{
    if (ncases >= (int)(sizeof(cases) / sizeof(cases[0])))
        return;
    pcase *c = &cases[ncases++];
    *c = (pcase){.pattern = pat, .dtype = dt, .d = d, .hq = hq, .hkv = hkv, .dv = d,
                 .page = page, .head_major = hm, .sinks = sinks, .B = B, .bounds = bounds};
    for (int b = 0; b < B; b++) {
        c->q[b] = q[b];
        c->kv[b] = kv[b];
    }
}

/* The last case added with V and O of head dim dv. */
static void with_dv(int dv)
{
    if (ncases > 0)
        cases[ncases - 1].dv = dv;
}

/* The last case added with the scores' scale `s` (a negative one: the kernels without a score
 * mod negate Q). */
static void with_scale(float s)
{
    if (ncases > 0)
        cases[ncases - 1].scale = s;
}

/* The last case added with O's rows padded (pcase.o_pad). */
static void with_o_pad(void)
{
    if (ncases > 0)
        cases[ncases - 1].o_pad = true;
}

static void build(bool quick)
{
    static const char *const pats[] = {
        "full", "causal", "sliding_window(100)", "sliding_window($w=700)", "alibi+causal",
        "softcap(30)+causal", "document+causal", "prefix_lm(300)", "causal_bottom_right+softcap(20)",
        "examples/patterns/gemma2.lua", "examples/patterns/dilated_window.lua",
        "tests/per_head_window.lua",
    };
    /* quick: full, causal and a window; on the CPU backend, whose kernels are the reference
     * (plumbing only), full with its extra shapes (the window took a third of CI's paged_api,
     * causal most of the rest; logical positions are test_reference_paged's) */
    const int npat = quick ? (on_cpu ? 1 : 3) : (int)(sizeof(pats) / sizeof(pats[0]));
    static const int q1[8] = {1, 1, 1, 1, 1, 1, 1, 1}, q4[8] = {4, 4, 4, 4, 4, 4, 4, 4};
    static const int q16[8] = {16, 16, 16, 16}, qr[8] = {0, 1, 5, 16, 33, 1, 0, 3};
    static const int kvr[8] = {700, 1, 2048, 5000, 33, 900, 0, 64}, kvs[8] = {3000, 1500, 250, 4000,
                                                                            64, 5, 777, 2049};
    static const int kvlong[1] = {20000}, ql[1] = {1}, ql4[1] = {7};
    static const int qp[8] = {40, 1, 1, 1, 1, 1, 1, 1}; /* a prefill chunk beside decodes */
    static const int kvmany[8] = {40000, 9000, 4097, 2049, 5, 4, 33000, 12345};
    static const int kvshort[8] = {150, 1, 64, 100, 33, 190, 0, 77}; /* three tiles at most */
    for (int i = 0; i < npat; i++) {
        const char *p = pats[i];
        add(p, KPT_DTYPE_BF16, 128, 32, 8, 16, false, false, 8, q1, kvs, 0);
        add(p, KPT_DTYPE_BF16, 128, 16, 2, 1, false, true, 4, q4, kvs, 0);
        add(p, KPT_DTYPE_BF16, 128, 8, 8, 64, true, false, 4, q16, kvs, 0);
        add(p, KPT_DTYPE_BF16, 128, 32, 8, 256, false, true, 8, qr, kvr, 0);
        add(p, KPT_DTYPE_BF16, 128, 32, 8, 0, false, false, 1, ql, kvlong, 0);
        if (i == 0) {
            add(p, KPT_DTYPE_BF16, 64, 16, 4, 16, false, false, 8, qr, kvr, 2);
            add(p, KPT_DTYPE_BF16, 128, 32, 8, 16, false, true, 8, q1, kvs, 3);
            add(p, KPT_DTYPE_BF16, 128, 32, 8, 16, false, true, 8, qr, kvr, 0);
            with_dv(64);
            add(p, KPT_DTYPE_F16, 64, 16, 2, 64, true, false, 4, q4, kvs, 0);
            with_dv(128);
            /* O padded: unsplit (keys too few to split), so the attention kernel writes O with
             * four or two columns a lane where rows are aligned and one where not; and split,
             * so the combine writes it */
            add(p, KPT_DTYPE_BF16, 128, 32, 8, 16, false, true, 8, qr, kvshort, 0);
            with_o_pad();
            add(p, KPT_DTYPE_F16, 64, 16, 2, 64, true, false, 8, qr, kvshort, 0);
            with_o_pad();
            add(p, KPT_DTYPE_BF16, 128, 32, 8, 16, false, false, 1, ql, kvlong, 0);
            with_o_pad();
            /* a chunk of prefill beside decodes (a packed plan: its blocks follow cu_q), and
             * a packed plan for fewer queries than the run has */
            add(p, KPT_DTYPE_BF16, 128, 32, 8, 16, false, false, 8, qp, kvs, 0);
            add(p, KPT_DTYPE_BF16, 128, 32, 8, 16, false, true, 8, qp, kvs, 4);
            /* 6 sequences x 8 kv heads of 5000 keys: a thin wave on a GPU of 132 SMs (2 parts,
             * 96 CTAs; kpt_paged_plan_sms splits it in 5 for two CTAs an SM) */
            static const int kvu[8] = {5000, 5000, 5000, 5000, 5000, 5000, 5000, 5000};
            add(p, KPT_DTYPE_BF16, 128, 32, 8, 16, false, false, 6, q1, kvu, 0);
            /* negative scales, on the 16-, 32- and 64-row kernels */
            add(p, KPT_DTYPE_BF16, 128, 32, 8, 16, false, true, 8, qr, kvr, 0);
            with_scale(-0.07f);
            add(p, KPT_DTYPE_F16, 64, 16, 4, 0, false, false, 4, q16, kvs, 0);
            with_scale(-0.2f);
        }
        if (i <= 1 && !on_cpu) {
            /* a CTA's key range over more pages than it stages at once (2048 page ids): the
             * next chunks staged as its tiles pass them; pages of 1, 3 (not a power of two: the
             * generic copy) and 16 rows */
            add(p, KPT_DTYPE_BF16, 128, 32, 8, 1, false, false, 8, q1, kvmany, 0);
            add(p, KPT_DTYPE_F16, 64, 16, 2, 3, true, false, 8, q4, kvmany, 0);
            add(p, KPT_DTYPE_BF16, 128, 32, 8, 16, false, true, 8, q1, kvmany, 0);
            /* pages around a thread's run of rows in the copies (kpt_pg_load_kv: 8 rows at
             * head dims 64 to 256, 4 at 32): from that size on one page id a run, below it one
             * a row */
            add(p, KPT_DTYPE_BF16, 128, 32, 8, 8, false, true, 8, qr, kvr, 0);
            add(p, KPT_DTYPE_F16, 64, 16, 2, 4, true, false, 4, q16, kvs, 0);
            add(p, KPT_DTYPE_BF16, 128, 32, 8, 4, true, false, 8, q4, kvs, 0);
            add(p, KPT_DTYPE_BF16, 256, 16, 8, 8, false, false, 8, q1, kvs, 0);
            /* 64-row CTAs over long ranges: split for two CTAs an SM (kpt_cuda_paged_plan),
             * page 16 then without the third stage */
            add(p, KPT_DTYPE_BF16, 128, 32, 8, 16, false, false, 8, q16, kvmany, 0);
            add(p, KPT_DTYPE_F16, 64, 32, 8, 0, true, true, 8, q16, kvmany, 0);
        }
        if (i == 0 && !on_cpu) { /* the CPU runs the reference twice: plumbing only */
            /* head dim 256 (Gemma): decode, speculative, ragged, long, Dv far above Dqk */
            add(p, KPT_DTYPE_BF16, 256, 16, 8, 16, false, true, 8, q1, kvs, 0);
            add(p, KPT_DTYPE_F16, 256, 16, 8, 64, true, false, 4, q16, kvs, 0);
            add(p, KPT_DTYPE_BF16, 256, 32, 8, 16, false, false, 8, qr, kvr, 0);
            add(p, KPT_DTYPE_BF16, 256, 16, 8, 0, false, true, 1, ql, kvlong, 0);
            add(p, KPT_DTYPE_BF16, 64, 16, 2, 16, false, false, 8, qr, kvr, 0);
            with_dv(256);
            /* head dim 32 (128-key tiles, as at 64; mma.sync): ragged, and 64-row CTAs over
             * one-row pages */
            add(p, KPT_DTYPE_BF16, 32, 16, 4, 16, false, false, 8, qr, kvr, 0);
            add(p, KPT_DTYPE_F16, 32, 8, 2, 1, true, false, 4, q16, kvs, 0);
        }
        if (quick)
            continue;
        add(p, KPT_DTYPE_F16, 64, 32, 4, 16, true, true, 1, ql4, kvlong, 0);
        add(p, KPT_DTYPE_BF16, 128, 32, 8, 16, false, false, 8, qr, kvr, 1);
        add(p, KPT_DTYPE_F16, 64, 8, 1, 7, false, false, 8, q4, kvs, 0);
        if (!on_cpu)
            add(p, KPT_DTYPE_BF16, 256, 16, 8, 16, false, false, 8, qr, kvr, 0);
    }
}

/* The Vulkan matrix: f16, bf16 and f32, head dims 32 to 256, page sizes 1 to 256 and
 * contiguous, ragged lengths with 0 and 1, GQA 1, 4 and 8, sinks, plans from bounds above and
 * below the lengths, and kv lengths to 20k: split over the keys where llvmpipe's loop limit or
 * the device's size asks for it. Paths are relative to the source tree. */
static void build_vulkan(bool quick)
{
    static const char *const pats[] = {
        "full", "causal", "sliding_window(100)", "document+causal", "tests/per_head_window.lua",
        "alibi+causal",
        "softcap(30)+causal", "sliding_window($w=300)", "prefix_lm(300)",
        "examples/patterns/gemma2.lua", "examples/patterns/dilated_window.lua",
    };
    const int npat = quick ? 5 : (int)(sizeof(pats) / sizeof(pats[0]));
    static const int q1[8] = {1, 1, 1, 1, 1, 1, 1, 1}, q4[8] = {4, 4, 4, 4, 4, 4, 4, 4};
    static const int q16[8] = {16, 16, 16, 16}, qr[8] = {0, 1, 5, 16, 33, 1, 0, 3};
    static const int kvr[8] = {700, 1, 1500, 900, 33, 5, 0, 64};
    static const int kvs[8] = {1200, 600, 250, 1500, 64, 5, 777, 1025};
    static const int kvlong[1] = {2000}, ql[1] = {3};
    static const int kv32k[8] = {32768, 32768, 32768, 32768, 32768, 32768, 32768, 32768};
    static const int q2[2] = {1, 0}, kv20k[2] = {20000, 0}, q16b[2] = {16, 5}, kv9k[2] = {9000, 5};
    for (int i = 0; i < npat; i++) {
        const char *p = pats[i];
        /* quick (CI): one kernel per pattern, f16 D = 64 (llvmpipe compiles each kernel for
         * seconds), and the other dtypes and head dims on the first pattern */
        const kpt_dtype t1 = quick ? KPT_DTYPE_F16 : KPT_DTYPE_BF16;
        const kpt_dtype t2 = quick ? KPT_DTYPE_F16 : KPT_DTYPE_F32;
        const int d1 = quick ? 64 : 128, d2 = quick ? 64 : 32;
        add(p, KPT_DTYPE_F16, 64, 32, 8, 16, false, false, 8, q1, kvs, 0);
        add(p, t1, d1, 16, 4, 1, false, true, 4, q4, kvs, 0);
        add(p, t2, 64, 8, 8, 64, true, false, 4, q16, kvs, 0);
        add(p, KPT_DTYPE_F16, d1, 32, 8, 256, false, true, 8, qr, kvr, 0);
        add(p, KPT_DTYPE_F16, d2, 16, 2, 0, false, false, 1, ql, kvlong, 0);
        if (i == 0) {
            add(p, KPT_DTYPE_F16, 64, 16, 4, 16, false, false, 8, qr, kvr, 2);
            add(p, KPT_DTYPE_F16, 64, 16, 4, 16, false, true, 8, qr, kvr, 3);
        }
        /* one sequence decoding over 20k keys, the other empty: the keys split for the loop
         * limit (llvmpipe) or to fill the device; speculative decoding over 9000 */
        add(p, KPT_DTYPE_F16, 64, 16, 2, 16, false, i % 2 == 0, 2, q2, kv20k, 0);
        if (i < 3)
            add(p, t1, d1, 8, 1, 64, true, true, 2, q16b, kv9k, 0);
        if (i == 0 && quick) {
            add(p, KPT_DTYPE_BF16, 128, 16, 4, 1, false, true, 4, q4, kvs, 0);
            add(p, KPT_DTYPE_F32, 32, 16, 2, 0, false, false, 1, ql, kvlong, 0);
        }
        if (i == 0) {
            add(p, KPT_DTYPE_F16, 96, 16, 4, 16, false, true, 8, qr, kvr, 0);
            with_dv(40);
            add(p, KPT_DTYPE_F16, 64, 16, 4, 16, false, true, 8, qr, kvr, 0);
            with_o_pad();
            add(p, KPT_DTYPE_F16, 256, 8, 2, 16, false, false, 8, qr, kvr, 0);
        }
        if (quick)
            continue;
        add(p, KPT_DTYPE_BF16, 64, 32, 8, 7, false, false, 8, qr, kvr, 1);
        if (i < 2) { /* decode of a 32k cache, one sequence and eight (--repeat times them) */
            add(p, KPT_DTYPE_BF16, 128, 32, 8, 16, false, false, 1, q1, kv32k, 0);
            add(p, KPT_DTYPE_BF16, 128, 32, 8, 16, false, false, 8, q1, kv32k, 0);
        }
    }
}

int main(int argc, char **argv)
{
    const char *filter = NULL, *backend = "cuda";
    uint64_t seed = 1;
    bool quick = false;
    shard sh = SHARD_ALL;
    static const struct option opts[] = {{"quick", no_argument, NULL, 'q'},
                                         {"filter", required_argument, NULL, 'f'},
                                         {"shard", required_argument, NULL, 'k'},
                                         {"seed", required_argument, NULL, 's'},
                                         {"backend", required_argument, NULL, 'b'},
                                         {"repeat", required_argument, NULL, 'r'},
                                         {NULL, 0, NULL, 0}};
    bool bad = false;
    for (int c; (c = getopt_long(argc, argv, "", opts, NULL)) != -1;) {
        if (c == 'q')
            quick = true;
        else if (c == 'f')
            filter = optarg;
        else if (c == 's')
            seed = strtoull(optarg, NULL, 10);
        else if (c == 'b')
            backend = optarg;
        else if (c == 'r')
            repeat = atoi(optarg);
        else if (c == 'k')
            bad |= !shard_parse(optarg, &sh);
        else
            bad = true; /* getopt_long said what was wrong */
    }
    if (bad || optind != argc) {
        fprintf(stderr, "usage: paged_check [--backend cuda|vulkan|cpu] [--quick] "
                        "[--filter TEXT] " SHARD_USAGE " [--seed N] [--repeat N]\n");
        return 2;
    }
    const bool vulkan = !strcmp(backend, "vulkan");
    on_cpu = !strcmp(backend, "cpu");
    if (!vulkan && strcmp(backend, "cuda") && strcmp(backend, "cpu")) {
        fprintf(stderr, "paged_check: --backend wants cuda, vulkan or cpu, not '%s'\n", backend);
        return 2;
    }
    kpt_context_params cp = {.backend = vulkan                    ? KPT_BACKEND_VULKAN
                                        : strcmp(backend, "cpu") ? KPT_BACKEND_CUDA
                                                                 : KPT_BACKEND_CPU,
                             .flags = KPT_CONTEXT_NO_DISK_CACHE};
    kpt_diag d = {0};
    if (kpt_context_create(&cp, &ctx, &d)) {
        printf("SKIP: %s\n", d.message);
        return 77;
    }
    printf("device: %s (%s)\n", kpt_context_device_name(ctx), kpt_context_target(ctx));
    if (vulkan)
        build_vulkan(quick);
    else
        build(quick);
    int pass = 0, fail = 0, split = 0;
    for (int i = 0; i < ncases; i++) {
        const pcase *c = &cases[i];
        char name[200];
        char dims[32];
        snprintf(dims, sizeof(dims), c->dv == c->d ? "D%d" : "D%d/%d", c->d, c->dv);
        char sc[32] = "";
        if (c->scale != 0.0f)
            snprintf(sc, sizeof(sc), " scale %g", c->scale);
        snprintf(name, sizeof(name), "%s %s %s %d:%d page %d%s%s B%d q0 %d kv0 %d%s%s%s",
                 c->pattern, kpt_dtype_name(c->dtype), dims, c->hq, c->hkv, c->page,
                 c->head_major ? " head-major" : "", c->sinks ? " sinks" : "", c->B, c->q[0],
                 c->kv[0],
                 c->bounds == 1   ? " bounds-plan"
                 : c->bounds == 2 ? " short-plan"
                 : c->bounds == 3 ? " far-bounds-plan, no workspace"
                 : c->bounds == 4 ? " packed-short-plan"
                                  : "",
                 c->o_pad ? " o-padded" : "", sc);
        if ((filter && !strstr(name, filter)) || !shard_has(sh, i))
            continue;
        outcome res;
        if (run_case(c, seed + (uint64_t)i, &res)) {
            pass++;
            split += res.splits > 1;
            printf("  ok   %-80s rel %.2e lse %.2e splits %d", name, res.rel, res.lse_err,
                   res.splits);
            if (res.us > 0) {
                double bytes = 0;
                for (int b = 0; b < c->B; b++)
                    bytes += (double)c->kv[b] * c->hkv * (c->d + c->dv) *
                             kpt_dtype_size(c->dtype);
                printf("  %.1f us %.0f GB/s", res.us, bytes / res.us * 1e-3);
            }
            printf("\n");
        } else {
            fail++;
            printf("  FAIL %-80s %s\n", name, res.why);
        }
        fflush(stdout);
    }
    if (vulkan && !filter && sh.n == 1 && !split) {
        printf("  FAIL no case split the keys: the combine went unchecked\n");
        fail++;
    }
    printf("%d passed, %d failed (%d split over the keys)\n", pass, fail, split);
    kpt_context_destroy(&ctx);
    return fail ? 1 : 0;
}
