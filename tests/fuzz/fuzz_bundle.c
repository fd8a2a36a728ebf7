/* Fuzz target: kernel bundles (kpt_context_load_bundle's parser). The first input byte chooses
 * which checksums to recompute over the rest (the file), so mutations reach past them: bit 0
 * the header's, bit 1 the payload's, bit 2 every entry's. Any file gives entries that lie
 * inside it, or a diagnostic -- no crash, leak or out-of-range read. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/diag.h"
#include "base/hash.h"
#include "runtime/bundle.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

volatile uint8_t kpt_fuzz_sink; /* reads the compiler may not drop */

static void reseal(uint8_t *f, size_t n, unsigned flags)
{
    if (n < KPT_BUNDLE_HEADER)
        return;
    if (flags & 4) {
        uint32_t count = kpt_get_u32le(f + 12);
        for (uint32_t i = 0; i < count && (size_t)(i + 1) * KPT_BUNDLE_ENTRY <= n - KPT_BUNDLE_HEADER;
             i++) {
            uint8_t *e = f + KPT_BUNDLE_HEADER + (size_t)i * KPT_BUNDLE_ENTRY;
            uint64_t off = kpt_get_u64le(e + 104), len = kpt_get_u64le(e + 112);
            if (off <= n && len <= n - off)
                kpt_put_u64le(e + 120, kpt_checksum(f + off, len));
        }
    }
    if (flags & 2)
        kpt_put_u64le(f + 40, kpt_checksum(f + KPT_BUNDLE_HEADER, n - KPT_BUNDLE_HEADER));
    if (flags & 1) {
        kpt_put_u64le(f + 32, n);
        kpt_put_u64le(f + 48, kpt_checksum(f, 48));
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    uint8_t *f = malloc(size);
    if (!f)
        return 0;
    memcpy(f, data + 1, size - 1);
    reseal(f, size - 1, data[0]);
    kpt_bundle b;
    kpt_diag d = {0};
    if (kpt_bundle_parse("fuzz.kpt", f, size - 1, &b, &d) == KPT_OK) {
        for (int i = 0; i < b.count; i++) {
            const kpt_bundle_entry *e = &b.entries[i];
            if (e->payload < b.file || e->size > b.file_size ||
                (size_t)(e->payload - b.file) > b.file_size - e->size)
                abort();
            for (size_t k = 0; k < e->size; k++)
                kpt_fuzz_sink = e->payload[k];
        }
        kpt_bundle_free(&b);
    } else if (!d.message[0]) {
        abort();
    }
    free(f);
    return 0;
}
