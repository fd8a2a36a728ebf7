/* The template filler (see template.h). */
#include <stdio.h>
#include <string.h>

#include "codegen/template.h"

static bool hole_char(char c)
{
    return (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

bool kpt_template_fill(kpt_strbuf *out, const char *tmpl, const kpt_hole *holes, int nholes,
                       char *err, size_t err_size)
{
    unsigned used[64] = {0};
    if (nholes > 64) {
        snprintf(err, err_size, "template: too many holes (%d)", nholes);
        return false;
    }
    int line = 1;
    const char *s = tmpl;
    while (*s) {
        const char *at = strchr(s, '@');
        const char *stop = at ? at : s + strlen(s);
        for (const char *c = s; c < stop; c++)
            line += *c == '\n';
        if (!at) {
            kpt_sb_puts(out, s);
            break;
        }
        kpt_sb_printf(out, "%.*s", (int)(at - s), s);
        const char *name = at + 1, *e = name;
        while (hole_char(*e))
            e++;
        if (e == name || *e != '@') {
            snprintf(err, err_size, "template line %d: stray '@' (holes are written @NAME@)", line);
            return false;
        }
        int i = 0;
        while (i < nholes && (strlen(holes[i].name) != (size_t)(e - name) ||
                              strncmp(holes[i].name, name, (size_t)(e - name)) != 0))
            i++;
        if (i == nholes) {
            snprintf(err, err_size, "template line %d: hole @%.*s@ is not filled", line,
                     (int)(e - name), name);
            return false;
        }
        used[i]++;
        kpt_sb_puts(out, holes[i].text);
        s = e + 1;
    }
    for (int i = 0; i < nholes; i++)
        if (!used[i]) {
            snprintf(err, err_size, "template has no hole @%s@", holes[i].name);
            return false;
        }
    if (out->failed) {
        snprintf(err, err_size, "out of memory");
        return false;
    }
    return true;
}
