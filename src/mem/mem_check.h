/*
 * mem/mem_check.h — validity walkers of the memory layer (tests call them after every
 * operation; docs/style.md "Errors": invariants made executable).
 *
 * Each walks the whole structure, checks every invariant its public header states, logs the
 * first violation (AKV_LOG_E, naming the page/slot/context) and returns AKV_ESTATE; AKV_OK
 * when all hold. They allocate nothing, so they can run between fault-injected operations
 * without moving the injection counters. Linear in the structure's size (the host table's is
 * quadratic in its pages): tests only.
 */
#ifndef AKV_MEM_CHECK_H
#define AKV_MEM_CHECK_H

#include "akv/dev_pool.h"
#include "akv/host_pool.h"
#include "akv/host_table.h"

/* Takes a non-const pool: it marks page records while walking and clears the marks. */
akv_status akv__host_pool_check(akv_host_pool *pool);
akv_status akv__host_table_check(const akv_host_table *t);
/* Non-const: it uses the pool's scratch bitmap to catch a page held twice. */
akv_status akv__dev_pool_check(akv_dev_pool *pool);

#endif
