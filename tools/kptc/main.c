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
#include "tools/kptc/kptc.h"

int main(int argc, char **argv)
{
    return kptc_main(argc, argv);
}
