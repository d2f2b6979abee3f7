/* A worker program's stop: SIGTERM and SIGINT set one process-wide flag that its serving
 * loop polls (smelt-rollout, smelt-tinker). Installed without SA_RESTART, so a blocking
 * zmq_poll returns at once (EINTR) and the loop sees the flag. */
#ifndef SMELT_COMMON_STOP_H
#define SMELT_COMMON_STOP_H

#include "common/error.h"

/* C only: the flag is a C11 atomic (common/common.h is also read by the CUDA sources,
 * which are C++). */
#ifndef __cplusplus
#include <stdatomic.h>

/* Installs the SIGTERM / SIGINT handler; SMELT_EIO naming the failing call otherwise. */
int stop_on_signals(struct smelt_error *err);
/* The flag the handler sets (0 until a stop signal came); lives for the whole process. */
atomic_int *stop_flag(void);
#endif

#endif
