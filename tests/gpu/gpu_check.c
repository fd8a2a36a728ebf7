/* gpu_check: every pattern x dtype x head dims x GQA ratio x lengths on the CUDA backend, against
 * the CPU reference, on fresh random inputs with poisoned outputs (tests/gpu/README.md).
 *
 *   gpu_check [--quick] [--filter TEXT] [--shard K/N] [--seed N] [--scripts DIR]
 *
 * --quick runs a small subset (for compute-sanitizer). --shard K/N runs the cases whose index is
 * K modulo N (0 <= K < N), so that N processes share the matrix (NVRTC's compiles and the CPU
 * reference set its time: the full matrix took 341 s in one process on the H200). --scripts adds every Lua pattern script
 * of DIR (examples/patterns) with its default params; a build without Lua skips them. Prints one line per case and a summary;
 * exits 0 when every case passes, 1 when one fails, 77 (skip) when there is no CUDA device.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <getopt.h>
#include <time.h>

#include <kpt/kpt.h>

#include "compiler/parse_lua.h"
#include "compiler/parse_pattern.h"
#include "base/numeric.h"
#include "runtime/attention_args.h"
#include "runtime/cuda_device.h"
#include "tools/rng.h"
#include "tests/gpu/check_common.h"
#include "tests/gpu/shard.h"
#include "tests/covers_builtins.h"

static const char *const all_patterns[] = {
    "full", "causal", "causal_bottom_right", "sliding_window(100)", "sliding_window($w=256)",
    "local(64,32)", "chunked(128)", "prefix_lm(200)", "document", "alibi", "softcap(20)",
    "alibi+causal", "softcap(50)+causal", "document+causal", "document+causal+softcap(30)",
};
#define NPAT ((int)(sizeof(all_patterns) / sizeof(all_patterns[0])))

static const int lens[][2] = {{1, 1}, {17, 17}, {1000, 1000}, {1, 300}, {300, 1}, {1000, 777},
                              {17, 1000}};
#define NLEN ((int)(sizeof(lens) / sizeof(lens[0])))

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- a small kernel cache, so each (pattern, dtype, dims) compiles once ---------------------- */

typedef struct cached {
    char key[128];
    kpt_pattern *p;
    kpt_cuda_kernel *k;
    kpt_cuda_kernel *tall; /* k's tall variant, where KPT_CUDA_TALL=1 asked for it */
} cached;

static cached cache[256];
static int ncache;
static double total_compile_ms, max_compile_ms;

static kpt_cuda_kernel *get_kernel(const kpt_cuda_device *dev, const gcase *c, kpt_diag *d)
{
    char key[128];
    snprintf(key, sizeof(key), "%s|%d|%d|%d", c->pattern, c->dtype, c->dqk, c->dv);
    for (int i = 0; i < ncache; i++)
        if (!strcmp(cache[i].key, key))
            return cache[i].k;
    if (ncache == 256)
        return NULL;
    kpt_pattern *p = NULL;
    size_t n = strlen(c->pattern);
    bool script = n > 4 && !strcmp(c->pattern + n - 4, ".lua");
    if (script ? kpt_pattern_from_lua_file(c->pattern, NULL, &p, d)
               : kpt_pattern_parse(c->pattern, &p, d))
        return NULL;
    kpt_kernel_config cfg = {.dtype = c->dtype, .dqk = c->dqk, .dv = c->dv};
    kpt_cuda_kernel *k = NULL;
    double t0 = now();
    if (kpt_cuda_kernel_create(dev, p, &cfg, &k, d)) {
        kpt_pattern_destroy(&p);
        return NULL;
    }
    double ms = (now() - t0) * 1e3;
    total_compile_ms += ms;
    if (ms > max_compile_ms)
        max_compile_ms = ms;
    /* With KPT_CUDA_TALL=1, every call of a plan with a tall variant takes it (the runtime's
     * choice otherwise: kpt_forward_tall_pays), as the context pairs them */
    const char *tall_env = getenv("KPT_CUDA_TALL");
    kpt_cuda_kernel *tall = NULL;
    if (k->plan.tall_variant && tall_env && !strcmp(tall_env, "1")) {
        cfg.tall = true;
        if (kpt_cuda_kernel_create(dev, p, &cfg, &tall, d)) {
            kpt_cuda_kernel_destroy(&k);
            kpt_pattern_destroy(&p);
            return NULL;
        }
        kpt_cuda_kernel_pair(k, tall);
    }
    snprintf(cache[ncache].key, sizeof(cache[ncache].key), "%s", key);
    cache[ncache].p = p;
    cache[ncache].k = k;
    cache[ncache].tall = tall;
    ncache++;
    return k;
}

