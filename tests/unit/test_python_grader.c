/* Python graders in the reward stage (rewards/python_grader.c, sandbox.c, sandbox_pool.c,
 * sandbox_runner.c): grade(sample, item) run in bubblewrap sandboxes. Scores computed
 * from the sample's and the row's fields, checked against the same formula in C; every
 * way a grade() can fail (raises, returns a non-number, NaN, loops, ignores its timer,
 * exits, prints 100 MB, allocates 10 GB, fork-bombs) scores 0 with a message naming it
 * while the batch's other samples are scored; what the code cannot reach (the network,
 * even the test's own listening socket on 127.0.0.1; /etc/shadow; a file of another job;
 * writes outside /tmp; the host's environment; root); python inside a multi grader; the
 * spec's refusals (syntax errors with their line, no grade, a machine without bwrap, a
 * bad uid range); no free sandbox uid failing the call; the spec written back. After
 * each test no process is left: none of the test's children, none running as one of
 * its sandbox uids.
 *
 * Without bwrap (or where it cannot create namespaces) every test reports itself
 * skipped. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "rewards/graders_internal.h"
#include "rewards/rewards.h"
#include "rewards/sandbox_internal.h"

/* ---- the test's own sandbox uids, and what must be gone afterwards ---- */

static unsigned uid_first, uid_last;

/* Each test process (Criterion runs tests in parallel processes) takes 8 uids of its own,
 * so the leftover check below sees only its own sandboxes. */
static void own_uids(void) {
    uid_first = SANDBOX_UID_FIRST + SANDBOX_UID_COUNT + (unsigned)(getpid() % 200000) * 8u;
    uid_last = uid_first + 7;
    char range[64];
    snprintf(range, sizeof range, "%u-%u", uid_first, uid_last);
    cr_assert_eq(setenv("SMELT_SANDBOX_UIDS", range, 1), 0);
}

/* Processes running as one of the test's sandbox uids. */
static int sandbox_processes(void) {
    DIR *d = opendir("/proc");
    cr_assert(d);
    int found = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] < '1' || e->d_name[0] > '9') continue;
        char path[300];
        struct stat st;
        snprintf(path, sizeof path, "/proc/%s", e->d_name);
        if (stat(path, &st) == 0 && st.st_uid >= uid_first && st.st_uid <= uid_last) {
            found++;
            char sp[320], line[400] = "";
            snprintf(sp, sizeof sp, "%s/stat", path);
            FILE *f = fopen(sp, "r");
            if (f) { if (!fgets(line, sizeof line, f)) line[0] = 0; fclose(f); }
            fprintf(stderr, "left behind, uid %u: %s", (unsigned)st.st_uid, line);
        }
    }
    closedir(d);
    return found;
}

static void expect_nothing_left(void) {
    errno = 0;
    cr_expect_eq(waitpid(-1, NULL, WNOHANG), -1, "a child of the test is left");
    cr_expect_eq(errno, ECHILD);
    if (geteuid() == 0) cr_expect_eq(sandbox_processes(), 0, "a process of a sandbox uid is left");
}

/* Skips the test (reported as skipped) where no sandbox can run. */
static void need_sandbox(void) {
    own_uids();
    struct sandbox_host host;
    struct smelt_error err = {0};
    if (sandbox_host_find(&host, &err)) cr_skip_test("no sandbox here: %s", err.message);
    struct sandbox_limits lim = {.timeout_s = 5, .memory_mb = 1024, .sandboxes = 1};
    char why[SANDBOX_MESSAGE_BYTES];
    int rc = sandbox_check("def grade(s, i): return 1\n", &lim, why, sizeof why, &err);
    if (rc < 0) cr_skip_test("no sandbox here: %s", err.message);
    cr_assert_eq(rc, 0, "%s", why);
}

/* ---- specs and batches ---- */

