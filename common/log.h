/* Logging: one line per call to stderr, "2026-11-21T10:00:00.123Z INFO  file.c:42 message".
 * The level comes from SMELT_LOG_LEVEL (debug, info, warn, error; default info) or
 * log_set_level. Thread-safe: each line is written with one call. */
#ifndef SMELT_COMMON_LOG_H
#define SMELT_COMMON_LOG_H

enum log_level { LOG_LEVEL_DEBUG, LOG_LEVEL_INFO, LOG_LEVEL_WARN, LOG_LEVEL_ERROR, LOG_LEVEL_OFF };

void log_set_level(enum log_level level);
enum log_level log_get_level(void);
/* Parses "debug"/"info"/"warn"/"error"/"off"; returns 0 or SMELT_EINVAL. */
int log_level_parse(const char *name, enum log_level *out);

void log_write(enum log_level level, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#define log_debug(...) log_write(LOG_LEVEL_DEBUG, __FILE__, __LINE__, __VA_ARGS__)
#define log_info(...)  log_write(LOG_LEVEL_INFO,  __FILE__, __LINE__, __VA_ARGS__)
#define log_warn(...)  log_write(LOG_LEVEL_WARN,  __FILE__, __LINE__, __VA_ARGS__)
#define log_error(...) log_write(LOG_LEVEL_ERROR, __FILE__, __LINE__, __VA_ARGS__)

#endif
