/* test_forward_dev.c — the forward pass on a device's queues (akv/forward_dev.h) run on the
 * host backend: its ops go through ref/ on the compute worker thread, the queued route uploads
 * tables and writes rows back on the queues. Against the host pass (f32 weights, direct route)
 * within bf16 tolerance, over chunked prefill (prefill and decode-kernel chunks) and decode
 * steps; the host copy equals the device pages after every step; bad input refused. */
#include "model_build.h"

#include "alloc_settled.h"
#include "akv/log.h"
#include "akv/testing/dev_faults.h"

#include "fwd_fixture.h"

#include "akv/forward_ops.h"
#include "akv/gguf_quant.h"
#include "core/alloc.h"

enum { P = 16 };

/* Relative logit error allowed between the passes. Weights are bf16-exact (the fixture
 * rounds them), so what remains is the rounding of the products' inputs to bf16 (normed
 * activations, attention output, SwiGLU output: 2^-9 relative each), compounded through
 * these small, sharp random models: measured up to 0.03. */
#define TOL 0.05

/* Prefill n_prompt tokens, then n_decode greedy steps driven by the host pass's tokens; the
 * two passes' logits agree within tol at every step. */
static void compare_passes(const akv_model *m, uint32_t max_step_tokens, uint32_t n_prompt,
                           uint32_t n_decode, double tol, uint64_t *rng) {
    const akv_model_config *c = akv_model_get_config(m);
    fx h = {0}, d = {0};
    uint32_t n_total = n_prompt + n_decode;
    if (!fx_open(&h, akv_dev_host_backend(), m, P, n_total, max_step_tokens, false) ||
        !fx_open(&d, akv_dev_host_backend(), m, P, n_total, max_step_tokens, true)) {
        fx_close(&h), fx_close(&d);
        return;
    }
    int32_t *tokens = akv__malloc(n_total * sizeof *tokens);
    float *lh = akv__malloc(c->n_vocab * sizeof *lh), *ld = akv__malloc(c->n_vocab * sizeof *ld);
    for (uint32_t i = 0; i < n_prompt; i++)
        tokens[i] = (int32_t)test_rand_below(rng, c->n_vocab);
    uint32_t pos = 0, n = n_prompt;
    while (pos < n_total) {
        if (!CHECK(fx_feed(&h, tokens + pos, n, lh) == AKV_OK) ||
            !CHECK(fx_feed(&d, tokens + pos, n, ld) == AKV_OK))
            break;
        pos += n;
        if (!fx_close_to(ld, lh, c->n_vocab, tol, "device-queue pass vs host pass")) {
            printf("  %s, after %u tokens (chunks of %u)\n", c->arch_name, pos, max_step_tokens);
            break;
        }
        CHECK_OK(akv_route_sync(d.q.r));
        CHECK_OK(akv__route_check(d.q.r));
        if (pos < n_total) tokens[pos] = fx_argmax(lh, c->n_vocab, NULL);
        n = 1;
    }
    r1_stats sh = r1_get_stats(&h.q), sd = r1_get_stats(&d.q);
    CHECK_EQ_U64(sd.r.d2h_bytes, sh.r.d2h_bytes); /* the same rows written back */
    CHECK_EQ_U64(sd.s.n_tokens, sh.s.n_tokens);
    akv__free(tokens), akv__free(lh), akv__free(ld);
    fx_close(&h), fx_close(&d);
}

/* The device pass over a resident route on the host backend, with graphs or op by op. */
static int fault_fx_open(fx *x, const akv_model *m, bool graphs) {
    return fx_open_pass(x, akv_dev_host_backend(), m, P, 64, 8, true, !graphs);
}

/* The end of a recovered case: the host copy equals the device pages, then close. */
static void fault_case_close(fx *x) {
    CHECK_OK(akv_route_sync(x->q.r));
    CHECK_OK(akv__route_check(x->q.r));
    fx_close(x);
}

/* A decode step that fails at one device point (a submission refused, a wait that cannot
 * establish completion, or work that fails while it runs), on the graph path or op by op:
 * the run returns an error; once the device recovers (faults cleared) and the route is
 * truncated back, the same step runs again and its logits are bit-identical to a clean run's.
 * Every pass of every fault point of one step is tried in turn. Returns the cases tried. */
