/*
 * stage/stage_check.h — the staging layer's validity walker (tests call it after every
 * operation). It walks every lease record and checks the invariants of akv/stage.h that a
 * snapshot can show; it logs the first violation and returns AKV_ESTATE.
 */
#ifndef AKV_STAGE_CHECK_H
#define AKV_STAGE_CHECK_H

#include "akv/stage.h"

akv_status akv__stage_check(const akv_stage *st);

/* Negative controls (tests only): each flag removes ONE device-side ordering, so that a test
 * can prove it detects exactly that bug (a buffer reused one event too early). Never set
 * outside tests. */
enum {
    AKV__STAGE_BREAK_PRIOR = 1u,     /* the next slot occupant does not wait for prior readers */
    AKV__STAGE_BREAK_COPY_WAIT = 2u, /* attention does not wait for the copies */
    AKV__STAGE_BREAK_ATTN_WAIT = 4u, /* the write-back does not wait for attention */
    AKV__STAGE_BREAK_RAW = 8u,       /* a refill does not wait for a pending write-back */
};
void akv__stage_break(akv_stage *st, unsigned flags);

#endif
