/* One context shared by 16 threads: concurrent requests for the same kernel compile it once (the
 * others wait and get the same kernel), different kernels compile in parallel, and launches from
 * many threads at once are safe. With NVRTC the kernels are real offline CUDA compiles; without
 * it the CPU backend stands in. CI also runs this under ThreadSanitizer. */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <kpt/kpt.h>

#include "vendor/rtc_nvrtc.h"

enum { THREADS = 16, KINDS = 2 };

typedef struct shared {
    kpt_context *ctx;
    kpt_pattern *p;
    kpt_dtype dtype;
    pthread_barrier_t start;
    kpt_kernel *got[THREADS][KINDS];
    kpt_status st[THREADS];
} shared;

typedef struct slot {
    shared *sh;
    int id;
} slot;

static void *requester(void *arg)
{
    slot *sl = arg;
    shared *sh = sl->sh;
    pthread_barrier_wait(&sh->start);
    for (int i = 0; i < KINDS; i++) {
        int kind = (sl->id + i) % KINDS; /* half the threads ask in the other order */
        kpt_kernel_desc desc = {.dtype = sh->dtype, .head_dim = kind ? 128 : 64};
        kpt_status st = kpt_kernel_get(sh->ctx, sh->p, &desc, &sh->got[sl->id][kind], NULL);
        if (st)
            sh->st[sl->id] = st;
    }
    return NULL;
}

static void run_requests(shared *sh)
{
    pthread_t th[THREADS];
    slot sl[THREADS];
    pthread_barrier_init(&sh->start, NULL, THREADS);
    for (int i = 0; i < THREADS; i++) {
        sl[i] = (slot){sh, i};
        assert_int_equal(pthread_create(&th[i], NULL, requester, &sl[i]), 0);
    }
    for (int i = 0; i < THREADS; i++)
        pthread_join(th[i], NULL);
    pthread_barrier_destroy(&sh->start);
}

static void check_requests(shared *sh, bool compiles)
{
    for (int i = 0; i < THREADS; i++) {
        assert_int_equal(sh->st[i], KPT_OK);
        for (int kind = 0; kind < KINDS; kind++)
            assert_ptr_equal(sh->got[i][kind], sh->got[0][kind]);
    }
    assert_ptr_not_equal(sh->got[0][0], sh->got[0][1]);
    kpt_stats s;
    kpt_context_get_stats(sh->ctx, &s);
    assert_int_equal(s.requests, THREADS * KINDS);
    assert_int_equal(s.memory_hits, THREADS * KINDS - KINDS);
    assert_int_equal(s.compiles, compiles ? KINDS : 0);
    assert_int_equal(s.failures, 0);
}

static void test_offline_compile_once(void **state)
{
    (void)state;
    if (kpt_nvrtc_version(NULL) <= 0) {
        print_message("NVRTC not found, skipping\n");
        skip();
    }
    static shared sh;
    kpt_context_params cp = {.backend = KPT_BACKEND_CUDA, .target = "cuda:sm_80",
                             .flags = KPT_CONTEXT_OFFLINE | KPT_CONTEXT_NO_DISK_CACHE};
    assert_int_equal(kpt_context_create(&cp, &sh.ctx, NULL), KPT_OK);
    assert_int_equal(kpt_pattern_parse("causal+alibi", &sh.p, NULL), KPT_OK);
    sh.dtype = KPT_DTYPE_BF16;
    run_requests(&sh);
    check_requests(&sh, true);
    kpt_pattern_destroy(&sh.p);
    kpt_context_destroy(&sh.ctx);
}

enum { B = 1, H = 2, S = 19 };

typedef struct launch_job {
    kpt_kernel *k;
    float q[B * H * S * 64], kv[B * H * S * 64], o[B * H * S * 64];
    kpt_status st;
} launch_job;

static void *launcher(void *arg)
{
    launch_job *j = arg;
    int64_t shape[4] = {B, H, S, 64};
    kpt_attention_args a = {
        .q = kpt_tensor_contiguous(j->q, KPT_DTYPE_F32, 4, shape),
        .k = kpt_tensor_contiguous(j->kv, KPT_DTYPE_F32, 4, shape),
        .v = kpt_tensor_contiguous(j->kv, KPT_DTYPE_F32, 4, shape),
        .o = kpt_tensor_contiguous(j->o, KPT_DTYPE_F32, 4, shape),
    };
    for (int rep = 0; rep < 4 && !j->st; rep++)
        j->st = kpt_kernel_launch(j->k, &a, NULL, NULL, NULL);
    return NULL;
}

static void test_cpu_requests_and_launches(void **state)
{
    (void)state;
    static shared sh;
    kpt_context_params cp = {.backend = KPT_BACKEND_CPU};
    assert_int_equal(kpt_context_create(&cp, &sh.ctx, NULL), KPT_OK);
    assert_int_equal(kpt_pattern_parse("causal+alibi", &sh.p, NULL), KPT_OK);
    sh.dtype = KPT_DTYPE_F32;
    run_requests(&sh);
    check_requests(&sh, false);
    /* every thread launches the one kernel on its own data; results match thread 0's inputs */
    static launch_job jobs[THREADS];
    pthread_t th[THREADS];
    for (int i = 0; i < THREADS; i++) {
        jobs[i].k = sh.got[0][0];
        for (int e = 0; e < B * H * S * 64; e++) {
            jobs[i].q[e] = (float)sin(e * 0.37);
            jobs[i].kv[e] = (float)cos(e * 0.11);
            jobs[i].o[e] = NAN;
        }
        assert_int_equal(pthread_create(&th[i], NULL, launcher, &jobs[i]), 0);
    }
    for (int i = 0; i < THREADS; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < THREADS; i++) {
        assert_int_equal(jobs[i].st, KPT_OK);
        assert_memory_equal(jobs[i].o, jobs[0].o, sizeof(jobs[0].o));
    }
    assert_false(isnan(jobs[0].o[0]));
    kpt_pattern_destroy(&sh.p);
    kpt_context_destroy(&sh.ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_offline_compile_once),
        cmocka_unit_test(test_cpu_requests_and_launches),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
