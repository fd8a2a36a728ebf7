/* kpt — serving: ragged batches of queries against a paged KV cache (decode, chunked prefill,
 * speculative decoding), split over the keys, with attention sinks.
 *
 * Every sequence b of a batch has kv_lens[b] keys in the cache and q_len(b) = cu_seqlens_q[b+1] -
 * cu_seqlens_q[b] new queries (0 is fine), which are its last positions: query i of sequence b
 * sits at logical position kv_lens[b] - q_len(b) + i, and the pattern sees Sq = Skv = kv_lens[b].
 * So "causal" (or causal_bottom_right) lets a decoding token see its whole sequence, and a
 * sliding window is measured back from each query's own position. Attention then follows the
 * contract of kpt_attention_args per sequence (docs/serving.md), plus the sink: with sinks given,
 * each row's softmax denominator gains exp(sinks[h]) (gpt-oss, StreamingLLM), so
 *   O = sum_k exp(s_k) v_k / (sum_k exp(s_k) + exp(sink_h)),  LSE = log of that denominator.
 *
 * Use: get a kernel with KPT_DESC_PAGED, make a plan from the batch's lengths on the host (or
 * bounds on them), then run it as often as the lengths stay within the plan:
 *
 *     kpt_kernel_desc desc = {.dtype = KPT_DTYPE_BF16, .head_dim = 128, .options = KPT_DESC_PAGED};
 *     kpt_kernel_get(ctx, pattern, &desc, &k, &diag);
 *     kpt_paged_shape shape = {.batch = B, .cu_seqlens_q = host_cu, .kv_lens = host_kv,
 *                              .num_heads_q = 32, .num_heads_kv = 8};
 *     kpt_paged_plan plan;
 *     kpt_paged_plan_make(k, &shape, &plan, &diag);
 *     // workspace: plan.workspace_bytes of device memory (0 when the plan needs none)
 *     kpt_paged_run(k, &plan, &args, workspace, plan.workspace_bytes, stream, &diag);
 *
 * A run is one launch (two when the plan splits the keys) with no host synchronisation and no
 * allocation (given a workspace), reading the lengths and the page table from device memory, so
 * it can be captured in a CUDA graph and replayed while the lengths change within the plan.
 */
#ifndef KPT_SERVING_H
#define KPT_SERVING_H

#include <stddef.h>
#include <stdint.h>

#include <kpt/reference.h>
#include <kpt/runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Kernel desc option: the serving kernels (kpt_paged_run) instead of the forward. CUDA (sm_80
 * and newer, head dims 32, 64, 96, 128 and 256; Dqk and Dv may differ), Vulkan (head dims 1 to 256)
 * and the CPU backend have them. */
enum { KPT_DESC_PAGED = 1u << 1 };

/* The arguments of a serving call. Tensors are device pointers (host pointers on the CPU
 * backend and for kpt_reference_paged_attention). */
typedef struct kpt_paged_args {
    kpt_tensor q;   /* [T, Hq, Dqk]: the sequences' queries one after another (T >= the sum) */
    kpt_tensor o;   /* [T, Hq, Dv]: rows of each sequence's queries are written, no others */
    kpt_tensor lse; /* [T, Hq] f32 (the reference: also f64), natural log, or data NULL */
    /* The cache, [num_pages, page_size, Hkv, Dqk] and [num_pages, page_size, Hkv, Dv] (a
     * head-major [num_pages, Hkv, page_size, D] cache is the same view with other strides).
     * page_size is 1 to 256 with a page table; without one it is the cache's length. */
    kpt_tensor k, v;
    /* i32 [B, max_pages]: key j of sequence b is row j % page_size of page
     * page_table[b][j / page_size]. data NULL: no paging, the cache's first dimension is the
     * sequence (k [B, S, Hkv, D]: sequence b's keys are k[b, 0 .. kv_lens[b]]). Entries a
     * sequence does not reach are not read; an entry outside 0 .. num_pages - 1 reads zeros. */
    kpt_tensor page_table;
    kpt_tensor cu_seqlens_q; /* i32 [B + 1]: 0 = cu[0] <= cu[1] <= ... <= cu[B] <= T */
    kpt_tensor kv_lens;      /* i32 [B]: keys of each sequence, its new queries' own included;
                                kv_lens[b] >= q_len(b) */
    kpt_tensor sinks;        /* f32 [Hq]: each head's sink logit, or data NULL for none */
    double scale;            /* 0: 1/sqrt(Dqk) */
    const kpt_scalar_value *scalars;
    int num_scalars;
    /* Aux tensors: dimensions declared B are the batch; Sq and Skv are the longest kv length
     * of the plan (max_kv) — logical positions index them. */
    const kpt_aux_tensor *aux;
    int num_aux;
} kpt_paged_args;

