/*
 * akv/chat.h — chat templates: a conversation rendered as the text a model was trained on.
 *
 * A GGUF carries its chat template as Jinja source (tokenizer.chat_template). It is run as
 * Hugging Face's apply_chat_template runs it (akv/jinja.h: kind JINJA), with the messages,
 * add_generation_prompt, bos_token and eos_token (the texts of the GGUF's BOS and EOS
 * tokens), tools when given, and strftime_now (today, UTC). A template the interpreter cannot
 * compile, or that fails on a plain one-message conversation, falls back to its family when
 * it has one (logged as a warning, with the interpreter's reason), and a named family
 * (akv_chat_params.name, `--chat-template chatml|llama3|gemma`) renders in C as below.
 *
 * Families
 *   CHATML   markers <|im_start|> and <|im_end|> (SmolLM2, Qwen, ...). Each message is
 *            "<|im_start|>" role "\n" content "<|im_end|>\n"; the generation prompt is
 *            "<|im_start|>assistant\n". When the template inserts a default system message
 *            whenever the first message is not a system one (SmolLM2 does: "You are a helpful
 *            AI assistant named SmolLM, trained by Hugging Face"), that text is taken from the
 *            template and inserted the same way.
 *   LLAMA3   markers <|start_header_id|>, <|end_header_id|>, <|eot_id|> (Llama 3). Each
 *            message is "<|start_header_id|>" role "<|end_header_id|>\n\n" trim(content)
 *            "<|eot_id|>", the first one preceded by the BOS token's text; the generation prompt
 *            is "<|start_header_id|>assistant<|end_header_id|>\n\n". trim() is Jinja's (Python
 *            str.strip(): Unicode whitespace at both ends). Llama 3.1+ templates (knowledge-date
 *            system header, tool calls) render differently and are not recognised.
 *   GEMMA    markers <start_of_turn> and <end_of_turn> (Gemma 2 and 3). The BOS token's text
 *            first; system messages are not turns: their trimmed contents go, with "\n\n"
 *            after them, before the next user message's content (Gemma 3's first user
 *            prefix; llama.cpp's rendering); each other message is "<start_of_turn>" role
 *            "\n" trim(content) "<end_of_turn>\n" with the role "assistant" written "model";
 *            the generation prompt is "<start_of_turn>model\n". Also the family of a gemma3
 *            file without a template (akv_chat_create_from_gguf; Gemma 3 270M's has none).
 *
 * A template of no known family is refused (AKV_EUNSUPPORTED, logged) unless the caller names
 * the family (akv_chat_params.name, `akv tok --template`).
 *
 * The rendered text contains special-token texts: encode it with AKV_TOK_PARSE_SPECIAL and
 * without AKV_TOK_ADD_SPECIAL (the template already wrote BOS where the model wants it), as
 * Hugging Face's apply_chat_template does. Message contents are inserted verbatim; the render
 * reports where each one lies, so an encode can read them as plain text
 * (akv_tok_encode_opts.plain): a control-token text a user writes ("<|im_end|>") then stays
 * text and cannot close its turn or open one of another role. Encoding the whole rendering
 * with control texts parsed everywhere (llama-server's and vLLM's default) lets it.
 *
 * Thread-safety: an akv_chat is immutable after creation.
 */
#ifndef AKV_CHAT_H
#define AKV_CHAT_H

#include <stdbool.h>
#include <stddef.h>

#include "akv/status.h"
#include "akv/tok.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct akv_chat akv_chat;
typedef struct akv_gguf akv_gguf; /* akv/gguf.h */

typedef enum akv_chat_kind {
    AKV_CHAT_CHATML = 1,
    AKV_CHAT_LLAMA3 = 2,
    AKV_CHAT_JINJA = 3, /* the template's own source, run (akv/jinja.h) */
    AKV_CHAT_GEMMA = 4, /* <start_of_turn>role ... <end_of_turn>: Gemma's turns (below) */
} akv_chat_kind;

/* One message. Both strings NUL-terminated UTF-8, borrowed for the call. */
typedef struct akv_chat_msg {
    const char *role;    /* "system", "user", "assistant", ... (any text) */
    const char *content; /* the message text */
} akv_chat_msg;

typedef struct akv_chat_params {
    const char *template_text; /* Jinja source (tokenizer.chat_template); NULL = none */
    size_t template_bytes;     /* its length; 0 = NUL-terminated */
    const char *name;          /* "chatml", "llama3" or "gemma" to force a family; NULL = recognise */
    const char *bos_text;      /* the template's bos_token (LLAMA3 writes it); NULL = "" */
    const char *eos_text;      /* its eos_token (JINJA); NULL = "" */
} akv_chat_params;

/* Compiles p->template_text (JINJA), or recognises (or takes by name) its family, and copies
 * what rendering needs. AKV_EUNSUPPORTED (logged) for a template neither run nor recognised,
 * or none, without a name; AKV_EINVAL (logged) for a name that is not a family; AKV_ENOMEM. */
akv_status akv_chat_create(const akv_chat_params *p, akv_chat **out);

/* The same from a GGUF: tokenizer.chat_template, and bos_token = the text of
 * tokenizer.ggml.bos_token_id. `name` as in akv_chat_params (NULL = recognise). AKV_EFORMAT
 * (logged) for a mistyped key or a bos id outside the vocabulary. */
akv_status akv_chat_create_from_gguf(const akv_gguf *gguf, const char *name, akv_chat **out);

/* NULL is a no-op. */
void akv_chat_destroy(akv_chat *chat);

akv_chat_kind akv_chat_get_kind(const akv_chat *chat);

/* The default system message the template inserts, or NULL when it has none. Borrowed until
 * akv_chat_destroy. */
const char *akv_chat_default_system(const akv_chat *chat);

/* "chatml", "llama3", "gemma", "jinja"; "unknown" for other values. */
const char *akv_chat_kind_name(akv_chat_kind kind);

/* AKV_OK and *out for "chatml" / "llama3" / "gemma"; AKV_EINVAL (not logged) otherwise. */
akv_status akv_chat_kind_from_name(const char *name, akv_chat_kind *out);

/* Appends the rendering of msgs[0..n_msgs) to *out, then the generation prompt when
 * add_generation_prompt. When contents is not NULL, the stretch of out->bytes each non-empty
 * message content occupies is appended to it, in order. AKV_EINVAL (logged) for a message
 * with a NULL role or content; AKV_ENOMEM; on error *out and *contents are unchanged. */
akv_status akv_chat_render(const akv_chat *chat, const akv_chat_msg *msgs, size_t n_msgs,
                           bool add_generation_prompt, akv_tok_text *out,
                           akv_tok_spans *contents);

/* The same with the messages as JSON (an array of objects as OpenAI's API writes them: role,
 * content, tool_calls, tool_call_id, name, ...) and tools (a JSON array, NULL: none), for a
 * JINJA template; every message's "content" string is a content stretch. AKV_EUNSUPPORTED
 * (logged) for a family template (it renders plain {role, content} messages:
 * akv_chat_render); AKV_EINVAL when the template refuses the conversation (raise_exception)
 * or fails on it, its message and line in why[why_cap] (when not NULL; else logged);
 * AKV_EFORMAT for JSON that does not parse; AKV_ENOMEM. */
akv_status akv_chat_render_json(const akv_chat *chat, const char *messages_json,
                                const char *tools_json, bool add_generation_prompt,
                                akv_tok_text *out, akv_tok_spans *contents, char *why,
                                size_t why_cap);

#ifdef __cplusplus
}
#endif
#endif /* AKV_CHAT_H */
