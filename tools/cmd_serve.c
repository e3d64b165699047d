/* cmd_serve.c — `akv serve`: the OpenAI-compatible server (akv/server.h) from the command line:
 * the engine's flags (tools/engine_opts.h), the HTTP ones, signals for a graceful stop. */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "akv/chat.h"
#include "akv/log.h"
#include "akv/ops.h"
#include "akv/server.h"
#include "cmd.h"
#include "engine_opts.h"
#include "akv/trace.h"

static const char serve_usage[] =
    "usage: akv serve [-m MODEL.gguf] [--host ADDR] [--port N] [--parallel N] [options]\n"
    "\n"
    "Serves the model over HTTP with OpenAI's API: POST /v1/chat/completions and\n"
    "/v1/completions (streamed with \"stream\": true), GET /v1/models, /health and /metrics\n"
    "(Prometheus), and llama-server's slots: GET /slots, POST /slots/N?action=save, restore\n"
    "or erase. Requests run together in the engine's batch steps; what cannot be served\n"
    "is refused with the reason (429 when the queue is full, 503 when it can never fit).\n"
    "SIGINT, SIGTERM or SIGHUP stops it: the listening socket closes at once, requests in\n"
    "flight get --grace seconds, a second signal cancels them at once.\n"
    "\n"
    "options:\n"
    "  -m, --model PATH         GGUF model (default " AKV_TOOL_DEFAULT_MODEL ")\n"
    "      --host ADDR          address to listen on (default 127.0.0.1: this machine only;\n"
    "                           0.0.0.0 or :: for every interface)\n"
    "      --port N             (default 8080; 0 = any free port, printed)\n"
    "      --api-key KEY        require Authorization: Bearer KEY (every path but /health);\n"
    "                           also read from AKV_API_KEY\n"
    "      --alias NAME         the model's name in answers and /v1/models (default: the\n"
    "                           file's name)\n"
    "      --parallel N         sequences run at once (default 4)\n"
    "      --max-queue N        requests that may wait for room (default 64; 0 = refuse at once)\n"
    "      --max-context N      the longest history of a request, prompt + new tokens\n"
    "                           (default: the model's context length)\n"
    "  -n, --n-predict N        max_tokens when a request does not say (default 512)\n"
    "      --max-prompt-tokens N  the longest prompt accepted (default: the context)\n"
    "      --max-body-bytes N   the largest request body (default 16M)\n"
    "      --timeout S          a request's limit in seconds, arrival to last token (default\n"
    "                           600)\n"
    "      --grace S            on SIGINT/SIGTERM, seconds requests in flight may finish in\n"
    "                           (default 10)\n"
    "      --idle-timeout S     close a kept-alive connection idle this long, or an answer\n"
    "                           its client stopped reading for this long (default 60)\n"
    "      --read-timeout S     a request's head and body must arrive within S seconds of\n"
    "                           its first byte, or it is answered 408 (default 30)\n"
    "      --max-connections N  connections served at once (default 256); past it a client\n"
    "                           may still ask /health, anything else gets 503\n"
    "      --max-connections-per-client N  of those, from one client address (default half\n"
    "                           of --max-connections); past it: /health, else 429\n"
    "      --seed S             the seed of requests that give none (default: a fresh one\n"
    "                           per request)\n"
    "      --slot-save-path DIR an existing directory where POST /slots/N?action=save writes\n"
    "                           slot N's conversation ({\"filename\": F}) and restore reads it\n"
    "                           back (default: none; those actions answer 501)\n"
    "  -v, --verbose            a log line per request\n"
    "  -h, --help               this text\n"
    "Engine and default sampling (a request's own fields win):\n";

static void serve_help(FILE *f) {
    akv_tool_eopts d;
    akv_tool_eopts_defaults(&d);
    fputs(serve_usage, f);
    akv_tool_eopts_help(f, &d);
}

static int serve_pipe[2] = {-1, -1};

static void serve_on_signal(int sig) {
    char c = (char)sig;
    ssize_t k = write(serve_pipe[1], &c, 1); /* async-signal-safe */
    (void)k;
}

