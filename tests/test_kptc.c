/* kptc end to end: every subcommand, and bad input exits 2 with a message saying what and where. */
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/testutil.h"

#include "tests/covers_builtins.h"
#include "tests/runtool.h"

static const char *kptc, *examples;

typedef tool_result result;

/* Runs kptc with the arguments (NULL-terminated). */
static result *run(const char *arg0, ...)
{
    static result res;
    const char *argv[32] = {kptc};
    int argc = 1;
    va_list ap;
    va_start(ap, arg0);
    for (const char *a = arg0; a && argc < 31; a = va_arg(ap, const char *))
        argv[argc++] = a;
    va_end(ap);
    argv[argc] = NULL;
    assert_true(tool_run(&res, argv));
    return &res;
}

#define EXPECT(r, code, stream, needle)                                                            \
    do {                                                                                           \
        if ((r)->status != (code) || !strstr((r)->stream, needle))                                 \
            fail_msg("exit %d (wanted %d); wanted '%s' in " #stream "\nstdout: %s\nstderr: %s",    \
                     (r)->status, code, needle, (r)->out, (r)->err);                               \
    } while (0)

static void test_basics(void **state)
{
    (void)state;
    result *r = run("--help", NULL);
    EXPECT(r, 0, out, "usage: kptc");
    r = run("--version", NULL);
    EXPECT(r, 0, out, "kptc 0.");
    r = run("patterns", NULL);
    EXPECT(r, 0, out, "sliding_window(W)");
    EXPECT(r, 0, out, "document");
    r = run(NULL);
    EXPECT(r, 2, err, "no command given");
    r = run("frobnicate", NULL);
    EXPECT(r, 2, err, "unknown command 'frobnicate'");
}

