/* kptc bundle: compiles every (target, pattern, dtype, head dims) combination asked for, in
 * parallel through offline runtime contexts, and writes one bundle file (runtime/bundle.h) that
 * applications preload with kpt_context_load_bundle. */
#include <getopt.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/clock.h"
#include "runtime/context.h"
#include "target/target.h"
#include "tools/kptc/kptc.h"

#define MAX_LIST 16

typedef struct bundle_opts {
    const char *out;
    const char *targets[MAX_LIST];
    int ntargets;
    kpt_dtype dtypes[MAX_LIST];
    int ndtypes;
    int dqk[MAX_LIST], dv[MAX_LIST];
    int ndims;
    const char *patterns[KPTC_MAX_PATTERNS];
    int npatterns;
    kpt_param_value params[KPTC_MAX_KV];
    char param_names[KPTC_MAX_KV][KPT_NAME_MAX];
    int nparams;
    int jobs;
    bool dtypes_given;
} bundle_opts;

/* The backend that compiles for a target (the target table's; parse_args checked the name). */
static kpt_backend_kind backend_of(const char *target)
{
    return kpt_target_find(target)->backend;
}

/* Splits a comma list into `items` (pointers into `buf`): the count, or -1 after a usage
 * message. */
static int split(const char *opt, const char *list, char *buf, size_t n, const char **items)
{
    if (snprintf(buf, n, "%s", list) >= (int)n)
        return -!!kptc_usage_error("%s: list too long", opt);
    int count = 0;
    for (char *s = buf, *save = NULL, *tok; (tok = strtok_r(s, ",", &save)); s = NULL) {
        if (count == MAX_LIST)
            return -!!kptc_usage_error("%s: at most %d items", opt, MAX_LIST);
        items[count++] = tok;
    }
    if (!count)
        return -!!kptc_usage_error("%s: empty list", opt);
    return count;
}

static int parse_dims(const char *list, bundle_opts *o)
{
    static char buf[256];
    const char *items[MAX_LIST];
    int n = split("--head-dim", list, buf, sizeof(buf), items);
    if (n < 0)
        return KPTC_EXIT_USAGE;
    for (int i = 0; i < n; i++) {
        char *colon = strchr(items[i], ':');
        int64_t a, b;
        if (colon)
            *colon = 0;
        if (!kptc_parse_int(items[i], 1, 1024, &a) ||
            (colon && !kptc_parse_int(colon + 1, 1, 1024, &b)))
            return kptc_usage_error("--head-dim: '%s' is not D or D:Dv", items[i]);
        o->dqk[i] = (int)a;
        o->dv[i] = colon ? (int)b : (int)a;
    }
    o->ndims = n;
    return 0;
}

static int parse_args(int argc, char **argv, bundle_opts *o)
{
    static const struct option longopts[] = {
        {"output", required_argument, NULL, 'o'},
        {"target", required_argument, NULL, KPTC_OPT_TARGET},
        {"dtype", required_argument, NULL, KPTC_OPT_DTYPE},
        {"head-dim", required_argument, NULL, KPTC_OPT_HEAD_DIM},
        {"jobs", required_argument, NULL, 'j'},
        {"param", required_argument, NULL, KPTC_OPT_PARAM},
        {"help", no_argument, NULL, 'h'},
        {0},
    };
    static kptc_options a;
    static char tbuf[512], dbuf[128];
    memset(&a, 0, sizeof(a)); /* kptc_main may run more than once in a process (fuzzing) */
    int rc = kptc_parse_options(argc, argv, longopts, kptc_usage_bundle, &a);
    if (rc)
        return rc;
    const char *dtypes = a.dtype ? a.dtype : "bf16,f16", *dims = a.head_dim ? a.head_dim : "64,128";
    o->dtypes_given = a.dtype != NULL;
    o->out = a.output;
    o->jobs = (int)sysconf(_SC_NPROCESSORS_ONLN);
    int64_t j;
    if (a.jobs && !kptc_parse_int(a.jobs, 1, 256, &j))
        return kptc_usage_error("-j wants a thread count from 1 to 256, got '%s'", a.jobs);
    if (a.jobs)
        o->jobs = (int)j;
    for (int i = 0; i < a.nparams; i++) {
        rc = kptc_parse_assignment("--param", a.params[i], true, o->param_names[i],
                                   &o->params[i].value);
        if (rc)
            return rc;
        o->params[i].name = o->param_names[i];
    }
    o->nparams = a.nparams;
    memcpy(o->patterns, a.patterns, sizeof(a.patterns));
    o->npatterns = a.npatterns;
    if (!o->out)
        return kptc_usage_error("bundle: -o FILE is required");
    if (!a.target)
        return kptc_usage_error("bundle: --target is required (e.g. cuda:sm_80,cuda:sm_90, "
                                "hip:gfx90a, spirv)");
    if (!o->npatterns)
        return kptc_usage_error("bundle: no PATTERN given");
    int n = split("--target", a.target, tbuf, sizeof(tbuf), o->targets);
    if (n < 0)
        return KPTC_EXIT_USAGE;
    o->ntargets = n;
    char list[256];
    for (int i = 0; i < n; i++)
        if (!kpt_target_find(o->targets[i]))
            return kptc_usage_error("--target '%s': expected %s", o->targets[i],
                                    kpt_target_list(KPT_BACKEND_AUTO, list, sizeof(list)));
    const char *items[MAX_LIST];
    if ((n = split("--dtype", dtypes, dbuf, sizeof(dbuf), items)) < 0)
        return KPTC_EXIT_USAGE;
    for (int i = 0; i < n; i++)
        if ((o->dtypes[i] = kpt_dtype_from_name(items[i])) == KPT_DTYPE_INVALID)
            return kptc_usage_error("--dtype: unknown dtype '%s'", items[i]);
    o->ndtypes = n;
    return parse_dims(dims, o);
}

