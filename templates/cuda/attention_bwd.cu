// The sm_80+ backward kernels (mma.sync m16n8k16, ldmatrix, cp.async), inserted into
// templates/cuda/common.cu by codegen/cuda_source.c for the kernel kind "backward".
//
// Three launches, and no atomics anywhere, so the gradients are bitwise reproducible:
//   kpt_bwd_prep  delta[b, h, q] = dO . O per row (one warp a row);
//   kpt_bwd_dkdv  one CTA per (kv tile, kv head, batch row): dK and dV of its 64 keys stay in
//                 registers while it walks the live q tiles of every query head of its group in
//                 a fixed order (GQA sums without atomics). Rows of the MMAs are keys: it
//                 computes S^T = K Q^T and dP^T = V dO^T, so P^T and dS^T are already the A
//                 operands of dV += P^T dO and dK += dS^T Q;
//   kpt_bwd_dq    one CTA per (q tile, head, batch row): dQ over its live kv tiles, as the
//                 forward walks them.
//   kpt_bwd_daux  (with aux gradients) one thread per aux element: its exact sum, to f32.
// Both recompute S and dP: the price of determinism without an fp32 dQ accumulator. With
// gradients of the score mod, dS = P (dP - delta) * d s'/d s (kpt_score_grad).
//
// Aux gradients (learnable score-mod parameters) are scattered: any (b, h, q, k) may read any
// element. kpt_bwd_dkdv adds each pair's dL/ds' * ds'/d aux into a 128-bit fixed-point
// accumulator per element (2^-64 resolution) with integer atomics; integer sums do not depend on
// their order, so the result is bitwise reproducible and exact up to the one rounding of each
// term to 2^-64 (and of the sum to f32). A term of magnitude 2^62 or more, infinite or NaN sets
// the element's flags instead, and it comes out as +-inf or NaN.

#define KPT_AUX_GRADS @NDAUX@

// The gradient arguments; runtime/kernel_args.h holds the host twin.
struct kpt_gargs {
    u64 dout, dq, dk, dv, delta;
    i64 dos[4], dqs[4], dks[4], dvs[4];
    u64 dacc[16], dflag[16]; // per aux slot: accumulators (16 bytes an element) and flags, or 0
    int daux_on, pad;        // any dacc set
    u64 dsinks;              // f32 [Hq]: the sinks' gradient, or 0
    i64 dsinks_stride;
    u64 dqacc;               // sm_90a, not deterministic: f32 [B, Hq, Sq, Dqk], zeroed; or 0
    u64 dqdone;              // with dqacc: u32 [B, Hkv], kpt_bwd_dkdv's warpgroups done, zeroed
};
static_assert(sizeof(kpt_gargs) == 464, "kpt_gargs layout");

#define KPT_INF __int_as_float(0x7f800000u)

// The score mod and its derivative at one pair (generated from the pattern's derived IR).
KPT_DEV float kpt_score_grad(const kpt_args &A, const kpt_uniform &U, float s, int b, int h,
                             int q, int k, float &ds)
{
@GRAD@
}

// ---- aux gradients ----------------------------------------------------------------------------

// v as a 128-bit two's-complement fixed-point number with 64 fraction bits (truncated toward 0
// below 2^-64); returns flags instead (1 NaN, 2 +big, 4 -big) where |v| >= 2^62 or inf.
__device__ __forceinline__ u32 kpt_fix128(float v, u64 &lo, u64 &hi)
{
    const u32 bits = __float_as_uint(v), ex = (bits >> 23) & 255;
    lo = hi = 0;
    if (ex >= 127 + 62) return ex == 255 && (bits & 0x7fffffu) ? 1u : bits >> 31 ? 4u : 2u;
    const u64 m = (bits & 0x7fffffu) | (ex ? 0x800000u : 0u);
    const int sh = (ex ? (int)ex : 1) - 150 + 64; // v = m 2^(sh - 64)
    if (sh >= 64) {
        hi = m << (sh - 64);
    } else if (sh >= 0) {
        lo = m << sh;
        hi = sh > 40 ? m >> (64 - sh) : 0;
    } else {
        lo = sh > -24 ? m >> -sh : 0;
    }
    if (bits >> 31) {
        lo = ~lo + 1;
        hi = ~hi + (lo == 0 ? 1 : 0);
    }
    return 0;
}

// Adds a 128-bit sum (lo, hi) and flags to element e of aux slot `slot`'s accumulators.
__device__ __forceinline__ void kpt_daux_atomic(const kpt_gargs &G, int slot, i64 e, u64 lo,
                                                u64 hi, u32 flag)
{
    unsigned long long *acc = (unsigned long long *)G.dacc[slot] + 2 * e;
    if (lo) {
        const u64 old = atomicAdd(acc, (unsigned long long)lo);
        hi += old + lo < old ? 1 : 0; // the carry out of the low word
    }
    if (hi) atomicAdd(acc + 1, (unsigned long long)hi);
    if (flag) atomicOr((u32 *)G.dflag[slot] + e, flag);
}

// Aux gradients of few elements (a learnable bias by head and bucket, slopes by head) are summed
// per CTA in shared memory first: every pair of a head adds to one of a few elements, and the
// returning atomics on those hot global addresses held each warp for microseconds (Graphormer's
// bias by random distance, H100, 16k: 1.25 s against 47 ms without aux gradients). A slot's
// elements take table entries where they fit (kpt_daux_tab_begin); an entry keeps the sums of
// its positive and of its negative terms' magnitudes, 128 bits each in four 32-bit words, and
// flags, added to the accumulators once at the CTA's end. 32-bit words because shared memory
// has no 64-bit atomic add (ptxas makes a compare-and-swap loop of it, which contended); apart
// by sign so that a carry runs past the words a term has (24 bits, two words) only when a word
// overflows. Integer sums: the result is the same bits whatever the order.
#define KPT_DAUX_TAB 512 // entries; the table's size is KPT_BWD_DAUX_TAB in plan_tiles_cuda.c
struct kpt_daux_tab {
    int off[16];                 // per aux slot: its first entry, or -1 (not in the table)
    u32 flag[KPT_DAUX_TAB / 4];  // an entry's flags in byte (entry mod 4) of word entry / 4
    u32 sum[KPT_DAUX_TAB][2][4]; // positive terms, negative terms: 128-bit sums, low word first
};
static_assert(sizeof(kpt_daux_tab) == 16960, "KPT_BWD_DAUX_TAB in compiler/plan_tiles_cuda.c");

__device__ __forceinline__ i64 kpt_daux_count(const kpt_args &A, const kpt_gargs &G, int slot)
{
    const int *d = A.aux[slot].dim;
    return G.dacc[slot] ? (i64)d[0] * d[1] * d[2] * d[3] : 0;
}

// The table zeroed and the slots placed, by `n` threads (t their index); a barrier of those
// threads must follow before any kpt_daux_add.
__device__ __forceinline__ void kpt_daux_tab_begin(const kpt_args &A, const kpt_gargs &G,
                                                   kpt_daux_tab *T, int t, int n)
{
    for (int i = t; i < KPT_DAUX_TAB; i += n) {
        if (i % 4 == 0)
            T->flag[i / 4] = 0;
        for (int j = 0; j < 8; j++)
            T->sum[i][j >> 2][j & 3] = 0;
    }
    if (t == 0) {
        i64 used = 0;
        for (int slot = 0; slot < 16; slot++) {
            const i64 c = kpt_daux_count(A, G, slot);
            T->off[slot] = c > 0 && used + c <= KPT_DAUX_TAB ? (int)used : -1;
            used += T->off[slot] >= 0 ? c : 0;
        }
    }
}

