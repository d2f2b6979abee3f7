/* weightsync/: new weights from trainer rank 0 to the rollout workers after each optimizer
 * step (docs/architecture.md §5 "Weight sync").
 *
 * A sync is one weights.begin carrying the metadata (every tensor's name, dtype, shape and
 * byte range in one packed byte stream, the total, the bucket size, the policy version,
 * the kind), then the stream cut into fixed-size buckets (a tensor may span buckets),
 * sent back to back without waiting for any answer, then weights.end. The receiver
 * copies each bucket into a staging buffer as it comes (so bucket k is copied while
 * k + 1 is in flight), checks everything arrived — every bucket once, each of its
 * expected size, each matching its XXH64 — and only then hands the whole stream over to
 * be applied, between two engine steps, in one go. Whatever is wrong is refused naming
 * the field at fault and the old weights stay.
 *
 * Kinds:
 *   "full" — the model's flat f32 weights (model->weights: every parameter in the order
 *            of model->params, smelt's names): what rollout_engine_set_weights_version
 *            takes.
 *   "lora" — only the adapter's flat f32 buffer (lora->weights: PEFT's tensor names, A
 *            then B per wrapped module), with its rank, alpha and use_rslora. The
 *            receiving worker must have been started with an adapter of the same
 *            configuration (smelt-rollout --adapter, e.g. the adapter the trainer saved
 *            at step 0): the update is a copy into that adapter's buffer, which the
 *            engine applies unmerged. A worker without one refuses "lora" syncs.
 * The receiver accepts only the layout it has (same tensors, order, shapes, offsets):
 * the stream is then byte for byte its own flat buffer.
 *
 * Transports: struct weightsync_transport is what the sender (weightsync_push) talks to:
 * begin (the metadata), bucket (one packed bucket, host memory, valid during the call),
 * finish (the end, then wait until every receiver has applied the weights or refused
 * them). The ZeroMQ byte transport is the rollout client's (rollout/client.c): its
 * DEALER sockets, the same connection as gen.*, carrying the messages this folder
 * encodes (weightsync_*_header / weightsync_*_read; types in common/msg.h). A collective
 * transport (NCCL broadcast, Gloo, CUDA IPC) would send the metadata over ZeroMQ the same
 * way and move the bytes itself, receiving bucket k straight into
 * weightsync_receiver_bucket_dst and confirming it with weightsync_receiver_landed.
 *
 * Ownership: a struct weightsync_meta owns its tensor table (weightsync_meta_free). The
 * receiver owns its staging buffer; the model and adapter it checks against are
 * borrowed and must outlive it. */
#ifndef SMELT_WEIGHTSYNC_H
#define SMELT_WEIGHTSYNC_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "comm/comm.h"
#include "common/error.h"
#include "common/msg.h"
#include "kernels/ops.h"
#include "lora/lora.h"
#include "model/model.h"

/* Bucket size when the caller gives none: large enough that per-message costs vanish,
 * small enough that receiving overlaps sending. */
#define WEIGHTSYNC_DEFAULT_BUCKET_BYTES (32ll << 20)
/* Bucket sizes: whole f32 elements, at most 1 GiB (one ZeroMQ frame). */
#define WEIGHTSYNC_MAX_BUCKET_BYTES (1ll << 30)
#define WEIGHTSYNC_NAME_BYTES 160   /* a tensor's name, NUL included (PEFT's names fit) */

enum weightsync_kind { WEIGHTSYNC_FULL, WEIGHTSYNC_LORA };

const char *weightsync_kind_name(enum weightsync_kind kind); /* "full", "lora" */

/* How the bytes move: as weights.bucket messages (the metadata, the end and the acks go
 * over ZeroMQ either way), or by a comm_broadcast from the sender (group rank 0) to the
 * receivers (ranks 1..N). NCCL and CUDA IPC would be further values. */
enum weightsync_via { WEIGHTSYNC_VIA_ZMQ, WEIGHTSYNC_VIA_BROADCAST };
const char *weightsync_via_name(enum weightsync_via via); /* "zmq", "broadcast" */
#define WEIGHTSYNC_COMM_NAME_BYTES 65 /* a comm_options.name, NUL included */

