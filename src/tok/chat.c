/* chat.c — chat templates: a model's own Jinja template run (akv/jinja.h), or a family
 * recognised and rendered in C (see akv/chat.h). */
#include "akv/chat.h"
#include <stdio.h>

#include <string.h>

#include "akv/gguf.h"
#include "akv/jinja.h"
#include "core/alloc.h"
#include "core/log.h"
#include "tok/utf8.h"

struct akv_chat {
    akv_chat_kind kind;
    char *default_system; /* CHATML: inserted before a first message that is not "system" */
    char *bos_text;       /* LLAMA3: written before the first message; JINJA: bos_token; never
                             NULL */
    char *eos_text;       /* JINJA: eos_token; never NULL */
    akv_jinja *jinja;     /* JINJA: the compiled template */
};

static const char *chat_find(const char *hay, size_t n, const char *needle) {
    size_t m = strlen(needle);
    for (size_t i = 0; m <= n && i <= n - m; i++)
        if (hay[i] == needle[0] && memcmp(hay + i, needle, m) == 0) return hay + i;
    return NULL;
}

const char *akv_chat_kind_name(akv_chat_kind kind) {
    switch (kind) {
    case AKV_CHAT_CHATML:
        return "chatml";
    case AKV_CHAT_LLAMA3:
        return "llama3";
    case AKV_CHAT_GEMMA:
        return "gemma";
    case AKV_CHAT_JINJA:
        return "jinja";
    }
    return "unknown";
}

akv_status akv_chat_kind_from_name(const char *name, akv_chat_kind *out) {
    if (name && strcmp(name, "chatml") == 0)
        *out = AKV_CHAT_CHATML;
    else if (name && strcmp(name, "llama3") == 0)
        *out = AKV_CHAT_LLAMA3;
    else if (name && strcmp(name, "gemma") == 0)
        *out = AKV_CHAT_GEMMA;
    else
        return AKV_EINVAL;
    return AKV_OK;
}

/* The literal default system text of a ChatML template: what follows a literal
 * "<|im_start|>system" and a newline (written as is or as \n) up to "<|im_end|>", when that
 * stretch is plain text inside a Jinja string (no quote, brace or '+' outside an escape).
 * *n_out = 0 and NULL when there is none; else a new string (NULL + *n_out = 1: no memory). */
static char *chat_chatml_default_system(const char *t, size_t n, size_t *n_out) {
    static const char head[] = "<|im_start|>system";
    *n_out = 0;
    for (const char *at = t; (at = chat_find(at, n - (size_t)(at - t), head)) != NULL; at++) {
        const char *s = at + sizeof head - 1, *end = t + n;
        if (s < end && *s == '\n')
            s++;
        else if (end - s >= 2 && s[0] == '\\' && s[1] == 'n')
            s += 2;
        else
            continue;
        const char *stop = chat_find(s, (size_t)(end - s), "<|im_end|>");
        if (!stop) continue;
        /* Unescape into a copy; give up on anything that is not a plain literal. */
        char *out = akv__malloc((size_t)(stop - s) + 1);
        if (!out) {
            *n_out = 1;
            return NULL;
        }
        size_t o = 0;
        bool literal = true;
        for (const char *c = s; c < stop && literal; c++) {
            if (*c == '\\' && c + 1 < stop) {
                c++;
                out[o++] = *c == 'n' ? '\n' : *c == 't' ? '\t' : *c;
            } else if (strchr("'\"{}+", *c)) {
                literal = false;
            } else {
                out[o++] = *c;
            }
        }
        if (!literal) {
            akv__free(out);
            continue;
        }
        out[o] = '\0';
        *n_out = o;
        return out;
    }
    return NULL;
}

/* Recognises the family of a template; AKV_EUNSUPPORTED (logged unless quiet) when it has
 * none. */
