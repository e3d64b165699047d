/* test_schema.c — response_format json_schema: schemas compiled (server/schema.h) and the
 * state machine that follows them (akv/json_schema.h): valid texts taken whole and cut
 * anywhere and complete only at their end, invalid ones refused at the byte that breaks them
 * (an unknown or repeated key, a missing required one, a fraction in an integer, an item too
 * many, an enum miss, null where none is allowed), $defs with recursion, and what the compiler
 * refuses, naming it. */
#include "test.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "akv/json_schema.h"
#include "server/schema.h"

static akv_srv_schema *compile_text(const char *text, char *why, size_t cap) {
    cJSON *j = cJSON_Parse(text);
    if (!j) return NULL;
    akv_srv_schema *s = NULL;
    (void)akv_srv_schema_compile(j, &s, why, cap);
    cJSON_Delete(j);
    return s;
}

/* The byte at which text is refused (strlen when taken), fed whole; *complete. Cutting it
 * anywhere gives the same. */
static size_t run(const akv_json_schema *sch, const char *text, bool *complete) {
    const size_t n = strlen(text);
    akv_js_state s;
    akv_js_init(&s, sch);
    size_t at = n;
    for (size_t i = 0; i < n; i++) {
        akv_js_state q = s;
        if (!akv_js_feed(&q, (const uint8_t *)text + i, 1)) {
            at = i;
            break;
        }
        s = q;
    }
    *complete = at == n && akv_js_complete(&s);
    for (size_t cut = 0; cut <= n; cut += 3) {
        akv_js_state a;
        akv_js_init(&a, sch);
        const bool ok = akv_js_feed(&a, (const uint8_t *)text, cut) &&
                        akv_js_feed(&a, (const uint8_t *)text + cut, n - cut);
        TEST_CHECK_(ok == (at == n), "%s cut at %zu", text, cut);
        if (ok) TEST_CHECK_(akv_js_complete(&a) == *complete, "%s cut at %zu: complete", text, cut);
    }
    return at;
}

static void valid(const akv_json_schema *sch, const char *text) {
    bool complete = false;
    const size_t at = run(sch, text, &complete);
    TEST_CHECK_(at == strlen(text) && complete, "%s: refused at %zu, or not complete", text, at);
}

static void invalid(const akv_json_schema *sch, const char *text, size_t want) {
    bool complete = false;
    const size_t at = run(sch, text, &complete);
    TEST_CHECK_(at == want, "%s: refused at %zu, want %zu", text, at, want);
}

static void incomplete(const akv_json_schema *sch, const char *text) {
    bool complete = true;
    const size_t at = run(sch, text, &complete);
    TEST_CHECK_(at == strlen(text) && !complete, "%s: refused at %zu or complete", text, at);
}

