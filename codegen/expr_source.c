/* The target-independent C++ fragment (see expr_source.h). */
#include <stdlib.h>

#include "codegen/expr_source.h"
#include "codegen/template.h"
#include "base/diag.h"

extern const char kpt_tmpl_common_expr[]; /* templates/common/expr.inc, embedded */

kpt_status kpt_expr_source(kpt_strbuf *out, const kpt_pattern *p, const kpt_c_dialect *d,
                           kpt_diag *diag)
{
    kpt_strbuf score = {0}, mask = {0}, tile = {0}, ufields = {0}, uinit = {0}, keys = {0},
               pair = {0}, nk = {0};
    kpt_emit_uniform(&ufields, &uinit, p, d);
    kpt_emit_score_body(&score, p, d);
    kpt_emit_mask_body(&mask, p, d);
    kpt_emit_tile_body(&tile, p, d);
    kpt_sb_printf(&nk, "%d", kpt_emit_mask_split(&keys, &pair, p, d));
    kpt_status st = KPT_OK;
    char err[256];
    kpt_strbuf *all[] = {&score, &mask, &tile, &ufields, &uinit, &keys, &pair, &nk};
    bool failed = false;
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
        failed |= all[i]->failed;
    if (failed) {
        st = kpt_diag_set(diag, KPT_ERR_NO_MEMORY, "out of memory (%s codegen)", d->name);
    } else {
        const kpt_hole holes[] = {
            {"SCORE", score.data},          {"MASK", mask.data},
            {"TILE", tile.data},            {"UNIFORM_FIELDS", ufields.data},
            {"UNIFORM_INIT", uinit.data},   {"MASK_KEYS", keys.data},
            {"MASK_PAIR", pair.data},       {"MASK_NK", nk.data},
        };
        if (!kpt_template_fill(out, kpt_tmpl_common_expr, holes, 8, err, sizeof(err)))
            st = kpt_diag_set(diag, KPT_ERR_INTERNAL, "expression template: %s", err);
    }
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
        kpt_sb_free(all[i]);
    return st;
}

kpt_status kpt_cpp_kernel_source(const kpt_pattern *p, const kpt_c_dialect *d, const char *tmpl,
                                 const char *kernel, const kpt_strbuf *config, char **out,
                                 kpt_diag *diag)
{
    kpt_strbuf expr = {0}, src = {0};
    kpt_status st = kpt_expr_source(&expr, p, d, diag);
    char err[256];
    if (!st && (config->failed || expr.failed)) {
        st = kpt_diag_set(diag, KPT_ERR_NO_MEMORY, "out of memory (%s codegen)", d->name);
    } else if (!st) {
        const kpt_hole holes[] = {{"CONFIG", config->data}, {"EXPR", expr.data},
                                  {"KERNEL", kernel}};
        if (!kpt_template_fill(&src, tmpl, holes, kernel ? 3 : 2, err, sizeof(err)))
            st = kpt_diag_set(diag, KPT_ERR_INTERNAL, "%s template: %s", d->name, err);
    }
    kpt_sb_free(&expr);
    if (!st && !(*out = kpt_sb_take(&src)))
        st = kpt_diag_set(diag, KPT_ERR_NO_MEMORY, "out of memory (%s codegen)", d->name);
    kpt_sb_free(&src);
    return st;
}
