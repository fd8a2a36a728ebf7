/* The argument block of the generated C++ kernels (see kernel_args.h). */
#include <string.h>

#include "base/diag.h"
#include "runtime/attention_args.h"
#include "runtime/kernel_args.h"

kpt_status kpt_kernel_check_rows(const kpt_tensor *t, const char *name, kpt_dtype want,
                                 int64_t d, kpt_diag *diag)
{
    kpt_status st = kpt_kernel_check_elems(t, name, want, d, diag);
    if (st)
        return st;
    for (int i = 0; i < t->rank - 1; i++)
        if (t->stride[i] % 8)
            return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                                "tensor %s: stride %d (%lld) must be a multiple of 8 elements "
                                "(16-byte rows)", name, i, (long long)t->stride[i]);
    if ((uintptr_t)t->data % 16)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                            "tensor %s: the data pointer must be 16-byte aligned", name);
    return KPT_OK;
}

kpt_status kpt_kernel_check_elems(const kpt_tensor *t, const char *name, kpt_dtype want,
                                  int64_t d, kpt_diag *diag)
{
    if (t->dtype != want)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                            "tensor %s is %s; this kernel was compiled for %s", name,
                            kpt_dtype_name(t->dtype), kpt_dtype_name(want));
    const int last = t->rank - 1;
    if (last < 0 || last >= KPT_TENSOR_MAX_RANK)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT, "tensor %s has rank %d", name,
                            t->rank);
    if (t->shape[last] != d)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                            "tensor %s has head dim %lld; this kernel was compiled for %lld", name,
                            (long long)t->shape[last], (long long)d);
    if (t->stride[last] != 1)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                            "tensor %s: the head dim must be contiguous (stride 1, not %lld)", name,
                            (long long)t->stride[last]);
    if ((uintptr_t)t->data % kpt_dtype_size(want))
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                            "tensor %s: the data pointer must be aligned to its element size",
                            name);
    return KPT_OK;
}

static uint32_t float_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
}

kpt_status kpt_kernel_args_pack_extras(const kpt_pattern *p, const kpt_attn_binding *bind,
                                       kpt_kernel_args *out, kpt_diag *diag)
{
    out->scale = (float)bind->scale;
    out->scale_log2 = (float)(bind->scale * 1.4426950408889634);
    for (int i = 0; i < p->num_scalars; i++)
        out->scalars[i] = p->scalars[i].type == KPT_IR_F32 ? float_bits((float)bind->scalars[i].f)
                                                           : (uint32_t)bind->scalars[i].i;
    for (int i = 0; i < p->num_aux; i++) {
        const kpt_ir_auxview *v = &bind->aux[i];
        if ((uintptr_t)v->data % (uintptr_t)kpt_dtype_size(v->dtype))
            return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                                "aux tensor '%s': data pointer not aligned to its element size",
                                p->aux[i].name);
        out->aux[i].ptr = (uint64_t)(uintptr_t)v->data;
        for (int d = 0; d < KPT_AUX_MAX_RANK; d++) {
            if (d < v->rank && v->shape[d] > INT32_MAX)
                return kpt_diag_set(diag, KPT_ERR_LIMIT, "aux tensor '%s' is too large",
                                    p->aux[i].name);
            out->aux[i].dim[d] = d < v->rank ? (int32_t)v->shape[d] : 1;
            out->aux[i].stride[d] = d < v->rank ? v->stride[d] : 0;
        }
    }
    return KPT_OK;
}

kpt_status kpt_kernel_args_pack_tensors(const kpt_kernel_plan *pl, const char *backend,
                                        const kpt_tensor *q, const kpt_tensor *k,
                                        const kpt_tensor *v, const kpt_tensor *o,
                                        const kpt_tensor *lse, bool o_any_rows,
                                        kpt_kernel_args *out, kpt_diag *diag)
{
    kpt_status st;
    kpt_dtype dt = pl->cfg.dtype;
    if ((st = kpt_kernel_check_rows(q, "q", dt, pl->cfg.dqk, diag)) ||
        (st = kpt_kernel_check_rows(k, "k", dt, pl->cfg.dqk, diag)) ||
        (st = kpt_kernel_check_rows(v, "v", dt, pl->cfg.dv, diag)) ||
        (st = (o_any_rows ? kpt_kernel_check_elems : kpt_kernel_check_rows)(o, "o", dt,
                                                                            pl->cfg.dv, diag)))
        return st;
    if (lse->data && lse->dtype != KPT_DTYPE_F32)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT, "tensor lse must be f32 on %s",
                            backend);
    memset(out, 0, sizeof(*out));
    out->q = (uint64_t)(uintptr_t)q->data;
    out->k = (uint64_t)(uintptr_t)k->data;
    out->v = (uint64_t)(uintptr_t)v->data;
    out->o = (uint64_t)(uintptr_t)o->data;
    out->lse = (uint64_t)(uintptr_t)lse->data;
    for (int i = 0; i < q->rank; i++)
        out->qs[i] = q->stride[i];
    for (int i = 0; i < k->rank; i++)
        out->ks[i] = k->stride[i];
    for (int i = 0; i < v->rank; i++)
        out->vs[i] = v->stride[i];
    for (int i = 0; i < o->rank; i++)
        out->os[i] = o->stride[i];
    for (int i = 0; lse->data && i < lse->rank && i < 3; i++)
        out->lses[i] = lse->stride[i];
    return KPT_OK;
}

