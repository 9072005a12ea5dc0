/*
 * The YAML loader of both daemons' configs. One file, at ~1,600 lines, because its three
 * parts only make sense together: the event-driven loader over libyaml that tracks where it
 * is (file:line:column for every error), the field parsers (addresses, sizes, devices,
 * labels, ...), and the two schemas as tables of those parsers with their defaults.
 * Reading it from the tables at the bottom up is the easiest way in: a new key is one table
 * row, and usually no new code.
 */
#include "config.h"

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <yaml.h>

#include "address.h"
#include "device.h"
#include "rpc.h"
#include "status.h"

/* Bounds on what a file may make us hold. Devices are compared pairwise for duplicates, so
 * their count is bounded too; a worker with more than this is a mistake, not a machine. */
#define CONFIG_FILE_MAX    ((size_t)1024 * 1024)
#define CONFIG_DEVICES_MAX 4096
#define CONFIG_LABELS_MAX  256

#define CONFIG_FIELDS_MAX  16  /* keys one mapping of the schema may have */
#define CONFIG_PATH_SIZE   320 /* "devices[12].memory", "labels.<escaped key>" */
#define CONFIG_REASON_SIZE 640
#define CONFIG_QUOTE_CHARS 64 /* characters of user text quoted in a message */
#define CONFIG_QUOTE_SIZE  (CONFIG_QUOTE_CHARS * 4 + 8)
#define CONFIG_FOUND_SIZE  (CONFIG_QUOTE_SIZE + 32)

#define DEFAULT_COORDINATOR_LISTEN "tcp://127.0.0.1:7400"
#define DEFAULT_COORDINATOR_HTTP   "127.0.0.1:7480"
#define DEFAULT_WORKER_LISTEN      "tcp://127.0.0.1:7500"
#define DEFAULT_MAX_MESSAGE_BYTES  4194304
#define MIN_MAX_MESSAGE_BYTES      4096
#define MAX_MAX_MESSAGE_BYTES      (1024ULL * 1024 * 1024)
#define MAX_MAX_TENSOR_BYTES       (1ULL << 40)
#define DEFAULT_MAX_TENSOR_BYTES   (4ULL << 30)
#define MAX_INFLIGHT_BYTES         (1ULL << 40)
#define MAX_MAX_CONNECTIONS        (1u << 24)
/* The registry's bounds (issue 12): a few thousand nodes of up to a few hundred devices
 * each; the total leaves room for the 100k-device registry benchmark. Registrations past
 * them are refused, so memory stays bounded whatever peers send. */
#define DEFAULT_MAX_WORKERS            4096
#define DEFAULT_MAX_DEVICES_PER_WORKER 1024
#define DEFAULT_MAX_DEVICES            131072
/* One RegisterWorker cannot carry more devices than this within any message limit. */
#define MAX_MAX_DEVICES_PER_WORKER 65536
#define DEFAULT_FORGET_AFTER_MS    3600000

_Static_assert(sizeof(unsigned long long) == sizeof(uint64_t), "strtoull must fill a uint64_t");

/*
 * The file is read as a stream of libyaml events and walked against a schema of tables, one
 * per mapping. A node of the wrong type is an error at once, so the walk never goes deeper than
 * the schema (three levels: devices, one device, its keys) however deep the file nests, and no
 * tree of the file is ever built. Aliases are refused: none is needed, and they are the one way
 * a small YAML file can stand for a huge or cyclic one.
 */
struct loader {
    yaml_parser_t parser;
    yaml_event_t ev; /* the current event, valid while have_ev */
    bool have_ev;
    const char *name;
    const char *data;
    size_t len;
    dc_status *st;
};

/* What a mapping of the schema saw: which keys, where. Indexed like its field table. */
struct seen {
    uint32_t mask;
    yaml_mark_t key[CONFIG_FIELDS_MAX];
    yaml_mark_t value[CONFIG_FIELDS_MAX];
};

struct field;
typedef dc_code (*field_parse_fn)(struct loader *ld, const struct field *f, const char *path,
                                  void *at);
typedef dc_code (*field_check_fn)(struct loader *ld, const char *path, void *at,
                                  const struct seen *seen);

/* One key of a mapping. `at` handed to parse is the mapping's base plus offset. */
struct field {
    const char *name;
    field_parse_fn parse;
    size_t offset;
    uint64_t min, max;       /* integers and sizes */
    const struct field *sub; /* field_map: the nested mapping's keys, ended by a NULL name */
    field_check_fn check;    /* field_map: run once the nested mapping is read */
};

static bool
is_digit(char c)
{
    return c >= '0' && c <= '9';
}