/* One tensor: a byte range [offset_bytes, offset_bytes + bytes) of the packed stream. */
struct weightsync_tensor {
    char name[WEIGHTSYNC_NAME_BYTES];
    enum dtype dtype;            /* DTYPE_F32 (the only one today) */
    int ndim;                    /* 1 or 2 */
    int64_t shape[2];            /* shape[1] is 1 when ndim is 1 */
    int64_t offset_bytes, bytes;
};

struct weightsync_meta {
    enum weightsync_kind kind;
    int64_t version;             /* the policy version the weights become (the trainer's iteration) */
    int64_t total_bytes;         /* the stream: the tensors back to back */
    int64_t bucket_bytes;        /* every bucket but the last holds this many */
    int64_t n_buckets;           /* ceil(total_bytes / bucket_bytes) */
    struct { int rank; float alpha; bool use_rslora; } lora; /* kind lora only */
    /* The transport of the bytes (WEIGHTSYNC_VIA_ZMQ unless the sender sets it); for a
     * broadcast, the communicator the receivers join (its comm_options.name in the store
     * they were started with: a new name after a failure) and its timeout. */
    struct { enum weightsync_via kind; char comm[WEIGHTSYNC_COMM_NAME_BYTES]; int timeout_ms; } via;
    struct weightsync_tensor *tensors; /* [n_tensors], owned */
    int n_tensors;
};

/* The metadata of a full sync of model (model->params), or of a LoRA sync of adapter.
 * bucket_bytes 0 takes WEIGHTSYNC_DEFAULT_BUCKET_BYTES; otherwise a multiple of 4 in
 * [4, WEIGHTSYNC_MAX_BUCKET_BYTES] (SMELT_EINVAL naming "bucket_bytes"). */
int weightsync_meta_model(const struct model *model, int64_t version, int64_t bucket_bytes,
                          struct weightsync_meta *out, struct smelt_error *err);
int weightsync_meta_lora(const struct lora *adapter, int64_t version, int64_t bucket_bytes,
                         struct weightsync_meta *out, struct smelt_error *err);
void weightsync_meta_free(struct weightsync_meta *meta);

/* Bytes of bucket index (the last one may be short). */
int64_t weightsync_bucket_size(const struct weightsync_meta *meta, int64_t index);

/* XXH64 (seed 0) of bytes: the bucket checksum, cheap enough (several GB/s) to be
 * computed on both sides of every sync. */
uint64_t weightsync_hash(const void *data, size_t bytes);

/* ---- sending ---- */

struct weightsync_bucket {
    int64_t version, index;
    const void *data;            /* host memory; borrowed for the call */
    int64_t bytes;
    uint64_t hash;               /* weightsync_hash(data, bytes) */
};

/* One receiver's answer: the weights of version are in use. */
struct weightsync_ack {
    int64_t version;
    enum weightsync_kind kind;
    int64_t bytes;               /* payload bytes the receiver took in (its bucket frames) */
    int64_t buckets;
    double seconds;              /* its weights.begin to weights applied */
};

/* What a push did, for the loop to print (sync time and bytes). */
struct weightsync_report {
    int64_t version;
    enum weightsync_kind kind;
    int64_t bytes;               /* payload per receiver: total_bytes (LoRA: the adapter's size) */
    int64_t bytes_sent;          /* over every receiver */
    int64_t buckets;             /* per receiver */
    int receivers;
    double send_seconds;         /* begin until the last bucket was handed to the transport */
    double seconds;              /* begin until the last receiver acknowledged */
    double receiver_seconds;     /* the slowest receiver's own figure (its ack) */
};

/* A transport. After a failed call the sender stops: the sync is abandoned (the next
 * begin supersedes it at every receiver), so a transport that may have sent a begin
 * should make sure no answer of it is taken for a later sync's. */
