/* What the CPU reference's forward (reference.c) and backward (reference_backward.c) share:
 * element offsets, the double dot product, rows converted to doubles, and the worker threads. */
#ifndef KPT_RUNTIME_REFERENCE_UTIL_H
#define KPT_RUNTIME_REFERENCE_UTIL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include <kpt/tensor.h>

#include "compiler/analyze_mask.h"
#include "ir/ir_eval.h"
#include "runtime/attention_args.h"

/* Keys per tile when a row's keys are classified by the mask analysis. */
#define KPT_REF_TILE_K 32

/* The element offset of [i0, i1, i2, i3] in a rank-4 tensor. */
int64_t kpt_ref_off4(const kpt_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3);
/* sum(a[i] * b[i]) in a fixed order (four partial sums), so results do not depend on threads. */
double kpt_ref_dot(const double *a, const double *b, int64_t n);
/* t[b, h, 0..rows, 0..cols] as contiguous doubles. */
void kpt_ref_load_rows(const kpt_tensor *t, int64_t b, int64_t h, int64_t rows, int64_t cols,
                       double *out);

/* What scoring a query row needs: the pattern with its mask and score programs, the scale, and
 * the sizes of the (batch row, kv head)'s keys. */
typedef struct kpt_ref_scorer {
    const kpt_pattern *p;
    const kpt_ir_prog *mask_prog, *score_prog;
    const kpt_mask_analysis *analysis; /* NULL: the mask is evaluated for every key */
    kpt_tile_class *tiles; /* scratch: the row's key tiles (Skv / KPT_REF_TILE_K + 1) */
    double scale;
    int64_t Skv, Dqk;
} kpt_ref_scorer;

/* The exact mask analysis of p under the binding's sizes and scalars (b, h and aux data
 * unknown), for skipping key tiles in kpt_ref_row_scores; NULL without a mask. Sound: a tile
 * is skipped only when no key of it is kept, so results are those of evaluating every key. */
kpt_mask_analysis *kpt_ref_analyze(const kpt_pattern *p, const kpt_attn_binding *bind);

/* One row's scores (env's b, h and q set; qd the row of q, kd the keys, as doubles): kept[k],
 * raw[k] = scale * q.k before the score mod (raw may be NULL) and out[k] after it, for the kept
 * keys. Returns the row's max: -inf when nothing is kept, NaN when some score is NaN. The
 * forward and the backward score rows only here, so they agree on what a score is. */
double kpt_ref_row_scores(const kpt_ref_scorer *sc, kpt_ir_env *env, kpt_ir_value *vals,
                          const double *qd, const double *kd, uint8_t *kept, double *raw,
                          double *out);

/* Head h's sink logit, or -inf without sinks (sinks->data NULL). */
double kpt_ref_sink(const kpt_tensor *sinks, int64_t h);

/* Workers for a problem of this shape: $KPT_REFERENCE_THREADS, else one per online core (at
 * most 64), never more than `units` (what can run in parallel); small problems get one. */
int kpt_ref_workers(const kpt_attn_shape *s, int64_t units);

/* A worker's first member: its thread. */
typedef struct kpt_ref_worker_base {
    pthread_t thread;
} kpt_ref_worker_base;

/* Runs fn on each of n workers (an array of `size`-byte structs starting with a
 * kpt_ref_worker_base): workers 1.. on threads, worker 0 on the caller's; a worker whose thread
 * cannot start runs on the caller's too. Returns when all are done. */
/* KPT_ERR_LIMIT where a worker's scratch (K and V of one (b, kv head) in double precision, and
 * as much again for the backward's dK and dV) would pass 2^40 elements: no size arithmetic may
 * wrap, whatever the strides (stride-0 tensors describe huge shapes in little memory). */
kpt_status kpt_ref_check_scratch(const kpt_attn_shape *s, kpt_diag *diag);

void kpt_ref_run_workers(void *workers, size_t size, int n, void *(*fn)(void *));

/* kpt_reference_attention_backward with delta = dO . O taken from o (shaped as args->o; any float
 * dtype) instead of sum(P dP): the gradient the kernels compute from the O they stored (16-bit).
 * Where one aux element collects nearly all of each row's probability (Graphormer's capped
 * distance), its gradient is a sum that almost cancels, and the rounding of O alone moves it by
 * a few percent of the largest; checks of kernels compare aux gradients with this. o NULL: the
 * exact gradient. */
kpt_status kpt_ref_backward_stored_o(const kpt_pattern *p, const kpt_attention_args *args,
                                     const kpt_tensor *o, const kpt_attention_grads *grads,
                                     kpt_diag *diag);

#endif
