// The sm_90a backward kernels (warpgroup MMA), appended to templates/cuda/attention_bwd.cu by
// codegen/cuda_source.c for cuda:sm_90a in place of its mma.sync kpt_bwd_dkdv and kpt_bwd_dq;
// kpt_bwd_prep, kpt_bwd_dsinks and kpt_bwd_daux are shared.
//
// In the deterministic mode the same split as on sm_80, and so the same guarantee: no float
// atomics, every sum in a fixed order, bitwise reproducible results; by default dq is summed by
// TMA bulk reductions inside kpt_bwd_dkdv instead (below) and kpt_bwd_dq does not run. Tiles are
// 128 x 128 (the plan's bm and bn: tile classes and block maps use them; 64 x 64 with split
// columns past head dim 128, KPT_BWD_SPLIT below, which this overview does not describe). A
// CTA is a producer warpgroup and two consumer warpgroups of 64 rows (KPT_BWD_THREADS = 384;
// setmaxnreg gives the consumers 240 registers), and every product is a wgmma of 64 rows:
//   kpt_bwd_dkdv  one CTA per (128-key tile, kv head, batch row); consumer c owns keys
//                 c * 64 .. + 63, dK and dV in registers, K and V resident in shared memory. A
//                 producer warp walks the live 128-query tiles of the group's heads in halves
//                 of 64 queries ("steps") and streams each step's Q and dO (TMA), LSE and delta
//                 through a ring on mbarriers: S^T = K Q^T and dP^T = V dO^T (both operands
//                 from shared memory), then dV += P^T dO and dK += dS^T Q with P^T and dS^T from
//                 registers (the accumulator layout is the A-fragment layout, as P is in the
//                 forward). Kv tiles go in order but, with a block map, in the grid's last
//                 wave (kpt_bwd_kv_tile).
//   kpt_bwd_dq    one CTA per (128-query tile, head, batch row); consumer c owns queries
//                 c * 64 .. + 63 and dQ in registers, Q and dO resident; K and V of each live
//                 kv tile come through a two-stage TMA ring and are used in halves of 64 keys:
//                 S = Q K^T, dP = dO V^T, dQ += dS K.
// The consumers wait on mbarriers, not on each other (but for the default mode's dS^T swap), so
// one warpgroup's exponentials overlap the other's products. Shared tiles have the layout of
// TMA's 128-byte swizzle (per 64-column block, rows of 128 bytes, 16-byte chunk c of row r
// stored at chunk c ^ (r % 8)); the wgmma descriptors are those of the forward kernel. Each warp
// holds 16 rows of an accumulator in the mma.sync layout, so the masks, score-mod gradients,
// probabilities and stores are attention_bwd.cu's helpers.

// KPT_BWD_SUB (codegen, compiler/plan_tiles.h's KPT_BWD_STEP_ROWS): query rows of a kpt_bwd_dkdv
// step, keys of a kpt_bwd_dq step, the rows of the TMA boxes of Q, dO and the dQ accumulator.
static_assert(KPT_BWD_SUB == 64, "a step is one wgmma of 64 rows");

// Past head dim 128 (KPT_BWD_SPLIT) a warpgroup's 64 rows of dK and dV (or dQ) would take all its
// registers, so the plan's tiles are 64 x 64 and both consumer warpgroups take the CTA's same 64
// rows, warpgroup c the columns c * KPT_BWD_CK .. of dK (dQ) and c * KPT_BWD_CV .. of dV: their
// registers are those of head dim 128. The products that need every column share their rows
// instead: in kpt_bwd_dkdv warpgroup c computes S^T and dP^T for the step's queries c * 32 ..
// + 31 and, through shared memory, both take the whole P^T and dS^T (kpt_bwd_split_step).
// kpt_bwd_dq instead takes two q tiles a CTA, warpgroup c the queries c * 64 .. + 63 and all of
// dQ's columns (kpt_bwd_wide_producer's kernel), or, for masks with a block map, the CTA's 64
// queries and its columns of dQ, with S and dP for a tile's keys c * 32 .. + 31 and the whole dS
// taken as in kpt_bwd_dkdv (kpt_bwd_split_dq). kpt_bwd_dkdv does not sum dQ (plan.dq_tiles = 0).
#define KPT_BWD_SPLIT (KPT_DQK > 128 || KPT_DV > 128)
#define KPT_BWD_CK (KPT_BWD_SPLIT ? KPT_DQK / 2 : KPT_DQK) // dK's (dQ's) columns a warpgroup
#define KPT_BWD_CV (KPT_BWD_SPLIT ? KPT_DV / 2 : KPT_DV)   // dV's
#define KPT_BWD_WROWS (KPT_BWD_SPLIT ? 0 : 64) // consumer c's rows start at c * this
static_assert(KPT_BM == KPT_BN && KPT_BN == (KPT_BWD_SPLIT ? 64 : 128), "the plan's tiles");
static_assert(KPT_BWD_CK % 64 == 0 && KPT_BWD_CV % 64 == 0 && KPT_BWD_CK <= 128 &&
              KPT_BWD_CV <= 128, "a warpgroup's columns: one wgmma of N = 64 or 128");
static_assert(!KPT_BWD_SPLIT || KPT_BWD_DQ_TILES == 0, "no dQ sums with split columns");

// The byte offset of warpgroup c's first column block (of `cols` columns a warpgroup) in a
// swizzled tile of `rows` rows: 0 unless the columns are split.
__device__ __forceinline__ u32 kpt_bwd_cols(int c, int cols, int rows)
{
    return KPT_BWD_SPLIT ? (u32)(c * (cols / 64) * rows * 128) : 0u;
}

// Descriptors of k step kk (16 elements of the reduced dimension) of an operand in a swizzled
// tile of ROWS rows at t: K-major (the reduced dimension along the rows' 128-byte lines), or
// MN-major (the reduced dimension down the rows; the leading byte offset steps over 64-column
// blocks, ROWS * 128 bytes apart).
// (K-major: the base descriptor opaque, so that every k step's is one 64-bit add, kpt_opaque64;
// MN-major operands lost as many instructions as that saved elsewhere, ptxas)
template <int ROWS> __device__ __forceinline__ u64 kpt_desc_k(u32 t, int kk)
{
    const u32 off = (u32)((kk >> 2) * ROWS * 128 + (kk & 3) * 32);
    return kpt_desc_add(kpt_opaque64(kpt_sw128_desc(t, 16, 1024)), off);
}
template <int ROWS> __device__ __forceinline__ u64 kpt_desc_mn(u32 t, int kk)
{
    return kpt_desc_add(kpt_sw128_desc(t, ROWS * 128, 1024), (u32)(kk * 16 * 128));
}

// C (64 x N, N = 64 or 32) = A (64 rows at a, in a tile of RA rows) B^T (N rows at b, in a tile
// of RB rows), both K-major over KD columns; or over k steps K0 .. K1 - 1 of them only (the first
// step of all, kk = 0, starts C afresh). Issued, not committed.
template <int KD, int RA, int RB, int N = 64, int K0 = 0, int K1 = KD / 16>
__device__ __forceinline__ void kpt_bwd_ss(float (&C)[N / 8][4], u32 a, u32 b)
{
    static_assert(N == 64 || N == 32, "m64n64k16 or m64n32k16");
#pragma unroll
    for (int kk = K0; kk < K1; kk++) {
        if (N == 64)
            kpt_wgmma_ss_n64(&C[0][0], kpt_desc_k<RA>(a, kk), kpt_desc_k<RB>(b, kk), kk > 0);
        else
            kpt_wgmma_ss_n32(&C[0][0], kpt_desc_k<RA>(a, kk), kpt_desc_k<RB>(b, kk), kk > 0);
    }
}

// C (64 x N) += F (64 x 64, registers: A fragments) B (64 rows at b, MN-major, in a tile of RB
// rows). Issued, not committed.
template <int N, int RB>
__device__ __forceinline__ void kpt_bwd_rs(float (&C)[N / 8][4], const u32 (&F)[4][4], u32 b)
{
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
        if (N == 128)
            kpt_wgmma_rs_n128(&C[0][0], F[kk], kpt_desc_mn<RB>(b, kk));
        else
            kpt_wgmma_rs_n64(&C[0][0], F[kk], kpt_desc_mn<RB>(b, kk), 1);
    }
}

#if KPT_BWD_SPLIT
// C (64 x N) += A (the 64 x 64 tile at a, K-major: P^T, dS^T or dS from kpt_bwd_put_frags)
// B (64 rows at b, MN-major, in a tile of RB rows). Issued, not committed.
template <int N, int RB>
__device__ __forceinline__ void kpt_bwd_ts(float (&C)[N / 8][4], u32 a, u32 b)
{
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
        if (N == 128)
            kpt_wgmma_ss_n128<0, 1>(&C[0][0], kpt_desc_k<64>(a, kk), kpt_desc_mn<RB>(b, kk), 1);
        else
            kpt_wgmma_ss_n64<0, 1>(&C[0][0], kpt_desc_k<64>(a, kk), kpt_desc_mn<RB>(b, kk), 1);
    }
}
#define KPT_BWD_PT (64 * 64 * 2) // a 64 x 64 tile of P^T, dS^T or dS (16-bit)
#endif

// ---- dK, dV (and dQ by bulk reductions) --------------------------------------------------------
//
// Unless the launch asks for determinism, kpt_bwd_dkdv also adds each step's dQ = dS K into an
// f32 accumulator in global memory (G.dqacc; kpt_bwd_dq_store converts it) and kpt_bwd_dq does
// not run: five products a pair instead of seven. The warpgroups' dS^T (bf16, the A fragments
// of dK += dS^T Q) go to shared memory, swizzled; the whole 128-key dS times K's 64-column
// blocks, by one warpgroup a step or each warpgroup its block (kpt_bwd_dq_add), and the TMA adds
// the 64 x 64 results to the accumulator. The order of the additions varies run to run.

