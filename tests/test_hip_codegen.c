/* HIP code generation, verified by compilation (no AMD GPU is available to run it): deterministic
 * source with no user text and no #include; every built-in pattern and every example script
 * compiled to a gfx90a code object by hipRTC and to a gfx940 one by clang; each ELF read with
 * llvm-readelf and llvm-objdump for the kernel symbols, MFMA instructions, no scratch or spills,
 * and LDS within the 64 KiB of a workgroup; gfx942 refused with a clear error where no local
 * compiler has it. Skips (77) when neither hipRTC nor clang for HIP is installed.
 *
 *   test_hip_codegen EXAMPLES_DIR */
#include <dirent.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <kpt/kpt.h>

#include "codegen/hip_source.h"
#include "compiler/builtins.h"
#include "compiler/plan_tiles.h"
#include "target/target.h"
#include "vendor/rtc_hiprtc.h"
#include "tests/runtool.h"
#include "tests/covers_builtins.h"

static const char *const patterns[] = {
    "full", "causal", "causal_bottom_right", "sliding_window(1024)", "sliding_window($w=256)",
    "local(64,32)", "chunked(128)", "prefix_lm(100)", "document", "alibi", "softcap(30)",
    "alibi+causal", "softcap(50)+causal", "document+causal+softcap(30)",
};
#define NPAT ((int)(sizeof(patterns) / sizeof(patterns[0])))

static char scripts[32][512];
static int nscripts;
static bool have_rtc, have_clang;
static const char *readelf = "/usr/bin/llvm-readelf-15", *objdump = "/usr/bin/llvm-objdump-15";

static kpt_pattern *load(const char *name)
{
    kpt_pattern *p = NULL;
    kpt_diag d = {0};
    size_t n = strlen(name);
    kpt_status st = n > 4 && !strcmp(name + n - 4, ".lua")
                        ? kpt_pattern_from_lua_file(name, NULL, &p, &d)
                        : kpt_pattern_parse(name, &p, &d);
    if (st)
        print_message("%s: %s\n", name, d.message);
    assert_int_equal(st, KPT_OK);
    return p;
}

static char *source(kpt_pattern *p, kpt_dtype dt, int dqk, int dv, int gfx, kpt_kernel_plan *plan)
{
    kpt_diag d = {0};
    kpt_kernel_config cfg = {.dtype = dt, .dqk = dqk, .dv = dv, .gfx = gfx};
    assert_int_equal(kpt_plan_tiles_hip(p, &cfg, 0, plan, &d), KPT_OK);
    char *src = NULL;
    assert_int_equal(kpt_hip_source(p, plan, &kpt_dialect_hip, &src, &d), KPT_OK);
    return src;
}

/* A value from llvm-readelf's note dump of one kernel: the number after "KEY:" in the block that
 * holds ".name: NAME"; -1 when absent. */
static long note_value(const char *notes, const char *kernel, const char *key)
{
    char name[96];
    snprintf(name, sizeof(name), ".name:           %s\n", kernel);
    const char *k = strstr(notes, name);
    if (!k)
        return -1;
    /* a kernel's block runs from its list entry ("\n  - .") to the next one */
    const char *start = notes, *e;
    while ((e = strstr(start + 1, "\n  - .")) && e < k)
        start = e;
    const char *end = strstr(k, "\n  - .");
    char pat[64];
    snprintf(pat, sizeof(pat), "%s:", key);
    const char *v = strstr(start, pat);
    if (!v || (end && v > end))
        return -1;
    return strtol(v + strlen(pat), NULL, 10);
}