int main(int argc, char **argv) {
    test_args(argc, argv);
    char why[256];

    TEST_CASE(an_object_of_every_kind) {
        akv_srv_schema *s = compile_text(
            "{\"type\": \"object\", \"properties\": {"
            "\"name\": {\"type\": \"string\"}, \"age\": {\"type\": \"integer\"},"
            "\"score\": {\"type\": \"number\"}, \"ok\": {\"type\": \"boolean\"},"
            "\"tags\": {\"type\": \"array\", \"items\": {\"enum\": [\"a\", \"bb\", 3, 30, null]},"
            "           \"minItems\": 1, \"maxItems\": 2},"
            "\"pet\": {\"anyOf\": [{\"type\": \"object\", \"properties\": {\"kind\": {\"const\": \"cat\"}},"
            "                        \"required\": [\"kind\"]}, {\"type\": \"null\"}]},"
            "\"extra\": {}},"
            "\"required\": [\"name\", \"age\"], \"additionalProperties\": false}",
            why, sizeof why);
        if (!CHECK(s != NULL)) {
            printf("%s\n", why);
            break;
        }
        const akv_json_schema *sch = akv_srv_schema_view(s);
        valid(sch, "{\"name\": \"Ann\", \"age\": 30}");
        valid(sch, "{\"age\":-3,\"name\":\"x\\\"y\\u00e9\",\"score\":1.5e-3,\"ok\":true}");
        valid(sch, "{ \"name\" : \"A\" , \"age\" : 0 , \"tags\" : [ \"bb\" , 30 ] , \"pet\" : null }");
        valid(sch, "{\"name\": \"A\", \"age\": 1, \"tags\": [3], \"pet\": {\"kind\": \"cat\"}}");
        valid(sch, "{\"name\": \"A\", \"age\": 1, \"tags\": [null], \"extra\": [1, {\"k\": [true]}]}");
        valid(sch, "{\"name\": \"A\", \"age\": 1, \"extra\": 7}");
        incomplete(sch, "{\"name\": \"A\", \"age\": 1");
        incomplete(sch, "{\"name\": \"A\", \"age\": 1, \"tags\": [3");
        invalid(sch, "{\"nam\": 1}", 5);                       /* no such key */
        invalid(sch, "{\"name\": \"A\", \"name\": \"B\"}", 15);  /* a key given twice */
        invalid(sch, "{\"name\": \"A\"}", 12);                 /* age is required */
        invalid(sch, "{\"name\": \"A\", \"age\": 1.5}", 22);    /* an integer */
        invalid(sch, "{\"name\": 5}", 9);                      /* a string */
        invalid(sch, "{\"name\": \"A\", \"age\": 1, \"tags\": []}", 33);        /* minItems 1 */
        invalid(sch, "{\"name\": \"A\", \"age\": 1, \"tags\": [3, 3, 3]}", 37); /* maxItems 2 */
        invalid(sch, "{\"name\": \"A\", \"age\": 1, \"tags\": [\"c\"]}", 34);   /* the enum */
        invalid(sch, "{\"name\": \"A\", \"age\": 1, \"tags\": [31]}", 34);
        invalid(sch, "{\"name\": null}", 9);                   /* not nullable */
        invalid(sch, "{\"name\": \"A\", \"age\": 1, \"pet\": {\"kind\": \"dog\"}}", 41);
        invalid(sch, "{\"name\": \"A\", \"age\": 1, \"pet\": {}}", 32); /* kind required */
        invalid(sch, "[1]", 0);
        invalid(sch, "{\"name\": \"A\", \"age\": 1} x", 24);
        akv_srv_schema_free(s);
    }

    TEST_CASE(defs_refs_and_recursion) {
        akv_srv_schema *s = compile_text(
            "{\"$defs\": {\"Node\": {\"type\": \"object\", \"properties\": {"
            "  \"v\": {\"type\": \"integer\"},"
            "  \"kids\": {\"type\": \"array\", \"items\": {\"$ref\": \"#/$defs/Node\"}}},"
            "  \"required\": [\"v\"]}},"
            " \"$ref\": \"#/$defs/Node\"}",
            why, sizeof why);
        if (!CHECK(s != NULL)) {
            printf("%s\n", why);
            break;
        }
        const akv_json_schema *sch = akv_srv_schema_view(s);
        valid(sch, "{\"v\": 1}");
        valid(sch, "{\"v\": 1, \"kids\": [{\"v\": 2, \"kids\": [{\"v\": 3}]}, {\"v\": 4}]}");
        invalid(sch, "{\"v\": 1, \"kids\": [{\"w\": 2}]}", 20);
        akv_srv_schema_free(s);
        /* a recursive optional (pydantic's Optional["Node"]): the reference under anyOf with
         * null is the node itself, required keys and all, not a copy made before it was whole */
        s = compile_text(
            "{\"$defs\": {\"Node\": {\"type\": \"object\", \"properties\": {"
            "  \"value\": {\"type\": \"integer\"},"
            "  \"next\": {\"anyOf\": [{\"$ref\": \"#/$defs/Node\"}, {\"type\": \"null\"}]}},"
            "  \"required\": [\"value\", \"next\"]}},"
            " \"$ref\": \"#/$defs/Node\"}",
            why, sizeof why);
        if (CHECK(s != NULL)) {
            valid(akv_srv_schema_view(s), "{\"value\": 1, \"next\": {\"value\": 2, \"next\": null}}");
            invalid(akv_srv_schema_view(s), "{\"value\": 1, \"next\": {}}", 22);
            invalid(akv_srv_schema_view(s), "{\"value\": 1, \"next\": [1]}", 21);
            akv_srv_schema_free(s);
        }
        /* a top-level string enum and a nullable type pair */
        s = compile_text("{\"type\": [\"string\", \"null\"]}", why, sizeof why);
        if (CHECK(s != NULL)) {
            valid(akv_srv_schema_view(s), "\"x\"");
            valid(akv_srv_schema_view(s), "null");
            invalid(akv_srv_schema_view(s), "1", 0);
            akv_srv_schema_free(s);
        }
    }

    TEST_CASE(a_union_told_apart_by_a_const) {
        /* anyOf of objects of the same properties, one of them a distinct const in each (a tool
         * call: the name chooses the arguments' schema): the tag first, then each property as
         * its branch says; a branch's arguments under another's name are refused */
        const char *text =
            "{\"anyOf\": ["
            "{\"type\": \"object\", \"properties\": {\"name\": {\"const\": \"get_weather\"}, "
            "\"arguments\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, "
            "\"required\": [\"city\"]}}, \"required\": [\"name\", \"arguments\"]},"
            "{\"type\": \"object\", \"properties\": {\"name\": {\"const\": \"add\"}, "
            "\"arguments\": {\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"integer\"}, "
            "\"b\": {\"type\": \"integer\"}}, \"required\": [\"a\", \"b\"]}}, \"required\": [\"name\", \"arguments\"]}]}";
        akv_srv_schema *s = compile_text(text, why, sizeof why);
        if (!CHECK(s != NULL)) {
            printf("  %s\n", why);
            break;
        }
        const akv_json_schema *v = akv_srv_schema_view(s);
        valid(v, "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}");
        valid(v, "{\"name\":\"add\",\"arguments\":{\"b\":2,\"a\":1}}");
        invalid(v, "{\"name\": \"add\", \"arguments\": {\"city\": \"Paris\"}}", 31);
        invalid(v, "{\"name\": \"get_weather\", \"arguments\": {\"a\": 1}}", 39);
        invalid(v, "{\"arguments\": {\"a\": 1}, \"name\": \"add\"}", 2); /* the tag first */
        invalid(v, "{\"name\": \"sub\", \"arguments\": {}}", 10);
        invalid(v, "{\"name\": \"add\"}", 14); /* arguments required */
        incomplete(v, "{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}");
        /* the union as an array's items (a Mistral call list) */
        char arr[2048];
        snprintf(arr, sizeof arr, "{\"type\": \"array\", \"minItems\": 1, \"items\": %s}", text);
        akv_srv_schema *sa = compile_text(arr, why, sizeof why);
        if (CHECK(sa != NULL)) {
            const akv_json_schema *va = akv_srv_schema_view(sa);
            valid(va, "[{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}, {\"name\": "
                      "\"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}]");
            invalid(va, "[{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}, {\"name\": "
                        "\"get_weather\", \"arguments\": {\"a\": 1}}]", 88);
        }
        akv_srv_schema_free(sa);
        akv_srv_schema_free(s);
        /* not a union: branches of other properties, or no distinct const */
        const char *nots[] = {
            "{\"anyOf\": [{\"type\": \"object\", \"properties\": {\"k\": {\"const\": 1}}}, "
            "{\"type\": \"object\", \"properties\": {\"j\": {\"const\": 2}}}]}",
            "{\"anyOf\": [{\"type\": \"object\", \"properties\": {\"k\": {\"const\": 1}}}, "
            "{\"type\": \"object\", \"properties\": {\"k\": {\"const\": 1}}}]}",
        };
        for (int i = 0; i < 2; i++) {
            why[0] = 0;
            akv_srv_schema *x = compile_text(nots[i], why, sizeof why);
            TEST_CHECK_(x == NULL && strstr(why, "anyOf"), "%s: compiled, or '%s'", nots[i], why);
            akv_srv_schema_free(x);
        }
    }

    TEST_CASE(bounds_and_lengths_by_hand) {
        char sch[512];
        snprintf(sch, sizeof sch, "{\"type\": \"object\", \"properties\": {"
                 "\"n\": {\"type\": \"integer\", \"minimum\": -5, \"exclusiveMaximum\": 120},"
                 "\"x\": {\"type\": \"number\", \"minimum\": 0, \"maximum\": 1},"
                 "\"s\": {\"type\": \"string\", \"minLength\": 2, \"maxLength\": 3},"
                 "\"y\": {\"type\": \"number\", \"exclusiveMinimum\": -0.5, \"maximum\": 2.25}},"
                 "\"required\": []}");
        akv_srv_schema *c = compile_text(sch, why, sizeof why);
        if (!TEST_CHECK_(c != NULL, "%s", why)) break;
        const akv_json_schema *v = akv_srv_schema_view(c);
        valid(v, "{\"n\": -5}");
        valid(v, "{\"n\": 119}");
        valid(v, "{\"n\": 0}");
        invalid(v, "{\"n\": 120}", 8);   /* the 0 that makes 120: 12 could still be 12 */
        invalid(v, "{\"n\": -6}", 7);
        invalid(v, "{\"n\": 1234}", 8);  /* 123 can only grow past 119 */
        invalid(v, "{\"n\": 00}", 7);    /* no digit after a leading 0 */
        valid(v, "{\"x\": 0.75}");
        valid(v, "{\"x\": 1}");
        valid(v, "{\"x\": 1.000}");
        invalid(v, "{\"x\": 1.01}", 9);
        invalid(v, "{\"x\": 2}", 6);
        invalid(v, "{\"x\": -0.1}", 9);  /* -0. may still be -0.0 */
        valid(v, "{\"x\": -0.0}");
        invalid(v, "{\"x\": 1e0}", 7);   /* no exponent where bounds hold */
        valid(v, "{\"y\": -0.4999}");
        invalid(v, "{\"y\": -0.5}", 9); /* exclusive: -0.5 and every -0.5... are out */
        valid(v, "{\"y\": 2.25}");
        invalid(v, "{\"y\": 2.26}", 9);
        valid(v, "{\"s\": \"ab\"}");
        valid(v, "{\"s\": \"\u00e9t\u00e9\"}");            /* 3 characters, escaped */
        valid(v, "{\"s\": \"\xc3\xa9t\xc3\xa9\"}");      /* 3 characters, 5 bytes */
        valid(v, "{\"s\": \"\\ud83d\\ude00!\"}");        /* a surrogate pair is one */
        invalid(v, "{\"s\": \"a\"}", 8);
        invalid(v, "{\"s\": \"abcd\"}", 10);
        akv_srv_schema_free(c);
        /* large integer bounds, exact (they were rounded through doubles of micro-units) */
        c = compile_text("{\"type\": \"integer\", \"minimum\": 1e13, \"maximum\": 2e13}", why, sizeof why);
        if (!TEST_CHECK_(c != NULL, "%s", why)) break;
        valid(akv_srv_schema_view(c), "15000000000000");
        invalid(akv_srv_schema_view(c), "-1", 0);
        akv_srv_schema_free(c);
        c = compile_text("{\"type\": \"integer\", \"minimum\": 706489407141, \"exclusiveMaximum\": "
                         "706489407141.018}", why, sizeof why);
        if (!TEST_CHECK_(c != NULL, "%s", why)) break;
        valid(akv_srv_schema_view(c), "706489407141");
        akv_srv_schema_free(c);
        c = compile_text("{\"type\": \"integer\", \"maximum\": -1e13}", why, sizeof why);
        if (!TEST_CHECK_(c != NULL, "%s", why)) break;
        incomplete(akv_srv_schema_view(c), "-9300000000000"); /* a digit more: -9.3e13 */
        akv_srv_schema_free(c);
        /* a surrogate pair is one character; an unpaired high surrogate is refused */
        c = compile_text("{\"type\": \"string\", \"maxLength\": 1}", why, sizeof why);
        if (!TEST_CHECK_(c != NULL, "%s", why)) break;
        valid(akv_srv_schema_view(c), "\"\\ud83d\\ude00\"");
        invalid(akv_srv_schema_view(c), "\"\\ud83da\"", 7);
        invalid(akv_srv_schema_view(c), "\"\\ud800\\ud800\"", 10);
        invalid(akv_srv_schema_view(c), "\"\\ud83d\"", 7);
        valid(akv_srv_schema_view(c), "\"\\udc00\""); /* a low half alone: one character */
        akv_srv_schema_free(c);
        c = compile_text(sch, why, sizeof why);
        v = akv_srv_schema_view(c);
        /* whitespace between tokens is bounded (no loop on blank lines); inside a string, text */
        valid(v, "{\n\n  \"s\": \"a b\"\n}");
        invalid(v, "{\n\n\n\"s\": \"ab\"}", 3);
        invalid(v, "{\"n\": 1\n\n\n}", 9);
        akv_srv_schema_free(c);
    }

    TEST_CASE(bounded_walks_never_dead_end_and_always_validate) {
        /* Random schemas of one bounded value; from the start, a walk takes a random byte of
         * those the machine allows (of digits, signs, dot, e, quote, letters, a multi-byte
         * character, an escape) until the value is complete and chosen to stop: no prefix on
         * the way may allow nothing while incomplete, and every complete value must parse and
         * lie within the bounds (strtod; characters counted as code points). */
        uint64_t rng = test_seed(7);
        static const char *const pieces[] = {"0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "-", ".", "e", "\"", "a", "\xc3\xa9",
                                             "\\n", "\\u00e9", "\\ud83d\\ude00", " "};
        const size_t np = sizeof pieces / sizeof pieces[0];
        for (int round = 0; round < 3000; round++) {
            char sch[256], text[512];
            const int kind = (int)test_rand_below(&rng, 3); /* integer, number, string */
            double a = (double)((int64_t)test_rand_below(&rng, 4001) - 2000) / (kind == 1 ? 100.0 : 1.0);
            if (kind == 0 && test_rand_below(&rng, 3) == 0) a *= 1e10; /* 13-14 digits */
            double b = a + (double)test_rand_below(&rng, 3000) / (kind == 1 ? 1000.0 : 1.0);
            const bool xa = test_rand_below(&rng, 2), xb = test_rand_below(&rng, 2);
            char ta[40], tb[40]; /* the bounds as the schema says them */
            snprintf(ta, sizeof ta, "%.6f", a), snprintf(tb, sizeof tb, "%.6f", b);
            a = strtod(ta, NULL), b = strtod(tb, NULL);
            if (kind == 2) {
                a = fabs(a) / 200, b = a + (double)test_rand_below(&rng, 6);
                snprintf(sch, sizeof sch, "{\"type\": \"string\", \"minLength\": %d, \"maxLength\": %d}",
                         (int)a, (int)b);
            } else {
                snprintf(sch, sizeof sch, "{\"type\": \"%s\", \"%s\": %.6f, \"%s\": %.6f}",
                         kind ? "number" : "integer", xa ? "exclusiveMinimum" : "minimum", a,
                         xb ? "exclusiveMaximum" : "maximum", b);
            }
            akv_srv_schema *c = compile_text(sch, why, sizeof why);
            if (!c) { /* an empty range: refused, as it must be */
                TEST_CHECK_(strstr(why, "no value") != NULL, "%s: %s", sch, why);
                continue;
            }
            const akv_json_schema *v = akv_srv_schema_view(c);
            akv_js_state st;
            akv_js_init(&st, v);
            size_t len = 0;
            bool dead = false;
            for (int step = 0; step < 60; step++) {
                if (akv_js_complete(&st) && test_rand_below(&rng, 4) == 0) break;
                const char *ok[32];
                size_t n_ok = 0;
                for (size_t i = 0; i < np; i++) {
                    akv_js_state q = st;
                    if (akv_js_feed(&q, (const uint8_t *)pieces[i], strlen(pieces[i]))) ok[n_ok++] = pieces[i];
                }
                if (!n_ok) {
                    dead = !akv_js_complete(&st);
                    break;
                }
                const char *p = ok[test_rand_below(&rng, n_ok)];
                if (len + strlen(p) >= sizeof text) break;
                CHECK(akv_js_feed(&st, (const uint8_t *)p, strlen(p)));
                memcpy(text + len, p, strlen(p)), len += strlen(p);
            }
            text[len] = 0;
            if (!TEST_CHECK_(!dead, "%s: '%s' allows nothing more and is not a value", sch, text)) break;
            if (!akv_js_complete(&st)) { /* the walk ran out of steps: a long string or number */
                akv_srv_schema_free(c);
                continue;
            }
            cJSON *j = cJSON_Parse(text);
            bool within = j != NULL;
            if (j && kind == 2) {
                int chars = 0;
                for (const unsigned char *q = (const unsigned char *)cJSON_GetStringValue(j); q && *q; q++)
                    chars += (*q & 0xC0) != 0x80;
                within = cJSON_IsString(j) && chars >= (int)a && chars <= (int)b;
            } else if (j) {
                const double x = j->valuedouble;
                double lo = a, hi = b;
                if (kind == 0) lo = xa ? floor(a) + 1 : ceil(a), hi = xb ? ceil(b) - 1 : floor(b);
                within = cJSON_IsNumber(j) && (kind == 0 ? x >= lo && x <= hi
                                                         : (xa ? x > a : x >= a) && (xb ? x < b : x <= b));
                if (kind == 0) within = within && x == floor(x) && !strpbrk(text, ".eE");
            }
            TEST_CHECK_(within, "%s: '%s' is not a value within the bounds", sch, text);
            cJSON_Delete(j);
            akv_srv_schema_free(c);
        }
    }

    TEST_CASE(refused_naming_the_keyword) {
        const char *bad[][2] = {
            {"{\"type\": \"object\", \"properties\": {\"a\": {}}, \"additionalProperties\": true}", "additionalProperties"},
            {"{\"anyOf\": [{\"type\": \"string\"}, {\"type\": \"integer\"}]}", "anyOf"},
            {"{\"not\": {\"type\": \"string\"}}", "not"},
            {"{\"type\": \"object\", \"properties\": {\"a\\\"b\": {}}}", "quote"},
            {"{\"$ref\": \"#/components/x\"}", "$ref"},
            {"{\"type\": \"thing\"}", "thing"},
            {"{\"type\": \"object\", \"properties\": {\"a\": {}}, \"required\": [\"b\"]}", "required"},
            {"{\"type\": \"array\", \"minItems\": 3, \"maxItems\": 2}", "minItems"},
            {"{\"type\": [\"string\", \"integer\"]}", "type"},
            {"{\"type\": \"string\", \"pattern\": \"^a+$\"}", "pattern"},
            {"{\"type\": \"number\", \"multipleOf\": 0.5}", "multipleOf"},
            {"{\"type\": \"array\", \"uniqueItems\": true}", "uniqueItems"},
            {"{\"type\": \"object\", \"minProperties\": 1}", "minProperties"},
            {"{\"minimum\": 3}", "minimum"},
            {"{\"type\": \"integer\", \"minimum\": 5, \"maximum\": 4}", "no value"},
            {"{\"type\": \"integer\", \"exclusiveMinimum\": 4, \"exclusiveMaximum\": 5}", "no value"},
            {"{\"type\": \"number\", \"minimum\": 0.1234567}", "6 decimals"},
            {"{\"type\": \"number\", \"maximum\": 12345678901234.5}", "more digits"},
            {"{\"type\": \"integer\", \"minimum\": 1e14}", "more digits"},
            {"{\"type\": \"number\", \"exclusiveMinimum\": 1000000.0000004}", "6 decimals"},
            {"{\"enum\": [1, 5], \"minimum\": 3}", "beside 'enum'"},
            {"{\"anyOf\": [{\"type\": \"integer\"}, {\"type\": \"null\"}], \"minimum\": 3}", "beside 'anyOf'"},
            {"{\"$ref\": \"#/$defs/a\", \"maxLength\": 3, \"$defs\": {\"a\": {\"type\": \"string\"}}}", "beside '$ref'"},
            {"{\"type\": \"string\", \"minLength\": 4, \"maxLength\": 3}", "minLength"},
            {"{\"type\": \"string\", \"maxLength\": -1}", "maxLength"},
            {"{\"type\": \"number\", \"minimum\": \"3\"}", "minimum"},
        };
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
            why[0] = 0;
            akv_srv_schema *s = compile_text(bad[i][0], why, sizeof why);
            TEST_CHECK_(s == NULL && strstr(why, bad[i][1]), "%s: compiled, or '%s' does not name %s", bad[i][0],
                        why, bad[i][1]);
            akv_srv_schema_free(s);
        }
    }
    return test_finish();
}