// A step of kpt_bwd_dkdv: 64 queries (q0 on) of head h. Steps go head by head, q tile by q tile,
// half by half, skipping the q tiles whose class is 0 and the halves of partial tiles with
// stored bits that keep nothing (kpt_bits_halves). tile: 2 full, 1 partial, 3 + s partial with
// its keep bits stored in slot s (plan.mask_bits).
struct kpt_bwd_step {
    int h, qt, half, tile;
};

#if KPT_MASK_BITS
// The stored keep bits of partial tile (qt, kt) for kpt_blockmap_bits: row block blk's words in
// kpt_bwd_dkdv's layout (KR: S^T, key rows; the bits of kpt_bwd_keep for each 64-query half of
// the q tile) or kpt_bwd_dq's (query rows, each 64-key half of the kv tile), the first half in
// the low half of the word.
static_assert(KPT_BM == 2 * KPT_BWD_SUB && KPT_BN == KPT_BM, "a tile is two steps");
template <bool KR>
__device__ __forceinline__ u64 kpt_tile_bits(const kpt_args &A, const kpt_uniform &U, int b,
                                             int h, int qt, int kt, int blk, int lane)
{
    const int r0 = (KR ? kt : qt) * KPT_BM + blk * 16, c0 = (KR ? qt : kt) * KPT_BM;
    return (u64)kpt_bwd_keep<KPT_BWD_SUB, KR>(A, U, b, h, r0, c0, lane) |
           (u64)kpt_bwd_keep<KPT_BWD_SUB, KR>(A, U, b, h, r0, c0 + KPT_BWD_SUB, lane) << 32;
}
#endif

// The live halves of the tile with stored bits in slot (kpt_bits_halves): 3 where none are stored.
__device__ __forceinline__ int kpt_bwd_halves(const kpt_args &A, bool kr, int slot)
{
#if KPT_MASK_BITS
    return slot >= 0 ? *kpt_bits_halves(A, kr, slot) : 3;
#else
    (void)A, (void)kr, (void)slot;
    return 3;
#endif
}

// The producer warp's walk over the q tiles: its lanes classify 32 q tiles of a head at once (one
// each) and the steps go through the live ones. (Walked one tile at a time, a class a step, a CTA
// of a sparse pattern waited for ~a hundred dependent classes, block-map loads or interval code,
// before its first step: a sliding window's kv tile skips every q tile before its window.)
struct kpt_bwd_walk {
    int h, base;    // the head and the first q tile of the chunk
    u32 live, full; // bit i: q tile base + i is live, full (live bits are cleared as walked)
    u32 part;       // bit i: q tile base + i is partial
    int slot;       // the stored keep bits of the chunk's first partial tile, or -1
};

// The classes of q tiles base .. base + 31 of head w.h against kv tile kt.
__device__ __forceinline__ void kpt_bwd_chunk(const kpt_args &A, int b, int kt, kpt_bwd_walk &w,
                                              int lane)
{
    const int qt = w.base + lane;
#if KPT_HAS_MASK
    const int t = min(qt, A.n_qt - 1), q0 = t * KPT_BM; // every lane classifies: no divergence
    const int c =
        qt < A.n_qt ? kpt_tile_class(A, b, w.h, t, q0, min(q0 + KPT_BM, A.Sq) - 1, kt) : 0;
    w.live = __ballot_sync(0xffffffffu, c != 0);
    w.full = __ballot_sync(0xffffffffu, c == 2);
#else
    (void)b, (void)kt;
    w.live = w.full = __ballot_sync(0xffffffffu, qt < A.n_qt);
#endif
    w.part = w.live & ~w.full;
}

// The step after s (s.h < 0: the first; s.h past the group's last head: none is left). The
// current q tile is the lowest bit of w.live.
__device__ __forceinline__ void kpt_bwd_next(const kpt_args &A, int b, int hk, int kt,
                                             kpt_bwd_walk &w, kpt_bwd_step &s, int lane)
{
    if (s.h >= 0) {
        // (the live halves read again rather than kept: the producer has 24 registers)
        if (s.half + 1 < KPT_BM / KPT_BWD_SUB &&
            s.qt * KPT_BM + (s.half + 1) * KPT_BWD_SUB < A.Sq &&
            (kpt_bwd_halves(A, true, s.tile - 3) >> (s.half + 1) & 1)) {
            s.half++;
            return;
        }
        w.live &= w.live - 1;
    }
    while (w.live == 0) {
        w.base += 32;
        w.slot += w.slot >= 0 ? __popc(w.part) : 0;
        if (w.base >= A.n_qt) {
            w.base = 0;
            if (++w.h >= (hk + 1) * A.group) {
                s.h = w.h;
                return;
            }
            w.slot = kpt_bits_base(A, true, b, w.h, kt);
        }
        kpt_bwd_chunk(A, b, kt, w, lane);
    }
    const int i = __ffs(w.live) - 1;
    const bool full = (w.full >> i) & 1;
    const int slot = !full && w.slot >= 0 ? w.slot + __popc(w.part & ((1u << i) - 1)) : -1;
    s = {w.h, w.base + i, kpt_bwd_halves(A, true, slot) & 1 ? 0 : 1,
         full ? 2 : slot >= 0 ? 3 + slot : 1};
}

// Which pairs of this thread's 16 x 64 block are kept: rows row0 on (keys with KR, kpt_bwd_dkdv's
// S^T; else queries), columns col0 on, half `half` of its tile's columns. The stored bits of a
// partial tile that has them (slot >= 0), else kpt_bwd_keep's (all where nothing is dropped: a
// full tile inside both lengths).
template <bool KR>
__device__ __forceinline__ u32 kpt_bwd_tile_keep(const kpt_args &A, const kpt_uniform &U, int b,
                                                 int h, int row0, int col0, int half, int slot,
                                                 bool partial, int lane)
{
#if KPT_MASK_BITS
    if (slot >= 0)
        return (u32)(kpt_bits_word(A, KR, slot, (row0 % KPT_BM) >> 4, lane) >> (32 * half));
#else
    (void)half, (void)slot;
#endif
    return partial ? kpt_bwd_keep<KPT_BWD_SUB, KR>(A, U, b, h, row0, col0, lane) : ~0u;
}

// A step's probabilities (kpt_bwd_probs of its 64 x 64 block; KEY_ROWS: kpt_bwd_dkdv's S^T). A
// full tile's without the keep bits' selects where the code of both is small (no score mod): 32
// selects and the bits' moves a step, skipped by a uniform branch on the step's partial flag.
template <bool KEY_ROWS>
__device__ __forceinline__ void kpt_bwd_step_probs(const kpt_args &A, const kpt_uniform &U, int b,
                                                   int h, int row0, int col0, u32 keep,
                                                   bool partial, float (&S)[8][4],
                                                   float (&D)[8][4], const float *lse_col,
                                                   const float *lse_row, int lane)
{
    if (KPT_HAS_SCORE || partial)
        kpt_bwd_probs<KPT_BWD_SUB, KEY_ROWS>(A, U, b, h, row0, col0, keep, S, D, lse_col,
                                             lse_row, lane);
    else
        kpt_bwd_probs<KPT_BWD_SUB, KEY_ROWS, false>(A, U, b, h, row0, col0, keep, S, D, lse_col,
                                                    lse_row, lane);
}

// This warp's 16 x N block of A fragments (rows r0 on, columns c0 on: dS^T or P^T) into a swizzled
// tile of 64 columns at t (16-bit elements, rows of 128 bytes), the operand layout of wgmma.
// (Every caller's t is 1024-byte aligned, r0 a multiple of 16 and c0 of 8, so a thread's rows
// have row % 8 == lane / 4 and a store's 16-byte chunk, (c0 + kk * 16 + (i / 2) * 8) / 8 < 8, is
// a constant: the swizzle is one XOR of the chunk into a base that holds lane / 4 in its bits 4-6,
// instead of ptxas's ~3 instructions of address a store.)
template <int N>
__device__ __forceinline__ void kpt_bwd_put_frags(u32 t, const u32 (&E)[N / 16][4], int r0, int c0,
                                                  int lane)
{
    const u32 base = t + (u32)((r0 + (lane >> 2)) * 128 + ((lane >> 2) << 4) + (lane & 3) * 4);
#pragma unroll
    for (int kk = 0; kk < N / 16; kk++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const u32 chunk = (u32)((c0 >> 3) + kk * 2 + (i >> 1));
            const u32 a = (base ^ (chunk << 4)) + (u32)(i & 1) * 8 * 128;
            asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(a), "r"(E[kk][i]) : "memory");
        }
}

// The TMA tensor maps of both kernels: Q and dO in boxes of KPT_BWD_SUB rows, K and V in boxes
// of KPT_BN rows (64 columns each, 128-byte swizzle), the f32 dQ accumulator (G.dqacc, [B, Hq,
// Sq, Dqk]; unset in the deterministic mode) in boxes of 32 columns x KPT_BWD_SUB rows, dK and
// dV in boxes of 64 rows (kpt_bwd_dkdv's stores), and per tensor the factors of the head and
// batch coordinates, as the forward's kpt_tma. Host twin: kpt_kernel_bwd_tma in
// runtime/cuda_tma.h.
struct kpt_bwd_tma {
    kpt_tmap q, o, k, v, dq, dk, dv;
    int hq, bq, ho, bo, hk, bk, hv, bv, hdk, bdk, hdv, bdv;
};
static_assert(sizeof(kpt_bwd_tma) == 960, "kpt_bwd_tma layout");

#define KPT_BWD_DQB (KPT_BWD_SUB * 64 * 4) // a warpgroup's dQ tile (64 columns, f32)

