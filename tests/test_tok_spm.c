/* test_tok_spm.c — the SentencePiece-style tokenizer (akv/tok.h, model SPM) on a small
 * vocabulary with scores: against a plain quadratic reference of the same rule (join the
 * adjacent pair whose text is the token of highest score, leftmost on ties, until none is a
 * token; a symbol that is no token becomes its bytes' <0xNN> tokens) on random text of
 * awkward characters; the space prefix, special tokens, byte fallback, pieces and decode; the
 * refusals. Gemma 3's real vocabulary against llama.cpp: test_tok_model. */
#include "test.h"

#include <math.h>
#include <string.h>

#include "akv/log.h"
#include "akv/tok.h"
#include "tok/tok_impl.h"

#define SP "\xE2\x96\x81" /* U+2581, the vocabulary's space */

enum { N_BYTES = 256 };

/* The vocabulary: 0 <unk>, 1 <s>, 2 </s>, 3 <|turn|> (CONTROL), 4 "<u>" (USER_DEFINED), then
 * the words below, then <0x00>..<0xFF> (BYTE). Scores: the words' own (ties on purpose). */
static const struct {
    const char *text;
    float score;
} words[] = {
    {SP, -1.0f},         {"a", -2.0f},         {"b", -2.0f},         {"c", -3.0f},
    {"ab", -1.5f},       {"bc", -1.5f},        {"abc", -0.5f},       {SP "a", -1.0f},
    {SP "ab", -0.8f},    {"ca", -1.5f},        {"cab", -0.7f},       {SP SP, -0.9f},
    {"\xC3\xA9", -4.0f}, {"b\xC3\xA9", -1.2f}, {"aa", -1.5f},        {"aaa", -1.4f},
};
enum { N_FIXED = 5, N_WORDS = sizeof words / sizeof words[0], BYTE0 = N_FIXED + N_WORDS };

typedef struct spm_vocab {
    char bytes[N_BYTES][7];
    const char *texts[BYTE0 + N_BYTES];
    int32_t types[BYTE0 + N_BYTES];
    float scores[BYTE0 + N_BYTES];
    akv_tok_params p;
} spm_vocab;

static void vocab_init(spm_vocab *v, bool space_prefix) {
    static const char *const fixed[N_FIXED] = {"<unk>", "<s>", "</s>", "<|turn|>", "<u>"};
    static const int32_t fixed_types[N_FIXED] = {AKV_TOK_TYPE_UNKNOWN, AKV_TOK_TYPE_CONTROL,
                                                 AKV_TOK_TYPE_CONTROL, AKV_TOK_TYPE_CONTROL,
                                                 AKV_TOK_TYPE_USER_DEFINED};
    for (int i = 0; i < N_FIXED; i++)
        v->texts[i] = fixed[i], v->types[i] = fixed_types[i], v->scores[i] = 0.0f;
    for (int i = 0; i < N_WORDS; i++)
        v->texts[N_FIXED + i] = words[i].text, v->types[N_FIXED + i] = AKV_TOK_TYPE_NORMAL,
                       v->scores[N_FIXED + i] = words[i].score;
    for (int b = 0; b < N_BYTES; b++) {
        snprintf(v->bytes[b], sizeof v->bytes[b], "<0x%02X>", b);
        v->texts[BYTE0 + b] = v->bytes[b], v->types[BYTE0 + b] = AKV_TOK_TYPE_BYTE;
        v->scores[BYTE0 + b] = 0.0f;
    }
    v->p = akv_tok_default_params();
    v->p.model = AKV_TOK_MODEL_SPM;
    v->p.n_tokens = BYTE0 + N_BYTES;
    v->p.tokens = v->texts;
    v->p.token_types = v->types;
    v->p.scores = v->scores;
    v->p.unk_id = 0, v->p.bos_id = 1, v->p.eos_id = 2, v->p.add_bos = true;
    v->p.add_space_prefix = space_prefix;
}

