/*
 * tools/engine_opts.h — the command-line options that configure an engine (akv/engine.h) and
 * its default sampling, shared by `akv run` and `akv serve`: one table of flags, one parser,
 * one set of checks, one help text, and the mapping to akv_engine_params, so the two
 * commands cannot drift apart.
 *
 * A command puts AKV_TOOL_ENGINE_OPTIONS into its getopt_long table, hands every option it
 * does not handle itself to akv_tool_eopts_parse, calls akv_tool_eopts_check after the loop,
 * and fills its engine params with akv_tool_eopts_apply.
 */
#ifndef AKV_TOOLS_ENGINE_OPTS_H
#define AKV_TOOLS_ENGINE_OPTS_H

#include <getopt.h>

#include "akv/engine.h"
#include "cmd.h"

#define AKV_TOOL_DEFAULT_MODEL "models/SmolLM2-135M-Instruct.Q4_1.gguf"

typedef struct akv_tool_eopts {
    const char *model;      /* -m */
    const char *device;     /* --device: auto, cpu, cuda, cuda:N */
    const char *tmpl;       /* --chat-template: a family name or a file of Jinja source */
    int no_graphs;
    int special_in_content; /* --special-in-content: control texts in chat contents parsed */
    unsigned long long ctx; /* --max-context; 0 = the command's default */
    unsigned long long host_gib, device_gib, chunk, threads, parallel, window_pages;
    unsigned long long step_tokens;
    akv_route_kind route;
    akv_dtype kv_dtype;
    akv_weights weights;    /* --weights */
    akv_sample_params sp;   /* the default sampling (a request may override it) */
} akv_tool_eopts;

/* Option ids (getopt_long's val), above every short option and command-specific id. */
enum {
    AKV_OPT_CTX = 1024, AKV_OPT_DEVICE, AKV_OPT_ROUTE, AKV_OPT_WINDOW, AKV_OPT_HOST,
    AKV_OPT_DEVGIB, AKV_OPT_KV, AKV_OPT_CHUNK, AKV_OPT_STEP, AKV_OPT_THREADS, AKV_OPT_NOGRAPHS,
    AKV_OPT_PARALLEL, AKV_OPT_TMPL, AKV_OPT_TEMP, AKV_OPT_TOPK, AKV_OPT_TOPP, AKV_OPT_MINP,
    AKV_OPT_RP, AKV_OPT_RLN, AKV_OPT_SEED, AKV_OPT_PRES, AKV_OPT_FREQ, AKV_OPT_WEIGHTS,
    AKV_OPT_SPECIAL_CONTENT,
};

/* The entries of a getopt_long table ('m' for -m / --model). */
#define AKV_TOOL_ENGINE_OPTIONS                                                                   \
    {"model", required_argument, 0, 'm'}, {"max-context", required_argument, 0, AKV_OPT_CTX},      \
        {"device", required_argument, 0, AKV_OPT_DEVICE},                                          \
        {"route", required_argument, 0, AKV_OPT_ROUTE},                                            \
        {"window-pages", required_argument, 0, AKV_OPT_WINDOW},                                    \
        {"host-gib", required_argument, 0, AKV_OPT_HOST},                                          \
        {"device-gib", required_argument, 0, AKV_OPT_DEVGIB},                                      \
        {"kv-dtype", required_argument, 0, AKV_OPT_KV},                                            \
        {"weights", required_argument, 0, AKV_OPT_WEIGHTS},                                        \
        {"chunk", required_argument, 0, AKV_OPT_CHUNK},                                            \
        {"step-tokens", required_argument, 0, AKV_OPT_STEP},                                       \
        {"threads", required_argument, 0, AKV_OPT_THREADS},                                        \
        {"no-graphs", no_argument, 0, AKV_OPT_NOGRAPHS},                                           \
        {"parallel", required_argument, 0, AKV_OPT_PARALLEL},                                      \
        {"chat-template", required_argument, 0, AKV_OPT_TMPL},                                     \
        {"special-in-content", no_argument, 0, AKV_OPT_SPECIAL_CONTENT},                          \
        {"temp", required_argument, 0, AKV_OPT_TEMP}, {"top-k", required_argument, 0, AKV_OPT_TOPK}, \
        {"top-p", required_argument, 0, AKV_OPT_TOPP}, {"min-p", required_argument, 0, AKV_OPT_MINP}, \
        {"repeat-penalty", required_argument, 0, AKV_OPT_RP},                                      \
        {"repeat-last-n", required_argument, 0, AKV_OPT_RLN},                                      \
        {"presence-penalty", required_argument, 0, AKV_OPT_PRES},                                  \
        {"frequency-penalty", required_argument, 0, AKV_OPT_FREQ},                                 \
        {"seed", required_argument, 0, AKV_OPT_SEED}

/* The defaults: the default model, device auto, 1 GiB pools, bf16 K/V, resident, chunk 256,
 * window 4 pages, the sampler's defaults; parallel 0 and ctx 0 (the command decides). */
void akv_tool_eopts_defaults(akv_tool_eopts *o);

/* Option c with argument arg: 1 when it is an engine option (taken), 0 when it is not, -1 when
 * its value is bad (printed as "akv <cmd>: --flag: ..."). */
int akv_tool_eopts_parse(const char *cmd, int c, const char *arg, akv_tool_eopts *o);

/* The checks that need every option: -1 when the options hold, else AKV_EXIT_USAGE (printed). */
int akv_tool_eopts_check(const char *cmd, const akv_tool_eopts *o);

/* Help lines for the shared options (-m, --max-context and --parallel excepted: their
 * defaults are each command's). */
extern const char akv_tool_eopts_help[];

/* The library's params field names said as these flags: entries of an akv_tool_name table
 * (a command adds its own and the {NULL, NULL} end). */
#define AKV_TOOL_ENGINE_NAMES                                                                     \
    {"max_context", "--max-context"}, {"max_history", "--max-context"},                            \
        {"host_gib", "--host-gib"}, {"limit_gib", "--host-gib"}, {"device_gib", "--device-gib"},   \
        {"max_seqs", "--parallel"}, {"concurrency", "--parallel"},                                 \
        {"window_pages", "--window-pages"}, {"chunk", "--chunk"}, {"step_tokens", "--step-tokens"},  \
        {"max_step_tokens", "--step-tokens"}, {"kv_dtype", "--kv-dtype"}, {"weights", "--weights"}, \
        {"chat_template_name", "--chat-template"}, {"chat_template_text", "--chat-template"}

/* The memory, scheduling and pass fields of ep from o (device, model, max_context, max_seqs,
 * queue and idle limits are the command's). */
void akv_tool_eopts_apply(const akv_tool_eopts *o, akv_engine_params *ep);

/* --threads as used: 0 (every core), or at most the cores this process may run on. */
uint32_t akv_tool_eopts_threads(const akv_tool_eopts *o);

/* A float option's value in [lo, hi] (bounds compared in double). 0 on a bad value (printed). */
int akv_tool_parse_float(const char *cmd, const char *flag, const char *s, double lo, double hi,
                         float *out);

#endif
