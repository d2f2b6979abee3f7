/* Batches through sandboxes: up to lim->sandboxes runners at once, each handed the next
 * request when it has answered the last, with the wall clock and the output watched
 * from here (one poll loop, no threads); the source check at spec creation is the same
 * loop with one sandbox and no requests. sandbox_internal.h states the rules. */
#include "rewards/sandbox_internal.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define LINE_BYTES 4096  /* one result line */
#define HEAD_BYTES 240   /* the start of what a sandbox printed, for messages */
#define MAX_WORKERS 16

struct worker {
    struct sandbox_proc p;
    bool running, ready;
    int sample;              /* the request in flight; -1 none */
    double deadline;         /* monotonic seconds; the start-up's, then the sample's */
    char *send;              /* what is left to write of the current line (owned) */
    size_t send_n, send_off;
    char line[LINE_BYTES];   /* a partial result line */
    size_t line_n;
    long long printed;       /* bytes on stderr */
    char head[HEAD_BYTES];   /* the first of them */
    size_t head_n;
};

struct pool {
    const struct sandbox_host *host;
    const struct sandbox_limits *lim;
    const char *header;      /* {"source": ...}\n */
    const char *const *requests;
    struct sandbox_result *out;
    int n, next, done;       /* requests; the next to hand out; answered */
    double cpu_s;
    struct worker w[MAX_WORKERS];
    int n_workers;
    char fatal[SANDBOX_MESSAGE_BYTES]; /* a sandbox could not start the source: why */
    bool source_fault;       /* fatal came from the runner (the source's fault), not a dead sandbox */
    int starts;              /* sandboxes started, bounded: see feed */
    bool check;              /* sandbox_check: stop at the first ready or fatal */
    bool ready;              /* (check) a sandbox said ready */
};

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void finish(struct pool *pl, int i, bool ok, double score, const char *error) {
    struct sandbox_result *r = &pl->out[i];
    r->ok = ok;
    r->score = ok ? score : 0.0;
    snprintf(r->error, sizeof r->error, "%s", ok ? "" : error);
    pl->done++;
}

/* ---- one worker ---- */

static int queue_line(struct worker *w, const char *text, size_t n, struct smelt_error *err) {
    free(w->send);
    w->send = malloc(n);
    if (!w->send) return error_set(err, SMELT_ENOMEM, "sandbox: out of memory");
    memcpy(w->send, text, n);
    w->send_n = n;
    w->send_off = 0;
    return SMELT_OK;
}

static int start_worker(struct pool *pl, struct worker *w, struct smelt_error *err) {
    free(w->send);
    *w = (struct worker){.sample = -1};
    pl->starts++;
    TRY(sandbox_spawn(pl->host, pl->lim, pl->cpu_s, &w->p, err));
    w->running = true;
    w->deadline = now_s() + SANDBOX_START_S + pl->lim->timeout_s;
    return queue_line(w, pl->header, strlen(pl->header), err);
}

/* "exit status 1", "killed by SIGKILL": bwrap passes on its command's end as 128 + signal. */
static void describe_status(int status, char *buf, size_t n) {
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (code > 128 && code < 128 + NSIG) snprintf(buf, n, "killed by signal %d (%s)", code - 128, strsignal(code - 128));
    else snprintf(buf, n, "exit status %d", code);
}

/* Stops w; the sample in flight (if any) gets why, or, when why is NULL, a message from
 * the way the sandbox ended. A sandbox that never became ready could not start the
 * source: the pool stops handing out requests (pl->fatal). */
