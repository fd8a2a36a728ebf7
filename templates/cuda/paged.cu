// The serving kernels (kind "paged"), inserted into templates/cuda/common.cu by
// codegen/cuda_source.c: ragged queries (cu_seqlens) against a paged or contiguous KV cache,
// split over the keys (flash-decoding), and the combine that merges the splits by their LSE.
//
// Positions are logical (docs/serving.md): sequence b has kv_len keys and q_len new queries, its
// query i sits at position kv_len - q_len + i, and the pattern sees Sq = Skv = kv_len, so a
// causal mask is bottom-right. A CTA owns one (sequence, block of its queries, kv head, split):
// its rows are the block's query tokens times the kv head's query heads (row r is token r / group,
// head hk * group + r % group), so each K/V byte is read once for the whole GQA group. Its four
// warps split the rows (WR blocks of 16) and the keys of each tile (WK = 4 / WR slices; past
// head dim 128 O's columns instead, KPT_PG_DVSPLIT, and the tiles have 32 keys instead of 64:
// compiler/plan_tiles_cuda.c), and merge their softmax states through shared memory at the end.
// On sm_90a at head dims 64 and 128 the tiles are swizzled and a CTA of 64 rows computes its
// products as one warpgroup (KPT_PG_WG, kpt_pg_wg_s and kpt_pg_wg_pv); 16 and 32 rows keep
// mma.sync.

// The serving arguments; runtime/kernel_args.h holds the host twin (kpt_kernel_pargs).
struct kpt_pargs {
    u64 page_table, cu_q, kv_lens, sinks, part_o, part_lse;
    i64 pt_stride, sink_stride; // elements between page-table rows / sink values
    int page_size, page_shift;  // rows per page; log2 of it, or -1 when not a power of two
    int num_pages, max_pages;   // pages in the cache; page-table columns
    int T;                      // query rows of q and o
    int splits, q_blocks, q_per_block; // grid x: blocks * splits; y: kv heads
    int rows;                   // q_per_block * group
    int paged;                  // 0: no page table, sequence b's keys are the cache's row b
    int stages;                 // the ring's depth this launch: KPT_STAGES or plan.stages_deep
    int packed;                 // blocks follow cu_q (kpt_pg_seq_of); q_blocks: the launch's
    int cluster;                // a block's splits are a cluster and combine there (KPT_PG_CLUSTER)
    int reserved;
};
static_assert(sizeof(kpt_pargs) == 120, "kpt_pargs layout");

#define KPT_PG_ROWS 64 // rows of a CTA at most (and of each partial result in the workspace)
#define KPT_PG_OS (KPT_DV + 8) // floats a row of O in the warps' merge (plan_paged's scratch)
#define KPT_PG_NAN __int_as_float(0x7fc00000)
#define KPT_PAGED_MAX_SPLITS_DEV 256 // twin of KPT_PAGED_MAX_SPLITS (runtime/paged_args.h)

#define KPT_PG_PT_CAP 2048 // page ids of a CTA's key range staged in shared memory at a time
#define KPT_PG_NEVER 0x7fffffff

// Shared tiles (Q, and the ring's K and V). On sm_90a (head dims 64 and 128, plan_paged) they
// are laid out as TMA's 128-byte swizzle lays them (per 64 columns a block of ROWS rows of 128
// bytes, a row's 16-byte chunks permuted by the row's low three bits), which warpgroup MMA reads
// (KPT_PG_WG); otherwise rows padded by 16 bytes for conflict-free ldmatrix. kpt_pg_at: the byte
// offset of element (r, c) of a tile of ROWS rows, c a multiple of 8.
#define KPT_PG_WG KPT_WGMMA
template <int ROWS, int STR> __device__ __forceinline__ u32 kpt_pg_at(int r, int c)
{
#if KPT_PG_WG
    return (u32)((c >> 6) * ROWS * 128 + r * 128 + ((((c >> 3) & 7) ^ (r & 7)) << 4));
#else
    return (u32)(r * STR + c) * 2u;
#endif
}
#define KPT_PG_Q_BYTES (KPT_PG_WG ? KPT_PG_ROWS * KPT_DQK * 2 : KPT_PG_ROWS * KPT_QSTR * 2)
#define KPT_PG_K_BYTES (KPT_PG_WG ? KPT_BN * KPT_DQK * 2 : KPT_BN * KPT_KSTR * 2)
#define KPT_PG_V_BYTES (KPT_PG_WG ? KPT_BN * KPT_DV * 2 : KPT_BN * KPT_VSTR * 2)

// The page-table column of key `pos` (pages of P.page_size rows).
__device__ __forceinline__ int kpt_pg_page_of(const kpt_pargs &P, int pos)
{
    return P.page_shift >= 0 ? pos >> P.page_shift : pos / P.page_size;
}

// The page holding key `pos` of sequence b (and `off`, the key's row in it), or -1 when the
// table does not hold it: past its columns, or a page id outside the cache. Such keys read as
// zeros (never out of bounds). With a table, the ids of the CTA's key range are staged in shared
// memory, a chunk at a time (spt, from page spa on, holding this key's).
__device__ __forceinline__ int kpt_pg_page(const kpt_pargs &P, const int *spt, int spa, int b,
                                           int pos, int &off)
{
    if (!P.paged) {
        off = pos;
        return pos < P.page_size ? b : -1;
    }
    const int pi = kpt_pg_page_of(P, pos);
    off = pos - pi * P.page_size;
    return pi < P.max_pages ? spt[pi - spa] : -1;
}

// Stages the ids of pages [first, min(first + KPT_PG_PT_CAP, spz + 1)) of a sequence's table row
// in s_pt (an id outside the cache as -1; the caller's spa is then `first`); returns the first
// kv tile whose keys pass them (KPT_PG_NEVER: none up to page spz). All threads of the CTA call
// it: a barrier on each side (every thread has issued its copies from the previous chunk's ids;
// all are staged). Out of line: inlined into the load of every tile, its code cost the 64-row
// kernel 5 % of its bandwidth on a contiguous cache, which never calls it. Its arguments are
// values: a reference to the kernel's parameters, or to the caller's spa, put them in local
// memory, which the paged loads then read at every tile (ncu, H200: 131k local loads a launch).
__device__ __noinline__ int kpt_pg_stage(const int *ptrow, int *s_pt, int first, int spz,
                                         int num_pages, int page_size)
{
    __syncthreads();
    const int spe = min(first + KPT_PG_PT_CAP, spz + 1);
    for (int i = (int)threadIdx.x; i < spe - first; i += KPT_THREADS) {
        const int page = ptrow[first + i];
        s_pt[i] = (u32)page < (u32)num_pages ? page : -1;
    }
    __syncthreads();
    // tile t needs page spe once its last key t * KPT_BN + KPT_BN - 1 reaches spe's first
    return spe > spz ? KPT_PG_NEVER : (int)((i64)spe * page_size / KPT_BN);
}

// Keys [k0, k0 + KPT_BN) of one sequence and kv head (D elements a row, `base` the head's first
// element, sp and sr the page and row strides) into shared memory with row stride STR; rows past
// the length, or not in the table, are zero-filled so they contribute nothing.
template <int D, int STR>
__device__ __forceinline__ void kpt_pg_load(u32 dst, const u16 *base, i64 sp, i64 sr,
                                            const kpt_pargs &P, const int *spt, int spa, int b,
                                            int k0, int kv_len)
{
    constexpr int CH = D / 8, N = KPT_BN * CH, ITERS = (N + KPT_THREADS - 1) / KPT_THREADS;
#pragma unroll 2 // each step finds its row's page on its own: unrolled, it was most of the code
    for (int it = 0; it < ITERS; it++) {
        const int i = (int)threadIdx.x + it * KPT_THREADS;
        if (N % KPT_THREADS != 0 && i >= N) break;
        const int r = i / CH, c = i % CH, pos = k0 + r;
        int off = 0;
        const int page = pos < kv_len ? kpt_pg_page(P, spt, spa, b, pos, off) : -1;
        const bool ok = page >= 0;
        const u16 *g = base + (ok ? (i64)page * sp + (i64)off * sr : 0) + c * 8;
        kpt_cp16(dst + kpt_pg_at<KPT_BN, STR>(r, c * 8), g, ok);
    }
}

