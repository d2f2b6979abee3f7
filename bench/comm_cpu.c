/* Collective bandwidth on loopback: comm/'s all_reduce, reduce_scatter, all_gather and
 * broadcast (Gloo over TCP) for 2 and 4 ranks at sizes from 4 KiB to 256 MiB, next to a
 * memcpy of the same size and to torch.distributed with the Gloo backend
 * (bench/comm_torch.py, run by this program after its own sweep, never at the same time)
 * on the same sizes, ranks and iteration counts. bench/README.md defines the columns.
 *
 * The ranks are forked children meeting through a file store in a temporary folder;
 * rank 0 writes each row's result into memory shared with the parent. An op that fails
 * prints its error in its row instead of a time. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm.h"
#include "common/args.h"
#include "common/file.h"
#include "common/json.h"
#include "common/spawn.h"

enum { OP_ALL_REDUCE, OP_REDUCE_SCATTER, OP_ALL_GATHER, OP_BROADCAST, N_OPS };
static const char *const op_names[N_OPS] = {"all_reduce", "reduce_scatter", "all_gather",
                                            "broadcast"};

#define MAX_SIZES 16
#define MAX_RANKS 16
#define ITER_BYTES (64LL << 20) /* a row runs about this many bytes (2..20 calls) */
#define MAX_ITERS 20

struct options {
    int32_t *ranks;
    int64_t nranks;
    int nsizes;
    int64_t bytes[MAX_SIZES];
    int iters[MAX_SIZES];
    bool torch;
    const char *python, *script;
    int64_t timeout_ms;
};

