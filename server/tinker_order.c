/* Per-model ordering of Tinker requests (tinker_api.h): the SDK numbers each training
 * client's requests (seq_id) and may send them out of order (forward_backward chunks go
 * concurrently, the first last), while the worker must see them in order. Early requests
 * wait here; a request repeated by a retry answers the first one's future. A model's state
 * (about 140 KiB: the seen ring) lives from its create_model until its session job ends
 * (tinker_api_forget_job), found by id in O(1). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "server/tinker_api.h"

#define ORDER_SEEN_MAX 1024 /* futures remembered per model for repeated seq ids */
#define ORDER_AHEAD_MAX 1024 /* how far past the next expected seq a request may come (what waits is bounded) */

struct order_item {
    int64_t seq;
    char future_id[TINKER_ID_BYTES];
    void *payload; /* NULL: a skipped seq (refused at submission) */
    struct order_item *next;
};

struct order_seen {
    int64_t seq;
    char future_id[TINKER_ID_BYTES];
};

struct order_model {
    int64_t next_seq;
    struct order_item *waiting; /* sorted by seq, all > next_seq - 1 */
    struct order_seen seen[ORDER_SEEN_MAX];
    int n_seen, seen_at;        /* a ring once full */
};

struct tinker_order {
    pthread_mutex_t lock;
    tinker_order_send_fn send;
    void (*free_payload)(void *payload);
    struct strmap models; /* model id -> struct order_model: opened by create_model, closed when it ends */
};

int tinker_order_new(tinker_order_send_fn send, void (*free_payload)(void *), struct tinker_order **out,
                     struct smelt_error *err) {
    struct tinker_order *o = calloc(1, sizeof *o);
    if (!o) return error_set(err, SMELT_ENOMEM, "out of memory");
    pthread_mutex_init(&o->lock, NULL);
    o->send = send;
    o->free_payload = free_payload;
    *out = o;
    return 0;
}

static void items_free(struct tinker_order *o, struct order_item *it) {
    while (it) {
        struct order_item *next = it->next;
        if (it->payload) o->free_payload(it->payload);
        free(it);
        it = next;
    }
}

static void model_free(struct tinker_order *o, struct order_model *m) {
    if (!m) return;
    items_free(o, m->waiting);
    free(m);
}

void tinker_order_free(struct tinker_order *o) {
    if (!o) return;
    for (size_t i = 0; i < o->models.cap; i++)
        if (o->models.slots[i].key) model_free(o, o->models.slots[i].value);
    strmap_free(&o->models);
    pthread_mutex_destroy(&o->lock);
    free(o);
}

/* The model's state, made (expecting seq 1: create_model is seq 0) when new; NULL when out of memory. */
static struct order_model *model_get(struct tinker_order *o, const char *model_id) {
    struct order_model *m = strmap_get(&o->models, model_id);
    if (m || strlen(model_id) >= TINKER_ID_BYTES || !(m = calloc(1, sizeof *m))) return m;
    m->next_seq = 1;
    struct smelt_error err = {0};
    if (strmap_put(&o->models, model_id, m, &err) != 0) {
        free(m);
        return NULL;
    }
    return m;
}

int tinker_order_open(struct tinker_order *o, const char *model_id, int64_t next_seq, struct smelt_error *err) {
    pthread_mutex_lock(&o->lock);
    struct order_model *m = model_get(o, model_id);
    if (m) {
        items_free(o, m->waiting);
        m->waiting = NULL;
        m->n_seen = m->seen_at = 0;
        m->next_seq = next_seq;
    }
    pthread_mutex_unlock(&o->lock);
    return m ? 0 : error_set(err, SMELT_ENOMEM, "out of memory ordering requests of %s", model_id);
}

static void remember(struct order_model *m, int64_t seq, const char *future_id) {
    struct order_seen *s = &m->seen[m->seen_at];
    s->seq = seq;
    snprintf(s->future_id, sizeof s->future_id, "%s", future_id);
    m->seen_at = (m->seen_at + 1) % ORDER_SEEN_MAX;
    if (m->n_seen < ORDER_SEEN_MAX) m->n_seen++;
}

static const char *seen_future(const struct order_model *m, int64_t seq) {
    for (int i = 0; i < m->n_seen; i++)
        if (m->seen[i].seq == seq) return m->seen[i].future_id;
    for (const struct order_item *it = m->waiting; it; it = it->next)
        if (it->seq == seq && it->payload) return it->future_id;
    return NULL;
}

