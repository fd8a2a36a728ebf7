// The sm_90a attention kernel (warpgroup MMA), inserted into templates/cuda/common.cu by
// codegen/cuda_source.c for cuda:sm_90a.
//
// One CTA of two warpgroups owns one (q tile of 128 rows, head, batch row); each warpgroup owns
// 64 rows and every column of the kv tile, each of its warps 16 rows with the same per-thread
// layout as the sm_80 kernel's m16 blocks, so masks, score mods and the online softmax are the
// same code. S = Q K^T and O += P V are wgmma.mma_async: Q, K and V sit in shared memory in the
// 128-byte-swizzled layout the tensor cores read directly (Q and K as K-major operands, V as an
// N-major one), P goes from registers. Loads are cp.async into two stages, one tile ahead.
// Not yet here (issue "Hopper path"): TMA, producer/consumer warp specialisation, ping-pong.

#if KPT_BF16
#define KPT_WG_T "bf16"
#else
#define KPT_WG_T "f16"
#endif

// D (64 x 64, f32) += A (64 x 16, shared, K-major) * B (16 x 64, shared, K-major)^T;
// scale_d = 0 ignores D's old value.
__device__ __forceinline__ void kpt_wgmma_ss_n64(float *d, u64 da, u64 db, int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32." KPT_WG_T "." KPT_WG_T " "
                 "{"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
                 "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
                   , "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
                   , "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23])
                   , "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "l"(da), "l"(db), "r"(scale_d));
}
// D (64 x 64, f32) += A (64 x 16, registers, the mma.sync A-fragment layout per warp) *
// B (16 x 64, shared, MN-major: N contiguous).
__device__ __forceinline__ void kpt_wgmma_rs_n64(float *d, const u32 *a, u64 db, int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32." KPT_WG_T "." KPT_WG_T " "
                 "{"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
                 "}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
                   , "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
                   , "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23])
                   , "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));
}
// Keeps the compiler from moving reads or writes of D across a wgmma wait (the products
// write D asynchronously, behind the compiler's back).
__device__ __forceinline__ void kpt_wgmma_regs_n64(float *d)
{
#pragma unroll
    for (int i = 0; i < 32; i++)
        asm volatile("" : "+f"(d[i])::"memory");
}

// D (64 x 128, f32) += A (64 x 16, shared, K-major) * B (16 x 128, shared, K-major)^T;
// scale_d = 0 ignores D's old value.
__device__ __forceinline__ void kpt_wgmma_ss_n128(float *d, u64 da, u64 db, int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32." KPT_WG_T "." KPT_WG_T " "
                 "{"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
                 "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
                   , "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
                   , "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23])
                   , "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                   , "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39])
                   , "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47])
                   , "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55])
                   , "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "l"(da), "l"(db), "r"(scale_d));
}
// D (64 x 128, f32) += A (64 x 16, registers, the mma.sync A-fragment layout per warp) *
// B (16 x 128, shared, MN-major: N contiguous).
__device__ __forceinline__ void kpt_wgmma_rs_n128(float *d, const u32 *a, u64 db, int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32." KPT_WG_T "." KPT_WG_T " "
                 "{"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
                 "}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
                   , "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
                   , "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23])
                   , "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                   , "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39])
                   , "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47])
                   , "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55])
                   , "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));
}
// Keeps the compiler from moving reads or writes of D across a wgmma wait (the products
// write D asynchronously, behind the compiler's back).
__device__ __forceinline__ void kpt_wgmma_regs_n128(float *d)
{
#pragma unroll
    for (int i = 0; i < 64; i++)
        asm volatile("" : "+f"(d[i])::"memory");
}


