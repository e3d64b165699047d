/*
 * cmd_gguf.c — `akv gguf info FILE` and `akv gguf synth`.
 *
 *   akv gguf info FILE [--tensors] [--meta]
 *       architecture, hyperparameters, tokenizer, K/V bytes per token, tensors by type
 *       (--tensors: every tensor; --meta: every kv)
 *   akv gguf synth (--shape NAME | --layers N --hidden N ...) -o FILE [--type T] [--seed N]
 *                  [--vocab-from FILE]
 *       a synthetic Llama model with seeded random weights (akv/gguf_synth.h)
 *   akv gguf synth --list
 *   akv gguf slice FILE --layers N -o OUT
 *       the first N layers of a model as a complete GGUF (akv_gguf_write_layer_slice)
 */
#define _GNU_SOURCE
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "akv/gguf.h"
#include "akv/gguf_synth.h"
#include "akv/gguf_writer.h"
#include "cmd.h"

static const char gguf_usage[] =
    "usage: akv gguf info FILE [--tensors] [--meta]\n"
    "       akv gguf synth (--shape NAME | --layers N --hidden N --heads N --ffn N --vocab N)\n"
    "                      -o FILE [options]\n"
    "       akv gguf synth --list\n"
    "       akv gguf slice FILE --layers N -o OUT\n\n"
    "info: architecture, hyperparameters, tokenizer, K/V bytes per token and tensor sizes\n"
    "  --tensors        list every tensor (name, type, extents, bytes, file offset)\n"
    "  --meta           list every metadata key and value (arrays summarised)\n\n"
    "synth: write a Llama- or Qwen3-architecture GGUF with seeded random weights of a real shape\n"
    "  --shape NAME     a preset (--list shows them); the flags below override its fields\n"
    "  --layers N --hidden N --heads N --kv-heads N --head-dim N --ffn N --vocab N --ctx N\n"
    "  --rope-theta F --rms-eps F --tied | --untied --arch llama|qwen3\n"
    "                   shape fields (kv-heads defaults to heads, head-dim to hidden/heads,\n"
    "                   ctx to 4096, rope-theta to 10000, rms-eps to 1e-5, untied, llama;\n"
    "                   qwen3: each layer's Q and K heads RMS-normalised)\n"
    "  --type T         matrices' encoding: bf16 (default), f16, f32, q8_0, q4_0, q4_1,\n"
    "                   q4_K, q5_K, q6_K (the K types need rows that are multiples of 256)\n"
    "  --seed N         weight stream (default 1)\n"
    "  --vocab-from F   copy the tokenizer (tokenizer.* keys) of GGUF file F; its token\n"
    "                   count becomes the vocabulary size\n"
    "  -o, --output F   the file to write (written as F.partial, renamed when complete)\n";

/* ---- info -------------------------------------------------------------------------------- */

/* A u32 hyperparameter "<arch>.<suffix>", 0 when absent. */
static uint32_t arch_u32(const akv_gguf *g, const char *arch, const char *suffix) {
    char key[160];
    uint32_t v = 0;
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    return akv_gguf_get_u32(g, key, &v) == AKV_OK ? v : 0;
}

static float arch_f32(const akv_gguf *g, const char *arch, const char *suffix) {
    char key[160];
    float v = 0;
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    return akv_gguf_get_f32(g, key, &v) == AKV_OK ? v : 0;
}

static void print_bytes(double n) {
    const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (n >= 1024 && u < 4) n /= 1024, u++;
    printf(u ? "%.1f %s" : "%.0f %s", n, unit[u]);
}

