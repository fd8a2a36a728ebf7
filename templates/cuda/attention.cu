// The sm_80+ attention kernel (mma.sync m16n8k16, ldmatrix, cp.async), inserted into
// templates/cuda/common.cu by codegen/cuda_source.c.
//
// One CTA owns one (q tile, head, batch row). Each warp owns KPT_MT m16 row blocks of the q tile
// and all its columns, so row statistics never leave the warp (reductions are quad shuffles).
// Scores live in registers only; P is repacked in registers as the A operand of P*V.

extern "C" __global__ void __launch_bounds__(KPT_THREADS) kpt_attention(const kpt_args A)
{
    extern __shared__ __align__(16) unsigned char kpt_smem[];
    const u32 sQ = kpt_smem_addr(kpt_smem); // byte addresses in the shared window
    const u32 sK = sQ + KPT_BM * KPT_QSTR * 2;
    const u32 sV = sK + KPT_STAGES * KPT_BN * KPT_KSTR * 2;

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
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

    float O[KPT_MT][KPT_DV / 8][4];
    float m[KPT_MT][2], l[KPT_MT][2];
#pragma unroll
    for (int mt = 0; mt < KPT_MT; mt++) {
#pragma unroll
        for (int n = 0; n < KPT_DV / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) O[mt][n][e] = 0.0f;
        m[mt][0] = m[mt][1] = KPT_NINF;
        l[mt][0] = l[mt][1] = 0.0f;
    }

    const int wrow = warp * KPT_MT * 16; // this warp's first row in the tile
    kpt_load_tile<KPT_BM, KPT_DQK, KPT_QSTR>(sQ, gQ, A.qs[2], A.Sq - q0);
    int stage = 0;
    if (lo <= hi) {
        int k0 = lo * KPT_BN;
        kpt_load_tile<KPT_BN, KPT_DQK, KPT_KSTR>(sK, gK + (i64)k0 * A.ks[2], A.ks[2], A.Skv - k0);
        kpt_load_tile<KPT_BN, KPT_DV, KPT_VSTR>(sV, gV + (i64)k0 * A.vs[2], A.vs[2], A.Skv - k0);
    }
    kpt_cp_commit();

#if !KPT_HAS_SCORE
    // Without a score mod the scale is folded into the exponent (p = 2^(s*c - m), one FFMA),
    // which needs c > 0 to take the row max on raw scores; a negative scale negates Q instead.
    if (A.scale_log2 < 0.0f) {
        kpt_cp_wait<0>();
        __syncthreads();
        for (int i = tid; i < KPT_BM * KPT_DQK / 2; i += KPT_THREADS) {
            u32 *w = (u32 *)kpt_smem + (i / (KPT_DQK / 2)) * (KPT_QSTR / 2) + i % (KPT_DQK / 2);
            *w ^= 0x80008000u;
        }
        __syncthreads();
    }
    const float sc = fabsf(A.scale_log2);
#else
    const float sc = KPT_LOG2E; // kpt_score's results are natural-log units
#endif
#if KPT_Q_IN_REGS
    u32 qf[KPT_MT][KPT_DQK / 16][4];
    kpt_cp_wait<0>();
    __syncthreads();
#pragma unroll
    for (int mt = 0; mt < KPT_MT; mt++)
#pragma unroll
        for (int kk = 0; kk < KPT_DQK / 16; kk++)
            kpt_ldsm4(qf[mt][kk], sQ + ((wrow + mt * 16 + (lane & 15)) * KPT_QSTR + kk * 16 +
                                       (lane >> 4) * 8) * 2);
#endif

    for (int j = lo; j <= hi;) {
#if KPT_HAS_MASK
        const int cls = kpt_class_of(A, s_cls, b, h, qt, q0, q1, j);
        const int jn = kpt_next_tile(A, s_cls, b, h, qt, q0, q1, j, hi); // the next worth loading
#else
        const int cls = 2;
        const int jn = j + 1;
#endif
        if (jn <= hi) {
            int k0n = jn * KPT_BN;
            const u32 dK = sK + (stage ^ 1) * KPT_BN * KPT_KSTR * 2;
            const u32 dV = sV + (stage ^ 1) * KPT_BN * KPT_VSTR * 2;
            kpt_load_tile<KPT_BN, KPT_DQK, KPT_KSTR>(dK, gK + (i64)k0n * A.ks[2], A.ks[2], A.Skv - k0n);
            kpt_load_tile<KPT_BN, KPT_DV, KPT_VSTR>(dV, gV + (i64)k0n * A.vs[2], A.vs[2], A.Skv - k0n);
            kpt_cp_commit();
            kpt_cp_wait<1>();
        } else {
            kpt_cp_wait<0>();
        }
        __syncthreads();

        const u32 tK = sK + stage * KPT_BN * KPT_KSTR * 2;
        const u32 tV = sV + stage * KPT_BN * KPT_VSTR * 2;
        const int k0 = j * KPT_BN;

        // Which pairs of a partial tile are kept, as one bit each, decided before the scores
        // occupy registers (the mask may load aux data; its temporaries then cost nothing).
        const bool partial = cls != 2 || k0 + KPT_BN > A.Skv;
        u64 keep = ~0ull;
        if (partial) {
            KPT_MASK_UNROLL
            for (int mt = 0; mt < KPT_MT; mt++)
                KPT_MASK_UNROLL
                for (int n = 0; n < KPT_BN / 8; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int qi = q0 + wrow + mt * 16 + (lane >> 2) + (e >> 1) * 8;
                        const int ki = k0 + n * 8 + (lane & 3) * 2 + (e & 1);
                        bool kp = ki < A.Skv;
#if KPT_HAS_MASK
                        kp = kp & kpt_mask(A, U, b, h, qi, ki);
#endif
                        if (!kp) keep &= ~(1ull << ((mt * (KPT_BN / 8) + n) * 4 + e));
                    }
        }

        // S = Q K^T
        float S[KPT_MT][KPT_BN / 8][4];
#pragma unroll
        for (int kk = 0; kk < KPT_DQK / 16; kk++) {
            u32 a[KPT_MT][4];
#pragma unroll
            for (int mt = 0; mt < KPT_MT; mt++) {
#if KPT_Q_IN_REGS
#pragma unroll
                for (int e = 0; e < 4; e++) a[mt][e] = qf[mt][kk][e];
#else
                kpt_ldsm4(a[mt], sQ + ((wrow + mt * 16 + (lane & 15)) * KPT_QSTR + kk * 16 +
                                      (lane >> 4) * 8) * 2);
#endif
            }
#pragma unroll
            for (int np = 0; np < KPT_BN / 16; np++) {
                u32 bk[4];
                kpt_ldsm4(bk, tK + ((np * 16 + (lane & 7) + (lane >> 4) * 8) * KPT_KSTR + kk * 16 +
                                   ((lane >> 3) & 1) * 8) * 2);
#pragma unroll
                for (int mt = 0; mt < KPT_MT; mt++) {
                    if (kk == 0) {
                        kpt_mma_z(S[mt][2 * np], a[mt], bk[0], bk[1]);
                        kpt_mma_z(S[mt][2 * np + 1], a[mt], bk[2], bk[3]);
                    } else {
                        kpt_mma(S[mt][2 * np], a[mt], bk[0], bk[1]);
                        kpt_mma(S[mt][2 * np + 1], a[mt], bk[2], bk[3]);
                    }
                }
            }
        }

        // Score mods, then the mask bits: only partial tiles test them.
#if KPT_HAS_SCORE
#pragma unroll
        for (int mt = 0; mt < KPT_MT; mt++)
#pragma unroll
            for (int n = 0; n < KPT_BN / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int qi = q0 + wrow + mt * 16 + (lane >> 2) + (e >> 1) * 8;
                    const int ki = k0 + n * 8 + (lane & 3) * 2 + (e & 1);
                    S[mt][n][e] = kpt_score(A, U, S[mt][n][e] * A.scale, b, h, qi, ki);
                }
#endif
        if (partial) {
#pragma unroll
            for (int mt = 0; mt < KPT_MT; mt++)
#pragma unroll
                for (int n = 0; n < KPT_BN / 8; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        if (!((keep >> ((mt * (KPT_BN / 8) + n) * 4 + e)) & 1))
                            S[mt][n][e] = KPT_NINF;
        }

        // Online softmax in base 2. Once the row maxima settle, most tiles leave every row max
        // of the warp unchanged: alpha is exactly 1 and the rescale of O is skipped (a
        // warp-uniform branch).
        float alpha[KPT_MT][2];
        bool grew = false;
#pragma unroll
        for (int mt = 0; mt < KPT_MT; mt++)
            grew = kpt_softmax_max(S[mt], m[mt], l[mt], sc, alpha[mt]) || grew;
        if (__any_sync(0xffffffffu, grew)) {
#pragma unroll
            for (int mt = 0; mt < KPT_MT; mt++)
                kpt_rescale_rows(O[mt], alpha[mt]);
        }
#pragma unroll
        for (int mt = 0; mt < KPT_MT; mt++)
            kpt_softmax_exp(S[mt], m[mt], l[mt], sc);

        // O += P V, P repacked from the score registers as A fragments.
#pragma unroll
        for (int kk = 0; kk < KPT_BN / 16; kk++) {
            u32 pa[KPT_MT][4];
#pragma unroll
            for (int mt = 0; mt < KPT_MT; mt++)
                kpt_frag(pa[mt], S[mt][2 * kk], S[mt][2 * kk + 1]);
#pragma unroll
            for (int dp = 0; dp < KPT_DV / 16; dp++) {
                u32 bv[4];
                kpt_ldsm4t(bv, tV + ((kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * KPT_VSTR +
                                    dp * 16 + (lane >> 4) * 8) * 2);
#pragma unroll
                for (int mt = 0; mt < KPT_MT; mt++) {
                    kpt_mma(O[mt][2 * dp], pa[mt], bv[0], bv[1]);
                    kpt_mma(O[mt][2 * dp + 1], pa[mt], bv[2], bv[3]);
                }
            }
        }
        __syncthreads(); // everyone is done with this stage before it is refilled
        stage ^= 1;
        j = jn;
    }
    kpt_cp_wait<0>();

    // Epilogue: normalise, write O (and LSE).
#pragma unroll
    for (int mt = 0; mt < KPT_MT; mt++)
        kpt_store_rows(A, b, h, q0 + wrow + mt * 16, lane, O[mt], m[mt], l[mt]);
}
