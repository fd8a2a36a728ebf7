/* GLSL source generation (see glsl_source.h). */
#include <stdlib.h>

#include "codegen/emit_c.h"
#include "codegen/glsl_source.h"
#include "codegen/template.h"
#include "base/diag.h"

extern const char kpt_tmpl_glsl_attention[]; /* templates/glsl/attention.comp, embedded */

/* the template spells the serving kernel's bindings as numbers */
_Static_assert(KPT_GLSL_BIND_PAGE_TABLE == 8 && KPT_GLSL_BIND_CU_Q == 9 &&
                   KPT_GLSL_BIND_KV_LENS == 10 && KPT_GLSL_BIND_WORKSPACE == 11,
               "templates/glsl/attention.comp's serving bindings");

static void emit_config(kpt_strbuf *sb, const kpt_pattern *p, const kpt_kernel_plan *pl)
{
    const bool paged = pl->cfg.kind == KPT_KERNEL_PAGED;
    kpt_sb_printf(sb, "// shape class: %s, Dqk %d, Dv %d%s\n", kpt_dtype_name(pl->cfg.dtype),
                  pl->cfg.dqk, pl->cfg.dv, paged ? ", paged" : "");
    kpt_sb_printf(sb, "#define KPT_ENTRY_PAGED %d\n", paged);
    if (paged) /* rows of one workgroup span heads: classify per head? */
        kpt_sb_printf(sb, "#define KPT_MASK_PER_H %d\n#define KPT_MASK_AUX %d\n", pl->bm_per_h,
                      pl->mask_loads);
    kpt_sb_printf(sb, "#define KPT_F16 %d\n", pl->cfg.dtype == KPT_DTYPE_F16);
    kpt_sb_printf(sb, "#define KPT_BF16 %d\n", pl->cfg.dtype == KPT_DTYPE_BF16);
    kpt_sb_printf(sb, "#define KPT_DQK %d\n#define KPT_DV %d\n", pl->cfg.dqk, pl->cfg.dv);
    kpt_sb_printf(sb, "#define KPT_BM %d\n#define KPT_BN %d\n", pl->bm, pl->bn);
    kpt_sb_printf(sb, "#define KPT_HAS_MASK %d\n#define KPT_HAS_SCORE %d\n", pl->has_mask,
                  pl->has_score);
    kpt_sb_printf(sb, "#define KPT_HAS_BLOCKMAP %d\n", pl->has_blockmap);
    kpt_sb_printf(sb, "#define KPT_COOPMAT %d\n", pl->cfg.coopmat);
    kpt_sb_printf(sb, "#define KPT_CH %d\n", kpt_glsl_chunk(pl->cfg.dqk, pl->cfg.dv));
    if (pl->cfg.coopmat)
        kpt_sb_printf(sb, "#define KPT_KV_ELEMS %zu\n",
                      kpt_glsl_coopmat_kv_elems(pl->cfg.dqk, pl->cfg.dv));
    /* GLSL has no empty arrays */
    kpt_sb_printf(sb, "#define KPT_NSCALARS %d\n#define KPT_NAUX %d",
                  p->num_scalars > 0 ? p->num_scalars : 1, p->num_aux > 0 ? p->num_aux : 1);
}

/* The element of aux slot i at element index e (bounds already checked), by dtype: every aux
 * buffer is read as 32-bit words, so no 8- or 16-bit storage feature is needed for them. */
static void emit_aux_read(kpt_strbuf *sb, unsigned i, kpt_dtype t)
{
    switch (t) {
    case KPT_DTYPE_I32:
        kpt_sb_printf(sb, "    return int(kpt_auxb%u.w[(G.aux[%u].off >> 2) + e]);\n", i, i);
        return;
    case KPT_DTYPE_F32:
        kpt_sb_printf(sb, "    return uintBitsToFloat(kpt_auxb%u.w[(G.aux[%u].off >> 2) + e]);\n",
                      i, i);
        return;
    case KPT_DTYPE_F16:
    case KPT_DTYPE_BF16:
        kpt_sb_printf(sb, "    const uint o = G.aux[%u].off + e * 2u;\n", i);
        kpt_sb_printf(sb, "    const uint w = kpt_auxb%u.w[o >> 2] >> ((o & 2u) * 8u);\n", i);
        kpt_sb_puts(sb, t == KPT_DTYPE_F16 ? "    return unpackHalf2x16(w).x;\n"
                                           : "    return uintBitsToFloat((w & 0xffffu) << 16);\n");
        return;
    default: /* bool: one byte */
        kpt_sb_printf(sb, "    const uint o = G.aux[%u].off + e;\n", i);
        kpt_sb_printf(sb, "    return ((kpt_auxb%u.w[o >> 2] >> ((o & 3u) * 8u)) & 0xffu) != 0u;\n",
                      i);
        return;
    }
}

static const char *aux_type(kpt_dtype t)
{
    switch (t) {
    case KPT_DTYPE_I32: return "int";
    case KPT_DTYPE_BOOL: return "bool";
    default: return "float";
    }
}

/* The range of an i32 or bool aux over a box of indices, for the block-map kernel's interval
 * classification (the CUDA template reads it with a warp; here one invocation loops). */
