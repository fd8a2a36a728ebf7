/* A growable string with a sticky failure flag: append freely, check `failed` once at the end. */
#ifndef KPT_BASE_STRBUF_H
#define KPT_BASE_STRBUF_H

#include <stdbool.h>
#include <stddef.h>

typedef struct kpt_strbuf {
    char *data; /* NUL-terminated when len > 0 or after kpt_sb_take */
    size_t len, cap;
    bool failed; /* out of memory: contents are incomplete */
} kpt_strbuf;

void kpt_sb_printf(kpt_strbuf *sb, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void kpt_sb_puts(kpt_strbuf *sb, const char *s);
/* Appends s as a double-quoted string, escaping quotes, backslashes and non-printing bytes. */
void kpt_sb_quoted(kpt_strbuf *sb, const char *s);
/* Returns the malloc'ed string (caller frees) and resets sb; NULL if anything failed. */
char *kpt_sb_take(kpt_strbuf *sb);
void kpt_sb_free(kpt_strbuf *sb);

#endif
