/* The hand-written pattern lists of the codegen tests and the GPU checks must grow with the
 * built-in table (compiler/builtins.c): each asks this at start-up. Header-only. */
#ifndef KPT_TESTS_COVERS_BUILTINS_H
#define KPT_TESTS_COVERS_BUILTINS_H

#include <stddef.h>
#include <string.h>

#include "compiler/builtins.h"

/* Whether the pattern string `pat` has a term named `name` ("causal" is not a term of
 * "causal_bottom_right"). */
static inline int kpt_test_has_term(const char *pat, const char *name)
{
    size_t n = strlen(name);
    for (const char *t = pat; t; t = strchr(t, '+'), t = t ? t + 1 : NULL)
        if (!strncmp(t, name, n) && (t[n] == 0 || t[n] == '(' || t[n] == '+'))
            return 1;
    return 0;
}

/* The first built-in none of the n patterns uses, or NULL when they cover the table. */
static inline const char *kpt_test_uncovered_builtin(const char *const *patterns, int n)
{
    for (int b = 0; b < kpt_num_builtins; b++) {
        int used = 0;
        for (int i = 0; i < n && !used; i++)
            used = kpt_test_has_term(patterns[i], kpt_builtins[b].info.name);
        if (!used)
            return kpt_builtins[b].info.name;
    }
    return NULL;
}

#endif
