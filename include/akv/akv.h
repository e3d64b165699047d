/*
 * akv/akv.h — the whole public API of activekv in one include.
 */
#ifndef AKV_AKV_H
#define AKV_AKV_H

#include "akv/status.h"
#include "akv/log.h"
#include "akv/version.h"
#include "akv/dev.h"
#include "akv/geom.h"
#include "akv/host_pool.h"
#include "akv/host_table.h"
#include "akv/dev_pool.h"

#endif
