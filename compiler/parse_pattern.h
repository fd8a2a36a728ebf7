/* The built-in pattern-string front end. */
#ifndef KPT_COMPILER_PARSE_PATTERN_H
#define KPT_COMPILER_PARSE_PATTERN_H

#include "ir/pattern.h"

/* Parses a pattern string into IR, before any pass runs. NULL on error (diag says where). */
kpt_pattern *kpt_parse_pattern(const char *text, kpt_diag *diag);

/* The closest built-in name to `name` (edit distance), or NULL if nothing is close. */
const char *kpt_builtin_suggest(const char *name, size_t len);

#endif