static int32_t word_id(const char *text) {
    for (int i = 0; i < N_WORDS; i++)
        if (!strcmp(words[i].text, text)) return N_FIXED + i;
    return -1;
}

/* ---- the reference: the rule, quadratic, on an array of strings ---------------------------- */

static size_t ref_encode(const char *s, bool prefix, int32_t *out) {
    char esc[1024];
    size_t m = 0;
    if (prefix) memcpy(esc, SP, 3), m = 3;
    for (const char *c = s; *c; c++) {
        if (*c == ' ') memcpy(esc + m, SP, 3), m += 3;
        else esc[m++] = *c;
    }
    /* symbols as [start, end) over esc, one a character */
    size_t st[1024], en[1024], k = 0;
    for (size_t i = 0; i < m;) {
        const unsigned char b = (unsigned char)esc[i];
        size_t len = b < 0xC0 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
        st[k] = i, en[k] = i + len, k++, i += len;
    }
    for (;;) {
        int best = -1;
        float best_score = 0;
        for (size_t i = 0; i + 1 < k; i++) {
            const size_t n = en[i + 1] - st[i];
            for (int w = 0; w < N_WORDS; w++)
                if (strlen(words[w].text) == n && !memcmp(words[w].text, esc + st[i], n) &&
                    (best < 0 || words[w].score > best_score)) /* strict: leftmost on ties */
                    best = (int)i, best_score = words[w].score;
        }
        if (best < 0) break;
        en[best] = en[best + 1];
        memmove(st + best + 1, st + best + 2, (k - best - 2) * sizeof *st);
        memmove(en + best + 1, en + best + 2, (k - best - 2) * sizeof *en);
        k--;
    }
    size_t n_out = 0;
    for (size_t i = 0; i < k; i++) {
        char t[64];
        memcpy(t, esc + st[i], en[i] - st[i]);
        t[en[i] - st[i]] = '\0';
        const int32_t id = word_id(t);
        if (id >= 0) out[n_out++] = id;
        else
            for (size_t j = st[i]; j < en[i]; j++) out[n_out++] = BYTE0 + (unsigned char)esc[j];
    }
    return n_out;
}

/* ---- helpers ------------------------------------------------------------------------------ */

static bool encode_eq(const akv_tok *tok, const char *s, uint32_t flags, const int32_t *want,
                      size_t n_want) {
    akv_tok_ids ids = {0};
    akv_status st = akv_tok_encode(tok, s, strlen(s), flags, &ids);
    bool ok = st == AKV_OK && ids.n_ids == n_want && (!n_want || !memcmp(ids.ids, want, n_want * 4));
    if (!ok) {
        fprintf(stderr, "encode(\"%s\"): got", s);
        for (size_t i = 0; i < ids.n_ids; i++) fprintf(stderr, " %d", ids.ids[i]);
        fprintf(stderr, ", want");
        for (size_t i = 0; i < n_want; i++) fprintf(stderr, " %d", want[i]);
        fprintf(stderr, "\n");
    }
    akv_tok_ids_free(&ids);
    return ok;
}
#define ENCODE_IS(tok, s, flags, ...)                                                              \
    do {                                                                                           \
        const int32_t want_[] = {__VA_ARGS__};                                                     \
        CHECK(encode_eq(tok, s, flags, want_, sizeof want_ / sizeof want_[0]));                   \
    } while (0)

static bool decodes_to(const akv_tok *tok, const int32_t *ids, size_t n, uint32_t flags, const char *want) {
    akv_tok_text t = {0};
    bool ok = akv_tok_decode(tok, ids, n, flags, &t) == AKV_OK && t.n_bytes == strlen(want) &&
              !memcmp(t.bytes, want, t.n_bytes);
    if (!ok) fprintf(stderr, "decode: got \"%.*s\", want \"%s\"\n", (int)t.n_bytes, t.bytes ? t.bytes : "", want);
    akv_tok_text_free(&t);
    return ok;
}

