/* The shared C-like expression emitter: turns a pattern's score mod and mask into straight-line
 * statements for the C-family kernel languages (CUDA, HIP, GLSL). One statement per live IR node, in
 * node order, so the text depends only on the IR (deterministic source, stable cache keys).
 *
 * The emitted code calls helpers every target's template defines under the same names
 * (kpt_iadd, kpt_idiv, kpt_fexp, kpt_aux_i32, kpt_iv_add, ...), which carry the IR's semantics:
 * wrapping i32, floor division, out-of-range aux loads reading 0. A dialect table holds what
 * differs between the targets. No user text reaches the output: names become indices. */
#ifndef KPT_CODEGEN_EMIT_C_H
#define KPT_CODEGEN_EMIT_C_H

#include "ir/pattern.h"
#include "base/strbuf.h"

typedef struct kpt_c_dialect {
    const char *name; /* "cuda", "hip", "glsl" */
    /* Names of the IR types: i32, f32, bool. */
    const char *type_int, *type_float, *type_bool;
    /* printf format of a finite float literal: hex floats where the language has them (exact),
     * else nine significant digits (which round-trip a float). */
    const char *float_lit;
    /* The function that turns u32 bits into a float: non-finite literals and f32 runtime
     * scalars (A.scalars[] holds their bits). */
    const char *float_from_bits;
    /* Conversions: `open` + value + `close`. */
    const char *to_int_open, *to_int_close, *to_float_open, *to_float_close;
    /* printf format of the head of an aux load, given the loader's dtype suffix ("i32", "f16",
     * ...) and the aux slot: C passes the tensor (`kpt_aux_i32(A.aux[3], `); GLSL has one
     * storage buffer per tensor and a generated loader per slot (`kpt_aux3(`, "%.0s" drops the
     * suffix). */
    const char *aux_load;
    /* The same for the interval of a load, given "true"/"false" (bool data) and the slot. */
    const char *iv_load;
    /* The approximate float division helper (constant divisors become products with their
     * reciprocal); NULL where the language's `/` is already approximate (GLSL). */
    const char *fdiv;
    /* printf format of the tile classifier's return statement for the mask's interval i<N>,
     * given N ("%1$u" where N is used twice): 0 no pair kept, 2 every pair, 1 otherwise. */
    const char *tile_class;
} kpt_c_dialect;

extern const kpt_c_dialect kpt_dialect_cuda;
extern const kpt_c_dialect kpt_dialect_hip;
extern const kpt_c_dialect kpt_dialect_glsl;

/* Values the score mod and mask need that depend only on b, h, lengths and scalars (ALiBi's
 * slope(h), say), hoisted out of the per-element code: the fields of `struct kpt_uniform` and the
 * body of `void kpt_uniform_init(const kpt_args &A, int b, int h, kpt_uniform &U)`. The score and
 * mask bodies read them as U.u<N>. */
void kpt_emit_uniform(kpt_strbuf *fields, kpt_strbuf *init, const kpt_pattern *p,
                      const kpt_c_dialect *d);
/* Body of `float kpt_score(const kpt_args &A, const kpt_uniform &U, float s, int b, int h, int q, int k)`. */
void kpt_emit_score_body(kpt_strbuf *sb, const kpt_pattern *p, const kpt_c_dialect *d);
/* Body of `bool kpt_mask(const kpt_args &A, const kpt_uniform &U, int b, int h, int q, int k)`. */
void kpt_emit_mask_body(kpt_strbuf *sb, const kpt_pattern *p, const kpt_c_dialect *d);
/* The most key values of a split mask (kpt_emit_mask_split). */
#define KPT_MASK_KEY_VALUES 4

/* A mask split for evaluation over a tile, where each key is paired with many queries: the body
 * of `void kpt_mask_keys(const kpt_args &A, const kpt_uniform &U, int b, int h, int k, int
 * (&kv)[N])`, which computes the values the mask derives from the key alone (a Morton key's
 * decoded x and y), and of `bool kpt_mask_pair(..., int q, int k, const int (&kv)[N])`, the rest
 * of the mask given them. Returns N: 0 when the mask does not split usefully (no mask, aux loads,
 * float or more than KPT_MASK_KEY_VALUES key values, or key values that save few nodes); the
 * bodies are then trivial. */
int kpt_emit_mask_split(kpt_strbuf *keys, kpt_strbuf *pair, const kpt_pattern *p,
                        const kpt_c_dialect *d);
/* Body of `float kpt_score_grad(const kpt_args &A, const kpt_uniform &U, float s, int b, int h,
 * int q, int k, float &ds)` for a derived pattern (kpt_diff_score): returns the score mod's value
 * at s and sets ds to its derivative d s'/d s. */
void kpt_emit_score_grad_body(kpt_strbuf *sb, const kpt_pattern *p, const kpt_c_dialect *d);
/* Body of `void kpt_aux_grads(const kpt_args &A, const kpt_uniform &U, const kpt_gargs &G, float s,
 * int b, int h, int q, int k, float g)` for a derived pattern: for each float aux load of the score
 * mod (p->dloads), kpt_daux_add(A, G, slot, rank, i0, i1, i2, g * d s'/d load) at the load's
 * indices. */
void kpt_emit_aux_grad_body(kpt_strbuf *sb, const kpt_pattern *p, const kpt_c_dialect *d);
/* Body of `int kpt_tile_interval(const kpt_args &A, int b, int h, int q0, int q1, int k0, int k1)`:
 * interval arithmetic over the box q in [q0, q1], k in [k0, k1]; returns 0 when no pair can be
 * kept, 2 when every pair is, 1 otherwise. Sound for every mask; exact for box-separable
 * comparisons (causal, windows, prefixes, chunks). */
void kpt_emit_tile_body(kpt_strbuf *sb, const kpt_pattern *p, const kpt_c_dialect *d);

#endif
