/* Validation and binding of kpt_attention_args against a pattern: shapes, strides, dtypes,
 * runtime scalars and aux tensors. Shared by the CPU reference and every backend's launch path, so
 * all of them accept and refuse exactly the same calls with the same messages. */
#ifndef KPT_RUNTIME_ATTENTION_ARGS_H
#define KPT_RUNTIME_ATTENTION_ARGS_H

#include <kpt/reference.h>

#include "ir/ir_eval.h"
#include "ir/pattern.h"

typedef struct kpt_attn_shape {
    int64_t B, Hq, Hkv, Sq, Skv, Dqk, Dv;
} kpt_attn_shape;

typedef struct kpt_attn_binding {
    kpt_attn_shape shape;
    double scale;                          /* resolved: 1/sqrt(Dqk) when args->scale == 0 */
    kpt_ir_value scalars[KPT_MAX_SCALARS]; /* by the pattern's scalar index */
    kpt_ir_auxview aux[KPT_MAX_AUX];       /* by the pattern's aux index */
} kpt_attn_binding;

/* The size an aux dimension must have for this shape: a fixed size, B, Hq, Hkv, Sq or Skv;
 * -1 for KPT_DIM_ANY. */
int64_t kpt_attn_dim_size(int64_t dim, const kpt_attn_shape *s);

/* Checks everything and fills `out`. Errors name the tensor, dimension, scalar or aux tensor. */
kpt_status kpt_attn_bind(const kpt_pattern *p, const kpt_attention_args *args,
                         kpt_attn_binding *out, kpt_diag *diag);

/* The scale, runtime scalars and aux tensors of args bound for a shape checked elsewhere (the
 * serving calls'); args' tensors are not read. */
kpt_status kpt_attn_bind_shaped(const kpt_pattern *p, const kpt_attention_args *args,
                                const kpt_attn_shape *shape, kpt_attn_binding *out,
                                kpt_diag *diag);

/* The gradient tensors of a backward call, checked against the bound forward arguments. */
typedef struct kpt_grad_binding {
    kpt_ir_auxview daux[KPT_MAX_AUX]; /* by aux index; data NULL: no gradient wanted */
} kpt_grad_binding;

/* Checks that t (named `name` in messages) is a rank-4 float tensor with data and like's shape. */
kpt_status kpt_attn_check_like(const char *name, const kpt_tensor *t, const kpt_tensor *like,
                               const char *like_name, kpt_diag *diag);

/* Checks dout (the shape of o) and dq, dk, dv (those of q, k, v, where given) against args,
 * which kpt_attn_bind accepted, and the daux array (not its entries). */
kpt_status kpt_attn_check_grads(const kpt_attention_args *args, const kpt_attention_grads *g,
                                kpt_diag *diag);

/* kpt_attn_check_grads, then the aux gradients (each a float aux tensor's shape; f32, or f64 too
 * where `allow_f64`) into `out`. */
kpt_status kpt_attn_bind_grads(const kpt_pattern *p, const kpt_attention_args *args,
                               const kpt_attn_binding *bind, const kpt_attention_grads *g,
                               bool allow_f64, kpt_grad_binding *out, kpt_diag *diag);

#endif
