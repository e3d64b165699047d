/* test_tok.c — the tokenizer on tiny hand-made vocabularies: byte alphabet, merges by rank,
 * pre-tokenizer splits (against Hugging Face), special tokens, byte fallback, invalid UTF-8,
 * streaming decode, bad vocabularies, allocation failures, and hostile random input. */
#include "test.h"

#include "akv/chat.h"
#include "akv/gguf.h"
#include "akv/log.h"
#include "akv/tok.h"
#include "gguf_build.h"
#include "tok_tiny.h"
#include "core/alloc.h"
#include "core/assert.h"
#include "tok/pretok.h"
#include "tok/tok_impl.h"
#include "tok/utf8.h"

static akv_tok *tiny_create(tiny *t) {
    akv_tok *tok = NULL;
    akv_status st = akv_tok_create(&t->p, &tok);
    CHECK_OK(st);
    if (tok) CHECK(akv__tok_check(tok));
    return tok;
}

/* Encodes s and compares with want[0..n_want). */
static int encode_is(const akv_tok *tok, const char *s, uint32_t flags, const int32_t *want,
                     size_t n_want) {
    akv_tok_ids ids = {0};
    akv_status st = akv_tok_encode(tok, s, strlen(s), flags, &ids);
    CHECK_OK(st);
    int ok = ids.n_ids == n_want && (n_want == 0 || !memcmp(ids.ids, want, n_want * 4));
    if (!ok) {
        test_fail(__FILE__, __LINE__);
        fprintf(stderr, "encode(\"%s\"): got", s);
        for (size_t i = 0; i < ids.n_ids; i++)
            fprintf(stderr, " %d", ids.ids[i]);
        fprintf(stderr, ", want");
        for (size_t i = 0; i < n_want; i++)
            fprintf(stderr, " %d", want[i]);
        fprintf(stderr, "\n");
    }
    test_n_checks++;
    akv_tok_ids_free(&ids);
    return ok;
}
#define ENCODE_IS(tok, s, flags, ...)                                                              \
    do {                                                                                           \
        const int32_t want_[] = {__VA_ARGS__};                                                     \
        encode_is(tok, s, flags, want_, AKV_ARRAY_LEN(want_));                                     \
    } while (0)

/* decode(ids, flags) as a string (static buffer). */
static const char *decode_str(const akv_tok *tok, const int32_t *ids, size_t n, uint32_t flags) {
    static char buf[4096];
    akv_tok_text t = {0};
    buf[0] = '\0';
    if (akv_tok_decode(tok, ids, n, flags, &t) == AKV_OK && t.n_bytes < sizeof buf)
        memcpy(buf, t.bytes, t.n_bytes + 1);
    akv_tok_text_free(&t);
    return buf;
}

/* ---- a tiny vocabulary as a GGUF image ------------------------------------------------------ */

/* What to write, and what to spoil. */
typedef struct tiny_gguf {
    const char *model, *pre; /* NULL: key left out */
    bool no_tokens, tokens_as_i32, no_merges;
    int64_t n_types;     /* token_type entries; -1: as many as tokens; 0: key left out */
    int32_t bad_type_at; /* index whose type becomes 9; -1: none */
    int64_t bos_id;      /* -1: key left out */
    bool add_bos;
    const char *chat_template; /* NULL: key left out */
} tiny_gguf;

static void gb_kv_head(gb *b, const char *key, uint32_t vtype) {
    gb_str(b, key);
    gb_u32(b, vtype);
}

static void gb_kv_strs(gb *b, const char *key, const char *const *strs, const size_t *lens,
                       size_t n) {
    gb_kv_head(b, key, AKV_GGUF_VTYPE_ARRAY);
    gb_u32(b, AKV_GGUF_VTYPE_STRING);
    gb_u64(b, n);
    for (size_t i = 0; i < n; i++) {
        size_t len = lens ? lens[i] : strlen(strs[i]);
        gb_u64(b, len);
        gb_bytes(b, strs[i], len);
    }
}

/* A GGUF image (no tensors) holding tiny `t`'s vocabulary with the changes in `w`. */
static void tiny_gguf_build(gb *b, const tiny *t, const tiny_gguf *w) {
    uint64_t n_kv = 0;
    gb_bytes(b, "GGUF", 4);
    gb_u32(b, 3);
    gb_u64(b, 0);
    size_t n_kv_at = b->n;
    gb_u64(b, 0);
    if (w->model)
        gb_kv_head(b, "tokenizer.ggml.model", AKV_GGUF_VTYPE_STRING), gb_str(b, w->model), n_kv++;
    if (w->pre)
        gb_kv_head(b, "tokenizer.ggml.pre", AKV_GGUF_VTYPE_STRING), gb_str(b, w->pre), n_kv++;
    if (!w->no_tokens && !w->tokens_as_i32) {
        gb_kv_strs(b, "tokenizer.ggml.tokens", t->p.tokens, t->p.token_bytes, t->p.n_tokens);
        n_kv++;
    } else if (w->tokens_as_i32) {
        gb_kv_head(b, "tokenizer.ggml.tokens", AKV_GGUF_VTYPE_ARRAY);
        gb_u32(b, AKV_GGUF_VTYPE_I32), gb_u64(b, 1), gb_u32(b, 7), n_kv++;
    }
    if (!w->no_merges)
        gb_kv_strs(b, "tokenizer.ggml.merges", t->p.merges, NULL, t->p.n_merges), n_kv++;
    if (w->n_types) {
        size_t n = w->n_types < 0 ? t->p.n_tokens : (size_t)w->n_types;
        gb_kv_head(b, "tokenizer.ggml.token_type", AKV_GGUF_VTYPE_ARRAY);
        gb_u32(b, AKV_GGUF_VTYPE_I32);
        gb_u64(b, n);
        for (size_t i = 0; i < n; i++)
            gb_u32(b, (int32_t)i == w->bad_type_at ? 9u : (uint32_t)t->types[i]);
        n_kv++;
    }
    if (w->bos_id >= 0) {
        gb_kv_head(b, "tokenizer.ggml.bos_token_id", AKV_GGUF_VTYPE_U32);
        gb_u32(b, (uint32_t)w->bos_id), n_kv++;
    }
    gb_kv_head(b, "tokenizer.ggml.add_bos_token", AKV_GGUF_VTYPE_BOOL), gb_u8(b, w->add_bos),
        n_kv++;
    if (w->chat_template) {
        gb_kv_head(b, "tokenizer.chat_template", AKV_GGUF_VTYPE_STRING);
        gb_str(b, w->chat_template), n_kv++;
    }
    gb_put64(b, n_kv_at, n_kv);
    gb_pad(b, 32);
}

static tiny_gguf tiny_gguf_good(void) {
    return (tiny_gguf){.model = "gpt2",
                       .pre = "smollm",
                       .n_types = -1,
                       .bad_type_at = -1,
                       .bos_id = 256 + 6,
                       .chat_template = "{{ '<|im_start|>' }}{{ '<|im_end|>' }}"};
}

/* Opens the image and builds a tokenizer (pre overrides); returns the status and the log. */
static akv_status tiny_gguf_try(const tiny *t, const tiny_gguf *w, const char *pre, akv_tok **out);

/* ---- log capture --------------------------------------------------------------------------- */

static char last_log[512];
static void capture(akv_log_level level, const char *msg, void *user) {
    (void)level, (void)user;
    snprintf(last_log, sizeof last_log, "%s", msg);
}