/* Writes the code object to a file and checks what its ELF says. */
static void check_elf(const kpt_hip_output *out, const char *arch, bool blockmap, const char *what)
{
    char path[] = "/tmp/kpt_hip_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, out->code, out->size), (ssize_t)out->size);
    close(fd);
    static tool_result r; /* large */
    const char *nargv[] = {readelf, "--notes", path, NULL};
    assert_true(tool_run(&r, nargv));
    assert_int_equal(r.status, 0);
    const char *kernels[] = {"kpt_attention", "kpt_blockmap"};
    for (int i = 0; i < (blockmap ? 2 : 1); i++) {
        long lds = note_value(r.out, kernels[i], ".group_segment_fixed_size");
        long scratch = note_value(r.out, kernels[i], ".private_segment_fixed_size");
        /* SGPR spills go to VGPR lanes, not memory: scratch 0 is what matters, with no VGPR
         * spills */
        long vsp = note_value(r.out, kernels[i], ".vgpr_spill_count");
        long wave = note_value(r.out, kernels[i], ".wavefront_size");
        if (lds < 0 || scratch != 0 || vsp != 0 || lds > 65536 || wave != 64)
            print_message("%s %s %s: lds %ld scratch %ld vgpr spills %ld wave %ld\n", what, arch,
                          kernels[i], lds, scratch, vsp, wave);
        assert_true(lds >= 0 && lds <= 65536);
        assert_int_equal(scratch, 0);
        assert_int_equal(vsp, 0);
        assert_int_equal(wave, 64);
    }
    if (!blockmap)
        assert_int_equal(note_value(r.out, "kpt_blockmap", ".group_segment_fixed_size"), -1);
    /* the kernel symbols, and the MFMA instructions in kpt_attention's code */
    char cmd[512];
    snprintf(cmd, sizeof(cmd),
             "%s --symbols %s | grep -c ' kpt_attention$' && "
             "%s -d --mcpu=%s --disassemble-symbols=kpt_attention %s | grep -c v_mfma_f32_16x16x16",
             readelf, path, objdump, arch, path);
    const char *sargv[] = {"/bin/sh", "-c", cmd, NULL};
    assert_true(tool_run(&r, sargv));
    unlink(path);
    int syms = 0, mfma = 0;
    if (r.status != 0 || sscanf(r.out, "%d %d", &syms, &mfma) != 2 || syms < 1 || mfma < 1)
        print_message("%s %s: symbols/MFMA check failed (status %d): %s%s\n", what, arch,
                      r.status, r.out, r.err);
    assert_int_equal(r.status, 0);
    assert_true(syms >= 1);
    assert_true(mfma >= 1);
}

static void compile_and_check(const char *name, kpt_dtype dt, int dqk, int dv, int gfx)
{
    kpt_pattern *p = load(name);
    kpt_kernel_plan plan;
    char *src = source(p, dt, dqk, dv, gfx, &plan);
    char arch[16];
    snprintf(arch, sizeof(arch), "gfx%x", (unsigned)gfx);
    kpt_hip_output out;
    kpt_diag d = {0};
    kpt_status st = gfx == 0x90a ? kpt_hiprtc_compile(src, arch, &out, &d)
                                 : kpt_hip_clang_compile(src, arch, &out, &d);
    if (st)
        print_message("%s %s %s d%d/%d: %s\n", name, arch, kpt_dtype_name(dt), dqk, dv, d.message);
    assert_int_equal(st, KPT_OK);
    check_elf(&out, arch, plan.has_blockmap, name);
    kpt_hip_output_free(&out);
    free(src);
    kpt_pattern_destroy(&p);
}

static void test_source_is_self_contained(void **state)
{
    (void)state;
    kpt_pattern *p = load("document+causal+softcap(30)");
    kpt_kernel_plan plan;
    char *a = source(p, KPT_DTYPE_BF16, 128, 128, 0x90a, &plan);
    char *b = source(p, KPT_DTYPE_BF16, 128, 128, 0x90a, &plan);
    assert_string_equal(a, b); /* deterministic */
    assert_null(strstr(a, "#include"));
    assert_null(strstr(a, "doc_q")); /* aux names become indices: no user text */
    assert_true(plan.has_blockmap);
    assert_non_null(strstr(a, "kpt_blockmap"));
    assert_non_null(strstr(a, "__builtin_amdgcn_mfma_f32_16x16x16bf16_1k"));
    free(a);
    free(b);
    kpt_pattern_destroy(&p);
}