static json_t *python_grader(const char *source, double timeout_s, int sandboxes) {
    json_t *g = json_pack("{s:s, s:s, s:s, s:f}", "type", "python", "name", "test", "source", source, "timeout_s",
                          timeout_s);
    cr_assert(g);
    if (sandboxes) json_object_set_new(g, "sandboxes", json_integer(sandboxes));
    return g;
}

static struct reward_stage *stage_of(json_t *spec) {
    struct reward_stage *st = NULL;
    struct smelt_error err = {0};
    int rc = reward_stage_create(spec, "reward", &st, &err);
    json_decref(spec);
    cr_assert_eq(rc, SMELT_OK, "refused: %s", err.message);
    return st;
}

static struct reward_stage *python_stage(const char *source, double timeout_s, int sandboxes) {
    return stage_of(json_pack("{s:o}", "grader", python_grader(source, timeout_s, sandboxes)));
}

/* Scores samples[0..n); every field of every result must be written. */
static void score(struct reward_stage *st, const struct reward_sample *samples, int n, struct reward_result *out) {
    memset(out, 0xff, (size_t)n * sizeof *out);
    struct smelt_error err = {0};
    cr_assert_eq(reward_stage_score(st, samples, n, out, &err), SMELT_OK, "%s", err.message);
}

/* Sample i scored `want` with no warning. */
static void expect_score(const struct reward_result *r, int i, double want) {
    cr_expect(!r[i].failed && r[i].warning[0] == '\0', "sample %d: failed %d, warning \"%s\"", i, r[i].failed,
              r[i].warning);
    cr_expect(r[i].reward == want && r[i].scores[0] == want, "sample %d scored %.17g, expected %.17g", i,
              r[i].reward, want);
}

/* Sample i scored 0 (not failed) with a warning holding `part`. */
static void expect_zero(const struct reward_result *r, int i, const char *part) {
    cr_expect(!r[i].failed, "sample %d failed: %s", i, r[i].error);
    cr_expect(r[i].reward == 0.0 && r[i].scores[0] == 0.0, "sample %d scored %g, expected 0", i, r[i].reward);
    cr_expect(strstr(r[i].warning, part), "sample %d: warning \"%s\" lacks \"%s\"", i, r[i].warning, part);
    cr_expect(strncmp(r[i].warning, "grader (python): ", 17) == 0, "sample %d: \"%s\" does not name the grader", i,
              r[i].warning);
}

static double seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* ---- scores ---- */

/* The reward from the sample's text and JSON and the row's answer and metadata. */
static const char *const FIELDS_SOURCE =
    "import json\n"
    "def grade(sample, item) -> float:\n"
    "    text = sample['output_text']\n"
    "    parsed = sample['output_json']\n"
    "    score = item['weight'] * (text.strip() == item['answer'])\n"
    "    score += 0.25 if isinstance(parsed, dict) else 0.0\n"
    "    score += len(text) / 64\n"
    "    score += 0.5 if sample['finish_reason'] == 'length' else 0.0\n"
    "    assert sample['choices'][0]['message']['content'] == text and sample['output_tools'] == []\n"
    "    return score + sample['n_completion_tokens'] / 1000\n";

static double fields_formula(const char *text, const char *answer, double weight, bool json_object, bool length,
                             long long tokens) {
    size_t a = 0, b = strlen(text);
    while (a < b && (text[a] == ' ' || text[a] == '\n')) a++;
    while (b > a && (text[b - 1] == ' ' || text[b - 1] == '\n')) b--;
    bool equal = b - a == strlen(answer) && memcmp(text + a, answer, b - a) == 0;
    double score = weight * (equal ? 1.0 : 0.0);
    score += json_object ? 0.25 : 0.0;
    score += (double)strlen(text) / 64; /* ASCII texts: characters = bytes */
    score += length ? 0.5 : 0.0;
    return score + (double)tokens / 1000;
}

