/* cmd_tok.c — `akv tok`: a GGUF's tokenizer on the command line. */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "akv/chat.h"
#include "akv/gguf.h"
#include "akv/tok.h"
#include "cmd.h"
#include "core/clock.h"

static const char tok_usage[] =
    "usage: akv tok MODEL.gguf [options] [TEXT...]\n"
    "\n"
    "Encodes TEXT (the arguments joined by spaces) with the model's tokenizer and prints one\n"
    "line per token: its position, its id and its piece (C-escaped: \\n, \\t, \\xNN for bytes\n"
    "that are not printable UTF-8), then the count.\n"
    "\n"
    "options:\n"
    "  -f, --file PATH      encode the contents of PATH instead ('-' = standard input)\n"
    "      --max-input-bytes N  the most bytes --file may hold (default 64M)\n"
    "      --no-special     do not match control-token texts such as <|im_start|> in the text\n"
    "      --no-bos         do not add BOS/EOS even where the model asks for them\n"
    "      --ids            print only the ids, on one line\n"
    "      --decode         the arguments are ids: print the text they decode to\n"
    "      --chat           the arguments are messages ROLE:CONTENT; render them with the\n"
    "                       model's chat template (plus the generation prompt), print the\n"
    "                       text, then encode it\n"
    "      --pre NAME       pre-tokenizer instead of tokenizer.ggml.pre: gpt2, smollm or\n"
    "                       llama-bpe\n"
    "      --template NAME  chat template family rendered in C, chatml or llama3 (default:\n"
    "                       tokenizer.chat_template itself, run as Jinja)\n"
    "      --stats          print the count and the encode throughput instead of the tokens\n"
    "      --repeat N       with --stats: encode N times and report the best (default 3)\n"
    "  -h, --help           this text\n";

/* Prints piece bytes C-escaped: printable ASCII and well-formed non-ASCII UTF-8 as they are. */
static void tok_print_escaped(FILE *f, const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint8_t c = p[i];
        if (c == '\n')
            fputs("\\n", f);
        else if (c == '\t')
            fputs("\\t", f);
        else if (c == '\r')
            fputs("\\r", f);
        else if (c == '\\')
            fputs("\\\\", f);
        else if (c >= 0x20 && c < 0x7F)
            fputc(c, f);
        else {
            /* A complete multi-byte character stays whole; anything else is \xNN. */
            size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 ? 2 : 0;
            bool ok = len > 0 && i + len <= n;
            for (size_t k = 1; ok && k < len; k++)
                ok = (p[i + k] & 0xC0) == 0x80;
            if (ok) {
                fwrite(p + i, 1, len, f);
                i += len - 1;
            } else {
                fprintf(f, "\\x%02X", c);
            }
        }
    }
}

/* Joins argv[from..argc) with spaces into *out. */
static int tok_join_args(int argc, char **argv, int from, akv_tok_text *out) {
    for (int i = from; i < argc; i++) {
        if ((i > from && akv_tok_text_append(out, " ", 1)) ||
            akv_tok_text_append(out, argv[i], strlen(argv[i])))
            return 0;
    }
    return akv_tok_text_append(out, NULL, 0) == AKV_OK;
}

/* Renders ROLE:CONTENT arguments with the chat template: AKV_EXIT_OK, AKV_EXIT_USAGE for an
 * argument that is not ROLE:CONTENT, else AKV_EXIT_FAIL. */
static int tok_render_chat(const akv_gguf *g, const char *name, int argc, char **argv, int from,
                           akv_tok_text *text,
                           akv_tok_spans *contents) {
    akv_chat *chat = NULL;
    akv_status st = akv_chat_create_from_gguf(g, name, &chat);
    if (st) {
        fprintf(stderr, "akv tok: no chat template: %s%s\n", akv_status_str(st),
                st == AKV_EUNSUPPORTED ? " (use --template chatml or --template llama3)" : "");
        return AKV_EXIT_FAIL;
    }
    int n = argc - from, ok = 1, rc = AKV_EXIT_FAIL;
    akv_chat_msg *msgs = calloc(n > 0 ? (size_t)n : 1, sizeof *msgs);
    char **roles = calloc(n > 0 ? (size_t)n : 1, sizeof *roles);
    for (int i = 0; ok && msgs && roles && i < n; i++) {
        const char *colon = strchr(argv[from + i], ':');
        if (!colon || colon == argv[from + i]) {
            fprintf(stderr, "akv tok: --chat: '%s' is not ROLE:CONTENT\n", argv[from + i]);
            ok = 0;
            rc = AKV_EXIT_USAGE;
            break;
        }
        roles[i] = strndup(argv[from + i], (size_t)(colon - argv[from + i]));
        msgs[i] = (akv_chat_msg){roles[i], colon + 1};
        ok = roles[i] != NULL;
    }
    if (ok && (!msgs || !roles || akv_chat_render(chat, msgs, (size_t)n, true, text, contents) != AKV_OK)) {
        fprintf(stderr, "akv tok: cannot render the chat\n");
        ok = 0;
    }
    for (int i = 0; roles && i < n; i++)
        free(roles[i]);
    free(roles);
    free(msgs);
    if (ok)
        printf("template %s:\n%s\n---\n", akv_chat_kind_name(akv_chat_get_kind(chat)), text->bytes);
    akv_chat_destroy(chat);
    return ok ? AKV_EXIT_OK : rc;
}

