/* test_trace.c — the trace (akv/trace.h): levels, the ring and what it drops, the file that takes
 * every event past the ring's size, Chrome JSON that parses with the expected tracks and
 * events, and level off costing no allocation and no lock. */
#define _POSIX_C_SOURCE 200809L /* mkstemp */
#include "test.h"

#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#include "akv/log.h"
#include "akv/trace.h"
#include "core/alloc.h"

/* The events of a Chrome trace (an array, or an object's traceEvents) of ph `ph` named `name`
 * (NULL: any) on track tid (0: any). */
static int count_events(const cJSON *events, const char *ph, const char *name, int tid) {
    int n = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, events) {
        const cJSON *p = cJSON_GetObjectItem(e, "ph"), *nm = cJSON_GetObjectItem(e, "name"),
                    *t = cJSON_GetObjectItem(e, "tid");
        if (!cJSON_IsString(p) || strcmp(p->valuestring, ph)) continue;
        if (name && (!cJSON_IsString(nm) || strcmp(nm->valuestring, name))) continue;
        if (tid && (!cJSON_IsNumber(t) || t->valueint != tid)) continue;
        n++;
    }
    return n;
}

static char *read_all(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) free(b), b = NULL;
    if (b) b[n] = 0;
    fclose(f);
    return b;
}

/* A new empty file's name into path ("/tmp/akv_trace_XXXXXX"); 0 on failure. */
static int temp_file(char *path) {
    int fd = mkstemp(path);
    if (fd < 0) return 0;
    close(fd);
    return 1;
}

/* The file at path parsed as JSON (NULL if it does not parse); the file removed. */
static cJSON *parse_and_remove(const char *path) {
    char *text = read_all(path);
    cJSON *doc = text ? cJSON_Parse(text) : NULL;
    free(text);
    unlink(path);
    return doc;
}

/* 100,000 spans and as many counters (a thread's body). */
static void *emit_many(void *arg) {
    akv_trace *t = arg;
    for (int i = 0; i < 100000; i++) {
        akv_trace_span(t, AKV_TRACE_TRACK_REQUEST + (uint32_t)(i % 7), "s", (uint64_t)i, (uint64_t)i + 3, "i", i, NULL, 0);
        akv_trace_counter(t, "c", (uint64_t)i, i);
    }
    return NULL;
}

