/* Serving calls: validation, plans and kernel arguments (see paged_args.h). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/diag.h"
#include "runtime/paged_args.h"

static bool is_float(kpt_dtype t)
{
    return t == KPT_DTYPE_F16 || t == KPT_DTYPE_BF16 || t == KPT_DTYPE_F32 || t == KPT_DTYPE_F64;
}

/* Tensor `name` has data, rank `rank`, dtype `dt` (KPT_DTYPE_INVALID: any float) and the
 * sizes `want` (-1: any positive size; sizes may be 0 only where `want` says 0). */
static kpt_status check(const char *name, const kpt_tensor *t, int rank, kpt_dtype dt,
                        const int64_t *want, kpt_diag *diag)
{
    if (!t->data)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT, "tensor %s has no data", name);
    if (t->rank != rank)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT, "tensor %s must have rank %d, not %d",
                            name, rank, t->rank);
    if (dt ? t->dtype != dt : !is_float(t->dtype))
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT, "tensor %s has dtype %s; expected %s",
                            name, kpt_dtype_name(t->dtype),
                            dt ? kpt_dtype_name(dt) : "f16, bf16, f32 or f64");
    for (int d = 0; d < rank; d++) {
        if (t->stride[d] < 0)
            return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                                "tensor %s: stride %d is %lld; strides must be >= 0 (elements)",
                                name, d, (long long)t->stride[d]);
        if (want[d] >= 0 && t->shape[d] != want[d])
            return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                                "tensor %s: dimension %d has size %lld, expected %lld", name, d,
                                (long long)t->shape[d], (long long)want[d]);
        if (t->shape[d] < (want[d] == 0 ? 0 : 1) || t->shape[d] > INT32_MAX)
            return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                                "tensor %s: dimension %d has size %lld (must be 1..%d)", name, d,
                                (long long)t->shape[d], INT32_MAX);
    }
    return KPT_OK;
}

static kpt_status check_index_arrays(const kpt_paged_args *a, kpt_paged_binding *pb,
                                     kpt_diag *diag)
{
    kpt_status st;
    if (!a->cu_seqlens_q.data || a->cu_seqlens_q.rank != 1 || a->cu_seqlens_q.shape[0] < 1)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                            "tensor cu_seqlens_q must be i32 [B + 1] with data");
    pb->B = a->cu_seqlens_q.shape[0] - 1;
    const int64_t cu[1] = {pb->B + 1}, kv[1] = {pb->B ? pb->B : 0};
    if ((st = check("cu_seqlens_q", &a->cu_seqlens_q, 1, KPT_DTYPE_I32, cu, diag)) ||
        (st = check("kv_lens", &a->kv_lens, 1, KPT_DTYPE_I32, kv, diag)))
        return st;
    if (a->cu_seqlens_q.stride[0] != 1 || (pb->B && a->kv_lens.stride[0] != 1))
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                            "tensors cu_seqlens_q and kv_lens must be contiguous (stride 1)");
    pb->paged = a->page_table.data != NULL;
    if (!pb->paged) {
        pb->num_pages = a->k.shape[0];
        pb->page_size = a->k.shape[1];
        if (pb->num_pages < pb->B)
            return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                                "without a page table the cache holds one sequence per row of "
                                "dimension 0: k has %lld rows for a batch of %lld",
                                (long long)pb->num_pages, (long long)pb->B);
        return KPT_OK;
    }
    const int64_t pt[2] = {pb->B ? pb->B : 0, -1};
    if ((st = check("page_table", &a->page_table, 2, KPT_DTYPE_I32, pt, diag)))
        return st;
    if (a->page_table.stride[1] != 1)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                            "tensor page_table: its rows must be contiguous (stride 1, not %lld)",
                            (long long)a->page_table.stride[1]);
    pb->num_pages = a->k.shape[0];
    pb->page_size = a->k.shape[1];
    pb->max_pages = a->page_table.shape[1];
    if (pb->page_size > KPT_PAGED_MAX_PAGE)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                            "page size %lld (dimension 1 of k): pages hold 1 to %d rows",
                            (long long)pb->page_size, KPT_PAGED_MAX_PAGE);
    return KPT_OK;
}