static int tok_decode_args(const akv_tok *tok, int argc, char **argv, int from) {
    size_t n = argc > from ? (size_t)(argc - from) : 0;
    int32_t *ids = calloc(n ? n : 1, sizeof *ids);
    akv_tok_text text = {0};
    int rc = ids ? AKV_EXIT_OK : AKV_EXIT_FAIL;
    for (size_t i = 0; i < n && rc == AKV_EXIT_OK; i++) {
        const char *arg = argv[from + (int)i];
        char *end;
        errno = 0;
        long v = strtol(arg, &end, 10);
        if (errno || *end || end == arg || v < 0 || (size_t)v >= akv_tok_n_tokens(tok)) {
            fprintf(stderr, "akv tok: --decode: '%s' is not a token id (0 .. %zu)\n", arg,
                    akv_tok_n_tokens(tok) - 1);
            rc = AKV_EXIT_USAGE;
        }
        if (ids) ids[i] = (int32_t)v;
    }
    if (rc == AKV_EXIT_OK) {
        if (akv_tok_decode(tok, ids, n, AKV_TOK_DECODE_SPECIAL, &text) != AKV_OK) {
            rc = AKV_EXIT_FAIL;
        } else {
            fwrite(text.bytes, 1, text.n_bytes, stdout);
            fputc('\n', stdout);
        }
    }
    free(ids);
    akv_tok_text_free(&text);
    return rc;
}

/* --stats: encodes `text` `repeat` times; reports the best time. */
static int tok_stats(const akv_tok *tok, const akv_tok_text *text, uint32_t flags, int repeat) {
    double best = 0;
    size_t n_ids = 0;
    for (int r = 0; r < repeat; r++) {
        akv_tok_ids ids = {0};
        double t0 = akv_clock_s();
        akv_status st = akv_tok_encode(tok, text->bytes, text->n_bytes, flags, &ids);
        double dt = akv_clock_s() - t0;
        n_ids = ids.n_ids;
        akv_tok_ids_free(&ids);
        if (st) {
            fprintf(stderr, "akv tok: encode failed: %s\n", akv_status_str(st));
            return AKV_EXIT_FAIL;
        }
        if (r == 0 || dt < best) best = dt;
    }
    printf("%zu bytes -> %zu tokens (%.2f bytes/token); encode %.3f ms, %.2f MB/s "
           "(best of %d)\n",
           text->n_bytes, n_ids, n_ids ? (double)text->n_bytes / (double)n_ids : 0.0, best * 1e3,
           best > 0 ? (double)text->n_bytes / best / 1e6 : 0.0, repeat);
    return AKV_EXIT_OK;
}

static void tok_print_ids(const akv_tok *tok, const akv_tok_ids *ids, bool ids_only) {
    for (size_t i = 0; i < ids->n_ids; i++) {
        if (ids_only) {
            printf(i ? " %d" : "%d", ids->ids[i]);
            continue;
        }
        size_t n;
        const uint8_t *piece = akv_tok_token_piece(tok, ids->ids[i], &n);
        akv_tok_type type = akv_tok_token_type(tok, ids->ids[i]);
        printf("%6zu %7d  ", i, ids->ids[i]);
        if (type == AKV_TOK_TYPE_CONTROL || type == AKV_TOK_TYPE_USER_DEFINED ||
            type == AKV_TOK_TYPE_UNKNOWN) {
            fwrite(piece, 1, n, stdout);
            printf("  (special)");
        } else {
            fputc('\'', stdout);
            tok_print_escaped(stdout, piece, n);
            fputc('\'', stdout);
        }
        fputc('\n', stdout);
    }
    if (ids_only)
        fputc('\n', stdout);
    else
        printf("%zu tokens\n", ids->n_ids);
}