static int fault_recovery(const akv_model *m, bool graphs) {
    const akv_model_config *c = akv_model_get_config(m);
    enum { PROMPT = 7, STEPS = 3 };
    int32_t tok[PROMPT + STEPS + 1];
    for (int i = 0; i < PROMPT + STEPS + 1; i++)
        tok[i] = (int32_t)((i * 7 + 3) % (int)c->n_vocab);
    float *want = malloc(c->n_vocab * sizeof *want), *got = malloc(c->n_vocab * sizeof *got);
    int cases = 0, failed = 0;
    /* the clean run: the logits of the step after PROMPT + STEPS tokens, and the number of
     * passes of each fault point during that one step */
    uint64_t passes[AKV_N_FAULTS] = {0};
    fx x;
    bool clean = fault_fx_open(&x, m, graphs) && CHECK(fx_feed(&x, tok, PROMPT, got) == AKV_OK);
    for (int i = 0; clean && i < STEPS; i++)
        clean = CHECK(fx_feed(&x, tok + PROMPT + i, 1, got) == AKV_OK);
    for (int f = 0; clean && f < AKV_N_FAULTS; f++)
        passes[f] = akv_dev_fault_passes(x.dev, (akv_dev_fault)f);
    clean = clean && CHECK(fx_feed(&x, tok + PROMPT + STEPS, 1, want) == AKV_OK);
    for (int f = 0; clean && f < AKV_N_FAULTS; f++)
        passes[f] = akv_dev_fault_passes(x.dev, (akv_dev_fault)f) - passes[f];
    fx_close(&x); /* a failed open leaves a fixture that closes */
    if (!clean) goto out;
    for (int f = 0; f < AKV_N_FAULTS; f++) {
        for (uint64_t k = 1; k <= passes[f]; k++, cases++) {
            if (!fault_fx_open(&x, m, graphs)) goto out;
            bool ok = CHECK(fx_feed(&x, tok, PROMPT, got) == AKV_OK);
            for (int i = 0; ok && i < STEPS; i++)
                ok = CHECK(fx_feed(&x, tok + PROMPT + i, 1, got) == AKV_OK);
            if (!ok) {
                fx_close(&x);
                goto out;
            }
            uint64_t n_before = r1_len(&x.q);
            CHECK_OK(akv_dev_inject_fault(x.dev, (akv_dev_fault)f, k, 0));
            /* the step may fail or not (a wait point may fail after the step's work was all
             * submitted, or the fault may land in work the step does not wait for, a
             * write-back): either way the device recovers and the step is redone from the same
             * history */
            (void)fx_feed(&x, tok + PROMPT + STEPS, 1, got);
            (void)akv_dev_sync(x.dev);
            CHECK_OK(akv_dev_clear_faults(x.dev));
            CHECK_OK(r1_truncate(&x.q, n_before));
            akv_status again = fx_feed(&x, tok + PROMPT + STEPS, 1, got);
            failed += again != AKV_OK;
            TEST_CHECK_(again == AKV_OK, "%s, fault '%s' at pass %llu: the step after recovery "
                        "failed: %s", graphs ? "graphs" : "op by op",
                        akv_dev_fault_name((akv_dev_fault)f), (unsigned long long)k,
                        akv_status_str(again));
            bool differ = again == AKV_OK && memcmp(got, want, c->n_vocab * sizeof *got) != 0;
            failed += differ;
            if (again == AKV_OK)
                TEST_CHECK_(!differ,
                            "%s, fault '%s' at pass %llu: the logits after recovery differ",
                            graphs ? "graphs" : "op by op",
                            akv_dev_fault_name((akv_dev_fault)f), (unsigned long long)k);
            fault_case_close(&x);
        }
    }
out:
    free(want), free(got);
    printf("  %s: %d fault cases, %d of them recovered to the clean run's logits\n",
           graphs ? "decode step replayed as a graph" : "decode step op by op", cases,
           cases - failed);
    return cases;
}

/* The first decode step (the one that records and builds the graph, or launches op by op)
 * with its k-th host allocation failing, for every k (the process-wide counter: the
 * submitting thread's allocations and the host ops' own on the compute worker): the run
 * fails cleanly or succeeds; either way, once the device recovers and the route is truncated
 * back, the step runs again to the clean run's logits, and the next step too. Returns the
 * cases tried. */
