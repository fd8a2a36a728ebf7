/* CUDA code generation: the template filler, deterministic source with no user text in it, and
 * (where NVRTC is installed; skipped otherwise) every built-in pattern x dtype x head dims compiled
 * to PTX and CUBIN for sm_80 and sm_90 — forward, backward and serving kernels — the PTX checked
 * for the tensor-core path and ptxas's spill and shared-memory reports read. */
#include <dirent.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <kpt/kpt.h>

#include "codegen/cuda_source.h"
#include "codegen/template.h"
#include "compiler/plan_tiles.h"
#include "base/diag.h"
#include "runtime/cuda_device.h"
#include "runtime/kernel_args.h"
#include "target/target.h"
#include "tests/covers_builtins.h"
#include "compiler/passes.h"
#include "vendor/rtc_nvrtc.h"

static void test_template_fill(void **state)
{
    (void)state;
    char err[256];
    kpt_strbuf sb = {0};
    const kpt_hole h[] = {{"A", "x"}, {"B_2", "yy"}};
    assert_true(kpt_template_fill(&sb, "1@A@2@B_2@3@A@", h, 2, err, sizeof(err)));
    char *s = kpt_sb_take(&sb);
    assert_string_equal(s, "1x2yy3x");
    free(s);
    assert_false(kpt_template_fill(&sb, "@C@", h, 2, err, sizeof(err)));
    assert_non_null(strstr(err, "@C@ is not filled"));
    kpt_sb_free(&sb);
    assert_false(kpt_template_fill(&sb, "@A@", h, 2, err, sizeof(err)));
    assert_non_null(strstr(err, "no hole @B_2@"));
    kpt_sb_free(&sb);
    assert_false(kpt_template_fill(&sb, "a@b", h, 0, err, sizeof(err)));
    assert_non_null(strstr(err, "stray"));
    kpt_sb_free(&sb);
}

static char *source_of_pattern(kpt_pattern *p, kpt_dtype dt, int dqk, int dv, int sm)
{
    kpt_diag d = {0};
    kpt_kernel_config cfg = {.dtype = dt, .dqk = dqk, .dv = dv, .sm = sm};
    kpt_kernel_plan plan;
    assert_int_equal(kpt_plan_tiles_cuda(p, &cfg, 0, &plan, &d), KPT_OK);
    char *src = NULL;
    assert_int_equal(kpt_cuda_source(p, &plan, &kpt_dialect_cuda, &src, &d), KPT_OK);
    kpt_pattern_destroy(&p);
    return src;
}

static char *source_of(const char *pattern, kpt_dtype dt, int dqk, int dv, int sm)
{
    kpt_pattern *p = NULL;
    kpt_diag d = {0};
    assert_int_equal(kpt_pattern_parse(pattern, &p, &d), KPT_OK);
    return source_of_pattern(p, dt, dqk, dv, sm);
}

static void test_deterministic_no_user_text(void **state)
{
    (void)state;
    const char *pat = "document+sliding_window($zqxsecret=64)+softcap(30)";
    char *a = source_of(pat, KPT_DTYPE_BF16, 128, 128, 80);
    char *b = source_of(pat, KPT_DTYPE_BF16, 128, 128, 80);
    assert_string_equal(a, b);
    assert_null(strstr(a, "zqxsecret"));  /* scalar names become indices */
    assert_null(strstr(a, "doc_q"));      /* aux names too */
    assert_null(strstr(a, "#include"));   /* NVRTC needs no include path */
    assert_non_null(strstr(a, "#define KPT_HAS_BLOCKMAP 1")); /* aux mask: block-map kernel */
    /* a mask that loads is evaluated in a loop, and its tiles are bounded by the loaded ranges */
    assert_non_null(strstr(a, "#define KPT_MASK_UNROLL _Pragma(\"unroll 1\")"));
    assert_non_null(strstr(a, "kpt_iv_load<false>(A.aux[0], 2, "));
    assert_non_null(strstr(a, "#define KPT_MASK_NK 0")); /* a mask that loads does not split */
    free(a);
    free(b);
    char *c = source_of("causal", KPT_DTYPE_F16, 64, 64, 90);
    assert_non_null(strstr(c, "#define KPT_HAS_BLOCKMAP 0"));
    assert_non_null(strstr(c, "#define KPT_MASK_UNROLL _Pragma(\"unroll\")")); /* short: unrolled */
    assert_non_null(strstr(c, "#define KPT_MASK_NK 0")); /* nothing computed from k alone */
    free(c);
    /* a Morton-decoded window splits: each key's x and y once per warp, then the pair tests */
    const char *morton =
        "local function c(v) v = v & 0x55555555; v = (v | (v >> 1)) & 0x33333333\n"
        "  v = (v | (v >> 2)) & 0x0F0F0F0F; return (v | (v >> 4)) & 0x00FF00FF end\n"
        "return kpt.pattern{ mask = function(b, h, q, k)\n"
        "  return kpt.abs(c(q) - c(k)):le(3) & kpt.abs(c(q >> 1) - c(k >> 1)):le(3) end }";
    kpt_pattern *mp = NULL;
    kpt_diag md = {0};
    assert_int_equal(kpt_pattern_from_lua(morton, strlen(morton), NULL, &mp, &md), KPT_OK);
    char *m = source_of_pattern(mp, KPT_DTYPE_BF16, 128, 128, 90);
    assert_non_null(strstr(m, "#define KPT_MASK_NK 2"));
    assert_non_null(strstr(m, "kv[1] = (int)v"));
    free(m);
    /* nor from Lua scripts: names, params, aux tensors and strings stay out */
    const char *script =
        "return kpt.pattern{ name = 'zqxname', params = { zqxparam = kpt.runtime('zqxrt', 3) },\n"
        "  aux = { zqxaux = { dtype = 'float32', shape = {'hq', 'skv'} } },\n"
        "  score = function(s, b, h, q, k, p) return s + p.zqxaux[h][k] * p.zqxparam end,\n"
        "  mask = function(b, h, q, k, p) return kpt.builtin('causal') end }";
    for (int i = 0; i < 2; i++) {
        kpt_pattern *p = NULL;
        kpt_diag d = {0};
        assert_int_equal(kpt_pattern_from_lua(script, strlen(script), NULL, &p, &d), KPT_OK);
        char *src = source_of_pattern(p, KPT_DTYPE_BF16, 128, 128, 80);
        assert_null(strstr(src, "zqx"));
        if (i == 0)
            a = src;
        else
            assert_string_equal(a, src);
        if (i == 1) {
            free(a);
            free(src);
        }
    }
}

static void test_plan_refuses(void **state)
{
    (void)state;
    kpt_pattern *p = NULL;
    kpt_diag d = {0};
    assert_int_equal(kpt_pattern_parse("causal", &p, &d), KPT_OK);
    kpt_kernel_plan plan;
    kpt_kernel_config bad_dim = {.dtype = KPT_DTYPE_BF16, .dqk = 80, .dv = 80, .sm = 80};
    assert_int_equal(kpt_plan_tiles_cuda(p, &bad_dim, 0, &plan, &d), KPT_ERR_UNSUPPORTED);
    assert_non_null(strstr(d.message, "Dqk = 80"));
    kpt_kernel_config bad_dt = {.dtype = KPT_DTYPE_F32, .dqk = 64, .dv = 64, .sm = 80};
    assert_int_equal(kpt_plan_tiles_cuda(p, &bad_dt, 0, &plan, &d), KPT_ERR_UNSUPPORTED);
    /* sm_90a covers head dims 64, 128 and 256; others fall back to the sm_80 kernel */
    kpt_kernel_config a96 = {.dtype = KPT_DTYPE_BF16, .dqk = 96, .dv = 96, .sm = 90, .wgmma = true};
    assert_int_equal(kpt_plan_tiles_cuda(p, &a96, 0, &plan, &d), KPT_OK);
    assert_false(plan.cfg.wgmma);
    assert_int_equal(plan.warps, 4);
    kpt_kernel_config a128 = {.dtype = KPT_DTYPE_F16, .dqk = 128, .dv = 64, .sm = 90, .wgmma = true};
    assert_int_equal(kpt_plan_tiles_cuda(p, &a128, 0, &plan, &d), KPT_OK);
    assert_true(plan.cfg.wgmma);
    assert_int_equal(plan.warps, 12);
    assert_int_equal(plan.bm, 128);
    assert_int_equal(plan.bn, 128);
    /* 256: 64-key tiles, within the H100's 227 KB of shared memory a block */
    kpt_kernel_config a256 = {
        .dtype = KPT_DTYPE_BF16, .dqk = 256, .dv = 256, .sm = 90, .wgmma = true};
    assert_int_equal(kpt_plan_tiles_cuda(p, &a256, 0, &plan, &d), KPT_OK);
    assert_true(plan.cfg.wgmma);
    assert_int_equal(plan.bn, 64);
    assert_true(plan.smem_bytes <= 227 * 1024);
    kpt_kernel_config a80 = {.dtype = KPT_DTYPE_BF16, .dqk = 64, .dv = 64, .sm = 80, .wgmma = true};
    assert_int_equal(kpt_plan_tiles_cuda(p, &a80, 0, &plan, &d), KPT_OK);
    assert_false(plan.cfg.wgmma);
    kpt_kernel_config old = {.dtype = KPT_DTYPE_BF16, .dqk = 64, .dv = 64, .sm = 75};
    assert_int_equal(kpt_plan_tiles_cuda(p, &old, 0, &plan, &d), KPT_ERR_UNSUPPORTED);
    kpt_pattern_destroy(&p);
}

