/*
 * akv/version.h — the library's version.
 */
#ifndef AKV_VERSION_H
#define AKV_VERSION_H

#ifdef __cplusplus
extern "C" {
#endif

#define AKV_VERSION_MAJOR 0
#define AKV_VERSION_MINOR 1
#define AKV_VERSION_PATCH 0

/* "MAJOR.MINOR.PATCH"; static storage. */
const char *akv_version(void);

#ifdef __cplusplus
}
#endif
#endif /* AKV_VERSION_H */