static bool
is_alnum(char c)
{
    return is_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

/* User text for a message: at most CONFIG_QUOTE_CHARS characters, control bytes as \xNN. */
static const char *
text_escape(const char *s, char *buf, size_t cap)
{
    size_t n = 0, chars = 0;

    for (const char *p = s; *p != '\0' && n + 8 < cap; p++) {
        unsigned char u   = (unsigned char)*p;
        bool continuation = (u & 0xc0) == 0x80;

        if (!continuation && chars++ == CONFIG_QUOTE_CHARS) {
            n += (size_t)snprintf(buf + n, cap - n, "...");
            break;
        }
        if (log_is_control(u) || u == '\'' || u == '\\') {
            n += (size_t)snprintf(buf + n, cap - n, "\\x%02x", u);
        } else {
            buf[n++] = (char)u;
        }
    }
    buf[n] = '\0';
    return buf;
}

static const char *
text_quote(const char *s, char buf[CONFIG_QUOTE_SIZE])
{
    char esc[CONFIG_QUOTE_SIZE - 2];

    snprintf(buf, CONFIG_QUOTE_SIZE, "'%s'", text_escape(s, esc, sizeof(esc)));
    return buf;
}

static dc_code loader_fail(struct loader *ld, const yaml_mark_t *mark, const char *path,
                           const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* "name:line:column: key 'path': reason"; libyaml counts from 0, people from 1. */
static dc_code
loader_fail(struct loader *ld, const yaml_mark_t *mark, const char *path, const char *fmt, ...)
{
    char reason[CONFIG_REASON_SIZE];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(reason, sizeof(reason), fmt, ap);
    va_end(ap);
    if (path[0] == '\0') {
        return status_set(ld->st, DC_INVALID_ARGUMENT, "%s:%zu:%zu: %s", ld->name, mark->line + 1,
                          mark->column + 1, reason);
    }
    return status_set(ld->st, DC_INVALID_ARGUMENT, "%s:%zu:%zu: key '%s': %s", ld->name,
                      mark->line + 1, mark->column + 1, path, reason);
}

static dc_code
loader_oom(struct loader *ld)
{
    return status_set(ld->st, DC_RESOURCE_EXHAUSTED, "%s: out of memory", ld->name);
}

static dc_code
loader_syntax_error(struct loader *ld)
{
    const yaml_parser_t *p = &ld->parser;
    const char *problem    = p->problem != NULL ? p->problem : "invalid YAML";
    size_t line = 1, column = 1;

    if (p->error == YAML_MEMORY_ERROR) {
        return loader_oom(ld);
    }
    if (p->error == YAML_READER_ERROR) {
        /* The reader reports a byte offset, not a mark. */
        for (size_t i = 0; i < p->problem_offset && i < ld->len; i++) {
            column++;
            if (ld->data[i] == '\n') {
                line++;
                column = 1;
            }
        }
        if (p->problem_value != -1) {
            return status_set(ld->st, DC_INVALID_ARGUMENT, "%s:%zu:%zu: %s (#%X)", ld->name, line,
                              column, problem, (unsigned)p->problem_value);
        }
        return status_set(ld->st, DC_INVALID_ARGUMENT, "%s:%zu:%zu: %s", ld->name, line, column,
                          problem);
    }
    line   = p->problem_mark.line + 1;
    column = p->problem_mark.column + 1;
    if (p->context != NULL) {
        return status_set(ld->st, DC_INVALID_ARGUMENT, "%s:%zu:%zu: %s (%s at %zu:%zu)", ld->name,
                          line, column, problem, p->context, p->context_mark.line + 1,
                          p->context_mark.column + 1);
    }
    return status_set(ld->st, DC_INVALID_ARGUMENT, "%s:%zu:%zu: %s", ld->name, line, column,
                      problem);
}

/* Moves to the next event, dropping the current one. */
static dc_code
loader_next(struct loader *ld)
{
    if (ld->have_ev) {
        yaml_event_delete(&ld->ev);
        ld->have_ev = false;
    }
    if (!yaml_parser_parse(&ld->parser, &ld->ev)) {
        return loader_syntax_error(ld);
    }
    ld->have_ev = true;
    return DC_OK;
}

static const yaml_mark_t *
loader_mark(const struct loader *ld)
{
    return &ld->ev.start_mark;
}

static bool
tag_is(const char *tag, const char *name)
{
    return tag != NULL && strcmp(tag, name) == 0;
}

/* YAML's null: an empty or ~/null plain scalar (of the current event, a scalar). */
static bool
scalar_is_null(const char *text, bool typed)
{
    return typed && (text[0] == '\0' || strcmp(text, "~") == 0 || strcmp(text, "null") == 0 ||
                     strcmp(text, "Null") == 0 || strcmp(text, "NULL") == 0);
}

/* What the current event is, for "expected X, found Y". */
static const char *
loader_found(const struct loader *ld, char buf[CONFIG_FOUND_SIZE])
{
    const yaml_event_t *ev = &ld->ev;
    char q[CONFIG_QUOTE_SIZE];

    switch (ev->type) {
    case YAML_MAPPING_START_EVENT:
        return "a mapping";
    case YAML_SEQUENCE_START_EVENT:
        return "a sequence";
    case YAML_ALIAS_EVENT:
        return "an alias (aliases are not supported)";
    case YAML_SCALAR_EVENT: {
        const char *text = (const char *)ev->data.scalar.value;
        bool plain       = ev->data.scalar.style == YAML_PLAIN_SCALAR_STYLE;

        if (ev->data.scalar.tag == NULL && scalar_is_null(text, plain)) {
            return "null";
        }
        snprintf(buf, CONFIG_FOUND_SIZE, "%s%s", plain ? "" : "the quoted string ",
                 text_quote(text, q));
        return buf;
    }
    default:
        return "the end of a collection";
    }
}

/*
 * The current event as a scalar. `typed` says whether YAML may read it as a null, boolean or
 * integer (a plain scalar, or one tagged !!null, !!bool or !!int) rather than as a string.
 * The text lives until the next event.
 */
static dc_code
loader_scalar(struct loader *ld, const char *path, const char *expected, const char **text,
              bool *typed)
{
    const yaml_event_t *ev = &ld->ev;
    const char *tag;
    char found[CONFIG_FOUND_SIZE], q[CONFIG_QUOTE_SIZE];

    *text  = "";
    *typed = false;
    if (ev->type != YAML_SCALAR_EVENT) {
        return loader_fail(ld, loader_mark(ld), path, "expected %s, found %s", expected,
                           loader_found(ld, found));
    }
    tag   = (const char *)ev->data.scalar.tag;
    *text = (const char *)ev->data.scalar.value;
    if (tag == NULL) {
        *typed = ev->data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
    } else if (tag_is(tag, "!") || tag_is(tag, YAML_STR_TAG)) {
        *typed = false;
    } else if (tag_is(tag, YAML_NULL_TAG) || tag_is(tag, YAML_BOOL_TAG) ||
               tag_is(tag, YAML_INT_TAG)) {
        *typed = true;
    } else {
        return loader_fail(ld, loader_mark(ld), path, "unsupported tag %s", text_quote(tag, q));
    }
    /* A double-quoted "\0" puts a NUL inside the value; C strings cannot carry it. */
    if (strlen(*text) != ev->data.scalar.length) {
        return loader_fail(ld, loader_mark(ld), path, "contains a NUL character");
    }
    return DC_OK;
}

/* A non-null scalar read as a string; "" only when empty_ok. */
static dc_code
loader_string(struct loader *ld, const char *path, bool empty_ok, const char **text)
{
    bool typed;
    dc_code rv;

    if ((rv = loader_scalar(ld, path, "a string", text, &typed)) != DC_OK) {
        return rv;
    }
    if (scalar_is_null(*text, typed)) {
        return loader_fail(ld, loader_mark(ld), path, "expected a string, found null");
    }
    if (!empty_ok && (*text)[0] == '\0') {
        return loader_fail(ld, loader_mark(ld), path, "must not be empty");
    }
    return DC_OK;
}

static dc_code
loader_strdup(struct loader *ld, char **field, const char *text)
{
    char *copy = strdup(text);

    if (copy == NULL) {
        return loader_oom(ld);
    }
    free(*field);
    *field = copy;
    return DC_OK;
}

/* A plain decimal integer: digits only, no sign, no leading zero, at most UINT64_MAX. */
static dc_code
loader_uint(struct loader *ld, const char *path, uint64_t *out)
{
    const char *text;
    char *end;
    char q[CONFIG_QUOTE_SIZE], found[CONFIG_FOUND_SIZE];
    unsigned long long v;
    bool typed;
    dc_code rv;
    size_t i;

    if ((rv = loader_scalar(ld, path, "an integer", &text, &typed)) != DC_OK) {
        return rv;
    }
    if (!typed || scalar_is_null(text, typed)) {
        return loader_fail(ld, loader_mark(ld), path, "expected an integer, found %s",
                           loader_found(ld, found));
    }
    i = text[0] == '-' ? 1 : 0;
    while (is_digit(text[i])) {
        i++;
    }
    if (text[i] != '\0' || !is_digit(text[text[0] == '-' ? 1 : 0])) {
        return loader_fail(ld, loader_mark(ld), path, "expected a decimal integer, found %s",
                           text_quote(text, q));
    }
    if (text[0] == '-') {
        return loader_fail(ld, loader_mark(ld), path, "must not be negative, found %s",
                           text_quote(text, q));
    }
    if (text[0] == '0' && text[1] != '\0') {
        return loader_fail(ld, loader_mark(ld), path,
                           "expected a decimal integer without leading zeros, found %s",
                           text_quote(text, q));
    }
    errno = 0;
    v     = strtoull(text, &end, 10);
    if (errno == ERANGE || *end != '\0') {
        return loader_fail(ld, loader_mark(ld), path,
                           "out of range, found %s (at most %" PRIu64 ")", text_quote(text, q),
                           UINT64_MAX);
    }
    *out = v;
    return DC_OK;
}

static dc_code
loader_range(struct loader *ld, const struct field *f, const char *path, uint64_t v,
             const yaml_mark_t *mark)
{
    if (v >= f->min && v <= f->max) {
        return DC_OK;
    }
    if (v < f->min && (f->max == UINT32_MAX || f->max == UINT64_MAX)) {
        return loader_fail(ld, mark, path, "must be at least %" PRIu64 ", found %" PRIu64, f->min,
                           v);
    }
    if (v > f->max && f->min == 0) {
        return loader_fail(ld, mark, path, "must be at most %" PRIu64 ", found %" PRIu64, f->max,
                           v);
    }
    return loader_fail(ld, mark, path,
                       "must be between %" PRIu64 " and %" PRIu64 ", found %" PRIu64, f->min,
                       f->max, v);
}

static void
path_join(char out[CONFIG_PATH_SIZE], const char *parent, const char *key)
{
    char esc[CONFIG_QUOTE_SIZE];
    size_t n = strnlen(parent, CONFIG_PATH_SIZE - 1), k;

    /* A path too long for the buffer is cut short: it only ever appears in messages. */
    text_escape(key, esc, sizeof(esc));
    memmove(out, parent, n);
    if (n > 0 && n < CONFIG_PATH_SIZE - 1) {
        out[n++] = '.';
    }
    k = strlen(esc);
    if (k > CONFIG_PATH_SIZE - 1 - n) {
        k = CONFIG_PATH_SIZE - 1 - n;
    }
    memcpy(out + n, esc, k);
    out[n + k] = '\0';
}

static void
path_index(char out[CONFIG_PATH_SIZE], const char *parent, size_t i)
{
    snprintf(out, CONFIG_PATH_SIZE, "%s[%zu]", parent, i);
}

/* The current event as a mapping key: a non-empty string. */
static dc_code
loader_key(struct loader *ld, const char *path, const char **key)
{
    char found[CONFIG_FOUND_SIZE];
    bool typed;
    dc_code rv;

    *key = "";
    if (ld->ev.type != YAML_SCALAR_EVENT) {
        return loader_fail(ld, loader_mark(ld), path, "keys must be strings, found %s",
                           loader_found(ld, found));
    }
    if ((rv = loader_scalar(ld, path, "a key", key, &typed)) != DC_OK) {
        return rv;
    }
    if ((*key)[0] == '\0' || scalar_is_null(*key, typed)) {
        return loader_fail(ld, loader_mark(ld), path, "empty key");
    }
    return DC_OK;
}

static dc_code
loader_unknown_key(struct loader *ld, const struct field *fields, const char *path)
{
    char known[CONFIG_REASON_SIZE / 2];
    size_t n = 0;

    known[0] = '\0';
    for (const struct field *f = fields; f->name != NULL && n < sizeof(known); f++) {
        n += (size_t)snprintf(known + n, sizeof(known) - n, "%s%s", f == fields ? "" : ", ",
                              f->name);
    }
    return loader_fail(ld, loader_mark(ld), path, "unknown key (expected one of: %s)", known);
}

/* Reads the mapping whose start is the current event against `fields`, up to its end. */
static dc_code
loader_mapping(struct loader *ld, const char *path, const struct field *fields, void *base,
               struct seen *seen)
{
    char child[CONFIG_PATH_SIZE];
    const char *key;
    size_t i;
    dc_code rv;

    memset(seen, 0, sizeof(*seen));
    for (;;) {
        if ((rv = loader_next(ld)) != DC_OK) {
            return rv;
        }
        if (ld->ev.type == YAML_MAPPING_END_EVENT) {
            return DC_OK;
        }
        if ((rv = loader_key(ld, path, &key)) != DC_OK) {
            return rv;
        }
        path_join(child, path, key);
        for (i = 0; fields[i].name != NULL && strcmp(fields[i].name, key) != 0; i++) {
        }
        if (fields[i].name == NULL) {
            return loader_unknown_key(ld, fields, child);
        }
        assert(i < CONFIG_FIELDS_MAX);
        if (seen->mask & (1U << i)) {
            return loader_fail(ld, loader_mark(ld), child, "duplicate key (first at line %zu)",
                               seen->key[i].line + 1);
        }
        seen->mask |= 1U << i;
        seen->key[i] = *loader_mark(ld);
        if ((rv = loader_next(ld)) != DC_OK) {
            return rv;
        }
        seen->value[i] = *loader_mark(ld);
        if ((rv = fields[i].parse(ld, &fields[i], child, (char *)base + fields[i].offset)) !=
            DC_OK) {
            return rv;
        }
    }
}

static dc_code
loader_expect(struct loader *ld, const char *path, yaml_event_type_t type, const char *expected)
{
    char found[CONFIG_FOUND_SIZE];

    if (ld->ev.type == type) {
        return DC_OK;
    }
    return loader_fail(ld, loader_mark(ld), path, "expected %s, found %s", expected,
                       loader_found(ld, found));
}

/* Field parsers: each reads the current event (the key's value) into `at`. */

static dc_code
field_map(struct loader *ld, const struct field *f, const char *path, void *at)
{
    struct seen seen;
    dc_code rv;

    if ((rv = loader_expect(ld, path, YAML_MAPPING_START_EVENT, "a mapping")) != DC_OK ||
        (rv = loader_mapping(ld, path, f->sub, at, &seen)) != DC_OK) {
        return rv;
    }
    return f->check != NULL ? f->check(ld, path, at, &seen) : DC_OK;
}

static dc_code
field_string(struct loader *ld, const struct field *f, const char *path, void *at)
{
    const char *text;
    dc_code rv;

    (void)f;
    if ((rv = loader_string(ld, path, false, &text)) != DC_OK) {
        return rv;
    }
    return loader_strdup(ld, at, text);
}

/* An nng address the daemon listens on or dials. */
static dc_code
field_address(struct loader *ld, const struct field *f, const char *path, void *at)
{
    const char *text, *why;
    char q[CONFIG_QUOTE_SIZE];
    dc_code rv;

    (void)f;
    if ((rv = loader_string(ld, path, false, &text)) != DC_OK) {
        return rv;
    }
    if ((why = address_problem(text)) != NULL) {
        return loader_fail(ld, loader_mark(ld), path, "invalid address %s: %s", text_quote(text, q),
                           why);
    }
    return loader_strdup(ld, at, text);
}

/* NULL when text is an etcd endpoint we can dial: http:// or https://, a host, a port,
 * nothing after it. */
static const char *
endpoint_problem(const char *text)
{
    const char *host, *colon;

    if (strncmp(text, "http://", 7) == 0) {
        host = text + 7;
    } else if (strncmp(text, "https://", 8) == 0) {
        host = text + 8;
    } else {
        return "expected http://HOST:PORT or https://HOST:PORT";
    }
    if (strlen(text) > ADDRESS_MAX) {
        return "too long";
    }
    if ((colon = strrchr(host, ':')) == NULL || colon == host) {
        return "expected HOST:PORT after the scheme";
    }
    for (const char *p = host; *p != '\0'; p++) {
        if (log_is_control((unsigned char)*p) || *p == '/' || *p == ',' || *p == ' ') {
            return "the host and port may not hold control characters, '/', ',' or spaces";
        }
    }
    if (!address_port_valid(colon + 1) || colon[1] == '\0') {
        return "invalid port";
    }
    return NULL;
}

static const char *
address_item_problem(const char *text)
{
    if (strchr(text, ',') != NULL) {
        return "one address per item (',' separates addresses only in a string)";
    }
    return address_problem(text);
}

/* A list of addresses, as a YAML sequence or a string "a,b,c", each checked by `problem`;
 * kept as "a,b,c". */
static dc_code
field_list(struct loader *ld, const char *path, void *at, const char *(*problem)(const char *))
{
    char item[CONFIG_PATH_SIZE], q[CONFIG_QUOTE_SIZE],
        joined[CONFIG_ENDPOINTS_MAX * (ADDRESS_MAX + 1)];
    size_t n = 0, used = 0;
    bool seq = ld->ev.type == YAML_SEQUENCE_START_EVENT;
    const char *text, *why;
    dc_code rv;

    joined[0] = '\0';
    for (size_t i = 0;; i++) {
        char one[ADDRESS_MAX + 2];
        const char *start, *end;

        if (seq) {
            if ((rv = loader_next(ld)) != DC_OK) {
                return rv;
            }
            if (ld->ev.type == YAML_SEQUENCE_END_EVENT) {
                break;
            }
            path_index(item, path, i);
            if ((rv = loader_string(ld, item, false, &text)) != DC_OK) {
                return rv;
            }
            start = text;
            end   = text + strlen(text);
        } else {
            if (i == 0 && (rv = loader_string(ld, path, false, &text)) != DC_OK) {
                return rv;
            }
            snprintf(item, sizeof(item), "%s", path);
            if (i > 0 && *text == '\0') {
                break;
            }
            start = text;
            end   = strchr(start, ',');
            if (end == NULL) {
                end = start + strlen(start);
            }
            text = *end == ',' ? end + 1 : end;
            if (end == start) {
                return loader_fail(ld, loader_mark(ld), path, "empty address in the list");
            }
        }
        if ((size_t)(end - start) > ADDRESS_MAX) {
            return loader_fail(ld, loader_mark(ld), item, "address longer than %d bytes",
                               ADDRESS_MAX);
        }
        memcpy(one, start, (size_t)(end - start));
        one[end - start] = '\0';
        if ((why = problem(one)) != NULL) {
            return loader_fail(ld, loader_mark(ld), item, "invalid address %s: %s",
                               text_quote(one, q), why);
        }
        if (n == CONFIG_ENDPOINTS_MAX) {
            return loader_fail(ld, loader_mark(ld), item, "more than %d addresses",
                               CONFIG_ENDPOINTS_MAX);
        }
        used +=
            (size_t)snprintf(joined + used, sizeof(joined) - used, "%s%s", n > 0 ? "," : "", one);
        n++;
        if (!seq && *text == '\0') {
            if (*end == ',') {
                return loader_fail(ld, loader_mark(ld), path, "empty address in the list");
            }
            break;
        }
    }
    if (n == 0) {
        return loader_fail(ld, loader_mark(ld), path, "must name at least one address");
    }
    return loader_strdup(ld, at, joined);
}

/* coordinator: one nng address, or several ([a, b, c] or "a,b,c") to follow a leader. */
static dc_code
field_address_list(struct loader *ld, const struct field *f, const char *path, void *at)
{
    (void)f;
    return field_list(ld, path, at, address_item_problem);
}

/* state.endpoints: etcd's client URLs. */
static dc_code
field_endpoints(struct loader *ld, const struct field *f, const char *path, void *at)
{
    (void)f;
    return field_list(ld, path, at, endpoint_problem);
}

static dc_code
field_state_backend(struct loader *ld, const struct field *f, const char *path, void *at)
{
    const char *text;
    char q[CONFIG_QUOTE_SIZE];
    dc_code rv;

    (void)f;
    if ((rv = loader_string(ld, path, false, &text)) != DC_OK) {
        return rv;
    }
    if (strcmp(text, "local") == 0) {
        *(enum config_state_backend *)at = STATE_BACKEND_LOCAL;
    } else if (strcmp(text, "etcd") == 0) {
        *(enum config_state_backend *)at = STATE_BACKEND_ETCD;
    } else {
        return loader_fail(ld, loader_mark(ld), path, "unknown backend %s (expected local or etcd)",
                           text_quote(text, q));
    }
    return DC_OK;
}

/* state.prefix: an etcd key prefix, "/" and then printable text without spaces. */
static dc_code
field_prefix(struct loader *ld, const struct field *f, const char *path, void *at)
{
    const char *text;
    dc_code rv;

    (void)f;
    if ((rv = loader_string(ld, path, false, &text)) != DC_OK) {
        return rv;
    }
    if (text[0] != '/' || strlen(text) > 200) {
        return loader_fail(ld, loader_mark(ld), path,
                           "must start with '/' and be at most 200 bytes");
    }
    for (const char *p = text; *p != '\0'; p++) {
        if (log_is_control((unsigned char)*p) || *p == ' ') {
            return loader_fail(ld, loader_mark(ld), path,
                               "may not hold control characters or spaces");
        }
    }
    if (text[strlen(text) - 1] == '/' && text[1] != '\0') {
        return loader_fail(ld, loader_mark(ld), path, "must not end with '/'");
    }
    return loader_strdup(ld, at, text);
}

/* "host:port" of the HTTP endpoint, or "" for none. */
static dc_code
field_http(struct loader *ld, const struct field *f, const char *path, void *at)
{
    const char *text, *colon;
    char q[CONFIG_QUOTE_SIZE];
    dc_code rv;

    (void)f;
    if ((rv = loader_string(ld, path, true, &text)) != DC_OK) {
        return rv;
    }
    if (text[0] != '\0') {
        colon = strrchr(text, ':');
        if (colon == NULL || !address_port_valid(colon + 1)) {
            return loader_fail(ld, loader_mark(ld), path,
                               "invalid address %s (expected HOST:PORT, or \"\" for none)",
                               text_quote(text, q));
        }
    }
    return loader_strdup(ld, at, text);
}

static dc_code
field_u32(struct loader *ld, const struct field *f, const char *path, void *at)
{
    yaml_mark_t mark = *loader_mark(ld);
    uint64_t v       = 0;
    dc_code rv;

    if ((rv = loader_uint(ld, path, &v)) != DC_OK ||
        (rv = loader_range(ld, f, path, v, &mark)) != DC_OK) {
        return rv;
    }
    *(uint32_t *)at = (uint32_t)v;
    return DC_OK;
}

/* A byte count, "4194304" or "80GiB"; quoted or not, since a unit makes it text anyway. */
static dc_code
field_size(struct loader *ld, const struct field *f, const char *path, void *at)
{
    yaml_mark_t mark = *loader_mark(ld);
    const char *text;
    char q[CONFIG_QUOTE_SIZE], found[CONFIG_FOUND_SIZE];
    uint64_t v;
    bool typed;
    dc_code rv;

    if ((rv = loader_scalar(ld, path, "a size", &text, &typed)) != DC_OK) {
        return rv;
    }
    if (scalar_is_null(text, typed)) {
        return loader_fail(ld, &mark, path, "expected a size, found %s", loader_found(ld, found));
    }
    if (!config_parse_size(text, &v)) {
        return loader_fail(ld, &mark, path,
                           "invalid size %s (expected a whole number of bytes below 2^64, "
                           "optionally with a unit B, KB, MB, GB, TB, KiB, MiB, GiB or TiB)",
                           text_quote(text, q));
    }
    if ((rv = loader_range(ld, f, path, v, &mark)) != DC_OK) {
        return rv;
    }
    *(uint64_t *)at = v;
    return DC_OK;
}

static dc_code
field_bool(struct loader *ld, const struct field *f, const char *path, void *at)
{
    static const char *const yes[] = {
        "true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON"
    };
    static const char *const no[] = { "false", "False", "FALSE", "no", "No",
                                      "NO",    "off",   "Off",   "OFF" };
    const char *text;
    char found[CONFIG_FOUND_SIZE];
    bool typed;
    dc_code rv;

    (void)f;
    if ((rv = loader_scalar(ld, path, "a boolean", &text, &typed)) != DC_OK) {
        return rv;
    }
    for (size_t i = 0; typed && i < sizeof(yes) / sizeof(yes[0]); i++) {
        if (strcmp(text, yes[i]) == 0 || strcmp(text, no[i]) == 0) {
            *(bool *)at = strcmp(text, yes[i]) == 0;
            return DC_OK;
        }
    }
    return loader_fail(ld, loader_mark(ld), path, "expected true or false, found %s",
                       loader_found(ld, found));
}

static dc_code
field_autodiff(struct loader *ld, const struct field *f, const char *path, void *at)
{
    const char *text;
    char q[CONFIG_QUOTE_SIZE];
    int policy;
    dc_code rv;

    (void)f;
    if ((rv = loader_string(ld, path, false, &text)) != DC_OK) {
        return rv;
    }
    if ((policy = autodiff_policy_from_name(text)) < 0) {
        return loader_fail(ld, loader_mark(ld), path,
                           "unknown autodiff policy %s (expected strip, unwrap-all or reject)",
                           text_quote(text, q));
    }
    *(enum autodiff_policy *)at = (enum autodiff_policy)policy;
    return DC_OK;
}

static dc_code
field_log_level(struct loader *ld, const struct field *f, const char *path, void *at)
{
    const char *text;
    char q[CONFIG_QUOTE_SIZE];
    int level;
    dc_code rv;

    (void)f;
    if ((rv = loader_string(ld, path, false, &text)) != DC_OK) {
        return rv;
    }
    if ((level = log_level_from_name(text)) < 0) {
        return loader_fail(ld, loader_mark(ld), path,
                           "unknown log level %s (expected debug, info, warn or error)",
                           text_quote(text, q));
    }
    *(enum log_level *)at = (enum log_level)level;
    return DC_OK;
}

static dc_code
field_log_format(struct loader *ld, const struct field *f, const char *path, void *at)
{
    const char *text;
    char q[CONFIG_QUOTE_SIZE];
    int format;
    dc_code rv;

    (void)f;
    if ((rv = loader_string(ld, path, false, &text)) != DC_OK) {
        return rv;
    }
    if ((format = log_format_from_name(text)) < 0) {
        return loader_fail(ld, loader_mark(ld), path,
                           "unknown log format %s (expected text or json)", text_quote(text, q));
    }
    *(enum log_format *)at = (enum log_format)format;
    return DC_OK;
}

static dc_code
field_worker_name(struct loader *ld, const struct field *f, const char *path, void *at)
{
    const char *text;
    char q[CONFIG_QUOTE_SIZE];
    dc_code rv;

    (void)f;
    if ((rv = loader_string(ld, path, false, &text)) != DC_OK) {
        return rv;
    }
    if (!device_worker_name_valid(text, strlen(text))) {
        return loader_fail(ld, loader_mark(ld), path,
                           "invalid worker name %s (1 to %d letters, digits, '.', '_' or '-', "
                           "starting with a letter or digit)",
                           text_quote(text, q), DC_WORKER_NAME_MAX);
    }
    return loader_strdup(ld, at, text);
}

static dc_code
field_executor(struct loader *ld, const struct field *f, const char *path, void *at)
{
    const char *text;
    char q[CONFIG_QUOTE_SIZE];
    dc_code rv;

    (void)f;
    if ((rv = loader_string(ld, path, false, &text)) != DC_OK) {
        return rv;
    }
    /* The kinds server/worker/executor.c builds; `staged` exists for the tests. */
    if (strcmp(text, "host") != 0 && strcmp(text, "staged") != 0) {
        return loader_fail(ld, loader_mark(ld), path,
                           "unknown executor %s ('host', or 'staged' for tests)",
                           text_quote(text, q));
    }
    return loader_strdup(ld, at, text);
}

/* A worker's own device: concrete, no worker prefix, no autodiff wrapper. */
static dc_code
field_device(struct loader *ld, const struct field *f, const char *path, void *at)
{
    const char *text;
    char q[CONFIG_QUOTE_SIZE], canon[DC_DEVICE_TEXT_SIZE];
    dc_device_ref ref;
    dc_status pst;
    dc_code rv;

    (void)f;
    if ((rv = loader_string(ld, path, false, &text)) != DC_OK) {
        return rv;
    }
    if (dc_device_ref_parse(text, strlen(text), &ref, &pst) != DC_OK) {
        return loader_fail(ld, loader_mark(ld), path, "invalid device %s: %s", text_quote(text, q),
                           pst.message);
    }
    if (ref.worker[0] != '\0') {
        dc_device_format(&ref.device, canon, sizeof(canon));
        return loader_fail(ld, loader_mark(ld), path,
                           "a worker's own device takes no worker prefix, found %s (write '%s')",
                           text_quote(text, q), canon);
    }
    if (ref.autodiff_depth > 0) {
        dc_device_format(&ref.device, canon, sizeof(canon));
        return loader_fail(ld, loader_mark(ld), path,
                           "autodiff(...) wraps a device in a request, it is not a device, "
                           "found %s (write '%s')",
                           text_quote(text, q), canon);
    }
    *(dc_device *)at = ref.device;
    return DC_OK;
}

enum { DEV_DEVICE, DEV_MEMORY, DEV_HEALTHY };

static const struct field device_fields[] = {
    [DEV_DEVICE]  = { .name   = "device",
                      .parse  = field_device,
                      .offset = offsetof(struct config_device, device) },
    [DEV_MEMORY]  = { .name   = "memory",
                      .parse  = field_size,
                      .offset = offsetof(struct config_device, memory_bytes),
                      .max    = UINT64_MAX },
    [DEV_HEALTHY] = { .name   = "healthy",
                      .parse  = field_bool,
                      .offset = offsetof(struct config_device, healthy) },
    { .name = NULL },
};

static bool
device_equal(const dc_device *a, const dc_device *b)
{
    return a->backend == b->backend && a->kind == b->kind && a->index == b->index;
}

/* devices: a non-empty sequence of {device, memory, healthy}; replaces the default list. */
static dc_code
field_devices(struct loader *ld, const struct field *f, const char *path, void *at)
{
    struct config_worker *w    = at;
    struct config_device *devs = NULL;
    size_t *lines              = NULL;
    size_t n                   = 0;
    yaml_mark_t seq_mark       = *loader_mark(ld);
    char item[CONFIG_PATH_SIZE], key[CONFIG_PATH_SIZE], canon[DC_DEVICE_TEXT_SIZE];
    struct seen seen;
    dc_code rv;

    (void)f;
    if ((rv = loader_expect(ld, path, YAML_SEQUENCE_START_EVENT,
                            "a sequence of {device, memory, healthy}")) != DC_OK) {
        goto out;
    }
    for (;;) {
        yaml_mark_t item_mark;
        struct config_device dev = { .memory_bytes = 0, .healthy = true };

        if ((rv = loader_next(ld)) != DC_OK) {
            goto out;
        }
        if (ld->ev.type == YAML_SEQUENCE_END_EVENT) {
            break;
        }
        path_index(item, path, n);
        item_mark = *loader_mark(ld);
        if (n == CONFIG_DEVICES_MAX) {
            rv = loader_fail(ld, &item_mark, item, "more than %d devices", CONFIG_DEVICES_MAX);
            goto out;
        }
        if ((rv = loader_expect(ld, item, YAML_MAPPING_START_EVENT,
                                "a mapping {device, memory, healthy}")) != DC_OK ||
            (rv = loader_mapping(ld, item, device_fields, &dev, &seen)) != DC_OK) {
            goto out;
        }
        if (!(seen.mask & (1U << DEV_DEVICE))) {
            rv = loader_fail(ld, &item_mark, item, "missing key 'device'");
            goto out;
        }
        for (size_t i = 0; i < n; i++) {
            if (device_equal(&devs[i].device, &dev.device)) {
                path_join(key, item, "device");
                dc_device_format(&dev.device, canon, sizeof(canon));
                rv = loader_fail(ld, &seen.value[DEV_DEVICE], key,
                                 "device %s listed twice (first at line %zu)", canon, lines[i]);
                goto out;
            }
        }
        if ((n & (n - 1)) == 0) { /* grow at 0, 1, 2, 4, ...; n is bounded above */
            size_t cap                  = n == 0 ? 1 : n * 2;
            struct config_device *ndevs = realloc(devs, cap * sizeof(*devs));
            size_t *nlines;

            if (ndevs == NULL) {
                rv = loader_oom(ld);
                goto out;
            }
            devs = ndevs;
            if ((nlines = realloc(lines, cap * sizeof(*lines))) == NULL) {
                rv = loader_oom(ld);
                goto out;
            }
            lines = nlines;
        }
        devs[n]  = dev;
        lines[n] = seen.value[DEV_DEVICE].line + 1;
        n++;
    }
    if (n == 0) {
        rv = loader_fail(ld, &seq_mark, path, "a worker needs at least one device");
        goto out;
    }
    free(w->devices);
    w->devices   = devs;
    w->n_devices = n;
    devs         = NULL;
out:
    free(devs);
    free(lines);
    return rv;
}

static void
labels_free(struct config_label *labels, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(labels[i].key);
        free(labels[i].value);
    }
    free(labels);
}

/* labels: {key: value, ...} of strings; replaces the (empty) default. */
static dc_code
field_labels(struct loader *ld, const struct field *f, const char *path, void *at)
{
    struct config_worker *w     = at;
    struct config_label *labels = NULL;
    size_t n                    = 0;
    char child[CONFIG_PATH_SIZE];
    const char *text;
    dc_code rv;

    (void)f;
    if ((rv = loader_expect(ld, path, YAML_MAPPING_START_EVENT, "a mapping of strings")) != DC_OK) {
        goto out;
    }
    for (;;) {
        if ((rv = loader_next(ld)) != DC_OK) {
            goto out;
        }
        if (ld->ev.type == YAML_MAPPING_END_EVENT) {
            break;
        }
        if ((rv = loader_key(ld, path, &text)) != DC_OK) {
            goto out;
        }
        path_join(child, path, text);
        /* Labels travel to the coordinator, which refuses control characters in them (they
         * would reach its log lines and listings): say so here, with the place. */
        if (log_has_control(text)) {
            rv = loader_fail(ld, loader_mark(ld), child, "control character in a label key");
            goto out;
        }
        if (n == CONFIG_LABELS_MAX) {
            rv = loader_fail(ld, loader_mark(ld), child, "more than %d labels", CONFIG_LABELS_MAX);
            goto out;
        }
        for (size_t i = 0; i < n; i++) {
            if (strcmp(labels[i].key, text) == 0) {
                rv = loader_fail(ld, loader_mark(ld), child, "duplicate key");
                goto out;
            }
        }
        if ((n & (n - 1)) == 0) {
            size_t cap                = n == 0 ? 1 : n * 2;
            struct config_label *grow = realloc(labels, cap * sizeof(*labels));

            if (grow == NULL) {
                rv = loader_oom(ld);
                goto out;
            }
            labels = grow;
        }
        labels[n].key   = strdup(text);
        labels[n].value = NULL;
        n++;
        if (labels[n - 1].key == NULL) {
            rv = loader_oom(ld);
            goto out;
        }
        if ((rv = loader_next(ld)) != DC_OK ||
            (rv = loader_string(ld, child, true, &text)) != DC_OK) {
            goto out;
        }
        if (log_has_control(text)) {
            rv = loader_fail(ld, loader_mark(ld), child, "control character in a label value");
            goto out;
        }
        if ((rv = loader_strdup(ld, &labels[n - 1].value, text)) != DC_OK) {
            goto out;
        }
    }
    labels_free(w->labels, w->n_labels);
    w->labels   = labels;
    w->n_labels = n;
    labels      = NULL;
    n           = 0;
out:
    labels_free(labels, n);
    return rv;
}

/* collectives: [backend, ...]; the backends named, and no other, run collectives. */
static dc_code
field_collectives(struct loader *ld, const struct field *f, const char *path, void *at)
{
    bool *out                     = at;
    bool listed[DC_BACKEND_COUNT] = { false };
    char item[CONFIG_PATH_SIZE], q[CONFIG_QUOTE_SIZE];
    const char *text;
    dc_backend b;
    dc_code rv;

    (void)f;
    if ((rv = loader_expect(ld, path, YAML_SEQUENCE_START_EVENT, "a sequence of backends")) !=
        DC_OK) {
        return rv;
    }
    for (size_t i = 0;; i++) {
        if ((rv = loader_next(ld)) != DC_OK) {
            return rv;
        }
        if (ld->ev.type == YAML_SEQUENCE_END_EVENT) {
            break;
        }
        path_index(item, path, i);
        if ((rv = loader_string(ld, item, false, &text)) != DC_OK) {
            return rv;
        }
        if ((b = dc_backend_from_name(text)) == DC_BACKEND_NONE) {
            return loader_fail(ld, loader_mark(ld), item,
                               "unknown backend %s (expected cpu, cuda, rocm, metal, vulkan, "
                               "wgpu, webgpu, flex, ndarray, libtorch or remote)",
                               text_quote(text, q));
        }
        if (listed[b]) {
            return loader_fail(ld, loader_mark(ld), item, "backend %s listed twice", text);
        }
        listed[b] = true;
    }
    memcpy(out, listed, sizeof(listed));
    return DC_OK;
}

enum { TLS_CERT, TLS_KEY, TLS_CA, TLS_REQUIRE_CLIENT_CERT };

/* Keys a (field index ia) and b (ib) of the mapping `section` at path go together: one
 * given without the other fails at the one given, naming the other. */
static dc_code
check_pair(struct loader *ld, const char *path, const struct seen *seen, const char *section,
           const char *a, int ia, bool has_a, const char *b, int ib, bool has_b)
{
    char key[CONFIG_PATH_SIZE];

    if (has_a == has_b) {
        return DC_OK;
    }
    path_join(key, path, has_a ? a : b);
    return loader_fail(ld, &seen->value[has_a ? ia : ib], key, "needs %s.%s as well", section,
                       has_a ? b : a);
}

static dc_code
tls_check(struct loader *ld, const char *path, void *at, const struct seen *seen)
{
    const struct config_tls *tls = at;
    char key[CONFIG_PATH_SIZE];
    dc_code rv;

    if ((rv = check_pair(ld, path, seen, "tls", "cert", TLS_CERT, tls->cert != NULL, "key", TLS_KEY,
                         tls->key != NULL)) != DC_OK) {
        return rv;
    }
    if (tls->require_client_cert && tls->ca == NULL) {
        path_join(key, path, "require_client_cert");
        return loader_fail(ld, &seen->value[TLS_REQUIRE_CLIENT_CERT], key,
                           "needs tls.ca to check client certificates against");
    }
    return DC_OK;
}

static const struct field tls_fields[] = {
    [TLS_CERT] = { .name   = "cert",
                   .parse  = field_string,
                   .offset = offsetof(struct config_tls, cert) },
    [TLS_KEY]  = { .name   = "key",
                   .parse  = field_string,
                   .offset = offsetof(struct config_tls, key) },
    [TLS_CA]   = { .name = "ca", .parse = field_string, .offset = offsetof(struct config_tls, ca) },
    [TLS_REQUIRE_CLIENT_CERT] = { .name   = "require_client_cert",
                                  .parse  = field_bool,
                                  .offset = offsetof(struct config_tls, require_client_cert) },
    { .name = NULL },
};

static const struct field log_fields[] = {
    { .name = "level", .parse = field_log_level, .offset = offsetof(struct config_log, level) },
    { .name = "format", .parse = field_log_format, .offset = offsetof(struct config_log, format) },
    { .name = NULL },
};

enum { HB_INTERVAL, HB_DEAD_AFTER, HB_FORGET_AFTER };

static dc_code
heartbeat_check(struct loader *ld, const char *path, void *at, const struct seen *seen)
{
    const struct config_coordinator *c = at;
    char key[CONFIG_PATH_SIZE];

    if (c->dead_after_ms > c->heartbeat_interval_ms) {
        return DC_OK;
    }
    if (seen->mask & (1U << HB_DEAD_AFTER)) {
        path_join(key, path, "dead_after_ms");
        return loader_fail(ld, &seen->value[HB_DEAD_AFTER], key,
                           "must be greater than heartbeat.interval_ms (%" PRIu32
                           "), found %" PRIu32,
                           c->heartbeat_interval_ms, c->dead_after_ms);
    }
    path_join(key, path, "interval_ms");
    return loader_fail(ld, &seen->value[HB_INTERVAL], key,
                       "must be less than heartbeat.dead_after_ms (%" PRIu32 "), found %" PRIu32,
                       c->dead_after_ms, c->heartbeat_interval_ms);
}

static const struct field heartbeat_fields[] = {
    [HB_INTERVAL]     = { .name   = "interval_ms",
                          .parse  = field_u32,
                          .min    = 1,
                          .max    = UINT32_MAX,
                          .offset = offsetof(struct config_coordinator, heartbeat_interval_ms) },
    [HB_DEAD_AFTER]   = { .name   = "dead_after_ms",
                          .parse  = field_u32,
                          .min    = 1,
                          .max    = UINT32_MAX,
                          .offset = offsetof(struct config_coordinator, dead_after_ms) },
    [HB_FORGET_AFTER] = { .name   = "forget_after_ms",
                          .parse  = field_u32,
                          .min    = 1,
                          .max    = UINT32_MAX,
                          .offset = offsetof(struct config_coordinator, forget_after_ms) },
    { .name = NULL },
};

static const struct field coordinator_limits_fields[] = {
    { .name   = "max_message_bytes",
      .parse  = field_size,
      .min    = MIN_MAX_MESSAGE_BYTES,
      .max    = MAX_MAX_MESSAGE_BYTES,
      .offset = offsetof(struct config_coordinator, max_message_bytes) },
    { .name   = "max_group_devices",
      .parse  = field_u32,
      .min    = 1,
      .max    = UINT32_MAX,
      .offset = offsetof(struct config_coordinator, max_group_devices) },
    { .name   = "op_timeout_ms",
      .parse  = field_u32,
      .min    = 1,
      .max    = UINT32_MAX,
      .offset = offsetof(struct config_coordinator, op_timeout_ms) },
    { .name   = "op_history",
      .parse  = field_u32,
      .min    = 0,
      .max    = UINT32_MAX,
      .offset = offsetof(struct config_coordinator, op_history) },
    { .name   = "max_workers",
      .parse  = field_u32,
      .min    = 1,
      .max    = UINT32_MAX,
      .offset = offsetof(struct config_coordinator, max_workers) },
    { .name   = "max_devices_per_worker",
      .parse  = field_u32,
      .min    = 1,
      .max    = MAX_MAX_DEVICES_PER_WORKER,
      .offset = offsetof(struct config_coordinator, max_devices_per_worker) },
    { .name   = "max_devices",
      .parse  = field_u32,
      .min    = 1,
      .max    = UINT32_MAX,
      .offset = offsetof(struct config_coordinator, max_devices) },
    { .name   = "max_inflight_bytes",
      .parse  = field_size,
      .min    = 1,
      .max    = MAX_INFLIGHT_BYTES,
      .offset = offsetof(struct config_coordinator, max_inflight_bytes) },
    { .name   = "max_inflight_bytes_per_connection",
      .parse  = field_size,
      .min    = 1,
      .max    = MAX_INFLIGHT_BYTES,
      .offset = offsetof(struct config_coordinator, max_inflight_bytes_per_connection) },
    { .name   = "handshake_timeout_ms",
      .parse  = field_u32,
      .min    = 100,
      .max    = 3600000,
      .offset = offsetof(struct config_coordinator, handshake_timeout_ms) },
    { .name   = "max_connections",
      .parse  = field_u32,
      .min    = 0,
      .max    = MAX_MAX_CONNECTIONS,
      .offset = offsetof(struct config_coordinator, max_connections) },
    { .name = NULL },
};

static const struct field auth_fields[] = {
    { .name   = "tokens_file",
      .parse  = field_string,
      .offset = offsetof(struct config_coordinator, tokens_file) },
    { .name = NULL },
};

/* In state_fields' order (prefix, lease_ttl_ms and ca come unindexed between). */
enum {
    STATE_BACKEND_FIELD,
    STATE_ENDPOINTS,
    STATE_PREFIX,
    STATE_LEASE_TTL_MS,
    STATE_CA,
    STATE_CERT,
    STATE_KEY,
    STATE_USERNAME,
    STATE_PASSWORD_FILE
};

static dc_code
state_fields_check(struct loader *ld, const char *path, void *at, const struct seen *seen)
{
    const struct config_state *s = at;
    char key[CONFIG_PATH_SIZE];
    dc_code rv;

    if (s->backend == STATE_BACKEND_ETCD && s->endpoints == NULL) {
        path_join(key, path, "backend");
        return loader_fail(ld, &seen->value[STATE_BACKEND_FIELD], key,
                           "etcd needs state.endpoints as well");
    }
    if (s->backend != STATE_BACKEND_ETCD && s->endpoints != NULL) {
        path_join(key, path, "endpoints");
        return loader_fail(ld, &seen->value[STATE_ENDPOINTS], key, "only for state.backend etcd");
    }
    if ((rv = check_pair(ld, path, seen, "state", "cert", STATE_CERT, s->cert != NULL, "key",
                         STATE_KEY, s->key != NULL)) != DC_OK) {
        return rv;
    }
    return check_pair(ld, path, seen, "state", "username", STATE_USERNAME, s->username != NULL,
                      "password_file", STATE_PASSWORD_FILE, s->password_file != NULL);
}

static const struct field state_fields[] = {
    [STATE_BACKEND_FIELD] = { .name   = "backend",
                              .parse  = field_state_backend,
                              .offset = offsetof(struct config_state, backend) },
    [STATE_ENDPOINTS]     = { .name   = "endpoints",
                              .parse  = field_endpoints,
                              .offset = offsetof(struct config_state, endpoints) },
    { .name = "prefix", .parse = field_prefix, .offset = offsetof(struct config_state, prefix) },
    { .name   = "lease_ttl_ms",
      .parse  = field_u32,
      .min    = 2000,
      .max    = 60000,
      .offset = offsetof(struct config_state, lease_ttl_ms) },
    { .name = "ca", .parse = field_string, .offset = offsetof(struct config_state, ca) },
    [STATE_CERT]          = { .name   = "cert",
                              .parse  = field_string,
                              .offset = offsetof(struct config_state, cert) },
    [STATE_KEY]           = { .name   = "key",
                              .parse  = field_string,
                              .offset = offsetof(struct config_state, key) },
    [STATE_USERNAME]      = { .name   = "username",
                              .parse  = field_string,
                              .offset = offsetof(struct config_state, username) },
    [STATE_PASSWORD_FILE] = { .name   = "password_file",
                              .parse  = field_string,
                              .offset = offsetof(struct config_state, password_file) },
    { .name = NULL },
};

/* Nested mappings of flat struct members (heartbeat, limits, auth) keep the parent's base. */
static const struct field call_link_fields[] = {
    { .name   = "enabled",
      .parse  = field_bool,
      .offset = offsetof(struct config_coordinator, call_link) },
    { .name   = "port",
      .parse  = field_u32,
      .min    = 0,
      .max    = 65535,
      .offset = offsetof(struct config_coordinator, call_link_port) },
    { .name = NULL },
};

static const struct field coordinator_fields[] = {
    { .name   = "listen",
      .parse  = field_address,
      .offset = offsetof(struct config_coordinator, listen) },
    { .name = "http", .parse = field_http, .offset = offsetof(struct config_coordinator, http) },
    { .name   = "autodiff",
      .parse  = field_autodiff,
      .offset = offsetof(struct config_coordinator, autodiff) },
    { .name = "heartbeat", .parse = field_map, .sub = heartbeat_fields, .check = heartbeat_check },
    { .name = "limits", .parse = field_map, .sub = coordinator_limits_fields },
    { .name = "auth", .parse = field_map, .sub = auth_fields },
    { .name   = "tls",
      .parse  = field_map,
      .sub    = tls_fields,
      .check  = tls_check,
      .offset = offsetof(struct config_coordinator, tls) },
    { .name   = "log",
      .parse  = field_map,
      .sub    = log_fields,
      .offset = offsetof(struct config_coordinator, log) },
    { .name   = "state_dir",
      .parse  = field_string,
      .offset = offsetof(struct config_coordinator, state_dir) },
    { .name   = "state",
      .parse  = field_map,
      .sub    = state_fields,
      .check  = state_fields_check,
      .offset = offsetof(struct config_coordinator, state) },
    { .name   = "advertise",
      .parse  = field_address,
      .offset = offsetof(struct config_coordinator, advertise) },
    { .name = "call_link", .parse = field_map, .sub = call_link_fields },
    { .name = NULL },
};

static const struct field worker_limits_fields[] = {
    { .name   = "max_message_bytes",
      .parse  = field_size,
      .min    = MIN_MAX_MESSAGE_BYTES,
      .max    = MAX_MAX_MESSAGE_BYTES,
      .offset = offsetof(struct config_worker, max_message_bytes) },
    { .name   = "max_tensor_bytes",
      .parse  = field_size,
      .min    = 1,
      .max    = MAX_MAX_TENSOR_BYTES,
      .offset = offsetof(struct config_worker, max_tensor_bytes) },
    { .name   = "max_stored_bytes",
      .parse  = field_size,
      .min    = 0,
      .max    = 1ull << 50,
      .offset = offsetof(struct config_worker, max_stored_bytes) },
    { .name   = "max_inflight_bytes",
      .parse  = field_size,
      .min    = 1,
      .max    = MAX_INFLIGHT_BYTES,
      .offset = offsetof(struct config_worker, max_inflight_bytes) },
    { .name   = "max_inflight_bytes_per_connection",
      .parse  = field_size,
      .min    = 1,
      .max    = MAX_INFLIGHT_BYTES,
      .offset = offsetof(struct config_worker, max_inflight_bytes_per_connection) },
    { .name   = "handshake_timeout_ms",
      .parse  = field_u32,
      .min    = 100,
      .max    = 3600000,
      .offset = offsetof(struct config_worker, handshake_timeout_ms) },
    { .name   = "max_connections",
      .parse  = field_u32,
      .min    = 0,
      .max    = MAX_MAX_CONNECTIONS,
      .offset = offsetof(struct config_worker, max_connections) },
    { .name = NULL },
};

static const struct field worker_groups_fields[] = {
    { .name   = "stall_warn_ms",
      .parse  = field_u32,
      .min    = 1,
      .max    = UINT32_MAX,
      .offset = offsetof(struct config_worker, group_stall_warn_ms) },
    { .name   = "shm_max_bytes",
      .parse  = field_size,
      .min    = 0,
      .max    = 1ull << 40,
      .offset = offsetof(struct config_worker, group_shm_max_bytes) },
    { .name   = "buffer_cache_bytes",
      .parse  = field_size,
      .min    = 0,
      .max    = 1ull << 40,
      .offset = offsetof(struct config_worker, group_buffer_cache_bytes) },
    { .name   = "data_port",
      .parse  = field_u32,
      .min    = 0,
      .max    = 65535,
      .offset = offsetof(struct config_worker, group_data_port) },
    { .name = NULL },
};

static const struct field worker_auth_fields[] = {
    { .name   = "tokens_file",
      .parse  = field_string,
      .offset = offsetof(struct config_worker, tokens_file) },
    { .name = NULL },
};

static const struct field worker_fields[] = {
    { .name = "name", .parse = field_worker_name, .offset = offsetof(struct config_worker, name) },
    { .name   = "coordinator",
      .parse  = field_address_list,
      .offset = offsetof(struct config_worker, coordinator) },
    { .name = "listen", .parse = field_address, .offset = offsetof(struct config_worker, listen) },
    { .name   = "advertise",
      .parse  = field_address,
      .offset = offsetof(struct config_worker, advertise) },
    { .name = "http", .parse = field_http, .offset = offsetof(struct config_worker, http) },
    { .name   = "token_file",
      .parse  = field_string,
      .offset = offsetof(struct config_worker, token_file) },
    { .name   = "executor",
      .parse  = field_executor,
      .offset = offsetof(struct config_worker, executor) },
    { .name = "labels", .parse = field_labels },
    { .name = "devices", .parse = field_devices },
    { .name   = "collectives",
      .parse  = field_collectives,
      .offset = offsetof(struct config_worker, collectives) },
    { .name = "limits", .parse = field_map, .sub = worker_limits_fields },
    { .name = "groups", .parse = field_map, .sub = worker_groups_fields },
    { .name = "auth", .parse = field_map, .sub = worker_auth_fields },
    { .name   = "tls",
      .parse  = field_map,
      .sub    = tls_fields,
      .check  = tls_check,
      .offset = offsetof(struct config_worker, tls) },
    { .name   = "log",
      .parse  = field_map,
      .sub    = log_fields,
      .offset = offsetof(struct config_worker, log) },
    { .name = NULL },
};

/* Reads one document (or none: all defaults) whose top level is a mapping of `fields`. */
static dc_code
loader_document(struct loader *ld, const struct field *fields, void *base)
{
    char found[CONFIG_FOUND_SIZE];
    struct seen seen;
    dc_code rv;

    /* The stream's start, then a document's start or, for a file of comments, its end. */
    if ((rv = loader_next(ld)) != DC_OK) {
        return rv;
    }
    if ((rv = loader_next(ld)) != DC_OK) {
        return rv;
    }
    if (ld->ev.type == YAML_STREAM_END_EVENT) {
        return DC_OK;
    }
    if ((rv = loader_next(ld)) != DC_OK) {
        return rv;
    }
    if (ld->ev.type == YAML_MAPPING_START_EVENT) {
        if ((rv = loader_mapping(ld, "", fields, base, &seen)) != DC_OK) {
            return rv;
        }
    } else if (ld->ev.type != YAML_SCALAR_EVENT || ld->ev.data.scalar.tag != NULL ||
               !scalar_is_null((const char *)ld->ev.data.scalar.value,
                               ld->ev.data.scalar.style == YAML_PLAIN_SCALAR_STYLE)) {
        return loader_fail(ld, loader_mark(ld), "", "expected a mapping of keys, found %s",
                           loader_found(ld, found));
    }
    /* The document's end, then the stream's. */
    if ((rv = loader_next(ld)) != DC_OK) {
        return rv;
    }
    if ((rv = loader_next(ld)) != DC_OK) {
        return rv;
    }
    if (ld->ev.type != YAML_STREAM_END_EVENT) {
        return loader_fail(ld, loader_mark(ld), "", "expected one document, found a second");
    }
    return DC_OK;
}

static dc_code
config_parse(const char *name, const char *data, size_t len, const struct field *fields, void *base,
             dc_status *st)
{
    struct loader ld = { .name = name, .data = data != NULL ? data : "", .len = len, .st = st };
    dc_code rv;

    if (len > CONFIG_FILE_MAX) {
        return status_set(st, DC_INVALID_ARGUMENT, "%s: larger than %zu bytes", name,
                          CONFIG_FILE_MAX);
    }
    if (!yaml_parser_initialize(&ld.parser)) {
        return loader_oom(&ld);
    }
    yaml_parser_set_input_string(&ld.parser, (const unsigned char *)ld.data, len);
    rv = loader_document(&ld, fields, base);
    if (ld.have_ev) {
        yaml_event_delete(&ld.ev);
    }
    yaml_parser_delete(&ld.parser);
    return rv;
}

/* Reads a whole file of at most CONFIG_FILE_MAX bytes; the caller frees *data. */
static dc_code
config_read(const char *path, char **data, size_t *len, dc_status *st)
{
    FILE *f   = fopen(path, "rb");
    char *buf = NULL;
    size_t n;
    dc_code rv = DC_OK;

    if (f == NULL) {
        return status_set(st, DC_NOT_FOUND, "%s: cannot open: %s", path, strerror(errno));
    }
    if ((buf = malloc(CONFIG_FILE_MAX + 1)) == NULL) {
        rv = status_set(st, DC_RESOURCE_EXHAUSTED, "%s: out of memory", path);
        goto out;
    }
    n = fread(buf, 1, CONFIG_FILE_MAX + 1, f);
    if (ferror(f)) {
        rv = status_set(st, DC_NOT_FOUND, "%s: cannot read: %s", path, strerror(errno));
        goto out;
    }
    if (n > CONFIG_FILE_MAX) {
        rv =
            status_set(st, DC_INVALID_ARGUMENT, "%s: larger than %zu bytes", path, CONFIG_FILE_MAX);
        goto out;
    }
    *data = buf;
    *len  = n;
    buf   = NULL;
out:
    free(buf);
    fclose(f);
    return rv;
}

static dc_code
config_oom(dc_status *st)
{
    return status_set(st, DC_RESOURCE_EXHAUSTED, "configuration: out of memory");
}

dc_code
config_coordinator_defaults(struct config_coordinator *cfg, dc_status *st)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->autodiff               = AUTODIFF_STRIP;
    cfg->heartbeat_interval_ms  = 1000;
    cfg->dead_after_ms          = 5000;
    cfg->forget_after_ms        = DEFAULT_FORGET_AFTER_MS;
    cfg->max_message_bytes      = DEFAULT_MAX_MESSAGE_BYTES;
    cfg->max_group_devices      = 4096;
    cfg->op_timeout_ms          = 30000;
    cfg->op_history             = 1024;
    cfg->max_workers            = DEFAULT_MAX_WORKERS;
    cfg->max_devices_per_worker = DEFAULT_MAX_DEVICES_PER_WORKER;
    cfg->max_devices            = DEFAULT_MAX_DEVICES;
    cfg->log.level              = LOG_INFO;
    cfg->log.format             = LOG_FORMAT_TEXT;

    cfg->max_inflight_bytes                = RPC_DEFAULT_MAX_INFLIGHT;
    cfg->max_inflight_bytes_per_connection = RPC_DEFAULT_MAX_INFLIGHT_PER_CONNECTION;
    cfg->handshake_timeout_ms              = RPC_DEFAULT_HANDSHAKE_TIMEOUT_MS;
    cfg->state.lease_ttl_ms                = 3000;
    cfg->call_link                         = true;
    if ((cfg->listen = strdup(DEFAULT_COORDINATOR_LISTEN)) == NULL ||
        (cfg->http = strdup(DEFAULT_COORDINATOR_HTTP)) == NULL ||
        (cfg->state.prefix = strdup("/devcoord/default")) == NULL) {
        config_coordinator_free(cfg);
        return config_oom(st);
    }
    status_clear(st);
    return DC_OK;
}

