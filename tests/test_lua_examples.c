/* Every example script of examples/patterns/ checked end to end: `kptc check --backend cpu
 * --save DIR` runs the script and the CPU reference on random inputs, and this test recomputes
 * the attention from the saved inputs with the example's mask and bias written out here as
 * plain C loops -- straight from each paper's definition, not through the IR -- and compares.
 *
 * argv[1] is kptc, argv[2] the source tree's examples/patterns directory. */
#include "tests/testutil.h"

#include <sys/stat.h>

#include "tools/npy.h"
#include "tests/runtool.h"

static const char *kptc, *examples;

typedef struct run_data {
    kpt_npy q, k, v, o, lse;
    kpt_npy aux[3];
    const char *aux_names[3];
    int naux;
    int64_t B, Hq, Hkv, S, D;
} run_data;

static double aux_at4(const run_data *r, const char *name, int64_t i0, int64_t i1, int64_t i2,
                      int64_t i3)
{
    for (int a = 0; a < r->naux; a++) {
        if (strcmp(r->aux_names[a], name) != 0)
            continue;
        const kpt_npy *n = &r->aux[a];
        int64_t idx[4] = {i0, i1, i2, i3}, off = 0;
        for (int d = 0; d < n->rank; d++) {
            assert_true(idx[d] >= 0 && idx[d] < n->shape[d]);
            off = off * n->shape[d] + idx[d];
        }
        return n->values[off];
    }
    fail_msg("no aux tensor %s saved", name);
    return 0;
}

static double aux_at(const run_data *r, const char *name, int64_t i0, int64_t i1, int64_t i2)
{
    return aux_at4(r, name, i0, i1, i2, 0);
}

/* ---- the examples, written out ------------------------------------------------------------- */

typedef struct example {
    const char *file;
    const char *shape;        /* --shape */
    const char *options[20];  /* more kptc options */
    const char *aux[3];       /* aux tensors the script declares */
    bool (*keep)(const run_data *r, int64_t b, int64_t h, int64_t q, int64_t k);
    double (*score)(const run_data *r, double s, int64_t b, int64_t h, int64_t q, int64_t k);
} example;

/* document_logical, prefix = 6: same document, and causal or within the document's first 6
 * tokens. The document's start is found by walking back over equal ids, not from `offsets`. */
static int64_t doc_start(const run_data *r, int64_t b, int64_t i)
{
    double id = aux_at(r, "doc", b, i, 0);
    while (i > 0 && aux_at(r, "doc", b, i - 1, 0) == id)
        i--;
    return i;
}

static bool keep_document(const run_data *r, int64_t b, int64_t h, int64_t q, int64_t k)
{
    if (aux_at(r, "doc", b, q, 0) != aux_at(r, "doc", b, k, 0))
        return false;
    int64_t start = doc_start(r, b, k);
    /* the script's offsets table must say the same */
    assert_true(aux_at(r, "offsets", b, (int64_t)aux_at(r, "doc", b, k, 0), 0) == (double)start);
    return q >= k || k - start < 6;
}

/* longformer, window = 8 */
static bool keep_longformer(const run_data *r, int64_t b, int64_t h, int64_t q, int64_t k)
{
    return llabs(q - k) <= 8 || aux_at(r, "global", b, q, 0) != 0 ||
           aux_at(r, "global", b, k, 0) != 0;
}

/* dilated_window, window = 6, dilation = 3: k is one of q, q-3, ..., q-15 */
static bool keep_dilated(const run_data *r, int64_t b, int64_t h, int64_t q, int64_t k)
{
    for (int j = 0; j < 6; j++)
        if (k == q - 3 * j)
            return true;
    return false;
}

/* natten_2d on a 12 x 10 canvas, kernel 5: the 5 x 5 window around the query, shifted inwards
 * at the borders */
static int64_t window_start(int64_t centre, int64_t size)
{
    int64_t start = centre - 2;
    if (start < 0)
        start = 0;
    if (start + 5 > size)
        start = size - 5;
    return start;
}

static bool keep_natten(const run_data *r, int64_t b, int64_t h, int64_t q, int64_t k)
{
    int64_t qx = q % 12, qy = q / 12, kx = k % 12, ky = k / 12;
    int64_t x0 = window_start(qx, 12), y0 = window_start(qy, 10);
    return kx >= x0 && kx < x0 + 5 && ky >= y0 && ky < y0 + 5;
}

/* sliding_tile in 3-D: an 8 x 8 x 16 (frames x height x width) canvas in tiles of 2 x 4 x 4
 * pixels, numbered tile by tile; a query sees the 3 x 1 x 3 tiles around its own, the window
 * shifted inwards at the borders. Tiles from pixels: a token's pixel, then the pixel's tile. */
