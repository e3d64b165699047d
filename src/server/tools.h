/*
 * server/tools.h — tool calls in a model's answer: found in the text in the forms the chat
 * templates in the wild ask their models to write, and given back as OpenAI's tool_calls.
 *
 * Forms (tried in this order; the first that holds a call wins):
 *   <tool_call>{"name": N, "arguments": {...}}</tool_call>   Hermes, Qwen 2.5 / 3 (several;
 *                                                            the last may lack its close)
 *   <function=N>{...}</function>                             Functionary, Llama 3.1 custom
 *   [TOOL_CALLS] [{"name": N, "arguments": {...}}, ...]      Mistral (the marker optional)
 *   <|python_tag|>{"name": N, "parameters": {...}}           Llama 3.x JSON tool calling (the
 *                                                            tag optional; the whole answer)
 * A call names one of the tools offered; anything else is text. What is left of the answer
 * besides the calls (trimmed) is its content (NULL when nothing is).
 */
#ifndef AKV_SERVER_TOOLS_H
#define AKV_SERVER_TOOLS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "akv/status.h"
#include "server/api.h"

typedef struct akv_srv_tool_calls {
    akv_api_tool_call *v; /* [n]: id (9 letters and digits, from the tag and i: Mistral's
                             templates take no other), name, arguments (JSON text), owned */
    size_t n;
    char *content;        /* the answer's text besides the calls, trimmed; NULL: none */
} akv_srv_tool_calls;

/* Finds the calls in text[0..n) to the tools of tools_json (a JSON array as the request
 * gave it). *out->n = 0 when there are none. AKV_ENOMEM. */
akv_status akv_srv_tool_calls_find(const char *text, size_t n, const char *tools_json,
                                   unsigned long long tag, akv_srv_tool_calls *out);

void akv_srv_tool_calls_free(akv_srv_tool_calls *c);

/* A call as far as it has come in a held answer (akv_srv_tool_calls_partial): its name once
 * whole, and its arguments' JSON text so far, as the model writes it. */
typedef struct akv_srv_call_part {
    const char *name;   /* into the held text, name_n bytes (no escapes: a tool's name) */
    size_t name_n;
    bool named;         /* the name is whole */
    size_t args_at, args_n; /* the arguments' bytes so far: held[args_at, args_at + args_n) */
    bool has_args;      /* its arguments have begun */
    bool args_whole;    /* ... and ended */
} akv_srv_call_part;

/* Where a scan of a held answer's calls stands: zeroed before the first scan of an answer;
 * each scan reads on from where the last one left, the first call that was not whole. */
enum { SCAN_UNKNOWN = 0, SCAN_BLOCKS, SCAN_LIST, SCAN_ONE };
typedef struct akv_srv_calls_scan {
    size_t at;     /* the held text's offset the next scan reads from */
    size_t first;  /* calls whole so far (out[0, first) are final: not read again) */
    uint8_t form;  /* SCAN_*: <tool_call> blocks, a list ([TOOL_CALLS] [...] or [...]), one call */
    bool open;     /* the last scan left call `first` open (out[first] as far as it came) */
} akv_srv_calls_scan;

/* The calls of a held answer (held[0, n), which only grows between scans) in the forms a
 * held call takes (the Hermes / Qwen form after <tool_call>, Mistral's list after
 * [TOOL_CALLS], a bare call object or list), as far as they have come: calls from sc->first
 * on into out (up to cap in all); returns how many there are, the open one included. A
 * call's name whose bytes hold an escape is never named (a tool's name has none). */
size_t akv_srv_tool_calls_partial(const char *held, size_t n, akv_srv_calls_scan *sc,
                                  akv_srv_call_part *out, size_t cap);

/* The id of call i of the request tagged tag (what akv_srv_tool_calls_find gives it). */
void akv_srv_tool_call_id(unsigned long long tag, size_t i, char out[16]);

/* A streamed answer when tools are offered: its text goes out as it comes, but for what may
 * be a call. From the first byte of a call's opener on (<tool_call>, <function= anywhere;
 * [TOOL_CALLS], <|python_tag|>, a '{' or '[' only where they begin the answer, as the forms
 * are read) the rest is held,
 * as are the last bytes that may begin an opener and trailing white space (a call's content is
 * trimmed). At the end the held text is searched for calls (akv_srv_tool_calls_find); what is
 * not a call in it is the rest of the content. A held stretch that proves to be text is sent
 * as soon as it does. Concatenating what feed and the end give equals the answer's text when
 * it holds no call. */
typedef struct akv_srv_tool_stream {
    char *held;   /* text not sent yet */
    size_t n_held, cap;
    char *out;    /* what the last feed handed out */
    size_t out_cap;
    bool call;    /* an opener was seen: everything from it is held to the end */
    bool started; /* a byte other than white space has come */
    bool sent_any; /* some text went out */
} akv_srv_tool_stream;

/* Appends a piece; *n_out bytes of it (with what was held before) may go out now as content,
 * at *out (valid until the next call). AKV_ENOMEM. */
akv_status akv_srv_tool_stream_feed(akv_srv_tool_stream *ts, const char *piece, size_t n,
                                    const char **out, size_t *n_out);

/* The held text at the end (the call or calls, or text that never proved itself), n bytes. */
const char *akv_srv_tool_stream_held(const akv_srv_tool_stream *ts, size_t *n);

void akv_srv_tool_stream_free(akv_srv_tool_stream *ts);

#endif
