/* kpt demo: compile a few patterns with the public API and draw their masks.
 *
 * It uses only <kpt/kpt.h>: patterns are parsed from strings, and the CPU reference attention is
 * run with all-zero queries and keys (so every kept key gets the same score) and V = identity, so
 * O[q][k] is exactly the softmax weight of key k for query q: nonzero where the mask keeps (q, k).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kpt/kpt.h>

enum { S = 16 };

static int draw(const char *text, const kpt_scalar_value *scalars, int nscalars)
{
    kpt_pattern *p = NULL;
    kpt_diag diag;
    kpt_status st = kpt_pattern_parse(text, &p, &diag);
    if (st != KPT_OK) {
        fprintf(stderr, "%s\n", diag.message);
        return 1;
    }
    static double zeros[S * S], eye[S * S], o[S * S], lse[S];
    memset(zeros, 0, sizeof(zeros));
    for (int i = 0; i < S * S; i++)
        eye[i] = i / S == i % S;
    int32_t doc[S];
    for (int i = 0; i < S; i++)
        doc[i] = i < 5 ? 0 : i < 12 ? 1 : 2; /* three documents: 5, 7 and 4 tokens */
    int64_t shape[4] = {1, 1, S, S};
    kpt_aux_tensor aux[2] = {
        {"doc_q", kpt_tensor_contiguous(doc, KPT_DTYPE_I32, 2, (int64_t[]){1, S})},
        {"doc_kv", kpt_tensor_contiguous(doc, KPT_DTYPE_I32, 2, (int64_t[]){1, S})},
    };
    kpt_attention_args args = {
        .q = kpt_tensor_contiguous(zeros, KPT_DTYPE_F64, 4, shape),
        .k = kpt_tensor_contiguous(zeros, KPT_DTYPE_F64, 4, shape),
        .v = kpt_tensor_contiguous(eye, KPT_DTYPE_F64, 4, shape),
        .o = kpt_tensor_contiguous(o, KPT_DTYPE_F64, 4, shape),
        .lse = kpt_tensor_contiguous(lse, KPT_DTYPE_F64, 3, (int64_t[]){1, 1, S}),
        .scalars = scalars,
        .num_scalars = nscalars,
        .aux = aux,
        .num_aux = kpt_pattern_aux_count(p),
    };
    st = kpt_reference_attention(p, &args, &diag);
    if (st != KPT_OK) {
        fprintf(stderr, "%s: %s\n", text, diag.message);
        kpt_pattern_destroy(&p);
        return 1;
    }
    printf("%s", kpt_pattern_name(p));
    for (int i = 0; i < nscalars; i++)
        printf("  ($%s = %g)", scalars[i].name, scalars[i].value);
    printf("\n");
    for (int q = 0; q < S; q++) {
        printf("  ");
        for (int k = 0; k < S; k++)
            fputs(o[q * S + k] > 0 ? "#" : ".", stdout);
        printf("\n");
    }
    printf("\n");
    kpt_pattern_destroy(&p);
    return 0;
}

int main(void)
{
    printf("kpt %s: masks of built-in patterns, %dx%d (rows: queries, columns: keys)\n\n",
           kpt_version(), S, S);
    kpt_scalar_value w = {"w", 3};
    int bad = draw("causal", NULL, 0) | draw("sliding_window($w)", &w, 1) |
              draw("prefix_lm(6)", NULL, 0) | draw("chunked(4)", NULL, 0) |
              draw("document+causal", NULL, 0);
    /* errors point at the column */
    kpt_pattern *p = NULL;
    kpt_diag diag;
    if (kpt_pattern_parse("causal+sliding_windw(128)", &p, &diag) != KPT_OK)
        printf("a typo gives:\n%s\n", diag.message);
    return bad;
}