Test(python_grader, scores_from_the_sample_and_the_row) {
    need_sandbox();
    struct reward_stage *st = python_stage(FIELDS_SOURCE, 5.0, 2);
    cr_expect_eq(reward_stage_count(st), 1);
    cr_expect_str_eq(reward_stage_name(st, 0), "python");
    struct reward_sample s[6] = {
        {.completion = " 42\n", .answer = "42", .metadata_json = "{\"weight\": 2}", .n_completion_tokens = 3,
         .finish_reason = "stop"},
        {.completion = "41", .answer = "42", .metadata_json = "{\"weight\": 2}", .n_completion_tokens = 1},
        {.completion = "{\"a\": 1}", .answer = "x", .metadata_json = "{\"weight\": 1.5}", .finish_reason = "length"},
        {.completion = "[1, 2]", .answer = "[1, 2]", .metadata_json = "{\"weight\": 0.5}", .n_completion_tokens = 7},
        /* the row's answer wins over a metadata field of that name */
        {.completion = "row", .answer = "row", .metadata_json = "{\"weight\": 3, \"answer\": \"meta\"}"},
        /* no answer on the row: the metadata's */
        {.completion = "meta", .metadata_json = "{\"weight\": 3, \"answer\": \"meta\"}"},
    };
    struct reward_result r[6];
    score(st, s, 6, r);
    expect_score(r, 0, fields_formula(" 42\n", "42", 2, false, false, 3));
    expect_score(r, 1, fields_formula("41", "42", 2, false, false, 1));
    expect_score(r, 2, fields_formula("{\"a\": 1}", "x", 1.5, true, true, 0));
    expect_score(r, 3, fields_formula("[1, 2]", "[1, 2]", 0.5, false, false, 7));
    expect_score(r, 4, fields_formula("row", "row", 3, false, false, 0));
    expect_score(r, 5, fields_formula("meta", "meta", 3, false, false, 0));
    /* The same stage scores a second batch (new sandboxes, the same source). */
    score(st, s + 1, 1, r);
    expect_score(r, 0, fields_formula("41", "42", 2, false, false, 1));
    reward_stage_free(st);
    expect_nothing_left();
}

/* ---- failures: 0 with a reason, the batch goes on ---- */

static const char *const CASES_SOURCE =
    "import os, signal, sys\n"
    "def grade(sample, item):\n"
    "    case = item['case']\n"
    "    if case == 'raise':\n"
    "        raise ValueError('no ' + sample['output_text'])\n"
    "    if case == 'str':\n"
    "        return 'x'\n"
    "    if case == 'nan':\n"
    "        return float('nan')\n"
    "    if case == 'huge':\n"
    "        return 10 ** 400\n"
    "    if case == 'none':\n"
    "        return None\n"
    "    if case == 'exit':\n"
    "        sys.exit(3)\n"
    "    if case == 'true':\n"
    "        return True\n"
    "    if case == 'loop':\n"
    "        while True:\n"
    "            pass\n"
    "    if case == 'deaf':\n"
    "        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGALRM])\n"
    "        while True:\n"
    "            pass\n"
    "    if case == 'die':\n"
    "        os._exit(5)\n"
    "    if case == 'print':\n"
    "        sys.stdout.write('x' * 100_000_000)\n"
    "        return 1\n"
    "    if case == 'memory':\n"
    "        block = bytearray(10 * 2**30)\n"
    "        return 1\n"
    "    return len(sample['output_text'])\n";

#define CASE(name) "{\"case\": \"" name "\"}"

