/* The backward through the public API on a real GPU, as a training framework drives it: the
 * workspace queried with kpt_kernel_backward_workspace and given, a block map built once, and
 * the launch captured in a CUDA graph and replayed, in the default and the deterministic mode.
 * Each pattern's dq, dk, dv and aux gradients are checked against
 * kpt_reference_attention_backward, outputs poisoned before every run; in the deterministic
 * mode the graph's replays must give the same bits as the direct launch. Exits 77 (skip)
 * without a CUDA device.
 *
 *     backward_check */
#include <dlfcn.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kpt/kpt.h>

#include "base/numeric.h"
#include "tests/gpu/api_common.h"

enum { B = 2, HQ = 4, HKV = 2, S = 333, D = 64, NAUX = 4 };
#define NQ ((size_t)B * HQ * S * D)
#define NK ((size_t)B * HKV * S * D)

/* The driver's stream and graph calls (libkpt has no use for them): opened here. */
static struct {
    int (*StreamCreate)(void **, unsigned);
    int (*StreamDestroy)(void *);
    int (*StreamSynchronize)(void *);
    int (*StreamBeginCapture)(void *, int);
    int (*StreamEndCapture)(void *, void **);
    int (*GraphInstantiate)(void **, void *, unsigned long long);
    int (*GraphLaunch)(void *, void *);
    int (*GraphExecDestroy)(void *);
    int (*GraphDestroy)(void *);
} cu;

static bool load_driver(void)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib)
        return false;
    *(void **)&cu.StreamCreate = dlsym(lib, "cuStreamCreate");
    *(void **)&cu.StreamDestroy = dlsym(lib, "cuStreamDestroy_v2");
    *(void **)&cu.StreamSynchronize = dlsym(lib, "cuStreamSynchronize");
    *(void **)&cu.StreamBeginCapture = dlsym(lib, "cuStreamBeginCapture_v2");
    *(void **)&cu.StreamEndCapture = dlsym(lib, "cuStreamEndCapture");
    *(void **)&cu.GraphInstantiate = dlsym(lib, "cuGraphInstantiateWithFlags");
    *(void **)&cu.GraphLaunch = dlsym(lib, "cuGraphLaunch");
    *(void **)&cu.GraphExecDestroy = dlsym(lib, "cuGraphExecDestroy");
    *(void **)&cu.GraphDestroy = dlsym(lib, "cuGraphDestroy");
    return cu.StreamCreate && cu.StreamDestroy && cu.StreamSynchronize && cu.StreamBeginCapture &&
           cu.StreamEndCapture && cu.GraphInstantiate && cu.GraphLaunch && cu.GraphExecDestroy &&
           cu.GraphDestroy;
}

/* A learnable ALiBi (slopes per head, f32), a bias by distance read out of range for far pairs,
 * and a gain on s (bf16, so its derivative depends on s), under a document mask (a block map). */
static const char learned_src[] =
    "return kpt.pattern{ name = 'learned',\n"
    "  aux = { slopes = { dtype = 'float32', shape = {'hq'} },\n"
    "          gain = { dtype = 'bfloat16', shape = {'hq'} },\n"
    "          near = { dtype = 'float32', shape = {16} },\n"
    "          doc = { dtype = 'int32', shape = {'b', 'skv'} } },\n"
    "  score = function(s, b, h, q, k, p)\n"
    "    return s * (1 + p.gain[h]) - p.slopes[h] * kpt.float(kpt.abs(k - q)) + p.near[k - q + 8]\n"
    "  end,\n"
    "  mask = function(b, h, q, k, p) return p.doc[b][q]:eq(p.doc[b][k]) & q:ge(k) end }\n";

typedef struct host {
    uint16_t q[NQ], k[NK], v[NK], dout[NQ];
    float slopes[HQ], near[16];
    uint16_t gain[HQ];
    int32_t doc[B * S];
    double dq[NQ], dk[NK], dv[NK], dslopes[HQ], dgain[HQ], dnear[16]; /* the reference's */
} host;

static host h;

