/* clock.c — CLOCK_MONOTONIC in nanoseconds; CLOCK_REALTIME deadlines. */
#define _POSIX_C_SOURCE 200809L
#include "core/clock.h"

#include <errno.h>
#include <time.h>

uint64_t akv_clock_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

double akv_clock_s(void) {
    return (double)akv_clock_ns() * 1e-9;
}

struct timespec akv_clock_deadline(double seconds) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    const double ns = (double)t.tv_nsec + (seconds > 0 ? seconds : 0) * 1e9;
    const double whole = (double)(uint64_t)(ns / 1e9);
    t.tv_sec += (time_t)whole;
    t.tv_nsec = (long)(ns - whole * 1e9);
    return t;
}

void akv_clock_sleep_ns(uint64_t ns) {
    struct timespec req = {.tv_sec = (time_t)(ns / 1000000000u), .tv_nsec = (long)(ns % 1000000000u)};
    while (nanosleep(&req, &req) != 0 && errno == EINTR) {
    }
}