static int alloc_recovery(const akv_model *m, bool graphs) {
    const akv_model_config *c = akv_model_get_config(m);
    enum { PROMPT = 9 };
    int32_t tok[PROMPT + 3];
    for (int i = 0; i < PROMPT + 3; i++)
        tok[i] = (int32_t)((i * 5 + 1) % (int)c->n_vocab);
    float *want = malloc(2 * c->n_vocab * sizeof *want), *got = malloc(c->n_vocab * sizeof *got);
    int cases = 0, failed = 0;
    uint64_t n_allocs = 0;
    fx x;
    if (!fault_fx_open(&x, m, graphs) || !CHECK(fx_feed(&x, tok, PROMPT, got) == AKV_OK)) {
        fx_close(&x);
        goto out;
    }
    uint64_t a0 = akv__alloc_calls();
    bool ok = CHECK(fx_feed(&x, tok + PROMPT, 1, want) == AKV_OK);
    n_allocs = akv__alloc_calls() - a0;
    ok = ok && CHECK(fx_feed(&x, tok + PROMPT + 1, 1, want + c->n_vocab) == AKV_OK);
    fx_close(&x);
    for (uint64_t k = 1; ok && k <= n_allocs; k++, cases++) {
        if (!fault_fx_open(&x, m, graphs) || !CHECK(fx_feed(&x, tok, PROMPT, got) == AKV_OK)) {
            fx_close(&x);
            break;
        }
        uint64_t n_before = r1_len(&x.q);
        akv__alloc_fail_nth(k);
        akv_status st = fx_feed(&x, tok + PROMPT, 1, got);
        akv__alloc_fail_nth(0);
        /* host-side failures are ENOMEM; an op's own allocation failing on the compute worker
         * is a failed kernel: the queue faults (EDEVICE) until the device recovers */
        CHECK(st == AKV_OK || st == AKV_ENOMEM || st == AKV_EDEVICE);
        if (akv_dev_sync(x.dev) != AKV_OK) CHECK_OK(akv_dev_clear_faults(x.dev));
        CHECK_OK(akv_dev_sync(x.dev));
        if (st != AKV_OK) {
            CHECK_OK(r1_truncate(&x.q, n_before));
            st = fx_feed(&x, tok + PROMPT, 1, got);
        }
        bool same = st == AKV_OK && !memcmp(got, want, c->n_vocab * sizeof *got);
        same = same && fx_feed(&x, tok + PROMPT + 1, 1, got) == AKV_OK &&
               !memcmp(got, want + c->n_vocab, c->n_vocab * sizeof *got);
        failed += !same;
        TEST_CHECK_(same, "%s, allocation %llu of the first decode step failing: the steps "
                    "after it differ from the clean run (or failed)",
                    graphs ? "graphs" : "op by op", (unsigned long long)k);
        fault_case_close(&x);
    }
out:
    free(want), free(got);
    printf("  %s: %d allocation-failure cases, %d of them recovered to the clean run's logits\n",
           graphs ? "first decode step building its graph" : "first decode step op by op",
           cases, cases - failed);
    return cases;
}

/* The llama shape's model with every matrix in GGUF block type `type` (the file quantized
 * from the drawn weights), loaded with native storage; NULL if it fails. */
static akv_model *load_blocks(const tm_shape *s, uint64_t seed, uint32_t type) {
    tm_model m;
    tm_init(&m, s, seed);
    for (int i = 0; i < m.n_t; i++) {
        tm_tensor *t = &m.t[i];
        if (t->n_dims != 2) continue;
        const size_t n = (size_t)(t->ne[0] * t->ne[1]);
        void *q = akv__malloc(n * 4);
        if (!q || akv_gguf_quantize(type, t->data, n, q) != AKV_OK) abort();
        size_t bytes;
        if (akv_gguf_type_bytes(type, n, &bytes) != AKV_OK) abort();
        memcpy(t->data, q, bytes);
        akv__free(q);
        t->type = type, t->raw_bytes = bytes;
    }
    return tm_write_load(&m);
}

