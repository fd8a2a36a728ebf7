/* hipRTC through dlopen, and the clang route (see hiprtc.h). hipRTC is searched for in
 * $KPT_HIPRTC (a path), then libhiprtc.so.6, libhiprtc.so, libamdhip64.so.5 on the loader's path
 * and under $ROCM_PATH and /opt/rocm (lib). comgr is found the same way ($KPT_COMGR,
 * libamd_comgr.so.2). The outcome is cached for the process. */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/diag.h"
#include "base/clock.h"
#include "vendor/api_hip.h"
#include "vendor/rtc_hiprtc.h"

typedef int hiprtcResult;
typedef struct _hiprtcProgram *hiprtcProgram;

static struct {
    void *lib, *comgr;
    char where[512];
    hiprtcResult (*Version)(int *, int *);
    const char *(*GetErrorString)(hiprtcResult);
    hiprtcResult (*CreateProgram)(hiprtcProgram *, const char *, const char *, int,
                                  const char **, const char **);
    hiprtcResult (*DestroyProgram)(hiprtcProgram *);
    hiprtcResult (*CompileProgram)(hiprtcProgram, int, const char **);
    hiprtcResult (*GetCodeSize)(hiprtcProgram, size_t *);
    hiprtcResult (*GetCode)(hiprtcProgram, char *);
    hiprtcResult (*GetProgramLogSize)(hiprtcProgram, size_t *);
    hiprtcResult (*GetProgramLog)(hiprtcProgram, char *);
    int (*IsaCount)(size_t *);
    int (*IsaName)(size_t, const char **);
} hr;

static pthread_once_t hr_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t hr_lock = PTHREAD_MUTEX_INITIALIZER; /* comgr is not reentrant in 5.x */

static bool bind_symbols(void *lib)
{
#define SYM(field, name)                                         \
    do {                                                         \
        *(void **)&hr.field = dlsym(lib, name);                  \
        if (!hr.field)                                           \
            return false;                                        \
    } while (0)
    SYM(Version, "hiprtcVersion");
    SYM(GetErrorString, "hiprtcGetErrorString");
    SYM(CreateProgram, "hiprtcCreateProgram");
    SYM(DestroyProgram, "hiprtcDestroyProgram");
    SYM(CompileProgram, "hiprtcCompileProgram");
    SYM(GetCodeSize, "hiprtcGetCodeSize");
    SYM(GetCode, "hiprtcGetCode");
    SYM(GetProgramLogSize, "hiprtcGetProgramLogSize");
    SYM(GetProgramLog, "hiprtcGetProgramLog");
#undef SYM
    return true;
}

static void load_once(void)
{
    static const char *const names[] = {"libhiprtc.so.6", "libhiprtc.so", "libamdhip64.so.5"};
    const char *env = getenv("KPT_HIPRTC");
    for (int i = -1; i < 3 && !hr.lib; i++) {
        const char *name = i < 0 ? env : names[i];
        if (!name || !*name)
            continue;
        void *lib = kpt_rocm_dlopen(name);
        if (lib && bind_symbols(lib)) {
            hr.lib = lib;
            snprintf(hr.where, sizeof(hr.where), "%s", name);
        } else if (lib) {
            dlclose(lib);
        }
    }
    if (!hr.lib) {
        snprintf(hr.where, sizeof(hr.where), "looked for libhiprtc.so.6, libhiprtc.so and "
                 "libamdhip64.so.5 in $KPT_HIPRTC, the loader path, $ROCM_PATH/lib and /opt/rocm/lib");
        return;
    }
    const char *cenv = getenv("KPT_COMGR");
    hr.comgr = kpt_rocm_dlopen(cenv && *cenv ? cenv : "libamd_comgr.so.2");
    if (!hr.comgr)
        hr.comgr = kpt_rocm_dlopen("libamd_comgr.so");
    if (hr.comgr) {
        *(void **)&hr.IsaCount = dlsym(hr.comgr, "amd_comgr_get_isa_count");
        *(void **)&hr.IsaName = dlsym(hr.comgr, "amd_comgr_get_isa_name");
    }
}

static kpt_status ensure_loaded(kpt_diag *diag)
{
    pthread_once(&hr_once, load_once);
    if (!hr.lib)
        return kpt_diag_set(diag, KPT_ERR_NO_DEVICE, "hipRTC not found (%s)", hr.where);
    return KPT_OK;
}

