/* kpt-embedding: a small application that embeds libkpt through its public API only.
 *
 * It loads a pattern (a Lua script by default, or any pattern string), opens the best backend
 * this machine has (a CUDA GPU, else the CPU reference), gets the kernel for one shape class,
 * runs it on random bf16 inputs (with a reusable block map where the pattern needs one), checks
 * the output against the CPU reference and prints the runtime's statistics.
 *
 *     kpt-embedding [PATTERN|SCRIPT.lua [NAME=VALUE...]]
 *
 * NAME=VALUE sets a Lua script's params. The shape is fixed: B=2, Hq=8, Hkv=2, S=1000, D=64. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kpt/kpt.h>

enum { B = 2, HQ = 8, HKV = 2, S = 1000, D = 64 };

#ifndef KPT_EXAMPLE_SCRIPT
#define KPT_EXAMPLE_SCRIPT "examples/patterns/longformer.lua"
#endif

static void log_to_stderr(void *user, kpt_log_level level, const char *msg)
{
    (void)user;
    fprintf(stderr, "[kpt %s] %s\n", level <= KPT_LOG_WARN ? "warn" : "info", msg);
}

/* float -> bfloat16 bits, rounding to nearest even (inputs here are finite) */
static uint16_t to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

static uint32_t rng_state = 12345;

static float uniform(void) /* in [-1, 1) */
{
    rng_state = rng_state * 1664525u + 1013904223u;
    return (float)(rng_state >> 8) / (float)(1u << 23) - 1.0f;
}

static int fail(const char *what, const kpt_diag *d)
{
    fprintf(stderr, "kpt-embedding: %s: %s\n", what, d->message);
    return 1;
}

static kpt_status load(const char *arg, int nparams, char **params, kpt_pattern **p,
                       kpt_diag *d)
{
    size_t n = strlen(arg);
    if (n < 4 || strcmp(arg + n - 4, ".lua"))
        return kpt_pattern_parse(arg, p, d);
    kpt_param_value values[16];
    char names[16][32];
    for (int i = 0; i < nparams && i < 16; i++) {
        const char *eq = strchr(params[i], '=');
        size_t len = eq ? (size_t)(eq - params[i]) : 0;
        if (!eq || len >= sizeof(names[i])) {
            snprintf(d->message, sizeof(d->message), "'%s': expected NAME=VALUE", params[i]);
            return KPT_ERR_INVALID_ARGUMENT;
        }
        memcpy(names[i], params[i], len);
        names[i][len] = 0;
        values[i] = (kpt_param_value){names[i], atof(eq + 1)};
    }
    kpt_lua_params lp = {.params = values, .num_params = nparams < 16 ? nparams : 16};
    return kpt_pattern_from_lua_file(arg, &lp, p, d);
}

/* The size of one aux dimension for this shape. */
static int64_t dim_size(int64_t dim)
{
    switch (dim) {
    case KPT_DIM_B: return B;
    case KPT_DIM_HQ: return HQ;
    case KPT_DIM_HKV: return HKV;
    case KPT_DIM_SQ: case KPT_DIM_SKV: case KPT_DIM_ANY: return S;
    default: return dim;
    }
}

/* Plausible aux data whatever the pattern: booleans true for a few positions (global tokens),
 * integers rising every 300 positions (document ids), floats small and smooth (biases). */
static void fill_aux(const kpt_aux_info *ai, void *data, int64_t n, int64_t last)
{
    for (int64_t i = 0; i < n; i++) {
        int64_t pos = i % last;
        switch (ai->dtype) {
        case KPT_DTYPE_BOOL: ((uint8_t *)data)[i] = pos == 0 || pos % 97 == 5; break;
        case KPT_DTYPE_I32: ((int32_t *)data)[i] = (int32_t)(pos / 300); break;
        case KPT_DTYPE_F32: ((float *)data)[i] = 0.1f * sinf((float)pos); break;
        default: ((uint16_t *)data)[i] = to_bf16(0.1f * sinf((float)pos)); break;
        }
    }
}

typedef struct host_args {
    uint16_t *q, *k, *v, *o;
    float *lse;
    void *aux_data[8];
    kpt_aux_tensor aux[8];
    kpt_scalar_value scalars[8];
    kpt_attention_args args;
} host_args;