struct weightsync_transport {
    void *ctx;
    int (*begin)(void *ctx, const struct weightsync_meta *meta, struct smelt_error *err);
    int (*bucket)(void *ctx, const struct weightsync_bucket *bucket, struct smelt_error *err);
    /* Optional: a transport that moves the whole stream itself (a broadcast) sets stream,
     * called in place of bucket for every bucket, with the source as weightsync_push got it. */
    int (*stream)(void *ctx, const struct weightsync_meta *meta, const struct tensor *source,
                  struct smelt_error *err);
    /* Ends the sync and waits for every receiver: fills receivers, bytes_sent and
     * receiver_seconds of report; an error names the receiver that refused or died. */
    int (*finish)(void *ctx, const struct weightsync_meta *meta, struct weightsync_report *report,
                  struct smelt_error *err);
};

/* Pushes source (f32, numel * 4 == meta->total_bytes, on any backend) through t:
 * begin, every bucket (straight from source on the CPU; copied bucket by bucket to one
 * host buffer from a device), finish. Fills report. */
int weightsync_push(const struct weightsync_transport *t, const struct weightsync_meta *meta,
                    const struct tensor *source, struct weightsync_report *report,
                    struct smelt_error *err);

/* ---- receiving ----
 *
 * One sync at a time: begin (checked against what this receiver has), buckets in any
 * order, end. Every function returns SMELT_OK, an error (err->field names the field at
 * fault; the sync is then over, refused, and its later messages are ignored), or
 * WEIGHTSYNC_IGNORED for a message of a sync already refused (answer nothing: its
 * sender has its answer). A message for another version than the one in progress is
 * refused without ending that one; a bucket or end with no sync at all is refused (and
 * the rest of its version ignored). A begin while another sync is in progress
 * supersedes it (weightsync_receiver_busy says whether one is). */
#define WEIGHTSYNC_IGNORED 1

enum weightsync_rx_state { WEIGHTSYNC_RX_IDLE, WEIGHTSYNC_RX_RECEIVING, WEIGHTSYNC_RX_COMPLETE };

struct weightsync_receiver {
    struct weightsync_meta full;  /* this model's layout */
    struct weightsync_meta lora;  /* the adapter's; n_tensors 0 when there is none */
    bool has_adapter;
    enum weightsync_rx_state state;
    struct weightsync_meta meta;  /* the sync in progress (its copy) */
    uint8_t *staging;             /* [staging_bytes] host */
    int64_t staging_bytes;
    uint8_t *arrived;             /* [meta.n_buckets] */
    int64_t n_arrived, bytes_arrived;
    bool refused;                 /* refused_version's later messages are ignored */
    int64_t refused_version;
    double begin_seconds;         /* monotonic clock at begin */
};

/* adapter may be NULL (then "lora" syncs are refused). */
int weightsync_receiver_init(struct weightsync_receiver *rx, const struct model *model,
                             const struct lora *adapter, struct smelt_error *err);
void weightsync_receiver_free(struct weightsync_receiver *rx);
bool weightsync_receiver_busy(const struct weightsync_receiver *rx);

/* meta is checked against this receiver's layout and current_version (the engine's
 * policy version, which meta->version must exceed), then copied. */
int weightsync_receiver_begin(struct weightsync_receiver *rx, const struct weightsync_meta *meta,
                              int64_t current_version, struct smelt_error *err);
/* A bucket that arrived in a message: checked and copied into the staging buffer. */
int weightsync_receiver_bucket(struct weightsync_receiver *rx, const struct weightsync_bucket *bucket,
                               struct smelt_error *err);
/* For transports that write in place: where bucket index of version goes (*dst, *bytes),
 * then weightsync_receiver_landed once the bytes are there. */
int weightsync_receiver_bucket_dst(struct weightsync_receiver *rx, int64_t version, int64_t index,
                                   void **dst, int64_t *bytes, struct smelt_error *err);
int weightsync_receiver_landed(struct weightsync_receiver *rx, int64_t version, int64_t index,
                               uint64_t hash, struct smelt_error *err);
/* landed for a transport that hashed the bytes itself as they landed (got) and learns the
 * sender's hash (want) only later (a broadcast: the hashes come in weights.end). */
int weightsync_receiver_landed_hashed(struct weightsync_receiver *rx, int64_t version, int64_t index,
                                      uint64_t got, uint64_t want, struct smelt_error *err);