/* kpt_kernel_args_pack for arguments kpt_attn_bind accepted as `bind`. */
static kpt_status pack_bound(const kpt_pattern *p, const kpt_kernel_plan *pl, const char *backend,
                             const kpt_attention_args *a, const kpt_attn_binding *bind,
                             kpt_kernel_args *out, kpt_diag *diag)
{
    kpt_status st = kpt_kernel_args_pack_tensors(pl, backend, &a->q, &a->k, &a->v, &a->o,
                                                 &a->lse, false, out, diag);
    if (st)
        return st;
    const kpt_attn_shape *s = &bind->shape;
    if (s->Sq > INT32_MAX - 256 || s->Skv > INT32_MAX - 256 || s->B > 65535 || s->Hq > 65535)
        return kpt_diag_set(diag, KPT_ERR_LIMIT,
                            "shape too large for the %s kernel (Sq, Skv < 2^31; B, Hq <= 65535)",
                            backend);
    if (a->sinks.data && a->sinks.dtype != KPT_DTYPE_F32)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT, "tensor sinks must be f32 on %s",
                            backend);
    if (a->sinks.data && (uintptr_t)a->sinks.data % 4)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                            "tensor sinks: the data pointer must be 4-byte aligned");
    out->sinks = (uint64_t)(uintptr_t)a->sinks.data;
    out->sink_stride = a->sinks.data ? a->sinks.stride[0] : 0;
    out->B = (int32_t)s->B;
    out->Hq = (int32_t)s->Hq;
    out->Hkv = (int32_t)s->Hkv;
    out->Sq = (int32_t)s->Sq;
    out->Skv = (int32_t)s->Skv;
    out->group = (int32_t)(s->Hq / s->Hkv);
    out->n_qt = (int32_t)((s->Sq + pl->bm - 1) / pl->bm);
    out->n_kt = (int32_t)((s->Skv + pl->bn - 1) / pl->bn);
    if ((st = kpt_kernel_args_pack_extras(p, bind, out, diag)))
        return st;
    /* block map layout [b?][h?][q tile][kv tile] */
    int64_t per_q = out->n_kt, per_h = per_q * out->n_qt;
    int64_t per_b = per_h * (pl->bm_per_h ? s->Hq : 1);
    out->bm_sq = per_q;
    out->bm_sh = pl->bm_per_h ? per_h : 0;
    out->bm_sb = pl->bm_per_b ? per_b : 0;
    return KPT_OK;
}

kpt_status kpt_kernel_args_pack(const kpt_pattern *p, const kpt_kernel_plan *pl,
                                const char *backend, const kpt_attention_args *a,
                                kpt_kernel_args *out, kpt_diag *diag)
{
    if (!a)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT, "attention args are NULL");
    kpt_attn_binding bind;
    kpt_status st = kpt_attn_bind(p, a, &bind, diag);
    return st ? st : pack_bound(p, pl, backend, a, &bind, out, diag);
}

/* The keep bits' layouts of a plan (kpt_bits_geom in templates/cuda/common.cu): with query rows,
 * a q tile's partial tiles in consecutive slots (the forward's, and kpt_bwd_dq's); the backward
 * first has one with key rows, a kv tile's partial tiles in consecutive slots (kpt_bwd_dkdv's).
 * Layout i's lines (the tiles whose partial tiles follow each other) and the tiles along one. */