// Whether a tile's K and V loads can share their rows' lookups (kpt_pg_load_kv): the same
// chunks a row in both, and whole rows a thread.
#define KPT_PG_KV_SHARED (KPT_DQK == KPT_DV && KPT_THREADS % (KPT_DQK / 8) == 0 && \
                          KPT_BN % (KPT_THREADS / (KPT_DQK / 8)) == 0)
// The rows a thread copies in kpt_pg_load_kv (a run of consecutive ones with MODE 2).
#define KPT_PG_RUN (KPT_BN / (KPT_THREADS / (KPT_DQK / 8)))

// The staged id of the page of key `pos` (pages of a power-of-two size), or 0 with ok cleared
// where the table does not hold it (past its columns, or an id outside the cache): without
// branches, such a key reads entry 0 of the staged ids and is dropped.
__device__ __forceinline__ u32 kpt_pg_staged(const kpt_pargs &P, const int *spt, int spa, int pos,
                                             bool &ok)
{
    const int pi = pos >> P.page_shift;
    ok = ok && pi < P.max_pages;
    const int id = spt[ok ? pi - spa : 0];
    ok = ok && id >= 0;
    return ok ? (u32)id : 0u;
}

// Keys [k0, k0 + KPT_BN) of K and V at once, for the caches most calls have: MODE 0 a
// contiguous one (gK and gV are then sequence b's row of the cache), MODE 1 pages of a
// power-of-two size whose ids were staged in shared memory (spt). Each thread copies the same
// column chunk of the same rows of K and V, so a key's page is found once for both, with none
// of kpt_pg_page's branches per row; row strides, and page strides where there are pages, fit
// 32 bits (kpt_cuda_paged checks). With the generic pair of kpt_pg_load calls the decode
// kernel ran 59 instructions per 16-byte copy, all its work included; with this, 38 (H100,
// ncu, one sequence of 32k keys): speculative decoding, whose CTAs also compute, gains most.
// MODE 2: pages of a power-of-two size of at least ITERS rows, where a thread's rows are ITERS
// consecutive ones instead of every RSTEP-th, all in one page: one id a tile instead of one a
// row. With an id a row (and kpt_pg_stage's reference arguments in local memory), pages of 16
// to 256 rows ran at 0.80-0.87 of the contiguous cache's bandwidth, the page order and size
// regardless (ncu, H200, 8 x 1 x 32k: 2.7x the shared loads, 1.9x the short-scoreboard stalls,
// each row's copies waiting on its id); with a run's id, 0.94-1.05 (docs/BENCHMARKS.md).
template <int MODE>
__device__ __forceinline__ void kpt_pg_load_kv(u32 dK, u32 dV, const u16 *gK, const u16 *gV,
                                               int ksp, int ksr, int vsp, int vsr,
                                               const kpt_pargs &P, const int *spt, int spa,
                                               int k0, int kv_len)
{
    constexpr int CH = KPT_DQK / 8, RSTEP = KPT_THREADS / CH, ITERS = KPT_PG_RUN;
    const int c = (int)threadIdx.x % CH, r0 = (int)threadIdx.x / CH;
    const int lim = MODE == 0 ? min(kv_len, P.page_size) : kv_len;
    // byte addresses and byte strides (below 2^32: the element strides are non-negative and
    // below 2^31, kpt_cuda_paged checks), so that each address is two wide multiply-adds
    const char *bK = (const char *)(gK + c * 8), *bV = (const char *)(gV + c * 8);
    const u32 kp2 = 2u * (u32)ksp, kr2 = 2u * (u32)ksr, vp2 = 2u * (u32)vsp, vr2 = 2u * (u32)vsr;
    if constexpr (MODE == 2) {
        // the run starts at a multiple of ITERS (k0 at one of KPT_BN), so it ends in its page;
        // an id outside the table or the cache reads the first rows of page 0, dropped
        const int ra = r0 * ITERS, p0 = k0 + ra;
        bool okp = true;
        const u32 page = kpt_pg_staged(P, spt, spa, p0, okp);
        const u32 off = okp ? (u32)(p0 & (P.page_size - 1)) : 0u;
        const char *rK = bK + (u64)page * kp2 + (u64)off * kr2;
        const char *rV = bV + (u64)page * vp2 + (u64)off * vr2;
#pragma unroll
        for (int it = 0; it < ITERS; it++) {
            const bool ok = okp && p0 + it < kv_len;
            kpt_cp16(dK + kpt_pg_at<KPT_BN, KPT_KSTR>(ra + it, c * 8), rK + it * kr2, ok);
            kpt_cp16(dV + kpt_pg_at<KPT_BN, KPT_VSTR>(ra + it, c * 8), rV + it * vr2, ok);
        }
        return;
    }
#pragma unroll
    for (int it = 0; it < ITERS; it++) {
        const int r = r0 + it * RSTEP, pos = k0 + r;
        bool ok = pos < lim;
        u32 page = 0, off = (u32)pos;
        if (MODE == 1) {
            // Without branches (kpt_pg_staged): branches and signed 64-bit products here made
            // the paged copies 30 % more instructions than the contiguous ones in the 64-row
            // kernel (ncu, 8 x 16 x 32k, page 16).
            page = kpt_pg_staged(P, spt, spa, pos, ok);
            off = (u32)(pos & (P.page_size - 1));
        }
        off = ok ? off : 0u; // a dropped row's address is the head's first row: never faults
        kpt_cp16(dK + kpt_pg_at<KPT_BN, KPT_KSTR>(r, c * 8), bK + (u64)page * kp2 + (u64)off * kr2,
                 ok);
        kpt_cp16(dV + kpt_pg_at<KPT_BN, KPT_VSTR>(r, c * 8), bV + (u64)page * vp2 + (u64)off * vr2,
                 ok);
    }
}

#if KPT_HAS_MASK
// The class of keys [k0, k1] against query positions [qa, qz] for every head of kv head hk
// (0 nothing kept, 2 everything, 1 mixed or unknown).
__device__ __forceinline__ int kpt_pg_class(const kpt_args &A, int b, int hk, int qa, int qz,
                                            int k0, int k1)
{
    int c = kpt_tile_interval(A, b, hk * A.group, qa, qz, k0, k1);
#if KPT_MASK_PER_H
    for (int g = 1; g < A.group && c != 1; g++)
        if (kpt_tile_interval(A, b, hk * A.group + g, qa, qz, k0, k1) != c) c = 1;
#endif
    return c;
}
#endif

// What a CTA works on.
struct kpt_pg_work {
    int b, qb, split, hk;
    int blk;               // the block's index in the launch (its partial results' slots)
    int t0, q_len, kv_len; // the sequence's first row in q and o, its queries and keys
    int i0, n_tok;         // the block's first query (within the sequence) and its count
};

// A packed launch's first block of sequence b (runtime/paged_args.c, packed_first): blocks of
// p queries, each sequence's from (cu[b] + b (p - 1)) / p, which grows by ceil(q_len / p) at
// least from one sequence to the next. In 32 unsigned bits: cu[b] < 2^31 and b (p - 1) < 2^26
// (B up to 2^20, p up to 64), and a 64-bit division is a long subroutine.
__device__ __forceinline__ int kpt_pg_first_block(const int *cu, int b, int p)
{
    return (int)(((u32)cu[b] + (u32)b * (u32)(p - 1)) / (u32)p);
}

// The sequence of packed block x: the last b whose first block is at most x. A warp's search, 32
// candidates a round (two rounds up to 1024 sequences), every warp on its own: no shared memory
// or barrier, and the loads of a round in flight together. The whole warp calls it.
__device__ __forceinline__ int kpt_pg_seq_of(const int *cu, int B, int p, int x)
{
    const int lane = threadIdx.x & 31;
    int lo = 0, n = B; // the answer is in [lo, lo + n); the first block of lo is at most x
    while (n > 1) {
        const int step = (n + 31) / 32, c = lo + lane * step;
        const bool at = lane == 0 || (c < lo + n && kpt_pg_first_block(cu, c, p) <= x);
        const int k = 31 - __clz(__ballot_sync(0xffffffffu, at));
        const int end = lo + n;
        lo += k * step;
        n = min(step, end - lo);
    }
    return lo;
}

