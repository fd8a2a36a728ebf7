/* GLSL -> SPIR-V in process (glslang's C interface, linked statically) and validation with
 * SPIRV-Tools (spvValidate) before any pipeline sees a module. Works without a GPU: CI compiles
 * and validates every pattern this way. Thread-safe.
 *
 * A Vulkan kernel's binary holds two modules: the attention kernel and, for masks that read aux
 * tensors, the block-map kernel (the same source compiled with KPT_ENTRY_BLOCKMAP defined):
 *
 *   u32 magic 'KPTV', u32 format (1), u32 words of the attention module, u32 words of the
 *   block-map module (0: none), then the words of each, native byte order. */
#ifndef KPT_VENDOR_RTC_GLSLANG_H
#define KPT_VENDOR_RTC_GLSLANG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <kpt/status.h>

/* The SPIR-V environment kpt targets: Vulkan 1.1 (SPIR-V 1.3). */
#define KPT_SPIRV_VULKAN_MINOR 1

/* Compiles `glsl` (a compute shader) to SPIR-V words (malloc'ed), validated. With `second`, the
 * source's second entry point (KPT_ENTRY_SECOND = 1: a forward kernel's block-map builder, a
 * serving kernel's combine). KPT_ERR_COMPILE with glslang's or SPIRV-Tools' log on failure. */
kpt_status kpt_spirv_compile(const char *glsl, bool second, uint32_t **words, size_t *count,
                             kpt_diag *diag);
/* spvValidate for the Vulkan 1.1 environment. */
kpt_status kpt_spirv_validate(const uint32_t *words, size_t count, kpt_diag *diag);

/* The kernel binary: the attention module and, with `second`, the second entry's module. */
kpt_status kpt_spirv_build(const char *glsl, bool second, void **binary, size_t *size,
                           kpt_diag *diag);
/* Finds the modules in a binary made by kpt_spirv_build (bm, the second entry's: NULL and 0
 * when it has none).
 * False when the binary is malformed. */
bool kpt_spirv_unpack(const void *binary, size_t size, const uint32_t **attn, size_t *n_attn,
                      const uint32_t **bm, size_t *n_bm);

/* "glslang 12.0.0" (the compiler part of cache keys). */
const char *kpt_spirv_compiler(void);

#endif
