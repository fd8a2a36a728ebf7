/* Fuzz target: kptc's command lines. The input is split at newlines into arguments after
 * "kptc"; every command parses and validates them and loads its pattern (kptc_parse_only: no
 * file is written, no data read, nothing compiled or run). Any command line gives an exit
 * status of 0, 1 or 2 -- no crash, leak or hang. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/fuzz/fuzz_util.h"
#include "tools/kptc/kptc.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { MAX_ARGS = 32 };

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 4096)
        return 0;
    char *text = kpt_fuzz_text(data, size);
    if (!text)
        return 0;
    char *argv[MAX_ARGS + 2] = {"kptc"};
    int argc = 1;
    for (char *s = text; argc <= MAX_ARGS; argc++) {
        argv[argc] = s;
        char *nl = strchr(s, '\n');
        if (!nl) {
            argc++;
            break;
        }
        *nl = 0;
        s = nl + 1;
    }
    argv[argc] = NULL;
    kptc_parse_only = true;
    int rc = kptc_main(argc, argv);
    fflush(stdout);
    if (rc < 0 || rc > 2)
        abort();
    free(text);
    return 0;
}
