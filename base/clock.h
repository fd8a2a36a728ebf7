/* A monotonic clock in milliseconds, for the compile and load timings the backends report. */
#ifndef KPT_BASE_CLOCK_H
#define KPT_BASE_CLOCK_H

#include <time.h>

static inline double kpt_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

#endif