static akv_status chat_recognise(const char *t, size_t n, bool quiet, akv_chat_kind *kind) {
    if (chat_find(t, n, "<|start_header_id|>") && chat_find(t, n, "<|end_header_id|>") &&
        chat_find(t, n, "<|eot_id|>")) {
        if (chat_find(t, n, "Cutting Knowledge Date") || chat_find(t, n, "ipython")) {
            if (!quiet)
                AKV_LOG_E(
                    "chat template: a Llama 3.1-style template (knowledge-date system header, "
                    "tool calls), which is not rendered; name a template (llama3 for plain "
                    "Llama 3 turns) to use one anyway");
            return AKV_EUNSUPPORTED;
        }
        *kind = AKV_CHAT_LLAMA3;
        return AKV_OK;
    }
    if (chat_find(t, n, "<|im_start|>") && chat_find(t, n, "<|im_end|>")) {
        *kind = AKV_CHAT_CHATML;
        return AKV_OK;
    }
    if (chat_find(t, n, "<start_of_turn>") && chat_find(t, n, "<end_of_turn>")) {
        *kind = AKV_CHAT_GEMMA;
        return AKV_OK;
    }
    if (!quiet)
        AKV_LOG_E("chat template: not a known family (chatml: <|im_start|>/<|im_end|>; llama3: "
                  "<|start_header_id|>/<|eot_id|>; gemma: <start_of_turn>/<end_of_turn>); name a "
                  "template to use one anyway");
    return AKV_EUNSUPPORTED;
}

/* ---- the template run (JINJA) ---------------------------------------------------------- */

#define CHAT_LIT(out, lit) akv_tok_text_append(out, lit, sizeof lit - 1)

/* A JSON string of s[0..n) appended to out. */
static akv_status chat_json_str(akv_tok_text *out, const char *s, size_t n) {
    akv_status st = CHAT_LIT(out, "\"");
    size_t run = 0;
    for (size_t i = 0; !st && i < n; i++) {
        const unsigned char ch = (unsigned char)s[i];
        char esc[8];
        if (ch == '"' || ch == '\\') snprintf(esc, sizeof esc, "\\%c", ch);
        else if (ch == '\n') snprintf(esc, sizeof esc, "\\n");
        else if (ch < 0x20) snprintf(esc, sizeof esc, "\\u%04x", ch);
        else continue;
        if (!(st = akv_tok_text_append(out, s + run, i - run))) st = akv_tok_text_append(out, esc, strlen(esc));
        run = i + 1;
    }
    if (!st) st = akv_tok_text_append(out, s + run, n - run);
    return st ? st : CHAT_LIT(out, "\"");
}

/* The template's variables as JSON: messages (given as JSON), tools (NULL: none),
 * add_generation_prompt, bos_token, eos_token. */
static akv_status chat_context(const akv_chat *c, const char *messages_json, const char *tools_json,
                               bool add_generation_prompt, akv_tok_text *ctx) {
    akv_status st = CHAT_LIT(ctx, "{\"messages\": ");
    if (!st) st = akv_tok_text_append(ctx, messages_json, strlen(messages_json));
    /* tools and documents as apply_chat_template passes them: null when there are none */
    if (!st) st = CHAT_LIT(ctx, ", \"documents\": null, \"tools\": ");
    if (!st) st = tools_json ? akv_tok_text_append(ctx, tools_json, strlen(tools_json)) : CHAT_LIT(ctx, "null");
    if (!st) {
        const char *agp = add_generation_prompt ? ", \"add_generation_prompt\": true, \"bos_token\": "
                                                : ", \"add_generation_prompt\": false, \"bos_token\": ";
        st = akv_tok_text_append(ctx, agp, strlen(agp));
    }
    if (!st) st = chat_json_str(ctx, c->bos_text, strlen(c->bos_text));
    if (!st) st = CHAT_LIT(ctx, ", \"eos_token\": ");
    if (!st) st = chat_json_str(ctx, c->eos_text, strlen(c->eos_text));
    return st ? st : CHAT_LIT(ctx, "}");
}

static akv_status chat_jinja_render(const akv_jinja *j, const char *ctx, size_t n_ctx,
                                    akv_tok_text *out, akv_tok_spans *contents,
                                    akv_jinja_error *err) {
    /* what a client wrote stays text, wherever the template prints it: contents, calls
     * (names, ids, arguments), tool results' names and the tools themselves */
    static const char *const plain[] = {"content", "tool_calls", "tool_call_id", "name", "tools"};
    const akv_jinja_render_params rp = {.context_json = ctx, .context_bytes = n_ctx,
                                        .plain_keys = plain, .n_plain_keys = 5};
    return akv_jinja_render(j, &rp, out, contents, err);
}