// dQ (rows q0 on, of head h) += dS K for step i: dS^T of both warpgroups at tDS, K resident at
// sK; the 64-column blocks of dQ go to staging tiles at sDQ in the layout of T.dq's boxes (two
// of 32 columns, 128-byte swizzle), and a warpgroup's first thread hands them to the TMA, which
// adds them to the accumulator in global memory (cp.reduce.async.bulk.tensor). Two schemes:
// - KPT_BWD_DQ_ONE: one warpgroup a step (i's parity) computes all of dQ, a block at a time (two
//   in flight take too many registers), into the two staging tiles it owns. The other only
//   arrives at the step's barrier (named 7 + (i & 1): one that runs ahead arrives at the next
//   step's) and goes on with its next step, so the warpgroups drift apart and the tensor cores
//   stop draining at every step's end (H200, bf16, 16k, kpt_bwd_dkdv: full 10031 -> 9884 us,
//   causal 4999 -> 4906, GQA causal 10121 -> 9988; full 4k 2593 -> 2546). Its first thread
//   waits for its last reduction's read (two steps back) before the barrier.
// - else warpgroup c < KPT_DQK / 64 computes block c into staging tile i % KPT_BWD_DQ_TILES, the
//   first threads waiting before the barrier until the tile this step writes has been read. For
//   one staging tile (codegen's KPT_BWD_DQ_TILES, the plan's dq_tiles: patterns with aux data
//   or a block map), where the one-warpgroup scheme's reads waited in line (document 3706 ->
//   4165 us), and where the consumers take turns (plan.dkdv_turns), which keep them in step.
// (The threads adding their products with red.global.add.v2.f32 instead spent ~15 % of their
// time on it, the reductions waiting for the memory pipeline: H100, bf16, D = 128, 16k, full.)
#if KPT_BWD_DQ_TILES
#define KPT_BWD_DQ_ONE (KPT_BWD_DQ_TILES == 2 && !KPT_BWD_DKDV_TURNS)
__device__ __forceinline__ void kpt_bwd_dq_add(const kpt_bwd_tma &T, int b, int h, int q0,
                                               u32 tDS, u32 sK, u32 sDQ, int c, int cw, int lane,
                                               u32 i)
{
    static_assert(KPT_DQK <= 128, "dQ's blocks of 64 columns: two staging tiles");
    constexpr int NB = KPT_DQK / 64;
    constexpr bool one = KPT_BWD_DQ_ONE;
    const bool lead = (cw & 3) == 0 && lane == 0; // this warpgroup's first thread
    const int id = one ? 7 + (int)(i & 1) : 1;
    kpt_fence_proxy_async();
    if (one && c != (int)(i & 1)) {
        kpt_bar_arrive(id, KPT_THREADS);
        return;
    }
    if (lead)
        kpt_bulk_wait<one ? 0 : KPT_BWD_DQ_TILES - 1, true>();
    kpt_bar_sync(id, KPT_THREADS);
    if (!one && c >= NB)
        return;
    const int m0 = one ? 0 : c, m1 = one ? NB : c + 1; // its blocks
    const u32 t0 = sDQ + (one ? 2 * c : c + 2 * (int)(i % KPT_BWD_DQ_TILES)) * KPT_BWD_DQB;
#pragma unroll
    for (int m = m0; m < m1; m++) {
        float Q[8][4];
        kpt_wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < KPT_BN / 16; kk++)
            kpt_wgmma_ss_n64<1, 1>(&Q[0][0], kpt_desc_mn<64>(tDS, kk),
                                   kpt_desc_mn<KPT_BN>(sK + m * KPT_BN * 128, kk), kk > 0);
        kpt_wgmma_commit();
        kpt_wgmma_wait<0>();
        kpt_wgmma_regs<32>(&Q[0][0]);
        const u32 t = t0 + (m - m0) * KPT_BWD_DQB;
        // a row's 16-byte chunk (n % 4) * 2 + (lane % 4) / 2, swizzled by the row's
        // (cw % 4) * 16 + lane / 4 + r * 8) % 8 = lane / 4: the chunk's even part is a constant
        // a store, XORed into a base that holds the rest (as kpt_bwd_put_frags)
        const u32 base = t + (u32)(((cw & 3) * 16 + (lane >> 2)) * 128 +
                                   (((lane >> 2) ^ ((lane & 3) >> 1)) << 4) + (lane & 1) * 8);
#pragma unroll
        for (int n = 0; n < 8; n++)
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const u32 a = (base ^ (u32)((n & 3) * 2 << 4)) +
                              (u32)((n >> 2) * KPT_BWD_SUB * 128 + r * 8 * 128);
                asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(a), "f"(Q[n][2 * r]),
                             "f"(Q[n][2 * r + 1])
                             : "memory");
            }
    }
    kpt_fence_proxy_async();
    if ((cw & 3) != 0) {
        kpt_bar_arrive(2 + c, 128);
        return;
    }
    kpt_bar_sync(2 + c, 128);
    if (lane == 0) {
        for (int m = m0; m < m1; m++) {
            const u32 t = t0 + (m - m0) * KPT_BWD_DQB;
            kpt_tma_add(&T.dq, t, m * 64, q0, h, b);
            kpt_tma_add(&T.dq, t + KPT_BWD_SUB * 128, m * 64 + 32, q0, h, b);
        }
        kpt_bulk_commit();
    }
}
#endif

#define KPT_BWD_QB (KPT_BWD_SUB * KPT_DQK * 2) // a stage: Q rows, then dO rows
#define KPT_BWD_STAGE (KPT_BWD_QB + KPT_BWD_SUB * KPT_DV * 2)
#define KPT_BWD_DS (KPT_BN * KPT_BWD_SUB * 2) // a dS^T tile of the default mode's dQ (two)
// after the stages: both dS^T tiles and the warpgroups' dQ staging tiles where dQ is summed; with
// split columns, two pairs of P^T and dS^T tiles (by step parity); else nothing
#if KPT_BWD_SPLIT
#define KPT_BWD_X_SMEM (4 * KPT_BWD_PT)
#else
#define KPT_BWD_X_SMEM (KPT_BWD_DQ_TILES ? 2 * KPT_BWD_DS + 2 * KPT_BWD_DQ_TILES * KPT_BWD_DQB : 0)
#endif

// Ping-pong of the two consumer warpgroups around a step's first products (the forward's,
// attention_sm90.cu): a warpgroup waits for its turn (named barrier id + c, 256 threads) before
// issuing S and dP and gives the other its turn once they are issued, so the other's
// exponentials and dS run under its products. Without turns the warpgroups drift into step and
// their exponentials run side by side, the tensor cores idle: kpt_bwd_dq's step took about
// their sum (H200, bf16, D = 128, 16k, deterministic kpt_bwd_dq: causal 2283 -> 2256 us,
// softcap+causal 3096 -> 2796, full 4835 -> 4666; D = 64 alibi+causal 3687 -> 3374;
// docs/BENCHMARKS.md). kpt_bwd_dkdv takes turns only where the plan says (plan.dkdv_turns:
// a score mod's transcendentals at head dims 128; elsewhere they held it back). Consumer 1 gives
// consumer 0 the first turn before the loop and consumer 0 takes consumer 1's last one after it:
// the arrivals balance, as both take a turn every step. Not with split columns (their steps
// exchange tiles through shared memory instead). `on` is a compile-time constant.
__device__ __forceinline__ void kpt_bwd_turns_open(bool on, int id, int c)
{
    if (on && c == 1)
        kpt_bar_arrive(id, 256);
}
__device__ __forceinline__ void kpt_bwd_turn_wait(bool on, int id, int c)
{
    if (on)
        kpt_bar_sync(id + c, 256);
}
__device__ __forceinline__ void kpt_bwd_turn_give(bool on, int id, int c)
{
    if (on)
        kpt_bar_arrive(id + 1 - c, 256);
}
__device__ __forceinline__ void kpt_bwd_turns_close(bool on, int id, int c)
{
    if (on && c == 0)
        kpt_bar_sync(id, 256);
}

// The CTA of both kernels: a producer warpgroup before the two consumer warpgroups (KPT_THREADS);
// the runtime launches the plan's warps and KPT_BWD_PRODUCER_WARPS (codegen, from
// compiler/plan_tiles.h).
static_assert(KPT_BWD_PRODUCER_WARPS == 4, "the producer is a warpgroup (setmaxnreg)");
#define KPT_BWD_THREADS (KPT_THREADS + KPT_BWD_PRODUCER_WARPS * 32)
#define KPT_BWD_PRODUCER_REGS 24
#define KPT_BWD_CONSUMER_REGS 240

// kpt_bwd_dkdv's mbarriers: K and V in; per stage, its Q, dO, LSE and delta in ("full": the
// producer warp's 32 lanes arrive, lane 0 with the TMA's bytes) and handed back ("empty": every
// consumer thread arrives).
#define KPT_BB_KV 0
#define KPT_BB_F(s) (1 + (s))
#define KPT_BB_E(s) (1 + KPT_STAGES + (s))
#define KPT_BB_N (1 + 2 * KPT_STAGES)