/* The host name made a valid worker name: other characters become '-', at most 63 kept. */
static char *
worker_default_name(void)
{
    char host[256];
    size_t n;

    if (gethostname(host, sizeof(host)) != 0) {
        return strdup("worker");
    }
    host[sizeof(host) - 1] = '\0';
    n                      = strlen(host);
    if (n > DC_WORKER_NAME_MAX) {
        n       = DC_WORKER_NAME_MAX;
        host[n] = '\0';
    }
    for (size_t i = 0; i < n; i++) {
        if (!is_alnum(host[i]) && host[i] != '.' && host[i] != '_' && host[i] != '-') {
            host[i] = '-';
        }
    }
    return strdup(device_worker_name_valid(host, n) ? host : "worker");
}

dc_code
config_worker_defaults(struct config_worker *cfg, dc_status *st)
{
    memset(cfg, 0, sizeof(*cfg));
    for (int b = DC_BACKEND_CPU; b < DC_BACKEND_COUNT; b++) {
        cfg->collectives[b] = true;
    }
    cfg->max_tensor_bytes         = DEFAULT_MAX_TENSOR_BYTES;
    cfg->group_stall_warn_ms      = 5000;
    cfg->group_shm_max_bytes      = 1ull << 30;
    cfg->group_buffer_cache_bytes = 256ull << 20;
    cfg->max_message_bytes        = DEFAULT_MAX_MESSAGE_BYTES;
    cfg->log.level                = LOG_INFO;
    cfg->log.format               = LOG_FORMAT_TEXT;

    cfg->max_inflight_bytes                = RPC_WORKER_DEFAULT_MAX_INFLIGHT;
    cfg->max_inflight_bytes_per_connection = RPC_WORKER_DEFAULT_MAX_INFLIGHT_PER_CONNECTION;
    cfg->handshake_timeout_ms              = RPC_DEFAULT_HANDSHAKE_TIMEOUT_MS;
    if ((cfg->name = worker_default_name()) == NULL ||
        (cfg->coordinator = strdup(DEFAULT_COORDINATOR_LISTEN)) == NULL ||
        (cfg->listen = strdup(DEFAULT_WORKER_LISTEN)) == NULL ||
        (cfg->advertise = strdup(DEFAULT_WORKER_LISTEN)) == NULL ||
        (cfg->http = strdup("")) == NULL || (cfg->executor = strdup("host")) == NULL ||
        (cfg->devices = calloc(1, sizeof(*cfg->devices))) == NULL) {
        config_worker_free(cfg);
        return config_oom(st);
    }
    cfg->n_devices                 = 1;
    cfg->devices[0].device.backend = DC_BACKEND_CPU;
    cfg->devices[0].device.kind    = device_default_kind(DC_BACKEND_CPU);
    cfg->devices[0].device.index   = 0;
    cfg->devices[0].memory_bytes   = 0;
    cfg->devices[0].healthy        = true;
    status_clear(st);
    return DC_OK;
}