kpt_status kpt_paged_bind_tensors(const kpt_paged_args *a, kpt_paged_binding *out,
                                  kpt_diag *diag)
{
    if (!a || !out)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT, "args is NULL");
    memset(out, 0, sizeof(*out));
    const int64_t any3[3] = {-1, -1, -1}, any4[4] = {-1, -1, -1, -1};
    kpt_status st;
    if ((st = check("q", &a->q, 3, 0, any3, diag)) || (st = check("k", &a->k, 4, 0, any4, diag)))
        return st;
    out->T = a->q.shape[0];
    out->Hq = a->q.shape[1];
    out->Dqk = a->q.shape[2];
    out->Hkv = a->k.shape[2];
    const int64_t kv4[4] = {a->k.shape[0], a->k.shape[1], out->Hkv, -1};
    if ((st = check("v", &a->v, 4, 0, kv4, diag)))
        return st;
    out->Dv = a->v.shape[3];
    const int64_t o3[3] = {out->T, out->Hq, out->Dv};
    if ((st = check("o", &a->o, 3, 0, o3, diag)))
        return st;
    if (a->k.shape[3] != out->Dqk)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                            "head dim Dqk differs: q has %lld, k has %lld", (long long)out->Dqk,
                            (long long)a->k.shape[3]);
    if (out->Hq % out->Hkv)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                            "query heads (%lld) must be a multiple of kv heads (%lld)",
                            (long long)out->Hq, (long long)out->Hkv);
    if (a->lse.data) {
        const int64_t l2[2] = {out->T, out->Hq};
        if ((st = check("lse", &a->lse, 2, a->lse.dtype == KPT_DTYPE_F64 ? KPT_DTYPE_F64
                                                                          : KPT_DTYPE_F32,
                        l2, diag)))
            return st;
    }
    if (a->sinks.data) {
        const int64_t s1[1] = {out->Hq};
        if ((st = check("sinks", &a->sinks, 1, KPT_DTYPE_F32, s1, diag)))
            return st;
    }
    return check_index_arrays(a, out, diag);
}

kpt_status kpt_paged_bind_extras(const kpt_pattern *p, const kpt_paged_args *a, int64_t max_kv,
                                 kpt_paged_binding *out, kpt_diag *diag)
{
    if (!p)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT, "pattern is NULL");
    if (max_kv > INT32_MAX)
        return kpt_diag_set(diag, KPT_ERR_LIMIT, "kv length %lld is past 2^31",
                            (long long)max_kv);
    const kpt_attention_args extras = {.scale = a->scale, .scalars = a->scalars,
                                       .num_scalars = a->num_scalars, .aux = a->aux,
                                       .num_aux = a->num_aux};
    const kpt_attn_shape shape = {.B = out->B, .Hq = out->Hq, .Hkv = out->Hkv, .Sq = max_kv,
                                  .Skv = max_kv, .Dqk = out->Dqk, .Dv = out->Dv};
    return kpt_attn_bind_shaped(p, &extras, &shape, &out->bind, diag);
}

kpt_status kpt_paged_bind(const kpt_pattern *p, const kpt_paged_args *a, int64_t max_kv,
                          kpt_paged_binding *out, kpt_diag *diag)
{
    kpt_status st = kpt_paged_bind_tensors(a, out, diag);
    return st ? st : kpt_paged_bind_extras(p, a, max_kv, out, diag);
}

