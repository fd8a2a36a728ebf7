/* The sm_90a kernels' TMA maps (runtime/cuda_tma.c), built against a driver that records what it
 * is asked to encode: which tensors get maps, their dims, byte strides and boxes, and the calls
 * refused with a clear error. No GPU. */
#include <string.h>

#include "tests/testutil.h"

#include "compiler/plan_tiles.h"
#include "runtime/cuda_tma.h"

/* One cuTensorMapEncodeTiled call, as the fake driver saw it. */
typedef struct encoded {
    int dtype;
    unsigned rank;
    uint64_t ptr, dim[4], stride[3];
    unsigned box[4];
    int swizzle;
} encoded;

static encoded calls[16];
static int ncalls;

static CUresult fake_encode(void *map, int dtype, unsigned rank, void *ptr, const uint64_t *dim,
                            const uint64_t *stride, const unsigned *box, const unsigned *elem,
                            int interleave, int swizzle, int promo, int fill)
{
    (void)map, (void)elem, (void)interleave, (void)promo, (void)fill;
    if (ncalls < 16) {
        encoded *e = &calls[ncalls];
        e->dtype = dtype;
        e->rank = rank;
        e->ptr = (uint64_t)(uintptr_t)ptr;
        memcpy(e->dim, dim, sizeof(e->dim));
        memcpy(e->stride, stride, sizeof(e->stride));
        memcpy(e->box, box, sizeof(e->box));
        e->swizzle = swizzle;
    }
    ncalls++;
    return 0;
}

static kpt_kernel_plan plan_for(kpt_kernel_kind kind, const char *pattern, int dqk, int dv)
{
    kpt_pattern *p = NULL;
    kpt_diag d = {0};
    assert_int_equal(kpt_pattern_parse(pattern, &p, &d), KPT_OK);
    const kpt_kernel_config cfg = {.kind = kind, .dtype = KPT_DTYPE_BF16, .dqk = dqk, .dv = dv,
                                   .sm = 90, .wgmma = true};
    kpt_kernel_plan pl;
    assert_int_equal(kpt_plan_tiles_cuda(p, &cfg, 232448, &pl, &d), KPT_OK);
    assert_true(pl.cfg.wgmma);
    kpt_pattern_destroy(&p);
    return pl;
}

/* A BSHD call: B 2, Hq 8, Hkv 2, Sq 300, Skv 333, each tensor at its own address. */
static kpt_kernel_args bshd_args(int dqk, int dv)
{
    kpt_kernel_args a = {0};
    a.B = 2, a.Hq = 8, a.Hkv = 2, a.Sq = 300, a.Skv = 333, a.group = 4;
    a.q = 0x10000, a.k = 0x20000, a.v = 0x30000, a.o = 0x40000;
    const int64_t qs[4] = {(int64_t)300 * 8 * dqk, dqk, 8 * dqk, 1};
    const int64_t ks[4] = {(int64_t)333 * 2 * dqk, dqk, 2 * dqk, 1};
    const int64_t vs[4] = {(int64_t)333 * 2 * dv, dv, 2 * dv, 1};
    const int64_t os[4] = {(int64_t)300 * 8 * dv, dv, 8 * dv, 1};
    memcpy(a.qs, qs, sizeof(qs));
    memcpy(a.ks, ks, sizeof(ks));
    memcpy(a.vs, vs, sizeof(vs));
    memcpy(a.os, os, sizeof(os));
    return a;
}

static const encoded *find(uint64_t ptr)
{
    for (int i = 0; i < ncalls && i < 16; i++)
        if (calls[i].ptr == ptr)
            return &calls[i];
    return NULL;
}

/* The forward: maps of q, k and v, and of o (boxes of a consumer's 64 rows) where the plan
 * stores O through TMA (Dv up to 128); not at Dv = 256. */
