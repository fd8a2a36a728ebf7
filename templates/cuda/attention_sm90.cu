// The sm_90a attention kernel (Hopper: TMA, mbarriers, warpgroup MMA, warp specialisation),
// inserted into templates/cuda/common.cu by codegen/cuda_source.c for cuda:sm_90a.
//
// A CTA of three warpgroups (four for unmasked patterns at head dims up to 64) works on one or
// more items (q tile of 128 rows (192), head, batch row; kpt_item: one CTA per item, or a
// persistent grid). Warpgroup 0 is the producer: it gives most
// of its registers away (setmaxnreg) and one of its threads issues TMA bulk tensor copies of each
// item's Q and of its K and V tile by tile into a ring of KPT_STAGES stages in shared memory,
// each stage completing on an mbarrier ("full") and handed back by the consumers on another
// ("empty"); for masked patterns another of its warps classifies the next item's kv tiles
// (kpt_scheduler). The others are consumers of 64 rows each: S = Q K^T and O += P V
// are wgmma.mma_async (Q and K K-major from the 128-byte-swizzled shared tiles TMA writes, P from
// registers, V as an N-major operand). Within a consumer, the product S of the next kv tile runs
// while the softmax of the current one does; between the consumers, named barriers take turns
// (ping-pong) so one issues its products while the others do their softmax. Each warp holds
// 16 rows in the sm_80 kernel's m16 accumulator layout, so masks, score mods, the online softmax
// and the epilogue are the same code (common.cu).

// The TMA tensor maps of Q, K and V (the runtime builds them with cuTensorMapEncodeTiled:
// dims D, S, heads, batch; boxes of 64 columns x a tile's rows, 128-byte swizzle) and, per tensor,
// the factors of the head and batch coordinates (0 where the tensor broadcasts that dim with a
// zero stride and the map has extent 1 there); with KPT_O_TMA, O's map too (boxes of 64 rows).
// Host twin: kpt_kernel_tma in runtime/cuda_tma.h.
struct kpt_tma {
    kpt_tmap q, k, v, o;
    int hq, bq, hk, bk, hv, bv, ho, bo;
};
static_assert(sizeof(kpt_tma) == 576, "kpt_tma layout");

// The consumer warpgroups, of 64 rows each: two (128-row q tiles), or three (192 rows: head dims
// up to 64 without masks, compiler/plan_tiles_cuda.c), whose softmax then weighs as much as
// their products and a third warpgroup keeps the tensor cores fed.
#define KPT_NCONS (KPT_WARPS / 4 - 1)
static_assert(KPT_BM == 64 * KPT_NCONS, "64 rows a consumer warpgroup");
// What the CTA is given: 128 x 24 + 256 x 240 = 384 x 168, or 128 x 24 + 384 x 160 = 512 x 126.
// (The scheduler warp's interval code for large masks spills a little at 24 registers, off the
// consumers' path; 128 x 40 + 256 x 232 instead cost the consumers of alibi, softcap and sliding
// tile masks 3-12 %, H200.)
#define KPT_PRODUCER_REGS 24
#define KPT_CONSUMER_REGS (KPT_NCONS == 2 ? 240 : 160)
#ifndef KPT_PINGPONG
#define KPT_PINGPONG 1
#endif

// The mbarriers, in static shared memory: Q full and empty; per stage K full, V full, K empty,
// V empty; then, for masked patterns, the two slots of a work item's live tiles (full, empty).
#define KPT_BAR_Q 0
#define KPT_BAR_QE 1
#define KPT_BAR_KF(s) (2 + (s))
#define KPT_BAR_VF(s) (2 + KPT_STAGES + (s))
#define KPT_BAR_KE(s) (2 + 2 * KPT_STAGES + (s))
#define KPT_BAR_VE(s) (2 + 3 * KPT_STAGES + (s))
#define KPT_BAR_IF(s) (2 + 4 * KPT_STAGES + (s))
#define KPT_BAR_IE(s) (4 + 4 * KPT_STAGES + (s))
#define KPT_NBARS (6 + 4 * KPT_STAGES)
#define KPT_CONSUMERS (128 * KPT_NCONS) // threads of the consumer warpgroups
// Named barriers: 1 .. NCONS the turns, then per consumer one for its Q negation and one for its
// epilogue.
#define KPT_NB_NEG (1 + KPT_NCONS)
#define KPT_NB_EPI (1 + 2 * KPT_NCONS)
#define KPT_K_BYTES (KPT_BN * KPT_DQK * 2)
#define KPT_V_BYTES (KPT_BN * KPT_DV * 2)

// The persistent grid's split (kpt_item), the same for every item: computed once a CTA
// (kpt_tail_init, before the first barrier) and read from shared memory, since its divisions
// took ~100 instructions an item in each role's loop where computed there. [0]: the first head
// whose q tiles go singly (h0, even where n_qt is odd, as the pairs then straddle heads); [1],
// [2]: the pairs before it, as rounds of gridDim.x and the CTAs of the last (partial) round.
__shared__ u32 kpt_tail[3];
__device__ __forceinline__ void kpt_tail_init(const kpt_args &A)
{
    const u32 nq = (u32)A.n_qt, total = nq * (u32)A.Hq * (u32)A.B, G = gridDim.x;
    const u32 rounds = (total >> 1) / G; // of whole pairs
    u32 h0 = G < total && rounds > 1 ? 2 * (rounds - 1) * G / nq : 0;
    if (nq & 1)
        h0 &= ~1u;
    const u32 pairs = h0 * nq >> 1;
    kpt_tail[0] = h0;
    kpt_tail[1] = pairs / G;
    kpt_tail[2] = pairs % G;
}

