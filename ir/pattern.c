/* Pattern objects: declarations, the public accessors, and graph rewriting. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/diag.h"
#include "ir/pattern.h"

kpt_ir_type kpt_aux_ir_type(kpt_dtype dtype)
{
    switch (dtype) {
    case KPT_DTYPE_I32: return KPT_IR_I32;
    case KPT_DTYPE_BOOL: return KPT_IR_BOOL;
    case KPT_DTYPE_F32:
    case KPT_DTYPE_F16:
    case KPT_DTYPE_BF16: return KPT_IR_F32;
    default: return KPT_IR_VOID;
    }
}

static void attach(kpt_pattern *p)
{
    p->g.aux_types = p->aux_types;
    p->g.num_aux = (uint32_t)p->num_aux;
}

kpt_pattern *kpt_pattern_new(const char *name)
{
    kpt_pattern *p = calloc(1, sizeof(*p));
    if (!p)
        return NULL;
    kpt_ir_graph_init(&p->g);
    attach(p);
    if (!kpt_pattern_set_name(p, name ? name : "")) {
        free(p);
        return NULL;
    }
    return p;
}

bool kpt_pattern_set_name(kpt_pattern *p, const char *name)
{
    char *copy = strdup(name);
    if (!copy)
        return false;
    free(p->name);
    p->name = copy;
    return true;
}

static bool valid_name(const char *name)
{
    size_t n = strlen(name);
    if (n == 0 || n >= KPT_NAME_MAX)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
        if (!alpha && !(i > 0 && c >= '0' && c <= '9'))
            return false;
    }
    return true;
}

int kpt_pattern_find_scalar(const kpt_pattern *p, const char *name)
{
    for (int i = 0; i < p->num_scalars; i++)
        if (strcmp(p->scalars[i].name, name) == 0)
            return i;
    return -1;
}

int kpt_pattern_find_aux(const kpt_pattern *p, const char *name)
{
    for (int i = 0; i < p->num_aux; i++)
        if (strcmp(p->aux[i].name, name) == 0)
            return i;
    return -1;
}

int kpt_pattern_scalar(kpt_pattern *p, const char *name, kpt_ir_type type, bool has_default,
                       double def, char *err, size_t err_size)
{
    if (!valid_name(name)) {
        snprintf(err, err_size, "'%.40s' is not a valid scalar name (letters, digits, '_', at most %d)",
                 name, KPT_NAME_MAX - 1);
        return -1;
    }
    if (type != KPT_IR_I32 && type != KPT_IR_F32) {
        snprintf(err, err_size, "runtime scalar '%s' must be i32 or f32", name);
        return -1;
    }
    int i = kpt_pattern_find_scalar(p, name);
    if (i >= 0) {
        kpt_scalar_decl *s = &p->scalars[i];
        if (s->type != type) {
            snprintf(err, err_size, "runtime scalar '$%s' is used as %s here but as %s before",
                     name, kpt_ir_type_name(type), kpt_ir_type_name(s->type));
            return -1;
        }
        if (has_default && s->has_default && s->def != def) {
            snprintf(err, err_size, "runtime scalar '$%s' has two different defaults (%g and %g)",
                     name, s->def, def);
            return -1;
        }
        if (has_default) {
            s->has_default = true;
            s->def = def;
        }
        return i;
    }
    if (p->num_scalars >= KPT_MAX_SCALARS) {
        snprintf(err, err_size, "too many runtime scalars (at most %d)", KPT_MAX_SCALARS);
        return -1;
    }
    kpt_scalar_decl *s = &p->scalars[p->num_scalars];
    memset(s, 0, sizeof(*s));
    strcpy(s->name, name);
    s->type = type;
    s->has_default = has_default;
    s->def = has_default ? def : 0;
    return p->num_scalars++;
}

int kpt_pattern_add_aux(kpt_pattern *p, const kpt_aux_decl *decl, char *err, size_t err_size)
{
    if (!valid_name(decl->name)) {
        snprintf(err, err_size, "'%.40s' is not a valid aux tensor name", decl->name);
        return -1;
    }
    if (kpt_pattern_find_aux(p, decl->name) >= 0) {
        snprintf(err, err_size, "aux tensor '%s' is declared twice", decl->name);
        return -1;
    }
    if (kpt_aux_ir_type(decl->dtype) == KPT_IR_VOID) {
        snprintf(err, err_size, "aux tensor '%s' has an unsupported dtype", decl->name);
        return -1;
    }
    if (decl->rank < 1 || decl->rank > KPT_AUX_MAX_RANK) {
        snprintf(err, err_size, "aux tensor '%s' must have rank 1 to %d, not %d", decl->name,
                 KPT_AUX_MAX_RANK, decl->rank);
        return -1;
    }
    for (int d = 0; d < decl->rank; d++)
        if (decl->dims[d] < KPT_DIM_SKV) {
            snprintf(err, err_size, "aux tensor '%s' has a bad size in dimension %d", decl->name, d);
            return -1;
        }
    if (p->num_aux >= KPT_MAX_AUX) {
        snprintf(err, err_size, "too many aux tensors (at most %d)", KPT_MAX_AUX);
        return -1;
    }
    p->aux[p->num_aux] = *decl;
    p->aux_types[p->num_aux] = (uint8_t)kpt_aux_ir_type(decl->dtype);
    p->num_aux++;
    attach(p);
    return p->num_aux - 1;
}

kpt_ir_ref kpt_rewrite_copy(kpt_ir_graph *ng, const kpt_ir_node *old, const kpt_ir_ref *args)
{
    return kpt_ir_build(ng, (kpt_ir_op)old->op, (kpt_ir_type)old->type, old->imm.bits, old->nargs,
                        args);
}

int kpt_pattern_roots(const kpt_pattern *p, kpt_ir_ref *roots)
{
    int n = 0;
    roots[n++] = p->score;
    roots[n++] = p->mask;
    roots[n++] = p->dscore;
    for (int i = 0; i < p->num_dloads; i++) {
        roots[n++] = p->dloads[i].load;
        roots[n++] = p->dloads[i].deriv;
    }
    return n;
}

static void assign_roots(kpt_pattern *p, const kpt_ir_ref *roots)
{
    p->score = roots[0];
    p->mask = roots[1];
    p->dscore = roots[2];
    for (int i = 0; i < p->num_dloads; i++) {
        p->dloads[i].load = roots[3 + 2 * i];
        p->dloads[i].deriv = roots[4 + 2 * i];
    }
}

/* The roots' types must survive a rewrite: the score and derivatives f32, the mask bool, and a
 * dload's load still a load. */