/* The host lengths of a shape, checked: max_q and max_kv. */
static kpt_status scan_lengths(const kpt_paged_shape *s, int *max_q, int *max_kv, kpt_diag *diag)
{
    *max_q = s->cu_seqlens_q ? 0 : s->max_q;
    *max_kv = s->kv_lens ? 0 : s->max_kv;
    if (*max_q < 0 || *max_kv < 0)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                            "paged shape: negative bound (max_q %d, max_kv %d)", s->max_q,
                            s->max_kv);
    if (s->cu_seqlens_q && s->cu_seqlens_q[0] != 0)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                            "cu_seqlens_q[0] is %d; it must be 0", s->cu_seqlens_q[0]);
    for (int b = 0; b < s->batch; b++) {
        int q = s->cu_seqlens_q ? s->cu_seqlens_q[b + 1] - s->cu_seqlens_q[b] : s->max_q;
        int kv = s->kv_lens ? s->kv_lens[b] : s->max_kv;
        if (q < 0)
            return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                                "cu_seqlens_q decreases at sequence %d (%d, then %d)", b,
                                s->cu_seqlens_q[b], s->cu_seqlens_q[b + 1]);
        if (kv < q)
            return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                                "sequence %d has %d queries but %d keys: its keys include its "
                                "queries' own (kv_lens[b] >= q_len)", b, q, kv);
        *max_q = q > *max_q ? q : *max_q;
        *max_kv = kv > *max_kv ? kv : *max_kv;
    }
    return KPT_OK;
}

size_t kpt_paged_workspace_bytes(const kpt_paged_plan *plan, int rows, int dv,
                                 size_t *lse_offset)
{
    const size_t slots = (size_t)plan->blocks * plan->splits * plan->num_heads_kv * rows;
    const size_t off = (slots * (size_t)dv * sizeof(float) + 255) & ~(size_t)255;
    if (lse_offset)
        *lse_offset = off;
    return off + slots * sizeof(float);
}

size_t kpt_paged_plan_workspace(const kpt_paged_plan *plan, int rows, int dv)
{
    return plan->splits > 1 ? kpt_paged_workspace_bytes(plan, rows, dv, NULL) : 0;
}

/* The CTAs a plan launches: blocks x splits x kv heads. */
static int64_t plan_ctas(const kpt_paged_plan *plan)
{
    return (int64_t)plan->blocks * plan->splits * plan->num_heads_kv;
}

/* Parts for the tail of a ragged batch. Items start in launch order as slots free up, so the
 * longest can start last: the run then ends up to (longest - mean) / splits after the average
 * share, while each part adds KPT_PAGED_CTA_TILES to the share; their sum is least at
 * splits = sqrt((longest - mean) slots / (cost items)). 0 where all items are equal, as in a
 * uniform batch: its waves are whole. */
static double tail_splits(const kpt_paged_work *w, int heads, int64_t slots)
{
    const double n = (double)w->items * heads, excess = (double)w->longest * w->items - w->tiles;
    if (excess <= 0 || n <= 0)
        return 0;
    return sqrt(excess / w->items * (double)slots / (KPT_PAGED_CTA_TILES * n));
}

int kpt_paged_split_work(const kpt_paged_work *w, int heads, int64_t slots)
{
    /* Split the keys until the work fills the device once: decoding is bound by memory, and one
     * wave of items no longer than the average share streams the cache with no tail. The
     * longest item's parts are that share; each part keeps two tiles. A ragged batch splits
     * further (tail_splits): on the H200, 64 decodes over 1k to 32k keys took 822 us unsplit
     * and 583 at the 6 parts this gives. */
    const int64_t work = w->tiles * heads;
    int64_t splits = work > 0 ? slots * w->longest / work : 1;
    const int64_t tail = llround(tail_splits(w, heads, slots));
    if (splits < tail)
        splits = tail;
    if (splits > w->longest / 2)
        splits = w->longest / 2;
    if (splits > KPT_PAGED_MAX_SPLITS)
        splits = KPT_PAGED_MAX_SPLITS;
    return splits > 1 ? (int)splits : 1;
}

