/*
 * server/api.h — the OpenAI-compatible request and response bodies, with no HTTP and no
 * engine: a body's bytes in, a checked request out (or an error naming the field); a
 * request's outcome in, the response JSON out. Pure functions, so the request parser is
 * fuzzed on its own (tests/fuzz/fuzz_api.c).
 *
 *   POST /v1/chat/completions  messages (rendered with the model's chat template)
 *   POST /v1/completions       prompt: a string, [string], [token ids] or [[token ids]]
 * Both take: model (ignored: one model is served), stream, stream_options.include_usage,
 * max_tokens / max_completion_tokens, temperature, top_p, top_k, min_p, seed, stop (a string
 * or up to 4), presence_penalty, frequency_penalty, repeat_penalty, ignore_eos, n (choices,
 * up to AKV_API_MAX_N), logprobs / top_logprobs, response_format (text, json_object,
 * json_schema), kv_tier, user (ignored); completions also echo; chats also tools,
 * tool_choice (auto, none, required, a named function), parallel_tool_calls, tool messages
 * and assistants' tool_calls. Refused with 400 naming the field: logit_bias, functions / function_call,
 * suffix, best_of other than 1, a message part that is not text. Unknown fields are ignored,
 * as llama-server does.
 */
#ifndef AKV_SERVER_API_H
#define AKV_SERVER_API_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "akv/chat.h"
#include "akv/engine.h"
#include "akv/kv_repr.h"
#include "akv/sample.h"
#include "akv/status.h"

enum { AKV_API_MAX_STOP = 4, AKV_API_MAX_MESSAGES = 4096 };
/* The most choices one request asks (n): each is a request of its own in the engine. */
enum { AKV_API_MAX_N = 16 };

typedef enum akv_api_kind {
    AKV_API_CHAT = 0,   /* /v1/chat/completions */
    AKV_API_COMPLETION, /* /v1/completions */
} akv_api_kind;

/* What limits a request (the server's settings). */
typedef struct akv_api_limits {
    uint32_t max_tokens_default; /* max_tokens when the request does not say */
    uint64_t max_tokens_limit;   /* the most max_tokens may ask */
    int32_t n_vocab;             /* token ids of a prompt are below it */
    akv_repr kv_tier;            /* the engine's compact tier (exact: none): what kv_tier may
                                    ask besides "exact" */
    akv_sample_params sample;    /* the sampling a request starts from */
} akv_api_limits;

/* The most alternatives a token's log-probabilities list (top_logprobs; a completion's
 * logprobs). */
enum { AKV_API_MAX_TOP_LOGPROBS = 20 };

