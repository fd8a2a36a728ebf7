/* api_check: patterns x dtypes x head dims x GQA x lengths on one backend (Vulkan, HIP or CUDA),
 * through the public API only (context, buffers, kernels, block maps), against the CPU reference
 * on fresh random inputs with poisoned outputs; and, with --bench, TFLOP/s of full and causal
 * attention (beside the CUDA backend in the same process when the backend is another).
 *
 *   api_check --backend vulkan|hip|cuda [--full] [--filter TEXT] [--seed N] [--scripts DIR]
 *             [--device N] [--bench]
 *
 * The default matrix is small enough for lavapipe (Mesa's CPU Vulkan driver), where CI runs it
 * through meson test; --full adds the lengths tests/gpu/run.sh uses on a GPU (1000, 4133). The
 * dtypes are f32 and f16 on Vulkan, bf16 and f16 on HIP and CUDA. Prints one line per failing
 * case and a summary; exits 0 when every case passes, 1 when one fails, 77 (skip) when the
 * backend has no device. */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <time.h>

#include <kpt/kpt.h>

#include "runtime/backend_vulkan.h"
#include "runtime/context.h"
#include "tests/gpu/check_common.h"
#include "tests/covers_builtins.h"

static const char *const all_patterns[] = {
    "full", "causal", "causal_bottom_right", "sliding_window(100)", "sliding_window($w=40)",
    "local(64,32)", "chunked(48)", "prefix_lm(50)", "document", "alibi", "softcap(20)",
    "alibi+causal", "softcap(50)+causal", "document+causal", "document+causal+softcap(30)",
};
#define NPAT ((int)(sizeof(all_patterns) / sizeof(all_patterns[0])))

static kpt_context *ctx;
static kpt_backend_kind backend;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
static bool f16_ok = true;

/* ---- one case ---------------------------------------------------------------------------------- */

typedef struct hostbuf {
    void *h;
    size_t bytes;
    kpt_buffer *d;
} hostbuf;

static bool hb_alloc(hostbuf *b, size_t bytes)
{
    b->bytes = bytes ? bytes : 16;
    b->h = calloc(1, b->bytes);
    return b->h && !kpt_buffer_create(ctx, b->bytes, &b->d, NULL);
}

static void hb_free(hostbuf *b)
{
    kpt_buffer_destroy(&b->d);
    free(b->h);
    memset(b, 0, sizeof(*b));
}

static bool poison(hostbuf *b)
{
    void *p = malloc(b->bytes);
    if (!p)
        return false;
    memset(p, 0xff, b->bytes); /* NaN in f16 and f32 */
    bool ok = !kpt_buffer_write(b->d, 0, p, b->bytes, NULL);
    free(p);
    return ok;
}

/* A device buffer holding a copy of n bytes of src. */
static bool put(kpt_buffer **b, const void *src, size_t n)
{
    return !kpt_buffer_create(ctx, n, b, NULL) && !kpt_buffer_write(*b, 0, src, n, NULL);
}

static kpt_pattern *load(const char *pat, kpt_diag *d)
{
    kpt_pattern *p = NULL;
    size_t n = strlen(pat);
    bool script = n > 4 && !strcmp(pat + n - 4, ".lua");
    if (script ? kpt_pattern_from_lua_file(pat, NULL, &p, d) : kpt_pattern_parse(pat, &p, d))
        return NULL;
    return p;
}

/* Launches (with a block map built first when `use_map`), reads o and lse back, compares. */
static bool run_device(const gcase *c, kpt_kernel *k, const kpt_attention_args *da, hostbuf *o,
                       hostbuf *lse, const double *ref_o, const double *ref_l, bool use_map,
                       result *res)
{
    kpt_diag d = {0};
    kpt_blockmap *map = NULL;
    if (!poison(o) || !poison(lse)) {
        snprintf(res->why, sizeof(res->why), "poisoning failed");
        return false;
    }
    kpt_status st = use_map ? kpt_blockmap_create(k, da, NULL, &map, &d) : KPT_OK;
    if (!st)
        st = kpt_kernel_launch(k, da, map, NULL, &d);
    kpt_blockmap_destroy(&map);
    if (!st)
        st = kpt_buffer_read(o->d, 0, o->h, o->bytes, &d);
    if (!st)
        st = kpt_buffer_read(lse->d, 0, lse->h, lse->bytes, &d);
    if (st) {
        snprintf(res->why, sizeof(res->why), "launch%s: %.140s", use_map ? " (map)" : "",
                 d.message);
        return false;
    }
    check_compare(c, &da->o, o->h, lse->h, ref_o, ref_l, res);
    return true;
}

