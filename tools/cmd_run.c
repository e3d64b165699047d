/* cmd_run.c — `akv run`: generate text from a GGUF model, its K/V history in the memory layer's
 * pages (host copy authoritative, device window through a route). */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "akv/admit.h"
#include "akv/chat.h"
#include "akv/dev_pool.h"
#include "akv/forward.h"
#include "akv/forward_dev.h"
#include "akv/geom.h"
#include "akv/host_pool.h"
#include "akv/model.h"
#include "akv/ops.h"
#include "akv/route.h"
#include "akv/sample.h"
#include "akv/tok.h"
#include "cmd.h"
#include "core/clock.h"

#define RUN_DEFAULT_MODEL "models/SmolLM2-135M-Instruct.Q4_1.gguf"
enum { RUN_MAX_TURNS = 1024 }; /* user turns a --chat conversation holds */

static const char run_usage[] =
    "usage: akv run [-m MODEL.gguf] [-p PROMPT | --chat] [options]\n"
    "\n"
    "Generates text, streaming it to standard output as it is produced. The attention history\n"
    "lives in the memory layer: host pages (the authoritative copy, --host-gib) and a device\n"
    "pool (--device-gib) that the route fills. Progress and the final report go to stderr.\n"
    "\n"
    "options:\n"
    "  -m, --model PATH         GGUF model (default " RUN_DEFAULT_MODEL ")\n"
    "  -p, --prompt TEXT        the prompt; with --chat, the first user message\n"
    "      --chat               render messages with the model's chat template; without -p,\n"
    "                           read user messages from standard input, one per line (a\n"
    "                           conversation holds up to 1024 turns)\n"
    "      --system TEXT        with --chat: a system message (else the template's default)\n"
    "  -n, --n-predict N        tokens to generate per reply (default 128)\n"
    "      --max-context N      the longest history, tokens (default: prompt + n, or the\n"
    "                           model's context length with --chat from standard input)\n"
    "      --device D           where the forward pass runs: auto (default: the GPU when one\n"
    "                           answers, else the CPU), cpu, cuda or cuda:N\n"
    "      --route resident|staged  how the history reaches the attention (default resident):\n"
    "                           resident keeps every page in the device pool; staged keeps\n"
    "                           the window there and stages the rest each step\n"
    "      --window-pages N     staged: window pages per layer, the sink + the newest\n"
    "                           (default 4, at least 2)\n"
    "      --host-gib G         host pool limit, whole GiB (default 1)\n"
    "      --device-gib G       device pool size, whole GiB (default 1)\n"
    "      --kv-dtype T         K/V page element type: bf16 (default), f16 or f32\n"
    "      --chunk N            prefill chunk, tokens (default 256)\n"
    "      --no-graphs          GPU: launch every kernel of a decode step by itself instead of\n"
    "                           replaying the step as one CUDA graph (resident route)\n"
    "      --threads N          CPU threads of the matrix products and the attention (default:\n"
    "                           every core)\n"
    "      --temp T             temperature; 0 = greedy (default 0.8)\n"
    "      --top-k K            (default 40; 0 = off)\n"
    "      --top-p P            (default 0.95; 1 = off)\n"
    "      --min-p P            (default 0.05; 0 = off)\n"
    "      --repeat-penalty R   (default 1 = off)\n"
    "      --repeat-last-n N    tokens the penalty looks back over (default 64)\n"
    "      --seed S             sampler seed (default 0)\n"
    "      --dump-logits FILE   write every step's logits as raw float32 (n_vocab per step)\n"
    "  -q, --quiet              no progress and no report on stderr\n"
    "  -h, --help               this text\n"
    "\n"
    "Generation stops after N tokens, at an end-of-sequence or end-of-turn token, or at any\n"
    "control token (a chat model opening a new turn).\n";

typedef struct run_opts {
    const char *model, *prompt, *system, *device, *dump;
    int chat, quiet, no_graphs;
    unsigned long long n_predict, ctx, host_gib, device_gib, chunk, threads, repeat_last_n, seed;
    unsigned long long window_pages;
    akv_route_kind route;
    akv_dtype kv_dtype;
    akv_sample_params sp;
} run_opts;

/* Everything one run holds, torn down by run_free. */
typedef struct run_state {
    run_opts o;
    akv_model *model;
    const akv_model_config *cfg;
    akv_tok *tok;
    akv_chat *chat;
    akv_dev *dev;
    akv_host_pool *hp;
    akv_dev_pool *dp;
    akv_route *route;
    akv_route_seq *seq;
    akv_forward *fwd;         /* --device cpu: the host pass */
    akv_forward_dev *fwd_dev; /* a device backend: the pass on its queues */
    akv_sampler *sampler;
    FILE *dump;
    float *logits;
    uint64_t n_ctx;
    akv_dev_info dev_info; /* is_host = 0: akv_forward_dev and the queued route */
    /* measurements */
    uint64_t n_prompt, n_gen, n_dec; /* prompt tokens, tokens shown, decode steps run */
    double t_prompt, t_gen, t_first; /* seconds: prefill, decode, start -> first token */
    akv_tok_text fed;                /* chat: the text the context holds so far */
    int32_t unfed;                   /* chat: a reply's last token, in fed but not yet run */
    bool has_unfed;                  /*   through the model (the reply stopped at -n) */
    int load_pct;                    /* last percentage the load progress showed */
} run_state;