/* ---- inputs ------------------------------------------------------------------------------------ */

typedef struct dbuf {
    CUdeviceptr d;
    void *h;
    size_t bytes;
} dbuf;

static bool dalloc(const kpt_cu_api *cu, dbuf *b, size_t bytes)
{
    b->bytes = bytes ? bytes : 16;
    b->h = calloc(1, b->bytes);
    return b->h && cu->MemAlloc(&b->d, b->bytes) == 0;
}

static void dfree(const kpt_cu_api *cu, dbuf *b)
{
    if (b->d)
        cu->MemFree(b->d);
    free(b->h);
    memset(b, 0, sizeof(*b));
}

/* ---- one case ---------------------------------------------------------------------------------- */

static int run_case(const kpt_cuda_device *dev, const gcase *c, uint64_t seed, result *res)
{
    memset(res, 0, sizeof(*res));
    const kpt_cu_api *cu = dev->cu;
    kpt_diag d = {0};
    kpt_cuda_kernel *k = get_kernel(dev, c, &d);
    if (!k) {
        snprintf(res->why, sizeof(res->why), "compile: %.140s", d.message);
        return d.status == KPT_ERR_UNSUPPORTED && strstr(d.message, "no Lua") ? 77 : 1;
    }
    const kpt_pattern *p = k->pattern;
    size_t es = (size_t)kpt_dtype_size(c->dtype);
    size_t no = (size_t)c->B * c->Hq * c->Sq * c->dv, nl = (size_t)c->B * c->Hq * c->Sq;
    dbuf q = {0}, kk = {0}, v = {0}, o = {0}, lse = {0}, aux[KPT_MAX_AUX] = {{0}};
    kpt_aux_tensor dev_aux[KPT_MAX_AUX];
    check_inputs in;
    if (!check_inputs_make(c, p, seed, &in, res))
        return 1;
    const kpt_attention_args *ha = &in.ref;
    int rc = 1;
    if (!dalloc(cu, &q, in.q_bytes) || !dalloc(cu, &kk, in.k_bytes) ||
        !dalloc(cu, &v, in.v_bytes) || !dalloc(cu, &o, no * es) || !dalloc(cu, &lse, nl * 4)) {
        snprintf(res->why, sizeof(res->why), "out of memory");
        goto out;
    }
    for (int a = 0; a < p->num_aux; a++) {
        if (!dalloc(cu, &aux[a], in.aux_bytes[a]) ||
            cu->MemcpyHtoD(aux[a].d, in.aux[a], in.aux_bytes[a])) {
            snprintf(res->why, sizeof(res->why), "aux upload failed");
            goto out;
        }
        dev_aux[a] = in.host_aux[a];
        dev_aux[a].tensor.data = (void *)(uintptr_t)aux[a].d;
    }

    /* device: inputs up, outputs poisoned (all-ones bits: NaN in f16, bf16 and f32) */
    kpt_attention_args da = *ha;
    da.q.data = (void *)(uintptr_t)q.d;
    da.k.data = (void *)(uintptr_t)kk.d;
    da.v.data = (void *)(uintptr_t)v.d;
    da.o = tensor4((void *)(uintptr_t)o.d, c->dtype, c, c->Hq, c->Sq, c->dv);
    da.lse = kpt_tensor_contiguous((void *)(uintptr_t)lse.d, KPT_DTYPE_F32, 3,
                                   (int64_t[]){c->B, c->Hq, c->Sq});
    da.aux = dev_aux;
    if (cu->MemcpyHtoD(q.d, in.q, in.q_bytes) || cu->MemcpyHtoD(kk.d, in.k, in.k_bytes) ||
        cu->MemcpyHtoD(v.d, in.v, in.v_bytes) || cu->MemsetD8(o.d, 0xff, o.bytes) ||
        cu->MemsetD8(lse.d, 0xff, lse.bytes)) {
        snprintf(res->why, sizeof(res->why), "upload failed");
        goto out;
    }
    if (kpt_cuda_attention(k, &da, 0, NULL, &d)) {
        snprintf(res->why, sizeof(res->why), "launch: %.140s", d.message);
        goto out;
    }
    CUresult r = cu->CtxSynchronize();
    if (r) {
        kpt_cu_fail(&d, "kernel", r);
        snprintf(res->why, sizeof(res->why), "%.150s", d.message);
        goto out;
    }
    if (cu->MemcpyDtoH(o.h, o.d, o.bytes) || cu->MemcpyDtoH(lse.h, lse.d, lse.bytes)) {
        snprintf(res->why, sizeof(res->why), "download failed");
        goto out;
    }

    check_compare(c, &da.o, o.h, lse.h, in.ref_o, in.ref_l, res);
    rc = 0;
out:
    dfree(cu, &q);
    dfree(cu, &kk);
    dfree(cu, &v);
    dfree(cu, &o);
    dfree(cu, &lse);
    for (int a = 0; a < KPT_MAX_AUX; a++)
        dfree(cu, &aux[a]);
    check_inputs_free(&in);
    return rc;
}

