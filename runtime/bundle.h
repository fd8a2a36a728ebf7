/* Kernel bundles: many precompiled kernels in one file, written by `kptc bundle`, preloaded by
 * the runtime so an application compiles nothing at start-up.
 *
 * Layout (integers little-endian):
 *
 *     header, 64 bytes   0 magic "KPTBUNDL"     16 kpt version (16 bytes, NUL-padded)
 *                        8 format version (u32) 32 file size (u64)
 *                       12 entry count (u32)    40 checksum of bytes 64..end (XXH3-64)
 *                                               48 checksum of bytes 0..47
 *     entry table, 128 bytes an entry:
 *                        0 key (16 bytes)       64 description (40 bytes, NUL-padded)
 *                       16 target (16 bytes)   104 payload offset (u64)
 *                       32 compiler (32 bytes) 112 payload size (u64)
 *                                              120 payload checksum (XXH3-64)
 *     payloads.
 *
 * The key is the kernel's bundle key (generated source, target, kpt version): it does not depend
 * on the machine's compiler or driver, so a bundle made on a build machine serves every machine
 * of its target. A reader checks everything before using anything. */
#ifndef KPT_RUNTIME_BUNDLE_H
#define KPT_RUNTIME_BUNDLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <kpt/status.h>

#include "base/hash.h"

#define KPT_BUNDLE_VERSION 1
#define KPT_BUNDLE_HEADER 64
#define KPT_BUNDLE_ENTRY 128

typedef struct kpt_bundle_entry {
    kpt_key key;
    char target[16];
    char compiler[32];
    char description[40];
    const uint8_t *payload;
    size_t size;
} kpt_bundle_entry;

/* A bundle read into memory. */
typedef struct kpt_bundle {
    uint8_t *file;
    size_t file_size;
    int count;
    kpt_bundle_entry *entries;
} kpt_bundle;

/* Reads and checks the bundle at `path` (whole file, every field, every checksum). On failure
 * nothing is kept and diag says what is wrong. */
kpt_status kpt_bundle_read(const char *path, kpt_bundle *out, kpt_diag *diag);
/* The same for a bundle's bytes in memory (copied), named `name` in messages. */
kpt_status kpt_bundle_parse(const char *name, const void *data, size_t size, kpt_bundle *out,
                            kpt_diag *diag);
void kpt_bundle_free(kpt_bundle *b);

/* Writes `count` entries (payload and size taken from each) to `path` through a temp file and a
 * rename. */
kpt_status kpt_bundle_write(const char *path, const kpt_bundle_entry *entries, int count,
                            kpt_diag *diag);

#endif