static void test_emit(void **state)
{
    (void)state;
    result *r = run("emit", "--emit", "ir", "causal", NULL);
    EXPECT(r, 0, out, "kpt-ir 1\npattern \"causal\"\n%1 = i32 q\n%2 = i32 k\n%3 = bool le %2 %1\nmask %3\n");
    r = run("emit", "sliding_window($w=64)+softcap(20)", "--dump-after", "parse", NULL);
    EXPECT(r, 0, out, "# after parse\n");
    EXPECT(r, 0, out, "scalar w i32 = 64");
    r = run("emit", "--dump-after=all", "alibi", NULL);
    EXPECT(r, 0, out, "# after opt_simplify (round 1)");
    r = run("emit", "causal+sliding_windw(128)", NULL);
    EXPECT(r, 2, err, "pattern:1:8: error: unknown pattern 'sliding_windw'; did you mean 'sliding_window'?\n"
                      "  causal+sliding_windw(128)\n         ^");
    r = run("emit", "--emit", "cuda", "--head-dim", "64", "--dtype", "f16", "causal", NULL);
    EXPECT(r, 0, out, "#define KPT_DQK 64\n");
    EXPECT(r, 0, out, "extern \"C\" __global__ void __launch_bounds__(KPT_THREADS) kpt_attention");
    /* the tall variant of a masked head-dim-64 kernel on sm_90a: 192-row q tiles, 16 warps */
    r = run("emit", "--emit", "cuda", "--target", "cuda:sm_90a", "--head-dim", "64", "causal", NULL);
    EXPECT(r, 0, out, "#define KPT_BM 128\n");
    r = run("emit", "--emit", "cuda", "--target", "cuda:sm_90a", "--head-dim", "64", "--tall",
            "causal", NULL);
    EXPECT(r, 0, out, "#define KPT_BM 192\n");
    r = run("emit", "--emit", "cuda", "--target", "cuda:sm_90a", "--head-dim", "128", "--tall",
            "causal", NULL);
    EXPECT(r, 1, err, "pattern 'causal' has no tall variant on cuda:sm_90a at this head dim");
    r = run("emit", "--emit", "cuda", "--target", "cuda:sm_90a", "--head-dim", "64", "--tall",
            "document", NULL);
    EXPECT(r, 1, err, "has no tall variant");
    r = run("emit", "--emit", "ir", "--tall", "causal", NULL);
    EXPECT(r, 2, err, "--tall goes with --emit cuda|ptx|cubin of a forward kernel");
    r = run("emit", "--emit", "cuda", "--backward", "--tall", "causal", NULL);
    EXPECT(r, 2, err, "--tall goes with --emit cuda|ptx|cubin of a forward kernel");
    /* the AMD kernel: HIP source (no headers, MFMA), a code object (an ELF), clear refusals */
    r = run("emit", "--emit", "hip", "--dtype", "f16", "--head-dim", "64", "causal", NULL);
    EXPECT(r, 0, out, "#define KPT_DQK 64\n");
    EXPECT(r, 0, out, "__builtin_amdgcn_mfma_f32_16x16x16f16");
    r = run("emit", "--emit", "hsaco", "--target", "hip:gfx90a", "causal", NULL);
    EXPECT(r, 0, out, "\x7f" "ELF");
    r = run("emit", "--emit", "hip", "--target", "hip:gfx1100", "causal", NULL);
    EXPECT(r, 2, err, "--target 'hip:gfx1100': --emit hip takes hip:gfx90a, hip:gfx940 or hip:gfx942");
    r = run("emit", "--emit", "hip", "--dtype", "f32", "causal", NULL);
    EXPECT(r, 2, err, "hip:gfx90a takes f16 or bf16");
    /* the Vulkan kernel: GLSL, and validated SPIR-V (the module's magic number first) */
    r = run("emit", "--emit", "glsl", "--head-dim", "64,32", "document+causal", NULL);
    EXPECT(r, 0, out, "#version 450\n");
    EXPECT(r, 0, out, "#define KPT_DQK 64\n#define KPT_DV 32\n");
    EXPECT(r, 0, out, "layout(std430, set = 0, binding = 13) readonly buffer kpt_aux_buf1");
    /* the serving kernel: the same template's KPT_ENTRY_PAGED, never the matrix kernel */
    r = run("emit", "--emit", "glsl", "--paged", "--target", "spirv:coopmat", "--head-dim", "128",
            "sliding_window(64)+alibi", NULL);
    EXPECT(r, 0, out, "#define KPT_ENTRY_PAGED 1\n#define KPT_MASK_PER_H 0\n#define KPT_MASK_AUX 0\n");
    EXPECT(r, 0, out, "#define KPT_COOPMAT 0\n");
    r = run("emit", "--emit", "spirv", "--paged", "--dtype", "bf16", "document+causal", NULL);
    EXPECT(r, 0, out, "\x03\x02\x23\x07");
    r = run("emit", "--emit", "glsl", "causal", NULL);
    EXPECT(r, 0, out, "#define KPT_ENTRY_PAGED 0\n");
    r = run("emit", "--emit", "spirv", "--dtype", "f32", "softcap(30)+alibi", NULL);
    EXPECT(r, 0, out, "\x03\x02\x23\x07");
    r = run("emit", "--emit", "spirv", "--blockmap", "document", NULL);
    EXPECT(r, 0, out, "\x03\x02\x23\x07");
    r = run("emit", "--emit", "spirv", "--blockmap", "causal", NULL);
    EXPECT(r, 1, err, "pattern 'causal' needs no block map");
    r = run("emit", "--emit", "glsl", "--dtype", "i32", "causal", NULL);
    EXPECT(r, 2, err, "spirv takes f16, bf16 or f32");
    r = run("emit", "--emit", "glsl", "--dtype", "bf16", "causal", NULL);
    EXPECT(r, 0, out, "#define KPT_BF16 1");
    r = run("emit", "--emit", "glsl", "--target", "cuda:sm_80", "causal", NULL);
    EXPECT(r, 2, err, "--emit glsl takes spirv");
    /* the cooperative-matrix kernel (no device here has it: compiled and validated only) */
    static const char *const cm_patterns[] = {
        "full", "causal", "document+causal+softcap(30)", "alibi+causal", "sliding_window($w=40)",
        "prefix_lm(50)", "chunked(48)", "local(64,32)"};
    for (int i = 0; i < 8; i++) {
        r = run("emit", "--emit", "spirv", "--target", "spirv:coopmat", "--head-dim",
                i % 2 ? "128,64" : "64", cm_patterns[i], NULL);
        EXPECT(r, 0, out, "\x03\x02\x23\x07");
    }
    r = run("emit", "--emit", "glsl", "--target", "spirv:coopmat", "--head-dim", "128", "causal",
            NULL);
    EXPECT(r, 0, out, "#define KPT_COOPMAT 1\n");
    /* shapes it does not take get the portable kernel */
    r = run("emit", "--emit", "glsl", "--target", "spirv:coopmat", "--head-dim", "256", "causal",
            NULL);
    EXPECT(r, 0, out, "#define KPT_COOPMAT 0\n");
    r = run("emit", "--emit", "glsl", "--target", "spirv:coopmat", "--dtype", "f32", "causal",
            NULL);
    EXPECT(r, 0, out, "#define KPT_COOPMAT 0\n");
    r = run("emit", "--emit", "glsl", "--head-dim", "300", "causal", NULL);
    EXPECT(r, 2, err, "the Vulkan backend supports 1 to 256");
    r = run("emit", "--emit", "cuda", "--smem", "4096", "causal", NULL);
    EXPECT(r, 2, err, "--smem and --blockmap go with --emit glsl|spirv");
    r = run("emit", "--emit", "cuda", "--target", "cuda:sm_70", "causal", NULL);
    EXPECT(r, 2, err, "--target 'cuda:sm_70': --emit cuda takes cuda:sm_80");
    r = run("emit", "--emit", "cuda", "--head-dim", "80", "causal", NULL);
    EXPECT(r, 2, err, "the CUDA backend supports 32, 64, 96, 128 and 256");
    r = run("emit", "--target", "cuda:sm_80", "causal", NULL);
    EXPECT(r, 2, err, "go with --emit cuda|ptx|cubin");
    r = run("emit", "--dump-after", "nope", "causal", NULL);
    EXPECT(r, 2, err, "unknown stage 'nope'");
    r = run("emit", "--bogus", "causal", NULL);
    EXPECT(r, 2, err, "unknown option '--bogus'");
    r = run("emit", NULL);
    EXPECT(r, 2, err, "emit needs a PATTERN");
    r = run("emit", "causal", "full", NULL);
    EXPECT(r, 2, err, "more than one PATTERN");
    r = run("emit", "--emit", NULL);
    EXPECT(r, 2, err, "option '--emit' needs a value");
    /* getopt_long: --opt=value, options after PATTERN, flags refuse values, per-command help */
    r = run("emit", "causal", "--emit=cuda", "--target=cuda:sm_90a", NULL);
    EXPECT(r, 0, out, "#define KPT_DQK 128");
    r = run("emit", "--verbose=1", "causal", NULL);
    EXPECT(r, 2, err, "--verbose takes no value");
    r = run("emit", "--dtype", "f16", "--dtype", "bf16", "--emit", "cuda", "causal", NULL);
    EXPECT(r, 2, err, "option '--dtype' given twice");
    r = run("emit", "--help", NULL);
    EXPECT(r, 0, out, "usage: kptc emit");
    r = run("check", "-h", NULL);
    EXPECT(r, 0, out, "--shape B,Hq,Hkv,Sq,Skv,Dqk[,Dv]");
    r = run("bundle", "--help", NULL);
    EXPECT(r, 0, out, "-j N");
    r = run("patterns", "extra", NULL);
    EXPECT(r, 2, err, "patterns takes no arguments");
    /* -o FILE writes there instead of stdout */
    char path[] = "/tmp/kptc-emit-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    r = run("emit", "--emit", "glsl", "-o", path, "causal", NULL);
    assert_int_equal(r->status, 0);
    assert_string_equal(r->out, "");
    FILE *f = fopen(path, "r");
    char head[64] = "";
    assert_non_null(f);
    assert_non_null(fgets(head, sizeof(head), f));
    fclose(f);
    unlink(path);
    assert_non_null(strstr(head, "#version 450"));
}