/* What a plan is made from: the batch's lengths on the host, or bounds on them. */
typedef struct kpt_paged_shape {
    int batch;                   /* B */
    const int32_t *cu_seqlens_q; /* host copy, [B + 1]; NULL: every sequence has max_q */
    const int32_t *kv_lens;      /* host copy, [B]; NULL: every sequence has max_kv */
    int max_q, max_kv;           /* bounds used where the arrays are NULL (else ignored) */
    int num_heads_q, num_heads_kv;
} kpt_paged_shape;

/* The schedule of a serving run. Made by kpt_paged_plan_make; the fields are informative.
 *
 * A plan made from bounds, or from lengths whose sequences have about the same number of
 * queries, gives every sequence the same q_blocks query blocks: it fits every batch of the same
 * B and head counts whose sequences have at most max_q queries (on GPU backends a sequence with
 * more gets NaN in the rows past the plan's, never a silently wrong answer; the CPU backend
 * computes them). On CUDA, a plan made from host lengths of unequal query counts (chunked
 * prefill beside decodes) may instead be packed (q_blocks = 0): its blocks follow cu_seqlens_q
 * on the device, so no CTA is launched for the queries a short sequence lacks. A packed plan
 * fits any query counts of that batch size that add up to at most max_tokens (past that, the
 * rows its blocks do not reach, the last sequences' last, get NaN). Either way kv lengths may be
 * anything (the split count was chosen for the lengths planned for). */
typedef struct kpt_paged_plan {
    int batch, num_heads_q, num_heads_kv;
    int max_q, max_kv;     /* the lengths planned for */
    int splits;            /* parts each sequence's keys are split into (1: no combine launch) */
    int q_per_block;       /* query tokens per CTA (each with the kv head's Hq / Hkv heads) */
    int q_blocks;          /* query blocks per sequence; 0: packed */
    int blocks;            /* query blocks of a launch (batch * q_blocks where not packed) */
    int max_tokens;        /* packed: the queries of all sequences together at most; else 0 */
    int rows;              /* q_per_block * Hq / Hkv: rows of a CTA (16, 32 or 64 at most) */
    size_t workspace_bytes; /* device memory kpt_paged_run needs (partial results); 0: none */
} kpt_paged_plan;

/* Plans a run of kernel k (got with KPT_DESC_PAGED) for these lengths on k's device. Host
 * only: no device work, no allocation kept. */
KPT_API kpt_status kpt_paged_plan_make(const kpt_kernel *k, const kpt_paged_shape *shape,
                                       kpt_paged_plan *out, kpt_diag *diag);

/* Runs attention for the batch of args on `stream` under `plan`. Every host-visible argument is
 * validated first (shapes, strides, dtypes, head counts against the plan, scalars, aux tensors;
 * nothing is launched on an error). `workspace`: device memory of at least
 * plan->workspace_bytes, 256-byte aligned, or NULL to allocate a temporary one on the stream
 * (stream-ordered; not capturable). */
KPT_API kpt_status kpt_paged_run(const kpt_kernel *k, const kpt_paged_plan *plan,
                                 const kpt_paged_args *args, void *workspace,
                                 size_t workspace_bytes, void *stream, kpt_diag *diag);

/* The CPU reference of a serving call (host pointers), in double precision: each sequence's
 * pages gathered into dense keys, then the definition above. Any page size, any lengths. */
KPT_API kpt_status kpt_reference_paged_attention(const kpt_pattern *p,
                                                 const kpt_paged_args *args, kpt_diag *diag);

#ifdef __cplusplus
}
#endif
#endif