// The producer warp: walks the steps (kpt_bwd_next, tile classes included) and fills the ring,
// each stage with its step (h < 0: none is left), Q and dO by TMA, and LSE and delta by the
// lanes (two rows each). All lanes run the same walk.
__device__ __forceinline__ void kpt_bwd_producer(const kpt_args &A, const kpt_gargs &G,
                                                 const kpt_bwd_tma &T, int b, int hk, int kt,
                                                 u32 bar, u32 sK, u32 sV, u32 sQ, float *s_rv,
                                                 int4 *s_step, int lane)
{
    const int k0 = kt * KPT_BN;
    if (lane == 0) {
        kpt_mbar_expect_tx(bar + 8 * KPT_BB_KV, KPT_BN * (KPT_DQK + KPT_DV) * 2);
        kpt_tma_tile<KPT_BN, KPT_DQK>(sK, &T.k, k0, hk * T.hk, b * T.bk, bar + 8 * KPT_BB_KV);
        kpt_tma_tile<KPT_BN, KPT_DV>(sV, &T.v, k0, hk * T.hv, b * T.bv, bar + 8 * KPT_BB_KV);
    }
    const int h_end = (hk + 1) * A.group;
    kpt_bwd_walk w = {hk * A.group, 0, 0, 0, 0, kpt_bits_base(A, true, b, hk * A.group, kt)};
    kpt_bwd_chunk(A, b, kt, w, lane);
    kpt_bwd_step s = {-1, 0, 0, 0}; // before the first step
    kpt_bwd_next(A, b, hk, kt, w, s, lane);
    for (u32 i = 0;; i++) { // unsigned: the stage and parity are a mask and a shift
        const u32 st = i % KPT_STAGES, f = bar + 8 * KPT_BB_F(st);
        if (i >= KPT_STAGES)
            kpt_mbar_wait(bar + 8 * KPT_BB_E(st), ((i / KPT_STAGES) & 1) ^ 1);
        if (s.h >= h_end) {
            if (lane == 0)
                s_step[st] = make_int4(-1, 0, 0, 0);
            kpt_mbar_arrive(f);
            return;
        }
        const int q0 = s.qt * KPT_BM + s.half * KPT_BWD_SUB;
        float *rv = s_rv + st * 2 * KPT_BWD_SUB;
#pragma unroll
        for (int r = 0; r < KPT_BWD_SUB; r += 32) {
            rv[r + lane] = kpt_lse2(A, b, s.h, q0 + r + lane);
            rv[KPT_BWD_SUB + r + lane] = kpt_delta(A, G, b, s.h, q0 + r + lane);
        }
        if (lane == 0) {
            s_step[st] = make_int4(s.h, s.qt, s.half, s.tile);
            const u32 t = sQ + st * KPT_BWD_STAGE;
            kpt_mbar_expect_tx(f, KPT_BWD_STAGE);
            kpt_tma_tile<KPT_BWD_SUB, KPT_DQK>(t, &T.q, q0, s.h * T.hq, b * T.bq, f);
            kpt_tma_tile<KPT_BWD_SUB, KPT_DV>(t + KPT_BWD_QB, &T.o, q0, s.h * T.ho, b * T.bo, f);
        } else {
            kpt_mbar_arrive(f); // releases this lane's LSE and delta
        }
        kpt_bwd_next(A, b, hk, kt, w, s, lane);
    }
}

#if KPT_BWD_SPLIT
// A kpt_bwd_dkdv step with split columns (KPT_BWD_SPLIT), warpgroup c: S^T and dP^T of the CTA's
// 64 keys against the step's queries q0 + c * 32 .. + 31; its half of P^T into the tile at tP
// and, after a barrier of both warpgroups, dV += P^T dO over all 64 queries for this
// warpgroup's columns, issued before dS is computed; then its half of dS^T into the tile after
// and, after a second barrier, dK += dS^T Q. Leaves the products in flight. Both warpgroups are
// at most a step apart (the barriers), and each waits for its products before the next step,
// so tiles taken by step parity are free when written.
template <bool AUXG>
__device__ __forceinline__ void kpt_bwd_split_step(
    const kpt_args &A, const kpt_uniform &U, const kpt_gargs &G, int b, int h, int krow, int q0,
    bool partial, u32 sK, u32 sV, u32 tQ, u32 tO, u32 cQ, u32 cO, const float *lse,
    const float *del, u32 tP, int c, int cw, int lane, float (&dK)[KPT_BWD_CK / 8][4],
    float (&dV)[KPT_BWD_CV / 8][4], float2 *s_aux)
{
    const int qc = q0 + c * 32; // this warpgroup's queries
    float S[4][4], dP[4][4];
    kpt_wgmma_fence();
    kpt_bwd_ss<KPT_DQK, KPT_BN, KPT_BWD_SUB, 32>(S, sK, tQ + c * 32 * 128);
    kpt_wgmma_commit();
    kpt_bwd_ss<KPT_DV, KPT_BN, KPT_BWD_SUB, 32>(dP, sV, tO + c * 32 * 128);
    kpt_wgmma_commit();
    const u32 keep = partial ? kpt_bwd_keep<32, true>(A, U, b, h, krow, qc, lane) : ~0u;
    kpt_wgmma_wait<1>();
    kpt_wgmma_regs<16>(&S[0][0]);
    float D[4][4]; // d s'/d s (with a score mod)
    kpt_bwd_probs<32, true>(A, U, b, h, krow, qc, keep, S, D, lse + c * 32, nullptr, lane);
    u32 F[2][4];
    kpt_frags<32>(F, S);
    kpt_bwd_put_frags<32>(tP, F, (cw & 3) * 16, c * 32, lane);
    kpt_fence_proxy_async();
    kpt_bar_sync(1, KPT_THREADS); // both halves of P^T are in
    kpt_wgmma_fence();
    kpt_bwd_ts<KPT_BWD_CV, KPT_BWD_SUB>(dV, tP, tO + cO);
    kpt_wgmma_commit();
    constexpr bool fold = KPT_HAS_SCORE && !AUXG;
    if (fold)
        kpt_bwd_fold<32>(S, D);
    kpt_wgmma_wait<1>();
    kpt_wgmma_regs<16>(&dP[0][0]);
#if KPT_AUX_GRADS
    if (AUXG && G.daux_on) { // S^T once more: the scores are gone, and kept they cost registers
        float X[4][4];
        kpt_wgmma_fence();
        kpt_bwd_ss<KPT_DQK, KPT_BN, KPT_BWD_SUB, 32>(X, sK, tQ + c * 32 * 128);
        kpt_wgmma_commit();
        kpt_wgmma_wait<0>();
        kpt_wgmma_regs<16>(&X[0][0]);
        kpt_bwd_aux<32>(A, U, G, b, h, krow, qc, X, S, dP, del + c * 32,
                        s_aux + cw * KPT_AUX_CHUNK * 32, kpt_daux_table(s_aux), lane);
    }
#else
    (void)G, (void)s_aux;
#endif
    kpt_bwd_ds<32, true, KPT_HAS_SCORE && !fold>(S, dP, D, del + c * 32, nullptr, lane);
    u32 E[2][4];
    kpt_frags<32>(E, S);
    kpt_bwd_put_frags<32>(tP + KPT_BWD_PT, E, (cw & 3) * 16, c * 32, lane);
    kpt_fence_proxy_async();
    kpt_bar_sync(1, KPT_THREADS); // both halves of dS^T are in
    kpt_wgmma_fence();
    kpt_bwd_ts<KPT_BWD_CK, KPT_BWD_SUB>(dK, tP + KPT_BWD_PT, tQ + cQ);
    kpt_wgmma_commit();
}
#endif

// The kv tile of this CTA of kpt_bwd_dkdv. In order: neighbouring CTAs walk mostly the same q
// tiles at the same time, so their Q and dO come from L2. But then the grid's last CTAs may be
// heavy (a long document's) and leave the SMs idle as they finish; so with a block map the rows
// of CTAs that share the grid's last wave (as many CTAs as SMs: one CTA an SM) take their kv
// tiles by decreasing work (kpt_blockmap_order, by the map row of the group's first head).
// Sorting every row measured 1-9 % slower than this in the deterministic mode on documents
// (docs/BENCHMARKS.md, "Backward: the kv tile order under a block map").
__device__ __forceinline__ int kpt_bwd_kv_tile(const kpt_args &A, int b, int hk)
{
#if KPT_KV_ORDER
    u32 sms;
    asm("mov.u32 %0, %%nsmid;" : "=r"(sms));
    const i64 row = (i64)b * gridDim.y + hk, ctas = (i64)gridDim.x * gridDim.y * gridDim.z;
    if ((row + 1) * gridDim.x + sms > ctas) // the row ends in the grid's last sms CTAs
        return kpt_kv_order_row(A, b, hk * A.group)[blockIdx.x];
#endif
    return blockIdx.x;
}

