/*
 * akv/akv.h — the whole public API of activekv in one include, floor by floor (docs/design.md,
 * "The floors"). Every header under include/akv/ is here except include/akv/testing/ (test
 * scaffolding: fault injection, the staging probe), which tests include by name; the headers
 * test checks both.
 */
#ifndef AKV_AKV_H
#define AKV_AKV_H

/* core */
#include "akv/status.h"
#include "akv/log.h"
#include "akv/version.h"
#include "akv/dtype.h"
#include "akv/kv_repr.h"
/* the device */
#include "akv/dev.h"
#include "akv/dev_cuda.h"
/* the memory layer */
#include "akv/geom.h"
#include "akv/host_pool.h"
#include "akv/host_table.h"
#include "akv/dev_pool.h"
#include "akv/admit.h"
/* files, text */
#include "akv/gguf.h"
#include "akv/gguf_quant.h"
#include "akv/gguf_writer.h"
#include "akv/gguf_synth.h"
#include "akv/tok.h"
#include "akv/chat.h"
#include "akv/jinja.h"
/* staging, attention, the model */
#include "akv/stage.h"
#include "akv/attn.h"
#include "akv/kvq.h"
#include "akv/kv_parts.h"
#include "akv/route.h"
#include "akv/gate.h"
#include "akv/attn_host.h"
#include "akv/ops.h"
#include "akv/model.h"
#include "akv/fwd_sample.h"
#include "akv/trace.h"
#include "akv/forward_ops.h"
#include "akv/forward.h"
#include "akv/forward_dev.h"
/* the engine, the server */
#include "akv/sample.h"
#include "akv/json_prefix.h"
#include "akv/json_schema.h"
#include "akv/engine.h"
#include "akv/server.h"

#endif
