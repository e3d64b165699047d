/*
 * cmd_fit.c — `akv fit`: the admission arithmetic for a geometry and a configuration, printed
 * with every term (akv_admit_fit / akv_fit_format do the work; this file parses and prints).
 *
 * Exit codes (tools/cmd.h): 0 fits (possibly after shrinking), 2 usage, 3 refused (the message
 * names the flag to change), 1 anything else.
 * With -m FILE the geometry (and the default --max-context, the trained context length) comes
 * from the model's GGUF metadata; explicit flags override it.
 */
#define _GNU_SOURCE
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "akv/admit.h"
#include "akv/gguf.h"
#include "akv/log.h"
#include "akv/model.h"
#include "cmd.h"
#include "settings.h"

static const char fit_usage[] =
    "usage: akv fit (-m MODEL.gguf | --layers N --kv-heads N --head-dim N --max-context TOKENS)\n"
    "               --host-gib N --device-gib N [--parallel N] [--mode refuse|shrink]\n"
    "               [--dtype bf16|f16|f32] [--page-tokens P] [--arena-mib N] [--staging-pages N]\n"
    "\n"
    "Prints the host-pool fit formula with its terms (effective concurrency = min(configured\n"
    "limit, full-length histories the host pool holds, floors the device pool holds)), the\n"
    "pages per context, each context's target/burst/floor and the verdict.\n"
    "\n"
    "  -m, --model PATH    read layers, K/V heads, head dim and the default --max-context\n"
    "                      (the trained context length) from a GGUF file; flags override\n"
    "  --layers N          attention layers with a K/V history\n"
    "  --kv-heads N        K/V heads per layer\n"
    "  --head-dim N        elements per head\n"
    "  --dtype T           K/V element type (default bf16)\n"
    "  --max-context T     tokens of a full-length context (K/M suffixes: 128K = 131072)\n"
    "  --host-gib N        host pool limit, whole GiB (pinned memory)\n"
    "  --device-gib N      device pool size, whole GiB (never automatic)\n"
    "  --parallel N        contexts served at once (default 1; also --concurrency)\n"
    "  --mode M            refuse (default): a configuration that does not fit is an error;\n"
    "                      shrink: lower the concurrency to what fits\n"
    "  --page-tokens P     tokens per page, a power of two (default: pages closest to 256 KiB)\n"
    "  --arena-mib N       host pool arena size (default 256)\n"
    "  --staging-pages N   device pages reserved for staging buffers (default 0)\n"
    "\n"
    "exit codes: 0 fits, 2 usage error, 3 refused (the message names the flag to change)\n"
    ;

/* Parses a value of flag `name` that must fit in [lo, hi]. */
static int fit_parse(const char *name, const char *s, unsigned long long lo, unsigned long long hi,
                     unsigned long long *out) {
    if (!akv_tool_parse_u64("fit", name, s, out)) return 0;
    if (*out < lo || *out > hi) {
        fprintf(stderr, "akv fit: --%s: %llu is out of range [%llu, %llu]\n", name, *out, lo, hi);
        return 0;
    }
    return 1;
}

/* Fills whichever of layers, K/V heads, head dim and context the flags left at 0 from the
 * model's metadata, and prints where the geometry came from. */
static int fit_from_model(const char *path, unsigned long long *layers, unsigned long long *heads,
                          unsigned long long *dim, unsigned long long *ctx) {
    akv_log_set(NULL, NULL, AKV_LOG_ERROR);
    akv_gguf *g = NULL;
    akv_status st = akv_gguf_open(path, &g);
    akv_model_config cfg;
    if (st == AKV_OK) st = akv_model_config_read(g, &cfg);
    /* the weights' bytes as the file stores them (what native storage keeps) and widened */
    uint64_t file_bytes = 0, n_elems = 0;
    for (size_t i = 0; st == AKV_OK && i < akv_gguf_n_tensors(g); i++) {
        const akv_gguf_tensor *t = akv_gguf_tensor_at(g, i);
        file_bytes += t->n_bytes, n_elems += t->n_elems;
    }
    akv_gguf_close(g);
    if (st != AKV_OK) {
        fprintf(stderr, "akv fit: -m %s: %s (see the message above)\n", path, akv_status_str(st));
        return 0;
    }
    if (!*layers) *layers = cfg.n_layers;
    if (!*heads) *heads = cfg.n_kv_heads;
    if (!*dim) *dim = cfg.head_dim;
    if (!*ctx) *ctx = cfg.n_ctx_train;
    printf("model %s: %s, %u layers, %u K/V heads, head dim %u, trained context %u\n", path,
           cfg.arch_name, cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, cfg.n_ctx_train);
    printf("weights: %.1f MiB as the file stores them (--weights native), %.1f MiB widened to "
           "bf16, %.1f MiB to f32; not part of the pools below\n",
           (double)file_bytes / (1 << 20), (double)n_elems * 2 / (1 << 20),
           (double)n_elems * 4 / (1 << 20));
    return 1;
}

