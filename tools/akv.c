/*
 * akv.c — the `akv` command: one binary, subcommands.
 *
 *   akv --help            list the subcommands
 *   akv <cmd> --help      a subcommand's options
 *   akv version           version and build features
 * Exit codes are in tools/cmd.h (0 ok, 1 failure, 2 usage, 3 refused).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "akv/akv.h"
#include "cmd.h"
#ifdef AKV_HAVE_CUDA
#include "akv/dev_cuda.h"
#endif

static const akv_cmd akv_cmds[] = {
    {"devices", "list the devices this build can use and their properties", akv_cmd_devices},
    {"run", "generate text from a GGUF model, its K/V history in host and device pages", akv_cmd_run},
    {"perplexity", "a model's perplexity over a text, and a compact K/V tier's against exact", akv_cmd_perplexity},
    {"calibrate", "measure the rates the economic gate (--kv-tier auto) weighs, into a file", akv_cmd_calibrate},
    {"serve", "an OpenAI-compatible HTTP server over the engine (chat, completions, metrics)", akv_cmd_serve},
    {"tok", "tokenize text (or a chat) with a GGUF's tokenizer; print ids and pieces", akv_cmd_tok},
    {"gguf", "inspect a GGUF file (info), write a synthetic model (synth) or a layer slice (slice)", akv_cmd_gguf},
    {"fit", "admission arithmetic: what a geometry and pool sizes can serve, with the formula", akv_cmd_fit},
    {"version", "print the version and the build's features", akv_cmd_version},
};

static void akv_usage(FILE *f) {
    fprintf(f, "usage: akv <command> [options]\n\n"
               "activekv: attention history in host memory, a bounded working set on the GPU.\n\n"
               "commands:\n");
    for (size_t i = 0; i < sizeof akv_cmds / sizeof akv_cmds[0]; i++)
        fprintf(f, "  %-10s %s\n", akv_cmds[i].name, akv_cmds[i].summary);
    fprintf(f, "\n'akv <command> --help' shows a command's options.\n"
               "exit codes: 0 ok, 1 failure, 2 usage error, 3 refused (does not fit)\n");
}

/* Handles `--help` for commands whose only option is --help. Returns -1 to go on. */
static int akv_simple_opts(int argc, char **argv, const char *usage) {
    static const struct option opts[] = {{"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        if (c == 'h') {
            printf("%s", usage);
            return AKV_EXIT_OK;
        }
        fprintf(stderr, "%s", usage);
        return AKV_EXIT_USAGE;
    }
    if (optind < argc) {
        fprintf(stderr, "akv %s: unexpected argument '%s'\n%s", argv[0], argv[optind], usage);
        return AKV_EXIT_USAGE;
    }
    return -1;
}

int akv_cmd_version(int argc, char **argv) {
    int rc = akv_simple_opts(argc, argv, "usage: akv version\n\nPrints the version and build features.\n");
    if (rc >= 0) return rc;
    printf("akv %s\n", akv_version());
#ifdef AKV_HAVE_CUDA
    printf("backends: host cuda\n");
#else
    printf("backends: host (built without CUDA)\n");
#endif
    return AKV_EXIT_OK;
}

static void akv_print_device(akv_dev *dev) {
    akv_dev_info info;
    if (akv_dev_get_info(dev, &info) != AKV_OK) return;
    printf("  %s: %d SMs, %.1f GiB, %zu KiB shared memory per block, %.0f MB L2\n", info.name,
           info.n_sm, (double)info.total_bytes / (1u << 30), info.smem_per_block_bytes / 1024,
           (double)info.l2_bytes / 1e6);
}

int akv_cmd_devices(int argc, char **argv) {
    int rc = akv_simple_opts(argc, argv,
                             "usage: akv devices\n\nLists the backends this build has and the "
                             "devices each can open.\n");
    if (rc >= 0) return rc;
    akv_dev *dev = NULL;
    printf("host backend:\n");
    if (akv_dev_create(akv_dev_host_backend(), NULL, &dev) == AKV_OK) {
        akv_print_device(dev);
        akv_dev_destroy(dev);
    }
#ifdef AKV_HAVE_CUDA
    printf("cuda backend:\n");
    int n_found = 0;
    for (int i = 0; i < 64; i++) {
        akv_dev_params p = akv_dev_default_params();
        p.device_index = i;
        if (akv_dev_create(akv_dev_cuda_backend(), &p, &dev) != AKV_OK) break;
        akv_print_device(dev);
        akv_dev_destroy(dev);
        n_found++;
    }
    if (!n_found) printf("  (no CUDA device answers on this machine)\n");
#else
    printf("cuda backend: not built (nvcc was not found at configure time)\n");
#endif
    return AKV_EXIT_OK;
}

/* The command's exit code, or a failure when its standard output could not be written (a
 * full disk, a closed pipe): output that was lost is never a success. */
static int exit_code(int rc) {
    errno = 0;
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "akv: writing the output failed%s%s\n", errno ? ": " : "", errno ? strerror(errno) : "");
        return rc == AKV_EXIT_OK ? AKV_EXIT_FAIL : rc;
    }
    return rc;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        akv_usage(stderr);
        return AKV_EXIT_USAGE;
    }
    const char *name = argv[1];
    if (!strcmp(name, "--help") || !strcmp(name, "-h") || !strcmp(name, "help")) {
        akv_usage(stdout);
        return AKV_EXIT_OK;
    }
    if (!strcmp(name, "--version")) name = "version";
    for (size_t i = 0; i < sizeof akv_cmds / sizeof akv_cmds[0]; i++)
        if (!strcmp(name, akv_cmds[i].name)) return exit_code(akv_cmds[i].fn(argc - 1, argv + 1));
    fprintf(stderr, "akv: unknown command '%s'\n\n", name);
    akv_usage(stderr);
    return AKV_EXIT_USAGE;
}