// The table's sums added to the accumulators, by `n` threads after a barrier of them that
// follows their last kpt_daux_add.
__device__ __forceinline__ void kpt_daux_tab_end(const kpt_args &A, const kpt_gargs &G,
                                                 const kpt_daux_tab *T, int t, int n)
{
    for (int slot = 0; slot < 16; slot++) {
        const int off = T->off[slot];
        const int c = off >= 0 ? (int)kpt_daux_count(A, G, slot) : 0;
        for (int e = t; e < c; e += n) {
            const u32 *p = T->sum[off + e][0], *m = T->sum[off + e][1];
            const u64 plo = p[0] | (u64)p[1] << 32, phi = p[2] | (u64)p[3] << 32;
            const u64 mlo = m[0] | (u64)m[1] << 32, mhi = m[2] | (u64)m[3] << 32;
            const u64 lo = plo - mlo, hi = phi - mhi - (plo < mlo ? 1 : 0);
            const u32 flag = T->flag[(off + e) / 4] >> (off + e) % 4 * 8 & 255;
            if (lo | hi | flag) kpt_daux_atomic(G, slot, e, lo, hi, flag);
        }
    }
}

// Adds the 128-bit two's-complement x = (lo, hi) to a table entry: its magnitude to the sum of
// its sign, word by word, each add's carry into the next word (most terms touch two words).
__device__ __forceinline__ void kpt_daux_tab_add(kpt_daux_tab *T, int i, u64 lo, u64 hi)
{
    const bool neg = (i64)hi < 0;
    if (neg) {
        lo = ~lo + 1;
        hi = ~hi + (lo == 0 ? 1 : 0);
    }
    u32 *w = T->sum[i][neg];
    const u32 x[4] = {(u32)lo, (u32)(lo >> 32), (u32)hi, (u32)(hi >> 32)};
    u32 c = 0;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const u64 a = (u64)x[j] + c;
        c = 0;
        if (a) {
            const u32 old = atomicAdd(&w[j], (u32)a);
            c = (u32)(((u64)old + a) >> 32);
        }
    }
}

// Adds v (this thread's term) to element (i0, i1, i2, i3) of aux slot `slot`'s gradient; nothing
// where the index lies outside the tensor (the load read 0 there). Called by all 32 lanes of a
// warp together: when they all add to one element, the warp sums its terms first (exactly, as
// integers) and lane 0 adds the sum. Into the CTA's table T where the slot has entries there,
// else into the accumulators.
KPT_DEV void kpt_daux_add(const kpt_args &A, const kpt_gargs &G, kpt_daux_tab *T, int slot,
                          int rank, int i0, int i1, int i2, int i3, float v)
{
    if (!G.dacc[slot]) return; // not wanted (uniform across the grid)
    const kpt_aux &a = A.aux[slot];
    bool in = (u32)i0 < (u32)a.dim[0];
    i64 e = i0;
    if (rank > 1) {
        in = in & ((u32)i1 < (u32)a.dim[1]);
        e = e * a.dim[1] + i1;
    }
    if (rank > 2) {
        in = in & ((u32)i2 < (u32)a.dim[2]);
        e = e * a.dim[2] + i2;
    }
    if (rank > 3) {
        in = in & ((u32)i3 < (u32)a.dim[3]);
        e = e * a.dim[3] + i3;
    }
    u64 lo, hi;
    u32 flag = kpt_fix128(v, lo, hi);
    if (!in) e = -1, lo = hi = 0, flag = 0;
    int same;
    __match_all_sync(0xffffffffu, (unsigned long long)e, &same);
    if (same) {
        if (e < 0) return;
#pragma unroll
        for (int m = 16; m > 0; m >>= 1) {
            const u64 l2 = __shfl_xor_sync(0xffffffffu, lo, m), h2 = __shfl_xor_sync(0xffffffffu, hi, m);
            const u64 s = lo + l2;
            hi = hi + h2 + (s < lo ? 1 : 0);
            lo = s;
            flag |= __shfl_xor_sync(0xffffffffu, flag, m);
        }
        if ((threadIdx.x & 31) != 0) return;
    }
    if (e < 0) return;
    const int off = T->off[slot];
    if (off < 0) {
        kpt_daux_atomic(G, slot, e, lo, hi, flag);
        return;
    }
    if (lo | hi) kpt_daux_tab_add(T, off + (int)e, lo, hi);
    if (flag) atomicOr(&T->flag[(off + e) / 4], flag << (off + e) % 4 * 8);
}

// The score mod's aux gradients at one pair: g = dL/ds' there, s the scaled score (generated).
KPT_DEV void kpt_aux_grads(const kpt_args &A, const kpt_uniform &U, const kpt_gargs &G,
                           kpt_daux_tab *dt, float s, int b, int h, int q, int k, float g)
{
@AUXGRAD@
}

// One output of kpt_bwd_daux: an aux gradient, rank 1 to 4 (unused dims 1), f32 with strides.
struct kpt_daux_out {
    u64 acc, flag, out;
    i64 stride[4];
    int dim[4];
};

extern "C" __global__ void __launch_bounds__(256) kpt_bwd_daux(const kpt_daux_out O)
{
    const i64 e = (i64)blockIdx.x * 256 + threadIdx.x;
    const i64 n23 = (i64)O.dim[2] * O.dim[3], n123 = O.dim[1] * n23;
    if (e >= (i64)O.dim[0] * n123) return;
    const u64 *acc = (const u64 *)O.acc + 2 * e;
    const u32 flag = ((const u32 *)O.flag)[e];
    float v = (float)((double)(i64)acc[1] + (double)acc[0] * 5.421010862427522e-20); // 2^-64
    if (flag) v = flag & 1 || (flag & 6) == 6 ? __int_as_float(0x7fc00000) : flag & 2 ? KPT_INF : -KPT_INF;
    const i64 i0 = e / n123, i1 = e / n23 % O.dim[1], i2 = e / O.dim[3] % O.dim[2], i3 = e % O.dim[3];
    ((float *)O.out)[i0 * O.stride[0] + i1 * O.stride[1] + i2 * O.stride[2] + i3 * O.stride[3]] = v;
}

__device__ __forceinline__ float kpt_x2f(u16 x)
{
#if KPT_BF16
    return kpt_bf2f(x);
#else
    return kpt_h2f(x);
#endif
}