static void stop_worker(struct pool *pl, struct worker *w, const char *why) {
    int status = 0;
    sandbox_stop(&w->p, true, &status);
    w->running = false;
    free(w->send);
    w->send = NULL;
    char msg[SANDBOX_MESSAGE_BYTES], how[64];
    describe_status(status, how, sizeof how);
    if (why) snprintf(msg, sizeof msg, "%s", why);
    else snprintf(msg, sizeof msg, "the sandbox ended (%s)%s%.*s", how, w->head_n ? ": " : "", (int)w->head_n,
                  w->head);
    if (w->sample >= 0) finish(pl, w->sample, false, 0.0, msg);
    w->sample = -1;
    if (!w->ready && !pl->fatal[0]) snprintf(pl->fatal, sizeof pl->fatal, "%s", msg);
}

/* One result line of w. */
static void take_line(struct pool *pl, struct worker *w, const char *text, size_t n) {
    json_t *j = json_loadb(text, n, 0, NULL);
    const json_t *i = json_object_get(j, "i"), *score = json_object_get(j, "score"), *error = json_object_get(j, "error");
    if (json_is_true(json_object_get(j, "ready")) && !w->ready && w->sample < 0) {
        w->ready = true;
        pl->ready = true;
    } else if (json_is_string(json_object_get(j, "fatal")) && !w->ready) {
        snprintf(pl->fatal, sizeof pl->fatal, "%s", json_string_value(json_object_get(j, "fatal")));
        pl->source_fault = true;
        stop_worker(pl, w, pl->fatal);
    } else if (w->sample >= 0 && json_is_integer(i) && json_integer_value(i) == w->sample &&
               (json_is_number(score) || json_is_string(error))) {
        if (json_is_number(score)) finish(pl, w->sample, true, json_number_value(score), NULL);
        else finish(pl, w->sample, false, 0.0, json_string_value(error));
        w->sample = -1;
    } else {
        stop_worker(pl, w, "the sandbox wrote something that is not a result to its result channel");
    }
    json_decref(j);
}

/* Reads what w has for us: result lines and printed output. */
static void read_worker(struct pool *pl, struct worker *w) {
    char buf[8192];
    for (;;) { /* printed output: counted, its start kept, the rest dropped */
        ssize_t got = read(w->p.err_fd, buf, sizeof buf);
        if (got <= 0) break;
        size_t keep = HEAD_BYTES - 1 - w->head_n < (size_t)got ? HEAD_BYTES - 1 - w->head_n : (size_t)got;
        memcpy(w->head + w->head_n, buf, keep);
        w->head_n += keep;
        if ((w->printed += got) > SANDBOX_OUTPUT_BYTES) {
            char why[SANDBOX_MESSAGE_BYTES];
            snprintf(why, sizeof why, "the code printed more than %lld bytes; the sandbox was stopped",
                     SANDBOX_OUTPUT_BYTES);
            stop_worker(pl, w, why);
            return;
        }
    }
    for (;;) {
        ssize_t got = read(w->p.out_fd, w->line + w->line_n, sizeof w->line - w->line_n);
        if (got == 0 || (got < 0 && errno != EAGAIN && errno != EINTR)) {
            stop_worker(pl, w, NULL);
            return;
        }
        if (got < 0) return;
        w->line_n += (size_t)got;
        char *nl;
        while (w->running && (nl = memchr(w->line, '\n', w->line_n))) {
            size_t len = (size_t)(nl - w->line);
            take_line(pl, w, w->line, len);
            memmove(w->line, nl + 1, w->line_n - len - 1);
            w->line_n -= len + 1;
        }
        if (!w->running) return;
        if (w->line_n == sizeof w->line) {
            stop_worker(pl, w, "the sandbox wrote a result line longer than 4096 bytes");
            return;
        }
    }
}

