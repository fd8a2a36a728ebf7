/* What kptc's command files share (common.c, usage.c). Every shared name is prefixed kptc_. */
#ifndef KPT_TOOLS_KPTC_KPTC_H
#define KPT_TOOLS_KPTC_KPTC_H

#include <getopt.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <kpt/kpt.h>

#include "compiler/parse_lua.h"
#include "ir/pattern.h"

#define KPTC_EXIT_USAGE 2
#define KPTC_MAX_KV 32
#define KPTC_MAX_PATTERNS 64

extern const char kptc_usage[], kptc_usage_patterns[], kptc_usage_emit[], kptc_usage_check[],
    kptc_usage_bundle[];

/* The whole command line (argv[0] is the program); returns the exit status. */
int kptc_main(int argc, char **argv);

/* When set (by the argument fuzz target), each command returns 0 once its arguments and
 * pattern are validated, before it writes a file, reads data or compiles and runs kernels. */
extern bool kptc_parse_only;

/* "kptc: <message>" and a pointer to --help on stderr; returns KPTC_EXIT_USAGE. */
__attribute__((format(printf, 1, 2))) int kptc_usage_error(const char *fmt, ...);
/* Prints a diag; returns the exit status for it. */
int kptc_report(const kpt_diag *d, kpt_status st);
bool kptc_parse_int(const char *s, int64_t lo, int64_t hi, int64_t *out);
/* NAME=VALUE of --scalar and --param: a name of 1 to KPT_NAME_MAX-1 characters and a finite
 * number (or true/false when `booleans`). */
int kptc_parse_assignment(const char *opt, const char *arg, bool booleans,
                          char name[KPT_NAME_MAX], double *value);

/* ---- options: one struct for every command, filled by getopt_long -------------------------- */

/* Codes of the long options without a short form (the commands' `struct option` tables). */
enum {
    KPTC_OPT_EMIT = 256,
    KPTC_OPT_DUMP_AFTER,
    KPTC_OPT_TARGET,
    KPTC_OPT_HEAD_DIM,
    KPTC_OPT_VERBOSE,
    KPTC_OPT_BACKEND,
    KPTC_OPT_SHAPE,
    KPTC_OPT_DTYPE,
    KPTC_OPT_LAYOUT,
    KPTC_OPT_SEED,
    KPTC_OPT_TILE,
    KPTC_OPT_SAVE,
    KPTC_OPT_SMEM,
    KPTC_OPT_BLOCKMAP,
    KPTC_OPT_PARAM,
    KPTC_OPT_SCALAR,
    KPTC_OPT_AUX,
    KPTC_OPT_BACKWARD,
    KPTC_OPT_PAGED,
    KPTC_OPT_PAGE_SIZE,
    KPTC_OPT_SEQLENS,
    KPTC_OPT_SINKS,
    KPTC_OPT_TALL,
};

typedef struct kptc_options {
    const char *pattern; /* patterns[0] */
    const char *patterns[KPTC_MAX_PATTERNS];
    int npatterns;
    const char *emit, *dump_after, *target, *head_dim, *verbose, *backend, *shape, *dtype;
    const char *layout, *seed, *tile, *save, *smem, *blockmap, *backward, *output, *jobs;
    const char *paged, *page_size, *seqlens, *sinks, *tall;
    const char *params[KPTC_MAX_KV];
    int nparams;
    const char *scalars[KPTC_MAX_KV];
    int nscalars;
    const char *aux[KPTC_MAX_KV];
    int naux;
} kptc_options;

/* Parses a command's options (argv[0] is the command) with getopt_long: values as "--opt V" or
 * "--opt=V", -o and -j where longopts has them, the rest as PATTERNs. Returns 0, an exit status
 * for a usage error, or -1 after printing `help` for --help/-h. */
int kptc_parse_options(int argc, char **argv, const struct option *longopts, const char *help,
                       kptc_options *o);
/* --backend NAME (kpt_backend_name's names: cpu, cuda, hip, vulkan) -> *kind; else a usage
 * error. */
int kptc_parse_backend(const char *name, kpt_backend_kind *kind);
/* Exactly one PATTERN was given (else a usage error naming `cmd`). */
int kptc_one_pattern(const kptc_options *o, const char *cmd);

/* ---- patterns: built-in strings and Lua scripts --------------------------------------------- */

/* Whether PATTERN names a Lua script (ends in .lua) rather than being a pattern string. */
bool kptc_is_script(const char *pattern);

typedef struct kptc_script {
    char *src; /* the script's text; NULL for a pattern string */
    size_t len;
    kpt_lua_params prm;
    kpt_param_value values[KPTC_MAX_KV];
    char names[KPTC_MAX_KV][KPT_NAME_MAX];
} kptc_script;