// kpt_bwd_prep: delta[b, h, q] = dO . O per row, eight lanes a row (KPT_PREP_ROWS rows a CTA,
// from codegen), each lane 16 bytes of O and dO at a time; and where the default mode sums dQ
// atomically (G.dqacc, sm_90a) the row's f32 sums zeroed, which a memset did in a pass of its
// own before, and each kv head's count of finished kpt_bwd_dkdv warpgroups (G.dqdone). With a
// warp a row and 4-byte loads it read O and dO at 2.4 TB/s (H100, 16k rows x 16 heads, D = 128:
// 56 us, and 42 for the memset). O, dO and dq rows are 16-byte aligned (kpt_kernel_check_rows).
extern "C" __global__ void __launch_bounds__(256) kpt_bwd_prep(const kpt_args A, const kpt_gargs G)
{
    const int sub = threadIdx.x & 7, q = blockIdx.x * KPT_PREP_ROWS + (threadIdx.x >> 3);
    const int h = blockIdx.y, b = blockIdx.z;
    const bool live = q < A.Sq; // every lane takes part in the shuffles below
    const u16 *o = (const u16 *)A.o + (i64)b * A.os[0] + (i64)h * A.os[1] + (i64)q * A.os[2];
    const u16 *d = (const u16 *)G.dout + (i64)b * G.dos[0] + (i64)h * G.dos[1] + (i64)q * G.dos[2];
    float s = 0.0f;
#pragma unroll
    for (int c = sub; c < KPT_DV / 8; c += 8) {
        if (!live) break;
        const uint4 x = *(const uint4 *)(o + c * 8), y = *(const uint4 *)(d + c * 8);
        const u32 xs[4] = {x.x, x.y, x.z, x.w}, ys[4] = {y.x, y.y, y.z, y.w};
#pragma unroll
        for (int e = 0; e < 4; e++)
            s += kpt_x2f((u16)xs[e]) * kpt_x2f((u16)ys[e]) +
                 kpt_x2f((u16)(xs[e] >> 16)) * kpt_x2f((u16)(ys[e] >> 16));
    }
#pragma unroll
    for (int m = 4; m > 0; m >>= 1)
        s += __shfl_xor_sync(0xffffffffu, s, m);
    if (!live) return;
    if (sub == 0) ((float *)G.delta)[((i64)b * A.Hq + h) * A.Sq + q] = s;
    if (G.dqacc) {
        float4 *acc = (float4 *)((float *)G.dqacc + (((i64)b * A.Hq + h) * A.Sq + q) * KPT_DQK);
#pragma unroll
        for (int c = sub; c < KPT_DQK / 4; c += 8) acc[c] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (q == 0 && sub == 0 && h % A.group == 0) // the kv head's count (kpt_bwd_dq_store)
            ((u32 *)G.dqdone)[(i64)b * A.Hkv + h / A.group] = 0;
    }
}

// The sinks' gradient, one CTA a head: dsink_h = -sum over its rows of exp(sink_h - LSE) delta,
// each thread summing its rows in a fixed order, then a fixed tree: the same bits every run.
extern "C" __global__ void __launch_bounds__(256) kpt_bwd_dsinks(const kpt_args A, const kpt_gargs G)
{
    __shared__ float part[256];
    const int h = blockIdx.x, tid = threadIdx.x;
    const float sink = ((const float *)A.sinks)[(i64)h * A.sink_stride];
    float s = 0.0f;
    for (i64 r = tid; r < (i64)A.B * A.Sq; r += 256) {
        const int b = (int)(r / A.Sq), q = (int)(r % A.Sq);
        const float l = ((const float *)A.lse)[(i64)b * A.lses[0] + (i64)h * A.lses[1] + (i64)q * A.lses[2]];
        const float d = ((const float *)G.delta)[((i64)b * A.Hq + h) * A.Sq + q];
        if (l != KPT_NINF) s -= expf(sink - l) * d;
    }
    part[tid] = s;
    __syncthreads();
    for (int w = 128; w > 0; w >>= 1) {
        if (tid < w) part[tid] += part[tid + w];
        __syncthreads();
    }
    if (tid == 0) ((float *)G.dsinks)[(i64)h * G.dsinks_stride] = part[0];
}

// LSE of row q in log2 units, +inf where the row keeps nothing (or lies past Sq), so that
// 2^(x - lse) is 0 there instead of NaN.
__device__ __forceinline__ float kpt_lse2(const kpt_args &A, int b, int h, int q)
{
    if (q >= A.Sq) return KPT_INF;
    const float l = ((const float *)A.lse)[(i64)b * A.lses[0] + (i64)h * A.lses[1] + (i64)q * A.lses[2]];
    return l == KPT_NINF ? KPT_INF : l * KPT_LOG2E;
}

__device__ __forceinline__ float kpt_delta(const kpt_args &A, const kpt_gargs &G, int b, int h, int q)
{
    return q < A.Sq ? ((const float *)G.delta)[((i64)b * A.Hq + h) * A.Sq + q] : 0.0f;
}

// The LSE and delta of this thread's two rows of an m16 row block whose first query is row0
// (rows lane / 4 and lane / 4 + 8): what the sm_90a kpt_bwd_dq kernels read before their tiles
// (the sm_80 one keeps its own loop: through the helper its PTX changed).
__device__ __forceinline__ void kpt_row_stats(const kpt_args &A, const kpt_gargs &G, int b, int h,
                                              int row0, int lane, float (&lse)[2], float (&del)[2])
{
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int qi = row0 + (lane >> 2) + r * 8;
        lse[r] = kpt_lse2(A, b, h, qi);
        del[r] = kpt_delta(A, G, b, h, qi);
    }
}

// C[16 x N] (+)= A[16 x K] B^T: A rows from shared memory (row stride ASTR), B rows (N of them,
// row stride BSTR) from shared memory, both K-contiguous. One warp; accumulator layout as mma.sync.
template <int N, int K, int ASTR, int BSTR, bool ZERO>
__device__ __forceinline__ void kpt_mm_abt(float (&C)[N / 8][4], u32 sA, u32 sB, int lane)
{
#pragma unroll
    for (int kk = 0; kk < K / 16; kk++) {
        u32 a[4];
        kpt_ldsm4(a, sA + ((lane & 15) * ASTR + kk * 16 + (lane >> 4) * 8) * 2);
#pragma unroll
        for (int np = 0; np < N / 16; np++) {
            u32 bb[4];
            kpt_ldsm4(bb, sB + ((np * 16 + (lane & 7) + (lane >> 4) * 8) * BSTR + kk * 16 +
                                ((lane >> 3) & 1) * 8) * 2);
            if (ZERO && kk == 0) {
                kpt_mma_z(C[2 * np], a, bb[0], bb[1]);
                kpt_mma_z(C[2 * np + 1], a, bb[2], bb[3]);
            } else {
                kpt_mma(C[2 * np], a, bb[0], bb[1]);
                kpt_mma(C[2 * np + 1], a, bb[2], bb[3]);
            }
        }
    }
}