// One CTA per (128-key tile, kv head, batch row). Warpgroup 0 is the producer (one warp of it
// works: kpt_bwd_producer); warpgroups 1 and 2 are the consumers, c = 0 and 1, of keys
// c * 64 .. + 63. The consumers never wait for each other but to swap dS^T for the default
// mode's dQ (named barrier 1), and there over two buffers: a warpgroup writes one while the
// other may still read the other. AUXG: the aux gradients' terms are compiled in (the entry
// kpt_bwd_dkdv_aux, for calls that ask for them); their code beside the main path's made ptxas
// spill in it (t5_buckets 180 bytes, graphormer_edges 388) even when no call asked.
template <bool AUXG>
__device__ __forceinline__ void kpt_bwd_dkdv_run(const kpt_args &A, const kpt_gargs &G,
                                                 const kpt_bwd_tma &T)
{
    // the dynamic shared memory, named apart from the kernels' kpt_smem (NVRTC warns of the
    // same name declared in a device function and a kernel)
    extern __shared__ __align__(16) unsigned char kpt_smem_kv[];
    __shared__ __align__(8) u64 s_bar[KPT_BB_N];
    __shared__ int4 s_step[KPT_STAGES];
    const u32 s0 = kpt_smem_addr(kpt_smem_kv);
    const u32 sK = (s0 + 1023u) & ~1023u; // swizzle atoms repeat every 1024 bytes
    const u32 sV = sK + KPT_BN * KPT_DQK * 2;
    const u32 sQ = sV + KPT_BN * KPT_DV * 2; // the ring
    const u32 sDS = sQ + KPT_STAGES * KPT_BWD_STAGE; // dS^T for the default mode's dQ, two
    const u32 sDQ = sDS + 2 * KPT_BWD_DS;            // the warpgroups' dQ tiles (by parity)
    // per stage: lse, delta
    float *s_rv = (float *)(kpt_smem_kv + (sDS + KPT_BWD_X_SMEM - s0));
#if KPT_AUX_GRADS
    float2 *s_aux = (float2 *)(s_rv + KPT_STAGES * 2 * KPT_BWD_SUB); // kpt_bwd_aux's staging
#endif
    const u32 bar = kpt_smem_addr(s_bar);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    // the next kernel (dQ, or its conversion) may be scheduled: its CTAs take SMs as this
    // grid's last CTAs leave them (runtime/cuda_device.c, launch_dependent)
    kpt_grid_launch();
    const int hk = blockIdx.y, b = blockIdx.z, kt = kpt_bwd_kv_tile(A, b, hk);
    if (tid == 0) {
        kpt_mbar_init(bar + 8 * KPT_BB_KV, 1);
        for (int s = 0; s < KPT_STAGES; s++) {
            kpt_mbar_init(bar + 8 * KPT_BB_F(s), 32);
            kpt_mbar_init(bar + 8 * KPT_BB_E(s), KPT_THREADS);
        }
        kpt_mbar_init_fence();
    }
    __syncthreads();
    if (warp < 4) {
        kpt_regs_dec<KPT_BWD_PRODUCER_REGS>();
        if (warp == 0)
            kpt_bwd_producer(A, G, T, b, hk, kt, bar, sK, sV, sQ, s_rv, s_step, lane);
        return;
    }
    kpt_regs_inc<KPT_BWD_CONSUMER_REGS>();

    // consumer warp and warpgroup; through a shuffle, the compiler knows them to be the same in
    // every lane, and keeps more of the descriptors' arithmetic in the uniform datapath (72
    // instructions fewer here, 40 in kpt_bwd_dq; H100 full 16k 475-496 -> 494-503 TFLOP/s)
    const int cw = __shfl_sync(0xffffffffu, warp - 4, 0), c = cw >> 2;
    const int k0 = kt * KPT_BN;
    const int krow = k0 + c * KPT_BWD_WROWS + (cw & 3) * 16; // this warp's first key
    // this warpgroup's keys, and its columns of Q and dO in a stage
    const u32 wK = sK + c * KPT_BWD_WROWS * 128, wV = sV + c * KPT_BWD_WROWS * 128;
    const u32 cQ = kpt_bwd_cols(c, KPT_BWD_CK, KPT_BWD_SUB);
    const u32 cO = kpt_bwd_cols(c, KPT_BWD_CV, KPT_BWD_SUB);
    float dK[KPT_BWD_CK / 8][4], dV[KPT_BWD_CV / 8][4];
    kpt_zero<KPT_BWD_CK>(dK);
    kpt_zero<KPT_BWD_CV>(dV);
    kpt_uniform U;
    int uh = -1;
#if KPT_AUX_GRADS
    if (AUXG) { // the consumers' table (named barrier 4: the consumers)
        kpt_daux_tab_begin(A, G, kpt_daux_table(s_aux), tid - KPT_BWD_PRODUCER_WARPS * 32,
                           KPT_THREADS);
        kpt_bar_sync(4, KPT_THREADS);
    }
#endif
    kpt_mbar_wait(bar + 8 * KPT_BB_KV, 0);
    // The turns only where this call sums dQ: without that product (the deterministic mode)
    // they held the step back (H200, 16k, softcap+causal: 3743 -> 3522 us without them).
    const bool turns = KPT_BWD_DKDV_TURNS && !KPT_BWD_SPLIT && G.dqacc;
    kpt_bwd_turns_open(turns, 5, c);
    for (u32 i = 0;; i++) {
        const u32 st = i % KPT_STAGES;
        kpt_mbar_wait(bar + 8 * KPT_BB_F(st), (i / KPT_STAGES) & 1);
        const int4 s = s_step[st]; // kpt_bwd_step
        if (s.x < 0)
            break;
        if (s.x != uh) {
            kpt_uniform_init(A, b, s.x, U);
            uh = s.x;
        }
        const u32 tQ = sQ + st * KPT_BWD_STAGE, tO = tQ + KPT_BWD_QB;
        const float *lse = s_rv + st * 2 * KPT_BWD_SUB, *del = lse + KPT_BWD_SUB;
        const int h = s.x, q0 = s.y * KPT_BM + s.z * KPT_BWD_SUB;
#if KPT_BWD_SPLIT
        kpt_bwd_split_step<AUXG>(A, U, G, b, h, krow, q0,
                                 s.w != 2 || k0 + KPT_BN > A.Skv || q0 + KPT_BWD_SUB > A.Sq, sK,
                                 sV, tQ, tO, cQ, cO, lse, del, sDS + (i & 1) * 2 * KPT_BWD_PT, c,
                                 cw, lane, dK, dV,
#if KPT_AUX_GRADS
                                 s_aux);
#else
                                 nullptr);
#endif
        (void)sDQ;
#else
        // S^T = K Q^T and dP^T = V dO^T: this warpgroup's 64 keys against the step's queries.
        float S[8][4], dP[8][4];
        kpt_bwd_turn_wait(turns, 5, c);
        kpt_wgmma_fence();
        kpt_bwd_ss<KPT_DQK, KPT_BN, KPT_BWD_SUB>(S, wK, tQ);
        kpt_wgmma_commit();
        kpt_bwd_ss<KPT_DV, KPT_BN, KPT_BWD_SUB>(dP, wV, tO);
        kpt_wgmma_commit();
        kpt_bwd_turn_give(turns, 5, c);
        const bool partial = s.w != 2 || k0 + KPT_BN > A.Skv || q0 + KPT_BWD_SUB > A.Sq;
        const u32 keep = kpt_bwd_tile_keep<true>(A, U, b, h, krow, q0, s.z,
                                                 s.w >= 3 ? s.w - 3 : -1, partial, lane);
        kpt_wgmma_wait<1>();
        kpt_wgmma_regs<32>(&S[0][0]);
        float D[8][4]; // d s'/d s (with a score mod)
        kpt_bwd_step_probs<true>(A, U, b, h, krow, q0, keep, partial, S, D, lse, nullptr, lane);
        // dV += P^T dO
        u32 F[4][4];
        kpt_frags<KPT_BWD_SUB>(F, S);
        kpt_wgmma_fence();
        kpt_bwd_rs<KPT_BWD_CV, KPT_BWD_SUB>(dV, F, tO + cO);
        kpt_wgmma_commit();
        // With a score mod, P becomes P d s'/d s now: kept apart until dS, D's 32 registers beside
        // dK, dV, P, dP and P's fragments made softcap's consumers spill. (Aux gradients need P
        // itself after dP.)
        constexpr bool fold = KPT_HAS_SCORE && !AUXG;
        if (fold)
            kpt_bwd_fold<KPT_BWD_SUB>(S, D);
        kpt_wgmma_wait<1>();
        kpt_wgmma_regs<32>(&dP[0][0]);
#if KPT_AUX_GRADS
        if (AUXG && G.daux_on) { // S^T once more: the scores are gone, and kept they cost registers
            float X[8][4];
            kpt_wgmma_fence();
            kpt_bwd_ss<KPT_DQK, KPT_BN, KPT_BWD_SUB>(X, wK, tQ);
            kpt_wgmma_commit();
            kpt_wgmma_wait<0>();
            kpt_wgmma_regs<32>(&X[0][0]);
            kpt_bwd_aux<KPT_BWD_SUB>(A, U, G, b, h, krow, q0, X, S, dP, del,
                                     s_aux + cw * KPT_AUX_CHUNK * 32, kpt_daux_table(s_aux), lane);
        }
#endif
        // dK += dS^T Q
        kpt_bwd_ds<KPT_BWD_SUB, true, KPT_HAS_SCORE && !fold>(S, dP, D, del, nullptr, lane);
        u32 E[4][4];
        kpt_frags<KPT_BWD_SUB>(E, S);
        kpt_wgmma_fence();
        kpt_bwd_rs<KPT_BWD_CK, KPT_BWD_SUB>(dK, E, tQ + cQ);
        kpt_wgmma_commit();
#if KPT_BWD_DQ_TILES
        if (G.dqacc) {
            const u32 tDS = sDS + (i & 1) * KPT_BWD_DS;
            kpt_bwd_put_frags<64>(tDS, E, c * 64 + (cw & 3) * 16, 0, lane);
            kpt_bwd_dq_add(T, b, h, q0, tDS, sK, sDQ, c, cw, lane, i);
        }
#else
        (void)sDQ;
#endif
#endif // KPT_BWD_SPLIT
        kpt_wgmma_wait<0>(); // the stage is read: hand it back
        kpt_wgmma_regs<KPT_BWD_CK / 2>(&dK[0][0]);
        kpt_wgmma_regs<KPT_BWD_CV / 2>(&dV[0][0]);
        kpt_mbar_arrive(bar + 8 * KPT_BB_E(st));
    }
    // (The last dQ tile's reduction may still be reading its staging tile: nothing writes the dQ
    // tiles again, and the same thread waits for all its bulk groups before the CTA exits.)
    // Both warpgroups past their last step: the table (AUXG) holds every term, and no product
    // reads K or V any more (the default mode's dQ reads all 128 keys of K).
    kpt_bwd_turns_close(turns, 5, c);
    kpt_bar_sync(4, KPT_THREADS);
#if KPT_AUX_GRADS
    if (AUXG)
        kpt_daux_tab_end(A, G, kpt_daux_table(s_aux), tid - KPT_BWD_PRODUCER_WARPS * 32,
                         KPT_THREADS);