__device__ __forceinline__ kpt_pg_work kpt_pg_work_of(const kpt_args &A, const kpt_pargs &P,
                                                      int x, int hk, int splits)
{
    kpt_pg_work w;
    const int *cu = (const int *)P.cu_q;
    w.split = x % splits;
    x /= splits;
    w.blk = x;
    if (P.packed) {
        w.b = kpt_pg_seq_of(cu, A.B, P.q_per_block, x);
        w.qb = x - kpt_pg_first_block(cu, w.b, P.q_per_block);
    } else {
        w.qb = x % P.q_blocks;
        w.b = x / P.q_blocks;
    }
    w.hk = hk;
    w.t0 = cu[w.b];
    w.q_len = max(cu[w.b + 1] - w.t0, 0);
    w.kv_len = max(((const int *)P.kv_lens)[w.b], 0);
    w.i0 = w.qb * P.q_per_block;
    w.n_tok = max(min(P.q_per_block, w.q_len - w.i0), 0);
    return w;
}

// The element of o (or of lse, d < 0) for query row t and head h.
__device__ __forceinline__ void kpt_pg_store(const kpt_args &A, int t, int h, int d, float x)
{
    if (d < 0) {
        if (A.lse) ((float *)A.lse)[(i64)t * A.lses[0] + (i64)h * A.lses[1]] = x;
        return;
    }
    u16 *go = (u16 *)A.o + (i64)t * A.os[0] + (i64)h * A.os[1];
    go[d] = (u16)(kpt_pack(x, 0.0f) & 0xffffu);
}

// NaN in every head and column (and the LSE) of n query rows from t0: a warp a (row, head),
// its lanes over the columns. Not unrolled: it runs only where a plan was made for fewer
// queries, and its 64-bit divisions would be copied with it.
__device__ __forceinline__ void kpt_pg_nan_rows(const kpt_args &A, const kpt_pargs &P, int t0,
                                                int n)
{
    const int lane = threadIdx.x & 31;
#pragma unroll 1
    for (i64 rh = threadIdx.x >> 5; rh < (i64)n * A.Hq; rh += KPT_THREADS / 32) {
        const int t = t0 + (int)(rh / A.Hq), h = (int)(rh % A.Hq);
        if ((u32)t >= (u32)P.T) continue;
#pragma unroll 1
        for (int d = lane - 1; d < KPT_DV; d += 32) kpt_pg_store(A, t, h, d, KPT_PG_NAN);
    }
}

// A sequence with more queries than the plan's blocks cover gets NaN in those rows (a plan made
// for other lengths must not give a silent wrong answer): one CTA per sequence writes them, or
// in a packed launch its last block's, for every sequence its blocks do not reach (the last
// ones: every sequence before one that fits fits too). One call site of kpt_pg_nan_rows.
__device__ __forceinline__ void kpt_pg_overflow(const kpt_args &A, const kpt_pargs &P,
                                                const kpt_pg_work &w)
{
    if (w.split != 0 || w.hk != 0) return;
    if (P.packed ? w.blk != P.q_blocks - 1 : w.qb != P.q_blocks - 1) return;
    const int *cu = (const int *)P.cu_q;
#pragma unroll 1
    for (int b = P.packed ? A.B - 1 : w.b; b >= 0; b--) {
        const int q = max(cu[b + 1] - cu[b], 0);
        const int blocks = P.packed ? max(P.q_blocks - kpt_pg_first_block(cu, b, P.q_per_block), 0)
                                    : P.q_blocks;
        const i64 reach = (i64)blocks * P.q_per_block; // the queries its blocks hold
        if (q <= reach) return;
        kpt_pg_nan_rows(A, P, cu[b] + (int)reach, q - (int)reach);
        if (!P.packed) return;
    }
}

// Head h's sink logit in log2 units (P.sinks non-null).
__device__ __forceinline__ float kpt_pg_sink2(const kpt_pargs &P, int h)
{
    return ((const float *)P.sinks)[(i64)h * P.sink_stride] * KPT_LOG2E;
}

// A finished row's LSE (log2 units) with its head's sink joined, in tot, and the factor its
// columns take: `base` times the sink's share (base without a sink; 0 for a row that kept no
// key).
__device__ __forceinline__ float kpt_pg_sink_join(const kpt_pargs &P, int h, float lse2, float L,
                                                  float base, float &tot)
{
    tot = lse2;
    if (!P.sinks) return base;
    tot = kpt_sink_lse2(lse2, kpt_pg_sink2(P, h));
    return L > 0.0f ? base * kpt_ex2(lse2 - tot) : 0.0f;
}

// Row r's slot among the partial results of the CTA's split (runtime/paged_args.h,
// kpt_paged_workspace_bytes): ((block splits + split) Hkv + hk) rows + r.
__device__ __forceinline__ i64 kpt_pg_slot(const kpt_args &A, const kpt_pargs &P,
                                           const kpt_pg_work &w, int r)
{
    return (((i64)w.blk * P.splits + w.split) * A.Hkv + w.hk) * KPT_PG_ROWS + r;
}

// A finished row's LSE in log2 units from its maximum M and sum L (-inf for a row that kept no
// key).
__device__ __forceinline__ float kpt_pg_lse2(float M, float L)
{
    return L > 0.0f ? M + __log2f(L) : KPT_NINF;
}

// One row of the CTA: its head, logical position and row of q and o (t = -1: a padding row).
struct kpt_pg_row {
    int h, qpos, t;
};

__device__ __forceinline__ kpt_pg_row kpt_pg_row_of(const kpt_args &A, const kpt_pargs &P,
                                                    const kpt_pg_work &w, int r)
{
    kpt_pg_row x;
    const int tok = r / A.group;
    x.h = w.hk * A.group + r % A.group;
    x.qpos = w.kv_len - w.q_len + w.i0 + tok;
    x.t = w.t0 + w.i0 + tok;
    if (r >= P.rows || tok >= w.n_tok || (u32)x.t >= (u32)P.T) x.t = -1;
    return x;
}

// The end of a CTA for one row, a warp's collective: its merged softmax state (M in log2
// units, L) and its columns (col(d) = O[d] / L), written as the result (a single split; the sink
// joins the denominator here) or as a partial result. Lanes own KPT_PG_VEC adjacent columns.
#define KPT_PG_VEC ((KPT_DV % 128 == 0) ? 4 : (KPT_DV % 64 == 0) ? 2 : 1)
template <typename COL>
__device__ __forceinline__ void kpt_pg_finish_row(const kpt_args &A, const kpt_pargs &P,
                                                  const kpt_pg_work &w, int r, const kpt_pg_row &x,
                                                  float M, float L, COL col)
{
    constexpr int V = KPT_PG_VEC;
    const int lane = threadIdx.x & 31;
    const float lse2 = kpt_pg_lse2(M, L);
    if (P.splits > 1) {
        const i64 slot = kpt_pg_slot(A, P, w, r);
        if (lane == 0) ((float *)P.part_lse)[slot] = lse2;
        for (int d0 = lane * V; d0 < KPT_DV; d0 += 32 * V) {
            float *dst = (float *)P.part_o + slot * KPT_DV + d0; // 16-byte aligned (workspace)
            if constexpr (V == 4) {
                *(float4 *)dst = make_float4(col(d0), col(d0 + 1), col(d0 + 2), col(d0 + 3));
            } else {
#pragma unroll
                for (int e = 0; e < V; e++) dst[e] = col(d0 + e);
            }
        }
        return;
    }
    float tot;
    const float scale = kpt_pg_sink_join(P, x.h, lse2, L, 1.0f, tot);
    if (lane == 0) kpt_pg_store(A, x.t, x.h, -1, tot * KPT_LN2);
    u16 *go = (u16 *)A.o + (i64)x.t * A.os[0] + (i64)x.h * A.os[1];
    for (int d0 = lane * V; d0 < KPT_DV; d0 += 32 * V) {
        float c[V];
#pragma unroll
        for (int e = 0; e < V; e++) c[e] = col(d0 + e) * scale;
        const u64 at = (u64)(go + d0); // o's strides are the caller's: vector stores where aligned
        if constexpr (V == 4) {
            if ((at & 7) == 0) {
                *(uint2 *)(go + d0) = make_uint2(kpt_pack(c[0], c[1]), kpt_pack(c[2], c[3]));
                continue;
            }
        } else if constexpr (V == 2) {
            if ((at & 3) == 0) {
                *(u32 *)(go + d0) = kpt_pack(c[0], c[1]);
                continue;
            }
        }
#pragma unroll
        for (int e = 0; e < V; e++) kpt_pg_store(A, x.t, x.h, d0 + e, c[e]);
    }
}

