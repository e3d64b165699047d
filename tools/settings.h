/*
 * tools/settings.h — every setting the akv commands name, in one table: its params field (the
 * id the library's messages carry, {=host_gib}: akv/log.h), its command-line flag, its HTTP
 * request field, its range and its default, and its help.
 *
 * The engine's settings shared by `akv run` and `akv serve` are read here too: their getopt
 * entries, their parsing and range checks and their help lines all come from the table, so a
 * flag, its range, its default as printed and its name in messages cannot drift apart. A row
 * with no getopt id is named only (a command reads it itself: serve's --max-queue, fit's
 * --staging-pages, ...), or another field said as the same flag (max_history: --max-context).
 *
 * Front ends name a setting by its field: akv_tool_flag_namer (the command line: --host-gib)
 * and akv_tool_http_namer (a server's answer: the request's field where a request sets it,
 * max_tokens; else the operator's flag, --parallel).
 */
#ifndef AKV_TOOLS_SETTINGS_H
#define AKV_TOOLS_SETTINGS_H

#include <getopt.h>
#include <stddef.h>
#include <stdio.h>

#include "akv/engine.h"

#define AKV_TOOL_DEFAULT_MODEL "models/SmolLM2-135M-Instruct.Q4_1.gguf"

/* The values the table reads (the engine options of akv run and akv serve, tools/engine_opts.h). */
typedef struct akv_tool_eopts {
    const char *model;      /* -m */
    const char *device;     /* --device: auto, cpu, cuda, cuda:N */
    const char *tmpl;       /* --chat-template: a family name or a file of Jinja source */
    int no_graphs;
    int host_sampling;
    int special_in_content; /* --special-in-content: control texts in chat contents parsed */
    unsigned long long ctx; /* --max-context; 0 = the command's default */
    unsigned long long host_gib, device_gib, chunk, threads, parallel, window_pages;
    unsigned long long step_tokens, prefill_beside;
    akv_route_kind route;
    float host_share;       /* --host-share: the host-attended route's; 0 = planned */
    akv_dtype kv_dtype;
    akv_weights weights;    /* --weights */
    akv_repr kv_tier;       /* --kv-tier (AKV_ENGINE_TIER_AUTO: auto) */
    unsigned long long exact_recent; /* --exact-recent; 0 = the route's default */
    const char *calibration; /* --calibration: the gate's rates (akv calibrate) */
    const char *session_dir; /* --session-dir: idle conversations kept on disk */
    unsigned long long session_dir_gib; /* --session-dir-gib; 0 = no limit */
    const char *trace_path;  /* --trace: the Chrome trace file */
    const char *trace_level; /* --trace-level: off, counters, spans */
    akv_gate_rates gate_rates; /* read from it by akv_tool_eopts_check */
    akv_sample_params sp;   /* the default sampling (a request may override it) */
} akv_tool_eopts;

/* Option ids (getopt_long's val), above every short option and command-specific id. */
enum {
    AKV_OPT_CTX = 1024, AKV_OPT_DEVICE, AKV_OPT_ROUTE, AKV_OPT_WINDOW, AKV_OPT_HOST,
    AKV_OPT_DEVGIB, AKV_OPT_KV, AKV_OPT_CHUNK, AKV_OPT_STEP, AKV_OPT_THREADS, AKV_OPT_NOGRAPHS, AKV_OPT_HOST_SAMPLING,
    AKV_OPT_PARALLEL, AKV_OPT_TMPL, AKV_OPT_TEMP, AKV_OPT_TOPK, AKV_OPT_TOPP, AKV_OPT_MINP,
    AKV_OPT_RP, AKV_OPT_RLN, AKV_OPT_SEED, AKV_OPT_PRES, AKV_OPT_FREQ, AKV_OPT_WEIGHTS,
    AKV_OPT_SPECIAL_CONTENT, AKV_OPT_TIER, AKV_OPT_RECENT, AKV_OPT_CALIBRATION, AKV_OPT_BESIDE,
    AKV_OPT_SESSION_DIR, AKV_OPT_SESSION_GIB, AKV_OPT_TRACE, AKV_OPT_TRACE_LEVEL,
    AKV_OPT_HOST_SHARE,
};