static void test_check(void **state)
{
    (void)state;
    result *r = run("check", "document+causal+softcap(30)", "--backend", "cpu", "--shape",
                    "2,4,2,100,100,32", "--seed", "3", NULL);
    EXPECT(r, 0, out, "B=2 Hq=4 Hkv=2 Sq=100 Skv=100 Dqk=32 Dv=32");
    EXPECT(r, 0, out, "doc_q i32 [2, 100]: generated: sorted segments of random lengths");
    EXPECT(r, 0, out, "agrees with the brute-force mask");
    EXPECT(r, 0, out, "all rows consistent");
    r = run("check", "sliding_window($w)", "--scalar", "w=16", "--shape", "1,2,1,70,90,16,8",
            "--dtype", "f16", "--layout", "bshd", "--tile", "16x32", NULL);
    EXPECT(r, 0, out, "$w = 16 (--scalar)");
    EXPECT(r, 0, out, "analysis   2 affine atoms, 0 opaque leaves: exact");
    r = run("check", "causal_bottom_right", "--shape", "1,1,1,50,20,8", NULL);
    EXPECT(r, 0, out, "30 fully masked rows");
    /* bad input */
    r = run("check", "sliding_window($w)", NULL);
    EXPECT(r, 2, err, "runtime scalar '$w' has no value and no default");
    r = run("check", "causal", "--shape", "1,3,2,8,8,8", NULL);
    EXPECT(r, 2, err, "Hq (3) must be a multiple of Hkv (2)");
    r = run("check", "causal", "--shape", "1,2,x,8,8,8", NULL);
    EXPECT(r, 2, err, "'x' is not a positive integer");
    r = run("check", "causal", "--shape", "1,2,2,8", NULL);
    EXPECT(r, 2, err, "--shape wants B,Hq,Hkv,Sq,Skv,Dqk[,Dv]");
    r = run("check", "causal", "--dtype", "f8", NULL);
    EXPECT(r, 2, err, "--dtype 'f8': expected f16, bf16 or f32");
    r = run("check", "causal", "--backend", "metal", NULL);
    EXPECT(r, 2, err, "--backend metal: expected cpu, cuda, hip or vulkan");
    /* lavapipe in CI; a machine without any Vulkan device says so before the reference runs */
    r = run("check", "prefix_lm(40)", "--backend", "vulkan", "--dtype", "f32", "--shape",
            "2,4,2,45,70,32", NULL);
    if (r->status == 1) { /* a missing driver is not bad input */
        assert_non_null(strstr(r->err, "Vulkan"));
        assert_string_equal(r->out, "");
    } else
        EXPECT(r, 0, out, "vulkan     spirv on ");
    r = run("check", "causal", "--backend", "cuda", "--dtype", "f32", NULL);
    EXPECT(r, 2, err, "dtype f32 is not supported by the CUDA backend");
    assert_string_equal(r->out, ""); /* refused before the reference ran */
    /* bf16 (kptc's default) on Vulkan: 16-bit storage, widened in the shader */
    r = run("check", "sliding_window(100)+softcap(20)", "--backend", "vulkan", "--shape",
            "1,4,2,300,700,64", NULL);
    if (r->status == 1)
        assert_non_null(strstr(r->err, "Vulkan"));
    else
        EXPECT(r, 0, out, "vulkan     spirv on ");
    /* without a GPU, --backend cuda says so before the reference runs (at 2048 tokens it took
     * seconds); with one it must agree */
    r = run("check", "causal", "--backend", "cuda", "--shape", "1,4,2,2048,2048,64", NULL);
    if (r->status == 1) {
        assert_non_null(strstr(r->err, "CUDA"));
        assert_string_equal(r->out, "");
    } else
        EXPECT(r, 0, out, "max relative error");
    /* no AMD GPU here: the HIP backend refuses cleanly, before the reference */
    r = run("check", "causal", "--backend", "hip", "--dtype", "f16", "--shape", "1,2,1,33,33,64",
            NULL);
    if (r->status == 1) {
        assert_non_null(strstr(r->err, "HIP"));
        assert_string_equal(r->out, "");
    } else
        EXPECT(r, 0, out, "max relative error");
    r = run("check", "causal", "--scalar", "w=3", NULL);
    EXPECT(r, 2, err, "unknown runtime scalar '$w'");
    r = run("check", "document", "--aux", "doc_q=/nonexistent.npy", NULL);
    EXPECT(r, 2, err, "cannot open '/nonexistent.npy'");
    r = run("check", "document", "--aux", "nothing=/x.npy", NULL);
    EXPECT(r, 2, err, "the pattern has no aux tensor 'nothing'");
    r = run("check", "causal", "--shape", "1000,64,64,16777216,16777216,128", NULL);
    EXPECT(r, 2, err, "Sq x Skv is too large for check's brute-force mask");
    r = run("check", "causal", "--shape", "1000,64,64,4096,4096,128", NULL);
    EXPECT(r, 2, err, "too large for the CPU reference");
    r = run("check", "causal", "--seed", "-4", NULL);
    EXPECT(r, 2, err, "--seed '-4' is not a non-negative integer");
}

