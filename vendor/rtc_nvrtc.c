/* NVRTC through dlopen (see rtc_nvrtc.h). $KPT_NVRTC, when set, names the library (and nothing
 * else is tried: an explicit choice that does not load is an error). Otherwise it is searched for:
 * the sonames libnvrtc.so.13 and .12 on the loader's path, then the same names under $CUDA_HOME,
 * $CUDA_PATH and /usr/local/cuda, in lib64 and targets/x86_64-linux/lib (where the toolkit puts
 * it). The first that loads and has every symbol wins; the outcome is cached for the process. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/diag.h"
#include "base/clock.h"
#include "vendor/rtc_nvrtc.h"

typedef int nvrtcResult;
typedef struct _nvrtcProgram *nvrtcProgram;

static struct {
    void *lib;
    char where[512];   /* the path that loaded, or where we looked */
    nvrtcResult (*Version)(int *, int *);
    const char *(*GetErrorString)(nvrtcResult);
    nvrtcResult (*CreateProgram)(nvrtcProgram *, const char *, const char *, int,
                                 const char *const *, const char *const *);
    nvrtcResult (*DestroyProgram)(nvrtcProgram *);
    nvrtcResult (*CompileProgram)(nvrtcProgram, int, const char *const *);
    nvrtcResult (*GetPTXSize)(nvrtcProgram, size_t *);
    nvrtcResult (*GetPTX)(nvrtcProgram, char *);
    nvrtcResult (*GetCUBINSize)(nvrtcProgram, size_t *);
    nvrtcResult (*GetCUBIN)(nvrtcProgram, char *);
    nvrtcResult (*GetProgramLogSize)(nvrtcProgram, size_t *);
    nvrtcResult (*GetProgramLog)(nvrtcProgram, char *);
} nv;

static pthread_once_t nv_once = PTHREAD_ONCE_INIT;

static bool bind_symbols(void *lib)
{
#define SYM(field, name)                                         \
    do {                                                         \
        *(void **)&nv.field = dlsym(lib, name);                  \
        if (!nv.field)                                           \
            return false;                                        \
    } while (0)
    SYM(Version, "nvrtcVersion");
    SYM(GetErrorString, "nvrtcGetErrorString");
    SYM(CreateProgram, "nvrtcCreateProgram");
    SYM(DestroyProgram, "nvrtcDestroyProgram");
    SYM(CompileProgram, "nvrtcCompileProgram");
    SYM(GetPTXSize, "nvrtcGetPTXSize");
    SYM(GetPTX, "nvrtcGetPTX");
    SYM(GetCUBINSize, "nvrtcGetCUBINSize");
    SYM(GetCUBIN, "nvrtcGetCUBIN");
    SYM(GetProgramLogSize, "nvrtcGetProgramLogSize");
    SYM(GetProgramLog, "nvrtcGetProgramLog");
#undef SYM
    return true;
}

static bool try_load(const char *path)
{
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib)
        return false;
    if (!bind_symbols(lib)) {
        dlclose(lib);
        return false;
    }
    nv.lib = lib;
    snprintf(nv.where, sizeof(nv.where), "%s", path);
    return true;
}

static void load_once(void)
{
    static const char *const names[] = {"libnvrtc.so.13", "libnvrtc.so.12"};
    static const char *const subdirs[] = {"lib64", "targets/x86_64-linux/lib"};
    const char *env = getenv("KPT_NVRTC");
    if (env && *env) { /* an explicit choice: that library or none, never a silent other one */
        if (!try_load(env)) {
            const char *why = dlerror();
            snprintf(nv.where, sizeof(nv.where), "$KPT_NVRTC=%.150s does not load: %.150s", env,
                     why ? why : "it lacks NVRTC's symbols");
        }
        return;
    }
    for (int i = 0; i < 2; i++)
        if (try_load(names[i]))
            return;
    const char *roots[] = {getenv("CUDA_HOME"), getenv("CUDA_PATH"), "/usr/local/cuda"};
    for (int r = 0; r < 3; r++) {
        if (!roots[r] || !*roots[r])
            continue;
        for (int s = 0; s < 2; s++)
            for (int i = 0; i < 2; i++) {
                char path[1024];
                snprintf(path, sizeof(path), "%s/%s/%s", roots[r], subdirs[s], names[i]);
                if (try_load(path))
                    return;
            }
    }
    snprintf(nv.where, sizeof(nv.where),
             "looked for libnvrtc.so.13/.12 in $KPT_NVRTC, the loader path, $CUDA_HOME, "
             "$CUDA_PATH and /usr/local/cuda");
}