/* One row's result, written by rank 0 (smelt) or the parent (torch) into shared memory. */
struct row {
    int done;
    double seconds; /* per call, the slowest rank's */
    char error[SMELT_ERROR_MESSAGE_BYTES];
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* nccl-tests' bus bandwidth factor (its doc/PERFORMANCE.md): what each rank's link
 * carries in a ring, relative to the buffer size. */
static double bus_factor(int op, int n) {
    if (op == OP_ALL_REDUCE) return 2.0 * (n - 1) / n;
    if (op == OP_BROADCAST) return 1.0;
    return (double)(n - 1) / n;
}

/* ---- options ---------------------------------------------------------------------- */

static void usage(FILE *f) {
    fprintf(f, "usage: comm_cpu [--quick] [--ranks 2,4] [--min-size BYTES] [--max-size BYTES]\n"
               "         [--no-torch] [--python PY] [--torch-script PATH] [--timeout-ms MS]\n"
               "  --quick            sizes up to 4 MiB (default max 256 MiB)\n"
               "  --ranks LIST       rank counts, each a power of two in [2, %d] (default 2,4)\n"
               "  --min-size BYTES   smallest buffer, a power of two >= 64 (default 4096)\n"
               "  --max-size BYTES   largest buffer; sizes grow by 4x from --min-size\n"
               "  --no-torch         skip the torch.distributed peer\n"
               "  --python PY        interpreter for the peer (default python3, from PATH)\n"
               "  --torch-script P   the peer (default bench/comm_torch.py: run from the repo root)\n"
               "  --timeout-ms MS    per collective (default 120000)\n",
            MAX_RANKS);
}

static bool power_of_two(int64_t x) { return x > 0 && (x & (x - 1)) == 0; }

static int parse_sizes(const char *min_s, const char *max_s, bool quick, struct options *o,
                       struct smelt_error *err) {
    int64_t min = 4096, max = quick ? 4LL << 20 : 256LL << 20;
    if (min_s) TRY(args_int("--min-size", min_s, 64, 1LL << 30, &min, err));
    if (max_s) TRY(args_int("--max-size", max_s, 64, 1LL << 30, &max, err));
    if (!power_of_two(min))
        return error_set(err, SMELT_EINVAL, "--min-size: %lld is not a power of two",
                         (long long)min);
    if (max < min)
        return error_set(err, SMELT_EINVAL, "--max-size: %lld is below --min-size %lld",
                         (long long)max, (long long)min);
    o->nsizes = 0;
    for (int64_t b = min; b <= max && o->nsizes < MAX_SIZES; b *= 4) {
        int64_t it = ITER_BYTES / b;
        o->bytes[o->nsizes] = b;
        o->iters[o->nsizes++] = (int)(it < 2 ? 2 : it > MAX_ITERS ? MAX_ITERS : it);
    }
    return SMELT_OK;
}

static int parse(int argc, char **argv, struct options *o, struct smelt_error *err) {
    const char *ranks = "2,4", *min_s = NULL, *max_s = NULL, *timeout = NULL;
    bool quick = false, no_torch = false, help = false;
    *o = (struct options){.python = "python3", .script = "bench/comm_torch.py",
                          .timeout_ms = 120000};
    const struct args_option table[] = {
        {"--quick", NULL, &quick},        {"--no-torch", NULL, &no_torch},
        {"--help", NULL, &help},          {"--ranks", &ranks, NULL},
        {"--min-size", &min_s, NULL},     {"--max-size", &max_s, NULL},
        {"--python", &o->python, NULL},   {"--torch-script", &o->script, NULL},
        {"--timeout-ms", &timeout, NULL}, {NULL, NULL, NULL}};
    TRY(args_parse(argc, argv, 1, table, err));
    if (help) {
        usage(stdout);
        exit(0);
    }
    o->torch = !no_torch;
    if (timeout) TRY(args_int("--timeout-ms", timeout, 1, 3600000, &o->timeout_ms, err));
    TRY(args_int_list("--ranks", ranks, 2, MAX_RANKS, &o->ranks, &o->nranks, err));
    for (int64_t i = 0; i < o->nranks; i++)
        if (!power_of_two(o->ranks[i]))
            return error_set(err, SMELT_EINVAL, "--ranks: %d is not a power of two (every "
                             "buffer must split evenly)", o->ranks[i]);
    return parse_sizes(min_s, max_s, quick, o, err);
}

/* ---- one rank --------------------------------------------------------------------- */

/* One call of op on count f32 elements: buf is the input (all_gather: its first shard),
 * out the output where the op has one. */
static int run_op(struct comm *c, int op, float *buf, float *out, size_t count,
                  struct smelt_error *err) {
    switch (op) {
    case OP_ALL_REDUCE: return comm_all_reduce(c, buf, count, COMM_F32, COMM_SUM, NULL, err);
    case OP_REDUCE_SCATTER:
        return comm_reduce_scatter(c, buf, out, count, COMM_F32, COMM_SUM, NULL, err);
    case OP_ALL_GATHER: return comm_all_gather(c, buf, out, count, COMM_F32, NULL, err);
    default: return comm_broadcast(c, buf, count, COMM_F32, 0, NULL, err);
    }
}

/* One untimed call, a barrier, then iters calls; *seconds is the slowest rank's time
 * per call. */
static int time_op(struct comm *c, int op, size_t count, int iters, double *seconds,
                   struct smelt_error *err) {
    float *buf = malloc(count * sizeof *buf), *out = malloc(count * sizeof *out);
    int rc = buf && out ? SMELT_OK : error_set(err, SMELT_ENOMEM, "buffers of %zu floats", count);
    for (size_t i = 0; !rc && i < count; i++) buf[i] = out[i] = (float)(comm_rank(c) + 1);
    if (!rc) rc = run_op(c, op, buf, out, count, err);
    if (!rc) rc = comm_barrier(c, NULL, err);
    double t0 = now_s();
    for (int i = 0; !rc && i < iters; i++) rc = run_op(c, op, buf, out, count, err);
    float t = (float)((now_s() - t0) / iters);
    if (!rc) rc = comm_all_reduce(c, &t, 1, COMM_F32, COMM_MAX, NULL, err);
    *seconds = t;
    free(buf);
    free(out);
    return rc;
}

static _Noreturn void rank_main(int rank, int size, const char *dir, const struct options *o,
                                struct row *rows) {
    struct smelt_error err = {0};
    struct comm_store *store = NULL;
    struct comm *c = NULL;
    char spec[512];
    snprintf(spec, sizeof spec, "file:%s", dir);
    struct comm_options co = {.rank = rank, .size = size, .name = "bench", .host = "127.0.0.1",
                              .timeout_ms = (int)o->timeout_ms};
    int rc = comm_store_open(spec, "comm-cpu", &store, &err);
    if (!rc) rc = comm_create(store, &co, &c, &err);
    for (int op = 0; op < N_OPS; op++)
        for (int s = 0; s < o->nsizes; s++) {
            struct row *r = &rows[op * o->nsizes + s];
            double sec = 0;
            int row_rc = rc ? rc : time_op(c, op, (size_t)o->bytes[s] / 4, o->iters[s], &sec, &err);
            if (rank != 0) continue;
            if (row_rc) snprintf(r->error, sizeof r->error, "%s", err.message);
            r->seconds = sec;
            r->done = 1;
        }
    comm_destroy(c);
    comm_store_close(store);
    _exit(rc ? 1 : 0);
}

/* ---- the smelt sweep: forked ranks -------------------------------------------------- */

/* Fills rows that no rank filled with why. */
static void rows_fail(struct row *rows, int n, const char *why) {
    for (int i = 0; i < n; i++)
        if (!rows[i].done) {
            snprintf(rows[i].error, sizeof rows[i].error, "%s", why);
            rows[i].done = 1;
        }
}

static int run_smelt(int size, const struct options *o, struct row *rows,
                     struct smelt_error *err) {
    char dir[] = "/tmp/comm_cpu.XXXXXX";
    if (!mkdtemp(dir)) return error_set(err, SMELT_EIO, "mkdtemp %s: %s", dir, strerror(errno));
    fflush(stdout);
    pid_t pids[MAX_RANKS];
    int started = 0;
    for (; started < size; started++) {
        pids[started] = fork();
        if (pids[started] < 0) break;
        if (pids[started] == 0) rank_main(started, size, dir, o, rows);
    }
    char why[128] = "";
    if (started < size) snprintf(why, sizeof why, "fork: %s", strerror(errno));
    for (int r = 0; r < started; r++) {
        int status;
        waitpid(pids[r], &status, 0);
        if (r == 0 && !WIFEXITED(status))
            snprintf(why, sizeof why, "rank 0 died of signal %d", WTERMSIG(status));
    }
    rows_fail(rows, N_OPS * o->nsizes, why[0] ? why : "rank 0 wrote no result");
    return dir_remove_all(dir, err);
}

/* ---- the torch peer ------------------------------------------------------------------ */

static void join_ints(char *buf, size_t bytes, const int64_t *v64, const int *v32, int n) {
    size_t at = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && at < bytes; i++)
        at += (size_t)snprintf(buf + at, bytes - at, "%s%lld", i ? "," : "",
                               v64 ? (long long)v64[i] : (long long)v32[i]);
}

