/* The on-disk kernel cache: compiled kernels shared by every process of a user.
 *
 * One file per entry, named by its key (<hex key>.kpt in the cache directory), holding a 64-byte
 * header and the payload:
 *
 *     0  magic "KPTCACHE"       16  key (16 bytes)          40  payload checksum (XXH3-64)
 *     8  format version (u32)   32  payload size (u64)      48  header checksum of bytes 0-47
 *    12  header size (u32)                                  56  reserved (0)
 *
 * (integers little-endian). Entries are written to a temporary file in the same directory,
 * flushed and renamed over the final name, so readers see a whole entry or none, whatever
 * happens to the writer. An entry whose magic, version, key, size or checksums do not match is
 * logged and treated as a miss; the recompiled kernel replaces it. The header and the file's
 * size are checked before the payload is read, and entries are opened with O_NOFOLLOW and
 * O_NONBLOCK, so a symlink, a FIFO or a huge file planted at an entry's name is a miss, never a
 * hang or a huge read. Hits refresh the file's modification time; when the directory outgrows
 * its cap the least recently used entries are removed, and only names of the cache's own
 * format are ever removed.
 *
 * Thread-safety: all calls are safe from any thread, and from several processes sharing one
 * directory. */
#ifndef KPT_RUNTIME_DISK_CACHE_H
#define KPT_RUNTIME_DISK_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/hash.h"
#include "base/log.h"

#define KPT_DISK_CACHE_VERSION 1
#define KPT_DISK_CACHE_HEADER 64
#define KPT_DISK_CACHE_MAX_ENTRY ((uint64_t)1 << 30) /* payload bytes; larger files are misses */

typedef struct kpt_disk_cache kpt_disk_cache;

/* Opens (creating, mode 0700) the cache in `dir`. When the directory cannot be created or
 * written, logs one warning and returns NULL: the caller runs without a disk cache. `log` must
 * outlive the cache. */
kpt_disk_cache *kpt_disk_cache_open(const char *dir, uint64_t max_bytes, const kpt_logger *log);
void kpt_disk_cache_close(kpt_disk_cache **cache);

/* Reads the entry of `key`. On a hit returns true with a malloc'ed payload the caller frees. */
bool kpt_disk_cache_get(kpt_disk_cache *cache, const kpt_key *key, void **data, size_t *size);
/* Stores an entry (failures are logged, never fatal), then evicts down to the cap. */
void kpt_disk_cache_put(kpt_disk_cache *cache, const kpt_key *key, const void *data, size_t size);

/* The default directory: $KPT_CACHE_DIR, else $XDG_CACHE_HOME/kpt, else $HOME/.cache/kpt.
 * Writes at most `n` bytes; returns false when none can be formed. */
bool kpt_disk_cache_default_dir(char *out, size_t n);

/* The entry's file name in the cache directory (tests use it). */
void kpt_disk_cache_entry_name(const kpt_key *key, char out[40]);

#endif
