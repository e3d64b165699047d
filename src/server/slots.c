/*
 * slots.c — llama-server's slot endpoints over the engine's slots (akv_engine_slots: each
 * conversation the engine holds, running or idle, has a number): GET /slots lists them;
 * POST /slots/N?action=save|restore|erase with {"filename": F} writes slot N's conversation to
 * F in --slot-save-path, reads it back into slot N, or drops it. The HTTP side parses and
 * checks the request on its own thread and posts a SLOT command; the engine thread runs the
 * action between steps (akv__server_slot_run) and finishes the request; the answer has
 * llama-server's fields.
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/log.h"
#include "server/server_impl.h"

/* ---- the engine thread ---------------------------------------------------------------- */

void akv__server_slot_run(akv_server *s, akv_srv_req *r) {
    akv_srv_slot_op *op = &r->slot;
    akv_engine *e = s->engine;
    const double t0 = akv_clock_s();
    if (!e) {
        op->st = AKV_ESTATE; /* a command raced a failed load */
    } else if (op->action == AKV_SRV_SLOTS_LIST) {
        const uint32_t n = akv_engine_slots(e, NULL, 0);
        op->list = akv__calloc(n ? n : 1, sizeof *op->list);
        op->st = op->list ? AKV_OK : AKV_ENOMEM;
        if (op->list) op->n_list = akv_engine_slots(e, op->list, n);
    } else if (op->action == AKV_SRV_SLOT_SAVE) {
        op->st = akv_engine_slot_save(e, op->id, op->path, &op->n_tokens);
    } else if (op->action == AKV_SRV_SLOT_RESTORE) {
        op->st = akv_engine_slot_restore(e, op->id, op->path, &op->n_tokens);
    } else {
        op->st = akv_engine_slot_erase(e, op->id, &op->n_tokens);
    }
    op->ms = (akv_clock_s() - t0) * 1e3;
    akv_srv_req_finish(r, op->st ? AKV_FINISH_ERROR : AKV_FINISH_STOP, 0, 0, 0);
}

/* ---- the HTTP side ------------------------------------------------------------------------ */

/* A file name for --slot-save-path, as llama-server takes them: 1 to 255 bytes, no path
 * separator, no control byte, not "." or "..". */
static bool slot_filename_ok(const char *f) {
    const size_t n = strlen(f);
    if (n == 0 || n > 255 || !strcmp(f, ".") || !strcmp(f, "..")) return false;
    for (const unsigned char *p = (const unsigned char *)f; *p; p++)
        if (*p == '/' || *p == '\\' || *p < 0x20 || *p == 0x7f) return false;
    return true;
}

/* The slot number of "/slots/N" (or "/v1/slots/N", the route's two prefixes): decimal digits
 * below AKV_ENGINE_MAX_SLOT, and nothing else. */
static bool slot_id_of(const char *path, uint32_t *id) {
    const char *d = path + (strncmp(path, "/v1/", 4) ? 7 : 10);
    uint64_t v = 0;
    if (!*d || strlen(d) > 6) return false;
    for (; *d; d++) {
        if (*d < '0' || *d > '9') return false;
        v = v * 10 + (uint64_t)(*d - '0');
    }
    *id = (uint32_t)v;
    return v < AKV_ENGINE_MAX_SLOT;
}

/* The value of `key` in a query string "a=b&c=d" (as sent, not percent-decoded), in out. */
static bool query_value(const char *q, const char *key, char *out, size_t cap) {
    const size_t nk = strlen(key);
    for (const char *p = q; *p;) {
        const char *end = strchr(p, '&');
        const size_t n = end ? (size_t)(end - p) : strlen(p);
        if (n > nk && !strncmp(p, key, nk) && p[nk] == '=' && n - nk - 1 < cap) {
            memcpy(out, p + nk + 1, n - nk - 1);
            out[n - nk - 1] = '\0';
            return true;
        }
        p += n + (end != NULL);
    }
    return false;
}