int akv_cmd_fit(int argc, char **argv) {
    enum { O_LAYERS = 256, O_HEADS, O_DIM, O_DTYPE, O_CTX, O_HOST, O_DEV, O_CONC, O_MODE,
           O_PAGE, O_ARENA, O_STAGING };
    static const struct option opts[] = {
        {"layers", required_argument, 0, O_LAYERS},   {"kv-heads", required_argument, 0, O_HEADS},
        {"head-dim", required_argument, 0, O_DIM},    {"dtype", required_argument, 0, O_DTYPE},
        {"max-context", required_argument, 0, O_CTX}, {"host-gib", required_argument, 0, O_HOST},
        {"device-gib", required_argument, 0, O_DEV},  {"parallel", required_argument, 0, O_CONC},
        {"mode", required_argument, 0, O_MODE},       {"page-tokens", required_argument, 0, O_PAGE},
        {"arena-mib", required_argument, 0, O_ARENA}, {"staging-pages", required_argument, 0, O_STAGING},
        {"model", required_argument, 0, 'm'},         {"help", no_argument, 0, 'h'},
        {"concurrency", required_argument, 0, O_CONC}, /* the admission's word for --parallel */
        {0, 0, 0, 0}};
    const char *model_path = NULL;
    unsigned long long layers = 0, heads = 0, dim = 0, ctx = 0, host = 0, devg = 0, conc = 1,
                       page = 0, arena_mib = 0, staging = 0;
    akv_dtype dtype = AKV_DTYPE_BF16;
    akv_admit_mode mode = AKV_ADMIT_REFUSE;
    int c, ok = 1;
    optind = 1;
    while (ok && (c = getopt_long(argc, argv, "hm:", opts, NULL)) != -1) {
        switch (c) {
        case 'h': printf("%s", fit_usage); return AKV_EXIT_OK;
        case 'm': model_path = optarg; break;
        case O_LAYERS: ok = fit_parse("layers", optarg, 1, AKV_GEOM_MAX_LAYERS, &layers); break;
        case O_HEADS: ok = fit_parse("kv-heads", optarg, 1, AKV_GEOM_MAX_KV_HEADS, &heads); break;
        case O_DIM: ok = fit_parse("head-dim", optarg, 1, AKV_GEOM_MAX_HEAD_DIM, &dim); break;
        case O_CTX: ok = fit_parse("max-context", optarg, 1, ~0ull, &ctx); break;
        case O_HOST: ok = fit_parse("host-gib", optarg, 1, UINT32_MAX, &host); break;
        case O_DEV: ok = fit_parse("device-gib", optarg, 1, UINT32_MAX, &devg); break;
        case O_CONC: ok = fit_parse("parallel", optarg, 1, UINT32_MAX, &conc); break;
        case O_PAGE: ok = fit_parse("page-tokens", optarg, 1, AKV_GEOM_MAX_PAGE_TOKENS, &page); break;
        case O_ARENA: ok = fit_parse("arena-mib", optarg, 1, 1ull << 20, &arena_mib); break;
        case O_STAGING: ok = fit_parse("staging-pages", optarg, 0, UINT32_MAX, &staging); break;
        case O_DTYPE:
            if (!strcmp(optarg, "bf16")) dtype = AKV_DTYPE_BF16;
            else if (!strcmp(optarg, "f16")) dtype = AKV_DTYPE_F16;
            else if (!strcmp(optarg, "f32")) dtype = AKV_DTYPE_F32;
            else {
                fprintf(stderr, "akv fit: --dtype: '%s' is not bf16, f16 or f32\n", optarg);
                ok = 0;
            }
            break;
        case O_MODE:
            if (!strcmp(optarg, "refuse")) mode = AKV_ADMIT_REFUSE;
            else if (!strcmp(optarg, "shrink")) mode = AKV_ADMIT_SHRINK;
            else {
                fprintf(stderr, "akv fit: --mode: '%s' is not refuse or shrink\n", optarg);
                ok = 0;
            }
            break;
        default: ok = 0; break;
        }
    }
    if (!ok) {
        fprintf(stderr, "(akv fit --help lists the options)\n");
        return AKV_EXIT_USAGE;
    }
    if (optind < argc) {
        fprintf(stderr, "akv fit: unexpected argument '%s'\n", argv[optind]);
        return AKV_EXIT_USAGE;
    }
    if (model_path && !fit_from_model(model_path, &layers, &heads, &dim, &ctx)) return AKV_EXIT_FAIL;
    const struct { const char *flag; unsigned long long v; } required[] = {
        {"--layers", layers},     {"--kv-heads", heads},  {"--head-dim", dim},
        {"--max-context", ctx},   {"--host-gib", host},   {"--device-gib", devg}};
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++) {
        if (required[i].v == 0) {
            fprintf(stderr, "akv fit: %s is required (akv fit --help)\n", required[i].flag);
            return AKV_EXIT_USAGE;
        }
    }
    /* the library's own errors name the setting (by field: said here as the flags) */
    akv_tool_log_flags(AKV_LOG_ERROR);
    akv_admit_params p = {.max_context = ctx,
                          .host_gib = (uint32_t)host,
                          .arena_bytes = (size_t)arena_mib << 20,
                          .device_gib = (uint32_t)devg,
                          .staging_pages = (uint32_t)staging,
                          .concurrency = (uint32_t)conc,
                          .mode = mode};
    if (akv_geom_init(&p.geom, (uint32_t)layers, (uint32_t)heads, (uint32_t)dim, dtype,
                      (uint32_t)page) != AKV_OK) {
        fprintf(stderr, "akv fit: invalid geometry (see the message above)\n");
        return AKV_EXIT_USAGE;
    }
    akv_fit f;
    akv_status st = akv_admit_fit(&p, &f);
    if (st != AKV_OK) {
        fprintf(stderr, "akv fit: %s (see the message above)\n", akv_status_str(st));
        return st == AKV_EINVAL || st == AKV_EOVERFLOW ? AKV_EXIT_USAGE : AKV_EXIT_FAIL;
    }
    char text[4096], said[4096];
    akv_fit_format(&f, text, sizeof text);
    akv_tool_render(text, said, sizeof said);
    fputs(said, stdout);
    if (f.status != AKV_OK) {
        akv_tool_render(f.verdict, said, sizeof said);
        fprintf(stderr, "akv fit: %s\n", said);
        return AKV_EXIT_REFUSED;
    }
    return AKV_EXIT_OK;
}