/* Compiles the template and renders a one-message conversation with it: *out the compiled
 * template when both work (NULL and *err when not). AKV_ENOMEM, or AKV_OK either way. */
static akv_status chat_jinja_try(const akv_chat_params *p, const char *t, size_t n,
                                 akv_jinja **out, akv_jinja_error *err) {
    *out = NULL;
    akv_jinja *j = NULL;
    akv_status st = akv_jinja_compile(t, n, &j, err);
    if (st) return st == AKV_ENOMEM ? st : AKV_OK;
    const akv_chat probe = {.bos_text = (char *)(p->bos_text ? p->bos_text : ""),
                            .eos_text = (char *)(p->eos_text ? p->eos_text : "")};
    akv_tok_text ctx = {0}, text = {0};
    /* a conversation without tools, else with one (a template for tool use only, as
     * Hermes 3's tool_use, needs them) */
    static const char *const tools[] = {
        NULL, "[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"description\": \"f\", "
              "\"parameters\": {\"type\": \"object\", \"properties\": {}}}}]"};
    for (int i = 0; i < 2; i++) {
        st = chat_context(&probe, "[{\"role\": \"user\", \"content\": \"Hi\"}]", tools[i], true, &ctx);
        if (!st) st = chat_jinja_render(j, ctx.bytes, ctx.n_bytes, &text, NULL, err);
        akv_tok_text_free(&ctx);
        akv_tok_text_free(&text);
        if (st == AKV_OK || st == AKV_ENOMEM) break;
    }
    if (st == AKV_OK) *out = j;
    else akv_jinja_destroy(j);
    return st == AKV_ENOMEM ? st : AKV_OK;
}

akv_status akv_chat_render_json(const akv_chat *c, const char *messages_json,
                                const char *tools_json, bool add_generation_prompt,
                                akv_tok_text *out, akv_tok_spans *contents, char *why,
                                size_t why_cap) {
    AKV_ASSERT(c && messages_json && out);
    if (c->kind != AKV_CHAT_JINJA) {
        AKV_LOG_E("chat template: the %s family renders plain {role, content} messages; tools "
                  "and tool calls need the model's own template",
                  akv_chat_kind_name(c->kind));
        return AKV_EUNSUPPORTED;
    }
    akv_tok_text ctx = {0};
    akv_jinja_error err = {0};
    akv_status st = chat_context(c, messages_json, tools_json, add_generation_prompt, &ctx);
    if (!st) st = chat_jinja_render(c->jinja, ctx.bytes, ctx.n_bytes, out, contents, &err);
    akv_tok_text_free(&ctx);
    if (st && st != AKV_ENOMEM) {
        if (why) snprintf(why, why_cap, "line %u: %s", err.line, err.msg);
        else AKV_LOG_E("chat template: line %u: %s", err.line, err.msg);
    }
    return st == AKV_EOVERFLOW ? AKV_EINVAL : st;
}

