/* Filling a kpt_diag: plain messages, and messages about source text that show the offending line
 * with a caret under the column, as compilers do:
 *
 *   pattern:1:8: error: unknown pattern 'sliding_windw'; did you mean 'sliding_window'?
 *     causal+sliding_windw(128)
 *            ^
 */
#ifndef KPT_BASE_DIAG_H
#define KPT_BASE_DIAG_H

#include <stddef.h>

#include <kpt/status.h>

/* Sets status and message (no position). diag may be NULL. Returns status, for tail calls. */
kpt_status kpt_diag_set(kpt_diag *diag, kpt_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Sets status, position and a message about `src` at 1-based (line, column); `origin` names the
 * source ("pattern", a file name). A column of 0 means "the whole line": no caret (Lua reports
 * lines only). Returns status. */
kpt_status kpt_diag_at(kpt_diag *diag, kpt_status status, const char *origin, const char *src,
                       int line, int column, const char *fmt, ...)
    __attribute__((format(printf, 7, 8)));

/* The same for a source of src_len bytes that need not end in a NUL (a Lua script's text). */
kpt_status kpt_diag_at_len(kpt_diag *diag, kpt_status status, const char *origin,
                           const char *src, size_t src_len, int line, int column, const char *fmt,
                           ...) __attribute__((format(printf, 8, 9)));

#endif
