/*
 * dev/dev_op.h — what code outside the device module may use to launch ops and to implement
 * them on the host backend: the checks every launch passes, and the host address behind a
 * device address. Internal to the library (not under include/), and the only part of the
 * device module's internals that other modules see; backends themselves use dev/dev_impl.h.
 */
#ifndef AKV_DEV_OP_H
#define AKV_DEV_OP_H

#include <stddef.h>

#include "akv/dev.h"
#include "akv/status.h"

/* The checks every op launch passes before anything is submitted (akv_dev_op_launch, each
 * launch of akv_dev_graph_create, a stage's attend): an op with a name, args_bytes equal to
 * op->args_bytes and arguments when it has any (AKV_EINVAL), and an implementation on dev's
 * backend (AKV_EUNSUPPORTED). Logs the problem, naming the op. */
akv_status akv__dev_op_check(const akv_dev *dev, const akv_dev_op *op, const void *args,
                             size_t args_bytes);

/* Host backend only: the host address behind a device address (asserts the backend). Op host
 * implementations use it to reach their buffers. */
void *akv__dev_host_addr(const akv_dev *dev, akv_dptr p);

#endif