/* Starts the peer (execvp, no shell) with its stdout on a pipe; *fd reads it. */
static int torch_start(int size, const struct options *o, pid_t *pid, int *fd,
                       struct smelt_error *err) {
    char ranks[16], sizes[512], iters[256], timeout[32];
    snprintf(ranks, sizeof ranks, "%d", size);
    snprintf(timeout, sizeof timeout, "%.3f", (double)o->timeout_ms / 1000);
    join_ints(sizes, sizeof sizes, o->bytes, NULL, o->nsizes);
    join_ints(iters, sizeof iters, NULL, o->iters, o->nsizes);
    char *argv[] = {(char *)o->python, (char *)o->script, "--ranks", ranks, "--sizes", sizes,
                    "--iters", iters, "--timeout-s", timeout, NULL};
    int p[2];
    if (pipe(p)) return error_set(err, SMELT_EIO, "pipe: %s", strerror(errno));
    fflush(stdout);
    *pid = fork();
    if (*pid < 0) {
        close(p[0]);
        close(p[1]);
        return error_set(err, SMELT_EIO, "fork: %s", strerror(errno));
    }
    if (*pid == 0) {
        dup2(p[1], STDOUT_FILENO);
        close(p[0]);
        close(p[1]);
        execvp(argv[0], argv);
        fd_write_str(STDERR_FILENO, "comm_cpu: cannot run the torch peer (--python)\n");
        _exit(127);
    }
    close(p[1]);
    *fd = p[0];
    return SMELT_OK;
}