static kpt_tensor t4(void *data, kpt_dtype dt, int64_t heads)
{
    return kpt_tensor_contiguous(data, dt, 4, (int64_t[]){B, heads, S, D});
}

/* The arguments over q, k, v, o, lse, and the aux tensors in `aux`, at pointers `p`. */
static kpt_attention_args args_at(void *const p[9], kpt_dtype dt, kpt_aux_tensor aux[NAUX])
{
    aux[0] = (kpt_aux_tensor){"slopes", kpt_tensor_contiguous(p[5], KPT_DTYPE_F32, 1, (int64_t[]){HQ})};
    aux[1] = (kpt_aux_tensor){"gain", kpt_tensor_contiguous(p[6], KPT_DTYPE_BF16, 1, (int64_t[]){HQ})};
    aux[2] = (kpt_aux_tensor){"near", kpt_tensor_contiguous(p[7], KPT_DTYPE_F32, 1, (int64_t[]){16})};
    aux[3] = (kpt_aux_tensor){"doc", kpt_tensor_contiguous(p[8], KPT_DTYPE_I32, 2, (int64_t[]){B, S})};
    kpt_attention_args a = {.q = t4(p[0], dt, HQ), .k = t4(p[1], dt, HKV), .v = t4(p[2], dt, HKV),
                            .o = t4(p[3], dt, HQ), .aux = aux, .num_aux = NAUX};
    if (p[4])
        a.lse = kpt_tensor_contiguous(p[4], KPT_DTYPE_F32, 3, (int64_t[]){B, HQ, S});
    return a;
}

static kpt_attention_grads grads_at(void *const g[7], kpt_dtype dt, kpt_aux_tensor daux[3])
{
    daux[0] = (kpt_aux_tensor){"slopes", kpt_tensor_contiguous(g[4], dt == KPT_DTYPE_F64 ? dt : KPT_DTYPE_F32, 1, (int64_t[]){HQ})};
    daux[1] = (kpt_aux_tensor){"gain", kpt_tensor_contiguous(g[5], daux[0].tensor.dtype, 1, (int64_t[]){HQ})};
    daux[2] = (kpt_aux_tensor){"near", kpt_tensor_contiguous(g[6], daux[0].tensor.dtype, 1, (int64_t[]){16})};
    kpt_dtype in = dt == KPT_DTYPE_F64 ? KPT_DTYPE_BF16 : dt;
    return (kpt_attention_grads){.dout = t4(g[0], in, HQ), .dq = t4(g[1], dt, HQ),
                                 .dk = t4(g[2], dt, HKV), .dv = t4(g[3], dt, HKV),
                                 .daux = daux, .num_daux = 3};
}

static void fill(void)
{
    for (size_t i = 0; i < NQ; i++) {
        kpt_store_double(h.q, KPT_DTYPE_BF16, (int64_t)i, uniform());
        kpt_store_double(h.dout, KPT_DTYPE_BF16, (int64_t)i, uniform());
    }
    for (size_t i = 0; i < NK; i++) {
        kpt_store_double(h.k, KPT_DTYPE_BF16, (int64_t)i, uniform());
        kpt_store_double(h.v, KPT_DTYPE_BF16, (int64_t)i, uniform());
    }
    for (int i = 0; i < HQ; i++) {
        h.slopes[i] = 0.05f * (float)(i + 1);
        kpt_store_double(h.gain, KPT_DTYPE_BF16, i, 0.3 * uniform());
    }
    for (int i = 0; i < 16; i++)
        h.near[i] = uniform();
    for (int b = 0; b < B; b++) /* documents of 100 tokens, shifted per batch row */
        for (int s = 0; s < S; s++)
            h.doc[b * S + s] = (s + 37 * b) / 100;
}

/* max |got - want| / max(max |want|, 0.01) over n f32 or bf16 values */
static double error(const void *got, kpt_dtype dt, const double *want, size_t n)
{
    double err = 0, scale = 1e-2;
    for (size_t i = 0; i < n; i++) {
        double g = kpt_load_as_double(got, dt, (int64_t)i);
        if (isnan(g))
            return INFINITY;
        err = fmax(err, fabs(g - want[i]));
        scale = fmax(scale, fabs(want[i]));
    }
    return err / scale;
}