akv_status akv_chat_create(const akv_chat_params *p, akv_chat **out) {
    AKV_ASSERT(p && out);
    const char *t = p->template_text;
    size_t n = t ? (p->template_bytes ? p->template_bytes : strlen(t)) : 0;
    akv_chat_kind kind, found;
    akv_status st;
    bool recognised = t && n > 0;
    akv_jinja *jinja = NULL;
    akv_jinja_error jerr = {0};
    if (!p->name && recognised && (st = chat_jinja_try(p, t, n, &jinja, &jerr)) == AKV_ENOMEM)
        return st;
    if (jinja) {
        kind = AKV_CHAT_JINJA;
    } else if (p->name) {
        if (akv_chat_kind_from_name(p->name, &kind) != AKV_OK) {
            AKV_LOG_E("chat template: '%s' is not a template name (chatml, llama3, gemma)", p->name);
            return AKV_EINVAL;
        }
        /* Named: the template's own details (a default system) count only when the
         * template is of that family too. */
        recognised = recognised && chat_recognise(t, n, true, &found) == AKV_OK && found == kind;
    } else if (!recognised) {
        AKV_LOG_E("chat template: the model has none; name one (chatml, llama3 or gemma)");
        return AKV_EUNSUPPORTED;
    } else if (chat_recognise(t, n, true, &kind) == AKV_OK) {
        AKV_LOG_W("chat template: not run (line %u: %s); rendered as the %s family", jerr.line,
                  jerr.msg, akv_chat_kind_name(kind));
    } else {
        AKV_LOG_E("chat template: it cannot be run (line %u: %s) and is of no known family; name "
                  "one (chatml, llama3 or gemma) or give a template that runs",
                  jerr.line, jerr.msg);
        return AKV_EUNSUPPORTED;
    }
    akv_chat *c = akv__calloc(1, sizeof *c);
    if (!c) {
        akv_jinja_destroy(jinja);
        return AKV_ENOMEM;
    }
    c->kind = kind;
    c->jinja = jinja;
    if (!(c->bos_text = akv__strdup(p->bos_text ? p->bos_text : ""))) goto nomem;
    if (!(c->eos_text = akv__strdup(p->eos_text ? p->eos_text : ""))) goto nomem;
    if (kind == AKV_CHAT_CHATML && recognised) {
        size_t n_sys;
        c->default_system = chat_chatml_default_system(t, n, &n_sys);
        if (!c->default_system && n_sys) goto nomem;
    }
    *out = c;
    return AKV_OK;
nomem:
    akv_chat_destroy(c);
    return AKV_ENOMEM;
}

void akv_chat_destroy(akv_chat *chat) {
    if (!chat) return;
    akv__free(chat->default_system);
    akv__free(chat->bos_text);
    akv__free(chat->eos_text);
    akv_jinja_destroy(chat->jinja);
    akv__free(chat);
}

akv_chat_kind akv_chat_get_kind(const akv_chat *chat) {
    return chat->kind;
}

const char *akv_chat_default_system(const akv_chat *chat) {
    return chat->default_system;
}

/* Python's str.isspace() for one code point: what Jinja's trim strips. */
static bool chat_is_py_space(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
           c == 0x202F || c == 0x205F || c == 0x3000;
}

/* s[0..*n) without Python whitespace at either end; returns the new start. */
static const char *chat_trim(const char *s, size_t *n) {
    const uint8_t *b = (const uint8_t *)s;
    size_t lo = 0, hi = *n, len;
    uint32_t cp;
    while (lo < hi && akv__utf8_next(b + lo, hi - lo, &len, &cp) == AKV__UTF8_VALID &&
           chat_is_py_space(cp))
        lo += len;
    while (hi > lo) {
        size_t start = hi - 1;
        while (start > lo && hi - start < 4 && (b[start] & 0xC0) == 0x80)
            start--;
        if (akv__utf8_next(b + start, hi - start, &len, &cp) != AKV__UTF8_VALID ||
            start + len != hi || !chat_is_py_space(cp))
            break;
        hi = start;
    }
    *n = hi - lo;
    return s + lo;
}

static akv_status chat_put(akv_tok_text *out, const char *s, size_t n) {
    return akv_tok_text_append(out, s, n);
}
#define CHAT_PUT(out, lit) chat_put(out, lit, sizeof lit - 1)

/* A message's content: appended, and its stretch recorded in *contents (when asked). */
static akv_status chat_put_content(akv_tok_text *out, const char *s, size_t n,
                                   akv_tok_spans *contents) {
    const size_t at = out->n_bytes;
    akv_status st = chat_put(out, s, n);
    if (!st && contents && n) st = akv_tok_spans_push(contents, at, n);
    return st;
}

static akv_status chat_render_msg(const akv_chat *c, const char *role, const char *content,
                                  bool first, akv_tok_text *out, akv_tok_spans *contents) {
    akv_status st;
    size_t n = strlen(content);
    if (c->kind == AKV_CHAT_CHATML) {
        if ((st = CHAT_PUT(out, "<|im_start|>")) || (st = chat_put(out, role, strlen(role))) ||
            (st = CHAT_PUT(out, "\n")) || (st = chat_put_content(out, content, n, contents)) ||
            (st = CHAT_PUT(out, "<|im_end|>\n")))
            return st;
        return AKV_OK;
    }
    const char *body = chat_trim(content, &n);
    if ((first && (st = chat_put(out, c->bos_text, strlen(c->bos_text)))) ||
        (st = CHAT_PUT(out, "<|start_header_id|>")) || (st = chat_put(out, role, strlen(role))) ||
        (st = CHAT_PUT(out, "<|end_header_id|>\n\n")) ||
        (st = chat_put_content(out, body, n, contents)) || (st = CHAT_PUT(out, "<|eot_id|>")))
        return st;
    return AKV_OK;
}