static akv_status tiny_gguf_try(const tiny *t, const tiny_gguf *w, const char *pre, akv_tok **out) {
    gb b = {0};
    tiny_gguf_build(&b, t, w);
    akv_gguf *g = NULL;
    akv_status st = akv_gguf_open_memory(b.p, b.n, &g);
    CHECK_OK(st);
    last_log[0] = '\0';
    if (!st) {
        akv_log_set(capture, NULL, AKV_LOG_ERROR);
        st = akv_tok_create_from_gguf(g, pre, out);
        akv_log_set(NULL, NULL, AKV_LOG_WARN);
    }
    akv_gguf_close(g);
    gb_free(&b);
    return st;
}

/* ---- pre-tokenizer splits against Hugging Face --------------------------------------------- */

/* Expected pieces, joined with \x01, produced by Hugging Face tokenizers 0.23.3:
 *   python3 scripts/tok-reference.py pieces --pre PRE --c < strings.jsonl
 * (GPT2: ByteLevel(use_regex); SMOLLM: Sequence[Digits(individual), ByteLevel]; LLAMA3:
 * Sequence[Split(Llama 3 regex, isolated), ByteLevel(use_regex=false)]). */
typedef struct split_case {
    const char *input, *pieces;
} split_case;

/* clang-format off */
static const split_case split_gpt2[] = {
    {"Hello world", "Hello\x01"" world"},
    {"don't  stop\n\n  x", "don\x01""'t\x01"" \x01"" stop\x01""\n\n \x01"" x"},
    {"abc123 def 4567", "abc\x01""123\x01"" def\x01"" 4567"},
    {"a\xE3""\x80""\x80""b\xC2""\xA0""c\xE1""\xA0""\x8E""d\xC2""\x85""e\xE2""\x80""\xA8""f", "a\x01""\xE3""\x80""\x80""\x01""b\x01""\xC2""\xA0""\x01""c\x01""\xE1""\xA0""\x8E""\x01""d\x01""\xC2""\x85""\x01""e\x01""\xE2""\x80""\xA8""\x01""f"},
    {"I'LL x'ſ 'S", "I\x01""'\x01""LL\x01"" x\x01""'\x01""ſ\x01"" '\x01""S"},
    {"  leading and trailing  ", " \x01"" leading\x01"" and\x01"" trailing\x01""  "},
    {"tabs\tand\t\tnewlines\r\n\r\nend", "tabs\x01""\t\x01""and\x01""\t\x01""\t\x01""newlines\x01""\r\n\r\x01""\n\x01""end"},
    {"x = f(y) + 12345;  // comment\n    return x;", "x\x01"" =\x01"" f\x01""(\x01""y\x01"")\x01"" +\x01"" 12345\x01"";\x01"" \x01"" //\x01"" comment\x01""\n   \x01"" return\x01"" x\x01"";"},
    {"日本語のテキスト、中文", "日本語のテキスト\x01""、\x01""中文"},
    {"emoji 👍🏽 family 👨\xE2""\x80""\x8D""👩\xE2""\x80""\x8D""👧 flags 🇫🇷", "emoji\x01"" 👍🏽\x01"" family\x01"" 👨\xE2""\x80""\x8D""👩\xE2""\x80""\x8D""👧\x01"" flags\x01"" 🇫🇷"},
    {"e\xCC""\x81"" combining a\xCC""\x88""", "e\x01""\xCC""\x81""\x01"" combining\x01"" a\x01""\xCC""\x88"""},
    {"١٢٣ Arabic digits ٤٥ and Ⅻ Roman ½", "١٢٣\x01"" Arabic\x01"" digits\x01"" ٤٥\x01"" and\x01"" Ⅻ\x01"" Roman\x01"" ½"},
    {"    ", "    "},
    {"\n", "\n"},
    {"a\n\n\nb", "a\x01""\n\n\x01""\n\x01""b"},
    {"$100.00!!! ???", "$\x01""100\x01"".\x01""00\x01""!!!\x01"" ???"},
    {"we've they're I'm he'd you'll", "we\x01""'ve\x01"" they\x01""'re\x01"" I\x01""'m\x01"" he\x01""'d\x01"" you\x01""'ll"},
    {" \n \n x", " \n \n\x01"" x"},
    {"ÿĀ mixed Ελληνικά кириллица", "ÿĀ\x01"" mixed\x01"" Ελληνικά\x01"" кириллица"},
};
/* clang-format on */

/* clang-format off */
static const split_case split_smollm[] = {
    {"Hello world", "Hello\x01"" world"},
    {"don't  stop\n\n  x", "don\x01""'t\x01"" \x01"" stop\x01""\n\n \x01"" x"},
    {"abc123 def 4567", "abc\x01""1\x01""2\x01""3\x01"" def\x01"" \x01""4\x01""5\x01""6\x01""7"},
    {"a\xE3""\x80""\x80""b\xC2""\xA0""c\xE1""\xA0""\x8E""d\xC2""\x85""e\xE2""\x80""\xA8""f", "a\x01""\xE3""\x80""\x80""\x01""b\x01""\xC2""\xA0""\x01""c\x01""\xE1""\xA0""\x8E""\x01""d\x01""\xC2""\x85""\x01""e\x01""\xE2""\x80""\xA8""\x01""f"},
    {"I'LL x'ſ 'S", "I\x01""'\x01""LL\x01"" x\x01""'\x01""ſ\x01"" '\x01""S"},
    {"  leading and trailing  ", " \x01"" leading\x01"" and\x01"" trailing\x01""  "},
    {"tabs\tand\t\tnewlines\r\n\r\nend", "tabs\x01""\t\x01""and\x01""\t\x01""\t\x01""newlines\x01""\r\n\r\x01""\n\x01""end"},
    {"x = f(y) + 12345;  // comment\n    return x;", "x\x01"" =\x01"" f\x01""(\x01""y\x01"")\x01"" +\x01"" \x01""1\x01""2\x01""3\x01""4\x01""5\x01"";\x01"" \x01"" //\x01"" comment\x01""\n   \x01"" return\x01"" x\x01"";"},
    {"日本語のテキスト、中文", "日本語のテキスト\x01""、\x01""中文"},
    {"emoji 👍🏽 family 👨\xE2""\x80""\x8D""👩\xE2""\x80""\x8D""👧 flags 🇫🇷", "emoji\x01"" 👍🏽\x01"" family\x01"" 👨\xE2""\x80""\x8D""👩\xE2""\x80""\x8D""👧\x01"" flags\x01"" 🇫🇷"},
    {"e\xCC""\x81"" combining a\xCC""\x88""", "e\x01""\xCC""\x81""\x01"" combining\x01"" a\x01""\xCC""\x88"""},
    {"١٢٣ Arabic digits ٤٥ and Ⅻ Roman ½", "١\x01""٢\x01""٣\x01"" Arabic\x01"" digits\x01"" \x01""٤\x01""٥\x01"" and\x01"" \x01""Ⅻ\x01"" Roman\x01"" \x01""½"},
    {"    ", "    "},
    {"\n", "\n"},
    {"a\n\n\nb", "a\x01""\n\n\x01""\n\x01""b"},
    {"$100.00!!! ???", "$\x01""1\x01""0\x01""0\x01"".\x01""0\x01""0\x01""!!!\x01"" ???"},
    {"we've they're I'm he'd you'll", "we\x01""'ve\x01"" they\x01""'re\x01"" I\x01""'m\x01"" he\x01""'d\x01"" you\x01""'ll"},
    {" \n \n x", " \n \n\x01"" x"},
    {"ÿĀ mixed Ελληνικά кириллица", "ÿĀ\x01"" mixed\x01"" Ελληνικά\x01"" кириллица"},
};
/* clang-format on */

