/* settings.c — the table of the akv commands' settings (tools/settings.h). */
#define _GNU_SOURCE
#include "settings.h"

#include <stdint.h>
#include <string.h>

#include "akv/dev_pool.h"
#include "akv/host_pool.h"
#include "akv/route.h"
#include "akv/log.h"
#include "cmd.h"

#define AT(m) offsetof(akv_tool_eopts, m)
#define ROW(field, flag, http, id, arg, type, m, lo, hi, deflt, help)                              \
    {field, flag, http, id, arg, type, AT(m), lo, hi, deflt, help}
#define NAMED(field, flag, http) {field, flag, http, 0, NULL, AKV_TV_NONE, 0, 0, 0, NULL, NULL}

const akv_tool_setting akv_tool_settings[] = {
    /* the engine's, read here; help NULL: each command's usage says it */
    ROW(NULL, "--model", NULL, 'm', "PATH", AKV_TV_TEXT, model, 0, 0, NULL, NULL),
    ROW("max_context", "--max-context", NULL, AKV_OPT_CTX, "N", AKV_TV_U64, ctx, 2,
        (double)(1ull << 40), NULL, NULL),
    ROW("max_seqs", "--parallel", NULL, AKV_OPT_PARALLEL, "N", AKV_TV_U64, parallel, 1,
        AKV_ROUTE_MAX_SEQS, NULL, NULL),
    ROW("chat_template_name", "--chat-template", NULL, AKV_OPT_TMPL, "T", AKV_TV_TEXT, tmpl, 0, 0,
        "the model's", "a chat template family rendered in C (chatml, llama3) or a file of Jinja source to run instead of the model's own template"),
    ROW("content_specials", "--special-in-content", NULL, AKV_OPT_SPECIAL_CONTENT, NULL,
        AKV_TV_SWITCH, special_in_content, 0, 0, NULL,
        "read control-token texts inside chat message contents as control tokens "
        "(\"<|im_end|>\" typed by a user then closes its turn, as in llama-server and vLLM); "
        "without it contents are plain text, as OpenAI's API treats them"),
    ROW(NULL, "--device", NULL, AKV_OPT_DEVICE, "D", AKV_TV_TEXT, device, 0, 0, NULL,
        "where the forward pass runs: auto (the GPU when one answers, else the CPU), cpu, cuda "
        "or cuda:N"),
    ROW("route", "--route", NULL, AKV_OPT_ROUTE, "resident|staged|host", AKV_TV_ROUTE, route, 0,
        0, NULL,
        "how the history reaches the attention: resident keeps every page in the device pool; "
        "staged keeps each sequence's window there and stages the rest each step; host stages "
        "like staged, but in decode steps the host's cores attend the oldest --host-share of "
        "the pages outside the window where they lie, the bus and the cores together"),
    ROW("window_pages", "--window-pages", NULL, AKV_OPT_WINDOW, "N", AKV_TV_U64, window_pages, 2,
        UINT32_MAX, NULL, "staged, host: window pages per layer at least, the sink + the newest"),
    ROW("host_share", "--host-share", NULL, AKV_OPT_HOST_SHARE, "F", AKV_TV_F32, host_share, 0, 1,
        "planned", "--route host: the share of the pages outside the window the host's cores "
        "attend, 0..1; 0 = planned at start from the host's measured rate and the bus's "
        "(--calibration), printed with its arithmetic"),
    ROW("host_gib", "--host-gib", NULL, AKV_OPT_HOST, "G", AKV_TV_U64, host_gib, 1,
        AKV_HOST_POOL_MAX_GIB, NULL, "host pool limit, whole GiB"),
    ROW("device_gib", "--device-gib", NULL, AKV_OPT_DEVGIB, "G", AKV_TV_U64, device_gib, 1,
        AKV_DEV_POOL_MAX_GIB, NULL, "device pool size, whole GiB"),
    ROW("kv_dtype", "--kv-dtype", NULL, AKV_OPT_KV, "T", AKV_TV_DTYPE, kv_dtype, 0, 0, NULL,
        "K/V page element type: bf16, f16 or f32"),
    ROW("kv_tier", "--kv-tier", NULL, AKV_OPT_TIER, "exact|q8|q4|auto", AKV_TV_REPR, kv_tier, 0,
        0, NULL,
        "the form of each history's pages older than --exact-recent tokens: exact (every page "
        "as the pool keeps it), q8 (8.1-8.3 bits an element) or q4 (4.5 bits, K rotated); with "
        "the resident route the compact pages' GiB come out of --device-gib; with the staged "
        "route a compact copy of each older page sits beside it in --host-gib, the device keeps "
        "the newest compact pages and stages the rest; auto: the economic gate chooses the "
        "route and the tier by the step it predicts (--calibration)"),
    ROW("calibration", "--calibration", NULL, AKV_OPT_CALIBRATION, "FILE", AKV_TV_TEXT,
        calibration, 0, 0, "an H100's", "with --kv-tier auto: the machine's rates, written by akv calibrate"),
    ROW("exact_recent", "--exact-recent", NULL, AKV_OPT_RECENT, "N", AKV_TV_U64, exact_recent, 1,
        (double)(1ull << 40), "256", "with --kv-tier q8|q4: tokens before the newest kept exact"),
    ROW("weights", "--weights", NULL, AKV_OPT_WEIGHTS, "W", AKV_TV_WEIGHTS, weights, 0, 0, NULL,
        "how the weight matrices are kept: native (in the file's block formats, e.g. Q4_1, "
        "where the pass has a product for the format), f32 (CPU: widened, for comparison) or "
        "bf16 (GPU: widened)"),
    ROW("chunk", "--chunk", NULL, AKV_OPT_CHUNK, "N", AKV_TV_U64, chunk, 1, 65536, NULL,
        "prompt chunk, tokens"),
    ROW("step_tokens", "--step-tokens", NULL, AKV_OPT_STEP, "N", AKV_TV_U64, step_tokens, 0,
        1u << 20, "4096, or --parallel - 1 + --chunk if larger",
        "most tokens a step runs, decodes and chunks together (a prompt alone runs in pieces "
        "of up to this)"),
    ROW("prefill_beside", "--prefill-beside", NULL, AKV_OPT_BESIDE, "N", AKV_TV_U64,
        prefill_beside, 0, 1u << 20, "2048 on a GPU, --chunk on the CPU",
        "most prompt tokens a step runs beside running decodes, whole chunks of waiting "
        "prompts first come, first served: more starts prompts sooner, less keeps the "
        "decodes' inter-token latency lower"),
    ROW("session_dir", "--session-dir", NULL, AKV_OPT_SESSION_DIR, "DIR", AKV_TV_TEXT,
        session_dir, 0, 0, "none",
        "an existing directory where finished conversations go, one file each, when they "
        "would be dropped from the host pool (least recently used first), and come back from "
        "when a prompt continues one; the files outlive the process"),
    ROW("session_dir_gib", "--session-dir-gib", NULL, AKV_OPT_SESSION_GIB, "G", AKV_TV_U64,
        session_dir_gib, 0, 1u << 20, "0: no limit but the disk",
        "with --session-dir: its files at most, whole GiB (the oldest removed first)"),
    ROW(NULL, "--trace", NULL, AKV_OPT_TRACE, "FILE", AKV_TV_TEXT, trace_path, 0, 0, "none",
        "write a Chrome trace-event file (Perfetto, chrome://tracing opens it): steps, requests, "
        "tokens and the staged copies, at --trace-level"),
    ROW(NULL, "--trace-level", NULL, AKV_OPT_TRACE_LEVEL, "L", AKV_TV_TEXT, trace_level, 0, 0,
        "spans with --trace, else off",
        "off, counters (the end report's figures each step) or spans (and every step, request "
        "and token); serve keeps the last events for GET /trace"),
    ROW(NULL, "--no-graphs", NULL, AKV_OPT_NOGRAPHS, NULL, AKV_TV_SWITCH, no_graphs, 0, 0, NULL,
        "GPU: launch every kernel of a decode step by itself instead of replaying the step as "
        "one CUDA graph (resident route)"),
    ROW(NULL, "--host-sampling", NULL, AKV_OPT_HOST_SAMPLING, NULL, AKV_TV_SWITCH, host_sampling, 0,
        0, NULL,
        "GPU: draw tokens at a temperature on the CPU from each row of logits, which then "
        "crosses the bus, instead of on the GPU where only the id comes back"),
    ROW("threads", "--threads", NULL, AKV_OPT_THREADS, "N", AKV_TV_U64, threads, 0, 1024,
        "every core this process may run on, which is also the most",
        "CPU threads of the matrix products and the attention"),
    ROW("temp", "--temp", "temperature", AKV_OPT_TEMP, "T", AKV_TV_F32, sp.temp, 0, 1e6, NULL,
        "temperature; 0 = greedy"),
    ROW("top_k", "--top-k", "top_k", AKV_OPT_TOPK, "K", AKV_TV_I32, sp.top_k, 0, INT32_MAX, NULL,
        "keep the K most likely tokens; 0 = off"),
    ROW("top_p", "--top-p", "top_p", AKV_OPT_TOPP, "P", AKV_TV_F32, sp.top_p, 1e-9, 1, NULL,
        "keep the most likely tokens whose probabilities add up to P; 1 = off"),
    ROW("min_p", "--min-p", "min_p", AKV_OPT_MINP, "P", AKV_TV_F32, sp.min_p, 0, 0.999999, NULL,
        "drop the tokens less likely than P times the most likely; 0 = off"),
    ROW("repeat_penalty", "--repeat-penalty", "repeat_penalty", AKV_OPT_RP, "R", AKV_TV_F32,
        sp.repeat_penalty, 1e-6, 1e6, NULL,
        "the logits of tokens seen in the last --repeat-last-n shrink by R; 1 = off"),
    ROW("presence_penalty", "--presence-penalty", "presence_penalty", AKV_OPT_PRES, "P",
        AKV_TV_F32, sp.presence_penalty, -2, 2, NULL, "subtracted once from each token seen"),
    ROW("frequency_penalty", "--frequency-penalty", "frequency_penalty", AKV_OPT_FREQ, "F",
        AKV_TV_F32, sp.frequency_penalty, -2, 2, NULL,
        "subtracted per time a token was seen"),
    ROW("repeat_last_n", "--repeat-last-n", NULL, AKV_OPT_RLN, "N", AKV_TV_I32, sp.repeat_last_n,
        0, INT32_MAX, NULL, "tokens the penalties look back over"),
    ROW("seed", "--seed", "seed", AKV_OPT_SEED, "S", AKV_TV_U64, sp.seed, 0,
        18446744073709551615.0, NULL, NULL),
    /* named only: read by their commands, or another field said as the same flag */
    NAMED("max_tokens", "-n", "max_tokens"),
    NAMED("kv_exact", "--kv-tier exact", "kv_tier"),
    NAMED("max_history", "--max-context", NULL),
    NAMED("max_step_tokens", "--step-tokens", NULL),
    NAMED("concurrency", "--parallel", NULL),
    NAMED("limit_gib", "--host-gib", NULL),
    NAMED("chat_template_text", "--chat-template", NULL),
    NAMED("max_queue", "--max-queue", NULL),
    NAMED("max_prompt_tokens", "--max-prompt-tokens", NULL),
    NAMED("max_body_bytes", "--max-body-bytes", NULL),
    NAMED("max_connections", "--max-connections", NULL),
    NAMED("max_connections_per_client", "--max-connections-per-client", NULL),
    NAMED("read_timeout_s", "--read-timeout", NULL),
    NAMED("idle_timeout_s", "--idle-timeout", NULL),
    NAMED("staging_pages", "--staging-pages", NULL),
    NAMED("arena_bytes", "--arena-mib (in bytes)", NULL),
    {NULL, NULL, NULL, 0, NULL, AKV_TV_NONE, 0, 0, 0, NULL, NULL},
};