__device__ __forceinline__ void kpt_wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void kpt_wgmma_commit()
{
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N> __device__ __forceinline__ void kpt_wgmma_wait()
{
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// cp.async writes shared memory through the generic proxy; wgmma reads it through the async
// proxy: each writing thread fences before the barrier that publishes a tile.
__device__ __forceinline__ void kpt_fence_proxy_async()
{
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

#if KPT_DV == 128
#define kpt_wgmma_rs_o kpt_wgmma_rs_n128
#define kpt_wgmma_regs_o kpt_wgmma_regs_n128
#else
#define kpt_wgmma_rs_o kpt_wgmma_rs_n64
#define kpt_wgmma_regs_o kpt_wgmma_regs_n64
#endif

// A shared-memory matrix descriptor for the 128-byte swizzle: start address, leading and
// stride byte offsets (each stored divided by 16), swizzle mode 1 in bits 62-63.
__device__ __forceinline__ u64 kpt_sw128_desc(u32 addr, u32 lbo, u32 sbo)
{
    return (u64)((addr & 0x3ffffu) >> 4) | ((u64)(lbo >> 4) << 16) | ((u64)(sbo >> 4) << 32) |
           (1ull << 62);
}

// Copies ROWS rows of D 16-bit elements (row r from src + r * stride) into the swizzled layout:
// D / 64 column blocks of ROWS rows x 128 bytes, 16-byte chunk c of row r stored at chunk
// c ^ (r % 8) of its row. Rows at or past `valid` are zero-filled.
template <int ROWS, int D>
__device__ __forceinline__ void kpt_load_sw(u32 dst, const u16 *src, i64 stride, int valid)
{
    constexpr int CH = D / 8, N = ROWS * CH;
    static_assert(N % KPT_THREADS == 0, "tile copies must divide among the threads");
#pragma unroll
    for (int it = 0; it < N / KPT_THREADS; it++) {
        const int i = (int)threadIdx.x + it * KPT_THREADS;
        const int r = i / CH, cg = i % CH;
        const bool ok = r < valid;
        const u32 d = dst + (u32)((cg >> 3) * ROWS * 128 + r * 128 + (((cg & 7) ^ (r & 7)) << 4));
        kpt_cp16(d, src + (ok ? (i64)r * stride : 0) + cg * 8, ok);
    }
}

extern "C" __global__ void __launch_bounds__(KPT_THREADS, 1) kpt_attention(const kpt_args A)
{
    extern __shared__ __align__(16) unsigned char kpt_smem[];
    // swizzle atoms repeat every 1024 bytes: the tiles start 1024-byte aligned (the plan adds
    // the slack)
    const u32 sQ = (kpt_smem_addr(kpt_smem) + 1023u) & ~1023u;
    const u32 sK = sQ + KPT_BM * KPT_DQK * 2;
    const u32 sV = sK + 2 * KPT_BN * KPT_DQK * 2;

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, wg = warp >> 2;
    const int qt = A.n_qt - 1 - (int)blockIdx.x; // heaviest (last) q tiles first under causal masks
    const int h = blockIdx.y, b = blockIdx.z, hk = h / A.group;
    kpt_uniform U;
    kpt_uniform_init(A, b, h, U);
    const int q0 = qt * KPT_BM;
    const int q1 = min(q0 + KPT_BM, A.Sq) - 1;

    const u16 *gQ = (const u16 *)A.q + (i64)b * A.qs[0] + (i64)h * A.qs[1] + (i64)q0 * A.qs[2];
    const u16 *gK = (const u16 *)A.k + (i64)b * A.ks[0] + (i64)hk * A.ks[1];
    const u16 *gV = (const u16 *)A.v + (i64)b * A.vs[0] + (i64)hk * A.vs[1];

    // The kv tiles that may hold a kept pair lie in [lo, hi].
    int lo = 0, hi = A.n_kt - 1;
#if KPT_HAS_MASK
    __shared__ int s_lo, s_hi;
    __shared__ unsigned char s_cls[KPT_CLS_CAP];
    kpt_live_tiles(A, b, h, qt, q0, q1, s_cls, &s_lo, &s_hi, lo, hi);
#endif

    float O[KPT_DV / 8][4];
    float m[2], l[2];
#pragma unroll
    for (int n = 0; n < KPT_DV / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) O[n][e] = 0.0f;
    m[0] = m[1] = KPT_NINF;
    l[0] = l[1] = 0.0f;

    const int wrow = warp * 16; // this warp's first row in the tile
    kpt_load_sw<KPT_BM, KPT_DQK>(sQ, gQ, A.qs[2], A.Sq - q0);
    int stage = 0;
    if (lo <= hi) {
        int k0 = lo * KPT_BN;
        kpt_load_sw<KPT_BN, KPT_DQK>(sK, gK + (i64)k0 * A.ks[2], A.ks[2], A.Skv - k0);
        kpt_load_sw<KPT_BN, KPT_DV>(sV, gV + (i64)k0 * A.vs[2], A.vs[2], A.Skv - k0);
    }
    kpt_cp_commit();

#if !KPT_HAS_SCORE
    // as in the sm_80 kernel: the scale folds into the exponent; a negative one negates Q
    if (A.scale_log2 < 0.0f) {
        kpt_cp_wait<0>();
        __syncthreads();
        for (int i = tid; i < KPT_BM * KPT_DQK / 2; i += KPT_THREADS) {
            u32 *w = (u32 *)(kpt_smem + (sQ - kpt_smem_addr(kpt_smem))) + i;
            *w ^= 0x80008000u;
        }
        __syncthreads();
    }
    const float sc = fabsf(A.scale_log2);
#else
    const float sc = KPT_LOG2E;
#endif

    for (int j = lo; j <= hi;) {
#if KPT_HAS_MASK
#define KPT_CLASS_OF(t) ((t) < KPT_CLS_CAP ? (int)s_cls[t] : kpt_tile_class(A, b, h, qt, q0, q1, (t)))
        const int cls = KPT_CLASS_OF(j);
        int jn = j + 1;
        while (jn <= hi && KPT_CLASS_OF(jn) == 0)
            jn++;
#undef KPT_CLASS_OF
#else
        const int cls = 2;
        const int jn = j + 1;
#endif
        if (jn <= hi) {
            const int k0n = jn * KPT_BN;
            kpt_load_sw<KPT_BN, KPT_DQK>(sK + (stage ^ 1) * KPT_BN * KPT_DQK * 2,
                                         gK + (i64)k0n * A.ks[2], A.ks[2], A.Skv - k0n);
            kpt_load_sw<KPT_BN, KPT_DV>(sV + (stage ^ 1) * KPT_BN * KPT_DV * 2,
                                        gV + (i64)k0n * A.vs[2], A.vs[2], A.Skv - k0n);
            kpt_cp_commit();
            kpt_cp_wait<1>();
        } else {
            kpt_cp_wait<0>();
        }
        kpt_fence_proxy_async();
        __syncthreads();

        const u32 tK = sK + stage * KPT_BN * KPT_DQK * 2;
        const u32 tV = sV + stage * KPT_BN * KPT_DV * 2;
        const int k0 = j * KPT_BN;

        const bool partial = cls != 2 || k0 + KPT_BN > A.Skv;
        u64 keep = ~0ull;
        if (partial) {
            KPT_MASK_UNROLL
            for (int n = 0; n < KPT_BN / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int qi = q0 + wrow + (lane >> 2) + (e >> 1) * 8;
                    const int ki = k0 + n * 8 + (lane & 3) * 2 + (e & 1);
                    bool kp = ki < A.Skv;
#if KPT_HAS_MASK
                    kp = kp && kpt_mask(A, U, b, h, qi, ki);
#endif
                    if (!kp) keep &= ~(1ull << (n * 4 + e));
                }
        }

        // S = Q K^T: this warpgroup's 64 rows of Q against the tile's keys, K steps of 16
        float S[KPT_BN / 8][4];
#pragma unroll
        for (int n = 0; n < KPT_BN / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) S[n][e] = 0.0f;
        kpt_wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < KPT_DQK / 16; kk++) {
            const u32 kb = (u32)((kk & 3) * 32); // 16 elements within a 64-column block
            const u64 da = kpt_sw128_desc(sQ + (kk >> 2) * KPT_BM * 128 + wg * 64 * 128 + kb, 16, 1024);
            const u64 db = kpt_sw128_desc(tK + (kk >> 2) * KPT_BN * 128 + kb, 16, 1024);
            kpt_wgmma_ss_n128(&S[0][0], da, db, 1);
        }
        kpt_wgmma_commit();
        kpt_wgmma_wait<0>();
        kpt_wgmma_regs_n128(&S[0][0]);

#if KPT_HAS_SCORE
#pragma unroll
        for (int n = 0; n < KPT_BN / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int qi = q0 + wrow + (lane >> 2) + (e >> 1) * 8;
                const int ki = k0 + n * 8 + (lane & 3) * 2 + (e & 1);
                S[n][e] = kpt_score(A, U, S[n][e] * A.scale, b, h, qi, ki);
            }
#endif
        if (partial) {
#pragma unroll
            for (int n = 0; n < KPT_BN / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    if (!((keep >> (n * 4 + e)) & 1)) S[n][e] = KPT_NINF;
        }

        // online softmax in base 2, the O rescale skipped when no row max of the warp grew
        float alpha[2];
        if (__any_sync(0xffffffffu, kpt_softmax_max(S, m, l, sc, alpha)))
            kpt_rescale_rows(O, alpha);
        kpt_softmax_exp(S, m, l, sc);

        // O += P V: P from registers (the A-fragment layout), V N-major from shared memory; the
        // leading byte offset steps over 64-column blocks of V, the stride over 8-row groups
        u32 pa[KPT_BN / 16][4];
#pragma unroll
        for (int kk = 0; kk < KPT_BN / 16; kk++) {
            pa[kk][0] = kpt_pack(S[2 * kk][0], S[2 * kk][1]);
            pa[kk][1] = kpt_pack(S[2 * kk][2], S[2 * kk][3]);
            pa[kk][2] = kpt_pack(S[2 * kk + 1][0], S[2 * kk + 1][1]);
            pa[kk][3] = kpt_pack(S[2 * kk + 1][2], S[2 * kk + 1][3]);
        }
        kpt_wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < KPT_BN / 16; kk++) {
            const u64 dv = kpt_sw128_desc(tV + kk * 16 * 128, KPT_BN * 128, 1024);
            kpt_wgmma_rs_o(&O[0][0], pa[kk], dv, 1);
        }
        kpt_wgmma_commit();
        kpt_wgmma_wait<0>();
        kpt_wgmma_regs_o(&O[0][0]);
        __syncthreads(); // everyone is done with this stage before it is refilled
        stage ^= 1;
        j = jn;
    }
    kpt_cp_wait<0>();

    // Epilogue: normalise, write O (and LSE).
    kpt_store_rows(A, b, h, q0 + wrow, lane, O, m, l);
}
