/* Fuzz target: disk-cache entries (kpt_disk_cache_get on a file someone else wrote). The input
 * is written at an entry's name in a private directory; its first byte chooses checksums to
 * recompute over the rest (bit 0 the header's, bit 1 the payload's and its size) so mutations
 * reach past them. Any file is a hit with exactly its payload or a miss -- no crash, leak, huge
 * allocation or hang. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/hash.h"
#include "runtime/disk_cache.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char dir[64], path[128];
static kpt_disk_cache *cache;
static kpt_key key;

static void remove_dir(void)
{
    kpt_disk_cache_close(&cache);
    unlink(path);
    rmdir(dir);
}

static void open_cache(void)
{
    snprintf(dir, sizeof(dir), "/tmp/kpt_fuzz_cache_XXXXXX");
    if (!mkdtemp(dir))
        abort();
    cache = kpt_disk_cache_open(dir, (uint64_t)1 << 40, NULL);
    int n = 1;
    kpt_key_part part = {&n, sizeof(n)};
    key = kpt_key_of(&part, 1);
    char name[40];
    kpt_disk_cache_entry_name(&key, name);
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    atexit(remove_dir);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!cache)
        open_cache();
    if (size < 1)
        return 0;
    uint8_t *f = malloc(size);
    if (!f)
        return 0;
    size_t n = size - 1;
    memcpy(f, data + 1, n);
    if (n >= KPT_DISK_CACHE_HEADER && (data[0] & 2)) {
        kpt_put_u64le(f + 32, n - KPT_DISK_CACHE_HEADER);
        kpt_put_u64le(f + 40, kpt_checksum(f + KPT_DISK_CACHE_HEADER, n - KPT_DISK_CACHE_HEADER));
    }
    if (n >= KPT_DISK_CACHE_HEADER && (data[0] & 1))
        kpt_put_u64le(f + 48, kpt_checksum(f, 48));
    FILE *fp = fopen(path, "wb");
    if (!fp || fwrite(f, 1, n, fp) != n || fclose(fp))
        abort();
    void *payload;
    size_t len;
    if (kpt_disk_cache_get(cache, &key, &payload, &len)) {
        if (n < KPT_DISK_CACHE_HEADER || len != n - KPT_DISK_CACHE_HEADER ||
            memcmp(payload, f + KPT_DISK_CACHE_HEADER, len))
            abort(); /* a hit is exactly the file's payload */
        free(payload);
    }
    free(f);
    return 0;
}