const akv_tool_setting *akv_tool_setting_of_field(const char *field) {
    for (const akv_tool_setting *s = akv_tool_settings; field && s->flag; s++)
        if (s->field && !strcmp(s->field, field)) return s;
    return NULL;
}

const akv_tool_setting *akv_tool_setting_of_id(int id) {
    for (const akv_tool_setting *s = akv_tool_settings; id && s->flag; s++)
        if (s->id == id) return s;
    return NULL;
}

const char *akv_tool_flag_namer(const char *field, void *user) {
    (void)user;
    const akv_tool_setting *s = akv_tool_setting_of_field(field);
    return s ? s->flag : NULL;
}

const char *akv_tool_http_namer(const char *field, void *user) {
    (void)user;
    const akv_tool_setting *s = akv_tool_setting_of_field(field);
    return !s ? NULL : s->http ? s->http : s->flag;
}

/* The flag without its dashes, as the parse helpers print it after "--". */
static const char *setting_bare(const akv_tool_setting *s) {
    return s->flag + (s->flag[1] == '-' ? 2 : 1);
}

/* One of names[] (NULL-terminated): its index, else -1 printed as "expected a, b or c". */
static int setting_choice(const char *cmd, const akv_tool_setting *s, const char *arg,
                          const char *const *names) {
    for (int i = 0; names[i]; i++)
        if (!strcmp(arg, names[i])) return i;
    fprintf(stderr, "akv %s: %s '%s': expected ", cmd, s->flag, arg);
    for (int i = 0; names[i]; i++)
        fprintf(stderr, "%s%s", i == 0 ? "" : names[i + 1] ? ", " : " or ", names[i]);
    fputc('\n', stderr);
    return -1;
}

