/* test_json_prefix.c — the JSON prefix state machine (akv/json_prefix.h): every prefix of a
 * valid text is taken, fed whole or cut anywhere, and only the whole is complete; invalid texts
 * are refused at the byte that breaks them; object_only; the depth limit; random valid texts. */
#include "test.h"

#include <stdio.h>
#include <string.h>

#include "akv/json_prefix.h"

/* Feeds s whole, then cut at every point into two pieces: the same answer every way. Returns
 * the index of the first refused byte (strlen(s) when every byte is taken) and *complete. */
static size_t run(const char *s, bool object_only, bool *complete) {
    const size_t n = strlen(s);
    size_t refused = n;
    akv_json_prefix p;
    akv_json_prefix_init(&p, object_only);
    for (size_t i = 0; i < n; i++) {
        akv_json_prefix q = p;
        if (!akv_json_prefix_feed(&q, (const uint8_t *)s + i, 1)) {
            refused = i;
            break;
        }
        p = q;
        if (i + 1 < n && akv_json_prefix_complete(&p) && !object_only) continue;
    }
    *complete = refused == n && akv_json_prefix_complete(&p);
    for (size_t cut = 0; cut <= n; cut++) {
        akv_json_prefix a;
        akv_json_prefix_init(&a, object_only);
        const bool ok = akv_json_prefix_feed(&a, (const uint8_t *)s, cut) &&
                        akv_json_prefix_feed(&a, (const uint8_t *)s + cut, n - cut);
        TEST_CHECK_(ok == (refused == n), "%s cut at %zu: %s", s, cut, ok ? "taken" : "refused");
        if (ok) TEST_CHECK_(akv_json_prefix_complete(&a) == *complete, "%s cut at %zu", s, cut);
    }
    return refused;
}

/* Every proper prefix of s is taken and not complete (but where a number may end), s complete. */
static void valid(const char *s, bool object_only) {
    bool complete = false;
    const size_t at = run(s, object_only, &complete);
    TEST_CHECK_(at == strlen(s) && complete, "%s: refused at %zu or not complete", s, at);
    akv_json_prefix p;
    akv_json_prefix_init(&p, object_only);
    for (size_t i = 0; i + 1 < strlen(s); i++) {
        (void)akv_json_prefix_feed(&p, (const uint8_t *)s + i, 1);
        const char c = s[i];
        const bool number_end = (c >= '0' && c <= '9') && !object_only;
        if (!number_end) TEST_CHECK_(!akv_json_prefix_complete(&p) || s[i + 1] == ' ' || s[i + 1] == '\n',
                                     "%s: complete after %zu bytes", s, i + 1);
    }
}

/* s is refused at byte `at`. */
static void invalid(const char *s, size_t at, bool object_only) {
    bool complete = false;
    const size_t got = run(s, object_only, &complete);
    TEST_CHECK_(got == at, "%s: refused at %zu, want %zu", s, got, at);
}

/* A random valid value of at most `depth` levels into buf (returns its end). */
static char *random_value(char *b, int depth, uint64_t *rng) {
    const int kind = (int)test_rand_below(rng, depth > 0 ? 8 : 6);
    const char *ws[] = {"", " ", "\n", "\t "};
    switch (kind) {
    case 0: return b + sprintf(b, "%s", test_rand_below(rng, 2) ? "true" : "null");
    case 1: return b + sprintf(b, "false");
    case 2: return b + sprintf(b, "%d", (int)test_rand_below(rng, 100000) - 50000);
    case 3: return b + sprintf(b, "-0.%de+%d", (int)test_rand_below(rng, 999), (int)test_rand_below(rng, 40));
    case 4: return b + sprintf(b, "\"a\\\"b\\\\c\\u00e9\\n\xc3\xa9 %d\"", (int)test_rand_below(rng, 9));
    case 5: return b + sprintf(b, "%s\"\"%s", ws[test_rand_below(rng, 4)], ws[test_rand_below(rng, 4)]);
    case 6: {
        b += sprintf(b, "[%s", ws[test_rand_below(rng, 4)]);
        const int n = (int)test_rand_below(rng, 4);
        for (int i = 0; i < n; i++) {
            if (i) b += sprintf(b, ",%s", ws[test_rand_below(rng, 4)]);
            b = random_value(b, depth - 1, rng);
        }
        return b + sprintf(b, "%s]", ws[test_rand_below(rng, 4)]);
    }
    default: {
        b += sprintf(b, "{%s", ws[test_rand_below(rng, 4)]);
        const int n = (int)test_rand_below(rng, 4);
        for (int i = 0; i < n; i++) {
            if (i) b += sprintf(b, ",");
            b += sprintf(b, "%s\"k%d\"%s:%s", ws[test_rand_below(rng, 4)], i, ws[test_rand_below(rng, 4)],
                         ws[test_rand_below(rng, 4)]);
            b = random_value(b, depth - 1, rng);
        }
        return b + sprintf(b, "}");
    }
    }
}