static kpt_tensor t4(void *data, int64_t h, int64_t d)
{
    return kpt_tensor_contiguous(data, KPT_DTYPE_BF16, 4, (int64_t[]){B, h, S, d});
}

/* Host inputs: random q, k, v; aux tensors and scalars the pattern declares. */
static int make_inputs(const kpt_pattern *p, host_args *h)
{
    size_t nq = (size_t)B * HQ * S * D, nk = (size_t)B * HKV * S * D;
    h->q = malloc(nq * 2), h->k = malloc(nk * 2), h->v = malloc(nk * 2), h->o = malloc(nq * 2);
    h->lse = malloc((size_t)B * HQ * S * sizeof(float));
    if (!h->q || !h->k || !h->v || !h->o || !h->lse)
        return 1;
    for (size_t i = 0; i < nq; i++) h->q[i] = to_bf16(uniform());
    for (size_t i = 0; i < nk; i++) h->k[i] = to_bf16(uniform());
    for (size_t i = 0; i < nk; i++) h->v[i] = to_bf16(uniform());
    h->args = (kpt_attention_args){.q = t4(h->q, HQ, D), .k = t4(h->k, HKV, D),
                                   .v = t4(h->v, HKV, D), .o = t4(h->o, HQ, D),
                                   .lse = kpt_tensor_contiguous(h->lse, KPT_DTYPE_F32, 3,
                                                                (int64_t[]){B, HQ, S})};
    int na = kpt_pattern_aux_count(p);
    for (int i = 0; i < na && i < 8; i++) {
        kpt_aux_info ai;
        kpt_pattern_aux_info(p, i, &ai);
        int64_t shape[3], n = 1;
        for (int d = 0; d < ai.rank; d++)
            n *= shape[d] = dim_size(ai.dims[d]);
        if (!(h->aux_data[i] = malloc((size_t)n * (size_t)kpt_dtype_size(ai.dtype))))
            return 1;
        fill_aux(&ai, h->aux_data[i], n, shape[ai.rank - 1]);
        h->aux[i] = (kpt_aux_tensor){ai.name, kpt_tensor_contiguous(h->aux_data[i], ai.dtype,
                                                                     ai.rank, shape)};
        printf("aux tensor %s: %s, rank %d\n", ai.name, kpt_dtype_name(ai.dtype), ai.rank);
    }
    h->args.aux = h->aux;
    h->args.num_aux = na < 8 ? na : 8;
    int ns = kpt_pattern_scalar_count(p), nset = 0;
    for (int i = 0; i < ns && nset < 8; i++) {
        kpt_scalar_info si;
        kpt_pattern_scalar_info(p, i, &si);
        if (!si.has_default) {
            h->scalars[nset++] = (kpt_scalar_value){si.name, 128};
            printf("runtime scalar $%s = 128\n", si.name);
        }
    }
    h->args.scalars = h->scalars;
    h->args.num_scalars = nset;
    return 0;
}

/* Copies a host tensor to a new buffer and points `t` at it. */
static kpt_status upload(kpt_context *ctx, kpt_tensor *t, kpt_buffer **buf, kpt_diag *d)
{
    size_t n = (size_t)kpt_dtype_size(t->dtype);
    for (int i = 0; i < t->rank; i++)
        n *= (size_t)t->shape[i];
    kpt_status st = kpt_buffer_create(ctx, n, buf, d);
    if (!st)
        st = kpt_buffer_write(*buf, 0, t->data, n, d);
    if (!st)
        t->data = kpt_buffer_data(*buf);
    return st;
}