// C[16 x N] += P[16 x K] B: P from registers (accumulator layout, repacked as A fragments), B
// rows (K of them, row stride BSTR, N-contiguous) from shared memory.
template <int N, int K, int BSTR>
__device__ __forceinline__ void kpt_mm_pb(float (&C)[N / 8][4], const float (&P)[K / 8][4], u32 sB,
                                          int lane)
{
#pragma unroll
    for (int kk = 0; kk < K / 16; kk++) {
        u32 pa[4];
        kpt_frag(pa, P[2 * kk], P[2 * kk + 1]);
#pragma unroll
        for (int dp = 0; dp < N / 16; dp++) {
            u32 bv[4];
            kpt_ldsm4t(bv, sB + ((kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * BSTR + dp * 16 +
                                 (lane >> 4) * 8) * 2);
            kpt_mma(C[2 * dp], pa, bv[0], bv[1]);
            kpt_mma(C[2 * dp + 1], pa, bv[2], bv[3]);
        }
    }
}

template <int N>
__device__ __forceinline__ void kpt_zero(float (&C)[N / 8][4])
{
#pragma unroll
    for (int n = 0; n < N / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) C[n][e] = 0.0f;
}

// Writes this thread's two rows (row0 + lane / 4, + 8) of a 16 x N accumulator times `mul` to a
// 16-bit tensor (rows at or past `rows` are skipped).
template <int N>
__device__ __forceinline__ void kpt_store_acc(const float (&C)[N / 8][4], u16 *base, i64 stride,
                                              int row0, int rows, float mul, int lane)
{
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int row = row0 + (lane >> 2) + r * 8;
        if (row >= rows) continue;
        u16 *g = base + (i64)row * stride;
#pragma unroll
        for (int n = 0; n < N / 8; n++)
            *(u32 *)(g + n * 8 + (lane & 3) * 2) = kpt_pack(C[n][2 * r] * mul, C[n][2 * r + 1] * mul);
    }
}

// Which pairs of a 16 x N block are kept, one bit each (bit n * 4 + e for this thread's element
// (n, e); layout as in kpt_bwd_probs), decided before the scores occupy registers: the mask's
// temporaries then cost nothing, and a large mask is evaluated in a rolled loop
// (KPT_MASK_UNROLL) instead of once per element of the unrolled tile. Padding past Sq or Skv is
// dropped too.
template <int N, bool KEY_ROWS>
__device__ __forceinline__ u32 kpt_bwd_keep(const kpt_args &A, const kpt_uniform &U, int b, int h,
                                            int row0, int col0, int lane)
{
    static_assert(N / 8 * 4 <= 32, "one bit per element of a thread");
    u32 keep = ~0u;
    KPT_MASK_UNROLL
    for (int n = 0; n < N / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int r = row0 + (lane >> 2) + (e >> 1) * 8;
            const int c = col0 + n * 8 + (lane & 3) * 2 + (e & 1);
            const int qi = KEY_ROWS ? c : r, ki = KEY_ROWS ? r : c;
            bool kp = ki < A.Skv && qi < A.Sq;
#if KPT_HAS_MASK
            kp = kp && kpt_mask(A, U, b, h, qi, ki);
#endif
            if (!kp) keep &= ~(1u << (n * 4 + e));
        }
    return keep;
}

// The probabilities of a 16 x N block of scores, in place, and the score mod's derivative
// d s'/d s of each in D (only with a score mod). Rows are queries and columns keys, or the
// transpose (KEY_ROWS: kpt_bwd_dkdv's S^T). This thread's element (n, e) lies in row
// row0 + lane / 4 (+ 8 for e >= 2) and column col0 + n * 8 + (lane % 4) * 2 + e % 2. The query's
// LSE in log2 units comes from lse_col[column - col0] (KEY_ROWS, shared memory) or from
// lse_row[e / 2] (this thread's two rows). Pairs `keep` drops (kpt_bwd_keep) get P = 0; with
// SELECT false none is dropped (a full tile: keep is all ones) and no select is made.
template <int N, bool KEY_ROWS, bool SELECT = true>
__device__ __forceinline__ void kpt_bwd_probs(const kpt_args &A, const kpt_uniform &U, int b, int h,
                                              int row0, int col0, u32 keep,
                                              float (&S)[N / 8][4], float (&D)[N / 8][4],
                                              const float *lse_col, const float *lse_row, int lane)
{
#pragma unroll
    for (int n = 0; n < N / 8; n++) {
        // the column pair's LSE at once; every exponential is taken and dropped pairs selected
        // to 0 after: with the exponential (and its LSE load) under the keep bit, NVVM made a
        // branch of each of the 32 and loaded each column's LSE twice
        const float2 lc = KEY_ROWS ? *(const float2 *)(lse_col + n * 8 + (lane & 3) * 2)
                                   : make_float2(0.0f, 0.0f);
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int r = row0 + (lane >> 2) + (e >> 1) * 8;
            const int c = n * 8 + (lane & 3) * 2 + (e & 1);
            const int qi = KEY_ROWS ? col0 + c : r, ki = KEY_ROWS ? r : col0 + c;
            const float lse = KEY_ROWS ? ((e & 1) ? lc.y : lc.x) : lse_row[e >> 1];
#if KPT_HAS_SCORE || !KPT_WGMMA
            float x = S[n][e] * A.scale;
#if KPT_HAS_SCORE
            x = kpt_score_grad(A, U, x, b, h, qi, ki, D[n][e]);
#else
            (void)qi, (void)ki;
#endif
            const float p = kpt_ex2(x * KPT_LOG2E - lse);
#else // the scale and log2(e) one factor, as the forward's: an FFMA a score, not two operations
      // (sm_90a only: in the mma.sync kernels ptxas then spilled, document D = 64 4 bytes)
            (void)qi, (void)ki;
            const float p = kpt_ex2(S[n][e] * A.scale_log2 - lse);
#endif
            S[n][e] = !SELECT || (keep >> (n * 4 + e)) & 1 ? p : 0.0f;
        }
    }
}

// x * d s'/d s for a pair of probability p (0 for dropped pairs). Where the derivative may be
// infinite or NaN at a finite score (KPT_DS_FINITE 0, compiler/analyze_range.c), dropped pairs
// are kept at 0 instead of 0 * inf; otherwise that select, two instructions a pair, is left out.
__device__ __forceinline__ float kpt_times_ds(float p, float x, float d)
{
    return KPT_DS_FINITE || p != 0.0f ? x * d : 0.0f;
}

// P times d s'/d s, in place, for kpt_bwd_ds<..., false>: folded in as soon as P's A fragments
// are made, D's registers are free while the products that follow are in flight.
template <int N>
__device__ __forceinline__ void kpt_bwd_fold(float (&S)[N / 8][4], const float (&D)[N / 8][4])
{
#pragma unroll
    for (int n = 0; n < N / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            S[n][e] = kpt_times_ds(S[n][e], S[n][e], D[n][e]);
}

// dS = P (dP - delta) (times d s'/d s where WITH_D, the default with a score mod; without, P
// may hold the product already: kpt_bwd_fold), in place over P; the scale is applied when dQ and
// dK are stored. delta of the element's query as lse in kpt_bwd_probs.
template <int N, bool KEY_ROWS, bool WITH_D = KPT_HAS_SCORE>
__device__ __forceinline__ void kpt_bwd_ds(float (&S)[N / 8][4], const float (&dP)[N / 8][4],
                                           const float (&D)[N / 8][4], const float *del_col,
                                           const float *del_row, int lane)
{
#pragma unroll
    for (int n = 0; n < N / 8; n++) {
        const float2 dc = KEY_ROWS ? *(const float2 *)(del_col + n * 8 + (lane & 3) * 2)
                                   : make_float2(0.0f, 0.0f); // the column pair's delta
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const float g =
                S[n][e] * (dP[n][e] - (KEY_ROWS ? ((e & 1) ? dc.y : dc.x) : del_row[e >> 1]));
            S[n][e] = WITH_D ? kpt_times_ds(S[n][e], g, D[n][e]) : g;
        }
    }
}