static int run_case(const gcase *c, uint64_t seed, result *res)
{
    memset(res, 0, sizeof(*res));
    kpt_diag d = {0};
    kpt_pattern *p = load(c->pattern, &d);
    kpt_kernel *k = NULL;
    kpt_kernel_desc desc = {.dtype = c->dtype, .head_dim = c->dqk, .head_dim_v = c->dv};
    if (!p || kpt_kernel_get(ctx, p, &desc, &k, &d)) {
        snprintf(res->why, sizeof(res->why), "compile: %.140s", d.message);
        kpt_pattern_destroy(&p);
        return d.status == KPT_ERR_UNSUPPORTED && strstr(d.message, "no Lua") ? 77 : 1;
    }
    size_t es = (size_t)kpt_dtype_size(c->dtype);
    size_t no = (size_t)c->B * c->Hq * c->Sq * c->dv, nl = (size_t)c->B * c->Hq * c->Sq;
    hostbuf o = {0}, lse = {0};
    kpt_buffer *q = NULL, *kk = NULL, *v = NULL, *sk = NULL, *aux[KPT_MAX_AUX] = {NULL};
    kpt_aux_tensor dev_aux[KPT_MAX_AUX];
    check_inputs in;
    if (!check_inputs_make(c, p, seed, &in, res)) {
        kpt_pattern_destroy(&p);
        return 1;
    }
    int rc = 1;
    bool up = hb_alloc(&o, no * es) && hb_alloc(&lse, nl * 4) && put(&q, in.q, in.q_bytes) &&
              put(&kk, in.k, in.k_bytes) && put(&v, in.v, in.v_bytes) &&
              (!c->sinks || put(&sk, in.sinks, (size_t)c->Hq * 4));
    for (int a = 0; up && a < p->num_aux; a++) {
        up = put(&aux[a], in.aux[a], in.aux_bytes[a]);
        dev_aux[a] = in.host_aux[a];
        dev_aux[a].tensor.data = kpt_buffer_data(aux[a]);
    }
    if (!up) {
        snprintf(res->why, sizeof(res->why), "out of memory or upload failed");
        goto out;
    }
    kpt_attention_args da = in.ref;
    da.q.data = kpt_buffer_data(q);
    da.k.data = kpt_buffer_data(kk);
    da.v.data = kpt_buffer_data(v);
    da.o = tensor4(kpt_buffer_data(o.d), c->dtype, c, c->Hq, c->Sq, c->dv);
    da.lse = kpt_tensor_contiguous(kpt_buffer_data(lse.d), KPT_DTYPE_F32, 3,
                                   (int64_t[]){c->B, c->Hq, c->Sq});
    da.aux = dev_aux;
    if (c->sinks)
        da.sinks.data = kpt_buffer_data(sk);
    if (!run_device(c, k, &da, &o, &lse, in.ref_o, in.ref_l, false, res))
        goto out;
    /* data-dependent masks: again with a block map made by the caller */
    if (res->pass && p->num_aux && strstr(c->pattern, "document") &&
        !run_device(c, k, &da, &o, &lse, in.ref_o, in.ref_l, true, res))
        goto out;
    rc = 0;
out:
    kpt_buffer_destroy(&q);
    kpt_buffer_destroy(&kk);
    kpt_buffer_destroy(&v);
    kpt_buffer_destroy(&sk);
    hb_free(&o);
    hb_free(&lse);
    for (int a = 0; a < KPT_MAX_AUX; a++)
        kpt_buffer_destroy(&aux[a]);
    check_inputs_free(&in);
    kpt_pattern_destroy(&p);
    return rc;
}

/* ---- the matrix --------------------------------------------------------------------------------- */

