/* engine_opts.c — the engine's command-line options, shared by akv run and akv serve. */
#define _GNU_SOURCE
#include "engine_opts.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "akv/chat.h"
#include "akv/dev_pool.h"
#include "akv/host_pool.h"
#include "akv/route.h"
#include "core/par.h"

const char akv_tool_eopts_help[] =
    "      --chat-template T    the template family (chatml, llama3) or a file of Jinja\n"
    "                           source to recognise (default: the model's)\n"
    "      --special-in-content read control-token texts inside chat message contents as\n"
    "                           control tokens (\"<|im_end|>\" typed by a user then closes\n"
    "                           its turn, as in llama-server and vLLM); default: contents are\n"
    "                           plain text, as OpenAI's API treats them\n"
    "      --device D           where the forward pass runs: auto (default: the GPU when one\n"
    "                           answers, else the CPU), cpu, cuda or cuda:N\n"
    "      --route resident|staged  how the history reaches the attention (default resident):\n"
    "                           resident keeps every page in the device pool; staged keeps\n"
    "                           each sequence's window there and stages the rest each step\n"
    "      --window-pages N     staged: window pages per layer at least, the sink + the newest\n"
    "                           (default 4, at least 2)\n"
    "      --host-gib G         host pool limit, whole GiB (default 1)\n"
    "      --device-gib G       device pool size, whole GiB (default 1)\n"
    "      --kv-dtype T         K/V page element type: bf16 (default), f16 or f32\n"
    "      --weights W          how the weight matrices are kept: native (default: in the\n"
    "                           file's block formats, e.g. Q4_1, where the pass has a product\n"
    "                           for the format), f32 (CPU: widened, for comparison) or bf16\n"
    "                           (GPU: widened)\n"
    "      --chunk N            prompt chunk, tokens (default 256)\n"
    "      --step-tokens N      most tokens a step runs, decodes and chunks together; a prompt\n"
    "                           takes one chunk a step beside decodes, up to this alone (default:\n"
    "                           4096, or --parallel - 1 + --chunk if larger)\n"
    "      --no-graphs          GPU: launch every kernel of a decode step by itself instead of\n"
    "                           replaying the step as one CUDA graph (resident route)\n"
    "      --threads N          CPU threads of the matrix products and the attention (default:\n"
    "                           every core this process may run on, which is also the most)\n"
    "      --temp T             temperature; 0 = greedy (default 0.8)\n"
    "      --top-k K            (default 40; 0 = off)\n"
    "      --top-p P            (default 0.95; 1 = off)\n"
    "      --min-p P            (default 0.05; 0 = off)\n"
    "      --repeat-penalty R   (default 1 = off)\n"
    "      --presence-penalty P subtracted once from each token seen (default 0; -2..2)\n"
    "      --frequency-penalty F subtracted per time a token was seen (default 0; -2..2)\n"
    "      --repeat-last-n N    tokens the penalties look back over (default 64)\n";

void akv_tool_eopts_defaults(akv_tool_eopts *o) {
    memset(o, 0, sizeof *o);
    o->model = AKV_TOOL_DEFAULT_MODEL, o->device = "auto", o->host_gib = 1, o->device_gib = 1;
    o->chunk = 256, o->kv_dtype = AKV_DTYPE_BF16, o->window_pages = AKV_ROUTE_WINDOW_PAGES;
    akv_route_kind_from_name("resident", &o->route); /* the default route */
    o->sp = akv_sample_default_params();
}

int akv_tool_parse_float(const char *cmd, const char *flag, const char *s, double lo, double hi,
                         float *out) {
    char *end = NULL;
    errno = 0;
    double v = s ? strtod(s, &end) : NAN;
    if (!s || errno || end == s || *end || !(v >= lo && v <= hi)) {
        fprintf(stderr, "akv %s: --%s: '%s' is not a number in [%g, %g]\n", cmd, flag,
                s ? s : "", lo, hi);
        return 0;
    }
    *out = (float)v;
    return 1;
}

/* A count that the sampler holds in an int32. */
static int eopts_i32(const char *cmd, const char *flag, const char *s, int32_t *out) {
    unsigned long long v;
    if (!akv_tool_parse_max(cmd, flag, s, INT32_MAX, &v)) return 0;
    *out = (int32_t)v;
    return 1;
}

/* One of n named values: *out = the value named arg, else 0 printed as "expected a, b or c". */
typedef struct eopts_name {
    const char *name;
    int value;
} eopts_name;