/* Writes src to a new file named from `path` (a mkstemps template ending in ".lua"). */
static void write_script(char *path, const char *src)
{
    int fd = mkstemps(path, 4);
    assert_true(fd >= 0);
    assert_true(write(fd, src, strlen(src)) == (ssize_t)strlen(src));
    close(fd);
}

/* The reference evaluates f32 expressions in f32, as kernels do: a T5 bucket written as in Hugging
 * Face floors to 2 at n = 16, 32, ... in both (in double the reference got 1 and blamed the f32
 * Vulkan kernel with a relative error of 0.35). */
/* kptc check --backward on the CPU: the reference gradients against finite differences for
 * every built-in (tests/covers_builtins.h keeps the list whole) and an example script with a
 * learnable aux table; kptc emit --backward. */
static void test_check_paged(void **state)
{
    (void)state;
    result *r = run("check", "document+causal", "--page-size", "16", "--sinks", "--seqlens",
                    "1:300,4:40,0:0,2:2", "--shape", "1,8,2,1,1,32", NULL);
    EXPECT(r, 0, out, "4 sequences (queries:keys 1:300, 4:40, 0:0, 2:2), Hq=8 Hkv=2 D=32");
    EXPECT(r, 0, out, "pages of 16 rows, shuffled");
    EXPECT(r, 0, out, "all rows consistent");
    r = run("check", "causal", "--page-size", "0", NULL);
    EXPECT(r, 0, out, "cache      contiguous");
    r = run("check", "causal", "--seqlens", "5:4", NULL);
    EXPECT(r, 2, err, "each KV must be >= its Q");
    r = run("check", "causal", "--page-size", "300", NULL);
    EXPECT(r, 2, err, "--page-size wants 0 (contiguous) to 256");
    /* the Vulkan serving kernel (lavapipe in CI): a mask that reads aux data, one per head */
    static const char *const vk[] = {"document+causal", "alibi+sliding_window($w=50)"};
    for (int i = 0; i < 2; i++) {
        r = run("check", vk[i], "--backend", "vulkan", "--page-size", "7", "--sinks",
                "--seqlens", "1:300,5:40,0:0,17:90", "--shape", "1,8,2,1,1,32", NULL);
        if (r->status == 1 && strstr(r->err, "Vulkan")) /* no Vulkan device here */
            return;
        EXPECT(r, 0, out, "relative RMS error");
        EXPECT(r, 0, out, "all written");
    }
}