/* The end: every bucket must have arrived. On success the sync is COMPLETE and
 * weightsync_receiver_stream gives the bytes to apply; then call
 * weightsync_receiver_done, whether applying worked or not. */
int weightsync_receiver_end(struct weightsync_receiver *rx, int64_t version, int64_t n_buckets,
                            int64_t total_bytes, struct smelt_error *err);
/* The complete stream (kind and layout in rx->meta): valid until the next begin. */
const void *weightsync_receiver_stream(const struct weightsync_receiver *rx);
/* Ends a COMPLETE sync: its ack (seconds measured from begin), the receiver idle. */
struct weightsync_ack weightsync_receiver_done(struct weightsync_receiver *rx);
/* Ends the sync in progress without applying it: abandon (superseded; its later
 * messages are answered as strays) or refuse (the caller refused it, say a malformed
 * message or a failed apply: its later messages are WEIGHTSYNC_IGNORED). */
void weightsync_receiver_abandon(struct weightsync_receiver *rx);
void weightsync_receiver_refuse(struct weightsync_receiver *rx);

/* ---- the ZeroMQ messages (common/msg.h: weights.begin / bucket / end / ack / error) ----
 *
 * *_header builds a message's JSON header (a new reference; NULL when out of memory);
 * *_read checks and reads one: unknown fields, wrong types and out-of-range values are
 * SMELT_EINVAL with err->field naming the header field ("bytes" for a bucket's frame).
 * A bucket read points into the message's frame (valid while the message lives); a
 * begin read fills a meta to free with weightsync_meta_free. */
json_t *weightsync_begin_header(const struct weightsync_meta *meta);
int weightsync_begin_read(const struct msg *m, struct weightsync_meta *out, struct smelt_error *err);
json_t *weightsync_bucket_header(const struct weightsync_bucket *bucket);
int weightsync_bucket_read(const struct msg *m, struct weightsync_bucket *out, struct smelt_error *err);
/* hashes: NULL, or (a broadcast sync) every bucket's XXH64, [meta->n_buckets]. */
json_t *weightsync_end_header(const struct weightsync_meta *meta, const uint64_t *hashes);
int weightsync_end_read(const struct msg *m, int64_t *version, int64_t *n_buckets, int64_t *total_bytes,
                        struct smelt_error *err);
/* The hashes of a weights.end already read (n_buckets of them): SMELT_EINVAL naming
 * "hashes" when they are missing or not n_buckets XXH64s. */
int weightsync_end_hashes(const struct msg *m, int64_t n_buckets, uint64_t *out, struct smelt_error *err);
json_t *weightsync_ack_header(const struct weightsync_ack *ack);
int weightsync_ack_read(const struct msg *m, struct weightsync_ack *out, struct smelt_error *err);
/* The "version" of any weights.* header, when it has an integer one (else -1): how a
 * reply is matched to its sync. */
int64_t weightsync_header_version(const struct msg *m);

/* ---- the broadcast transport's bytes (broadcast.c) ----
 *
 * Both sides walk the buckets of meta in order, one comm_broadcast each from group rank
 * root, double-buffered: bucket k + 1 is in flight (the communicator's thread) while
 * bucket k is hashed. The sender reads source (f32, meta->total_bytes; a device source is
 * copied through two host buckets, so at most two buckets of host memory) and fills
 * hashes[k] (XXH64) for weights.end. The receiver writes each bucket straight into rx's
 * staging buffer (weightsync_receiver_bucket_dst) when rx is receiving meta's version;
 * when it is not (rx refused the begin), it still takes part — into a scratch bucket,
 * thrown away — so the group's collectives stay in step; got[k] is the hash of what
 * landed, for weightsync_receiver_landed_hashed once weights.end brings the sender's.
 * A failed broadcast returns comm's error (the communicator is broken after it). */
int weightsync_broadcast_send(struct comm *comm, int root, const struct weightsync_meta *meta,
                              const struct tensor *source, uint64_t *hashes, struct smelt_error *err);
int weightsync_broadcast_receive(struct comm *comm, int root, struct weightsync_receiver *rx,
                                 const struct weightsync_meta *meta, uint64_t *got, struct smelt_error *err);

#endif
