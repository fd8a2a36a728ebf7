/* Kernel bundles (see bundle.h). */
#include <errno.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/diag.h"
#include "base/file.h"
#include "kpt_version.h"
#include "runtime/bundle.h"

#define MAGIC "KPTBUNDL"
#define MAX_BUNDLE_BYTES ((uint64_t)4 << 30)

static bool padded_string(const uint8_t *p, size_t n)
{
    return memchr(p, 0, n) != NULL;
}

static kpt_status read_file(const char *path, uint8_t **data, size_t *size, kpt_diag *diag)
{
    long long fsize = 0;
    FILE *f = kpt_open_regular(path, "bundle", &fsize, diag);
    if (!f)
        return KPT_ERR_IO;
    if (fsize > (long long)MAX_BUNDLE_BYTES) { /* refused before reading a byte */
        fclose(f);
        return kpt_diag_set(diag, KPT_ERR_LIMIT, "bundle '%s' is larger than 4 GiB", path);
    }
    uint8_t *buf = NULL;
    size_t n = 0, cap = 0;
    kpt_status st = KPT_OK;
    for (;;) {
        if (n == cap) {
            if (cap >= MAX_BUNDLE_BYTES) {
                st = kpt_diag_set(diag, KPT_ERR_LIMIT, "bundle '%s' is larger than 4 GiB", path);
                break;
            }
            size_t ncap = cap ? 2 * cap : 65536;
            uint8_t *nb = realloc(buf, ncap);
            if (!nb) {
                st = kpt_diag_set(diag, KPT_ERR_NO_MEMORY, "out of memory reading '%s'", path);
                break;
            }
            buf = nb;
            cap = ncap;
        }
        size_t r = fread(buf + n, 1, cap - n, f);
        n += r;
        if (r == 0) {
            if (ferror(f))
                st = kpt_diag_set(diag, KPT_ERR_IO, "cannot read bundle '%s'", path);
            break;
        }
    }
    fclose(f);
    if (st) {
        free(buf);
        return st;
    }
    *data = buf;
    *size = n;
    return KPT_OK;
}

/* Checks the header and the entry table, filling b->entries. */
static kpt_status parse(const char *path, kpt_bundle *b, kpt_diag *diag)
{
    const uint8_t *h = b->file;
    size_t n = b->file_size;
#define BAD(...) kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT, __VA_ARGS__)
    if (n < KPT_BUNDLE_HEADER || memcmp(h, MAGIC, 8))
        return BAD("'%s' is not a kpt bundle (bad magic or too short)", path);
    if (kpt_get_u64le(h + 48) != kpt_checksum(h, 48))
        return BAD("bundle '%s' is damaged: header checksum mismatch", path);
    uint32_t version = kpt_get_u32le(h + 8);
    if (version != KPT_BUNDLE_VERSION)
        return BAD("bundle '%s' has format version %u; this kpt reads version %d", path,
                   (unsigned)version, KPT_BUNDLE_VERSION);
    if (!padded_string(h + 16, 16) || strcmp((const char *)h + 16, KPT_VERSION_STRING))
        return BAD("bundle '%s' was made by kpt %.15s; this is kpt %s (rebuild it with this "
                   "kptc)", path, (const char *)h + 16, KPT_VERSION_STRING);
    if (kpt_get_u64le(h + 32) != n)
        return BAD("bundle '%s' is damaged: %zu bytes, the header says %llu (truncated?)", path,
                   n, (unsigned long long)kpt_get_u64le(h + 32));
    if (kpt_get_u64le(h + 40) != kpt_checksum(h + KPT_BUNDLE_HEADER, n - KPT_BUNDLE_HEADER))
        return BAD("bundle '%s' is damaged: checksum mismatch", path);
    uint32_t count = kpt_get_u32le(h + 12);
    if (count > (n - KPT_BUNDLE_HEADER) / KPT_BUNDLE_ENTRY)
        return BAD("bundle '%s' is damaged: %u entries do not fit", path, (unsigned)count);
    b->entries = calloc(count ? count : 1, sizeof(*b->entries));
    if (!b->entries)
        return kpt_diag_set(diag, KPT_ERR_NO_MEMORY, "out of memory");
    size_t table_end = KPT_BUNDLE_HEADER + (size_t)count * KPT_BUNDLE_ENTRY;
    for (uint32_t i = 0; i < count; i++) {
        const uint8_t *e = h + KPT_BUNDLE_HEADER + (size_t)i * KPT_BUNDLE_ENTRY;
        kpt_bundle_entry *be = &b->entries[i];
        uint64_t off = kpt_get_u64le(e + 104), size = kpt_get_u64le(e + 112);
        if (!padded_string(e + 16, 16) || !padded_string(e + 32, 32) ||
            !padded_string(e + 64, 40))
            return BAD("bundle '%s' is damaged: entry %u has unterminated strings", path,
                       (unsigned)i);
        if (off < table_end || off > n || size > n - off)
            return BAD("bundle '%s' is damaged: entry %u lies outside the file", path,
                       (unsigned)i);
        if (kpt_get_u64le(e + 120) != kpt_checksum(h + off, size))
            return BAD("bundle '%s' is damaged: entry %u checksum mismatch", path, (unsigned)i);
        memcpy(be->key.b, e, 16);
        memcpy(be->target, e + 16, 16);
        memcpy(be->compiler, e + 32, 32);
        memcpy(be->description, e + 64, 40);
        be->payload = h + off;
        be->size = size;
    }
#undef BAD
    b->count = (int)count;
    return KPT_OK;
}

