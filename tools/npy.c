/* .npy reader. The header is a Python dict literal; we accept exactly the keys NumPy writes
 * ('descr', 'fortran_order', 'shape') and check every length against the file's size. */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/diag.h"
#include "base/file.h"
#include "base/numeric.h"
#include "tools/npy.h"

#define NPY_MAX_ELEMS (1LL << 31)
#define NPY_MAX_FILE (1LL << 34)

static const char *find_key(const char *h, size_t n, const char *key)
{
    size_t kl = strlen(key);
    for (size_t i = 0; i + kl <= n; i++)
        if (memcmp(h + i, key, kl) == 0)
            return h + i + kl;
    return NULL;
}

static const char *skip_to_value(const char *p, const char *end)
{
    while (p < end && (*p == ' ' || *p == ':'))
        p++;
    return p;
}

static kpt_status parse_header(const char *h, size_t n, kpt_npy *out, int *elem_size,
                               kpt_diag *diag)
{
    const char *end = h + n;
    const char *d = find_key(h, n, "'descr'");
    const char *f = find_key(h, n, "'fortran_order'");
    const char *s = find_key(h, n, "'shape'");
    if (!d || !f || !s)
        return kpt_diag_set(diag, KPT_ERR_PARSE, "npy header lacks descr, fortran_order or shape");
    d = skip_to_value(d, end);
    if (d >= end || *d != '\'')
        return kpt_diag_set(diag, KPT_ERR_PARSE, "npy header: descr is not a string");
    d++;
    size_t dl = 0;
    while (d + dl < end && d[dl] != '\'' && dl < sizeof(out->descr) - 1)
        dl++;
    if (d + dl >= end || d[dl] != '\'')
        return kpt_diag_set(diag, KPT_ERR_PARSE, "npy header: bad descr");
    memcpy(out->descr, d, dl);
    out->descr[dl] = 0;
    static const struct {
        const char *descr;
        int size;
        bool integral;
    } kinds[] = {{"<i4", 4, true}, {"<i8", 8, true}, {"<f2", 2, false}, {"<f4", 4, false},
                 {"<f8", 8, false}, {"|b1", 1, true}, {"|u1", 1, true}, {"|i1", 1, true}};
    *elem_size = 0;
    for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++)
        if (strcmp(out->descr, kinds[i].descr) == 0) {
            *elem_size = kinds[i].size;
            out->integral = kinds[i].integral;
        }
    if (!*elem_size)
        return kpt_diag_set(diag, KPT_ERR_UNSUPPORTED,
                            "npy dtype '%s' is not supported (int32, int64, float16, float32, "
                            "float64, bool, uint8, int8; little-endian)", out->descr);
    f = skip_to_value(f, end);
    if (end - f >= 4 && memcmp(f, "True", 4) == 0)
        return kpt_diag_set(diag, KPT_ERR_UNSUPPORTED,
                            "npy file is in Fortran order; save it with C order");
    if (end - f < 5 || memcmp(f, "False", 5) != 0)
        return kpt_diag_set(diag, KPT_ERR_PARSE, "npy header: bad fortran_order");
    s = skip_to_value(s, end);
    if (s >= end || *s != '(')
        return kpt_diag_set(diag, KPT_ERR_PARSE, "npy header: shape is not a tuple");
    s++;
    out->rank = 0;
    out->count = 1;
    for (;;) {
        while (s < end && *s == ' ')
            s++;
        if (s < end && *s == ')')
            break;
        if (s >= end || *s < '0' || *s > '9')
            return kpt_diag_set(diag, KPT_ERR_PARSE, "npy header: bad shape");
        int64_t v = 0;
        while (s < end && *s >= '0' && *s <= '9') {
            v = v * 10 + (*s++ - '0');
            if (v > NPY_MAX_ELEMS)
                return kpt_diag_set(diag, KPT_ERR_LIMIT, "npy array is too large");
        }
        if (out->rank == 4)
            return kpt_diag_set(diag, KPT_ERR_UNSUPPORTED, "npy arrays of rank > 4 are not supported");
        out->shape[out->rank++] = v;
        out->count *= v;
        if (out->count > NPY_MAX_ELEMS)
            return kpt_diag_set(diag, KPT_ERR_LIMIT, "npy array is too large");
        while (s < end && *s == ' ')
            s++;
        if (s < end && *s == ',')
            s++;
    }
    return KPT_OK;
}

static double element(const unsigned char *p, const char *descr)
{
    if (strcmp(descr, "<i4") == 0) { int32_t v; memcpy(&v, p, 4); return v; }
    if (strcmp(descr, "<i8") == 0) { int64_t v; memcpy(&v, p, 8); return (double)v; }
    if (strcmp(descr, "<f2") == 0) { uint16_t v; memcpy(&v, p, 2); return kpt_f16_to_f32(v); }
    if (strcmp(descr, "<f4") == 0) { float v; memcpy(&v, p, 4); return v; }
    if (strcmp(descr, "<f8") == 0) { double v; memcpy(&v, p, 8); return v; }
    if (strcmp(descr, "|b1") == 0) return p[0] != 0;
    if (strcmp(descr, "|u1") == 0) return p[0];
    return (int8_t)p[0]; /* |i1 */
}

