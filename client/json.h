/*
 * A small JSON writer for devcoordctl's `-o json`: it builds one document in memory, adds
 * commas and escapes strings itself (invalid UTF-8 becomes U+FFFD), so whatever a server
 * sends, the output stays valid JSON. The caller owns the struct; json_free releases it.
 */
#ifndef DEVCOORD_CLIENT_JSON_H
#define DEVCOORD_CLIENT_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define JSON_DEPTH_MAX 32

struct json {
    char *buf;
    size_t len, cap;
    bool failed; /* out of memory or nested too deep: the text is incomplete */
    unsigned depth;
    bool has_items[JSON_DEPTH_MAX + 1];
    bool after_key;
};

void json_init(struct json *j);
void json_free(struct json *j);

/* The document so far, NUL-terminated; NULL when the writer failed. */
const char *json_text(const struct json *j);

void json_object_begin(struct json *j);
void json_object_end(struct json *j);
void json_array_begin(struct json *j);
void json_array_end(struct json *j);

/* The key of the next value inside an object. */
void json_key(struct json *j, const char *key);

/* NULL writes null. */
void json_string(struct json *j, const char *s);
void json_string_len(struct json *j, const char *s, size_t len);
void json_uint(struct json *j, uint64_t v);
void json_int(struct json *j, int64_t v);
/* The shortest text that reads back as the same double; NaN and infinities as null. */
void json_double(struct json *j, double v);
/* As json_double, shortest for the float v. */
void json_float(struct json *j, float v);
void json_bool(struct json *j, bool v);
/* The shortest text of v (as a float when as_float) that reads back the same, as
 * json_double writes it; "nan", "inf" and "-inf" for those. */
void json_format_number(char *buf, size_t cap, double v, bool as_float);
void json_null(struct json *j);

#endif