#endif
    // dK and dV leave through K's and V's tiles: each warpgroup stages its 64 rows there and its
    // first thread stores them by TMA (rows past Skv lie outside the maps and are not written).
    // Stored from registers, a thread's 4-byte pieces made warp stores of 8 rows' 16 bytes, as
    // the forward's O did (architecture.md).
    // (With split columns, each warpgroup its columns of the CTA's 64 rows.)
    const u32 oK = wK + kpt_bwd_cols(c, KPT_BWD_CK, KPT_BN);
    const u32 oV = wV + kpt_bwd_cols(c, KPT_BWD_CV, KPT_BN);
    kpt_stage_rows<KPT_BWD_CK, KPT_BN>(dK, oK, (cw & 3) * 16, A.scale, A.scale, lane);
    kpt_stage_rows<KPT_BWD_CV, KPT_BN>(dV, oV, (cw & 3) * 16, 1.0f, 1.0f, lane);
    kpt_fence_proxy_async();
    kpt_bar_sync(2 + c, 128);
    if ((cw & 3) == 0 && lane == 0) {
        const int r = k0 + c * KPT_BWD_WROWS, kc = KPT_BWD_SPLIT ? c * KPT_BWD_CK : 0,
                  vc = KPT_BWD_SPLIT ? c * KPT_BWD_CV : 0;
        kpt_tma_store_tile<KPT_BN, KPT_BWD_CK>(&T.dk, oK, r, hk * T.hdk, b * T.bdk, kc);
        kpt_tma_store_tile<KPT_BN, KPT_BWD_CV>(&T.dv, oV, r, hk * T.hdv, b * T.bdv, vc);
        kpt_bulk_commit();
        kpt_bulk_wait<0, false>(); // before the CTA's shared memory goes
        // and this warpgroup's dQ reductions, its earlier bulk groups, are complete: counted for
        // kpt_bwd_dq_store, which converts a kv head's rows once all its warpgroups are
        if (G.dqacc)
            kpt_count_done((u32 *)G.dqdone + (i64)b * A.Hkv + hk);
    }
}

extern "C" __global__ void __launch_bounds__(KPT_BWD_THREADS, 1)
kpt_bwd_dkdv(const kpt_args A, const kpt_gargs G, const __grid_constant__ kpt_bwd_tma T)
{
    kpt_bwd_dkdv_run<false>(A, G, T);
}

#if KPT_AUX_GRADS
extern "C" __global__ void __launch_bounds__(KPT_BWD_THREADS, 1)
kpt_bwd_dkdv_aux(const kpt_args A, const kpt_gargs G, const __grid_constant__ kpt_bwd_tma T)
{
    kpt_bwd_dkdv_run<true>(A, G, T);
}
#endif

// ---- dQ ---------------------------------------------------------------------------------------

// Past head dim 128 (KPT_BWD_SPLIT) kpt_bwd_dq takes 128 queries a CTA (after the #else below),
// except for masks with a block map, which keep the kernel of 64 queries a CTA with split columns
// (kpt_bwd_split_dq): for them the 128-query kernel was slower (document masks, H200, bf16,
// D = 256: kpt_bwd_dq 786 -> 927 us at 4k tokens, 2668 -> 2823 at 16k; why was not found), for
// the others 23-33 % faster (full 16k 6215 -> 4800 us). compiler/plan_tiles_cuda.c plans either
// (plan.dq_rows).
#if !KPT_BWD_SPLIT || KPT_HAS_BLOCKMAP
#define KPT_BWD_KB (KPT_BN * KPT_DQK * 2) // a stage: K rows, then V rows
#define KPT_BWD_KSTAGE (KPT_BWD_KB + KPT_BN * KPT_DV * 2)

// kpt_bwd_dq's mbarriers: Q and dO in; per stage (two), its K and V in and handed back.
#define KPT_BQ_QO 0
#define KPT_BQ_F(s) (1 + (s))
#define KPT_BQ_E(s) (3 + (s))
#define KPT_BQ_N 5

// kpt_bwd_dq's producer (one thread): Q and dO of the CTA's queries, then K and V of each live kv
// tile into two stages, each refilled once the consumers have handed it back.
__device__ __forceinline__ void kpt_bwd_dq_producer(const kpt_args &A, const kpt_bwd_tma &T,
                                                    const unsigned char *cls, u32 bar, u32 sQ,
                                                    u32 sO, u32 sK, int b, int h, int qt, int lo,
                                                    int hi)
{
    const int hk = h / A.group, q0 = qt * KPT_BM, q1 = min(q0 + KPT_BM, A.Sq) - 1;
    kpt_mbar_expect_tx(bar + 8 * KPT_BQ_QO, KPT_BM * (KPT_DQK + KPT_DV) * 2);
#pragma unroll
    for (int r = 0; r < KPT_BM; r += KPT_BWD_SUB) {
        kpt_tma_part<KPT_BM, KPT_DQK>(sQ, &T.q, r, q0, h * T.hq, b * T.bq, bar + 8 * KPT_BQ_QO);
        kpt_tma_part<KPT_BM, KPT_DV>(sO, &T.o, r, q0, h * T.ho, b * T.bo, bar + 8 * KPT_BQ_QO);
    }
    u32 i = 0;
    for (int j = lo; j <= hi; j = kpt_next_tile(A, cls, b, h, qt, q0, q1, j, hi), i++) {
        const u32 s = i & 1, f = bar + 8 * KPT_BQ_F(s), t = sK + s * KPT_BWD_KSTAGE;
        if (i >= 2)
            kpt_mbar_wait(bar + 8 * KPT_BQ_E(s), ((i >> 1) & 1) ^ 1);
        kpt_mbar_expect_tx(f, KPT_BWD_KSTAGE);
        kpt_tma_tile<KPT_BN, KPT_DQK>(t, &T.k, j * KPT_BN, hk * T.hk, b * T.bk, f);
        kpt_tma_tile<KPT_BN, KPT_DV>(t + KPT_BWD_KB, &T.v, j * KPT_BN, hk * T.hv, b * T.bv, f);
    }
}

#if KPT_BWD_SPLIT
// 64 keys (k0 on, at hK and hV) of a kpt_bwd_dq CTA with split columns (masks with a block map;
// the others take 128 queries a CTA, kpt_bwd_wide_producer's kernel), warpgroup c: S and dP of
// the CTA's 64 queries against keys k0 + c * 32 .. + 31, dS into the tile at tS, a barrier of
// both warpgroups, and dQ += dS K over all 64 keys for this warpgroup's columns. Leaves the
// product in flight (tiles taken by parity are free when written, as kpt_bwd_split_step's).
__device__ __forceinline__ void kpt_bwd_split_dq(const kpt_args &A, const kpt_uniform &U, int b,
                                                 int h, int row0, int k0, bool partial, u32 sQ,
                                                 u32 sO, u32 hK, u32 hV, u32 cK,
                                                 const float (&lse)[2],
                                                 const float (&del)[2], u32 tS, int c, int cw,
                                                 int lane, float (&dQ)[KPT_BWD_CK / 8][4])
{
    const int kc = k0 + c * 32; // this warpgroup's keys
    float S[4][4], dP[4][4];
    kpt_wgmma_fence();
    kpt_bwd_ss<KPT_DQK, KPT_BM, KPT_BN, 32>(S, sQ, hK + c * 32 * 128);
    kpt_wgmma_commit();
    kpt_bwd_ss<KPT_DV, KPT_BM, KPT_BN, 32>(dP, sO, hV + c * 32 * 128);
    kpt_wgmma_commit();
    const u32 keep = partial ? kpt_bwd_keep<32, false>(A, U, b, h, row0, kc, lane) : ~0u;
    kpt_wgmma_wait<1>();
    kpt_wgmma_regs<16>(&S[0][0]);
    float D[4][4]; // d s'/d s (with a score mod)
    kpt_bwd_probs<32, false>(A, U, b, h, row0, kc, keep, S, D, nullptr, lse, lane);
    kpt_wgmma_wait<0>();
    kpt_wgmma_regs<16>(&dP[0][0]);
    kpt_wgmma_regs<KPT_BWD_CK / 2>(&dQ[0][0]);
    kpt_bwd_ds<32, false>(S, dP, D, nullptr, del, lane);
    u32 E[2][4];
    kpt_frags<32>(E, S);
    kpt_bwd_put_frags<32>(tS, E, (cw & 3) * 16, c * 32, lane);
    kpt_fence_proxy_async();
    kpt_bar_sync(1, KPT_THREADS); // both halves of dS are in
    kpt_wgmma_fence();
    kpt_bwd_ts<KPT_BWD_CK, KPT_BN>(dQ, tS, hK + cK);
    kpt_wgmma_commit();
}
#endif

