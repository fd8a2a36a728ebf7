/* A random serving batch for tests and kptc check: ragged sequences (queries and kv lengths per
 * sequence), their K/V in a cache of shuffled pages (or a contiguous cache), a page table, the
 * cu_seqlens and kv_lens arrays, random sinks and document ids; and the kpt_paged_args that
 * describe it over host memory or over device copies with the same layout. */
#ifndef KPT_TOOLS_PAGED_BATCH_H
#define KPT_TOOLS_PAGED_BATCH_H

#include <stdbool.h>
#include <stdint.h>

#include <kpt/serving.h>

#include "tools/rng.h"

typedef struct kpt_paged_batch {
    int B, hq, hkv, d, dv; /* dv: V's and O's head dim */
    kpt_dtype dtype;
    int page;        /* rows per page; 0: no page table (the cache's dimension 0 is the sequence) */
    bool head_major; /* cache memory [pages, Hkv, page, D] instead of [pages, page, Hkv, D] */
    int T;           /* rows of q and o: the queries, plus 3 no sequence owns */
    int P, maxp, maxkv, rows; /* pages, page-table columns, longest kv, rows per page */
    int32_t *cu, *kv, *pt;    /* [B + 1], [B], [B, maxp] (NULL without paging) */
    int32_t *docs;            /* sorted document ids [B, maxkv], for masks that read them */
    float *sinks;             /* [hq] */
    void *q, *k, *v;          /* dtype: [T, hq, d], caches of P pages (rows of d, dv) */
} kpt_paged_batch;

/* Builds a batch of B sequences with q[b] queries and kv[b] keys (kv[b] >= q[b]), head dims d
 * (q and k) and dv (v and o; 0: d); false when out of memory. */
bool kpt_paged_batch_make(kpt_paged_batch *pb, int B, const int *q, const int *kv, int page,
                          bool head_major, kpt_dtype dtype, int hq, int hkv, int d, int dv,
                          kpt_rng *r);
void kpt_paged_batch_free(kpt_paged_batch *pb);

/* Bytes of q, of the K cache, of the V cache, of the page table and of the document ids. */
size_t kpt_paged_batch_q_bytes(const kpt_paged_batch *pb);
size_t kpt_paged_batch_cache_bytes(const kpt_paged_batch *pb);
size_t kpt_paged_batch_v_bytes(const kpt_paged_batch *pb);
size_t kpt_paged_batch_pt_bytes(const kpt_paged_batch *pb);
size_t kpt_paged_batch_doc_bytes(const kpt_paged_batch *pb);

/* Where each array lives (host or device), and the outputs. */
typedef struct kpt_paged_batch_mem {
    void *q, *k, *v, *o, *lse, *pt, *cu, *kv, *sinks; /* sinks NULL: none */
    kpt_dtype o_dtype, lse_dtype;
} kpt_paged_batch_mem;

/* The args of the batch over `m`; aux may be NULL (naux 0). */
kpt_paged_args kpt_paged_batch_args(const kpt_paged_batch *pb, const kpt_paged_batch_mem *m,
                                    const kpt_aux_tensor *aux, int naux);

#endif
