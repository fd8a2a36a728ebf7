/* GLSL -> SPIR-V and validation (see spirv.h).
 *
 * glslang's C interface rather than shaderc: Debian 12's libshaderc.so.1 does not link on its
 * own (it leaves glslang symbols undefined), and the static shaderc_combined drags in a C++
 * wrapper around the same glslang calls. glslang and SPIRV-Tools are linked statically, so
 * libkpt needs neither at run time. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <glslang/Include/glslang_c_interface.h>
#include <glslang/Public/resource_limits_c.h>
#include <glslang/build_info.h>
#include <spirv-tools/libspirv.h>

#include "base/diag.h"
#include "vendor/rtc_glslang.h"

#define KPT_SPIRV_MAGIC 0x5654504bu /* "KPTV" */
#define KPT_SPIRV_FORMAT 1u

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
/* glslang keeps process-wide state (its symbol tables); one compile at a time keeps it safe, and
 * a kernel compiles in milliseconds. */
static pthread_mutex_t compile_lock = PTHREAD_MUTEX_INITIALIZER;

static void init_glslang(void)
{
    glslang_initialize_process();
}

const char *kpt_spirv_compiler(void)
{
#define KPT_STR_(x) #x
#define KPT_STR(x) KPT_STR_(x)
    return "glslang " KPT_STR(GLSLANG_VERSION_MAJOR) "." KPT_STR(GLSLANG_VERSION_MINOR) "."
        KPT_STR(GLSLANG_VERSION_PATCH);
}

/* The first error of a log, on one line, for the diag (the log names generated lines only). */
static kpt_status compile_error(kpt_diag *diag, const char *stage, const char *log)
{
    const char *e = log ? strstr(log, "ERROR") : NULL;
    if (!e)
        e = log ? log : "";
    size_t n = strcspn(e, "\n");
    return kpt_diag_set(diag, KPT_ERR_COMPILE,
                        "GLSL %s failed (a bug in kpt's generated code: please report it): %.*s",
                        stage, (int)(n > 300 ? 300 : n), e);
}

static kpt_status compile_locked(const char *glsl, bool second, uint32_t **words,
                                 size_t *count, kpt_diag *diag)
{
    const glslang_input_t in = {
        .language = GLSLANG_SOURCE_GLSL,
        .stage = GLSLANG_STAGE_COMPUTE,
        .client = GLSLANG_CLIENT_VULKAN,
        .client_version = GLSLANG_TARGET_VULKAN_1_1,
        .target_language = GLSLANG_TARGET_SPV,
        .target_language_version = GLSLANG_TARGET_SPV_1_3,
        .code = glsl,
        .default_version = 450,
        .default_profile = GLSLANG_NO_PROFILE,
        .messages = GLSLANG_MSG_DEFAULT_BIT | GLSLANG_MSG_SPV_RULES_BIT |
                    GLSLANG_MSG_VULKAN_RULES_BIT,
        .resource = glslang_default_resource(),
    };
    glslang_shader_t *sh = glslang_shader_create(&in);
    if (!sh)
        return kpt_diag_set(diag, KPT_ERR_NO_MEMORY, "out of memory (glslang)");
    if (second)
        glslang_shader_set_preamble(sh, "#define KPT_ENTRY_SECOND 1\n");
    kpt_status st = KPT_OK;
    glslang_program_t *prog = NULL;
    if (!glslang_shader_preprocess(sh, &in) || !glslang_shader_parse(sh, &in)) {
        st = compile_error(diag, "compilation", glslang_shader_get_info_log(sh));
    } else if (!(prog = glslang_program_create())) {
        st = kpt_diag_set(diag, KPT_ERR_NO_MEMORY, "out of memory (glslang)");
    } else {
        glslang_program_add_shader(prog, sh);
        if (!glslang_program_link(prog, in.messages))
            st = compile_error(diag, "link", glslang_program_get_info_log(prog));
    }
    if (!st) {
        glslang_program_SPIRV_generate(prog, GLSLANG_STAGE_COMPUTE);
        size_t n = glslang_program_SPIRV_get_size(prog);
        uint32_t *w = n ? malloc(n * sizeof(*w)) : NULL;
        if (!w) {
            st = kpt_diag_set(diag, n ? KPT_ERR_NO_MEMORY : KPT_ERR_COMPILE,
                              n ? "out of memory (SPIR-V)" : "glslang produced no SPIR-V");
        } else {
            glslang_program_SPIRV_get(prog, w);
            *words = w;
            *count = n;
        }
    }
    if (prog)
        glslang_program_delete(prog);
    glslang_shader_delete(sh);
    return st;
}