/* The example scripts (examples/patterns, main's argument), sorted: the compile matrix and the
 * backward's plans use them. */
#define MAX_SCRIPTS 32
static char scripts[MAX_SCRIPTS][512];
static int nscripts;

/* The backward's plans: the sm_90a kernels at head dims 64 and 128 (two warpgroups, 128 x 128
 * tiles, within 227 KB) and past 128 (64 x 64 tiles, split columns), the sm_80 ones elsewhere; dq's atomic sums in the workspace only for
 * the former and only when determinism is not asked for. */
static void test_plan_backward(void **state)
{
    (void)state;
    kpt_pattern *p = NULL;
    kpt_diag d = {0};
    assert_int_equal(kpt_pattern_parse("causal", &p, &d), KPT_OK);
    kpt_kernel_plan plan;
    const int dims_ok[][2] = {{64, 64}, {128, 128}, {128, 64}, {64, 128}};
    for (int i = 0; i < 4; i++) {
        kpt_kernel_config c = {.kind = KPT_KERNEL_BACKWARD, .dtype = KPT_DTYPE_BF16,
                               .dqk = dims_ok[i][0], .dv = dims_ok[i][1], .sm = 90,
                               .wgmma = true};
        assert_int_equal(kpt_plan_tiles_cuda(p, &c, 0, &plan, &d), KPT_OK);
        assert_true(plan.cfg.wgmma);
        assert_int_equal(plan.warps, 8);
        assert_int_equal(plan.bm, 128);
        assert_int_equal(plan.bn, 128);
        assert_int_equal(plan.dq_rows, 128); /* a q tile a kpt_bwd_dq CTA */
        assert_true(plan.smem_bytes <= 227 * 1024);
        /* kpt_bwd_dq's own, with its static tile classes beside it */
        assert_true(plan.dq_smem_bytes <= plan.smem_bytes);
        assert_true(plan.dq_smem_bytes + 2048 + 64 <= 227 * 1024); /* s_cls, s_lo, ... */
        assert_int_equal(plan.dq_tiles, 2); /* nothing the kernel reads through L1 */
        assert_false(plan.aux_grads);
    }
    /* one dQ tile where the pattern reads aux data (L1 keeps its 60 KB) */
    kpt_pattern *doc = NULL;
    assert_int_equal(kpt_pattern_parse("document+causal", &doc, &d), KPT_OK);
    kpt_kernel_config cdoc = {.kind = KPT_KERNEL_BACKWARD, .dtype = KPT_DTYPE_BF16, .dqk = 128,
                              .dv = 128, .sm = 90, .wgmma = true};
    assert_int_equal(kpt_plan_tiles_cuda(doc, &cdoc, 0, &plan, &d), KPT_OK);
    assert_int_equal(plan.dq_tiles, 1);
    kpt_pattern_destroy(&doc);
    /* the largest sm_90a kpt_bwd_dkdv: D = 128 with aux gradients' staging (scripts whose score
     * reads float aux data), with its mbarriers and step records beside it */
    int with_aux = 0;
    for (int i = 0; i < nscripts; i++) {
        kpt_pattern *sp = NULL;
        assert_int_equal(kpt_pattern_from_lua_file(scripts[i], NULL, &sp, &d), KPT_OK);
        assert_int_equal(kpt_diff_score(sp, &d), KPT_OK); /* the backward's derived pattern */
        if (sp->num_dloads) {
            kpt_kernel_config c = {.kind = KPT_KERNEL_BACKWARD, .dtype = KPT_DTYPE_BF16,
                                   .dqk = 128, .dv = 128, .sm = 90, .wgmma = true};
            assert_int_equal(kpt_plan_tiles_cuda(sp, &c, 0, &plan, &d), KPT_OK);
            assert_true(plan.cfg.wgmma);
            assert_true(plan.smem_bytes + 256 <= 227 * 1024);
            assert_true(plan.dq_smem_bytes + 2048 + 64 <= 227 * 1024);
            assert_int_equal(plan.dq_tiles, 1);
            assert_true(plan.aux_grads);
            with_aux++;
            c.dqk = c.dv = 256; /* split columns: one stage beside the aux staging */
            assert_int_equal(kpt_plan_tiles_cuda(sp, &c, 0, &plan, &d), KPT_OK);
            assert_true(plan.cfg.wgmma);
            assert_int_equal(plan.stages, 1);
            assert_true(plan.smem_bytes + 256 <= 227 * 1024);
        }
        kpt_pattern_destroy(&sp);
    }
    assert_true(nscripts == 0 || with_aux > 0);
    kpt_kernel_config c96 = {.kind = KPT_KERNEL_BACKWARD, .dtype = KPT_DTYPE_BF16, .dqk = 96,
                             .dv = 96, .sm = 90, .wgmma = true};
    assert_int_equal(kpt_plan_tiles_cuda(p, &c96, 0, &plan, &d), KPT_OK);
    assert_false(plan.cfg.wgmma);
    assert_int_equal(plan.bm, 64);
    /* past head dim 128: the sm_80 kernels with eight warps in two column parts, 152 KB of
     * shared memory (tiles, row vectors, the parts' 16 KB exchange) with one stage of Q and dO,
     * 215 KB with two where they fit, refused with the numbers where a device has less
     * (sm_86/89: 99 KB) */
    kpt_kernel_config c256 = c96;
    c256.dqk = c256.dv = 256;
    c256.wgmma = false; /* (sm_90a's own below) */
    const int pair = 2 * 64 * 264 * 2, xchg = 8 * 32 * 16 * 4, rows = 2 * 64 * 4;
    assert_int_equal(kpt_plan_tiles_cuda(p, &c256, 0, &plan, &d), KPT_OK); /* sm_90: 227 KB */
    assert_false(plan.cfg.wgmma);
    assert_int_equal(plan.warps, 8);
    assert_int_equal(plan.bm, 64);
    assert_int_equal(plan.bn, 64);
    assert_int_equal(plan.stages, 2);
    assert_int_equal(plan.smem_bytes, pair + xchg + 2 * (pair + rows));
    assert_int_equal(plan.dq_smem_bytes, plan.smem_bytes);
    assert_int_equal(kpt_plan_tiles_cuda(p, &c256, 163 * 1024, &plan, &d), KPT_OK); /* sm_80 */
    assert_int_equal(plan.stages, 1);
    assert_int_equal(plan.smem_bytes, pair + xchg + pair + rows);
    assert_int_equal(kpt_plan_tiles_cuda(p, &c256, 99 * 1024, &plan, &d), KPT_ERR_UNSUPPORTED);
    assert_non_null(strstr(d.message, "156160 bytes of shared memory")); /* + 4 KB static */
    kpt_kernel_config c256_64 = c256;
    c256_64.dv = 64;
    assert_int_equal(kpt_plan_tiles_cuda(p, &c256_64, 0, &plan, &d), KPT_OK);
    assert_int_equal(plan.warps, 8);
    /* sm_90a past head dim 128: 64 x 64 tiles, the consumers split the gradients' columns
     * (halves of 64 or 128), two stages, no keep bits, no dQ sums (both modes run kpt_bwd_dq,
     * the workspace is delta's); Dv = 64 has halves of 32 and keeps the sm_80 kernels */
    kpt_pattern *bits = NULL; /* keep bits at head dim 128 (it reads aux data) */
    assert_int_equal(kpt_pattern_parse("document+causal", &bits, &d), KPT_OK);
    const int split[][2] = {{256, 256}, {256, 128}, {128, 256}};
    for (int i = 0; i < 3; i++) {
        kpt_kernel_config c = c96;
        c.dqk = split[i][0], c.dv = split[i][1];
        assert_int_equal(kpt_plan_tiles_cuda(bits, &c, 0, &plan, &d), KPT_OK);
        assert_true(plan.cfg.wgmma);
        assert_int_equal(plan.warps, 8);
        assert_int_equal(plan.bm, 64);
        assert_int_equal(plan.bn, 64);
        assert_int_equal(plan.stages, 2);
        assert_int_equal(plan.dq_tiles, 0);
        assert_false(plan.mask_bits);
        assert_true(plan.smem_bytes + 256 <= 227 * 1024); /* kpt_bwd_dkdv's mbarriers, ... */
        assert_true(plan.dq_smem_bytes + 2048 + 64 <= 227 * 1024); /* s_cls, s_lo, ... */
        /* kpt_bwd_dq with a block map: a q tile a CTA, Q and dO, two stages of K and V and
         * two dS tiles; without: two q tiles a CTA, their Q and dO and one tile of K and V */
        const size_t row = 2 * (size_t)(c.dqk + c.dv);
        assert_true(plan.has_blockmap);
        assert_int_equal(plan.dq_rows, 64);
        assert_int_equal(plan.dq_smem_bytes, 1024 + 3 * 64 * row + 2 * 64 * 64 * 2);
        kpt_kernel_plan plain;
        assert_int_equal(kpt_plan_tiles_cuda(p, &c, 0, &plain, &d), KPT_OK);
        assert_false(plain.has_blockmap);
        assert_int_equal(plain.dq_rows, 128);
        assert_int_equal(plain.dq_smem_bytes, 1024 + 192 * row);
        assert_false(kpt_kernel_bwd_atomic_dq(&plan, false));
        kpt_kernel_args wa = {.B = 2, .Hq = 3, .Hkv = 3, .Sq = 100};
        assert_int_equal(kpt_kernel_args_bwd_workspace(&plan, &wa, false), 2560); /* delta's */
    }
    kpt_pattern_destroy(&bits);
    c256_64.wgmma = true;
    assert_int_equal(kpt_plan_tiles_cuda(p, &c256_64, 0, &plan, &d), KPT_OK);
    assert_false(plan.cfg.wgmma);

    /* workspace: delta (4 bytes a row), then dq's sums (4 bytes an element) and counts (4 bytes
     * a kv head) where atomic */
    kpt_kernel_config c128 = {.kind = KPT_KERNEL_BACKWARD, .dtype = KPT_DTYPE_BF16, .dqk = 128,
                              .dv = 128, .sm = 90, .wgmma = true};
    assert_int_equal(kpt_plan_tiles_cuda(p, &c128, 0, &plan, &d), KPT_OK);
    kpt_kernel_args a = {.B = 2, .Hq = 3, .Hkv = 3, .Sq = 100};
    assert_true(kpt_kernel_bwd_atomic_dq(&plan, false));
    assert_false(kpt_kernel_bwd_atomic_dq(&plan, true));
    assert_int_equal(kpt_kernel_args_bwd_workspace(&plan, &a, true), 2560);
    assert_int_equal(kpt_kernel_args_bwd_workspace(&plan, &a, false), 2560 + 307200 + 256);
    /* a packed call's layout: dq's sums right after delta, then their counts, which kpt_bwd_prep
     * zeroes (runtime/cuda_device.c memsets only what follows); none in the deterministic mode */
    const int64_t rows4[] = {2, 3, 100, 128}, rows3[] = {2, 3, 100};
    kpt_attention_args args = {0};
    kpt_attention_grads grads = {0};
    kpt_tensor *bf[] = {&args.q, &args.k, &args.v, &args.o, &grads.dout, &grads.dq, &grads.dk,
                        &grads.dv};
    for (int i = 0; i < 8; i++) /* never read: the pack checks shapes, strides and alignment */
        *bf[i] = kpt_tensor_contiguous((void *)(uintptr_t)(0x100000 * (i + 1)), KPT_DTYPE_BF16, 4,
                                       rows4);
    args.lse = kpt_tensor_contiguous((void *)(uintptr_t)0x900000, KPT_DTYPE_F32, 3, rows3);
    for (int det = 0; det < 2; det++) {
        grads.deterministic = det;
        kpt_kernel_args pa;
        kpt_kernel_gargs ga;
        kpt_bwd_workspace ws;
        assert_int_equal(kpt_kernel_bwd_pack(p, &plan, "CUDA", &args, &grads, &pa, &ga, &ws, &d),
                         KPT_OK);
        assert_int_equal(ws.dqacc, det ? 0 : 2560);
        assert_int_equal(ws.dqdone, det ? 0 : 2560 + 307200);
        assert_int_equal(ws.bytes, det ? 2560 : 2560 + 307200 + 256);
        assert_int_equal(ws.zero_from, ws.bytes); /* no aux gradients: nothing for a memset */
    }
    kpt_kernel_config c80 = c128;
    c80.sm = 80, c80.wgmma = false;
    assert_int_equal(kpt_plan_tiles_cuda(p, &c80, 0, &plan, &d), KPT_OK);
    assert_false(kpt_kernel_bwd_atomic_dq(&plan, false));
    assert_int_equal(kpt_kernel_args_bwd_workspace(&plan, &a, false), 2560);
    kpt_pattern_destroy(&p);
}

