/* test_chat.c — chat templates: recognition of a template's family from its Jinja source, the
 * default system message it carries, and renderings compared with Jinja's own.
 *
 * The expected renderings were produced by jinja2 3.1.6 running the templates below:
 *   python3 scripts/tok-reference.py chat --template-file T.j2 --bos '<|begin_of_text|>' --c
 * with the conversations of `convs` as JSON lines. SMOLLM2 is tokenizer.chat_template of the
 * default model (byte for byte); LLAMA3 is Meta-Llama-3-8B-Instruct's; QWEN is a ChatML
 * template in Qwen2.5's style (tool branch left out) whose default system is written with
 * \n escapes. */
#define _GNU_SOURCE
#include "test.h"

#include "akv/chat.h"
#include "akv/log.h"
#include "core/alloc.h"
#include "core/assert.h"

/* clang-format off */
static const char SMOLLM2[] = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";
static const char LLAMA3[] = "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";
static const char QWEN[] = "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}{%- else %}{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}{%- endif %}{%- for message in messages %}{%- if not (message.role == 'system' and loop.first) %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}{%- endif %}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

/* clang-format on */
typedef struct conv {
    size_t n;
    bool gen;
    akv_chat_msg msgs[4];
} conv;

/* clang-format off */
static const conv convs[] = {
    {1, true, {{"user", "Hi"}}},
    {4, true, {{"system", "Be brief."}, {"user", "What is 2+2?"}, {"assistant", "4"}, {"user", "  And 3+3?\n"}}},
    {2, false, {{"user", "  padded\t\n"}, {"assistant", " \xE3""\x80""\x80""x\xC2""\xA0""\xE2""\x80""\xA8"""}}},
    {1, false, {{"user", "<|im_start|>日本 👍 e\xCC""\x81"""}}},
};

static const char *const want_smollm2[] = {
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n<|im_start|>user\n  And 3+3?\n<|im_end|>\n<|im_start|>assistant\n",
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\n  padded\t\n<|im_end|>\n<|im_start|>assistant\n \xE3""\x80""\x80""x\xC2""\xA0""\xE2""\x80""\xA8""<|im_end|>\n",
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\n<|im_start|>日本 👍 e\xCC""\x81""<|im_end|>\n",
};
static const char *const want_llama3[] = {
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n4<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nAnd 3+3?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\npadded<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nx<|eot_id|>",
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n<|im_start|>日本 👍 e\xCC""\x81""<|eot_id|>",
};
static const char *const want_qwen[] = {
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n<|im_start|>user\n  And 3+3?\n<|im_end|>\n<|im_start|>assistant\n",
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n<|im_start|>user\n  padded\t\n<|im_end|>\n<|im_start|>assistant\n \xE3""\x80""\x80""x\xC2""\xA0""\xE2""\x80""\xA8""<|im_end|>\n",
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n<|im_start|>user\n<|im_start|>日本 👍 e\xCC""\x81""<|im_end|>\n",
};
static const char *const want_gemma[] = {
        "<|begin_of_text|><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n",
        "<|begin_of_text|><start_of_turn>user\nBe brief.\n\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n4<end_of_turn>\n<start_of_turn>user\nAnd 3+3?<end_of_turn>\n<start_of_turn>model\n",
        "<|begin_of_text|><start_of_turn>user\npadded<end_of_turn>\n<start_of_turn>model\nx<end_of_turn>\n",
        "<|begin_of_text|><start_of_turn>user\n<|im_start|>日本 👍 e\xCC""\x81""<end_of_turn>\n",
};

/* clang-format on */
static char last_log[512];
static void capture(akv_log_level level, const char *msg, void *user) {
    (void)level, (void)user;
    snprintf(last_log, sizeof last_log, "%s", msg);
}

