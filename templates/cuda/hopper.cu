// Hopper primitives (warpgroup MMA, shared-memory matrix descriptors, mbarriers, TMA, named
// barriers, register reallocation), placed by codegen/cuda_source.c before the sm_90a kernels
// (templates/cuda/attention_sm90.cu, templates/cuda/attention_bwd_sm90.cu, and
// templates/cuda/paged.cu at head dims 64 and 128) in the KERNEL hole of
// templates/cuda/common.cu.

#if KPT_BF16
#define KPT_WG_T "bf16"
#else
#define KPT_WG_T "f16"
#endif

// Operands of the warpgroup products: D, N / 2 floats (N = 32, 64, 128 or 256), in operands %0 on;
// KPT_ACC* name them in the asm text, KPT_D* bind them.
#define KPT_ACC16 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
#define KPT_ACC32                                                                                  \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "  \
    "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define KPT_ACC64                                                                                  \
    KPT_ACC32 ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
              "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define KPT_ACC128                                                                                 \
    KPT_ACC64 ", %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
              "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "   \
              "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, "               \
              "%108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, "           \
              "%120, %121, %122, %123, %124, %125, %126, %127"
#define KPT_D8(o)                                                                                  \
    "+f"(d[o]), "+f"(d[o + 1]), "+f"(d[o + 2]), "+f"(d[o + 3]), "+f"(d[o + 4]), "+f"(d[o + 5]),    \
        "+f"(d[o + 6]), "+f"(d[o + 7])
#define KPT_D32 KPT_D8(0), KPT_D8(8), KPT_D8(16), KPT_D8(24)
#define KPT_D64 KPT_D32, KPT_D8(32), KPT_D8(40), KPT_D8(48), KPT_D8(56)
#define KPT_D128                                                                                   \
    KPT_D64, KPT_D8(64), KPT_D8(72), KPT_D8(80), KPT_D8(88), KPT_D8(96), KPT_D8(104),            \
        KPT_D8(112), KPT_D8(120)
#define KPT_P4(k) "r"(a[k][0]), "r"(a[k][1]), "r"(a[k][2]), "r"(a[k][3])
#define KPT_P32 KPT_P4(0), KPT_P4(1), KPT_P4(2), KPT_P4(3), KPT_P4(4), KPT_P4(5), KPT_P4(6), KPT_P4(7)

// D (64 x 128, f32) += A (64 x 16, shared, K-major) * B (16 x 128, shared, K-major)^T;
// scale_d = 0 ignores D's old value. One asm statement per k step: issuing the k steps of S from
// one statement (as P V does) compiles ~5 % faster but ran 2-5 % slower (H100: full, alibi).
// TA, TB = 1: A or B is MN-major instead (as kpt_wgmma_ss_n64's).
template <int TA = 0, int TB = 0>
__device__ __forceinline__ void kpt_wgmma_ss_n128(float *d, u64 da, u64 db, int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32." KPT_WG_T "." KPT_WG_T " " KPT_ACC64
                 "}, %64, %65, p, 1, 1, %67, %68;\n}\n"
                 : KPT_D64
                 : "l"(da), "l"(db), "r"(scale_d), "n"(TA), "n"(TB));
}

// The same with B 16 x 64: S of 64-key tiles (head dim 256). TA, TB = 1: A or B is MN-major
// instead (M or N contiguous; the backward's dQ = dS K takes dS^T and K as they lie).
template <int TA = 0, int TB = 0>
__device__ __forceinline__ void kpt_wgmma_ss_n64(float *d, u64 da, u64 db, int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32." KPT_WG_T "." KPT_WG_T " " KPT_ACC32
                 "}, %32, %33, p, 1, 1, %35, %36;\n}\n"
                 : KPT_D32
                 : "l"(da), "l"(db), "r"(scale_d), "n"(TA), "n"(TB));
}

// The same with B 16 x 32 (K-major): the backward's S^T and dP^T (S and dP) where the two
// consumer warpgroups split a step's 64 queries (a tile's 64 keys) between them (head dims past
// 128).
__device__ __forceinline__ void kpt_wgmma_ss_n32(float *d, u64 da, u64 db, int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k16.f32." KPT_WG_T "." KPT_WG_T " " KPT_ACC16
                 "}, %16, %17, p, 1, 1, 0, 0;\n}\n"
                 : KPT_D8(0), KPT_D8(8)
                 : "l"(da), "l"(db), "r"(scale_d));
}

