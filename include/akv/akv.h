/*
 * akv/akv.h — the whole public API of activekv in one include.
 */
#ifndef AKV_AKV_H
#define AKV_AKV_H

#include "akv/status.h"
#include "akv/log.h"
#include "akv/version.h"
#include "akv/dev.h"
#include "akv/gguf.h"
#include "akv/gguf_quant.h"
#include "akv/tok.h"
#include "akv/chat.h"

#endif