// The end of a CTA whose warps each hold whole rows (one key slice: the 64-row kernel up to head
// dim 128): each thread writes its own fragment of O (rows lane / 4 and + 8,
// two adjacent columns an 8-column block) straight from registers, with no pass through shared
// memory, no barrier and no loop of a warp over rows. The softmax state is the quad's.
template <int NO>
__device__ __forceinline__ void kpt_pg_finish_frags(const kpt_args &A, const kpt_pargs &P,
                                                    const kpt_pg_work &w, const kpt_pg_row (&rw)[2],
                                                    int row0, int col0, const float (&O)[NO][4],
                                                    const float *m, const float *l)
{
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int rr = 0; rr < 2; rr++) {
        float L = l[rr];
        L += __shfl_xor_sync(0xffffffffu, L, 1);
        L += __shfl_xor_sync(0xffffffffu, L, 2);
        const kpt_pg_row x = rw[rr];
        if (x.t < 0) continue; // a padding row
        const float M = m[rr], inv = L > 0.0f ? 1.0f / L : 0.0f;
        const float lse2 = kpt_pg_lse2(M, L);
        const int r = row0 + (lane >> 2) + rr * 8;
        if (P.splits > 1) {
            const i64 slot = kpt_pg_slot(A, P, w, r);
            if ((lane & 3) == 0 && col0 == 0) ((float *)P.part_lse)[slot] = lse2;
            float *dst = (float *)P.part_o + slot * KPT_DV + col0 + (lane & 3) * 2;
#pragma unroll
            for (int n = 0; n < NO; n++) // 8-byte aligned: the workspace, even columns
                *(float2 *)(dst + n * 8) = make_float2(O[n][2 * rr] * inv, O[n][2 * rr + 1] * inv);
            continue;
        }
        float tot;
        const float scale = kpt_pg_sink_join(P, x.h, lse2, L, inv, tot);
        if ((lane & 3) == 0 && col0 == 0) kpt_pg_store(A, x.t, x.h, -1, tot * KPT_LN2);
        u16 *go = (u16 *)A.o + (i64)x.t * A.os[0] + (i64)x.h * A.os[1];
        const int d0 = col0 + (lane & 3) * 2;
        const bool al = ((u64)(go + d0) & 3) == 0; // o's strides are the caller's
#pragma unroll
        for (int n = 0; n < NO; n++) {
            const float c0 = O[n][2 * rr] * scale, c1 = O[n][2 * rr + 1] * scale;
            if (al) {
                *(u32 *)(go + d0 + n * 8) = kpt_pack(c0, c1);
            } else {
                kpt_pg_store(A, x.t, x.h, d0 + n * 8, c0);
                kpt_pg_store(A, x.t, x.h, d0 + n * 8 + 1, c1);
            }
        }
    }
}

// Past head dim 128 the warps of a row block split O's columns instead of the tile's keys: each
// computes the scores of all the tile's keys (the same softmax state in each) and P V for its
// share of Dv, so O takes 32 registers a thread instead of 128 (which spilled and kept one CTA
// an SM).
#define KPT_PG_DVSPLIT (KPT_DV > 128)

#if KPT_PG_WG
// The products of one tile by the CTA's warpgroup (64 rows; a warp's 16 rows in the mma.sync
// accumulator layout, as the other kernels' fragments): S = Q K^T with both from the swizzled
// tiles, then O += P V (the forward's kpt_issue_pv, hopper.cu). Each waits for its result: the
// next step needs it. Against mma.sync by each warp (64-row CTAs: 128 mma and 64 ldmatrix a
// warp a tile), one instruction per 16 keys or columns, and K and V read once a tile instead of
// once a warp. Tiles of 64 keys at head dim 128, of 128 at 64 (plan_paged).
static_assert(KPT_DQK == KPT_DV &&
                  ((KPT_BN == 64 && KPT_DV == 128) || (KPT_BN == 128 && KPT_DV == 64)),
              "plan_paged's sm_90a shapes");
__device__ __forceinline__ void kpt_pg_wg_s(float (&S)[KPT_BN / 8][4], u32 sQ, u32 tK)
{
    kpt_wgmma_fence();
    const u64 dq = kpt_sw128_desc(sQ, 16, 1024), dk = kpt_sw128_desc(tK, 16, 1024);
#pragma unroll
    for (int kk = 0; kk < KPT_DQK / 16; kk++) {
        const u32 kb = (u32)((kk & 3) * 32); // 16 elements within a 64-column block
        const u64 da = kpt_desc_add(dq, (kk >> 2) * KPT_PG_ROWS * 128 + kb);
        const u64 db = kpt_desc_add(dk, (kk >> 2) * KPT_BN * 128 + kb);
        kpt_wgmma_ss_keys(&S[0][0], da, db, kk > 0);
    }
    kpt_wgmma_commit();
    kpt_wgmma_wait<0>();
    kpt_wgmma_regs<KPT_BN / 2>(&S[0][0]);
}
__device__ __forceinline__ void kpt_pg_wg_pv(float (&O)[KPT_DV / 8][4],
                                             const float (&S)[KPT_BN / 8][4], u32 tV)
{
    u32 pa[KPT_BN / 16][4];
    kpt_frags<KPT_BN>(pa, S);
    kpt_issue_pv(O, pa, tV);
    kpt_wgmma_wait<0>();
    kpt_wgmma_regs<KPT_DV / 2>(&O[0][0]);
}
#endif

// Waits for all but the last n (0 to 2) groups of cp.async copies: n is the launch's ring depth
// less one, uniform across the CTA.
__device__ __forceinline__ void kpt_cp_wait_n(int n)
{
    if (n >= 2)
        kpt_cp_wait<2>();
    else if (n == 1)
        kpt_cp_wait<1>();
    else
        kpt_cp_wait<0>();
}

// The combine inside a cluster (P.cluster: sm_90, the 16-row kernel, 2 to 16 splits; the
// runtime takes it for pairs in one wave: runtime/cuda_device.c, cluster_combine): a block's
// splits are the CTAs of one thread block cluster, each leaves its merged partial result in its
// own shared memory (where Q was: rows x Dv floats, then the rows' LSEs in log2 units), and
// after a cluster barrier every CTA merges its share of the block's output columns from all of
// them through distributed shared memory, then waits at a second barrier until the others have
// read its own. No workspace and no second launch, whose start behind the attention's end costs
// 2-3 us a run (H200, one decoding token a sequence); having the last split to arrive combine
// from the workspace instead (a fence, an atomic and the loads from L2 on the path) cost more
// (1 x 1 x 4k 10.3 -> 11.7 us; branch exp/fused-combine).
#define KPT_PG_CLUSTER KPT_WGMMA
#define KPT_PG_CL_ROWS 16 // rows of a cluster's block at most (the 16-row kernel)
#if KPT_PG_CLUSTER
static_assert((KPT_PG_CL_ROWS * KPT_DV + KPT_PG_CL_ROWS) * 4 <= KPT_PG_Q_BYTES,
              "a split's partial result fits where Q was");
__device__ __forceinline__ void kpt_cluster_sync()
{
    asm volatile("barrier.cluster.arrive.release.aligned;\n"
                 "barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

// The address in the shared memory of cluster CTA `rank` of this CTA's shared address a.
__device__ __forceinline__ u32 kpt_cluster_map(u32 a, int rank)
{
    u32 r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(rank));
    return r;
}

__device__ __forceinline__ float kpt_cluster_ld(u32 a)
{
    float v;
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(a) : "memory");
    return v;
}

__device__ __forceinline__ float4 kpt_cluster_ld4(u32 a)
{
    float4 v;
    asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(a) : "memory");
    return v;
}