/* clang-format off */
static const split_case split_llama3[] = {
    {"Hello world", "Hello\x01"" world"},
    {"don't  stop\n\n  x", "don\x01""'t\x01"" \x01"" stop\x01""\n\n\x01"" \x01"" x"},
    {"abc123 def 4567", "abc\x01""123\x01"" def\x01"" \x01""456\x01""7"},
    {"a\xE3""\x80""\x80""b\xC2""\xA0""c\xE1""\xA0""\x8E""d\xC2""\x85""e\xE2""\x80""\xA8""f", "a\x01""\xE3""\x80""\x80""b\x01""\xC2""\xA0""c\x01""\xE1""\xA0""\x8E""d\x01""\xC2""\x85""e\x01""\xE2""\x80""\xA8""f"},
    {"I'LL x'ſ 'S", "I\x01""'LL\x01"" x\x01""'ſ\x01"" '\x01""S"},
    {"  leading and trailing  ", " \x01"" leading\x01"" and\x01"" trailing\x01""  "},
    {"tabs\tand\t\tnewlines\r\n\r\nend", "tabs\x01""\tand\x01""\t\x01""\tnewlines\x01""\r\n\r\n\x01""end"},
    {"x = f(y) + 12345;  // comment\n    return x;", "x\x01"" =\x01"" f\x01""(y\x01"")\x01"" +\x01"" \x01""123\x01""45\x01"";\x01"" \x01"" //\x01"" comment\x01""\n\x01""   \x01"" return\x01"" x\x01"";"},
    {"日本語のテキスト、中文", "日本語のテキスト\x01""、中文"},
    {"emoji 👍🏽 family 👨\xE2""\x80""\x8D""👩\xE2""\x80""\x8D""👧 flags 🇫🇷", "emoji\x01"" 👍🏽\x01"" family\x01"" 👨\xE2""\x80""\x8D""👩\xE2""\x80""\x8D""👧\x01"" flags\x01"" 🇫🇷"},
    {"e\xCC""\x81"" combining a\xCC""\x88""", "e\x01""\xCC""\x81""\x01"" combining\x01"" a\x01""\xCC""\x88"""},
    {"١٢٣ Arabic digits ٤٥ and Ⅻ Roman ½", "١٢٣\x01"" Arabic\x01"" digits\x01"" \x01""٤٥\x01"" and\x01"" \x01""Ⅻ\x01"" Roman\x01"" \x01""½"},
    {"    ", "    "},
    {"\n", "\n"},
    {"a\n\n\nb", "a\x01""\n\n\n\x01""b"},
    {"$100.00!!! ???", "$\x01""100\x01"".\x01""00\x01""!!!\x01"" ???"},
    {"we've they're I'm he'd you'll", "we\x01""'ve\x01"" they\x01""'re\x01"" I\x01""'m\x01"" he\x01""'d\x01"" you\x01""'ll"},
    {" \n \n x", " \n \n\x01"" x"},
    {"ÿĀ mixed Ελληνικά кириллица", "ÿĀ\x01"" mixed\x01"" Ελληνικά\x01"" кириллица"},
};
/* clang-format on */

typedef struct joined {
    char buf[1024];
    size_t n;
} joined;

static akv_status join_piece(void *ctx, const uint8_t *s, size_t n) {
    joined *j = ctx;
    if (j->n + n + 2 > sizeof j->buf) return AKV_EFULL;
    if (j->n) j->buf[j->n++] = '\x01';
    memcpy(j->buf + j->n, s, n);
    j->n += n;
    j->buf[j->n] = '\0';
    return AKV_OK;
}

/* Qwen2's (Qwen3's) expression, computed with Python's `regex` module from its tokenizer.json
 * (the same computation reproduces every split_llama3 case above, which came from HF). */
static const split_case split_qwen2[] = {
    {"Hello world", "Hello\x01"" world"},
    {"don't  stop\n\n  x", "don\x01""'t\x01"" \x01"" stop\x01""\n\n\x01"" \x01"" x"},
    {"abc123 def 4567", "abc\x01""1\x01""2\x01""3\x01"" def\x01"" \x01""4\x01""5\x01""6\x01""7"},
    {"a\xE3""\x80""\x80""b\xC2""\xA0""c\xE1""\xA0""\x8E""d\xC2""\x85""e\xE2""\x80""\xA8""f", "a\x01""\xE3""\x80""\x80""b\x01""\xC2""\xA0""c\x01""\xE1""\xA0""\x8E""d\x01""\xC2""\x85""e\x01""\xE2""\x80""\xA8""f"},
    {"I'LL x'ſ 'S", "I\x01""'LL\x01"" x\x01""'ſ\x01"" '\x01""S"},
    {"  leading and trailing  ", " \x01"" leading\x01"" and\x01"" trailing\x01""  "},
    {"tabs\tand\t\tnewlines\r\n\r\nend", "tabs\x01""\tand\x01""\t\x01""\tnewlines\x01""\r\n\r\n\x01""end"},
    {"x = f(y) + 12345;  // comment\n    return x;", "x\x01"" =\x01"" f\x01""(y\x01"")\x01"" +\x01"" \x01""1\x01""2\x01""3\x01""4\x01""5\x01"";\x01"" \x01"" //\x01"" comment\x01""\n\x01""   \x01"" return\x01"" x\x01"";"},
    {"日本語のテキスト、中文", "日本語のテキスト\x01""、中文"},
    {"emoji 👍🏽 family 👨\xE2""\x80""\x8D""👩\xE2""\x80""\x8D""👧 flags 🇫🇷", "emoji\x01"" 👍🏽\x01"" family\x01"" 👨\xE2""\x80""\x8D""👩\xE2""\x80""\x8D""👧\x01"" flags\x01"" 🇫🇷"},
    {"e\xCC""\x81"" combining a\xCC""\x88""", "e\x01""\xCC""\x81""\x01"" combining\x01"" a\x01""\xCC""\x88"""},
    {"١٢٣ Arabic digits ٤٥ and Ⅻ Roman ½", "١\x01""٢\x01""٣\x01"" Arabic\x01"" digits\x01"" \x01""٤\x01""٥\x01"" and\x01"" \x01""Ⅻ\x01"" Roman\x01"" \x01""½"},
    {"    ", "    "},
    {"\n", "\n"},
    {"a\n\n\nb", "a\x01""\n\n\n\x01""b"},
    {"$100.00!!! ???", "$\x01""1\x01""0\x01""0\x01"".\x01""0\x01""0\x01""!!!\x01"" ???"},
    {"we've they're I'm he'd you'll", "we\x01""'ve\x01"" they\x01""'re\x01"" I\x01""'m\x01"" he\x01""'d\x01"" you\x01""'ll"},
    {" \n \n x", " \n \n\x01"" x"},
    {"ÿĀ mixed Ελληνικά кириллица", "ÿĀ\x01"" mixed\x01"" Ελληνικά\x01"" кириллица"},
};

static void check_splits(akv_tok_pre pre, const split_case *cases, size_t n_cases) {
    akv__pretok *p = NULL;
    CHECK_OK(akv__pretok_create(pre, &p));
    for (size_t i = 0; p && i < n_cases; i++) {
        joined j = {{0}, 0};
        CHECK_OK(akv__pretok_split(p, (const uint8_t *)cases[i].input, strlen(cases[i].input),
                                   join_piece, &j));
        if (strcmp(j.buf, cases[i].pieces) != 0) {
            test_fail(__FILE__, __LINE__);
            fprintf(stderr, "%s: split of case %zu \"%s\" differs from HF:\n got  ",
                    akv_tok_pre_name(pre), i, cases[i].input);
            for (const char *c = j.buf; *c; c++)
                fputs(*c == '\x01' ? " | " : (char[]){*c, 0}, stderr);
            fprintf(stderr, "\n want ");
            for (const char *c = cases[i].pieces; *c; c++)
                fputs(*c == '\x01' ? " | " : (char[]){*c, 0}, stderr);
            fprintf(stderr, "\n");
        }
        test_n_checks++;
    }
    akv__pretok_destroy(p);
}