// D (64 x 64, f32) += A (64 x 16, registers, the mma.sync A-fragment layout per warp) *
// B (16 x 64, shared, MN-major: N contiguous).
__device__ __forceinline__ void kpt_wgmma_rs_n64(float *d, const u32 *a, u64 db, int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32." KPT_WG_T "." KPT_WG_T " " KPT_ACC32
                 "}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
                 : KPT_D32
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));
}

// The same with B 16 x 128 and 16 x 256, adding to D: the k steps of P V over 64-key tiles.
__device__ __forceinline__ void kpt_wgmma_rs_n128(float *d, const u32 *a, u64 db)
{
    asm volatile("{\n.reg .pred t;\nsetp.eq.b32 t, 0, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32." KPT_WG_T "." KPT_WG_T " " KPT_ACC64
                 "}, {%64, %65, %66, %67}, %68, t, 1, 1, 1;\n}\n"
                 : KPT_D64
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}
__device__ __forceinline__ void kpt_wgmma_rs_n256(float *d, const u32 *a, u64 db)
{
    asm volatile("{\n.reg .pred t;\nsetp.eq.b32 t, 0, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32." KPT_WG_T "." KPT_WG_T " " KPT_ACC128
                 "}, {%128, %129, %130, %131}, %132, t, 1, 1, 1;\n}\n"
                 : KPT_D128
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}

// Keeps the compiler from moving reads or writes of D (N floats) across a wgmma wait (the
// products write D asynchronously, behind the compiler's back).
template <int N> __device__ __forceinline__ void kpt_wgmma_regs(float *d)
{
#pragma unroll
    for (int i = 0; i < N; i++)
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
// Writes to shared memory through the generic proxy (the Q negation) must be fenced before the
// async proxy (wgmma) reads them.
__device__ __forceinline__ void kpt_fence_proxy_async()
{
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// A shared-memory matrix descriptor for the 128-byte swizzle: start address, leading and
// stride byte offsets (each stored divided by 16), swizzle mode 1 in bits 62-63.
__device__ __forceinline__ u64 kpt_sw128_desc(u32 addr, u32 lbo, u32 sbo)
{
    return (u64)((addr & 0x3ffffu) >> 4) | ((u64)(lbo >> 4) << 16) | ((u64)(sbo >> 4) << 32) |
           (1ull << 62);
}

// desc (kpt_sw128_desc) of the operand `bytes` (a multiple of 16) further on: an add to its start
// address field, which does not carry (shared addresses stay below 256 KB). Built from one base
// descriptor, the k steps of a product cost an add each instead of the add, mask, shift and or
// of a fresh descriptor. A 64-bit add, not one to the low word: ptxas makes it one UIADD3.64,
// where the low word's add took a UIADD3 and a UMOV of the high word besides (sm_90a backward
// full, a kpt_bwd_dkdv step 829 -> 786 instructions, kpt_bwd_dq's 485 -> 456).
__device__ __forceinline__ u64 kpt_desc_add(u64 desc, u32 bytes)
{
    return desc + (bytes >> 4);
}

// One k step of S (64 x KPT_BN, f32) += Q (64 x 16) K^T (16 x KPT_BN), both from shared memory,
// K-major: the forward's and the serving kernel's first product, over tiles of 64 or 128 keys.
__device__ __forceinline__ void kpt_wgmma_ss_keys(float *d, u64 da, u64 db, int scale_d)
{
#if KPT_BN == 128
    kpt_wgmma_ss_n128(d, da, db, scale_d);
#else
    kpt_wgmma_ss_n64(d, da, db, scale_d);
#endif
}

// x, with what the compiler knew of its bits forgotten: a base descriptor whose address bits it
// knows to be zero has its k steps' adds made ORs of the low word, each with a move of the high
// word besides, instead of one 64-bit add (UIADD3.64)
__device__ __forceinline__ u64 kpt_opaque64(u64 x)
{
    asm("mov.b64 %0, %0;" : "+l"(x));
    return x;
}

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
// O += P V over a KPT_BN-key tile (the attention kernels' second product; the forward's and the
// serving kernel's): P from registers (the A-fragment layout), V N-major from shared memory in
// 64-column blocks of KPT_BN rows (the 128-byte swizzle); the leading byte offset steps over the
// blocks, the stride over 8-row groups. Issued and committed, not waited for.
__device__ __forceinline__ void kpt_issue_pv(float (&O)[KPT_DV / 8][4],
                                             const u32 (&P)[KPT_BN / 16][4], u32 tV)
{
    kpt_wgmma_fence();
#if KPT_DV == 128 && KPT_BN == 128
    kpt_wgmma_pv128(&O[0][0], P, kpt_sw128_desc(tV, KPT_BN * 128, 1024));
#else
    const u64 dv0 = kpt_sw128_desc(tV, KPT_BN * 128, 1024);
#pragma unroll
    for (int kk = 0; kk < KPT_BN / 16; kk++) {
        const u64 dv = kpt_desc_add(dv0, kk * 16 * 128);
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

// ---- mbarriers, TMA, named barriers, register reallocation ----------------------------------

__device__ __forceinline__ void kpt_mbar_init(u32 bar, u32 count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Makes the initialised barriers visible to the async proxy (TMA) before first use.
__device__ __forceinline__ void kpt_mbar_init_fence()
{
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// The producer's arrival, announcing the bytes the TMA copies will complete on the barrier.
__device__ __forceinline__ void kpt_mbar_expect_tx(u32 bar, u32 bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void kpt_mbar_arrive(u32 bar)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Waits for the completion of the barrier's phase of the given parity.
__device__ __forceinline__ void kpt_mbar_wait(u32 bar, u32 parity)
{
    u32 done;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(bar), "r"(parity)
                     : "memory");
    } while (!done);
}
// A CUtensorMap (128 opaque bytes, 64-byte aligned), passed in a __grid_constant__ parameter.
struct __align__(64) kpt_tmap {
    u64 w[16];
};
// One box (64 columns x ROWS rows, 128-byte swizzle) of a 4-d tensor map (D, S, heads, batch)
// into shared memory; rows outside the tensor read as zeros.
__device__ __forceinline__ void kpt_tma_box(u32 dst, const void *map, int d0, int row, int hc,
                                            int bc, u32 bar)
{
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(dst),
                 "l"(map), "r"(d0), "r"(row), "r"(hc), "r"(bc), "r"(bar)
                 : "memory");
}
// Rows part on of a tile of ROWS rows x D columns (a block of ROWS x 128 bytes per 64 columns),
// from tensor rows row + part on: D / 64 boxes of the map's rows (fewer than ROWS where the
// backward's 64-row boxes of Q and dO fill its 128-row tiles). kpt_tma_tile: a whole tile, boxes
// of ROWS rows.
template <int ROWS, int D>
__device__ __forceinline__ void kpt_tma_part(u32 dst, const void *map, int part, int row, int hc,
                                             int bc, u32 bar)
{
#pragma unroll
    for (int c = 0; c < D / 64; c++)
        kpt_tma_box(dst + c * ROWS * 128 + part * 128, map, c * 64, row + part, hc, bc, bar);
}
template <int ROWS, int D>
__device__ __forceinline__ void kpt_tma_tile(u32 dst, const void *map, int row, int hc, int bc,
                                             u32 bar)
{
    kpt_tma_part<ROWS, D>(dst, map, 0, row, hc, bc, bar);
}
// The box at src (shared memory, the map's layout) added into the tensor (f32 maps: the
// backward's dQ accumulator) at the given coordinates, in this thread's current bulk group.
__device__ __forceinline__ void kpt_tma_add(const void *map, u32 src, int d0, int row, int hc,
                                           int bc)
{
    asm volatile("cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.tile.bulk_group"
                 " [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(map),
                 "r"(src), "r"(d0), "r"(row), "r"(hc), "r"(bc)
                 : "memory");
}
// The box at src (shared memory, the map's layout) written to the tensor at the given
// coordinates, in this thread's current bulk group; rows past the tensor's end are not written.
// A box that starts before row 0 is an illegal instruction on the H100 (measured: the branch
// exp/d64-end-aligned; TMA loads there fill zeros), so callers store those rows otherwise.
__device__ __forceinline__ void kpt_tma_store(const void *map, u32 src, int d0, int row, int hc,
                                             int bc)
{
    asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group"
                 " [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(map),
                 "r"(src), "r"(d0), "r"(row), "r"(hc), "r"(bc)
                 : "memory");
}
// A tile of ROWS rows x D columns at src (per 64 columns a block of ROWS x 128 bytes, as
// kpt_tma_tile loads one) written to the tensor from row `row` and column col0 on: D / 64 boxes
// of the map's rows (fewer than ROWS where the backward's 64-row boxes of dK and dV leave its
// 128-row tiles), in this thread's current bulk group.
template <int ROWS, int D>
__device__ __forceinline__ void kpt_tma_store_tile(const void *map, u32 src, int row, int hc,
                                                   int bc, int col0 = 0)
{
#pragma unroll
    for (int c = 0; c < D / 64; c++)
        kpt_tma_store(map, src + c * ROWS * 128, col0 + c * 64, row, hc, bc);
}
// Four 8x8 matrices of 16-bit elements into shared memory, each register holding this lane's
// pair of a row in the mma accumulator layout; lane i gives the address of row i % 8 of matrix
// i / 8.
__device__ __forceinline__ void kpt_stsm4(u32 addr, u32 a, u32 b, u32 c, u32 d)
{
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr),
                 "r"(a), "r"(b), "r"(c), "r"(d)
                 : "memory");
}
// A warp's 16 rows r0 .. r0 + 15 (r0 a multiple of 8) of an accumulator C (N columns, the mma
// layout: this lane's rows lane / 4 and lane / 4 + 8), times m0 and m1 (the two rows'), as 16-bit
// 8x8 matrices into a swizzled tile at t of ROWS rows: per 64 columns a block of ROWS rows of
// 128 bytes, chunk c of row r at c ^ (r % 8), as TMA's 128-byte swizzle lays out a box, so
// that a TMA store can take it.
template <int N, int ROWS>
__device__ __forceinline__ void kpt_stage_rows(const float (&C)[N / 8][4], u32 t, int r0,
                                               float m0, float m1, int lane)
{
    const int mx = lane >> 3, rr = lane & 7; // the matrix and its row this lane addresses
    const int r = r0 + (mx & 1) * 8 + rr;
#pragma unroll
    for (int k = 0; k < N / 16; k++) {
        const int col = k * 16 + (mx >> 1) * 8;
        const u32 at = t + (col >> 6) * ROWS * 128 + r * 128 + ((((col & 63) >> 3) ^ rr) << 4);
        kpt_stsm4(at, kpt_pack(C[2 * k][0] * m0, C[2 * k][1] * m0),
                  kpt_pack(C[2 * k][2] * m1, C[2 * k][3] * m1),
                  kpt_pack(C[2 * k + 1][0] * m0, C[2 * k + 1][1] * m0),
                  kpt_pack(C[2 * k + 1][2] * m1, C[2 * k + 1][3] * m1));
    }
}
__device__ __forceinline__ void kpt_bulk_commit()
{
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
// This thread's bulk groups but the newest N have read their shared memory (READ) or are
// complete.
template <int N, bool READ> __device__ __forceinline__ void kpt_bulk_wait()
{
    if (READ)
        asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
    else
        asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}
// A count in global memory that other CTAs wait for: kpt_count_done adds one once this thread's
// bulk groups are complete (kpt_bulk_wait<0, false>): the proxy fence orders the TMA's writes
// (the async proxy's) before the release, so a CTA that acquires the count reads them.
__device__ __forceinline__ void kpt_count_done(u32 *count)
{
    asm volatile("fence.proxy.async.global;\n"
                 "red.release.gpu.global.add.u32 [%0], 1;\n" ::"l"(count)
                 : "memory");
}
// Spins (one thread) until the count reaches `need`.
__device__ __forceinline__ void kpt_count_wait(const u32 *count, u32 need)
{
    for (;;) {
        u32 v;
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(count) : "memory");
        if (v >= need)
            break;
        __nanosleep(256);
    }
    asm volatile("fence.proxy.async.global;\n" ::: "memory");
}
__device__ __forceinline__ void kpt_bar_sync(int id, int n)
{
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
__device__ __forceinline__ void kpt_bar_arrive(int id, int n)
{
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
template <int N> __device__ __forceinline__ void kpt_regs_dec()
{
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N> __device__ __forceinline__ void kpt_regs_inc()
{
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