static void test_check_backward(void **state)
{
    (void)state;
    static const char *const pats[] = {
        "full", "causal+softcap(20)", "causal_bottom_right+alibi", "sliding_window(16)+alibi",
        "local(8,4)", "chunked(16)+softcap($c=5)", "prefix_lm(20)", "document+causal",
    };
    const char *missing = kpt_test_uncovered_builtin(pats, (int)(sizeof(pats) / sizeof(pats[0])));
    if (missing)
        fail_msg("test_check_backward does not cover the built-in '%s'", missing);
    for (size_t i = 0; i < sizeof(pats) / sizeof(pats[0]); i++) {
        result *r = run("check", pats[i], "--backward", "--shape", "1,4,2,40,50,32", NULL);
        EXPECT(r, 0, out, "dq: finite differences agree");
        EXPECT(r, 0, out, "dv: finite differences agree");
    }
    /* every example script, aux gradients (t5_buckets', graphormer's tables) included */
    DIR *dir = examples ? opendir(examples) : NULL;
    struct dirent *e;
    int scripts = 0;
    while (dir && (e = readdir(dir))) {
        size_t n = strlen(e->d_name);
        if (n < 5 || strcmp(e->d_name + n - 4, ".lua"))
            continue;
        char path[1024];
        snprintf(path, sizeof(path), "%s/%s", examples, e->d_name);
        result *r = run("check", path, "--backward", "--shape", "1,4,2,40,50,32", NULL);
        EXPECT(r, 0, out, "dk: finite differences agree");
        scripts++;
    }
    if (dir)
        closedir(dir);
    assert_true(!examples || scripts >= 10);
    /* sinks on the dense shape: their gradient too (rows with no key keep a finite LSE) */
    result *r = run("check", "causal_bottom_right+softcap(20)", "--backward", "--sinks", "--shape",
                    "1,4,2,50,30,32", NULL);
    EXPECT(r, 0, out, "sinks      standard normal, one per query head");
    EXPECT(r, 0, out, "all rows consistent");
    EXPECT(r, 0, out, "dsinks: finite differences agree");
    r = run("emit", "--backward", "--emit", "cuda", "document+causal+softcap(30)", NULL);
    EXPECT(r, 0, out, "kpt_bwd_dkdv");
    EXPECT(r, 0, out, "ds = ");
    r = run("emit", "--backward", "--emit", "hip", "causal", NULL);
    EXPECT(r, 2, err, "no backward kernel for this target");
    r = run("emit", "--backward", "--emit", "cuda", "--head-dim", "256", "causal", NULL);
    EXPECT(r, 0, out, "#define KPT_WARPS 8"); /* two column parts (plan_tiles_cuda.c) */
}

