/* The IR printer. Text format (one item per line; ir_read.c parses it back):
 *
 *   kpt-ir 1
 *   pattern "sliding_window($w)+alibi"
 *   scalar w i32                       runtime scalar: name, type [= default]
 *   aux doc_q i32 [b, sq] segments     aux tensor: name, dtype, dims, fill rule for kptc check
 *                                      (segments, range LO HI, or script: the Lua script's)
 *   %1 = i32 q                         nodes: label, type, op, immediate, operands
 *   %2 = f32 const 0.5
 *   %3 = i32 scalar w
 *   %4 = i32 load doc_q %5 %1
 *   score %9                           roots; a missing line means "s unchanged" / "keep all"
 *   mask %7
 *
 * Only live nodes are printed, numbered densely in topological order, so the text of a pattern
 * depends on its structure alone.
 */
#include <stdlib.h>

#include "ir/pattern.h"
#include "base/strbuf.h"

const char *kpt_dim_name(int64_t dim)
{
    switch (dim) {
    case KPT_DIM_ANY: return "any";
    case KPT_DIM_B: return "b";
    case KPT_DIM_HQ: return "hq";
    case KPT_DIM_HKV: return "hkv";
    case KPT_DIM_SQ: return "sq";
    case KPT_DIM_SKV: return "skv";
    default: return NULL; /* a fixed size: print the number */
    }
}

static void print_decls(kpt_strbuf *sb, const kpt_pattern *p)
{
    for (int i = 0; i < p->num_scalars; i++) {
        const kpt_scalar_decl *s = &p->scalars[i];
        kpt_sb_printf(sb, "scalar %s %s", s->name, kpt_ir_type_name(s->type));
        if (s->has_default)
            kpt_sb_printf(sb, " = %.17g", s->def);
        kpt_sb_puts(sb, "\n");
    }
    for (int i = 0; i < p->num_aux; i++) {
        const kpt_aux_decl *a = &p->aux[i];
        kpt_sb_printf(sb, "aux %s %s [", a->name, kpt_dtype_name(a->dtype));
        for (int d = 0; d < a->rank; d++) {
            const char *n = kpt_dim_name(a->dims[d]);
            if (n)
                kpt_sb_printf(sb, "%s%s", d ? ", " : "", n);
            else
                kpt_sb_printf(sb, "%s%lld", d ? ", " : "", (long long)a->dims[d]);
        }
        if (a->fill == KPT_FILL_SEGMENTS)
            kpt_sb_puts(sb, "] segments\n");
        else if (a->fill == KPT_FILL_SCRIPT)
            kpt_sb_puts(sb, "] script\n");
        else
            kpt_sb_printf(sb, "] range %.17g %.17g\n", a->fill_lo, a->fill_hi);
    }
}

static void print_node(kpt_strbuf *sb, const kpt_pattern *p, const kpt_ir_node *n,
                       uint32_t label, const uint32_t *labels)
{
    kpt_sb_printf(sb, "%%%u = %s %s", label, kpt_ir_type_name((kpt_ir_type)n->type),
                  kpt_ir_op_name((kpt_ir_op)n->op));
    if (n->op == KPT_IR_CONST) {
        if (n->type == KPT_IR_F32)
            kpt_sb_printf(sb, " %.9g", (double)n->imm.f);
        else if (n->type == KPT_IR_BOOL)
            kpt_sb_puts(sb, n->imm.i ? " true" : " false");
        else
            kpt_sb_printf(sb, " %d", n->imm.i);
    } else if (n->op == KPT_IR_SCALAR) {
        kpt_sb_printf(sb, " %s", p->scalars[n->imm.index].name);
    } else if (n->op == KPT_IR_LOAD) {
        kpt_sb_printf(sb, " %s", p->aux[n->imm.index].name);
    }
    for (int i = 0; i < n->nargs; i++)
        kpt_sb_printf(sb, " %%%u", labels[n->arg[i]]);
    kpt_sb_puts(sb, "\n");
}

char *kpt_pattern_print(const kpt_pattern *p)
{
    kpt_strbuf sb = {0};
    uint32_t n = p->g.count ? p->g.count : 1;
    uint8_t *live = calloc(n, 1);
    uint32_t *labels = calloc(n, sizeof(*labels));
    if (!live || !labels) {
        free(live);
        free(labels);
        return NULL;
    }
    kpt_ir_ref roots[2] = {p->score, p->mask};
    kpt_ir_mark_live(&p->g, roots, 2, live);
    kpt_sb_puts(&sb, "kpt-ir 1\npattern ");
    kpt_sb_quoted(&sb, p->name ? p->name : "");
    kpt_sb_puts(&sb, "\n");
    print_decls(&sb, p);
    uint32_t next = 1;
    for (kpt_ir_ref r = 1; r < p->g.count; r++) {
        if (!live[r])
            continue;
        labels[r] = next++;
        print_node(&sb, p, &p->g.nodes[r], labels[r], labels);
    }
    if (p->score)
        kpt_sb_printf(&sb, "score %%%u\n", labels[p->score]);
    if (p->mask)
        kpt_sb_printf(&sb, "mask %%%u\n", labels[p->mask]);
    free(live);
    free(labels);
    return kpt_sb_take(&sb);
}