Test(python_grader, raising_and_non_numbers_score_zero) {
    need_sandbox();
    struct reward_stage *st = python_stage(CASES_SOURCE, 5.0, 2);
    struct reward_sample s[] = {
        {.completion = "abc", .metadata_json = CASE("raise")}, {.completion = "ab", .metadata_json = CASE("ok")},
        {.completion = "", .metadata_json = CASE("str")},      {.completion = "", .metadata_json = CASE("nan")},
        {.completion = "", .metadata_json = CASE("huge")},     {.completion = "", .metadata_json = CASE("none")},
        {.completion = "", .metadata_json = CASE("exit")},     {.completion = "", .metadata_json = CASE("true")},
        {.completion = "abcd", .metadata_json = CASE("ok")},
    };
    int n = (int)(sizeof s / sizeof s[0]);
    struct reward_result r[sizeof s / sizeof s[0]];
    score(st, s, n, r);
    expect_zero(r, 0, "grade() raised ValueError: no abc (grader.source line 5)");
    expect_score(r, 1, 2);
    expect_zero(r, 2, "grade() returned str, expected a number");
    expect_zero(r, 3, "grade() returned nan, not a finite number");
    expect_zero(r, 4, "OverflowError");
    expect_zero(r, 5, "grade() returned NoneType, expected a number");
    expect_zero(r, 6, "grade() raised SystemExit: 3 (grader.source line 15)");
    expect_score(r, 7, 1); /* a bool is a number: True is 1 */
    expect_score(r, 8, 4);
    reward_stage_free(st);
    expect_nothing_left();
}

Test(python_grader, a_loop_is_stopped_and_the_others_are_scored) {
    need_sandbox();
    struct reward_stage *st = python_stage(CASES_SOURCE, 0.5, 1);
    struct reward_sample s[] = {
        {.completion = "a", .metadata_json = CASE("ok")},
        {.completion = "", .metadata_json = CASE("loop")},
        {.completion = "abc", .metadata_json = CASE("ok")},
        {.completion = "", .metadata_json = CASE("deaf")}, /* blocks the timer: the sandbox is killed */
        {.completion = "abcde", .metadata_json = CASE("ok")},
        {.completion = "", .metadata_json = CASE("die")},
        {.completion = "ab", .metadata_json = CASE("ok")},
    };
    struct reward_result r[7];
    double t0 = seconds();
    score(st, s, 7, r);
    double took = seconds() - t0;
    expect_score(r, 0, 1);
    expect_zero(r, 1, "grade() took more than 0.5 s");
    expect_score(r, 2, 3);
    expect_zero(r, 3, "grade() did not return within 0.5 s; the sandbox was killed");
    expect_score(r, 4, 5); /* in a new sandbox */
    expect_zero(r, 5, "the sandbox ended (exit status 5)");
    expect_score(r, 6, 2);
    /* 0.5 s + 1.5 s (timer, then kill) plus three sandbox starts: far from forever. */
    cr_expect(took < 10.0, "the batch took %.1f s", took);
    reward_stage_free(st);
    expect_nothing_left();
}

Test(python_grader, printing_100_mb_is_cut) {
    need_sandbox();
    struct reward_stage *st = python_stage(CASES_SOURCE, 5.0, 1);
    struct reward_sample s[] = {
        {.completion = "", .metadata_json = CASE("print")},
        {.completion = "xyz", .metadata_json = CASE("ok")},
    };
    struct reward_result r[2];
    score(st, s, 2, r);
    expect_zero(r, 0, "the code printed more than 1048576 bytes; the sandbox was stopped");
    expect_score(r, 1, 3);
    reward_stage_free(st);
    expect_nothing_left();
}

Test(python_grader, allocating_10_gb_fails_alone) {
    need_sandbox();
    struct reward_stage *st = python_stage(CASES_SOURCE, 5.0, 1);
    struct reward_sample s[] = {
        {.completion = "", .metadata_json = CASE("memory")},
        {.completion = "xy", .metadata_json = CASE("ok")},
    };
    struct reward_result r[2];
    score(st, s, 2, r);
    expect_zero(r, 0, "grade() raised MemoryError (grader.source line 31)");
    expect_score(r, 1, 2);
    reward_stage_free(st);
    expect_nothing_left();
}

/* A fork bomb stops at the process limit; the processes it made (sleeping for a minute)
 * are gone when the call returns; a plain bomb scores 0. */
