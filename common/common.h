/* common/: what every other folder uses. Include this header, not the parts.
 *   error.h  struct smelt_error, error codes, error_set/error_wrap, SMELT_ASSERT
 *   log.h    log_debug/info/warn/error to stderr with timestamps
 *   json.h   jansson loading and typed field readers that name the field in errors
 *   file.h   whole-file read, atomic write, mkdir -p, paths, read-only mmap
 *   rng.h    seeded xoshiro256** generator: uniform, normal
 *   args.h   command-line values parsed whole, errors naming the flag
 *   msg.h    the ZeroMQ message frames and every message type (framing only; no zmq.h)
 *   spawn.h  starting child processes (fork + execve of a prepared argv), environments with a device
 *   clock.h  the monotonic clock in ms, a sleep that survives signals
 *   curve.h  ZeroMQ CURVE keys, key files, secure sockets, the ZAP handler; a job's keys
 *   secret_fd.h  a secret handed to a child through an inherited pipe */
#ifndef SMELT_COMMON_H
#define SMELT_COMMON_H

#include "common/args.h"
#include "common/clock.h"
#include "common/curve.h"
#include "common/error.h"
#include "common/file.h"
#include "common/json.h"
#include "common/log.h"
#include "common/msg.h"
#include "common/rng.h"
#include "common/secret_fd.h"
#include "common/spawn.h"
#include "common/stop.h"
#include "common/strmap.h"

#endif