/* ---- hostile input helpers ----------------------------------------------------------------- */

/* A random well-formed UTF-8 string of about n bytes from a pool of awkward code points. */
static size_t random_utf8(uint64_t *rng, uint8_t *out, size_t n) {
    static const uint32_t pool[] = {
        ' ',    ' ',    '\n',     '\t',   '\r',   'a',    'b',    'c',    'Z',     '0',
        '7',    '\'',   's',      '.',    '<',    '|',    '>',    0x0,    0x7F,    0x85,
        0xA0,   0xE9,   0x301,    0x3000, 0x180E, 0x2028, 0x4E2D, 0x6587, 0x1F44D, 0x1F3FD,
        0x200D, 0xFEFF, 0x10FFFF, 0xFFFD, 0x661,  0x216B, 0x17F};
    size_t o = 0;
    while (o + 4 <= n) {
        uint32_t cp = test_rand_below(rng, 4) == 0
                          ? (uint32_t)test_rand_below(rng, 0x110000)
                          : pool[test_rand_below(rng, AKV_ARRAY_LEN(pool))];
        if (cp >= 0xD800 && cp < 0xE000) cp = 'x'; /* surrogates are not characters */
        o += akv__utf8_put(cp, out + o);
    }
    return o;
}

int main(int argc, char **argv) {
    test_args(argc, argv);
    tiny t;

    TEST_CASE(byte_alphabet) {
        char c[3];
        CHECK_EQ_INT(byte_char(' ', c), 2);
        CHECK(!memcmp(c, "Ġ", 2));
        byte_char('\n', c), CHECK(!memcmp(c, "Ċ", 2));
        byte_char(0, c), CHECK(!memcmp(c, "Ā", 2));
        byte_char(0xAD, c), CHECK(!memcmp(c, "Ń", 2));
        byte_char(0xFF, c), CHECK(!memcmp(c, "ÿ", 2));
        tiny_init(&t, extra, extra_types, AKV_ARRAY_LEN(extra), merges_bc_first, 6, -1);
        akv_tok *tok = tiny_create(&t);
        if (!tok) break;
        for (unsigned b = 0; b < 256; b++) {
            size_t n;
            const uint8_t *piece = akv_tok_token_piece(tok, (int32_t)b, &n);
            if (!CHECK(n == 1 && piece[0] == b)) fprintf(stderr, "byte %u\n", b);
        }
        CHECK_EQ_INT(akv_tok_find(tok, "Ġ", 2), ' ');
        size_t n;
        const uint8_t *piece = akv_tok_token_piece(tok, ODD, &n);
        CHECK(n == 2 && piece[0] == 0xAD && piece[1] == 0xE4);
        piece = akv_tok_token_piece(tok, IM_START, &n);
        CHECK(n == 12 && !memcmp(piece, "<|im_start|>", 12));
        CHECK(akv_tok_token_piece(tok, 9999, &n) == NULL);
        CHECK_EQ_INT(akv_tok_token_type(tok, USER), AKV_TOK_TYPE_USER_DEFINED);
        CHECK_EQ_INT(akv_tok_max_piece_bytes(tok), 12);
        akv_tok_destroy(tok);
    }

    TEST_CASE(merges_by_rank) {
        tiny_init(&t, extra, extra_types, AKV_ARRAY_LEN(extra), merges_bc_first, 6, -1);
        akv_tok *tok = tiny_create(&t);
        tiny u;
        tiny_init(&u, extra, extra_types, AKV_ARRAY_LEN(extra), merges_ab_first, 6, -1);
        akv_tok *tok2 = tiny_create(&u);
        if (!tok || !tok2) break;
        ENCODE_IS(tok, "abc", 0, ABC);      /* b+c (rank 0), then a+bc (rank 2) */
        ENCODE_IS(tok2, "abc", 0, AB, 'c'); /* a+b (rank 0) first: "ab c" has no merge */
        ENCODE_IS(tok, "abcabc", 0, ABC, ABC);
        ENCODE_IS(tok, "cab", 0, 'c', AB);
        /* Leftmost first among equal ranks, then the pair the merges formed. */
        ENCODE_IS(tok, "aaaaa", 0, AAAA, 'a');
        ENCODE_IS(tok, "aaa", 0, AA, 'a');
        /* BPE never crosses pre-tokens: " a" is one pre-token, "a a" are two. */
        ENCODE_IS(tok, "a a", 0, 'a', GA);
        encode_is(tok, "", 0, NULL, 0);
        akv_tok_destroy(tok);
        akv_tok_destroy(tok2);
    }

    TEST_CASE(pre_tokenizer_splits_match_hf) {
        check_splits(AKV_TOK_PRE_GPT2, split_gpt2, AKV_ARRAY_LEN(split_gpt2));
        check_splits(AKV_TOK_PRE_SMOLLM, split_smollm, AKV_ARRAY_LEN(split_smollm));
        check_splits(AKV_TOK_PRE_LLAMA3, split_llama3, AKV_ARRAY_LEN(split_llama3));
        akv_tok_pre pre;
        CHECK_OK(akv_tok_pre_from_name("smollm", &pre));
        CHECK_EQ_INT(pre, AKV_TOK_PRE_SMOLLM);
        CHECK_OK(akv_tok_pre_from_name("llama-bpe", &pre));
        CHECK_EQ_INT(pre, AKV_TOK_PRE_LLAMA3);
        check_splits(AKV_TOK_PRE_QWEN2, split_qwen2, AKV_ARRAY_LEN(split_qwen2));
        CHECK_OK(akv_tok_pre_from_name("qwen2", &pre));
        CHECK_EQ_INT(pre, AKV_TOK_PRE_QWEN2);
        CHECK_STR(akv_tok_pre_name(AKV_TOK_PRE_QWEN2), "qwen2");
        CHECK_STATUS(akv_tok_pre_from_name("qwen35", &pre), AKV_EUNSUPPORTED);
        CHECK_STR(akv_tok_pre_name(AKV_TOK_PRE_LLAMA3), "llama-bpe");
    }

    TEST_CASE(ignore_merges_takes_whole_tokens) {
        /* "abc" is a token but no merge reaches it from "a b c" when only "a b" exists: GPT2
         * gives [ab, c]; LLAMA3 (ignore_merges) gives [abc]. */
        static const char *only_ab[] = {"a b", "b c", "ab c"};
        tiny_init(&t, extra, extra_types, AKV_ARRAY_LEN(extra), only_ab, 1, -1);
        akv_tok *tok = tiny_create(&t);
        t.p.pre = AKV_TOK_PRE_LLAMA3;
        akv_tok *tok3 = tiny_create(&t);
        if (!tok || !tok3) break;
        ENCODE_IS(tok, "abc", 0, AB, 'c');
        ENCODE_IS(tok3, "abc", 0, ABC);
        ENCODE_IS(tok3, "abcb", 0, AB, 'c', 'b');
        akv_tok_destroy(tok);
        akv_tok_destroy(tok3);
    }

    TEST_CASE(special_tokens) {
        tiny_init(&t, extra, extra_types, AKV_ARRAY_LEN(extra), merges_bc_first, 6, -1);
        t.p.bos_id = IM_START, t.p.eos_id = IM, t.p.add_bos = true;
        akv_tok *tok = tiny_create(&t);
        if (!tok) break;
        const uint32_t P = AKV_TOK_PARSE_SPECIAL;
        /* Longest first at a position; CONTROL only with PARSE_SPECIAL; USER_DEFINED always. */
        ENCODE_IS(tok, "x<|im_start|>abc<|im[U]", P, 'x', IM_START, ABC, IM, USER);
        ENCODE_IS(tok, "<|im[U]", 0, '<', '|', 'i', 'm', USER);
        ENCODE_IS(tok, "<|im_start|>", 0, '<', '|', 'i', 'm', '_', 's', 't', 'a', 'r', 't', '|',
                  '>');
        ENCODE_IS(tok, "<|im_star", P, IM, '_', 's', 't', 'a', 'r');
        /* A special token inside a word splits it: BPE never merges across it. */
        ENCODE_IS(tok, "a[U]bc", 0, 'a', USER, BC);
        /* BOS per the vocabulary (add_bos) only with ADD_SPECIAL; EOS off here. */
        ENCODE_IS(tok, "ab", AKV_TOK_ADD_SPECIAL, IM_START, AB);
        t.p.add_eos = true;
        akv_tok *tok2 = tiny_create(&t);
        if (tok2) ENCODE_IS(tok2, "ab", AKV_TOK_ADD_SPECIAL, IM_START, AB, IM);
        akv_tok_destroy(tok2);
        akv_tok_specials sp = akv_tok_get_specials(tok);
        CHECK_EQ_INT(sp.bos_id, IM_START);
        CHECK(sp.add_bos && !sp.add_eos);

        const int32_t ids[] = {'x', IM_START, ABC, USER, IM};
        CHECK_STR(decode_str(tok, ids, 5, AKV_TOK_DECODE_SPECIAL), "x<|im_start|>abc[U]<|im");
        CHECK_STR(decode_str(tok, ids, 5, 0), "xabc[U]");
        akv_tok_destroy(tok);
    }

    TEST_CASE(plain_spans_keep_control_texts_as_text) {
        tiny_init(&t, extra, extra_types, AKV_ARRAY_LEN(extra), merges_bc_first, 6, -1);
        akv_tok *tok = tiny_create(&t);
        if (!tok) break;
        /* "<|im_start|>" is a CONTROL text: matched outside the plain span, text inside it;
         * USER_DEFINED "[U]" is matched everywhere */
        const char *s = "<|im_start|>x<|im_start|>[U]<|im_start|>";
        const akv_tok_span plain[] = {{12, 16}}; /* "x<|im_start|>[U]" */
        akv_tok_encode_opts o = {.flags = AKV_TOK_PARSE_SPECIAL, .plain = plain, .n_plain = 1};
        akv_tok_ids ids = {0};
        CHECK_OK(akv_tok_encode_with(tok, s, strlen(s), &o, &ids));
        const int32_t want[] = {IM_START, 'x', '<', '|', 'i', 'm', '_', 's', 't', 'a', 'r', 't',
                                '|', '>', USER, IM_START};
        CHECK(ids.n_ids == AKV_ARRAY_LEN(want) && !memcmp(ids.ids, want, sizeof want));
        akv_tok_ids_free(&ids);
        /* a control text that would reach into a span is not matched either ("<|im" ends
         * inside the span [2, 4)); a shorter one ending before it still is */
        const char *s2 = "<|im_start|>";
        const akv_tok_span in_it[] = {{2, 2}};
        o.plain = in_it;
        CHECK_OK(akv_tok_encode_with(tok, s2, strlen(s2), &o, &ids));
        CHECK(ids.n_ids > 1 && ids.ids[0] == '<');
        akv_tok_ids_free(&ids);
        /* spans out of order, overlapping or past the end are refused */
        const akv_tok_span bad[][2] = {{{4, 2}, {0, 2}}, {{0, 4}, {2, 2}}, {{0, 2}, {10, 40}}};
        for (int i = 0; i < 3; i++) {
            o.plain = bad[i], o.n_plain = 2;
            CHECK_STATUS(akv_tok_encode_with(tok, s, strlen(s), &o, &ids), AKV_EINVAL);
            CHECK_EQ_U64(ids.n_ids, 0);
        }
        /* invalid UTF-8 before a span: the span still covers its own bytes after the repair */
        const char s3[] = "\xff<|im_start|>";
        const akv_tok_span after[] = {{1, 12}};
        o.plain = after, o.n_plain = 1;
        CHECK_OK(akv_tok_encode_with(tok, s3, sizeof s3 - 1, &o, &ids));
        CHECK(ids.n_ids == 3 + 12); /* U+FFFD's 3 bytes, then the text byte by byte */
        akv_tok_ids_free(&ids);
        akv_tok_destroy(tok);
    }

    TEST_CASE(limit_stops_early_in_bounded_memory) {
        tiny_init(&t, extra, extra_types, AKV_ARRAY_LEN(extra), merges_bc_first, 6, 0x04);
        akv_tok *tok = tiny_create(&t);
        if (!tok) break;
        akv_tok_ids ids = {0};
        akv_tok_encode_opts o = {.max_ids = 5};
        CHECK_OK(akv_tok_encode_with(tok, "abc abc", 7, &o, &ids)); /* abc, Ġa, bc: 3 */
        CHECK_EQ_U64(ids.n_ids, 3);
        o.max_ids = 2;
        CHECK_STATUS(akv_tok_encode_with(tok, "abc abc", 7, &o, &ids), AKV_EFULL);
        CHECK_EQ_U64(ids.n_ids, 3); /* nothing appended */
        akv_tok_ids_free(&ids);
        /* one 64 MiB word against a limit of 100: refused before the merge loop allocates for
         * it (about 60 bytes a byte: 3.8 GB), so no allocation near its size happens */
        const size_t n = (size_t)64 << 20;
        char *big = malloc(n);
        if (!CHECK(big)) break;
        memset(big, 'a', n);
        o.max_ids = 100;
        const int64_t live0 = akv__alloc_live();
        akv__alloc_fail_nth(0);
        const uint64_t calls0 = akv__alloc_calls();
        CHECK_STATUS(akv_tok_encode_with(tok, big, n, &o, &ids), AKV_EFULL);
        CHECK(akv__alloc_calls() - calls0 < 16);
        CHECK_EQ_INT(akv__alloc_live(), live0);
        /* bytes without a token (0x04 here) split the merge loop: 64 MiB of them with a few
         * letters between encode to those letters alone, in memory of the runs' size */
        memset(big, 0x04, n);
        for (size_t i = 0; i < 8; i++) big[i * (n / 8)] = 'a';
        o.max_ids = 0;
        CHECK_OK(akv_tok_encode_with(tok, big, n, &o, &ids));
        CHECK_EQ_U64(ids.n_ids, 8);
        akv_tok_ids_free(&ids);
        free(big);
        akv_tok_destroy(tok);
    }

    TEST_CASE(byte_fallback_and_bytes_without_tokens) {
        /* No token for byte 0xBF: that byte is dropped (as HF's BPE without unk_token and
         * llama.cpp do), never replaced by the unknown token; creation says so (info). */
        tiny_init(&t, extra, extra_types, AKV_ARRAY_LEN(extra), merges_bc_first, 6, 0xBF);
        t.p.unk_id = IM;
        akv_log_set(capture, NULL, AKV_LOG_INFO);
        akv_tok *tok = tiny_create(&t);
        akv_log_set(NULL, NULL, AKV_LOG_WARN);
        if (!tok) break;
        CHECK(strstr(last_log, "1 bytes") && strstr(last_log, "0xBF"));
        ENCODE_IS(tok, "\xC3\xBF", 0, 0xC3); /* U+00FF = C3 BF */
        ENCODE_IS(tok,
                  "a\xC3\xBF"
                  "bc",
                  0, 'a', 0xC3, BC);
        ENCODE_IS(tok,
                  "\xC3\xBF"
                  "abc",
                  0, 0xC3, ABC);
        /* Words with no merge fall back to their byte tokens. */
        ENCODE_IS(tok, "中", 0, 0xE4, 0xB8, 0xAD);
        akv_tok_destroy(tok);
    }

    TEST_CASE(utf8_maximal_subparts_like_python) {
        /* Expected outputs from Python's bytes.decode("utf-8", "replace"). */
        static const struct {
            const char *in, *want;
        } cases[] = {
            {"\xF0\x80\x80", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"},
            {"\xE0\xA0", "\xEF\xBF\xBD"},
            {"\xED\xA0\x80", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"},
            {"\xF4\x90\x80\x80", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"},
            {"\xC0\xAF", "\xEF\xBF\xBD\xEF\xBF\xBD"},
            {"\xE1\x80"
             "A",
             "\xEF\xBF\xBD"
             "A"},
            {"a\xFF\xC3(b\xE2\x82", "a\xEF\xBF\xBD\xEF\xBF\xBD(b\xEF\xBF\xBD"},
            {"\xF0\x9F\x98", "\xEF\xBF\xBD"},
            {"\xF0\x9F\x98\x80\x80", "\xF0\x9F\x98\x80\xEF\xBF\xBD"},
        };
        tiny_init(&t, extra, extra_types, AKV_ARRAY_LEN(extra), merges_bc_first, 6, -1);
        akv_tok *tok = tiny_create(&t);
        if (!tok) break;
        for (size_t i = 0; i < AKV_ARRAY_LEN(cases); i++) {
            uint8_t out[64];
            size_t n = akv__utf8_sanitize((const uint8_t *)cases[i].in, strlen(cases[i].in), out);
            out[n] = 0;
            CHECK_STR((const char *)out, cases[i].want);
            /* The encoder applies the same rule: decode(encode(x)) == sanitize(x). */
            akv_tok_ids ids = {0};
            CHECK_OK(akv_tok_encode(tok, cases[i].in, strlen(cases[i].in), 0, &ids));
            CHECK_STR(decode_str(tok, ids.ids, ids.n_ids, 0), cases[i].want);
            akv_tok_ids_free(&ids);
        }
        /* Lossy decode of ids that split a character. */
        const int32_t split[] = {'a', 0xE4, 0xB8, 'b'};
        CHECK_STR(decode_str(tok, split, 4, AKV_TOK_DECODE_LOSSY), "a\xEF\xBF\xBD"
                                                                   "b");
        const char *raw = decode_str(tok, split, 4, 0);
        CHECK(!memcmp(raw,
                      "a\xE4\xB8"
                      "b",
                      5));
        akv_tok_destroy(tok);
    }

    TEST_CASE(streaming_decode) {
        tiny_init(&t, extra, extra_types, AKV_ARRAY_LEN(extra), merges_bc_first, 6, -1);
        akv_tok *tok = tiny_create(&t);
        if (!tok) break;
        akv_tok_stream s = {{0}, 0};
        akv_tok_text out = {0};
        /* 中 = E4 B8 AD, one byte per token: nothing shows until it is complete. */
        CHECK_OK(akv_tok_stream_push(tok, &s, 0xE4, 0, &out));
        CHECK_EQ_U64(out.n_bytes, 0);
        CHECK_OK(akv_tok_stream_push(tok, &s, 0xB8, 0, &out));
        CHECK_EQ_U64(out.n_bytes, 0);
        CHECK_EQ_INT(s.n_pending, 2);
        CHECK_OK(akv_tok_stream_push(tok, &s, 0xAD, 0, &out));
        CHECK_STR(out.bytes, "中");
        /* A piece that ends one character and starts the next: ODD = AD E4. */
        CHECK_OK(akv_tok_stream_push(tok, &s, 0xE4, 0, &out));
        CHECK_OK(akv_tok_stream_push(tok, &s, 0xB8, 0, &out));
        CHECK_OK(akv_tok_stream_push(tok, &s, ODD, 0, &out));
        CHECK_STR(out.bytes, "中中");
        CHECK_OK(akv_tok_stream_push(tok, &s, 0xB8, 0, &out));
        CHECK_OK(akv_tok_stream_push(tok, &s, 0xAD, 0, &out));
        CHECK_STR(out.bytes, "中中中");
        /* A sequence the next byte proves invalid becomes U+FFFD right away. */
        CHECK_OK(akv_tok_stream_push(tok, &s, 0xE4, 0, &out));
        CHECK_OK(akv_tok_stream_push(tok, &s, 'a', 0, &out));
        CHECK_STR(out.bytes, "中中中\xEF\xBF\xBD"
                             "a");
        /* Hidden specials do not disturb a pending sequence; shown ones end it. */
        CHECK_OK(akv_tok_stream_push(tok, &s, 0xE4, 0, &out));
        CHECK_OK(akv_tok_stream_push(tok, &s, IM_START, 0, &out));
        CHECK_EQ_INT(s.n_pending, 1);
        CHECK_OK(akv_tok_stream_push(tok, &s, IM_START, AKV_TOK_DECODE_SPECIAL, &out));
        CHECK_STR(out.bytes, "中中中\xEF\xBF\xBD"
                             "a\xEF\xBF\xBD<|im_start|>");
        /* Flush turns a held-back prefix into one U+FFFD. */
        akv_tok_text_free(&out);
        CHECK_OK(akv_tok_stream_push(tok, &s, 0xF0, 0, &out));
        CHECK_OK(akv_tok_stream_push(tok, &s, 0x9F, 0, &out));
        CHECK_OK(akv_tok_stream_flush(&s, &out));
        CHECK_STR(out.bytes, "\xEF\xBF\xBD");
        CHECK_EQ_INT(s.n_pending, 0);
        /* A bad id is refused and changes nothing. */
        size_t n0 = out.n_bytes;
        akv_log_set(capture, NULL, AKV_LOG_ERROR);
        CHECK_STATUS(akv_tok_stream_push(tok, &s, -3, 0, &out), AKV_EINVAL);
        akv_log_set(NULL, NULL, AKV_LOG_WARN);
        CHECK(strstr(last_log, "id -3") != NULL);
        CHECK_EQ_U64(out.n_bytes, n0);
        akv_tok_text_free(&out);
        akv_tok_destroy(tok);
    }

    TEST_CASE(bad_vocabularies_are_refused_with_the_reason) {
        static const struct {
            const char *merge, *why;
        } bad_merges[] = {
            {"ab", "is not two token texts"},         {"a ", "is not two token texts"},
            {"zz a", "first token that is not"},      {"a zz", "second token that is not"},
            {"c a", "joins into a text that is not"},
        };
        for (size_t i = 0; i < AKV_ARRAY_LEN(bad_merges); i++) {
            const char *merges[] = {"a b", bad_merges[i].merge};
            tiny_init(&t, extra, extra_types, AKV_ARRAY_LEN(extra), merges, 2, -1);
            akv_tok *tok = NULL;
            akv_log_set(capture, NULL, AKV_LOG_ERROR);
            CHECK_STATUS(akv_tok_create(&t.p, &tok), AKV_EFORMAT);
            akv_log_set(NULL, NULL, AKV_LOG_WARN);
            CHECK(tok == NULL);
            if (!CHECK(strstr(last_log, "merge 1") && strstr(last_log, bad_merges[i].why)))
                fprintf(stderr, "log: %s\n", last_log);
        }
        tiny_init(&t, extra, extra_types, AKV_ARRAY_LEN(extra), merges_bc_first, 6, -1);
        t.types[256] = 9;
        akv_tok *tok = NULL;
        akv_log_set(capture, NULL, AKV_LOG_ERROR);
        CHECK_STATUS(akv_tok_create(&t.p, &tok), AKV_EFORMAT);
        CHECK(strstr(last_log, "token 256 has type 9") != NULL);
        t.types[256] = 1;
        t.p.bos_id = 5000;
        CHECK_STATUS(akv_tok_create(&t.p, &tok), AKV_EINVAL);
        CHECK(strstr(last_log, "bos token id 5000") != NULL);
        t.p.bos_id = -1, t.p.add_bos = true;
        CHECK_STATUS(akv_tok_create(&t.p, &tok), AKV_EINVAL);
        t.p.add_bos = false, t.p.n_merges = 3, t.p.merges = NULL;
        CHECK_STATUS(akv_tok_create(&t.p, &tok), AKV_EINVAL);
        t.p.merges = merges_bc_first, t.p.n_tokens = 0;
        CHECK_STATUS(akv_tok_create(&t.p, &tok), AKV_EINVAL);
        akv_log_set(NULL, NULL, AKV_LOG_WARN);
        CHECK(tok == NULL);
        /* A duplicate merge keeps its first rank; duplicate texts keep the first id. */
        static const char *dup_merges[] = {"b c", "a b", "a bc", "b c"};
        static const char *dup_extra[] = {"ab", "bc", "abc", "ab"};
        tiny_init(&t, dup_extra, NULL, 4, dup_merges, 4, -1);
        akv_log_set(NULL, NULL, AKV_LOG_ERROR);
        tok = tiny_create(&t);
        akv_log_set(NULL, NULL, AKV_LOG_WARN);
        if (tok) {
            ENCODE_IS(tok, "abc", 0, ABC);
            CHECK_EQ_INT(akv_tok_find(tok, "ab", 2), AB);
        }
        akv_tok_destroy(tok);
        /* Decode refuses ids out of range and leaves the output alone. */
        tiny_init(&t, extra, extra_types, AKV_ARRAY_LEN(extra), merges_bc_first, 6, -1);
        tok = tiny_create(&t);
        if (!tok) break;
        akv_tok_text out = {0};
        CHECK_OK(akv_tok_text_append(&out, "keep", 4));
        CHECK_STATUS(akv_tok_text_append(&out, NULL, 5), AKV_EINVAL); /* nothing appended */
        CHECK_STATUS(akv_tok_text_append(NULL, "x", 1), AKV_EINVAL);
        CHECK_OK(akv_tok_text_append(&out, NULL, 0));
        CHECK_EQ_U64(out.n_bytes, 4);
        const int32_t ids[] = {'a', 266};
        akv_log_set(capture, NULL, AKV_LOG_ERROR);
        CHECK_STATUS(akv_tok_decode(tok, ids, 2, 0, &out), AKV_EINVAL);
        akv_log_set(NULL, NULL, AKV_LOG_WARN);
        CHECK(strstr(last_log, "id 266 at position 1") != NULL);
        CHECK_STR(out.bytes, "keep");
        akv_tok_text_free(&out);
        akv_tok_destroy(tok);
    }

    TEST_CASE(from_gguf_and_its_errors) {
        tiny_init(&t, extra, extra_types, AKV_ARRAY_LEN(extra), merges_bc_first, 6, -1);
        tiny_gguf w = tiny_gguf_good();
        akv_tok *tok = NULL;
        CHECK_OK(tiny_gguf_try(&t, &w, NULL, &tok));
        if (!tok) break;
        CHECK(akv__tok_check(tok));
        CHECK_EQ_INT(akv_tok_get_pre(tok), AKV_TOK_PRE_SMOLLM);
        CHECK_EQ_INT(akv_tok_get_specials(tok).bos_id, IM_START);
        CHECK_EQ_INT(akv_tok_get_specials(tok).eos_id, -1);
        ENCODE_IS(tok, "<|im_start|>abc 12", AKV_TOK_PARSE_SPECIAL, IM_START, ABC, ' ', '1', '2');
        akv_tok_destroy(tok);
        tok = NULL;
        /* The chat template comes from the same file. */
        {
            gb b = {0};
            tiny_gguf_build(&b, &t, &w);
            akv_gguf *g = NULL;
            akv_chat *chat = NULL;
            CHECK_OK(akv_gguf_open_memory(b.p, b.n, &g));
            if (g) CHECK_OK(akv_chat_create_from_gguf(g, NULL, &chat));
            if (chat) CHECK_EQ_INT(akv_chat_get_kind(chat), AKV_CHAT_JINJA); /* its own, run */
            akv_chat_destroy(chat);
            akv_gguf_close(g);
            gb_free(&b);
        }

        static const struct {
            const char *what, *log;
            akv_status want;
        } bad[] = {
            {"model wpm", "'wpm'", AKV_EUNSUPPORTED},
            {"no model", "no tokenizer.ggml.model", AKV_EFORMAT},
            {"no pre", "no tokenizer.ggml.pre", AKV_EUNSUPPORTED},
            {"pre qwen35", "'qwen35' is not supported", AKV_EUNSUPPORTED},
            {"no tokens", "no tokenizer.ggml.tokens", AKV_EFORMAT},
            {"tokens i32", "array of i32", AKV_EFORMAT},
            {"no merges", "no tokenizer.ggml.merges", AKV_EFORMAT},
            {"short types", "expected 266 integers", AKV_EFORMAT},
            {"bad type", "token_type[258] = 9", AKV_EFORMAT},
            {"bos out of range", "bos_token_id = 5000", AKV_EFORMAT},
            {"add_bos without bos", "add_bos_token is true", AKV_EFORMAT},
            {"model llama without scores", "needs tokenizer.ggml.scores", AKV_EFORMAT},
        };
        for (size_t i = 0; i < AKV_ARRAY_LEN(bad); i++) {
            w = tiny_gguf_good();
            switch (i) {
            case 0:
                w.model = "wpm";
                break;
            case 1:
                w.model = NULL;
                break;
            case 2:
                w.pre = NULL;
                break;
            case 3:
                w.pre = "qwen35";
                break;
            case 4:
                w.no_tokens = true;
                break;
            case 5:
                w.tokens_as_i32 = true;
                break;
            case 6:
                w.no_merges = true;
                break;
            case 7:
                w.n_types = 5;
                break;
            case 8:
                w.bad_type_at = 258;
                break;
            case 9:
                w.bos_id = 5000;
                break;
            case 10:
                w.bos_id = -1, w.add_bos = true;
                break;
            case 11: /* SentencePiece: scores, not merges */
                w.model = "llama";
                break;
            }
            CHECK_STATUS(tiny_gguf_try(&t, &w, NULL, &tok), bad[i].want);
            CHECK(tok == NULL);
            if (!CHECK(strstr(last_log, bad[i].log) != NULL))
                fprintf(stderr, "%s: log was \"%s\"\n", bad[i].what, last_log);
        }
        /* Naming the pre-tokenizer overrides the file's (or its absence). */
        w = tiny_gguf_good();
        w.pre = NULL;
        CHECK_OK(tiny_gguf_try(&t, &w, "llama-bpe", &tok));
        if (tok) CHECK_EQ_INT(akv_tok_get_pre(tok), AKV_TOK_PRE_LLAMA3);
        akv_tok_destroy(tok);
        tok = NULL;
        CHECK_STATUS(tiny_gguf_try(&t, &w, "bert", &tok), AKV_EINVAL);
        CHECK(strstr(last_log, "'bert'") != NULL);
    }

    TEST_CASE(allocation_failures_leave_no_trace) {
        tiny_init(&t, extra, extra_types, AKV_ARRAY_LEN(extra), merges_bc_first, 6, -1);
        int64_t live0 = akv__alloc_live();
        int n_failed = 0;
        for (uint64_t nth = 1; nth < 200; nth++) {
            akv_tok *tok = NULL;
            akv__alloc_fail_nth(nth);
            akv_status st = akv_tok_create(&t.p, &tok);
            bool fired = akv__alloc_failure_fired();
            akv__alloc_fail_nth(0);
            if (!fired) {
                CHECK_OK(st);
                akv_tok_destroy(tok);
                break;
            }
            n_failed++;
            CHECK_STATUS(st, AKV_ENOMEM);
            CHECK(tok == NULL);
            CHECK_EQ_INT(akv__alloc_live(), live0);
        }
        CHECK(n_failed > 5);
        akv_tok *tok = tiny_create(&t);
        if (!tok) break;
        const char *text = "x<|im_start|>abc ab\xFF 12 bc";
        for (uint64_t nth = 1; nth < 100; nth++) {
            akv_tok_ids ids = {0};
            CHECK_OK(akv_tok_encode(tok, "zz", 2, 0, &ids)); /* something to keep */
            int64_t live1 = akv__alloc_live();
            akv__alloc_fail_nth(nth);
            akv_status st = akv_tok_encode(tok, text, strlen(text), AKV_TOK_PARSE_SPECIAL, &ids);
            bool fired = akv__alloc_failure_fired();
            akv__alloc_fail_nth(0);
            if (fired) {
                CHECK_STATUS(st, AKV_ENOMEM);
                CHECK_EQ_U64(ids.n_ids, 2);
                CHECK_EQ_INT(akv__alloc_live(), live1);
            }
            akv_tok_ids_free(&ids);
            if (!fired) break;
        }
        akv_tok_destroy(tok);
        CHECK_EQ_INT(akv__alloc_live(), live0);
    }

    TEST_CASE(long_inputs_stay_fast) {
        /* One 1 MiB word (the merge loop on one long pre-token), runs of spaces, newlines and
         * digits: each must round-trip; quadratic rescans would take minutes here. */
        for (int pre = AKV_TOK_PRE_GPT2; pre <= AKV_TOK_PRE_LLAMA3; pre++) {
            tiny_init(&t, extra, extra_types, AKV_ARRAY_LEN(extra), merges_bc_first, 6, -1);
            t.p.pre = (akv_tok_pre)pre;
            akv_tok *tok = tiny_create(&t);
            if (!tok) break;
            const char fill[] = {'a', ' ', '\n', '7'};
            for (size_t f = 0; f < sizeof fill; f++) {
                size_t n = (size_t)1 << 20;
                char *s = malloc(n + 1);
                memset(s, fill[f], n);
                s[n - 1] = 'b';
                akv_tok_ids ids = {0};
                akv_tok_text back = {0};
                CHECK_OK(akv_tok_encode(tok, s, n, 0, &ids));
                CHECK_OK(akv_tok_decode(tok, ids.ids, ids.n_ids, 0, &back));
                CHECK_EQ_U64(back.n_bytes, n);
                CHECK(back.bytes && !memcmp(back.bytes, s, n));
                if (fill[f] == 'a') CHECK_EQ_U64(ids.n_ids, n / 4 + 1); /* aaaa.. aa ab */
                akv_tok_ids_free(&ids);
                akv_tok_text_free(&back);
                free(s);
            }
            akv_tok_destroy(tok);
        }
    }

    TEST_CASE(hostile_random_input) {
        uint64_t rng = test_seed(0x70CA11);
        tiny_init(&t, extra, extra_types, AKV_ARRAY_LEN(extra), merges_bc_first, 6, -1);
        akv_tok *toks[3] = {0};
        for (int pre = 0; pre < 3; pre++) {
            t.p.pre = (akv_tok_pre)pre;
            toks[pre] = tiny_create(&t);
        }
        if (!toks[0] || !toks[1] || !toks[2]) break;
        uint8_t in[600], want[1800];
        for (int iter = 0; iter < 3000; iter++) {
            const akv_tok *tok = toks[iter % 3];
            size_t n;
            bool valid = iter % 2 == 0;
            if (valid) {
                n = random_utf8(&rng, in, 1 + test_rand_below(&rng, sizeof in));
            } else {
                n = test_rand_below(&rng, sizeof in);
                for (size_t i = 0; i < n; i++) {
                    /* Bias towards bytes that make and break UTF-8 sequences and specials. */
                    static const uint8_t hot[] = {0xE4, 0xB8, 0xAD, 0xF0, 0x9F, 0xC3, 0x80, 0xBF,
                                                  0xED, 0xA0, ' ',  '<',  '|',  'a',  '\n'};
                    in[i] = test_rand_below(&rng, 2) ? (uint8_t)test_rand(&rng)
                                                     : hot[test_rand_below(&rng, sizeof hot)];
                }
            }
            size_t n_want = akv__utf8_sanitize(in, n, want);
            uint32_t flags = (uint32_t)test_rand_below(&rng, 4);
            akv_tok_ids ids = {0};
            akv_tok_text back = {0}, streamed = {0}, lossy = {0};
            akv_status st = akv_tok_encode(tok, (const char *)in, n, flags, &ids);
            CHECK_OK(st);
            if (st) break;
            for (size_t i = 0; i < ids.n_ids; i++)
                CHECK((size_t)ids.ids[i] < t.p.n_tokens);
            CHECK_OK(akv_tok_decode(tok, ids.ids, ids.n_ids, AKV_TOK_DECODE_SPECIAL, &back));
            if (!CHECK(back.n_bytes == n_want && !memcmp(back.bytes, want, n_want))) {
                fprintf(stderr, "iteration %d (%s input, %zu bytes, pre %s): round trip differs\n",
                        iter, valid ? "valid" : "random", n, akv_tok_pre_name(tok->pre));
                break;
            }
            if (valid) CHECK(n_want == n && !memcmp(want, in, n));
            /* Random ids: streaming output is valid UTF-8 and equals the lossy decode. */
            int32_t rid[64];
            size_t n_rid = test_rand_below(&rng, 64);
            for (size_t i = 0; i < n_rid; i++)
                rid[i] = test_rand_below(&rng, 2) ? (int32_t)(0x80 + test_rand_below(&rng, 0x80))
                                                  : (int32_t)test_rand_below(&rng, t.p.n_tokens);
            akv_tok_stream s = {{0}, 0};
            for (size_t i = 0; i < n_rid; i++)
                CHECK_OK(akv_tok_stream_push(tok, &s, rid[i], AKV_TOK_DECODE_SPECIAL, &streamed));
            CHECK_OK(akv_tok_stream_flush(&s, &streamed));
            CHECK_OK(akv_tok_decode(tok, rid, n_rid, AKV_TOK_DECODE_SPECIAL | AKV_TOK_DECODE_LOSSY,
                                    &lossy));
            CHECK(akv__utf8_valid((const uint8_t *)streamed.bytes, streamed.n_bytes));
            if (!CHECK(streamed.n_bytes == lossy.n_bytes &&
                       !memcmp(streamed.bytes, lossy.bytes, lossy.n_bytes)))
                fprintf(stderr, "iteration %d: stream decode differs from lossy decode\n", iter);
            akv_tok_ids_free(&ids);
            akv_tok_text_free(&back);
            akv_tok_text_free(&streamed);
            akv_tok_text_free(&lossy);
        }
        for (int pre = 0; pre < 3; pre++)
            akv_tok_destroy(toks[pre]);
    }

    return test_finish();
}
