#define _POSIX_C_SOURCE 200809L
/* test_settings.c — the akv commands' settings table (tools/settings.h): one row per setting,
 * its flag, range, default and names, and what the commands build from it. */
#include "test.h"

#include <stddef.h>
#include <string.h>

#include "../tools/engine_opts.h"
#include "../tools/settings.h"
#include "akv/log.h"

/* Reads arg for the row of `flag` into a fresh set of defaults; 1 when taken. */
static int parse_one(const char *flag, const char *arg, akv_tool_eopts *o) {
    akv_tool_eopts_defaults(o);
    for (const akv_tool_setting *s = akv_tool_settings; s->flag; s++)
        if (s->id && !strcmp(s->flag, flag)) return akv_tool_setting_parse("test", s, arg, o);
    return -1;
}

int main(int argc, char **argv) {
    test_args(argc, argv);

    TEST_CASE(one_row_per_setting) {
        int n_rows = 0;
        for (const akv_tool_setting *s = akv_tool_settings; s->flag; s++, n_rows++) {
            CHECK(s->flag[0] == '-');
            /* a row read here has a type; a named-only row has none and no getopt id */
            CHECK((s->id != 0) == (s->type != AKV_TV_NONE));
            CHECK(s->type == AKV_TV_SWITCH || s->type == AKV_TV_NONE || s->arg != NULL);
            for (const akv_tool_setting *t = s + 1; t->flag; t++) {
                if (s->field && t->field && !strcmp(s->field, t->field)) {
                    printf("  field %s has two rows\n", s->field);
                    (void)CHECK(0);
                }
                if (s->id && s->id == t->id) {
                    printf("  id %d has two rows (%s, %s)\n", s->id, s->flag, t->flag);
                    (void)CHECK(0);
                }
            }
            /* a row's own range holds its default */
            akv_tool_eopts d;
            akv_tool_eopts_defaults(&d);
            if (s->type == AKV_TV_U64 && s->lo > 0 && !s->deflt && s->field && strcmp(s->field, "max_context") &&
                strcmp(s->field, "max_seqs")) {
                double v = (double)*(unsigned long long *)((char *)&d + s->offset);
                if (!CHECK(v >= s->lo && v <= s->hi)) printf("  %s default %g\n", s->flag, v);
            }
        }
        CHECK(n_rows > 30);
        /* every engine option id has its row */
        for (int id = AKV_OPT_CTX; id <= AKV_OPT_SPECIAL_CONTENT; id++)
            if (!CHECK(akv_tool_setting_of_id(id) != NULL)) printf("  id %d\n", id);
        CHECK(akv_tool_setting_of_id('m') != NULL);
    }

    TEST_CASE(values_land_in_their_fields_within_their_ranges) {
        akv_tool_eopts o;
        CHECK_EQ_INT(parse_one("--host-gib", "7", &o), 1);
        CHECK_EQ_INT((int)o.host_gib, 7);
        CHECK_EQ_INT(parse_one("--host-gib", "0", &o), 0); /* below 1 */
        CHECK_EQ_INT(parse_one("--device-gib", "4096", &o), 1);
        CHECK_EQ_INT(parse_one("--device-gib", "4097", &o), 0);
        CHECK_EQ_INT(parse_one("--parallel", "0", &o), 0);
        CHECK_EQ_INT(parse_one("--max-context", "1", &o), 0);
        CHECK_EQ_INT(parse_one("--max-context", "128K", &o), 1);
        CHECK_EQ_INT((int)o.ctx, 131072);
        CHECK_EQ_INT(parse_one("--window-pages", "1", &o), 0);
        CHECK_EQ_INT(parse_one("--chunk", "65537", &o), 0);
        CHECK_EQ_INT(parse_one("--threads", "1025", &o), 0);
        CHECK_EQ_INT(parse_one("--top-k", "2147483647", &o), 1);
        CHECK_EQ_INT(o.sp.top_k, 2147483647);
        CHECK_EQ_INT(parse_one("--top-k", "2147483648", &o), 0);
        CHECK_EQ_INT(parse_one("--temp", "0.25", &o), 1);
        CHECK(o.sp.temp == 0.25f);
        CHECK_EQ_INT(parse_one("--presence-penalty", "-2.5", &o), 0);
        CHECK_EQ_INT(parse_one("--seed", "18446744073709551615", &o), 1);
        CHECK(o.sp.seed == 18446744073709551615ull);
        CHECK_EQ_INT(parse_one("--kv-dtype", "f16", &o), 1);
        CHECK_EQ_INT((int)o.kv_dtype, (int)AKV_DTYPE_F16);
        CHECK_EQ_INT(parse_one("--kv-dtype", "q4", &o), 0);
        CHECK_EQ_INT(parse_one("--weights", "bf16", &o), 1);
        CHECK_EQ_INT((int)o.weights, (int)AKV_WEIGHTS_BF16);
        CHECK_EQ_INT(parse_one("--route", "staged", &o), 1);
        CHECK_STR(akv_route_kind_name(o.route), "staged");
        CHECK_EQ_INT(parse_one("--route", "hybrid", &o), 0);
        CHECK_EQ_INT(parse_one("--no-graphs", NULL, &o), 1);
        CHECK_EQ_INT(o.no_graphs, 1);
        CHECK_EQ_INT(parse_one("--chat-template", "chatml", &o), 1);
        CHECK_STR(o.tmpl, "chatml");
        /* the parser a command calls: not an engine option is 0, a bad value -1 */
        akv_tool_eopts_defaults(&o);
        CHECK_EQ_INT(akv_tool_eopts_parse("test", 'p', "x", &o), 0);
        CHECK_EQ_INT(akv_tool_eopts_parse("test", AKV_OPT_HOST, "x", &o), -1);
        CHECK_EQ_INT(akv_tool_eopts_parse("test", AKV_OPT_HOST, "3", &o), 1);
        CHECK_EQ_INT((int)o.host_gib, 3);
    }

    TEST_CASE(each_front_end_names_a_setting_its_way) {
        CHECK_STR(akv_tool_flag_namer("host_gib", NULL), "--host-gib");
        CHECK_STR(akv_tool_flag_namer("max_seqs", NULL), "--parallel");
        CHECK_STR(akv_tool_flag_namer("concurrency", NULL), "--parallel");
        CHECK_STR(akv_tool_flag_namer("max_history", NULL), "--max-context");
        CHECK_STR(akv_tool_flag_namer("max_tokens", NULL), "-n");
        CHECK(akv_tool_flag_namer("no_such_field", NULL) == NULL);
        /* a server's answer: the request's field where a request sets it */
        CHECK_STR(akv_tool_http_namer("max_tokens", NULL), "max_tokens");
        CHECK_STR(akv_tool_http_namer("temp", NULL), "temperature");
        CHECK_STR(akv_tool_http_namer("max_seqs", NULL), "--parallel");
        char buf[160];
        akv_log_render("model: {=weights} f32: the host model keeps its matrices for the weights",
                       akv_tool_flag_namer, NULL, buf, sizeof buf);
        CHECK_STR(buf, "model: --weights f32: the host model keeps its matrices for the weights");
        akv_log_render("lower {=max_tokens} or raise {=max_context}", akv_tool_http_namer, NULL,
                       buf, sizeof buf);
        CHECK_STR(buf, "lower max_tokens or raise --max-context");
    }

    TEST_CASE(getopt_table_and_help_come_from_the_rows) {
        static const struct option own[] = {{"prompt", required_argument, 0, 'p'}, {0, 0, 0, 0}};
        struct option opts[96];
        int n = akv_tool_options(own, opts, 96);
        int n_read = 0;
        for (const akv_tool_setting *s = akv_tool_settings; s->flag; s++) n_read += s->id != 0;
        CHECK_EQ_INT(n, n_read + 1);
        CHECK_STR(opts[n - 1].name, "prompt");
        CHECK(opts[n].name == NULL);
        CHECK_EQ_INT(akv_tool_options(own, opts, (size_t)n_read), -1); /* no room */
        for (int i = 0; i < n_read; i++) {
            const akv_tool_setting *s = akv_tool_setting_of_id(opts[i].val);
            if (!CHECK(s != NULL)) break;
            CHECK_STR(opts[i].name, s->flag + 2);
            CHECK_EQ_INT(opts[i].has_arg, s->arg ? required_argument : no_argument);
        }
        /* help: every row with a text, its default from the defaults, lines within 92 columns */
        char *text = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&text, &len);
        if (!CHECK(f != NULL)) break;
        akv_tool_eopts d;
        akv_tool_eopts_defaults(&d);
        d.host_gib = 37; /* the help says the value it is given */
        akv_tool_eopts_help(f, &d);
        fclose(f);
        for (const akv_tool_setting *s = akv_tool_settings; s->flag; s++) {
            if (!s->id) continue; /* named only: its flag, if any, is another row's */
            char head[80];
            snprintf(head, sizeof head, "      %s%s%s", s->flag, s->arg ? " " : "",
                     s->arg ? s->arg : "");
            const bool shown = strstr(text, head) != NULL;
            if (!CHECK(shown == (s->help != NULL))) printf("  %s\n", s->flag);
        }
        CHECK(strstr(text, "host pool limit, whole GiB (default 37)") != NULL);
        CHECK(strstr(text, "(default: the model's)") != NULL);
        CHECK(strstr(text, "(default resident)") != NULL);
        for (char *line = text, *end; *line; line = end + 1) {
            end = strchr(line, '\n');
            if (!CHECK(end != NULL)) break;
            if (!CHECK(end - line <= 92)) printf("  %.*s\n", (int)(end - line), line);
        }
        free(text);
    }

    return test_finish();
}