static int ncases;
static gcase cases[4096];

static void add(const char *pat, kpt_dtype dt, int dqk, int dv, int B, int Hq, int Hkv, int Sq,
                int Skv, bool bshd)
{
    bool bits16 = dt == KPT_DTYPE_F16 || (dt == KPT_DTYPE_BF16 && backend == KPT_BACKEND_VULKAN);
    if (ncases == (int)(sizeof(cases) / sizeof(cases[0])) || (bits16 && !f16_ok))
        return;
    const char *scalar = strstr(pat, "$w") ? "w=40" : NULL;
    cases[ncases++] = (gcase){pat, dt, dqk, dv, B, Hq, Hkv, Sq, Skv, scalar, bshd, 0, false};
}

/* The last case added, with attention sinks. */
static void with_sinks(void)
{
    if (ncases > 0)
        cases[ncases - 1].sinks = true;
}

static void build_matrix(bool full, const char *scripts, char paths[][512], int *npaths)
{
    static const int lens[][2] = {{1, 1}, {17, 17}, {77, 45}, {1, 33}, {33, 1}, {130, 130}};
    static const int big[][2] = {{1000, 1000}, {1000, 777}, {17, 1000}, {4133, 4133}};
    /* the wide dtype: f32 on Vulkan, bf16 on the tensor-core backends */
    const kpt_dtype dts[] = {backend == KPT_BACKEND_VULKAN ? KPT_DTYPE_F32 : KPT_DTYPE_BF16,
                             KPT_DTYPE_F16};
    /* on lavapipe (not --full) f16 under every third pattern: each (pattern, dtype) is a kernel
     * of 3-12 s of JIT there, and f16 differs from f32 in the storage types only */
    const bool thin = backend == KPT_BACKEND_VULKAN && !full;
    for (int pi = 0; pi < NPAT; pi++)
        for (int di = 0; di < 2; di++)
            for (int li = 0; li < 6 && !(thin && di == 1 && pi % 3); li++)
                /* MHA and GQA 4:1, both layouts, across lengths */
                add(all_patterns[pi], dts[di], 64, 64, li % 2 + 1, 4, li % 3 == 1 ? 1 : 4,
                    lens[li][0], lens[li][1], (li + di) % 2 == 1);
    /* Vulkan takes any head dim up to 256 (40/24 here); the others 32, 64, 96, 128 and 256 */
    const int dims[][2] = {{32, 32}, {128, 128}, {128, 64},
                           {backend == KPT_BACKEND_VULKAN ? 40 : 96,
                            backend == KPT_BACKEND_VULKAN ? 24 : 96}, {256, 256}};
    for (int i = 0; i < (backend == KPT_BACKEND_VULKAN ? 4 : 5); i++)
        for (int di = 0; di < 2; di++) {
            add("causal", dts[di], dims[i][0], dims[i][1], 1, 2, 1, 77, 77, i % 2);
            add("document+causal", dts[di], dims[i][0], dims[i][1], 2, 2, 2, 45, 130, i % 2 == 0);
        }
    /* bf16 on Vulkan (16-bit storage widened in the shader, the same for every pattern): a mask,
     * a score mod, aux loads, long rows and the head dims of the matrix. (Every pattern took 14
     * kernels, a minute of lavapipe's compiles in CI.) */
    if (backend == KPT_BACKEND_VULKAN) {
        static const char *const bf16_pats[] = {"causal_bottom_right", "softcap(20)", "document"};
        for (int pi = 0; pi < 3; pi++)
            add(bf16_pats[pi], KPT_DTYPE_BF16, 64, 64, 2, 4, 1, 77, 45, pi % 2 == 1);
        for (int i = 0; i < 4; i++)
            add(i % 2 ? "document+causal" : "causal", KPT_DTYPE_BF16, dims[i][0], dims[i][1], 1,
                2, 1, i < 2 ? 2048 : 130, i < 2 ? 2048 : 77, i == 1);
    }
    /* Long rows at every head dim the matrix runs: lavapipe once returned garbage past ~475 keys
     * (its loop limit; docs/vulkan.md), and CI runs this part there. */
    static const int longs[][2] = {{2048, 2048}, {33, 2047}};
    static const char *const long_pats[] = {"causal", "full", "document+causal", "alibi",
                                            "sliding_window($w=40)"};
    for (int i = 0; i < (backend == KPT_BACKEND_VULKAN ? 4 : 5); i++)
        for (int li = 0; li < 2; li++)
            add(long_pats[(2 * i + li) % 5], dts[(i + li) % 2], dims[i][0], dims[i][1], 1, 1, 1,
                longs[li][0], longs[li][1], li == 1);
    /* attention sinks: rows with nothing kept (bottom-right causal, Sq > Skv: O = 0, LSE = the
     * sink), GQA, both dtypes and kernels' head dims */
    for (int di = 0; di < 2; di++) {
        add("causal_bottom_right", dts[di], 64, 64, 2, 4, 2, 77, 45, di == 1);
        with_sinks();
        add("softcap(30)+causal", dts[di], dims[1][0], dims[1][1], 1, 4, 1, 130, 130, di == 0);
        with_sinks();
        add("document+causal", dts[di], 64, 64, 2, 2, 2, 45, 130, false);
        with_sinks();
    }
    if (full)
        for (int pi = 0; pi < NPAT; pi++)
            for (int li = 0; li < 4; li++)
                add(all_patterns[pi], dts[li % 2], li < 2 ? 128 : 64, li < 2 ? 128 : 64, 1, 4,
                    li % 2 ? 1 : 4, big[li][0], big[li][1], li == 2);
    DIR *dir = scripts ? opendir(scripts) : NULL;
    struct dirent *e;
    while (dir && (e = readdir(dir)) && *npaths < 64) {
        size_t n = strlen(e->d_name);
        if (n > 4 && !strcmp(e->d_name + n - 4, ".lua"))
            snprintf(paths[(*npaths)++], 512, "%s/%s", scripts, e->d_name);
    }
    if (dir)
        closedir(dir);
    /* each script in one dtype, by turns (its code is the dtype's storage apart the same), unless
     * --full: a kernel is most of a case's time on lavapipe */
    for (int i = 0; i < *npaths; i++)
        for (int di = 0; di < 2; di++) {
            if (!full && di != i % 2)
                continue;
            add(paths[i], dts[di], 64, 64, 1, 4, di ? 1 : 4, 17, 17, false);
            add(paths[i], dts[di], 64, 64, 2, 2, 2, 130, 77, true);
            if (full)
                add(paths[i], dts[di], 128, 128, 1, 4, 4, 1000, 1000, di == 1);
        }
}