int main(int argc, char **argv) {
    test_args(argc, argv);
    uint64_t rng = test_seed(11);

    TEST_CASE(valid_texts_and_every_prefix) {
        valid("{}", true);
        valid("{\"a\":1}", true);
        valid(" { \"k\" : { } , \"l\" : [ ] } ", true);
        valid("{\"a\":[1,2.5e-3,-0,0.5E+7,true,false,null,\"x\\u00e9\\n\\/\"]}", true);
        valid("{\"\xe6\x97\xa5\xe6\x9c\xac\":\"\xf0\x9f\x98\x80\"}", true);
        valid("[\"\xc3\xa9\xe2\x82\xac\xed\x9f\xbf\xee\x80\x80\xf4\x8f\xbf\xbf\"]", false); /* é € U+D7FF U+E000 U+10FFFF */
        valid("[1, [2, [3]]]", false);
        valid("\"just a string\"", false);
        valid("-12.5e3", false);
        valid("0", false);
        valid("null", false);
    }

    TEST_CASE(invalid_texts_refused_at_the_byte) {
        invalid("{\"a\"}", 4, true);
        invalid("{a:1}", 1, true);
        invalid("[1,]", 3, false);
        invalid("{\"a\":01}", 6, true);
        invalid("{\"a\":1.}", 7, true);
        invalid("{\"a\":-}", 6, true);
        invalid("{\"a\":\"\x01\"}", 6, true);
        invalid("{\"a\":tru e}", 8, true);
        invalid("{}}", 2, true);
        invalid("{} {}", 3, true);
        invalid("{\"a\":\"\\x\"}", 7, true);
        invalid("{\"a\":\"\\u12g4\"}", 10, true);
        invalid("{\"a\" 1}", 5, true);
        invalid("{,}", 1, true);
        invalid("{\"a\":1,}", 7, true);
        invalid("[1 2]", 3, false);
        /* strings are well-formed UTF-8: a stray continuation, a bad lead, an overlong, a
         * surrogate, above U+10FFFF, a sequence cut by a quote */
        invalid("\"\x80\"", 1, false);
        invalid("\"\xff\"", 1, false);
        invalid("\"\xc0\xaf\"", 1, false);
        invalid("\"\xe0\x80\x80\"", 2, false);
        invalid("\"\xed\xa0\x80\"", 2, false);
        invalid("\"\xf4\x90\x80\x80\"", 2, false);
        invalid("\"\xc3\"", 2, false);
        invalid("\"\xe2\x82\"", 3, false);
        /* object_only: another value is refused at its first byte */
        invalid("[1]", 0, true);
        invalid("\"s\"", 0, true);
        invalid("  1", 2, true);
        invalid("1 2", 2, false);
    }

    TEST_CASE(whitespace_runs_are_bounded) {
        /* between tokens: 2 line feeds and 64 bytes a run at most; inside a string, text */
        valid("{\n\n  \"a\": 1,\n  \"b\":\r\n\t[1, 2]\n}", true);
        invalid("{\n\n\n\"a\": 1}", 3, true);
        invalid("[1,\n \n \n 2]", 7, false);
        char sp[160], in[160];
        memset(sp, ' ', sizeof sp), memset(in, ' ', sizeof in);
        memcpy(sp, "[1,", 3), memcpy(sp + 3 + 65, "2]", 3);         /* 65 spaces: the 65th */
        invalid(sp, 3 + 64, false);
        memcpy(sp + 3 + 64, "2]", 3);                                  /* 64: taken */
        valid(sp, false);
        in[0] = '"', memcpy(in + 101, "\"", 2);                       /* 100 inside a string */
        valid(in, false);
    }

    TEST_CASE(depth_limit) {
        char deep[AKV_JSON_MAX_DEPTH + 2];
        memset(deep, '[', sizeof deep - 1);
        deep[sizeof deep - 1] = 0;
        invalid(deep, AKV_JSON_MAX_DEPTH, false);
    }

    TEST_CASE(random_valid_texts) {
        static char buf[1 << 16];
        for (int i = 0; i < 300; i++) {
            char *end = random_value(buf, 4, &rng);
            *end = 0;
            const bool obj = buf[0] == '{';
            bool complete = false;
            const size_t at = run(buf, obj, &complete);
            TEST_CHECK_(at == strlen(buf) && complete, "random %d: %s refused at %zu", i, buf, at);
            /* cut short: a prefix, not complete (unless a number or whitespace may end it) */
            const char last = buf[strlen(buf) - 1];
            if (strlen(buf) > 1 && !strchr("0123456789 \t\n", last)) {
                akv_json_prefix p;
                akv_json_prefix_init(&p, obj);
                CHECK(akv_json_prefix_feed(&p, (const uint8_t *)buf, strlen(buf) - 1));
                TEST_CHECK_(!akv_json_prefix_complete(&p), "random %d: complete one byte short: %s", i, buf);
            }
        }
    }
    return test_finish();
}