/* A number against the row's range: 1 inside it, else 0 printed. */
static int setting_in_range(const char *cmd, const akv_tool_setting *s, double v) {
    if (v < s->lo) {
        fprintf(stderr, "akv %s: %s must be at least %.17g (got %.17g)\n", cmd, s->flag, s->lo, v);
        return 0;
    }
    if (v > s->hi) {
        fprintf(stderr, "akv %s: %s: %.17g is more than %.17g\n", cmd, s->flag, v, s->hi);
        return 0;
    }
    return 1;
}

int akv_tool_setting_parse(const char *cmd, const akv_tool_setting *s, const char *arg,
                           akv_tool_eopts *base) {
    static const char *const dtypes[] = {"bf16", "f16", "f32", NULL};
    static const akv_dtype dtype_of[] = {AKV_DTYPE_BF16, AKV_DTYPE_F16, AKV_DTYPE_F32};
    static const char *const weights[] = {"native", "bf16", "f32", NULL};
    static const akv_weights weights_of[] = {AKV_WEIGHTS_NATIVE, AKV_WEIGHTS_BF16,
                                             AKV_WEIGHTS_F32};
    void *at = (char *)base + s->offset;
    unsigned long long u;
    float f;
    int i;
    switch (s->type) {
    case AKV_TV_TEXT: *(const char **)at = arg; return 1;
    case AKV_TV_SWITCH: *(int *)at = 1; return 1;
    case AKV_TV_U64:
        if (!akv_tool_parse_u64(cmd, setting_bare(s), arg, &u) ||
            !setting_in_range(cmd, s, (double)u))
            return 0;
        *(unsigned long long *)at = u;
        return 1;
    case AKV_TV_I32:
        if (!akv_tool_parse_u64(cmd, setting_bare(s), arg, &u) ||
            !setting_in_range(cmd, s, (double)u))
            return 0;
        *(int32_t *)at = (int32_t)u;
        return 1;
    case AKV_TV_F32:
        if (!akv_tool_parse_float(cmd, setting_bare(s), arg, s->lo, s->hi, &f)) return 0;
        *(float *)at = f;
        return 1;
    case AKV_TV_DTYPE:
        if ((i = setting_choice(cmd, s, arg, dtypes)) < 0) return 0;
        *(akv_dtype *)at = dtype_of[i];
        return 1;
    case AKV_TV_WEIGHTS:
        if ((i = setting_choice(cmd, s, arg, weights)) < 0) return 0;
        *(akv_weights *)at = weights_of[i];
        return 1;
    case AKV_TV_REPR:
        if (!strcmp(arg, "auto")) {
            *(akv_repr *)at = AKV_ENGINE_TIER_AUTO;
            return 1;
        }
        if (akv_repr_from_name(arg, (akv_repr *)at) == AKV_OK) return 1;
        fprintf(stderr, "akv %s: %s '%s': expected one of %s\n", cmd, s->flag, arg, s->arg);
        return 0;
    case AKV_TV_ROUTE:
        if (akv_route_kind_from_name(arg, (akv_route_kind *)at) == AKV_OK) return 1;
        fprintf(stderr, "akv %s: %s '%s': expected one of %s\n", cmd, s->flag, arg, s->arg);
        return 0;
    case AKV_TV_NONE: break;
    }
    fprintf(stderr, "akv %s: %s is read by its command, not the settings table\n", cmd, s->flag);
    return 0;
}

