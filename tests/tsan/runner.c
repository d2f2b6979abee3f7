/* The unit tests' runner under ThreadSanitizer (`make test TSAN=1`), in place of
 * libcriterion's. Criterion cannot start there: before any test runs it maps a shared
 * arena at a random address in 0x2000_0000_0000..0x6000_0000_0000, nearly all of which
 * TSAN has reserved for its shadow, so it aborts ("Could not initialize inheritable
 * arena", Snaipe/Criterion#274) or crashes. The tests are unchanged: this file supplies
 * the few runtime functions that criterion's Test() / TestSuite() / cr_assert macros call.
 *
 * Like criterion: each test runs in a forked child (fixtures: the suite's init, the
 * test's, the test, the test's fini, the suite's), .timeout (the test's, else the
 * suite's), .signal and .exit_code are honoured, `--filter GLOB` matches "suite/name",
 * `--jobs N` runs N children at once, and the summary line is criterion's "Synthesis".
 * A failed cr_assert ends the test (then its fini runs); a failed cr_expect does not.
 * The runner itself starts no thread, so forking it is safe under TSAN. */
#include <criterion/criterion.h>
#include <criterion/options.h>

#include <fnmatch.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* The macros put a pointer to each test (suite) in section cr_tst (cr_sts); the linker
 * names the bounds. Weak: a binary may have no TestSuite at all. */
extern struct criterion_test *__start_cr_tst[] __attribute__((weak));
extern struct criterion_test *__stop_cr_tst[] __attribute__((weak));
extern struct criterion_suite *__start_cr_sts[] __attribute__((weak));
extern struct criterion_suite *__stop_cr_sts[] __attribute__((weak));

struct criterion_options criterion_options;

/* The test running in this child. */
static const struct criterion_test *current_test;
static const struct criterion_suite *current_suite;
static pthread_t test_thread;
static jmp_buf test_abort;
static int failed_asserts;

/* ---- what the macros call (in the child) ---- */

int cr_asprintf(char **strp, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vasprintf(strp, fmt, ap);
    va_end(ap);
    if (n < 0) *strp = NULL;
    return n;
}

void cr_asprintf_free(char *buf) { free(buf); }

void cr_log(enum criterion_severity severity, const char *msg, ...) {
    static const char *const names[] = {"info", "warning", "error"};
    fprintf(stderr, "[%s] ", (unsigned)severity < 3 ? names[severity] : "log");
    va_list ap;
    va_start(ap, msg);
    vfprintf(stderr, msg, ap);
    va_end(ap);
    fputc('\n', stderr);
}

/* The default message of an assertion without one; the first vararg, when the kind has
 * one, is the condition's text. */
char *cr_translate_assert_msg(int msg_index, ...) {
    char *out = NULL;
    if (msg_index == CRITERION_ASSERT_MSG_FAIL) {
        cr_asprintf(&out, "The conditions for this assertion were not met.");
        return out;
    }
    va_list ap;
    va_start(ap, msg_index);
    const char *what = va_arg(ap, const char *);
    va_end(ap);
    cr_asprintf(&out, "The expression %s is false.", what ? what : "");
    return out;
}

void cri_asserts_passed_incr(void) {}

void criterion_send_assert(struct criterion_assert_stats *stats) {
    if (stats->passed) return;
    failed_asserts++;
    fprintf(stderr, "[----] %s:%u: Assertion Failed\n[----]   %s\n", stats->file, stats->line,
            stats->message ? stats->message : "");
}

void criterion_continue_test(void) {}

/* A failed cr_assert: back to criterion_internal_test_main, which then lets the fini
 * run. From another thread of the test the stack cannot be unwound: end the child. */
void criterion_abort_test(void) {
    if (!pthread_equal(pthread_self(), test_thread)) {
        fflush(NULL);
        _exit(1);
    }
    longjmp(test_abort, 1);
}

void criterion_test_die(const char *msg, ...) {
    va_list ap;
    va_start(ap, msg);
    vfprintf(stderr, msg, ap);
    va_end(ap);
    fputc('\n', stderr);
    fflush(NULL);
    _exit(1);
}

void criterion_internal_test_setup(void) {
    if (current_suite && current_suite->data && current_suite->data->init) current_suite->data->init();
    if (current_test->data->init) current_test->data->init();
}

void criterion_internal_test_main(void (*fn)(void)) {
    if (setjmp(test_abort) == 0) fn();
}

void criterion_internal_test_teardown(void) {
    if (current_test->data->fini) current_test->data->fini();
    if (current_suite && current_suite->data && current_suite->data->fini) current_suite->data->fini();
}

/* ---- the runner (in the parent) ---- */

struct running {
    const struct criterion_test *test;
    pid_t pid;
    double deadline_s;  /* 0: none */
};