/* Creates a chat from a template (and name), renders every conversation, compares. */
static void check_renders(const char *tmpl, const char *name, akv_chat_kind kind,
                          const char *const *want) {
    /* LLAMA3 (the family, or the template run) trims each content */
    const bool trimmed = kind == AKV_CHAT_LLAMA3 || kind == AKV_CHAT_GEMMA || (tmpl && strstr(tmpl, "| trim"));
    akv_chat_params p = {.template_text = tmpl, .name = name, .bos_text = "<|begin_of_text|>"};
    akv_chat *chat = NULL;
    CHECK_OK(akv_chat_create(&p, &chat));
    if (!chat) return;
    CHECK_EQ_INT(akv_chat_get_kind(chat), kind);
    for (size_t i = 0; i < AKV_ARRAY_LEN(convs); i++) {
        akv_tok_text out = {0};
        CHECK_OK(akv_chat_render(chat, convs[i].msgs, convs[i].n, convs[i].gen, &out, NULL));
        if (!CHECK(out.bytes && strcmp(out.bytes, want[i]) == 0))
            fprintf(stderr, "conversation %zu:\n got  [%s]\n want [%s]\n", i,
                    out.bytes ? out.bytes : "(null)", want[i]);
        /* the same rendering with the contents' stretches: one per content, in order, each
         * holding that content (LLAMA3's trimmed of Unicode white space, so: a part of it
         * that the trim leaves; contents all white space leave none) */
        akv_tok_text again = {0};
        akv_tok_spans spans = {0};
        CHECK_OK(akv_chat_render(chat, convs[i].msgs, convs[i].n, convs[i].gen, &again, &spans));
        CHECK(again.bytes && out.bytes && !strcmp(again.bytes, out.bytes));
        size_t k = 0;
        for (size_t m = 0; m < convs[i].n && k < spans.n; m++) {
            const char *c = convs[i].msgs[m].content;
            const akv_tok_span sp = spans.spans[k];
            if (!CHECK(sp.off + sp.n_bytes <= again.n_bytes)) break;
            const char *got = again.bytes + sp.off;
            if (!trimmed)
                CHECK(sp.n_bytes == strlen(c) && !memcmp(got, c, sp.n_bytes));
            else
                CHECK(memmem(c, strlen(c), got, sp.n_bytes) != NULL);
            k++;
        }
        CHECK_EQ_U64(k, spans.n);
        CHECK(spans.n >= convs[i].n - trimmed);
        akv_tok_spans_free(&spans);
        akv_tok_text_free(&again);
        akv_tok_text_free(&out);
    }
    akv_chat_destroy(chat);
}

