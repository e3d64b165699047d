/*
 * core/clock.h — a monotonic clock, and wall-clock deadlines for timed waits.
 */
#ifndef AKV_CORE_CLOCK_H
#define AKV_CORE_CLOCK_H

#include <stdint.h>
#include <time.h>

/* Nanoseconds from an arbitrary fixed origin (CLOCK_MONOTONIC); never goes back. */
uint64_t akv_clock_ns(void);

/* Seconds as a double, same origin: for reports, not for ordering. */
double akv_clock_s(void);

/* Sleep for at least `ns` nanoseconds (restarted on signals). */
void akv_clock_sleep_ns(uint64_t ns);

/* The wall-clock (CLOCK_REALTIME) time `seconds` from now (0 for a negative count), the
 * absolute deadline pthread_cond_timedwait takes. */
struct timespec akv_clock_deadline(double seconds);

#endif