#if KPT_AUX_GRADS
// Pairs of a warp's (s, g) staged in shared memory at a time by kpt_bwd_aux: the twin of
// KPT_BWD_AUX_CHUNK in compiler/plan_tiles_cuda.c, which plans KPT_WARPS * this * 32 float2.
#define KPT_AUX_CHUNK 8

// The CTA's table (kpt_daux_tab), after the warps' staging (plan_tiles_cuda.c plans both).
__device__ __forceinline__ kpt_daux_tab *kpt_daux_table(float2 *stage0)
{
    return (kpt_daux_tab *)(stage0 + KPT_WARPS * KPT_AUX_CHUNK * 32);
}

// The aux gradients of a 16 x N block of kpt_bwd_dkdv (keys are rows, layout as kpt_bwd_probs):
// X the raw scores, P the probabilities, dP = dO V^T, del_col the queries' delta; `stage` this
// warp's KPT_AUX_CHUNK * 32 float2 of shared memory. The pairs' (s, g) go through `stage`
// KPT_AUX_CHUNK at a time and kpt_aux_grads runs in a loop that is not unrolled: inlined once
// per pair, its loads and scatters (a warp vote, shuffles and atomics each) made kpt_bwd_dkdv
// thousands of instructions long, spilled it (a 1.7 KB stack frame at sm_90a for Graphormer's
// edge encoding) and took ptxas tens of seconds; a loop over registers would index the
// accumulators dynamically and put them in local memory.
template <int N>
__device__ __forceinline__ void kpt_bwd_aux(const kpt_args &A, const kpt_uniform &U,
                                            const kpt_gargs &G, int b, int h, int row0, int col0,
                                            const float (&X)[N / 8][4], const float (&P)[N / 8][4],
                                            const float (&dP)[N / 8][4], const float *del_col,
                                            float2 *stage, kpt_daux_tab *dt, int lane)
{
    constexpr int PAIRS = N / 2;
    static_assert(PAIRS % KPT_AUX_CHUNK == 0, "whole chunks");
#pragma unroll 1
    for (int c0 = 0; c0 < PAIRS; c0 += KPT_AUX_CHUNK) {
        __syncwarp();
#pragma unroll
        for (int t = 0; t < PAIRS; t++) {
            const int n = t / 4, e = t % 4, c = n * 8 + (lane & 3) * 2 + (e & 1);
            if (t >= c0 && t < c0 + KPT_AUX_CHUNK) {
                const float g = P[n][e] * (dP[n][e] - del_col[c]);
                stage[(t - c0) * 32 + lane] =
                    make_float2(X[n][e] * A.scale, P[n][e] != 0.0f ? g : 0.0f);
            }
        }
        __syncwarp();
#pragma unroll 1
        for (int i = 0; i < KPT_AUX_CHUNK; i++) {
            const int t = c0 + i, n = t / 4, e = t % 4;
            const int c = n * 8 + (lane & 3) * 2 + (e & 1);
            const int ki = row0 + (lane >> 2) + (e >> 1) * 8;
            const float2 sg = stage[i * 32 + lane];
            kpt_aux_grads(A, U, G, dt, sg.x, b, h, col0 + c, ki, sg.y);
        }
    }
}
#endif

#if !KPT_WGMMA // the sm_90a kernels follow in attention_bwd_sm90.cu
#define KPT_BWD_ROWS ((1 + KPT_STAGES) * KPT_BM * (KPT_QSTR + KPT_VSTR)) // the kernels' tiles
// Past head dim 128 the CTA has eight warps (compiler/plan_tiles_cuda.c) in two parts: warps w
// and w + 4 own the same 16 rows, each accumulates its part of the gradient's columns (dK and
// dV, or dQ: all of them would take all 255 registers), and each computes the scores and dP of
// those rows over its part of the head dim, the pair's halves then summed (kpt_bwd_pair_sum).
#define KPT_BWD_PARTS (KPT_WARPS / 4)
#define KPT_BWD_KC (KPT_DQK / KPT_BWD_PARTS) // dK's (dQ's) columns a part; Q's and K's too
#define KPT_BWD_VC (KPT_DV / KPT_BWD_PARTS)  // dV's; dO's and V's
#define KPT_BWD_XH 16                        // floats a thread of kpt_bwd_pair_sum's rounds
static_assert(KPT_WARPS % 4 == 0 && KPT_BM == 64 && KPT_BN == 64, "four warps of 16 rows a part");
static_assert(KPT_BWD_KC % 16 == 0 && KPT_BWD_VC % 16 == 0, "whole 16-column blocks a part");

// C = the sum of the C of this warp and of its pair's other warp (two parts; nothing with one),
// the same bits in both (float addition commutes), through x: KPT_BWD_XH floats a thread, a
// round per KPT_BWD_XH elements, the pair meeting on named barrier 1 + warp % 4. x takes
// KPT_WARPS * 32 * KPT_BWD_XH floats (16 KB; one 32-float round would not leave sm_80's 163 KB
// for it).
template <int N>
__device__ __forceinline__ void kpt_bwd_pair_sum(float (&C)[N / 8][4], float *x, int warp, int lane)
{
    if constexpr (KPT_BWD_PARTS > 1) {
        static_assert(N / 2 % KPT_BWD_XH == 0, "whole rounds");
        const int pair = warp & 3, part = warp >> 2;
        float *mine = x + (pair * 2 + part) * KPT_BWD_XH * 32 + lane;
        const float *theirs = x + (pair * 2 + 1 - part) * KPT_BWD_XH * 32 + lane;
#pragma unroll
        for (int r = 0; r < N / 2; r += KPT_BWD_XH) {
            // the other warp has read the previous round (or product) before x is written
            asm volatile("bar.sync %0, 64;" ::"r"(1 + pair) : "memory");
#pragma unroll
            for (int i = 0; i < KPT_BWD_XH; i++) mine[i * 32] = C[(r + i) / 4][(r + i) % 4];
            asm volatile("bar.sync %0, 64;" ::"r"(1 + pair) : "memory");
#pragma unroll
            for (int i = 0; i < KPT_BWD_XH; i++) C[(r + i) / 4][(r + i) % 4] += theirs[i * 32];
        }
    } else {
        (void)C, (void)x, (void)warp, (void)lane;
    }
}

// Where kpt_bwd_dkdv's and kpt_bwd_dq's steps find their tiles (stage st of the streamed pair)
// and row vectors, and this warp's place (wrow: its 16 rows; part: its columns).
struct kpt_bwd_at {
    u32 sK, sV, sQ, sO;
    const float *lse, *del; // kpt_bwd_dkdv: the q tile's, shared
    float *x;               // kpt_bwd_pair_sum's exchange
    int wrow, part, warp, lane;
};

// C = A B^T for this warp's 16 rows of A (rows at sA, stride ASTR) against the N rows of B (at sB,
// stride BSTR), over the head dim D: this warp's part of D, then the pair's parts summed (with
// one part, all of D).
template <int N, int D, int ASTR, int BSTR>
__device__ __forceinline__ void kpt_bwd_mm_rows(float (&C)[N / 8][4], u32 sA, u32 sB,
                                                const kpt_bwd_at &w)
{
    constexpr int DC = D / KPT_BWD_PARTS;
    kpt_mm_abt<N, DC, ASTR, BSTR, true>(C, sA + (w.wrow * ASTR + w.part * DC) * 2,
                                        sB + w.part * DC * 2, w.lane);
    kpt_bwd_pair_sum<N>(C, w.x, w.warp, w.lane);
}

