#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/diag.h"
#include "base/strbuf.h"

kpt_status kpt_diag_set(kpt_diag *diag, kpt_status status, const char *fmt, ...)
{
    if (!diag)
        return status;
    diag->status = status;
    diag->line = 0;
    diag->column = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(diag->message, sizeof(diag->message), fmt, ap);
    va_end(ap);
    return status;
}

/* Appends line `line` of src (src_len bytes; it need not end in a NUL), made printable, clipped
 * to a window that contains `column`, and a caret line under it. */
static void show_line(kpt_strbuf *sb, const char *src, size_t src_len, int line, int column)
{
    const char *s = src, *end = src + src_len;
    for (int l = 1; l < line && s; l++) {
        s = memchr(s, '\n', (size_t)(end - s));
        if (s)
            s++;
    }
    if (!s)
        return;
    const char *nl = memchr(s, '\n', (size_t)(end - s));
    size_t len = nl ? (size_t)(nl - s) : (size_t)(end - s);
    enum { WINDOW = 100 };
    size_t start = 0;
    if (column > WINDOW - 20)
        start = (size_t)column - (WINDOW - 20);
    if (start > len)
        start = len;
    size_t stop = len - start > WINDOW ? start + WINDOW : len;
    kpt_sb_puts(sb, "\n  ");
    for (size_t i = start; i < stop; i++) {
        unsigned char c = (unsigned char)s[i];
        kpt_sb_printf(sb, "%c", c == '\t' ? ' ' : (c < 0x20 || c >= 0x7f) ? '?' : (char)c);
    }
    if (column <= 0)
        return;
    kpt_sb_puts(sb, "\n  ");
    for (size_t i = start; (int)i + 1 < column; i++)
        kpt_sb_puts(sb, " ");
    kpt_sb_puts(sb, "^");
}

static kpt_status diag_at(kpt_diag *diag, kpt_status status, const char *origin, const char *src,
                          size_t src_len, int line, int column, const char *fmt, va_list ap)
{
    if (!diag)
        return status;
    char what[512];
    vsnprintf(what, sizeof(what), fmt, ap);
    kpt_strbuf sb = {0};
    if (column > 0)
        kpt_sb_printf(&sb, "%s:%d:%d: error: %s", origin, line, column, what);
    else /* Lua reports lines only: no column, no caret */
        kpt_sb_printf(&sb, "%s:%d: error: %s", origin, line, what);
    if (src && line > 0)
        show_line(&sb, src, src_len, line, column);
    diag->status = status;
    diag->line = line;
    diag->column = column;
    snprintf(diag->message, sizeof(diag->message), "%s", sb.failed || !sb.data ? what : sb.data);
    kpt_sb_free(&sb);
    return status;
}

kpt_status kpt_diag_at(kpt_diag *diag, kpt_status status, const char *origin, const char *src,
                       int line, int column, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    kpt_status st = diag_at(diag, status, origin, src, src ? strlen(src) : 0, line, column, fmt, ap);
    va_end(ap);
    return st;
}

kpt_status kpt_diag_at_len(kpt_diag *diag, kpt_status status, const char *origin,
                           const char *src, size_t src_len, int line, int column, const char *fmt,
                           ...)
{
    va_list ap;
    va_start(ap, fmt);
    kpt_status st = diag_at(diag, status, origin, src, src_len, line, column, fmt, ap);
    va_end(ap);
    return st;
}