kpt_status kpt_bundle_read(const char *path, kpt_bundle *out, kpt_diag *diag)
{
    memset(out, 0, sizeof(*out));
    kpt_status st = read_file(path, &out->file, &out->file_size, diag);
    if (!st && (st = parse(path, out, diag)))
        kpt_bundle_free(out);
    return st;
}

kpt_status kpt_bundle_parse(const char *name, const void *data, size_t size, kpt_bundle *out,
                            kpt_diag *diag)
{
    memset(out, 0, sizeof(*out));
    if (size > MAX_BUNDLE_BYTES)
        return kpt_diag_set(diag, KPT_ERR_LIMIT, "bundle '%s' is larger than 4 GiB", name);
    if (!(out->file = malloc(size ? size : 1)))
        return kpt_diag_set(diag, KPT_ERR_NO_MEMORY, "out of memory");
    memcpy(out->file, data, size);
    out->file_size = size;
    kpt_status st = parse(name, out, diag);
    if (st)
        kpt_bundle_free(out);
    return st;
}

void kpt_bundle_free(kpt_bundle *b)
{
    free(b->file);
    free(b->entries);
    memset(b, 0, sizeof(*b));
}

static void put_string(uint8_t *p, size_t n, const char *s)
{
    memset(p, 0, n);
    size_t len = strlen(s);
    memcpy(p, s, len < n - 1 ? len : n - 1);
}

kpt_status kpt_bundle_write(const char *path, const kpt_bundle_entry *entries, int count,
                            kpt_diag *diag)
{
    size_t size = KPT_BUNDLE_HEADER + (size_t)count * KPT_BUNDLE_ENTRY;
    for (int i = 0; i < count; i++)
        size += entries[i].size;
    uint8_t *buf = calloc(1, size);
    if (!buf)
        return kpt_diag_set(diag, KPT_ERR_NO_MEMORY, "out of memory");
    size_t off = KPT_BUNDLE_HEADER + (size_t)count * KPT_BUNDLE_ENTRY;
    for (int i = 0; i < count; i++) {
        uint8_t *e = buf + KPT_BUNDLE_HEADER + (size_t)i * KPT_BUNDLE_ENTRY;
        memcpy(e, entries[i].key.b, 16);
        put_string(e + 16, 16, entries[i].target);
        put_string(e + 32, 32, entries[i].compiler);
        put_string(e + 64, 40, entries[i].description);
        kpt_put_u64le(e + 104, off);
        kpt_put_u64le(e + 112, entries[i].size);
        kpt_put_u64le(e + 120, kpt_checksum(entries[i].payload, entries[i].size));
        memcpy(buf + off, entries[i].payload, entries[i].size);
        off += entries[i].size;
    }
    memcpy(buf, MAGIC, 8);
    kpt_put_u32le(buf + 8, KPT_BUNDLE_VERSION);
    kpt_put_u32le(buf + 12, (uint32_t)count);
    put_string(buf + 16, 16, KPT_VERSION_STRING);
    kpt_put_u64le(buf + 32, size);
    kpt_put_u64le(buf + 40, kpt_checksum(buf + KPT_BUNDLE_HEADER, size - KPT_BUNDLE_HEADER));
    kpt_put_u64le(buf + 48, kpt_checksum(buf, 48));

    char tmp[4096];
    kpt_status st = KPT_OK;
    /* a fresh name made with O_EXCL (mkstemp): a file or symlink someone planted at a
     * predictable temp name is never followed or overwritten */
    if ((size_t)snprintf(tmp, sizeof(tmp), "%s.tmp-XXXXXX", path) >= sizeof(tmp))
        st = kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT, "path too long: '%s'", path);
    int fd = st ? -1 : mkstemp(tmp);
    FILE *f = fd < 0 ? NULL : fdopen(fd, "wb");
    if (fd >= 0 && !f)
        close(fd);
    if (!st && !f)
        st = kpt_diag_set(diag, KPT_ERR_IO, "cannot write '%s': %s", tmp, strerror(errno));
    if (f) {
        bool ok = fwrite(buf, 1, size, f) == size;
        ok = !fclose(f) && ok;
        /* mkstemp makes the file 0600; a bundle is meant to be read by others */
        ok = ok && !chmod(tmp, 0644);
        if (!ok || rename(tmp, path)) {
            st = kpt_diag_set(diag, KPT_ERR_IO, "cannot write '%s': %s", path, strerror(errno));
            unlink(tmp);
        }
    }
    free(buf);
    return st;
}