// One CTA per (128-query tile, head, batch row), as kpt_bwd_dkdv a producer warpgroup (one
// thread of it issues the TMA copies) and two consumer warpgroups, c = 0 and 1, of queries
// c * 64 .. + 63, which never wait for each other (with split columns: kpt_bwd_split_dq).
extern "C" __global__ void __launch_bounds__(KPT_BWD_THREADS, 1)
kpt_bwd_dq(const kpt_args A, const kpt_gargs G, const __grid_constant__ kpt_bwd_tma T)
{
    extern __shared__ __align__(16) unsigned char kpt_smem[];
    __shared__ __align__(8) u64 s_bar[KPT_BQ_N];
    const u32 sQ = (kpt_smem_addr(kpt_smem) + 1023u) & ~1023u;
    const u32 sO = sQ + KPT_BM * KPT_DQK * 2; // dO
    const u32 sK = sO + KPT_BM * KPT_DV * 2;  // two stages of K and V
    const u32 bar = kpt_smem_addr(s_bar);

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    kpt_grid_end_after(); // launched as a dependent of kpt_bwd_dkdv, of which it reads nothing
    const int qt = A.n_qt - 1 - (int)blockIdx.x;
    const int h = blockIdx.y, b = blockIdx.z;
    const int q0 = qt * KPT_BM, q1 = min(q0 + KPT_BM, A.Sq) - 1;
    if (tid == 0) {
        kpt_mbar_init(bar + 8 * KPT_BQ_QO, 1);
        for (int s = 0; s < 2; s++) {
            kpt_mbar_init(bar + 8 * KPT_BQ_F(s), 1);
            kpt_mbar_init(bar + 8 * KPT_BQ_E(s), KPT_THREADS);
        }
        kpt_mbar_init_fence();
    }
    int lo = 0, hi = A.n_kt - 1;
#if KPT_HAS_MASK
    __shared__ int s_lo, s_hi;
    __shared__ unsigned char s_cls[KPT_CLS_CAP];
    // every thread takes part (a CTA of KPT_THREADS + 128: the last 128 repeat the first's
    // second share, writing the same classes); its barriers publish the mbarriers too
    kpt_live_tiles(A, b, h, qt, q0, q1, s_cls, &s_lo, &s_hi, lo, hi);
#else
    const unsigned char *s_cls = 0;
    __syncthreads();
#endif
    if (warp < 4) {
        kpt_regs_dec<KPT_BWD_PRODUCER_REGS>();
        if (tid == 0)
            kpt_bwd_dq_producer(A, T, s_cls, bar, sQ, sO, sK, b, h, qt, lo, hi);
        return;
    }
    kpt_regs_inc<KPT_BWD_CONSUMER_REGS>();

    const int cw = __shfl_sync(0xffffffffu, warp - 4, 0), c = cw >> 2; // as in kpt_bwd_dkdv
    const int row0 = q0 + c * KPT_BWD_WROWS + (cw & 3) * 16; // this warp's first query
    // this warpgroup's queries, and its columns of K in a stage
    const u32 wQ = sQ + c * KPT_BWD_WROWS * 128, wO = sO + c * KPT_BWD_WROWS * 128;
    const u32 cK = kpt_bwd_cols(c, KPT_BWD_CK, KPT_BN);
    kpt_uniform U;
    kpt_uniform_init(A, b, h, U);
    float lse[2], del[2];
    kpt_row_stats(A, G, b, h, row0, lane, lse, del);
    float dQ[KPT_BWD_CK / 8][4];
    kpt_zero<KPT_BWD_CK>(dQ);
    const bool rows_out = row0 - (cw & 3) * 16 + 64 > A.Sq; // this warpgroup's rows pass Sq
    // the slot of the next partial tile's keep bits (the q tile's partial tiles have consecutive
    // slots), or -1
    int slot = kpt_bits_base(A, false, b, h, qt);
    kpt_mbar_wait(bar + 8 * KPT_BQ_QO, 0);
    kpt_bwd_turns_open(!KPT_BWD_SPLIT, 1, c);
    for (int j = lo, i = 0; j <= hi; i++) {
        const int jn = kpt_next_tile(A, s_cls, b, h, qt, q0, q1, j, hi);
        const int cls = kpt_class_of(A, s_cls, b, h, qt, q0, q1, j);
        const int ts = kpt_bits_take(cls, slot); // this tile's slot
        const int halves = kpt_bwd_halves(A, false, ts); // of its keys
        const u32 tK = sK + (i & 1) * KPT_BWD_KSTAGE, tV = tK + KPT_BWD_KB;
        kpt_mbar_wait(bar + 8 * KPT_BQ_F(i & 1), (i >> 1) & 1);
#pragma unroll 1
        for (int half = 0; half < KPT_BN / KPT_BWD_SUB; half++) {
            const int k0 = j * KPT_BN + half * KPT_BWD_SUB;
            if (k0 >= A.Skv) break;
            if (!(halves >> half & 1))
                continue; // no kept pair in these 64 keys
            const u32 hK = tK + half * KPT_BWD_SUB * 128, hV = tV + half * KPT_BWD_SUB * 128;
#if KPT_BWD_SPLIT
            (void)wO, (void)ts;
            const bool partial = cls != 2 || k0 + KPT_BWD_SUB > A.Skv || rows_out;
            kpt_bwd_split_dq(A, U, b, h, row0, k0, partial, sQ, sO, hK, hV, cK, lse, del,
                             sK + 2 * KPT_BWD_KSTAGE + (i & 1) * KPT_BWD_PT, c, cw, lane, dQ);
#else
            // S = Q K^T and dP = dO V^T: this warpgroup's 64 queries against 64 keys
            float S[8][4], dP[8][4];
            kpt_bwd_turn_wait(true, 1, c);
            kpt_wgmma_fence();
            kpt_bwd_ss<KPT_DQK, KPT_BM, KPT_BN>(S, wQ, hK);
            kpt_wgmma_commit();
            kpt_bwd_ss<KPT_DV, KPT_BM, KPT_BN>(dP, wO, hV);
            kpt_wgmma_commit();
            kpt_bwd_turn_give(true, 1, c);
            const bool partial = cls != 2 || k0 + KPT_BWD_SUB > A.Skv || rows_out;
            const u32 keep =
                kpt_bwd_tile_keep<false>(A, U, b, h, row0, k0, half, ts, partial, lane);
            kpt_wgmma_wait<1>();
            kpt_wgmma_regs<32>(&S[0][0]);
            float D[8][4]; // d s'/d s (with a score mod)
            kpt_bwd_step_probs<false>(A, U, b, h, row0, k0, keep, partial, S, D, nullptr, lse,
                                      lane);
            kpt_wgmma_wait<0>();
            kpt_wgmma_regs<32>(&dP[0][0]);
            kpt_wgmma_regs<KPT_BWD_CK / 2>(&dQ[0][0]);
            kpt_bwd_ds<KPT_BWD_SUB, false>(S, dP, D, nullptr, del, lane);
            // dQ += dS K: K's keys are the reduced dimension, down the rows
            u32 F[4][4];
            kpt_frags<KPT_BWD_SUB>(F, S);
            kpt_wgmma_fence();
            kpt_bwd_rs<KPT_BWD_CK, KPT_BN>(dQ, F, hK + cK);
            kpt_wgmma_commit();
#endif
        }
        kpt_wgmma_wait<0>(); // the stage is read: hand it back
        kpt_wgmma_regs<KPT_BWD_CK / 2>(&dQ[0][0]);
        kpt_mbar_arrive(bar + 8 * KPT_BQ_E(i & 1));
        j = jn;
    }
    kpt_bwd_turns_close(!KPT_BWD_SPLIT, 1, c);
    kpt_store_acc<KPT_BWD_CK>(dQ,
                              (u16 *)G.dq + (i64)b * G.dqs[0] + (i64)h * G.dqs[1] +
                                  (KPT_BWD_SPLIT ? c * KPT_BWD_CK : 0),
                              G.dqs[2], row0, A.Sq, A.scale, lane);
}

#else
// Past head dim 128 (KPT_BWD_SPLIT) a kpt_bwd_dq CTA takes 128 queries, two of the plan's 64-row q
// tiles, and consumer c the queries c * 64 .. + 63 with all of dQ's columns (64 x 256 f32: 128
// registers, in two halves of Dqk / 2 columns), so S and dP are m64n64 products of its own rows
// and dS stays in registers as dQ's A operand. (With 64 queries a CTA, each warpgroup computed S
// and dP for half the keys and took the whole dS through shared memory: ~312 KB of shared-memory
// traffic for each 64 x 64 pair against ~190 KB here.) Q and dO of 128 rows leave room for one
// 64-key tile of K and V (192 KB at 256 / 256), so the tile's parts are handed back as soon as
// they are read, each on its own mbarriers: V once dP is computed, K's two column halves once
// their halves of dQ += dS K are. A tile's dP is issued first, so the next V (loaded since the
// last dP) starts it while K's first half comes in.
#define KPT_BWD_WQ (2 * KPT_BM)                 // queries of a CTA
#define KPT_BWD_KH (KPT_DQK / 2)                // columns of a K half (and of a dQ half)
#define KPT_BWD_QT (KPT_BWD_SUB * KPT_DQK * 2)  // a warpgroup's 64 rows of Q
#define KPT_BWD_OT (KPT_BWD_SUB * KPT_DV * 2)   // and of dO
static_assert(KPT_BWD_KH % 64 == 0 && KPT_BWD_KH <= 128, "a half: one wgmma of N = 64 or 128");

// The mbarriers: Q and dO in; V in and handed back; each K half in and handed back.
#define KPT_BW_QO 0
#define KPT_BW_VF 1
#define KPT_BW_VE 2
#define KPT_BW_KF(x) (3 + (x))
#define KPT_BW_KE(x) (5 + (x))
#define KPT_BW_N 7

// The producer (one thread): Q and dO of the CTA's 128 queries, then for each live kv tile its V
// and K's two halves, each loaded once the consumers have handed back the last tile's.
__device__ __forceinline__ void kpt_bwd_wide_producer(const kpt_args &A, const kpt_bwd_tma &T,
                                                      const unsigned char *cls, u32 bar, u32 sQ,
                                                      u32 sO, u32 sK, u32 sV, int b, int h,
                                                      int qt, int lo, int hi)
{
    const int hk = h / A.group, q0 = qt * KPT_BM, q1 = min(q0 + KPT_BWD_WQ, A.Sq) - 1;
    const u32 qo = bar + 8 * KPT_BW_QO;
    kpt_mbar_expect_tx(qo, KPT_BWD_WQ * (KPT_DQK + KPT_DV) * 2);
#pragma unroll
    for (int c = 0; c < 2; c++) {
        const int r = q0 + c * KPT_BWD_SUB; // rows past Sq read as zeros
        kpt_tma_tile<KPT_BWD_SUB, KPT_DQK>(sQ + c * KPT_BWD_QT, &T.q, r, h * T.hq, b * T.bq, qo);
        kpt_tma_tile<KPT_BWD_SUB, KPT_DV>(sO + c * KPT_BWD_OT, &T.o, r, h * T.ho, b * T.bo, qo);
    }
    u32 i = 0;
    for (int j = lo; j <= hi; j = kpt_next_tile(A, cls, b, h, qt, q0, q1, j, hi), i++) {
        const int k0 = j * KPT_BN;
        const u32 last = (i - 1) & 1; // the parity of the last tile's hand-backs
        const u32 vf = bar + 8 * KPT_BW_VF;
        if (i)
            kpt_mbar_wait(bar + 8 * KPT_BW_VE, last);
        kpt_mbar_expect_tx(vf, KPT_BN * KPT_DV * 2);
        kpt_tma_tile<KPT_BN, KPT_DV>(sV, &T.v, k0, hk * T.hv, b * T.bv, vf);
#pragma unroll
        for (int x = 0; x < 2; x++) {
            const u32 kf = bar + 8 * KPT_BW_KF(x);
            if (i)
                kpt_mbar_wait(bar + 8 * KPT_BW_KE(x), last);
            kpt_mbar_expect_tx(kf, KPT_BN * KPT_BWD_KH * 2);
#pragma unroll
            for (int cb = x * KPT_BWD_KH / 64; cb < (x + 1) * KPT_BWD_KH / 64; cb++)
                kpt_tma_box(sK + cb * KPT_BN * 128, &T.k, cb * 64, k0, hk * T.hk, b * T.bk, kf);
        }
    }
}