static void test_plan_refusals(void **state)
{
    (void)state;
    kpt_pattern *p = load("causal");
    kpt_kernel_plan plan;
    kpt_diag d = {0};
    kpt_kernel_config bad_dt = {.dtype = KPT_DTYPE_F32, .dqk = 128, .dv = 128, .gfx = 0x90a};
    assert_int_equal(kpt_plan_tiles_hip(p, &bad_dt, 0, &plan, &d), KPT_ERR_UNSUPPORTED);
    assert_non_null(strstr(d.message, "f16 or bf16"));
    kpt_kernel_config bad_d = {.dtype = KPT_DTYPE_F16, .dqk = 80, .dv = 80, .gfx = 0x90a};
    assert_int_equal(kpt_plan_tiles_hip(p, &bad_d, 0, &plan, &d), KPT_ERR_UNSUPPORTED);
    assert_non_null(strstr(d.message, "head dims"));
    kpt_kernel_config bad_arch = {.dtype = KPT_DTYPE_F16, .dqk = 64, .dv = 64, .gfx = 0x1100};
    assert_int_equal(kpt_plan_tiles_hip(p, &bad_arch, 0, &plan, &d), KPT_ERR_UNSUPPORTED);
    assert_non_null(strstr(d.message, "gfx1100"));
    assert_int_equal(kpt_target_find("hip:gfx942")->base.gfx, 0x942);
    assert_null(kpt_target_find("hip:gfx1100"));
    kpt_pattern_destroy(&p);
}

/* Every built-in with runtime scalars (i32 and f32) through the one generation path for every
 * HIP target of the table: the clang route once failed on f32 scalars (the dialect spelled
 * CUDA's __uint_as_float, which only hipRTC's pre-included headers define). Targets no local
 * compiler has are refused with a clear error. */
static void test_scalars_every_target(void **state)
{
    (void)state;
    for (int t = 0; t < kpt_target_count(); t++) {
        const kpt_target *tg = kpt_target_get(t);
        if (tg->backend != KPT_BACKEND_HIP)
            continue;
        for (int i = 0; i < kpt_num_builtins; i++) {
            const char *ex = kpt_builtins[i].scalar_example;
            if (!ex)
                continue;
            char pat[128];
            snprintf(pat, sizeof(pat), "%s+alibi", ex); /* f32 slope and i32 positions too */
            kpt_pattern *p = load(pat);
            kpt_kernel_request rq = {.dtype = KPT_DTYPE_BF16, .dqk = 64, .dv = 64};
            kpt_kernel_plan plan;
            char *src = NULL;
            kpt_diag d = {0};
            assert_int_equal(kpt_kernel_generate(tg, p, &rq, &plan, &src, &d), KPT_OK);
            kpt_rtc_output out;
            kpt_status st = kpt_kernel_compile(tg, src, &plan, 0, &out, &d);
            if (st && strstr(d.message, "invalid target ID")) { /* clang-15 lacks gfx942 */
                assert_string_equal(tg->name, "hip:gfx942");
            } else {
                if (st)
                    print_message("%s %s: %s\n", tg->name, pat, d.message);
                assert_int_equal(st, KPT_OK);
                assert_true(out.size > 0);
            }
            kpt_rtc_output_free(&out);
            free(src);
            kpt_pattern_destroy(&p);
        }
    }
}

/* hipRTC's comgr in ROCm 5.x aborts the process on archs it does not know: kpt must ask first. */
static void test_unknown_arch_refused(void **state)
{
    (void)state;
    if (!have_rtc)
        skip();
    kpt_diag d = {0};
    assert_true(kpt_hiprtc_has_arch("gfx90a", &d));
    kpt_hip_output out;
    kpt_status st = kpt_hiprtc_compile("extern \"C\" __attribute__((global)) void f() {}",
                                       "gfx9999", &out, &d);
    assert_int_equal(st, KPT_ERR_UNSUPPORTED);
    assert_non_null(strstr(d.message, "gfx9999"));
    kpt_hip_output_free(&out);
}

