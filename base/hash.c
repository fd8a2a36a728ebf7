/* Keys and checksums (see hash.h). */
#include <string.h>

/* the state on the stack: no allocation, so hashing cannot fail */
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include "base/hash.h"

kpt_key kpt_key_of(const kpt_key_part *parts, int n)
{
    XXH3_state_t st;
    XXH3_INITSTATE(&st);
    XXH3_128bits_reset(&st);
    for (int i = 0; i < n; i++) {
        uint8_t len[8];
        kpt_put_u64le(len, (uint64_t)parts[i].size);
        XXH3_128bits_update(&st, len, sizeof(len));
        if (parts[i].size)
            XXH3_128bits_update(&st, parts[i].data, parts[i].size);
    }
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits_digest(&st));
    kpt_key key;
    memcpy(key.b, c.digest, sizeof(key.b));
    return key;
}

uint64_t kpt_key_words(const int64_t *words, int n, const uint32_t *bits, int nbits)
{
    const kpt_key_part parts[2] = {{words, (size_t)n * sizeof(*words)},
                                   {bits, (size_t)nbits * sizeof(*bits)}};
    const kpt_key k = kpt_key_of(parts, 2);
    uint64_t h;
    memcpy(&h, k.b, sizeof(h));
    return h >> 1 ? h : 2;
}

void kpt_key_hex(const kpt_key *key, char out[33])
{
    static const char hex[] = "0123456789abcdef";
    for (int i = 0; i < 16; i++) {
        out[2 * i] = hex[key->b[i] >> 4];
        out[2 * i + 1] = hex[key->b[i] & 15];
    }
    out[32] = 0;
}

int kpt_key_equal(const kpt_key *a, const kpt_key *b)
{
    return !memcmp(a->b, b->b, sizeof(a->b));
}

uint64_t kpt_checksum(const void *data, size_t size)
{
    return XXH3_64bits(data, size);
}

void kpt_put_u32le(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

void kpt_put_u64le(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

uint32_t kpt_get_u32le(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

uint64_t kpt_get_u64le(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}