int akv_cmd_tok(int argc, char **argv) {
    enum {
        O_NO_SPECIAL = 256,
        O_NO_BOS,
        O_IDS,
        O_DECODE,
        O_CHAT,
        O_TEMPLATE,
        O_STATS,
        O_REPEAT,
        O_PRE,
        O_MAXIN
    };
    static const struct option opts[] = {{"file", required_argument, 0, 'f'},
                                         {"no-special", no_argument, 0, O_NO_SPECIAL},
                                         {"no-bos", no_argument, 0, O_NO_BOS},
                                         {"ids", no_argument, 0, O_IDS},
                                         {"decode", no_argument, 0, O_DECODE},
                                         {"chat", no_argument, 0, O_CHAT},
                                         {"template", required_argument, 0, O_TEMPLATE},
                                         {"stats", no_argument, 0, O_STATS},
                                         {"repeat", required_argument, 0, O_REPEAT},
                                         {"pre", required_argument, 0, O_PRE},
                                         {"max-input-bytes", required_argument, 0, O_MAXIN},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    const char *file = NULL, *template_name = NULL, *pre = NULL;
    bool parse_special = true, add_special = true, ids_only = false, decode = false, chat = false,
         stats = false;
    unsigned long long repeat = 3, max_input = AKV_TOOL_INPUT_LIMIT;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "f:h", opts, NULL)) != -1) {
        switch (c) {
        case 'f':
            file = optarg;
            break;
        case O_NO_SPECIAL:
            parse_special = false;
            break;
        case O_NO_BOS:
            add_special = false;
            break;
        case O_IDS:
            ids_only = true;
            break;
        case O_DECODE:
            decode = true;
            break;
        case O_CHAT:
            chat = true;
            break;
        case O_TEMPLATE:
            template_name = optarg;
            break;
        case O_PRE:
            pre = optarg;
            break;
        case O_STATS:
            stats = true;
            break;
        case O_MAXIN:
            if (!akv_tool_parse_u64("tok", "max-input-bytes", optarg, &max_input))
                return AKV_EXIT_USAGE;
            if (max_input == 0) {
                fprintf(stderr, "akv tok: --max-input-bytes must be at least 1\n");
                return AKV_EXIT_USAGE;
            }
            break;
        case O_REPEAT:
            if (!akv_tool_parse_u64("tok", "repeat", optarg, &repeat)) return AKV_EXIT_USAGE;
            if (repeat == 0 || repeat > 1000000) {
                fprintf(stderr, "akv tok: --repeat: %llu is not in 1 .. 1000000\n", repeat);
                return AKV_EXIT_USAGE;
            }
            break;
        case 'h':
            printf("%s", tok_usage);
            return AKV_EXIT_OK;
        default:
            fprintf(stderr, "%s", tok_usage);
            return AKV_EXIT_USAGE;
        }
    }
    akv_tok_pre pre_kind;
    if (pre && akv_tok_pre_from_name(pre, &pre_kind) != AKV_OK) {
        fprintf(stderr, "akv tok: --pre: '%s' is not gpt2, smollm or llama-bpe\n", pre);
        return AKV_EXIT_USAGE;
    }
    akv_chat_kind kind;
    if (template_name && akv_chat_kind_from_name(template_name, &kind) != AKV_OK) {
        fprintf(stderr, "akv tok: --template: '%s' is not chatml or llama3\n", template_name);
        return AKV_EXIT_USAGE;
    }
    if (optind >= argc) {
        fprintf(stderr, "akv tok: no model file\n%s", tok_usage);
        return AKV_EXIT_USAGE;
    }
    const char *model = argv[optind++];
    if ((file != NULL) + decode + chat > 1 || (file && optind < argc)) {
        fprintf(stderr, "akv tok: give the text one way: arguments, --file, --decode or --chat\n");
        return AKV_EXIT_USAGE;
    }

    akv_gguf *g = NULL;
    akv_tok *tok = NULL;
    akv_status st = akv_gguf_open(model, &g);
    if (st) {
        fprintf(stderr, "akv tok: cannot read '%s': %s\n", model, akv_status_str(st));
        return AKV_EXIT_FAIL;
    }
    if ((st = akv_tok_create_from_gguf(g, pre, &tok))) {
        fprintf(stderr, "akv tok: '%s' has no usable tokenizer: %s\n", model, akv_status_str(st));
        akv_gguf_close(g);
        return AKV_EXIT_FAIL;
    }
    int rc = AKV_EXIT_OK;
    akv_tok_text text = {0};
    akv_tok_ids ids = {0};
    akv_tok_spans contents = {0}; /* --chat: where the message contents lie */
    if (decode) {
        rc = tok_decode_args(tok, argc, argv, optind);
        goto done;
    }
    if (chat) {
        if ((rc = tok_render_chat(g, template_name, argc, argv, optind, &text, &contents)) != AKV_EXIT_OK)
            goto done;
        add_special = false; /* the template wrote BOS where the model wants it */
        parse_special = true;
    } else if (file ? !akv_tool_read_input("tok", file, max_input, "max-input-bytes", &text) : !tok_join_args(argc, argv, optind, &text)) {
        rc = AKV_EXIT_FAIL;
        goto done;
    }
    uint32_t flags =
        (parse_special ? AKV_TOK_PARSE_SPECIAL : 0) | (add_special ? AKV_TOK_ADD_SPECIAL : 0);
    if (stats) {
        rc = tok_stats(tok, &text, flags, (int)repeat);
        goto done;
    }
    /* a chat's message contents are plain text, as the server encodes them */
    const akv_tok_encode_opts eo = {.flags = flags, .plain = contents.spans, .n_plain = contents.n};
    if ((st = akv_tok_encode_with(tok, text.bytes, text.n_bytes, &eo, &ids))) {
        fprintf(stderr, "akv tok: encode failed: %s\n", akv_status_str(st));
        rc = AKV_EXIT_FAIL;
        goto done;
    }
    tok_print_ids(tok, &ids, ids_only);
done:
    akv_tok_spans_free(&contents);
    akv_tok_ids_free(&ids);
    akv_tok_text_free(&text);
    akv_tok_destroy(tok);
    akv_gguf_close(g);
    return rc;
}
