/*
 * akv/testing/dev_faults.h — fault injection into a device (akv/dev.h), for tests: a failure
 * armed at the nth pass of a submission, wait or execution point, delays injected into the
 * host backend's queues, allocation failures. Not part of akv/akv.h: the library's own code
 * never arms a fault; tests use these to prove that every failure is handled (invariant 6 of
 * docs/design.md).
 */
#ifndef AKV_TESTING_DEV_FAULTS_H
#define AKV_TESTING_DEV_FAULTS_H

#include <stdint.h>

#include "akv/dev.h"
#include "akv/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Host backend only: fail the n-th device (resp. pinned) allocation from now, once; 0
 * disarms. AKV_EUNSUPPORTED on other backends. */
akv_status akv_dev_inject_alloc_failure(akv_dev *dev, uint64_t nth_device, uint64_t nth_pinned);

typedef enum akv_dev_fault {
    AKV_FAULT_COPY = 0,      /* submission of an async copy or memset (1D, 2D, batch) */
    AKV_FAULT_RECORD = 1,    /* submission of an event record */
    AKV_FAULT_WAIT = 2,      /* submission of a queue wait on an event */
    AKV_FAULT_OP = 3,        /* launch of an op or a host function */
    AKV_FAULT_SYNC = 4,      /* a wait point: event query or sync, queue sync, device sync,
                                a synchronous copy */
    AKV_FAULT_COPY_EXEC = 5, /* host backend: an accepted copy fails while it runs */
    AKV_FAULT_OP_EXEC = 6,   /* host backend: an accepted op (or host function) fails as it runs */
} akv_dev_fault;
#define AKV_N_FAULTS 7

/* "copy", "record", "wait", "op", "sync", "copy_exec", "op_exec"; "(bad fault)" otherwise. */
const char *akv_dev_fault_name(akv_dev_fault f);

/* Arms a failure at the nth pass of point f from now (1-based): a submission point returns
 * AKV_EDEVICE and submits nothing; a wait point returns AKV_EDEVICE (the work itself is
 * untouched); an exec point accepts the work, which then fails on its queue (the queue
 * faults). sticky = 1: that pass and every later one fail until akv_dev_clear_faults (a device
 * that cannot establish completion). nth = 0 disarms f. Submission and wait points work on
 * every backend (the front injects them); exec points are AKV_EUNSUPPORTED off the host. */
akv_status akv_dev_inject_fault(akv_dev *dev, akv_dev_fault f, uint64_t nth, int sticky);
/* Disarms every injected failure and, on the host backend, waits until every queue has run
 * (or skipped) what it was given, then un-faults every queue (as if the device had been
 * recovered): later syncs can establish completion again, and a record that covered failed
 * work stays failed (akv_dev_event_outcome). */
akv_status akv_dev_clear_faults(akv_dev *dev);

/* Copy method m unavailable on dev (refuse 1) as on a backend without it, or available again
 * (0): akv_dev_set_copy_config and the per-call methods answer AKV_EUNSUPPORTED, so a caller's
 * fallback runs. The method in force is not changed. AKV_EINVAL for DEFAULT or no method. */
akv_status akv_dev_refuse_copy_method(akv_dev *dev, akv_copy_method m, int refuse);
/* How many times point f has been passed since the device was created (armed or not): run a
 * scenario once, read the counts, then inject at each pass in turn. */
uint64_t akv_dev_fault_passes(const akv_dev *dev, akv_dev_fault f);
/* Host backend: before each command a queue runs, with probability 1/one_in, it sleeps a
 * uniform 0..max_delay_us microseconds (per-queue random streams from `seed`). max_delay_us = 0
 * turns delays off. AKV_EUNSUPPORTED on other backends. */
akv_status akv_dev_inject_delays(akv_dev *dev, uint64_t seed, uint32_t max_delay_us,
                                 uint32_t one_in);

#ifdef __cplusplus
}
#endif
#endif /* AKV_TESTING_DEV_FAULTS_H */