enum { NBUF = 16 };
static const size_t grad_bytes[7] = {NQ * 2, NQ * 2, NK * 2, NK * 2, HQ * 4, HQ * 4, 16 * 4};

/* Reads the 6 gradients (dq dk dv dslopes dgain dnear) into out, poisoning them after. */
static void read_grads(kpt_buffer *gb[7], void *out[6])
{
    kpt_diag d = {0};
    for (int i = 1; i < 7; i++) {
        void *poison = malloc(grad_bytes[i]);
        memset(poison, 0xff, grad_bytes[i]);
        CHECK(!kpt_buffer_read(gb[i], 0, out[i - 1], grad_bytes[i], &d), "read: %s", d.message);
        CHECK(!kpt_buffer_write(gb[i], 0, poison, grad_bytes[i], &d), "poison: %s", d.message);
        free(poison);
    }
}

/* The forward and backward kernels of p (bf16, head dim D). */
static kpt_status get_kernels(kpt_context *ctx, const kpt_pattern *p, kpt_kernel **fwd,
                              kpt_kernel **bwd, kpt_diag *d)
{
    kpt_kernel_desc desc = {.dtype = KPT_DTYPE_BF16, .head_dim = D};
    kpt_status st = kpt_kernel_get(ctx, p, &desc, fwd, d);
    desc.options = KPT_DESC_BACKWARD;
    return st ? st : kpt_kernel_get(ctx, p, &desc, bwd, d);
}

/* The pattern's gradients in one mode: deterministic (the graph's replays must repeat the bits)
 * or the default (on sm_90a, dq by atomics: the replays are checked against the reference). */
