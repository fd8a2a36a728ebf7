/* Stable keys and checksums for the kernel caches and bundles, computed with xxHash (XXH3, from
 * Debian's libxxhash). Keys must not change between runs, processes or machines of one
 * endianness: they name files on disk and entries in bundles. */
#ifndef KPT_BASE_HASH_H
#define KPT_BASE_HASH_H

#include <stddef.h>
#include <stdint.h>

typedef struct kpt_key {
    uint8_t b[16];
} kpt_key;

/* One input of a key. */
typedef struct kpt_key_part {
    const void *data;
    size_t size;
} kpt_key_part;

/* The 128-bit XXH3 of the parts, each prefixed by its length so that no two different lists of
 * parts hash the same bytes. */
kpt_key kpt_key_of(const kpt_key_part *parts, int n);
/* Lower-case hex, 32 characters and a NUL. */
void kpt_key_hex(const kpt_key *key, char out[33]);
int kpt_key_equal(const kpt_key *a, const kpt_key *b);

/* A 64-bit key of n integer words and nbits 32-bit words, for the runtime's memos of a choice
 * per call shape (runtime/cuda_device.c): kpt_key_of over both, never 0 or 1 (a memo keeps its
 * answer in bit 0, and 0 is an empty memo). Not stable across endianness: in-process only. */
uint64_t kpt_key_words(const int64_t *words, int n, const uint32_t *bits, int nbits);

/* 64-bit XXH3 of a buffer: the checksum of cache entries and bundles. */
uint64_t kpt_checksum(const void *data, size_t size);

/* Little-endian fields of the on-disk formats. */
void kpt_put_u32le(uint8_t *p, uint32_t v);
void kpt_put_u64le(uint8_t *p, uint64_t v);
uint32_t kpt_get_u32le(const uint8_t *p);
uint64_t kpt_get_u64le(const uint8_t *p);

#endif