int kpt_hiprtc_version(kpt_diag *diag)
{
    kpt_status st = ensure_loaded(diag);
    if (st)
        return st;
    int major = 0, minor = 0;
    hr.Version(&major, &minor);
    return major * 1000 + minor * 10;
}

/* Whether one of comgr's ISA names ("amdgcn-amd-amdhsa--gfx90a", maybe with ":xnack-" and such
 * after it) is exactly `arch`. */
static bool comgr_lists(const char *arch)
{
    size_t n = 0;
    if (!hr.IsaCount || !hr.IsaName || hr.IsaCount(&n) != 0)
        return false;
    const size_t len = strlen(arch);
    for (size_t i = 0; i < n; i++) {
        const char *name = NULL;
        if (hr.IsaName(i, &name) != 0 || !name)
            continue;
        const char *g = strstr(name, "--");
        if (g && !strncmp(g + 2, arch, len) && (g[2 + len] == 0 || g[2 + len] == ':'))
            return true;
    }
    return false;
}

static kpt_status check_arch(const char *arch, kpt_diag *diag)
{
    kpt_status st = ensure_loaded(diag);
    if (st)
        return st;
    if (!hr.IsaCount || !hr.IsaName)
        return kpt_diag_set(diag, KPT_ERR_UNSUPPORTED,
                            "hipRTC found (%s) but not its comgr library (libamd_comgr.so.2), "
                            "which says which archs it can compile", hr.where);
    if (!comgr_lists(arch))
        return kpt_diag_set(diag, KPT_ERR_UNSUPPORTED,
                            "this hipRTC (%s) cannot compile for %s: its comgr does not list it "
                            "(kptc emit compiles such archs with clang)",
                            hr.where, arch);
    return KPT_OK;
}

bool kpt_hiprtc_has_arch(const char *arch, kpt_diag *diag)
{
    return check_arch(arch, diag) == KPT_OK;
}

void kpt_hip_output_free(kpt_hip_output *out)
{
    free(out->code);
    free(out->log);
    memset(out, 0, sizeof(*out));
}

static char *program_log(hiprtcProgram prog)
{
    size_t n = 0;
    if (hr.GetProgramLogSize(prog, &n) != 0)
        n = 0;
    char *log = calloc(n + 1, 1);
    if (log && n && hr.GetProgramLog(prog, log) != 0)
        log[0] = 0;
    return log;
}

kpt_status kpt_hiprtc_compile(const char *src, const char *arch, kpt_hip_output *out,
                              kpt_diag *diag)
{
    memset(out, 0, sizeof(*out));
    kpt_status st = check_arch(arch, diag);
    if (st)
        return st;
    char opt_arch[64];
    snprintf(opt_arch, sizeof(opt_arch), "--offload-arch=%s", arch);
    const char *opts[] = {opt_arch, "-O3", "-std=c++17"};
    double t0 = kpt_now_ms();
    pthread_mutex_lock(&hr_lock);
    hiprtcProgram prog = NULL;
    hiprtcResult r = hr.CreateProgram(&prog, src, "kpt_kernel.hip", 0, NULL, NULL);
    if (r != 0) {
        st = kpt_diag_set(diag, KPT_ERR_COMPILE, "hiprtcCreateProgram: %s", hr.GetErrorString(r));
        goto unlock;
    }
    r = hr.CompileProgram(prog, 3, opts);
    out->log = program_log(prog);
    if (r != 0) {
        st = kpt_diag_set(diag, KPT_ERR_COMPILE, "hipRTC (%s): %s\n%s", arch,
                          hr.GetErrorString(r), out->log ? out->log : "");
    } else if (hr.GetCodeSize(prog, &out->size) != 0 || !out->size ||
               !(out->code = malloc(out->size)) || hr.GetCode(prog, out->code) != 0) {
        st = kpt_diag_set(diag, KPT_ERR_COMPILE, "hipRTC: could not read the code object");
    }
    hr.DestroyProgram(&prog);
unlock:
    pthread_mutex_unlock(&hr_lock);
    out->ms = kpt_now_ms() - t0;
    if (st) {
        char *log = out->log;
        out->log = NULL;
        kpt_hip_output_free(out);
        out->log = log;
    }
    return st;
}

/* ---- the clang route --------------------------------------------------------------------------- */

static char *slurp(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = NULL;
    long n = fseek(f, 0, SEEK_END) ? -1 : ftell(f);
    if (n >= 0 && !fseek(f, 0, SEEK_SET) && (buf = malloc((size_t)n + 1)) &&
        fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) {
        buf[n] = 0;
        *size = (size_t)n;
    }
    return buf;
}

