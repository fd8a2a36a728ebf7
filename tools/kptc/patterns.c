/* kptc patterns: the built-in terms, from the table every part of kpt shares. */
#include <getopt.h>
#include <stdio.h>

#include "compiler/builtins.h"
#include "tools/kptc/kptc.h"

int kptc_cmd_patterns(int argc, char **argv)
{
    static const struct option longopts[] = {{"help", no_argument, NULL, 'h'}, {0}};
    kptc_options o = {0};
    int rc = kptc_parse_options(argc, argv, longopts, kptc_usage_patterns, &o);
    if (rc)
        return rc;
    if (o.npatterns)
        return kptc_usage_error("patterns takes no arguments");
    for (int i = 0; i < kpt_builtin_count(); i++) {
        const kpt_builtin_info *b = kpt_builtin_get(i);
        printf("%-22s %s\n", b->signature, b->meaning);
    }
    printf("\nCompose with '+' (masks AND, score mods apply left to right); write $name (or\n"
           "$name=default) for a runtime scalar argument. Example: document+causal+softcap(30)\n");
    return 0;
}

