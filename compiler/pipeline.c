/* The pipeline driver (QBE-style: a flat list of passes; NIR-style validation after each). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/passes.h"
#include "compiler/pipeline.h"
#include "base/diag.h"

#define MAX_ROUNDS 8

static const struct {
    const char *name;
    kpt_pass_fn run;
} passes[] = {
    {"opt_fold", kpt_opt_fold},
    {"opt_simplify", kpt_opt_simplify},
};

/* Stages --dump-after names: "parse", each pass of the list above by its name, "all". */
bool kpt_pipeline_is_stage(const char *name)
{
    if (!strcmp(name, "parse") || !strcmp(name, "all"))
        return true;
    for (size_t i = 0; i < sizeof(passes) / sizeof(passes[0]); i++)
        if (!strcmp(name, passes[i].name))
            return true;
    return false;
}

static kpt_status check(kpt_pattern *p, const char *after, kpt_diag *diag)
{
    char msg[300];
    if (kpt_pattern_validate(p, msg, sizeof(msg)))
        return KPT_OK;
    return kpt_diag_set(diag, KPT_ERR_INTERNAL, "invalid IR after %s: %s", after, msg);
}

static kpt_status dump(kpt_pattern *p, const kpt_pipeline_opts *o, const char *stage, int round,
                       kpt_diag *diag)
{
    if (!o || !o->dump_after || !o->dump)
        return KPT_OK;
    if (strcmp(o->dump_after, "all") != 0 && strcmp(o->dump_after, stage) != 0)
        return KPT_OK;
    char *text = kpt_pattern_print(p);
    if (!text)
        return kpt_diag_set(diag, KPT_ERR_NO_MEMORY, "out of memory");
    o->dump(o->dump_ud, stage, round, text);
    free(text);
    return KPT_OK;
}

/* A mask that folded to `true` is no mask; a score that is just `s` is no score mod. */
static void normalise_roots(kpt_pattern *p)
{
    const kpt_ir_node *m = p->mask ? kpt_ir_node_get(&p->g, p->mask) : NULL;
    if (m && m->op == KPT_IR_CONST && m->imm.i == 1)
        p->mask = 0;
    const kpt_ir_node *s = p->score ? kpt_ir_node_get(&p->g, p->score) : NULL;
    if (s && s->op == KPT_IR_S)
        p->score = 0;
}

kpt_status kpt_pipeline_run(kpt_pattern *p, const kpt_pipeline_opts *opts, kpt_diag *diag)
{
    if (!p)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT, "no pattern");
    kpt_status st = check(p, "parse", diag);
    if (st == KPT_OK)
        st = dump(p, opts, "parse", 0, diag);
    bool progress = true;
    for (int round = 1; st == KPT_OK && progress && round <= MAX_ROUNDS; round++) {
        progress = false;
        for (size_t i = 0; st == KPT_OK && i < sizeof(passes) / sizeof(passes[0]); i++) {
            bool changed = false;
            kpt_diag pd = {0};
            st = passes[i].run(p, &changed, &pd);
            if (st) {
                kpt_diag_set(diag, st, "%s: %s", passes[i].name, pd.message);
                break;
            }
            normalise_roots(p);
            progress |= changed;
            st = check(p, passes[i].name, diag);
            if (st == KPT_OK)
                st = dump(p, opts, passes[i].name, round, diag);
        }
    }
    return st;
}

kpt_status kpt_pipeline_finish(kpt_pattern *p, kpt_pattern **out, kpt_diag *diag)
{
    if (!p)
        return diag->status;
    kpt_status st = kpt_pipeline_run(p, NULL, diag);
    if (st != KPT_OK) {
        kpt_pattern_destroy(&p);
        return st;
    }
    *out = p;
    return KPT_OK;
}