static void sta_tile(int64_t t, int64_t tile[3])
{
    const int64_t size[3] = {2, 4, 4}, ntiles[3] = {4, 2, 4};
    int64_t i = t / 32, o = t % 32;
    int64_t ti[3] = {i / (ntiles[1] * ntiles[2]), i / ntiles[2] % ntiles[1], i % ntiles[2]};
    int64_t px[3] = {ti[0] * size[0] + o / 16, ti[1] * size[1] + o / 4 % 4, ti[2] * size[2] + o % 4};
    for (int d = 0; d < 3; d++)
        tile[d] = px[d] / size[d];
}

static bool keep_sta(const run_data *r, int64_t b, int64_t h, int64_t q, int64_t k)
{
    const int64_t ntiles[3] = {4, 2, 4}, win[3] = {3, 1, 3};
    int64_t tq[3], tk[3];
    sta_tile(q, tq);
    sta_tile(k, tk);
    for (int d = 0; d < 3; d++) {
        int64_t start = tq[d] - win[d] / 2;
        start = start < 0 ? 0 : start > ntiles[d] - win[d] ? ntiles[d] - win[d] : start;
        if (tk[d] < start || tk[d] >= start + win[d])
            return false;
    }
    return true;
}

/* natten_morton on a 16 x 16 canvas in Z order, kernel 5: x and y are a token's even and odd
 * bits */
static int64_t morton_coord(int64_t t, int shift)
{
    int64_t c = 0;
    for (int bit = 0; bit < 16; bit++)
        c |= ((t >> (2 * bit + shift)) & 1) << bit;
    return c;
}

static bool keep_morton(const run_data *r, int64_t b, int64_t h, int64_t q, int64_t k)
{
    int64_t qx = morton_coord(q, 0), qy = morton_coord(q, 1);
    int64_t kx = morton_coord(k, 0), ky = morton_coord(k, 1);
    int64_t x0 = qx - 2 < 0 ? 0 : qx - 2 > 11 ? 11 : qx - 2; /* clamped to 0..16-5 */
    int64_t y0 = qy - 2 < 0 ? 0 : qy - 2 > 11 ? 11 : qy - 2;
    return kx >= x0 && kx < x0 + 5 && ky >= y0 && ky < y0 + 5;
}

/* gelu_scores: s * Phi(s), causal */
static double score_gelu(const run_data *r, double s, int64_t b, int64_t h, int64_t q, int64_t k)
{
    return s * 0.5 * (1 + erf(s / sqrt(2.0)));
}

/* t5_buckets: T5's bidirectional bucket of k - q, 32 buckets, max distance 128 (a 1e-9 guard
 * makes exact powers land in their bucket, as the script documents) */
static double score_t5(const run_data *r, double s, int64_t b, int64_t h, int64_t q, int64_t k)
{
    int64_t rel = k - q, nb = 16, exact = 8, bucket = rel > 0 ? nb : 0, n = llabs(rel);
    if (n < exact) {
        bucket += n;
    } else {
        int64_t large = exact + (int64_t)floor(log((double)n / exact) / log(128.0 / exact) *
                                               (double)(nb - exact) + 1e-9);
        bucket += large < nb - 1 ? large : nb - 1;
    }
    return s + aux_at(r, "bias", h, bucket, 0);
}

/* gemma2, window = 24, cap = 50 */
static bool keep_gemma2(const run_data *r, int64_t b, int64_t h, int64_t q, int64_t k)
{
    return q >= k && q - k < 24;
}

static double score_gemma2(const run_data *r, double s, int64_t b, int64_t h, int64_t q, int64_t k)
{
    return 50.0 * tanh(s / 50.0);
}

/* graphormer: bias[h][min(dist, 15)]; the fill's distances must be a metric's */
static double score_graphormer(const run_data *r, double s, int64_t b, int64_t h, int64_t q,
                               int64_t k)
{
    double d = aux_at(r, "dist", b, q, k);
    assert_true(d == aux_at(r, "dist", b, k, q) && aux_at(r, "dist", b, q, q) == 0 && d >= 0);
    return s + aux_at(r, "bias", h, d > 15 ? 15 : (int64_t)d, 0);
}

/* graphormer_edges: the mean over K = 4 features of edge[b][q][k][c] * w[h][c] */
static double score_edges(const run_data *r, double s, int64_t b, int64_t h, int64_t q, int64_t k)
{
    double bias = 0;
    for (int c = 0; c < 4; c++)
        bias += aux_at4(r, "edge", b, q, k, c) * aux_at(r, "w", h, c, 0);
    return s + bias / 4;
}

