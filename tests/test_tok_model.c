/* test_tok_model.c — the tokenizer of the default model (SmolLM2-135M-Instruct, Q4_1): its
 * metadata, exact encodings checked against Hugging Face, round trips on a corpus of tricky
 * strings, the chat template as the file states it, and hostile input on the real vocabulary.
 * Skips (77) when models/ has no copy (scripts/fetch-model fetches it).
 *
 * The expected ids come from Hugging Face tokenizers 0.23.3 with a BPE built from this file's
 * own tokenizer.ggml.tokens/merges/token_type and SmolLM2's pre-tokenizer (Sequence[Digits(
 * individual_digits=True), ByteLevel(add_prefix_space=False)]), special tokens parsed, none
 * added:
 *   python3 scripts/tok-reference.py ids models/SmolLM2-135M-Instruct.Q4_1.gguf --c < in.jsonl
 * The chat renderings come from jinja2 3.1.6 running the file's tokenizer.chat_template
 * (scripts/tok-reference.py chat), and their ids from the same HF tokenizer. */
#define _POSIX_C_SOURCE 200809L
#include "test.h"
#include "model_path.h"


#include "akv/chat.h"
#include "akv/gguf.h"
#include "akv/tok.h"
#include "core/alloc.h"
#include "core/assert.h"
#include "core/clock.h"
#include "tok/tok_impl.h"
#include "tok/utf8.h"

#define T(s) s, sizeof(s) - 1

typedef struct expect {
    const char *text;
    size_t n_bytes;
    size_t n_ids;
    int32_t ids[64];
} expect;

/* clang-format off */
static const expect expected[] = {
    /* Bytes without a token are dropped by HF too (0x04; 0xF1 leading U+50000). */
    {T("a\x04" "b"), 2, {81, 82}},
    {T("x\xF1\x90\x80\x80" "y"), 5, {104, 234, 218, 218, 105}},
    {T("Hello, world!"), 4, {19556, 28, 905, 17}},
    {T("don't stop believing, I'll've they're WE'RE"), 13, {12420, 982, 2853, 16517, 28, 339, 3060, 3543, 502, 2316, 26587, 23, 3256}},
    {T("The year 2024 had 366 days; π≈3.14159 and 1,000,000."), 36, {504, 713, 216, 34, 32, 34, 36, 761, 216, 35, 38, 38, 2009, 43, 25143, 40533, 226, 35, 30, 33, 36, 33, 37, 41, 284, 216, 33, 28, 32, 32, 32, 28, 32, 32, 32, 30}},
    {T("    def f(x):\n        return x**2  # square\n"), 15, {333, 753, 275, 24, 104, 727, 448, 1003, 1792, 828, 34, 216, 907, 5222, 198}},
    {T("日本語のテキストと中文混合"), 24, {23274, 115, 40993, 179, 120, 248, 26453, 11100, 224, 10391, 251, 10391, 134, 11100, 226, 7365, 118, 28589, 29184, 177, 132, 132, 16357, 226}},
    {T("emoji 👨\xE2""\x80""\x8D""👩\xE2""\x80""\x8D""👧\xE2""\x80""\x8D""👦 🏳\xEF""\xB8""\x8F""\xE2""\x80""\x8D""🌈 👍🏽"), 35, {391, 33777, 15107, 235, 118, 321, 231, 10813, 235, 119, 321, 231, 10813, 235, 117, 321, 231, 10813, 235, 116, 15107, 233, 128, 31752, 321, 231, 10813, 230, 226, 15107, 235, 231, 10813, 233, 138}},
    {T("e\xCC""\x81"" n\xCC""\x83"" combining ẛ\xCC""\xA3"""), 12, {85, 151, 219, 304, 151, 221, 9301, 15822, 135, 245, 151, 113}},
    {T("  multiple   spaces\n\n\nand\ttabs\t\t"), 11, {216, 2701, 256, 5600, 1116, 198, 397, 197, 100, 7366, 1656}},
    {T("<|im_start|>user\nHi<|im_end|>\n<|endoftext|>"), 7, {1, 4093, 198, 26843, 2, 198, 0}},
    {T("Ελληνικά кириллица العربية ह\xE0""\xA4""\xBF""न\xE0""\xA5""\x8D""द\xE0""\xA5""\x80"""), 29, {153, 239, 17162, 17162, 25723, 11517, 12001, 21118, 26112, 31338, 7872, 46879, 12681, 35420, 32233, 6511, 27819, 34966, 20602, 31462, 23339, 43463, 12335, 134, 27011, 30658, 16525, 44757, 37189}},
    {T("\xC2""\xA0""nbsp\xE3""\x80""\x80""ideographic\xE2""\x80""\xA8""sep\xC2""\x85""nel"), 13, {15442, 94, 32093, 12109, 218, 489, 4551, 321, 118, 29070, 141, 223, 5824}},
    {T("a\x00""b\x7F""\x1B""[0m"), 8, {81, 190, 82, 217, 212, 75, 32, 93}},
    {T("{\"key\": [1, 2, 3], \"s\": \"x\\ny\"}"), 20, {39428, 2393, 1799, 933, 33, 28, 216, 34, 28, 216, 35, 1750, 476, 99, 1799, 476, 104, 76, 5568, 23597}},
    {T("\r\n\r\nwindows\r\nlines\r\n"), 7, {7209, 198, 37066, 201, 198, 5110, 2738}},
};
/* clang-format on */