static void emit_iv_load(kpt_strbuf *sb, unsigned i, kpt_dtype t)
{
    kpt_sb_printf(sb, "kpt_iv kpt_iv_load%u(int r, kpt_iv x, kpt_iv y, kpt_iv z, kpt_iv u)\n{\n",
                  i);
    kpt_sb_puts(sb, "    const int64_t nx = x.h - x.l + 1, ny = y.h - y.l + 1, nz = z.h - z.l + 1;\n"
                    "    const int64_t nu = u.h - u.l + 1, lim = KPT_IV_LOAD_MAX;\n"
                    "    if (kpt_lt64(lim, nx) || kpt_lt64(lim, ny) || kpt_lt64(lim, nz) ||\n"
                    "        kpt_lt64(lim, nu) || kpt_lt64(lim, nx * ny * nz * nu))\n");
    kpt_sb_printf(sb, "        return %s;\n",
                  t == KPT_DTYPE_BOOL ? "kpt_iv_anyb()" : "kpt_iv_any()");
    kpt_sb_puts(sb, "    const int n = int(nx * ny * nz * nu), w = int(nx), wy = int(ny), wz = int(nz);\n"
                    "    int lo = KPT_I32_MAX, hi = KPT_I32_MIN;\n"
                    "    for (int e = 0; e < n; e++) {\n"
                    "        const int i0 = int(x.l) + e % w, i1 = int(y.l) + (e / w) % wy;\n"
                    "        const int i2 = int(z.l) + (e / (w * wy)) % wz, i3 = int(u.l) + e / (w * wy * wz);\n");
    kpt_sb_printf(sb, "        const int v = int(kpt_aux%u(r, i0, i1, i2, i3));\n", i);
    kpt_sb_puts(sb, "        lo = min(lo, v);\n        hi = max(hi, v);\n    }\n"
                    "    return kpt_iv_mk(lo, hi);\n}\n");
}

static void emit_aux(kpt_strbuf *sb, const kpt_pattern *p)
{
    if (!p->num_aux)
        kpt_sb_puts(sb, "// no aux tensors");
    for (unsigned i = 0; i < (unsigned)p->num_aux; i++) {
        kpt_dtype t = p->aux[i].dtype;
        kpt_sb_printf(sb, "// aux %u: %s, rank %d\n", i, kpt_dtype_name(t), p->aux[i].rank);
        kpt_sb_printf(sb, "layout(std430, set = 0, binding = %u) readonly buffer kpt_aux_buf%u "
                          "{ uint w[]; } kpt_auxb%u;\n", KPT_GLSL_BIND_AUX0 + i, i, i);
        kpt_sb_printf(sb, "%s kpt_aux%u(int r, int i0, int i1, int i2, int i3)\n{\n", aux_type(t), i);
        kpt_sb_printf(sb, "    uint e;\n    if (!kpt_aux_index(%u, r, i0, i1, i2, i3, e))\n", i);
        kpt_sb_printf(sb, "        return %s;\n",
                      t == KPT_DTYPE_I32 ? "0" : t == KPT_DTYPE_BOOL ? "false" : "0.0");
        emit_aux_read(sb, i, t);
        kpt_sb_puts(sb, "}\n");
        if (t == KPT_DTYPE_I32 || t == KPT_DTYPE_BOOL)
            emit_iv_load(sb, i, t);
    }
}

kpt_status kpt_glsl_source(const kpt_pattern *p, const kpt_kernel_plan *plan,
                           const kpt_c_dialect *d, char **out, kpt_diag *diag)
{
    kpt_strbuf cfg = {0}, aux = {0}, score = {0}, mask = {0}, tile = {0}, src = {0},
               ufields = {0}, uinit = {0};
    emit_config(&cfg, p, plan);
    emit_aux(&aux, p);
    kpt_emit_uniform(&ufields, &uinit, p, d);
    kpt_emit_score_body(&score, p, d);
    kpt_emit_mask_body(&mask, p, d);
    kpt_emit_tile_body(&tile, p, d);
    kpt_status st = KPT_OK;
    char err[256];
    if (cfg.failed || aux.failed || score.failed || mask.failed || tile.failed ||
        ufields.failed || uinit.failed) {
        st = kpt_diag_set(diag, KPT_ERR_NO_MEMORY, "out of memory (GLSL codegen)");
    } else {
        const kpt_hole holes[] = {
            {"CONFIG", cfg.data},          {"AUX", aux.data},
            {"SCORE", score.data},         {"MASK", mask.data},
            {"TILE", tile.data},           {"UNIFORM_FIELDS", ufields.data},
            {"UNIFORM_INIT", uinit.data},
        };
        if (!kpt_template_fill(&src, kpt_tmpl_glsl_attention, holes, 7, err, sizeof(err)))
            st = kpt_diag_set(diag, KPT_ERR_INTERNAL, "GLSL template: %s", err);
    }
    kpt_strbuf *all[] = {&cfg, &aux, &score, &mask, &tile, &ufields, &uinit};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
        kpt_sb_free(all[i]);
    if (st) {
        kpt_sb_free(&src);
        return st;
    }
    *out = kpt_sb_take(&src);
    if (!*out)
        return kpt_diag_set(diag, KPT_ERR_NO_MEMORY, "out of memory (GLSL codegen)");
    return KPT_OK;
}