/* Whether the sm_90a backward plan of the derived pattern has kpt_bwd_dkdv's consumers take
 * turns (plan.dkdv_turns), at head dims dim. */
static bool dkdv_turns(const char *source, int dim)
{
    kpt_pattern *p = NULL;
    kpt_diag d = {0};
    assert_int_equal(kpt_pattern_parse(source, &p, &d), KPT_OK);
    assert_int_equal(kpt_diff_score(p, &d), KPT_OK);
    kpt_kernel_config c = {.kind = KPT_KERNEL_BACKWARD, .dtype = KPT_DTYPE_BF16, .dqk = dim,
                           .dv = dim, .sm = 90, .wgmma = true};
    kpt_kernel_plan plan;
    assert_int_equal(kpt_plan_tiles_cuda(p, &c, 0, &plan, &d), KPT_OK);
    kpt_pattern_destroy(&p);
    return plan.dkdv_turns;
}

/* Turns at head dims 128 where the score mod evaluates a transcendental a score (softcap's
 * tanh), not for cheaper ones (ALiBi's bias: its slope is per head), nor without a score mod,
 * nor at head dim 64 or with split columns (past 128). */
static void test_plan_backward_turns(void **state)
{
    (void)state;
    assert_true(dkdv_turns("softcap(30)+causal", 128));
    assert_true(dkdv_turns("softcap(30)", 128));
    assert_false(dkdv_turns("softcap(30)+causal", 64));
    assert_true(dkdv_turns("softcap($cap=30)+causal", 128));
    assert_false(dkdv_turns("softcap(30)+causal", 256));
    assert_false(dkdv_turns("alibi+causal", 128));
    assert_false(dkdv_turns("causal", 128));
    assert_false(dkdv_turns("full", 64));
}

/* The serving kernels' plans: two stages of 64-key tiles up to head dim 128 (every sm_80+
 * device holds them), of 32-key tiles past it (two CTAs an SM on the H100), a refusal with the
 * numbers on sm_86/89 (99 KB); the warps' merge scratch always fits after Q (Dv far above
 * Dqk). */
