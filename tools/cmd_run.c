/* cmd_run.c — `akv run`: generate text from a GGUF model through the engine (akv/engine.h):
 * one prompt, a conversation (--chat), or many prompts at once (--prompts, --parallel), each
 * streamed as it is produced, with a report per request and for the whole run. */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "akv/chat.h"
#include "akv/dev_pool.h"
#include "akv/engine.h"
#include "akv/host_pool.h"
#include "akv/log.h"
#include "akv/model.h"
#include "akv/ops.h"
#include "akv/route.h"
#include "akv/sample.h"
#include "akv/tok.h"
#include "cmd.h"
#include "engine_opts.h"
#include "akv/trace.h"
#include "core/clock.h"

enum {
    RUN_MAX_TURNS = 1024,            /* user turns a --chat conversation holds */
    RUN_MAX_PROMPTS = 65536,         /* lines of --prompts */
};

static const char run_usage[] =
    "usage: akv run [-m MODEL.gguf] (-p PROMPT | -f FILE | --prompts FILE | --chat) [options]\n"
    "\n"
    "Generates text, streaming it as it is produced. The attention history lives in the memory\n"
    "layer: host pages (the authoritative copy, --host-gib) and a device pool (--device-gib)\n"
    "that the route fills. Progress and the reports go to stderr.\n"
    "\n"
    "input (one of):\n"
    "  -p, --prompt TEXT        the prompt; with --chat, the first user message\n"
    "  -f, --file FILE          the prompt read from FILE (all of it)\n"
    "      --prompts FILE       one prompt per line of FILE, run concurrently (--parallel);\n"
    "                           each streamed to its own file (--out-dir) or, without it,\n"
    "                           printed in order when all are done\n"
    "      --chat               render messages with the model's chat template; without -p,\n"
    "                           read user messages from standard input, one per line (a\n"
    "                           conversation holds up to 1024 turns)\n"
    "options:\n"
    "  -m, --model PATH         GGUF model (default " AKV_TOOL_DEFAULT_MODEL ")\n"
    "      --system TEXT        with --chat: a system message (else the template's default)\n";
static const char run_usage2[] =
    "  -n, --n-predict N        tokens to generate per reply (default 128)\n"
    "      --max-context N      the longest history, tokens (default: the longest prompt + n,\n"
    "                           or the model's context length with --chat); a reply that\n"
    "                           reaches it stops there (finish length)\n"
    "      --parallel N         sequences run at once (default 1; with --prompts, up to 4)\n"
    "      --out-dir DIR        with --prompts: prompt i's text (the prompt and its reply) to\n"
    "                           DIR/i.txt (i from 1)\n"
    "      --session FILE       with -p or -f: the conversation's K/V kept in FILE: restored\n"
    "                           first when FILE exists (the prompt computes only what follows\n"
    "                           the tokens it shares with it), saved with the reply at the end\n"
    "                           (a damaged file or one of another model is refused, exit 1)\n";
static const char run_usage3[] =
    "      --seed S             sampler seed (default 0; with --prompts, prompt i uses S + i - 1)\n"
    "      --stop TEXT          stop where the reply contains TEXT (not printed); repeatable\n"
    "      --ignore-eos         go on past end-of-sequence, end-of-turn and control tokens\n"
    "                           (they are printed): every reply runs to N (benchmarks)\n"
    "      --dump-logits PATH   write every sampled token's logits as raw float32 (n_vocab\n"
    "                           each); with --prompts, prompt i's to PATH.i\n"
    "      --max-input-bytes N  the most bytes a prompt file or a chat line may hold (default\n"
    "                           64M)\n"
    "  -q, --quiet              no progress and no report on stderr\n"
    "  -h, --help               this text\n"
    "\n"
    "A reply stops after N tokens, at the --max-context limit, at an end-of-sequence or\n"
    "end-of-turn token, at any control token (a chat model opening a new turn; not with\n"
    "--ignore-eos), or at a --stop text.\n";

enum { RUN_MAX_STOPS = 16 };

typedef struct run_opts {
    akv_tool_eopts e; /* the engine's options and the sampling */
    const char *prompt, *file, *prompts, *out_dir, *system, *dump, *session;
    int chat, quiet, ignore_eos;
    unsigned long long n_predict, max_input;
    const char *stop[RUN_MAX_STOPS];
    uint32_t n_stop;
} run_opts;

/* One prompt of the run and its output. */
typedef struct run_job {
    akv_tok_ids ids;
    akv_request *rq;
    FILE *out;      /* where its text goes (stdout, its --out-dir file) or NULL: buffered */
    akv_tok_text buf; /* --prompts without --out-dir: its text until the end */
    FILE *dump;     /* its logits, or NULL */
    char *path;     /* its output file's path (for messages) */
    akv_tok_ids gen; /* its reply's tokens (chat: they join the conversation) */
    akv_finish finish;
    uint32_t n_vocab;
    int keep;       /* chat: the reply is also kept in buf (it joins the conversation) */
    int write_failed, dump_failed;
} run_job;

static void run_help(FILE *f) {
    akv_tool_eopts d;
    akv_tool_eopts_defaults(&d);
    fprintf(f, "%s%s", run_usage, run_usage2);
    akv_tool_eopts_help(f, &d);
    fputs(run_usage3, f);
}