/* Sends every waiting request that is due, in seq order. */
static void drain(struct tinker_order *o, struct order_model *m, void *ctx) {
    while (m->waiting && m->waiting->seq == m->next_seq) {
        struct order_item *it = m->waiting;
        m->waiting = it->next;
        m->next_seq++;
        if (it->payload) o->send(ctx, it->payload, it->future_id);
        free(it);
    }
}

/* A request waiting in seq order; one that comes for a seq passed over earlier (refused
 * at submission) takes its place. */
static int insert(struct order_model *m, int64_t seq, const char *future_id, void *payload,
                  struct smelt_error *err) {
    struct order_item **at = &m->waiting;
    while (*at && (*at)->seq < seq) at = &(*at)->next;
    struct order_item *it = *at && (*at)->seq == seq ? *at : calloc(1, sizeof *it);
    if (!it) return error_set(err, SMELT_ENOMEM, "out of memory ordering requests");
    if (it != *at) {
        it->next = *at;
        *at = it;
    } else if (!payload) {
        return 0; /* passed over twice */
    }
    it->seq = seq;
    snprintf(it->future_id, sizeof it->future_id, "%s", future_id);
    it->payload = payload;
    if (future_id[0]) remember(m, seq, future_id);
    return 0;
}

int tinker_order_submit(struct tinker_order *o, const char *model_id, int64_t seq, const char *future_id,
                        void *payload, void *ctx, char *first_id, size_t cap, struct smelt_error *err) {
    if (first_id && cap) first_id[0] = '\0';
    pthread_mutex_lock(&o->lock);
    struct order_model *m = model_get(o, model_id);
    const char *seen = m ? seen_future(m, seq) : NULL;
    int rc = 0;
    if (seq < 1) rc = error_set_field(err, SMELT_EINVAL, "seq_id", "seq_id: %lld; a model's requests count from 1",
                                      (long long)seq);
    else if (!m) rc = error_set(err, SMELT_ENOMEM, "out of memory ordering requests of %s", model_id);
    else if (seen) {
        if (first_id) snprintf(first_id, cap, "%s", seen);
        rc = TINKER_ORDER_REPEATED;
    } else if (seq < m->next_seq)
        rc = error_set_field(err, SMELT_EINVAL, "seq_id", "seq_id %lld: this model's requests are past it (next: "
                             "%lld)", (long long)seq, (long long)m->next_seq);
    else if (seq - m->next_seq > ORDER_AHEAD_MAX)
        rc = error_set_field(err, SMELT_EINVAL, "seq_id", "seq_id %lld: more than %d ahead of this model's next "
                             "request (%lld)", (long long)seq, ORDER_AHEAD_MAX, (long long)m->next_seq);
    else rc = insert(m, seq, future_id ? future_id : "", payload, err);
    if (rc == 0) drain(o, m, ctx);
    pthread_mutex_unlock(&o->lock);
    return rc;
}

int tinker_order_skip(struct tinker_order *o, const char *model_id, int64_t seq, void *ctx) {
    struct smelt_error err = {0};
    int rc = tinker_order_submit(o, model_id, seq, NULL, NULL, ctx, NULL, 0, &err);
    return rc == TINKER_ORDER_REPEATED ? 0 : rc;
}

void tinker_order_close(struct tinker_order *o, const char *model_id) {
    pthread_mutex_lock(&o->lock);
    model_free(o, strmap_remove(&o->models, model_id));
    pthread_mutex_unlock(&o->lock);
}

bool tinker_order_cancel(struct tinker_order *o, const char *model_id, const char *future_id) {
    pthread_mutex_lock(&o->lock);
    struct order_model *m = strmap_get(&o->models, model_id);
    struct order_item *it = m ? m->waiting : NULL;
    while (it && !(it->payload && strcmp(it->future_id, future_id) == 0)) it = it->next;
    if (it) { /* its seq stays, passed over when its turn comes */
        o->free_payload(it->payload);
        it->payload = NULL;
    }
    pthread_mutex_unlock(&o->lock);
    return it != NULL;
}

size_t tinker_order_count(struct tinker_order *o) {
    pthread_mutex_lock(&o->lock);
    size_t n = o->models.count;
    pthread_mutex_unlock(&o->lock);
    return n;
}