static void test_plan_paged(void **state)
{
    (void)state;
    kpt_pattern *p = NULL;
    kpt_diag d = {0};
    assert_int_equal(kpt_pattern_parse("causal", &p, &d), KPT_OK);
    kpt_kernel_plan plan;
    kpt_kernel_config c = {.kind = KPT_KERNEL_PAGED, .dtype = KPT_DTYPE_BF16, .dqk = 128,
                           .dv = 128, .sm = 86};
    assert_int_equal(kpt_plan_tiles_cuda(p, &c, 101376, &plan, &d), KPT_OK);
    assert_int_equal(plan.stages, 2);
    assert_int_equal(plan.bn, 64);
    c.dqk = c.dv = 256, c.sm = 90;
    assert_int_equal(kpt_plan_tiles_cuda(p, &c, 232448, &plan, &d), KPT_OK);
    assert_int_equal(plan.stages, 2);
    assert_int_equal(plan.bn, 32);
    /* two CTAs an SM, the static part and the 1 KB the driver keeps a CTA included */
    assert_true(2 * (plan.smem_bytes + KPT_PAGED_STATIC_SMEM + KPT_KERNEL_ARGS_BYTES + 1024) <=
                233472);
    c.sm = 80;
    assert_int_equal(kpt_plan_tiles_cuda(p, &c, 166912, &plan, &d), KPT_OK);
    assert_int_equal(plan.stages, 2);
    c.sm = 86;
    assert_int_equal(kpt_plan_tiles_cuda(p, &c, 101376, &plan, &d), KPT_ERR_UNSUPPORTED);
    assert_non_null(strstr(d.message, "bytes of shared memory a CTA; this device allows 101376"));
    c.dqk = 64; /* two stages of 64 + 256 columns are less than the merge scratch */
    assert_int_equal(kpt_plan_tiles_cuda(p, &c, 101376, &plan, &d), KPT_OK);
    assert_int_equal(plan.stages, 2);
    assert_true(plan.smem_bytes >= 2 * 64 * (64 + 8) + 4 * (16 * 256 + 32) * 4);
    /* sm_90a at head dims 64 and 128: swizzled tiles without padding, 1024-byte aligned (Q,
     * two stages of K and V, the alignment's slack); other head dims keep mma.sync's */
    c = (kpt_kernel_config){.kind = KPT_KERNEL_PAGED, .dtype = KPT_DTYPE_BF16, .dqk = 128,
                            .dv = 128, .sm = 90, .wgmma = true};
    assert_int_equal(kpt_plan_tiles_cuda(p, &c, 232448, &plan, &d), KPT_OK);
    assert_true(plan.cfg.wgmma);
    assert_int_equal(plan.stages, 2);
    assert_int_equal(plan.smem_bytes, 1024 + 2 * 64 * 128 + 2 * 2 * 64 * 256);
    /* and the ring of three stages paged runs split to one CTA an SM take, within 227 KB */
    assert_int_equal(plan.stages_deep, 3);
    assert_int_equal(plan.deep_smem_bytes, 1024 + 2 * 64 * 128 + 3 * 2 * 64 * 256);
    assert_true(plan.deep_smem_bytes + KPT_PAGED_STATIC_SMEM + KPT_KERNEL_ARGS_BYTES + 1024 <=
                232448);
    assert_int_equal(kpt_plan_tiles_cuda(p, &c, 120000, &plan, &d), KPT_OK); /* no room */
    assert_int_equal(plan.stages_deep, 0);
    c.dqk = c.dv = 256;
    assert_int_equal(kpt_plan_tiles_cuda(p, &c, 232448, &plan, &d), KPT_OK);
    assert_false(plan.cfg.wgmma);
    assert_int_equal(plan.stages_deep, 0);
    c.dqk = 128, c.dv = 64;
    assert_int_equal(kpt_plan_tiles_cuda(p, &c, 232448, &plan, &d), KPT_OK);
    assert_false(plan.cfg.wgmma);
    assert_int_equal(plan.bn, 64);
    /* head dim 64 (and 32): 128-key tiles, whose two stages still leave room for two CTAs an
     * SM on sm_90a, and fit sm_86's 99 KB */
    c.dqk = c.dv = 64;
    assert_int_equal(kpt_plan_tiles_cuda(p, &c, 232448, &plan, &d), KPT_OK);
    assert_true(plan.cfg.wgmma);
    assert_int_equal(plan.bn, 128);
    assert_int_equal(plan.smem_bytes, 1024 + 2 * 64 * 64 + 2 * 2 * 128 * 128);
    assert_true(2 * (plan.smem_bytes + KPT_PAGED_STATIC_SMEM + KPT_KERNEL_ARGS_BYTES + 1024) <=
                233472);
    c.dqk = c.dv = 32, c.sm = 86, c.wgmma = false;
    assert_int_equal(kpt_plan_tiles_cuda(p, &c, 101376, &plan, &d), KPT_OK);
    assert_int_equal(plan.bn, 128);
    assert_int_equal(plan.stages, 2);
    kpt_pattern_destroy(&p);
}

/* The sm_90a forward plans: O's staging tiles (plan.o_tma, Dv up to 128) beside Q and two
 * stages of K and V within the 227 KB a CTA may have, the static shared memory (barriers, tile
 * classes: at most 4.5 KB) included. */
static void test_plan_sm90_forward(void **state)
{
    (void)state;
    static const char *const patterns[] = {"causal", "full"};
    static const int dims[][2] = {{64, 64}, {128, 128}, {256, 128}, {128, 256}, {256, 256}};
    for (int k = 0; k < 2; k++) {
        kpt_pattern *p = NULL;
        kpt_diag d = {0};
        assert_int_equal(kpt_pattern_parse(patterns[k], &p, &d), KPT_OK);
        for (int i = 0; i < 5; i++) {
            kpt_kernel_config c = {.kind = KPT_KERNEL_FORWARD, .dtype = KPT_DTYPE_BF16,
                                   .dqk = dims[i][0], .dv = dims[i][1], .sm = 90, .wgmma = true};
            kpt_kernel_plan plan;
            assert_int_equal(kpt_plan_tiles_cuda(p, &c, 232448, &plan, &d), KPT_OK);
            assert_true(plan.cfg.wgmma);
            assert_int_equal(plan.o_tma, dims[i][1] <= 128);
            const size_t ring = 2 * (size_t)plan.bn * (size_t)(dims[i][0] + dims[i][1]) * 2;
            /* three consumer warpgroups (192 rows, 16 warps) for unmasked patterns at head
             * dims up to 64 */
            const bool three = !plan.has_mask && dims[i][0] <= 64 && dims[i][1] <= 64;
            assert_int_equal(plan.has_mask, k == 0);
            assert_int_equal(plan.bm, three ? 192 : 128);
            assert_int_equal(plan.warps, three ? 16 : 12);
            const size_t staging = plan.o_tma ? plan.bm * (size_t)dims[i][1] * 2 : 0;
            assert_int_equal(plan.smem_bytes,
                             1024 + plan.bm * (size_t)dims[i][0] * 2 + ring + staging);
            assert_true(plan.smem_bytes + 4608 <= 232448);
        }
        kpt_pattern_destroy(&p);
    }
}

/* The sm_90a plans: which store partial tiles' keep bits (plan.mask_bits: masks of 8 nodes or
 * more, or that read aux data; forward and backward alike), and the block map's bytes then:
 * classes, the order table, each line's first slot (a line is a q tile in the forward, a kv
 * tile in the backward), and min(pairs, KPT_MASK_BITS_TILES) slots of 2048 bytes shared out
 * evenly between the map rows, with a byte each of live halves (kpt_bits_geom in
 * templates/cuda/common.cu). */