static void print_value(const akv_gguf *g, size_t idx) {
    akv_gguf_value v = akv_gguf_kv_value(g, idx);
    switch (v.type) {
    case AKV_GGUF_VTYPE_STRING:
        if (v.as.str.len > 120 || memchr(v.as.str.ptr, '\n', v.as.str.len))
            printf("string of %zu bytes", v.as.str.len);
        else
            printf("\"%.*s\"", (int)v.as.str.len, v.as.str.ptr);
        break;
    case AKV_GGUF_VTYPE_ARRAY: {
        printf("[%" PRIu64 " x %s]", v.as.arr.n, akv_gguf_vtype_name(v.as.arr.type));
        for (uint64_t i = 0; i < v.as.arr.n && i < 4; i++) {
            if (v.as.arr.type == AKV_GGUF_VTYPE_STRING) {
                akv_gguf_str s = akv_gguf_arr_str(g, &v.as.arr, i);
                printf(" \"%.*s\"", (int)(s.len > 24 ? 24 : s.len), s.ptr);
            } else if (v.as.arr.type == AKV_GGUF_VTYPE_F32 || v.as.arr.type == AKV_GGUF_VTYPE_F64) {
                printf(" %g", akv_gguf_arr_float(&v.as.arr, i));
            } else {
                printf(" %" PRId64, akv_gguf_arr_int(&v.as.arr, i));
            }
        }
        if (v.as.arr.n > 4) printf(" ...");
        break;
    }
    case AKV_GGUF_VTYPE_F32:
    case AKV_GGUF_VTYPE_F64: printf("%g", v.as.f); break;
    case AKV_GGUF_VTYPE_BOOL: printf("%s", v.as.b ? "true" : "false"); break;
    case AKV_GGUF_VTYPE_I8:
    case AKV_GGUF_VTYPE_I16:
    case AKV_GGUF_VTYPE_I32:
    case AKV_GGUF_VTYPE_I64: printf("%" PRId64, v.as.i); break;
    default: printf("%" PRIu64, v.as.u); break;
    }
}

static void info_summary(const akv_gguf *g) {
    akv_gguf_str arch = {"?", 1}, name = {"", 0};
    akv_gguf_get_str(g, "general.architecture", &arch);
    akv_gguf_get_str(g, "general.name", &name);
    char a[64];
    snprintf(a, sizeof a, "%.*s", (int)arch.len, arch.ptr);
    printf("architecture  %s  \"%.*s\"\n", a, (int)name.len, name.ptr);
    uint32_t n_layers = arch_u32(g, a, "block_count"), n_embd = arch_u32(g, a, "embedding_length");
    uint32_t n_heads = arch_u32(g, a, "attention.head_count");
    uint32_t n_kv = arch_u32(g, a, "attention.head_count_kv");
    uint32_t head_dim = arch_u32(g, a, "attention.key_length");
    if (!n_kv) n_kv = n_heads; /* no GQA key: one K/V head per query head */
    if (!head_dim && n_heads) head_dim = n_embd / n_heads;
    uint32_t n_vocab = arch_u32(g, a, "vocab_size");
    akv_gguf_arr tokens = {0}, merges = {0};
    bool have_tokens = akv_gguf_get_arr(g, "tokenizer.ggml.tokens", &tokens) == AKV_OK;
    if (!n_vocab && have_tokens) n_vocab = (uint32_t)tokens.n;
    printf("layers %u  hidden %u  heads %u  kv heads %u  head dim %u  ffn %u  vocab %u  "
           "context %u\n",
           n_layers, n_embd, n_heads, n_kv, head_dim, arch_u32(g, a, "feed_forward_length"),
           n_vocab, arch_u32(g, a, "context_length"));
    printf("rope theta %g  rope dims %u  rms eps %g\n", arch_f32(g, a, "rope.freq_base"),
           arch_u32(g, a, "rope.dimension_count"),
           arch_f32(g, a, "attention.layer_norm_rms_epsilon"));
    akv_gguf_str tok_model = {"(none)", 6}, tok_pre = {"", 0};
    akv_gguf_get_str(g, "tokenizer.ggml.model", &tok_model);
    akv_gguf_get_str(g, "tokenizer.ggml.pre", &tok_pre);
    bool have_merges = akv_gguf_get_arr(g, "tokenizer.ggml.merges", &merges) == AKV_OK;
    size_t idx;
    printf("tokenizer  %.*s%s%.*s%s  %" PRIu64 " tokens  %" PRIu64 " merges  chat template %s\n",
           (int)tok_model.len, tok_model.ptr, tok_pre.len ? " (pre " : "", (int)tok_pre.len,
           tok_pre.ptr, tok_pre.len ? ")" : "", have_tokens ? tokens.n : 0,
           have_merges ? merges.n : 0,
           akv_gguf_find_kv(g, "tokenizer.chat_template", &idx) == AKV_OK ? "yes" : "no");
    /* K and V, every layer, every K/V head, bf16. */
    uint64_t kv_bytes = 2ull * n_layers * n_kv * head_dim * 2;
    printf("K/V per token  2 x %u layers x %u kv heads x %u dims x 2 bytes (bf16) = %" PRIu64
           " bytes (",
           n_layers, n_kv, head_dim, kv_bytes);
    print_bytes((double)kv_bytes);
    uint32_t n_ctx = arch_u32(g, a, "context_length");
    if (n_ctx) {
        printf("); %u tokens: ", n_ctx);
        print_bytes((double)kv_bytes * n_ctx);
    }
    printf(")\n");
}