int main(int argc, char **argv) {
    test_args(argc, argv);
    TEST_CASE(smollm2_chatml_with_its_default_system) {
        /* the template run, and its family in C: the same bytes (the family's default system
         * read from the template) */
        check_renders(SMOLLM2, NULL, AKV_CHAT_JINJA, want_smollm2);
        check_renders(SMOLLM2, "chatml", AKV_CHAT_CHATML, want_smollm2);
        akv_chat_params p = {.template_text = SMOLLM2, .name = "chatml"};
        akv_chat *chat = NULL;
        CHECK_OK(akv_chat_create(&p, &chat));
        if (!chat) break;
        CHECK_STR(akv_chat_default_system(chat),
                  "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
        akv_chat_destroy(chat);
        p.name = NULL;
        chat = NULL;
        CHECK_OK(akv_chat_create(&p, &chat));
        if (!chat) break;
        CHECK(akv_chat_default_system(chat) == NULL); /* the template writes it */
        /* No messages: the template's loop never runs, so no system either. */
        akv_tok_text out = {0};
        CHECK_OK(akv_chat_render(chat, NULL, 0, true, &out, NULL));
        CHECK_STR(out.bytes, "<|im_start|>assistant\n");
        akv_tok_text_free(&out);
        akv_chat_destroy(chat);
    }

    TEST_CASE(llama3) {
        check_renders(LLAMA3, NULL, AKV_CHAT_JINJA, want_llama3);
        check_renders(LLAMA3, "llama3", AKV_CHAT_LLAMA3, want_llama3);
    }

    TEST_CASE(gemma) {
        /* the family in C; a system message's text before the next user turn's content */
        check_renders(NULL, "gemma", AKV_CHAT_GEMMA, want_gemma);
        /* Gemma 2's own template (tests/data; it refuses a system role) gives the same bytes
         * for the conversations without one, and is recognised as the family */
        char path[512];
        const char *src = getenv("AKV_SOURCE_DIR");
        snprintf(path, sizeof path, "%s/tests/data/chat_templates/google-gemma-2-2b-it.jinja", src ? src : ".");
        FILE *f = fopen(path, "rb");
        if (!CHECK(f != NULL)) break;
        static char tmpl[8192];
        const size_t n = fread(tmpl, 1, sizeof tmpl - 1, f);
        fclose(f);
        tmpl[n] = '\0';
        akv_chat_params p = {.template_text = tmpl, .bos_text = "<|begin_of_text|>"};
        akv_chat *run = NULL, *fam = NULL;
        CHECK_OK(akv_chat_create(&p, &run));
        p.name = "gemma";
        CHECK_OK(akv_chat_create(&p, &fam));
        if (run && fam) {
            CHECK_EQ_INT(akv_chat_get_kind(run), AKV_CHAT_JINJA);
            for (size_t i = 0; i < AKV_ARRAY_LEN(convs); i++) {
                if (!strcmp(convs[i].msgs[0].role, "system")) continue;
                akv_tok_text a = {0}, b = {0};
                CHECK_OK(akv_chat_render(run, convs[i].msgs, convs[i].n, convs[i].gen, &a, NULL));
                CHECK_OK(akv_chat_render(fam, convs[i].msgs, convs[i].n, convs[i].gen, &b, NULL));
                if (!CHECK(a.bytes && b.bytes && !strcmp(a.bytes, b.bytes)))
                    fprintf(stderr, "conversation %zu:\n template [%s]\n family   [%s]\n", i,
                            a.bytes ? a.bytes : "", b.bytes ? b.bytes : "");
                akv_tok_text_free(&a), akv_tok_text_free(&b);
            }
        }
        akv_chat_destroy(run), akv_chat_destroy(fam);
        akv_chat_kind k;
        CHECK(akv_chat_kind_from_name("gemma", &k) == AKV_OK && k == AKV_CHAT_GEMMA);
        CHECK_STR(akv_chat_kind_name(AKV_CHAT_GEMMA), "gemma");
    }

    TEST_CASE(chatml_default_system_written_with_escapes) {
        check_renders(QWEN, NULL, AKV_CHAT_JINJA, want_qwen);
        check_renders(QWEN, "chatml", AKV_CHAT_CHATML, want_qwen);
    }

    TEST_CASE(unknown_templates_need_a_name) {
        static const char llama2[] = "{% for message in messages %}[INST] {{ message['content'] "
                                     "}} [/INST]{% endfor %}";
        static const char llama31[] = "{{- bos_token }}<|start_header_id|>system<|end_header_id|>"
                                      "\n\nCutting Knowledge Date: December 2023<|eot_id|>";
        akv_chat *chat = NULL;
        /* templates of no family run as they are */
        akv_chat_params p = {.template_text = llama2};
        CHECK_OK(akv_chat_create(&p, &chat));
        if (chat) {
            CHECK_EQ_INT(akv_chat_get_kind(chat), AKV_CHAT_JINJA);
            akv_tok_text out = {0};
            CHECK_OK(akv_chat_render(chat, convs[1].msgs, 2, true, &out, NULL));
            CHECK_STR(out.bytes, "[INST] Be brief. [/INST][INST] What is 2+2? [/INST]");
            akv_tok_text_free(&out);
            akv_chat_destroy(chat);
            chat = NULL;
        }
        /* one that does not run and has no family is refused, naming the line and why; one
         * that does not run but is of a family is rendered as that family */
        static const char broken[] = "{% for m in messages %}\n{{ m.content | nosuchfilter }}{% endfor %}";
        static const char broken_chatml[] = "<|im_start|>{{ messages[0].content }<|im_end|>";
        akv_log_set(capture, NULL, AKV_LOG_WARN);
        p.template_text = broken;
        CHECK_STATUS(akv_chat_create(&p, &chat), AKV_EUNSUPPORTED);
        CHECK(strstr(last_log, "line 2") && strstr(last_log, "nosuchfilter") && strstr(last_log, "no known family"));
        p.template_text = broken_chatml;
        CHECK_OK(akv_chat_create(&p, &chat));
        CHECK(chat && akv_chat_get_kind(chat) == AKV_CHAT_CHATML);
        CHECK(strstr(last_log, "rendered as the chatml family") != NULL);
        akv_chat_destroy(chat);
        chat = NULL;
        akv_log_set(capture, NULL, AKV_LOG_ERROR);
        p.template_text = NULL;
        CHECK_STATUS(akv_chat_create(&p, &chat), AKV_EUNSUPPORTED);
        CHECK(strstr(last_log, "has none") != NULL);
        p.name = "jinja";
        CHECK_STATUS(akv_chat_create(&p, &chat), AKV_EINVAL);
        CHECK(strstr(last_log, "'jinja'") != NULL);
        akv_log_set(NULL, NULL, AKV_LOG_WARN);
        CHECK(chat == NULL);
        /* Named, any template (or none) renders as that family, without a default system
         * unless the template is of the same family. */
        check_renders(llama2, "llama3", AKV_CHAT_LLAMA3, want_llama3);
        check_renders(llama31, "llama3", AKV_CHAT_LLAMA3, want_llama3);
        check_renders(NULL, "llama3", AKV_CHAT_LLAMA3, want_llama3);
        check_renders(QWEN, "chatml", AKV_CHAT_CHATML, want_qwen);
        p = (akv_chat_params){.template_text = LLAMA3, .name = "chatml"};
        CHECK_OK(akv_chat_create(&p, &chat));
        if (chat) CHECK(akv_chat_default_system(chat) == NULL);
        akv_chat_destroy(chat);
    }

    TEST_CASE(bad_messages_and_allocation_failures) {
        int64_t live = akv__alloc_live();
        akv_chat_params p = {.template_text = SMOLLM2};
        akv_chat *chat = NULL;
        CHECK_OK(akv_chat_create(&p, &chat));
        if (!chat) break;
        akv_tok_text out = {0};
        CHECK_OK(akv_tok_text_append(&out, "keep", 4));
        akv_chat_msg bad[] = {{"user", "hi"}, {"user", NULL}};
        akv_log_set(capture, NULL, AKV_LOG_ERROR);
        CHECK_STATUS(akv_chat_render(chat, bad, 2, true, &out, NULL), AKV_EINVAL);
        akv_log_set(NULL, NULL, AKV_LOG_WARN);
        CHECK(strstr(last_log, "message 1 has no content") != NULL);
        CHECK_STR(out.bytes, "keep");
        for (uint64_t nth = 1; nth < 50; nth++) {
            akv__alloc_fail_nth(nth);
            akv_status st = akv_chat_render(chat, convs[1].msgs, convs[1].n, true, &out, NULL);
            bool fired = akv__alloc_failure_fired();
            akv__alloc_fail_nth(0);
            if (!fired) {
                CHECK_OK(st);
                break;
            }
            CHECK_STATUS(st, AKV_ENOMEM);
            CHECK_STR(out.bytes, "keep");
        }
        akv_tok_text_free(&out);
        akv_chat_destroy(chat);
        for (uint64_t nth = 1; nth < 10; nth++) {
            akv__alloc_fail_nth(nth);
            akv_chat *c = NULL;
            akv_status st = akv_chat_create(&p, &c);
            bool fired = akv__alloc_failure_fired();
            akv__alloc_fail_nth(0);
            akv_chat_destroy(c);
            if (!fired) break;
            CHECK_STATUS(st, AKV_ENOMEM);
            CHECK(c == NULL);
        }
        CHECK_EQ_INT(akv__alloc_live(), live);
    }

    return test_finish();
}
