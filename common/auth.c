#include "auth.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <yaml.h>

#include "rpc.h"

#define TOKENS_FILE_MAX (1u << 20)
#define PEM_FILE_MAX    (1u << 20)

struct auth_token {
    char *token;
    size_t len;
    enum auth_role role;
};

struct auth {
    struct auth_token *tokens;
    size_t n;
};

static const struct {
    const char *name;
    enum auth_role role;
} role_names[] = {
    { "worker", ROLE_WORKER },
    { "trainer", ROLE_TRAINER },
    { "operator", ROLE_OPERATOR },
};

static const char *
role_name(enum auth_role r)
{
    for (size_t i = 0; i < sizeof(role_names) / sizeof(role_names[0]); i++) {
        if (role_names[i].role == r) {
            return role_names[i].name;
        }
    }
    return "none";
}

void
auth_free(struct auth *a)
{
    if (a == NULL) {
        return;
    }
    for (size_t i = 0; i < a->n; i++) {
        /* Do not leave tokens in freed memory. */
        memset(a->tokens[i].token, 0, a->tokens[i].len);
        free(a->tokens[i].token);
    }
    free(a->tokens);
    free(a);
}

/* Reads a whole file of at most max bytes, NUL-terminated. */
static dc_code
read_file(const char *path, size_t max, char **out, size_t *len, dc_status *st)
{
    FILE *f = fopen(path, "rb");
    char *buf;
    size_t n;

    if (f == NULL) {
        return status_set(st, DC_NOT_FOUND, "%s: cannot open: %s", path, strerror(errno));
    }
    if ((buf = malloc(max + 1)) == NULL) {
        fclose(f);
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
    }
    n = fread(buf, 1, max + 1, f);
    fclose(f);
    if (n > max) {
        free(buf);
        return status_set(st, DC_INVALID_ARGUMENT, "%s: larger than %zu bytes", path, max);
    }
    buf[n] = '\0';
    *out   = buf;
    *len   = n;
    return DC_OK;
}

static bool
token_chars_ok(const char *t, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)t[i];
        if (c <= 0x20 || c >= 0x7f) {
            return false;
        }
    }
    return len > 0 && len <= AUTH_TOKEN_MAX;
}