static void run(kpt_context *ctx, const kpt_pattern *p, int det)
{
    kpt_diag d = {0};
    kpt_kernel *fwd = NULL, *bwd = NULL;
    kpt_status st = get_kernels(ctx, p, &fwd, &bwd, &d);
    CHECK(!st, "kernels: %s", d.message);
    if (st)
        return;
    /* the reference's gradients */
    void *hp[9] = {h.q, h.k, h.v, NULL, NULL, h.slopes, h.gain, h.near, h.doc};
    static double o_ref[NQ];
    hp[3] = o_ref;
    kpt_aux_tensor aux[NAUX], daux[3];
    kpt_attention_args ha = args_at(hp, KPT_DTYPE_BF16, aux);
    ha.o = kpt_tensor_contiguous(o_ref, KPT_DTYPE_F64, 4, (int64_t[]){B, HQ, S, D});
    void *hg[7] = {h.dout, h.dq, h.dk, h.dv, h.dslopes, h.dgain, h.dnear};
    kpt_attention_grads hgr = grads_at(hg, KPT_DTYPE_F64, daux);
    st = kpt_reference_attention_backward(p, &ha, &hgr, &d);
    CHECK(!st, "reference backward: %s", d.message);

    /* the device's */
    kpt_buffer *ib[9], *gb[7];
    const void *src[9] = {h.q, h.k, h.v, NULL, NULL, h.slopes, h.gain, h.near, h.doc};
    const size_t bytes[9] = {NQ * 2, NK * 2, NK * 2, NQ * 2, (size_t)B * HQ * S * 4, HQ * 4,
                             HQ * 2, 16 * 4, (size_t)B * S * 4};
    void *dp[9], *dg[7];
    for (int i = 0; i < 9; i++)
        dp[i] = kpt_buffer_data(ib[i] = upload(ctx, src[i], bytes[i]));
    const void *gsrc[7] = {h.dout};
    for (int i = 0; i < 7; i++)
        dg[i] = kpt_buffer_data(gb[i] = upload(ctx, gsrc[i], grad_bytes[i]));
    kpt_attention_args a = args_at(dp, KPT_DTYPE_BF16, aux);
    kpt_attention_grads g = grads_at(dg, KPT_DTYPE_BF16, daux);
    g.deterministic = det;
    size_t ws_bytes = 0;
    kpt_blockmap *map = NULL;
    kpt_buffer *ws = NULL;
    void *stream = NULL, *graph = NULL, *exec = NULL;
    static uint16_t got[2][3][NQ];
    static float got_aux[2][3][16];
    void *out[2][6];
    for (int r = 0; r < 2; r++)
        for (int i = 0; i < 6; i++)
            out[r][i] = i < 3 ? (void *)got[r][i] : (void *)got_aux[r][i - 3];
    if ((st = kpt_kernel_launch(fwd, &a, NULL, NULL, &d)) ||
        (st = kpt_kernel_backward_workspace(bwd, &a, &g, &ws_bytes, &d)))
        goto done;
    /* 4 bytes a query row, then 20 an aux element for each of the 3 gradients, 256-aligned */
    size_t ws_want = (((size_t)B * HQ * S * 4 + 255) & ~(size_t)255) + 3 * 512;
    if (!det && !strcmp(kpt_context_target(ctx), "cuda:sm_90a")) /* + dq's sums and counts */
        ws_want += (((size_t)B * HQ * S * D * 4 + 255) & ~(size_t)255) + 256;
    CHECK(ws_bytes == ws_want, "workspace %zu bytes, expected %zu", ws_bytes, ws_want);
    ws = upload(ctx, NULL, ws_bytes);
    /* direct launch: temporary workspace and map */
    read_grads(gb, out[1]); /* poison */
    if ((st = kpt_kernel_launch_backward(bwd, &a, &g, NULL, NULL, 0, NULL, &d)) ||
        (st = kpt_context_synchronize(ctx, &d)))
        goto done;
    read_grads(gb, out[0]);
    const double *want[6] = {h.dq, h.dk, h.dv, h.dslopes, h.dgain, h.dnear};
    const size_t n[6] = {NQ, NK, NK, HQ, HQ, 16};
    static const char *const names[6] = {"dq", "dk", "dv", "dslopes", "dgain", "dnear"};
    printf("%-14s %-13s", kpt_pattern_name(p), det ? "deterministic" : "default");
    for (int i = 0; i < 6; i++) {
        double e = error(out[0][i], i < 3 ? KPT_DTYPE_BF16 : KPT_DTYPE_F32, want[i], n[i]);
        printf(" %s %.2g", names[i], e);
        CHECK(e <= 1e-2, "%s: %s relative error %.3g", kpt_pattern_name(p), names[i], e);
    }
    printf("\n");
    /* captured: a map built before, the workspace given; replayed twice */
    if ((st = kpt_blockmap_create(bwd, &a, NULL, &map, &d)) || (st = kpt_context_synchronize(ctx, &d)))
        goto done;
    CHECK(!cu.StreamCreate(&stream, 1), "cuStreamCreate");
    CHECK(!cu.StreamBeginCapture(stream, 0 /* global */), "cuStreamBeginCapture");
    st = kpt_kernel_launch_backward(bwd, &a, &g, map, kpt_buffer_data(ws), ws_bytes, stream, &d);
    CHECK(!cu.StreamEndCapture(stream, &graph) && graph, "cuStreamEndCapture");
    if (st || !graph)
        goto done;
    CHECK(!cu.GraphInstantiate(&exec, graph, 0), "cuGraphInstantiate");
    for (int rep = 0; rep < 2 && exec; rep++) {
        CHECK(!cu.GraphLaunch(exec, stream) && !cu.StreamSynchronize(stream), "graph launch");
        read_grads(gb, out[1]);
        for (int i = 0; i < 6; i++) {
            if (det)
                CHECK(!memcmp(out[0][i], out[1][i], n[i] * (i < 3 ? 2 : 4)),
                      "%s: the graph's replay %d gives other bits for %s", kpt_pattern_name(p),
                      rep, names[i]);
            double e = error(out[1][i], i < 3 ? KPT_DTYPE_BF16 : KPT_DTYPE_F32, want[i], n[i]);
            CHECK(e <= 1e-2, "%s: the graph's replay %d: %s relative error %.3g",
                  kpt_pattern_name(p), rep, names[i], e);
        }
    }
done:
    CHECK(!st, "%s: %s", kpt_pattern_name(p), d.message);
    if (exec)
        cu.GraphExecDestroy(exec);
    if (graph)
        cu.GraphDestroy(graph);
    if (stream)
        cu.StreamDestroy(stream);
    kpt_blockmap_destroy(&map);
    kpt_buffer_destroy(&ws);
    for (int i = 0; i < 9; i++)
        kpt_buffer_destroy(&ib[i]);
    for (int i = 0; i < 7; i++)
        kpt_buffer_destroy(&gb[i]);
}