/* ---- --bench: full and causal at D = 128, B * S = 16k tokens, beside CUDA ------------------- */

/* Milliseconds of one launch: the dispatch's timestamps on Vulkan; elsewhere the wall time of a
 * launch followed by kpt_context_synchronize (a few microseconds of launch cost included). */
static double launch_ms(kpt_context *c, kpt_kernel *k, const kpt_attention_args *a, kpt_diag *d)
{
    bool vk = kpt_context_backend(c) == KPT_BACKEND_VULKAN;
    double t0 = now_s();
    if (kpt_kernel_launch(k, a, NULL, NULL, d) || (!vk && kpt_context_synchronize(c, d)))
        return -1;
    return vk ? kpt_backend_vulkan_last_ms(kpt_context_backend_impl(c)) : (now_s() - t0) * 1e3;
}

/* Median of 5 launches after a warm-up, in ms, or -1 with *d set. */
static double bench_one(kpt_context *c, const char *pat, kpt_dtype dt, int B, int H, int S, int D,
                        kpt_diag *d)
{
    kpt_pattern *p = load(pat, d);
    kpt_kernel *k = NULL;
    kpt_kernel_desc desc = {.dtype = dt, .head_dim = D};
    gcase gc = {pat, dt, D, D, B, H, H, S, S, NULL, false, 0, false};
    size_t n = (size_t)B * H * S * D * (size_t)kpt_dtype_size(dt);
    kpt_buffer *q = NULL, *kv = NULL, *o = NULL;
    double ms[6] = {-1};
    void *zero = calloc(1, n); /* zeros: no overflow in f16 */
    kpt_status st = p ? kpt_kernel_get(c, p, &desc, &k, d) : d->status;
    if (!st && !zero)
        st = KPT_ERR_NO_MEMORY;
    if (!st && (kpt_buffer_create(c, n, &q, d) || kpt_buffer_create(c, n, &kv, d) ||
                kpt_buffer_create(c, n, &o, d) || kpt_buffer_write(q, 0, zero, n, d) ||
                kpt_buffer_write(kv, 0, zero, n, d)))
        st = d->status ? d->status : KPT_ERR_DEVICE;
    kpt_attention_args a = {
        .q = tensor4(kpt_buffer_data(q), dt, &gc, H, S, D),
        .k = tensor4(kpt_buffer_data(kv), dt, &gc, H, S, D),
        .v = tensor4(kpt_buffer_data(kv), dt, &gc, H, S, D),
        .o = tensor4(kpt_buffer_data(o), dt, &gc, H, S, D),
    };
    for (int r = 0; !st && r < 6; r++)
        if ((ms[r] = launch_ms(c, k, &a, d)) < 0)
            st = d->status ? d->status : KPT_ERR_DEVICE;
    for (int i = 1; !st && i < 6; i++) /* sort the timed runs (ms[0] is the warm-up) */
        for (int j = i; j > 1 && ms[j] < ms[j - 1]; j--) {
            double t = ms[j];
            ms[j] = ms[j - 1];
            ms[j - 1] = t;
        }
    kpt_buffer_destroy(&q);
    kpt_buffer_destroy(&kv);
    kpt_buffer_destroy(&o);
    free(zero);
    kpt_pattern_destroy(&p);
    return st ? -1 : ms[3];
}

