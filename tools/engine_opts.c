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
#include "akv/trace.h"
#include "core/par.h"

void akv_tool_eopts_help(FILE *f, const akv_tool_eopts *o) {
    akv_tool_settings_help(f, o);
}

void akv_tool_eopts_defaults(akv_tool_eopts *o) {
    memset(o, 0, sizeof *o);
    o->model = AKV_TOOL_DEFAULT_MODEL, o->device = "auto", o->host_gib = 1, o->device_gib = 1;
    o->chunk = 256, o->kv_dtype = AKV_DTYPE_BF16, o->window_pages = AKV_ROUTE_WINDOW_PAGES;
    akv_route_kind_from_name("resident", &o->route); /* the default route */
    o->sp = akv_sample_default_params();
}

int akv_tool_eopts_parse(const char *cmd, int c, const char *arg, akv_tool_eopts *o) {
    const akv_tool_setting *s = akv_tool_setting_of_id(c);
    if (!s) return 0;
    return akv_tool_setting_parse(cmd, s, arg, o) ? 1 : -1;
}

int akv_tool_eopts_check(const char *cmd, akv_tool_eopts *o) {
    /* a template is a file of Jinja source or a family's name; anything else is a typo that
     * would leave every chat request refused */
    struct stat sb;
    akv_chat_kind kind;
    if (o->tmpl && stat(o->tmpl, &sb) != 0 && akv_chat_kind_from_name(o->tmpl, &kind)) {
        fprintf(stderr, "akv %s: --chat-template '%s' is neither a file nor a template family "
                        "(chatml|llama3)\n", cmd, o->tmpl);
        return AKV_EXIT_USAGE;
    }
    const bool host = akv_route_kind_has_host_part(o->route);
    if (host && o->kv_tier == AKV_ENGINE_TIER_AUTO) {
        fprintf(stderr, "akv %s: --kv-tier auto chooses the route itself (resident or staged); "
                        "--route %s takes no tier\n",
                cmd, akv_route_kind_name(o->route));
        return AKV_EXIT_USAGE;
    }
    if (o->calibration && o->kv_tier != AKV_ENGINE_TIER_AUTO && !host) {
        fprintf(stderr, "akv %s: --calibration is read by the gate (--kv-tier auto) and by --route "
                        "host's plan\n",
                cmd);
        return AKV_EXIT_USAGE;
    }
    if (o->calibration && akv_gate_rates_load(o->calibration, &o->gate_rates) != AKV_OK) {
        fprintf(stderr, "akv %s: --calibration '%s' cannot be used (see above)\n", cmd, o->calibration);
        return AKV_EXIT_USAGE;
    }
    akv_trace_level level;
    if (o->trace_level && akv_trace_level_parse(o->trace_level, &level) != AKV_OK) {
        fprintf(stderr, "akv %s: --trace-level '%s' is not one of off, counters, spans\n", cmd,
                o->trace_level);
        return AKV_EXIT_USAGE;
    }
    const uint32_t cores = akv__par_cores();
    if (o->threads > cores)
        fprintf(stderr, "akv %s: --threads %llu is more than the %u CPUs this process may run "
                        "on: using %u (more threads would only wait for a core)\n",
                cmd, o->threads, cores, cores);
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
    ep->host_share = o->host_share;
    ep->kv_tier = o->kv_tier, ep->exact_recent = o->exact_recent;
    ep->gate_rates = o->calibration ? &o->gate_rates : NULL;
    ep->chunk = (uint32_t)o->chunk, ep->step_tokens = (uint32_t)o->step_tokens;
    ep->prefill_beside = (uint32_t)o->prefill_beside;
    ep->session_dir = o->session_dir, ep->session_dir_gib = (uint32_t)o->session_dir_gib;
    ep->threads = akv_tool_eopts_threads(o), ep->no_graphs = o->no_graphs != 0;
    ep->host_sampling = o->host_sampling != 0;
}

int akv_tool_trace_open(const char *cmd, const akv_tool_eopts *o, akv_trace **out) {
    *out = NULL;
    if (!o->trace_path && !o->trace_level) return -1;
    akv_trace_level level = AKV_TRACE_SPANS; /* with --trace alone */
    if (o->trace_level) (void)akv_trace_level_parse(o->trace_level, &level); /* checked */
    if (akv_trace_create(level, 0, out) != AKV_OK ||
        (o->trace_path && akv_trace_attach_file(*out, o->trace_path) != AKV_OK)) {
        fprintf(stderr, "akv %s: --trace '%s' cannot be written (see above)\n", cmd,
                o->trace_path ? o->trace_path : "");
        akv_trace_destroy(*out), *out = NULL;
        return AKV_EXIT_USAGE;
    }
    return -1;
}

uint32_t akv_tool_eopts_threads(const akv_tool_eopts *o) {
    const uint32_t cores = akv__par_cores();
    return o->threads > cores ? cores : (uint32_t)o->threads;
}

int akv_tool_engine_failed(const char *cmd, akv_status st) {
    fprintf(stderr, "akv %s: %s\n", cmd,
            st == AKV_EFULL          ? "the configuration does not fit (see above)"
            : st == AKV_EUNSUPPORTED ? "the configuration is not supported (see above)"
                                     : akv_status_str(st));
    return st == AKV_EFULL                              ? AKV_EXIT_REFUSED
           : st == AKV_EINVAL || st == AKV_EUNSUPPORTED ? AKV_EXIT_USAGE
                                                        : AKV_EXIT_FAIL;
}