/* A checked request. Every string is owned (akv_api_request_free). */
typedef struct akv_api_request {
    akv_api_kind kind;
    bool stream, include_usage, ignore_eos;
    uint32_t n;               /* choices, 1..AKV_API_MAX_N: each sampled on its own (a seed
                                 asked: choice i samples with seed + i) */
    uint32_t max_tokens;
    bool max_tokens_asked;    /* max_tokens or max_completion_tokens was given */
    bool seed_asked;          /* seed was given */
    bool kv_exact;            /* kv_tier "exact": its history kept exact (akv_request_params) */
    bool kv_compact;          /* kv_tier the server's tier by name: compacted however short */
    uint64_t cache_salt;      /* "cache_salt" (vLLM's): a hash of the text, 0 when absent */
    int8_t retention;         /* "kv_retention" (ours): -1 low, 0 normal, 1 high */
    bool logprobs;            /* each generated token's log-probability (chat: logprobs true;
                                 completion: logprobs a number) */
    uint32_t top_logprobs;    /* ... and the most likely alternatives', 0..AKV_API_MAX_TOP_LOGPROBS
                                 (chat: top_logprobs; completion: logprobs) */
    bool json_object;         /* response_format json_object: the answer is one JSON object
                                 (akv_request_params.format) */
    struct akv_srv_schema *schema; /* response_format json_schema: compiled (server/schema.h),
                                      owned */
    bool echo;                /* completion: the answer's text begins with the prompt, and its
                                 logprobs with the prompt tokens' (not streamed) */
    akv_sample_params sample;
    char *stop[AKV_API_MAX_STOP];
    uint32_t n_stop;
    akv_logit_bias *bias;     /* logit_bias: [n_bias] token ids and their biases */
    uint32_t n_bias;
    /* chat */
    akv_chat_msg *msgs; /* [n_msgs], role and content owned */
    size_t n_msgs;
    char *messages_json; /* the messages as the model's template reads them (role, content,
                            tool_calls with arguments as objects, tool_call_id, name) */
    char *messages_json_text; /* ... with the calls' arguments as JSON text, as HF passes
                            them (a template that joins them as strings, Functionary's, takes
                            only that); NULL: no call had object arguments */
    bool has_tool_use;   /* a tool message or an assistant's tool calls among them */
    char *tools_json;    /* tools offered (tool_choice not "none"): a JSON array; NULL: none */
    bool tool_forced;    /* tool_choice required or named: the answer is held to a call (schema) */
    struct akv_srv_schema *call_schema; /* tool_choice auto: a call's schema, which holds what
                                           follows call_after in the answer (server.c) */
    const char *call_after;  /* its opener ("<tool_call>", "[TOOL_CALLS]"); NULL with a
                                call_schema: none, a call is the answer when it begins with
                                '{' (Llama 3's JSON form) */
    bool parallel_tool_calls; /* false: one call at most (the first) */
    /* completion: text, or token ids */
    char *prompt;
    size_t prompt_len;
    int32_t *prompt_ids;
    uint32_t n_prompt_ids;
} akv_api_request;

/* Why a request is refused: the HTTP status, OpenAI's error type and the field. */
typedef struct akv_api_error {
    int status;             /* 400, ... */
    const char *type;       /* "invalid_request_error", ... */
    const char *code;       /* OpenAI's code or NULL ("context_length_exceeded", ...) */
    char param[64];         /* the field ("" when none) */
    char message[384];
} akv_api_error;

/* Parses and checks a body. AKV_OK: *out holds the request; AKV_EINVAL: *err says why (status
 * 400); AKV_ENOMEM. *out needs akv_api_request_free either way. */
/* The schema of a call to one of the tools of tools_json (a JSON array as the request gave
 * it; name: that tool only, NULL: any): {"name": N, args_key ("arguments", or Llama 3's
 * "parameters"): N's parameters}, a union told
 * apart by the name when there are several (server/schema.h; when one's parameters cannot be
 * followed, the name is held to the tools' names and the arguments to any object). AKV_EINVAL with why (the one tool's parameters schema the
 * compiler refuses), AKV_ENOMEM. list: an array of one or more calls, at most one unless
 * parallel (the request's parallel_tool_calls). */
akv_status akv_api_call_schema(const char *tools_json, const char *name, bool list, bool parallel,
                               const char *args_key, struct akv_srv_schema **out, char *why,
                               size_t cap);

akv_status akv_api_parse(akv_api_kind kind, const char *body, size_t n, const akv_api_limits *lim,
                         akv_api_request *out, akv_api_error *err);
void akv_api_request_free(akv_api_request *r);