dc_code
config_coordinator_parse(const char *name, const char *data, size_t len,
                         struct config_coordinator *cfg, dc_status *st)
{
    dc_code rv;

    config_coordinator_free(cfg);
    if ((rv = config_coordinator_defaults(cfg, st)) != DC_OK) {
        return rv;
    }
    if ((rv = config_parse(name, data, len, coordinator_fields, cfg, st)) != DC_OK) {
        config_coordinator_free(cfg);
        config_coordinator_defaults(cfg, NULL);
    }
    return rv;
}

dc_code
config_worker_parse(const char *name, const char *data, size_t len, struct config_worker *cfg,
                    dc_status *st)
{
    dc_code rv;

    config_worker_free(cfg);
    if ((rv = config_worker_defaults(cfg, st)) != DC_OK) {
        return rv;
    }
    /* advertise follows listen unless the file names it. */
    free(cfg->advertise);
    cfg->advertise = NULL;
    if ((rv = config_parse(name, data, len, worker_fields, cfg, st)) == DC_OK &&
        cfg->advertise == NULL && (cfg->advertise = strdup(cfg->listen)) == NULL) {
        rv = config_oom(st);
    }
    if (rv != DC_OK) {
        config_worker_free(cfg);
        config_worker_defaults(cfg, NULL);
    }
    return rv;
}