static kpt_status ensure_loaded(kpt_diag *diag)
{
    pthread_once(&nv_once, load_once);
    if (!nv.lib)
        return kpt_diag_set(diag, KPT_ERR_NO_DEVICE, "NVRTC not found (%s)", nv.where);
    return KPT_OK;
}

int kpt_nvrtc_version(kpt_diag *diag)
{
    kpt_status st = ensure_loaded(diag);
    if (st)
        return st;
    int major = 0, minor = 0;
    nv.Version(&major, &minor);
    return major * 1000 + minor * 10;
}

void kpt_nvrtc_output_free(kpt_nvrtc_output *out)
{
    free(out->ptx);
    free(out->cubin);
    free(out->log);
    memset(out, 0, sizeof(*out));
}

static char *program_log(nvrtcProgram prog)
{
    size_t n = 0;
    if (nv.GetProgramLogSize(prog, &n) != 0)
        n = 0;
    char *log = calloc(n + 1, 1);
    if (log && n && nv.GetProgramLog(prog, log) != 0)
        log[0] = 0;
    return log;
}

kpt_status kpt_nvrtc_compile(const char *src, int sm, unsigned flags, kpt_nvrtc_output *out,
                             kpt_diag *diag)
{
    memset(out, 0, sizeof(*out));
    kpt_status st = ensure_loaded(diag);
    if (st)
        return st;
    const bool cubin = flags & KPT_NVRTC_CUBIN;
    char arch[64];
    /* compute_XX yields PTX only; sm_XX yields PTX and CUBIN. */
    snprintf(arch, sizeof(arch), "--gpu-architecture=%s_%d%s", cubin ? "sm" : "compute", sm,
             flags & KPT_NVRTC_ARCH_SPECIFIC ? "a" : "");
    const char *opts[5] = {arch, "--std=c++17", "--device-as-default-execution-space"};
    int nopts = 3;
    if (cubin && (flags & KPT_NVRTC_PTXAS_VERBOSE))
        opts[nopts++] = "--ptxas-options=-v";
    if (flags & KPT_NVRTC_PARALLEL)
        opts[nopts++] = "--split-compile=0";
    double t0 = kpt_now_ms();
    nvrtcProgram prog = NULL;
    nvrtcResult r = nv.CreateProgram(&prog, src, "kpt_kernel.cu", 0, NULL, NULL);
    if (r != 0)
        return kpt_diag_set(diag, KPT_ERR_COMPILE, "nvrtcCreateProgram: %s", nv.GetErrorString(r));
    r = nv.CompileProgram(prog, nopts, opts);
    out->log = program_log(prog);
    if (r != 0) {
        st = kpt_diag_set(diag, KPT_ERR_COMPILE, "NVRTC (%s): %s\n%s", arch, nv.GetErrorString(r),
                          out->log ? out->log : "");
        goto done;
    }
    if (nv.GetPTXSize(prog, &out->ptx_size) != 0 || !(out->ptx = malloc(out->ptx_size + 1)) ||
        nv.GetPTX(prog, out->ptx) != 0) {
        st = kpt_diag_set(diag, KPT_ERR_COMPILE, "NVRTC: could not read the PTX");
        goto done;
    }
    out->ptx[out->ptx_size] = 0;
    if (cubin) {
        if (nv.GetCUBINSize(prog, &out->cubin_size) != 0 || out->cubin_size == 0 ||
            !(out->cubin = malloc(out->cubin_size)) || nv.GetCUBIN(prog, out->cubin) != 0) {
            st = kpt_diag_set(diag, KPT_ERR_COMPILE, "NVRTC: could not read the CUBIN");
            goto done;
        }
    }
    out->ms = kpt_now_ms() - t0;
done:
    nv.DestroyProgram(&prog);
    if (st) {
        char *log = out->log;
        out->log = NULL;
        kpt_nvrtc_output_free(out);
        out->log = log;
    }
    return st;
}