dc_code
auth_parse(const char *name, const char *data, size_t len, struct auth **out, dc_status *st)
{
    yaml_parser_t parser;
    yaml_event_t ev;
    struct auth *a = calloc(1, sizeof(*a));
    char *key      = NULL;
    int depth      = 0;
    dc_code code   = DC_OK;
    bool done      = false;

    *out = NULL;
    if (a == NULL || !yaml_parser_initialize(&parser)) {
        free(a);
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
    }
    yaml_parser_set_input_string(&parser, (const unsigned char *)data, len);
    while (!done && code == DC_OK) {
        unsigned line, col;
        if (!yaml_parser_parse(&parser, &ev)) {
            code = status_set(st, DC_INVALID_ARGUMENT, "%s:%zu:%zu: %s", name,
                              parser.problem_mark.line + 1, parser.problem_mark.column + 1,
                              parser.problem != NULL ? parser.problem : "syntax error");
            break;
        }
        line = (unsigned)ev.start_mark.line + 1;
        col  = (unsigned)ev.start_mark.column + 1;
        switch (ev.type) {
        case YAML_STREAM_END_EVENT:
            done = true;
            break;
        case YAML_MAPPING_START_EVENT:
            if (++depth > 1) {
                code = status_set(st, DC_INVALID_ARGUMENT,
                                  "%s:%u:%u: expected 'token: role' pairs, found a mapping", name,
                                  line, col);
            }
            break;
        case YAML_MAPPING_END_EVENT:
            depth--;
            break;
        case YAML_SEQUENCE_START_EVENT:
        case YAML_ALIAS_EVENT:
            code = status_set(st, DC_INVALID_ARGUMENT, "%s:%u:%u: expected 'token: role' pairs",
                              name, line, col);
            break;
        case YAML_SCALAR_EVENT: {
            const char *v = (const char *)ev.data.scalar.value;
            size_t vlen   = ev.data.scalar.length;
            if (depth != 1) {
                code = status_set(st, DC_INVALID_ARGUMENT,
                                  "%s:%u:%u: expected a mapping of token to role", name, line, col);
            } else if (key == NULL) {
                if (!token_chars_ok(v, vlen) || strlen(v) != vlen) {
                    code = status_set(st, DC_INVALID_ARGUMENT,
                                      "%s:%u:%u: a token is 1 to %d printable characters "
                                      "without blanks",
                                      name, line, col, AUTH_TOKEN_MAX);
                } else if ((key = strndup(v, vlen)) == NULL) {
                    code = status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
                } else if (auth_role_of(a, key) != ROLE_NONE) {
                    code = status_set(st, DC_INVALID_ARGUMENT, "%s:%u:%u: token listed twice", name,
                                      line, col);
                }
            } else {
                enum auth_role role = ROLE_NONE;
                struct auth_token *grow;
                for (size_t i = 0; i < sizeof(role_names) / sizeof(role_names[0]); i++) {
                    if (strcmp(v, role_names[i].name) == 0) {
                        role = role_names[i].role;
                    }
                }
                if (role == ROLE_NONE) {
                    code = status_set(st, DC_INVALID_ARGUMENT,
                                      "%s:%u:%u: unknown role (expected worker, trainer or "
                                      "operator)",
                                      name, line, col);
                } else if ((grow = realloc(a->tokens, (a->n + 1) * sizeof(*grow))) == NULL) {
                    code = status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
                } else {
                    a->tokens = grow;
                    a->tokens[a->n++] =
                        (struct auth_token){ .token = key, .len = strlen(key), .role = role };
                    key = NULL;
                }
            }
            break;
        }
        default:
            break;
        }
        yaml_event_delete(&ev);
    }
    yaml_parser_delete(&parser);
    free(key);
    if (code == DC_OK && a->n == 0) {
        code = status_set(st, DC_INVALID_ARGUMENT, "%s: no tokens", name);
    }
    if (code != DC_OK) {
        auth_free(a);
        return code;
    }
    *out = a;
    return DC_OK;
}

dc_code
auth_load(const char *path, struct auth **out, dc_status *st)
{
    char *data = NULL;
    size_t len = 0;
    dc_code code;

    if ((code = read_file(path, TOKENS_FILE_MAX, &data, &len, st)) != DC_OK) {
        return code;
    }
    code = auth_parse(path, data, len, out, st);
    memset(data, 0, len);
    free(data);
    return code;
}

/* Equal without an early exit: the time depends on the lengths only. */
static bool
token_equal(const char *a, size_t alen, const char *b, size_t blen)
{
    size_t n                 = alen > blen ? alen : blen;
    volatile unsigned char d = (unsigned char)(alen != blen);

    for (size_t i = 0; i < n; i++) {
        unsigned char x = i < alen ? (unsigned char)a[i] : 0;
        unsigned char y = i < blen ? (unsigned char)b[i] : 0;
        d |= (unsigned char)(x ^ y);
    }
    return d == 0;
}

enum auth_role
auth_role_of(const struct auth *a, const char *token)
{
    size_t len          = strnlen(token, AUTH_TOKEN_MAX + 1);
    enum auth_role role = ROLE_NONE;

    if (len == 0 || len > AUTH_TOKEN_MAX) {
        return ROLE_NONE;
    }
    /* Every token is compared, whichever matches. */
    for (size_t i = 0; i < a->n; i++) {
        if (token_equal(a->tokens[i].token, a->tokens[i].len, token, len)) {
            role = a->tokens[i].role;
        }
    }
    return role;
}

const char *
auth_token_with(const struct auth *a, enum auth_role role)
{
    for (size_t i = 0; a != NULL && i < a->n; i++) {
        if (a->tokens[i].role == role) {
            return a->tokens[i].token;
        }
    }
    return NULL;
}