static bool roots_keep_types(const kpt_ir_graph *g, const kpt_ir_ref *roots, int n)
{
    for (int i = 0; i < n; i++) {
        if (!roots[i])
            continue;
        kpt_ir_type want = i == 1 ? KPT_IR_BOOL : KPT_IR_F32;
        if (kpt_ir_type_of(g, roots[i]) != want)
            return false;
        if (i >= 3 && i % 2 == 1 && kpt_ir_node_get(g, roots[i])->op != KPT_IR_LOAD)
            return false;
    }
    return true;
}

kpt_status kpt_pattern_rewrite(kpt_pattern *p, kpt_rewrite_fn fn, void *ctx, kpt_diag *diag)
{
    kpt_ir_graph ng;
    kpt_ir_graph_init(&ng);
    ng.aux_types = p->aux_types;
    ng.num_aux = (uint32_t)p->num_aux;
    ng.max_nodes = p->g.max_nodes;
    kpt_ir_ref roots[KPT_MAX_ROOTS];
    int nroots = kpt_pattern_roots(p, roots);
    uint32_t n = p->g.count ? p->g.count : 1;
    uint8_t *live = calloc(n, 1);
    kpt_ir_ref *map = calloc(n, sizeof(*map));
    if (!live || !map) {
        free(live);
        free(map);
        return kpt_diag_set(diag, KPT_ERR_NO_MEMORY, "out of memory");
    }
    kpt_ir_mark_live(&p->g, roots, nroots, live);
    for (kpt_ir_ref r = 1; r < p->g.count && !ng.failed; r++) {
        if (!live[r])
            continue;
        const kpt_ir_node *old = &p->g.nodes[r];
        kpt_ir_ref args[KPT_IR_MAX_ARGS] = {0};
        for (int i = 0; i < old->nargs; i++)
            args[i] = map[old->arg[i]];
        map[r] = fn ? fn(&ng, old, args, ctx) : kpt_rewrite_copy(&ng, old, args);
        if (!map[r] && !ng.failed)
            kpt_ir_fail(&ng, "internal: rewrite produced no node for %%%u", r);
    }
    for (int i = 0; i < nroots; i++)
        roots[i] = map[roots[i]];
    free(live);
    free(map);
    if (!ng.failed && !roots_keep_types(&ng, roots, nroots))
        kpt_ir_fail(&ng, "internal: rewrite changed the type of a root");
    if (ng.failed) {
        kpt_status st = ng.out_of_memory ? KPT_ERR_NO_MEMORY
                        : ng.over_limit  ? KPT_ERR_LIMIT
                                         : KPT_ERR_INTERNAL;
        kpt_diag_set(diag, st, "%s", ng.error);
        kpt_ir_graph_free(&ng);
        return st;
    }
    kpt_ir_graph_free(&p->g);
    p->g = ng;
    attach(p);
    assign_roots(p, roots);
    return KPT_OK;
}