/* Sinks through the forward and the backward kernels: o, lse, dq, dk, dv and dsinks against
 * the reference (causal rows, so the first keep one key and the sink weighs most there). */
static void run_sinks(kpt_context *ctx)
{
    kpt_diag d = {0};
    kpt_pattern *p = NULL;
    CHECK(!kpt_pattern_parse("causal+softcap(20)", &p, &d), "pattern: %s", d.message);
    kpt_kernel *fwd = NULL, *bwd = NULL;
    kpt_status st = get_kernels(ctx, p, &fwd, &bwd, &d);
    CHECK(!st, "sinks kernels: %s", d.message);
    float sinks[HQ] = {-1.0f, 0.5f, 2.0f, 4.0f};
    static double o_ref[NQ], lse_ref[B * HQ * S], dq[NQ], dk[NK], dv[NK], ds[HQ];
    kpt_attention_args ha = {.q = t4(h.q, KPT_DTYPE_BF16, HQ), .k = t4(h.k, KPT_DTYPE_BF16, HKV),
                             .v = t4(h.v, KPT_DTYPE_BF16, HKV),
                             .o = t4(o_ref, KPT_DTYPE_F64, HQ),
                             .lse = kpt_tensor_contiguous(lse_ref, KPT_DTYPE_F64, 3,
                                                          (int64_t[]){B, HQ, S}),
                             .sinks = kpt_tensor_contiguous(sinks, KPT_DTYPE_F32, 1,
                                                            (int64_t[]){HQ})};
    kpt_attention_grads hg = {.dout = t4(h.dout, KPT_DTYPE_BF16, HQ),
                              .dq = t4(dq, KPT_DTYPE_F64, HQ), .dk = t4(dk, KPT_DTYPE_F64, HKV),
                              .dv = t4(dv, KPT_DTYPE_F64, HKV),
                              .dsinks = kpt_tensor_contiguous(ds, KPT_DTYPE_F64, 1,
                                                              (int64_t[]){HQ})};
    if (!st && ((st = kpt_reference_attention(p, &ha, &d)) ||
                (st = kpt_reference_attention_backward(p, &ha, &hg, &d))))
        CHECK(0, "sinks reference: %s", d.message);
    kpt_buffer *bq = upload(ctx, h.q, NQ * 2), *bk = upload(ctx, h.k, NK * 2),
               *bv = upload(ctx, h.v, NK * 2), *bo = upload(ctx, NULL, NQ * 2),
               *bl = upload(ctx, NULL, (size_t)B * HQ * S * 4), *bs = upload(ctx, sinks, HQ * 4),
               *bdo = upload(ctx, h.dout, NQ * 2), *bdq = upload(ctx, NULL, NQ * 2),
               *bdk = upload(ctx, NULL, NK * 2), *bdv = upload(ctx, NULL, NK * 2),
               *bds = upload(ctx, NULL, HQ * 4);
    kpt_attention_args a = ha;
    a.q.data = kpt_buffer_data(bq), a.k.data = kpt_buffer_data(bk), a.v.data = kpt_buffer_data(bv);
    a.o = t4(kpt_buffer_data(bo), KPT_DTYPE_BF16, HQ);
    a.lse = kpt_tensor_contiguous(kpt_buffer_data(bl), KPT_DTYPE_F32, 3, (int64_t[]){B, HQ, S});
    a.sinks.data = kpt_buffer_data(bs);
    kpt_attention_grads g = {.dout = t4(kpt_buffer_data(bdo), KPT_DTYPE_BF16, HQ),
                             .dq = t4(kpt_buffer_data(bdq), KPT_DTYPE_BF16, HQ),
                             .dk = t4(kpt_buffer_data(bdk), KPT_DTYPE_BF16, HKV),
                             .dv = t4(kpt_buffer_data(bdv), KPT_DTYPE_BF16, HKV),
                             .dsinks = kpt_tensor_contiguous(kpt_buffer_data(bds), KPT_DTYPE_F32,
                                                             1, (int64_t[]){HQ})};
    if (!st && ((st = kpt_kernel_launch(fwd, &a, NULL, NULL, &d)) ||
                (st = kpt_kernel_launch_backward(bwd, &a, &g, NULL, NULL, 0, NULL, &d)) ||
                (st = kpt_context_synchronize(ctx, &d))))
        CHECK(0, "sinks launch: %s", d.message);
    if (!st) {
        static uint16_t go[NQ], gq[NQ], gk[NK], gv[NK];
        static float gl[B * HQ * S], gs[HQ];
        kpt_buffer_read(bo, 0, go, NQ * 2, &d);
        kpt_buffer_read(bl, 0, gl, sizeof(gl), &d);
        kpt_buffer_read(bdq, 0, gq, NQ * 2, &d);
        kpt_buffer_read(bdk, 0, gk, NK * 2, &d);
        kpt_buffer_read(bdv, 0, gv, NK * 2, &d);
        kpt_buffer_read(bds, 0, gs, sizeof(gs), &d);
        const void *got[6] = {go, gl, gq, gk, gv, gs};
        const double *want[6] = {o_ref, lse_ref, dq, dk, dv, ds};
        const size_t n[6] = {NQ, (size_t)B * HQ * S, NQ, NK, NK, HQ};
        static const char *const names[6] = {"o", "lse", "dq", "dk", "dv", "dsinks"};
        printf("%-28s", "causal+softcap(20) + sinks");
        for (int i = 0; i < 6; i++) {
            kpt_dtype dt = i == 1 || i == 5 ? KPT_DTYPE_F32 : KPT_DTYPE_BF16;
            double e = error(got[i], dt, want[i], n[i]);
            printf(" %s %.2g", names[i], e);
            CHECK(e <= 1e-2, "sinks: %s relative error %.3g", names[i], e);
        }
        printf("\n");
    }
    kpt_buffer *all[] = {bq, bk, bv, bo, bl, bs, bdo, bdq, bdk, bdv, bds};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
        kpt_buffer_destroy(&all[i]);
    kpt_pattern_destroy(&p);
}