int main(int argc, char **argv) {
    test_args(argc, argv);
    TEST_CASE(levels_by_name) {
        akv_trace_level l = AKV_TRACE_OFF;
        CHECK_OK(akv_trace_level_parse("spans", &l));
        CHECK(l == AKV_TRACE_SPANS);
        CHECK_OK(akv_trace_level_parse("counters", &l));
        CHECK(l == AKV_TRACE_COUNTERS);
        akv_log_set(NULL, NULL, AKV_LOG_OFF);
        CHECK_STATUS(akv_trace_level_parse("all", &l), AKV_EINVAL);
        akv_trace *t = NULL;
        CHECK_STATUS(akv_trace_create((akv_trace_level)7, 0, &t), AKV_EINVAL);
        CHECK(akv_trace_level_of(NULL) == AKV_TRACE_OFF);
        CHECK(akv_trace_create(AKV_TRACE_SPANS, 4, &t) == AKV_OK);
        CHECK_STATUS(akv_trace_attach_file(t, "/nonexistent/dir/t.json"), AKV_EIO);
        akv_log_set(NULL, NULL, AKV_LOG_WARN);
        akv_trace_destroy(t);
    }
    TEST_CASE(off_costs_no_allocation_and_no_lock) {
        akv_trace *t = NULL;
        if (!REQUIRE_OK(akv_trace_create(AKV_TRACE_OFF, 16, &t))) break;
        const uint64_t a0 = akv__alloc_calls();
        for (int i = 0; i < 1000; i++) {
            akv_trace_span(t, 1, "x", 1, 2, "a", 1, NULL, 0);
            akv_trace_counter(t, "c", 3, 4);
            akv_trace_track(t, 5, "five");
            CHECK_OK(akv_trace_flush(t));
        }
        CHECK_EQ_U64(akv__alloc_calls(), a0);
        akv_trace_stats st;
        akv_trace_get_stats(t, &st);
        CHECK_EQ_U64(st.n_locks, 0);
        CHECK_EQ_U64(st.n_events, 0);
        akv_trace_destroy(t);
    }
    TEST_CASE(counters_level_keeps_counters_only) {
        akv_trace *t = NULL;
        if (!REQUIRE_OK(akv_trace_create(AKV_TRACE_COUNTERS, 16, &t))) break;
        akv_trace_span(t, 1, "x", 1, 2, NULL, 0, NULL, 0);
        akv_trace_counter(t, "c", 3, 4);
        akv_trace_stats st;
        akv_trace_get_stats(t, &st);
        CHECK_EQ_U64(st.n_events, 1);
        akv_trace_destroy(t);
    }
    TEST_CASE(ring_drops_the_oldest_and_says_so) {
        /* 10 events through a ring of 4: the dump has the last 4 (their values 6..9) and the
         * track names, as JSON that parses; 6 dropped */
        akv_trace *t = NULL;
        if (!REQUIRE_OK(akv_trace_create(AKV_TRACE_SPANS, 4, &t))) break;
        akv_trace_track(t, 7, "seven \"quoted\"");
        for (int i = 0; i < 10; i++) akv_trace_span(t, 7, "work", 1000 * (uint64_t)i, 1000 * (uint64_t)i + 500, "i", i, NULL, 0);
        char *js = NULL;
        if (!REQUIRE_OK(akv_trace_json(t, &js, NULL))) break;
        cJSON *doc = cJSON_Parse(js);
        const cJSON *ev = cJSON_GetObjectItem(doc, "traceEvents");
        CHECK(cJSON_IsArray(ev));
        CHECK_EQ_INT(count_events(ev, "X", "work", 7), 4);
        CHECK_EQ_INT(count_events(ev, "M", "thread_name", 7), 1);
        const cJSON *first = NULL, *e;
        cJSON_ArrayForEach(e, ev) {
            const cJSON *ph = cJSON_GetObjectItem(e, "ph");
            if (cJSON_IsString(ph) && !strcmp(ph->valuestring, "X")) {
                first = e;
                break;
            }
        }
        const cJSON *args = first ? cJSON_GetObjectItem(first, "args") : NULL;
        CHECK(args && cJSON_GetObjectItem(args, "i") && cJSON_GetObjectItem(args, "i")->valueint == 6);
        cJSON_Delete(doc);
        akv__free(js);
        akv_trace_stats st;
        akv_trace_get_stats(t, &st);
        CHECK_EQ_U64(st.n_events, 10);
        CHECK_EQ_U64(st.n_dropped, 6);
        akv_trace_destroy(t);
    }
    TEST_CASE(file_takes_every_event) {
        /* 1000 spans and counters through a ring of 16 with a file: the file has all of them,
         * nothing dropped, the track name written once, and it parses as a JSON array */
        char path[] = "/tmp/akv_trace_XXXXXX";
        if (!CHECK(temp_file(path))) break;
        akv_trace *t = NULL;
        if (!REQUIRE_OK(akv_trace_create(AKV_TRACE_SPANS, 16, &t))) break;
        CHECK_OK(akv_trace_attach_file(t, path));
        akv_trace_track(t, 3, "three");
        for (int i = 0; i < 500; i++) {
            akv_trace_span(t, 3, "s", 10 * (uint64_t)i, 10 * (uint64_t)i + 5, "a", i, "b", -i);
            akv_trace_counter(t, "c", 10 * (uint64_t)i, i * 0.5);
        }
        akv_trace_stats st;
        akv_trace_get_stats(t, &st);
        CHECK_EQ_U64(st.n_dropped, 0);
        akv_trace_destroy(t);
        cJSON *doc = parse_and_remove(path);
        CHECK(cJSON_IsArray(doc));
        CHECK_EQ_INT(count_events(doc, "X", "s", 3), 500);
        CHECK_EQ_INT(count_events(doc, "C", "c", 0), 500);
        CHECK_EQ_INT(count_events(doc, "M", "thread_name", 3), 1);
        cJSON_Delete(doc);
    }
    TEST_CASE(track_names_each_once_past_the_table) {
        /* 600 request tracks (more than the 512 names kept) with a file: each name once in the
         * file; the fixed track's name survives them in a dump; a file attached at off takes
         * no lock */
        char path[] = "/tmp/akv_trace_XXXXXX";
        if (!CHECK(temp_file(path))) break;
        akv_trace *t = NULL;
        if (!REQUIRE_OK(akv_trace_create(AKV_TRACE_SPANS, 1 << 12, &t))) break;
        CHECK_OK(akv_trace_attach_file(t, path));
        akv_trace_track(t, AKV_TRACE_TRACK_ENGINE, "engine");
        for (uint32_t i = 0; i < 600; i++) {
            char name[32];
            snprintf(name, sizeof name, "request %u", i);
            akv_trace_track(t, AKV_TRACE_TRACK_REQUEST + i, name);
            akv_trace_span(t, AKV_TRACE_TRACK_REQUEST + i, "s", i, i + 1, NULL, 0, NULL, 0);
        }
        char *js = NULL;
        if (REQUIRE_OK(akv_trace_json(t, &js, NULL))) {
            cJSON *doc = cJSON_Parse(js);
            CHECK_EQ_INT(count_events(cJSON_GetObjectItem(doc, "traceEvents"), "M", "thread_name",
                                      AKV_TRACE_TRACK_ENGINE), 1);
            cJSON_Delete(doc);
            akv__free(js);
        }
        akv_trace_destroy(t);
        cJSON *doc = parse_and_remove(path);
        CHECK(cJSON_IsArray(doc));
        int once = 0;
        for (uint32_t i = 0; i < 600; i++)
            once += count_events(doc, "M", "thread_name", (int)(AKV_TRACE_TRACK_REQUEST + i)) == 1;
        CHECK_EQ_INT(once, 600);
        CHECK_EQ_INT(count_events(doc, "M", "thread_name", AKV_TRACE_TRACK_ENGINE), 1);
        cJSON_Delete(doc);
        char p2[] = "/tmp/akv_trace_XXXXXX";
        if (!CHECK(temp_file(p2)) || !REQUIRE_OK(akv_trace_create(AKV_TRACE_OFF, 0, &t))) break;
        CHECK_OK(akv_trace_attach_file(t, p2));
        akv_trace_stats st;
        akv_trace_get_stats(t, &st);
        CHECK_EQ_U64(st.n_locks, 0);
        akv_trace_destroy(t);
        doc = parse_and_remove(p2);
        CHECK(cJSON_IsArray(doc) && cJSON_GetArraySize(doc) == 0);
        cJSON_Delete(doc);
    }
    TEST_CASE(a_reader_beside_the_emitter) {
        /* dumps taken while another thread emits: every dump parses, the counts add up */
        akv_trace *t = NULL;
        if (!REQUIRE_OK(akv_trace_create(AKV_TRACE_SPANS, 1 << 10, &t))) break;
        pthread_t th;
        if (!CHECK(pthread_create(&th, NULL, emit_many, t) == 0)) break;
        int parsed = 0;
        for (int i = 0; i < 50; i++) {
            char *js = NULL;
            if (akv_trace_json(t, &js, NULL) != AKV_OK) continue;
            cJSON *doc = cJSON_Parse(js);
            parsed += cJSON_IsArray(cJSON_GetObjectItem(doc, "traceEvents"));
            cJSON_Delete(doc);
            akv__free(js);
        }
        pthread_join(th, NULL);
        CHECK_EQ_INT(parsed, 50);
        akv_trace_stats st;
        akv_trace_get_stats(t, &st);
        CHECK_EQ_U64(st.n_events, 200000);
        CHECK_EQ_U64(st.n_dropped, 200000 - (1 << 10));
        akv_trace_destroy(t);
    }
    TEST_CASE(empty_file_is_an_empty_array) {
        char path[] = "/tmp/akv_trace_XXXXXX";
        if (!CHECK(temp_file(path))) break;
        akv_trace *t = NULL;
        if (!REQUIRE_OK(akv_trace_create(AKV_TRACE_COUNTERS, 0, &t))) break;
        CHECK_OK(akv_trace_attach_file(t, path));
        akv_trace_destroy(t);
        cJSON *doc = parse_and_remove(path);
        CHECK(cJSON_IsArray(doc) && cJSON_GetArraySize(doc) == 0);
        cJSON_Delete(doc);
    }
    return test_finish();
}