/* How a setting's value is read. */
typedef enum akv_tool_value {
    AKV_TV_NONE = 0, /* named only: its command reads it */
    AKV_TV_TEXT,     /* const char * */
    AKV_TV_SWITCH,   /* int, set to 1, no argument */
    AKV_TV_U64,      /* unsigned long long in [lo, hi]; K/M/G suffixes */
    AKV_TV_I32,      /* int32_t in [lo, hi] */
    AKV_TV_F32,      /* float in [lo, hi] */
    AKV_TV_DTYPE,    /* akv_dtype: bf16, f16, f32 */
    AKV_TV_WEIGHTS,  /* akv_weights: native, bf16, f32 */
    AKV_TV_ROUTE,    /* akv_route_kind, by the route's names */
    AKV_TV_REPR,     /* akv_repr, by its names (exact, q8, q4) */
} akv_tool_value;

typedef struct akv_tool_setting {
    const char *field;   /* the params field messages name it by; NULL: none */
    const char *flag;    /* as typed and said: "--host-gib" */
    const char *http;    /* the request field that sets it per request, or NULL */
    int id;              /* getopt id (short letter or AKV_OPT_*); 0: named only */
    const char *arg;     /* the value's name in help ("G"); NULL: a switch */
    akv_tool_value type;
    size_t offset;       /* of its value in akv_tool_eopts */
    double lo, hi;       /* numbers: the range */
    const char *deflt;   /* the default as help says it; NULL: the defaults' own value */
    const char *help;    /* NULL: the command's usage says it (the default is the command's) */
} akv_tool_setting;

/* The table, ended by a row whose flag is NULL. */
extern const akv_tool_setting akv_tool_settings[];

/* The first row naming params field `field`, or NULL. */
const akv_tool_setting *akv_tool_setting_of_field(const char *field);

/* The row read through getopt id `id`, or NULL. */
const akv_tool_setting *akv_tool_setting_of_id(int id);

/* akv_log_namer (akv/log.h) of the command line: the flag of `field` ("--host-gib"), or NULL
 * (the field itself) for a field no row names. user is unused. */
const char *akv_tool_flag_namer(const char *field, void *user);

/* akv_log_namer of a server's answers: the request's field where a request sets the setting
 * ("max_tokens"), else its flag (the operator's: "--parallel"). */
const char *akv_tool_http_namer(const char *field, void *user);

/* Reads arg into the value of row s inside base: 1 when it is good, else
 * 0, printed as "akv <cmd>: --flag ...", naming the range or the names allowed. */
int akv_tool_setting_parse(const char *cmd, const akv_tool_setting *s, const char *arg,
                           akv_tool_eopts *base);

/* The getopt_long entries of every row with an id, then own's entries (ended by a zero
 * entry), then the zero entry, into out[cap]. The count written, zero entry excluded; -1
 * when cap is too small. */
int akv_tool_options(const struct option *own, struct option *out, size_t cap);

/* The help lines of every row with an id and a help text, in table order: "      --flag ARG"
 * then the text, wrapped at 92 columns, with " (default X)" from deflt or from the value at
 * the row's offset in defaults. */
void akv_tool_settings_help(FILE *f, const akv_tool_eopts *defaults);

/* text with every {=field} marker (akv/log.h) said as the command-line flag the settings
 * table names for it (tools/settings.h), into buf (NUL-terminated, truncated to cap). Words
 * outside markers are never touched. */
void akv_tool_render(const char *text, char *buf, size_t cap);

/* Library messages at `threshold` and above to stderr ("akv error: ...", as the default
 * hook), their settings said as flags. */
void akv_tool_log_flags(int threshold);

#endif