static void test_forward_maps(void **state)
{
    (void)state;
    kpt_cu_api cu = {0};
    cu.TensorMapEncodeTiled = fake_encode;
    static const int dims[][2] = {{128, 128}, {64, 64}, {256, 128}, {256, 256}, {64, 64}};
    for (int i = 0; i < 5; i++) {
        const int dqk = dims[i][0], dv = dims[i][1];
        /* the last: an unmasked pattern, whose plan at head dim 64 has 192-row q tiles */
        const bool masked = i < 4;
        const kpt_kernel_plan pl = plan_for(KPT_KERNEL_FORWARD, masked ? "causal" : "full", dqk, dv);
        const kpt_kernel_args a = bshd_args(dqk, dv);
        kpt_kernel_tma t;
        kpt_diag d = {0};
        ncalls = 0;
        assert_int_equal(kpt_cuda_tma_pack(&cu, &pl, &a, &t, &d), KPT_OK);
        assert_int_equal(ncalls, pl.o_tma ? 4 : 3);
        assert_int_equal(pl.o_tma, dv <= 128);
        const encoded *o = find(a.o);
        if (!pl.o_tma) {
            assert_null(o);
            continue;
        }
        assert_non_null(o);
        assert_int_equal(o->rank, 4);
        assert_int_equal(o->dim[0], dv);
        assert_int_equal(o->dim[1], 300);
        assert_int_equal(o->dim[2], 8);
        assert_int_equal(o->dim[3], 2);
        assert_int_equal(o->stride[0], 8 * dv * 2); /* bytes: the sequence, head, batch */
        assert_int_equal(o->stride[1], dv * 2);
        assert_int_equal(o->stride[2], 300 * 8 * dv * 2);
        assert_int_equal(o->box[0], 64);
        assert_int_equal(o->box[1], 64);
        assert_int_equal(o->box[2], 1);
        assert_int_equal(o->swizzle, 3); /* 128 bytes */
        assert_int_equal(t.ho, 1);
        assert_int_equal(t.bo, 1);
        /* q keeps the plan's q tile rows: 192 where three consumer warpgroups take unmasked
         * patterns at head dims up to 64, else 128 */
        assert_int_equal(find(a.q)->box[1], pl.bm);
        assert_int_equal(pl.bm, !masked && dqk <= 64 && dv <= 64 ? 192 : 128);
    }
}

/* An o whose rows share one address (sequence stride 0) cannot be a TMA store's destination:
 * refused with the tensor's name, as q is. */
static void test_forward_refuses_o(void **state)
{
    (void)state;
    kpt_cu_api cu = {0};
    cu.TensorMapEncodeTiled = fake_encode;
    const kpt_kernel_plan pl = plan_for(KPT_KERNEL_FORWARD, "causal", 128, 128);
    kpt_kernel_args a = bshd_args(128, 128);
    a.os[2] = 0;
    kpt_kernel_tma t;
    kpt_diag d = {0};
    assert_int_equal(kpt_cuda_tma_pack(&cu, &pl, &a, &t, &d), KPT_ERR_UNSUPPORTED);
    assert_non_null(strstr(d.message, "tensor o: the sm_90a kernel needs a positive sequence"));
    /* a driver without TMA */
    cu.TensorMapEncodeTiled = NULL;
    a = bshd_args(128, 128);
    assert_int_equal(kpt_cuda_tma_pack(&cu, &pl, &a, &t, &d), KPT_ERR_UNSUPPORTED);
    assert_non_null(strstr(d.message, "cuTensorMapEncodeTiled"));
}

/* The backward: q and dout (64-row boxes), k and v (the plan's rows), dk and dv (64-row boxes,
 * kv heads: kpt_bwd_dkdv's stores), and the f32 dq accumulator only in the default mode. */
static void test_backward_maps(void **state)
{
    (void)state;
    kpt_cu_api cu = {0};
    cu.TensorMapEncodeTiled = fake_encode;
    const kpt_kernel_plan pl = plan_for(KPT_KERNEL_BACKWARD, "causal", 128, 128);
    const kpt_kernel_args a = bshd_args(128, 128);
    kpt_kernel_gargs g = {0};
    g.dout = 0x50000, g.dq = 0x60000, g.dk = 0x70000, g.dv = 0x80000;
    memcpy(g.dos, a.os, sizeof(g.dos));
    memcpy(g.dqs, a.qs, sizeof(g.dqs));
    memcpy(g.dks, a.ks, sizeof(g.dks));
    memcpy(g.dvs, a.vs, sizeof(g.dvs));
    for (int det = 0; det < 2; det++) {
        g.dqacc = det ? 0 : 0x90000;
        kpt_kernel_bwd_tma t;
        kpt_diag d = {0};
        ncalls = 0;
        assert_int_equal(kpt_cuda_tma_pack_bwd(&cu, &pl, &a, &g, &t, &d), KPT_OK);
        assert_int_equal(ncalls, det ? 6 : 7);
        for (int k = 0; k < 2; k++) {
            const encoded *e = find(k ? g.dv : g.dk);
            assert_non_null(e);
            assert_int_equal(e->dim[0], 128);
            assert_int_equal(e->dim[1], 333);
            assert_int_equal(e->dim[2], 2);
            assert_int_equal(e->dim[3], 2);
            assert_int_equal(e->stride[0], 2 * 128 * 2);
            assert_int_equal(e->box[0], 64);
            assert_int_equal(e->box[1], 64);
        }
        assert_int_equal(find(a.k)->box[1], pl.bn);
        assert_int_equal(find(g.dout)->box[1], 64);
        if (det)
            assert_null(find(0x90000));
        else
            assert_int_equal(find(0x90000)->box[0], 32); /* f32: 128 bytes of columns */
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forward_maps),
        cmocka_unit_test(test_forward_refuses_o),
        cmocka_unit_test(test_backward_maps),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
