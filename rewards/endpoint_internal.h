/* Private to rewards/: smelt's endpoint grader, {"type": "endpoint", "url": ...}: the
 * batch POSTed as JSON to the user's service, one reward per sample read back.
 * docs/rewards.md ("endpoint") is the user's reference: the request and reply the
 * service must implement, timeouts, retries, what fails a sample.
 *
 * endpoint_grader.c owns the grader (its fields, the request bodies, the replies read
 * into per-sample results); endpoint_http.c owns the HTTP client (libcurl: one POST with
 * timeouts and bounded retries, the reply's size bounded). The requests are made by the
 * process that scores the batch: the job's trainer (smelt-trainer, on the agent's
 * machine), never smeltd, which only reads the spec (no request is made then).
 *
 * A service that cannot answer (unreachable, slow, an HTTP error, a reply that is not
 * {"rewards": [...]} of the request's length) fails the samples of that request, with
 * a message naming what was wrong; a null or non-number reward fails that one sample.
 * Only memory failures fail the scoring call. */
#ifndef SMELT_REWARDS_ENDPOINT_INTERNAL_H
#define SMELT_REWARDS_ENDPOINT_INTERNAL_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "rewards/graders_internal.h"

struct curl_slist; /* <curl/curl.h>: only endpoint_http.c calls libcurl */

#define ENDPOINT_MAX_URL_BYTES 2048
#define ENDPOINT_MAX_HEADERS 16
#define ENDPOINT_MAX_HEADER_NAME_BYTES 64
#define ENDPOINT_MAX_HEADER_VALUE_BYTES 4096
#define ENDPOINT_DEFAULT_TIMEOUT_S 30.0
#define ENDPOINT_MAX_TIMEOUT_S 600.0
#define ENDPOINT_DEFAULT_RETRIES 2
#define ENDPOINT_MAX_RETRIES 10
#define ENDPOINT_CHUNK_SAMPLES 256              /* samples in one request at most */
#define ENDPOINT_CHUNK_BYTES (8u << 20)         /* a body grows past this only with its first sample */
#define ENDPOINT_MAX_REPLY_BYTES (16u << 20)
#define ENDPOINT_WHY_BYTES 200                  /* a sample's failure, before the grader's name */

/* ---- endpoint_grader.c ---- */

struct grader_endpoint;

/* The endpoint grader's own fields of obj (type and name are read by graders.c): url,
 * timeout_s, max_retries, headers. w names it in messages; err->field is the key
 * ("url", "headers.Authorization"). Makes no request. */
int grader_endpoint_parse(const json_t *obj, const char *w, struct reward_grader *g, struct smelt_error *err);
void grader_endpoint_free(struct grader_endpoint *ep); /* NULL is fine */
/* Adds the fields to obj, defaults filled; nonzero when out of memory. */
int grader_endpoint_to_json(const struct grader_endpoint *ep, json_t *obj);
/* Every endpoint grader of the tree (g, or a multi's sub-graders) on the batch
 * samples[0..n): the requests are made now, the results kept for
 * grader_endpoint_result. SMELT_ENOMEM only; a service's failure fails samples. */
int grader_endpoint_prepare(struct reward_grader *g, const struct reward_sample *samples, int n,
                            struct smelt_error *err);
/* Sample i of the last batch: 0 with *score, or GRADER_FAILED with why. */
int grader_endpoint_result(const struct grader_endpoint *ep, int i, double *score, char *why, size_t why_n);
/* A batch of n (1 to ENDPOINT_CHUNK_SAMPLES) samples scored from reply as if its one request
 * had got it, without a request: what tests/fuzz/fuzz_endpoint_reply.c feeds the replies'
 * reader. SMELT_ENOMEM (SMELT_EINVAL for n); then grader_endpoint_result per sample. */
struct endpoint_reply;
int grader_endpoint_read_reply(struct grader_endpoint *ep, int n, const struct endpoint_reply *reply,
                               struct smelt_error *err);

/* ---- endpoint_http.c: one POST through libcurl ---- */

/* Where and how to POST (owned by the grader). */
struct endpoint_target {
    char *url;                  /* http:// or https:// (checked by endpoint_url_check) */
    double timeout_s;           /* one attempt, connect and transfer together */
    int max_retries;            /* attempts after the first */
    struct curl_slist *headers; /* the user's, then smelt's framing headers */
    char *noproxy;              /* the environment's no_proxy plus the loopback names */
};

/* What one POST brought back. */
struct endpoint_reply {
    long status;                /* the last attempt's HTTP status; 0 when none answered */
    struct reward_buf body;     /* its body (at most ENDPOINT_MAX_REPLY_BYTES) */
    int attempts;
};

/* libcurl's global state, set up once per process (thread-safe; later calls return the
 * first one's result): 0, or SMELT_EBACKEND with the reason in why. */
int endpoint_http_init(char *why, size_t why_n);
/* url must be an absolute http or https URL with a host and no user name or password:
 * 0, or SMELT_EINVAL with why. */
int endpoint_url_check(const char *url, char *why, size_t why_n);
/* Adds "name: value" to t->headers (the caller checked both): 0 or SMELT_ENOMEM. */
int endpoint_target_add_header(struct endpoint_target *t, const char *name, const char *value);
/* After the user's headers: smelt's framing headers (Content-Type: application/json, no
 * "Expect: 100-continue"), and t->noproxy from the environment: 0 or SMELT_ENOMEM. */
int endpoint_target_finish(struct endpoint_target *t);
void endpoint_target_free(struct endpoint_target *t);
/* POSTs body[0..n) (application/json) to t, retrying connection errors, 429 and 5xx
 * with a backoff (a 429's or 503's Retry-After honoured up to timeout_s) at most
 * t->max_retries times; a timed-out attempt that had connected, and any other status,
 * are final. 0 when an answer came (any status, in r), ENDPOINT_NO_ANSWER with why when
 * none did (or its body was over ENDPOINT_MAX_REPLY_BYTES), SMELT_ENOMEM. r->body is
 * the caller's to free (reward_buf_free), also on failure. */
#define ENDPOINT_NO_ANSWER 1
int endpoint_http_post(const struct endpoint_target *t, const char *body, size_t n, struct endpoint_reply *r,
                       char *why, size_t why_n);

#endif