/* The first packed block of sequence b, whose queries start at row cu of q, for blocks of p
 * queries: (cu + b (p - 1)) / p. It grows by at least ceil(q_len / p) from one sequence to the
 * next, so each has its blocks, and the device finds a block's sequence from cu_seqlens_q
 * alone (kpt_pg_seq_of in templates/cuda/paged.cu). */
static int64_t packed_first(int64_t cu, int64_t b, int p)
{
    return (cu + b * (p - 1)) / p;
}

/* Where the shape's host lengths make fewer blocks packed than uniform, the plan is packed:
 * its work items are the blocks sequences have, not batch * q_blocks (a chunked prefill of 2048
 * queries beside 63 decodes: 191 blocks, not 8192). */
static void plan_blocks(const kpt_paged_shape *s, kpt_paged_plan *out)
{
    out->blocks = out->batch * out->q_blocks;
    if (!s->cu_seqlens_q || out->batch == 0)
        return;
    const int64_t T = s->cu_seqlens_q[out->batch];
    const int64_t packed = packed_first(T, out->batch, out->q_per_block);
    if (T > 0 && packed < out->blocks) {
        out->blocks = (int)packed;
        out->q_blocks = 0;
        out->max_tokens = (int)T;
    }
}

void kpt_paged_plan_work(const kpt_paged_shape *s, const kpt_paged_plan *pl, int tile,
                         kpt_paged_work *out)
{
    *out = (kpt_paged_work){0};
    for (int b = 0; b < s->batch; b++) {
        const int64_t q = s->cu_seqlens_q ? s->cu_seqlens_q[b + 1] - s->cu_seqlens_q[b] : s->max_q;
        const int64_t kv = s->kv_lens ? s->kv_lens[b] : s->max_kv;
        /* a bounds plan's blocks are all there; with host lengths, those sequences have */
        const int64_t blocks = s->cu_seqlens_q ? (q + pl->q_per_block - 1) / pl->q_per_block
                                               : pl->q_blocks;
        const int64_t tiles = (kv + tile - 1) / tile;
        if (!blocks || !tiles)
            continue;
        out->tiles += blocks * tiles;
        out->items += blocks;
        out->longest = tiles > out->longest ? tiles : out->longest;
    }
}

kpt_status kpt_paged_plan_compute(const kpt_paged_shape *s, int slots, int group_max, int dv,
                                  kpt_paged_plan *out, kpt_diag *diag)
{
    memset(out, 0, sizeof(*out));
    if (!s)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT, "paged shape is NULL");
    if (s->batch < 0 || s->batch > 1 << 20 || s->num_heads_q <= 0 || s->num_heads_kv <= 0 ||
        s->num_heads_q % s->num_heads_kv)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                            "paged shape: batch %d (0 to 2^20), heads %d:%d (positive, Hq a "
                            "multiple of Hkv)", s->batch, s->num_heads_q, s->num_heads_kv);
    const int group = s->num_heads_q / s->num_heads_kv;
    if (group_max && group > group_max)
        return kpt_diag_set(diag, KPT_ERR_UNSUPPORTED,
                            "GQA ratio %d: the serving kernels take up to %d query heads per kv "
                            "head", group, group_max);
    int max_q, max_kv;
    kpt_status st = scan_lengths(s, &max_q, &max_kv, diag);
    if (st)
        return st;
    *out = (kpt_paged_plan){.batch = s->batch, .num_heads_q = s->num_heads_q,
                            .num_heads_kv = s->num_heads_kv, .max_q = max_q, .max_kv = max_kv,
                            .splits = 1, .q_per_block = max_q ? max_q : 1, .q_blocks = 1,
                            .blocks = s->batch};
    out->rows = out->q_per_block * group;
    if (!slots)
        return KPT_OK; /* the CPU: one "block" per sequence, nothing split */
    /* rows of a CTA: 16, 32 or 64, the fewest that hold every query of a sequence */
    int cap = 16;
    while (cap < KPT_PAGED_ROWS && cap < (int64_t)max_q * group)
        cap *= 2;
    out->q_per_block = cap / group;
    /* at least one block: a sequence with more queries than planned for must still meet a CTA
     * that writes NaN into its rows (kpt_pg_overflow), even under a plan for max_q = 0 */
    out->q_blocks = max_q ? (max_q + out->q_per_block - 1) / out->q_per_block : 1;
    out->rows = out->q_per_block * group;
    if ((int64_t)s->batch * out->q_blocks * s->num_heads_kv > INT32_MAX)
        return kpt_diag_set(diag, KPT_ERR_LIMIT, "too many query blocks (%lld) for one launch",
                            (long long)s->batch * out->q_blocks);
    plan_blocks(s, out);
    kpt_paged_work work;
    kpt_paged_plan_work(s, out, KPT_PAGED_TILE, &work);
    out->splits = kpt_paged_split_work(&work, s->num_heads_kv, slots);
    if (plan_ctas(out) > INT32_MAX)
        return kpt_diag_set(diag, KPT_ERR_LIMIT, "too many query blocks (%d) for one launch",
                            out->blocks);
    out->workspace_bytes = kpt_paged_plan_workspace(out, KPT_PAGED_ROWS, dv);
    return KPT_OK;
}

