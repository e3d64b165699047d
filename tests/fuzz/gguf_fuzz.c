/*
 * gguf_fuzz.c — libFuzzer target for everything that reads a GGUF file: any byte string is
 * opened from memory; when it is accepted, the validity walker must pass and every getter is
 * exercised (each kv, every array element, every tensor by name, a row of each decodable
 * tensor); then the model loader, the tokenizer and the chat template are made from it (each
 * may refuse it, with a status, never a crash or a leak), and an accepted tokenizer encodes
 * and decodes a fixed text. Built with -DAKV_FUZZ=ON and clang (tests/fuzz/CMakeLists.txt);
 * every build also replays the corpus through it (fuzz_replay_gguf, tests/fuzz/replay.c);
 * docs/gguf.md has the commands and the recorded runs.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "akv/chat.h"
#include "akv/gguf.h"
#include "akv/gguf_quant.h"
#include "akv/log.h"
#include "akv/model.h"
#include "akv/tok.h"
#include "gguf/gguf_impl.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void quiet(akv_log_level level, const char *msg, void *user) {
    (void)level, (void)msg, (void)user;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    akv_log_set(quiet, NULL, AKV_LOG_DEBUG); /* still formats every message */
    /* An exact-size copy, so AddressSanitizer sees any read past the end. */
    uint8_t *copy = malloc(size ? size : 1);
    if (!copy) return 0;
    memcpy(copy, data, size);
    akv_gguf *g = NULL;
    if (akv_gguf_open_memory(copy, size, &g) == AKV_OK) {
        if (!akv__gguf_check(g)) abort();
        volatile uint64_t sink = 0;
        for (size_t i = 0; i < akv_gguf_n_kv(g); i++) {
            size_t j;
            if (akv_gguf_find_kv(g, akv_gguf_kv_key(g, i), &j) != AKV_OK || j != i) abort();
            akv_gguf_value v = akv_gguf_kv_value(g, i);
            if (v.type == AKV_GGUF_VTYPE_STRING) sink += v.as.str.len ? (uint8_t)v.as.str.ptr[v.as.str.len - 1] : 0;
            if (v.type != AKV_GGUF_VTYPE_ARRAY) continue;
            for (uint64_t e = 0; e < v.as.arr.n; e++) {
                if (v.as.arr.type == AKV_GGUF_VTYPE_STRING) {
                    akv_gguf_str s = akv_gguf_arr_str(g, &v.as.arr, e);
                    sink += s.len ? (uint8_t)s.ptr[s.len - 1] : 0;
                } else if (v.as.arr.type == AKV_GGUF_VTYPE_F32 || v.as.arr.type == AKV_GGUF_VTYPE_F64) {
                    sink += (uint64_t)(akv_gguf_arr_float(&v.as.arr, e) != 0);
                } else {
                    sink += (uint64_t)akv_gguf_arr_int(&v.as.arr, e);
                }
            }
        }
        uint64_t u;
        akv_gguf_get_u64(g, "general.alignment", &u);
        float row[4096];
        for (size_t i = 0; i < akv_gguf_n_tensors(g); i++) {
            const akv_gguf_tensor *t = akv_gguf_tensor_at(g, i), *found = NULL;
            if (akv_gguf_find_tensor(g, t->name, &found) != AKV_OK || found != t) abort();
            if (t->n_elems && t->ne[0] <= 4096 && akv_gguf_can_dequant(t->type) &&
                akv_gguf_dequant_f32(t->type, t->data, t->ne[0], row) != AKV_OK)
                abort();
        }
        (void)sink;
        /* what reads a GGUF after the reader: each refuses with a status or holds */
        akv_tok *tok = NULL;
        if (akv_tok_create_from_gguf(g, NULL, &tok) == AKV_OK) {
            static const char text[] = "Hello, world! 123 <|im_start|>user\n\xc3\xa9t\xc3\xa9";
            akv_tok_ids ids = {0};
            akv_tok_text back = {0};
            if (akv_tok_encode(tok, text, sizeof text - 1, AKV_TOK_PARSE_SPECIAL, &ids) == AKV_OK) {
                for (size_t i = 0; i < ids.n_ids; i++)
                    if (ids.ids[i] < 0 || (size_t)ids.ids[i] >= akv_tok_n_tokens(tok)) abort();
                akv_tok_decode(tok, ids.ids, ids.n_ids, AKV_TOK_DECODE_SPECIAL, &back);
            }
            akv_tok_ids_free(&ids);
            akv_tok_text_free(&back);
            akv_tok_destroy(tok);
        }
        akv_chat *chat = NULL;
        if (akv_chat_create_from_gguf(g, NULL, &chat) == AKV_OK) {
            akv_tok_text out = {0};
            akv_chat_msg m[2] = {{"system", "be brief"}, {"user", "hi"}};
            akv_chat_render(chat, m, 2, true, &out, NULL);
            akv_tok_text_free(&out);
            akv_chat_destroy(chat);
        }
        akv_gguf_close(g);
        akv_model *model = NULL;
        if (akv_model_load_memory(copy, size, NULL, &model) == AKV_OK) {
            const akv_model_config *c = akv_model_get_config(model);
            if (!c->n_layers || !akv_model_tok_embd(model)->data || !akv_model_output(model)->data) abort();
        } else if (model) {
            abort();
        }
        akv_model_destroy(model);
    } else if (g) {
        abort(); /* a refused open must not hand out an object */
    }
    free(copy);
    return 0;
}