/* ---- the parallel compile ------------------------------------------------------------------- */

typedef struct job_set {
    const bundle_opts *o;
    kpt_context **ctx;  /* one per target */
    kpt_pattern **pat;
    int total;
    atomic_int next, done;
    atomic_int failed;
    pthread_mutex_t lock; /* the first error and the progress bar */
    /* The failure of the lowest job index, so the message does not depend on thread timing:
     * jobs are taken in index order, so every job below a failed one has started. */
    int first_index;
    kpt_diag first_error;
    bool bar;
} job_set;

static void progress(job_set *js)
{
    int done = atomic_load(&js->done), width = 40, fill = done * width / js->total;
    fprintf(stderr, "\r[%.*s%*s] %d/%d kernels", fill,
            "========================================", width - fill, "", done, js->total);
    if (done == js->total)
        fputc('\n', stderr);
    fflush(stderr);
}

static void *worker(void *arg)
{
    job_set *js = arg;
    const bundle_opts *o = js->o;
    int per_target = o->npatterns * o->ndtypes * o->ndims;
    for (int j; (j = atomic_fetch_add(&js->next, 1)) < js->total && !atomic_load(&js->failed);) {
        int t = j / per_target, r = j % per_target;
        int p = r / (o->ndtypes * o->ndims), d = r % (o->ndtypes * o->ndims);
        kpt_kernel_desc desc = {.dtype = o->dtypes[d / o->ndims], .head_dim = o->dqk[d % o->ndims],
                                .head_dim_v = o->dv[d % o->ndims]};
        /* the default dtypes on Vulkan: f32 in place of bf16, the kernels spirv bundles held
         * before Vulkan took bf16 (give --dtype for bf16 ones) */
        if (!o->dtypes_given && desc.dtype == KPT_DTYPE_BF16 &&
            backend_of(o->targets[t]) == KPT_BACKEND_VULKAN)
            desc.dtype = KPT_DTYPE_F32;
        kpt_kernel *k;
        kpt_diag diag = {0};
        kpt_status st = kpt_kernel_get(js->ctx[t], js->pat[p], &desc, &k, &diag);
        pthread_mutex_lock(&js->lock);
        if (st)
            atomic_store(&js->failed, 1);
        if (st && j < js->first_index) {
            js->first_index = j;
            js->first_error = diag;
            js->first_error.status = st;
            char m[KPT_DIAG_MESSAGE_MAX];
            snprintf(m, sizeof(m), "%.15s, %.60s, %s d%d/%d: %.900s", o->targets[t], o->patterns[p],
                     kpt_dtype_name(desc.dtype), desc.head_dim, desc.head_dim_v, diag.message);
            memcpy(js->first_error.message, m, sizeof(m));
        }
        atomic_fetch_add(&js->done, 1);
        if (js->bar)
            progress(js);
        pthread_mutex_unlock(&js->lock);
    }
    return NULL;
}

