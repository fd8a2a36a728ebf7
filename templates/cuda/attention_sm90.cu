// The sm_90a attention kernel (Hopper: TMA, mbarriers, warpgroup MMA, warp specialisation),
// inserted into templates/cuda/common.cu by codegen/cuda_source.c for cuda:sm_90a.
//
// One CTA of three warpgroups owns one (q tile of 128 rows, head, batch row). Warpgroup 0 is the
// producer: it gives most of its registers away (setmaxnreg) and one of its threads issues TMA
// bulk tensor copies of Q once and of K and V tile by tile into a ring of KPT_STAGES stages in
// shared memory, each stage completing on an mbarrier ("full") and handed back by the consumers
// on another ("empty"). Warpgroups 1 and 2 are consumers of 64 rows each: S = Q K^T and O += P V
// are wgmma.mma_async (Q and K K-major from the 128-byte-swizzled shared tiles TMA writes, P from
// registers, V as an N-major operand). Within a consumer, the product S of the next kv tile runs
// while the softmax of the current one does; between the two consumers, named barriers take
// turns (ping-pong) so one issues its products while the other does its softmax. Each warp holds
// 16 rows in the sm_80 kernel's m16 accumulator layout, so masks, score mods, the online softmax
// and the epilogue are the same code (common.cu).

// One k step of O (64 x 128, f32) += P (64 x 16, registers, the mma.sync A-fragment layout per
// warp; operands pk) * V (16 x 128, shared, MN-major: N contiguous), V's descriptor %96 plus off
// (in 16-byte units of the 14-bit address field, which does not carry: shared addresses stay
// below 256 KB).
#define KPT_WG_RS128(pk, off)                                                                      \
    "add.s64 v, %96, " off ";\n"                                                                   \
    "wgmma.mma_async.sync.aligned.m64n128k16.f32." KPT_WG_T "." KPT_WG_T " " KPT_ACC64 "}, {" pk  \
    "}, v, t, 1, 1, 1;\n"
// O (64 x 128) += P V over a tile's KPT_BN keys, V's descriptor stepping 16 rows (2048 bytes) a
// k step. All k steps in one asm statement: NVVM's time grows with each statement of ~70
// operands, and one rather than eight takes ~5 % off the kernel's compile time at no cost in
// speed. (At D = 64 the same ran 3-8 % slower, H100: kpt_issue_pv keeps a statement per step.)
#if KPT_BN == 128 && KPT_DV == 128
__device__ __forceinline__ void kpt_wgmma_pv128(float *d, const u32 (&a)[KPT_BN / 16][4], u64 dv)
{
    asm volatile("{\n.reg .pred t;\n.reg .b64 v;\nsetp.eq.b32 t, 0, 0;\n"
                 KPT_WG_RS128("%64, %65, %66, %67", "0") KPT_WG_RS128("%68, %69, %70, %71", "128")
                 KPT_WG_RS128("%72, %73, %74, %75", "256") KPT_WG_RS128("%76, %77, %78, %79", "384")
                 KPT_WG_RS128("%80, %81, %82, %83", "512") KPT_WG_RS128("%84, %85, %86, %87", "640")
                 KPT_WG_RS128("%88, %89, %90, %91", "768") KPT_WG_RS128("%92, %93, %94, %95", "896")
                 "}\n"
                 : KPT_D64
                 : KPT_P32, "l"(dv));
}
#endif
// The TMA tensor maps of Q, K and V (the runtime builds them with cuTensorMapEncodeTiled:
// dims D, S, heads, batch; boxes of 64 columns x a tile's rows, 128-byte swizzle) and, per tensor,
// the factors of the head and batch coordinates (0 where the tensor broadcasts that dim with a
// zero stride and the map has extent 1 there). Host twin: kpt_kernel_tma in
// runtime/kernel_args.h.
struct __align__(64) kpt_tmap {
    u64 w[16];
};
struct kpt_tma {
    kpt_tmap q, k, v;
    int hq, bq, hk, bk, hv, bv;
};
static_assert(sizeof(kpt_tma) == 448, "kpt_tma layout");

