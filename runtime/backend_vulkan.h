/* The Vulkan backend (backend_vulkan.c): what the context and tests need beyond backend.h. */
#ifndef KPT_RUNTIME_BACKEND_VULKAN_H
#define KPT_RUNTIME_BACKEND_VULKAN_H

#include <stdbool.h>

#include "runtime/backend.h"

/* Opens the Vulkan backend: device p->device among those with Vulkan 1.1 and a compute queue,
 * best first (discrete GPUs, integrated, virtual, CPU). With gpu_only, CPU devices (lavapipe)
 * are not counted (the AUTO choice prefers the CPU reference to them). */
kpt_status kpt_backend_vulkan_open(const kpt_context_params *p, bool gpu_only, kpt_backend **out,
                                   kpt_diag *diag);

/* GPU time of the last attention dispatch, from timestamps, in ms (0 when the device has no
 * timestamps; -1 for another backend). */
double kpt_backend_vulkan_last_ms(const kpt_backend *b);

/* What the device offers for matrix products, for reports: "cooperative matrix: none", or the
 * extensions present and the NV extension's shapes ("VK_NV_cooperative_matrix: 16x8x16
 * f16*f16+f16 ..."). "" for another backend or offline. */
const char *kpt_backend_vulkan_matrix_support(const kpt_backend *b);

#endif
