/* kptc's command line: the command word, --help and --version, then one command file's
 * function (main.c calls it; the argument fuzz target too). */
#include <stdio.h>
#include <string.h>

#include <kpt/kpt.h>

#include "tools/kptc/kptc.h"

static const struct {
    const char *name;
    int (*run)(int argc, char **argv);
} commands[] = {
    {"patterns", kptc_cmd_patterns},
    {"emit", kptc_cmd_emit},
    {"check", kptc_cmd_check},
    {"bundle", kptc_cmd_bundle},
};

int kptc_main(int argc, char **argv)
{
    if (argc < 2)
        return kptc_usage_error("no command given");
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
        fputs(kptc_usage, stdout);
        return 0;
    }
    if (!strcmp(cmd, "--version")) {
        printf("kptc %s\n", kpt_version());
        return 0;
    }
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        if (!strcmp(cmd, commands[i].name)) {
            int rc = commands[i].run(argc - 1, argv + 1);
            return rc < 0 ? 0 : rc; /* -1: the command printed its --help */
        }
    return kptc_usage_error("unknown command '%s' (patterns, emit, check, bundle)", cmd);
}
