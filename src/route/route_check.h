/*
 * route/route_check.h — the route's validity walker (tests call it after every step).
 */
#ifndef AKV_ROUTE_CHECK_H
#define AKV_ROUTE_CHECK_H

#include "akv/route.h"

/* Between steps (after a forward pass, never between begin_step and the pass): the host copy
 * has ceil(n/P) pages per layer for n tokens, and it is authoritative — every used token row
 * of every page still in the device window equals its host page's bytes (pages another
 * context reclaimed are simply not resident). Logs the first violation (layer, page, K|V,
 * head) and returns AKV_ESTATE. It reads device memory as host memory: on another backend
 * AKV_EUNSUPPORTED (logged), nothing read. Allocates nothing. */
akv_status akv__route_check(const akv_route *r);

#endif