/* ---- the matrix --------------------------------------------------------------------------------- */

static int ncases;
static gcase cases[4096];

static void add_scaled(const char *pat, kpt_dtype dt, int dqk, int dv, int B, int Hq, int Hkv,
                       int Sq, int Skv, const char *scalar, bool bshd, double scale)
{
    if (ncases < 4096)
        cases[ncases++] = (gcase){pat, dt, dqk, dv, B, Hq, Hkv, Sq, Skv, scalar, bshd, scale, false};
}

static void add(const char *pat, kpt_dtype dt, int dqk, int dv, int B, int Hq, int Hkv, int Sq,
                int Skv, const char *scalar, bool bshd)
{
    add_scaled(pat, dt, dqk, dv, B, Hq, Hkv, Sq, Skv, scalar, bshd, 0);
}

/* Negative and unusual scales: without a score mod the kernel folds the scale into the
 * exponent and negates Q for a negative one (templates/cuda/attention.cu). */
static void add_scales(void)
{
    static const char *const sp[] = {"full", "causal", "softcap(20)", "sliding_window(100)"};
    for (int i = 0; i < 4; i++) {
        add_scaled(sp[i], KPT_DTYPE_BF16, 128, 128, 1, 2, 2, 300, 333, NULL, false, -0.09);
        add_scaled(sp[i], KPT_DTYPE_F16, 64, 64, 1, 2, 1, 129, 1000, NULL, true, -0.2);
        add_scaled(sp[i], KPT_DTYPE_BF16, 64, 128, 1, 2, 2, 1000, 17, NULL, false, 0.5);
    }
}

/* Every .lua of dir, over dtypes, head dims 64/128, GQA and MHA, odd and unequal lengths. */
static void add_scripts(const char *dir)
{
    static char paths[32][512];
    int n = 0;
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d)) && n < 32) {
        size_t len = strlen(e->d_name);
        if (len > 4 && !strcmp(e->d_name + len - 4, ".lua"))
            snprintf(paths[n++], sizeof(paths[0]), "%s/%s", dir, e->d_name);
    }
    if (d)
        closedir(d);
    static const int slens[][2] = {{17, 17}, {1000, 1000}, {300, 777}};
    static const kpt_dtype dts[] = {KPT_DTYPE_BF16, KPT_DTYPE_F16};
    for (int i = 0; i < n; i++)
        for (int di = 0; di < 2; di++)
            for (int hd = 0; hd < 2; hd++)
                for (int li = 0; li < 3; li++)
                    add(paths[i], dts[di], hd ? 128 : 64, hd ? 128 : 64, li ? 1 : 2, 4,
                        (li + di) % 2 ? 1 : 4, slens[li][0], slens[li][1], NULL, li == 2);
}

/* More q tiles x heads x batch rows than an H100 or H200 has SMs, and short items (a few kv
 * tiles): the sm_90a kernel's persistent grid, each CTA walking several work items
 * (runtime/forward_grid.c). KPT_CUDA_PERSISTENT=N in the environment puts every case on N CTAs. */