/* The file's chat template on two conversations (the first gets the template's default
 * system message), rendered and encoded. */
static const akv_chat_msg conv0[] = {{"user", "What is the capital of France?"},
                                     {"assistant", "Paris."},
                                     {"user", "And of 日本? 👍"}};
static const akv_chat_msg conv1[] = {{"system", "You are terse."}, {"user", "Hi"}};
/* clang-format off */
static const expect expected_chat[] = {
    {T("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\nParis.<|im_end|>\n<|im_start|>user\nAnd of 日本? 👍<|im_end|>\n<|im_start|>assistant\n"), 60, {1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411, 407, 19712, 8182, 2, 198, 1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198, 38634, 30, 2, 198, 1, 4093, 198, 3528, 282, 17097, 241, 115, 40993, 47, 15107, 235, 231, 2, 198, 1, 520, 9531, 198}},
    {T("<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"), 20, {1, 9690, 198, 2683, 359, 1733, 313, 30, 2, 198, 1, 4093, 198, 26843, 2, 198, 1, 520, 9531, 198}},
};
/* clang-format on */

/* Round-trip corpus: decode(encode(x)) == x, with and without special-token parsing. */
static const char *const corpus[] = {
    "",
    " ",
    "\n",
    "    \n\n\n\t\t  \r\n",
    "The quick brown fox jumps over the lazy dog.",
    "don't won't can't I'd we'll they've she's IT'S O'Neil rock'n'roll ''quoted''",
    "0 1 12 123 1234 12345678901234567890 3.14159 -42 1e-9 0x7fff ٣٤٥ ½ Ⅻ",
    "中文字符测试，包括标点符号。日本語：ひらがな、カタカナ。한국어 텍스트",
    "👍 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 🇫🇷🇯🇵 ❤️ 🧑🏿‍💻 "
    "*️⃣",
    "e\xCC\x81 a\xCC\x88\xCC\x81 Z\xCD\x91\xCD\x9B\xCC\xB7\xCC\xA1 n\xCC\x83 "
    "\xE0\xA4\x95\xE0\xA5\x8D\xE0\xA4\xB7",
    "int main(void) {\n\tfor (int i = 0; i < 10; i++) printf(\"%d\\n\", i);\n\treturn 0;\n}\n",
    "def f(x):\n    return {'a': [1, 2, 3], \"b\": None}  # comment\n\n\nclass A: pass\n",
    "<|im_start|>user\n<|im_end|><|endoftext|><repo_name><file_sep><|im_start",
    "mixed: Ελληνικά, кириллица, العربية, עברית, हिन्दी, ไทย, ქართული",
    "\xC2\xA0\xE3\x80\x80\xE2\x80\xA8\xE2\x80\xA9\xC2\x85\xE1\xA0\x8E\xEF\xBB\xBF "
    "zero\xE2\x80\x8Bwidth",
    "\xF4\x8F\xBF\xBF \xEF\xBF\xBD \xEE\x80\x80 private use and the last code point",
    "https://example.com/path?q=1&r=%20#frag  user@example.org",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
    "a",
    "----------------------------------------------------------------=================",
};

static int ids_equal(const akv_tok_ids *got, const int32_t *want, size_t n_want, const char *what) {
    int ok = got->n_ids == n_want && (n_want == 0 || !memcmp(got->ids, want, n_want * 4));
    test_n_checks++;
    if (!ok) {
        test_fail(__FILE__, __LINE__);
        fprintf(stderr, "encode(\"%s\"):\n got ", what);
        for (size_t i = 0; i < got->n_ids; i++)
            fprintf(stderr, " %d", got->ids[i]);
        fprintf(stderr, "\n want");
        for (size_t i = 0; i < n_want; i++)
            fprintf(stderr, " %d", want[i]);
        fprintf(stderr, "\n");
    }
    return ok;
}

/* Whether every byte of s[0..n) has a token (else it cannot round-trip: it is dropped). */
static bool all_bytes_have_tokens(const akv_tok *tok, const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (tok->byte_token[s[i]] < 0) return false;
    return true;
}

