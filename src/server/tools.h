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

#include <stddef.h>

#include "akv/status.h"
#include "server/api.h"

typedef struct akv_srv_tool_calls {
    akv_api_tool_call *v; /* [n]: id "call_<tag>_<i>", name, arguments (JSON text), owned */
    size_t n;
    char *content;        /* the answer's text besides the calls, trimmed; NULL: none */
} akv_srv_tool_calls;

/* Finds the calls in text[0..n) to the tools of tools_json (a JSON array as the request
 * gave it). *out->n = 0 when there are none. AKV_ENOMEM. */
akv_status akv_srv_tool_calls_find(const char *text, size_t n, const char *tools_json,
                                   unsigned long long tag, akv_srv_tool_calls *out);

void akv_srv_tool_calls_free(akv_srv_tool_calls *c);

#endif
