/* kpt — status codes and diagnostics.
 *
 * Every public call returns a kpt_status: KPT_OK (0) or a negative error. Calls that can fail on
 * user input also take an optional `kpt_diag *` (NULL = not wanted) that receives a readable
 * message and, for pattern text, the 1-based line and column of the problem.
 *
 * Thread-safety: kpt_status_string is safe from any thread; a kpt_diag is owned by its caller.
 */
#ifndef KPT_STATUS_H
#define KPT_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

#if defined(KPT_BUILDING)
#define KPT_API __attribute__((visibility("default")))
#else
#define KPT_API
#endif

typedef enum kpt_status {
    KPT_OK = 0,
    KPT_ERR_INVALID_ARGUMENT = -1, /* a NULL, a bad shape, stride or dtype, a bad option */
    KPT_ERR_PARSE = -2,            /* pattern text or IR text could not be parsed */
    KPT_ERR_TYPE = -3,             /* an expression is ill-typed */
    KPT_ERR_UNSUPPORTED = -4,      /* valid, but not supported by this build or target */
    KPT_ERR_NO_MEMORY = -5,
    KPT_ERR_IO = -6,               /* a file could not be read or written */
    KPT_ERR_NOT_FOUND = -7,        /* an unknown name: scalar, aux tensor, pattern */
    KPT_ERR_LIMIT = -8,            /* a size or resource limit was exceeded */
    KPT_ERR_INTERNAL = -9,         /* a bug in kpt: please report it */
    KPT_ERR_NO_DEVICE = -10,       /* no GPU driver, device or run-time compiler library found */
    KPT_ERR_COMPILE = -11,         /* the kernel compiler rejected generated code (log attached) */
    KPT_ERR_DEVICE = -12,          /* a GPU driver call failed (the driver's message attached) */
} kpt_status;

/* A short, static English description of a status ("invalid argument"). Never NULL. */
KPT_API const char *kpt_status_string(kpt_status status);

#define KPT_DIAG_MESSAGE_MAX 1024

/* Where and why a call failed. `message` is one or more lines, NUL-terminated, without a
 * trailing newline; for pattern text it shows the offending line with a caret under `column`. */
typedef struct kpt_diag {
    kpt_status status;
    int line;   /* 1-based, 0 when the error has no source position */
    int column; /* 1-based, 0 when the error has no source position */
    char message[KPT_DIAG_MESSAGE_MAX];
} kpt_diag;

#ifdef __cplusplus
}
#endif
#endif