static int eopts_choice(const char *cmd, const char *flag, const char *arg, const eopts_name *t,
                        size_t n, int *out) {
    for (size_t i = 0; i < n; i++)
        if (!strcmp(arg, t[i].name)) return (*out = t[i].value), 1;
    fprintf(stderr, "akv %s: --%s '%s': expected ", cmd, flag, arg);
    for (size_t i = 0; i < n; i++)
        fprintf(stderr, "%s%s", i == 0 ? "" : i + 1 == n ? " or " : ", ", t[i].name);
    fputc('\n', stderr);
    return 0;
}

int akv_tool_eopts_parse(const char *cmd, int c, const char *arg, akv_tool_eopts *o) {
    static const eopts_name dtypes[] = {
        {"bf16", AKV_DTYPE_BF16}, {"f16", AKV_DTYPE_F16}, {"f32", AKV_DTYPE_F32}};
    static const eopts_name weights[] = {
        {"native", AKV_WEIGHTS_NATIVE}, {"bf16", AKV_WEIGHTS_BF16}, {"f32", AKV_WEIGHTS_F32}};
    int choice = 0;
    unsigned long long v;
    int ok = 1;
    switch (c) {
    case 'm': o->model = arg; return 1;
    case AKV_OPT_DEVICE: o->device = arg; return 1;
    case AKV_OPT_TMPL: o->tmpl = arg; return 1;
    case AKV_OPT_NOGRAPHS: o->no_graphs = 1; return 1;
    case AKV_OPT_SPECIAL_CONTENT: o->special_in_content = 1; return 1;
    case AKV_OPT_CTX: ok = akv_tool_parse_u64(cmd, "max-context", arg, &o->ctx); break;
    case AKV_OPT_PARALLEL:
        ok = akv_tool_parse_max(cmd, "parallel", arg, AKV_ROUTE_MAX_SEQS, &o->parallel);
        if (ok && o->parallel == 0) {
            fprintf(stderr, "akv %s: --parallel must be at least 1 (sequences run at once)\n",
                    cmd);
            ok = 0;
        }
        break;
    case AKV_OPT_ROUTE:
        if (akv_route_kind_from_name(arg, &o->route) != AKV_OK) {
            fprintf(stderr, "akv %s: --route '%s': expected resident or staged\n", cmd, arg);
            ok = 0;
        }
        break;
    case AKV_OPT_WINDOW: ok = akv_tool_parse_u64(cmd, "window-pages", arg, &o->window_pages); break;
    case AKV_OPT_HOST: ok = akv_tool_parse_u64(cmd, "host-gib", arg, &o->host_gib); break;
    case AKV_OPT_DEVGIB: ok = akv_tool_parse_u64(cmd, "device-gib", arg, &o->device_gib); break;
    case AKV_OPT_KV:
        if ((ok = eopts_choice(cmd, "kv-dtype", arg, dtypes, sizeof dtypes / sizeof *dtypes,
                               &choice)))
            o->kv_dtype = (akv_dtype)choice;
        break;
    case AKV_OPT_WEIGHTS:
        if ((ok = eopts_choice(cmd, "weights", arg, weights, sizeof weights / sizeof *weights,
                               &choice)))
            o->weights = (akv_weights)choice;
        break;
    case AKV_OPT_CHUNK: ok = akv_tool_parse_u64(cmd, "chunk", arg, &o->chunk); break;
    case AKV_OPT_STEP:
        ok = akv_tool_parse_max(cmd, "step-tokens", arg, 1u << 20, &o->step_tokens);
        break;
    case AKV_OPT_THREADS: ok = akv_tool_parse_u64(cmd, "threads", arg, &o->threads); break;
    case AKV_OPT_TEMP: ok = akv_tool_parse_float(cmd, "temp", arg, 0, 1e6, &o->sp.temp); break;
    case AKV_OPT_TOPK: ok = eopts_i32(cmd, "top-k", arg, &o->sp.top_k); break;
    case AKV_OPT_TOPP: ok = akv_tool_parse_float(cmd, "top-p", arg, 1e-9, 1, &o->sp.top_p); break;
    case AKV_OPT_MINP:
        ok = akv_tool_parse_float(cmd, "min-p", arg, 0, 0.999999, &o->sp.min_p);
        break;
    case AKV_OPT_RP:
        ok = akv_tool_parse_float(cmd, "repeat-penalty", arg, 1e-6, 1e6, &o->sp.repeat_penalty);
        break;
    case AKV_OPT_PRES:
        ok = akv_tool_parse_float(cmd, "presence-penalty", arg, -2, 2, &o->sp.presence_penalty);
        break;
    case AKV_OPT_FREQ:
        ok = akv_tool_parse_float(cmd, "frequency-penalty", arg, -2, 2, &o->sp.frequency_penalty);
        break;
    case AKV_OPT_RLN: ok = eopts_i32(cmd, "repeat-last-n", arg, &o->sp.repeat_last_n); break;
    case AKV_OPT_SEED:
        ok = akv_tool_parse_u64(cmd, "seed", arg, &v);
        if (ok) o->sp.seed = v;
        break;
    default: return 0;
    }
    return ok ? 1 : -1;
}