static void test_reference_f32(void **state)
{
    (void)state;
    char path[] = "/tmp/kpt_test_t5XXXXXX.lua";
    write_script(path, "return kpt.pattern{ name = 't5_bucket',\n"
                       "  score = function(s, b, h, q, k)\n"
                       "    local n = kpt.max(q - k, 8)\n"
                       "    return s + kpt.floor(kpt.log(n / 8) / math.log(16) * 8)\n"
                       "  end }\n");
    result *r = run("check", path, "--backend", "vulkan", "--dtype", "f32", "--shape",
                    "1,1,1,64,64,32", NULL);
    if (r->status == 1) /* a missing driver is not bad input */
        assert_non_null(strstr(r->err, "Vulkan"));
    else
        EXPECT(r, 0, out, "vulkan     spirv on ");
    unlink(path);
}

/* Masks built from bit operations (tests/bit_masks.lua, beside examples/: one per `which`), run
 * on lavapipe against the reference: an unsound interval or known-bits rule for bit operations
 * drops kept pairs and the check fails. */
static void test_bit_masks(void **state)
{
    (void)state;
    if (!examples)
        return;
    char path[600], which[32];
    snprintf(path, sizeof(path), "%s/../../tests/bit_masks.lua", examples);
    for (int i = 1; i <= 8; i++) {
        snprintf(which, sizeof(which), "which=%d", i);
        result *r = run("check", path, "--param", which, "--backend", "vulkan", "--dtype", "f32",
                        "--shape", "1,2,1,300,333,32", NULL);
        if (r->status == 1 && strstr(r->err, "Vulkan")) /* no Vulkan device here */
            return;
        if (r->status != 0 || !strstr(r->out, "agrees with the brute-force mask"))
            fail_msg("bit_masks.lua %s: status %d\n%s%s", which, r->status, r->out, r->err);
    }
    result *r = run("check", path, "--param", "which=9", NULL); /* the list has 8 */
    EXPECT(r, 2, err, "which must be 1 to 8");
}

