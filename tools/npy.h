/* Reading NumPy .npy files (format versions 1-3, little-endian, C order) for aux tensors given
 * to kptc with --aux NAME=FILE.npy. Values are converted to double; the caller converts to the
 * aux tensor's dtype with its own range checks. */
#ifndef KPT_TOOLS_NPY_H
#define KPT_TOOLS_NPY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <kpt/status.h>

typedef struct kpt_npy {
    double *values; /* count elements, C order */
    int64_t count;
    int rank;
    int64_t shape[4];
    char descr[8];  /* as in the file: "<i4", "<f4", "|b1", ... */
    bool integral;  /* the file holds integers or booleans */
} kpt_npy;

/* Parses a whole .npy file held in memory. */
kpt_status kpt_npy_parse(const void *buf, size_t len, kpt_npy *out, kpt_diag *diag);
kpt_status kpt_npy_load(const char *path, kpt_npy *out, kpt_diag *diag);
void kpt_npy_free(kpt_npy *n);

/* Writes values (C order, little-endian doubles) as a version 1.0 .npy file (kptc check --save).
 * rank is 1 to 4. */
kpt_status kpt_npy_save_f64(const char *path, const double *values, int rank,
                            const int64_t *shape, kpt_diag *diag);

#endif