static void test_plan_sm90_mask_bits(void **state)
{
    (void)state;
    static const struct {
        const char *pattern;
        int d;
        bool bits;
    } cases[] = {
        {"causal", 128, false},          {"sliding_window(100)", 128, false},
        {"document", 128, true},         {"document+causal", 64, true},
        {"document", 256, true}, /* 64-key tiles: half of each word */
    };
    kpt_diag d = {0};
    kpt_kernel_plan plan;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        kpt_pattern *p = NULL;
        assert_int_equal(kpt_pattern_parse(cases[i].pattern, &p, &d), KPT_OK);
        kpt_kernel_config c = {.kind = KPT_KERNEL_FORWARD, .dtype = KPT_DTYPE_BF16,
                               .dqk = cases[i].d, .dv = cases[i].d, .sm = 90, .wgmma = true};
        assert_int_equal(kpt_plan_tiles_cuda(p, &c, 0, &plan, &d), KPT_OK);
        if (plan.mask_bits != cases[i].bits)
            fail_msg("%s, D = %d: mask_bits %d", cases[i].pattern, cases[i].d, plan.mask_bits);
        assert_true(!plan.mask_bits || plan.has_blockmap);
        c.wgmma = false; /* the mma.sync kernel evaluates its masks */
        assert_int_equal(kpt_plan_tiles_cuda(p, &c, 0, &plan, &d), KPT_OK);
        assert_false(plan.mask_bits);
        c.kind = KPT_KERNEL_BACKWARD, c.wgmma = true, c.dqk = c.dv = 128;
        assert_int_equal(kpt_plan_tiles_cuda(p, &c, 0, &plan, &d), KPT_OK);
        assert_int_equal(plan.mask_bits, cases[i].bits);
        assert_true(!plan.mask_bits || plan.has_blockmap);
        c.wgmma = false; /* the sm_80 backward evaluates its masks */
        assert_int_equal(kpt_plan_tiles_cuda(p, &c, 0, &plan, &d), KPT_OK);
        assert_false(plan.mask_bits);
        kpt_pattern_destroy(&p);
    }
    /* a long mask that reads no aux data: bits, and a block map for them alone */
    for (int i = 0; i < nscripts; i++) {
        if (!strstr(scripts[i], "natten_morton"))
            continue;
        kpt_pattern *p = NULL;
        assert_int_equal(kpt_pattern_from_lua_file(scripts[i], NULL, &p, &d), KPT_OK);
        kpt_kernel_config c = {.kind = KPT_KERNEL_FORWARD, .dtype = KPT_DTYPE_BF16, .dqk = 128,
                               .dv = 128, .sm = 90, .wgmma = true};
        assert_int_equal(kpt_plan_tiles_cuda(p, &c, 0, &plan, &d), KPT_OK);
        assert_true(plan.mask_bits && plan.has_blockmap && !plan.bm_per_h && !plan.bm_per_b);
        c.kind = KPT_KERNEL_BACKWARD;
        assert_int_equal(kpt_plan_tiles_cuda(p, &c, 0, &plan, &d), KPT_OK);
        assert_true(plan.mask_bits && plan.has_blockmap);
        kpt_pattern_destroy(&p);
    }
    /* document: one map row per batch row */
    kpt_pattern *p = NULL;
    assert_int_equal(kpt_pattern_parse("document", &p, &d), KPT_OK);
    kpt_kernel_config c = {.kind = KPT_KERNEL_FORWARD, .dtype = KPT_DTYPE_BF16, .dqk = 128,
                           .dv = 128, .sm = 90, .wgmma = true};
    assert_int_equal(kpt_plan_tiles_cuda(p, &c, 0, &plan, &d), KPT_OK);
    assert_true(plan.bm_per_b && !plan.bm_per_h);
    kpt_kernel_args a = {.B = 3, .Hq = 4, .n_qt = 5, .n_kt = 7};
    /* 105 class bytes -> 112, order 60 -> 172 -> 176, bases 60 -> 236 -> 256, 105 slots */
    assert_int_equal(kpt_kernel_args_map_bytes(&plan, &a), 256 + 105 * 2049);
    assert_int_equal(kpt_kernel_bits_ctas(&plan, &a), 5); /* a q tile's 7 kv tiles: one group */
    a.B = 7, a.n_qt = a.n_kt = 40; /* 11200 pairs: 8192 slots, 1170 a row */
    const size_t head = ((((size_t)11200 + 15) & ~(size_t)15) + 4 * 280 + 15) & ~(size_t)15;
    assert_int_equal(kpt_kernel_args_map_bytes(&plan, &a),
                     ((head + 4 * 280 + 255) & ~(size_t)255) + (size_t)1170 * 7 * 2049);
    /* the backward's two layouts, 5 x 7 tiles, 3 rows: by kv tile (bases 84 -> 176 + 84 -> 512,
     * then the slots and their halves: 512 + 105 * 2049 = 215657 -> 215664), then by q tile
     * (bases 60 -> 215724 -> 215808, then the slots and halves: 430953 -> 430960), then the kv
     * tiles' order (84); the bits kernel's CTAs: 7 lines of one group, then 5 */
    c.kind = KPT_KERNEL_BACKWARD;
    assert_int_equal(kpt_plan_tiles_cuda(p, &c, 0, &plan, &d), KPT_OK);
    a.B = 3, a.n_qt = 5, a.n_kt = 7;
    assert_int_equal(kpt_kernel_bits_ctas(&plan, &a), 12);
    assert_int_equal(kpt_kernel_args_map_bytes(&plan, &a), 430960 + 84);
    /* 40 x 40 tiles, 7 rows: the forward's head, the layout by kv tile, the one by q tile, then
     * the kv tiles' order (4 * 280 bytes) */
    a.B = 7, a.n_qt = a.n_kt = 40;
    const size_t kr = (((head + 4 * 280 + 255) & ~(size_t)255) + (size_t)1170 * 7 * 2049 + 15) &
                      ~(size_t)15;
    const size_t qr = ((kr + 4 * 280 + 255) & ~(size_t)255) + (size_t)1170 * 7 * 2049;
    assert_int_equal(kpt_kernel_args_map_bytes(&plan, &a), ((qr + 15) & ~(size_t)15) + 4 * 280);
    kpt_pattern_destroy(&p);
}

/* NVRTC's flags follow the plan: sm_90a for the Hopper kernel, and modules with block-map kernels
 * (a mask that reads aux data) compiled kernel by kernel in parallel; one-kernel modules not. */
static void test_nvrtc_flags(void **state)
{
    (void)state;
    static const struct {
        const char *pattern;
        int sm;
        bool wgmma;
        unsigned want;
    } cases[] = {
        {"causal", 80, false, KPT_NVRTC_CUBIN},
        {"causal", 90, true, KPT_NVRTC_CUBIN | KPT_NVRTC_ARCH_SPECIFIC},
        {"document", 80, false, KPT_NVRTC_CUBIN | KPT_NVRTC_PARALLEL},
        {"document", 90, true, KPT_NVRTC_CUBIN | KPT_NVRTC_ARCH_SPECIFIC | KPT_NVRTC_PARALLEL},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        kpt_pattern *p = NULL;
        kpt_diag d = {0};
        assert_int_equal(kpt_pattern_parse(cases[i].pattern, &p, &d), KPT_OK);
        kpt_kernel_config cfg = {.dtype = KPT_DTYPE_BF16, .dqk = 128, .dv = 128, .sm = cases[i].sm,
                                 .wgmma = cases[i].wgmma};
        kpt_kernel_plan plan;
        assert_int_equal(kpt_plan_tiles_cuda(p, &cfg, 0, &plan, &d), KPT_OK);
        assert_int_equal(kpt_nvrtc_flags(&plan, 0), cases[i].want);
        kpt_pattern_destroy(&p);
    }
}

/* ---- NVRTC over the whole matrix ------------------------------------------------------------- */

static const char *const patterns[] = {
    "full", "causal", "causal_bottom_right", "sliding_window(1024)", "sliding_window($w=256)",
    "local(64,32)", "chunked(128)", "prefix_lm($p=100)", "document", "alibi", "softcap(30)",
    "alibi+causal", "softcap($c=50)+causal", "document+causal+softcap(30)",
};
#define NPAT (sizeof(patterns) / sizeof(patterns[0]))
static const int dims[][2] = {{32, 32}, {64, 64}, {96, 96}, {128, 128}, {256, 256}, {128, 64},
                              {64, 128}};
#define NDIM (sizeof(dims) / sizeof(dims[0]))
/* sm_90a (the wgmma kernel) covers head dims 64, 128 and 256: these entries of dims[] */
static const int wgmma_dims[] = {1, 3, 4, 5, 6};
#define NWGMMA_DIMS (sizeof(wgmma_dims) / sizeof(wgmma_dims[0]))

static bool is_wgmma_dim(int dim)
{
    for (size_t i = 0; i < NWGMMA_DIMS; i++)
        if (wgmma_dims[i] == dim)
            return true;
    return false;
}
#define F16_DIM 3 /* the entry of dims[] compiled in f16 too: {128, 128} */

/* Whether the forward matrix compiles pattern p in dtype dt (0 bf16, 1 f16) at dims[dim] on
 * sm_90a (wgmma) or else sm_80: see test_nvrtc_matrix. */
static bool crossed(size_t p, int dt, size_t dim, bool wgmma)
{
    bool rich = p <= 1 || p == NPAT - 1; /* full, causal, document+causal+softcap(30) */
    if (dt)
        return dim == F16_DIM && (rich || p == 12);
    return rich || dim == (wgmma ? 3u : 1u);
}
#define NJOBS (NPAT * 2 * NDIM * 2 + NPAT * 2 * NWGMMA_DIMS + 2 * NPAT + 5)

/* The example scripts (examples/patterns) join the matrix in bf16: D = 64 on sm_80, 128 on sm_90a. */
static const int script_dims[] = {1 /* 64 */, 3 /* 128 */};

typedef struct job {
    int pat, dt, dim, sm;
    bool wgmma;  /* cuda:sm_90a */
    bool backward; /* the backward kernels (kind "backward") */
    bool paged;    /* the serving kernels (kind "paged") */
    bool tall;     /* the forward's tall variant (cfg.tall: 192-row q tiles) */
    int script; /* index into scripts, or -1 */
    kpt_status st;
    bool mma, ldmatrix, cp_async, cubin, wgmma_ptx, tma, setmaxnreg, bwd_entries;
    bool serialized; /* ptxas serialised the warpgroup MMAs (its "Potential Performance Loss") */
    bool waits_added; /* ptxas added a wait for them before a read of their results */
    bool paged_entries, pdl; /* serving: its four entry points; griddepcontrol (serving, backward) */
    bool proxy_fence;        /* fence.proxy.async: generic writes published to wgmma's reads */
    bool o_tma, tma_store;   /* forward: plan.o_tma; O staged by stmatrix and stored by TMA */
    int r4_ex2;              /* serving: exponentials in the 64-row kernel's PTX */
    bool aux_grads;          /* backward: plan.aux_grads */
    int dkdv_atomics[2];     /* backward: global atomics in kpt_bwd_dkdv and kpt_bwd_dkdv_aux */
    long paged_smem; /* serving: the attention kernels' static shared memory, the most (ptxas) */
    long spill_bytes;
    long stack_bytes; /* ptxas's stack frames, all entries together */
    double ms;
    char msg[1100];
} job;

/* the serving kernels: four patterns (each part of the template: no mask, a mask, a score mod,
 * and all of them with aux loads) and two scripts at D = 128 on sm_90 (what an H100 compiles), causal at the other
 * head dim pairs, and on sm_80 (no dependent launch there) in f16: the source differs between
 * sm_80 and sm_90 in nothing else. A module takes 2-14 s of NVRTC; every pattern and script
 * (35 modules) took cuda_codegen from 458 to 690 s in CI. */
