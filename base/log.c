/* The context's log (see log.h). */
#include <stdarg.h>
#include <stdio.h>

#include "base/log.h"

void kpt_log(const kpt_logger *log, kpt_log_level level, const char *fmt, ...)
{
    if (!log || !log->fn || level > log->level)
        return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    log->fn(log->user, level, msg);
}