/* The next signal within ms (-1: wait for one), or 0. */
static int serve_next_signal(int ms) {
    struct pollfd pf = {.fd = serve_pipe[0], .events = POLLIN};
    for (;;) {
        int k = poll(&pf, 1, ms);
        if (k < 0 && errno == EINTR) continue;
        char c;
        if (k > 0 && read(serve_pipe[0], &c, 1) == 1) return (unsigned char)c;
        return 0;
    }
}

static double serve_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int akv_cmd_serve(int argc, char **argv) {
    enum { O_HOST = 256, O_PORT, O_KEY, O_ALIAS, O_QUEUE, O_PROMPT, O_BODY, O_TIMEOUT, O_GRACE,
           O_CONNS, O_IDLE, O_READ, O_PER_CLIENT, O_SLOTS };
    static const struct option own[] = {
                                         {"host", required_argument, 0, O_HOST},
                                         {"port", required_argument, 0, O_PORT},
                                         {"api-key", required_argument, 0, O_KEY},
                                         {"alias", required_argument, 0, O_ALIAS},
                                         {"max-queue", required_argument, 0, O_QUEUE},
                                         {"n-predict", required_argument, 0, 'n'},
                                         {"max-prompt-tokens", required_argument, 0, O_PROMPT},
                                         {"max-body-bytes", required_argument, 0, O_BODY},
                                         {"timeout", required_argument, 0, O_TIMEOUT},
                                         {"grace", required_argument, 0, O_GRACE},
                                         {"max-connections", required_argument, 0, O_CONNS},
                                         {"idle-timeout", required_argument, 0, O_IDLE},
                                         {"read-timeout", required_argument, 0, O_READ},
                                         {"max-connections-per-client", required_argument, 0,
                                          O_PER_CLIENT},
                                         {"slot-save-path", required_argument, 0, O_SLOTS},
                                         {"verbose", no_argument, 0, 'v'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    struct option opts[96];
    if (akv_tool_options(own, opts, sizeof opts / sizeof *opts) < 0) {
        fprintf(stderr, "akv serve: too many options for the getopt table\n");
        return AKV_EXIT_FAIL;
    }
    akv_tool_eopts e;
    akv_tool_eopts_defaults(&e);
    akv_server_params p = akv_server_default_params();
    const char *alias = NULL, *key = getenv("AKV_API_KEY");
    unsigned long long port = 8080, queue = 64, n_predict = 512, max_prompt = 0;
    unsigned long long body = 16u << 20, conns = 256, per_client = 0;
    float timeout = 600, grace = 10, idle = 60, read = 30;
    int c, r;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:n:vh", opts, NULL)) != -1) {
        if (c == AKV_OPT_SEED) p.fixed_seed = 1; /* else each request gets a fresh one */
        if ((r = akv_tool_eopts_parse("serve", c, optarg, &e)) < 0) return AKV_EXIT_USAGE;
        if (r) continue;
        int ok = 1;
        switch (c) {
        case O_HOST: p.host = optarg; break;
        case O_PORT: ok = akv_tool_parse_max("serve", "port", optarg, 65535, &port); break;
        case O_KEY: key = optarg; break;
        case O_SLOTS: p.slot_save_path = optarg; break;
        case O_ALIAS: alias = optarg; break;
        case O_QUEUE: ok = akv_tool_parse_max("serve", "max-queue", optarg, 1u << 20, &queue); break;
        case 'n': ok = akv_tool_parse_max("serve", "n-predict", optarg, UINT32_MAX, &n_predict); break;
        case O_PROMPT:
            ok = akv_tool_parse_max("serve", "max-prompt-tokens", optarg, UINT32_MAX, &max_prompt);
            break;
        case O_BODY: ok = akv_tool_parse_max("serve", "max-body-bytes", optarg, 1ull << 32, &body); break;
        case O_TIMEOUT: ok = akv_tool_parse_float("serve", "timeout", optarg, 1, 1e7, &timeout); break;
        case O_IDLE: ok = akv_tool_parse_float("serve", "idle-timeout", optarg, 1, 1e6, &idle); break;
        case O_READ: ok = akv_tool_parse_float("serve", "read-timeout", optarg, 1, 1e6, &read); break;
        case O_PER_CLIENT:
            ok = akv_tool_parse_max("serve", "max-connections-per-client", optarg, 65536,
                                    &per_client);
            if (ok && per_client == 0) {
                fprintf(stderr, "akv serve: --max-connections-per-client must be at least 1\n");
                ok = 0;
            }
            break;
        case O_GRACE: ok = akv_tool_parse_float("serve", "grace", optarg, 0, 1e6, &grace); break;
        case O_CONNS: ok = akv_tool_parse_max("serve", "max-connections", optarg, 65536, &conns); break;
        case 'v': p.verbose = 1; break;
        case 'h': serve_help(stdout); return AKV_EXIT_OK;
        default: serve_help(stderr); return AKV_EXIT_USAGE;
        }
        if (!ok) return AKV_EXIT_USAGE;
    }
    if (optind < argc) {
        fprintf(stderr, "akv serve: unexpected argument '%s'\n", argv[optind]);
        return AKV_EXIT_USAGE;
    }
    if ((r = akv_tool_eopts_check("serve", &e)) >= 0) return r;
    if (n_predict == 0 || body == 0 || conns == 0) {
        fprintf(stderr, "akv serve: %s must be at least 1\n",
                n_predict == 0 ? "--n-predict" : body == 0 ? "--max-body-bytes" : "--max-connections");
        return AKV_EXIT_USAGE;
    }
    if (per_client > conns) {
        fprintf(stderr, "akv serve: --max-connections-per-client %llu is more than "
                        "--max-connections %llu\n", per_client, conns);
        return AKV_EXIT_USAGE;
    }
    if (key && !*key) {
        fprintf(stderr, "akv serve: --api-key is empty\n");
        return AKV_EXIT_USAGE;
    }
    struct stat sb;
    if (p.slot_save_path && (stat(p.slot_save_path, &sb) != 0 || !S_ISDIR(sb.st_mode))) {
        fprintf(stderr, "akv serve: --slot-save-path '%s' is not an existing directory\n",
                p.slot_save_path);
        return AKV_EXIT_USAGE;
    }
    if (stat(e.model, &sb) != 0) {
        fprintf(stderr, "akv serve: -m '%s': %s%s\n", e.model, strerror(errno),
                strcmp(e.model, AKV_TOOL_DEFAULT_MODEL) ? "" : " (bash scripts/fetch-model)");
        return AKV_EXIT_FAIL;
    }
    /* the template: a family name (akv_tool_eopts_check knows it), or a file of Jinja source
     * that must be one this server renders: refused now, not at every chat request */
    char *tmpl_text = NULL;
    if (e.tmpl && stat(e.tmpl, &sb) == 0) {
        akv_tok_text t = {0};
        if (!akv_tool_read_input("serve", e.tmpl, 1u << 20, NULL, &t)) {
            akv_tok_text_free(&t);
            return AKV_EXIT_USAGE;
        }
        tmpl_text = strdup(t.bytes ? t.bytes : "");
        akv_tok_text_free(&t);
        akv_chat *probe = NULL;
        akv_chat_params cp = {.template_text = tmpl_text ? tmpl_text : ""};
        if (!tmpl_text || akv_chat_create(&cp, &probe) != AKV_OK) {
            fprintf(stderr, "akv serve: --chat-template '%s': not a template this server "
                            "renders (see above); name the family (chatml, llama3)\n", e.tmpl);
            free(tmpl_text);
            return AKV_EXIT_USAGE;
        }
        akv_chat_destroy(probe);
        p.chat_template_text = tmpl_text;
    } else if (e.tmpl) {
        p.chat_template_name = e.tmpl;
    }
    char name[256];
    if (!alias) { /* the file's name without .gguf */
        const char *b = strrchr(e.model, '/');
        snprintf(name, sizeof name, "%s", b ? b + 1 : e.model);
        size_t n = strlen(name);
        if (n > 5 && !strcmp(name + n - 5, ".gguf")) name[n - 5] = '\0';
        alias = name;
    }
    akv_tool_log_flags(AKV_LOG_INFO);
    akv_status st = akv_tool_open_device(e.device, &p.engine.dev);
    if (st) {
        free(tmpl_text);
        return st == AKV_EINVAL ? AKV_EXIT_USAGE : AKV_EXIT_FAIL;
    }
    if (e.threads) akv_ops_ref_set_threads((int)akv_tool_eopts_threads(&e));
    akv_trace *trace = NULL; /* destroyed after the engine, on every way out from here */
    if ((r = akv_tool_trace_open("serve", &e, &trace)) >= 0) {
        akv_dev_destroy(p.engine.dev);
        free(tmpl_text);
        return r;
    }
    akv_tool_eopts_apply(&e, &p.engine);
    p.engine.trace = trace;
    p.engine.model_path = e.model;
    p.engine.max_context = e.ctx;
    p.engine.max_seqs = e.parallel ? (uint32_t)e.parallel : 4; /* 0: not given */
    p.engine.max_queue = (uint32_t)queue;
    p.port = (uint16_t)port, p.api_key = key, p.model_name = alias;
    p.sample = e.sp;
    p.max_tokens_default = (uint32_t)n_predict, p.max_prompt_tokens = (uint32_t)max_prompt;
    p.max_body_bytes = (size_t)body, p.timeout_s = timeout, p.max_connections = (uint32_t)conns;
    p.max_connections_per_client = (uint32_t)per_client;
    p.settings_namer = akv_tool_http_namer; /* a request's field, else our flag */
    p.idle_timeout_s = idle, p.read_timeout_s = read;
    p.content_specials = e.special_in_content;
    if (pipe(serve_pipe) != 0) {
        fprintf(stderr, "akv serve: pipe: %s\n", strerror(errno));
        akv_dev_destroy(p.engine.dev);
        akv_trace_destroy(trace);
        free(tmpl_text);
        return AKV_EXIT_FAIL;
    }
    struct sigaction sa = {.sa_handler = serve_on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL); /* a closed terminal or a service manager: stop as for TERM */
    signal(SIGPIPE, SIG_IGN); /* a client gone mid-write is an error on that socket only */
    akv_server *s = NULL;
    if ((st = akv_server_start(&p, &s))) {
        fprintf(stderr, "akv serve: %s\n", akv_status_str(st));
        akv_trace_destroy(trace); /* the engine never ran (or is gone with the server) */
        free(tmpl_text);
        return st == AKV_EINVAL ? AKV_EXIT_USAGE : AKV_EXIT_FAIL;
    }
    fprintf(stderr, "akv serve: listening on http://%s:%u (model %s loading)\n",
            p.host ? p.host : "127.0.0.1", (unsigned)akv_server_port(s), alias);
    int rc = AKV_EXIT_OK;
    int sig = 0;
    for (;;) { /* the load, then the signal */
        st = akv_server_wait_ready(s, 0.2);
        if (st != AKV_EBUSY) break;
        if ((sig = serve_next_signal(0))) goto stop;
    }
    if (st == AKV_OK) {
        fprintf(stderr, "akv serve: ready: %s on http://%s:%u\n", alias, p.host ? p.host : "127.0.0.1",
                (unsigned)akv_server_port(s));
        sig = serve_next_signal(-1);
    } else {
        fprintf(stderr, "akv serve: the model did not load (see above); /health says error\n");
        rc = AKV_EXIT_FAIL;
    }
stop:
    /* the listening socket closes now; what runs gets --grace, unless a second signal comes */
    akv_server_shutdown(s);
    if (sig) fprintf(stderr, "akv serve: %s: stopping (in-flight requests get %.0f s; a second "
                             "signal cancels them)\n", strsignal(sig), grace);
    const double until = serve_now() + grace;
    while (akv_server_n_inflight(s) && serve_now() < until) {
        if (serve_next_signal(100)) {
            fprintf(stderr, "akv serve: a second signal: cancelling what runs\n");
            break;
        }
    }
    akv_server_stop(s, 0);
    akv_server_destroy(s); /* the engine with it */
    akv_trace_destroy(trace);
    free(tmpl_text);
    fprintf(stderr, "akv serve: stopped\n");
    return rc;
}