// One CTA per (128 queries, head, batch row): a producer warpgroup and two consumer warpgroups.
// (No block map here: a kv tile's class is the mask's interval over all 128 rows, q0 .. q1.)
extern "C" __global__ void __launch_bounds__(KPT_BWD_THREADS, 1)
kpt_bwd_dq(const kpt_args A, const kpt_gargs G, const __grid_constant__ kpt_bwd_tma T)
{
    extern __shared__ __align__(16) unsigned char kpt_smem[];
    __shared__ __align__(8) u64 s_bar[KPT_BW_N];
    const u32 sQ = (kpt_smem_addr(kpt_smem) + 1023u) & ~1023u; // two 64-row tiles
    const u32 sO = sQ + 2 * KPT_BWD_QT;                           // dO, the same
    const u32 sK = sO + 2 * KPT_BWD_OT;                           // a 64-key tile of K
    const u32 sV = sK + KPT_BN * KPT_DQK * 2;                     // and of V
    const u32 bar = kpt_smem_addr(s_bar);

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    kpt_grid_end_after(); // launched as a dependent of kpt_bwd_dkdv, of which it reads nothing
    // the plan's q tiles qt and qt + 1, the last pair first (causal: the heaviest)
    const int qt = 2 * ((A.n_qt + 1) / 2 - 1 - (int)blockIdx.x);
    const int h = blockIdx.y, b = blockIdx.z;
    const int q0 = qt * KPT_BM, q1 = min(q0 + KPT_BWD_WQ, A.Sq) - 1;
    if (tid == 0) {
        for (int n = 0; n < KPT_BW_N; n++) // the hand-backs: every consumer thread arrives
            kpt_mbar_init(bar + 8 * n, n == KPT_BW_VE || n >= KPT_BW_KE(0) ? KPT_THREADS : 1);
        kpt_mbar_init_fence();
    }
    int lo = 0, hi = A.n_kt - 1;
#if KPT_HAS_MASK
    __shared__ int s_lo, s_hi;
    __shared__ unsigned char s_cls[KPT_CLS_CAP];
    kpt_live_tiles(A, b, h, qt, q0, q1, s_cls, &s_lo, &s_hi, lo, hi);
#else
    const unsigned char *s_cls = 0;
    __syncthreads();
#endif
    if (warp < 4) {
        kpt_regs_dec<KPT_BWD_PRODUCER_REGS>();
        if (tid == 0)
            kpt_bwd_wide_producer(A, T, s_cls, bar, sQ, sO, sK, sV, b, h, qt, lo, hi);
        return;
    }
    kpt_regs_inc<KPT_BWD_CONSUMER_REGS>();

    const int cw = __shfl_sync(0xffffffffu, warp - 4, 0), c = cw >> 2;
    const int row0 = q0 + c * KPT_BWD_SUB + (cw & 3) * 16; // this warp's first query
    const u32 wQ = sQ + c * KPT_BWD_QT, wO = sO + c * KPT_BWD_OT;
    kpt_uniform U;
    kpt_uniform_init(A, b, h, U);
    float lse[2], del[2];
    kpt_row_stats(A, G, b, h, row0, lane, lse, del);
    float dQ[2][KPT_BWD_KH / 8][4];
    kpt_zero<KPT_BWD_KH>(dQ[0]);
    kpt_zero<KPT_BWD_KH>(dQ[1]);
    const bool rows_out = q0 + (c + 1) * KPT_BWD_SUB > A.Sq; // this warpgroup's rows pass Sq
    kpt_mbar_wait(bar + 8 * KPT_BW_QO, 0);
    for (int j = lo, i = 0; j <= hi; i++) {
        const int jn = kpt_next_tile(A, s_cls, b, h, qt, q0, q1, j, hi);
        const int cls = kpt_class_of(A, s_cls, b, h, qt, q0, q1, j);
        const int k0 = j * KPT_BN;
        const u32 par = i & 1;
        // dP = dO V^T, then S = Q K^T as K's halves arrive: this warpgroup's 64 queries against
        // the tile's 64 keys
        float S[8][4], dP[8][4];
        kpt_mbar_wait(bar + 8 * KPT_BW_VF, par);
        kpt_wgmma_fence();
        kpt_bwd_ss<KPT_DV, KPT_BWD_SUB, KPT_BN>(dP, wO, sV);
        kpt_wgmma_commit();
        // (a fence after each wait: ptxas puts one there anyway, after the wait's loop)
        kpt_mbar_wait(bar + 8 * KPT_BW_KF(0), par);
        kpt_wgmma_fence();
        kpt_bwd_ss<KPT_DQK, KPT_BWD_SUB, KPT_BN, 64, 0, KPT_DQK / 32>(S, wQ, sK);
        kpt_mbar_wait(bar + 8 * KPT_BW_KF(1), par);
        kpt_wgmma_fence();
        kpt_bwd_ss<KPT_DQK, KPT_BWD_SUB, KPT_BN, 64, KPT_DQK / 32>(S, wQ, sK);
        kpt_wgmma_commit();
        const bool partial = cls != 2 || k0 + KPT_BN > A.Skv || rows_out;
        const u32 keep = partial ? kpt_bwd_keep<KPT_BN, false>(A, U, b, h, row0, k0, lane) : ~0u;
        kpt_wgmma_wait<1>(); // V is read
        kpt_wgmma_regs<32>(&dP[0][0]);
        kpt_mbar_arrive(bar + 8 * KPT_BW_VE);
        kpt_wgmma_wait<0>();
        kpt_wgmma_regs<32>(&S[0][0]);
        float D[8][4]; // d s'/d s (with a score mod), folded into P at once
        kpt_bwd_probs<KPT_BN, false>(A, U, b, h, row0, k0, keep, S, D, nullptr, lse, lane);
#if KPT_HAS_SCORE
        kpt_bwd_fold<KPT_BN>(S, D);
#endif
        kpt_bwd_ds<KPT_BN, false, false>(S, dP, D, nullptr, del, lane);
        // dQ += dS K, half by half of K's columns (the keys are the reduced dimension, down the
        // rows), each half handed back once its product is complete
        u32 F[4][4];
        kpt_frags<KPT_BN>(F, S);
        kpt_wgmma_fence();
        kpt_bwd_rs<KPT_BWD_KH, KPT_BN>(dQ[0], F, sK);
        kpt_wgmma_commit();
        kpt_bwd_rs<KPT_BWD_KH, KPT_BN>(dQ[1], F, sK + KPT_BWD_KH / 64 * KPT_BN * 128);
        kpt_wgmma_commit();
        kpt_wgmma_wait<1>();
        kpt_wgmma_regs<KPT_BWD_KH / 2>(&dQ[0][0][0]);
        kpt_mbar_arrive(bar + 8 * KPT_BW_KE(0));
        kpt_wgmma_wait<0>();
        kpt_wgmma_regs<KPT_BWD_KH / 2>(&dQ[1][0][0]);
        kpt_mbar_arrive(bar + 8 * KPT_BW_KE(1));
        j = jn;
    }
    u16 *dq = (u16 *)G.dq + (i64)b * G.dqs[0] + (i64)h * G.dqs[1];
    kpt_store_acc<KPT_BWD_KH>(dQ[0], dq, G.dqs[2], row0, A.Sq, A.scale, lane);
    kpt_store_acc<KPT_BWD_KH>(dQ[1], dq + KPT_BWD_KH, G.dqs[2], row0, A.Sq, A.scale, lane);
}
#endif

// dq = scale * the default mode's f32 accumulator, to the dtype: eight lanes a row (as
// kpt_bwd_prep), 32 bytes of sums read and 16 of dq written a lane at a time; with a warp a row
// and 8-byte reads it ran at 2.6 TB/s (77 us at 16k rows x 16 heads, D = 128, H100). Launched as
// a dependent of kpt_bwd_dkdv, its CTAs start on the SMs that kernel's last CTAs leave idle; a
// CTA waits for its kv head's kpt_bwd_dkdv CTAs only (both warpgroups of each of its n_kt kv
// tiles counted in G.dqdone), not for the whole grid, so the rows of the heads done early are
// converted while the last CTAs still run.
extern "C" __global__ void __launch_bounds__(256) kpt_bwd_dq_store(const kpt_args A, const kpt_gargs G)
{
    const int sub = threadIdx.x & 7, q = blockIdx.x * KPT_PREP_ROWS + (threadIdx.x >> 3);
    const int h = blockIdx.y, b = blockIdx.z;
    if (threadIdx.x == 0)
        kpt_count_wait((const u32 *)G.dqdone + (i64)b * A.Hkv + h / A.group, 2u * (u32)A.n_kt);
    __syncthreads();
    // the stream's later kernels find kpt_bwd_dkdv done (its CTAs may be past their count only)
    kpt_grid_end_after();
    if (q >= A.Sq) return;
    const float4 *acc =
        (const float4 *)((const float *)G.dqacc + (((i64)b * A.Hq + h) * A.Sq + q) * KPT_DQK);
    u16 *dq = (u16 *)G.dq + (i64)b * G.dqs[0] + (i64)h * G.dqs[1] + (i64)q * G.dqs[2];
#pragma unroll
    for (int c = sub; c < KPT_DQK / 8; c += 8) {
        const float4 x = acc[2 * c], y = acc[2 * c + 1];
        const float sc = A.scale;
        *(uint4 *)(dq + c * 8) = make_uint4(kpt_pack(x.x * sc, x.y * sc), kpt_pack(x.z * sc, x.w * sc),
                                            kpt_pack(y.x * sc, y.y * sc), kpt_pack(y.z * sc, y.w * sc));
    }
}