/* The actions by name, in akv_srv_slot_action's order. */
static const char *const slot_actions[] = {"list", "save", "restore", "erase"};

/* The answer to a finished slot command. */
static void slot_answer(akv_server *s, const akv_srv_req *r, const char *filename,
                        akv_http_response *resp) {
    const akv_srv_slot_op *op = &r->slot;
    const char *act = slot_actions[op->action];
    char msg[512];
    if (op->st) {
        int status = 500;
        const char *type = "server_error";
        switch (op->st) {
        case AKV_ENOTFOUND:
            status = 404, type = "not_found_error";
            if (op->action == AKV_SRV_SLOT_RESTORE)
                snprintf(msg, sizeof msg, "no file '%s' in --slot-save-path", filename);
            else
                snprintf(msg, sizeof msg, "slot %u holds no conversation", op->id);
            break;
        case AKV_EBUSY:
            status = 409, type = "invalid_request_error";
            snprintf(msg, sizeof msg, "slot %u is processing a request: %s it when it is idle",
                     op->id, act);
            break;
        case AKV_EFORMAT:
            status = 400, type = "invalid_request_error";
            snprintf(msg, sizeof msg, "'%s' is not a session of this model (another model or K/V "
                     "type, or a damaged file): nothing restored", filename);
            break;
        case AKV_EFULL:
            status = 503;
            snprintf(msg, sizeof msg, "the conversation in '%s' does not fit: longer than the "
                     "context, or no room in the host pool now", filename);
            break;
        default:
            if (op->action == AKV_SRV_SLOTS_LIST)
                snprintf(msg, sizeof msg, "the slots could not be listed: %s", akv_status_str(op->st));
            else
                snprintf(msg, sizeof msg, "slot %u: %s failed: %s", op->id, act, akv_status_str(op->st));
        }
        akv__srv_err(s, status, type, -1, msg, resp);
        return;
    }
    cJSON *o = NULL;
    if (op->action == AKV_SRV_SLOTS_LIST) {
        o = cJSON_CreateArray();
        for (uint32_t i = 0; o && i < op->n_list; i++) {
            const akv_engine_slot *x = &op->list[i];
            cJSON *it = cJSON_CreateObject();
            cJSON_AddNumberToObject(it, "id", x->id);
            cJSON_AddNumberToObject(it, "n_ctx", (double)s->max_context);
            cJSON_AddBoolToObject(it, "is_processing", x->running);
            cJSON_AddNumberToObject(it, "id_task", x->running ? (double)x->request_id : -1);
            cJSON_AddNumberToObject(it, "n_tokens", x->n_tokens);
            cJSON_AddItemToArray(o, it);
        }
    } else if ((o = cJSON_CreateObject())) {
        cJSON_AddNumberToObject(o, "id_slot", op->id);
        if (op->action == AKV_SRV_SLOT_ERASE) {
            cJSON_AddNumberToObject(o, "n_erased", op->n_tokens);
        } else {
            const bool save = op->action == AKV_SRV_SLOT_SAVE;
            struct stat sb;
            const double bytes = stat(op->path, &sb) == 0 ? (double)sb.st_size : 0;
            cJSON_AddStringToObject(o, "filename", filename);
            cJSON_AddNumberToObject(o, save ? "n_saved" : "n_restored", op->n_tokens);
            cJSON_AddNumberToObject(o, save ? "n_written" : "n_read", bytes);
            cJSON *t = cJSON_AddObjectToObject(o, "timings");
            if (t) cJSON_AddNumberToObject(t, save ? "save_ms" : "restore_ms", op->ms);
        }
    }
    akv__srv_text(200, "application/json", akv_api_json_text(o), resp);
}