kpt_status kpt_npy_parse(const void *buf, size_t len, kpt_npy *out, kpt_diag *diag)
{
    memset(out, 0, sizeof(*out));
    const unsigned char *b = buf;
    if (len < 10 || memcmp(b, "\x93NUMPY", 6) != 0)
        return kpt_diag_set(diag, KPT_ERR_PARSE, "not a .npy file (bad magic)");
    int major = b[6];
    size_t hlen, hstart;
    if (major == 1) {
        hlen = (size_t)b[8] | (size_t)b[9] << 8;
        hstart = 10;
    } else if (major == 2 || major == 3) {
        if (len < 12)
            return kpt_diag_set(diag, KPT_ERR_PARSE, "truncated .npy header");
        hlen = (size_t)b[8] | (size_t)b[9] << 8 | (size_t)b[10] << 16 | (size_t)b[11] << 24;
        hstart = 12;
    } else {
        return kpt_diag_set(diag, KPT_ERR_UNSUPPORTED, ".npy format version %d is not supported",
                            major);
    }
    if (hlen > len - hstart)
        return kpt_diag_set(diag, KPT_ERR_PARSE, "truncated .npy header");
    int esize = 0;
    kpt_status st = parse_header((const char *)b + hstart, hlen, out, &esize, diag);
    if (st)
        return st;
    size_t data = hstart + hlen;
    if ((uint64_t)(len - data) != (uint64_t)out->count * (uint64_t)esize)
        return kpt_diag_set(diag, KPT_ERR_PARSE,
                            ".npy data has %zu bytes, but the shape needs %lld", len - data,
                            (long long)(out->count * esize));
    out->values = malloc((size_t)(out->count ? out->count : 1) * sizeof(double));
    if (!out->values)
        return kpt_diag_set(diag, KPT_ERR_NO_MEMORY, "out of memory reading .npy");
    for (int64_t i = 0; i < out->count; i++)
        out->values[i] = element(b + data + (size_t)i * (size_t)esize, out->descr);
    return KPT_OK;
}

kpt_status kpt_npy_load(const char *path, kpt_npy *out, kpt_diag *diag)
{
    memset(out, 0, sizeof(*out));
    long long size = 0; /* from fstat: the file is regular */
    FILE *f = kpt_open_regular(path, "file", &size, diag);
    if (!f)
        return KPT_ERR_IO;
    kpt_status st = KPT_OK;
    unsigned char *buf = NULL;
    if (size > NPY_MAX_FILE) {
        st = kpt_diag_set(diag, KPT_ERR_IO, "cannot read '%s'", path);
    } else if (!(buf = malloc((size_t)size + 1))) {
        st = kpt_diag_set(diag, KPT_ERR_NO_MEMORY, "out of memory reading '%s'", path);
    } else if (fread(buf, 1, (size_t)size, f) != (size_t)size) {
        st = kpt_diag_set(diag, KPT_ERR_IO, "cannot read '%s'", path);
    } else {
        st = kpt_npy_parse(buf, (size_t)size, out, diag);
        if (st && diag) {
            char msg[sizeof(diag->message)];
            snprintf(msg, sizeof(msg), "%.200s: %.800s", path, diag->message);
            memcpy(diag->message, msg, sizeof(msg));
        }
    }
    free(buf);
    fclose(f);
    return st;
}

void kpt_npy_free(kpt_npy *n)
{
    free(n->values);
    memset(n, 0, sizeof(*n));
}

kpt_status kpt_npy_save_f64(const char *path, const double *values, int rank,
                            const int64_t *shape, kpt_diag *diag)
{
    char dict[256];
    int n = snprintf(dict, sizeof(dict), "{'descr': '<f8', 'fortran_order': False, 'shape': (");
    int64_t count = 1;
    for (int i = 0; i < rank; i++) {
        n += snprintf(dict + n, sizeof(dict) - (size_t)n, "%lld,%s", (long long)shape[i],
                      i + 1 < rank ? " " : "");
        count *= shape[i];
    }
    n += snprintf(dict + n, sizeof(dict) - (size_t)n, "), }");
    /* magic (6) + version (2) + length (2) + dict, padded with spaces to 64 bytes, then '\n' */
    size_t total = ((size_t)10 + (size_t)n + 1 + 63) / 64 * 64;
    char header[320];
    memcpy(header, "\x93NUMPY\x01\x00", 8);
    size_t hl = total - 10;
    header[8] = (char)(hl & 0xff);
    header[9] = (char)(hl >> 8);
    memcpy(header + 10, dict, (size_t)n);
    memset(header + 10 + n, ' ', total - 10 - (size_t)n - 1);
    header[total - 1] = '\n';
    FILE *f = fopen(path, "wb");
    if (!f)
        return kpt_diag_set(diag, KPT_ERR_IO, "cannot write %s: %s", path, strerror(errno));
    bool ok = fwrite(header, 1, total, f) == total &&
              fwrite(values, sizeof(double), (size_t)count, f) == (size_t)count;
    ok &= fclose(f) == 0;
    return ok ? KPT_OK : kpt_diag_set(diag, KPT_ERR_IO, "cannot write %s", path);
}
