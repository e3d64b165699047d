/*
 * core/log.h — internal logging entry points (the public hook is in akv/log.h).
 *
 * Log once, where the detail is known, and return a status. Messages are formatted only
 * when the level passes the threshold. Each call delivers one line (no trailing newline).
 */
#ifndef AKV_CORE_LOG_H
#define AKV_CORE_LOG_H

#ifdef __cplusplus /* included by the CUDA sources too */
extern "C" {
#endif

#include "akv/log.h"
#include "core/assert.h"

void akv__log(akv_log_level level, const char *fmt, ...) AKV_PRINTF(2, 3);

#define AKV_LOG_D(...) akv__log(AKV_LOG_DEBUG, __VA_ARGS__)
#define AKV_LOG_I(...) akv__log(AKV_LOG_INFO, __VA_ARGS__)
#define AKV_LOG_W(...) akv__log(AKV_LOG_WARN, __VA_ARGS__)
#define AKV_LOG_E(...) akv__log(AKV_LOG_ERROR, __VA_ARGS__)

#ifdef __cplusplus
}
#endif

#endif