// Every thread of the cluster calls it once the CTA's partial result is at `cl` (this CTA's
// shared address: KPT_PG_CL_ROWS rows of Dv floats, then their LSEs). The output's columns of
// four go round the splits (element e to split e % splits) so that each SM reads a share.
__device__ __forceinline__ void kpt_pg_cluster_combine(const kpt_args &A, const kpt_pargs &P,
                                                       const kpt_pg_work &w,
                                                       const kpt_pg_row *rows, u32 cl)
{
    kpt_cluster_sync(); // every split's partial result is in its shared memory
    constexpr int CH = KPT_DV / 4;
    const int S = P.splits, n = w.n_tok * A.group * CH;
    const u32 lse_at = cl + KPT_PG_CL_ROWS * KPT_DV * 4;
    for (int e = w.split + S * (int)threadIdx.x; e < n; e += S * KPT_THREADS) {
        const int r = e / CH, d0 = e % CH * 4;
        const kpt_pg_row x = rows[r];
        if (x.t < 0)
            continue;
        float M = P.sinks ? kpt_pg_sink2(P, x.h) : KPT_NINF;
        float L = M == KPT_NINF ? 0.0f : 1.0f, acc[4] = {};
        for (int s0 = 0; s0 < S; s0 += 16) {
            float lse[16];
            float4 o[16];
#pragma unroll
            for (int j = 0; j < 16; j++) { // every load in flight before the first use
                const bool in = s0 + j < S;
                lse[j] = in ? kpt_cluster_ld(kpt_cluster_map(lse_at + r * 4, s0 + j)) : KPT_NINF;
                o[j] = in ? kpt_cluster_ld4(kpt_cluster_map(cl + (r * KPT_DV + d0) * 4, s0 + j))
                          : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
            float Mn = M;
#pragma unroll
            for (int j = 0; j < 16; j++) Mn = fmaxf(Mn, lse[j]);
            const float Mu = Mn == KPT_NINF ? 0.0f : Mn, c = kpt_ex2(M - Mu);
            L *= c;
#pragma unroll
            for (int i = 0; i < 4; i++) acc[i] *= c;
#pragma unroll
            for (int j = 0; j < 16; j++) {
                const float p = kpt_ex2(lse[j] - Mu);
                L += p;
                if (p > 0.0f) { // an empty split has weight 0 and O 0; never 0 * NaN
                    acc[0] += p * o[j].x;
                    acc[1] += p * o[j].y;
                    acc[2] += p * o[j].z;
                    acc[3] += p * o[j].w;
                }
            }
            M = Mn;
        }
        const float inv = L > 0.0f ? 1.0f / L : 0.0f;
#pragma unroll
        for (int i = 0; i < 4; i++) kpt_pg_store(A, x.t, x.h, d0 + i, acc[i] * inv);
        if (d0 == 0)
            kpt_pg_store(A, x.t, x.h, -1, kpt_pg_lse2(M, L) * KPT_LN2);
    }
    kpt_cluster_sync(); // the others have read this CTA's shared memory
}
#endif

// An unsigned integer of at least N bits (N <= 64).
template <int N, bool WIDE = (N > 32)> struct kpt_pg_bits {
    typedef u32 t;
};
template <int N> struct kpt_pg_bits<N, true> {
    static_assert(N <= 64, "64 bits at most");
    typedef u64 t;
};

template <int WR>
__device__ __forceinline__ void kpt_paged_body(const kpt_args &Ag, const kpt_pargs &P)
{
    constexpr int WPR = KPT_WARPS / WR;                  // warps a row block
    constexpr int WK = KPT_PG_DVSPLIT ? 1 : WPR, KW = KPT_BN / WK; // key slices, keys a slice
    constexpr int WD = KPT_PG_DVSPLIT ? WPR : 1, DVW = KPT_DV / WD; // column slices, columns
    static_assert(DVW % 16 == 0, "whole 16-column blocks of O a warp");
    // warpgroup MMA: the CTA's four warps are one warpgroup over 64 rows
    constexpr bool WG = KPT_PG_WG && WR == 4;
    static_assert(!WG || KPT_WARPS == 4, "a warpgroup of 64 rows");
    extern __shared__ __align__(16) unsigned char kpt_smem[];
    __shared__ kpt_args A; // the launch's, with Sq = Skv = the sequence's kv length
    // the swizzled tiles start at 1024 bytes (plan_paged adds the slack)
    const u32 sQ = KPT_PG_WG ? (kpt_smem_addr(kpt_smem) + 1023u) & ~1023u : kpt_smem_addr(kpt_smem);
    const u32 sK = sQ + KPT_PG_Q_BYTES;
    const int ST = P.stages; // 1 to 3 (cuda_device.c, kpt_cuda_paged)
    const u32 sV = sK + ST * KPT_PG_K_BYTES;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int wr = warp / WPR, wk = KPT_PG_DVSPLIT ? 0 : warp % WPR;
    const int wd = KPT_PG_DVSPLIT ? warp % WPR : 0;

    kpt_grid_launch(); // the combine may be scheduled (common.cu)
    const kpt_pg_work w = kpt_pg_work_of(Ag, P, (int)blockIdx.x, (int)blockIdx.y, P.splits);
    kpt_pg_overflow(Ag, P, w);
    if (w.n_tok == 0) return; // a block past the sequence's queries: the combine skips it too
    const int b = w.b, hk = w.hk, kv_len = w.kv_len;
    const int n_kt = (kv_len + KPT_BN - 1) / KPT_BN;
    {
        // the argument block but the aux tensors the pattern does not name: a warp's lanes read
        // 32 addresses of the constant bank one after another, and all 16 slots tripled the copy
        constexpr int head = (KPT_ARGS_AUX_AT + KPT_NUM_AUX * (int)sizeof(kpt_aux)) / 4;
        constexpr int tail = KPT_ARGS_TAIL_AT / 4;
        constexpr int n = head + (int)(sizeof(kpt_args) / 4) - tail;
        for (int i = tid; i < n; i += KPT_THREADS) {
            const int wd = i < head ? i : i - head + tail;
            ((u32 *)&A)[wd] = ((const u32 *)&Ag)[wd];
        }
    }
    // the rows' heads, positions and rows of q and o, worked out once (a division each)
    __shared__ kpt_pg_row s_rows[16 * WR];
    if (tid < 16 * WR) s_rows[tid] = kpt_pg_row_of(Ag, P, w, tid);
    __syncthreads();
    if (tid == 0) {
        A.Sq = A.Skv = kv_len;
        A.n_kt = n_kt;
    }

    // Q: the block's rows, gathered from their tokens and heads.
    {
        constexpr int CH = KPT_DQK / 8;
        for (int i = tid; i < 16 * WR * CH; i += KPT_THREADS) {
            const int r = i / CH, c = i % CH;
            const kpt_pg_row x = s_rows[r];
            const bool ok = x.t >= 0;
            const u16 *g = (const u16 *)Ag.q + (ok ? (i64)x.t * Ag.qs[0] + (i64)x.h * Ag.qs[1] : 0);
            kpt_cp16(sQ + kpt_pg_at<KPT_PG_ROWS, KPT_QSTR>(r, c * 8), g + c * 8, ok);
        }
        kpt_cp_commit();
    }
    __syncthreads();

    // This thread's two rows.
    kpt_pg_row rw[2];
    kpt_uniform U[2];
#pragma unroll
    for (int rr = 0; rr < 2; rr++) {
        rw[rr] = s_rows[wr * 16 + (lane >> 2) + rr * 8];
        kpt_uniform_init(A, b, rw[rr].h, U[rr]);
    }

    // The live key tiles [lo, hi] of the block's rows, then this split's share of them.
    int lo = 0, hi = n_kt - 1;
#if KPT_HAS_MASK
    __shared__ int s_lo, s_hi;
    __shared__ unsigned char s_cls[KPT_CLS_CAP];
    const int qa = kv_len - w.q_len + w.i0, qz = qa + w.n_tok - 1;
    {
        if (tid == 0) {
            s_lo = n_kt;
            s_hi = -1;
        }
        __syncthreads();
        int my_lo = n_kt, my_hi = -1;
#if KPT_MASK_AUX
        // The mask reads aux data, whose ranges over a tile a warp reads together
        // (kpt_iv_load is a warp's collective): a warp per tile, its lanes in step.
        for (int t = warp; t < n_kt; t += KPT_WARPS) {
            const int c = kpt_pg_class(A, b, hk, qa, qz, t * KPT_BN, min(t * KPT_BN + KPT_BN, kv_len) - 1);
            if (t < KPT_CLS_CAP && lane == 0) s_cls[t] = (unsigned char)c;
            if (c != 0) {
                my_lo = min(my_lo, t);
                my_hi = t;
            }
        }
#else
        // Each thread classifies a run of tiles as one box first: most runs of a window or a
        // causal mask are settled by that one test.
        const int ta = (int)((i64)n_kt * tid / KPT_THREADS);
        const int tz = (int)((i64)n_kt * (tid + 1) / KPT_THREADS);
        if (ta < tz) {
            const int cb = kpt_pg_class(A, b, hk, qa, qz, ta * KPT_BN, min(tz * KPT_BN, kv_len) - 1);
            for (int t = ta; t < tz; t++) {
                const int c = cb != 1 ? cb
                                      : kpt_pg_class(A, b, hk, qa, qz, t * KPT_BN,
                                                     min(t * KPT_BN + KPT_BN, kv_len) - 1);
                if (t < KPT_CLS_CAP) s_cls[t] = (unsigned char)c;
                if (c != 0) {
                    my_lo = min(my_lo, t);
                    my_hi = t;
                }
            }
        }
#endif
        if (my_hi >= 0) {
            atomicMin(&s_lo, my_lo);
            atomicMax(&s_hi, my_hi);
        }
        __syncthreads();
        lo = s_lo;
        hi = s_hi;
    }
#define KPT_PG_CLASS(t) ((t) < KPT_CLS_CAP ? (int)s_cls[t] \
        : kpt_pg_class(A, b, hk, qa, qz, (t) * KPT_BN, min((t) * KPT_BN + KPT_BN, kv_len) - 1))
#else
    __syncthreads();
#define KPT_PG_CLASS(t) 2
#endif
    {
        const i64 n = hi >= lo ? hi - lo + 1 : 0;
        const int beg = lo + (int)(n * w.split / P.splits);
        hi = lo + (int)(n * (w.split + 1) / P.splits) - 1;
        lo = beg;
    }

    float O[DVW / 8][4];
    float m[2] = {KPT_NINF, KPT_NINF}, l[2] = {0.0f, 0.0f};
#pragma unroll
    for (int n = 0; n < DVW / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) O[n][e] = 0.0f;

    const int *ptrow = P.paged ? (const int *)P.page_table + (i64)b * P.pt_stride : nullptr;
    // The page ids of this split's keys, checked once, into shared memory: the loads of a tile
    // then wait on no global read before their copies issue. KPT_PG_PT_CAP of them at a time,
    // [spa, spe), the next chunk staged when a tile's keys pass the last (a barrier each side,
    // by every thread: the loads are the CTA's collective). Read from the table row by row
    // instead (when the range passed the cap), one-row pages ran at 0.29x the contiguous
    // cache's bandwidth at 8 sequences of 32k keys (H100: 811 against 2769 GB/s).
    __shared__ int s_pt[KPT_PG_PT_CAP];
    const int *spt = P.paged ? s_pt : nullptr;
    const int klast = min(hi * KPT_BN + KPT_BN, kv_len) - 1; // the split's last key
    const int spz = P.paged && lo <= hi ? min(kpt_pg_page_of(P, klast), P.max_pages - 1) : -1;
    int spa = 0, restage = KPT_PG_NEVER; // the first staged page; the first tile past them
    if (spz >= 0) {
        spa = kpt_pg_page_of(P, lo * KPT_BN);
        restage = kpt_pg_stage(ptrow, s_pt, spa, spz, P.num_pages, P.page_size);
    }
    const u16 *gK = (const u16 *)A.k + (i64)hk * A.ks[2];
    const u16 *gV = (const u16 *)A.v + (i64)hk * A.vs[2];
    auto next_live = [&](int t) {
        while (t <= hi && KPT_PG_CLASS(t) == 0) t++;
        return t;
    };
    // the cache's kind, settled once: 0 contiguous, 1 pages of a power-of-two size below a
    // thread's run of rows, 2 pages of a power-of-two size from it on (kpt_pg_load_kv), 3
    // anything else
    const int mode = !KPT_PG_KV_SHARED ? 3 : !P.paged ? 0 : P.page_shift < 0 ? 3
                   : P.page_size >= KPT_PG_RUN ? 2 : 1;
    auto load = [&](int t, int stage) {
        if (t >= restage) { // the tile's keys pass the staged pages: the next chunk from its first
            spa = kpt_pg_page_of(P, t * KPT_BN);
            restage = kpt_pg_stage(ptrow, s_pt, spa, spz, P.num_pages, P.page_size);
        }
        const u32 dK = sK + stage * KPT_PG_K_BYTES, dV = sV + stage * KPT_PG_V_BYTES;
        if (mode == 0)
            kpt_pg_load_kv<0>(dK, dV, gK + (i64)b * A.ks[0], gV + (i64)b * A.vs[0], 0,
                              (int)A.ks[1], 0, (int)A.vs[1], P, spt, spa, t * KPT_BN, kv_len);
        else if (mode == 1)
            kpt_pg_load_kv<1>(dK, dV, gK, gV, (int)A.ks[0], (int)A.ks[1], (int)A.vs[0],
                              (int)A.vs[1], P, spt, spa, t * KPT_BN, kv_len);
        else if (mode == 2)
            kpt_pg_load_kv<2>(dK, dV, gK, gV, (int)A.ks[0], (int)A.ks[1], (int)A.vs[0],
                              (int)A.vs[1], P, spt, spa, t * KPT_BN, kv_len);
        else {
            kpt_pg_load<KPT_DQK, KPT_KSTR>(dK, gK, A.ks[0], A.ks[1], P, spt, spa, b,
                                           t * KPT_BN, kv_len);
            kpt_pg_load<KPT_DV, KPT_VSTR>(dV, gV, A.vs[0], A.vs[1], P, spt, spa, b,
                                          t * KPT_BN, kv_len);
        }
    };

    // The ring: ST - 1 tiles in flight ahead of the one computed.
    int jl = next_live(lo);
#pragma unroll 1
    for (int s = 0; s < ST - 1; s++) {
        if (jl <= hi) {
            load(jl, s);
            jl = next_live(jl + 1);
        }
        kpt_cp_commit();
    }
    kpt_cp_wait_n(ST - 1); // Q has arrived
#if KPT_PG_WG
    if (WG) // this thread's copies, for the products' reads (async proxy)
        kpt_fence_proxy_async();
#endif
    __syncthreads();
#if !KPT_HAS_SCORE
    // As in the forward kernels: the scale folds into the softmax's exponent (common.cu's
    // kpt_softmax_max and kpt_softmax_exp, s * sc - m by one FMA), whose maxima need sc >= 0;
    // a negative scale negates Q instead (every 16-bit element's sign; padding too, unread).
    if (A.scale_log2 < 0.0f) {
        u32 *q = (u32 *)(kpt_smem + (sQ - kpt_smem_addr(kpt_smem)));
        for (int x = tid; x < KPT_PG_Q_BYTES / 4; x += KPT_THREADS) q[x] ^= 0x80008000u;
#if KPT_PG_WG
        if (WG)
            kpt_fence_proxy_async();
#endif
        __syncthreads();
    }
    const float sc = fabsf(A.scale_log2);
#else
    const float sc = KPT_LOG2E; // the score mod's result is in natural units
#endif
    // This warp's 16 rows of Q as A fragments: in registers up to head dim 128; at 256 they would
    // take 64 registers beside O's 128, so they are read from shared memory at each tile instead.
#if KPT_DQK <= 128
    u32 qf[KPT_DQK / 16][4];
#pragma unroll
    for (int kk = 0; kk < KPT_DQK / 16; kk++)
        if (!WG) // the warpgroup's products read Q from shared memory
            kpt_ldsm4(qf[kk], sQ + kpt_pg_at<KPT_PG_ROWS, KPT_QSTR>(wr * 16 + (lane & 15),
                                                                   kk * 16 + (lane >> 4) * 8));
#define KPT_PG_QF(kk) qf[kk]
#else
    u32 qs[4];
#define KPT_PG_QF(kk) qs
#endif

    int stage = 0;
    for (int j = next_live(lo); j <= hi; j = next_live(j + 1)) {
        if (jl <= hi) {
            load(jl, stage == 0 ? ST - 1 : stage - 1);
            jl = next_live(jl + 1);
        }
        kpt_cp_commit();
        kpt_cp_wait_n(ST - 1);
#if KPT_PG_WG
        if (WG)
            kpt_fence_proxy_async();
#endif
        __syncthreads();
        const u32 tK = sK + stage * KPT_PG_K_BYTES;
        const u32 tV = sV + stage * KPT_PG_V_BYTES;
        const int kb = j * KPT_BN + wk * KW; // this warp's first key
        const bool partial = KPT_PG_CLASS(j) != 2 || j * KPT_BN + KPT_BN > kv_len;

        // Which pairs of a partial tile are kept, one bit each, decided before the scores hold
        // registers (a mask that loads aux data runs in a rolled loop: KPT_MASK_UNROLL); 64 bits
        // where a warp has more than 64 keys (the 64-row kernel's 128-key tiles at head dim 64).
        typedef typename kpt_pg_bits<KW / 2>::t keep_t;
        keep_t keep = ~(keep_t)0;
        if (partial) {
            KPT_MASK_UNROLL
            for (int n = 0; n < KW / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int rr = e >> 1, kpos = kb + n * 8 + (lane & 3) * 2 + (e & 1);
                    bool kp = kpos < kv_len;
#if KPT_HAS_MASK
                    kp = kp & kpt_mask(A, U[rr], b, rw[rr].h, rw[rr].qpos, kpos);
#endif
                    if (!kp) keep &= ~((keep_t)1 << (n * 4 + e));
                }
        }
        float S[KW / 8][4];
        // (braces round the mma.sync loop: `else` followed by `#pragma unroll` made NVRTC drop the
        // scores' softmax after the warpgroup's product)
#if KPT_PG_WG
        if constexpr (WG) {
            kpt_pg_wg_s(S, sQ, tK);
        } else
#endif
        {
#pragma unroll
            for (int kk = 0; kk < KPT_DQK / 16; kk++) {
#if KPT_DQK > 128
                kpt_ldsm4(qs, sQ + kpt_pg_at<KPT_PG_ROWS, KPT_QSTR>(wr * 16 + (lane & 15),
                                                                   kk * 16 + (lane >> 4) * 8));
#endif
#pragma unroll
                for (int np = 0; np < KW / 16; np++) {
                    u32 bk[4];
                    kpt_ldsm4(bk, tK + kpt_pg_at<KPT_BN, KPT_KSTR>(
                                           wk * KW + np * 16 + (lane & 7) + (lane >> 4) * 8,
                                           kk * 16 + ((lane >> 3) & 1) * 8));
                    if (kk == 0) {
                        kpt_mma_z(S[2 * np], KPT_PG_QF(kk), bk[0], bk[1]);
                        kpt_mma_z(S[2 * np + 1], KPT_PG_QF(kk), bk[2], bk[3]);
                    } else {
                        kpt_mma(S[2 * np], KPT_PG_QF(kk), bk[0], bk[1]);
                        kpt_mma(S[2 * np + 1], KPT_PG_QF(kk), bk[2], bk[3]);
                    }
                }
            }
        }
#if KPT_HAS_SCORE
#pragma unroll
        for (int n = 0; n < KW / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int rr = e >> 1, kpos = kb + n * 8 + (lane & 3) * 2 + (e & 1);
                S[n][e] = kpt_score(A, U[rr], S[n][e] * A.scale, b, rw[rr].h, rw[rr].qpos, kpos);
            }
#endif
        if (partial) { // the keep bits only where the tile is partial, a branch taken alike
#pragma unroll
            for (int n = 0; n < KW / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    if (!((keep >> (n * 4 + e)) & 1)) S[n][e] = KPT_NINF;
        }
        // the forward's online softmax; O is rescaled only where a row of the warp has a new
        // maximum (over a long cache the maxima settle)
        float alpha[2];
        const bool grew = __any_sync(0xffffffffu, kpt_softmax_max(S, m, l, sc, alpha));
        kpt_softmax_exp(S, m, l, sc);
        if (grew)
            kpt_rescale_rows(O, alpha);
#if KPT_PG_WG
        if constexpr (WG) {
            kpt_pg_wg_pv(O, S, tV);
        } else
#endif
        {
#pragma unroll
            for (int kk = 0; kk < KW / 16; kk++) {
                u32 pa[4];
                kpt_frag(pa, S[2 * kk], S[2 * kk + 1]);
#pragma unroll
                for (int dp = 0; dp < DVW / 16; dp++) {
                    u32 bv[4];
                    kpt_ldsm4t(bv, tV + kpt_pg_at<KPT_BN, KPT_VSTR>(
                                            wk * KW + kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8,
                                            wd * DVW + dp * 16 + (lane >> 4) * 8));
                    kpt_mma(O[2 * dp], pa, bv[0], bv[1]);
                    kpt_mma(O[2 * dp + 1], pa, bv[2], bv[3]);
                }
            }
        }
        __syncthreads(); // the stage is refilled next
        stage = stage + 1 == ST ? 0 : stage + 1;
    }
#undef KPT_PG_CLASS
#undef KPT_PG_QF
    kpt_cp_wait<0>();
    if constexpr (WK == 1 && !KPT_PG_DVSPLIT) { // past head dim 128 the 32-row kernel spilled
        kpt_pg_finish_frags<DVW / 8>(A, P, w, rw, wr * 16, wd * DVW, O, m, l);
        return;
    }
    __syncthreads();

    // Merge the warps' states (the ring is free now, and the plan holds this much after Q: see
    // plan_paged): per warp 16 rows of O, then m and l. A row takes KPT_PG_OS floats, 8 past Dv:
    // the fragments' stores put eight rows in one instruction, which a stride of Dv (a multiple
    // of 32 banks) sent to the same eight banks, an eight-way conflict.
    float *scr = (float *)(kpt_smem + (sK - kpt_smem_addr(kpt_smem)));
    constexpr int OS = KPT_PG_OS, WSZ = 16 * OS + 32;
    {
        float *mine = scr + (KPT_PG_DVSPLIT ? wr : warp) * WSZ; // key slices, or a row block
#pragma unroll
        for (int rr = 0; rr < 2; rr++) {
            float sum = l[rr];
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            sum += __shfl_xor_sync(0xffffffffu, sum, 2);
            const int row = (lane >> 2) + rr * 8;
            if ((lane & 3) == 0 && wd == 0) { // the column slices' states are the same
                mine[16 * OS + row] = m[rr];
                mine[16 * OS + 16 + row] = sum;
            }
#pragma unroll
            for (int n = 0; n < DVW / 8; n++) {
                const int d = wd * DVW + n * 8 + (lane & 3) * 2; // even: 8-byte aligned
                *(float2 *)&mine[row * OS + d] = make_float2(O[n][2 * rr], O[n][2 * rr + 1]);
            }
        }
    }
    __syncthreads();
    // A warp a row: the slices' states merged once, then its lanes over the columns (the merge
    // per element, as it was, took half of a CTA's time at 4k keys: its divisions and
    // exponentials repeated 129 times a row, and padding rows passed through it too).
    for (int r = warp; r < 16 * WR; r += KPT_WARPS) {
        const kpt_pg_row x = s_rows[r];
        if (x.t < 0) continue;
        const float *base = scr + (r / 16) * WK * WSZ;
        const int rl = r % 16;
        float M = KPT_NINF;
#pragma unroll
        for (int s = 0; s < WK; s++) M = fmaxf(M, base[s * WSZ + 16 * OS + rl]);
        const float Mu = M == KPT_NINF ? 0.0f : M;
        float a[WK], L = 0.0f;
#pragma unroll
        for (int s = 0; s < WK; s++) {
            a[s] = kpt_ex2(base[s * WSZ + 16 * OS + rl] - Mu);
            L += a[s] * base[s * WSZ + 16 * OS + 16 + rl];
        }
        // 1 / L folded into the weights: a division a row, where one a column (four a lane,
        // each a branch to its slow path) took a quarter of the 64-row kernel's stall samples
        // at one sequence of 4k keys (ncu, H200)
        const float inv = L > 0.0f ? 1.0f / L : 0.0f;
#pragma unroll
        for (int s = 0; s < WK; s++) a[s] *= inv;
        auto col = [&](int d) { // column d of the row: the slices' O, weighted
            float o = 0.0f;
#pragma unroll
            for (int s = 0; s < WK; s++) o += a[s] * base[s * WSZ + rl * OS + d];
            return o;
        };
#if KPT_PG_CLUSTER
        if constexpr (WR == 1) {
            if (P.cluster) { // this split's result where Q was (kpt_pg_cluster_combine)
                float *cl = (float *)(kpt_smem + (sQ - kpt_smem_addr(kpt_smem)));
                if (lane == 0) cl[KPT_PG_CL_ROWS * KPT_DV + r] = kpt_pg_lse2(M, L);
                for (int d = lane; d < KPT_DV; d += 32) cl[r * KPT_DV + d] = col(d);
                continue;
            }
        }
#endif
        kpt_pg_finish_row(A, P, w, r, x, M, L, col);
    }
#if KPT_PG_CLUSTER
    if constexpr (WR == 1)
        if (P.cluster)
            kpt_pg_cluster_combine(A, P, w, s_rows, sQ);
#endif
}

// Up to head dim 128 the kernels say one CTA an SM is enough, which frees ptxas's register
// budget: without it the 16-row kernel took 168 registers and spilled (D = 128, after the
// branch-free page lookup of kpt_pg_load_kv), with it 185 and none. Two CTAs an SM still fit
// where the plan wants them (2 x 128 x 255 registers). At head dim 256 the same bound made the
// 16- and 32-row kernels spill more (255 registers each), so the 32- and 64-row kernels keep
// ptxas's own target; the 16-row kernel says two CTAs an SM (as the plan has them), with which
// it takes 240 registers and no spill, where ptxas's own target became 128 registers and 44
// bytes of spill loads once kpt_pg_stage took values (contiguous, 64 x 1 x 32k, H200: 3876-3910
// GB/s before, 3527-3561 so, 3773 with the bound).
#if KPT_DQK <= 128 && KPT_DV <= 128
#define KPT_PG_BOUNDS __launch_bounds__(KPT_THREADS, 1)
#define KPT_PG_BOUNDS_R1 KPT_PG_BOUNDS
#else
#define KPT_PG_BOUNDS __launch_bounds__(KPT_THREADS)
#define KPT_PG_BOUNDS_R1 __launch_bounds__(KPT_THREADS, 2)
#endif

extern "C" __global__ void KPT_PG_BOUNDS_R1 kpt_paged_r1(const kpt_args A, const kpt_pargs P)
{
    kpt_paged_body<1>(A, P);
}
extern "C" __global__ void KPT_PG_BOUNDS kpt_paged_r2(const kpt_args A, const kpt_pargs P)
{
    kpt_paged_body<2>(A, P);
}
extern "C" __global__ void KPT_PG_BOUNDS kpt_paged_r4(const kpt_args A, const kpt_pargs P)
{
    kpt_paged_body<4>(A, P);
}

// The combine of P.splits partial results (grid x: blocks * ceil(P.rows / rows a CTA), y: kv
// heads). Each row of a (sequence, query block, kv head) gets one to four warps, by the splits
// (kpt_pg_cwpr; the host sizes the grid with it): its threads turn the splits' LSEs into weights
// (the sink joins the denominator here), kept in shared memory; then each of its warps sums
// every wpr-th split's partial O, its lanes over the columns with several splits' loads in
// flight, and the warps' sums meet in shared memory. A warp a row, waiting on its splits a few
// at a time, took 18 us at one decoding sequence (33 splits, H100): a fifth of the decode; four
// warps a row for a handful of splits were slower than one.
#define KPT_PG_CW 4 // warps of the combine's CTA
#define KPT_PG_PF 4 // splits a warp of the combine loads before its weights are known
__device__ __forceinline__ int kpt_pg_cwpr(int splits)
{
    return splits >= 16 ? 4 : splits >= 8 ? 2 : 1;
}

// The maximum (or sum) of v over the wpr warps of row group wr, in a fixed order. Every thread
// of the CTA calls it (two barriers).
template <bool MAX>
__device__ __forceinline__ float kpt_pg_group_reduce(float v, float *red, int wr, int wpr)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float u = __shfl_xor_sync(0xffffffffu, v, o);
        v = MAX ? fmaxf(v, u) : v + u;
    }
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    v = red[wr * wpr];
    for (int q = 1; q < wpr; q++) v = MAX ? fmaxf(v, red[wr * wpr + q]) : v + red[wr * wpr + q];
    __syncthreads(); // red is reused
    return v;
}