#define NPAGED (NPAT + NDIM + MAX_SCRIPTS)
#define NTALL 2 /* the tall variants of masked head-dim-64 forward kernels on sm_90a */
static job jobs[NJOBS + MAX_SCRIPTS * 5 + NPAGED + NTALL];
static int next_job, njobs;
static pthread_mutex_t job_lock = PTHREAD_MUTEX_INITIALIZER;

/* The sum over ptxas's "-v" lines of the numbers before `what` ("bytes spill stores", "bytes
 * stack frame"). */
static long ptxas_total(const char *log, const char *what)
{
    long total = 0;
    for (const char *s = log; s && (s = strstr(s, what)); s++) {
        const char *n = s;
        while (n > log && n[-1] == ' ')
            n--;
        while (n > log && n[-1] >= '0' && n[-1] <= '9')
            n--;
        total += strtol(n, NULL, 10);
    }
    return total;
}

/* Whether the script has a score mod. */
static bool has_score(const char *script)
{
    kpt_pattern *p = NULL;
    kpt_diag d = {0};
    bool yes = kpt_pattern_from_lua_file(script, NULL, &p, &d) == KPT_OK && p->score != 0;
    kpt_pattern_destroy(&p);
    return yes;
}

/* Whether the script's score has aux gradients (float aux loads). */
static bool has_aux_grads(const char *script)
{
    kpt_pattern *p = NULL;
    kpt_diag d = {0};
    bool yes = kpt_pattern_from_lua_file(script, NULL, &p, &d) == KPT_OK &&
               kpt_diff_score(p, &d) == KPT_OK && p->num_dloads > 0;
    kpt_pattern_destroy(&p);
    return yes;
}

/* The most static shared memory ptxas gives the functions whose names begin with `prefix`. */
static long static_smem(const char *log, const char *prefix)
{
    char key[128];
    snprintf(key, sizeof(key), "Function properties for %s", prefix);
    long most = 0;
    for (const char *s = log; s && (s = strstr(s, key)); s++) {
        const char *e = strstr(s, " bytes smem"), *n = e;
        if (!e)
            break;
        while (n > s && n[-1] >= '0' && n[-1] <= '9')
            n--;
        long v = strtol(n, NULL, 10);
        most = v > most ? v : most;
    }
    return most;
}

/* How often `needle` occurs in the PTX of entry `entry` (up to the next entry). */
static int count_in_entry(const char *ptx, const char *entry, const char *needle)
{
    const char *at = strstr(ptx, entry), *end = at ? strstr(at + 1, ".entry ") : NULL;
    int n = 0;
    for (const char *p = at; p && (p = strstr(p, needle)) && (!end || p < end); p++)
        n++;
    return n;
}

static void *worker(void *arg)
{
    (void)arg;
    for (;;) {
        pthread_mutex_lock(&job_lock);
        int i = next_job++;
        pthread_mutex_unlock(&job_lock);
        if (i >= njobs)
            return NULL;
        job *j = &jobs[i];
        kpt_pattern *p = NULL;
        kpt_diag d = {0};
        kpt_kernel_plan plan;
        char *src = NULL;
        kpt_kernel_config cfg = {.kind = j->backward ? KPT_KERNEL_BACKWARD
                                         : j->paged  ? KPT_KERNEL_PAGED
                                                     : KPT_KERNEL_FORWARD,
                                 .dtype = j->dt ? KPT_DTYPE_F16 : KPT_DTYPE_BF16,
                                 .dqk = dims[j->dim][0], .dv = dims[j->dim][1], .sm = j->sm,
                                 .wgmma = j->wgmma, .tall = j->tall};
        if (j->script >= 0)
            j->st = kpt_pattern_from_lua_file(scripts[j->script], NULL, &p, &d);
        else
            j->st = kpt_pattern_parse(patterns[j->pat], &p, &d);
        if (!j->st && j->backward)
            j->st = kpt_diff_score(p, &d);
        if (!j->st)
            j->st = kpt_plan_tiles_cuda(p, &cfg, 0, &plan, &d);
        if (!j->st && plan.cfg.wgmma != j->wgmma)
            j->st = kpt_diag_set(&d, KPT_ERR_INTERNAL, "the plan did not keep sm_90a");
        if (!j->st && j->tall && (!plan.cfg.tall || plan.bm != 192 || plan.warps != 16))
            j->st = kpt_diag_set(&d, KPT_ERR_INTERNAL, "no tall variant (bm %d)", plan.bm);
        if (!j->st)
            j->st = kpt_cuda_source(p, &plan, &kpt_dialect_cuda, &src, &d);
        kpt_nvrtc_output out = {0};
        if (!j->st)
            j->st = kpt_nvrtc_compile(src, j->sm, kpt_nvrtc_flags(&plan, KPT_RTC_VERBOSE), &out,
                                      &d);
        if (!j->st) {
            j->mma = strstr(out.ptx, "mma.sync.aligned.m16n8k16.row.col.f32") != NULL;
            j->wgmma_ptx = strstr(out.ptx, "wgmma.mma_async.sync.aligned.m64n") != NULL;
            j->ldmatrix = strstr(out.ptx, "ldmatrix.sync.aligned") != NULL;
            j->cp_async = strstr(out.ptx, "cp.async.cg.shared.global") != NULL;
            j->tma = strstr(out.ptx, "cp.async.bulk.tensor.4d") != NULL;
            j->bwd_entries = strstr(out.ptx, ".entry kpt_bwd_prep") &&
                             strstr(out.ptx, ".entry kpt_bwd_dkdv") &&
                             strstr(out.ptx, ".entry kpt_bwd_dq") &&
                             (!j->wgmma || strstr(out.ptx, ".entry kpt_bwd_dq_store"));
            /* the consumers' registers: 240 with two consumer warpgroups, 160 with three */
            j->setmaxnreg = strstr(out.ptx, plan.warps == 16 ? "setmaxnreg.inc.sync.aligned.u32 160"
                                                             : "setmaxnreg.inc.sync.aligned.u32 240");
            j->cubin = out.cubin && out.cubin_size > 4 && !memcmp(out.cubin, "\177ELF", 4);
            j->serialized = out.log && strstr(out.log, "wgmma.mma_async instructions are serialized");
            j->waits_added = out.log && strstr(out.log, "warpgroup.wait is injected");
            j->spill_bytes = ptxas_total(out.log, "bytes spill stores");
            j->stack_bytes = ptxas_total(out.log, "bytes stack frame");
            j->paged_entries = strstr(out.ptx, ".entry kpt_paged_r1") &&
                               strstr(out.ptx, ".entry kpt_paged_r2") &&
                               strstr(out.ptx, ".entry kpt_paged_r4") &&
                               strstr(out.ptx, ".entry kpt_paged_combine");
            j->pdl = strstr(out.ptx, "griddepcontrol.launch_dependents") &&
                     strstr(out.ptx, "griddepcontrol.wait");
            j->paged_smem = static_smem(out.log, "kpt_paged_r");
            j->proxy_fence = strstr(out.ptx, "fence.proxy.async") != NULL;
            j->r4_ex2 = count_in_entry(out.ptx, ".entry kpt_paged_r4", "ex2.approx");
            j->aux_grads = plan.aux_grads;
            j->o_tma = plan.o_tma;
            j->tma_store = strstr(out.ptx, "stmatrix.sync.aligned") &&
                           strstr(out.ptx, "cp.async.bulk.tensor.4d.global.shared::cta");
            j->dkdv_atomics[0] = count_in_entry(out.ptx, ".entry kpt_bwd_dkdv(", "atom.global");
            j->dkdv_atomics[1] = strstr(out.ptx, ".entry kpt_bwd_dkdv_aux(")
                                     ? count_in_entry(out.ptx, ".entry kpt_bwd_dkdv_aux(",
                                                      "atom.global")
                                     : -1;
            j->ms = out.ms;
        }
        snprintf(j->msg, sizeof(j->msg), "%s", d.message);
        kpt_nvrtc_output_free(&out);
        free(src);
        kpt_pattern_destroy(&p);
    }
}

