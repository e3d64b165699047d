/*
 * akv/host_table.h — one context's K/V history in the host pool: a page table per layer.
 *
 * Glossary
 *   host table   for one context, for each layer, the list of host pages holding its tokens
 *                in token order (oldest first). Every layer has the same number of pages and
 *                tokens: page k of a layer holds tokens [k*P, (k+1)*P).
 *   CSR export   the FlashInfer-style page table a kernel reads, for a batch of contexts and
 *                one layer: indptr[n_seq+1], indices[nnz] (host page ids, token order) and
 *                last_page_len[n_seq] (tokens used in each sequence's last page: 1..P, or 0
 *                for a sequence with no page). Sequence s has (npages-1)*P + last_page_len
 *                tokens.
 *
 *   shared page  a full page several tables hold (akv_host_table_share: a prefix another
 *                context computed); the pool counts its owners (akv/host_pool.h).
 *
 * Invariants (akv__host_table_check)
 *   - every layer holds exactly ceil(n_tokens / P) pages, each live in the pool;
 *   - no page appears twice in one table;
 *   - a shared page is one of the table's full pages. Tokens are written only from a table's
 *     end on (into its partial last page or pages grown for them), so no shared page is ever
 *     written: a truncate that would leave a shared page partial gives the table a private
 *     copy of it first (the one place this layer copies bytes: host memory, a page a layer).
 *
 * Ownership: the table owns its pages (with the other owners, for shared ones); destroying it
 * frees them (drops its ownership of shared ones). The pool must outlive the table.
 * Thread-safety: none (the pool's owner thread).
 */
#ifndef AKV_HOST_TABLE_H
#define AKV_HOST_TABLE_H

#include <stddef.h>
#include <stdint.h>

#include "akv/host_pool.h"
#include "akv/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct akv_host_table akv_host_table;

/* An empty table (no token, no page) over `pool`. */
akv_status akv_host_table_create(akv_host_pool *pool, akv_host_table **out);

/* Frees every page and the table. NULL is a no-op. AKV_EBUSY, nothing changed, while any of
 * the pages it alone holds is leased (retire the copies first, or use akv_host_table_destroy_deferred). */
akv_status akv_host_table_destroy(akv_host_table *t);

/* Frees the table now and each page now or, if leased, at its last release (the pool's
 * deferred free): for a cancelled context whose copies are still in flight. Never fails for a
 * valid table; NULL is a no-op. */
void akv_host_table_destroy_deferred(akv_host_table *t);

/* Sets the length to n_tokens >= the current one, allocating the new pages of every layer.
 * All-or-nothing: AKV_EFULL at the pool's limit (or AKV_ENOMEM), with every page this call
 * allocated freed again. AKV_EINVAL for a shorter length (use truncate) or one whose page
 * count per layer exceeds INT32_MAX. */
akv_status akv_host_table_grow(akv_host_table *t, uint64_t n_tokens);

/* Makes the empty table dst hold src's first n_pages pages of every layer, shared (owned by
 * both; its length n_pages * P): a prefix computed once, held by several contexts. AKV_EINVAL
 * (logged) for a dst that is not empty or of another pool, or more pages than src holds full;
 * AKV_EOVERFLOW (nothing changed) past the pool's owner count. */
akv_status akv_host_table_share(akv_host_table *dst, const akv_host_table *src, uint32_t n_pages);

/* Sets the length to n_tokens <= the current one, freeing whole pages past it in every layer
 * (dropping the table's ownership of shared ones). A shared page that would become the partial
 * last page is replaced by a private copy. AKV_EBUSY, nothing changed, while a page this table
 * alone holds and would free is leased; AKV_EFULL or AKV_ENOMEM, nothing changed, when the
 * private copy cannot be allocated. */
akv_status akv_host_table_truncate(akv_host_table *t, uint64_t n_tokens);

uint64_t akv_host_table_n_tokens(const akv_host_table *t);
uint32_t akv_host_table_n_pages(const akv_host_table *t); /* per layer */

/* Handle of page page_idx of `layer` (asserts both in range). A plain value: lease it before
 * handing its address to a copy. */
akv_host_page akv_host_table_page(const akv_host_table *t, uint32_t layer, uint32_t page_idx);

/* The pages that destroying all n tables would free: those every owner of which is one of
 * them (a page only they hold, shared among them or not), counted once each, every layer.
 * The tables must be distinct and of one pool. What admission counts as reclaimable: closing a
 * set of idle contexts frees these, and no page another table still holds. AKV_EINVAL (logged)
 * for a NULL array, table or output, or tables of different pools; AKV_ENOMEM. */
akv_status akv_host_tables_sole_pages(const akv_host_table *const *tables, uint32_t n,
                                      uint64_t *out);

/* Host page ids of `layer` for a batch of n_seq tables, in CSR form (see above). indptr holds
 * n_seq+1 entries, last_page_len n_seq, indices `indices_cap` (the total page count is the
 * sum of akv_host_table_n_pages). AKV_EINVAL for a layer out of range, a NULL table or too
 * small an indices array (nothing written). */
akv_status akv_host_table_export_csr(const akv_host_table *const *tables, uint32_t n_seq,
                                     uint32_t layer, int32_t *indptr, int32_t *indices,
                                     size_t indices_cap, int32_t *last_page_len);

#ifdef __cplusplus
}
#endif
#endif /* AKV_HOST_TABLE_H */
