/* kpt — attention patterns.
 *
 * A pattern is the mask and score modification of an attention, compiled to kpt's expression IR
 * (see docs/patterns.md). Patterns are created from built-in pattern strings such as
 * "document+causal+softcap(30)" or "sliding_window($w)", or from Lua pattern scripts.
 *
 * Thread-safety: a kpt_pattern is immutable once created; any number of threads may use one
 * concurrently. kpt_pattern_destroy must not race with other uses of the same pattern.
 */
#ifndef KPT_PATTERN_H
#define KPT_PATTERN_H

#include <stddef.h>
#include <stdint.h>
#include <kpt/status.h>
#include <kpt/tensor.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kpt_pattern kpt_pattern;

/* Compiles a built-in pattern string (terms joined with '+'). On success *out owns a new
 * pattern; on failure *out is NULL and `diag` (may be NULL) says what and where, with a caret. */
KPT_API kpt_status kpt_pattern_parse(const char *text, kpt_pattern **out, kpt_diag *diag);

/* ---- Lua pattern scripts (docs/lua.md) ---------------------------------------------------- */

/* A value for one of a script's params (`params = {W = 256}`), overriding the script's own. */
typedef struct kpt_param_value {
    const char *name;
    double value; /* integral for integer params; 0/1 for booleans; a runtime param's default */
} kpt_param_value;

/* How a Lua script is run. Zero or NULL fields take the documented defaults. */
typedef struct kpt_lua_params {
    /* The script's name in messages and the pattern's default name. NULL: "script" for
     * kpt_pattern_from_lua, the path for kpt_pattern_from_lua_file. */
    const char *name;
    const kpt_param_value *params; /* overrides; an unknown name is an error */
    int num_params;
    size_t max_memory;         /* bytes the script may hold; 0: 64 MiB */
    /* Lua VM instructions, plus the work of C library calls and allocations charged by size
     * (docs/lua.md); 0: 200 million (about a second) */
    uint64_t max_instructions;
    /* Receives what the script print()s, one call per print. NULL: discarded. */
    void (*print)(void *user, const char *text);
    void *print_user;
    double max_seconds; /* wall-clock time the script may run; 0: 5 s */
} kpt_lua_params;

/* Runs a Lua pattern script (the source text, `length` bytes; bytecode is refused) in a sandbox
 * and compiles what it returns (kpt.pattern{...}). params may be NULL. On failure *out is NULL
 * and diag names the script and line. Thread-safe: each call runs its own Lua state. */
KPT_API kpt_status kpt_pattern_from_lua(const char *source, size_t length,
                                        const kpt_lua_params *params, kpt_pattern **out,
                                        kpt_diag *diag);
/* The same for a script file (at most 1 MiB). */
KPT_API kpt_status kpt_pattern_from_lua_file(const char *path, const kpt_lua_params *params,
                                             kpt_pattern **out, kpt_diag *diag);

/* Frees a pattern and sets *p to NULL. NULL and *p == NULL are fine. */
KPT_API void kpt_pattern_destroy(kpt_pattern **p);

/* The pattern's name: the normalised pattern string ("document+causal"). Valid while p lives. */
KPT_API const char *kpt_pattern_name(const kpt_pattern *p);

/* Whether the pattern has a mask / a score modification (1) or not (0). */
KPT_API int kpt_pattern_has_mask(const kpt_pattern *p);
KPT_API int kpt_pattern_has_score_mod(const kpt_pattern *p);

/* Runtime scalars ("$w"): kernel arguments, set at launch; changing one never recompiles. */
typedef struct kpt_scalar_info {
    const char *name;     /* without the '$'; valid while the pattern lives */
    kpt_dtype dtype;      /* KPT_DTYPE_I32 or KPT_DTYPE_F32 */
    int has_default;      /* 1 if the pattern gives a default ("$w=1024") */
    double default_value; /* meaningful when has_default */
} kpt_scalar_info;

KPT_API int kpt_pattern_scalar_count(const kpt_pattern *p);
KPT_API kpt_status kpt_pattern_scalar_info(const kpt_pattern *p, int index, kpt_scalar_info *out);

/* Aux tensors: data the mask or score reads (document ids, bias tables). Each dimension's size
 * is one of the attention sizes below, or KPT_DIM_ANY (any size; out-of-range reads give 0). */
typedef enum kpt_dim {
    KPT_DIM_ANY = 0,
    KPT_DIM_B = -1,   /* batch */
    KPT_DIM_HQ = -2,  /* query heads */
    KPT_DIM_HKV = -3, /* kv heads */
    KPT_DIM_SQ = -4,  /* query length */
    KPT_DIM_SKV = -5, /* kv length */
} kpt_dim;

/* The most dimensions an aux tensor has ([B, N, N, K] edge features need four). */
#define KPT_AUX_MAX_RANK 4

typedef struct kpt_aux_info {
    const char *name;                /* valid while the pattern lives */
    kpt_dtype dtype;                 /* I32, F32, BOOL, F16 or BF16 */
    int rank;                        /* 1 to KPT_AUX_MAX_RANK */
    int64_t dims[KPT_AUX_MAX_RANK]; /* a kpt_dim (<= 0) or a fixed size (> 0); unused ones 0 */
} kpt_aux_info;

KPT_API int kpt_pattern_aux_count(const kpt_pattern *p);
KPT_API kpt_status kpt_pattern_aux_info(const kpt_pattern *p, int index, kpt_aux_info *out);

/* The pattern's IR as text (the format kptc prints; docs/architecture.md). Free with kpt_free.
 * Returns NULL only when out of memory. */
KPT_API char *kpt_pattern_ir_text(const kpt_pattern *p);

/* Built-in pattern terms, for listings and completion. */
typedef struct kpt_builtin_info {
    const char *name;      /* "sliding_window" */
    const char *signature; /* "sliding_window(W)" */
    const char *meaning;   /* "q >= k and q - k < W" */
} kpt_builtin_info;

KPT_API int kpt_builtin_count(void);
/* NULL when index is out of range. */
KPT_API const kpt_builtin_info *kpt_builtin_get(int index);

/* Frees memory kpt returned to the caller (kpt_pattern_ir_text, ...). NULL is fine. */
KPT_API void kpt_free(void *ptr);

#ifdef __cplusplus
}
#endif
#endif