/* Runs argv with stdout and stderr into `log_path`; returns the exit status, or -1. */
static int run_program(char *const argv[], const char *log_path)
{
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        int fd = open(log_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execvp(argv[0], argv);
        _exit(127);
    }
    int ws = 0;
    while (waitpid(pid, &ws, 0) < 0)
        if (errno != EINTR)
            return -1;
    return WIFEXITED(ws) ? WEXITSTATUS(ws) : -1;
}

/* Removes the (empty) directories clang leaves in dir. */
static void remove_empty_dirs(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            char path[1024];
            snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
            rmdir(path);
        }
    closedir(d);
}

kpt_status kpt_hip_clang_compile(const char *src, const char *arch, kpt_hip_output *out,
                                 kpt_diag *diag)
{
    memset(out, 0, sizeof(*out));
    const char *tmp = getenv("TMPDIR");
    char dir[512];
    snprintf(dir, sizeof(dir), "%s/kpt-hip-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir))
        return kpt_diag_set(diag, KPT_ERR_IO, "cannot make a temporary directory in %s: %s",
                            tmp && *tmp ? tmp : "/tmp", strerror(errno));
    char in[600], obj[600], logp[600], opt_arch[64];
    snprintf(in, sizeof(in), "%s/kernel.hip", dir);
    snprintf(obj, sizeof(obj), "%s/kernel.hsaco", dir);
    snprintf(logp, sizeof(logp), "%s/log", dir);
    snprintf(opt_arch, sizeof(opt_arch), "--offload-arch=%s", arch);
    kpt_status st = KPT_OK;
    FILE *f = fopen(in, "w");
    if (!f || fputs(src, f) < 0 || fclose(f)) {
        if (f)
            fclose(f);
        st = kpt_diag_set(diag, KPT_ERR_IO, "cannot write %s", in);
        goto clean;
    }
    const char *env = getenv("KPT_HIP_CLANG");
    const char *cands[] = {env && *env ? env : NULL, "clang++-15", "clang++"};
    char tmpdir[600];
    /* clang's TMPDIR is our directory: each clang HIP compile leaves an empty directory there.
     * `env` sets it for the child only (and exits 127 when clang is not found). */
    snprintf(tmpdir, sizeof(tmpdir), "TMPDIR=%s", dir);
    double t0 = kpt_now_ms();
    int rc = 127;
    const char *used = "clang";
    for (int i = 0; i < 3 && rc == 127; i++) {
        if (!cands[i])
            continue;
        used = cands[i];
        char *argv[] = {"env", tmpdir, (char *)used, "-x", "hip", opt_arch, "--cuda-device-only",
                        "-nogpulib", "-nogpuinc", "--no-gpu-bundle-output", "-O3", "-std=c++17",
                        "-c", in, "-o", obj, NULL};
        rc = run_program(argv, logp);
    }
    out->ms = kpt_now_ms() - t0;
    size_t n = 0;
    out->log = slurp(logp, &n);
    if (rc == 127)
        st = kpt_diag_set(diag, KPT_ERR_NO_DEVICE,
                          "no clang for HIP found (tried $KPT_HIP_CLANG, clang++-15, clang++)");
    else if (rc != 0)
        st = kpt_diag_set(diag, KPT_ERR_COMPILE, "%s (%s): exit %d\n%s", used, arch, rc,
                          out->log ? out->log : "");
    else if (!(out->code = slurp(obj, &out->size)) || !out->size)
        st = kpt_diag_set(diag, KPT_ERR_COMPILE, "%s wrote no code object", used);
clean:
    remove(in);
    remove(obj);
    remove(logp);
    remove_empty_dirs(dir);
    rmdir(dir);
    return st;
}

kpt_status kpt_hip_compile(const char *src, const char *arch, kpt_hip_output *out,
                           kpt_diag *why_not_rtc, kpt_diag *diag)
{
    kpt_diag why = {0};
    if (kpt_hiprtc_has_arch(arch, &why)) {
        kpt_status st = kpt_hiprtc_compile(src, arch, out, diag);
        out->route = "hipRTC";
        return st;
    }
    if (why_not_rtc)
        *why_not_rtc = why;
    kpt_diag cd = {0};
    kpt_status st = kpt_hip_clang_compile(src, arch, out, &cd);
    out->route = "clang";
    if (st)
        kpt_diag_set(diag, st, "%s (hipRTC was not used: %s)", cd.message, why.message);
    return st;
}