int main(int argc, char **argv) {
    test_args(argc, argv);
    uint64_t rng = test_seed(17);
    const tm_shape llama = {.arch = "llama",
                            .n_layers = 2,
                            .n_embd = 32,
                            .n_ff = 48,
                            .n_heads = 4,
                            .n_kv_heads = 2,
                            .n_vocab = 37};

    TEST_CASE(llama_chunks_and_decode) {
        akv_model *m = fx_load_bf16_exact(&llama, rng);
        if (!CHECK(m != NULL)) break;
        /* chunks of 8: 37 = 8+8+8+8+5 (prefill kernel); chunks of 3: the decode kernel */
        compare_passes(m, 8, 37, 6, TOL, &rng);
        compare_passes(m, 3, 7, 4, TOL, &rng);
        compare_passes(m, 64, 1, 20, TOL, &rng);
        akv_model_destroy(m);
    }

    TEST_CASE(block_weights_on_the_device_pass) {
        /* every matrix in Q8_0, Q4_0, Q4_1: the device pass keeps them as blocks (fused Q|K|V
         * and gate|up too) and decodes them in its products; against the host pass, whose
         * block products quantize activations to 8 bits (measured 0.011-0.013 relative; the
         * bound holds 3x that) */
        tm_shape b = llama;
        b.n_ff = 64, b.weight_scale = 0.25f; /* rows of whole blocks of 32 */
        static const uint32_t types[3] = {AKV_GGUF_TYPE_Q8_0, AKV_GGUF_TYPE_Q4_0, AKV_GGUF_TYPE_Q4_1};
        for (int ti = 0; ti < 3; ti++) {
            akv_model *m = load_blocks(&b, rng, types[ti]);
            if (!CHECK(m != NULL)) break;
            CHECK(akv_ops_wtype_is_block(akv_model_get_layer(m, 0)->wq.type));
            fx d;
            if (fx_open(&d, akv_dev_host_backend(), m, P, 64, 8, true)) {
                /* the device holds the blocks: fewer bytes than bf16 would take */
                const akv_model_config *c = akv_model_get_config(m);
                const uint64_t bf16 = 2ull * c->n_layers *
                                      ((uint64_t)(c->n_heads + 2 * c->n_kv_heads) * c->head_dim * c->n_embd +
                                       (uint64_t)c->n_heads * c->head_dim * c->n_embd + 3ull * c->n_ff * c->n_embd);
                CHECK(akv_forward_dev_weight_bytes(d.fd) < bf16);
            }
            fx_close(&d);
            compare_passes(m, 8, 37, 6, 0.04, &rng);
            compare_passes(m, 64, 1, 12, 0.04, &rng);
            akv_model_destroy(m);
        }
        /* heads wider than the stream: the attention's output rows (n_heads * head_dim = 128)
         * are the widest matrix rows of the file, longer than n_embd and n_ff (the load's row
         * buffer must fit them: ASan checks it) */
        tm_shape w = b;
        w.head_dim = 32;
        akv_model *m = load_blocks(&w, rng, AKV_GGUF_TYPE_Q8_0);
        if (!CHECK(m != NULL)) break;
        CHECK_EQ_INT(akv_model_get_layer(m, 0)->wo.cols, 128);
        compare_passes(m, 8, 21, 4, 0.04, &rng);
        akv_model_destroy(m);
    }

    TEST_CASE(qwen2_bias_neox_tied_rope_factors) {
        tm_shape q = llama;
        q.arch = "qwen2", q.tied = true;
        akv_model *m = fx_load_bf16_exact(&q, rng);
        if (!CHECK(m != NULL)) break;
        compare_passes(m, 16, 33, 5, TOL, &rng);
        akv_model_destroy(m);
        tm_shape f = llama;
        f.rope_factors = true, f.n_layers = 3;
        if (!CHECK((m = fx_load_bf16_exact(&f, rng)) != NULL)) break;
        compare_passes(m, 5, 17, 5, TOL, &rng);
        akv_model_destroy(m);
    }

    TEST_CASE(qwen3_head_norms_on_both_passes) {
        /* the head norm op (one launch over every Q and K head of the qkv rows) against the
         * host pass's per-head norms; a head dimension apart from n_embd / n_heads */
        tm_shape q = llama;
        q.arch = "qwen3", q.head_dim = 16, q.n_kv_heads = 1;
        akv_model *m = fx_load_bf16_exact(&q, rng);
        if (!CHECK(m != NULL)) break;
        CHECK(akv_model_get_config(m)->has_qk_norm);
        compare_passes(m, 16, 33, 5, TOL, &rng);
        compare_passes(m, 5, 17, 5, TOL, &rng);
        akv_model_destroy(m);
    }

    TEST_CASE(decode_graph_replay_matches_op_by_op) {
        akv_model *m = fx_load_bf16_exact(&llama, rng);
        if (!CHECK(m != NULL)) break;
        fx_graph_vs_eager(akv_dev_host_backend(), m, P, 5, 2 * P + 3, &rng); /* 2 page turns */
        akv_model_destroy(m);
    }

    TEST_CASE(decode_step_recovers_from_every_device_fault_and_allocation_failure) {
        akv_model *m = fx_load_bf16_exact(&llama, rng);
        if (!CHECK(m != NULL)) break;
        CHECK(fault_recovery(m, true) > 0);
        CHECK(fault_recovery(m, false) > 0);
        CHECK(alloc_recovery(m, true) > 0);
        CHECK(alloc_recovery(m, false) > 0);
        akv_model_destroy(m);
    }

    TEST_CASE(fill_is_the_shared_formula) {
        akv_dev *dev = NULL;
        if (!CHECK(akv_dev_create(akv_dev_host_backend(), NULL, &dev) == AKV_OK)) break;
        akv_dptr y;
        CHECK_OK(akv_dev_mem_alloc(dev, 97 * sizeof(float), &y));
        akv_fwd_fill_args a = {
            .y = y, .n = 97, .seed = 5, .center = 1, .scale = 0.25f, .y_dtype = AKV_DTYPE_F32};
        CHECK_OK(akv_dev_op_launch(dev, &akv_fwd_op_fill, &a, sizeof a));
        CHECK_OK(akv_dev_queue_sync(dev, AKV_QUEUE_COMPUTE));
        float got[97];
        CHECK_OK(akv_dev_copy_d2h_sync(dev, got, y, sizeof got));
        int bad = 0;
        for (int i = 0; i < 97; i++) {
            float w = akv_fwd_fill_value(5, (uint64_t)i, 1, 0.25f);
            bad += got[i] != w || !(w >= 0.75f && w < 1.25f);
        }
        CHECK_EQ_INT(bad, 0);
        CHECK_OK(akv_dev_mem_free(dev, y));
        CHECK_OK(akv_dev_destroy(dev));
    }

    TEST_CASE(synthetic_weights_run) {
        /* the benchmark's path: weights filled on the device from a config alone */
        akv_model *m = fx_load_bf16_exact(&llama, rng);
        if (!CHECK(m != NULL)) break;
        fx d;
        if (fx_open(&d, akv_dev_host_backend(), m, P, 64, 8, true)) {
            akv_forward_dev *syn = NULL;
            akv_forward_params fp = {.max_step_tokens = 8};
            CHECK_OK(akv_forward_dev_create_synthetic(d.dev, akv_model_get_config(m), 3, &fp,
                                                      &syn));
            if (syn) {
                akv_forward_dev_destroy(d.fd);
                d.fd = syn;
                int32_t ids[11] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
                float logits[37];
                CHECK_OK(fx_feed(&d, ids, 11, logits));
                int finite = 1;
                for (int i = 0; i < 37; i++)
                    finite &= isfinite(logits[i]) != 0;
                CHECK(finite);
            }
        }
        fx_close(&d);
        akv_model_destroy(m);
    }

    TEST_CASE(gemma3_is_refused_by_name) {
        /* the device pass has no post-norms, GeGLU, windows or embedding scale yet */
        akv_model *m = fx_load_bf16_exact(&llama, rng);
        if (!CHECK(m != NULL)) break;
        akv_dev *dev = NULL;
        if (CHECK(akv_dev_create(akv_dev_host_backend(), NULL, &dev) == AKV_OK)) {
            akv_model_config c = *akv_model_get_config(m);
            c.arch = AKV_MODEL_ARCH_GEMMA3, c.has_post_norms = true, c.ffn_act = AKV_FFN_GEGLU;
            snprintf(c.arch_name, sizeof c.arch_name, "gemma3");
            akv_forward_dev *fd = NULL;
            akv_forward_params fp = {.max_step_tokens = 8};
            akv_log_set(NULL, NULL, AKV_LOG_OFF);
            CHECK_STATUS(akv_forward_dev_create_synthetic(dev, &c, 3, &fp, &fd), AKV_EUNSUPPORTED);
            akv_log_set(NULL, NULL, AKV_LOG_WARN);
            CHECK(fd == NULL);
            akv_dev_destroy(dev);
        }
        akv_model_destroy(m);
    }

    TEST_CASE(bad_requests) {
        akv_model *m = fx_load_bf16_exact(&llama, rng);
        if (!CHECK(m != NULL)) break;
        fx d;
        if (fx_open(&d, akv_dev_host_backend(), m, P, 64, 8, true)) {
            float logits[37];
            int32_t bad[2] = {1, 37};
            CHECK_STATUS(fx_feed(&d, bad, 2, logits), AKV_EINVAL); /* outside the vocabulary */
            CHECK_EQ_U64(r1_len(&d.q), 0);
            int32_t ok[3] = {1, 2, 3};
            CHECK_OK(fx_feed(&d, ok, 3, logits));
            akv_kv_hooks kv = akv_route_hooks(d.q.r);
            CHECK_STATUS(akv_forward_dev_run(d.fd, ok, 9, 3, &kv, logits, false), AKV_EINVAL);
            CHECK_STATUS(akv_forward_dev_run(d.fd, ok, 0, 3, &kv, logits, false), AKV_EINVAL);
            CHECK(akv_forward_dev_weight_bytes(d.fd) > 0);
        }
        fx_close(&d);
        akv_model_destroy(m);
    }

    CHECK_EQ_INT(test_alloc_live_settled(), 0);
    return test_finish();
}
