#include "log.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static atomic_int log_threshold = LOG_INFO;
static atomic_int log_fmt       = LOG_FORMAT_TEXT;
static char log_component[32]   = "devcoord";

static const char *const level_names[LOG_LEVEL_COUNT] = {
    [LOG_DEBUG] = "debug",
    [LOG_INFO]  = "info",
    [LOG_WARN]  = "warn",
    [LOG_ERROR] = "error",
};

static const char *const format_names[LOG_FORMAT_COUNT] = {
    [LOG_FORMAT_TEXT] = "text",
    [LOG_FORMAT_JSON] = "json",
};

static int
name_index(const char *const *names, int n, const char *name)
{
    for (int i = 0; i < n; i++) {
        if (strcmp(names[i], name) == 0) {
            return i;
        }
    }
    return -1;
}

const char *
log_level_name(enum log_level level)
{
    return (unsigned)level < LOG_LEVEL_COUNT ? level_names[level] : "?";
}

int
log_level_from_name(const char *name)
{
    return name_index(level_names, LOG_LEVEL_COUNT, name);
}

int
log_format_from_name(const char *name)
{
    return name_index(format_names, LOG_FORMAT_COUNT, name);
}

void
log_configure(enum log_level level, enum log_format format, const char *component)
{
    atomic_store(&log_threshold, (int)level);
    atomic_store(&log_fmt, (int)format);
    snprintf(log_component, sizeof(log_component), "%s", component);
}

void
log_set_level(enum log_level level)
{
    atomic_store(&log_threshold, (int)level);
}

bool
log_is_control(unsigned char c)
{
    return c < 0x20 || c == 0x7f;
}

bool
log_has_control(const char *text)
{
    for (; *text != '\0'; text++) {
        if (log_is_control((unsigned char)*text)) {
            return true;
        }
    }
    return false;
}

/* Copies s to out with its control characters escaped (\n, \r, \t by name, the others as
 * \xNN), so that a line stays one line on the terminal and in the file whatever text it
 * carries: a peer's name with a newline and a fake timestamp after it would otherwise
 * forge a line. Backslashes are left alone, for readable paths and messages. */
static void
text_escape(char *out, size_t cap, const char *s)
{
    size_t n = 0;

    for (; *s != '\0' && n + 5 < cap; s++) {
        unsigned char c = (unsigned char)*s;
        if (!log_is_control(c)) {
            out[n++] = (char)c;
        } else if (c == '\n' || c == '\r' || c == '\t') {
            out[n++] = '\\';
            out[n++] = c == '\n' ? 'n' : c == '\r' ? 'r' : 't';
        } else {
            n += (size_t)snprintf(out + n, cap - n, "\\x%02x", c);
        }
    }
    out[n] = '\0';
}

/* Appends s to out as the inside of a JSON string. */
static size_t
json_escape(char *out, size_t cap, const char *s)
{
    size_t n = 0;

    for (; *s != '\0' && n + 7 < cap; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            out[n++] = '\\';
            out[n++] = (char)c;
        } else if (c == '\n') {
            out[n++] = '\\';
            out[n++] = 'n';
        } else if (c < 0x20) {
            n += (size_t)snprintf(out + n, cap - n, "\\u%04x", c);
        } else {
            out[n++] = (char)c;
        }
    }
    out[n] = '\0';
    return n;
}

void
log_msg(enum log_level level, const char *fmt, ...)
{
    /* Escaping takes at most 6 bytes per byte (JSON's \u00XX). */
    char msg[2048], esc[sizeof(msg) * 6 + 1], ts[40];
    struct timespec now;
    struct tm tm;
    va_list ap;

    if ((int)level < atomic_load(&log_threshold)) {
        return;
    }
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);

    clock_gettime(CLOCK_REALTIME, &now);
    gmtime_r(&now.tv_sec, &tm);
    strftime(ts, sizeof(ts) - 8, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(ts + strlen(ts), 8, ".%03uZ", (unsigned)(now.tv_nsec / 1000000) % 1000u);
    if (atomic_load(&log_fmt) == LOG_FORMAT_JSON) {
        json_escape(esc, sizeof(esc), msg);
        fprintf(stderr, "{\"ts\":\"%s\",\"level\":\"%s\",\"component\":\"%s\",\"msg\":\"%s\"}\n",
                ts, level_names[level], log_component, esc);
    } else {
        text_escape(esc, sizeof(esc), msg);
        fprintf(stderr, "%s %-5s %s: %s\n", ts, level_names[level], log_component, esc);
    }
}
