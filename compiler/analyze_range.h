/* analyze_range: bounds of an f32 expression of the score s, for every s. */
#ifndef KPT_COMPILER_ANALYZE_RANGE_H
#define KPT_COMPILER_ANALYZE_RANGE_H

#include <stdbool.h>

#include "ir/ir.h"

/* An interval that holds every value a node can take (lo and hi may be infinite), and whether it
 * can also be NaN. */
typedef struct kpt_range {
    double lo, hi;
    bool nan;
} kpt_range;

/* The range of root over every s that is not NaN (+-inf included) and any value of the other
 * leaves, runtime scalars and aux loads (float ones may be NaN). Sound, not tight: the true
 * range lies inside, and the kernels' approximate f32 functions are allowed for. Returns false
 * only when out of memory. */
bool kpt_analyze_range(const kpt_ir_graph *g, kpt_ir_ref root, kpt_range *out);

/* Whether every value in r is a finite f32 (not NaN, not infinite). */
bool kpt_range_finite(const kpt_range *r);

#endif
