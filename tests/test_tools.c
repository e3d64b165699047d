/* test_tools.c (unit) — tool calls found in a model's answer (server/tools.h): each form the
 * templates ask for, several calls, the text besides them, names not offered, broken JSON. */
#include "test.h"

#include <string.h>

#include "akv/json_schema.h"
#include "server/api.h"
#include "server/schema.h"
#include "server/tools.h"

static const char tools[] =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"add\"}}]";

/* The calls found in text: n of them, the first's name and arguments, the content. */
static void expect(const char *text, size_t n, const char *name0, const char *args0,
                   const char *content) {
    akv_srv_tool_calls c;
    CHECK_OK(akv_srv_tool_calls_find(text, strlen(text), tools, 7, &c));
    if (!CHECK(c.n == n)) fprintf(stderr, "  in [%s]: %zu calls, want %zu\n", text, c.n, n);
    if (n && c.n) {
        CHECK_STR(c.v[0].name, name0);
        CHECK_STR(c.v[0].arguments, args0);
        CHECK(strlen(c.v[0].id) == 9 && strspn(c.v[0].id, "0123456789abcdefghijklmnopqrstuvwxyz"
                                                           "ABCDEFGHIJKLMNOPQRSTUVWXYZ") == 9);
        for (size_t i = 1; i < c.n; i++) CHECK(strcmp(c.v[i].id, c.v[0].id) != 0);
        akv_srv_tool_calls again;
        CHECK_OK(akv_srv_tool_calls_find(text, strlen(text), tools, 7, &again));
        if (again.n) CHECK_STR(again.v[0].id, c.v[0].id); /* the same request: the same ids */
        akv_srv_tool_calls_free(&again);
    }
    if (content) CHECK_STR(c.content ? c.content : "(none)", content);
    akv_srv_tool_calls_free(&c);
}

