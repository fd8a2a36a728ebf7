/* The template filler: kernel skeletons hold named holes written @NAME@ (capital letters, digits
 * and underscores); filling replaces each with its text. A hole the caller does not fill, a
 * filling no hole asks for and a stray '@' are errors, so a template and its generator cannot
 * drift apart silently. */
#ifndef KPT_CODEGEN_TEMPLATE_H
#define KPT_CODEGEN_TEMPLATE_H

#include <stdbool.h>
#include <stddef.h>

#include "base/strbuf.h"

typedef struct kpt_hole {
    const char *name;
    const char *text;
} kpt_hole;

/* Appends the filled template to `out`. Returns false with a message in `err` on a bad hole. */
bool kpt_template_fill(kpt_strbuf *out, const char *tmpl, const kpt_hole *holes, int nholes,
                       char *err, size_t err_size);

#endif
