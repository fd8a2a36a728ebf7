/* Linking Debian's static Lua into shared objects (libkpt.so, the benchmark's ctypes library).
 *
 * liblua5.4.a is compiled as position-independent *executable* code, not as shared-library
 * code: it reaches the C library's stdin, stdout and stderr with PC-relative relocations that
 * only an executable can satisfy (through copy relocations). The linker refuses them in a
 * shared object. This file, linked only into shared objects, gives those three names local
 * (hidden) definitions, filled with the C library's streams when the object is loaded, so the
 * relocations resolve inside the object. Lua uses them only in paths kpt never takes (reading
 * script files from stdin, the default print, the panic and warning writers); kpt's own code
 * writes nothing. Executables link liblua5.4.a directly and do not use this file.
 * The version script (kpt.map) keeps every symbol but kpt's API local, Lua's included, so an
 * application's own Lua never collides with ours.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>

#undef stdin
#undef stdout
#undef stderr

__attribute__((visibility("hidden"))) FILE *stdin, *stdout, *stderr;

__attribute__((constructor)) static void kpt_lua_link_streams(void)
{
    FILE **f;
    if ((f = dlsym(RTLD_DEFAULT, "stdin")))
        stdin = *f;
    if ((f = dlsym(RTLD_DEFAULT, "stdout")))
        stdout = *f;
    if ((f = dlsym(RTLD_DEFAULT, "stderr")))
        stderr = *f;
}