/* Reads fd to its end into a malloc'd string. */
static int read_all_fd(int fd, char **out, struct smelt_error *err) {
    size_t len = 0, cap = 4096;
    char *buf = malloc(cap);
    for (ssize_t got = 1; buf && got > 0;) {
        if (cap - len < 1024) {
            char *bigger = realloc(buf, cap *= 2);
            if (!bigger) free(buf);
            buf = bigger;
            if (!buf) break;
        }
        got = read(fd, buf + len, cap - len - 1);
        if (got < 0 && errno == EINTR) got = 1;
        else if (got > 0) len += (size_t)got;
    }
    if (!buf) return error_set(err, SMELT_ENOMEM, "the torch peer's output");
    buf[len] = '\0';
    *out = buf;
    return SMELT_OK;
}

static int index_of(const struct options *o, const char *op, int64_t bytes) {
    for (int i = 0; i < N_OPS; i++)
        for (int s = 0; s < o->nsizes; s++)
            if (strcmp(op_names[i], op) == 0 && o->bytes[s] == bytes) return i * o->nsizes + s;
    return -1;
}

/* One line of the peer's output into its row; the version line into version. */
static void torch_line(const char *line, const struct options *o, struct row *rows,
                       char *version, size_t vbytes) {
    json_t *j = NULL;
    if (json_load_buffer(line, strlen(line), "torch peer", &j, NULL)) return;
    const char *v = json_string_value(json_object_get(j, "torch"));
    const char *op = json_string_value(json_object_get(j, "op"));
    const char *error = json_string_value(json_object_get(j, "error"));
    const json_t *bytes = json_object_get(j, "bytes"), *sec = json_object_get(j, "seconds");
    if (v) snprintf(version, vbytes, "%s", v);
    int i = op && json_is_integer(bytes) ? index_of(o, op, json_integer_value(bytes)) : -1;
    if (i >= 0 && error) snprintf(rows[i].error, sizeof rows[i].error, "%s", error);
    else if (i >= 0 && json_is_number(sec) && json_number_value(sec) > 0)
        rows[i].seconds = json_number_value(sec);
    else if (i >= 0) snprintf(rows[i].error, sizeof rows[i].error, "no time in '%.160s'", line);
    if (i >= 0) rows[i].done = 1;
    json_decref(j);
}

