/* Private to weightsync/: reading a sync's source bucket by bucket, shared by the
 * message sender (push.c, which defines them) and the broadcast one (broadcast.c). */
#ifndef SMELT_WEIGHTSYNC_INTERNAL_H
#define SMELT_WEIGHTSYNC_INTERNAL_H

#include "weightsync/weightsync.h"

/* source is f32 of meta->total_bytes, and meta's bucket size is whole f32s within the limit. */
int weightsync_check_source(const struct weightsync_meta *meta, const struct tensor *source,
                            struct smelt_error *err);
/* Bucket index of source in host memory: a pointer into source on the CPU, else a copy
 * into host (one bucket's room, the caller's). */
int weightsync_source_bucket(const struct weightsync_meta *meta, const struct tensor *source, int64_t index,
                             float *host, const void **out, struct smelt_error *err);

#endif
