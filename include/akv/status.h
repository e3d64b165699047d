/*
 * akv/status.h — the one status type of activekv.
 *
 * Every fallible function returns an akv_status: 0 is success, every error is negative.
 * Results come back through out-parameters placed last and are written only on success
 * (all-or-nothing). Programmer errors are assertions, not statuses.
 *
 * Thread-safety: akv_status_str() is pure and thread-safe.
 */
#ifndef AKV_STATUS_H
#define AKV_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum akv_status {
    AKV_OK = 0,
    AKV_EINVAL = -1,       /* an argument or configuration is invalid */
    AKV_ENOMEM = -2,       /* host memory (or pinned host memory) could not be allocated */
    AKV_EDEVMEM = -3,      /* device memory could not be allocated */
    AKV_EDEVICE = -4,      /* the device or its runtime reported an error */
    AKV_EIO = -5,          /* a file or stream could not be read or written */
    AKV_EFORMAT = -6,      /* input data is malformed (a GGUF file, a JSON body, ...) */
    AKV_EFULL = -7,        /* refused for lack of capacity; retryable later */
    AKV_EBUSY = -8,        /* the object is in use (live leases, copies in flight) */
    AKV_EUNSUPPORTED = -9, /* valid, but not supported by this build or backend */
    AKV_ESTATE = -10,      /* the call is not allowed in the object's current state */
    AKV_EOVERFLOW = -11,   /* a size or count overflows its type */
    AKV_ENOTFOUND = -12,   /* a named thing (key, tensor, file) does not exist */
    AKV_EFAILED = -13,     /* the transport has failed and is quarantined; see its log */
    AKV_ECANCELED = -14,   /* the operation was cancelled */
} akv_status;

/* A short, static, human-readable name for a status ("invalid argument"); never NULL.
 * Unknown values give "unknown status". */
const char *akv_status_str(int status);

/* The enum name of a status ("AKV_EINVAL"); never NULL. */
const char *akv_status_name(int status);

#ifdef __cplusplus
}
#endif
#endif /* AKV_STATUS_H */