static double bf16_value(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

int main(int argc, char **argv)
{
    const char *what = argc > 1 ? argv[1] : KPT_EXAMPLE_SCRIPT;
    kpt_diag d = {0};
    kpt_pattern *p = NULL;
    if (load(what, argc > 2 ? argc - 2 : 0, argv + 2, &p, &d))
        return fail(what, &d);
    printf("pattern: %s\n", kpt_pattern_name(p));

    kpt_context_params cp = {.log = log_to_stderr, .log_level = KPT_LOG_INFO};
    kpt_context *ctx = NULL;
    if (kpt_context_create(&cp, &ctx, &d))
        return fail("context", &d);
    printf("backend: %s (%s, %s)\n", kpt_backend_name(kpt_context_backend(ctx)),
           kpt_context_target(ctx), kpt_context_device_name(ctx));

    kpt_kernel_desc desc = {.dtype = KPT_DTYPE_BF16, .head_dim = D};
    kpt_kernel *k = NULL;
    if (kpt_kernel_get(ctx, p, &desc, &k, &d))
        return fail("kernel", &d);

    static host_args h;
    if (make_inputs(p, &h))
        return fprintf(stderr, "kpt-embedding: out of memory\n"), 1;
    /* the launch's arguments: the same tensors, in the backend's memory */
    kpt_attention_args dev = h.args;
    kpt_aux_tensor dev_aux[8];
    memcpy(dev_aux, h.aux, sizeof(dev_aux));
    dev.aux = dev_aux;
    kpt_buffer *bufs[13] = {0};
    int nb = 0;
    kpt_status st = KPT_OK;
    kpt_tensor *io[] = {&dev.q, &dev.k, &dev.v, &dev.o, &dev.lse};
    for (int i = 0; i < 5 && !st; i++)
        st = upload(ctx, io[i], &bufs[nb++], &d);
    for (int i = 0; i < dev.num_aux && !st; i++)
        st = upload(ctx, &dev_aux[i].tensor, &bufs[nb++], &d);
    kpt_blockmap *map = NULL;
    if (!st && kpt_kernel_needs_blockmap(k)) /* built once, reused by every launch below */
        st = kpt_blockmap_create(k, &dev, NULL, &map, &d);
    int reps = kpt_context_backend(ctx) == KPT_BACKEND_CPU ? 1 : 3; /* the CPU is slow */
    for (int rep = 0; rep < reps && !st; rep++)
        st = kpt_kernel_launch(k, &dev, map, NULL, &d);
    if (!st)
        st = kpt_context_synchronize(ctx, &d);
    if (!st)
        st = kpt_buffer_read(bufs[3], 0, h.o, (size_t)B * HQ * S * D * 2, &d);
    if (st)
        return fail("launch", &d);

    /* the check: the CPU reference in double precision on the same (bf16) inputs */
    double *ref = malloc((size_t)B * HQ * S * D * sizeof(double));
    kpt_attention_args ra = h.args;
    ra.o = kpt_tensor_contiguous(ref, KPT_DTYPE_F64, 4, (int64_t[]){B, HQ, S, D});
    ra.lse.data = NULL;
    if (!ref || kpt_reference_attention(p, &ra, &d))
        return fail("reference", &d);
    double err = 0, scale = 0;
    for (size_t i = 0; i < (size_t)B * HQ * S * D; i++) {
        err = fmax(err, fabs(bf16_value(h.o[i]) - ref[i]));
        scale = fmax(scale, fabs(ref[i]));
    }
    double rel = err / (scale > 0 ? scale : 1);
    printf("max error against the CPU reference: %.3g (relative %.3g) -> %s\n", err, rel,
           rel <= 1e-2 ? "ok" : "FAILED");

    kpt_stats s;
    kpt_context_get_stats(ctx, &s);
    printf("stats: %llu requests, %llu compiles (%.0f ms total, %.0f ms max), %llu memory / %llu "
           "disk / %llu bundle hits, hit rate %.0f%%\n",
           (unsigned long long)s.requests, (unsigned long long)s.compiles, s.compile_ms_total,
           s.compile_ms_max, (unsigned long long)s.memory_hits, (unsigned long long)s.disk_hits,
           (unsigned long long)s.bundle_hits, 100 * s.hit_rate);
    fflush(stdout);

    kpt_blockmap_destroy(&map);
    for (int i = 0; i < nb; i++)
        kpt_buffer_destroy(&bufs[i]);
    kpt_context_destroy(&ctx);
    kpt_pattern_destroy(&p);
    free(ref);
    free(h.q), free(h.k), free(h.v), free(h.o), free(h.lse);
    for (int i = 0; i < 8; i++)
        free(h.aux_data[i]);
    return rel <= 1e-2 ? 0 : 1;
}