/* Lua scripts wherever a pattern goes: emit, check (fills from the script), --param. */
static void test_lua_scripts(void **state)
{
    (void)state;
    char path[] = "/tmp/kpt_test_scriptXXXXXX.lua";
    const char *src =
        "-- a window over document tokens\n"
        "print('tracing')\n"
        "return kpt.pattern{\n"
        "  name = 'doc_window',\n"
        "  params = { W = 16 },\n"
        "  aux = { doc = { dtype = 'int32', shape = {'b', 'sq'},\n"
        "    fill = function(shape) local t = {} for i = 1, shape[1] * shape[2] do\n"
        "      t[i] = (i - 1) % shape[2] // 8 end return t end } },\n"
        "  mask = function(b, h, q, k, p)\n"
        "    return (q - k):lt(p.W) & q:ge(k) & p.doc[b][q]:eq(p.doc[b][k])\n"
        "  end,\n"
        "}\n";
    write_script(path, src);
    result *r = run("emit", path, NULL);
    EXPECT(r, 0, out, "pattern \"doc_window\"");
    EXPECT(r, 0, out, "i32 const 16");
    EXPECT(r, 0, err, "tracing"); /* print() goes to stderr */
    r = run("emit", path, "--param", "W=5", NULL);
    EXPECT(r, 0, out, "i32 const 5");
    r = run("emit", path, "--param", "V=5", NULL);
    EXPECT(r, 2, err, "no param 'V' (its params: W)");
    r = run("emit", path, "--param", "W=2.5", NULL);
    EXPECT(r, 2, err, "param 'W' is an integer");
    r = run("emit", "causal", "--param", "W=5", NULL);
    EXPECT(r, 2, err, "--param goes with Lua scripts");
    r = run("emit", "--emit", "cuda", path, NULL);
    EXPECT(r, 0, out, "kpt_attention");
    /* 8-token documents, window 4: queries keep 1, 2, 3, 4, 4, 4, 4, 4 keys: 104 of 1024 */
    r = run("check", path, "--shape", "1,2,1,32,32,8", "--param", "W=4", NULL);
    EXPECT(r, 0, out, "doc i32 [1, 32]: generated by the script's fill");
    EXPECT(r, 0, out, "10.16% of (q, k) pairs kept");
    EXPECT(r, 0, out, "all rows consistent");
    r = run("check", "/nonexistent/x.lua", NULL);
    EXPECT(r, 2, err, "cannot open '/nonexistent/x.lua'");
    /* a FIFO (or a device) as a script is refused, not opened and waited on */
    char fifo[] = "/tmp/kptc-fifo-XXXXXX";
    assert_non_null(mkdtemp(fifo));
    char fpath[64];
    snprintf(fpath, sizeof(fpath), "%s/p.lua", fifo);
    assert_int_equal(mkfifo(fpath, 0600), 0);
    r = run("emit", fpath, NULL);
    EXPECT(r, 2, err, "is not a regular file");
    unlink(fpath);
    rmdir(fifo);
    r = run("check", "document", "--aux", "doc_q=/dev/zero", NULL);
    EXPECT(r, 2, err, "is not a regular file");
    unlink(path);

    /* errors name the script and the line */
    char bad[] = "/tmp/kpt_test_badXXXXXX.lua";
    write_script(bad, "return kpt.pattern{\n  mask = function(b, h, q, k)\n"
                      "    return q:ge(k) + 1\n  end,\n}\n");
    r = run("emit", bad, NULL);
    EXPECT(r, 2, err, ".lua:3: error: cannot add a boolean expression and the number 1");
    EXPECT(r, 2, err, "return q:ge(k) + 1");
    unlink(bad);

    /* an aux tensor of 2^72 elements: refused before any size arithmetic could wrap */
    char huge[] = "/tmp/kpt_test_hugeXXXXXX.lua";
    write_script(huge, "return kpt.pattern{ aux = { t = { dtype = 'float32',\n"
                       "  shape = {16777216, 16777216, 16777216} } },\n"
                       "  score = function(s, b, h, q, k, p) return s + p.t[h][q][k] end }\n");
    r = run("check", huge, "--shape", "1,1,1,4,4,8", NULL);
    EXPECT(r, 2, err, "aux tensor t: more than 2147483648 elements");
    unlink(huge);
}

