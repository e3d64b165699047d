/*
 * akv/forward_dev.h — the Llama-family forward pass on a device's queues: the same contract as
 * akv/forward.h (tokens in, logits out, attention through a paged K/V history the caller places
 * with the same hooks), with every op launched through the device op table
 * (akv/forward_ops.h). On the CUDA backend it runs on the GPU (cuBLAS products, the paged
 * attention kernels); on the host backend the same sequence of ops runs on the compute worker
 * thread through ref/ (the test bed for the ordering, and the bf16 oracle of the CUDA run).
 *
 * What runs where
 *   device  embedding, RMSNorm, Q/K/V (one fused product), bias, RoPE, K/V append and
 *           attention over the hook's pages, output projection, SwiGLU feed-forward, the
 *           output head: everything, on AKV_QUEUE_COMPUTE, in submission order.
 *   host    validation of the batch and its token ids, the upload of ids, positions, the
 *           prefill group's rows and the logit rows (one copy), the hooks (the route places
 *           pages and enqueues write-backs), and the wait for the logits (one queue sync per
 *           step that asks for logits; a step without logits returns without waiting).
 *
 * Precision: weight matrices are bf16 on the device (rounded from the model's values at
 * create), or their GGUF blocks with params weights NATIVE where the format has a device
 * product (the block products take x at 8 bits: akv/forward_ops.h); norms' weights, the
 * residual stream, Q/K/V before the K/V append, and logits are f32;
 * the inputs of the matrix products (normed activations, attention output, SwiGLU output)
 * are bf16; every product and reduction accumulates in f32 (RMSNorm's sum of squares in
 * double). K/V pages hold the route's dtype (bf16 on CUDA).
 *
 * Hooks: begin_layer must hand a table whose arrays (indptr, indices, last_page_len) are
 * DEVICE memory with their contents in place in compute-queue order (akv_route in its queued
 * mode does this); the pass cannot read them, so it checks only the shape fields. end_layer is
 * called after the layer's attention is enqueued (not complete): a hook that copies the new
 * rows must order itself after the compute queue with an event.
 *
 * Attention by groups (forward.h): each run of sequences with the same count of
 * 1..AKV_ATTN_MAX_QUERIES new tokens is one K/V append + one decode call on its view of the
 * table (each count with its own decode workspace); the sequences with longer chunks are one
 * causal prefill call (which writes the chunk's K/V itself). A layer with a past part (the
 * compact tier's older history) gives each part's states in f32 and merges them into the
 * attention output (akv_fwd_op_attn_merge): the decode groups read the past part with the
 * decode (its own workspace per query count), the prefill group with one decode per sequence
 * whose queries are its chunk's rows (one partition: the rows fill the device as row tiles).
 * The products and the row ops run
 * over every row of the step at once; the output head over the rows whose logits are asked
 * for, gathered by the output norm.
 *
 * Graph replay of decode steps (akv_dev_graph). A step of one token per sequence whose hooks
 * are replayable (akv_kv_hooks.replayable: a resident route) first RECORDS its launches
 * (embedding and every layer; the hooks' begin_layer runs, nothing is launched), then
 * compares the record with the one the current graph was built from, byte for byte (ops and
 * argument structs): equal, the graph is launched; different (the first step, a new batch
 * size, route or capacity), a new graph is built from the record and launched. Everything that changes between steps (ids,
 * positions, the page tables' contents) is device memory the kernels read, uploaded before
 * the launch, so a graph is only ever replayed with exactly the arguments it was built with.
 * Then every end_layer (the write-backs wait for the graph), then the output head, launched
 * one by one. Chunks of several tokens, non-replayable hooks and params.no_graphs launch op by
 * op. The bits are the same either way (the same kernels with the same arguments).
 *
 * Thread-safety: one akv_forward_dev per thread; it owns device memory of `dev`.
 */
#ifndef AKV_FORWARD_DEV_H
#define AKV_FORWARD_DEV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "akv/dev.h"
#include "akv/forward.h"
#include "akv/model.h"
#include "akv/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct akv_forward_dev akv_forward_dev;

/* Uploads `model`'s weights to `dev` (matrices as bf16 or, params weights NATIVE, in their
 * block formats; norms and biases f32) and allocates scratch for
 * chunks of params->max_step_tokens tokens (params as akv_forward_create; NULL = defaults). The
 * model must outlive the pass only for its config (the device holds the weights).
 * AKV_EDEVMEM when the device cannot hold weights + scratch (logged with the bytes);
 * AKV_EINVAL for bad params; AKV_EDEVICE. Waits for the uploads before returning. */
akv_status akv_forward_dev_create(akv_dev *dev, const akv_model *model,
                                  const akv_forward_params *params, akv_forward_dev **out);

/* The same pass for a synthetic model of configuration `c` (no file): every weight filled on
 * the device from `seed` (akv_fwd_op_fill: matrices uniform in +-1/sqrt(n_in), norms around 1,
 * embedding rows uniform in +-1), RoPE from c's base and linear scale (no Llama 3 factors).
 * For benchmarks of shapes too large to write as a file. */
akv_status akv_forward_dev_create_synthetic(akv_dev *dev, const akv_model_config *c,
                                            uint64_t seed, const akv_forward_params *params,
                                            akv_forward_dev **out);

/* Frees the device memory (akv_dev_mem_free waits for the device to be idle). NULL is a
 * no-op. */
void akv_forward_dev_destroy(akv_forward_dev *f);

/* akv_forward_step's contract (forward.h) on the device: one batch step. logits (if not NULL)
 * are complete when it returns. AKV_EINVAL also for more logit rows than params.max_logits.
 * On error the queue may hold part of the step's work: the caller syncs or discards the
 * device (a failed op faults the compute queue). */
akv_status akv_forward_dev_step(akv_forward_dev *f, const akv_forward_batch *b,
                                const akv_kv_hooks *kv, float *logits);

/* The step of one sequence (akv_forward_run's form). */
akv_status akv_forward_dev_run(akv_forward_dev *f, const int32_t *tokens, uint32_t n,
                               uint32_t pos0, const akv_kv_hooks *kv, float *logits,
                               bool all_logits);

/* The pass's own pinned buffer of logits ([max_logits][n_vocab], valid until destroy): a step
 * given it as its logits leaves them where the device copied them (no host copy of
 * rows x n_vocab floats); they are overwritten by the next step that asks for logits. */
float *akv_forward_dev_logits_buffer(akv_forward_dev *f);

/* Bytes of weights one decode step reads (every matrix once, the output head once, the
 * embedding row not counted): the numerator of the weight-bandwidth limit. */
uint64_t akv_forward_dev_weight_bytes(const akv_forward_dev *f);

/* Graph use so far: builds (a record that differed from the last graph's) and launches. */
typedef struct akv_forward_dev_stats {
    uint64_t graph_builds;
    uint64_t graph_launches;
} akv_forward_dev_stats;
akv_forward_dev_stats akv_forward_dev_get_stats(const akv_forward_dev *f);

/* The configuration the pass runs (borrowed, valid until destroy). */
const akv_model_config *akv_forward_dev_config(const akv_forward_dev *f);

#ifdef __cplusplus
}
#endif
#endif /* AKV_FORWARD_DEV_H */
