#!/bin/sh
# seeds.sh TARGET DIR GGUF_SEEDS — writes a fuzz target's starting corpus into DIR: for gguf,
# the images gguf_fuzz_seeds generates (GGUF_SEEDS, its executable); for tok, a few texts
# (byte 0 picks the tokenizer and flags); for api, request bodies (byte 0 picks the endpoint,
# bit 0 set = /v1/completions, and the limits); for http, request heads and chunked bodies (byte
# 0 picks the head limit and the piece size); for schema, a schema, NUL, bytes to feed. Used by
# replay.sh and scripts/fuzz.
target=$1 dir=$2 seeds=$3
mkdir -p "$dir" || exit 1
case "$target" in
gguf) "$seeds" "$dir" || { echo "seeds.sh: gguf_fuzz_seeds failed"; exit 1; } ;;
tok) printf '\000hello world' >"$dir/a"; printf '\001<|im_start|>user\nhi<|im_end|>' >"$dir/b"
     printf '\002 123 4567 89\t\r\n' >"$dir/c"; printf '\003\377\376 \303\251t\303\251' >"$dir/d" ;;
api) printf '\006{"messages":[{"role":"user","content":"hi"}],"max_tokens":8}' >"$dir/chat"
     printf '\006{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},{"role":"assistant","content":null},{"role":"developer","content":"x"}],"stream":true,"stream_options":{"include_usage":true},"temperature":0.7,"top_p":0.9,"top_k":40,"min_p":0.05,"seed":42,"stop":["\\n","END"],"presence_penalty":0.5,"frequency_penalty":-0.5,"max_completion_tokens":100,"n":1,"user":"u"}' >"$dir/chat_full"
     printf '\007{"prompt":"Once upon a time","max_tokens":16,"stop":"."}' >"$dir/cmpl"
     printf '\007{"prompt":[1,2,3,4000],"ignore_eos":true,"repeat_penalty":1.1}' >"$dir/cmpl_ids"
     printf '\007{"prompt":[[5,6]],"logprobs":null,"echo":false,"best_of":1}' >"$dir/cmpl_ids2"
     printf '\007{"prompt":["caf\\u00e9 \\ud83d\\ude00"],"tool_choice":"none","top_logprobs":0}' >"$dir/cmpl_str"
     printf '\000{"messages":[{"role":"user","content":"x"}],"response_format":{"type":"text"}}' >"$dir/chat_lim"
     printf '\006{"messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":3,"kv_tier":"exact","response_format":{"type":"json_schema","json_schema":{"name":"n","schema":{"$defs":{"T":{"type":"object","properties":{"v":{"type":["integer","null"]},"k":{"type":"array","items":{"$ref":"#/$defs/T"},"maxItems":2}},"required":["v"]}},"anyOf":[{"$ref":"#/$defs/T"},{"type":"null"}]}}}}' >"$dir/chat_schema"
     printf '\007{"prompt":"x","logprobs":2,"echo":true,"response_format":{"type":"json_object"}}' >"$dir/cmpl_echo"
     printf '\006{"messages":[{"role":"user","content":"w?"},{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\\"a\\":1}"}}]},{"role":"tool","tool_call_id":"c1","content":"ok"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]}}}],"tool_choice":{"type":"function","function":{"name":"f"}},"parallel_tool_calls":false,"n":3}' >"$dir/chat_tools" ;;
http) printf '\002POST /v1/completions HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\nAuthorization: Bearer k\r\n\r\n{}' >"$dir/post"
      printf '\004GET /health?x=1 HTTP/1.0\nConnection: keep-alive\n\n' >"$dir/get10"
      printf '\006POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nExpect: 100-continue\r\n\r\n' >"$dir/te"
      printf '\010POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n' >"$dir/dup_cl"
      printf '\012GET http://h/p HTTP/1.1\r\nHost: a\r\nX: y\r\n z\r\n\r\n' >"$dir/fold"
      printf '\0145;e=1\r\nhello\r\n6\r\n world\r\n0\r\nT: v\r\n\r\n' >"$dir/chunked"
      printf '\0163\nabc\n0\n\n' >"$dir/chunked_lf" ;;
jinja) here=$(dirname "$0")
       for f in "$here"/../data/chat_templates/*.jinja; do cp "$f" "$dir/$(basename "$f" .jinja)"; done
       printf '{%% for x in range(3) %%}{{ loop.index ~ x }}{%% endfor %%}\000{}' >"$dir/loop"
       printf '{{ messages[0].content[1:] | trim ~ (tools | tojson(indent=2)) }}' >"$dir/marks"
       printf '{%% macro m(a, b=2) %%}{{ a + b }}{%% endmacro %%}{{ m(1) }}{{ m(b=3, a=1) }}\000{"x": [1, 2.5, null, true, "s"]}' >"$dir/macro" ;;
schema) printf '{"type":"object","properties":{"n":{"type":"integer","minimum":-5,"exclusiveMaximum":120},"x":{"type":"number","minimum":0,"maximum":1},"s":{"type":"string","minLength":2,"maxLength":3}},"required":["n"]}\000{"n": 119, "x": 0.25, "s": "ab"}' >"$dir/bounds"
        printf '{"$defs":{"T":{"type":"object","properties":{"v":{"type":["integer","null"]},"k":{"type":"array","items":{"$ref":"#/$defs/T"},"maxItems":2}},"required":["v"]}},"anyOf":[{"$ref":"#/$defs/T"},{"type":"null"}]}\000{"v": 1, "k": [{"v": null}]}' >"$dir/recursive"
        printf '{"type":"array","minItems":1,"items":{"enum":["red",3,true,null]}}\000["red", 3,\n\n true]' >"$dir/enum"
        printf '{"anyOf":[{"type":"object","properties":{"name":{"const":"a"},"arguments":{"type":"object"}},"required":["name"]},{"type":"object","properties":{"name":{"const":"b"},"arguments":{"type":"number","exclusiveMinimum":-0.5}},"required":["name"]}]}\000{"name": "b", "arguments": -0.25}' >"$dir/union"
        printf '{"type":"string","maxLength":4}\000"\\ud83d\\ude00\303\251x"' >"$dir/chars" ;;
*) echo "seeds.sh: unknown target $target"; exit 2 ;;
esac
