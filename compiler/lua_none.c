/* The Lua front end's entry points in a build without Lua (meson -Dlua=disabled, or no
 * liblua5.4-dev): scripts are refused with a clear error. kpt's GPU machines build this way when
 * they lack Lua; binaries built where Lua is present link it statically instead. */
#include "compiler/parse_lua.h"
#include "base/diag.h"

#define NO_LUA "this build of kpt has no Lua (built without liblua5.4-dev): Lua pattern scripts "  \
               "are not available"

kpt_pattern *kpt_parse_lua(const char *source, size_t length, const kpt_lua_params *params,
                           kpt_diag *diag)
{
    kpt_diag_set(diag, KPT_ERR_UNSUPPORTED, NO_LUA);
    return NULL;
}

kpt_status kpt_lua_fill_aux(const char *source, size_t length, const kpt_lua_params *params,
                            const char *aux, int rank, const int64_t *shape, uint64_t seed,
                            double *out, kpt_diag *diag)
{
    return kpt_diag_set(diag, KPT_ERR_UNSUPPORTED, NO_LUA);
}

char *kpt_lua_read_file(const char *path, size_t *length, kpt_diag *diag)
{
    kpt_diag_set(diag, KPT_ERR_UNSUPPORTED, NO_LUA);
    return NULL;
}

kpt_status kpt_pattern_from_lua(const char *source, size_t length, const kpt_lua_params *params,
                                kpt_pattern **out, kpt_diag *diag)
{
    if (out)
        *out = NULL;
    return kpt_diag_set(diag, KPT_ERR_UNSUPPORTED, NO_LUA);
}

kpt_status kpt_pattern_from_lua_file(const char *path, const kpt_lua_params *params,
                                     kpt_pattern **out, kpt_diag *diag)
{
    if (out)
        *out = NULL;
    return kpt_diag_set(diag, KPT_ERR_UNSUPPORTED, NO_LUA);
}