/* Fills *err (printf-style message). */
void akv_api_error_set(akv_api_error *err, int status, const char *type, const char *code,
                       const char *param, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

/* ---- responses: JSON text (malloc'ed, NUL-terminated; NULL when out of memory) ---------- */

/* {"error": {"message", "type", "param", "code"}} */
char *akv_api_error_json(const akv_api_error *err);

/* o's JSON text as an akv__malloc string (the server's answers are the project's memory);
 * o is deleted. NULL for a NULL o or no memory. */
struct cJSON;
char *akv_api_json_text(struct cJSON *o);

typedef struct akv_api_usage {
    uint32_t prompt_tokens, completion_tokens, cached_tokens;
} akv_api_usage;

/* A token as an answer shows it: its piece (the bytes it stands for, borrowed from the
 * tokenizer; it may be a part of a UTF-8 sequence: its text then has U+FFFD, its bytes are
 * exact) and its log-probability. */
typedef struct akv_api_lp_token {
    const uint8_t *piece;
    size_t n;
    float logprob;
} akv_api_lp_token;

/* One generated token's log-probabilities: the natural log of its probability under the
 * model's next-token distribution (the softmax of the logits it was sampled from, before
 * temperature and penalties, as vLLM reports by default) and the n_top most likely tokens'
 * there, most likely first. */
typedef struct akv_api_logprob {
    akv_api_lp_token tok;
    bool none;            /* no probability (an echoed prompt's first token): null */
    bool no_text;         /* its piece is not in the answer's text (an echoed control token,
                             BOS): the text_offset after it does not move */
    uint32_t n_top;
    akv_api_lp_token top[AKV_API_MAX_TOP_LOGPROBS];
} akv_api_logprob;

/* The records an answer or a chunk carries; text_offset: the completion's text bytes before
 * the first (its text_offset list counts on from there). */
typedef struct akv_api_logprobs {
    const akv_api_logprob *items;
    size_t n;
    size_t text_offset;
} akv_api_logprobs;

/* The log-softmax of logits[n_vocab] at `token` into *lp, and the k (<= AKV_API_MAX_TOP_LOGPROBS)
 * most likely tokens into top_id / top_lp, most likely first (a tie: the lower id first). In
 * double, one pass for the sum and one for the top k. */
void akv_api_token_logprobs(const float *logits, uint32_t n_vocab, int32_t token, uint32_t k,
                            float *lp, int32_t *top_id, float *top_lp);

/* One tool call of an answer (server/tools.h finds them). */
typedef struct akv_api_tool_call {
    const char *id;
    const char *name;
    const char *arguments; /* JSON text */
} akv_api_tool_call;

/* One choice of an answer: its text (NULL with tool calls: "content": null), finish ("stop",
 * "length" or "tool_calls"), the logprobs asked (NULL: "logprobs": null) and its tool calls. */
typedef struct akv_api_choice {
    const char *text;
    size_t n_text;
    const char *finish;
    const akv_api_logprobs *lp;
    const akv_api_tool_call *calls;
    size_t n_calls;
} akv_api_choice;

/* A whole answer: chat.completion or text_completion, choices ch[n_choices] (index i each). */
char *akv_api_answer_json(akv_api_kind kind, const char *id, long long created,
                          const char *model, const akv_api_choice *ch, uint32_t n_choices,
                          const akv_api_usage *usage);

/* One streamed chunk (chat.completion.chunk or text_completion) of choice `index`: a delta of
 * text (role "assistant" on a choice's first chat chunk), or the finish (text NULL, finish
 * set), or the usage chunk (text and finish NULL, usage set: choices empty); lp as for an
 * answer, its tokens'. */
char *akv_api_chunk_json(akv_api_kind kind, const char *id, long long created, const char *model,
                         uint32_t index, bool first, const char *text, size_t n_text,
                         const char *finish, const akv_api_usage *usage,
                         const akv_api_logprobs *lp);

/* A streamed chunk of a piece of choice `index`'s tool call number `call`: its id, type and
 * name when call_id is not NULL (the call's first delta), and the next args_n bytes of its
 * arguments (delta.tool_calls[0].function.arguments: the client joins them). */
char *akv_api_tool_delta_json(const char *id, long long created, const char *model,
                              uint32_t index, uint32_t call, const char *call_id, const char *name,
                              size_t name_n, const char *args, size_t args_n);

/* GET /v1/models: one model. */
char *akv_api_models_json(const char *model, long long created, uint64_t max_context);

#endif