static int run_jobs(job_set *js, int jobs)
{
    pthread_t th[256];
    int n = jobs < js->total ? jobs : js->total, started = 0;
    for (; started < n; started++)
        if (pthread_create(&th[started], NULL, worker, js))
            break;
    if (!started)
        worker(js);
    for (int i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    if (atomic_load(&js->failed))
        return kptc_report(&js->first_error, js->first_error.status);
    return 0;
}

/* ---- collecting and writing ------------------------------------------------------------------- */

typedef struct collected {
    kpt_bundle_entry *v;
    int n, cap;
    bool oom;
} collected;

static void collect(void *user, const kpt_bundle_entry *e)
{
    collected *c = user;
    if (c->n == c->cap) {
        int ncap = c->cap ? 2 * c->cap : 64;
        kpt_bundle_entry *nv = realloc(c->v, (size_t)ncap * sizeof(*nv));
        if (!nv) {
            c->oom = true;
            return;
        }
        c->v = nv;
        c->cap = ncap;
    }
    kpt_bundle_entry *d = &c->v[c->n];
    *d = *e;
    void *copy = malloc(e->size ? e->size : 1);
    if (!copy) {
        c->oom = true;
        return;
    }
    memcpy(copy, e->payload, e->size);
    d->payload = copy;
    c->n++;
}

/* Bundles are byte-identical for the same inputs: entries sorted by target and key. */
static int by_target_key(const void *a, const void *b)
{
    const kpt_bundle_entry *x = a, *y = b;
    int c = strcmp(x->target, y->target);
    return c ? c : memcmp(x->key.b, y->key.b, sizeof(x->key.b));
}

static int write_out(const bundle_opts *o, kpt_context **ctx, double t0)
{
    collected c = {0};
    for (int t = 0; t < o->ntargets; t++)
        kpt_context_foreach_binary(ctx[t], collect, &c);
    int rc = 0;
    kpt_diag d = {0};
    if (c.oom) {
        fprintf(stderr, "kptc: out of memory\n");
        rc = 1;
    } else {
        qsort(c.v, (size_t)c.n, sizeof(*c.v), by_target_key);
        kpt_status st = kpt_bundle_write(o->out, c.v, c.n, &d);
        if (st)
            rc = kptc_report(&d, st);
    }
    size_t bytes = 0;
    for (int i = 0; i < c.n; i++) {
        bytes += c.v[i].size;
        free((void *)c.v[i].payload);
    }
    free(c.v);
    if (!rc)
        printf("kptc: wrote %s: %d kernels for %d target%s, %.1f MiB, %.1f s\n", o->out, c.n,
               o->ntargets, o->ntargets > 1 ? "s" : "", (double)bytes / (1 << 20),
               (kpt_now_ms() - t0) / 1e3);
    return rc;
}

static int load_patterns(const bundle_opts *o, kpt_pattern **pat)
{
    for (int i = 0; i < o->npatterns; i++) {
        kpt_diag d = {0};
        kpt_status st;
        if (kptc_is_script(o->patterns[i])) {
            kpt_lua_params lp = {.params = o->params, .num_params = o->nparams};
            st = kpt_pattern_from_lua_file(o->patterns[i], &lp, &pat[i], &d);
        } else {
            st = kpt_pattern_parse(o->patterns[i], &pat[i], &d);
        }
        if (st)
            return kptc_report(&d, st);
    }
    return 0;
}

int kptc_cmd_bundle(int argc, char **argv)
{
    static bundle_opts o;
    memset(&o, 0, sizeof(o));
    int rc = parse_args(argc, argv, &o);
    if (rc)
        return rc;
    double t0 = kpt_now_ms();
    kpt_pattern *pat[KPTC_MAX_PATTERNS] = {0};
    kpt_context *ctx[MAX_LIST] = {0};
    rc = load_patterns(&o, pat);
    for (int t = 0; !rc && !kptc_parse_only && t < o.ntargets; t++) {
        kpt_context_params cp = {.backend = backend_of(o.targets[t]), .target = o.targets[t],
                                 .flags = KPT_CONTEXT_OFFLINE | KPT_CONTEXT_NO_DISK_CACHE};
        kpt_diag d = {0};
        kpt_status st = kpt_context_create(&cp, &ctx[t], &d);
        if (st)
            rc = kptc_report(&d, st);
    }
    if (!rc && !kptc_parse_only) {
        job_set js = {.o = &o, .ctx = ctx, .pat = pat, .first_index = INT_MAX, .bar = isatty(2),
                      .total = o.ntargets * o.npatterns * o.ndtypes * o.ndims};
        pthread_mutex_init(&js.lock, NULL);
        rc = run_jobs(&js, o.jobs);
        pthread_mutex_destroy(&js.lock);
    }
    if (!rc && !kptc_parse_only)
        rc = write_out(&o, ctx, t0);
    for (int t = 0; t < o.ntargets; t++)
        kpt_context_destroy(&ctx[t]);
    for (int i = 0; i < o.npatterns; i++)
        kpt_pattern_destroy(&pat[i]);
    return rc;
}
