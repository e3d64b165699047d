/*
 * slots.c — slots, llama-server's numbered view of the conversations an engine holds: every
 * context, running or idle, has a number (given when it first runs or goes idle, the lowest
 * free one, kept while it lives), by which a client lists, saves, restores and erases them.
 * A save or a restore is a session file (session.c); the engine thread runs them between steps.
 */
#include <stdlib.h>

#include "core/log.h"
#include "engine/engine_impl.h"

/* The context holding slot id (NULL: none), running or idle. */
static akv__ctx *slot_find(const akv_engine *e, uint32_t id) {
    for (akv__ctx *c = e->idle_head; c; c = c->next)
        if (c->slot1 == id + 1) return c;
    for (uint32_t i = 0; i < e->n_run; i++)
        if (e->run[i]->ctx && e->run[i]->ctx->slot1 == id + 1) return e->run[i]->ctx;
    return NULL;
}

static int slot_cmp(const void *a, const void *b) {
    const akv_engine_slot *x = a, *y = b;
    return x->id < y->id ? -1 : x->id > y->id;
}

uint32_t akv_engine_slots(const akv_engine *e, akv_engine_slot *out, uint32_t cap) {
    uint32_t n = 0;
    for (uint32_t i = 0; i < e->n_run; i++) {
        const akv__ctx *c = e->run[i]->ctx;
        if (c && n < cap)
            out[n] = (akv_engine_slot){.id = c->slot1 - 1, .n_tokens = c->n_tokens, .running = true,
                                       .request_id = e->run[i]->p.id};
        n += c != NULL;
    }
    for (const akv__ctx *c = e->idle_head; c; c = c->next, n++)
        if (n < cap) out[n] = (akv_engine_slot){.id = c->slot1 - 1, .n_tokens = c->n_tokens};
    if (n <= cap && n > 1) qsort(out, n, sizeof *out, slot_cmp); /* out may be NULL: cap 0 */
    return n;
}

/* The idle context of slot id for an action named `what`: AKV_ENOTFOUND or AKV_EBUSY (logged)
 * when there is none or a request runs on it. */
static akv_status slot_idle(const akv_engine *e, uint32_t id, const char *what, akv__ctx **out) {
    akv__ctx *c = slot_find(e, id);
    if (!c) {
        AKV_LOG_E("engine: %s slot %u: no conversation holds it", what, id);
        return AKV_ENOTFOUND;
    }
    if (c->owner) {
        AKV_LOG_E("engine: %s slot %u: request %llu is running on it", what, id,
                  (unsigned long long)c->owner->p.id);
        return AKV_EBUSY;
    }
    *out = c;
    return AKV_OK;
}

akv_status akv_engine_slot_save(akv_engine *e, uint32_t id, const char *path, uint32_t *n_tokens) {
    if (!e || !path) return AKV_EINVAL;
    akv__ctx *c;
    akv_status st = slot_idle(e, id, "save", &c);
    if (!st) st = akv__session_write(e, c, path);
    if (!st && n_tokens) *n_tokens = c->n_tokens;
    return st;
}

akv_status akv_engine_slot_restore(akv_engine *e, uint32_t id, const char *path, uint32_t *n_tokens) {
    if (!e || !path) return AKV_EINVAL;
    if (id >= AKV_ENGINE_MAX_SLOT) {
        AKV_LOG_E("engine: restore into slot %u: slots are numbered below %u", id, AKV_ENGINE_MAX_SLOT);
        return AKV_EINVAL;
    }
    akv__ctx *old = slot_find(e, id);
    if (old && old->owner) {
        AKV_LOG_E("engine: restore into slot %u: request %llu is running on it", id,
                  (unsigned long long)old->owner->p.id);
        return AKV_EBUSY;
    }
    if (old && old->n_pin) {
        AKV_LOG_E("engine: restore into slot %u: an admitted request starts from its conversation "
                  "at the next step; try again after it", id);
        return AKV_EBUSY;
    }
    /* the file first: one that cannot be loaded leaves the slot as it was */
    akv__ctx *c = NULL;
    akv_status st = akv__session_read(e, path, &c, NULL);
    if (st) return st;
    const uint32_t n = c->n_tokens;
    const int8_t retention = c->retention;
    /* the slot's conversation out of the idle list, so its room counts for the restored one
     * and the trim that makes room closes neither; the restored one the most precious */
    if (old) akv__engine_idle_remove(e, old);
    c->slot1 = id + 1, c->retention = INT8_MAX;
    e->leaving = old; /* its own pages count as free */
    st = akv__engine_idle_adopt(e, c, false);
    e->leaving = NULL;
    /* still there (the trim may close even the most precious: max_idle 0)? Found by its slot,
     * which no other context holds now */
    bool kept = false;
    for (const akv__ctx *o = e->idle_head; !st && o && !kept; o = o->next) kept = o->slot1 == id + 1;
    if (!kept) { /* closed: the slot as it was */
        if (old) (void)akv__engine_idle_adopt(e, old, false);
        AKV_LOG_E("engine: the session '%s' (%u tokens) does not fit beside the running "
                  "requests' reservations and the idle conversations kept: slot %u left as it "
                  "was", path, n, id);
        return AKV_EFULL;
    }
    c->retention = retention;
    akv__ctx_close(e, old); /* NULL: none */
    if (n_tokens) *n_tokens = n;
    return AKV_OK;
}

akv_status akv_engine_slot_erase(akv_engine *e, uint32_t id, uint32_t *n_tokens) {
    if (!e) return AKV_EINVAL;
    akv__ctx *c;
    akv_status st = slot_idle(e, id, "erase", &c);
    if (st) return st;
    if (c->n_pin) {
        AKV_LOG_E("engine: erase slot %u: an admitted request starts from its conversation at the "
                  "next step; try again after it", id);
        return AKV_EBUSY;
    }
    if (n_tokens) *n_tokens = c->n_tokens;
    akv__engine_idle_remove(e, c);
    akv__ctx_close(e, c);
    return AKV_OK;
}