/* prefix_lm with the runtime scalar prefix = 37 */
static bool keep_prefix(const run_data *r, int64_t b, int64_t h, int64_t q, int64_t k)
{
    return k < 37 || q >= k;
}

/* chunked_causal, chunk = 16 */
static bool keep_chunked(const run_data *r, int64_t b, int64_t h, int64_t q, int64_t k)
{
    return q / 16 == k / 16 && q >= k;
}

/* alibi: slope 2^(-8 (h+1) / Hq), causal */
static bool keep_causal(const run_data *r, int64_t b, int64_t h, int64_t q, int64_t k)
{
    return q >= k;
}

static double score_alibi(const run_data *r, double s, int64_t b, int64_t h, int64_t q, int64_t k)
{
    return s + pow(2.0, -8.0 * (double)(h + 1) / (double)r->Hq) * (double)(k - q);
}

static const example examples_list[] = {
    {"document_logical.lua", "2,4,2,100,100,16", {"--param", "prefix=6"}, {"doc", "offsets"},
     keep_document, NULL},
    {"longformer.lua", "2,4,2,90,90,16", {"--param", "window=8"}, {"global"}, keep_longformer,
     NULL},
    {"dilated_window.lua", "1,4,1,77,77,32", {"--param", "window=6", "--param", "dilation=3"},
     {NULL}, keep_dilated, NULL},
    {"natten_2d.lua", "1,2,2,120,120,16",
     {"--param", "width=12", "--param", "height=10", "--param", "kernel=5"}, {NULL}, keep_natten,
     NULL},
    {"t5_buckets.lua", "1,4,2,160,160,16", {NULL}, {"bias"}, NULL, score_t5},
    {"gemma2.lua", "2,2,2,70,70,16", {"--param", "window=24"}, {NULL}, keep_gemma2,
     score_gemma2},
    {"graphormer.lua", "2,4,4,40,40,16", {NULL}, {"bias", "dist"}, NULL, score_graphormer},
    {"graphormer_edges.lua", "2,4,2,41,41,16", {NULL}, {"edge", "w"}, NULL, score_edges},
    {"prefix_lm.lua", "1,4,2,81,81,16", {"--scalar", "prefix=37"}, {NULL}, keep_prefix, NULL},
    {"chunked_causal.lua", "1,4,2,75,75,16", {"--param", "chunk=16"}, {NULL}, keep_chunked,
     NULL},
    {"alibi.lua", "1,4,2,66,66,16", {NULL}, {NULL}, keep_causal, score_alibi},
    {"natten_morton.lua", "1,2,1,256,256,16", {"--param", "side=16", "--param", "kernel=5"},
     {NULL}, keep_morton, NULL},
    {"gelu_scores.lua", "1,4,2,70,70,16", {NULL}, {NULL}, keep_causal, score_gelu},
    {"sliding_tile.lua", "1,2,1,1024,1024,16",
     {"--param", "frames=8", "--param", "height=8", "--param", "width=16", "--param", "tile_f=2",
      "--param", "tile_h=4", "--param", "tile_w=4", "--param", "win_f=3", "--param", "win_h=1",
      "--param", "win_w=3"},
     {NULL}, keep_sta, NULL},
};

/* ---- the check ------------------------------------------------------------------------------ */

static void load(const char *dir, const char *name, kpt_npy *out)
{
    char path[600];
    snprintf(path, sizeof(path), "%s/%s.npy", dir, name);
    kpt_diag d = {0};
    if (kpt_npy_load(path, out, &d) != KPT_OK)
        fail_msg("%s", d.message);
}

