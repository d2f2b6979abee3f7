#include "common/log.h"
#include "common/error.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

/* -1 until first use, when SMELT_LOG_LEVEL is read. */
static _Atomic int current_level = -1;

static const char *const level_names[] = {"DEBUG", "INFO", "WARN", "ERROR", "OFF"};

int log_level_parse(const char *name, enum log_level *out) {
    static const char *const lower[] = {"debug", "info", "warn", "error", "off"};
    for (int i = 0; i <= LOG_LEVEL_OFF; i++) {
        if (name && strcasecmp(name, lower[i]) == 0) {
            *out = (enum log_level)i;
            return SMELT_OK;
        }
    }
    return SMELT_EINVAL;
}

enum log_level log_get_level(void) {
    int level = atomic_load(&current_level);
    if (level < 0) {
        enum log_level parsed = LOG_LEVEL_INFO;
        const char *env = getenv("SMELT_LOG_LEVEL");
        if (env && log_level_parse(env, &parsed) != SMELT_OK) parsed = LOG_LEVEL_INFO;
        level = (int)parsed;
        atomic_store(&current_level, level);
    }
    return (enum log_level)level;
}

void log_set_level(enum log_level level) { atomic_store(&current_level, (int)level); }

void log_write(enum log_level level, const char *file, int line, const char *fmt, ...) {
    if (level < log_get_level() || level >= LOG_LEVEL_OFF) return;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;

    char buf[2048];
    int n = snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %-5s %s:%d ",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                     tm.tm_sec, ts.tv_nsec / 1000000, level_names[level], base, line);
    if (n < 0) return;
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(buf + n, sizeof buf - (size_t)n, fmt, ap);
    va_end(ap);
    size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
    if (len > sizeof buf - 2) len = sizeof buf - 2;
    buf[len++] = '\n';
    /* One write() per line keeps lines whole across threads and processes. */
    ssize_t w = write(STDERR_FILENO, buf, len);
    (void)w;
}