/* Bounds in double: a bound like 0.999999 given as a float would be below the same text parsed. */
static int run_parse_float(const char *flag, const char *s, double lo, double hi, float *out) {
    char *end = NULL;
    errno = 0;
    double v = s ? strtod(s, &end) : NAN;
    if (!s || errno || end == s || *end || !(v >= lo && v <= hi)) {
        fprintf(stderr, "akv run: --%s: '%s' is not a number in [%g, %g]\n", flag, s ? s : "", lo, hi);
        return 0;
    }
    *out = (float)v;
    return 1;
}

/* A count that the sampler holds in an int32. */
static int run_parse_i32(const char *flag, const char *s, int32_t *out) {
    unsigned long long v;
    if (!akv_tool_parse_max("run", flag, s, INT32_MAX, &v)) return 0;
    *out = (int32_t)v;
    return 1;
}

/* Returns -1 to go on, else an exit code. */
static int run_parse(int argc, char **argv, run_opts *o) {
    enum {
        O_CHAT = 256,
        O_SYSTEM,
        O_CTX,
        O_DEVICE,
        O_ROUTE,
        O_HOST,
        O_DEVGIB,
        O_KV,
        O_CHUNK,
        O_THREADS,
        O_TEMP,
        O_TOPK,
        O_TOPP,
        O_MINP,
        O_RP,
        O_RLN,
        O_SEED,
        O_DUMP,
        O_WINDOW,
        O_NOGRAPHS
    };
    static const struct option opts[] = {{"model", required_argument, 0, 'm'},
                                         {"prompt", required_argument, 0, 'p'},
                                         {"chat", no_argument, 0, O_CHAT},
                                         {"no-graphs", no_argument, 0, O_NOGRAPHS},
                                         {"system", required_argument, 0, O_SYSTEM},
                                         {"n-predict", required_argument, 0, 'n'},
                                         {"max-context", required_argument, 0, O_CTX},
                                         {"device", required_argument, 0, O_DEVICE},
                                         {"route", required_argument, 0, O_ROUTE},
                                         {"window-pages", required_argument, 0, O_WINDOW},
                                         {"host-gib", required_argument, 0, O_HOST},
                                         {"device-gib", required_argument, 0, O_DEVGIB},
                                         {"kv-dtype", required_argument, 0, O_KV},
                                         {"chunk", required_argument, 0, O_CHUNK},
                                         {"threads", required_argument, 0, O_THREADS},
                                         {"temp", required_argument, 0, O_TEMP},
                                         {"top-k", required_argument, 0, O_TOPK},
                                         {"top-p", required_argument, 0, O_TOPP},
                                         {"min-p", required_argument, 0, O_MINP},
                                         {"repeat-penalty", required_argument, 0, O_RP},
                                         {"repeat-last-n", required_argument, 0, O_RLN},
                                         {"seed", required_argument, 0, O_SEED},
                                         {"dump-logits", required_argument, 0, O_DUMP},
                                         {"quiet", no_argument, 0, 'q'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    memset(o, 0, sizeof *o);
    o->model = RUN_DEFAULT_MODEL, o->device = "auto", o->n_predict = 128, o->host_gib = 1;
    o->device_gib = 1, o->chunk = 256, o->repeat_last_n = 64, o->kv_dtype = AKV_DTYPE_BF16;
    o->window_pages = AKV_ROUTE_WINDOW_PAGES;
    o->route = AKV_ROUTE_RESIDENT;
    o->sp = akv_sample_default_params();
    unsigned long long v;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:p:n:qh", opts, NULL)) != -1) {
        switch (c) {
        case 'm':
            o->model = optarg;
            break;
        case 'p':
            o->prompt = optarg;
            break;
        case O_CHAT:
            o->chat = 1;
            break;
        case O_NOGRAPHS:
            o->no_graphs = 1;
            break;
        case O_SYSTEM:
            o->system = optarg;
            break;
        case 'n':
            if (!akv_tool_parse_u64("run", "n-predict", optarg, &o->n_predict))
                return AKV_EXIT_USAGE;
            break;
        case O_CTX:
            if (!akv_tool_parse_u64("run", "max-context", optarg, &o->ctx)) return AKV_EXIT_USAGE;
            break;
        case O_DEVICE:
            o->device = optarg;
            break;
        case O_ROUTE:
            if (!strcmp(optarg, "resident"))
                o->route = AKV_ROUTE_RESIDENT;
            else if (!strcmp(optarg, "staged"))
                o->route = AKV_ROUTE_STAGED;
            else {
                fprintf(stderr, "akv run: --route '%s': expected resident or staged\n", optarg);
                return AKV_EXIT_USAGE;
            }
            break;
        case O_WINDOW:
            if (!akv_tool_parse_u64("run", "window-pages", optarg, &o->window_pages))
                return AKV_EXIT_USAGE;
            break;
        case O_HOST:
            if (!akv_tool_parse_u64("run", "host-gib", optarg, &o->host_gib)) return AKV_EXIT_USAGE;
            break;
        case O_DEVGIB:
            if (!akv_tool_parse_u64("run", "device-gib", optarg, &o->device_gib))
                return AKV_EXIT_USAGE;
            break;
        case O_KV:
            if (!strcmp(optarg, "bf16"))
                o->kv_dtype = AKV_DTYPE_BF16;
            else if (!strcmp(optarg, "f16"))
                o->kv_dtype = AKV_DTYPE_F16;
            else if (!strcmp(optarg, "f32"))
                o->kv_dtype = AKV_DTYPE_F32;
            else {
                fprintf(stderr, "akv run: --kv-dtype '%s': expected bf16, f16 or f32\n", optarg);
                return AKV_EXIT_USAGE;
            }
            break;
        case O_CHUNK:
            if (!akv_tool_parse_u64("run", "chunk", optarg, &o->chunk)) return AKV_EXIT_USAGE;
            break;
        case O_THREADS:
            if (!akv_tool_parse_u64("run", "threads", optarg, &o->threads)) return AKV_EXIT_USAGE;
            break;
        case O_TEMP:
            if (!run_parse_float("temp", optarg, 0, 1e6, &o->sp.temp)) return AKV_EXIT_USAGE;
            break;
        case O_TOPK:
            if (!run_parse_i32("top-k", optarg, &o->sp.top_k)) return AKV_EXIT_USAGE;
            break;
        case O_TOPP:
            if (!run_parse_float("top-p", optarg, 1e-9, 1, &o->sp.top_p)) return AKV_EXIT_USAGE;
            break;
        case O_MINP:
            if (!run_parse_float("min-p", optarg, 0, 0.999999, &o->sp.min_p))
                return AKV_EXIT_USAGE;
            break;
        case O_RP:
            if (!run_parse_float("repeat-penalty", optarg, 1e-6, 1e6, &o->sp.repeat_penalty))
                return AKV_EXIT_USAGE;
            break;
        case O_RLN:
            if (!run_parse_i32("repeat-last-n", optarg, &o->sp.repeat_last_n)) return AKV_EXIT_USAGE;
            break;
        case O_SEED:
            if (!akv_tool_parse_u64("run", "seed", optarg, &v)) return AKV_EXIT_USAGE;
            o->sp.seed = v;
            break;
        case O_DUMP:
            o->dump = optarg;
            break;
        case 'q':
            o->quiet = 1;
            break;
        case 'h':
            printf("%s", run_usage);
            return AKV_EXIT_OK;
        default:
            fprintf(stderr, "%s", run_usage);
            return AKV_EXIT_USAGE;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "akv run: unexpected argument '%s' (the prompt goes after -p)\n",
                argv[optind]);
        return AKV_EXIT_USAGE;
    }
    if (!o->prompt && !o->chat) {
        fprintf(stderr, "akv run: give a prompt (-p TEXT) or --chat\n");
        return AKV_EXIT_USAGE;
    }
    if (o->system && !o->chat) {
        fprintf(stderr, "akv run: --system needs --chat\n");
        return AKV_EXIT_USAGE;
    }
    const char *bad = o->n_predict == 0 || o->n_predict > (1ull << 32)
                          ? "-n/--n-predict must be 1..4294967296"
                      : o->chunk == 0 || o->chunk > 65536 ? "--chunk must be 1..65536"
                      : o->threads > 1024                 ? "--threads must be at most 1024"
                                                          : NULL;
    if (bad) {
        fprintf(stderr, "akv run: %s\n", bad);
        return AKV_EXIT_USAGE;
    }
    if (o->host_gib == 0 || o->host_gib > AKV_HOST_POOL_MAX_GIB) {
        fprintf(stderr, "akv run: --host-gib must be 1..%u\n", AKV_HOST_POOL_MAX_GIB);
        return AKV_EXIT_USAGE;
    }
    if (o->device_gib == 0 || o->device_gib > AKV_DEV_POOL_MAX_GIB) {
        fprintf(stderr, "akv run: --device-gib must be 1..%u\n", AKV_DEV_POOL_MAX_GIB);
        return AKV_EXIT_USAGE;
    }
    if (o->window_pages < 2 || o->window_pages > UINT32_MAX) {
        fprintf(stderr, "akv run: --window-pages %llu must be in [2, %u]\n", (unsigned long long)o->window_pages,
                UINT32_MAX);
        return AKV_EXIT_USAGE;
    }
    if (o->dump && akv_tool_same_file(o->dump, o->model)) {
        fprintf(stderr, "akv run: --dump-logits '%s' is the model file; write the logits elsewhere\n", o->dump);
        return AKV_EXIT_USAGE;
    }
    return -1;
}

static void run_progress(void *user, uint64_t done, uint64_t total) {
    run_state *s = user;
    int pct = (int)(100.0 * (double)done / (double)total);
    if (s->o.quiet || (pct == s->load_pct && done != total)) return;
    s->load_pct = pct;
    fprintf(stderr, "\rloading %s: %3d%%", s->o.model, pct);
    if (done == total) fputc('\n', stderr);
}

static void run_free(run_state *s) {
    akv_forward_destroy(s->fwd);
    akv_forward_dev_destroy(s->fwd_dev);
    /* the staged route's last leases retire here (destroy never waits) */
    if (s->route && akv_route_sync(s->route) != AKV_OK)
        fprintf(stderr, "akv run: the route's last step did not complete\n");
    if (s->seq && akv_route_seq_close(s->route, s->seq) != AKV_OK)
        fprintf(stderr, "akv run: the sequence could not be closed\n");
    if (akv_route_destroy(s->route) != AKV_OK)
        fprintf(stderr, "akv run: the route could not be released\n");
    if (akv_dev_pool_destroy(s->dp) != AKV_OK)
        fprintf(stderr, "akv run: the device pool could not be released\n");
    if (akv_host_pool_destroy(s->hp) != AKV_OK)
        fprintf(stderr, "akv run: the host pool could not be released\n");
    if (akv_dev_destroy(s->dev) != AKV_OK) fprintf(stderr, "akv run: the device is still busy\n");
    akv_sampler_destroy(s->sampler);
    akv_chat_destroy(s->chat);
    akv_tok_destroy(s->tok);
    akv_model_destroy(s->model);
    if (s->dump && fclose(s->dump) != 0)
        fprintf(stderr, "akv run: --dump-logits: the file could not be completed: %s\n", strerror(errno));
    free(s->logits);
    akv_tok_text_free(&s->fed);
}

/* Model, tokenizer, device, pools, route, forward pass, sampler. Prints what failed. */
static int run_open(run_state *s) {
    const run_opts *o = &s->o;
    akv_status st = akv_tool_open_device(o->device, &s->dev);
    if (st) return st == AKV_EINVAL ? AKV_EXIT_USAGE : AKV_EXIT_FAIL; /* a bad --device is a usage error */
    if ((st = akv_dev_get_info(s->dev, &s->dev_info))) {
        fprintf(stderr, "akv run: --device %s: %s\n", o->device, akv_status_str(st));
        return AKV_EXIT_FAIL;
    }
    if (!s->dev_info.is_host && o->kv_dtype != AKV_DTYPE_BF16) {
        fprintf(stderr, "akv run: --device %s: the CUDA attention reads bf16 K/V pages only\n",
                o->device);
        return AKV_EXIT_FAIL;
    }
    if (o->threads) akv_ops_ref_set_threads((int)o->threads);
    akv_model_load_params lp = {.progress = run_progress, .progress_user = s};
    if ((st = akv_model_load(o->model, &lp, &s->model))) {
        fprintf(stderr, "akv run: cannot load '%s': %s%s\n", o->model, akv_status_str(st),
                st == AKV_EIO ? " (bash scripts/fetch-model fetches the default model)" : "");
        return AKV_EXIT_FAIL;
    }
    s->cfg = akv_model_get_config(s->model);
    if ((st = akv_tok_create_from_gguf(akv_model_gguf(s->model), NULL, &s->tok))) {
        fprintf(stderr, "akv run: the model's tokenizer: %s\n", akv_status_str(st));
        return AKV_EXIT_FAIL;
    }
    if (o->chat && (st = akv_chat_create_from_gguf(akv_model_gguf(s->model), NULL, &s->chat))) {
        fprintf(stderr, "akv run: the model's chat template: %s\n", akv_status_str(st));
        return AKV_EXIT_FAIL;
    }
    return -1;
}

/* The memory layer and the pass, sized for n_ctx tokens. */
static int run_open_memory(run_state *s) {
    const run_opts *o = &s->o;
    const akv_model_config *c = s->cfg;
    akv_geom g;
    akv_status st = akv_geom_init(&g, c->n_layers, c->n_kv_heads, c->head_dim, o->kv_dtype, 0);
    if (st) return AKV_EXIT_FAIL;
    akv_host_pool_params hpp = akv_host_pool_default_params();
    hpp.limit_gib = (uint32_t)o->host_gib;
    akv_dev_pool_params dpp = akv_dev_pool_default_params();
    dpp.device_gib = (uint32_t)o->device_gib;
    if (o->route == AKV_ROUTE_STAGED) {
        /* the staged route's own stage: 2 slots of (max pages - window) pages, from the pool */
        uint32_t win = (uint32_t)o->window_pages;
        dpp.staging_pages = akv_route_staging_pages(&g, s->n_ctx, win, 1);
        akv_dev_pool_stats lay;
        st = akv_dev_pool_layout(&g, &dpp, &lay);
        if (st || lay.window_capacity < win) {
            double mib = (double)dpp.staging_pages * akv_geom_page_bytes(&g) / (1 << 20);
            fprintf(stderr,
                    "akv run: the staged route needs %.0f MiB of staging (2 slots x %u pages "
                    "of %zu KiB for --max-context %llu) plus a window of %u pages x %u layers; "
                    "--device-gib %llu does not hold them: raise --device-gib or lower "
                    "--max-context (or --window-pages)\n",
                    mib, dpp.staging_pages / 2, akv_geom_page_bytes(&g) >> 10,
                    (unsigned long long)s->n_ctx, win, c->n_layers, o->device_gib);
            return AKV_EXIT_REFUSED;
        }
    }
    /* admission: the memory layer's arithmetic for one full-length history */
    akv_admit_params ap = {.geom = g,
                           .max_context = s->n_ctx,
                           .host_gib = hpp.limit_gib,
                           .device_gib = dpp.device_gib,
                           .staging_pages = dpp.staging_pages,
                           .concurrency = 1,
                           .mode = AKV_ADMIT_REFUSE};
    akv_fit fit;
    /* a configuration the arithmetic refuses (logged naming the setting) is a usage error */
    if ((st = akv_admit_fit(&ap, &fit))) return st == AKV_EINVAL || st == AKV_EOVERFLOW ? AKV_EXIT_USAGE : AKV_EXIT_FAIL;
    if (fit.status != AKV_OK) {
        fprintf(stderr, "akv run: %s\n", fit.verdict);
        return AKV_EXIT_REFUSED;
    }
    if ((st = akv_host_pool_create(s->dev, &g, &hpp, &s->hp)) ||
        (st = akv_dev_pool_create(s->dev, &g, &dpp, &s->dp))) {
        fprintf(stderr, "akv run: the memory pools: %s\n", akv_status_str(st));
        return AKV_EXIT_FAIL;
    }
    /* on a device the pass runs on the queues: the route keeps its tables there too */
    akv_route_params rp = {.kind = o->route,
                           .max_tokens = s->n_ctx,
                           .queued = !s->dev_info.is_host,
                           .window_pages = (uint32_t)o->window_pages};
    akv_route_seq_params sqp = {.tag = 1};
    if ((st = akv_route_create(s->dev, s->hp, s->dp, &rp, &s->route)) ||
        (st = akv_route_seq_open(s->route, &sqp, &s->seq))) {
        fprintf(stderr, "akv run: route %s: %s\n", akv_route_kind_name(o->route),
                akv_status_str(st));
        return st == AKV_EINVAL ? AKV_EXIT_REFUSED : AKV_EXIT_FAIL;
    }
    akv_forward_params fp = akv_forward_default_params();
    fp.max_chunk = (uint32_t)o->chunk;
    fp.no_graphs = o->no_graphs ? 1u : 0u;
    fp.threads = (uint32_t)o->threads;
    if (!s->dev_info.is_host && !o->quiet)
        fprintf(stderr, "akv run: uploading the weights to the device as bf16\n");
    if ((st = s->dev_info.is_host ? akv_forward_create(s->model, &fp, &s->fwd)
                                  : akv_forward_dev_create(s->dev, s->model, &fp, &s->fwd_dev)) ||
        (st = akv_sampler_create(&o->sp, (int32_t)c->n_vocab, &s->sampler))) {
        fprintf(stderr, "akv run: %s\n", akv_status_str(st));
        return AKV_EXIT_FAIL;
    }
    s->logits = malloc((size_t)c->n_vocab * sizeof(float));
    if (!s->logits) return AKV_EXIT_FAIL;
    if (o->dump && !(s->dump = fopen(o->dump, "wb"))) {
        fprintf(stderr, "akv run: --dump-logits '%s': %s\n", o->dump, strerror(errno));
        return AKV_EXIT_FAIL;
    }
    if (!o->quiet)
        fprintf(stderr,
                "akv run: on %s (%s); %s, %u layers, K/V %s in pages of %u tokens (%zu KiB); "
                "host pool %llu GiB, device pool %llu GiB, route %s, context %llu\n",
                s->dev_info.is_host ? "the CPU" : "the GPU", s->dev_info.name, c->arch_name,
                c->n_layers,
                akv_dtype_name(g.dtype), g.page_tokens,
                akv_geom_page_bytes(&g) >> 10, o->host_gib, o->device_gib,
                akv_route_kind_name(o->route), (unsigned long long)s->n_ctx);
    return -1;
}

/* Runs tokens through the model at the end of the history; logits of the last one in
 * s->logits (and the dump file). Prefill progress on stderr for long inputs. */
static akv_status run_feed(run_state *s, const int32_t *ids, size_t n) {
    akv_forward_kv kv = akv_route_forward_kv(s->route);
    akv_status st = AKV_OK;
    for (size_t done = 0; done < n && st == AKV_OK;) {
        uint32_t chunk = (uint32_t)(n - done < s->o.chunk ? n - done : s->o.chunk);
        uint64_t pos0 = akv_route_seq_n_tokens(s->seq);
        if (pos0 + chunk > s->n_ctx) {
            fprintf(stderr, "\nakv run: the context is full (%llu tokens; --max-context)\n",
                    (unsigned long long)s->n_ctx);
            return AKV_EFULL;
        }
        akv_route_req rq = {.seq = s->seq, .n_tokens = pos0 + chunk};
        if ((st = akv_route_begin_step(s->route, &rq, 1))) break;
        bool last = done + chunk == n;
        float *want = last ? s->logits : NULL;
        st = s->fwd_dev ? akv_forward_dev_run(s->fwd_dev, ids + done, chunk, (uint32_t)pos0, &kv,
                                              want, false)
                        : akv_forward_run(s->fwd, ids + done, chunk, (uint32_t)pos0, &kv, want,
                                          false);
        if (st) {
            akv_route_abort_step(s->route);
            break;
        }
        done += chunk;
        if (n > s->o.chunk && !s->o.quiet)
            fprintf(stderr, "\rprefill %zu/%zu tokens%s", done, n, done == n ? "\n" : "");
    }
    if (st) {
        fprintf(stderr, "akv run: the forward pass failed: %s\n", akv_status_str(st));
        return st;
    }
    if (s->dump && fwrite(s->logits, sizeof(float), s->cfg->n_vocab, s->dump) != s->cfg->n_vocab) {
        fprintf(stderr, "akv run: --dump-logits: write failed\n");
        return AKV_EIO;
    }
    return AKV_OK;
}

/* One generated token through the model (a decode step), timed and counted. */
static akv_status run_decode_one(run_state *s, int32_t id) {
    double ts = akv_clock_s();
    akv_status st = run_feed(s, &id, 1);
    if (st == AKV_OK) s->t_gen += akv_clock_s() - ts, s->n_dec++;
    return st;
}

/* Whether generation stops at token id. */
static bool run_is_stop(const run_state *s, int32_t id) {
    akv_tok_specials sp = akv_tok_get_specials(s->tok);
    return id == sp.eos_id || id == sp.eot_id ||
           akv_tok_token_type(s->tok, id) == AKV_TOK_TYPE_CONTROL;
}

/* Prefills the prompt ids, then samples and streams up to n_predict tokens. The generated
 * text is appended to *reply when it is not NULL. */
static akv_status run_generate(run_state *s, const akv_tok_ids *prompt, akv_tok_text *reply) {
    double t0 = akv_clock_s();
    for (size_t i = 0; i < prompt->n_ids; i++)
        akv_sampler_accept(s->sampler, prompt->ids[i]);
    akv_status st = run_feed(s, prompt->ids, prompt->n_ids);
    if (st) return st;
    double t1 = akv_clock_s();
    s->t_prompt += t1 - t0;
    s->n_prompt += prompt->n_ids;
    akv_tok_stream stream = {0};
    akv_tok_text out = {0};
    for (uint64_t i = 0; i < s->o.n_predict; i++) {
        int32_t id;
        if ((st = akv_sampler_sample(s->sampler, s->logits, &id))) break;
        if (s->n_gen == 0 && s->t_first == 0) s->t_first = akv_clock_s() - t0;
        if (run_is_stop(s, id)) break;
        akv_sampler_accept(s->sampler, id);
        size_t before = out.n_bytes;
        if ((st = akv_tok_stream_push(s->tok, &stream, id, 0, &out))) break;
        fwrite(out.bytes + before, 1, out.n_bytes - before, stdout);
        fflush(stdout);
        s->n_gen++;
        if (i + 1 == s->o.n_predict) { /* the last token needs no forward pass now */
            s->unfed = id, s->has_unfed = true; /* a next chat turn runs it first */
            break;
        }
        if ((st = run_decode_one(s, id))) break;
    }
    size_t before = out.n_bytes;
    if (st == AKV_OK) st = akv_tok_stream_flush(&stream, &out);
    fwrite(out.bytes + before, 1, out.n_bytes - before, stdout);
    fflush(stdout);
    if (st == AKV_OK && reply) st = akv_tok_text_append(reply, out.bytes, out.n_bytes);
    akv_tok_text_free(&out);
    return st;
}

/* Encodes text (parse_special for chat renderings) into *ids. */
static akv_status run_encode(run_state *s, const char *text, size_t n, bool chat,
                             akv_tok_ids *ids) {
    uint32_t flags = chat ? AKV_TOK_PARSE_SPECIAL : AKV_TOK_ADD_SPECIAL;
    akv_status st = akv_tok_encode(s->tok, text, n, flags, ids);
    if (st) fprintf(stderr, "akv run: cannot encode the prompt: %s\n", akv_status_str(st));
    return st;
}

/* Chat: renders the conversation so far and feeds the part the context does not hold yet
 * (the whole rendering shares its start with what was fed: the previous rendering plus the
 * reply's text). */
static akv_status run_chat_turn(run_state *s, akv_chat_msg *msgs, size_t n_msgs) {
    akv_tok_text r = {0};
    akv_status st = akv_chat_render(s->chat, msgs, n_msgs, true, &r);
    if (st) return st;
    size_t skip = s->fed.n_bytes;
    if (skip > r.n_bytes || (skip && memcmp(r.bytes, s->fed.bytes, skip))) {
        /* e.g. a template that trims the reply: the context would no longer be the text */
        fprintf(stderr, "akv run: the conversation no longer renders as the context holds it; "
                        "start a new one\n");
        akv_tok_text_free(&r);
        return AKV_EUNSUPPORTED;
    }
    akv_tok_ids ids = {0};
    if ((st = run_encode(s, r.bytes + skip, r.n_bytes - skip, true, &ids)) == AKV_OK) {
        akv_tok_text_free(&s->fed);
        st = akv_tok_text_append(&s->fed, r.bytes, r.n_bytes);
        akv_tok_text reply = {0};
        if (st == AKV_OK && s->has_unfed) {
            /* fed holds the previous reply's last token: the context must too */
            if ((st = run_decode_one(s, s->unfed)) == AKV_OK) s->has_unfed = false;
        }
        if (st == AKV_OK) st = run_generate(s, &ids, &reply);
        if (st == AKV_OK) st = akv_tok_text_append(&s->fed, reply.bytes, reply.n_bytes);
        /* the reply becomes the assistant's message of the conversation */
        if (st == AKV_OK) {
            msgs[n_msgs].role = "assistant";
            msgs[n_msgs].content = strdup(reply.bytes ? reply.bytes : "");
            if (!msgs[n_msgs].content) st = AKV_ENOMEM;
        }
        akv_tok_text_free(&reply);
    }
    akv_tok_ids_free(&ids);
    akv_tok_text_free(&r);
    return st;
}

static void run_report(const run_state *s) {
    if (s->o.quiet) return;
    akv_route_stats rs;
    akv_dev_pool_stats ps;
    akv_host_pool_stats hs;
    akv_route_get_stats(s->route, &rs);
    akv_dev_pool_get_stats(s->dp, &ps);
    akv_host_pool_get_stats(s->hp, &hs);
    uint64_t n_dec = s->n_dec;
    fprintf(stderr, "\n\nprompt: %llu tokens in %.3f s (%.1f tok/s)\n",
            (unsigned long long)s->n_prompt, s->t_prompt,
            s->t_prompt > 0 ? (double)s->n_prompt / s->t_prompt : 0);
    fprintf(stderr, "decode: %llu tokens in %.3f s (%.1f tok/s)\n", (unsigned long long)n_dec,
            s->t_gen, s->t_gen > 0 ? (double)n_dec / s->t_gen : 0);
    fprintf(stderr, "time to first token: %.3f s\n", s->t_first);
    uint64_t n_steps_tokens = s->n_prompt + n_dec;
    fprintf(stderr,
            "bytes staged per token: %.0f host->device (%.0f of it non-window pages), %.0f "
            "written back device->host (route %s)\n",
            n_steps_tokens ? (double)rs.h2d_bytes / (double)n_steps_tokens : 0,
            n_steps_tokens ? (double)rs.staged_bytes / (double)n_steps_tokens : 0,
            n_steps_tokens ? (double)rs.d2h_bytes / (double)n_steps_tokens : 0,
            akv_route_kind_name(s->o.route));
    double mib = 1.0 / (1 << 20);
    fprintf(stderr,
            "device pool: %u of %u pages per layer in use (%.1f of %.0f MiB); host pool: "
            "%llu pages, %.1f MiB pinned; history %llu tokens\n",
            ps.window_used, ps.window_capacity,
            (double)ps.window_used * s->cfg->n_layers * (double)ps.page_bytes * mib,
            (double)ps.n_pages * (double)ps.page_bytes * mib, (unsigned long long)hs.n_used,
            (double)hs.pinned_bytes * mib, (unsigned long long)akv_route_seq_n_tokens(s->seq));
    if (s->fwd_dev) {
        akv_forward_dev_stats fs = akv_forward_dev_get_stats(s->fwd_dev);
        fprintf(stderr, "decode steps replayed as graphs: %llu (%llu graph(s) built)\n",
                (unsigned long long)fs.graph_launches, (unsigned long long)fs.graph_builds);
    }
}

int akv_cmd_run(int argc, char **argv) {
    run_state s;
    memset(&s, 0, sizeof s);
    int rc = run_parse(argc, argv, &s.o);
    if (rc >= 0) return rc;
    akv_tok_ids ids = {0};
    akv_chat_msg *msgs = NULL;
    size_t n_msgs = 0;
    if ((rc = run_open(&s)) >= 0) goto done;
    rc = AKV_EXIT_FAIL;

    /* the prompt's tokens decide the default context */
    bool interactive = s.o.chat && !s.o.prompt;
    if (!s.o.chat && run_encode(&s, s.o.prompt, strlen(s.o.prompt), false, &ids)) goto done;
    if (!s.o.chat && ids.n_ids == 0) {
        /* no token, no logits: the first sample would read what no pass wrote */
        fprintf(stderr, "akv run: the prompt is empty (it encodes to no tokens)\n");
        rc = AKV_EXIT_USAGE;
        goto done;
    }
    if (s.o.chat && s.o.prompt) {
        akv_chat_msg m[2] = {{"system", s.o.system ? s.o.system : ""}, {"user", s.o.prompt}};
        akv_tok_text r = {0};
        akv_status st =
            akv_chat_render(s.chat, s.o.system ? m : m + 1, s.o.system ? 2 : 1, true, &r);
        if (st == AKV_OK) st = run_encode(&s, r.bytes, r.n_bytes, true, &ids);
        akv_tok_text_free(&r);
        if (st) goto done;
    }
    s.n_ctx = s.o.ctx ? s.o.ctx : interactive ? s.cfg->n_ctx_train : ids.n_ids + s.o.n_predict;
    if (s.n_ctx > s.cfg->n_ctx_train && !s.o.quiet)
        fprintf(stderr,
                "akv run: warning: --max-context %llu is beyond the model's training context "
                "%u\n",
                (unsigned long long)s.n_ctx, s.cfg->n_ctx_train);
    if (ids.n_ids + (interactive ? 0 : 1) > s.n_ctx) {
        fprintf(stderr, "akv run: the prompt (%zu tokens) does not fit --max-context %llu\n",
                ids.n_ids, (unsigned long long)s.n_ctx);
        rc = AKV_EXIT_REFUSED;
        goto done;
    }
    if ((rc = run_open_memory(&s)) >= 0) goto done;
    rc = AKV_EXIT_FAIL;

    if (!s.o.chat) {
        fputs(s.o.prompt, stdout);
        if (run_generate(&s, &ids, NULL)) goto done;
    } else {
        /* a conversation: [system] (user assistant)* — up to RUN_MAX_TURNS turns */
        msgs = calloc(2 * RUN_MAX_TURNS + 1, sizeof *msgs);
        if (!msgs) goto done;
        if (s.o.system) {
            msgs[n_msgs] = (akv_chat_msg){"system", strdup(s.o.system)};
            if (!msgs[n_msgs++].content) goto done;
        }
        char *line = NULL;
        size_t cap = 0;
        for (;;) {
            const char *user = s.o.prompt;
            if (interactive) {
                fprintf(stderr, "\n> ");
                ssize_t n = getline(&line, &cap, stdin);
                if (n <= 0) break;
                if (line[n - 1] == '\n') line[n - 1] = 0;
                user = line;
            }
            msgs[n_msgs] = (akv_chat_msg){"user", strdup(user)};
            if (!msgs[n_msgs++].content || run_chat_turn(&s, msgs, n_msgs)) {
                free(line);
                goto done;
            }
            n_msgs++;
            if (!interactive) break;
            if (n_msgs + 2 > 2 * RUN_MAX_TURNS + 1) {
                /* the conversation's turns are full: say so, and do not read (and drop) more */
                fprintf(stderr, "\nakv run --chat: the conversation reached its limit of %d turns; "
                                "input after this turn was not read (exit 1)\n", RUN_MAX_TURNS);
                free(line);
                goto done;
            }
            fputc('\n', stdout);
        }
        free(line);
    }
    fputc('\n', stdout);
    run_report(&s);
    rc = AKV_EXIT_OK;
done:
    for (size_t i = 0; i < n_msgs; i++)
        free((void *)msgs[i].content);
    free(msgs);
    akv_tok_ids_free(&ids);
    run_free(&s);
    return rc;
}
