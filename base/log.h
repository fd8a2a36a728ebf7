/* The context's log: messages go to the application's callback, filtered by level. */
#ifndef KPT_BASE_LOG_H
#define KPT_BASE_LOG_H

#include <kpt/runtime.h>

typedef struct kpt_logger {
    void (*fn)(void *user, kpt_log_level level, const char *message);
    void *user;
    kpt_log_level level; /* resolved: never KPT_LOG_DEFAULT */
} kpt_logger;

/* Formats and sends a message when the logger wants this level. NULL logger: nothing. */
void kpt_log(const kpt_logger *log, kpt_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