/* Returns -1 to go on, else an exit code. */
static int run_parse(int argc, char **argv, run_opts *o) {
    enum { O_CHAT = 256, O_SYSTEM, O_DUMP, O_PROMPTS, O_OUTDIR, O_STOP, O_MAXIN, O_SESSION, O_NOEOS };
    static const struct option own[] = {
                                         {"prompt", required_argument, 0, 'p'},
                                         {"file", required_argument, 0, 'f'},
                                         {"prompts", required_argument, 0, O_PROMPTS},
                                         {"out-dir", required_argument, 0, O_OUTDIR},
                                         {"chat", no_argument, 0, O_CHAT},
                                         {"system", required_argument, 0, O_SYSTEM},
                                         {"n-predict", required_argument, 0, 'n'},
                                         {"stop", required_argument, 0, O_STOP},
                                         {"ignore-eos", no_argument, 0, O_NOEOS},
                                         {"dump-logits", required_argument, 0, O_DUMP},
                                         {"max-input-bytes", required_argument, 0, O_MAXIN},
                                         {"session", required_argument, 0, O_SESSION},
                                         {"quiet", no_argument, 0, 'q'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    struct option opts[96];
    if (akv_tool_options(own, opts, sizeof opts / sizeof *opts) < 0) {
        fprintf(stderr, "akv run: too many options for the getopt table\n");
        return AKV_EXIT_FAIL;
    }
    memset(o, 0, sizeof *o);
    akv_tool_eopts_defaults(&o->e);
    o->n_predict = 128, o->max_input = AKV_TOOL_INPUT_LIMIT;
    int c, r;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:p:f:n:qh", opts, NULL)) != -1) {
        if ((r = akv_tool_eopts_parse("run", c, optarg, &o->e)) < 0) return AKV_EXIT_USAGE;
        if (r) continue;
        switch (c) {
        case 'p': o->prompt = optarg; break;
        case 'f': o->file = optarg; break;
        case O_PROMPTS: o->prompts = optarg; break;
        case O_OUTDIR: o->out_dir = optarg; break;
        case O_CHAT: o->chat = 1; break;
        case O_SYSTEM: o->system = optarg; break;
        case O_DUMP: o->dump = optarg; break;
        case O_SESSION: o->session = optarg; break;
        case 'q': o->quiet = 1; break;
        case O_NOEOS: o->ignore_eos = 1; break;
        case 'n':
            if (!akv_tool_parse_u64("run", "n-predict", optarg, &o->n_predict)) return AKV_EXIT_USAGE;
            break;
        case O_MAXIN:
            if (!akv_tool_parse_u64("run", "max-input-bytes", optarg, &o->max_input))
                return AKV_EXIT_USAGE;
            break;
        case O_STOP:
            if (o->n_stop == RUN_MAX_STOPS || !*optarg) {
                fprintf(stderr, "akv run: --stop: %s\n",
                        *optarg ? "at most 16 stop texts" : "an empty stop text");
                return AKV_EXIT_USAGE;
            }
            o->stop[o->n_stop++] = optarg;
            break;
        case 'h': run_help(stdout); return AKV_EXIT_OK;
        default: run_help(stderr); return AKV_EXIT_USAGE;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "akv run: unexpected argument '%s' (the prompt goes after -p)\n",
                argv[optind]);
        return AKV_EXIT_USAGE;
    }
    int n_inputs = (o->prompt != NULL) + (o->file != NULL) + (o->prompts != NULL);
    if (n_inputs > 1 || (o->chat && (o->file || o->prompts))) {
        fprintf(stderr, "akv run: give one of -p, -f and --prompts (--chat takes -p or standard "
                        "input)\n");
        return AKV_EXIT_USAGE;
    }
    if (n_inputs == 0 && !o->chat) {
        fprintf(stderr, "akv run: give a prompt (-p TEXT, -f FILE, --prompts FILE) or --chat\n");
        return AKV_EXIT_USAGE;
    }
    if (o->session && (o->chat || o->prompts)) {
        fprintf(stderr, "akv run: --session takes one prompt (-p or -f), not %s\n",
                o->chat ? "--chat" : "--prompts");
        return AKV_EXIT_USAGE;
    }
    if ((o->system || o->e.tmpl) && !o->chat) {
        fprintf(stderr, "akv run: %s needs --chat\n", o->system ? "--system" : "--chat-template");
        return AKV_EXIT_USAGE;
    }
    if (o->out_dir && !o->prompts) {
        fprintf(stderr, "akv run: --out-dir needs --prompts\n");
        return AKV_EXIT_USAGE;
    }
    const char *bad = o->n_predict == 0 || o->n_predict > (1ull << 32) - 1
                          ? "-n/--n-predict must be 1..4294967295"
                      : o->max_input == 0 ? "--max-input-bytes must be at least 1"
                                          : NULL;
    if (bad) {
        fprintf(stderr, "akv run: %s\n", bad);
        return AKV_EXIT_USAGE;
    }
    if ((r = akv_tool_eopts_check("run", &o->e)) >= 0) return r;
    if (o->dump && akv_tool_same_file(o->dump, o->e.model)) {
        fprintf(stderr, "akv run: --dump-logits '%s' is the model file; write the logits elsewhere\n", o->dump);
        return AKV_EXIT_USAGE;
    }
    return -1;
}

/* ---- the run's state ------------------------------------------------------------------------ */

typedef struct run_state {
    run_opts o;
    akv_model *model;
    const akv_model_config *cfg;
    akv_tok *tok;
    akv_chat *chat;
    akv_engine *engine;
    akv_trace *trace;   /* --trace: after the engine is gone, finished and freed */
    akv_tok_text input; /* -f / --prompts: the file, read once before the model loads */
    run_job *jobs;
    size_t n_jobs;
    uint64_t n_ctx;
    int load_pct;
    double t_start;
    /* chat: the conversation so far */
    akv_tok_text fed;  /* its text */
    akv_tok_ids conv;  /* its tokens: every prompt token and reply token (the context holds
                          them all but the reply's last, which the next turn feeds) */
    /* totals over the run's requests (the report) */
    uint64_t n_prompt, n_cached, n_dec, n_gen;
    double t_prompt, t_dec, t_first;
} run_state;

static void run_progress(void *user, uint64_t done, uint64_t total) {
    run_state *s = user;
    int pct = (int)(100.0 * (double)done / (double)total);
    if (s->o.quiet || (pct == s->load_pct && done != total)) return;
    s->load_pct = pct;
    fprintf(stderr, "\rloading %s: %3d%%", s->o.e.model, pct);
    if (done == total) fputc('\n', stderr);
}

static void run_engine_progress(void *user, const char *what, uint64_t done, uint64_t total) {
    const run_state *s = user;
    if (s->o.quiet || done != 0) return;
    if (!strcmp(what, "uploading"))
        fprintf(stderr, "akv run: uploading the weights to the device\n");
    if (!strcmp(what, "pinning") && total >= 4) /* about 0.4 s a GiB: worth saying when long */
        fprintf(stderr, "akv run: pinning %llu GiB of host memory for the history\n",
                (unsigned long long)total);
}

static void run_job_free(run_job *j) {
    akv_tok_ids_free(&j->ids);
    akv_tok_ids_free(&j->gen);
    akv_tok_text_free(&j->buf);
    if (j->out && j->out != stdout && fclose(j->out) != 0)
        fprintf(stderr, "akv run: '%s': the output could not be completed: %s\n", j->path,
                strerror(errno));
    if (j->dump && fclose(j->dump) != 0)
        fprintf(stderr, "akv run: --dump-logits: the file could not be completed: %s\n",
                strerror(errno));
    free(j->path);
}

static void run_free(run_state *s) {
    for (size_t i = 0; i < s->n_jobs; i++) {
        if (s->engine && s->jobs[i].rq) akv_engine_release(s->engine, s->jobs[i].rq);
        run_job_free(&s->jobs[i]);
    }
    free(s->jobs);
    akv_engine_destroy(s->engine); /* frees the device too */
    akv_trace_destroy(s->trace);    /* its file's last events */
    akv_chat_destroy(s->chat);
    akv_tok_destroy(s->tok);
    akv_model_destroy(s->model);
    akv_tok_text_free(&s->fed);
    akv_tok_ids_free(&s->conv);
    akv_tok_text_free(&s->input);
}

/* Encodes text into *ids: a prompt (BOS where the model asks), or a chat rendering (control
 * tokens parsed outside the `plain` stretches: the messages' contents). */
static akv_status run_encode(run_state *s, const char *text, size_t n, bool chat,
                             const akv_tok_spans *plain, akv_tok_ids *ids) {
    const akv_tok_encode_opts eo = {.flags = chat ? AKV_TOK_PARSE_SPECIAL : AKV_TOK_ADD_SPECIAL,
                                    .plain = plain ? plain->spans : NULL,
                                    .n_plain = plain ? plain->n : 0};
    akv_status st = akv_tok_encode_with(s->tok, text, n, &eo, ids);
    if (st) fprintf(stderr, "akv run: cannot encode the prompt: %s\n", akv_status_str(st));
    return st;
}

/* Model, tokenizer, chat template. Prints what failed. */
static int run_open_model(run_state *s) {
    const run_opts *o = &s->o;
    /* f32 widens on the host; native and bf16 keep the host copy native (the engine refuses
     * a storage its pass lacks: --weights f32 on the GPU, bf16 on the CPU) */
    akv_model_load_params lp = {.progress = run_progress, .progress_user = s,
                                .weights = o->e.weights == AKV_WEIGHTS_F32 ? AKV_WEIGHTS_F32
                                                                           : AKV_WEIGHTS_NATIVE};
    akv_status st = akv_model_load(o->e.model, &lp, &s->model);
    if (st) {
        /* the hint only where the path is the default one, which scripts/fetch-model fetches */
        const bool dflt = !strcmp(o->e.model, AKV_TOOL_DEFAULT_MODEL);
        fprintf(stderr, "akv run: cannot load '%s': %s%s\n", o->e.model, akv_status_str(st),
                st == AKV_EIO && dflt ? " (bash scripts/fetch-model fetches the default model)"
                                      : "");
        return AKV_EXIT_FAIL;
    }
    s->cfg = akv_model_get_config(s->model);
    if ((st = akv_tok_create_from_gguf(akv_model_gguf(s->model), NULL, &s->tok))) {
        fprintf(stderr, "akv run: the model's tokenizer: %s\n", akv_status_str(st));
        return AKV_EXIT_FAIL;
    }
    if (!o->chat) return -1;
    struct stat sb;
    if (o->e.tmpl && stat(o->e.tmpl, &sb) == 0) { /* a file of Jinja source */
        akv_tok_text src = {0};
        if (!akv_tool_read_input("run", o->e.tmpl, 1u << 20, NULL, &src)) {
            akv_tok_text_free(&src);
            return AKV_EXIT_USAGE;
        }
        akv_chat_params cp = {.template_text = src.bytes ? src.bytes : "",
                              .template_bytes = src.n_bytes};
        st = akv_chat_create(&cp, &s->chat);
        akv_tok_text_free(&src);
    } else {
        st = akv_chat_create_from_gguf(akv_model_gguf(s->model), o->e.tmpl, &s->chat);
    }
    if (st) {
        fprintf(stderr, "akv run: %s: %s; name the family with --chat-template chatml|llama3\n",
                o->e.tmpl ? "--chat-template" : "the model's chat template", akv_status_str(st));
        return st == AKV_EINVAL ? AKV_EXIT_USAGE : AKV_EXIT_FAIL;
    }
    return -1;
}

/* The prompts of a one-shot run (-p, -f, --prompts) as jobs. */
static int run_load_prompts(run_state *s) {
    const run_opts *o = &s->o;
    akv_tok_text text = {0};
    int rc = -1;
    const char *src = o->file || o->prompts ? s->input.bytes : o->prompt;
    size_t src_n = o->file || o->prompts ? s->input.n_bytes : strlen(o->prompt);
    if (akv_tok_text_append(&text, src ? src : "", src_n) != AKV_OK) return AKV_EXIT_FAIL;
    /* --prompts: one job per line (a last line without a newline counts) */
    size_t n = 1;
    if (o->prompts) {
        n = 0;
        for (size_t i = 0; i < text.n_bytes; i++) n += text.bytes[i] == '\n';
        n += text.n_bytes && text.bytes[text.n_bytes - 1] != '\n';
        if (n == 0 || n > RUN_MAX_PROMPTS) {
            fprintf(stderr, "akv run: --prompts '%s' holds %zu lines (1..%d)\n", o->prompts, n,
                    RUN_MAX_PROMPTS);
            akv_tok_text_free(&text);
            return AKV_EXIT_USAGE;
        }
    }
    s->jobs = calloc(n, sizeof *s->jobs);
    if (!s->jobs) {
        akv_tok_text_free(&text);
        return AKV_EXIT_FAIL;
    }
    s->n_jobs = n;
    const char *at = text.bytes ? text.bytes : "";
    for (size_t i = 0; i < n && rc < 0; i++) {
        const size_t line = o->prompts ? strcspn(at, "\n") : text.n_bytes;
        /* a CRLF file's lines end in "\r\n": the CR is the line end's, not the prompt's */
        const size_t len = o->prompts && line && at[line - 1] == '\r' ? line - 1 : line;
        if (run_encode(s, at, len, false, NULL, &s->jobs[i].ids)) rc = AKV_EXIT_FAIL;
        else if (s->jobs[i].ids.n_ids == 0) {
            /* no token, no logits: the first sample would read what no pass wrote */
            if (o->prompts)
                fprintf(stderr, "akv run: --prompts line %zu is empty (it encodes to no tokens)\n", i + 1);
            else
                fprintf(stderr, "akv run: the prompt is empty (it encodes to no tokens)\n");
            rc = AKV_EXIT_USAGE;
        }
        at += line + (at[line] == '\n');
    }
    akv_tok_text_free(&text);
    return rc;
}

/* The engine: the plan from the flags, the longest history the run needs. */
static int run_open_engine(run_state *s, uint32_t max_seqs) {
    const run_opts *o = &s->o;
    akv_engine_params ep = akv_engine_default_params();
    akv_status st = akv_tool_open_device(o->e.device, &ep.dev);
    if (st) return st == AKV_EINVAL ? AKV_EXIT_USAGE : AKV_EXIT_FAIL; /* printed */
    akv_dev_info info;
    if ((st = akv_dev_get_info(ep.dev, &info))) {
        fprintf(stderr, "akv run: --device %s: %s\n", o->e.device, akv_status_str(st));
        akv_dev_destroy(ep.dev);
        return AKV_EXIT_FAIL;
    }
    if (o->e.threads) akv_ops_ref_set_threads((int)akv_tool_eopts_threads(&o->e));
    int r;
    if ((r = akv_tool_trace_open("run", &o->e, &s->trace)) >= 0) {
        akv_dev_destroy(ep.dev);
        return r;
    }
    ep.model = s->model;
    ep.progress = run_engine_progress, ep.progress_user = s;
    akv_tool_eopts_apply(&o->e, &ep);
    ep.trace = s->trace;
    ep.max_context = s->n_ctx;
    ep.max_seqs = max_seqs;
    ep.max_queue = s->n_jobs > max_seqs ? (uint32_t)s->n_jobs : 0; /* every prompt waits its turn */
    ep.max_idle = 1;   /* a conversation's last context, for its next turn */
    st = akv_engine_create(&ep, &s->engine);
    if (st) return akv_tool_engine_failed("run", st); /* logged with the setting */
    if (!o->quiet) {
        const akv_engine_plan *pl = akv_engine_get_plan(s->engine);
        char tier[160] = "";
        if (pl->route.tier != AKV_REPR_EXACT)
            snprintf(tier, sizeof tier,
                     " with a %s tier (%.3g bits an element; exact the last %llu tokens; %u GiB "
                     "of the device pool)",
                     akv_repr_name(pl->route.tier), akv_geom_repr_bits(&pl->geom, pl->route.tier),
                     (unsigned long long)pl->route.exact_recent, pl->route.compact_gib);
        fprintf(stderr,
                "akv run: on %s (%s); %s, %u layers, weights %s (%.1f MiB); K/V %s in pages of "
                "%u tokens (%zu KiB); host pool %llu GiB, device pool %llu GiB, route %s%s, "
                "context %llu, %u at once\n",
                info.is_host ? "the CPU" : "the GPU", info.name, s->cfg->arch_name,
                s->cfg->n_layers, akv_weights_name(o->e.weights),
                (double)akv_engine_weight_bytes(s->engine) / (1 << 20),
                akv_dtype_name(pl->geom.dtype), pl->geom.page_tokens,
                akv_geom_page_bytes(&pl->geom) >> 10, o->e.host_gib, o->e.device_gib,
                akv_route_kind_name(pl->route.kind), tier, (unsigned long long)s->n_ctx,
                pl->max_seqs);
        if (akv_route_kind_has_host_part(pl->route.kind)) { /* --route host: its split */
            if (pl->route.host_bps > 0)
                fprintf(stderr, "akv run: host part: in decode steps the host's cores attend "
                        "%.0f %% of each history's pages outside its window = host %.1f GB/s / "
                        "(host + the bus's %.1f GB/s), each measured alone (--host-share F to "
                        "set it)\n",
                        100.0 * pl->route.host_share, pl->route.host_bps / 1e9,
                        pl->route.bus_bps / 1e9);
            else
                fprintf(stderr, "akv run: host part: in decode steps the host's cores attend "
                        "%.0f %% of each history's pages outside its window (--host-share)\n",
                        100.0 * pl->route.host_share);
        }
        if (pl->n_gate) { /* --kv-tier auto: what the gate weighed */
            char g[2048];
            akv_gate_format(&pl->gate_rates, pl->gate, pl->n_gate, pl->max_context, g, sizeof g);
            fputs(g, stderr);
        }
    }
    return -1;
}

/* ---- generation ----------------------------------------------------------------------------- */

static int run_push_id(akv_tok_ids *ids, int32_t id) {
    if (ids->n_ids == ids->cap) {
        size_t cap = ids->cap ? 2 * ids->cap : 64;
        int32_t *p = realloc(ids->ids, cap * sizeof *p);
        if (!p) return 0;
        ids->ids = p, ids->cap = cap;
    }
    ids->ids[ids->n_ids++] = id;
    return 1;
}

static void run_write(run_job *j, const char *text, size_t n) {
    if (!n) return;
    if ((!j->out || j->keep) && akv_tok_text_append(&j->buf, text, n) != AKV_OK) j->write_failed = 1;
    if (!j->out) return;
    if (fwrite(text, 1, n, j->out) != n) j->write_failed = 1;
    fflush(j->out);
}

static void run_on_token(void *user, akv_request *rq, const akv_token_event *ev) {
    (void)rq;
    run_job *j = user;
    if (ev->text) run_write(j, ev->text, ev->n_text);
    /* the reply's tokens: not the one that stopped it (an end of turn, a stop text's) */
    if (ev->token >= 0 && ev->finish != AKV_FINISH_STOP && !run_push_id(&j->gen, ev->token))
        j->write_failed = 1;
    if (ev->logits && j->dump &&
        fwrite(ev->logits, sizeof(float), j->n_vocab, j->dump) != j->n_vocab)
        j->dump_failed = 1;
    if (ev->finish != AKV_FINISH_NONE) j->finish = ev->finish;
}

/* Submits job j: its prompt (max_tokens capped by the context), its sampling. Prints a
 * refusal (with the flag to change) and returns 0 then. */
static int run_submit(run_state *s, run_job *j, uint64_t seed) {
    const run_opts *o = &s->o;
    uint64_t room = s->n_ctx > j->ids.n_ids ? s->n_ctx - j->ids.n_ids : 0;
    akv_request_params rp = {.prompt = j->ids.ids,
                             .n_prompt = (uint32_t)j->ids.n_ids,
                             .max_tokens = (uint32_t)(o->n_predict < room ? o->n_predict : room),
                             .sample = o->e.sp,
                             .stop = o->stop,
                             .n_stop = o->n_stop,
                             .ignore_eog = o->ignore_eos,
                             .on_token = run_on_token,
                             .user = j,
                             .want_logits = j->dump != NULL,
                             .id = (uint64_t)(j - s->jobs) + 1};
    rp.sample.seed = seed;
    j->n_vocab = s->cfg->n_vocab;
    j->finish = AKV_FINISH_NONE;
    if (rp.max_tokens == 0) {
        fprintf(stderr, "akv run: the prompt (%zu tokens) does not fit --max-context %llu\n",
                j->ids.n_ids, (unsigned long long)s->n_ctx);
        return 0;
    }
    akv_refusal rf;
    akv_status st = akv_engine_submit(s->engine, &rp, &j->rq, &rf);
    if (st) {
        char said[512];
        akv_tool_render(rf.message, said, sizeof said);
        fprintf(stderr, "akv run: refused (%s): %s\n", akv_refusal_reason_name(rf.reason), said);
        return 0;
    }
    return 1;
}

/* Steps until every request has ended. */
static akv_status run_until_done(run_state *s) {
    akv_status st = AKV_OK;
    while (akv_engine_busy(s->engine)) {
        st = akv_engine_step(s->engine, NULL);
        if (st && akv_engine_failed(s->engine)) break; /* every request ended with an error */
    }
    return akv_engine_failed(s->engine) ? AKV_EDEVICE : AKV_OK;
}

/* A finished job's numbers join the run's totals. */
static void run_account(run_state *s, const run_job *j) {
    akv_request_info ri;
    akv_request_get_info(j->rq, &ri);
    s->n_prompt += ri.n_prompt - ri.n_cached;
    s->n_cached += ri.n_cached;
    s->n_gen += ri.n_gen;
    s->n_dec += ri.n_gen > 1 ? ri.n_gen - 1 : 0;
    if (ri.t_first > 0) {
        s->t_prompt += ri.t_first - ri.t_admit;
        s->t_dec += ri.t_done - ri.t_first;
        if (s->t_first == 0) s->t_first = ri.t_first - ri.t_submit;
    }
}

/* A byte count in B, KB, MB or GB (decimal), into buf. */
static const char *run_bytes(double b, char buf[32]) {
    static const char *const unit[] = {"B", "KB", "MB", "GB", "TB"};
    int u = 0;
    while (b >= 1000 && u < 4) b /= 1000, u++;
    snprintf(buf, 32, u ? "%.2f %s" : "%.0f %s", b, unit[u]);
    return buf;
}

/* One request's report line (--prompts): its own times, not the run's. */
static void run_report_job(const run_state *s, size_t i) {
    akv_request_info ri;
    akv_request_get_info(s->jobs[i].rq, &ri);
    double dec = ri.t_done - ri.t_first;
    uint32_t n_dec = ri.n_gen > 1 ? ri.n_gen - 1 : 0;
    fprintf(stderr,
            "prompt %zu: %u prompt tokens (%u reused), %u generated; time to first token %.3f s, "
            "then %.1f tok/s; finish %s\n",
            i + 1, ri.n_prompt, ri.n_cached, ri.n_gen,
            ri.t_first > 0 ? ri.t_first - ri.t_submit : 0, dec > 0 ? n_dec / dec : 0,
            akv_finish_name(ri.finish));
}

static void run_report(const run_state *s) {
    if (s->o.quiet) return;
    akv_engine_stats es;
    akv_engine_get_stats(s->engine, &es);
    akv_dev_pool_stats ps;
    akv_host_pool_stats hs;
    akv_dev_pool_get_stats(akv_engine_dev_pool(s->engine), &ps);
    akv_host_pool_get_stats(akv_engine_host_pool(s->engine), &hs);
    const double wall = akv_clock_s() - s->t_start;
    if (s->n_jobs > 1) {
        /* many requests at once: each one's own figures, then the run's throughput over wall
         * time (per-request times overlap: their sums are no rate of anything) */
        fputc('\n', stderr);
        for (size_t i = 0; i < s->n_jobs; i++)
            if (s->jobs[i].rq) run_report_job(s, i);
        fprintf(stderr,
                "\nall %zu together, wall clock %.3f s from the first submit to the last token: "
                "%llu prompt tokens computed (%.1f tok/s), %llu generated (%.1f tok/s)",
                s->n_jobs, wall, (unsigned long long)s->n_prompt,
                wall > 0 ? (double)s->n_prompt / wall : 0, (unsigned long long)s->n_gen,
                wall > 0 ? (double)s->n_gen / wall : 0);
        if (s->n_cached)
            fprintf(stderr, "; %llu prompt tokens reused, not computed",
                    (unsigned long long)s->n_cached);
        fprintf(stderr, "\nsteps: %llu of %.1f ms on average, %llu of them decode steps\n",
                (unsigned long long)es.n_steps, es.n_steps ? es.step_s * 1e3 / es.n_steps : 0,
                (unsigned long long)es.n_decode_steps);
    } else {
        fprintf(stderr, "\n\nprompt: %llu tokens in %.3f s (%.1f tok/s)",
                (unsigned long long)s->n_prompt, s->t_prompt,
                s->t_prompt > 0 ? (double)s->n_prompt / s->t_prompt : 0);
        if (s->n_cached)
            fprintf(stderr, "; %llu more reused from %s, not computed", (unsigned long long)s->n_cached,
                    s->o.session                 ? "the --session file"
                    : es.n_restored && s->o.chat ? "earlier turns and the --session-dir directory"
                    : es.n_restored              ? "the --session-dir directory"
                                                 : "earlier turns");
        fprintf(stderr, "\ndecode: %llu tokens in %.3f s (%.1f tok/s)\n",
                (unsigned long long)s->n_dec, s->t_dec,
                s->t_dec > 0 ? (double)s->n_dec / s->t_dec : 0);
        fprintf(stderr, "time to first token: %.3f s\n", s->t_first);
    }
    /* the bus per decode step and per token it generated (prefill steps apart) */
    char b1[32], b2[32], b3[32], b4[32], b5[32];
    const double nd = (double)es.n_decode_steps, nt = (double)es.decode_tokens;
    fprintf(stderr,
            "bus, route %s, decode steps: %s host->device a step (%s of it non-window pages), "
            "%s written back; per generated token %s host->device, %s written back\n",
            akv_route_kind_name(s->o.e.route),
            run_bytes(nd ? es.decode_h2d_bytes / nd : 0, b1),
            run_bytes(nd ? es.decode_staged_bytes / nd : 0, b2),
            run_bytes(nd ? es.decode_d2h_bytes / nd : 0, b3),
            run_bytes(nt ? es.decode_h2d_bytes / nt : 0, b4),
            run_bytes(nt ? es.decode_d2h_bytes / nt : 0, b5));
    if (es.decode_host_bytes)
        fprintf(stderr, "host part: the host's cores attended %s a decode step where the pages "
                "lie (%s per generated token)\n",
                run_bytes(nd ? es.decode_host_bytes / nd : 0, b1),
                run_bytes(nt ? es.decode_host_bytes / nt : 0, b2));
    double mib = 1.0 / (1 << 20);
    if (es.compact_pages && akv_engine_get_plan(s->engine)->route.compact_host_gib)
        /* the staged compact route: copies made on the host, then copied into the window (the
         * pages staged are in the bus line's non-window bytes) */
        fprintf(stderr, "compact tier: %llu compact copies made on the host from the exact "
                "copies; %.1f MiB of them copied into the compact window\n",
                (unsigned long long)es.compact_pages, (double)es.compact_bytes * mib);
    else if (es.compact_pages)
        fprintf(stderr, "compact tier: %llu pages made (%llu on the device from their exact pages, "
                "the rest from the host copies: %.1f MiB copied)\n",
                (unsigned long long)es.compact_pages, (unsigned long long)es.compact_device,
                (double)es.compact_bytes * mib);
    fprintf(stderr,
            "device pool: %u of %u pages per layer in use (%.1f of %.0f MiB); host pool: "
            "%llu pages, %.1f MiB pinned; preemptions %llu\n",
            ps.window_used, ps.window_capacity,
            (double)ps.window_used * s->cfg->n_layers * (double)ps.page_bytes * mib,
            (double)ps.n_pages * (double)ps.page_bytes * mib, (unsigned long long)hs.n_used,
            (double)hs.pinned_bytes * mib, (unsigned long long)es.n_preemptions);
    if (es.graph_builds || es.graph_launches)
        fprintf(stderr, "decode steps replayed as graphs: %llu (%llu graph(s) built)\n",
                (unsigned long long)es.graph_launches, (unsigned long long)es.graph_builds);
}

/* Makes a directory and the ones above it that are missing (mkdir -p). 0 and errno set when
 * one cannot be made or a part is not a directory. */
static int run_mkdirs(const char *path) {
    char *p = strdup(path);
    if (!p) return 0;
    for (char *c = p + 1; *c; c++) {
        if (*c != '/') continue;
        *c = '\0';
        if (mkdir(p, 0777) != 0 && errno != EEXIST) {
            free(p);
            return 0;
        }
        *c = '/';
    }
    struct stat sb;
    const int ok = (mkdir(p, 0777) == 0 || errno == EEXIST) && stat(p, &sb) == 0 &&
                   (S_ISDIR(sb.st_mode) || (errno = ENOTDIR, 0));
    free(p);
    return ok;
}

/* Opens job i's outputs for --prompts: DIR/i.txt (or a buffer), PATH.i for the logits. */
static int run_open_job_outputs(run_state *s, size_t i) {
    run_job *j = &s->jobs[i];
    const run_opts *o = &s->o;
    if (!o->prompts) {
        j->out = stdout;
    } else if (o->out_dir) {
        if (i == 0 && !run_mkdirs(o->out_dir)) {
            fprintf(stderr, "akv run: --out-dir: cannot make '%s': %s\n", o->out_dir,
                    strerror(errno));
            return 0;
        }
        if (asprintf(&j->path, "%s/%zu.txt", o->out_dir, i + 1) < 0) return 0;
        if (!(j->out = fopen(j->path, "w"))) {
            fprintf(stderr, "akv run: --out-dir: '%s': %s\n", j->path, strerror(errno));
            return 0;
        }
    }
    if (o->dump) {
        char *dp = NULL;
        if (o->prompts && asprintf(&dp, "%s.%zu", o->dump, i + 1) < 0) return 0;
        const char *path = dp ? dp : o->dump;
        if (akv_tool_same_file(path, o->e.model) || !(j->dump = fopen(path, "wb"))) {
            fprintf(stderr, "akv run: --dump-logits '%s': %s\n", path,
                    j->dump ? "is the model" : strerror(errno));
            free(dp);
            return 0;
        }
        free(dp);
    }
    return 1;
}

/* -p, -f, --prompts: every prompt submitted at once (they wait their turn), each echoed and
 * streamed to its output. */
static int run_oneshot(run_state *s) {
    const run_opts *o = &s->o;
    for (size_t i = 0; i < s->n_jobs; i++)
        if (!run_open_job_outputs(s, i)) return AKV_EXIT_FAIL;
    /* each prompt's text first, as it was given */
    if (o->prompt) {
        run_write(&s->jobs[0], o->prompt, strlen(o->prompt));
    } else if (o->file) {
        run_write(&s->jobs[0], s->input.bytes ? s->input.bytes : "", s->input.n_bytes);
    } else {
        const char *at = s->input.bytes ? s->input.bytes : "";
        for (size_t i = 0; i < s->n_jobs; i++) {
            const size_t line = strcspn(at, "\n");
            run_write(&s->jobs[i], at, line && at[line - 1] == '\r' ? line - 1 : line);
            at += line + (at[line] == '\n');
        }
    }
    s->t_start = akv_clock_s(); /* the run's own time: from the first request on */
    for (size_t i = 0; i < s->n_jobs; i++)
        if (!run_submit(s, &s->jobs[i], o->e.sp.seed + i)) return AKV_EXIT_REFUSED;
    if (run_until_done(s) != AKV_OK) {
        fprintf(stderr, "akv run: the device failed and did not recover\n");
        return AKV_EXIT_FAIL;
    }
    int rc = AKV_EXIT_OK;
    for (size_t i = 0; i < s->n_jobs; i++) {
        run_job *j = &s->jobs[i];
        run_write(j, "\n", 1);
        if (!j->out) { /* buffered: printed in order now */
            if (s->n_jobs > 1) printf("== prompt %zu ==\n", i + 1);
            if (j->buf.n_bytes && fwrite(j->buf.bytes, 1, j->buf.n_bytes, stdout) != j->buf.n_bytes)
                j->write_failed = 1;
        }
        run_account(s, j);
        if (j->finish == AKV_FINISH_ERROR) {
            fprintf(stderr, "akv run: prompt %zu failed on the device\n", i + 1);
            rc = AKV_EXIT_FAIL;
        }
        if (j->dump_failed) {
            fprintf(stderr, "akv run: --dump-logits: write failed\n");
            rc = AKV_EXIT_FAIL;
        }
    }
    return rc;
}

/* One chat turn: the conversation rendered, its new text encoded after the tokens the context
 * holds, the reply generated and streamed. A turn that cannot fit the context is refused with
 * a message and the conversation kept (*refused). */
static int run_chat_turn(run_state *s, akv_chat_msg *msgs, size_t n_msgs, bool *refused) {
    *refused = false;
    akv_tok_text r = {0};
    akv_tok_spans contents = {0};
    akv_status st = akv_chat_render(s->chat, msgs, n_msgs, true, &r,
                                    s->o.e.special_in_content ? NULL : &contents);
    if (st) return AKV_EXIT_FAIL;
    size_t skip = s->fed.n_bytes;
    /* the contents' stretches in the new text only (the context holds the rest as tokens) */
    size_t k = 0;
    for (size_t i = 0; i < contents.n; i++) {
        const size_t a = contents.spans[i].off, b = a + contents.spans[i].n_bytes;
        if (b <= skip) continue;
        const size_t a2 = a > skip ? a - skip : 0;
        contents.spans[k++] = (akv_tok_span){a2, b - skip - a2};
    }
    contents.n = k;
    if (skip > r.n_bytes || (skip && memcmp(r.bytes, s->fed.bytes, skip))) {
        /* e.g. a template that trims the reply: the context would no longer be the text */
        fprintf(stderr, "akv run: the conversation no longer renders as the context holds it; "
                        "start a new one\n");
        akv_tok_text_free(&r);
        akv_tok_spans_free(&contents);
        return AKV_EXIT_FAIL;
    }
    run_job *j = &s->jobs[0];
    akv_tok_ids_free(&j->ids);
    akv_tok_ids_free(&j->gen);
    int rc = -1;
    for (size_t i = 0; i < s->conv.n_ids && rc < 0; i++)
        if (!run_push_id(&j->ids, s->conv.ids[i])) rc = AKV_EXIT_FAIL;
    if (rc < 0 && run_encode(s, r.bytes + skip, r.n_bytes - skip, true, &contents, &j->ids))
        rc = AKV_EXIT_FAIL;
    akv_tok_spans_free(&contents);
    if (rc < 0 && j->ids.n_ids + 1 > s->n_ctx) {
        fprintf(stderr, "akv run: this turn (%zu tokens with the conversation) does not fit "
                        "--max-context %llu; it was not sent, the conversation is kept\n",
                j->ids.n_ids, (unsigned long long)s->n_ctx);
        *refused = true;
        akv_tok_text_free(&r);
        return -1;
    }
    if (j->rq) akv_engine_release(s->engine, j->rq), j->rq = NULL;
    if (rc < 0 && !run_submit(s, j, s->o.e.sp.seed)) rc = AKV_EXIT_REFUSED;
    if (rc < 0 && run_until_done(s) != AKV_OK) rc = AKV_EXIT_FAIL;
    if (rc < 0) {
        run_account(s, j);
        if (j->finish == AKV_FINISH_ERROR) rc = AKV_EXIT_FAIL;
    }
    if (rc < 0) {
        /* the conversation goes on from the prompt and the reply (its text and its tokens) */
        akv_tok_ids_free(&s->conv);
        for (size_t i = 0; i < j->ids.n_ids && rc < 0; i++)
            if (!run_push_id(&s->conv, j->ids.ids[i])) rc = AKV_EXIT_FAIL;
        for (size_t i = 0; i < j->gen.n_ids && rc < 0; i++)
            if (!run_push_id(&s->conv, j->gen.ids[i])) rc = AKV_EXIT_FAIL;
        akv_tok_text_free(&s->fed);
        if (akv_tok_text_append(&s->fed, r.bytes, r.n_bytes) ||
            akv_tok_text_append(&s->fed, j->buf.bytes ? j->buf.bytes : "", j->buf.n_bytes))
            rc = AKV_EXIT_FAIL;
        /* the reply becomes the assistant's message of the conversation */
        msgs[n_msgs].role = "assistant";
        msgs[n_msgs].content = strdup(j->buf.bytes ? j->buf.bytes : "");
        if (!msgs[n_msgs].content) rc = AKV_EXIT_FAIL;
    }
    j->buf.n_bytes = 0;
    akv_tok_text_free(&r);
    return rc;
}

/* --chat: a conversation of -p or of the lines of standard input. */
static int run_chat(run_state *s) {
    const run_opts *o = &s->o;
    s->jobs = calloc(1, sizeof *s->jobs);
    if (!s->jobs) return AKV_EXIT_FAIL;
    s->n_jobs = 1;
    if (o->dump && !run_open_job_outputs(s, 0)) return AKV_EXIT_FAIL;
    s->jobs[0].out = stdout, s->jobs[0].keep = 1; /* streamed, and kept for the conversation */
    bool interactive = !o->prompt;
    akv_chat_msg *msgs = calloc(2 * RUN_MAX_TURNS + 2, sizeof *msgs);
    size_t n_msgs = 0;
    int rc = msgs ? -1 : AKV_EXIT_FAIL;
    if (rc < 0 && o->system) {
        msgs[n_msgs] = (akv_chat_msg){"system", strdup(o->system)};
        if (!msgs[n_msgs++].content) rc = AKV_EXIT_FAIL;
    }
    char *line = NULL;
    size_t cap = 0;
    while (rc < 0) {
        const char *user = o->prompt;
        if (interactive) {
            if (!o->quiet) fprintf(stderr, "\n> ");
            ssize_t n = getline(&line, &cap, stdin);
            if (n <= 0) break;
            if ((unsigned long long)n > o->max_input) {
                fprintf(stderr, "akv run --chat: a line of %zd bytes; --max-input-bytes is %llu: "
                                "the line was not sent\n", n, o->max_input);
                continue;
            }
            if (line[n - 1] == '\n') line[n - 1] = 0;
            user = line;
        }
        if (n_msgs + 2 > 2 * RUN_MAX_TURNS + 1) {
            /* the conversation's turns are full: say so, and do not read (and drop) more */
            fprintf(stderr, "\nakv run --chat: the conversation reached its limit of %d turns; "
                            "input after this turn was not read (exit 1)\n", RUN_MAX_TURNS);
            rc = AKV_EXIT_FAIL;
            break;
        }
        msgs[n_msgs] = (akv_chat_msg){"user", strdup(user)};
        if (!msgs[n_msgs].content) {
            rc = AKV_EXIT_FAIL;
            break;
        }
        bool refused;
        rc = run_chat_turn(s, msgs, n_msgs + 1, &refused);
        if (refused) { /* the turn is dropped; the conversation stays as it was */
            free((void *)msgs[n_msgs].content);
            msgs[n_msgs].content = NULL;
            rc = interactive ? -1 : AKV_EXIT_REFUSED;
        } else if (rc < 0) {
            n_msgs += 2;
        }
        if (!interactive) break;
        if (rc < 0) fputc('\n', stdout);
    }
    free(line);
    for (size_t i = 0; msgs && i < 2 * RUN_MAX_TURNS + 2; i++) free((void *)msgs[i].content);
    free(msgs);
    return rc < 0 ? AKV_EXIT_OK : rc;
}

/* --session FILE: restored into an idle context before the prompt (which reuses what it
 * shares with it); -1 to go on. */
static int run_session_load(run_state *s) {
    uint32_t n = 0;
    akv_status st = akv_engine_session_load(s->engine, s->o.session, &n);
    if (st == AKV_ENOTFOUND) {
        if (!s->o.quiet) fprintf(stderr, "akv run: --session %s: no such file yet; it is written at the end\n", s->o.session);
        return -1;
    }
    if (st) {
        fprintf(stderr, "akv run: --session %s: %s (the file is left as it is; %s)\n", s->o.session,
                akv_status_str(st),
                st == AKV_EFULL ? "raise --max-context or --host-gib to restore it"
                                : "remove it to start afresh");
        return AKV_EXIT_FAIL;
    }
    if (!s->o.quiet) fprintf(stderr, "akv run: --session %s: %u tokens restored\n", s->o.session, n);
    return -1;
}

/* The prompt and its reply, saved to --session FILE. */
static int run_session_save(run_state *s) {
    const run_job *j = &s->jobs[0];
    const size_t n = j->ids.n_ids + j->gen.n_ids;
    int32_t *all = malloc((n ? n : 1) * sizeof *all);
    akv_status st = all ? AKV_OK : AKV_ENOMEM;
    if (!st) {
        memcpy(all, j->ids.ids, j->ids.n_ids * sizeof *all);
        if (j->gen.n_ids) memcpy(all + j->ids.n_ids, j->gen.ids, j->gen.n_ids * sizeof *all);
        st = akv_engine_session_save(s->engine, all, (uint32_t)n, s->o.session);
    }
    free(all);
    if (st) {
        fprintf(stderr, "akv run: --session %s: not saved: %s\n", s->o.session, akv_status_str(st));
        return AKV_EXIT_FAIL;
    }
    if (!s->o.quiet) fprintf(stderr, "akv run: --session %s: saved\n", s->o.session);
    return AKV_EXIT_OK;
}

int akv_cmd_run(int argc, char **argv) {
    run_state s;
    memset(&s, 0, sizeof s);
    s.load_pct = -1;
    int rc = run_parse(argc, argv, &s.o);
    if (rc >= 0) return rc;
    const run_opts *o = &s.o;
    s.t_start = akv_clock_s();
    akv_tool_log_flags(AKV_LOG_WARN); /* the library's messages, said as our flags */
    if (!o->chat && (o->file || o->prompts) && /* a bad input fails before the model loads */
        !akv_tool_read_input("run", o->file ? o->file : o->prompts, o->max_input,
                             "max-input-bytes", &s.input)) {
        rc = AKV_EXIT_FAIL;
        goto done;
    }
    if ((rc = run_open_model(&s)) >= 0) goto done;
    uint32_t parallel = (uint32_t)o->e.parallel;
    if (!o->chat) {
        if ((rc = run_load_prompts(&s)) >= 0) goto done;
        uint64_t longest = 0;
        for (size_t i = 0; i < s.n_jobs; i++)
            if (s.jobs[i].ids.n_ids > longest) longest = s.jobs[i].ids.n_ids;
        s.n_ctx = o->e.ctx ? o->e.ctx : longest + o->n_predict;
        if (!parallel) parallel = s.n_jobs < 4 ? (uint32_t)s.n_jobs : 4;
    } else {
        s.n_ctx = o->e.ctx ? o->e.ctx : s.cfg->n_ctx_train;
        if (!parallel) parallel = 1;
    }
    if (s.n_ctx > s.cfg->n_ctx_train && !o->quiet)
        fprintf(stderr,
                "akv run: warning: --max-context %llu is beyond the model's training context "
                "%u\n",
                (unsigned long long)s.n_ctx, s.cfg->n_ctx_train);
    for (size_t i = 0; i < s.n_jobs; i++)
        if (s.jobs[i].ids.n_ids + 1 > s.n_ctx) {
            fprintf(stderr, "akv run: the prompt%s (%zu tokens) does not fit --max-context %llu\n",
                    s.n_jobs > 1 ? " of a line" : "", s.jobs[i].ids.n_ids,
                    (unsigned long long)s.n_ctx);
            rc = AKV_EXIT_REFUSED;
            goto done;
        }
    if ((rc = run_open_engine(&s, parallel)) >= 0) goto done;
    if (o->session && (rc = run_session_load(&s)) >= 0) goto done;
    rc = o->chat ? run_chat(&s) : run_oneshot(&s);
    if (rc == AKV_EXIT_OK && o->session) rc = run_session_save(&s);
    if (rc == AKV_EXIT_OK) run_report(&s);
    for (size_t i = 0; i < s.n_jobs; i++)
        if (s.jobs[i].write_failed) rc = AKV_EXIT_FAIL;
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "akv run: writing the output failed: %s\n", strerror(errno));
        rc = AKV_EXIT_FAIL;
    }
done:
    run_free(&s);
    return rc;
}