kpt_status kpt_paged_plan_sms(const kpt_paged_shape *s, int sms, bool two_wide, int per_sm,
                              int dv, kpt_paged_plan *out, kpt_diag *diag)
{
    kpt_status st = kpt_paged_plan_compute(s, sms, KPT_PAGED_ROWS, dv, out, diag);
    if (st)
        return st;
    kpt_paged_plan two;
    /* under 90 % of the SMs busy, or unsplit with some idle */
    const bool thin = plan_ctas(out) * 10 < (int64_t)sms * KPT_PAGED_THIN ||
                      (out->splits == 1 && plan_ctas(out) < sms);
    if ((thin && per_sm >= 2) || per_sm >= 3) {
        /* a thin wave, or small CTAs: split further, for one wave of as many CTAs an SM as fit
         * (small CTAs in parts of KPT_PAGED_WIDE_TILES tiles at least) */
        const int fit = per_sm < KPT_PAGED_THIN_PER_SM ? per_sm : KPT_PAGED_THIN_PER_SM;
        const int64_t slots = (int64_t)sms * fit;
        st = kpt_paged_plan_compute(s, (int)slots, KPT_PAGED_ROWS, dv, &two, diag);
        if (st)
            return st;
        const int cap = two.max_kv / (KPT_PAGED_WIDE_TILES * KPT_PAGED_TILE);
        if (!thin && two.splits > cap) {
            two.splits = cap > 1 ? cap : 1;
            two.workspace_bytes = kpt_paged_plan_workspace(&two, KPT_PAGED_ROWS, dv);
        }
        if (two.splits > out->splits && plan_ctas(&two) <= slots) {
            *out = two;
            return KPT_OK;
        }
        /* past one such wave (a ragged batch's tail splits): the rule below */
    }
    if (!two_wide || out->rows <= 32 || out->splits < 2)
        return KPT_OK;
    st = kpt_paged_plan_compute(s, 2 * sms, KPT_PAGED_ROWS, dv, &two, diag);
    if (!st && (int64_t)two.splits * KPT_PAGED_TWO_TILES * KPT_PAGED_TILE <= two.max_kv)
        *out = two;
    return st;
}

static bool plan_blocks_ok(const kpt_paged_plan *plan)
{
    if (plan->q_per_block < 1 || plan->batch < 0)
        return false;
    if (plan->q_blocks)
        return plan->q_blocks > 0 && plan->max_tokens == 0 &&
               (int64_t)plan->blocks == (int64_t)plan->batch * plan->q_blocks;
    return plan->max_tokens > 0 &&
           plan->blocks == packed_first(plan->max_tokens, plan->batch, plan->q_per_block);
}

