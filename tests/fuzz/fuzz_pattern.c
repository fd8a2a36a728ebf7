/* Fuzz target: the pattern-string parser and the pass pipeline behind it. Any input must give a
 * pattern or a diagnostic -- no crash, leak or hang -- and every pattern it accepts must print as
 * IR text that reads back to the same text. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <kpt/kpt.h>

#include "ir/pattern.h"
#include "tests/fuzz/fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = kpt_fuzz_text(data, size);
    if (!text)
        return 0;
    kpt_pattern *p = NULL;
    kpt_diag d;
    if (kpt_pattern_parse(text, &p, &d) == KPT_OK) {
        kpt_fuzz_round_trip(p);
        kpt_pattern_destroy(&p);
    } else if (d.message[0] == 0) {
        abort(); /* every failure says why */
    }
    free(text);
    return 0;
}