static int bits_layouts(const kpt_kernel_plan *pl)
{
    return pl->cfg.kind == KPT_KERNEL_BACKWARD ? 2 : 1;
}
static void bits_lines(const kpt_kernel_plan *pl, const kpt_kernel_args *a, int i, size_t *lines,
                       size_t *along)
{
    bool key_rows = pl->cfg.kind == KPT_KERNEL_BACKWARD && i == 0;
    *lines = (size_t)(key_rows ? a->n_kt : a->n_qt);
    *along = (size_t)(key_rows ? a->n_qt : a->n_kt);
}

int64_t kpt_kernel_bits_ctas(const kpt_kernel_plan *pl, const kpt_kernel_args *a)
{
    int64_t ctas = 0;
    for (int i = 0; pl->mask_bits && i < bits_layouts(pl); i++) {
        size_t lines, along;
        bits_lines(pl, a, i, &lines, &along);
        ctas += (int64_t)((along + 7) / 8 * lines);
    }
    return ctas;
}

size_t kpt_kernel_args_map_bytes(const kpt_kernel_plan *pl, const kpt_kernel_args *a)
{
    if (!pl->has_blockmap)
        return 0;
    size_t rows = (size_t)(pl->bm_per_h ? a->Hq : 1) * (size_t)(pl->bm_per_b ? a->B : 1);
    size_t bytes = (size_t)a->n_qt * (size_t)a->n_kt * rows;
    /* the sm_90a kernels' CTA order: n_qt int32 per map row after the map, 16-byte aligned
     * (kpt_order_row in templates/cuda/common.cu) */
    if (pl->cfg.wgmma)
        bytes = ((bytes + 15) & ~(size_t)15) + 4 * (size_t)a->n_qt * rows;
    /* keep bits (kpt_bits_geom in templates/cuda/common.cu), per layout: each line's first
     * slot, then min(pairs, KPT_MASK_BITS_TILES) slots of 2048 bytes shared out evenly between
     * the map rows, and a byte per slot (its live halves) */
    if (pl->mask_bits) {
        size_t pairs = (size_t)a->n_qt * (size_t)a->n_kt * rows;
        size_t slots = pairs < KPT_MASK_BITS_TILES ? pairs : KPT_MASK_BITS_TILES;
        for (int i = 0; i < bits_layouts(pl); i++) {
            size_t lines, along;
            bits_lines(pl, a, i, &lines, &along);
            bytes = (bytes + 15) & ~(size_t)15;
            bytes = ((bytes + 4 * lines * rows + 255) & ~(size_t)255) + slots / rows * rows * 2049;
        }
    }
    /* the sm_90a backward's kv tile order last: n_kt int32 per map row, 16-byte aligned
     * (kpt_kv_order_row) */
    if (kpt_plan_kv_order(pl))
        bytes = ((bytes + 15) & ~(size_t)15) + 4 * (size_t)a->n_kt * rows;
    return bytes;
}


static size_t align256(size_t n)
{
    return (n + 255) & ~(size_t)255;
}

/* The aux gradients' part of the workspace and their outputs. */
static kpt_status plan_daux(const kpt_pattern *p, const kpt_grad_binding *gb,
                            const char *backend, kpt_bwd_workspace *ws, kpt_diag *diag)
{
    for (int i = 0; i < p->num_aux; i++) {
        const kpt_ir_auxview *v = &gb->daux[i];
        if (!v->data)
            continue;
        if ((uintptr_t)v->data % 4)
            return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                                "the gradient of aux tensor '%s': data pointer not 4-byte aligned",
                                p->aux[i].name);
        kpt_kernel_daux_out *o = &ws->out[i];
        for (int d = 0; d < KPT_AUX_MAX_RANK; d++) {
            o->dim[d] = d < v->rank ? (int32_t)v->shape[d] : 1; /* the aux tensor's: < 2^31 */
            o->stride[d] = d < v->rank ? v->stride[d] : 0;
        }
        const int64_t n = kpt_kernel_daux_count(o);
        if (n > (int64_t)255 * INT32_MAX) /* kpt_bwd_daux: 256 elements a block, 2^31 - 1 blocks */
            return kpt_diag_set(diag, KPT_ERR_LIMIT,
                                "the gradient of aux tensor '%s' is too large for the %s backward "
                                "(2^39 elements)", p->aux[i].name, backend);
        o->out = (uint64_t)(uintptr_t)v->data;
        ws->acc[i] = ws->bytes;
        ws->flag[i] = ws->bytes + align256((size_t)n * 16);
        ws->bytes = ws->flag[i] + align256((size_t)n * 4);
    }
    return KPT_OK;
}