// The opening of both steps: this warp's 16 rows of the tile pair (q tile q0, kv tile k0, class
// cls) — key rows for kpt_bwd_dkdv (KR), query rows for kpt_bwd_dq — against its N columns: the
// pairs a partial tile keeps, the scores, then the probabilities in place and D = d s'/d s (LSE
// by column or by row, as kpt_bwd_probs).
template <int N, bool KR>
__device__ __forceinline__ void kpt_bwd_p(const kpt_args &A, const kpt_uniform &U,
                                          const kpt_bwd_at &w, int b, int h, int q0, int k0,
                                          int cls, const float *lse_col, const float *lse_row,
                                          float (&S)[N / 8][4], float (&D)[N / 8][4])
{
    const bool partial = cls != 2 || k0 + KPT_BN > A.Skv || q0 + KPT_BM > A.Sq;
    const int row0 = (KR ? k0 : q0) + w.wrow, col0 = KR ? q0 : k0;
    const u32 keep = partial ? kpt_bwd_keep<N, KR>(A, U, b, h, row0, col0, w.lane) : ~0u;
    if constexpr (KR) // S^T = K Q^T
        kpt_bwd_mm_rows<N, KPT_DQK, KPT_KSTR, KPT_QSTR>(S, w.sK, w.sQ, w);
    else // S = Q K^T
        kpt_bwd_mm_rows<N, KPT_DQK, KPT_QSTR, KPT_KSTR>(S, w.sQ, w.sK, w);
    kpt_bwd_probs<N, KR>(A, U, b, h, row0, col0, keep, S, D, lse_col, lse_row, w.lane);
}

// One step of kpt_bwd_dkdv: its 64 keys (k0) against q tile qt (class cls) of head h; with the
// aux gradients' terms where AUXG (see kpt_bwd_dkdv_run).
template <bool AUXG>
__device__ __forceinline__ void kpt_bwd_dkdv_step(const kpt_args &A, const kpt_gargs &G,
                                                  const kpt_uniform &U, const kpt_bwd_at &w,
                                                  float2 *aux, int b, int h, int qt, int cls,
                                                  int k0, float (&dK)[KPT_BWD_KC / 8][4],
                                                  float (&dV)[KPT_BWD_VC / 8][4])
{
    const int q0 = qt * KPT_BM, wrow = w.wrow, part = w.part, lane = w.lane;
    float S[KPT_BM / 8][4], D[KPT_BM / 8][4]; // P^T; d s'/d s (with a score mod)
    kpt_bwd_p<KPT_BM, true>(A, U, w, b, h, q0, k0, cls, w.lse, nullptr, S, D);
    // dV += P^T dO (this part's columns)
    kpt_mm_pb<KPT_BWD_VC, KPT_BM, KPT_VSTR>(dV, S, w.sO + part * KPT_BWD_VC * 2, lane);
    // dP^T = V dO^T
    float dP[KPT_BM / 8][4];
    kpt_bwd_mm_rows<KPT_BM, KPT_DV, KPT_VSTR, KPT_VSTR>(dP, w.sV, w.sO, w);
#if KPT_AUX_GRADS
    if (AUXG && G.daux_on && part == 0) { // S^T once more: the scores are gone, and kept they cost
                                  // registers (one part: each term once)
        float X[KPT_BM / 8][4];
        kpt_mm_abt<KPT_BM, KPT_DQK, KPT_KSTR, KPT_QSTR, true>(X, w.sK + wrow * KPT_KSTR * 2, w.sQ,
                                                              lane);
        kpt_bwd_aux<KPT_BM>(A, U, G, b, h, k0 + wrow, q0, X, S, dP, w.del,
                            aux + w.warp * KPT_AUX_CHUNK * 32, kpt_daux_table(aux), lane);
    }
#else
    (void)aux;
#endif
    // dS^T
    kpt_bwd_ds<KPT_BM, true>(S, dP, D, w.del, nullptr, lane);
    // dK += dS^T Q
    kpt_mm_pb<KPT_BWD_KC, KPT_BM, KPT_QSTR>(dK, S, w.sQ + part * KPT_BWD_KC * 2, lane);
}

// One step of kpt_bwd_dq: its q tile (q0, this thread's rows' LSE and delta) against kv tile
// j (class cls).
__device__ __forceinline__ void kpt_bwd_dq_step(const kpt_args &A, const kpt_uniform &U,
                                                const kpt_bwd_at &w, const float (&lse)[2],
                                                const float (&del)[2], int b, int h, int q0,
                                                int j, int cls, float (&dQ)[KPT_BWD_KC / 8][4])
{
    const int k0 = j * KPT_BN, part = w.part, lane = w.lane;
    float S[KPT_BN / 8][4], D[KPT_BN / 8][4]; // P; d s'/d s (with a score mod)
    kpt_bwd_p<KPT_BN, false>(A, U, w, b, h, q0, k0, cls, nullptr, lse, S, D);
    float dP[KPT_BN / 8][4];
    kpt_bwd_mm_rows<KPT_BN, KPT_DV, KPT_VSTR, KPT_VSTR>(dP, w.sO, w.sV, w);
    kpt_bwd_ds<KPT_BN, false>(S, dP, D, nullptr, del, lane);
    // dQ += dS K
    kpt_mm_pb<KPT_BWD_KC, KPT_BN, KPT_KSTR>(dQ, S, w.sK + part * KPT_BWD_KC * 2, lane);
}

#if KPT_STAGES > 1
// The next live q tile of kpt_bwd_dkdv's walk after (h, qt) (qt = -1: the first): the group's
// heads one after another, each head's q tiles in order; false past the last.
__device__ __forceinline__ bool kpt_bwd_next_q(const kpt_args &A, int b, int hk, int kt, int &h,
                                               int &qt, int &cls)
{
    for (;;) {
        if (++qt == A.n_qt) {
            qt = 0;
            if (++h == (hk + 1) * A.group)
                return false;
        }
#if KPT_HAS_MASK
        const int q0 = qt * KPT_BM;
        cls = kpt_tile_class(A, b, h, qt, q0, min(q0 + KPT_BM, A.Sq) - 1, kt);
        if (cls != 0)
            return true;
#else
        cls = 2;
        return true;
#endif
    }
}
#endif

// Both kernels keep one pair of tiles (K and V, or Q and dO) and stream the other through
// KPT_STAGES stages: one, loaded once the previous step is done (at head dims up to 128 three
// CTAs an SM hide the copies), or two where shared memory holds them (compiler/
// plan_tiles_cuda.c), the next live tile's copies issued before the current one is computed.
// Per stage: Q then dO, or K then V; then the stages' row vectors (LSE and delta of
// kpt_bwd_dkdv's q tiles), the pair exchange, the aux staging.
#define KPT_BWD_TILE (KPT_BM * (KPT_QSTR + KPT_VSTR)) // elements of a Q and dO (or K and V) pair
static_assert(KPT_BM == KPT_BN && KPT_QSTR == KPT_KSTR, "the kernels' pairs of tiles have one size");
static_assert(KPT_BWD_ROWS % 4 == 0, "kpt_bwd_probs reads LSE and delta in pairs");
static_assert(KPT_BM <= KPT_THREADS, "a row vector's element a thread");

