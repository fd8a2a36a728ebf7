/* Fuzz target: the pattern-string parser and the pass pipeline behind it. Any input must give a
 * pattern or a diagnostic -- no crash, leak or hang -- and every pattern it accepts must print as
 * IR text that reads back to the same text. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <kpt/kpt.h>

#include "ir/pattern.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    if (!text)
        return 0;
    memcpy(text, data, size);
    text[size] = 0;
    kpt_pattern *p = NULL;
    kpt_diag d;
    if (kpt_pattern_parse(text, &p, &d) == KPT_OK) {
        char *ir = kpt_pattern_print(p);
        kpt_diag rd;
        kpt_pattern *back = ir ? kpt_pattern_read(ir, &rd) : NULL;
        char *again = back ? kpt_pattern_print(back) : NULL;
        if (ir && (!again || strcmp(ir, again) != 0))
            abort(); /* the IR text round trip is broken */
        free(again);
        free(ir);
        kpt_pattern_destroy(&back);
        kpt_pattern_destroy(&p);
    } else if (d.message[0] == 0) {
        abort(); /* every failure says why */
    }
    free(text);
    return 0;
}
