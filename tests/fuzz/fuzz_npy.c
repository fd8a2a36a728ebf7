/* Fuzz target: the .npy reader (kptc check --aux NAME=FILE.npy). Any bytes give an array whose
 * element count matches its shape, or a diagnostic -- no crash, leak, huge allocation or hang. */
#include <stdint.h>
#include <stdlib.h>

#include "base/diag.h"
#include "tools/npy.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

volatile double kpt_fuzz_sink; /* reads the compiler may not drop */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kpt_npy n;
    kpt_diag d = {0};
    if (kpt_npy_parse(data, size, &n, &d) == KPT_OK) {
        int64_t count = 1;
        for (int i = 0; i < n.rank; i++)
            count *= n.shape[i];
        if (count != n.count || n.rank < 0 || n.rank > 4)
            abort();
        for (int64_t i = 0; i < n.count; i++)
            kpt_fuzz_sink = n.values[i]; /* every value is there (ASan sees a short buffer) */
        kpt_npy_free(&n);
    } else if (!d.message[0]) {
        abort();
    }
    return 0;
}