// AUXG: the aux gradients' terms are compiled in (the entry kpt_bwd_dkdv_aux, for calls that
// ask for them); their code beside the main path's made ptxas spill more in it (t5_buckets at
// D = 128: 340 bytes against 64) even when no call asked.
template <bool AUXG>
__device__ __forceinline__ void kpt_bwd_dkdv_run(const kpt_args &A, const kpt_gargs &G)
{
    // the dynamic shared memory, named apart from the kernels' kpt_smem (NVRTC warns of the
    // same name declared in a device function and a kernel)
    extern __shared__ __align__(16) unsigned char kpt_smem_kv[];
    const u32 sK = kpt_smem_addr(kpt_smem_kv);
    const u32 sQ0 = sK + KPT_BWD_TILE * 2; // stage s: Q at sQ0 + s * KPT_BWD_TILE * 2, then dO
    float *s_lse = (float *)(kpt_smem_kv + KPT_BWD_ROWS * 2); // stage s: + s * KPT_BM
    float *s_del = s_lse + KPT_STAGES * KPT_BM;
    float *s_x = s_del + KPT_STAGES * KPT_BM; // kpt_bwd_pair_sum's, with two parts
    // kpt_bwd_aux's staging, a share per warp
    float2 *s_aux = (float2 *)(s_x + (KPT_BWD_PARTS > 1 ? KPT_WARPS * 32 * KPT_BWD_XH : 0));

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    kpt_grid_launch(); // kpt_bwd_dq may be scheduled (runtime/cuda_device.c, launch_dependent)
    const int kt = blockIdx.x, hk = blockIdx.y, b = blockIdx.z;
    const int k0 = kt * KPT_BN;
    // this warp's keys in the tile, and its part (a constant 0 with one part)
    const int part = KPT_BWD_PARTS > 1 ? warp >> 2 : 0, wrow = (warp - part * 4) * 16;
    kpt_bwd_at w = {sK, sK + KPT_BN * KPT_KSTR * 2, sQ0, sQ0 + KPT_BM * KPT_QSTR * 2,
                    s_lse, s_del, s_x, wrow, part, warp, lane};
    kpt_load_tile<KPT_BN, KPT_DQK, KPT_KSTR>(w.sK, (const u16 *)A.k + (i64)b * A.ks[0] + (i64)hk * A.ks[1] + (i64)k0 * A.ks[2], A.ks[2], A.Skv - k0);
    kpt_load_tile<KPT_BN, KPT_DV, KPT_VSTR>(w.sV, (const u16 *)A.v + (i64)b * A.vs[0] + (i64)hk * A.vs[1] + (i64)k0 * A.vs[2], A.vs[2], A.Skv - k0);
    kpt_cp_commit();
#if KPT_AUX_GRADS
    if (AUXG) {
        kpt_daux_tab_begin(A, G, kpt_daux_table(s_aux), tid, KPT_THREADS);
        __syncthreads();
    }
#endif

    float dK[KPT_BWD_KC / 8][4], dV[KPT_BWD_VC / 8][4];
    kpt_zero<KPT_BWD_KC>(dK);
    kpt_zero<KPT_BWD_VC>(dV);
    // Q and dO of q tile qt of head h into stage st
    auto load_q = [&](int st, int h, int qt) {
        const int q0 = qt * KPT_BM;
        const u32 sQ = sQ0 + st * KPT_BWD_TILE * 2;
        kpt_load_tile<KPT_BM, KPT_DQK, KPT_QSTR>(
            sQ, (const u16 *)A.q + (i64)b * A.qs[0] + (i64)h * A.qs[1] + (i64)q0 * A.qs[2],
            A.qs[2], A.Sq - q0);
        kpt_load_tile<KPT_BM, KPT_DV, KPT_VSTR>(
            sQ + KPT_BM * KPT_QSTR * 2,
            (const u16 *)G.dout + (i64)b * G.dos[0] + (i64)h * G.dos[1] + (i64)q0 * G.dos[2],
            G.dos[2], A.Sq - q0);
        kpt_cp_commit();
    };
#if KPT_STAGES == 1
    for (int h = hk * A.group; h < (hk + 1) * A.group; h++) {
        kpt_uniform U;
        kpt_uniform_init(A, b, h, U);
        for (int qt = 0; qt < A.n_qt; qt++) {
            const int q0 = qt * KPT_BM;
#if KPT_HAS_MASK
            const int cls = kpt_tile_class(A, b, h, qt, q0, min(q0 + KPT_BM, A.Sq) - 1, kt);
            if (cls == 0) continue;
#else
            const int cls = 2;
#endif
            __syncthreads(); // the previous q tile is done with sQ, sO and the row vectors
            load_q(0, h, qt);
            for (int i = tid; i < KPT_BM; i += KPT_THREADS) {
                s_lse[i] = kpt_lse2(A, b, h, q0 + i);
                s_del[i] = kpt_delta(A, G, b, h, q0 + i);
            }
            kpt_cp_wait<0>();
            __syncthreads();
            kpt_bwd_dkdv_step<AUXG>(A, G, U, w, s_aux, b, h, qt, cls, k0, dK, dV);
        }
    }
#else
    // the next live q tile's copies go out before this one is computed, into the other stage
    // (each step's last barrier frees it), its row vectors through registers
    int h = hk * A.group, qt = -1, cls = 0, st = 0, uh = -1;
    bool live = kpt_bwd_next_q(A, b, hk, kt, h, qt, cls);
    if (live) {
        load_q(0, h, qt);
        if (tid < KPT_BM) {
            s_lse[tid] = kpt_lse2(A, b, h, qt * KPT_BM + tid);
            s_del[tid] = kpt_delta(A, G, b, h, qt * KPT_BM + tid);
        }
    }
    kpt_uniform U;
    while (live) {
        int hn = h, qn = qt, cn = 0;
        const bool more = kpt_bwd_next_q(A, b, hk, kt, hn, qn, cn);
        const int sn = st ^ 1;
        float nl = 0.0f, nd = 0.0f;
        if (more) {
            load_q(sn, hn, qn);
            if (tid < KPT_BM) {
                nl = kpt_lse2(A, b, hn, qn * KPT_BM + tid);
                nd = kpt_delta(A, G, b, hn, qn * KPT_BM + tid);
            }
            kpt_cp_wait<1>(); // all but the next tile's copies: this one's (and K and V)
        } else {
            kpt_cp_wait<0>();
        }
        __syncthreads();
        if (h != uh) {
            kpt_uniform_init(A, b, h, U);
            uh = h;
        }
        w.sQ = sQ0 + st * KPT_BWD_TILE * 2;
        w.sO = w.sQ + KPT_BM * KPT_QSTR * 2;
        w.lse = s_lse + st * KPT_BM;
        w.del = s_del + st * KPT_BM;
        kpt_bwd_dkdv_step<AUXG>(A, G, U, w, s_aux, b, h, qt, cls, k0, dK, dV);
        __syncthreads(); // this stage is read
        if (more && tid < KPT_BM) {
            s_lse[sn * KPT_BM + tid] = nl;
            s_del[sn * KPT_BM + tid] = nd;
        }
        h = hn, qt = qn, cls = cn, st = sn, live = more;
    }
#endif
    kpt_cp_wait<0>();
#if KPT_AUX_GRADS
    if (AUXG) {
        __syncthreads();
        kpt_daux_tab_end(A, G, kpt_daux_table(s_aux), tid, KPT_THREADS);
    }
#endif
    kpt_store_acc<KPT_BWD_KC>(dK, (u16 *)G.dk + (i64)b * G.dks[0] + (i64)hk * G.dks[1] +
                                      part * KPT_BWD_KC, G.dks[2], k0 + wrow, A.Skv, A.scale, lane);
    kpt_store_acc<KPT_BWD_VC>(dV, (u16 *)G.dv + (i64)b * G.dvs[0] + (i64)hk * G.dvs[1] +
                                      part * KPT_BWD_VC, G.dvs[2], k0 + wrow, A.Skv, 1.0f, lane);
}