#define KPT_PRODUCER_REGS 24 // 128 x 24 + 256 x 240 = 384 x 168, what the CTA is given
#define KPT_CONSUMER_REGS 240
#ifndef KPT_PINGPONG
#define KPT_PINGPONG 1
#endif

// The mbarriers, in static shared memory: Q's, then per stage K full, V full, K empty, V empty.
#define KPT_BAR_Q 0
#define KPT_BAR_KF(s) (1 + (s))
#define KPT_BAR_VF(s) (1 + KPT_STAGES + (s))
#define KPT_BAR_KE(s) (1 + 2 * KPT_STAGES + (s))
#define KPT_BAR_VE(s) (1 + 3 * KPT_STAGES + (s))
#define KPT_NBARS (1 + 4 * KPT_STAGES)
#define KPT_CONSUMERS 256 // threads of the two consumer warpgroups
#define KPT_K_BYTES (KPT_BN * KPT_DQK * 2)
#define KPT_V_BYTES (KPT_BN * KPT_DV * 2)

// The producer (one thread): Q once, then K and V of every live tile into the ring, each stage
// refilled once the consumers have handed it back.
__device__ __forceinline__ void kpt_produce(const kpt_args &A, const kpt_tma &T,
                                            const unsigned char *cls, u32 bar, u32 sQ, u32 sK,
                                            u32 sV, int b, int h, int hk, int qt, int q0, int q1,
                                            int lo, int hi)
{
    kpt_mbar_expect_tx(bar + 8 * KPT_BAR_Q, KPT_BM * KPT_DQK * 2);
    kpt_tma_tile<KPT_BM, KPT_DQK>(sQ, &T.q, q0, h * T.hq, b * T.bq, bar + 8 * KPT_BAR_Q);
    int i = 0;
    for (int j = lo; j <= hi; j = kpt_next_tile(A, cls, b, h, qt, q0, q1, j, hi), i++) {
        const int s = i % KPT_STAGES;
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
}

// Ping-pong of the two consumer warpgroups (named barriers 1 and 2): warpgroup c waits for its
// turn before issuing its products and, once they are issued, gives the turn to the other.
__device__ __forceinline__ void kpt_turn_wait(int c)
{
#if KPT_PINGPONG
    kpt_bar_sync(1 + c, KPT_CONSUMERS);
#endif
}
__device__ __forceinline__ void kpt_turn_give(int c)
{
#if KPT_PINGPONG
    kpt_bar_arrive(2 - c, KPT_CONSUMERS);
#endif
}

// S = Q K^T for one warpgroup's 64 rows (Q block qa) against a kv tile at tK, issued and
// committed, not waited for. The first k step ignores S's old contents.
__device__ __forceinline__ void kpt_issue_s(float (&S)[KPT_BN / 8][4], u32 qa, u32 tK)
{
    kpt_wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < KPT_DQK / 16; kk++) {
        const u32 kb = (u32)((kk & 3) * 32); // 16 elements within a 64-column block
        const u64 da = kpt_sw128_desc(qa + (kk >> 2) * KPT_BM * 128 + kb, 16, 1024);
        const u64 db = kpt_sw128_desc(tK + (kk >> 2) * KPT_BN * 128 + kb, 16, 1024);
#if KPT_BN == 128
        kpt_wgmma_ss_n128(&S[0][0], da, db, kk > 0);
#else
        kpt_wgmma_ss_n64(&S[0][0], da, db, kk > 0);
#endif
    }
    kpt_wgmma_commit();
}
// O += P V: P from registers (the A-fragment layout), V N-major from shared memory; the leading
// byte offset steps over 64-column blocks of V, the stride over 8-row groups. Issued and
// committed, not waited for.
__device__ __forceinline__ void kpt_issue_pv(float (&O)[KPT_DV / 8][4],
                                             const u32 (&P)[KPT_BN / 16][4], u32 tV)
{
    kpt_wgmma_fence();
#if KPT_DV == 128 && KPT_BN == 128
    kpt_wgmma_pv128(&O[0][0], P, kpt_sw128_desc(tV, KPT_BN * 128, 1024));
#else
#pragma unroll
    for (int kk = 0; kk < KPT_BN / 16; kk++) {
        const u64 dv = kpt_sw128_desc(tV + kk * 16 * 128, KPT_BN * 128, 1024);
#if KPT_DV == 64
        kpt_wgmma_rs_n64(&O[0][0], P[kk], dv, 1);
#elif KPT_DV == 128
        kpt_wgmma_rs_n128(&O[0][0], P[kk], dv);
#else
        kpt_wgmma_rs_n256(&O[0][0], P[kk], dv);
#endif
    }
#endif
    kpt_wgmma_commit();
}

