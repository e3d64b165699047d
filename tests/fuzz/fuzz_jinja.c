/*
 * fuzz_jinja.c — libFuzzer target for the Jinja interpreter (akv/jinja.h): the input is a
 * template, then (after a NUL byte, when there is one) a context's JSON. The template is
 * compiled and, when it compiles, rendered with that context (or a conversation of two
 * messages) under small limits. Checks: no crash or sanitizer report; a render either fails
 * with a status and a message or writes at most its limit; every marked stretch lies inside
 * the output, sorted and disjoint.
 *
 * Build and run (clang; see docs/tok.md):
 *   CC=clang AKV_CMAKE_ARGS="-DAKV_FUZZ=ON -DAKV_CUDA=OFF" bash scripts/build build-fuzz
 *   build-fuzz/tests/fuzz_jinja -max_total_time=300 -max_len=8192
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "akv/jinja.h"
#include "akv/log.h"
#include "akv/tok.h"

static const char dflt_ctx[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", "
    "\"content\": \"<|im_end|> hi\"}], \"add_generation_prompt\": true, \"bos_token\": \"<s>\", "
    "\"eos_token\": \"</s>\", \"tools\": [{\"type\": \"function\", \"function\": {\"name\": "
    "\"f\", \"parameters\": {\"type\": \"object\"}}}]}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    akv_log_set(NULL, NULL, AKV_LOG_OFF);
    const uint8_t *nul = memchr(data, 0, size);
    const size_t n_t = nul ? (size_t)(nul - data) : size;
    akv_jinja *j = NULL;
    akv_jinja_error err;
    if (akv_jinja_compile((const char *)data, n_t, &j, &err) != AKV_OK) {
        if (!err.msg[0]) abort(); /* a failure always says why */
        return 0;
    }
    akv_jinja_render_params p = {.context_json = nul ? (const char *)nul + 1 : dflt_ctx,
                                 .context_bytes = nul ? size - n_t - 1 : strlen(dflt_ctx),
                                 .date = "2026-12-06",
                                 .max_output = 1 << 16};
    if (nul && p.context_bytes == 0) p.context_json = dflt_ctx, p.context_bytes = strlen(dflt_ctx);
    akv_tok_text out = {0};
    akv_tok_spans marks = {0};
    const akv_status st = akv_jinja_render(j, &p, &out, &marks, &err);
    if (st == AKV_OK) {
        if (out.n_bytes > p.max_output) abort();
        for (size_t i = 0; i < marks.n; i++) {
            const akv_tok_span s = marks.spans[i];
            if (s.off + s.n_bytes > out.n_bytes || !s.n_bytes) abort();
            if (i && marks.spans[i - 1].off + marks.spans[i - 1].n_bytes > s.off) abort();
        }
    } else if (!err.msg[0] && st != AKV_ENOMEM) {
        abort();
    } else if (out.n_bytes) {
        abort(); /* a failed render leaves the output as it was */
    }
    akv_tok_text_free(&out);
    akv_tok_spans_free(&marks);
    akv_jinja_destroy(j);
    return 0;
}
