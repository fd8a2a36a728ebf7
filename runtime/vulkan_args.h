/* The arguments of the Vulkan kernels: the host twins of `kpt_push` (push constants) and
 * `kpt_geom_buf` (a storage buffer, std430) in templates/glsl/attention.comp. Change them
 * together. */
#ifndef KPT_RUNTIME_VULKAN_ARGS_H
#define KPT_RUNTIME_VULKAN_ARGS_H

#include <stdint.h>

/* Push constants: sizes and runtime scalars (the array is as long as the pattern has scalars,
 * at least 1). */
typedef struct kpt_vk_push {
    int32_t B, Hq, Hkv, Sq, Skv, group, n_qt, n_kt;
    float scale, scale_log2;
    uint32_t scalars[32];
} kpt_vk_push;
#define KPT_VK_PUSH_FIXED 40 /* bytes before scalars[] */

typedef struct kpt_vk_auxgeom {
    uint32_t off;       /* bytes from the start of the buffer */
    uint32_t dim[4];    /* unused dimensions: 1 */
    uint32_t stride[4]; /* elements */
} kpt_vk_auxgeom;

#define KPT_VK_NO_LSE 0xffffffffu
#define KPT_VK_NO_SINK 0xffffffffu

/* Element offsets of each tensor within its buffer and element strides; bms: block-map entry
 * strides for b, h and the q tile (0 where the map does not depend on them); so and ss: the
 * sinks' offset (KPT_VK_NO_SINK: none) and stride. n_check is
 * KPT_VK_LOOP_CHECK and status 0 at each launch; a kernel sets status bit 0 when its loops were
 * cut short (kpt_check_loops in the template: lavapipe's loop limit). */
typedef struct kpt_vk_geom {
    uint32_t qo, ko, vo, oo, lo, bmo;
    uint32_t qs[4], ks[4], vs[4], os[4];
    uint32_t ls[3], bms[3];
    uint32_t so, ss;
    uint32_t n_check, status;
    /* serving: the page table's start and row stride, the starts of cu_seqlens_q and kv_lens
     * (elements), rows per page, pages in the cache, page-table columns (0: no page table) and
     * tokens T of q and o */
    uint32_t po, ps, cuo, kvo, page_size, num_pages, max_pages, T;
    /* serving split over the keys: parts per sequence (1: none), and the element offsets of the
     * partial results' O and LSE in the workspace's buffer */
    uint32_t splits, wso, wlo;
    kpt_vk_auxgeom aux[16];
} kpt_vk_geom;
#define KPT_VK_LOOP_CHECK 2

_Static_assert(sizeof(kpt_vk_auxgeom) == 36, "kpt_vk_auxgeom layout");
_Static_assert(sizeof(kpt_vk_geom) == 172 + 16 * 36, "kpt_vk_geom layout");

#endif
