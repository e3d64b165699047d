/* status.c — names and messages of akv_status values. */
#include "akv/status.h"
#include "akv/version.h"

typedef struct status_entry {
    int code;
    const char *name;
    const char *text;
} status_entry;

static const status_entry status_table[] = {
    {AKV_OK, "AKV_OK", "ok"},
    {AKV_EINVAL, "AKV_EINVAL", "invalid argument"},
    {AKV_ENOMEM, "AKV_ENOMEM", "out of host memory"},
    {AKV_EDEVMEM, "AKV_EDEVMEM", "out of device memory"},
    {AKV_EDEVICE, "AKV_EDEVICE", "device error"},
    {AKV_EIO, "AKV_EIO", "input/output error"},
    {AKV_EFORMAT, "AKV_EFORMAT", "malformed input"},
    {AKV_EFULL, "AKV_EFULL", "refused: capacity exhausted"},
    {AKV_EBUSY, "AKV_EBUSY", "busy: still in use"},
    {AKV_EUNSUPPORTED, "AKV_EUNSUPPORTED", "not supported"},
    {AKV_ESTATE, "AKV_ESTATE", "not allowed in the current state"},
    {AKV_EOVERFLOW, "AKV_EOVERFLOW", "size overflow"},
    {AKV_ENOTFOUND, "AKV_ENOTFOUND", "not found"},
    {AKV_EFAILED, "AKV_EFAILED", "transport failed (quarantined)"},
    {AKV_ECANCELED, "AKV_ECANCELED", "cancelled"},
};

static const status_entry *status_find(int code) {
    for (unsigned i = 0; i < sizeof status_table / sizeof status_table[0]; i++)
        if (status_table[i].code == code) return &status_table[i];
    return 0;
}

const char *akv_status_str(int status) {
    const status_entry *e = status_find(status);
    return e ? e->text : "unknown status";
}

const char *akv_status_name(int status) {
    const status_entry *e = status_find(status);
    return e ? e->name : "AKV_E?";
}

const char *akv_version(void) {
    return "0.1.0";
}