static void add_persistent(bool quick)
{
    add("causal", KPT_DTYPE_BF16, 128, 128, 2, 16, 4, 1000, 1000, NULL, false);
    add("document+causal", KPT_DTYPE_F16, 64, 64, 3, 8, 8, 700, 900, NULL, true);
    /* head dim 64, unmasked: three consumers on 192-row tiles; at 1000 rows the last tile's
     * third of 192 rows leaves two consumers without rows (kpt_consume_idle) on every head */
    add("full", KPT_DTYPE_BF16, 64, 64, 2, 16, 4, 1000, 1000, NULL, true);
    add("alibi", KPT_DTYPE_F16, 64, 64, 2, 8, 2, 1000, 777, NULL, true);
    if (quick)
        return;
    add("full", KPT_DTYPE_BF16, 128, 128, 2, 16, 16, 1000, 1000, NULL, false);
    add("alibi", KPT_DTYPE_F16, 128, 128, 1, 24, 8, 1500, 1500, NULL, true);
    add("sliding_window(100)", KPT_DTYPE_BF16, 256, 256, 2, 12, 4, 900, 900, NULL, false);
    add_scaled("causal", KPT_DTYPE_F16, 64, 64, 2, 12, 12, 1111, 1300, NULL, false, -0.2);
}

static void build_matrix(bool quick)
{
    static const kpt_dtype dts[] = {KPT_DTYPE_BF16, KPT_DTYPE_F16};
    add_persistent(quick);
    if (quick) {
        static const char *const qp[] = {"causal", "document+causal", "softcap(20)", "alibi"};
        for (int i = 0; i < 4; i++) {
            add(qp[i], KPT_DTYPE_BF16, 64, 64, 1, 4, 1, 200, 333, NULL, false);
            add(qp[i], KPT_DTYPE_F16, 128, 128, 2, 2, 2, 129, 129, NULL, true);
        }
        /* head dim 256: the sm_90a kernel's 64-key tiles and 256-wide P V */
        add("document+causal", KPT_DTYPE_BF16, 256, 256, 1, 2, 1, 200, 333, NULL, false);
        add("alibi", KPT_DTYPE_F16, 256, 128, 1, 2, 2, 129, 129, NULL, true);
        add_scaled("full", KPT_DTYPE_BF16, 128, 128, 1, 2, 2, 300, 333, NULL, false, -0.09);
        add_scaled("causal", KPT_DTYPE_F16, 64, 64, 1, 2, 1, 129, 1000, NULL, true, -0.2);
        return;
    }
    for (int pi = 0; pi < NPAT; pi++)
        for (int di = 0; di < 2; di++)
            for (int hd = 0; hd < 2; hd++) {
                int D = hd ? 128 : 64;
                for (int g = 0; g < 2; g++)
                    for (int li = 0; li < NLEN; li++)
                        add(all_patterns[pi], dts[di], D, D, g ? 1 : 2, g ? 4 : 2, g ? 1 : 2,
                            lens[li][0], lens[li][1], NULL, (li + g) % 3 == 2);
                /* a long odd length, MHA */
                add(all_patterns[pi], dts[di], D, D, 1, 4, 4, 4133, 4133, NULL, false);
            }
    /* the other head dims, Dqk != Dv */
    static const int dims[][2] = {{32, 32},  {96, 96},  {256, 256}, {128, 64},
                                  {64, 128}, {256, 64}, {128, 256}};
    static const char *const dp[] = {"full", "causal", "document+causal", "softcap(50)+causal",
                                     "alibi"};
    for (size_t i = 0; i < sizeof(dims) / sizeof(dims[0]); i++)
        for (size_t j = 0; j < sizeof(dp) / sizeof(dp[0]); j++)
            for (int di = 0; di < 2; di++) {
                add(dp[j], dts[di], dims[i][0], dims[i][1], 1, 4, 1, 1000, 777, NULL, false);
                add(dp[j], dts[di], dims[i][0], dims[i][1], 2, 2, 2, 17, 300, NULL, true);
            }
    /* head dim 256 over many 64-key tiles, odd lengths */
    add("causal", KPT_DTYPE_BF16, 256, 256, 1, 2, 2, 2333, 2333, NULL, false);
    add("sliding_window(100)", KPT_DTYPE_F16, 256, 256, 1, 4, 2, 1500, 1777, NULL, true);
    /* runtime scalars: other values, same kernel */
    add("sliding_window($w=256)", KPT_DTYPE_BF16, 128, 128, 1, 2, 2, 1000, 1000, "w=77", false);
    add("sliding_window($w=256)", KPT_DTYPE_BF16, 128, 128, 1, 2, 2, 1000, 1000, "w=1", false);
    add("sliding_window($w=256)", KPT_DTYPE_F16, 64, 64, 1, 2, 2, 1000, 1000, "w=5000", false);
    add_scales();
}

