#include "json.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void
json_init(struct json *j)
{
    memset(j, 0, sizeof(*j));
}

void
json_free(struct json *j)
{
    free(j->buf);
    memset(j, 0, sizeof(*j));
}

const char *
json_text(const struct json *j)
{
    if (j->failed) {
        return NULL;
    }
    return j->buf != NULL ? j->buf : "";
}

static void
json_put(struct json *j, const char *s, size_t n)
{
    if (j->failed) {
        return;
    }
    if (n >= j->cap - j->len || j->buf == NULL) {
        size_t cap = j->cap ? j->cap : 256;
        char *grow;
        while (cap - j->len <= n) {
            if (cap > SIZE_MAX / 2) {
                j->failed = true;
                return;
            }
            cap *= 2;
        }
        if ((grow = realloc(j->buf, cap)) == NULL) {
            j->failed = true;
            return;
        }
        j->buf = grow;
        j->cap = cap;
    }
    memcpy(j->buf + j->len, s, n);
    j->len += n;
    j->buf[j->len] = '\0';
}

static void
json_puts(struct json *j, const char *s)
{
    json_put(j, s, strlen(s));
}

/* The separator a value needs where it is about to go. */
static void
json_value_start(struct json *j)
{
    if (j->after_key) {
        j->after_key = false;
        return;
    }
    if (j->has_items[j->depth]) {
        json_put(j, ",", 1);
    }
    j->has_items[j->depth] = true;
}

static void
json_open(struct json *j, const char *bracket)
{
    json_value_start(j);
    if (j->depth == JSON_DEPTH_MAX) {
        j->failed = true;
        return;
    }
    json_puts(j, bracket);
    j->depth++;
    j->has_items[j->depth] = false;
}

static void
json_close(struct json *j, const char *bracket)
{
    if (j->depth == 0) {
        j->failed = true;
        return;
    }
    j->depth--;
    json_puts(j, bracket);
}

void
json_object_begin(struct json *j)
{
    json_open(j, "{");
}

void
json_object_end(struct json *j)
{
    json_close(j, "}");
}

void
json_array_begin(struct json *j)
{
    json_open(j, "[");
}

void
json_array_end(struct json *j)
{
    json_close(j, "]");
}

/* Length of the valid UTF-8 sequence at s (n bytes left), or 0 when it is not one. */
static size_t
utf8_sequence(const unsigned char *s, size_t n)
{
    unsigned char c  = s[0];
    unsigned char lo = 0x80, hi = 0xbf;
    size_t len;

    if (c >= 0xc2 && c <= 0xdf) {
        len = 2;
    } else if (c >= 0xe0 && c <= 0xef) {
        len = 3;
        if (c == 0xe0) {
            lo = 0xa0; /* overlong */
        } else if (c == 0xed) {
            hi = 0x9f; /* surrogates */
        }
    } else if (c >= 0xf0 && c <= 0xf4) {
        len = 4;
        if (c == 0xf0) {
            lo = 0x90; /* overlong */
        } else if (c == 0xf4) {
            hi = 0x8f; /* past U+10FFFF */
        }
    } else {
        return 0;
    }
    if (n < len || s[1] < lo || s[1] > hi) {
        return 0;
    }
    for (size_t i = 2; i < len; i++) {
        if (s[i] < 0x80 || s[i] > 0xbf) {
            return 0;
        }
    }
    return len;
}

static void
json_escaped(struct json *j, const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0, run = 0;

    json_put(j, "\"", 1);
    while (i < n) {
        unsigned char c = p[i];
        const char *esc = NULL;
        char hex[8];
        size_t seq;

        if (c >= 0x20 && c != '"' && c != '\\' && c < 0x80) {
            i++;
            continue;
        }
        if (c >= 0x80 && (seq = utf8_sequence(p + i, n - i)) > 0) {
            i += seq;
            continue;
        }
        json_put(j, s + run, i - run);
        switch (c) {
        case '"':
            esc = "\\\"";
            break;
        case '\\':
            esc = "\\\\";
            break;
        case '\n':
            esc = "\\n";
            break;
        case '\r':
            esc = "\\r";
            break;
        case '\t':
            esc = "\\t";
            break;
        case '\b':
            esc = "\\b";
            break;
        case '\f':
            esc = "\\f";
            break;
        default:
            if (c < 0x20) {
                snprintf(hex, sizeof(hex), "\\u%04x", c);
                esc = hex;
            } else {
                esc = "\\ufffd";
            }
            break;
        }
        json_puts(j, esc);
        i++;
        run = i;
    }
    json_put(j, s + run, n - run);
    json_put(j, "\"", 1);
}

void
json_key(struct json *j, const char *key)
{
    json_value_start(j);
    json_escaped(j, key, strlen(key));
    json_put(j, ":", 1);
    j->after_key = true;
}

void
json_string_len(struct json *j, const char *s, size_t len)
{
    json_value_start(j);
    json_escaped(j, s, len);
}

void
json_string(struct json *j, const char *s)
{
    if (s == NULL) {
        json_null(j);
        return;
    }
    json_string_len(j, s, strlen(s));
}

void
json_uint(struct json *j, uint64_t v)
{
    char buf[32];

    json_value_start(j);
    snprintf(buf, sizeof(buf), "%llu", (unsigned long long)v);
    json_puts(j, buf);
}

void
json_int(struct json *j, int64_t v)
{
    char buf[32];

    json_value_start(j);
    snprintf(buf, sizeof(buf), "%lld", (long long)v);
    json_puts(j, buf);
}

void
json_format_number(char *buf, size_t cap, double v, bool as_float)
{
    if (isnan(v)) {
        snprintf(buf, cap, "nan");
        return;
    }
    if (isinf(v)) {
        snprintf(buf, cap, "%s", v < 0 ? "-inf" : "inf");
        return;
    }
    for (int prec = 1; prec <= 17; prec++) {
        const char *e;
        long exp10;

        snprintf(buf, cap, "%.*g", prec, v);
        if (as_float ? (float)strtod(buf, NULL) != (float)v : strtod(buf, NULL) != v) {
            continue;
        }
        /* %g switches to an exponent once it exceeds the precision ("1e+01" for 10); whole
         * numbers below 1e17 read better written out. */
        if ((e = strchr(buf, 'e')) != NULL && (exp10 = strtol(e + 1, NULL, 10)) > 0 && exp10 < 17) {
            snprintf(buf, cap, "%.*g", (int)exp10 + 1, v);
        }
        return;
    }
}

static void
json_number(struct json *j, double v, bool as_float)
{
    char buf[40];

    if (!isfinite(v)) {
        json_null(j);
        return;
    }
    json_format_number(buf, sizeof(buf), v, as_float);
    json_value_start(j);
    json_puts(j, buf);
}

void
json_double(struct json *j, double v)
{
    json_number(j, v, false);
}

void
json_float(struct json *j, float v)
{
    json_number(j, (double)v, true);
}

void
json_bool(struct json *j, bool v)
{
    json_value_start(j);
    json_puts(j, v ? "true" : "false");
}

void
json_null(struct json *j)
{
    json_value_start(j);
    json_puts(j, "null");
}
