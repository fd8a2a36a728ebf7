#include <stdint.h>
#include <string.h>

#include <kpt/tensor.h>

int kpt_dtype_size(kpt_dtype dtype)
{
    switch (dtype) {
    case KPT_DTYPE_F16:
    case KPT_DTYPE_BF16: return 2;
    case KPT_DTYPE_F32:
    case KPT_DTYPE_I32: return 4;
    case KPT_DTYPE_F64: return 8;
    case KPT_DTYPE_BOOL: return 1;
    default: return 0;
    }
}

static const struct {
    const char *name;
    kpt_dtype dtype;
} names[] = {
    {"f16", KPT_DTYPE_F16},   {"bf16", KPT_DTYPE_BF16},   {"f32", KPT_DTYPE_F32},
    {"f64", KPT_DTYPE_F64},   {"i32", KPT_DTYPE_I32},     {"bool", KPT_DTYPE_BOOL},
    {"fp16", KPT_DTYPE_F16},  {"float16", KPT_DTYPE_F16}, {"half", KPT_DTYPE_F16},
    {"bfloat16", KPT_DTYPE_BF16}, {"fp32", KPT_DTYPE_F32}, {"float32", KPT_DTYPE_F32},
    {"float", KPT_DTYPE_F32}, {"fp64", KPT_DTYPE_F64},    {"float64", KPT_DTYPE_F64},
    {"int32", KPT_DTYPE_I32},
};

const char *kpt_dtype_name(kpt_dtype dtype)
{
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (names[i].dtype == dtype)
            return names[i].name; /* the first entry of each dtype is its canonical name */
    return "invalid";
}

kpt_dtype kpt_dtype_from_name(const char *name)
{
    if (!name)
        return KPT_DTYPE_INVALID;
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (strcmp(names[i].name, name) == 0)
            return names[i].dtype;
    return KPT_DTYPE_INVALID;
}

kpt_tensor kpt_tensor_contiguous(void *data, kpt_dtype dtype, int rank, const int64_t *shape)
{
    kpt_tensor t;
    memset(&t, 0, sizeof(t));
    t.data = data;
    t.dtype = dtype;
    if (rank < 0 || rank > KPT_TENSOR_MAX_RANK || !shape)
        return t; /* rank 0: callers' validation rejects it */
    int64_t stride = 1;
    for (int d = rank - 1; d >= 0; d--) {
        /* a negative size or strides past int64 give rank 0, which validation rejects */
        if (shape[d] < 0 || (shape[d] > 0 && stride > INT64_MAX / shape[d]))
            return t;
        stride *= shape[d];
    }
    t.rank = rank;
    stride = 1;
    for (int d = rank - 1; d >= 0; d--) {
        t.shape[d] = shape[d];
        t.stride[d] = stride;
        stride *= shape[d];
    }
    return t;
}