// The work items (q tile, head, batch row) of a CTA. The runtime launches either one CTA per
// item (gridDim.x = items: the hardware schedules them) or, where items are short, a persistent
// grid of at most one CTA per SM that walks its share of them, so that the producer loads the
// next item's Q, K and V while the consumers finish the current one (its last products and the
// epilogue) instead of the SM idling between CTAs.
//
// Item n of this CTA: without a block map, one CTA per item goes by blockIdx (each head's last q
// tiles, the heaviest under causal masks, first); a persistent CTA takes pairs of q tiles
// (n_qt - 1 - p, p) of one head, whose work sums to the same under causal masks, round robin
// over the pairs, so each head's tiles run together (its K and V stay in L2). Whole pairs left
// the busiest CTA ~3 % above the mean at 1k-4k (one pair more than others), so the last round
// or two of them go as single items (kpt_tail): the q tiles of the heads left, heaviest first
// (every such head's last q tile, then the ones before), each round of gridDim.x items dealt
// alternately forwards and backwards, starting at the CTAs that took one pair fewer (H200,
// causal and GQA causal D = 128 at 2k-4k 2-3 % faster, docs/BENCHMARKS.md "The persistent
// forward's last rounds"). With a block map, items go map row by map row (batch row, head),
// each row's q tiles by decreasing work (kpt_blockmap_order), each round of gridDim.x items
// dealt alternately forwards and backwards, so no CTA takes the heaviest of every round.
// False past this CTA's last item. The runtime keeps n_qt * Hq * B below 2^31 (cuda_device.c).
__device__ __forceinline__ bool kpt_item(const kpt_args &A, int n, int &qt, int &h, int &b)
{
    const u32 total = (u32)A.n_qt * (u32)A.Hq * (u32)A.B, G = gridDim.x, c = blockIdx.x;
#if KPT_HAS_BLOCKMAP
    const u32 L = (u32)n * G + ((n & 1) ? G - 1 - c : c);
    if (L >= total)
        return false;
    // row-major (each map row's q tiles by rank), so the items running at once are q tiles of a
    // few heads, whose K and V stay in L2 between neighbouring q tiles: numbered rank-major (the
    // same rank of every row at once), twelve documents at 1k read each K/V tile from DRAM
    // about twice (DRAM 73 % busy, ncu), and at 16k ran at 313 TFLOP/s against 391
    const u32 nq = (u32)A.n_qt, r = L % nq, row = L / nq;
    h = (int)(row % (u32)A.Hq);
    b = (int)(row / (u32)A.Hq);
    qt = kpt_order_row(A, b, h)[r];
#else
    const bool persistent = G < total;
    const u32 nq = (u32)A.n_qt, h0 = kpt_tail[0], start = kpt_tail[2];
    const u32 more = c < start ? 1 : 0; // this CTA took a pair in the pairs' partial round
    const u32 pairs = kpt_tail[1] + more; // this CTA's
    u32 hb, x;
    if (persistent && (u32)n >= 2 * pairs) {
        // single items: this CTA's round r of them (a CTA that took a pair fewer starts in the
        // pairs' partial round), at position c forwards or G - 1 - c backwards
        const u32 r = (u32)n - 2 * pairs + more;
        const u32 i = r * G + ((r & 1) ? G - 1 - c : c) - start;
        if (i >= total - h0 * nq)
            return false;
        const u32 heads = (u32)A.Hq * (u32)A.B - h0, rank = i / heads;
        hb = h0 + (i - rank * heads);
        x = 2 * rank; // q tile n_qt - 1 - rank, below
    } else {
        const u32 L = persistent ? 2 * (c + (u32)(n >> 1) * G) + (u32)(n & 1) : c + (u32)n * G;
        if (L >= total)
            return false;
        hb = L / nq;
        x = L - hb * nq;
    }
    h = (int)(hb % (u32)A.Hq);
    b = (int)(hb / (u32)A.Hq);
    qt = (int)(persistent ? ((x & 1) ? x >> 1 : nq - 1 - (x >> 1)) : nq - 1 - x);
#endif
    return true;
}

// The live kv tiles of a work item of a masked pattern, for the producer and the consumers: [lo,
// hi] and the classes of the first KPT_CLS_CAP tiles, in one of two slots (items n and n + 1),
// each published on its "full" mbarrier and handed back on its "empty" one, on which the
// producer arrives too once it has read the classes (its loads alone would order its reads
// before the consumers' arrivals only through the TMA's completion). (Unmasked: all tiles, no
// slots.)
struct kpt_item_tiles {
    int lo, hi;
    unsigned char cls[KPT_CLS_CAP];
};
// The phase parity of item n's (n >= 1) "full" barrier: its slot's (n - 1) / 2-th use, as item
// 0 is published by kpt_live_tiles's barrier instead. (An arrival for item 0 to keep the count
// even completed a phase nobody waited for: compute-sanitizer's synccheck reported it.)
__device__ __forceinline__ u32 kpt_item_full_parity(int n)
{
    return (u32)((n - 1) >> 1) & 1;
}

