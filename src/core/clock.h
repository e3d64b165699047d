/*
 * core/clock.h — a monotonic clock.
 */
#ifndef AKV_CORE_CLOCK_H
#define AKV_CORE_CLOCK_H

#include <stdint.h>

/* Nanoseconds from an arbitrary fixed origin (CLOCK_MONOTONIC); never goes back. */
uint64_t akv_clock_ns(void);

/* Seconds as a double, same origin: for reports, not for ordering. */
double akv_clock_s(void);

/* Sleep for at least `ns` nanoseconds (restarted on signals). */
void akv_clock_sleep_ns(uint64_t ns);

#endif
