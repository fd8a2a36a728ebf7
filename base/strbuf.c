#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/strbuf.h"

static bool reserve(kpt_strbuf *sb, size_t extra)
{
    if (sb->failed)
        return false;
    if (sb->len + extra + 1 <= sb->cap)
        return true;
    size_t cap = sb->cap ? sb->cap : 256;
    while (cap < sb->len + extra + 1)
        cap *= 2;
    char *d = realloc(sb->data, cap);
    if (!d) {
        sb->failed = true;
        return false;
    }
    sb->data = d;
    sb->cap = cap;
    return true;
}

void kpt_sb_printf(kpt_strbuf *sb, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || !reserve(sb, (size_t)n)) {
        sb->failed = true;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(sb->data + sb->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    sb->len += (size_t)n;
}

void kpt_sb_puts(kpt_strbuf *sb, const char *s)
{
    size_t n = strlen(s);
    if (!reserve(sb, n))
        return;
    memcpy(sb->data + sb->len, s, n + 1);
    sb->len += n;
}

void kpt_sb_quoted(kpt_strbuf *sb, const char *s)
{
    kpt_sb_puts(sb, "\"");
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"' || *c == '\\')
            kpt_sb_printf(sb, "\\%c", *c);
        else if (*c < 0x20 || *c >= 0x7f)
            kpt_sb_printf(sb, "\\x%02x", *c);
        else
            kpt_sb_printf(sb, "%c", *c);
    }
    kpt_sb_puts(sb, "\"");
}

char *kpt_sb_take(kpt_strbuf *sb)
{
    if (!sb->failed && !reserve(sb, 0))
        sb->failed = true;
    if (sb->failed) {
        kpt_sb_free(sb);
        return NULL;
    }
    sb->data[sb->len] = 0;
    char *d = sb->data;
    memset(sb, 0, sizeof(*sb));
    return d;
}

void kpt_sb_free(kpt_strbuf *sb)
{
    free(sb->data);
    memset(sb, 0, sizeof(*sb));
}