static void test_nvrtc_matrix(void **state)
{
    (void)state;
    kpt_diag d = {0};
    int ver = kpt_nvrtc_version(&d);
    if (ver < 0) {
        print_message("NVRTC not found, skipping: %s\n", d.message);
        skip();
    }
    /* Patterns and head dims are crossed sparsely: a pattern's mask and score code is the same
     * at every head dim, and a head dim's tiles the same under every pattern, so every pattern
     * is compiled at head dim 64 on sm_80 and 128 on sm_90a, and every head dim under full,
     * causal and document+causal+softcap (aux loads, a mask, a score mod, a runtime scalar) on
     * both; f16 differs from bf16 in nothing but the conversion helpers KPT_BF16 selects, so it
     * is compiled at D = 128 under those and softcap($c)+causal. The whole cross product took
     * cuda_codegen to 16 of CI's 15 minutes; on the device, tests/gpu compiles and runs what it
     * checks. */
    /* sm_90 (mma.sync on Hopper) compiles the sm_80 kernel's very source for another ptxas
     * target: it runs every pattern at the head dims sm_90a leaves to it, and full and causal
     * elsewhere (reached only with the target "cuda:sm_90" or KPT_CUDA_WGMMA=0) */
    int n = 0;
    for (size_t p = 0; p < NPAT; p++)
        for (int dt = 0; dt < 2; dt++)
            for (size_t dim = 0; dim < NDIM; dim++)
                for (int a = 0; a < 2; a++)
                    if (crossed(p, dt, dim, false) && (!a || p <= 1 || !is_wgmma_dim((int)dim)))
                        jobs[n++] = (job){.pat = (int)p, .dt = dt, .dim = (int)dim,
                                          .sm = a ? 90 : 80, .script = -1};
    for (size_t p = 0; p < NPAT; p++)
        for (int dt = 0; dt < 2; dt++)
            for (size_t dim = 0; dim < NWGMMA_DIMS; dim++)
                if (crossed(p, dt, (size_t)wgmma_dims[dim], true))
                    jobs[n++] = (job){.pat = (int)p, .dt = dt, .dim = wgmma_dims[dim], .sm = 90,
                                      .wgmma = true, .script = -1};
    /* the scripts at D = 64 on sm_80 and at D = 128 on sm_90a: a script's mask and score code
     * is the same at every head dim, and what differs between head dims on sm_90a the built-in
     * patterns cover at both (both dims on both targets took two minutes more of CI's 15) */
    for (int sc = 0; sc < nscripts; sc++)
        for (int a = 0; a < 2; a++)
            jobs[n++] = (job){.dim = script_dims[a], .sm = a ? 90 : 80, .wgmma = a == 1,
                              .script = sc};
    /* the backward kernels on sm_80 (sm_90 devices run the same code past head dim 128): at D =
     * 64 in bf16 the patterns of bwd_pats (no mask, masks, windows and a runtime scalar, aux
     * loads, score mods; the sm_90a jobs below compile every pattern, whose mask and score code
     * is the same), one at D = 128 in f16, and the scripts with a score mod (its derivative) or
     * a mask past KPT_MASK_UNROLL_MAX_NODES (a rolled loop here) */
    static const int bwd_pats[] = {0, 1, 4, 8, 9, 12, 13};
    for (size_t i = 0; i < sizeof(bwd_pats) / sizeof(bwd_pats[0]); i++)
        jobs[n++] = (job){.pat = bwd_pats[i], .dim = 1, .sm = 80, .backward = true, .script = -1};
    jobs[n++] = (job){.pat = (int)NPAT - 1, .dt = 1, .dim = F16_DIM, .sm = 80, .backward = true,
                      .script = -1};
    for (int sc = 0; sc < nscripts; sc++)
        if (has_score(scripts[sc]) || strstr(scripts[sc], "/natten_morton.lua"))
            jobs[n++] = (job){.dim = 1, .sm = 80, .backward = true, .script = sc};
    /* the sm_90a backward kernels (head dims 64 and 128): every pattern at D = 128 in bf16, one
     * in f16 at D = 64, one at Dqk != Dv */
    for (size_t p = 0; p < NPAT; p++)
        jobs[n++] = (job){.pat = (int)p, .dim = 3, .sm = 90, .wgmma = true, .backward = true,
                          .script = -1};
    jobs[n++] = (job){.pat = 1, .dt = 1, .dim = 1, .sm = 90, .wgmma = true, .backward = true,
                      .script = -1};
    jobs[n++] = (job){.pat = (int)NPAT - 1, .dim = 5, .sm = 90, .wgmma = true, .backward = true,
                      .script = -1};
    /* and the scripts with aux gradients at D = 128 (kpt_bwd_dkdv_aux beside kpt_bwd_dkdv) */
    for (int sc = 0; sc < nscripts; sc++)
        if (has_aux_grads(scripts[sc]))
            jobs[n++] = (job){.dim = 3, .sm = 90, .wgmma = true, .backward = true, .script = sc};
    /* head dim 256: on sm_90a split columns (aux loads, a mask, a score mod), the sm_80 kernels
     * in two column parts elsewhere (and on sm_90 with KPT_CUDA_WGMMA=0) */
    jobs[n++] = (job){.pat = (int)NPAT - 1, .dim = 4, .sm = 90, .wgmma = true, .backward = true,
                      .script = -1};
    jobs[n++] = (job){.pat = 1, .dim = 4, .sm = 90, .backward = true, .script = -1};
    jobs[n++] = (job){.pat = (int)NPAT - 1, .dt = 1, .dim = 4, .sm = 80, .backward = true,
                      .script = -1};
    /* the tall variants (192-row q tiles on three consumers) of masked kernels: causal in bf16,
     * a runtime-scalar softcap with causal in f16 (the same template as the unmasked kernels'
     * 192-row tiles, which the matrix above compiles, with the mask's code) */
    jobs[n++] = (job){.pat = 1, .dim = 1, .sm = 90, .wgmma = true, .tall = true, .script = -1};
    jobs[n++] = (job){.pat = 12, .dt = 1, .dim = 1, .sm = 90, .wgmma = true, .tall = true,
                      .script = -1};
    const int first_paged = n;
    /* no mask, a mask, a score (mask and score with aux loads: document+causal+softcap on sm_90a
     * below, and graphormer_edges's here; on the mma.sync kernel it was the slowest module of
     * the matrix, 40 s of NVRTC) */
    static const int paged_pats[] = {0, 1, 12};
    for (size_t p = 0; p < sizeof(paged_pats) / sizeof(paged_pats[0]); p++)
        jobs[n++] = (job){.pat = paged_pats[p], .dim = 3, .sm = 90, .paged = true, .script = -1};
    /* head dims 32, 256 and Dqk != Dv (64 and 96 have the same 64-key tiles as 32 and 128; the
     * head dim is a loop bound) */
    static const int paged_dims[] = {0, 4, 5};
    for (size_t i = 0; i < sizeof(paged_dims) / sizeof(paged_dims[0]); i++)
        jobs[n++] = (job){.pat = 1, .dim = paged_dims[i], .sm = 90, .paged = true, .script = -1};
    jobs[n++] = (job){.pat = 1, .dt = 1, .dim = 3, .sm = 80, .paged = true, .script = -1};
    /* sm_90a (head dims 64 and 128): swizzled tiles, the 64-row kernel's products a warpgroup's */
    jobs[n++] = (job){.pat = 13, .dim = 3, .sm = 90, .wgmma = true, .paged = true, .script = -1};
    jobs[n++] = (job){.pat = 1, .dt = 1, .dim = 1, .sm = 90, .wgmma = true, .paged = true,
                      .script = -1};
    /* two scripts with expressions no built-in pattern has: erf, aux of rank 4 */
    static const char *const paged_scripts[] = {"/gelu_scores.lua", "/graphormer_edges.lua"};
    for (int sc = 0; sc < nscripts; sc++)
        for (size_t i = 0; i < sizeof(paged_scripts) / sizeof(paged_scripts[0]); i++)
            if (strstr(scripts[sc], paged_scripts[i]))
                jobs[n++] = (job){.dim = 3, .sm = 90, .paged = true, .script = sc};
    njobs = n;
    const char *env = getenv("KPT_TEST_JOBS");
    int nthreads = env ? atoi(env) : 4;
    if (nthreads < 1 || nthreads > 32)
        nthreads = 4;
    pthread_t th[32];
    for (int i = 0; i < nthreads; i++)
        assert_int_equal(pthread_create(&th[i], NULL, worker, NULL), 0);
    for (int i = 0; i < nthreads; i++)
        pthread_join(th[i], NULL);
    double max_ms = 0, cat_ms[5] = {0}; /* NVRTC time: sm_80, sm_90, sm_90a, backward, paged */
    int spilling = 0, scripted = 0, backward = 0;
    for (int i = 0; i < n; i++) {
        job *j = &jobs[i];
        const char *what = j->script >= 0 ? scripts[j->script] : patterns[j->pat];
        if (j->st)
            fail_msg("%s %s %d/%d sm_%d%s%s: %s", what, j->dt ? "f16" : "bf16", dims[j->dim][0],
                     dims[j->dim][1], j->sm, j->wgmma ? "a" : "",
                     j->backward ? " backward" : j->paged ? " paged" : "", j->msg);
        if (j->backward) {
            assert_true(j->bwd_entries);
            /* on sm_90 kpt_bwd_dkdv lets its dependent launch start and dQ's kernel waits for
             * it (runtime/cuda_device.c, launch_dependent); no griddepcontrol on sm_80 */
            if (j->pdl != (j->sm >= 90))
                fail_msg("%s backward sm_%d%s: griddepcontrol %s", what, j->sm,
                         j->wgmma ? "a" : "", j->pdl ? "on sm_80" : "missing");
            /* scores with aux gradients: a second dK/dV kernel with their terms (the atomic
             * sums of kpt_bwd_aux), the first without them; none for the others */
            if (j->aux_grads != (j->dkdv_atomics[1] >= 0) ||
                (j->aux_grads && j->dkdv_atomics[1] <= j->dkdv_atomics[0]))
                fail_msg("%s backward sm_%d%s: plan.aux_grads %d, kpt_bwd_dkdv %d global atomics, "
                         "kpt_bwd_dkdv_aux %d", what, j->sm, j->wgmma ? "a" : "", j->aux_grads,
                         j->dkdv_atomics[0], j->dkdv_atomics[1]);
        }
        if (j->paged) {
            /* mma.sync kernels at every head dim, without spills for the built-in patterns at
             * head dims 32 to 128 (at 256 ptxas spills 60-84 bytes, and graphormer_edges's mask
             * 136 at 128; docs/serving.md); the combine a programmatic dependent of the
             * attention on sm_90 only (runtime/cuda_device.c launches it so there); the static
             * shared memory within what the planner reserves for it */
            assert_true(j->paged_entries);
            if (j->spill_bytes && j->script < 0 && dims[j->dim][0] <= 128 &&
                dims[j->dim][1] <= 128)
                fail_msg("%s %s %d/%d sm_%d paged: %ld bytes of ptxas spills", what,
                         j->dt ? "f16" : "bf16", dims[j->dim][0], dims[j->dim][1], j->sm,
                         j->spill_bytes);
            /* nor a stack frame: the kernel parameters' address taken (a reference passed to
             * an out-of-line function) put them in one, read at every tile of a paged cache
             * (templates/cuda/paged.cu, kpt_pg_stage) */
            if (j->stack_bytes && j->script < 0 && dims[j->dim][0] <= 128 &&
                dims[j->dim][1] <= 128)
                fail_msg("%s %s %d/%d sm_%d paged: a %ld-byte stack frame", what,
                         j->dt ? "f16" : "bf16", dims[j->dim][0], dims[j->dim][1], j->sm,
                         j->stack_bytes);
            assert_int_equal(j->pdl, j->sm >= 90);
            /* the 64-row kernel's softmax is there: a thread's 32 scores of a 64-key tile (16 of
             * a 32-key tile past head dim 128). An `else` before `#pragma unroll` once made
             * NVRTC drop it after the warpgroup's product: 6 were left (PTX). */
            if (j->r4_ex2 < (dims[j->dim][1] > 128 ? 16 : 32))
                fail_msg("%s %d/%d sm_%d%s paged: %d exponentials in kpt_paged_r4", what,
                         dims[j->dim][0], dims[j->dim][1], j->sm, j->wgmma ? "a" : "", j->r4_ex2);
            if (j->paged_smem <= 0 || j->paged_smem > KPT_PAGED_STATIC_SMEM + KPT_KERNEL_ARGS_BYTES)
                fail_msg("%s %d/%d sm_%d paged: ptxas gives %ld bytes of static shared memory; "
                         "KPT_PAGED_STATIC_SMEM + KPT_KERNEL_ARGS_BYTES reserve %d", what,
                         dims[j->dim][0], dims[j->dim][1], j->sm, j->paged_smem,
                         KPT_PAGED_STATIC_SMEM + KPT_KERNEL_ARGS_BYTES);
        }
        if (j->wgmma && j->backward) {
            /* warpgroup MMAs, asynchronous, on tiles the TMA copies for a producer warpgroup
             * (setmaxnreg); no cp.async */
            assert_true(j->wgmma_ptx);
            assert_true(j->tma);
            assert_true(j->setmaxnreg);
            assert_false(j->cp_async);
            assert_false(j->mma);
        } else if (j->wgmma && j->paged) {
            /* serving on sm_90a: cp.async into swizzled tiles, published to the warpgroup's
             * products by a proxy fence; mma.sync and ldmatrix in the 16- and 32-row kernels */
            assert_true(j->wgmma_ptx);
            assert_true(j->proxy_fence);
            assert_true(j->cp_async);
            assert_true(j->mma);
            assert_true(j->ldmatrix);
            assert_false(j->tma);
        } else if (j->wgmma) {
            /* warpgroup MMAs on TMA copies, warp-specialised; no mma.sync, no cp.async; O
             * leaves by TMA stores up to Dv = 128 */
            assert_true(j->wgmma_ptx);
            assert_true(j->tma);
            assert_true(j->setmaxnreg);
            assert_false(j->mma);
            assert_false(j->cp_async);
            assert_int_equal(j->o_tma, dims[j->dim][1] <= 128);
            assert_int_equal(j->tma_store, j->o_tma);
        } else {
            assert_true(j->mma);
            assert_true(j->ldmatrix);
            assert_true(j->cp_async);
        }
        assert_true(j->cubin);
        /* every sm_90a kernel's products stay asynchronous: ptxas found no accumulator register
         * touched while a wgmma may still write it, nor added waits for products where the
         * kernel has none (an epilogue reading O while the next product S ran, on a branch, had
         * ptxas wait for that S first; it says so only as an "info" line) */
        if (j->wgmma && (j->serialized || j->waits_added))
            fail_msg("%s %s %d/%d sm_90a%s: ptxas %s", what, j->dt ? "f16" : "bf16",
                     dims[j->dim][0], dims[j->dim][1],
                     j->backward ? " backward" : j->paged ? " paged" : "",
                     j->serialized ? "serialised the wgmma pipeline"
                                   : "added waits for the warpgroup MMAs");
        /* the sm_90a kernel's full and causal compile without spills at every head dim (the
         * backward's too) */
        if (j->wgmma && j->script < 0 && j->pat <= 1)
            assert_int_equal(j->spill_bytes, 0);
        /* the main configurations of the head dims up to 64 compile without spills (the
         * serving kernels' rule is above) */
        if (!j->paged && j->script < 0 && j->pat <= 1 && dims[j->dim][0] <= 64 &&
            dims[j->dim][1] <= 64)
            assert_int_equal(j->spill_bytes, 0);
        spilling += j->spill_bytes > 0;
        scripted += j->script >= 0;
        backward += j->backward;
        if (j->ms > max_ms)
            max_ms = j->ms;
        cat_ms[j->paged ? 4 : j->backward ? 3 : j->wgmma ? 2 : j->sm == 90 ? 1 : 0] += j->ms;
    }
    print_message("NVRTC %d.%d: %d kernels compiled to PTX+CUBIN (sm_80, sm_90, sm_90a), %d "
                  "scripts' and %d backward and %d serving among them (slowest %.0f ms); %d with "
                  "ptxas spills (see docs/architecture.md); seconds of NVRTC: sm_80 %.0f, sm_90 "
                  "%.0f, sm_90a %.0f, backward %.0f, serving %.0f\n",
                  ver / 1000, ver % 1000 / 10, n, scripted, backward,
                  n - first_paged, max_ms, spilling, cat_ms[0] / 1e3, cat_ms[1] / 1e3,
                  cat_ms[2] / 1e3, cat_ms[3] / 1e3, cat_ms[4] / 1e3);
}