#if KPT_HAS_MASK

// The warp's lanes classify a share of the tiles each; [lo, hi] from warp reductions.
__device__ __forceinline__ void kpt_classify_warp(const kpt_args &A, int b, int h, int qt, int q0,
                                                  int q1, kpt_item_tiles &it, int lane)
{
    int lo = A.n_kt, hi = -1;
    for (int t = lane; t < A.n_kt; t += 32) {
        const int c = kpt_tile_class(A, b, h, qt, q0, q1, t);
        if (t < KPT_CLS_CAP)
            it.cls[t] = (unsigned char)c;
        if (c != 0) {
            lo = min(lo, t);
            hi = t;
        }
    }
    lo = __reduce_min_sync(0xffffffffu, lo);
    hi = __reduce_max_sync(0xffffffffu, hi);
    if (lane == 0) {
        it.lo = lo;
        it.hi = hi;
    }
}
#endif

// One thread's loads of a work item: Q once the consumers are done with the previous item's,
// then K and V of every live tile into the ring (`ring`: tiles loaded before this item), each
// stage refilled once the consumers have handed it back. Returns the number of tiles loaded.
__device__ __forceinline__ u32 kpt_produce(const kpt_args &A, const kpt_tma &T,
                                           const unsigned char *cls, u32 bar, u32 sQ, u32 sK,
                                           u32 sV, int n, u32 ring, int b, int h, int qt, int lo,
                                           int hi)
{
    const int hk = h / A.group, q0 = qt * KPT_BM, q1 = min(q0 + KPT_BM, A.Sq) - 1;
    if (n > 0)
        kpt_mbar_wait(bar + 8 * KPT_BAR_QE, (n & 1) ^ 1);
    kpt_mbar_expect_tx(bar + 8 * KPT_BAR_Q, KPT_BM * KPT_DQK * 2);
    kpt_tma_tile<KPT_BM, KPT_DQK>(sQ, &T.q, q0, h * T.hq, b * T.bq, bar + 8 * KPT_BAR_Q);
    u32 i = ring; // unsigned: the stage and parity are a mask and a shift
    for (int j = lo; j <= hi; j = kpt_next_tile(A, cls, b, h, qt, q0, q1, j, hi), i++) {
        const u32 s = i % KPT_STAGES;
        const u32 parity = ((i / KPT_STAGES) & 1) ^ 1; // the previous use of the stage
        if (i >= KPT_STAGES)
            kpt_mbar_wait(bar + 8 * KPT_BAR_KE(s), parity);
        kpt_mbar_expect_tx(bar + 8 * KPT_BAR_KF(s), KPT_K_BYTES);
        kpt_tma_tile<KPT_BN, KPT_DQK>(sK + s * KPT_K_BYTES, &T.k, j * KPT_BN, hk * T.hk, b * T.bk,
                                      bar + 8 * KPT_BAR_KF(s));
        if (i >= KPT_STAGES)
            kpt_mbar_wait(bar + 8 * KPT_BAR_VE(s), parity);
        kpt_mbar_expect_tx(bar + 8 * KPT_BAR_VF(s), KPT_V_BYTES);
        kpt_tma_tile<KPT_BN, KPT_DV>(sV + s * KPT_V_BYTES, &T.v, j * KPT_BN, hk * T.hv, b * T.bv,
                                     bar + 8 * KPT_BAR_VF(s));
    }
    return i - ring;
}

// The producer (one thread): per work item, its live tiles (masked patterns: as the scheduler
// warp published them), then its loads.
__device__ __forceinline__ void kpt_producer(const kpt_args &A, const kpt_tma &T,
                                             const kpt_item_tiles *tiles, u32 bar, u32 sQ,
                                             u32 sK, u32 sV)
{
    u32 ring = 0;
    int qt, h, b;
    for (int n = 0; kpt_item(A, n, qt, h, b); n++) {
        int lo = 0, hi = A.n_kt - 1;
        const unsigned char *cls = 0;
#if KPT_HAS_MASK
        const kpt_item_tiles &it = tiles[n & 1];
        if (n > 0) // the first item's tiles were published by kpt_live_tiles's barrier
            kpt_mbar_wait(bar + 8 * KPT_BAR_IF(n & 1), kpt_item_full_parity(n));
        lo = it.lo;
        hi = it.hi;
        cls = it.cls;
#endif
        ring += kpt_produce(A, T, cls, bar, sQ, sK, sV, n, ring, b, h, qt, lo, hi);
#if KPT_HAS_MASK
        kpt_mbar_arrive(bar + 8 * KPT_BAR_IE(n & 1)); // done with the item's tile classes
#endif
    }
}

#if KPT_HAS_MASK
// The scheduler warp of a masked pattern: classifies the live tiles of this CTA's items from the
// second on, one slot ahead, off the path of the loads and products. (The whole CTA classified
// the first item's, kpt_live_tiles, before the warps took their roles: a CTA with one item
// starts as fast as it did before it had a scheduler.)
__device__ __forceinline__ void kpt_scheduler(const kpt_args &A, kpt_item_tiles *tiles, u32 bar,
                                              int lane)
{
    int qt, h, b;
    for (int n = 1; kpt_item(A, n, qt, h, b); n++) {
        if (n >= 2)
            kpt_mbar_wait(bar + 8 * KPT_BAR_IE(n & 1), ((n >> 1) & 1) ^ 1);
        const int q0 = qt * KPT_BM;
        kpt_classify_warp(A, b, h, qt, q0, min(q0 + KPT_BM, A.Sq) - 1, tiles[n & 1], lane);
        // every lane publishes what it wrote itself (its arrival releases its writes)
        kpt_mbar_arrive(bar + 8 * KPT_BAR_IF(n & 1));
    }
}
#endif