int main(int argc, char **argv) {
    test_args(argc, argv);
    TEST_CASE(a_list_of_calls_held_one_unless_parallel) {
        /* Mistral's [TOOL_CALLS] [...]: the list held to the tools' calls; with
         * parallel_tool_calls false, one call at most */
        const char *one = "[{\"name\": \"add\", \"arguments\": {}}]";
        const char *two = "[{\"name\": \"add\", \"arguments\": {}}, {\"name\": \"get_weather\", \"arguments\": {}}]";
        for (int parallel = 0; parallel < 2; parallel++) {
            akv_srv_schema *sch = NULL;
            char why[256] = "";
            if (!REQUIRE_OK(akv_api_call_schema(tools, NULL, true, parallel, "arguments", &sch, why, sizeof why)))
                break;
            const akv_json_schema *v = akv_srv_schema_view(sch);
            akv_js_state st;
            akv_js_init(&st, v);
            CHECK(akv_js_feed(&st, (const uint8_t *)one, strlen(one)) && akv_js_complete(&st));
            akv_js_init(&st, v);
            const bool both = akv_js_feed(&st, (const uint8_t *)two, strlen(two)) && akv_js_complete(&st);
            TEST_CHECK_(both == (parallel == 1), "parallel %d: two calls %s", parallel, both ? "taken" : "refused");
            akv_js_init(&st, v);
            const char *other = "[{\"name\": \"sub\"";
            CHECK(!akv_js_feed(&st, (const uint8_t *)other, strlen(other))); /* a name not offered */
            akv_srv_schema_free(sch);
        }
    }

    TEST_CASE(hermes_and_qwen) {
        expect("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
               1, "get_weather", "{\"city\": \"Paris\"}", "(none)");
        expect("Let me look.\n<tool_call>{\"name\":\"add\",\"arguments\":{\"a\":1,\"b\":2}}</tool_call>\n"
               "<tool_call>{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Rome\"}}",
               2, "add", "{\"a\":1,\"b\":2}", "Let me look.");
        /* arguments given as text stay that text */
        expect("<tool_call>{\"name\":\"add\",\"arguments\":\"{\\\"a\\\": 1}\"}</tool_call>", 1, "add",
               "{\"a\": 1}", NULL);
    }
    /* a call's arguments are the JSON text the model wrote (as OpenAI gives them), spaces kept */
    TEST_CASE(functionary_mistral_llama) {
        expect("<function=get_weather>{\"city\": \"Oslo\"}</function>", 1, "get_weather",
               "{\"city\": \"Oslo\"}", "(none)");
        expect("[TOOL_CALLS] [{\"name\": \"add\", \"arguments\": {\"a\": 2, \"b\": 3}}]", 1, "add",
               "{\"a\": 2, \"b\": 3}", NULL);
        expect("[{\"name\": \"add\", \"arguments\": {}}, {\"name\": \"get_weather\", \"arguments\": {}}]",
               2, "add", "{}", NULL);
        expect("<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Lima\"}}", 1,
               "get_weather", "{\"city\": \"Lima\"}", NULL);
        expect("  {\"name\": \"add\", \"parameters\": {\"a\": 1}}  \n", 1, "add", "{\"a\": 1}", NULL);
    }
    TEST_CASE(text_is_text) {
        expect("The weather is fine.", 0, NULL, NULL, NULL);
        expect("{\"name\": \"nosuch\", \"arguments\": {}}", 0, NULL, NULL, NULL); /* not offered */
        expect("<tool_call>{\"name\": \"nosuch\"}</tool_call>", 0, NULL, NULL, NULL);
        expect("<tool_call>{not json</tool_call>", 0, NULL, NULL, NULL);
        /* another model's form in the same tags (Qwen3-Coder's parameters): not this one */
        expect("<function=get_weather><parameter=city>Paris</parameter></function>", 0, NULL, NULL, NULL);
        expect("{\"name\": \"add\", \"arguments\": {}} and more", 0, NULL, NULL, NULL); /* not whole */
        expect("[{\"name\": \"add\"}, {\"name\": \"nosuch\"}]", 0, NULL, NULL, NULL); /* all or none */
        expect("", 0, NULL, NULL, NULL);
        akv_srv_tool_calls c;
        CHECK_OK(akv_srv_tool_calls_find("{}", 2, NULL, 1, &c)); /* no tools: nothing */
        CHECK(c.n == 0);
    }
    TEST_CASE(calls_as_far_as_they_have_come) {
        /* Every prefix of a held answer, read on from the last (each call's part final once
         * whole): each call's name once whole is its name, its arguments
         * so far are a prefix of its whole arguments and never shrink; at the end the calls are
         * akv_srv_tool_calls_find's, names and argument text alike */
        static const char *const answers[] = {
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Pa\\\"ris\"}}\n</tool_call>",
            "<tool_call>{\"name\":\"add\",\"arguments\":{\"a\":1,\"b\":[2, {\"c\": \"}\"}]}}</tool_call>\n"
            "<tool_call>{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Rome\"}}</tool_call>",
            "[TOOL_CALLS] [{\"name\": \"add\", \"arguments\": {\"a\": 2, \"b\": 3}}, {\"name\": "
            "\"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}]",
            "{\"name\": \"add\", \"arguments\": {\"a\": -1.5e3, \"b\": true}}",
        };
        for (size_t a = 0; a < sizeof answers / sizeof answers[0]; a++) {
            const char *t = answers[a];
            const size_t n = strlen(t);
            akv_srv_tool_calls want;
            CHECK_OK(akv_srv_tool_calls_find(t, n, tools, 3, &want));
            CHECK(want.n > 0);
            size_t last[4] = {0};
            akv_srv_calls_scan sc = {0}; /* read on from cut to cut, as a stream grows */
            akv_srv_call_part p[4];
            for (size_t cut = 0; cut <= n; cut++) {
                const size_t k = akv_srv_tool_calls_partial(t, cut, &sc, p, 4);
                TEST_CHECK_(k <= want.n, "answer %zu cut %zu: %zu calls of %zu", a, cut, k, want.n);
                for (size_t i = 0; i < k && i < want.n; i++) {
                    if (p[i].named)
                        TEST_CHECK_(p[i].name_n == strlen(want.v[i].name) &&
                                        !memcmp(p[i].name, want.v[i].name, p[i].name_n),
                                    "answer %zu cut %zu call %zu: name", a, cut, i);
                    if (!p[i].has_args) continue;
                    TEST_CHECK_(p[i].args_n >= last[i] && p[i].args_n <= strlen(want.v[i].arguments) &&
                                    !memcmp(t + p[i].args_at, want.v[i].arguments, p[i].args_n),
                                "answer %zu cut %zu call %zu: arguments so far", a, cut, i);
                    last[i] = p[i].args_n;
                }
                if (cut == n) {
                    CHECK_EQ_INT(k, want.n);
                    for (size_t i = 0; i < k; i++)
                        CHECK(p[i].named && p[i].args_whole && p[i].args_n == strlen(want.v[i].arguments));
                }
            }
            akv_srv_tool_calls_free(&want);
        }
    }

    TEST_CASE(streamed_text_goes_out_calls_are_held) {
        /* Each answer fed in pieces of every size from 1 to its length: what goes out, then
         * what is held at the end. Text without a call goes out whole (bar its trailing white
         * space, held to the end); text before a call goes out, the call is held; an opener
         * split across pieces is never sent; an answer that begins with '{' or '[' is held. */
        static const struct { const char *text, *sent, *held; } cases[] = {
            {"The weather is fine.", "The weather is fine.", ""},
            {"Fine weather.  \n", "Fine weather.", "  \n"},
            {"Let me look. <tool_call>{\"name\":\"add\"}</tool_call>", "Let me look.",
             " <tool_call>{\"name\":\"add\"}</tool_call>"},
            {"a <tool_cal b", "a <tool_cal b", ""},
            {"x [TOOL_CALLS] [{}]", "x [TOOL_CALLS] [{}]", ""}, /* not at the start: text */
            {" [TOOL_CALLS] [{}]", "", " [TOOL_CALLS] [{}]"},
            {"Sure. <|python_tag|>{}", "Sure. <|python_tag|>{}", ""},
            {"  {\"name\": \"add\"}", "", "  {\"name\": \"add\"}"},
            {"[{\"name\": \"add\"}]", "", "[{\"name\": \"add\"}]"},
            {"Use <function=add>{}</function> now", "Use", " <function=add>{}</function> now"},
            {"ends with <|python", "ends with <|python", ""},
            {"<|python", "", "<|python"},
            {"", "", ""},
        };
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            const size_t n = strlen(cases[i].text);
            for (size_t step = 1; step <= (n ? n : 1); step++) {
                akv_srv_tool_stream ts = {0};
                char sent[256] = "";
                size_t n_sent = 0;
                for (size_t at = 0; at < n || (n == 0 && at == 0); at += step) {
                    const size_t k = n - at < step ? n - at : step;
                    const char *out;
                    size_t n_out;
                    CHECK_OK(akv_srv_tool_stream_feed(&ts, cases[i].text + at, k, &out, &n_out));
                    if (n_out) memcpy(sent + n_sent, out, n_out);
                    n_sent += n_out;
                    if (n == 0) break;
                }
                sent[n_sent] = 0;
                size_t n_held;
                const char *held = akv_srv_tool_stream_held(&ts, &n_held);
                TEST_CHECK_(!strcmp(sent, cases[i].sent) && n_held == strlen(cases[i].held) &&
                                !memcmp(held, cases[i].held, n_held),
                            "case %zu in pieces of %zu: sent [%s] held [%.*s]", i, step, sent,
                            (int)n_held, held);
                akv_srv_tool_stream_free(&ts);
            }
        }
    }
    return test_finish();
}
