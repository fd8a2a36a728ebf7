/* Fuzz target: the IR text reader (kpt_pattern_read: bundles' and caches' keys, kptc emit
 * --emit ir's output read back) and what runs on what it accepts. Any input must give a pattern
 * or a diagnostic; an accepted pattern must print as text that reads back to the same text, and
 * the passes and the CUDA source generator must take it or refuse it with a message -- no
 * crash, leak or hang. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <kpt/kpt.h>

#include "compiler/pipeline.h"
#include "ir/pattern.h"
#include "target/target.h"
#include "tests/fuzz/fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The passes, then every kernel kind's source for sm_80 at head dim 64 and for sm_90a at 128
 * (planning and emission; no NVRTC): the backward's adds the score mod's derivatives
 * (diff_score) and their range (analyze_range), sm_90a's planner its keep bits, dQ staging and
 * the consumers' turns (a score's transcendentals). */
static void generate(kpt_pattern *p)
{
    kpt_diag d = {0};
    if (kpt_pipeline_run(p, NULL, &d) != KPT_OK) {
        if (!d.message[0])
            abort(); /* every failure says why */
        return;
    }
    static const struct {
        const char *target;
        int dim;
    } cfgs[] = {{"cuda:sm_80", 64}, {"cuda:sm_90a", 128}};
    for (size_t t = 0; t < sizeof(cfgs) / sizeof(cfgs[0]); t++)
        for (int kind = KPT_KERNEL_FORWARD; kind < KPT_KERNEL_NUM_KINDS; kind++) {
            const kpt_kernel_request rq = {.kind = (kpt_kernel_kind)kind,
                                           .dtype = KPT_DTYPE_BF16, .dqk = cfgs[t].dim,
                                           .dv = cfgs[t].dim};
            kpt_kernel_plan plan;
            char *src = NULL;
            d.message[0] = 0;
            if (kpt_kernel_generate(kpt_target_find(cfgs[t].target), p, &rq, &plan, &src, &d) !=
                    KPT_OK &&
                !d.message[0])
                abort();
            free(src);
        }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = kpt_fuzz_text(data, size);
    if (!text)
        return 0;
    kpt_diag d = {0};
    kpt_pattern *p = kpt_pattern_read(text, &d);
    if (p) {
        kpt_fuzz_round_trip(p);
        generate(p);
        kpt_pattern_destroy(&p);
    } else if (d.message[0] == 0) {
        abort();
    }
    free(text);
    return 0;
}