dc_code
auth_check(const struct auth *a, const struct auth_rule *rules, size_t n_rules,
           const ProtobufCMethodDescriptor *method, const char *token, dc_status *st)
{
    enum auth_role role;
    unsigned allowed = ROLE_NONE;
    char who[64]     = "";

    if (token == NULL || token[0] == '\0') {
        return status_set(st, DC_UNAUTHENTICATED,
                          "%s needs a token (--token-file or "
                          "DEVCOORD_TOKEN)",
                          method->name);
    }
    if ((role = auth_role_of(a, token)) == ROLE_NONE) {
        return status_set(st, DC_UNAUTHENTICATED, "unknown token");
    }
    for (size_t i = 0; i < n_rules; i++) {
        if (strcmp(rules[i].method, method->name) == 0) {
            allowed = rules[i].roles;
        }
    }
    if ((allowed & role) != 0) {
        return DC_OK;
    }
    for (size_t i = 0; i < sizeof(role_names) / sizeof(role_names[0]); i++) {
        if (allowed & role_names[i].role) {
            size_t n = strlen(who);
            snprintf(who + n, sizeof(who) - n, "%s%s", n ? " or " : "", role_names[i].name);
        }
    }
    return status_set(st, DC_PERMISSION_DENIED, "%s needs role %s; this token has role %s",
                      method->name, who[0] ? who : "(none)", role_name(role));
}

dc_code
auth_read_token_file(const char *path, char **out, dc_status *st)
{
    char *data = NULL, *start, *end;
    size_t len = 0;
    dc_code code;

    if ((code = read_file(path, 64 * 1024, &data, &len, st)) != DC_OK) {
        return code;
    }
    start = data;
    while (*start == ' ' || *start == '\t') {
        start++;
    }
    end = start + strcspn(start, "\r\n");
    while (end > start && (end[-1] == ' ' || end[-1] == '\t')) {
        end--;
    }
    if (!token_chars_ok(start, (size_t)(end - start))) {
        code = status_set(st, DC_INVALID_ARGUMENT,
                          "%s: the first line must hold the token (1 to %d printable characters)",
                          path, AUTH_TOKEN_MAX);
    } else if ((*out = strndup(start, (size_t)(end - start))) == NULL) {
        code = status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
    }
    memset(data, 0, len);
    free(data);
    return code;
}

void
auth_url_host(const char *url, char *host, size_t cap)
{
    const char *p = strstr(url, "://");
    size_t n;

    p = p != NULL ? p + 3 : url;
    if (*p == '[') {
        p++;
        n = strcspn(p, "]");
    } else {
        n = strcspn(p, ":/");
    }
    snprintf(host, cap, "%.*s", (int)n, p);
}

static dc_code
tls_load(nng_tls_config *cfg, const char *ca, const char *cert, const char *key, dc_status *st)
{
    char *ca_pem = NULL, *cert_pem = NULL, *key_pem = NULL;
    size_t len;
    dc_code code = DC_OK;
    int rv;

    if ((ca != NULL && (code = read_file(ca, PEM_FILE_MAX, &ca_pem, &len, st)) != DC_OK) ||
        (cert != NULL && (code = read_file(cert, PEM_FILE_MAX, &cert_pem, &len, st)) != DC_OK) ||
        (key != NULL && (code = read_file(key, PEM_FILE_MAX, &key_pem, &len, st)) != DC_OK)) {
        goto out;
    }
    if (ca_pem != NULL && (rv = nng_tls_config_ca_chain(cfg, ca_pem, NULL)) != 0) {
        code = status_set(st, DC_INVALID_ARGUMENT, "%s: not a usable CA certificate: %s", ca,
                          nng_strerror(rv));
        goto out;
    }
    if (cert_pem != NULL && key_pem != NULL &&
        (rv = nng_tls_config_own_cert(cfg, cert_pem, key_pem, NULL)) != 0) {
        code = status_set(st, DC_INVALID_ARGUMENT, "%s / %s: not a usable certificate and key: %s",
                          cert, key, nng_strerror(rv));
    }
out:
    if (key_pem != NULL) {
        memset(key_pem, 0, strlen(key_pem));
    }
    free(ca_pem);
    free(cert_pem);
    free(key_pem);
    return code;
}