static void check_round_trip(const akv_tok *tok, const char *s, size_t n, uint32_t flags) {
    akv_tok_ids ids = {0};
    akv_tok_text back = {0};
    CHECK_OK(akv_tok_encode(tok, s, n, flags, &ids));
    CHECK_OK(akv_tok_decode(tok, ids.ids, ids.n_ids, AKV_TOK_DECODE_SPECIAL, &back));
    size_t at = 0;
    while (at < n && at < back.n_bytes && back.bytes[at] == s[at])
        at++;
    if (!CHECK(back.n_bytes == n && at == n))
        fprintf(stderr,
                "round trip (flags %u) of %zu bytes gave %zu, first difference at byte "
                "%zu: \"%.*s\" became \"%.*s\"\n",
                flags, n, back.n_bytes, at, (int)(n - at < 40 ? n - at : 40), s + at,
                (int)(back.n_bytes - at < 40 ? back.n_bytes - at : 40), back.bytes + at);
    akv_tok_ids_free(&ids);
    akv_tok_text_free(&back);
}

int main(int argc, char **argv) {
    test_args(argc, argv);
    char path[4096];
    if (!test_model_path(path, sizeof path, 0))
        test_skip("no default model in models/ (run scripts/fetch-model)");
    akv_gguf *g = NULL;
    akv_tok *tok = NULL;

    TEST_CASE(loads_from_the_gguf) {
        CHECK_OK(akv_gguf_open(path, &g));
        if (!g) break;
        double t0 = akv_clock_s();
        CHECK_OK(akv_tok_create_from_gguf(g, NULL, &tok));
        printf("tokenizer loaded in %.1f ms\n", (akv_clock_s() - t0) * 1e3);
        if (!tok) break;
        CHECK(akv__tok_check(tok));
        CHECK_EQ_U64(akv_tok_n_tokens(tok), 49152);
        CHECK_EQ_INT(akv_tok_get_pre(tok), AKV_TOK_PRE_SMOLLM);
        akv_tok_specials sp = akv_tok_get_specials(tok);
        CHECK_EQ_INT(sp.bos_id, 1);
        CHECK_EQ_INT(sp.eos_id, 2);
        CHECK_EQ_INT(sp.unk_id, 0);
        CHECK_EQ_INT(sp.pad_id, 2);
        CHECK_EQ_INT(sp.eot_id, 2); /* no eot key: <|im_end|> by text */
        CHECK(!sp.add_bos && !sp.add_eos);
        CHECK_STR(akv_tok_token_text(tok, 1, NULL), "<|im_start|>");
        CHECK_EQ_INT(akv_tok_token_type(tok, 1), AKV_TOK_TYPE_CONTROL);
        CHECK_EQ_INT(akv_tok_token_type(tok, 17), AKV_TOK_TYPE_NORMAL);
        /* The bytes this vocabulary has no token for (dropped from the input). */
        static const uint8_t missing[] = {0x04, 0x06, 0x13, 0x14, 0x16, 0x1D, 0xC0,
                                          0xC1, 0xF1, 0xF2, 0xF5, 0xF6, 0xF7, 0xF8,
                                          0xF9, 0xFA, 0xFB, 0xFC, 0xFD, 0xFE, 0xFF};
        for (int b = 0, k = 0; b < 256; b++) {
            bool want_missing = k < (int)sizeof missing && missing[k] == b;
            k += want_missing;
            if (!CHECK((tok->byte_token[b] < 0) == want_missing)) fprintf(stderr, "byte %d\n", b);
        }
    }
    if (!tok) {
        akv_gguf_close(g);
        return test_finish();
    }

    TEST_CASE(encodings_match_hugging_face) {
        for (size_t i = 0; i < AKV_ARRAY_LEN(expected); i++) {
            const expect *e = &expected[i];
            akv_tok_ids ids = {0};
            CHECK_OK(akv_tok_encode(tok, e->text, e->n_bytes, AKV_TOK_PARSE_SPECIAL, &ids));
            ids_equal(&ids, e->ids, e->n_ids, e->text);
            /* add_bos is false in this file: ADD_SPECIAL changes nothing. */
            akv_tok_ids ids2 = {0};
            CHECK_OK(akv_tok_encode(tok, e->text, e->n_bytes,
                                    AKV_TOK_PARSE_SPECIAL | AKV_TOK_ADD_SPECIAL, &ids2));
            ids_equal(&ids2, e->ids, e->n_ids, e->text);
            akv_tok_ids_free(&ids);
            akv_tok_ids_free(&ids2);
        }
    }

    TEST_CASE(chat_template_as_the_file_says) {
        akv_chat *chat = NULL;
        CHECK_OK(akv_chat_create_from_gguf(g, NULL, &chat));
        if (!chat) break;
        CHECK_EQ_INT(akv_chat_get_kind(chat), AKV_CHAT_JINJA); /* the file's own template, run */
        const akv_chat_msg *convs[] = {conv0, conv1};
        const size_t n_msgs[] = {AKV_ARRAY_LEN(conv0), AKV_ARRAY_LEN(conv1)};
        for (size_t c = 0; c < 2; c++) {
            akv_tok_text text = {0};
            akv_tok_ids ids = {0};
            CHECK_OK(akv_chat_render(chat, convs[c], n_msgs[c], true, &text, NULL));
            if (!CHECK(text.n_bytes == expected_chat[c].n_bytes &&
                       !memcmp(text.bytes, expected_chat[c].text, text.n_bytes)))
                fprintf(stderr, "rendered:\n%s\nwant:\n%s\n", text.bytes, expected_chat[c].text);
            CHECK_OK(akv_tok_encode(tok, text.bytes, text.n_bytes, AKV_TOK_PARSE_SPECIAL, &ids));
            ids_equal(&ids, expected_chat[c].ids, expected_chat[c].n_ids, "chat");
            akv_tok_text_free(&text);
            akv_tok_ids_free(&ids);
        }
        akv_chat_destroy(chat);
    }

    TEST_CASE(round_trip_corpus) {
        for (size_t i = 0; i < AKV_ARRAY_LEN(corpus); i++) {
            CHECK(akv__utf8_valid((const uint8_t *)corpus[i], strlen(corpus[i])));
            check_round_trip(tok, corpus[i], strlen(corpus[i]), AKV_TOK_PARSE_SPECIAL);
            check_round_trip(tok, corpus[i], strlen(corpus[i]), 0);
        }
        for (size_t i = 0; i < AKV_ARRAY_LEN(expected); i++)
            if (all_bytes_have_tokens(tok, (const uint8_t *)expected[i].text, expected[i].n_bytes))
                check_round_trip(tok, expected[i].text, expected[i].n_bytes, 0);
        /* All of it at once, and every code point of the BMP and some above (but those with a
         * byte that has no token), in one text. */
        akv_tok_text all = {0};
        for (size_t i = 0; i < AKV_ARRAY_LEN(corpus); i++)
            CHECK_OK(akv_tok_text_append(&all, corpus[i], strlen(corpus[i])));
        for (uint32_t cp = 1; cp < 0x30000; cp += (cp < 0x10000 ? 1 : 7)) {
            if (cp >= 0xD800 && cp < 0xE000) continue;
            uint8_t u[4];
            size_t n = akv__utf8_put(cp, u);
            if (all_bytes_have_tokens(tok, u, n)) CHECK_OK(akv_tok_text_append(&all, u, n));
        }
        check_round_trip(tok, all.bytes, all.n_bytes, AKV_TOK_PARSE_SPECIAL);
        akv_tok_text_free(&all);
    }

    TEST_CASE(hostile_input_on_the_real_vocabulary) {
        uint64_t rng = test_seed(0x5E11);
        uint8_t in[300], want[900];
        for (int iter = 0; iter < 1500; iter++) {
            size_t n = test_rand_below(&rng, sizeof in);
            for (size_t i = 0; i < n; i++) {
                static const uint8_t hot[] = {0xE4, 0xB8, 0xAD, 0xF0, 0x9F, 0x91, 0xC3, 0xA9, 0xE2,
                                              0x80, 0x8D, ' ',  '<',  '|',  '>',  '\n', '1',  'a'};
                in[i] = test_rand_below(&rng, 3) ? hot[test_rand_below(&rng, sizeof hot)]
                                                 : (uint8_t)test_rand(&rng);
            }
            /* Sanitised, then without the bytes that have no token. */
            size_t n_clean = akv__utf8_sanitize(in, n, want), n_want = 0;
            for (size_t i = 0; i < n_clean; i++)
                if (tok->byte_token[want[i]] >= 0) want[n_want++] = want[i];
            akv_tok_ids ids = {0};
            akv_tok_text back = {0};
            CHECK_OK(akv_tok_encode(tok, (const char *)in, n, AKV_TOK_PARSE_SPECIAL, &ids));
            CHECK_OK(akv_tok_decode(tok, ids.ids, ids.n_ids, AKV_TOK_DECODE_SPECIAL, &back));
            if (!CHECK(back.n_bytes == n_want && !memcmp(back.bytes, want, n_want))) {
                fprintf(stderr, "iteration %d: %zu random bytes do not round-trip\n", iter, n);
                break;
            }
            akv_tok_ids_free(&ids);
            akv_tok_text_free(&back);
        }
    }

    akv_tok_destroy(tok);
    akv_gguf_close(g);
    return test_finish();
}