static int bench(void)
{
    static const char *const pats[] = {"full", "causal"};
    const int H = 16, D = 128, tokens = 16384;
    const kpt_dtype dt = !f16_ok ? KPT_DTYPE_F32 : backend == KPT_BACKEND_VULKAN ? KPT_DTYPE_F16
                                                                                : KPT_DTYPE_BF16;
    const char *name = kpt_backend_name(backend);
    kpt_context *cuda = NULL;
    kpt_context_params cp = {.backend = KPT_BACKEND_CUDA, .flags = KPT_CONTEXT_NO_DISK_CACHE};
    kpt_diag cd = {0};
    if (backend != KPT_BACKEND_CUDA && kpt_context_create(&cp, &cuda, &cd))
        printf("bench: no CUDA comparison: %s\n", cd.message);
    printf("bench: %s, %s, D=%d, H=%d, B*S=%d; median of 5 launches after a warm-up (Vulkan: "
           "the dispatch's timestamps; otherwise launch + synchronise, wall time)\n",
           kpt_context_device_name(ctx), kpt_dtype_name(dt), D, H, tokens);
    printf("  %-7s %-7s %-4s %9s ms %10s %12s %10s %8s\n", "pattern", "S", "B", name, "TFLOP/s",
           "cuda ms", "TFLOP/s", "/cuda");
    for (int pi = 0; pi < 2; pi++)
        for (int S = 1024; S <= tokens; S *= 4) {
            const int B = tokens / S;
            double kept = pi ? (double)(S + 1) / (2.0 * S) : 1.0;
            double tflop = 4.0 * B * H * (double)S * S * D * kept / 1e12;
            kpt_diag d = {0};
            double ms = bench_one(ctx, pats[pi], dt, B, H, S, D, &d);
            if (ms < 0) {
                printf("  %-7s %-7d failed on %s: %s\n", pats[pi], S, name, d.message);
                continue;
            }
            double cu = cuda ? bench_one(cuda, pats[pi], dt, B, H, S, D, &d) : -1;
            if (cu < 0 && cuda)
                printf("  %-7s %-7d failed on CUDA: %s\n", pats[pi], S, d.message);
            printf("  %-7s %-7d %-4d %12.3f %10.2f", pats[pi], S, B, ms, tflop / (ms * 1e-3));
            if (cu > 0)
                printf(" %12.3f %10.2f %8.3f", cu, tflop / (cu * 1e-3), cu / ms);
            printf("\n");
        }
    kpt_context_destroy(&cuda);
    return 0;
}