int akv_tool_options(const struct option *own, struct option *out, size_t cap) {
    size_t n = 0;
    for (const akv_tool_setting *s = akv_tool_settings; s->flag; s++) {
        if (!s->id) continue;
        if (n + 1 >= cap) return -1;
        out[n++] = (struct option){setting_bare(s), s->arg ? required_argument : no_argument,
                                   NULL, s->id};
    }
    for (; own && own->name; own++) {
        if (n + 1 >= cap) return -1;
        out[n++] = *own;
    }
    out[n] = (struct option){0, 0, 0, 0};
    return (int)n;
}

/* The default of row s as help says it, from `defaults`, into buf; "" for none. */
static void setting_default(const akv_tool_setting *s, const akv_tool_eopts *defaults, char *buf,
                            size_t cap) {
    const void *at = (const char *)defaults + s->offset;
    buf[0] = '\0';
    if (s->deflt) {
        snprintf(buf, cap, "%s", s->deflt);
        return;
    }
    switch (s->type) {
    case AKV_TV_TEXT:
        if (*(const char *const *)at) snprintf(buf, cap, "%s", *(const char *const *)at);
        break;
    case AKV_TV_U64: snprintf(buf, cap, "%llu", *(const unsigned long long *)at); break;
    case AKV_TV_I32: snprintf(buf, cap, "%d", (int)*(const int32_t *)at); break;
    case AKV_TV_F32: snprintf(buf, cap, "%g", (double)*(const float *)at); break;
    case AKV_TV_DTYPE: snprintf(buf, cap, "%s", akv_dtype_name(*(const akv_dtype *)at)); break;
    case AKV_TV_WEIGHTS: snprintf(buf, cap, "%s", akv_weights_name(*(const akv_weights *)at)); break;
    case AKV_TV_ROUTE:
        snprintf(buf, cap, "%s", akv_route_kind_name(*(const akv_route_kind *)at));
        break;
    case AKV_TV_REPR:
        snprintf(buf, cap, "%s", *(const akv_repr *)at == AKV_ENGINE_TIER_AUTO ? "auto"
                                                                                : akv_repr_name(*(const akv_repr *)at));
        break;
    case AKV_TV_SWITCH:
    case AKV_TV_NONE: break;
    }
}