/* The pattern before any pass runs: a pattern string, or a script (its text kept in sc; the
 * caller frees sc->src). Returns 0 or an exit status (the error printed). */
int kptc_load_pattern(const kptc_options *o, kptc_script *sc, kpt_pattern **out);

/* ---- the commands --------------------------------------------------------------------------- */

int kptc_cmd_patterns(int argc, char **argv);
int kptc_cmd_emit(int argc, char **argv);
int kptc_cmd_check(int argc, char **argv);
int kptc_cmd_bundle(int argc, char **argv);

/* The context of a device backend for kptc check's device runs: 0, or the exit status of why
 * there is none (reported: no driver, no device). Opened before the reference runs, so a missing
 * GPU is said at once; the forward and backward checks share it. */
int kptc_device_context(kpt_backend_kind kind, kpt_context **ctx);

/* kptc check --backend cuda|hip|vulkan (check_device.c): runs p on ctx's device on ref's inputs
 * (q, k, v, aux, scalars; host memory) and compares with ref's o and lse (f64). Returns the exit
 * status. */
int kptc_check_device(kpt_context *ctx, const kpt_pattern *p, const kpt_attention_args *ref,
                      kpt_dtype dtype);

/* kptc check --backward (check_backward.c): the gradients of the reference (double precision)
 * for a random dO, checked (ctx NULL) against central finite differences of the reference
 * forward along random directions, or against the backward kernels of ctx's device (outputs
 * poisoned, run twice to check the bits repeat). */
int kptc_check_backward(kpt_context *ctx, const kpt_pattern *p, const kpt_attention_args *ref,
                        kpt_dtype dtype, uint64_t seed);

/* kptc check in serving mode (check_paged.c): a ragged batch over a paged cache. */
#define KPTC_MAX_SEQS 256
typedef struct kptc_paged_opts {
    int n, q[KPTC_MAX_SEQS], kv[KPTC_MAX_SEQS]; /* --seqlens */
    int page;                                   /* --page-size; 0: contiguous cache */
    bool sinks;
    int hq, hkv, d, dv; /* dv: V's and O's head dim */
    kpt_dtype dtype;
    uint64_t seed;
} kptc_paged_opts;

/* Parses --seqlens Q:KV[,Q:KV...] into q and kv (at most max); 0 or the exit status. */
int kptc_parse_seqlens(const char *s, int *q, int *kv, int max, int *n);
/* The check itself (dev NULL: the reference alone); returns the exit status. */
int kptc_check_paged(kpt_context *dev, const kpt_pattern *p, const kptc_paged_opts *po,
                     const kpt_scalar_value *scalars, int nscalars, const kpt_aux_tensor *aux,
                     int naux);

/* ---- shared by the device checks (check_device.c) ---- */

/* Bytes spanned by a tensor (its largest offset + 1 element). */
size_t kptc_span(const kpt_tensor *t);
/* An element of a rank-3 or rank-4 tensor as a double. */
double kptc_element(const kpt_tensor *t, const void *data, int64_t i0, int64_t i1, int64_t i2,
                    int64_t i3);

typedef struct kptc_device_run {
    kpt_context *ctx; /* borrowed from the caller */
    kpt_buffer *bufs[16 + 2 * KPT_MAX_AUX];
    int nbufs;
    kpt_aux_tensor aux[KPT_MAX_AUX];
} kptc_device_run;

/* A device buffer for t (its data copied when `copy`, else poisoned with 0xff bytes, NaN in
 * every float dtype); t->data becomes the buffer's. */
kpt_status kptc_upload(kptc_device_run *r, kpt_tensor *t, bool copy, kpt_diag *d);
/* The forward's arguments of ref on the device: q, k, v, the aux tensors and the sinks (where
 * ref has them) copied, o (dtype, ref's strides) and lse (f32 [B, Hq, Sq]) poisoned, o and lse
 * the last buffers made. */
kpt_status kptc_device_args(kptc_device_run *r, const kpt_attention_args *ref, kpt_dtype dtype,
                            kpt_attention_args *a, kpt_diag *d);
/* A run on ctx (kptc_device_context) with the kernels of p for ref's head dims and dtype: the
 * forward in *fwd and, where bwd is not NULL, the backward in *bwd. */
kpt_status kptc_device_open(kptc_device_run *r, kpt_context *ctx, const kpt_pattern *p,
                            const kpt_attention_args *ref, kpt_dtype dtype, kpt_kernel **fwd,
                            kpt_kernel **bwd, kpt_diag *d);
/* Frees the run's buffers (the context stays the caller's). */
void kptc_device_close(kptc_device_run *r);

#endif