// Ping-pong of the consumer warpgroups (named barriers 1 .. NCONS, round robin): warpgroup c
// waits for its turn (barrier 1 + c, with the warpgroup before it: 256 threads) before issuing
// its products and, once they are issued, gives the turn to the next. The turns run on across a
// CTA's items (each warpgroup takes a tile count + 1 of them an item, the last P V included), so
// that at an item's end one warpgroup's first product S of the next item is issued as soon as
// the one before has issued its last P V, not after its epilogue. The last consumer gives
// consumer 0 the first turn of the CTA's first item with live tiles, and consumer 0 takes the
// last consumer's last one after its last item: the arrivals balance.
__device__ __forceinline__ void kpt_turn_wait(int c)
{
#if KPT_PINGPONG
    kpt_bar_sync(1 + c, 256);
#endif
}
__device__ __forceinline__ void kpt_turn_give(int c)
{
#if KPT_PINGPONG
    kpt_bar_arrive(KPT_NCONS == 2 ? 2 - c : 1 + (c + 1) % KPT_NCONS, 256);
#endif
}

// The descriptors of one warpgroup's 64 rows of Q at sQ + qa, one per k step, computed once for
// all the items of a CTA (as the one-item kernel had them hoisted out of its loop; computed in
// the loop, they took ~30 instructions a tile once the kernel walked several items).
struct kpt_qdesc {
    u64 d[KPT_DQK / 16];
};
__device__ __forceinline__ kpt_qdesc kpt_q_descs(u32 qa)
{
    kpt_qdesc q;
#pragma unroll
    for (int kk = 0; kk < KPT_DQK / 16; kk++)
        q.d[kk] = kpt_sw128_desc(qa + (kk >> 2) * KPT_BM * 128 + (kk & 3) * 32, 16, 1024);
#pragma unroll
    for (int kk = 0; kk < KPT_DQK / 16; kk++) // kept as computed: not remade in the loop
        asm volatile("" : "+l"(q.d[kk]));
    return q;
}

// S = Q K^T for one warpgroup's 64 rows (dq: its Q descriptors) against a kv tile at tK,
// issued and committed, not waited for. The first k step ignores S's old contents.
__device__ __forceinline__ void kpt_issue_s(float (&S)[KPT_BN / 8][4], const kpt_qdesc &dq,
                                            u32 tK)
{
    kpt_wgmma_fence();
    const u64 dk = kpt_sw128_desc(tK, 16, 1024);
#pragma unroll
    for (int kk = 0; kk < KPT_DQK / 16; kk++) {
        const u32 kb = (u32)((kk & 3) * 32); // 16 elements within a 64-column block
        const u64 da = dq.d[kk];
        const u64 db = kpt_desc_add(dk, (kk >> 2) * KPT_BN * 128 + kb);
        kpt_wgmma_ss_keys(&S[0][0], da, db, kk > 0);
    }
    kpt_wgmma_commit();
}
#if KPT_HAS_BLOCKMAP || (KPT_HAS_MASK && KPT_MASK_ROLLED)
// Which pairs of a partial tile the mask keeps, one bit per score of this thread (bit n * 4 + e
// for S[n][e]; rows row0 + lane / 4 (+ 8), keys from k0), without touching S; keys past Skv are
// dropped. The block-map kernels store these words as a tile's keep bits (kpt_blockmap_bits).
// For masks that read aux data it is computed before the scores are waited for, so the loads'
// latency hides behind the product, in a loop unrolled only in part, so the loads' registers
// stay few while S, O and P hold most of them. A large mask (rolled, KPT_MASK_ROLLED) is
// evaluated here in a loop not unrolled at all: indexing S in such a loop would put the wgmma
// accumulators in local memory, and ptxas then serialises the warpgroup MMAs.
__device__ __forceinline__ u64 kpt_tile_keep(const kpt_args &A, const kpt_uniform &U, int b,
                                             int h, int row0, int k0, int lane, bool partial)
{
    u64 keep = ~0ull;
#if KPT_MASK_NK > 0 && !KPT_MASK_AUX
    // A mask that splits (kpt_mask_keys / kpt_mask_pair): a thread's 64 pairs hold 32 keys, each
    // shared with 7 other lanes, so the warp computes each key's values once (lane l: keys
    // k0 + l + 32 j) and passes them round with shuffles; only the pair test runs per pair.
    static_assert(KPT_BN % 32 == 0, "a warp's lanes cover the tile's keys in groups of 32");
    if (partial) {
        int kv[KPT_BN / 32][KPT_MASK_NK];
#pragma unroll
        for (int j = 0; j < KPT_BN / 32; j++)
            kpt_mask_keys(A, U, b, h, k0 + lane + 32 * j, kv[j]);
#pragma unroll
        for (int j = 0; j < KPT_BN / 32; j++)
#pragma unroll 1
            for (int m = 0; m < 4; m++) {
                u32 drop = 0; // bit e: pair e of the 8-key group n = 4 j + m is masked out
#pragma unroll
                for (int e1 = 0; e1 < 2; e1++) {
                    const int t = m * 8 + (lane & 3) * 2 + e1, ki = k0 + 32 * j + t;
                    int kvs[KPT_MASK_NK];
#pragma unroll
                    for (int f = 0; f < KPT_MASK_NK; f++)
                        kvs[f] = __shfl_sync(0xffffffffu, kv[j][f], t);
#pragma unroll
                    for (int e0 = 0; e0 < 2; e0++) {
                        const int qi = row0 + (lane >> 2) + e0 * 8;
                        const bool kp = (ki < A.Skv) & kpt_mask_pair(A, U, b, h, qi, ki, kvs);
                        drop |= (u32)!kp << (e0 * 2 + e1);
                    }
                }
                keep &= ~((u64)drop << ((4 * j + m) * 4));
            }
    }
#else
    if (partial) {
#if KPT_MASK_AUX
#pragma unroll 4
#else
#pragma unroll 1
#endif
        for (int n = 0; n < KPT_BN / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int qi = row0 + (lane >> 2) + (e >> 1) * 8;
                const int ki = k0 + n * 8 + (lane & 3) * 2 + (e & 1);
                const bool kp = (ki < A.Skv) & kpt_mask(A, U, b, h, qi, ki);
                keep &= ~((u64)!kp << (n * 4 + e));
            }
    }
#endif
    return keep;
}
#endif

