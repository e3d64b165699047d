/*
 * akv/akv.h — the whole public API of activekv in one include.
 */
#ifndef AKV_AKV_H
#define AKV_AKV_H

#include "akv/status.h"
#include "akv/log.h"
#include "akv/version.h"
#include "akv/dev.h"
#include "akv/dtype.h"
#include "akv/sample.h"
#include "akv/gguf.h"
#include "akv/gguf_quant.h"
#include "akv/geom.h"
#include "akv/host_pool.h"
#include "akv/host_table.h"
#include "akv/ops.h"
#include "akv/model.h"
#include "akv/gguf_synth.h"
#include "akv/gguf_writer.h"
#include "akv/dev_pool.h"
#include "akv/tok.h"
#include "akv/chat.h"
#include "akv/admit.h"
#include "akv/stage.h"
#include "akv/stage_probe.h"

#endif
