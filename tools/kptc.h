/* What kptc's command files share. */
#ifndef KPT_TOOLS_KPTC_H
#define KPT_TOOLS_KPTC_H

#include <stdbool.h>
#include <stdint.h>

#include <kpt/kpt.h>

#include "ir/pattern.h"

#define EXIT_USAGE 2
#define MAX_KV 32

/* "kptc: <message>" and a pointer to --help on stderr; returns EXIT_USAGE. */
__attribute__((format(printf, 1, 2))) int usage_error(const char *fmt, ...);
/* Prints a diag; returns the exit status for it. */
int report(const kpt_diag *d, kpt_status st);
bool parse_int(const char *s, int64_t lo, int64_t hi, int64_t *out);
/* NAME=VALUE of --scalar and --param. */
int parse_assignment(const char *opt, const char *arg, bool booleans, char name[KPT_NAME_MAX],
                     double *value);

/* Whether PATTERN names a Lua script (ends in .lua) rather than being a pattern string. */
bool is_script(const char *pattern);

/* kptc check --backend cuda (kptc_device.c): runs p on the device on ref's inputs (q, k, v, aux,
 * scalars; host memory) and compares with ref's o and lse (f64). Returns the exit status. */
int kptc_check_device(const char *backend, const kpt_pattern *p, const kpt_attention_args *ref,
                      kpt_dtype dtype);

/* kptc bundle (kptc_bundle.c). */
int kptc_bundle(int argc, char **argv);

#endif