int main(int argc, char **argv) {
    test_args(argc, argv);
    uint64_t seed = test_seed(20261207);
    spm_vocab v;

    TEST_CASE(pairs_by_score_leftmost_on_ties) {
        vocab_init(&v, false);
        akv_tok *tok = NULL;
        if (!REQUIRE_OK(akv_tok_create(&v.p, &tok))) break;
        CHECK(akv__tok_check(tok) && akv_tok_get_model(tok) == AKV_TOK_MODEL_SPM);
        const int32_t a = word_id("a"), ab = word_id("ab"), abc = word_id("abc"),
                      bc = word_id("bc"), c = word_id("c"), cab = word_id("cab"),
                      sp_ab = word_id(SP "ab"), sp_sp = word_id(SP SP), aa = word_id("aa"),
                      aaa = word_id("aaa");
        ENCODE_IS(tok, "abc", 0, abc);   /* ab and bc tie at -1.5: ab (leftmost), then abc */
        ENCODE_IS(tok, "abcab", 0, abc, ab); /* cab (-0.7) never forms: abc came first */
        ENCODE_IS(tok, "cabc", 0, cab, c);   /* ca, ab, bc tie: ca (leftmost), then cab */
        ENCODE_IS(tok, " ab", 0, sp_ab);
        ENCODE_IS(tok, "  ab", 0, sp_sp, ab); /* ▁▁ (-0.9) before ▁a (-1.0) */
        ENCODE_IS(tok, "aaaa", 0, aaa, a);    /* aa, aa, aa tie: leftmost, then aaa (-1.4) */
        ENCODE_IS(tok, "bca", 0, bc, a);
        CHECK(encode_eq(tok, "", 0, NULL, 0));
        ENCODE_IS(tok, "a", AKV_TOK_ADD_SPECIAL, 1, a);
        (void)aa;
        akv_tok_destroy(tok);
    }

    TEST_CASE(byte_fallback_and_pieces) {
        vocab_init(&v, false);
        akv_tok *tok = NULL;
        if (!REQUIRE_OK(akv_tok_create(&v.p, &tok))) break;
        /* é is a token; b + é joins (-1.2); ü (C3 BC) is none: its two bytes; an invalid byte
         * becomes U+FFFD first (EF BF BD), none: three bytes */
        ENCODE_IS(tok, "\xC3\xA9", 0, word_id("\xC3\xA9"));
        ENCODE_IS(tok, "b\xC3\xA9", 0, word_id("b\xC3\xA9"));
        ENCODE_IS(tok, "\xC3\xBC" "a", 0, BYTE0 + 0xC3, BYTE0 + 0xBC, word_id("a"));
        ENCODE_IS(tok, "\xFF", 0, BYTE0 + 0xEF, BYTE0 + 0xBF, BYTE0 + 0xBD);
        size_t n;
        const uint8_t *pc = akv_tok_token_piece(tok, word_id(SP "ab"), &n);
        CHECK(n == 3 && !memcmp(pc, " ab", 3));
        pc = akv_tok_token_piece(tok, BYTE0 + 0xC3, &n);
        CHECK(n == 1 && pc[0] == 0xC3);
        const int32_t ids[] = {1, word_id(SP "ab"), BYTE0 + 0xC3, BYTE0 + 0xBC, word_id(SP SP), 4, 2};
        CHECK(decodes_to(tok, ids, 7, 0, " ab\xC3\xBC  <u>"));
        CHECK(decodes_to(tok, ids, 7, AKV_TOK_DECODE_SPECIAL, "<s> ab\xC3\xBC  <u></s>"));
        akv_tok_destroy(tok);
    }

    TEST_CASE(specials_cut_fragments_and_the_space_prefix) {
        for (int prefix = 0; prefix < 2; prefix++) {
            vocab_init(&v, prefix);
            akv_tok *tok = NULL;
            if (!REQUIRE_OK(akv_tok_create(&v.p, &tok))) break;
            const int32_t a = word_id("a"), sp_a = word_id(SP "a"), b = word_id("b");
            /* USER_DEFINED always cut out; CONTROL only with PARSE_SPECIAL; a prefix before
             * every fragment when set (each follows a special or begins the text) */
            if (prefix) {
                ENCODE_IS(tok, "a<u>a", 0, sp_a, 4, sp_a);
                ENCODE_IS(tok, "<|turn|>b", AKV_TOK_PARSE_SPECIAL | AKV_TOK_ADD_SPECIAL, 1, 3,
                          word_id(SP), b);
                ENCODE_IS(tok, "<u>", 0, 4); /* no empty fragment, so no lone prefix */
            } else {
                ENCODE_IS(tok, "a<u>a", 0, a, 4, a);
                ENCODE_IS(tok, "<|turn|>b", AKV_TOK_PARSE_SPECIAL, 3, b);
                /* without PARSE_SPECIAL the control text is text: bytes and words */
                int32_t want[32];
                size_t n = ref_encode("<|turn|>b", false, want);
                CHECK(encode_eq(tok, "<|turn|>b", 0, want, n));
            }
            akv_tok_destroy(tok);
        }
    }

    TEST_CASE(random_text_equals_the_reference) {
        static const char *const alphabet[] = {"a", "b", "c", " ", "\xC3\xA9", "\xC3\xBC", "x", "aa"};
        uint64_t rng = seed;
        int bad = 0;
        for (int prefix = 0; prefix < 2; prefix++) {
            vocab_init(&v, prefix);
            akv_tok *tok = NULL;
            if (!REQUIRE_OK(akv_tok_create(&v.p, &tok))) break;
            for (int iter = 0; iter < 3000 && bad < 5; iter++) {
                char s[200] = "";
                const size_t len = test_rand_below(&rng, 40);
                for (size_t i = 0; i < len; i++) strcat(s, alphabet[test_rand_below(&rng, 8)]);
                int32_t want[600];
                const size_t n = ref_encode(s, prefix && len > 0, want);
                if (!CHECK(encode_eq(tok, s, 0, want, n))) bad++;
            }
            akv_tok_destroy(tok);
        }
    }

    TEST_CASE(byte_texts_of_another_type) {
        /* a vocabulary without token types (all NORMAL): <0xNN> still the fallback, as in
         * llama.cpp, decoding as its text; the walker holds */
        vocab_init(&v, false);
        v.p.token_types = NULL;
        akv_tok *tok = NULL;
        if (!REQUIRE_OK(akv_tok_create(&v.p, &tok))) break;
        CHECK(akv__tok_check(tok));
        ENCODE_IS(tok, "\xC3\xBC", 0, BYTE0 + 0xC3, BYTE0 + 0xBC);
        const int32_t ids[] = {BYTE0 + 0xC3};
        CHECK(decodes_to(tok, ids, 1, 0, "<0xC3>"));
        akv_tok_destroy(tok);
    }

    TEST_CASE(refusals) {
        akv_log_set(NULL, NULL, AKV_LOG_OFF);
        vocab_init(&v, false);
        akv_tok *tok = NULL;
        v.p.scores = NULL;
        CHECK_STATUS(akv_tok_create(&v.p, &tok), AKV_EINVAL); /* SPM without scores */
        vocab_init(&v, false);
        v.scores[7] = NAN;
        CHECK_STATUS(akv_tok_create(&v.p, &tok), AKV_EFORMAT);
        vocab_init(&v, false);
        static const char *const merge[] = {"a b"};
        v.p.n_merges = 1, v.p.merges = merge;
        CHECK_STATUS(akv_tok_create(&v.p, &tok), AKV_EINVAL); /* merges are BPE's */
        vocab_init(&v, false);
        v.p.model = (akv_tok_model)7;
        CHECK_STATUS(akv_tok_create(&v.p, &tok), AKV_EINVAL);
        CHECK(tok == NULL);
        akv_log_set(NULL, NULL, AKV_LOG_WARN);
    }

    return test_finish();
}