int main(void)
{
    kpt_diag d = {0};
    kpt_context *ctx = NULL;
    kpt_context_params cp = {.backend = KPT_BACKEND_CUDA, .flags = KPT_CONTEXT_NO_DISK_CACHE};
    if (kpt_context_create(&cp, &ctx, &d) || !load_driver()) {
        printf("SKIP: no CUDA device (%s)\n", d.message);
        return 77;
    }
    printf("device: %s (%s)\n", kpt_context_device_name(ctx), kpt_context_target(ctx));
    srand(7);
    fill();
    kpt_pattern *p = NULL;
    if (kpt_pattern_from_lua(learned_src, sizeof(learned_src) - 1, NULL, &p, &d)) {
        printf("SKIP: no Lua front end (%s)\n", d.message);
        kpt_context_destroy(&ctx);
        return 77;
    }
    /* the default mode both ways: dq summed in kpt_bwd_dkdv (forced: at these sizes, fewer
     * CTAs than SMs, the runtime takes kpt_bwd_dq) and as the runtime chooses */
    setenv("KPT_CUDA_DQ_SUMS", "1", 1);
    run(ctx, p, 0);
    unsetenv("KPT_CUDA_DQ_SUMS");
    run(ctx, p, 0);
    run(ctx, p, 1);
    kpt_pattern_destroy(&p);
    run_sinks(ctx);
    kpt_context_destroy(&ctx);
    printf("%s: %d failure%s\n", failures ? "FAILED" : "passed", failures, failures == 1 ? "" : "s");
    return failures ? 1 : 0;
}