static bool parse_backend(const char *s)
{
    static const kpt_backend_kind kinds[] = {KPT_BACKEND_VULKAN, KPT_BACKEND_HIP,
                                             KPT_BACKEND_CUDA};
    for (int i = 0; i < 3; i++)
        if (!strcmp(s, kpt_backend_name(kinds[i]))) {
            backend = kinds[i];
            return true;
        }
    return false;
}

/* On lavapipe, a launch past its loop limit is refused with KPT_ERR_LIMIT and leaves o as it was
 * (docs/vulkan.md); elsewhere nothing to check. Returns whether that held. */
static bool check_llvmpipe_refusal(void)
{
    if (backend != KPT_BACKEND_VULKAN || strncmp(kpt_context_device_name(ctx), "llvmpipe", 8))
        return true;
    const int64_t Skv = 20000, D = 64;
    kpt_diag d = {0};
    kpt_pattern *p = load("full", &d);
    kpt_kernel *k = NULL;
    kpt_kernel_desc desc = {.dtype = KPT_DTYPE_F32, .head_dim = (int)D};
    kpt_buffer *q = NULL, *kv = NULL, *o = NULL;
    float poison[64], back[64];
    for (int i = 0; i < 64; i++)
        poison[i] = -7.0f;
    bool ok = p && !kpt_kernel_get(ctx, p, &desc, &k, &d) &&
              !kpt_buffer_create(ctx, sizeof(poison), &q, &d) &&
              !kpt_buffer_create(ctx, (size_t)(Skv * D * 4), &kv, &d) &&
              !kpt_buffer_create(ctx, sizeof(poison), &o, &d) &&
              !kpt_buffer_write(q, 0, poison, sizeof(poison), &d) &&
              !kpt_buffer_write(o, 0, poison, sizeof(poison), &d);
    if (ok) {
        const int64_t sq[4] = {1, 1, 1, D}, sk[4] = {1, 1, Skv, D};
        kpt_attention_args a = {
            .q = kpt_tensor_contiguous(kpt_buffer_data(q), KPT_DTYPE_F32, 4, sq),
            .k = kpt_tensor_contiguous(kpt_buffer_data(kv), KPT_DTYPE_F32, 4, sk),
            .v = kpt_tensor_contiguous(kpt_buffer_data(kv), KPT_DTYPE_F32, 4, sk),
            .o = kpt_tensor_contiguous(kpt_buffer_data(o), KPT_DTYPE_F32, 4, sq),
        };
        kpt_status st = kpt_kernel_launch(k, &a, NULL, NULL, &d);
        ok = st == KPT_ERR_LIMIT && strstr(d.message, "llvmpipe") &&
             !kpt_buffer_read(o, 0, back, sizeof(back), &d) && !memcmp(back, poison, sizeof(back));
        printf("api_check: Skv = %lld on lavapipe: %s (%s)\n", (long long)Skv,
               ok ? "refused" : "NOT refused", st ? d.message : "KPT_OK");
    } else {
        printf("api_check: the refusal check could not start: %s\n", d.message);
    }
    kpt_buffer_destroy(&q);
    kpt_buffer_destroy(&kv);
    kpt_buffer_destroy(&o);
    kpt_pattern_destroy(&p);
    return ok;
}