dc_code
config_coordinator_load(const char *path, struct config_coordinator *cfg, dc_status *st)
{
    char *data = NULL;
    size_t len = 0;
    dc_code rv;

    if ((rv = config_read(path, &data, &len, st)) != DC_OK) {
        config_coordinator_free(cfg);
        config_coordinator_defaults(cfg, NULL);
        return rv;
    }
    rv = config_coordinator_parse(path, data, len, cfg, st);
    free(data);
    return rv;
}

dc_code
config_worker_load(const char *path, struct config_worker *cfg, dc_status *st)
{
    char *data = NULL;
    size_t len = 0;
    dc_code rv;

    if ((rv = config_read(path, &data, &len, st)) != DC_OK) {
        config_worker_free(cfg);
        config_worker_defaults(cfg, NULL);
        return rv;
    }
    rv = config_worker_parse(path, data, len, cfg, st);
    free(data);
    return rv;
}

static void
tls_free(struct config_tls *tls)
{
    free(tls->cert);
    free(tls->key);
    free(tls->ca);
}

void
config_coordinator_free(struct config_coordinator *cfg)
{
    if (cfg == NULL) {
        return;
    }
    free(cfg->listen);
    free(cfg->http);
    free(cfg->tokens_file);
    free(cfg->state_dir);
    free(cfg->advertise);
    free(cfg->state.endpoints);
    free(cfg->state.prefix);
    free(cfg->state.ca);
    free(cfg->state.cert);
    free(cfg->state.key);
    free(cfg->state.username);
    free(cfg->state.password_file);
    tls_free(&cfg->tls);
    memset(cfg, 0, sizeof(*cfg));
}