Test(python_grader, a_fork_bomb_is_capped_and_cleaned_up) {
    need_sandbox();
    const char *source = "import os, time\n"
                         "def grade(sample, item):\n"
                         "    if item['case'] == 'bomb':\n"
                         "        while True:\n"
                         "            os.fork()\n"
                         "    made = 0\n"
                         "    try:\n"
                         "        while True:\n"
                         "            if os.fork() == 0:\n"
                         "                time.sleep(60)\n"
                         "                os._exit(0)\n"
                         "            made += 1\n"
                         "    except OSError:\n"
                         "        return made\n";
    struct reward_stage *st = python_stage(source, 5.0, 1);
    struct reward_sample s[] = {
        {.completion = "", .metadata_json = CASE("count")},
        {.completion = "", .metadata_json = CASE("bomb")},
        {.completion = "", .metadata_json = CASE("count")},
    };
    struct reward_result r[3];
    double t0 = seconds();
    score(st, s, 3, r);
    cr_expect(seconds() - t0 < 10.0, "the batch took %.1f s (the sleepers were waited for?)", seconds() - t0);
    for (int i = 0; i < 3; i += 2) {
        cr_expect(!r[i].failed && r[i].warning[0] == '\0', "%s", r[i].warning);
        cr_expect(r[i].reward >= 1 && r[i].reward < SANDBOX_MAX_PROCS, "sample %d forked %g processes", i,
                  r[i].reward);
    }
    /* The third sample forks as many as the first: the first one's sleepers were killed. */
    cr_expect_eq(r[2].reward, r[0].reward);
    expect_zero(r, 1, "grade() raised BlockingIOError");
    reward_stage_free(st);
    expect_nothing_left();
}

/* ---- what the code cannot reach ---- */