static void info_types(const akv_gguf *g) {
    uint64_t count[AKV_GGUF_TYPE_COUNT] = {0}, elems[AKV_GGUF_TYPE_COUNT] = {0},
             bytes[AKV_GGUF_TYPE_COUNT] = {0}, all_elems = 0, all_bytes = 0;
    for (size_t i = 0; i < akv_gguf_n_tensors(g); i++) {
        const akv_gguf_tensor *t = akv_gguf_tensor_at(g, i);
        count[t->type]++, elems[t->type] += t->n_elems, bytes[t->type] += t->n_bytes;
        all_elems += t->n_elems, all_bytes += t->n_bytes;
    }
    printf("tensors by type:\n  %-8s %7s %15s %15s  %s\n", "type", "count", "elements", "bytes",
           "bits/weight");
    for (uint32_t t = 0; t < AKV_GGUF_TYPE_COUNT; t++)
        if (count[t])
            printf("  %-8s %7" PRIu64 " %15" PRIu64 " %15" PRIu64 "  %.2f\n", akv_gguf_type_name(t),
                   count[t], elems[t], bytes[t], elems[t] ? 8.0 * bytes[t] / elems[t] : 0);
    printf("  %-8s %7zu %15" PRIu64 " %15" PRIu64 "  %.2f\n", "total", akv_gguf_n_tensors(g),
           all_elems, all_bytes, all_elems ? 8.0 * all_bytes / all_elems : 0);
}

static void info_tensors(const akv_gguf *g) {
    printf("%-32s %-6s %-24s %12s %12s\n", "tensor", "type", "ne", "bytes", "offset");
    for (size_t i = 0; i < akv_gguf_n_tensors(g); i++) {
        const akv_gguf_tensor *t = akv_gguf_tensor_at(g, i);
        char ne[64];
        int n = 0;
        for (uint32_t d = 0; d < t->n_dims; d++)
            n += snprintf(ne + n, sizeof ne - (size_t)n, d ? " x %" PRIu64 : "%" PRIu64, t->ne[d]);
        printf("%-32s %-6s %-24s %12" PRIu64 " %12" PRIu64 "\n", t->name,
               akv_gguf_type_name(t->type), ne, t->n_bytes, t->offset);
    }
}

