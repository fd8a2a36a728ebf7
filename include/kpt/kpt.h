/* kpt — attention patterns compiled to fused GPU kernels. The umbrella header. */
#ifndef KPT_KPT_H
#define KPT_KPT_H

#include <kpt/status.h>
#include <kpt/tensor.h>
#include <kpt/pattern.h>
#include <kpt/reference.h>
#include <kpt/runtime.h>
#include <kpt/serving.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The library's version, "MAJOR.MINOR.PATCH". */
KPT_API const char *kpt_version(void);

#ifdef __cplusplus
}
#endif
#endif
