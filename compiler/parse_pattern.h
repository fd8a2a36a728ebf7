/* The built-in pattern-string front end. */
#ifndef KPT_COMPILER_PARSE_PATTERN_H
#define KPT_COMPILER_PARSE_PATTERN_H

#include "ir/pattern.h"

/* Parses a pattern string into IR, before any pass runs. NULL on error (diag says where). */
kpt_pattern *kpt_parse_pattern(const char *text, kpt_diag *diag);

/* Parses a pattern string into an existing pattern (Lua's kpt.builtin): its masks are AND-ed
 * into *mask_out (0: none), its score mods applied to score_in (0: the variable s) give
 * *score_out. Scalars and aux tensors it names are declared in p. False on error (diag). */
bool kpt_parse_pattern_into(kpt_pattern *p, const char *text, kpt_ir_ref score_in,
                            kpt_ir_ref *score_out, kpt_ir_ref *mask_out, kpt_diag *diag);

/* The closest built-in name to `name` (edit distance), or NULL if nothing is close. */
const char *kpt_builtin_suggest(const char *name, size_t len);

#endif