extern "C" __global__ void __launch_bounds__(KPT_THREADS) kpt_bwd_dkdv(const kpt_args A, const kpt_gargs G)
{
    kpt_bwd_dkdv_run<false>(A, G);
}

#if KPT_AUX_GRADS
extern "C" __global__ void __launch_bounds__(KPT_THREADS) kpt_bwd_dkdv_aux(const kpt_args A, const kpt_gargs G)
{
    kpt_bwd_dkdv_run<true>(A, G);
}
#endif

extern "C" __global__ void __launch_bounds__(KPT_THREADS) kpt_bwd_dq(const kpt_args A, const kpt_gargs G)
{
    extern __shared__ __align__(16) unsigned char kpt_smem[];
    const u32 sQ = kpt_smem_addr(kpt_smem);
    const u32 sK0 = sQ + KPT_BWD_TILE * 2; // stage s: K at sK0 + s * KPT_BWD_TILE * 2, then V
    float *s_x = (float *)(kpt_smem + KPT_BWD_ROWS * 2) + 2 * KPT_STAGES * KPT_BM; // as dkdv's

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    kpt_grid_end_after(); // launched as a dependent of kpt_bwd_dkdv, of which it reads nothing
    const int qt = A.n_qt - 1 - (int)blockIdx.x;
    const int h = blockIdx.y, b = blockIdx.z, hk = h / A.group;
    const int q0 = qt * KPT_BM, q1 = min(q0 + KPT_BM, A.Sq) - 1;
    const int part = KPT_BWD_PARTS > 1 ? warp >> 2 : 0, wrow = (warp - part * 4) * 16;
    kpt_bwd_at w = {sK0, sK0 + KPT_BN * KPT_KSTR * 2, sQ, sQ + KPT_BM * KPT_QSTR * 2,
                    nullptr, nullptr, s_x, wrow, part, warp, lane};
    kpt_uniform U;
    kpt_uniform_init(A, b, h, U);
    kpt_load_tile<KPT_BM, KPT_DQK, KPT_QSTR>(w.sQ, (const u16 *)A.q + (i64)b * A.qs[0] + (i64)h * A.qs[1] + (i64)q0 * A.qs[2], A.qs[2], A.Sq - q0);
    kpt_load_tile<KPT_BM, KPT_DV, KPT_VSTR>(w.sO, (const u16 *)G.dout + (i64)b * G.dos[0] + (i64)h * G.dos[1] + (i64)q0 * G.dos[2], G.dos[2], A.Sq - q0);
    kpt_cp_commit();
    const u16 *gK = (const u16 *)A.k + (i64)b * A.ks[0] + (i64)hk * A.ks[1];
    const u16 *gV = (const u16 *)A.v + (i64)b * A.vs[0] + (i64)hk * A.vs[1];
    // K and V of kv tile j into stage st
    auto load_kv = [&](int st, int j) {
        const int k0 = j * KPT_BN;
        const u32 sK = sK0 + st * KPT_BWD_TILE * 2;
        kpt_load_tile<KPT_BN, KPT_DQK, KPT_KSTR>(sK, gK + (i64)k0 * A.ks[2], A.ks[2], A.Skv - k0);
        kpt_load_tile<KPT_BN, KPT_DV, KPT_VSTR>(sK + KPT_BN * KPT_KSTR * 2, gV + (i64)k0 * A.vs[2],
                                                A.vs[2], A.Skv - k0);
        kpt_cp_commit();
    };

    int lo = 0, hi = A.n_kt - 1;
#if KPT_HAS_MASK
    __shared__ int s_lo, s_hi;
    __shared__ unsigned char s_cls[KPT_CLS_CAP];
    kpt_live_tiles(A, b, h, qt, q0, q1, s_cls, &s_lo, &s_hi, lo, hi);
#define KPT_BWD_CLASS(j) kpt_class_of(A, s_cls, b, h, qt, q0, q1, j)
#else
#define KPT_BWD_CLASS(j) 2
#endif
    float lse[2], del[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int qi = q0 + wrow + (lane >> 2) + r * 8;
        lse[r] = kpt_lse2(A, b, h, qi);
        del[r] = kpt_delta(A, G, b, h, qi);
    }
    float dQ[KPT_BWD_KC / 8][4];
    kpt_zero<KPT_BWD_KC>(dQ);
#if KPT_STAGES == 1
    for (int j = lo; j <= hi; j++) {
        const int cls = KPT_BWD_CLASS(j);
        if (cls == 0) continue;
        __syncthreads(); // the previous kv tile is done with sK and sV
        load_kv(0, j);
        kpt_cp_wait<0>();
        __syncthreads();
        kpt_bwd_dq_step(A, U, w, lse, del, b, h, q0, j, cls, dQ);
    }
#else
    // as in kpt_bwd_dkdv: the next live kv tile's copies go out before this one is computed
    auto next_kv = [&](int j) {
        for (j++; j <= hi && KPT_BWD_CLASS(j) == 0; j++) {}
        return j;
    };
    int j = next_kv(lo - 1), st = 0;
    if (j <= hi)
        load_kv(0, j);
    while (j <= hi) {
        const int jn = next_kv(j), sn = st ^ 1;
        if (jn <= hi) {
            load_kv(sn, jn);
            kpt_cp_wait<1>();
        } else {
            kpt_cp_wait<0>();
        }
        __syncthreads();
        w.sK = sK0 + st * KPT_BWD_TILE * 2;
        w.sV = w.sK + KPT_BN * KPT_KSTR * 2;
        kpt_bwd_dq_step(A, U, w, lse, del, b, h, q0, j, KPT_BWD_CLASS(j), dQ);
        __syncthreads(); // this stage is read
        j = jn, st = sn;
    }
#endif
#undef KPT_BWD_CLASS
    kpt_cp_wait<0>();
    kpt_store_acc<KPT_BWD_KC>(dQ, (u16 *)G.dq + (i64)b * G.dqs[0] + (i64)h * G.dqs[1] +
                                      part * KPT_BWD_KC, G.dqs[2], q0 + wrow, A.Sq, A.scale, lane);
}
#endif