static void test_check_aux_file(void **state)
{
    (void)state;
    /* doc ids from a .npy file: two documents of 5 and 3 tokens */
    char path[] = "/tmp/kpt_test_docXXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    const char header[] = "{'descr': '<i4', 'fortran_order': False, 'shape': (1, 8), }\n";
    unsigned char buf[256] = "\x93NUMPY\x01\x00";
    size_t hl = strlen(header);
    buf[8] = (unsigned char)hl;
    buf[9] = 0;
    memcpy(buf + 10, header, hl);
    int32_t ids[8] = {0, 0, 0, 0, 0, 1, 1, 1};
    memcpy(buf + 10 + hl, ids, sizeof(ids));
    assert_true(write(fd, buf, 10 + hl + sizeof(ids)) == (ssize_t)(10 + hl + sizeof(ids)));
    close(fd);
    char arg1[128], arg2[128];
    snprintf(arg1, sizeof(arg1), "doc_q=%s", path);
    snprintf(arg2, sizeof(arg2), "doc_kv=%s", path);
    result *r = run("check", "document", "--shape", "1,1,1,8,8,8", "--aux", arg1, "--aux", arg2, NULL);
    /* kept pairs: 5*5 + 3*3 = 34 of 64 */
    EXPECT(r, 0, out, "53.12% of (q, k) pairs kept");
    r = run("check", "document", "--shape", "1,1,1,9,8,8", "--aux", arg1, "--aux", arg2, NULL);
    EXPECT(r, 2, err, "aux tensor 'doc_q': dimension 1 has size 8, expected 9 (sq)");
    unlink(path);
    /* a file of the wrong rank says which rank it has (it said 0) */
    memcpy(path + strlen(path) - 6, "XXXXXX", 6);
    fd = mkstemp(path);
    assert_true(fd >= 0);
    const char header1[] = "{'descr': '<i4', 'fortran_order': False, 'shape': (8,), }\n";
    hl = strlen(header1);
    buf[8] = (unsigned char)hl;
    memcpy(buf + 10, header1, hl);
    memcpy(buf + 10 + hl, ids, sizeof(ids));
    assert_true(write(fd, buf, 10 + hl + sizeof(ids)) == (ssize_t)(10 + hl + sizeof(ids)));
    close(fd);
    snprintf(arg1, sizeof(arg1), "doc_q=%s", path);
    r = run("check", "document", "--shape", "1,1,1,8,8,8", "--aux", arg1, NULL);
    EXPECT(r, 2, err, "has rank 1, the pattern wants 2");
    unlink(path);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: test_kptc PATH-TO-KPTC\n");
        return 1;
    }
    kptc = argv[1];
    examples = argc > 2 ? argv[2] : NULL; /* examples/patterns */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_basics), cmocka_unit_test(test_emit),
        cmocka_unit_test(test_check), cmocka_unit_test(test_check_aux_file),
        cmocka_unit_test(test_lua_scripts), cmocka_unit_test(test_reference_f32),
        cmocka_unit_test(test_check_backward),
        cmocka_unit_test(test_check_paged), cmocka_unit_test(test_bit_masks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
