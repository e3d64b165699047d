/* test_tok_gemma.c — the SentencePiece tokenizer (akv/tok.h, model SPM) on Gemma 3 270M's
 * vocabulary (262,144 tokens with scores, byte fallback, whitespace runs as user-defined
 * tokens, no space prefix): its metadata, exact encodings checked against llama.cpp, round
 * trips, and hostile input. Skips (77) when models/ has no copy (scripts/fetch-model
 * gemma3-270m fetches it).
 *
 * The expected ids come from llama.cpp's llama-tokenize (the tree of the llama-cpp-python
 * 0.3.36 sdist, CPU build), on this file, each string read verbatim from a file:
 *   llama-tokenize -m gemma-3-270m-q4_k_m.gguf -f IN --ids --no-escape --no-bos
 *     [--no-parse-special where `special` is 0]
 * The same tool and ours gave identical ids on 28 KB of license text, hostile strings and
 * random characters, and on six 20,000-character random texts over Latin, CJK, emoji,
 * whitespace and the special tokens' texts (about 195,000 ids; docs/tok.md). */
#define _POSIX_C_SOURCE 200809L
#include "test.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "akv/gguf.h"
#include "akv/tok.h"
#include "tok/tok_impl.h"

#define T(s) s, sizeof(s) - 1

typedef struct expect {
    const char *text;
    size_t n_bytes;
    int special; /* AKV_TOK_PARSE_SPECIAL */
    size_t n_ids;
    int32_t ids[40];
} expect;

/* clang-format off */
static const expect expected[] = {
    {T("Hello, world!"), 1, 4, {9259, 236764, 1902, 236888}},
    {T("The year 2024 had 366 days; \xCF\x80\xE2\x89\x88" "3.14159 and 1,000,000."), 1, 35, {818, 1051, 236743, 236778, 236771, 236778, 236812, 1053, 236743, 236800, 236825, 236825, 2668, 236793, 4609, 240443, 236800, 236761, 236770, 236812, 236770, 236810, 236819, 532, 236743, 236770, 236764, 236771, 236771, 236771, 236764, 236771, 236771, 236771, 236761}},
    {T("    def f(x):\n        return x**2  # square\n"), 1, 16, {140, 2063, 517, 236769, 236781, 1473, 107, 144, 2060, 1123, 1018, 236778, 138, 236865, 6281, 107}},
    {T("\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E\xE3\x81\xAE\xE3\x83\x86\xE3\x82\xAD\xE3\x82\xB9\xE3\x83\x88\xE3\x81\xA8\xE4\xB8\xAD\xE6\x96\x87\xE6\xB7\xB7\xE5\x90\x88"), 1, 6, {94951, 236945, 95830, 237032, 55041, 60478}},
    {T("emoji \xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x91\xA7\xE2\x80\x8D\xF0\x9F\x91\xA6 \xF0\x9F\x8F\xB3\xEF\xB8\x8F\xE2\x80\x8D\xF0\x9F\x8C\x88 \xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD"), 1, 16, {67906, 236743, 243874, 237243, 243767, 237243, 244814, 237243, 244990, 236743, 248177, 238178, 237243, 243712, 103712, 242713}},
    {T("e\xCC\x81 n\xCC\x83 combining \xE1\xBA\x9B\xCC\xA3"), 1, 10, {236744, 238288, 538, 240810, 26614, 236743, 463, 424, 393, 239430}},
    {T("  multiple   spaces\n\n\nand\ttabs\t\t"), 1, 9, {138, 43819, 139, 35220, 109, 624, 255968, 39218, 255969}},
    {T("<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"), 1, 9, {105, 2364, 107, 10979, 106, 107, 105, 4368, 107}},
    {T("<start_of_turn>user\nHi<end_of_turn>"), 0, 17, {236820, 3041, 236779, 1340, 236779, 887, 236813, 2364, 107, 10979, 236820, 643, 236779, 1340, 236779, 887, 236813}},
    {T("\xCE\x95\xCE\xBB\xCE\xBB\xCE\xB7\xCE\xBD\xCE\xB9\xCE\xBA\xCE\xAC \xD0\xBA\xD0\xB8\xD1\x80\xD0\xB8\xD0\xBB\xD0\xBB\xD0\xB8\xD1\x86\xD0\xB0 \xD8\xA7\xD9\x84\xD8\xB9\xD8\xB1\xD8\xA8\xD9\x8A\xD8\xA9 \xE0\xA4\xB9\xE0\xA4\xBF\xE0\xA4\xA8\xE0\xA5\x8D\xE0\xA4\xA6\xE0\xA5\x80"), 1, 9, {238600, 109959, 42220, 13584, 1297, 25204, 7484, 87595, 85394}},
    {T("\xC2\xA0nbsp\xE3\x80\x80ideographic\xE2\x80\xA8sep\xC2\x85nel"), 1, 15, {432, 398, 11539, 465, 366, 366, 754, 9814, 464, 366, 406, 30868, 432, 371, 6726}},
    {T("{\"key\": [1, 2, 3], \"s\": \"x\\ny\"}"), 1, 20, {14937, 2478, 1083, 870, 236770, 236764, 236743, 236778, 236764, 236743, 236800, 1604, 623, 236751, 1083, 623, 236781, 236785, 1920, 25938}},
    {T("\r\n\r\nwindows\r\nlines\r\n"), 1, 10, {251, 107, 251, 107, 33908, 251, 107, 8721, 251, 107}},
    {T("\xE2\x96\x81" "already a space mark\xE2\x96\x81\xE2\x96\x81"), 1, 6, {3016, 496, 2557, 1686, 236743, 236743}},
    {T("<0x41> is text, <bos> too"), 0, 13, {236820, 236771, 236781, 236812, 236770, 236813, 563, 1816, 236764, 655, 46757, 236813, 2311}},
    {T("<bos><eos><pad>"), 1, 3, {2, 1, 0}},
    {T("\xEF\xAC\x81 ligatures, Stra\xC3\x9F" "e, \xC4\xB0stanbul"), 1, 7, {240811, 13300, 2746, 236764, 80176, 236764, 87125}},
    {T("xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx abababababababababababababababababababab"), 1, 16, {130987, 130987, 130987, 130987, 130987, 763, 111507, 111507, 111507, 111507, 111507, 111507, 111507, 111507, 111507, 596}},
    {T("\xF0\x9D\x95\x8F\xF0\x9F\xA7\xAC\xF3\xA0\x81\x81 astral"), 1, 10, {478, 395, 387, 381, 253633, 481, 398, 367, 367, 187715}},
    {T("trailing space "), 1, 3, {136697, 2557, 236743}},
};
/* clang-format on */