kpt_status kpt_kernel_bwd_pack(const kpt_pattern *p, const kpt_kernel_plan *pl,
                               const char *backend, const kpt_attention_args *a,
                               const kpt_attention_grads *g, kpt_kernel_args *pa,
                               kpt_kernel_gargs *out, kpt_bwd_workspace *ws, kpt_diag *diag)
{
    if (!a)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT, "attention args are NULL");
    kpt_attn_binding bind;
    kpt_grad_binding gb;
    kpt_status st = kpt_attn_bind(p, a, &bind, diag);
    if (!st)
        st = pack_bound(p, pl, backend, a, &bind, pa, diag);
    if (!st)
        st = kpt_attn_bind_grads(p, a, &bind, g, false, &gb, diag);
    if (st)
        return st;
    if (!a->lse.data)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                            "the backward needs lse (the forward's, f32 [B, Hq, Sq])");
    if (!g->dq.data || !g->dk.data || !g->dv.data)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                            "the %s backward writes dq, dk and dv: all three need data", backend);
    kpt_dtype dt = pl->cfg.dtype;
    if ((st = kpt_kernel_check_rows(&g->dout, "dout", dt, pl->cfg.dv, diag)) ||
        (st = kpt_kernel_check_rows(&g->dq, "dq", dt, pl->cfg.dqk, diag)) ||
        (st = kpt_kernel_check_rows(&g->dk, "dk", dt, pl->cfg.dqk, diag)) ||
        (st = kpt_kernel_check_rows(&g->dv, "dv", dt, pl->cfg.dv, diag)))
        return st;
    memset(ws, 0, sizeof(*ws));
    /* delta, then dq's sums and counts where they are atomic (kpt_bwd_prep zeroes them as it
     * writes delta), then what the launch zeroes: the aux gradients' accumulators and flags */
    const size_t rows = (size_t)pa->B * (size_t)pa->Hq * (size_t)pa->Sq;
    const size_t delta = align256(rows * sizeof(float));
    ws->bytes = kpt_kernel_args_bwd_workspace(pl, pa, g->deterministic);
    ws->dqacc = ws->bytes > delta ? delta : 0;
    ws->dqdone = ws->dqacc ? delta + align256(rows * (size_t)pl->cfg.dqk * sizeof(float)) : 0;
    ws->zero_from = ws->bytes;
    if ((st = plan_daux(p, &gb, backend, ws, diag)))
        return st;
    memset(out, 0, sizeof(*out));
    out->dout = (uint64_t)(uintptr_t)g->dout.data;
    out->dq = (uint64_t)(uintptr_t)g->dq.data;
    out->dk = (uint64_t)(uintptr_t)g->dk.data;
    out->dv = (uint64_t)(uintptr_t)g->dv.data;
    for (int i = 0; i < 4; i++) {
        out->dos[i] = g->dout.stride[i];
        out->dqs[i] = g->dq.stride[i];
        out->dks[i] = g->dk.stride[i];
        out->dvs[i] = g->dv.stride[i];
    }
    if (g->dsinks.data && (g->dsinks.dtype != KPT_DTYPE_F32 || (uintptr_t)g->dsinks.data % 4))
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                            "tensor dsinks must be f32 (4-byte aligned) on %s", backend);
    out->dsinks = (uint64_t)(uintptr_t)g->dsinks.data;
    out->dsinks_stride = g->dsinks.data ? g->dsinks.stride[0] : 0;
    for (int i = 0; i < KPT_MAX_AUX; i++)
        out->daux_on |= ws->acc[i] != 0;
    return KPT_OK;
}

bool kpt_kernel_bwd_atomic_dq(const kpt_kernel_plan *plan, bool deterministic)
{
    return plan->cfg.kind == KPT_KERNEL_BACKWARD && plan->cfg.wgmma && plan->dq_tiles > 0 &&
           !deterministic;
}

size_t kpt_kernel_args_bwd_workspace(const kpt_kernel_plan *plan, const kpt_kernel_args *a,
                                     bool deterministic)
{
    size_t rows = (size_t)a->B * (size_t)a->Hq * (size_t)a->Sq;
    size_t delta = align256(rows * sizeof(float));
    if (!kpt_kernel_bwd_atomic_dq(plan, deterministic))
        return delta;
    size_t counts = (size_t)a->B * (size_t)a->Hkv * sizeof(uint32_t);
    return delta + align256(rows * (size_t)plan->cfg.dqk * sizeof(float)) + align256(counts);
}