enum { HELP_COL = 27, HELP_WIDTH = 92 };

void akv_tool_settings_help(FILE *f, const akv_tool_eopts *defaults) {
    for (const akv_tool_setting *s = akv_tool_settings; s->flag; s++) {
        if (!s->id || !s->help) continue;
        char head[96], deflt[128], text[1024];
        int n = s->id < 128 ? snprintf(head, sizeof head, "  -%c, %s", s->id, s->flag)
                            : snprintf(head, sizeof head, "      %s", s->flag);
        if (s->arg) snprintf(head + n, sizeof head - (size_t)n, " %s", s->arg);
        setting_default(s, defaults, deflt, sizeof deflt);
        /* a described default after a colon: "(default: the model's)" */
        snprintf(text, sizeof text, !deflt[0] ? "%s" : s->deflt ? "%s (default: %s)" : "%s (default %s)",
                 s->help, deflt);
        /* the head, then the words from column HELP_COL, wrapped at HELP_WIDTH */
        int col = fprintf(f, "%s", head);
        if (col + 2 > HELP_COL) col += fprintf(f, "  ");
        else col += fprintf(f, "%*s", HELP_COL - col, "");
        const char *w = text;
        while (*w) {
            size_t len = strcspn(w, " ");
            if (col > HELP_COL && col + 1 + (int)len > HELP_WIDTH)
                col = fprintf(f, "\n%*s", HELP_COL, "") - 1;
            else if (w != text)
                col += fprintf(f, " ");
            col += fprintf(f, "%.*s", (int)len, w);
            w += len;
            while (*w == ' ') w++;
        }
        fputc('\n', f);
    }
}

/* ---- library messages said as flags --------------------------------------------------------- */

void akv_tool_render(const char *text, char *buf, size_t cap) {
    akv_log_render(text, akv_tool_flag_namer, NULL, buf, cap);
}

static void tool_log_said(akv_log_level level, const char *msg, void *user) {
    (void)user;
    char line[2048];
    akv_tool_render(msg, line, sizeof line);
    fprintf(stderr, "akv %s: %s\n", akv_log_level_str(level), line);
}

void akv_tool_log_flags(int threshold) {
    akv_log_set(tool_log_said, NULL, (akv_log_level)threshold);
}