static int compare_paths(const void *a, const void *b)
{
    return strcmp(a, b);
}

/* Lists the example scripts of `dir`, sorted. */
static void find_scripts(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d)) && nscripts < MAX_SCRIPTS) {
        size_t n = strlen(e->d_name);
        if (n > 4 && !strcmp(e->d_name + n - 4, ".lua"))
            snprintf(scripts[nscripts++], sizeof(scripts[0]), "%s/%s", dir, e->d_name);
    }
    if (d)
        closedir(d);
    qsort(scripts, (size_t)nscripts, sizeof(scripts[0]), compare_paths);
}

static void test_covers_builtins(void **state)
{
    (void)state;
    assert_null(kpt_test_uncovered_builtin(patterns, (int)NPAT));
}

int main(int argc, char **argv)
{
    if (argc > 1)
        find_scripts(argv[1]); /* the examples' directory */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_covers_builtins),
        cmocka_unit_test(test_template_fill),
        cmocka_unit_test(test_deterministic_no_user_text),
        cmocka_unit_test(test_plan_refuses),
        cmocka_unit_test(test_plan_backward), cmocka_unit_test(test_plan_backward_turns),
        cmocka_unit_test(test_plan_paged),
        cmocka_unit_test(test_plan_sm90_forward), cmocka_unit_test(test_plan_sm90_mask_bits),
        cmocka_unit_test(test_nvrtc_flags),
        cmocka_unit_test(test_nvrtc_matrix),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
