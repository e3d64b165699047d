/*
 * tools/cmd.h — subcommands of the `akv` executable.
 *
 * Each subcommand is `int akv_cmd_<name>(int argc, char **argv)` with argv[0] = the
 * subcommand's name, long options through getopt_long, and `--help`. Exit codes, for every
 * subcommand:
 *   0  success
 *   1  failure (the message names what failed)
 *   2  usage error (bad flag or value; the message names it)
 *   3  refused: the configuration does not fit (the message names the setting to change)
 */
#ifndef AKV_TOOLS_CMD_H
#define AKV_TOOLS_CMD_H

#include <stdio.h>

#include "akv/dev.h"
#include "akv/tok.h"

enum { AKV_EXIT_OK = 0, AKV_EXIT_FAIL = 1, AKV_EXIT_USAGE = 2, AKV_EXIT_REFUSED = 3 };

typedef struct akv_cmd {
    const char *name;
    const char *summary;
    int (*fn)(int argc, char **argv);
} akv_cmd;

int akv_cmd_version(int argc, char **argv);
int akv_cmd_devices(int argc, char **argv);
int akv_cmd_tok(int argc, char **argv); /* cmd_tok.c */
int akv_cmd_run(int argc, char **argv); /* cmd_run.c */
int akv_cmd_perplexity(int argc, char **argv); /* cmd_perplexity.c */
int akv_cmd_calibrate(int argc, char **argv); /* cmd_calibrate.c */
int akv_cmd_serve(int argc, char **argv); /* cmd_serve.c */
int akv_cmd_gguf(int argc, char **argv);
int akv_cmd_fit(int argc, char **argv); /* cmd_fit.c */

/* Helpers shared by subcommands (tools/util.c). */

/* Parses a non-negative integer with an optional K/M/G suffix (powers of 1024) into *out.
 * Prints "akv <cmd>: --<flag>: ..." and returns 0 on a bad value. */
int akv_tool_parse_u64(const char *cmd, const char *flag, const char *s, unsigned long long *out);

/* akv_tool_parse_u64 with an upper bound (a value above it is refused, naming it). */
int akv_tool_parse_max(const char *cmd, const char *flag, const char *s, unsigned long long max,
                       unsigned long long *out);

/* 1 when paths a and b name the same existing file (same device and inode), else 0: an
 * output must never be a command's input. */
int akv_tool_same_file(const char *a, const char *b);

/* While an output file is written as "<path>.partial" (akv/gguf_writer.h): SIGINT, SIGTERM
 * and SIGHUP (those not ignored) remove the partial file, then end the process as the signal
 * would have. akv_tool_partial_guard(NULL) puts the previous actions back. 0 when nothing was
 * installed (a path too long to keep, or a guard already in): the command proceeds. */
int akv_tool_partial_guard(const char *path);

/* A float option's value in [lo, hi] (bounds compared in double). 0 on a bad value (printed). */
int akv_tool_parse_float(const char *cmd, const char *flag, const char *s, double lo, double hi,
                         float *out);

/* The most bytes an input file may hold unless a command's flag raises it. */
#define AKV_TOOL_INPUT_LIMIT (64ull << 20)

/* Reads all of the file at `path` ("-" = standard input) into *out, appending at most `max`
 * bytes: a larger input is refused, naming `flag` (the one that raises the limit; NULL: a
 * fixed limit), before more than max + 64 KiB is held. Prints "akv <cmd>: ..." and returns 0 on failure. */
int akv_tool_read_input(const char *cmd, const char *path, unsigned long long max,
                        const char *flag, akv_tok_text *out);

/* Opens the device named by `--device` ("cpu"/"host", "cuda", "cuda:N", or "auto": CUDA when
 * built with it and a device answers, else the host). Prints an error and returns a status. */
akv_status akv_tool_open_device(const char *spec, akv_dev **out);

#endif