static int n_passed, n_failed, n_crashed;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static const struct criterion_suite *suite_of(const struct criterion_test *t) {
    if (!__start_cr_sts) return NULL;
    for (struct criterion_suite **s = __start_cr_sts; s < __stop_cr_sts; s++)
        if (*s && strcmp((*s)->name, t->category) == 0) return *s;
    return NULL;
}

static double timeout_of(const struct criterion_test *t) {
    if (t->data->timeout > 0) return t->data->timeout;
    const struct criterion_suite *s = suite_of(t);
    return s && s->data && s->data->timeout > 0 ? s->data->timeout : 0;
}

static void run_in_child(const struct criterion_test *t) {
    current_test = t;
    current_suite = suite_of(t);
    test_thread = pthread_self();
    t->test();
    fflush(NULL);
    _exit(failed_asserts ? 1 : t->data->exit_code);
}

static void report(const struct criterion_test *t, int status, bool timed_out) {
    const struct criterion_test_extra_data *d = t->data;
    bool ok;
    if (timed_out) ok = false;
    else if (d->signal) ok = WIFSIGNALED(status) && WTERMSIG(status) == d->signal;
    else ok = WIFEXITED(status) && WEXITSTATUS(status) == d->exit_code;
    if (ok) {
        n_passed++;
        return;
    }
    if (WIFSIGNALED(status) && !d->signal && !timed_out) {
        n_crashed++;
        fprintf(stderr, "[FAIL] %s::%s: CRASH (signal %d)\n", t->category, t->name, WTERMSIG(status));
    } else {
        n_failed++;
        fprintf(stderr, "[FAIL] %s::%s%s\n", t->category, t->name, timed_out ? ": Timed out" : "");
    }
}

static void start(struct running *r, const struct criterion_test *t) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        perror("fork");
        exit(2);
    }
    if (pid == 0) run_in_child(t);
    double timeout = timeout_of(t);
    *r = (struct running){.test = t, .pid = pid, .deadline_s = timeout > 0 ? now_s() + timeout : 0};
}

/* Reaps what has ended (killing what is past its timeout); returns how many still run. */
static int reap(struct running *slots, int n) {
    int busy = 0;
    for (int i = 0; i < n; i++) {
        struct running *r = &slots[i];
        if (!r->pid) continue;
        int status;
        pid_t got = waitpid(r->pid, &status, WNOHANG);
        bool timed_out = false;
        if (got == 0 && r->deadline_s > 0 && now_s() > r->deadline_s) {
            kill(r->pid, SIGKILL);
            waitpid(r->pid, &status, 0);
            timed_out = true;
            got = r->pid;
        }
        if (got == r->pid) {
            report(r->test, status, timed_out);
            r->pid = 0;
        } else {
            busy++;
        }
    }
    return busy;
}

static bool selected(const struct criterion_test *t, const char *filter) {
    if (t->data->disabled) return false;
    if (!filter) return true;
    char id[512];
    snprintf(id, sizeof id, "%s/%s", t->category, t->name);
    return fnmatch(filter, id, 0) == 0;
}

static void parse_args(int argc, char **argv, const char **filter, int *jobs) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strncmp(a, "--filter=", 9) == 0) *filter = a + 9;
        else if (strcmp(a, "--filter") == 0 && i + 1 < argc) *filter = argv[++i];
        else if (strncmp(a, "--jobs=", 7) == 0) *jobs = atoi(a + 7);
        else if ((strcmp(a, "--jobs") == 0 || strcmp(a, "-j") == 0) && i + 1 < argc) *jobs = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--filter GLOB] [--jobs N]\n", argv[0]);
            exit(2);
        }
    }
    if (*jobs < 1) *jobs = 1;
    if (*jobs > 64) *jobs = 64;
}

int main(int argc, char **argv) {
    const char *filter = NULL;
    int jobs = 1;
    parse_args(argc, argv, &filter, &jobs);
    struct running slots[64] = {0};
    struct criterion_test **next = __start_cr_tst;
    while (true) {
        while (next && next < __stop_cr_tst && (!*next || !selected(*next, filter))) next++;
        bool more = next && next < __stop_cr_tst;
        int busy = reap(slots, jobs);
        if (!more && busy == 0) break;
        if (more && busy < jobs) {
            for (int i = 0; i < jobs; i++) {
                if (slots[i].pid) continue;
                start(&slots[i], *next++);
                break;
            }
            continue;
        }
        struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    int tested = n_passed + n_failed + n_crashed;
    printf("[====] Synthesis: Tested: %d | Passing: %d | Failing: %d | Crashing: %d\n", tested, n_passed,
           n_failed, n_crashed);
    return n_failed || n_crashed ? 1 : 0;
}