/* What a POST asks: the action and, for save and restore, the file. false: *resp says why. */
static bool slot_request(akv_server *s, const akv_http_request *rq, akv_srv_slot_op *op,
                         char *filename, size_t cap, akv_http_response *resp) {
    char act[16];
    if (!slot_id_of(rq->path, &op->id)) {
        akv__srv_err(s, 400, "invalid_request_error", -1, "Invalid slot ID: /slots/N takes a "
                     "slot number (GET /slots lists them)", resp);
        return false;
    }
    op->action = AKV_SRV_SLOTS_LIST; /* not an action a POST takes */
    if (query_value(rq->query, "action", act, sizeof act))
        for (int a = AKV_SRV_SLOT_SAVE; a <= AKV_SRV_SLOT_ERASE; a++)
            if (!strcmp(act, slot_actions[a])) op->action = (akv_srv_slot_action)a;
    if (op->action == AKV_SRV_SLOTS_LIST) {
        akv__srv_err(s, 400, "invalid_request_error", -1,
                     "POST /slots/N takes ?action=save, restore or erase", resp);
        return false;
    }
    if (op->action == AKV_SRV_SLOT_ERASE) return true;
    if (!s->p.slot_save_path) {
        akv__srv_err(s, 501, "not_supported_error", -1, "this server keeps no slot files: start "
                     "it with --slot-save-path DIR to save and restore slots", resp);
        return false;
    }
    cJSON *body = cJSON_ParseWithLength(rq->body ? rq->body : "", rq->n_body);
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(body, "filename");
    const bool ok = cJSON_IsString(f) && slot_filename_ok(f->valuestring) &&
                    strlen(f->valuestring) < cap;
    if (ok) snprintf(filename, cap, "%s", f->valuestring);
    cJSON_Delete(body);
    if (!ok) {
        akv__srv_err(s, 400, "invalid_request_error", -1, "the body must be {\"filename\": F}, F "
                     "a file name of 1 to 255 bytes without a '/', '\\\\' or control byte", resp);
        return false;
    }
    const size_t n = strlen(s->p.slot_save_path) + 1 + strlen(filename) + 1;
    if (!(op->path = akv__malloc(n))) {
        akv__srv_err(s, 503, "server_error", -1, "out of memory", resp);
        return false;
    }
    snprintf(op->path, n, "%s/%s", s->p.slot_save_path, filename);
    return true;
}

void akv__server_slots(akv_server *s, akv_http_conn *c, const akv_http_request *rq) {
    akv_http_response resp = {0};
    char filename[256] = "";
    akv_status st;
    akv_srv_req *r = akv__srv_req_new(s, c);
    if (!r) return;
    const bool list = rq->method != AKV_HTTP_POST;
    if (list || slot_request(s, rq, &r->slot, filename, sizeof filename, &resp)) {
        if (list) r->slot.action = AKV_SRV_SLOTS_LIST;
        const double deadline = akv_clock_s() + s->p.timeout_s;
        /* counted in flight, as a generation is, so a stop's grace lets a save finish */
        pthread_mutex_lock(&s->mu);
        const bool ready = s->state == AKV_SRV_READY;
        if (ready) s->n_inflight++;
        pthread_mutex_unlock(&s->mu);
        if (!ready || (st = akv_srv_queue_post(&s->q, AKV_SRV_SLOT, r))) {
            if (ready) {
                pthread_mutex_lock(&s->mu);
                s->n_inflight--;
                pthread_cond_broadcast(&s->state_cv);
                pthread_mutex_unlock(&s->mu);
            }
            akv__srv_err(s, 503, "server_error", -1,
                         !ready || st == AKV_ESTATE ? "the server is shutting down" : "out of memory", &resp);
        } else {
            int w = 1;
            while (w > 0 && akv_srv_req_phase(r) != AKV_SRV_DONE) w = akv_http_conn_wait(c, r->efd, deadline);
            if (w < 0) goto out; /* the client left: the action runs on, unanswered */
            if (w == 0) akv__srv_err(s, 504, "timeout", -1, "no answer from the engine in time", &resp);
            else slot_answer(s, r, filename, &resp);
        }
    }
    akv_http_conn_send(c, &resp);
out:
    akv_srv_req_unref(r);
}