int akv_tool_eopts_check(const char *cmd, const akv_tool_eopts *o) {
    const char *bad = o->chunk == 0 || o->chunk > 65536 ? "--chunk must be 1..65536"
                      : o->threads > 1024                ? "--threads must be at most 1024"
                      : o->ctx == 1 ? "--max-context must be at least 2 (a prompt token and a new "
                                      "one)"
                                    : NULL;
    if (bad) {
        fprintf(stderr, "akv %s: %s\n", cmd, bad);
        return AKV_EXIT_USAGE;
    }
    /* a template is a file of Jinja source or a family's name; anything else is a typo that
     * would leave every chat request refused */
    struct stat sb;
    akv_chat_kind kind;
    if (o->tmpl && stat(o->tmpl, &sb) != 0 && akv_chat_kind_from_name(o->tmpl, &kind)) {
        fprintf(stderr, "akv %s: --chat-template '%s' is neither a file nor a template family "
                        "(chatml|llama3)\n", cmd, o->tmpl);
        return AKV_EXIT_USAGE;
    }
    const uint32_t cores = akv__par_cores();
    if (o->threads > cores)
        fprintf(stderr, "akv %s: --threads %llu is more than the %u CPUs this process may run "
                        "on: using %u (more threads would only wait for a core)\n",
                cmd, o->threads, cores, cores);
    if (o->host_gib == 0 || o->host_gib > AKV_HOST_POOL_MAX_GIB) {
        fprintf(stderr, "akv %s: --host-gib must be 1..%u\n", cmd, AKV_HOST_POOL_MAX_GIB);
        return AKV_EXIT_USAGE;
    }
    if (o->device_gib == 0 || o->device_gib > AKV_DEV_POOL_MAX_GIB) {
        fprintf(stderr, "akv %s: --device-gib must be 1..%u\n", cmd, AKV_DEV_POOL_MAX_GIB);
        return AKV_EXIT_USAGE;
    }
    if (o->window_pages < 2 || o->window_pages > UINT32_MAX) {
        fprintf(stderr, "akv %s: --window-pages %llu must be in [2, %u]\n", cmd, o->window_pages,
                UINT32_MAX);
        return AKV_EXIT_USAGE;
    }
    /* said before the model is read (widening it to f32 first would take the load's time);
     * with --device auto the pass is known only once the device is open: the engine says it */
    if (o->device && !strncmp(o->device, "cuda", 4) && o->weights == AKV_WEIGHTS_F32) {
        fprintf(stderr, "akv %s: --weights f32 runs on the host pass only; the CUDA pass keeps "
                        "weights native or bf16 (--weights native|bf16, or --device cpu)\n",
                cmd);
        return AKV_EXIT_USAGE;
    }
    if (o->device && !strcmp(o->device, "cpu") && o->weights == AKV_WEIGHTS_BF16) {
        fprintf(stderr, "akv %s: --weights bf16 runs on the CUDA pass only; the host pass keeps "
                        "weights native or f32 (--weights native|f32, or --device cuda)\n",
                cmd);
        return AKV_EXIT_USAGE;
    }
    return -1;
}

void akv_tool_eopts_apply(const akv_tool_eopts *o, akv_engine_params *ep) {
    ep->host_gib = (uint32_t)o->host_gib, ep->device_gib = (uint32_t)o->device_gib;
    ep->kv_dtype = o->kv_dtype, ep->weights = o->weights;
    ep->route = o->route, ep->window_pages = (uint32_t)o->window_pages;
    ep->chunk = (uint32_t)o->chunk, ep->step_tokens = (uint32_t)o->step_tokens;
    ep->threads = akv_tool_eopts_threads(o), ep->no_graphs = o->no_graphs != 0;
}

uint32_t akv_tool_eopts_threads(const akv_tool_eopts *o) {
    const uint32_t cores = akv__par_cores();
    return o->threads > cores ? cores : (uint32_t)o->threads;
}