static bool ids_eq(const akv_tok *tok, const char *s, size_t n, uint32_t flags, const int32_t *want,
                   size_t n_want) {
    akv_tok_ids ids = {0};
    const bool ok = akv_tok_encode(tok, s, n, flags, &ids) == AKV_OK && ids.n_ids == n_want &&
                    (!n_want || !memcmp(ids.ids, want, n_want * sizeof *want));
    if (!ok) {
        fprintf(stderr, "encode(%.*s): got", (int)(n > 60 ? 60 : n), s);
        for (size_t i = 0; i < ids.n_ids; i++) fprintf(stderr, " %d", ids.ids[i]);
        fprintf(stderr, "\n");
    }
    akv_tok_ids_free(&ids);
    return ok;
}

int main(int argc, char **argv) {
    test_args(argc, argv);
    const char *src = getenv("AKV_SOURCE_DIR");
    char path[4096];
    snprintf(path, sizeof path, "%s/models/gemma-3-270m-q4_k_m.gguf", src ? src : ".");
    if (access(path, R_OK) != 0) test_skip("no Gemma 3 270M in models/ (scripts/fetch-model gemma3-270m)");
    akv_gguf *g = NULL;
    akv_tok *tok = NULL;
    if (!REQUIRE_OK(akv_gguf_open(path, &g)) || !REQUIRE_OK(akv_tok_create_from_gguf(g, NULL, &tok)))
        return test_finish();

    TEST_CASE(loads_from_the_gguf) {
        CHECK(akv_tok_get_model(tok) == AKV_TOK_MODEL_SPM);
        CHECK(akv_tok_n_tokens(tok) == 262144);
        const akv_tok_specials sp = akv_tok_get_specials(tok);
        CHECK(sp.bos_id == 2 && sp.eos_id == 1 && sp.unk_id == 3 && sp.pad_id == 0 && sp.add_bos &&
              !sp.add_eos);
        CHECK(!tok->add_space_prefix); /* tokenizer.ggml.add_space_prefix false */
        CHECK(akv__tok_check(tok));
        size_t n;
        const uint8_t *p = akv_tok_token_piece(tok, tok->byte_token[0x41], &n);
        CHECK(n == 1 && p[0] == 0x41); /* <0x41> */
    }

    TEST_CASE(encodings_match_llama_cpp) {
        for (size_t i = 0; i < sizeof expected / sizeof expected[0]; i++) {
            const expect *e = &expected[i];
            CHECK(ids_eq(tok, e->text, e->n_bytes, e->special ? AKV_TOK_PARSE_SPECIAL : 0, e->ids, e->n_ids));
        }
        /* BOS first when asked (add_bos_token true) */
        const int32_t hello[] = {2, 9259, 236764, 1902, 236888};
        CHECK(ids_eq(tok, T("Hello, world!"), AKV_TOK_ADD_SPECIAL, hello, 5));
    }

    TEST_CASE(round_trips) {
        /* without specials parsed, decode(encode(x)) == x for valid UTF-8 (no space prefix to
         * strip: Gemma adds none) without U+2581, which is the vocabulary's space and decodes
         * as ' ' (as in llama.cpp) */
        for (size_t i = 0; i < sizeof expected / sizeof expected[0]; i++) {
            const expect *e = &expected[i];
            if (strstr(e->text, "\xE2\x96\x81")) {
                akv_tok_ids ids = {0};
                akv_tok_text t = {0};
                CHECK_OK(akv_tok_encode(tok, e->text, e->n_bytes, 0, &ids));
                CHECK_OK(akv_tok_decode(tok, ids.ids, ids.n_ids, 0, &t));
                size_t marks = 0; /* each 3-byte mark comes back as one space */
                for (const char *m = e->text; (m = strstr(m, "\xE2\x96\x81")); m += 3) marks++;
                CHECK(t.n_bytes == e->n_bytes - 2 * marks && t.bytes[0] == ' ');
                akv_tok_ids_free(&ids);
                akv_tok_text_free(&t);
                continue;
            }
            akv_tok_ids ids = {0};
            akv_tok_text t = {0};
            CHECK_OK(akv_tok_encode(tok, e->text, e->n_bytes, 0, &ids));
            CHECK_OK(akv_tok_decode(tok, ids.ids, ids.n_ids, AKV_TOK_DECODE_SPECIAL, &t));
            if (!CHECK(t.n_bytes == e->n_bytes && !memcmp(t.bytes, e->text, e->n_bytes)))
                fprintf(stderr, "round trip %zu: got %zu bytes, want %zu\n", i, t.n_bytes, e->n_bytes);
            akv_tok_ids_free(&ids);
            akv_tok_text_free(&t);
        }
    }

    TEST_CASE(hostile_input_on_the_real_vocabulary) {
        uint64_t rng = test_seed(20261207);
        uint8_t buf[512];
        for (int iter = 0; iter < 300; iter++) {
            const size_t n = test_rand_below(&rng, sizeof buf);
            for (size_t i = 0; i < n; i++) buf[i] = (uint8_t)test_rand_below(&rng, 256);
            akv_tok_ids ids = {0};
            if (!REQUIRE_OK(akv_tok_encode(tok, (const char *)buf, n, AKV_TOK_PARSE_SPECIAL, &ids))) break;
            for (size_t i = 0; i < ids.n_ids; i++)
                if (!CHECK(ids.ids[i] >= 0 && ids.ids[i] < 262144)) break;
            akv_tok_text t = {0};
            CHECK_OK(akv_tok_decode(tok, ids.ids, ids.n_ids, AKV_TOK_DECODE_LOSSY, &t));
            akv_tok_ids_free(&ids);
            akv_tok_text_free(&t);
        }
    }

    akv_tok_destroy(tok);
    akv_gguf_close(g);
    return test_finish();
}
