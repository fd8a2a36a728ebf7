/* kpt — the CPU reference attention.
 *
 * The oracle every backend is checked against: a straightforward attention in double precision
 * that follows DESIGN §2 (docs/architecture.md) exactly, for any pattern, any GQA ratio, Dqk != Dv,
 * any strides, f16/bf16/f32 inputs. Slow by design (plain double loops), but it runs one thread
 * per core ($KPT_REFERENCE_THREADS overrides), fast enough to check S = 4096, D = 128 in seconds.
 *
 * Thread-safety: reentrant; concurrent calls on one pattern are fine.
 */
#ifndef KPT_REFERENCE_H
#define KPT_REFERENCE_H

#include <kpt/pattern.h>
#include <kpt/tensor.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A runtime scalar's value, by name (without '$'). */
typedef struct kpt_scalar_value {
    const char *name;
    double value; /* converted to the scalar's type; an i32 scalar must hold an integer */
} kpt_scalar_value;

/* An aux tensor bound by name; its rank, dtype and shape must match the pattern's declaration. */
typedef struct kpt_aux_tensor {
    const char *name;
    kpt_tensor tensor;
} kpt_aux_tensor;

/* Attention arguments. All tensors are logically [B, H, S, D] (rank 4), whatever their strides:
 *   q [B, Hq, Sq, Dqk], k [B, Hkv, Skv, Dqk], v [B, Hkv, Skv, Dv], o [B, Hq, Sq, Dv];
 *   lse is [B, Hq, Sq] (rank 3, f32 or f64), or data == NULL when not wanted.
 * Hq % Hkv == 0; query head h reads kv head h / (Hq / Hkv). */
typedef struct kpt_attention_args {
    kpt_tensor q, k, v, o, lse;
    double scale; /* 0 means 1/sqrt(Dqk); else finite, magnitude in [1e-30, 1e30] */
    const kpt_scalar_value *scalars;
    int num_scalars;
    const kpt_aux_tensor *aux;
    int num_aux;
    /* Attention sinks (gpt-oss, StreamingLLM), or data == NULL for none: [Hq], f32 (f64 in the
     * reference), each head's logit that joins every row's softmax denominator with no value:
     * O = sum_k exp(s_k) v_k / (sum_k exp(s_k) + exp(sink_h)), LSE = log of that denominator (a
     * row with nothing kept: O = 0, LSE = sink_h). CUDA and the CPU backend take them. */
    kpt_tensor sinks;
} kpt_attention_args;

/* Computes o (and lse) for pattern p. Inputs f16, bf16, f32 or f64; o any float dtype (f64 keeps
 * the reference's full precision). A row with no kept key gives o = 0 and lse = -inf.
 * Errors (KPT_ERR_INVALID_ARGUMENT, KPT_ERR_NOT_FOUND, ...) leave o untouched. */
KPT_API kpt_status kpt_reference_attention(const kpt_pattern *p, const kpt_attention_args *args,
                                           kpt_diag *diag);

/* Gradients of attention (the backward pass): given dO, the gradients of a scalar loss with
 * respect to q, k, v and the float aux tensors the score mod reads. The tensors' layouts follow
 * kpt_attention_args: dq like q, dk like k, dv like v, dout like o. dk and dv are summed over the
 * query heads that share each kv head (GQA/MQA); rows with no kept key contribute nothing (zero
 * gradients, never NaN). Score mods are differentiated exactly (kpt's IR derivative pass); masks
 * have no gradient. */
typedef struct kpt_attention_grads {
    kpt_tensor dout;       /* dO, [B, Hq, Sq, Dv]: read */
    kpt_tensor dq, dk, dv; /* written; data == NULL: not wanted */
    /* Gradients of aux tensors, by the aux tensor's name: each the aux tensor's shape, f32 (f64
     * in the reference). Only f32/f16/bf16 aux tensors can have one; an aux tensor the score mod
     * does not read (or reads only in the mask) gets zeros. Written, not accumulated into. */
    const kpt_aux_tensor *daux;
    int num_daux;
    /* The sinks' gradient, [Hq] like args->sinks (f32; f64 in the reference), or data == NULL:
     * d loss / d sink_h = -sum over rows of head h of exp(sink_h - LSE) * rowsum(dO * O).
     * Written, not accumulated into. */
    kpt_tensor dsinks;
    /* Non-zero: the same bits on every run, where a backend would otherwise trade that for
     * speed. Only CUDA's sm_90a backward does (dq summed with f32 atomics, about 1.3x faster;
     * docs/api.md, "Determinism"); every other backend and the reference are deterministic
     * whatever this says. */
    int deterministic;
} kpt_attention_grads;

/* The reference backward, in double precision: the exact gradient of kpt_reference_attention at
 * args (args->o and args->lse are not read; the reference recomputes what it needs). Gradients
 * may be f16, bf16, f32 or f64 (f64 keeps full precision). Errors leave the outputs untouched. */
KPT_API kpt_status kpt_reference_attention_backward(const kpt_pattern *p,
                                                    const kpt_attention_args *args,
                                                    const kpt_attention_grads *grads,
                                                    kpt_diag *diag);

#ifdef __cplusplus
}
#endif
#endif