#if KPT_MASK_BITS
// The stored keep bits of partial tile (qt, kt) (kpt_blockmap_bits): row block blk's words, with
// query rows (KR, key rows, is the backward's).
template <bool KR>
__device__ __forceinline__ u64 kpt_tile_bits(const kpt_args &A, const kpt_uniform &U, int b,
                                             int h, int qt, int kt, int blk, int lane)
{
    static_assert(!KR, "the forward's bits have query rows");
    return kpt_tile_keep(A, U, b, h, qt * KPT_BM + blk * 16, kt * KPT_BN, lane, true);
}
#endif

// Score mods, then masks on one tile of scores: thread rows row0 + lane / 4 (+ 8), keys from
// k0. A mask that reads aux data comes as the bits of kpt_tile_keep, others are evaluated here.
__device__ __forceinline__ void kpt_apply_tile(const kpt_args &A, const kpt_uniform &U,
                                               float (&S)[KPT_BN / 8][4], int b, int h, int row0,
                                               int k0, int lane, bool partial, u64 keep)
{
#if KPT_HAS_SCORE
#pragma unroll
    for (int n = 0; n < KPT_BN / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int qi = row0 + (lane >> 2) + (e >> 1) * 8;
            const int ki = k0 + n * 8 + (lane & 3) * 2 + (e & 1);
            S[n][e] = kpt_score(A, U, S[n][e] * A.scale, b, h, qi, ki);
        }
#endif
    if (partial) {
#if KPT_HAS_BLOCKMAP || (KPT_HAS_MASK && KPT_MASK_ROLLED)
#if !KPT_HAS_BLOCKMAP
        keep = kpt_tile_keep(A, U, b, h, row0, k0, lane, true);
#endif
#pragma unroll
        for (int n = 0; n < KPT_BN / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                S[n][e] = (keep >> (n * 4 + e)) & 1 ? S[n][e] : KPT_NINF;
#else
        (void)keep;
        KPT_MASK_UNROLL
        for (int n = 0; n < KPT_BN / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int ki = k0 + n * 8 + (lane & 3) * 2 + (e & 1);
                bool kp = ki < A.Skv;
#if KPT_HAS_MASK
                const int qi = row0 + (lane >> 2) + (e >> 1) * 8;
                kp = kp & kpt_mask(A, U, b, h, qi, ki);
#endif
                S[n][e] = kp ? S[n][e] : KPT_NINF;
            }
#endif
    }
}

// The keep bits of kv tile j where they are known before its scores are waited for: a partial
// tile's stored bits (slot >= 0: kpt_blockmap_bits computed them) or, for masks that read aux
// data, kpt_tile_keep's; all ones where kpt_apply_tile evaluates the mask itself.
__device__ __forceinline__ u64 kpt_keep(const kpt_args &A, const kpt_uniform &U, int b, int h,
                                        int row0, int j, int lane, bool partial, int slot)
{
#if KPT_MASK_BITS
    if (slot >= 0)
        return kpt_bits_word(A, false, slot, (row0 % KPT_BM) >> 4, lane);
#endif
#if KPT_HAS_BLOCKMAP
    return kpt_tile_keep(A, U, b, h, row0, j * KPT_BN, lane, partial);
#else
    (void)slot;
    return ~0ull;
#endif
}

// A consumer whose 64 rows all lie past Sq (the last q tile of a length that is not a multiple
// of 192, with three consumers): its share of an item without products. It waits for each
// tile's K and V and hands them back, and takes its turns, as kpt_consume does (the ring's and
// the turns' counts stay those of a working consumer; the CTA's first hand-off is made by
// kpt_consume before it comes here), but computes nothing (at 1000 tokens, two of the last q
// tile's three consumers). Returns the number of tiles consumed.
__device__ __forceinline__ u32 kpt_consume_idle(const kpt_args &A, const unsigned char *cls,
                                                u32 bar, int c, u32 ring, int b, int h, int qt,
                                                int lo, int hi)
{
    const int q0 = qt * KPT_BM, q1 = min(q0 + KPT_BM, A.Sq) - 1;
    u32 i = ring;
    for (int j = lo; j <= hi; i++) {
        const int jn = kpt_next_tile(A, cls, b, h, qt, q0, q1, j, hi);
        const u32 s = i % KPT_STAGES, sp = (i - 1) % KPT_STAGES;
        kpt_mbar_wait(bar + 8 * KPT_BAR_KF(s), (i / KPT_STAGES) & 1);
        if (j > lo)
            kpt_mbar_wait(bar + 8 * KPT_BAR_VF(sp), ((i - 1) / KPT_STAGES) & 1);
        kpt_turn_wait(c);
        kpt_turn_give(c);
        kpt_mbar_arrive(bar + 8 * KPT_BAR_KE(s));
        if (j > lo)
            kpt_mbar_arrive(bar + 8 * KPT_BAR_VE(sp));
        if (jn > hi)
            kpt_mbar_arrive(bar + 8 * KPT_BAR_QE);
        j = jn;
    }
    const u32 s = (i - 1) % KPT_STAGES; // the last tile's V
    kpt_mbar_wait(bar + 8 * KPT_BAR_VF(s), ((i - 1) / KPT_STAGES) & 1);
    kpt_turn_wait(c);
    kpt_turn_give(c);
    kpt_mbar_arrive(bar + 8 * KPT_BAR_VE(s));
    return i - ring;
}

// One consumer warpgroup's work on one item: its 64 rows of the q tile against the live kv
// tiles [lo, hi] (`ring`: tiles consumed before this item), O left unnormalised in registers
// with its row maxima and sums. Hands Q back (KPT_BAR_QE) as soon as its last product S is
// done, so the producer loads the next item's Q during this item's last tile and epilogue.
// Returns the number of tiles consumed.
__device__ __forceinline__ u32 kpt_consume(const kpt_args &A, const kpt_uniform &U,
                                           const unsigned char *cls, u32 bar,
                                           const kpt_qdesc &dq, u32 sK, u32 sV, int c, u32 ring,
                                           int b, int h, int qt, int row0, int lane, int lo,
                                           int hi, float sc, float (&O)[KPT_DV / 8][4],
                                           float (&m)[2], float (&l)[2])
{
    if (lo > hi) {
        kpt_mbar_arrive(bar + 8 * KPT_BAR_QE);
        return 0;
    }
    if (c == KPT_NCONS - 1 && ring == 0)
        kpt_turn_give(c); // consumer 0 takes the CTA's first turn
    if (KPT_NCONS > 2 && qt * KPT_BM + c * 64 >= A.Sq)
        return kpt_consume_idle(A, cls, bar, c, ring, b, h, qt, lo, hi);
    const int q0 = qt * KPT_BM, q1 = min(q0 + KPT_BM, A.Sq) - 1;
    // the slot of the next partial tile's keep bits (the item's partial tiles have consecutive
    // slots), or -1
    int slot = kpt_bits_base(A, false, b, h, qt);
    float S[KPT_BN / 8][4], alpha[2] = {1.0f, 1.0f};
    u32 P[KPT_BN / 16][4];
    bool grew = false;
    // the first live tile: its scores, then its probabilities
    int j = lo;
    u32 i = ring; // unsigned, as in kpt_produce
    int jn = kpt_next_tile(A, cls, b, h, qt, q0, q1, j, hi);
    {
        const u32 s = i % KPT_STAGES;
        kpt_mbar_wait(bar + 8 * KPT_BAR_KF(s), (i / KPT_STAGES) & 1);
        kpt_turn_wait(c);
        kpt_issue_s(S, dq, sK + s * KPT_K_BYTES);
        kpt_turn_give(c);
        const int cj = kpt_class_of(A, cls, b, h, qt, q0, q1, j);
        const bool partial = cj != 2 || (j + 1) * KPT_BN > A.Skv;
        const u64 keep = kpt_keep(A, U, b, h, row0, j, lane, partial, kpt_bits_take(cj, slot));
        kpt_wgmma_wait<0>();
        kpt_wgmma_regs<KPT_BN / 2>(&S[0][0]);
        kpt_mbar_arrive(bar + 8 * KPT_BAR_KE(s));
        if (jn > hi)
            kpt_mbar_arrive(bar + 8 * KPT_BAR_QE);
        kpt_apply_tile(A, U, S, b, h, row0, j * KPT_BN, lane, partial, keep);
        grew = __any_sync(0xffffffffu, kpt_softmax_max(S, m, l, sc, alpha));
        kpt_softmax_exp(S, m, l, sc);
        kpt_frags<KPT_BN>(P, S);
    }
    // Then, per tile: S of tile j is issued, O of the previous tile rescaled and its P V
    // issued; the softmax of tile j runs while P V does.
    while (jn <= hi) {
        const u32 ip = i;
        j = jn;
        i++;
        jn = kpt_next_tile(A, cls, b, h, qt, q0, q1, j, hi);
        const u32 s = i % KPT_STAGES, sp = ip % KPT_STAGES;
        kpt_mbar_wait(bar + 8 * KPT_BAR_KF(s), (i / KPT_STAGES) & 1);
        kpt_turn_wait(c);
        kpt_issue_s(S, dq, sK + s * KPT_K_BYTES);
        if (grew)
            kpt_rescale_rows(O, alpha);
        kpt_mbar_wait(bar + 8 * KPT_BAR_VF(sp), (ip / KPT_STAGES) & 1);
        kpt_issue_pv(O, P, sV + sp * KPT_V_BYTES);
        kpt_turn_give(c);
        const int cj = kpt_class_of(A, cls, b, h, qt, q0, q1, j);
        const bool partial = cj != 2 || (j + 1) * KPT_BN > A.Skv;
        const u64 keep = kpt_keep(A, U, b, h, row0, j, lane, partial, kpt_bits_take(cj, slot));
        kpt_wgmma_wait<1>();
        kpt_wgmma_regs<KPT_BN / 2>(&S[0][0]);
        kpt_mbar_arrive(bar + 8 * KPT_BAR_KE(s));
        if (jn > hi)
            kpt_mbar_arrive(bar + 8 * KPT_BAR_QE);
        kpt_apply_tile(A, U, S, b, h, row0, j * KPT_BN, lane, partial, keep);
        grew = __any_sync(0xffffffffu, kpt_softmax_max(S, m, l, sc, alpha));
        kpt_softmax_exp(S, m, l, sc);
        kpt_wgmma_wait<0>();
        kpt_wgmma_regs<KPT_DV / 2>(&O[0][0]);
        kpt_mbar_arrive(bar + 8 * KPT_BAR_VE(sp));
        kpt_frags<KPT_BN>(P, S);
    }
    // the last tile's P V
    const u32 s = i % KPT_STAGES;
    if (grew)
        kpt_rescale_rows(O, alpha);
    kpt_mbar_wait(bar + 8 * KPT_BAR_VF(s), (i / KPT_STAGES) & 1);
    kpt_turn_wait(c);
    kpt_issue_pv(O, P, sV + s * KPT_V_BYTES);
    kpt_turn_give(c);
    kpt_wgmma_wait<0>();
    kpt_wgmma_regs<KPT_DV / 2>(&O[0][0]);
    kpt_mbar_arrive(bar + 8 * KPT_BAR_VE(s));
    return i + 1 - ring;
}

#if KPT_O_TMA
// The epilogue through shared memory (KPT_O_TMA, plan.o_tma: Dv up to 128), a staging tile of 64
// rows a consumer after the K and V ring: this consumer's 64 rows of O, normalised, as 8x8 matrices
// (stmatrix) into its staging tile in the map's layout (per 64 columns, 64 rows of 128 bytes,
// 16-byte chunks swizzled by row mod 8), then TMA stores of the tile by the consumer's first
// thread, which first waits until its stores of the item before have read the tile. Rows past
// Sq lie outside the map and are not written. Named barrier KPT_NB_EPI + c.
__device__ __forceinline__ void kpt_store_rows_tma(const kpt_args &A, const kpt_tma &T, int b,
                                                   int h, int qt, int c, int row0, int lane,
                                                   u32 sO, const float (&O)[KPT_DV / 8][4],
                                                   const float *m, const float *l)
{
    float inv[2];
#pragma unroll
    for (int r = 0; r < 2; r++)
        inv[r] = kpt_finish_row(A, b, h, row0 + (lane >> 2) + r * 8, lane, m[r], l[r]);
    const bool lead = (threadIdx.x & 127) == 0;
    const u32 tile = sO + c * 64 * KPT_DV * 2;
    if (lead)
        kpt_bulk_wait<0, true>();
    kpt_bar_sync(KPT_NB_EPI + c, 128);
    kpt_stage_rows<KPT_DV, 64>(O, tile, row0 & 63, inv[0], inv[1], lane);
    kpt_fence_proxy_async();
    kpt_bar_sync(KPT_NB_EPI + c, 128);
    if (lead) {
        kpt_tma_store_tile<64, KPT_DV>(&T.o, tile, qt * KPT_BM + c * 64, h * T.ho, b * T.bo);
        kpt_bulk_commit();
    }
}
#endif

extern "C" __global__ void __launch_bounds__(KPT_THREADS, 1)
kpt_attention(const kpt_args A, const __grid_constant__ kpt_tma T)
{
    extern __shared__ __align__(16) unsigned char kpt_smem[];
    __shared__ __align__(8) u64 s_bar[KPT_NBARS];
#if KPT_HAS_MASK
    __shared__ kpt_item_tiles s_tiles[2];
#else
    kpt_item_tiles *s_tiles = 0;
#endif
    // swizzle atoms repeat every 1024 bytes: the tiles start 1024-byte aligned (the plan adds
    // the slack)
    const u32 sQ = (kpt_smem_addr(kpt_smem) + 1023u) & ~1023u;
    const u32 sK = sQ + KPT_BM * KPT_DQK * 2;
    const u32 sV = sK + KPT_STAGES * KPT_K_BYTES;
    const u32 bar = kpt_smem_addr(s_bar);

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, wg = warp >> 2;
    if (tid == 0) {
        kpt_mbar_init(bar + 8 * KPT_BAR_Q, 1);
        kpt_mbar_init(bar + 8 * KPT_BAR_QE, KPT_CONSUMERS);
        for (int s = 0; s < KPT_STAGES; s++) {
            kpt_mbar_init(bar + 8 * KPT_BAR_KF(s), 1);
            kpt_mbar_init(bar + 8 * KPT_BAR_VF(s), 1);
            kpt_mbar_init(bar + 8 * KPT_BAR_KE(s), KPT_CONSUMERS);
            kpt_mbar_init(bar + 8 * KPT_BAR_VE(s), KPT_CONSUMERS);
        }
        for (int s = 0; s < 2; s++) {
            kpt_mbar_init(bar + 8 * KPT_BAR_IF(s), 32); // the scheduler warp's lanes
            kpt_mbar_init(bar + 8 * KPT_BAR_IE(s), KPT_CONSUMERS + 1); // and the producer
        }
        kpt_mbar_init_fence();
        kpt_tail_init(A);
    }
    __syncthreads();
    int qt, h, b;
#if KPT_HAS_MASK
    if (kpt_item(A, 0, qt, h, b)) { // always: the runtime launches no more CTAs than items
        const int q0 = qt * KPT_BM;
        int lo, hi;
        kpt_live_tiles(A, b, h, qt, q0, min(q0 + KPT_BM, A.Sq) - 1, s_tiles[0].cls,
                       &s_tiles[0].lo, &s_tiles[0].hi, lo, hi);
    }
#endif

    if (wg == 0) {
        kpt_regs_dec<KPT_PRODUCER_REGS>();
        if (tid == 0)
            kpt_producer(A, T, s_tiles, bar, sQ, sK, sV);
#if KPT_HAS_MASK
        else if (warp == 1)
            kpt_scheduler(A, s_tiles, bar, lane);
#endif
        return;
    }
    kpt_regs_inc<KPT_CONSUMER_REGS>();

    // This consumer warpgroup: c for addresses, and cu, the same through a shuffle, for the
    // turns and the branches on them, which the compiler then knows to be taken alike by every
    // lane. Branching on c itself in the item loop had the K and V descriptors made in regular
    // registers and moved to uniform ones for each product (~120 instructions more, causal 1k
    // 2-3 % slower); cu everywhere instead cost softcap+causal at 16k 3-4 % (H100). Code that
    // one thread runs alone inside the tile loop (a wait for TMA stores) did the same to the
    // descriptors: 637 -> 753 instructions a tile (docs/BENCHMARKS.md, "Item boundaries").
    const int c = wg - 1, cu = __shfl_sync(0xffffffffu, c, 0);
    const kpt_qdesc dq = kpt_q_descs(sQ + c * 64 * 128); // its 64 rows of Q
    u32 ring = 0;
    for (int n = 0; kpt_item(A, n, qt, h, b); n++) {
        int lo = 0, hi = A.n_kt - 1;
        const unsigned char *cls = 0;
#if KPT_HAS_MASK
        const kpt_item_tiles &it = s_tiles[n & 1];
        if (n > 0) // as in kpt_producer
            kpt_mbar_wait(bar + 8 * KPT_BAR_IF(n & 1), kpt_item_full_parity(n));
        lo = it.lo;
        hi = it.hi;
        cls = it.cls;
#endif
        const int row0 = qt * KPT_BM + c * 64 + (warp & 3) * 16; // this warp's first row
        kpt_uniform U;
        kpt_uniform_init(A, b, h, U);
        float O[KPT_DV / 8][4], m[2], l[2];
#pragma unroll
        for (int x = 0; x < KPT_DV / 8; x++)
#pragma unroll
            for (int e = 0; e < 4; e++) O[x][e] = 0.0f;
        m[0] = m[1] = KPT_NINF;
        l[0] = l[1] = 0.0f;

        kpt_mbar_wait(bar + 8 * KPT_BAR_Q, n & 1);
#if !KPT_HAS_SCORE
        // as in the sm_80 kernel: the scale folds into the exponent; a negative one negates
        // this warpgroup's rows of Q (fenced for the async proxy, then published to the
        // warpgroup)
        if (A.scale_log2 < 0.0f && lo <= hi) {
            u32 *q = (u32 *)(kpt_smem + (sQ - kpt_smem_addr(kpt_smem)));
#pragma unroll 1
            for (int blk = 0; blk < KPT_DQK / 64; blk++)
                for (int x = tid - 128 - c * 128; x < 64 * 32; x += 128)
                    q[blk * KPT_BM * 32 + c * 64 * 32 + x] ^= 0x80008000u;
            kpt_fence_proxy_async();
            kpt_bar_sync(KPT_NB_NEG + c, 128);
        }
        const float sc = fabsf(A.scale_log2);
#else
        const float sc = KPT_LOG2E;
#endif
        ring += kpt_consume(A, U, cls, bar, dq, sK, sV, cu, ring, b, h, qt, row0, lane, lo, hi, sc,
                            O, m, l);
#if KPT_HAS_MASK
        kpt_mbar_arrive(bar + 8 * KPT_BAR_IE(n & 1));
#endif
        // Epilogue: normalise, write O (and LSE).
#if KPT_O_TMA
        kpt_store_rows_tma(A, T, b, h, qt, c, row0, lane, sV + KPT_STAGES * KPT_V_BYTES, O, m, l);
#else
        kpt_store_rows(A, b, h, row0, lane, O, m, l);
#endif
    }
    if (cu == 0 && ring > 0)
        kpt_turn_wait(cu); // the last consumer's last turn
#if KPT_O_TMA
    if ((tid & 127) == 0)
        kpt_bulk_wait<0, false>(); // the staging tile is read before the CTA's shared memory goes
#endif
}