/* A listening socket of the test on 127.0.0.1: the sandbox's 127.0.0.1 is its own. */
static int listener(int *port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    cr_assert(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    cr_assert_eq(listen(fd, 4), 0);
    cr_assert_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    *port = ntohs(a.sin_port);
    return fd;
}

/* Each case returns the errno its attempt ended with (0: it worked). */
static const char *const REACH_SOURCE =
    "import os, socket\n"
    "def attempt(fn):\n"
    "    try:\n"
    "        fn()\n"
    "        return 0\n"
    "    except OSError as e:\n"
    "        return e.errno or -1\n"
    "def connect(host, port):\n"
    "    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)\n"
    "    s.settimeout(2)\n"
    "    s.connect((host, port))\n"
    "def write(path, size):\n"
    "    with open(path, 'wb') as f:\n"
    "        f.write(b'x' * size)\n"
    "def grade(sample, item):\n"
    "    case, arg = item['case'], item.get('arg')\n"
    "    if case == 'loopback':\n"
    "        return attempt(lambda: connect('127.0.0.1', arg))\n"
    "    if case == 'outside':\n"
    "        return attempt(lambda: connect('1.1.1.1', 53))\n"
    "    if case == 'read':\n"
    "        return attempt(lambda: open(arg, 'rb').read())\n"
    "    if case == 'write':\n"
    "        return attempt(lambda: write(arg, 10))\n"
    "    if case == 'fill':\n"
    "        return attempt(lambda: write('/tmp/big', 100 * 2**20))\n"
    "    if case == 'env':\n"
    "        return len([k for k in os.environ if k.startswith('SMELT')])\n"
    "    if case == 'uid':\n"
    "        return os.getuid()\n"
    "    if case == 'userns':\n"
    "        import ctypes\n"
    "        libc = ctypes.CDLL(None, use_errno=True)\n"
    "        return 0 if libc.unshare(0x10000000) == 0 else ctypes.get_errno()\n"
    "    return -2\n";

static struct reward_sample reach(const char *metadata) {
    return (struct reward_sample){.completion = "", .metadata_json = metadata};
}

Test(python_grader, no_network_no_host_files_no_root) {
    need_sandbox();
    int port, lfd = listener(&port);
    char tmpl[] = "/tmp/smelt-other-job-XXXXXX";
    cr_assert(mkdtemp(tmpl));
    char secret[300], m_loop[128], m_secret[400];
    snprintf(secret, sizeof secret, "%s/secret.txt", tmpl);
    FILE *f = fopen(secret, "w");
    cr_assert(f);
    fputs("another job's data\n", f);
    fclose(f);
    cr_assert_eq(setenv("SMELT_TEST_SECRET", "host", 1), 0);
    snprintf(m_loop, sizeof m_loop, "{\"case\": \"loopback\", \"arg\": %d}", port);
    snprintf(m_secret, sizeof m_secret, "{\"case\": \"read\", \"arg\": \"%s\"}", secret);
    struct reward_stage *st = python_stage(REACH_SOURCE, 5.0, 2);
    struct reward_sample s[] = {
        reach(m_loop),
        reach(CASE("outside")),
        reach("{\"case\": \"read\", \"arg\": \"/etc/shadow\"}"),
        reach(m_secret),
        reach("{\"case\": \"write\", \"arg\": \"/usr/smelt-test\"}"),
        reach("{\"case\": \"write\", \"arg\": \"/smelt-test\"}"),
        reach("{\"case\": \"write\", \"arg\": \"/tmp/mine\"}"),
        reach(CASE("fill")),
        reach(CASE("env")),
        reach(CASE("uid")),
        reach(CASE("userns")),
        reach("{\"case\": \"read\", \"arg\": \"/usr/bin/python3\"}"),
    };
    struct reward_result r[12];
    score(st, s, 12, r);
    expect_score(r, 0, ECONNREFUSED); /* nothing listens on the sandbox's own loopback */
    expect_score(r, 1, ENETUNREACH);  /* no route out at all: nothing is ever sent */
    expect_score(r, 2, ENOENT);
    expect_score(r, 3, ENOENT);
    expect_score(r, 4, EROFS);
    expect_score(r, 5, EROFS);
    expect_score(r, 6, 0);
    cr_expect(r[7].reward == ENOSPC || r[7].reward == EFBIG, "filling /tmp ended with errno %g", r[7].reward);
    expect_score(r, 8, 0);
    if (geteuid() == 0) /* root drops to a sandbox uid of its own */
        cr_expect(r[9].reward >= uid_first && r[9].reward <= uid_last, "the code ran as uid %g", r[9].reward);
    else cr_expect_eq(r[9].reward, (double)getuid());
    /* no user namespace of its own (bwrap --disable-userns) */
    cr_expect(r[10].reward == ENOSPC || r[10].reward == EPERM, "unshare(CLONE_NEWUSER) gave errno %g", r[10].reward);
    expect_score(r, 11, 0); /* /usr is there, read-only */
    struct sockaddr_in peer;
    socklen_t len = sizeof peer;
    cr_expect_eq(accept(lfd, (struct sockaddr *)&peer, &len), -1, "the sandbox reached the test's listener");
    close(lfd);
    remove(secret);
    rmdir(tmpl);
    reward_stage_free(st);
    expect_nothing_left();
}

/* ---- inside a multi grader ---- */

Test(python_grader, a_python_sub_grader_of_a_multi) {
    need_sandbox();
    const char *source = "def grade(sample, item):\n"
                         "    if sample['output_text'] == 'boom':\n"
                         "        raise RuntimeError('boom')\n"
                         "    return 0.25 * len(sample['output_text'])\n";
    json_t *spec = json_pack("{s:{s:s, s:s, s:{s:o, s:{s:s, s:s, s:s, s:s}}}}", "grader", "type", "multi",
                             "calculate_output", "0.5 * py + eq", "graders", "py", python_grader(source, 5.0, 0), "eq",
                             "type", "string_check", "input", "{{sample.output_text}}", "reference", "{{item.answer}}",
                             "operation", "eq");
    cr_assert(spec);
    struct reward_stage *st = stage_of(spec);
    cr_expect_eq(reward_stage_count(st), 3);
    cr_expect_str_eq(reward_stage_name(st, 1), "py");
    struct reward_sample s[] = {
        {.completion = "abcd", .answer = "abcd"},
        {.completion = "boom", .answer = "boom"},
        {.completion = "ab", .answer = "x"},
    };
    struct reward_result r[3];
    score(st, s, 3, r);
    cr_expect(!r[0].failed && r[0].reward == 0.5 * 1.0 + 1 && r[0].scores[1] == 1.0 && r[0].scores[2] == 1.0);
    cr_expect_str_eq(r[0].warning, "");
    /* the python sub-grader's 0 goes into the formula; the sample is scored, with the reason */
    cr_expect(!r[1].failed && r[1].reward == 1.0 && r[1].scores[1] == 0.0 && r[1].scores[2] == 1.0, "%g %s",
              r[1].reward, r[1].error);
    cr_expect(strstr(r[1].warning, "grader.graders.py (python): grade() raised RuntimeError: boom"), "%s",
              r[1].warning);
    cr_expect(!r[2].failed && r[2].reward == 0.25 && r[2].scores[2] == 0.0);
    reward_stage_free(st);
    expect_nothing_left();
}

/* ---- the spec ---- */

static void expect_refused(json_t *grader, const char *field, const char *part) {
    json_t *spec = json_pack("{s:o}", "grader", grader);
    struct reward_stage *st = NULL;
    struct smelt_error err = {0};
    int rc = reward_stage_create(spec, "reward", &st, &err);
    json_decref(spec);
    cr_expect_neq(rc, SMELT_OK, "accepted; expected a refusal naming %s", field);
    cr_expect_null(st);
    reward_stage_free(st);
    cr_expect_str_eq(err.field, field, "field \"%s\", expected \"%s\" (%s)", err.field, field, err.message);
    cr_expect(strstr(err.message, part), "message \"%s\" lacks \"%s\"", err.message, part);
}

Test(python_grader, refused_specs_name_the_field) {
    need_sandbox();
    expect_refused(python_grader("def grade(sample, item):\n    return (1\n", 5, 0), "grader.source",
                   "reward.grader.source: line 2: ");
    expect_refused(python_grader("def grade(sample item):\n    return 1\n", 5, 0), "grader.source",
                   "reward.grader.source: line 1: invalid syntax");
    expect_refused(python_grader("def grader(sample, item):\n    return 1\n", 5, 0), "grader.source",
                   "defines no grade(sample, item) function");
    expect_refused(python_grader("def grade(sample):\n    return 1\n", 5, 0), "grader.source",
                   "grade must take two arguments: grade(sample, item)");
    expect_refused(python_grader("import numpy_that_is_not_there\ndef grade(s, i):\n    return 1\n", 5, 0),
                   "grader.source", "the module's top level raised ModuleNotFoundError");
    expect_refused(python_grader("while True:\n    pass\n", 0.3, 0), "grader.source",
                   "the module's top level took more than 0.3 s");
    expect_refused(python_grader("def grade(s, i):\n    return 1\n", 500, 0), "grader.timeout_s", "timeout_s");
    expect_refused(python_grader("def grade(s, i):\n    return 1\n", 5, 17), "grader.sandboxes", "sandboxes");
    json_t *g = python_grader("def grade(s, i):\n    return 1\n", 5, 0);
    json_object_set_new(g, "network", json_true());
    expect_refused(g, "grader.network", "network");
    g = python_grader("def grade(s, i):\n    return 1\n", 5, 0);
    json_object_set_new(g, "memory_mb", json_integer(16));
    expect_refused(g, "grader.memory_mb", "memory_mb");
    char *big = malloc(GRADER_MAX_SOURCE_BYTES + 2);
    cr_assert(big);
    memset(big, '#', GRADER_MAX_SOURCE_BYTES + 1);
    big[GRADER_MAX_SOURCE_BYTES + 1] = '\0';
    expect_refused(python_grader(big, 5, 0), "grader.source", "expected 1 to 262144");
    free(big);
    expect_nothing_left();
}

/* A machine without bwrap refuses the grader when the spec is read: never unsandboxed. */
Test(python_grader, refused_without_bwrap) {
    own_uids();
    cr_assert_eq(setenv("PATH", "/nonexistent", 1), 0);
    expect_refused(python_grader("def grade(s, i):\n    return 1\n", 5, 0), "grader.type",
                   "reward.grader.type: python graders cannot run on this machine: python graders run in a "
                   "bubblewrap sandbox, and bwrap is not installed");
    expect_nothing_left();
}

Test(python_grader, written_back_with_its_defaults) {
    need_sandbox();
    json_t *g = python_grader("def grade(s, i):\n    return 1\n", 5, 0);
    json_object_del(g, "timeout_s");
    json_object_set_new(g, "image_tag", json_string("2025-05-08"));
    json_object_set_new(g, "pass_threshold", json_real(0.5));
    struct reward_stage *st = stage_of(json_pack("{s:o}", "grader", g));
    json_t *back;
    struct smelt_error err = {0};
    cr_assert_eq(reward_stage_to_json(st, &back, &err), SMELT_OK);
    char *text = json_dumps(back, JSON_SORT_KEYS | JSON_COMPACT);
    cr_expect_str_eq(text, "{\"grader\":{\"image_tag\":\"2025-05-08\",\"memory_mb\":2048,\"name\":\"test\","
                           "\"pass_threshold\":0.5,\"source\":\"def grade(s, i):\\n    return 1\\n\","
                           "\"timeout_s\":10.0,\"type\":\"python\"}}");
    free(text);
    /* The prompts check has nothing to refuse: grade() reads what it likes. */
    cr_expect_eq(reward_stage_check_prompt(st, NULL, NULL, &err), SMELT_OK);
    reward_stage_free(st);
    reward_stage_free(stage_of(back)); /* what was written back is a spec again */
    json_t *with = python_grader("def grade(s, i):\n    return 1\n", 5, 3);
    st = stage_of(json_pack("{s:o}", "grader", with));
    cr_assert_eq(reward_stage_to_json(st, &back, &err), SMELT_OK);
    cr_expect_eq(json_integer_value(json_object_get(json_object_get(back, "grader"), "sandboxes")), 3);
    json_decref(back);
    reward_stage_free(st);
    expect_nothing_left();
}

/* Root: a sandbox needs a uid of its own. With one uid for two sandboxes the second
 * cannot start: the scoring call fails (the host's problem, not the samples'), naming
 * why, and the first sandbox is stopped all the same. A range that is not one is
 * refused when the spec is read. */
Test(python_grader, no_free_uid_fails_the_call) {
    need_sandbox();
    if (geteuid() != 0) cr_skip_test("uids are claimed by root callers only");
    struct reward_stage *st = python_stage("def grade(s, i):\n    return 1\n", 5.0, 2);
    char one[32];
    snprintf(one, sizeof one, "%u-%u", uid_first, uid_first);
    cr_assert_eq(setenv("SMELT_SANDBOX_UIDS", one, 1), 0);
    struct reward_sample s[2] = {{.completion = "a"}, {.completion = "b"}};
    struct reward_result r[2];
    struct smelt_error err = {0};
    cr_expect_eq(reward_stage_score(st, s, 2, r, &err), SMELT_EBACKEND);
    cr_expect(strstr(err.message, "grader (python): sandbox: every sandbox uid"), "%s", err.message);
    reward_stage_free(st);
    expect_nothing_left();
    cr_assert_eq(setenv("SMELT_SANDBOX_UIDS", "7-3", 1), 0);
    expect_refused(python_grader("def grade(s, i):\n    return 1\n", 5, 0), "grader.type",
                   "SMELT_SANDBOX_UIDS=\"7-3\": expected FIRST-LAST");
}