static void check_example(const example *ex)
{
    char dir[] = "/tmp/kpt_lua_exampleXXXXXX";
    assert_non_null(mkdtemp(dir));
    char script[600];
    snprintf(script, sizeof(script), "%s/%s", examples, ex->file);
    const char *argv[40] = {kptc, "check", script, "--backend", "cpu", "--shape", ex->shape,
                            "--dtype", "f32", "--seed", "7", "--save", dir};
    int argc = 13;
    for (int i = 0; i < 20 && ex->options[i]; i++)
        argv[argc++] = ex->options[i];
    argv[argc] = NULL;
    static tool_result res;
    assert_true(tool_run(&res, argv));
    if (res.status != 0)
        fail_msg("%s: kptc check exited %d\n%s%s", ex->file, res.status, res.out, res.err);

    run_data r = {0};
    load(dir, "q", &r.q);
    load(dir, "k", &r.k);
    load(dir, "v", &r.v);
    load(dir, "o", &r.o);
    load(dir, "lse", &r.lse);
    for (int a = 0; a < 3 && ex->aux[a]; a++) {
        char name[64];
        snprintf(name, sizeof(name), "aux_%s", ex->aux[a]);
        load(dir, name, &r.aux[a]);
        r.aux_names[a] = ex->aux[a];
        r.naux++;
    }
    r.B = r.q.shape[0], r.Hq = r.q.shape[1], r.S = r.q.shape[2], r.D = r.q.shape[3];
    r.Hkv = r.k.shape[1];
    double scale = 1.0 / sqrt((double)r.D), max_err = 0;
    double *s = malloc((size_t)r.S * sizeof(double));
    int64_t kept = 0, total = 0;
    for (int64_t b = 0; b < r.B; b++)
        for (int64_t h = 0; h < r.Hq; h++) {
            int64_t hk = h / (r.Hq / r.Hkv);
            for (int64_t q = 0; q < r.S; q++) {
                double m = -INFINITY;
                for (int64_t k = 0; k < r.S; k++) {
                    double dot = 0;
                    for (int64_t e = 0; e < r.D; e++)
                        dot += r.q.values[((b * r.Hq + h) * r.S + q) * r.D + e] *
                               r.k.values[((b * r.Hkv + hk) * r.S + k) * r.D + e];
                    double sc = scale * dot;
                    if (ex->score)
                        sc = ex->score(&r, sc, b, h, q, k);
                    bool keep = !ex->keep || ex->keep(&r, b, h, q, k);
                    s[k] = keep ? sc : -INFINITY;
                    kept += keep;
                    total++;
                    if (s[k] > m)
                        m = s[k];
                }
                double sum = 0;
                for (int64_t k = 0; k < r.S; k++)
                    sum += m == -INFINITY ? 0 : exp(s[k] - m);
                int64_t row = (b * r.Hq + h) * r.S + q;
                double lse = m == -INFINITY ? -INFINITY : m + log(sum);
                if (lse == -INFINITY)
                    assert_true(r.lse.values[row] == -INFINITY);
                else
                    max_err = fmax(max_err, fabs(lse - r.lse.values[row]));
                for (int64_t e = 0; e < r.D; e++) {
                    double o = 0;
                    for (int64_t k = 0; k < r.S && sum > 0; k++)
                        o += exp(s[k] - m) / sum * r.v.values[((b * r.Hkv + hk) * r.S + k) * r.D + e];
                    max_err = fmax(max_err, fabs(o - r.o.values[row * r.D + e]));
                }
            }
        }
    free(s);
    print_message("%-22s kept %5.1f%% of pairs, max |error| %.3g\n", ex->file,
                  100.0 * (double)kept / (double)total, max_err);
    /* the hand-written side computes in double; kptc's reference evaluates the scripts' f32
     * expressions in float, as kernels do (docs/architecture.md), so scores differ by ulps */
    if (!(max_err < 1e-5))
        fail_msg("%s: kptc's reference and the hand-written one differ by %g", ex->file, max_err);
    /* a mask that keeps everything (or nothing) would make the test weak */
    if (ex->keep)
        assert_true(kept > 0 && kept < total);
    kpt_npy_free(&r.q);
    kpt_npy_free(&r.k);
    kpt_npy_free(&r.v);
    kpt_npy_free(&r.o);
    kpt_npy_free(&r.lse);
    for (int a = 0; a < r.naux; a++)
        kpt_npy_free(&r.aux[a]);
    char cmd[700];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

static void test_examples(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(examples_list) / sizeof(examples_list[0]); i++)
        check_example(&examples_list[i]);
}

/* Every script in the directory is in the list above (a new example must bring its check). */
static void test_all_listed(void **state)
{
    (void)state;
    char cmd[700];
    snprintf(cmd, sizeof(cmd), "ls '%s'", examples);
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    char line[256];
    int n = 0;
    while (fgets(line, sizeof(line), f)) {
        line[strcspn(line, "\n")] = 0;
        size_t len = strlen(line);
        if (len < 4 || strcmp(line + len - 4, ".lua") != 0)
            continue;
        bool listed = false;
        for (size_t i = 0; i < sizeof(examples_list) / sizeof(examples_list[0]); i++)
            listed |= !strcmp(examples_list[i].file, line);
        if (!listed)
            fail_msg("examples/patterns/%s has no check in test_lua_examples.c", line);
        n++;
    }
    pclose(f);
    assert_int_equal(n, (int)(sizeof(examples_list) / sizeof(examples_list[0])));
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: test_lua_examples KPTC EXAMPLES_DIR\n");
        return 2;
    }
    kptc = argv[1];
    examples = argv[2];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_all_listed),
        cmocka_unit_test(test_examples),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