void
config_worker_free(struct config_worker *cfg)
{
    if (cfg == NULL) {
        return;
    }
    free(cfg->name);
    free(cfg->coordinator);
    free(cfg->listen);
    free(cfg->advertise);
    free(cfg->http);
    free(cfg->token_file);
    free(cfg->tokens_file);
    free(cfg->executor);
    labels_free(cfg->labels, cfg->n_labels);
    free(cfg->devices);
    tls_free(&cfg->tls);
    memset(cfg, 0, sizeof(*cfg));
}

bool
config_parse_size(const char *text, uint64_t *out)
{
    static const struct {
        const char *unit;
        uint64_t bytes;
    } units[] = {
        { "", 1 },
        { "B", 1 },
        { "KB", 1000ULL },
        { "MB", 1000ULL * 1000 },
        { "GB", 1000ULL * 1000 * 1000 },
        { "TB", 1000ULL * 1000 * 1000 * 1000 },
        { "KiB", 1ULL << 10 },
        { "MiB", 1ULL << 20 },
        { "GiB", 1ULL << 30 },
        { "TiB", 1ULL << 40 },
    };
    unsigned long long v;
    char *end;

    /* strtoull alone would take leading blanks, a sign, and wrap "-1". */
    if (text == NULL || !is_digit(text[0]) || (text[0] == '0' && is_digit(text[1]))) {
        return false;
    }
    errno = 0;
    v     = strtoull(text, &end, 10);
    if (errno == ERANGE) {
        return false;
    }
    if (*end == ' ') {
        while (*end == ' ') {
            end++;
        }
        if (*end == '\0') {
            return false;
        }
    }
    for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
        if (strcmp(end, units[i].unit) == 0) {
            if (v > UINT64_MAX / units[i].bytes) {
                return false;
            }
            *out = v * units[i].bytes;
            return true;
        }
    }
    return false;
}
