/* kptc — kpt's command-line compiler: one file per command (patterns.c, emit.c, check.c,
 * bundle.c), shared helpers in common.c. See docs/kptc.md and kptc(1).
 *
 *   kptc patterns
 *   kptc emit [--emit ir|cuda|ptx|cubin|hip|hsaco|glsl|spirv] [options] PATTERN
 *   kptc check [options] PATTERN
 *   kptc bundle -o FILE --target T[,T...] [options] PATTERN...
 *
 * PATTERN is a built-in pattern string or a Lua script (a path ending in .lua); scripts take
 * --param NAME=VALUE (repeatable) in every command. `kptc COMMAND --help` shows a command's
 * options.
 *
 * Exit status: 0 success, 2 bad input (usage, pattern, files), 1 anything else.
 */
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

int main(int argc, char **argv)
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
