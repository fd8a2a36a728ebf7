/* Fuzz target: the Lua front end and its sandbox. Any input -- valid scripts, broken ones,
 * hostile ones -- must give a pattern or a diagnostic with no crash, leak or hang. The limits
 * are small so each run stays short. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <kpt/kpt.h>

#include "ir/pattern.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kpt_lua_params prm = {.name = "fuzz.lua", .max_memory = 16 << 20,
                          .max_instructions = 2000000};
    kpt_pattern *p = NULL;
    kpt_diag d;
    if (kpt_pattern_from_lua((const char *)data, size, &prm, &p, &d) == KPT_OK) {
        char *ir = kpt_pattern_print(p);
        free(ir);
        kpt_pattern_destroy(&p);
    } else if (d.message[0] == 0) {
        abort(); /* every failure says why */
    }
    return 0;
}