kpt_pattern *kpt_pattern_clone(const kpt_pattern *p)
{
    kpt_pattern *c = malloc(sizeof(*c));
    if (!c)
        return NULL;
    *c = *p;
    kpt_ir_graph_init(&c->g);
    c->g.max_nodes = p->g.max_nodes;
    c->name = strdup(p->name ? p->name : "");
    size_t n = p->g.count, t = p->g.table_cap;
    c->g.nodes = n ? malloc(p->g.cap * sizeof(*c->g.nodes)) : NULL;
    c->g.table = t ? malloc(t * sizeof(*c->g.table)) : NULL;
    if (!c->name || (n && !c->g.nodes) || (t && !c->g.table)) {
        kpt_pattern_destroy(&c);
        return NULL;
    }
    if (n)
        memcpy(c->g.nodes, p->g.nodes, n * sizeof(*c->g.nodes));
    if (t)
        memcpy(c->g.table, p->g.table, t * sizeof(*c->g.table));
    c->g.count = p->g.count;
    c->g.cap = p->g.cap;
    c->g.table_cap = p->g.table_cap;
    attach(c);
    return c;
}

bool kpt_pattern_validate(const kpt_pattern *p, char *msg, size_t msg_size)
{
    if (!kpt_ir_validate(&p->g, msg, msg_size))
        return false;
    kpt_ir_ref roots[KPT_MAX_ROOTS];
    int nroots = kpt_pattern_roots(p, roots);
    for (int i = 0; i < nroots; i++)
        if (roots[i] && roots[i] >= p->g.count) {
            snprintf(msg, msg_size, "a root is not a node");
            return false;
        }
    if (!roots_keep_types(&p->g, roots, nroots) && (p->dscore || p->num_dloads)) {
        snprintf(msg, msg_size, "a gradient root has the wrong type");
        return false;
    }
    if (p->score && kpt_ir_type_of(&p->g, p->score) != KPT_IR_F32) {
        snprintf(msg, msg_size, "the score is %s, not f32",
                 kpt_ir_type_name(kpt_ir_type_of(&p->g, p->score)));
        return false;
    }
    if (p->mask && kpt_ir_type_of(&p->g, p->mask) != KPT_IR_BOOL) {
        snprintf(msg, msg_size, "the mask is %s, not bool",
                 kpt_ir_type_name(kpt_ir_type_of(&p->g, p->mask)));
        return false;
    }
    for (kpt_ir_ref r = 1; r < p->g.count; r++) {
        const kpt_ir_node *n = &p->g.nodes[r];
        if (n->op == KPT_IR_SCALAR &&
            (n->imm.index >= (uint32_t)p->num_scalars || p->scalars[n->imm.index].type != n->type)) {
            snprintf(msg, msg_size, "%%%u: scalar %u is undeclared or of another type", r,
                     n->imm.index);
            return false;
        }
        if (n->op == KPT_IR_LOAD && n->nargs != p->aux[n->imm.index].rank) {
            snprintf(msg, msg_size, "%%%u: '%s' has rank %d but is loaded with %d indices", r,
                     p->aux[n->imm.index].name, p->aux[n->imm.index].rank, n->nargs);
            return false;
        }
    }
    return true;
}

/* --- public API ---------------------------------------------------------------------------- */

void kpt_pattern_destroy(kpt_pattern **pp)
{
    if (!pp || !*pp)
        return;
    kpt_pattern *p = *pp;
    kpt_ir_graph_free(&p->g);
    free(p->name);
    free(p);
    *pp = NULL;
}

const char *kpt_pattern_name(const kpt_pattern *p)
{
    return p ? p->name : NULL;
}

int kpt_pattern_has_mask(const kpt_pattern *p)
{
    return p && p->mask != 0;
}

int kpt_pattern_has_score_mod(const kpt_pattern *p)
{
    return p && p->score != 0;
}

int kpt_pattern_scalar_count(const kpt_pattern *p)
{
    return p ? p->num_scalars : 0;
}

kpt_status kpt_pattern_scalar_info(const kpt_pattern *p, int index, kpt_scalar_info *out)
{
    if (!p || !out || index < 0 || index >= p->num_scalars)
        return KPT_ERR_INVALID_ARGUMENT;
    const kpt_scalar_decl *s = &p->scalars[index];
    out->name = s->name;
    out->dtype = s->type == KPT_IR_I32 ? KPT_DTYPE_I32 : KPT_DTYPE_F32;
    out->has_default = s->has_default;
    out->default_value = s->def;
    return KPT_OK;
}

int kpt_pattern_aux_count(const kpt_pattern *p)
{
    return p ? p->num_aux : 0;
}

kpt_status kpt_pattern_aux_info(const kpt_pattern *p, int index, kpt_aux_info *out)
{
    if (!p || !out || index < 0 || index >= p->num_aux)
        return KPT_ERR_INVALID_ARGUMENT;
    const kpt_aux_decl *a = &p->aux[index];
    out->name = a->name;
    out->dtype = a->dtype;
    out->rank = a->rank;
    for (int d = 0; d < KPT_AUX_MAX_RANK; d++)
        out->dims[d] = d < a->rank ? a->dims[d] : 0;
    return KPT_OK;
}

char *kpt_pattern_ir_text(const kpt_pattern *p)
{
    return p ? kpt_pattern_print(p) : NULL;
}

void kpt_free(void *ptr)
{
    free(ptr);
}