dc_code
auth_tls_server(const struct config_tls *tls, nng_tls_config **out, dc_status *st)
{
    nng_tls_config *cfg;
    dc_code code;
    int rv;

    if (tls->cert == NULL || tls->key == NULL) {
        return status_set(st, DC_INVALID_ARGUMENT,
                          "a tls+tcp:// listener needs tls.cert and tls.key");
    }
    if ((rv = nng_tls_config_alloc(&cfg, NNG_TLS_MODE_SERVER)) != 0) {
        return status_set(st, DC_UNAVAILABLE, "TLS: %s", nng_strerror(rv));
    }
    if ((code = tls_load(cfg, tls->require_client_cert ? tls->ca : NULL, tls->cert, tls->key,
                         st)) != DC_OK ||
        (rv = nng_tls_config_auth_mode(cfg, tls->require_client_cert ? NNG_TLS_AUTH_MODE_REQUIRED
                                                                     : NNG_TLS_AUTH_MODE_NONE)) !=
            0) {
        if (code == DC_OK) {
            code = status_set(st, DC_INVALID_ARGUMENT, "TLS: %s", nng_strerror(rv));
        }
        nng_tls_config_free(cfg);
        return code;
    }
    *out = cfg;
    return DC_OK;
}

dc_code
auth_tls_client(const char *ca, const char *cert, const char *key, const char *server_name,
                nng_tls_config **out, dc_status *st)
{
    nng_tls_config *cfg;
    dc_code code;
    int rv;

    if ((cert == NULL) != (key == NULL)) {
        return status_set(st, DC_INVALID_ARGUMENT, "a client certificate needs both cert and key");
    }
    if ((rv = nng_tls_config_alloc(&cfg, NNG_TLS_MODE_CLIENT)) != 0) {
        return status_set(st, DC_UNAVAILABLE, "TLS: %s", nng_strerror(rv));
    }
    /* Without a CA the server cannot be verified: refuse rather than trust anyone. */
    if (ca == NULL) {
        nng_tls_config_free(cfg);
        return status_set(st, DC_INVALID_ARGUMENT,
                          "a tls+tcp:// dialer needs a CA certificate to verify the server");
    }
    if ((code = tls_load(cfg, ca, cert, key, st)) != DC_OK ||
        (rv = nng_tls_config_auth_mode(cfg, NNG_TLS_AUTH_MODE_REQUIRED)) != 0 ||
        (server_name != NULL && (rv = nng_tls_config_server_name(cfg, server_name)) != 0)) {
        if (code == DC_OK) {
            code = status_set(st, DC_INVALID_ARGUMENT, "TLS: %s", nng_strerror(rv));
        }
        nng_tls_config_free(cfg);
        return code;
    }
    *out = cfg;
    return DC_OK;
}

dc_code
auth_client_open(const char *url, const char *token, const struct config_tls *tls,
                 size_t max_message_bytes, uint32_t reconnect_max_ms, struct rpc_client **out,
                 dc_status *st)
{
    struct rpc_client_opts opts = { 0 };
    nng_tls_config *cfg         = NULL;
    char host[256];
    dc_code code;

    if (strncmp(url, "tls+", 4) == 0) {
        auth_url_host(url, host, sizeof(host));
        if ((code = auth_tls_client(tls->ca, tls->cert, tls->key, host, &cfg, st)) != DC_OK) {
            return code;
        }
    }
    opts.url               = url;
    opts.token             = token;
    opts.tls               = cfg;
    opts.max_message_bytes = max_message_bytes;
    opts.reconnect_min_ms  = 20;
    opts.reconnect_max_ms  = reconnect_max_ms;
    code                   = rpc_client_open(&opts, out, st);
    /* The dialer holds its own reference. */
    if (cfg != NULL) {
        nng_tls_config_free(cfg);
    }
    return code;
}
