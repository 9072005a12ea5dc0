/*
 * Logging for the daemons: one line per event on stderr, as readable text or as one JSON
 * object per line (log.format), filtered by log.level. Thread-safe. Never pass a secret
 * (a token) to it.
 */
#ifndef DEVCOORD_COMMON_LOG_H
#define DEVCOORD_COMMON_LOG_H

#include <stdbool.h>

enum log_format { LOG_FORMAT_TEXT = 0, LOG_FORMAT_JSON, LOG_FORMAT_COUNT };
enum log_level { LOG_DEBUG = 0, LOG_INFO, LOG_WARN, LOG_ERROR, LOG_LEVEL_COUNT };

/* Sets the threshold, the format and the component name printed with every line. */
void log_configure(enum log_level level, enum log_format format, const char *component);

/* Changes the threshold only (a reload: SIGHUP). */
void log_set_level(enum log_level level);

void log_msg(enum log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define log_debug(...) log_msg(LOG_DEBUG, __VA_ARGS__)
#define log_info(...)  log_msg(LOG_INFO, __VA_ARGS__)
#define log_warn(...)  log_msg(LOG_WARN, __VA_ARGS__)
#define log_error(...) log_msg(LOG_ERROR, __VA_ARGS__)

/* Control characters: bytes 0x01 to 0x1f and 0x7f. Log lines escape them. Names, labels
 * and addresses that peers send or configs give must not hold any (they are refused at the
 * door), since they end up in log lines, listings and terminals. */
bool log_is_control(unsigned char c);
bool log_has_control(const char *text);

/* The names configs and log lines use: "debug" ... "error", "text" | "json"; the
 * from_name functions return -1 for anything else. */
const char *log_level_name(enum log_level level);
int log_level_from_name(const char *name);
int log_format_from_name(const char *name);

#endif