int main(int argc, char **argv)
{
    const char *missing = kpt_test_uncovered_builtin(all_patterns, NPAT);
    if (missing) {
        fprintf(stderr, "the pattern list misses the built-in '%s'\n", missing);
        return 1;
    }
    bool full = false, do_bench = false;
    const char *filter = NULL, *scripts = NULL;
    uint64_t seed = 1;
    int device = 0;
    static const struct option opts[] = {
        {"full", no_argument, NULL, 'F'},          {"bench", no_argument, NULL, 'B'},
        {"filter", required_argument, NULL, 'f'},  {"seed", required_argument, NULL, 's'},
        {"scripts", required_argument, NULL, 'd'}, {"device", required_argument, NULL, 'n'},
        {"backend", required_argument, NULL, 'b'}, {NULL, 0, NULL, 0}};
    bool bad = false;
    for (int c; (c = getopt_long(argc, argv, "", opts, NULL)) != -1;) {
        if (c == 'F')
            full = true;
        else if (c == 'B')
            do_bench = true;
        else if (c == 'f')
            filter = optarg;
        else if (c == 's')
            seed = strtoull(optarg, NULL, 10);
        else if (c == 'd')
            scripts = optarg;
        else if (c == 'n')
            device = atoi(optarg);
        else if (c != 'b' || !parse_backend(optarg))
            bad = true; /* getopt_long (or the backend's name) was wrong */
    }
    if (bad || optind != argc) {
        fprintf(stderr, "usage: api_check --backend vulkan|hip|cuda [--full] [--filter TEXT] "
                        "[--seed N] [--scripts DIR] [--device N] [--bench]\n");
        return 2;
    }
    if (backend == KPT_BACKEND_AUTO) {
        fprintf(stderr, "api_check: --backend vulkan|hip|cuda is required\n");
        return 2;
    }
    kpt_diag d = {0};
    kpt_context_params cp = {.backend = backend, .device = device,
                             .flags = KPT_CONTEXT_NO_DISK_CACHE};
    kpt_status st = kpt_context_create(&cp, &ctx, &d);
    if (st) {
        printf("api_check: %s skipped: %s\n", kpt_backend_name(backend), d.message);
        return st == KPT_ERR_NO_DEVICE || st == KPT_ERR_UNSUPPORTED ? 77 : 1;
    }
    kpt_pattern *probe = load("full", &d);
    kpt_kernel *pk = NULL;
    kpt_kernel_desc f16 = {.dtype = KPT_DTYPE_F16, .head_dim = 64};
    f16_ok = probe && kpt_kernel_get(ctx, probe, &f16, &pk, &d) != KPT_ERR_UNSUPPORTED;
    kpt_pattern_destroy(&probe);
    printf("api_check: %s (%s), f16 %s\n", kpt_context_device_name(ctx),
           kpt_context_target(ctx), f16_ok ? "yes" : "no (storageBuffer16BitAccess missing)");
    if (backend == KPT_BACKEND_VULKAN)
        printf("api_check: %s\n",
               kpt_backend_vulkan_matrix_support(kpt_context_backend_impl(ctx)));
    if (do_bench) {
        int rc = bench();
        kpt_context_destroy(&ctx);
        return rc;
    }
    static char paths[64][512];
    int npaths = 0;
    build_matrix(full, scripts, paths, &npaths);
    int pass = 0, fail = 0, skipped = 0;
    for (int i = 0; i < ncases; i++) {
        const gcase *c = &cases[i];
        if (filter && !strstr(c->pattern, filter))
            continue;
        result r;
        double t0 = now_s();
        int rc = run_case(c, seed + (uint64_t)i, &r);
        if (getenv("KPT_CHECK_TIMES"))
            printf("%.3f s  %s%s %s d%d/%d S%d/%d\n", now_s() - t0, c->pattern,
                   c->sinks ? " +sinks" : "",
                   kpt_dtype_name(c->dtype), c->dqk, c->dv, c->Sq, c->Skv);
        if (rc == 77) {
            skipped++;
            continue;
        }
        if (rc == 0 && r.pass) {
            pass++;
            continue;
        }
        fail++;
        printf("FAIL %s%s %s d%d/%d B%d H%d/%d S%d/%d %s: %s\n", c->pattern,
               c->sinks ? " +sinks" : "", kpt_dtype_name(c->dtype), c->dqk, c->dv, c->B, c->Hq, c->Hkv, c->Sq, c->Skv,
               c->bshd ? "bshd" : "bhsd", r.why);
    }
    if (!filter && !check_llvmpipe_refusal())
        fail++;
    kpt_stats s;
    kpt_context_get_stats(ctx, &s);
    printf("api_check: %d passed, %d failed, %d skipped (no Lua); %d kernels compiled in "
           "%.0f ms\n", pass, fail, skipped, (int)s.compiles, s.compile_ms_total);
    kpt_context_destroy(&ctx);
    return fail ? 1 : 0;
}