#if KPT_HAS_BLOCKMAP || (KPT_HAS_MASK && KPT_MASK_ROLLED)
// Which pairs of a partial tile the mask keeps, one bit per score of this thread (bit n * 4 + e
// for S[n][e]; rows row0 + lane / 4 (+ 8), keys from k0), without touching S. For masks that read
// aux data it is computed before the scores are waited for, so the loads' latency hides behind
// the product, in a loop unrolled only in part, so the loads' registers stay few while S, O and
// P hold most of them. A large mask (rolled, KPT_MASK_ROLLED) is evaluated here in a loop not
// unrolled at all: indexing S in such a loop would put the wgmma accumulators in local memory,
// and ptxas then serialises the warpgroup MMAs.
__device__ __forceinline__ u64 kpt_tile_keep(const kpt_args &A, const kpt_uniform &U, int b,
                                             int h, int row0, int k0, int lane, bool partial)
{
    u64 keep = ~0ull;
#if KPT_MASK_NK > 0 && !KPT_HAS_BLOCKMAP
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
#if KPT_HAS_BLOCKMAP
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

// The keep bits of kv tile j for masks that read aux data (kpt_tile_keep); all ones for the
// others, whose partial tiles kpt_apply_tile evaluates itself.
#if KPT_HAS_BLOCKMAP
#define KPT_TILE_KEEP(j, partial)                                                                  \
    kpt_tile_keep(A, U, b, h, row0, (j) * KPT_BN, lane, partial)
#else
#define KPT_TILE_KEEP(j, partial) (~0ull)
#endif

// This CTA's q tile, head and batch row. Without a block map, blockIdx order with the last q
// tiles (the heaviest under causal masks) first. With one, CTAs go by decreasing work over all
// heads and batch rows (rank r of every (batch row, head), then rank r + 1), each (batch row,
// head) taking its q tiles in kpt_blockmap_order's order: the few long CTAs (a document
// boundary crossing the q tile makes all its tiles partial) start first rather than last.
__device__ __forceinline__ void kpt_cta_tile(const kpt_args &A, int &qt, int &h, int &b)
{
#if KPT_HAS_BLOCKMAP
    // the runtime keeps n_qt * Hq * B below 2^31 (cuda_backend.c)
    const u32 hb = (u32)A.Hq * (u32)A.B;
    const u32 L = blockIdx.x + (u32)A.n_qt * (blockIdx.y + (u32)A.Hq * blockIdx.z);
    const u32 r = L / hb, rest = L - r * hb;
    h = (int)(rest % (u32)A.Hq);
    b = (int)(rest / (u32)A.Hq);
    qt = kpt_order_row(A, b, h)[r];
#else
    qt = A.n_qt - 1 - (int)blockIdx.x;
    h = blockIdx.y;
    b = blockIdx.z;
#endif
}

extern "C" __global__ void __launch_bounds__(KPT_THREADS, 1)
kpt_attention(const kpt_args A, const __grid_constant__ kpt_tma T)
{
    extern __shared__ __align__(16) unsigned char kpt_smem[];
    __shared__ __align__(8) u64 s_bar[KPT_NBARS];
    // swizzle atoms repeat every 1024 bytes: the tiles start 1024-byte aligned (the plan adds
    // the slack)
    const u32 sQ = (kpt_smem_addr(kpt_smem) + 1023u) & ~1023u;
    const u32 sK = sQ + KPT_BM * KPT_DQK * 2;
    const u32 sV = sK + KPT_STAGES * KPT_K_BYTES;
    const u32 bar = kpt_smem_addr(s_bar);

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, wg = warp >> 2;
    int qt, h, b;
    kpt_cta_tile(A, qt, h, b);
    const int hk = h / A.group;
    const int q0 = qt * KPT_BM;
    const int q1 = min(q0 + KPT_BM, A.Sq) - 1;

    // The kv tiles that may hold a kept pair lie in [lo, hi].
    int lo = 0, hi = A.n_kt - 1;
#if KPT_HAS_MASK
    __shared__ int s_lo, s_hi;
    __shared__ unsigned char s_cls[KPT_CLS_CAP];
    kpt_live_tiles(A, b, h, qt, q0, q1, s_cls, &s_lo, &s_hi, lo, hi);
#else
    const unsigned char *s_cls = 0;
#endif
    if (tid == 0) {
        kpt_mbar_init(bar + 8 * KPT_BAR_Q, 1);
        for (int s = 0; s < KPT_STAGES; s++) {
            kpt_mbar_init(bar + 8 * KPT_BAR_KF(s), 1);
            kpt_mbar_init(bar + 8 * KPT_BAR_VF(s), 1);
            kpt_mbar_init(bar + 8 * KPT_BAR_KE(s), KPT_CONSUMERS);
            kpt_mbar_init(bar + 8 * KPT_BAR_VE(s), KPT_CONSUMERS);
        }
        kpt_mbar_init_fence();
    }
    __syncthreads();

    if (wg == 0) {
        kpt_regs_dec<KPT_PRODUCER_REGS>();
        if (tid == 0)
            kpt_produce(A, T, s_cls, bar, sQ, sK, sV, b, h, hk, qt, q0, q1, lo, hi);
        return;
    }
    kpt_regs_inc<KPT_CONSUMER_REGS>();

    const int c = wg - 1;                        // this consumer warpgroup
    const int row0 = q0 + c * 64 + (warp & 3) * 16; // this warp's first row
    const u32 qa = sQ + c * 64 * 128;            // its 64 rows of Q
    kpt_uniform U;
    kpt_uniform_init(A, b, h, U);

    float O[KPT_DV / 8][4];
    float m[2], l[2], alpha[2] = {1.0f, 1.0f};
#pragma unroll
    for (int n = 0; n < KPT_DV / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) O[n][e] = 0.0f;
    m[0] = m[1] = KPT_NINF;
    l[0] = l[1] = 0.0f;

    kpt_mbar_wait(bar + 8 * KPT_BAR_Q, 0);
#if !KPT_HAS_SCORE
    // as in the sm_80 kernel: the scale folds into the exponent; a negative one negates this
    // warpgroup's rows of Q (fenced for the async proxy, then published to the warpgroup)
    if (A.scale_log2 < 0.0f) {
        u32 *q = (u32 *)(kpt_smem + (sQ - kpt_smem_addr(kpt_smem)));
#pragma unroll 1
        for (int blk = 0; blk < KPT_DQK / 64; blk++)
            for (int i = tid - 128 - c * 128; i < 64 * 32; i += 128)
                q[blk * KPT_BM * 32 + c * 64 * 32 + i] ^= 0x80008000u;
        kpt_fence_proxy_async();
        kpt_bar_sync(3 + c, 128);
    }
    const float sc = fabsf(A.scale_log2);
#else
    const float sc = KPT_LOG2E;
#endif

    if (lo <= hi) {
        float S[KPT_BN / 8][4];
        u32 P[KPT_BN / 16][4];
        bool grew = false;
#if KPT_PINGPONG
        if (c == 1)
            kpt_bar_arrive(1, KPT_CONSUMERS); // consumer 0 takes the first turn
#endif
        // the first live tile: its scores, then its probabilities
        int j = lo, i = 0;
        int jn = kpt_next_tile(A, s_cls, b, h, qt, q0, q1, j, hi);
        kpt_mbar_wait(bar + 8 * KPT_BAR_KF(0), 0);
        kpt_turn_wait(c);
        kpt_issue_s(S, qa, sK);
        if (c == 0 || jn <= hi)
            kpt_turn_give(c);
        {
            const bool partial = kpt_class_of(A, s_cls, b, h, qt, q0, q1, j) != 2 ||
                                 (j + 1) * KPT_BN > A.Skv;
            const u64 keep = KPT_TILE_KEEP(j, partial);
            kpt_wgmma_wait<0>();
            kpt_wgmma_regs<KPT_BN / 2>(&S[0][0]);
            kpt_mbar_arrive(bar + 8 * KPT_BAR_KE(0));
            kpt_apply_tile(A, U, S, b, h, row0, j * KPT_BN, lane, partial, keep);
            grew = __any_sync(0xffffffffu, kpt_softmax_max(S, m, l, sc, alpha));
            kpt_softmax_exp(S, m, l, sc);
            kpt_frags<KPT_BN>(P, S);
        }
        // Then, per tile: S of tile j is issued, O of the previous tile rescaled and its P V
        // issued; the softmax of tile j runs while P V does.
        while (jn <= hi) {
            const int ip = i;
            j = jn;
            i++;
            jn = kpt_next_tile(A, s_cls, b, h, qt, q0, q1, j, hi);
            const int s = i % KPT_STAGES, sp = ip % KPT_STAGES;
            kpt_mbar_wait(bar + 8 * KPT_BAR_KF(s), (i / KPT_STAGES) & 1);
            kpt_turn_wait(c);
            kpt_issue_s(S, qa, sK + s * KPT_K_BYTES);
            if (grew)
                kpt_rescale_rows(O, alpha);
            kpt_mbar_wait(bar + 8 * KPT_BAR_VF(sp), (ip / KPT_STAGES) & 1);
            kpt_issue_pv(O, P, sV + sp * KPT_V_BYTES);
            if (c == 0 || jn <= hi)
                kpt_turn_give(c);
            const bool partial = kpt_class_of(A, s_cls, b, h, qt, q0, q1, j) != 2 ||
                                 (j + 1) * KPT_BN > A.Skv;
            const u64 keep = KPT_TILE_KEEP(j, partial);
            kpt_wgmma_wait<1>();
            kpt_wgmma_regs<KPT_BN / 2>(&S[0][0]);
            kpt_mbar_arrive(bar + 8 * KPT_BAR_KE(s));
            kpt_apply_tile(A, U, S, b, h, row0, j * KPT_BN, lane, partial, keep);
            grew = __any_sync(0xffffffffu, kpt_softmax_max(S, m, l, sc, alpha));
            kpt_softmax_exp(S, m, l, sc);
            kpt_wgmma_wait<0>();
            kpt_wgmma_regs<KPT_DV / 2>(&O[0][0]);
            kpt_mbar_arrive(bar + 8 * KPT_BAR_VE(sp));
            kpt_frags<KPT_BN>(P, S);
        }
        // the last tile's P V
        const int s = i % KPT_STAGES;
        if (grew)
            kpt_rescale_rows(O, alpha);
        kpt_mbar_wait(bar + 8 * KPT_BAR_VF(s), (i / KPT_STAGES) & 1);
        kpt_issue_pv(O, P, sV + s * KPT_V_BYTES);
        kpt_wgmma_wait<0>();
        kpt_wgmma_regs<KPT_DV / 2>(&O[0][0]);
        kpt_mbar_arrive(bar + 8 * KPT_BAR_VE(s));
    }

    // Epilogue: normalise, write O (and LSE).
    kpt_store_rows(A, b, h, row0, lane, O, m, l);
}
