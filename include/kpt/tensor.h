/* kpt — element types and strided tensor views.
 *
 * A kpt_tensor describes memory the caller owns; kpt never frees or retains it beyond a call.
 * Shapes and strides are in elements, not bytes, listed in the logical order the call documents
 * (attention tensors are always [B, H, S, D] logically; a [B, S, H, D] layout is expressed by its
 * strides). A stride of 0 broadcasts a dimension; negative strides are refused (every call
 * that takes tensors says so with KPT_ERR_INVALID_ARGUMENT).
 */
#ifndef KPT_TENSOR_H
#define KPT_TENSOR_H

#include <stdint.h>
#include <kpt/status.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum kpt_dtype {
    KPT_DTYPE_INVALID = 0,
    KPT_DTYPE_F16,  /* IEEE binary16 */
    KPT_DTYPE_BF16, /* bfloat16 */
    KPT_DTYPE_F32,
    KPT_DTYPE_F64,  /* the CPU reference's outputs only */
    KPT_DTYPE_I32,  /* aux tensors */
    KPT_DTYPE_BOOL, /* aux tensors; one byte, nonzero is true */
} kpt_dtype;

#define KPT_TENSOR_MAX_RANK 4

typedef struct kpt_tensor {
    void *data;
    kpt_dtype dtype;
    int rank;
    int64_t shape[KPT_TENSOR_MAX_RANK];
    int64_t stride[KPT_TENSOR_MAX_RANK]; /* in elements */
} kpt_tensor;

/* Size of one element in bytes (0 for KPT_DTYPE_INVALID or an unknown value). */
KPT_API int kpt_dtype_size(kpt_dtype dtype);
/* Lower-case name: "f16", "bf16", "f32", "f64", "i32", "bool"; "invalid" otherwise. */
KPT_API const char *kpt_dtype_name(kpt_dtype dtype);
/* Parses a name as printed by kpt_dtype_name (also "fp16", "fp32", "float32", "int32", ...).
 * Returns KPT_DTYPE_INVALID for anything else. */
KPT_API kpt_dtype kpt_dtype_from_name(const char *name);

/* A contiguous, row-major view: strides computed from the shape. A negative size, or a shape
 * whose element count overflows int64, gives a view of rank 0, which every call rejects. */
KPT_API kpt_tensor kpt_tensor_contiguous(void *data, kpt_dtype dtype, int rank,
                                         const int64_t *shape);

#ifdef __cplusplus
}
#endif
#endif