static void write_worker(struct pool *pl, struct worker *w) {
    while (w->send && w->send_off < w->send_n) {
        ssize_t put = send(w->p.in_fd, w->send + w->send_off, w->send_n - w->send_off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (put < 0 && (errno == EAGAIN || errno == EINTR)) return;
        if (put < 0) { /* the runner is gone; its end of file on out_fd says how */
            stop_worker(pl, w, NULL);
            return;
        }
        w->send_off += (size_t)put;
    }
}

/* The next request to w: "<i> <json>\n". */
static int hand_out(struct pool *pl, struct worker *w, struct smelt_error *err) {
    int i = pl->next++;
    size_t len = strlen(pl->requests[i]);
    char *line = malloc(len + 16);
    if (!line) return error_set(err, SMELT_ENOMEM, "sandbox: out of memory");
    int k = snprintf(line, 16, "%d ", i);
    memcpy(line + k, pl->requests[i], len);
    line[k + (int)len] = '\n';
    free(w->send);
    w->send = line;
    w->send_n = (size_t)k + len + 1;
    w->send_off = 0;
    w->sample = i;
    w->deadline = now_s() + pl->lim->timeout_s + SANDBOX_GRACE_S;
    return SMELT_OK;
}

static void timed_out(struct pool *pl, struct worker *w) {
    char why[SANDBOX_MESSAGE_BYTES];
    if (!w->ready)
        snprintf(why, sizeof why, "the sandbox did not start the source within %g s; it was killed",
                 SANDBOX_START_S + pl->lim->timeout_s);
    else snprintf(why, sizeof why, "grade() did not return within %g s; the sandbox was killed", pl->lim->timeout_s);
    stop_worker(pl, w, why);
}

/* ---- the loop ---- */

static bool pool_done(const struct pool *pl) {
    if (pl->check) return pl->ready || pl->fatal[0] || !pl->w[0].running;
    return pl->done == pl->n;
}

/* Hands out work, starts replacements for dead sandboxes while requests wait. A
 * replacement is due when a sandbox died grading (that sample is answered) or right
 * after starting; code that ends its sandbox before taking any request would have it
 * replaced forever, so past n + 2 starts per sandbox slot the rest is failed. */
static int feed(struct pool *pl, struct smelt_error *err) {
    if (pl->starts > pl->n + 2 * pl->n_workers && !pl->fatal[0])
        snprintf(pl->fatal, sizeof pl->fatal, "the sandboxes kept ending before grading (%d started)", pl->starts);
    for (int k = 0; k < pl->n_workers; k++) {
        struct worker *w = &pl->w[k];
        bool waiting = pl->next < pl->n && !pl->fatal[0];
        if (!w->running && waiting && !pl->check) TRY(start_worker(pl, w, err));
        if (w->running && w->ready && w->sample < 0 && waiting) TRY(hand_out(pl, w, err));
        if (w->running) write_worker(pl, w);
    }
    return SMELT_OK;
}

static void wait_events(struct pool *pl) {
    struct pollfd pf[3 * MAX_WORKERS];
    int m = 0;
    double first = INFINITY, now = now_s();
    for (int k = 0; k < pl->n_workers; k++) {
        struct worker *w = &pl->w[k];
        if (!w->running) continue;
        pf[m++] = (struct pollfd){.fd = w->p.out_fd, .events = POLLIN};
        pf[m++] = (struct pollfd){.fd = w->p.err_fd, .events = POLLIN};
        pf[m++] = (struct pollfd){.fd = w->p.in_fd, .events = w->send && w->send_off < w->send_n ? POLLOUT : 0};
        if (w->sample >= 0 || !w->ready) first = fmin(first, w->deadline);
    }
    int wait_ms = isfinite(first) ? (int)fmax(0.0, (first - now) * 1000.0) + 1 : 1000;
    if (poll(pf, (nfds_t)m, wait_ms) < 0 && errno != EINTR) usleep(1000); /* EINVAL/ENOMEM: do not spin */
    now = now_s();
    for (int k = 0; k < pl->n_workers; k++) {
        struct worker *w = &pl->w[k];
        if (w->running) read_worker(pl, w);
        if (w->running && (w->sample >= 0 || !w->ready) && now >= w->deadline) timed_out(pl, w);
    }
}

/* Requests that never reached a sandbox because none could start the source. */
static void fail_waiting(struct pool *pl) {
    char msg[SANDBOX_MESSAGE_BYTES];
    snprintf(msg, sizeof msg, "%s%.160s", pl->source_fault ? "the source cannot be graded: " : "", pl->fatal);
    while (pl->next < pl->n) finish(pl, pl->next++, false, 0.0, msg);
}

static int run_pool(struct pool *pl, struct smelt_error *err) {
    int rc = SMELT_OK;
    for (int k = 0; k < pl->n_workers && !rc; k++) rc = start_worker(pl, &pl->w[k], err);
    while (!rc && !pool_done(pl)) {
        rc = feed(pl, err);
        if (pl->fatal[0]) fail_waiting(pl);
        if (!rc && !pool_done(pl)) wait_events(pl);
        if (pl->fatal[0]) fail_waiting(pl);
    }
    for (int k = 0; k < pl->n_workers; k++) {
        if (pl->w[k].running || pl->w[k].p.pid > 0) sandbox_stop(&pl->w[k].p, pl->w[k].sample >= 0, NULL);
        free(pl->w[k].send);
        pl->w[k].send = NULL;
    }
    return rc;
}

/* {"source": ...}\n, malloc'd. */
static char *header_line(const char *source) {
    json_t *h = json_pack("{s:s}", "source", source);
    char *text = h ? json_dumps(h, JSON_COMPACT) : NULL;
    json_decref(h);
    if (!text) return NULL;
    size_t len = strlen(text);
    char *line = realloc(text, len + 2);
    if (!line) {
        free(text);
        return NULL;
    }
    memcpy(line + len, "\n", 2);
    return line;
}

static int pool_init(struct pool *pl, struct sandbox_host *host, const char *source,
                     const struct sandbox_limits *lim, struct smelt_error *err) {
    TRY(sandbox_host_find(host, err));
    pl->host = host;
    pl->lim = lim;
    pl->header = header_line(source);
    if (!pl->header) return error_set(err, SMELT_ENOMEM, "sandbox: out of memory (the source is not UTF-8?)");
    return SMELT_OK;
}

int sandbox_check(const char *source, const struct sandbox_limits *lim, char *why, size_t why_n,
                  struct smelt_error *err) {
    struct sandbox_host host;
    struct pool pl = {.n_workers = 1, .check = true, .cpu_s = SANDBOX_START_S + lim->timeout_s + 1};
    TRY(pool_init(&pl, &host, source, lim, err));
    int rc = run_pool(&pl, err);
    free((char *)pl.header);
    if (rc) return rc;
    if (pl.ready) return SMELT_OK;
    /* A runner's fatal names the source's fault; a sandbox that died first, the host's. */
    if (pl.source_fault) {
        snprintf(why, why_n, "%s", pl.fatal);
        return SANDBOX_REFUSED;
    }
    return error_set(err, SMELT_EUNSUPPORTED, "the python sandbox could not start: %s", pl.fatal);
}

int sandbox_grade(const char *source, const struct sandbox_limits *lim, const char *const *requests, int n,
                  struct sandbox_result *out, struct smelt_error *err) {
    if (n <= 0) return SMELT_OK;
    struct sandbox_host host;
    int workers = lim->sandboxes < n ? lim->sandboxes : n;
    struct pool pl = {.requests = requests, .out = out, .n = n, .n_workers = workers < MAX_WORKERS ? workers : MAX_WORKERS,
                      .cpu_s = fmin(SANDBOX_START_S + lim->timeout_s * n + 1, 86400.0)};
    for (int i = 0; i < n; i++) out[i] = (struct sandbox_result){0};
    TRY(pool_init(&pl, &host, source, lim, err));
    int rc = run_pool(&pl, err);
    free((char *)pl.header);
    if (rc) /* the batch is lost: every result says so */
        for (int i = 0; i < n; i++) {
            out[i] = (struct sandbox_result){0};
            snprintf(out[i].error, sizeof out[i].error, "not graded: %.180s", err ? err->message : "");
        }
    return rc;
}