static int run_torch(int size, const struct options *o, struct row *rows, char *version,
                     size_t vbytes, struct smelt_error *err) {
    pid_t pid = -1;
    int fd = -1;
    char *text = NULL;
    TRY(torch_start(size, o, &pid, &fd, err));
    int rc = read_all_fd(fd, &text, err);
    close(fd);
    int status;
    waitpid(pid, &status, 0);
    for (char *line = text ? strtok(text, "\n") : NULL; line; line = strtok(NULL, "\n"))
        torch_line(line, o, rows, version, vbytes);
    free(text);
    char why[128];
    snprintf(why, sizeof why, "the torch peer exited with status %d (its stderr above)",
             WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
    rows_fail(rows, N_OPS * o->nsizes, why);
    return rc;
}

/* ---- memcpy and the table ---------------------------------------------------------- */

/* Seconds per memcpy of bytes: pages touched first, one untimed copy, then copies until
 * 50 ms have passed (at least iters), so that small sizes are not timer noise. */
static double time_memcpy(int64_t bytes, int iters) {
    char *src = malloc((size_t)bytes), *dst = malloc((size_t)bytes);
    double sec = NAN;
    if (src && dst) {
        memset(src, 1, (size_t)bytes);
        memset(dst, 0, (size_t)bytes);
        memcpy(dst, src, (size_t)bytes);
        long n = 0;
        double t0 = now_s(), t = t0;
        while (n < iters || t - t0 < 0.05) {
            memcpy(dst, src, (size_t)bytes);
            /* the buffers "escape", so the compiler cannot drop or hoist the copy */
            __asm__ volatile("" : : "r"(dst), "r"(src) : "memory");
            if (++n % iters == 0) t = now_s();
        }
        sec = (t - t0) / (double)n;
    }
    free(src);
    free(dst);
    return sec;
}

static void size_text(char *buf, size_t bytes, int64_t b) {
    if (b >= 1 << 20) snprintf(buf, bytes, "%lld MiB", (long long)(b >> 20));
    else if (b >= 1 << 10) snprintf(buf, bytes, "%lld KiB", (long long)(b >> 10));
    else snprintf(buf, bytes, "%lld B", (long long)b);
}

static void print_row(int op, int s, int size, const struct options *o, const struct row *ours,
                      const struct row *theirs, double memcpy_s) {
    char sz[32];
    size_text(sz, sizeof sz, o->bytes[s]);
    double factor = bus_factor(op, size) * (double)o->bytes[s] / 1e9;
    printf("%-15s %8s %5d", op_names[op], sz, o->iters[s]);
    if (ours->error[0]) printf("  smelt: %s", ours->error);
    else printf(" %10.3f %10.3f", ours->seconds * 1e3, factor / ours->seconds);
    if (!o->torch) printf(" %10s %10s %11s", "-", "-", "-");
    else if (theirs->error[0]) printf("  torch: %s", theirs->error);
    else if (ours->error[0]) printf(" torch %.3f ms %.3f GB/s", theirs->seconds * 1e3, factor / theirs->seconds);
    else printf(" %10.3f %10.3f %11.2f", theirs->seconds * 1e3, factor / theirs->seconds,
                theirs->seconds / ours->seconds);
    printf(" %11.2f\n", (double)o->bytes[s] / 1e9 / memcpy_s);
}

static void print_table(int size, const struct options *o, const struct row *ours,
                        const struct row *theirs, const double *memcpy_s, const char *version) {
    printf("\n%d ranks (torch %s)\n", size, o->torch ? version : "skipped: --no-torch");
    printf("%-15s %8s %5s %10s %10s %10s %10s %11s %11s\n", "op", "size", "iters", "smelt ms",
           "smelt GB/s", "torch ms", "torch GB/s", "smelt/torch", "memcpy GB/s");
    for (int op = 0; op < N_OPS; op++)
        for (int s = 0; s < o->nsizes; s++)
            print_row(op, s, size, o, &ours[op * o->nsizes + s], &theirs[op * o->nsizes + s],
                      memcpy_s[s]);
}

/* ---- main ------------------------------------------------------------------------- */

static int run_ranks(int size, const struct options *o, const double *memcpy_s,
                     struct smelt_error *err) {
    size_t n = (size_t)N_OPS * (size_t)o->nsizes, bytes = 2 * n * sizeof(struct row);
    struct row *rows = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (rows == MAP_FAILED) return error_set(err, SMELT_ENOMEM, "mmap: %s", strerror(errno));
    memset(rows, 0, bytes);
    char version[64] = "?";
    int rc = run_smelt(size, o, rows, err);
    if (!rc && o->torch) rc = run_torch(size, o, rows + n, version, sizeof version, err);
    if (!rc) print_table(size, o, rows, rows + n, memcpy_s, version);
    fflush(stdout);
    munmap(rows, bytes);
    return rc;
}

int main(int argc, char **argv) {
    struct options o;
    struct smelt_error err = {0};
    if (parse(argc, argv, &o, &err)) {
        fprintf(stderr, "comm_cpu: %s\n", err.message);
        usage(stderr);
        return 2;
    }
    double t0 = now_s(), load[3] = {0}, memcpy_s[MAX_SIZES];
    getloadavg(load, 3);
    printf("smelt collectives (comm/, Gloo over TCP on 127.0.0.1) against torch.distributed "
           "(Gloo), f32\n%ld online cores, load average %.1f; bus GB/s = size / time x "
           "nccl-tests' factor (all_reduce 2(n-1)/n, reduce_scatter and all_gather (n-1)/n, "
           "broadcast 1); memcpy GB/s = size / time\n",
           sysconf(_SC_NPROCESSORS_ONLN), load[0]);
    for (int s = 0; s < o.nsizes; s++) memcpy_s[s] = time_memcpy(o.bytes[s], o.iters[s]);
    int rc = 0;
    for (int64_t i = 0; !rc && i < o.nranks; i++) rc = run_ranks(o.ranks[i], &o, memcpy_s, &err);
    free(o.ranks);
    if (rc) {
        fprintf(stderr, "comm_cpu: %s\n", err.message);
        return 1;
    }
    printf("\ntotal %.1f s\n", now_s() - t0);
    return 0;
}