/* CHATML and LLAMA3 (akv/chat.h): a turn per message, the template's default system first. */
static akv_status chat_render_turns(const akv_chat *c, const akv_chat_msg *msgs, size_t n_msgs,
                                    bool add_generation_prompt, akv_tok_text *out,
                                    akv_tok_spans *contents) {
    akv_status st = AKV_OK;
    for (size_t i = 0; !st && i < n_msgs; i++) {
        /* the template's own system text is the template's, not a message's */
        if (i == 0 && c->default_system && strcmp(msgs[0].role, "system") != 0)
            st = chat_render_msg(c, "system", c->default_system, true, out, NULL);
        if (!st) st = chat_render_msg(c, msgs[i].role, msgs[i].content, i == 0, out, contents);
    }
    if (!st && add_generation_prompt)
        st = c->kind == AKV_CHAT_CHATML
                 ? CHAT_PUT(out, "<|im_start|>assistant\n")
                 : CHAT_PUT(out, "<|start_header_id|>assistant<|end_header_id|>\n\n");
    return st;
}

/* GEMMA (akv/chat.h): system contents held for the next user turn, roles model/user. */
static akv_status chat_render_gemma(const akv_chat *c, const akv_chat_msg *msgs, size_t n_msgs,
                                    bool add_generation_prompt, akv_tok_text *out,
                                    akv_tok_spans *contents) {
    akv_status st = chat_put(out, c->bos_text, strlen(c->bos_text));
    size_t held = SIZE_MAX; /* the first system message not yet written */
    for (size_t i = 0; !st && i < n_msgs; i++) {
        if (!strcmp(msgs[i].role, "system")) {
            if (held == SIZE_MAX) held = i;
            continue;
        }
        const bool model = !strcmp(msgs[i].role, "assistant");
        const char *role = model ? "model" : msgs[i].role;
        if ((st = CHAT_PUT(out, "<start_of_turn>")) || (st = chat_put(out, role, strlen(role))) ||
            (st = CHAT_PUT(out, "\n")))
            break;
        if (!model && held != SIZE_MAX) { /* every held system text, joined, before this content */
            for (size_t k = held; !st && k < i; k++) {
                if (strcmp(msgs[k].role, "system")) continue;
                size_t m = strlen(msgs[k].content);
                const char *b = chat_trim(msgs[k].content, &m);
                st = chat_put_content(out, b, m, contents);
            }
            if (!st) st = CHAT_PUT(out, "\n\n");
            held = SIZE_MAX;
        }
        size_t n = strlen(msgs[i].content);
        const char *body = chat_trim(msgs[i].content, &n);
        if (!st) st = chat_put_content(out, body, n, contents);
        if (!st) st = CHAT_PUT(out, "<end_of_turn>\n");
    }
    if (!st && add_generation_prompt) st = CHAT_PUT(out, "<start_of_turn>model\n");
    return st;
}