bool kpt_paged_plan_ok(const kpt_paged_plan *plan, int rows, int dv)
{
    return plan->splits >= 1 && plan->splits <= KPT_PAGED_MAX_SPLITS && plan_blocks_ok(plan) &&
           plan->workspace_bytes == kpt_paged_plan_workspace(plan, rows, dv);
}

bool kpt_paged_one_per_sm(const kpt_paged_plan *plan, int sms)
{
    return plan_ctas(plan) <= sms;
}

kpt_status kpt_paged_check_plan(const kpt_paged_plan *plan, const kpt_paged_binding *pb,
                                kpt_diag *diag)
{
    if (!plan)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT, "plan is NULL");
    if (plan->batch != pb->B || plan->num_heads_q != pb->Hq || plan->num_heads_kv != pb->Hkv)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                            "the plan is for B=%d, %d:%d heads; the call has B=%lld, "
                            "%lld:%lld heads", plan->batch, plan->num_heads_q,
                            plan->num_heads_kv, (long long)pb->B, (long long)pb->Hq,
                            (long long)pb->Hkv);
    return KPT_OK;
}

kpt_status kpt_kernel_paged_pack(const kpt_pattern *p, const kpt_kernel_plan *pl,
                                 const char *backend, const kpt_paged_plan *plan,
                                 const kpt_paged_args *a, kpt_kernel_args *out,
                                 kpt_kernel_pargs *pout, kpt_diag *diag)
{
    if (!plan)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT, "plan is NULL");
    kpt_paged_binding pb;
    kpt_status st = kpt_paged_bind(p, a, plan->max_kv, &pb, diag);
    if (!st)
        st = kpt_paged_check_plan(plan, &pb, diag);
    /* o may have any row strides: the serving kernels store it with vector stores where a row
     * is aligned and element by element where it is not (kpt_pg_finish_row) */
    if (st || (st = kpt_kernel_args_pack_tensors(pl, backend, &a->q, &a->k, &a->v, &a->o,
                                                 &a->lse, true, out, diag)))
        return st;
    memset(pout, 0, sizeof(*pout));
    out->B = (int32_t)pb.B;
    out->Hq = (int32_t)pb.Hq;
    out->Hkv = (int32_t)pb.Hkv;
    out->Sq = out->Skv = plan->max_kv; /* each CTA sets its sequence's own */
    out->group = (int32_t)(pb.Hq / pb.Hkv);
    if ((st = kpt_kernel_args_pack_extras(p, &pb.bind, out, diag)))
        return st;
    pout->page_table = (uint64_t)(uintptr_t)a->page_table.data;
    pout->cu_q = (uint64_t)(uintptr_t)a->cu_seqlens_q.data;
    pout->kv_lens = (uint64_t)(uintptr_t)a->kv_lens.data;
    pout->sinks = (uint64_t)(uintptr_t)a->sinks.data;
    pout->pt_stride = pb.paged ? a->page_table.stride[0] : 0;
    pout->sink_stride = a->sinks.data ? a->sinks.stride[0] : 0;
    pout->page_size = (int32_t)pb.page_size;
    pout->page_shift = -1;
    for (int s = 0; s < 9; s++)
        if (pb.page_size == (int64_t)1 << s)
            pout->page_shift = s;
    pout->num_pages = (int32_t)pb.num_pages;
    pout->max_pages = (int32_t)pb.max_pages;
    pout->T = (int32_t)pb.T;
    pout->splits = plan->splits;
    pout->packed = plan->q_blocks == 0;
    pout->q_blocks = pout->packed ? plan->blocks : plan->q_blocks;
    pout->q_per_block = plan->q_per_block;
    pout->rows = plan->rows;
    pout->paged = pb.paged;
    return KPT_OK;
}
