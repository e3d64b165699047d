/*
 * fuzz_tok.c — libFuzzer target for the tokenizer's input side: any bytes, encoded with each
 * pre-tokenizer, then decoded (whole and streaming) and rendered as chat messages. Checks:
 * no crash or sanitizer report; every id in range; decode(encode(x)) == x with invalid UTF-8
 * replaced (the tiny vocabulary has every byte); the streaming decode of random ids equals the
 * lossy decode. With AKV_FUZZ_MODEL=path/to.gguf the model's own vocabulary is fuzzed too.
 *
 * Build and run (clang; see docs/tok.md):
 *   CC=clang AKV_CMAKE_ARGS="-DAKV_FUZZ=ON -DAKV_CUDA=OFF" bash scripts/build build-fuzz
 *   build-fuzz/tests/fuzz_tok -max_total_time=300 -max_len=4096
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "akv/chat.h"
#include "akv/gguf.h"
#include "akv/log.h"
#include "akv/tok.h"
#include "tok/utf8.h"
#include "tok_tiny.h"

static akv_tok *fuzz_toks[5]; /* tiny with gpt2, smollm, llama-bpe, qwen2; the model (optional) */
static akv_chat *fuzz_chat;
static tiny fuzz_tiny;

static void fuzz_fail(const char *what, size_t n) {
    fprintf(stderr, "fuzz_tok: %s (input of %zu bytes)\n", what, n);
    abort();
}

static void fuzz_init(void) {
    akv_log_set(NULL, NULL, AKV_LOG_OFF);
    tiny_init(&fuzz_tiny, extra, extra_types, sizeof extra / sizeof extra[0], merges_bc_first, 6,
              -1);
    for (int pre = 0; pre < 4; pre++) {
        fuzz_tiny.p.pre = (akv_tok_pre)pre;
        if (akv_tok_create(&fuzz_tiny.p, &fuzz_toks[pre]) != AKV_OK) abort();
    }
    const char *model = getenv("AKV_FUZZ_MODEL");
    akv_gguf *g = NULL;
    if (model && akv_gguf_open(model, &g) == AKV_OK) {
        if (akv_tok_create_from_gguf(g, NULL, &fuzz_toks[4]) != AKV_OK) abort();
        akv_gguf_close(g);
    }
    akv_chat_params cp = {.name = "llama3", .bos_text = "<|im_start|>"};
    if (akv_chat_create(&cp, &fuzz_chat) != AKV_OK) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    if (!fuzz_toks[0]) fuzz_init();
    if (n == 0) return 0;
    /* Byte 0 picks the tokenizer and the flags; the rest is the text. */
    int which = data[0] % 5;
    const akv_tok *tok = fuzz_toks[which] ? fuzz_toks[which] : fuzz_toks[0];
    uint32_t flags = (data[0] >> 2) & 3;
    const uint8_t *s = data + 1;
    size_t len = n - 1;

    akv_tok_ids ids = {0};
    akv_tok_text back = {0}, streamed = {0}, lossy = {0}, chat = {0};
    if (akv_tok_encode(tok, (const char *)s, len, flags, &ids) != AKV_OK) fuzz_fail("encode", n);
    for (size_t i = 0; i < ids.n_ids; i++)
        if (ids.ids[i] < 0 || (size_t)ids.ids[i] >= akv_tok_n_tokens(tok))
            fuzz_fail("id out of range", n);
    if (akv_tok_decode(tok, ids.ids, ids.n_ids, AKV_TOK_DECODE_SPECIAL, &back) != AKV_OK)
        fuzz_fail("decode", n);
    if (which < 4) { /* the tiny vocabulary has every byte: exact round trip */
        uint8_t *want = malloc(3 * len + 1);
        size_t n_want = akv__utf8_sanitize(s, len, want);
        if (back.n_bytes != n_want || memcmp(back.bytes, want, n_want))
            fuzz_fail("decode(encode(x)) != sanitize(x)", n);
        free(want);
    }

    /* The input bytes read as ids (2 bytes each), streamed and decoded lossily. */
    akv_tok_stream st = {{0}, 0};
    size_t n_rid = len / 2;
    int32_t *rid = malloc((n_rid ? n_rid : 1) * sizeof *rid);
    for (size_t i = 0; i < n_rid; i++)
        rid[i] = (int32_t)((s[2 * i] | s[2 * i + 1] << 8) % akv_tok_n_tokens(tok));
    for (size_t i = 0; i < n_rid; i++)
        if (akv_tok_stream_push(tok, &st, rid[i], AKV_TOK_DECODE_SPECIAL, &streamed) != AKV_OK)
            fuzz_fail("stream push", n);
    if (akv_tok_stream_flush(&st, &streamed) != AKV_OK ||
        akv_tok_decode(tok, rid, n_rid, AKV_TOK_DECODE_SPECIAL | AKV_TOK_DECODE_LOSSY, &lossy))
        fuzz_fail("stream flush / lossy decode", n);
    if (streamed.n_bytes != lossy.n_bytes || memcmp(streamed.bytes, lossy.bytes, lossy.n_bytes) ||
        !akv__utf8_valid((const uint8_t *)streamed.bytes, streamed.n_bytes))
        fuzz_fail("stream decode != lossy decode", n);
    free(rid);

    /* The text as one chat message (trim runs over arbitrary bytes). */
    char *msg = malloc(len + 1);
    memcpy(msg, s, len);
    msg[len] = '\0';
    akv_chat_msg m = {"user", msg};
    if (akv_chat_render(fuzz_chat, &m, 1, true, &chat, NULL) != AKV_OK) fuzz_fail("chat render", n);
    free(msg);

    akv_tok_ids_free(&ids);
    akv_tok_text_free(&back);
    akv_tok_text_free(&streamed);
    akv_tok_text_free(&lossy);
    akv_tok_text_free(&chat);
    return 0;
}