static int gguf_info(int argc, char **argv) {
    static const struct option opts[] = {{"tensors", no_argument, 0, 't'},
                                         {"meta", no_argument, 0, 'm'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    int c, show_tensors = 0, show_meta = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        if (c == 't') show_tensors = 1;
        else if (c == 'm') show_meta = 1;
        else if (c == 'h') return printf("%s", gguf_usage), AKV_EXIT_OK;
        else return fprintf(stderr, "%s", gguf_usage), AKV_EXIT_USAGE;
    }
    if (optind != argc - 1) {
        fprintf(stderr, "akv gguf info: expected one FILE\n%s", gguf_usage);
        return AKV_EXIT_USAGE;
    }
    const char *path = argv[optind];
    akv_gguf *g = NULL;
    akv_status st = akv_gguf_open(path, &g);
    if (st) {
        fprintf(stderr, "akv gguf info: %s: %s\n", path, akv_status_str(st));
        return AKV_EXIT_FAIL;
    }
    printf("file  %s  (", path);
    print_bytes((double)akv_gguf_file_bytes(g));
    printf(", GGUF v%u, alignment %zu, %zu kv, %zu tensors)\n", akv_gguf_version(g),
           akv_gguf_alignment(g), akv_gguf_n_kv(g), akv_gguf_n_tensors(g));
    info_summary(g);
    info_types(g);
    if (show_meta) {
        printf("metadata:\n");
        for (size_t i = 0; i < akv_gguf_n_kv(g); i++) {
            printf("  %-44s ", akv_gguf_kv_key(g, i));
            print_value(g, i);
            printf("\n");
        }
    }
    if (show_tensors) info_tensors(g);
    akv_gguf_close(g);
    return AKV_EXIT_OK;
}

/* ---- synth ------------------------------------------------------------------------------- */

typedef struct synth_progress {
    double t0, last;
} synth_progress;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void on_progress(void *user, const char *tensor, size_t idx, size_t n_tensors,
                        uint64_t done, uint64_t total) {
    synth_progress *p = user;
    double t = now_s();
    if (t - p->last < 0.5 && done != total) return;
    p->last = t;
    fprintf(stderr, "\rsynth: tensor %zu/%zu %-28s %6.2f / %.2f GB (%3.0f%%) %6.0f MB/s", idx + 1,
            n_tensors, tensor, done / 1e9, total / 1e9, total ? 100.0 * done / total : 100.0,
            done / 1e6 / (t - p->t0 + 1e-9));
    if (done == total) fprintf(stderr, "\n");
}

static int parse_u32(const char *flag, const char *s, uint32_t *out) {
    unsigned long long v;
    if (!akv_tool_parse_max("gguf synth", flag, s, UINT32_MAX, &v)) return 0;
    *out = (uint32_t)v;
    return 1;
}

static int parse_f32(const char *flag, const char *s, float *out) {
    char *end = NULL;
    float v = strtof(s, &end);
    if (!*s || *end || !(v > 0) || isinf(v)) {
        fprintf(stderr, "akv gguf synth: --%s: '%s' is not a finite positive number\n", flag, s);
        return 0;
    }
    *out = v;
    return 1;
}

static int gguf_synth(int argc, char **argv) {
    enum { O_LAYERS = 256, O_HIDDEN, O_HEADS, O_KV, O_HEAD_DIM, O_FFN, O_VOCAB, O_CTX, O_THETA,
           O_EPS, O_TIED, O_UNTIED, O_SEED, O_TYPE, O_VOCAB_FROM, O_LIST, O_SHAPE, O_ARCH };
    static const struct option opts[] = {
        {"shape", required_argument, 0, O_SHAPE},     {"layers", required_argument, 0, O_LAYERS},
        {"hidden", required_argument, 0, O_HIDDEN},   {"heads", required_argument, 0, O_HEADS},
        {"kv-heads", required_argument, 0, O_KV},     {"head-dim", required_argument, 0, O_HEAD_DIM},
        {"ffn", required_argument, 0, O_FFN},         {"vocab", required_argument, 0, O_VOCAB},
        {"ctx", required_argument, 0, O_CTX},         {"rope-theta", required_argument, 0, O_THETA},
        {"rms-eps", required_argument, 0, O_EPS},     {"tied", no_argument, 0, O_TIED},
        {"untied", no_argument, 0, O_UNTIED},         {"seed", required_argument, 0, O_SEED},
        {"type", required_argument, 0, O_TYPE},       {"vocab-from", required_argument, 0, O_VOCAB_FROM},
        {"output", required_argument, 0, 'o'},        {"list", no_argument, 0, O_LIST},
        {"arch", required_argument, 0, O_ARCH},       {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0}};
    akv_gguf_synth_params p = {.type = AKV_GGUF_TYPE_BF16, .seed = 1};
    akv_gguf_synth_shape *s = &p.shape;
    const char *out = NULL, *vocab_from = NULL, *shape = NULL;
    bool head_dim_set = false, kv_set = false;
    /* A custom shape starts from these defaults; a preset replaces them. */
    *s = (akv_gguf_synth_shape){.name = "custom", .n_ctx = 4096, .rope_theta = 10000.0f,
                                .rms_eps = 1e-5f};
    /* The preset goes first so that the other flags override it wherever they stand. */
    for (int i = 1; i < argc - 1; i++)
        if (!strcmp(argv[i], "--shape")) shape = argv[i + 1];
    for (int i = 1; i < argc; i++)
        if (!strncmp(argv[i], "--shape=", 8)) shape = argv[i] + 8;
    if (shape && akv_gguf_synth_find_preset(shape, s) != AKV_OK) {
        fprintf(stderr, "akv gguf synth: --shape: no preset '%s' (--list shows them)\n", shape);
        return AKV_EXIT_USAGE;
    }
    head_dim_set = kv_set = shape != NULL;
    int c, ok = 1;
    bool list = false;
    unsigned long long seed;
    optind = 1;
    while (ok && (c = getopt_long(argc, argv, "o:h", opts, NULL)) != -1) {
        switch (c) {
        case O_SHAPE:
            /* applied above, before the other flags: only the spelled-out flag is seen there */
            if (!shape || strcmp(optarg, shape) != 0) {
                fprintf(stderr, "akv gguf synth: --shape: spell the flag out as --shape NAME (or "
                                "--shape=NAME), once\n");
                ok = 0;
            }
            break;
        case O_LAYERS: ok = parse_u32("layers", optarg, &s->n_layers); break;
        case O_HIDDEN: ok = parse_u32("hidden", optarg, &s->n_embd); break;
        case O_HEADS: ok = parse_u32("heads", optarg, &s->n_heads); break;
        case O_KV: ok = parse_u32("kv-heads", optarg, &s->n_kv_heads), kv_set = true; break;
        case O_HEAD_DIM: ok = parse_u32("head-dim", optarg, &s->head_dim), head_dim_set = true; break;
        case O_FFN: ok = parse_u32("ffn", optarg, &s->n_ff); break;
        case O_VOCAB: ok = parse_u32("vocab", optarg, &s->n_vocab); break;
        case O_CTX: ok = parse_u32("ctx", optarg, &s->n_ctx); break;
        case O_THETA: ok = parse_f32("rope-theta", optarg, &s->rope_theta); break;
        case O_EPS: ok = parse_f32("rms-eps", optarg, &s->rms_eps); break;
        case O_TIED: s->tied = true; break;
        case O_UNTIED: s->tied = false; break;
        case O_ARCH:
            if (strcmp(optarg, "llama") && strcmp(optarg, "qwen3")) {
                fprintf(stderr, "akv gguf synth: --arch: '%s' is not one of llama, qwen3\n", optarg);
                ok = 0;
            }
            s->qk_norm = !strcmp(optarg, "qwen3");
            break;
        case O_SEED:
            ok = akv_tool_parse_u64("gguf synth", "seed", optarg, &seed);
            p.seed = seed;
            break;
        case O_TYPE:
            if (akv_gguf_type_from_name(optarg, &p.type) != AKV_OK) {
                fprintf(stderr, "akv gguf synth: --type: unknown type '%s'\n", optarg);
                ok = 0;
            }
            break;
        case O_VOCAB_FROM: vocab_from = optarg; break;
        case 'o': out = optarg; break;
        case O_LIST: list = true; break;
        case 'h': return printf("%s", gguf_usage), AKV_EXIT_OK;
        default: ok = 0;
        }
    }
    if (!ok) return fprintf(stderr, "%s", gguf_usage), AKV_EXIT_USAGE;
    if (list) { /* after every flag was read: a bad one is still an error */
        if (optind != argc) {
            fprintf(stderr, "akv gguf synth: unexpected argument '%s'\n", argv[optind]);
            return AKV_EXIT_USAGE;
        }
        printf("%-14s %6s %7s %7s %6s %9s %9s %7s %8s %8s %6s\n", "preset", "arch", "layers", "hidden",
               "heads", "kv heads", "head dim", "ffn", "vocab", "context", "tied");
        for (size_t i = 0; i < akv_gguf_synth_n_presets(); i++) {
            const akv_gguf_synth_shape *q = akv_gguf_synth_preset(i);
            printf("%-14s %6s %7u %7u %6u %9u %9u %7u %8u %8u %6s\n", q->name,
                   akv_gguf_synth_arch(q), q->n_layers, q->n_embd,
                   q->n_heads, q->n_kv_heads, q->head_dim, q->n_ff, q->n_vocab, q->n_ctx,
                   q->tied ? "yes" : "no");
        }
        return AKV_EXIT_OK;
    }
    if (optind != argc) {
        fprintf(stderr, "akv gguf synth: unexpected argument '%s'\n%s", argv[optind], gguf_usage);
        return AKV_EXIT_USAGE;
    }
    if (!out) {
        fprintf(stderr, "akv gguf synth: -o FILE is required\n%s", gguf_usage);
        return AKV_EXIT_USAGE;
    }
    if (!kv_set) s->n_kv_heads = s->n_heads;
    if (!head_dim_set && s->n_heads) s->head_dim = s->n_embd / s->n_heads;
    akv_gguf *vocab = NULL;
    if (vocab_from) {
        akv_status st = akv_gguf_open(vocab_from, &vocab);
        if (st) {
            fprintf(stderr, "akv gguf synth: --vocab-from %s: %s\n", vocab_from, akv_status_str(st));
            return AKV_EXIT_FAIL;
        }
        p.vocab_from = vocab;
    } else if (!s->n_vocab) {
        fprintf(stderr, "akv gguf synth: give --vocab N, --vocab-from FILE or a --shape\n");
        return AKV_EXIT_USAGE;
    }
    synth_progress prog = {now_s(), 0};
    p.progress = on_progress;
    p.progress_user = &prog;
    akv_tool_partial_guard(out);
    akv_status st = akv_gguf_synth_write(&p, out);
    akv_tool_partial_guard(NULL);
    akv_gguf_close(vocab);
    if (st == AKV_EINVAL) return AKV_EXIT_USAGE; /* the shape: the log line names the field */
    if (st) {
        fprintf(stderr, "akv gguf synth: writing %s failed: %s\n", out, akv_status_str(st));
        return AKV_EXIT_FAIL;
    }
    fprintf(stderr, "synth: wrote %s in %.1f s\n", out, now_s() - prog.t0);
    return AKV_EXIT_OK;
}

/* akv gguf slice FILE --layers N -o OUT */
static int gguf_slice(int argc, char **argv) {
    static const struct option opts[] = {{"layers", required_argument, 0, 'l'},
                                         {"output", required_argument, 0, 'o'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    const char *out = NULL;
    unsigned long long n_layers = 0;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "o:h", opts, NULL)) != -1) {
        switch (c) {
        case 'l':
            if (!akv_tool_parse_u64("gguf slice", "layers", optarg, &n_layers)) return AKV_EXIT_USAGE;
            break;
        case 'o': out = optarg; break;
        case 'h': return printf("%s", gguf_usage), AKV_EXIT_OK;
        default: return AKV_EXIT_USAGE;
        }
    }
    if (optind + 1 != argc || !out || n_layers == 0 || n_layers > UINT32_MAX) {
        fprintf(stderr, "usage: akv gguf slice FILE --layers N -o OUT (N >= 1)\n");
        return AKV_EXIT_USAGE;
    }
    if (akv_tool_same_file(argv[optind], out)) {
        fprintf(stderr, "akv gguf slice: -o '%s' is the input file; write the slice elsewhere\n", out);
        return AKV_EXIT_USAGE;
    }
    akv_gguf *g = NULL;
    akv_status st = akv_gguf_open(argv[optind], &g);
    if (st == AKV_OK) {
        akv_tool_partial_guard(out);
        st = akv_gguf_write_layer_slice(g, (uint32_t)n_layers, out);
        akv_tool_partial_guard(NULL);
    }
    akv_gguf_close(g);
    if (st) {
        fprintf(stderr, "akv gguf slice: %s -> %s: %s (see the message above)\n", argv[optind], out,
                akv_status_str(st));
        return st == AKV_EINVAL ? AKV_EXIT_USAGE : AKV_EXIT_FAIL;
    }
    fprintf(stderr, "slice: wrote the first %llu layers of %s to %s\n", n_layers, argv[optind], out);
    return AKV_EXIT_OK;
}

int akv_cmd_gguf(int argc, char **argv) {
    if (argc < 2) return fprintf(stderr, "%s", gguf_usage), AKV_EXIT_USAGE;
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))
        return printf("%s", gguf_usage), AKV_EXIT_OK;
    if (!strcmp(argv[1], "info")) return gguf_info(argc - 1, argv + 1);
    if (!strcmp(argv[1], "synth")) return gguf_synth(argc - 1, argv + 1);
    if (!strcmp(argv[1], "slice")) return gguf_slice(argc - 1, argv + 1);
    fprintf(stderr, "akv gguf: unknown subcommand '%s'\n%s", argv[1], gguf_usage);
    return AKV_EXIT_USAGE;
}