akv_status akv_chat_render(const akv_chat *c, const akv_chat_msg *msgs, size_t n_msgs,
                           bool add_generation_prompt, akv_tok_text *out,
                           akv_tok_spans *contents) {
    AKV_ASSERT(c && out && (msgs || n_msgs == 0));
    for (size_t i = 0; i < n_msgs; i++) {
        if (!msgs[i].role || !msgs[i].content) {
            AKV_LOG_E("chat template: message %zu has no %s", i, msgs[i].role ? "content" : "role");
            return AKV_EINVAL;
        }
    }
    if (c->kind == AKV_CHAT_JINJA) { /* the messages as JSON, then the template */
        akv_tok_text js = {0};
        akv_status st = CHAT_PUT(&js, "[");
        for (size_t i = 0; !st && i < n_msgs; i++) {
            if (i) st = CHAT_PUT(&js, ", ");
            if (!st) st = CHAT_PUT(&js, "{\"role\": ");
            if (!st) st = chat_json_str(&js, msgs[i].role, strlen(msgs[i].role));
            if (!st) st = CHAT_PUT(&js, ", \"content\": ");
            if (!st) st = chat_json_str(&js, msgs[i].content, strlen(msgs[i].content));
            if (!st) st = CHAT_PUT(&js, "}");
        }
        if (!st) st = CHAT_PUT(&js, "]");
        if (!st) st = akv_chat_render_json(c, js.bytes, NULL, add_generation_prompt, out, contents, NULL, 0);
        akv_tok_text_free(&js);
        return st;
    }
    const size_t n0 = out->n_bytes, k0 = contents ? contents->n : 0;
    akv_status st = akv_tok_text_append(out, NULL, 0);
    if (!st)
        st = c->kind == AKV_CHAT_GEMMA
                 ? chat_render_gemma(c, msgs, n_msgs, add_generation_prompt, out, contents)
                 : chat_render_turns(c, msgs, n_msgs, add_generation_prompt, out, contents);
    if (st) {
        out->n_bytes = n0;
        if (out->bytes) out->bytes[n0] = '\0';
        if (contents) contents->n = k0;
    }
    return st;
}

/* The text of the token a GGUF key names (left empty when the key is absent). AKV_EFORMAT
 * (logged) for an id outside the vocabulary. */
static akv_status chat_token_text(const akv_gguf *g, const char *key, akv_gguf_str *text) {
    uint32_t id;
    akv_gguf_arr tokens;
    akv_status st = akv_gguf_get_u32(g, key, &id);
    if (st == AKV_ENOTFOUND) return AKV_OK;
    if (st) return st;
    if ((st = akv_gguf_get_arr(g, "tokenizer.ggml.tokens", &tokens))) return st;
    if (tokens.type != AKV_GGUF_VTYPE_STRING || id >= tokens.n) {
        AKV_LOG_E("chat template: %s %u is not a token of tokenizer.ggml.tokens", key, id);
        return AKV_EFORMAT;
    }
    *text = akv_gguf_arr_str(g, &tokens, id);
    return AKV_OK;
}

akv_status akv_chat_create_from_gguf(const akv_gguf *g, const char *name, akv_chat **out) {
    AKV_ASSERT(g && out);
    akv_chat_params p = {.name = name};
    akv_gguf_str tmpl = {0}, bos = {0}, arch = {0};
    akv_status st = akv_gguf_get_str(g, "tokenizer.chat_template", &tmpl);
    if (st && st != AKV_ENOTFOUND) return st;
    if (st == AKV_ENOTFOUND && !name && akv_gguf_get_str(g, "general.architecture", &arch) == AKV_OK &&
        arch.len == 6 && !memcmp(arch.ptr, "gemma3", 6)) { /* Gemma 3 270M's file has none */
        AKV_LOG_I("chat template: the gemma3 file has none; rendering the gemma family");
        p.name = "gemma";
    }
    if (st == AKV_OK) {
        if (tmpl.len == 0 || memchr(tmpl.ptr, '\0', tmpl.len)) {
            if (!name) { /* with a name the template is not needed */
                AKV_LOG_E("chat template: tokenizer.chat_template is %s; name a template",
                          tmpl.len ? "not text (it holds a NUL byte)" : "empty");
                return AKV_EFORMAT;
            }
        } else {
            p.template_text = tmpl.ptr;
            p.template_bytes = tmpl.len;
        }
    }
    akv_gguf_str eos = {0};
    if ((st = chat_token_text(g, "tokenizer.ggml.bos_token_id", &bos)) ||
        (st = chat_token_text(g, "tokenizer.ggml.eos_token_id", &eos)))
        return st;
    char *bos_text = akv__strndup(bos.ptr ? bos.ptr : "", bos.len);
    char *eos_text = akv__strndup(eos.ptr ? eos.ptr : "", eos.len);
    st = bos_text && eos_text ? AKV_OK : AKV_ENOMEM;
    p.bos_text = bos_text, p.eos_text = eos_text;
    if (!st) st = akv_chat_create(&p, out);
    akv__free(bos_text), akv__free(eos_text);
    return st;
}