kpt_status kpt_spirv_validate(const uint32_t *words, size_t count, kpt_diag *diag)
{
    spv_context c = spvContextCreate(SPV_ENV_VULKAN_1_1);
    if (!c)
        return kpt_diag_set(diag, KPT_ERR_NO_MEMORY, "out of memory (SPIRV-Tools)");
    spv_const_binary_t bin = {words, count};
    spv_diagnostic d = NULL;
    spv_result_t r = spvValidate(c, &bin, &d);
    kpt_status st = KPT_OK;
    if (r != SPV_SUCCESS)
        st = kpt_diag_set(diag, KPT_ERR_COMPILE, "SPIR-V validation failed (%d): %.300s", (int)r,
                          d && d->error ? d->error : "no message");
    spvDiagnosticDestroy(d);
    spvContextDestroy(c);
    return st;
}

kpt_status kpt_spirv_compile(const char *glsl, bool second, uint32_t **words, size_t *count,
                             kpt_diag *diag)
{
    *words = NULL;
    *count = 0;
    pthread_once(&init_once, init_glslang);
    pthread_mutex_lock(&compile_lock);
    kpt_status st = compile_locked(glsl, second, words, count, diag);
    pthread_mutex_unlock(&compile_lock);
    if (!st && (st = kpt_spirv_validate(*words, *count, diag))) {
        free(*words);
        *words = NULL;
        *count = 0;
    }
    return st;
}

kpt_status kpt_spirv_build(const char *glsl, bool second, void **binary, size_t *size,
                           kpt_diag *diag)
{
    *binary = NULL;
    *size = 0;
    uint32_t *a = NULL, *m = NULL;
    size_t na = 0, nm = 0;
    kpt_status st = kpt_spirv_compile(glsl, false, &a, &na, diag);
    if (!st && second)
        st = kpt_spirv_compile(glsl, true, &m, &nm, diag);
    uint32_t *out = NULL;
    if (!st && !(out = malloc((4 + na + nm) * sizeof(uint32_t))))
        st = kpt_diag_set(diag, KPT_ERR_NO_MEMORY, "out of memory (SPIR-V)");
    if (!st) {
        out[0] = KPT_SPIRV_MAGIC;
        out[1] = KPT_SPIRV_FORMAT;
        out[2] = (uint32_t)na;
        out[3] = (uint32_t)nm;
        memcpy(out + 4, a, na * sizeof(uint32_t));
        if (nm)
            memcpy(out + 4 + na, m, nm * sizeof(uint32_t));
        *binary = out;
        *size = (4 + na + nm) * sizeof(uint32_t);
    }
    free(a);
    free(m);
    return st;
}

bool kpt_spirv_unpack(const void *binary, size_t size, const uint32_t **attn, size_t *n_attn,
                      const uint32_t **bm, size_t *n_bm)
{
    const uint32_t *w = binary;
    if (!w || size < 16 || size % 4 || ((uintptr_t)w & 3))
        return false;
    size_t n = size / 4;
    if (w[0] != KPT_SPIRV_MAGIC || w[1] != KPT_SPIRV_FORMAT || w[2] == 0 ||
        (uint64_t)w[2] + w[3] != n - 4)
        return false;
    *attn = w + 4;
    *n_attn = w[2];
    *bm = w[3] ? w + 4 + w[2] : NULL;
    *n_bm = w[3];
    return true;
}
