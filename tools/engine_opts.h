/*
 * tools/engine_opts.h — the command-line options that configure an engine (akv/engine.h) and
 * its default sampling, shared by `akv run` and `akv serve`: one table of flags, one parser,
 * one set of checks, one help text, and the mapping to akv_engine_params, so the two
 * commands cannot drift apart.
 *
 * The flags, their ranges, defaults, help and names are rows of the settings table
 * (tools/settings.h). A command builds its getopt_long table with akv_tool_options (the
 * table's flags, then its own), hands every option it does not handle itself to
 * akv_tool_eopts_parse, calls akv_tool_eopts_check after the loop, and fills its engine
 * params with akv_tool_eopts_apply.
 */
#ifndef AKV_TOOLS_ENGINE_OPTS_H
#define AKV_TOOLS_ENGINE_OPTS_H

#include <getopt.h>

#include "akv/engine.h"
#include "cmd.h"
#include "settings.h"

/* The defaults: the default model, device auto, 1 GiB pools, bf16 K/V, resident, chunk 256,
 * window 4 pages, the sampler's defaults; parallel 0 and ctx 0 (the command decides). */
void akv_tool_eopts_defaults(akv_tool_eopts *o);

/* Option c with argument arg: 1 when it is an engine option (taken), 0 when it is not, -1 when
 * its value is bad (printed as "akv <cmd>: --flag: ..."). */
int akv_tool_eopts_parse(const char *cmd, int c, const char *arg, akv_tool_eopts *o);

/* The checks that need every option, and the calibration file read into o->gate_rates: -1 when
 * the options hold, else AKV_EXIT_USAGE (printed). */
int akv_tool_eopts_check(const char *cmd, akv_tool_eopts *o);

/* Help lines of the shared options from the settings table (-m, --max-context, --parallel
 * and --seed excepted: their defaults are each command's), defaults from o. */
void akv_tool_eopts_help(FILE *f, const akv_tool_eopts *o);

/* The memory, scheduling and pass fields of ep from o (device, model, max_context, max_seqs,
 * queue and idle limits are the command's). */
void akv_tool_eopts_apply(const akv_tool_eopts *o, akv_engine_params *ep);

/* The trace of --trace and --trace-level into *out (NULL without them), made right before the
 * engine once every other check has passed (its file is created then); the caller destroys it
 * after the engine (akv_trace_destroy). -1, or the exit code after saying why. */
int akv_tool_trace_open(const char *cmd, const akv_tool_eopts *o, struct akv_trace **out);

/* --threads as used: 0 (every core), or at most the cores this process may run on. */
uint32_t akv_tool_eopts_threads(const akv_tool_eopts *o);

/* akv_engine_create failed with st (the library logged why): says so as "akv <cmd>: ..." and
 * returns the exit code (3 does not fit, 2 bad or unsupported setting, 1 otherwise). */
int akv_tool_engine_failed(const char *cmd, akv_status st);

#endif