extern "C" __global__ void __launch_bounds__(KPT_PG_CW * 32)
kpt_paged_combine(const kpt_args A, const kpt_pargs P)
{
    __shared__ float s_w[KPT_PG_CW][KPT_PAGED_MAX_SPLITS_DEV];
    __shared__ __align__(16) float s_o[KPT_PG_CW][KPT_DV];
    __shared__ float s_red[KPT_PG_CW];
    const int wpr = kpt_pg_cwpr(P.splits), rpc = KPT_PG_CW / wpr;
    const int per_blk = (P.rows + rpc - 1) / rpc; // the combine's CTAs a query block
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int wr = warp / wpr, part = warp % wpr, t = part * 32 + lane, nt = wpr * 32;
    const int blk = (int)blockIdx.x / per_blk, r0 = (int)blockIdx.x % per_blk * rpc, r = r0 + wr;
    const kpt_pg_work w = kpt_pg_work_of(A, P, blk * P.splits, (int)blockIdx.y, P.splits);
    if (r0 >= w.n_tok * A.group) return; // the whole CTA
    bool live = r < w.n_tok * A.group;
    kpt_pg_row x = {};
    if (live) {
        x = kpt_pg_row_of(A, P, w, r);
        live = x.t >= 0;
    }
    kpt_grid_wait(); // the attention kernel's partial results, when launched as its dependent
    const float *pl = (const float *)P.part_lse, *po = (const float *)P.part_o;
    const i64 first = ((i64)w.blk * P.splits) * A.Hkv + w.hk; // split s: + s * Hkv
    // this warp's first KPT_PG_PF splits' partial O (its lanes' first columns), loaded with the
    // LSEs rather than after the weights: one wait on memory fewer between the attention's end
    // and the output (the loads do not need the weights, only the sums do)
    constexpr int V = KPT_PG_VEC, PF = KPT_PG_PF;
    const int d00 = lane * V;
    auto part_o = [&](int s, int d0, float *v) {
        const float *src = po + ((first + (i64)s * A.Hkv) * KPT_PG_ROWS + r) * KPT_DV + d0;
        if constexpr (V == 4) {
            const float4 f = *(const float4 *)src;
            v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
        } else {
#pragma unroll
            for (int e = 0; e < V; e++) v[e] = src[e];
        }
    };
    float pre[PF][V];
#pragma unroll
    for (int i = 0; i < PF; i++) {
        const int s = part + i * wpr;
        if (live && s < P.splits && d00 < KPT_DV)
            part_o(s, d00, pre[i]);
        else
#pragma unroll
            for (int e = 0; e < V; e++) pre[i][e] = 0.0f;
    }
    // this thread's splits' LSEs, several loads in flight, kept in s_w until they are weights
    float M = KPT_NINF;
#pragma unroll 8
    for (int s = t; live && s < P.splits; s += nt) {
        const float v = pl[(first + (i64)s * A.Hkv) * KPT_PG_ROWS + r];
        s_w[wr][s] = v;
        M = fmaxf(M, v);
    }
    M = kpt_pg_group_reduce<true>(M, s_red, wr, wpr);
    const float s2 = live && P.sinks ? kpt_pg_sink2(P, x.h) : KPT_NINF;
    M = fmaxf(M, s2);
    const float Mu = M == KPT_NINF ? 0.0f : M;
    float den = 0.0f;
    for (int s = t; live && s < P.splits; s += nt) {
        const float e = kpt_ex2(s_w[wr][s] - Mu);
        s_w[wr][s] = e;
        den += e;
    }
    den = kpt_pg_group_reduce<false>(den, s_red, wr, wpr) + kpt_ex2(s2 - Mu); // publishes s_w
    const float inv = den > 0.0f ? 1.0f / den : 0.0f;
    // an empty split has weight 0 and O 0; never 0 * NaN
    auto add = [](float *acc, float ws, const float *v) {
#pragma unroll
        for (int e = 0; e < V; e++) acc[e] += ws > 0.0f ? ws * v[e] : 0.0f;
    };
    for (int d0 = d00; live && d0 < KPT_DV; d0 += 32 * V) {
        float acc[V] = {};
        int s = part; // the splits in the same order either way: the bits do not depend on PF
        if (d0 == d00) {
#pragma unroll
            for (int i = 0; i < PF; i++, s += wpr)
                if (s < P.splits) add(acc, s_w[wr][s], pre[i]);
        }
#pragma unroll 8
        for (; s < P.splits; s += wpr) {
            float v[V];
            part_o(s, d0, v);
            add(acc, s_w[wr][s], v);
        }
#pragma unroll
        for (int e = 0; e < V; e++) s_o[warp][d0 + e] = acc[e];
    }
    __syncthreads();
    if (!live) return;
    for (int d = t; d < KPT_DV; d += nt) {
        float o = s_o[wr * wpr][d];
        for (int q = 1; q < wpr; q++) o += s_o[wr * wpr + q][d];
        kpt_pg_store(A, x.t, x.h, d, o * inv);
    }
    if (t == 0)
        kpt_pg_store(A, x.t, x.h, -1, den > 0.0f ? (M + __log2f(den)) * KPT_LN2 : KPT_NINF);
}