static void test_compile_error_has_log(void **state)
{
    (void)state;
    if (!have_rtc)
        skip();
    kpt_diag d = {0};
    kpt_hip_output out;
    assert_int_equal(kpt_hiprtc_compile("this is not C++", "gfx90a", &out, &d), KPT_ERR_COMPILE);
    assert_non_null(strstr(d.message, "error"));
    kpt_hip_output_free(&out);
}

static void test_gfx90a_patterns(void **state)
{
    (void)state;
    if (!have_rtc)
        skip();
    for (int i = 0; i < NPAT; i++) {
        compile_and_check(patterns[i], KPT_DTYPE_BF16, 128, 128, 0x90a);
        compile_and_check(patterns[i], KPT_DTYPE_F16, 64, 64, 0x90a);
    }
}

static void test_gfx90a_head_dims(void **state)
{
    (void)state;
    if (!have_rtc)
        skip();
    static const int dims[][2] = {{32, 32}, {96, 96}, {256, 256}, {128, 64}, {64, 128}};
    for (int i = 0; i < 5; i++)
        compile_and_check("softcap(50)+causal", KPT_DTYPE_BF16, dims[i][0], dims[i][1], 0x90a);
}

static void test_gfx90a_scripts(void **state)
{
    (void)state;
    if (!have_rtc || !nscripts)
        skip();
    for (int i = 0; i < nscripts; i++) {
        compile_and_check(scripts[i], KPT_DTYPE_BF16, 128, 128, 0x90a);
        compile_and_check(scripts[i], KPT_DTYPE_F16, 64, 64, 0x90a);
    }
}

static void test_gfx940_clang(void **state)
{
    (void)state;
    if (!have_clang)
        skip();
    for (int i = 0; i < NPAT; i++)
        compile_and_check(patterns[i], KPT_DTYPE_BF16, 128, 128, 0x940);
    for (int i = 0; i < nscripts; i++)
        compile_and_check(scripts[i], KPT_DTYPE_F16, 128, 128, 0x940);
}

static void test_covers_builtins(void **state)
{
    (void)state;
    assert_null(kpt_test_uncovered_builtin(patterns, (int)NPAT));
}

int main(int argc, char **argv)
{
    if (argc > 1) {
        DIR *dir = opendir(argv[1]);
        struct dirent *e;
        while (dir && (e = readdir(dir)) && nscripts < 32) {
            size_t n = strlen(e->d_name);
            if (n > 4 && !strcmp(e->d_name + n - 4, ".lua"))
                snprintf(scripts[nscripts++], sizeof(scripts[0]), "%s/%s", argv[1], e->d_name);
        }
        if (dir)
            closedir(dir);
        /* readdir's order is the file system's: sort, so failures read the same everywhere */
        qsort(scripts, (size_t)nscripts, sizeof(scripts[0]), (int (*)(const void *, const void *))strcmp);
    }
    kpt_diag d = {0};
    have_rtc = kpt_hiprtc_has_arch("gfx90a", &d);
    if (!have_rtc)
        printf("hipRTC for gfx90a not available: %s\n", d.message);
    have_clang = access("/usr/bin/clang++-15", X_OK) == 0 || getenv("KPT_HIP_CLANG");
    if ((have_rtc || have_clang) && (access(readelf, X_OK) || access(objdump, X_OK))) {
        printf("llvm-readelf-15 / llvm-objdump-15 missing (Debian's llvm-15)\n");
        return 77;
    }
    if (!have_rtc && !have_clang) {
        printf("neither hipRTC nor clang++-15: nothing to compile with\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_covers_builtins),
        cmocka_unit_test(test_source_is_self_contained),
        cmocka_unit_test(test_plan_refusals),
        cmocka_unit_test(test_unknown_arch_refused),
        cmocka_unit_test(test_compile_error_has_log),
        cmocka_unit_test(test_gfx90a_patterns),
        cmocka_unit_test(test_gfx90a_head_dims),
        cmocka_unit_test(test_gfx90a_scripts),
        cmocka_unit_test(test_gfx940_clang),
        cmocka_unit_test(test_scalars_every_target),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
