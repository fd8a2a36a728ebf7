/* The pass pipeline: a flat list of passes run in rounds until nothing changes, with the IR
 * validated after every pass and dumped after any pass on request. */
#ifndef KPT_COMPILER_PIPELINE_H
#define KPT_COMPILER_PIPELINE_H

#include "ir/pattern.h"

typedef struct kpt_pipeline_opts {
    /* Dump the IR after this pass ("parse", a pass name, or "all"); NULL: no dumps. */
    const char *dump_after;
    /* Receives each dump; `pass` names the stage, `round` counts from 1 (0 for "parse"). */
    void (*dump)(void *ud, const char *pass, int round, const char *ir_text);
    void *dump_ud;
} kpt_pipeline_opts;

/* Runs the passes over p. opts may be NULL. */
kpt_status kpt_pipeline_run(kpt_pattern *p, const kpt_pipeline_opts *opts, kpt_diag *diag);

/* What the public entry points do with a front end's result: p NULL (the front end failed, diag
 * says why) returns diag's status; otherwise runs the passes and gives p to *out, or destroys it
 * when a pass fails. */
kpt_status kpt_pipeline_finish(kpt_pattern *p, kpt_pattern **out, kpt_diag *diag);

/* Whether dump_after may name `name`: "parse", a pass of the pass list, or "all". */
bool kpt_pipeline_is_stage(const char *name);

#endif