int main(int argc, char **argv)
{
    const char *missing = kpt_test_uncovered_builtin(all_patterns, NPAT);
    if (missing) {
        fprintf(stderr, "the pattern list misses the built-in '%s'\n", missing);
        return 1;
    }
    bool quick = false;
    const char *filter = NULL, *scripts = NULL;
    uint64_t seed = (uint64_t)time(NULL);
    static const struct option opts[] = {{"quick", no_argument, NULL, 'q'},
                                         {"filter", required_argument, NULL, 'f'},
                                         {"seed", required_argument, NULL, 's'},
                                         {"scripts", required_argument, NULL, 'd'},
                                         {"shard", required_argument, NULL, 'k'},
                                         {NULL, 0, NULL, 0}};
    shard sh = SHARD_ALL;
    bool bad = false;
    for (int c; (c = getopt_long(argc, argv, "", opts, NULL)) != -1;) {
        if (c == 'q')
            quick = true;
        else if (c == 'f')
            filter = optarg;
        else if (c == 's')
            seed = strtoull(optarg, NULL, 10);
        else if (c == 'd')
            scripts = optarg;
        else if (c == 'k')
            bad |= !shard_parse(optarg, &sh);
        else
            bad = true; /* getopt_long said what was wrong */
    }
    if (bad || optind != argc) {
        fprintf(stderr, "usage: gpu_check [--quick] [--filter TEXT] " SHARD_USAGE " "
                        "[--seed N] [--scripts DIR]\n");
        return 2;
    }
    kpt_diag d = {0};
    kpt_cuda_device dev;
    if (kpt_cuda_device_open(0, &dev, &d)) {
        printf("SKIP: %s\n", d.message);
        return 77;
    }
    printf("device: %s (sm_%d, %d SMs), seed %llu\n", dev.name, dev.sm, dev.sm_count,
           (unsigned long long)seed);
    build_matrix(quick);
    if (scripts)
        add_scripts(scripts);
    int pass = 0, fail = 0, skipped = 0;
    double t0 = now();
    printf("%-30s %-4s %-7s %-9s %-11s %-9s %-9s %s\n", "pattern", "type", "Dqk/Dv", "B,Hq,Hkv",
           "Sq,Skv", "rel err", "lse err", "result");
    for (int i = 0; i < ncases; i++) {
        const gcase *c = &cases[i];
        if ((filter && !strstr(c->pattern, filter)) || !shard_has(sh, i))
            continue;
        result r;
        int rc = run_case(&dev, c, seed + (uint64_t)i * 7919, &r);
        char dims[16], heads[24], lens_s[24];
        snprintf(dims, sizeof(dims), "%d/%d", c->dqk, c->dv);
        snprintf(heads, sizeof(heads), "%d,%d,%d", c->B, c->Hq, c->Hkv);
        snprintf(lens_s, sizeof(lens_s), "%d,%d", c->Sq, c->Skv);
        if (rc == 77) {
            skipped++;
            continue;
        }
        bool ok = rc == 0 && r.pass;
        pass += ok;
        fail += !ok;
        printf("%-30s %-4s %-7s %-9s %-11s %-9.2e %-9.2e %s%s%s%s%s\n", c->pattern,
               kpt_dtype_name(c->dtype), dims, heads, lens_s, r.rel, r.lse_err,
               ok ? "pass" : "FAIL", c->bshd ? " bshd" : "", c->scalar ? " $" : "",
               c->scalar ? c->scalar : "", ok ? "" : "  ");
        if (c->scale != 0)
            printf("    (scale %g)\n", c->scale);
        if (!ok)
            printf("    %s\n", r.why);
        fflush(stdout);
    }
    if (skipped)
        printf("\n%d cases skipped: this build has no Lua\n", skipped);
    printf("\n%d passed, %d failed, %d kernels compiled (NVRTC+load: mean %.0f ms, max %.0f ms), "
           "%.1f s\n", pass, fail, ncache, ncache ? total_compile_ms / ncache : 0, max_compile_ms,
           now() - t0);
    for (int i = 0; i < ncache; i++) {
        kpt_cuda_kernel_destroy(&cache[i].k);
        kpt_cuda_kernel_destroy(&cache[i].tall);
        kpt_pattern_destroy(&cache[i].p);
    }
    kpt_cuda_device_close(&dev);
    return fail ? 1 : 0;
}
