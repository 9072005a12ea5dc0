#include "etcd.h"

#include <cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mbedtls/base64.h>
#include <nng/nng.h>
#include <nng/supplemental/http/http.h>
#include <nng/supplemental/tls/tls.h>

#include "address.h"
#include "auth.h"
#include "log.h"
#include "rpc.h"

struct etcd_endpoint {
    char url[ADDRESS_MAX + 1];
    nng_url *base;
    nng_http_client *client;
};

struct etcd {
    struct etcd_endpoint ep[ETCD_MAX_ENDPOINTS];
    size_t n;
    atomic_size_t current;
    uint32_t timeout_ms;
    char *username; /* NULL: etcd without auth */
    char *password; /* from state.password_file; wiped on free, never logged */
    pthread_mutex_t mu;
    char *token; /* guarded by mu: etcd's auth token, NULL before the first authenticate */
};

#define ETCD_MAX_TOKEN 4096

void
etcd_free(struct etcd *e)
{
    if (e == NULL) {
        return;
    }
    for (size_t i = 0; i < e->n; i++) {
        if (e->ep[i].client != NULL) {
            nng_http_client_free(e->ep[i].client);
        }
        if (e->ep[i].base != NULL) {
            nng_url_free(e->ep[i].base);
        }
    }
    if (e->password != NULL) {
        memset(e->password, 0, strlen(e->password));
        free(e->password);
    }
    free(e->username);
    free(e->token);
    pthread_mutex_destroy(&e->mu);
    free(e);
}

dc_code
etcd_open(const struct config_state *cfg, uint32_t timeout_ms, struct etcd **out, dc_status *st)
{
    const char *endpoints = cfg->endpoints, *ca = cfg->ca;
    char buf[ETCD_MAX_ENDPOINTS * (ADDRESS_MAX + 1 + 1)];
    const char *list[ETCD_MAX_ENDPOINTS];
    struct etcd *e;
    size_t n;
    int rv;

    *out = NULL;
    if ((n = address_split_list(endpoints, buf, sizeof(buf), list, ETCD_MAX_ENDPOINTS)) == 0) {
        return status_set(st, DC_INVALID_ARGUMENT, "state.endpoints: no usable endpoint");
    }
    if ((e = calloc(1, sizeof(*e))) == NULL) {
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
    }
    e->timeout_ms = timeout_ms;
    pthread_mutex_init(&e->mu, NULL);
    if (cfg->username != NULL) {
        dc_code code;

        if ((e->username = strdup(cfg->username)) == NULL) {
            etcd_free(e);
            return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
        }
        if (cfg->password_file == NULL) {
            etcd_free(e);
            return status_set(st, DC_INVALID_ARGUMENT, "state.username needs state.password_file");
        }
        if ((code = auth_read_token_file(cfg->password_file, &e->password, st)) != DC_OK) {
            char why[sizeof(st->message)];

            snprintf(why, sizeof(why), "%s", st->message);
            etcd_free(e);
            return status_set(st, code, "state.password_file: %s", why);
        }
    }
    for (size_t i = 0; i < n; i++, e->n++) {
        struct etcd_endpoint *ep = &e->ep[i];

        snprintf(ep->url, sizeof(ep->url), "%s", list[i]);
        if ((rv = nng_url_parse(&ep->base, list[i])) != 0 ||
            (rv = nng_http_client_alloc(&ep->client, ep->base)) != 0) {
            status_set(st, DC_INVALID_ARGUMENT, "etcd endpoint %s: %s", list[i], nng_strerror(rv));
            e->n++;
            etcd_free(e);
            return DC_INVALID_ARGUMENT;
        }
        if (strncmp(list[i], "https://", 8) == 0) {
            nng_tls_config *tls = NULL;
            dc_code code;
            char host[256];

            if (ca == NULL) {
                e->n++;
                etcd_free(e);
                return status_set(st, DC_INVALID_ARGUMENT,
                                  "etcd endpoint %s: https:// needs state.ca", list[i]);
            }
            auth_url_host(list[i], host, sizeof(host));
            /* state.cert / state.key: the client certificate for etcd's --client-cert-auth. */
            if ((code = auth_tls_client(ca, cfg->cert, cfg->key, host, &tls, st)) != DC_OK) {
                e->n++;
                etcd_free(e);
                return code;
            }
            rv = nng_http_client_set_tls(ep->client, tls);
            nng_tls_config_free(tls);
            if (rv != 0) {
                e->n++;
                etcd_free(e);
                return status_set(st, DC_INTERNAL, "etcd endpoint %s: %s", list[i],
                                  nng_strerror(rv));
            }
        }
    }
    *out = e;
    return DC_OK;
}

/* ---- HTTP ------------------------------------------------------------------------------ */

/* A chunk-size line's hex digits from *in (moved past them) as *size: how many digits, or -1
 * (not hex, or more than 8). */
static int
chunk_size(const char *buf, size_t n, size_t *in, size_t *size)
{
    size_t digits = 0;

    *size = 0;
    while (*in < n && buf[*in] != '\r' && buf[*in] != ';') {
        char c = buf[*in];
        unsigned v;

        if (c >= '0' && c <= '9') {
            v = (unsigned)(c - '0');
        } else if (c >= 'a' && c <= 'f') {
            v = (unsigned)(c - 'a' + 10);
        } else if (c >= 'A' && c <= 'F') {
            v = (unsigned)(c - 'A' + 10);
        } else {
            return -1;
        }
        if (++digits > 8) {
            return -1;
        }
        *size = *size * 16 + v;
        (*in)++;
    }
    return (int)digits;
}

int
etcd_dechunk_more(char *buf, size_t n, struct etcd_dechunk *d)
{
    for (;;) {
        size_t in = d->in, size = 0;
        int digits;

        if (d->trailers) {
            /* Trailer lines (the gateway's error answers carry Grpc-Trailer-Content-Type),
             * then the blank line that ends the body; d->in is the next line's start. */
            size_t eol = in;

            while (eol < n && buf[eol] != '\n') {
                eol++;
            }
            if (eol == n) {
                return 0;
            }
            if (eol == in || buf[eol - 1] != '\r') {
                return -1;
            }
            d->in = eol + 1;
            if (eol == in + 1) {
                return 1;
            }
            continue;
        }
        if ((digits = chunk_size(buf, n, &in, &size)) < 0) {
            return -1;
        }
        while (in < n && buf[in] != '\r') { /* chunk extensions */
            in++;
        }
        if (in + 2 > n) {
            return 0;
        }
        if (digits == 0 || buf[in + 1] != '\n') {
            return -1;
        }
        in += 2;
        if (size == 0) {
            d->in       = in;
            d->trailers = true;
            continue;
        }
        if (size > n - in || n - in - size < 2) {
            return 0; /* d unchanged: this chunk is parsed again once more has come */
        }
        if (buf[in + size] != '\r' || buf[in + size + 1] != '\n') {
            return -1;
        }
        memmove(buf + d->out, buf + in, size);
        d->out += size;
        d->in = in + size + 2;
    }
}

int
etcd_dechunk(char *buf, size_t *len)
{
    struct etcd_dechunk d = { 0 };
    int rv                = etcd_dechunk_more(buf, *len, &d);

    if (rv == 1) {
        *len = d.out;
    }
    return rv;
}

/* Waits for aio (whose timeout bounds it); 0 or an nng error. */
static int
aio_run(nng_aio *aio)
{
    nng_aio_wait(aio);
    return nng_aio_result(aio);
}

static nng_duration
remaining(uint64_t deadline)
{
    uint64_t now = rpc_now_ms();
    return now >= deadline ? 1 : (nng_duration)(deadline - now);
}

/* Reads the body after the header: Content-Length bytes, or chunks until the last one. */
static dc_code
read_body(nng_http_conn *conn, nng_http_res *res, nng_aio *aio, uint64_t deadline, char **out,
          size_t *out_len, dc_status *st)
{
    const char *cl         = nng_http_res_get_header(res, "Content-Length");
    const char *te         = nng_http_res_get_header(res, "Transfer-Encoding");
    char *buf              = NULL;
    size_t len             = 0, cap;
    struct etcd_dechunk dc = { 0 };
    nng_iov iov;
    int rv;

    if (cl != NULL) {
        char *end;
        unsigned long long v;

        errno = 0;
        v     = strtoull(cl, &end, 10);
        if (errno != 0 || *end != '\0' || end == cl || v > ETCD_MAX_RESPONSE) {
            return status_set(st, DC_UNAVAILABLE, "etcd: response of %.32s bytes refused", cl);
        }
        if ((buf = malloc((size_t)v + 1)) == NULL) {
            return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
        }
        if (v > 0) {
            iov.iov_buf = buf;
            iov.iov_len = (size_t)v;
            nng_aio_set_iov(aio, 1, &iov);
            nng_aio_set_timeout(aio, remaining(deadline));
            nng_http_conn_read_all(conn, aio);
            if ((rv = aio_run(aio)) != 0) {
                free(buf);
                return status_set(st, DC_UNAVAILABLE, "etcd: reading the response: %s",
                                  nng_strerror(rv));
            }
        }
        buf[v]   = '\0';
        *out     = buf;
        *out_len = (size_t)v;
        return DC_OK;
    }
    if (te == NULL || strstr(te, "chunked") == NULL) {
        return status_set(st, DC_UNAVAILABLE, "etcd: response with neither a length nor chunks");
    }
    cap = 4096;
    if ((buf = malloc(cap + 1)) == NULL) {
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
    }
    for (;;) {
        int done;

        if (len == cap) {
            char *grow;
            if (cap >= ETCD_MAX_RESPONSE) {
                free(buf);
                return status_set(st, DC_UNAVAILABLE, "etcd: response over %u bytes refused",
                                  ETCD_MAX_RESPONSE);
            }
            cap *= 2;
            if ((grow = realloc(buf, cap + 1)) == NULL) {
                free(buf);
                return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
            }
            buf = grow;
        }
        iov.iov_buf = buf + len;
        iov.iov_len = cap - len;
        nng_aio_set_iov(aio, 1, &iov);
        nng_aio_set_timeout(aio, remaining(deadline));
        nng_http_conn_read(conn, aio);
        if ((rv = aio_run(aio)) != 0) {
            free(buf);
            return status_set(st, DC_UNAVAILABLE, "etcd: reading the response: %s",
                              nng_strerror(rv));
        }
        len += nng_aio_count(aio);
        /* Decoded in place as chunks complete: a read costs the header line of the chunk it
         * ends in and the chunks it completes, not the whole body again. */
        done = etcd_dechunk_more(buf, len, &dc);
        if (done < 0) {
            free(buf);
            return status_set(st, DC_UNAVAILABLE, "etcd: malformed chunked response");
        }
        if (done == 1) {
            buf[dc.out] = '\0';
            *out        = buf;
            *out_len    = dc.out;
            return DC_OK;
        }
    }
}

/* What to say after an nng error on an https:// endpoint's connection. */
static const char *
tls_hint(const struct etcd_endpoint *ep, int rv)
{
    if (strncmp(ep->url, "https://", 8) == 0 && (rv == NNG_ECRYPTO || rv == NNG_EPEERAUTH)) {
        return " (TLS to etcd refused: check state.ca, state.cert, state.key)";
    }
    return "";
}

/* One POST to one endpoint. */
static dc_code
post_one(struct etcd *e, struct etcd_endpoint *ep, const char *path, const char *body,
         const char *token, cJSON **out, bool *unauth, dc_status *st)
{
    uint64_t deadline   = rpc_now_ms() + e->timeout_ms;
    nng_http_conn *conn = NULL;
    nng_http_req *req   = NULL;
    nng_http_res *res   = NULL;
    nng_aio *aio        = NULL;
    char *text          = NULL;
    size_t len          = 0;
    uint16_t status;
    dc_code code;
    int rv;

    if ((rv = nng_aio_alloc(&aio, NULL, NULL)) != 0 ||
        (rv = nng_http_req_alloc(&req, ep->base)) != 0 || (rv = nng_http_res_alloc(&res)) != 0 ||
        (rv = nng_http_req_set_method(req, "POST")) != 0 ||
        (rv = nng_http_req_set_uri(req, path)) != 0 ||
        (rv = nng_http_req_set_header(req, "Content-Type", "application/json")) != 0 ||
        (rv = nng_http_req_copy_data(req, body, strlen(body))) != 0 ||
        (token != NULL && (rv = nng_http_req_set_header(req, "Authorization", token)) != 0)) {
        code = status_set(st, DC_RESOURCE_EXHAUSTED, "etcd: %s", nng_strerror(rv));
        goto out;
    }
    nng_aio_set_timeout(aio, remaining(deadline));
    nng_http_client_connect(ep->client, aio);
    if ((rv = aio_run(aio)) != 0) {
        code = status_set(st, DC_UNAVAILABLE, "etcd %s: %s%s", ep->url, nng_strerror(rv),
                          tls_hint(ep, rv));
        goto out;
    }
    conn = nng_aio_get_output(aio, 0);
    nng_aio_set_timeout(aio, remaining(deadline));
    nng_http_conn_write_req(conn, req, aio);
    if ((rv = aio_run(aio)) != 0) {
        code = status_set(st, DC_UNAVAILABLE, "etcd %s: sending %s: %s%s", ep->url, path,
                          nng_strerror(rv), tls_hint(ep, rv));
        goto out;
    }
    nng_aio_set_timeout(aio, remaining(deadline));
    nng_http_conn_read_res(conn, res, aio);
    if ((rv = aio_run(aio)) != 0) {
        code = status_set(st, DC_UNAVAILABLE, "etcd %s: %s: %s%s", ep->url, path, nng_strerror(rv),
                          tls_hint(ep, rv));
        goto out;
    }
    if ((code = read_body(conn, res, aio, deadline, &text, &len, st)) != DC_OK) {
        goto out;
    }
    status = nng_http_res_get_status(res);
    *out   = cJSON_ParseWithLength(text, len);
    if (*out == NULL) {
        /* etcd's own plain-text refusals (e.g. a client certificate with a CommonName on the
         * gateway with auth on) are quoted: printable bytes of the first line only. */
        char said[161];
        size_t k = 0;

        for (size_t j = 0; j < len && k < sizeof(said) - 1 && text[j] != '\n'; j++) {
            said[k++] = text[j] >= 0x20 && text[j] < 0x7f ? text[j] : '?';
        }
        said[k] = '\0';
        code = status_set(st, DC_UNAVAILABLE, "etcd %s: %s: HTTP %u, not JSON: %s", ep->url, path,
                          status, said);
        goto out;
    }
    if (status == 200) {
        /* A stream's error (the keepalive's) comes in a 200: {"error": {"http_code": ...}}. */
        const cJSON *err = cJSON_GetObjectItemCaseSensitive(*out, "error");
        const cJSON *hc  = cJSON_GetObjectItemCaseSensitive(err, "http_code");
        const cJSON *msg = cJSON_GetObjectItemCaseSensitive(err, "message");

        if ((cJSON_IsNumber(hc) && hc->valuedouble == 401) ||
            (cJSON_IsString(msg) && strstr(msg->valuestring, "invalid auth token") != NULL)) {
            *unauth = true;
            code    = status_set(st, DC_UNAUTHENTICATED, "etcd %s: %s: %.200s", ep->url, path,
                              cJSON_IsString(msg) ? msg->valuestring : "unauthenticated");
            cJSON_Delete(*out);
            *out = NULL;
            goto out;
        }
    }
    if (status != 200) {
        const cJSON *msg = cJSON_GetObjectItemCaseSensitive(*out, "message");
        if (!cJSON_IsString(msg)) {
            msg = cJSON_GetObjectItemCaseSensitive(*out, "error");
        }
        *unauth = status == 401 ||
                  (cJSON_IsString(msg) && strstr(msg->valuestring, "invalid auth token") != NULL);
        code = status_set(st,
                          *unauth         ? DC_UNAUTHENTICATED
                          : status >= 500 ? DC_UNAVAILABLE
                                          : DC_INTERNAL,
                          "etcd %s: %s: HTTP %u: %.200s", ep->url, path, status,
                          cJSON_IsString(msg) ? msg->valuestring : "");
        cJSON_Delete(*out);
        *out = NULL;
        goto out;
    }
    code = DC_OK;
out:
    free(text);
    if (conn != NULL) {
        nng_http_conn_close(conn);
    }
    nng_http_res_free(res);
    nng_http_req_free(req);
    nng_aio_free(aio);
    return code;
}

/* POSTs text to path at the current endpoint, then the others; a refusal that is not
 * about reaching etcd is not tried again. */
static dc_code
post_text(struct etcd *e, const char *path, const char *text, const char *token, cJSON **out,
          bool *unauth, dc_status *st)
{
    size_t first = atomic_load(&e->current);
    dc_code code = DC_UNAVAILABLE;

    *out    = NULL;
    *unauth = false;
    for (size_t k = 0; k < e->n; k++) {
        size_t i = (first + k) % e->n;

        if ((code = post_one(e, &e->ep[i], path, text, token, out, unauth, st)) != DC_UNAVAILABLE) {
            break;
        }
        atomic_store(&e->current, (i + 1) % e->n);
    }
    return code;
}

/* POST /v3/auth/authenticate {"name", "password"}: a new token, kept for the next requests.
 * The request body holds the password: it is wiped, and no message quotes it. */
static dc_code
authenticate(struct etcd *e, char **token, dc_status *st)
{
    cJSON *req = cJSON_CreateObject(), *res = NULL;
    const cJSON *t;
    char *text = NULL;
    bool unauth;
    dc_code code;

    *token = NULL;
    if (req == NULL || cJSON_AddStringToObject(req, "name", e->username) == NULL ||
        cJSON_AddStringToObject(req, "password", e->password) == NULL ||
        (text = cJSON_PrintUnformatted(req)) == NULL) {
        code = status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
    } else {
        code = post_text(e, "/v3/auth/authenticate", text, NULL, &res, &unauth, st);
    }
    if (text != NULL) {
        memset(text, 0, strlen(text));
        free(text);
    }
    if (req != NULL) {
        cJSON *pw = cJSON_GetObjectItemCaseSensitive(req, "password");
        if (cJSON_IsString(pw)) {
            memset(pw->valuestring, 0, strlen(pw->valuestring));
        }
        cJSON_Delete(req);
    }
    if (code != DC_OK) {
        char why[sizeof(st->message)];

        snprintf(why, sizeof(why), "%s", st->message);
        return status_set(st, code == DC_UNAVAILABLE ? DC_UNAVAILABLE : DC_UNAUTHENTICATED,
                          "etcd authentication as %.64s failed: %s", e->username, why);
    }
    t = cJSON_GetObjectItemCaseSensitive(res, "token");
    if (!cJSON_IsString(t) || t->valuestring[0] == '\0' ||
        strlen(t->valuestring) > ETCD_MAX_TOKEN || strpbrk(t->valuestring, "\r\n") != NULL) {
        code = status_set(st, DC_UNAUTHENTICATED,
                          "etcd authentication as %.64s answered no usable token", e->username);
    } else if ((*token = strdup(t->valuestring)) == NULL) {
        code = status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
    }
    cJSON_Delete(res);
    return code;
}

/* The token to send (a copy, caller frees): the one held, or a new one. NULL without auth. */
static dc_code
current_token(struct etcd *e, char **token, dc_status *st)
{
    dc_code code;
    char *fresh;

    *token = NULL;
    if (e->username == NULL) {
        return DC_OK;
    }
    pthread_mutex_lock(&e->mu);
    if (e->token != NULL && (*token = strdup(e->token)) == NULL) {
        pthread_mutex_unlock(&e->mu);
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
    }
    pthread_mutex_unlock(&e->mu);
    if (*token != NULL) {
        return DC_OK;
    }
    /* Outside the lock: two threads may both authenticate; either token is good. */
    if ((code = authenticate(e, &fresh, st)) != DC_OK) {
        return code;
    }
    if ((*token = strdup(fresh)) == NULL) {
        free(fresh);
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
    }
    pthread_mutex_lock(&e->mu);
    free(e->token);
    e->token = fresh;
    pthread_mutex_unlock(&e->mu);
    return DC_OK;
}

/* Forgets token if it is still the one held (an expired or restarted etcd refused it). */
static void
drop_token(struct etcd *e, const char *token)
{
    pthread_mutex_lock(&e->mu);
    if (e->token != NULL && token != NULL && strcmp(e->token, token) == 0) {
        free(e->token);
        e->token = NULL;
    }
    pthread_mutex_unlock(&e->mu);
}

/* POSTs body to path, with the auth token when state.username is set; a request refused
 * for its token (401, "invalid auth token") authenticates again once and is sent again. */
static dc_code
post(struct etcd *e, const char *path, cJSON *body, cJSON **out, dc_status *st)
{
    char *text   = cJSON_PrintUnformatted(body);
    dc_code code = DC_UNAVAILABLE;

    *out = NULL;
    if (text == NULL) {
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
    }
    for (int attempt = 0; attempt < 2; attempt++) {
        char *token = NULL;
        bool unauth = false;

        if ((code = current_token(e, &token, st)) != DC_OK) {
            break;
        }
        code = post_text(e, path, text, token, out, &unauth, st);
        if (unauth && token != NULL) {
            log_info("etcd refused the auth token (%s); authenticating again", st->message);
            drop_token(e, token);
        }
        free(token);
        if (!unauth || e->username == NULL) {
            break;
        }
    }
    free(text);
    return code;
}

/* ---- JSON ------------------------------------------------------------------------------ */

/* int64 fields come as strings ("7587...") from the gateway; numbers are taken too. */
static int64_t
json_i64(const cJSON *obj, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);

    if (cJSON_IsString(v)) {
        return (int64_t)strtoll(v->valuestring, NULL, 10);
    }
    if (cJSON_IsNumber(v)) {
        /* Converting a double outside int64's range (or NaN) is undefined: such a field is
         * garbage, read as 0 like a missing one. */
        double d = v->valuedouble;
        return d > -9.2e18 && d < 9.2e18 ? (int64_t)d : 0;
    }
    return 0;
}

static bool
json_add_i64(cJSON *obj, const char *name, int64_t v)
{
    char buf[32];

    snprintf(buf, sizeof(buf), "%" PRId64, v);
    return cJSON_AddStringToObject(obj, name, buf) != NULL;
}

static bool
json_add_b64(cJSON *obj, const char *name, const void *data, size_t len)
{
    size_t olen = 0;
    char *buf;
    bool ok;

    mbedtls_base64_encode(NULL, 0, &olen, data, len);
    if ((buf = malloc(olen + 1)) == NULL) {
        return false;
    }
    if (mbedtls_base64_encode((unsigned char *)buf, olen + 1, &olen, data, len) != 0) {
        free(buf);
        return false;
    }
    buf[olen] = '\0';
    ok        = cJSON_AddStringToObject(obj, name, buf) != NULL;
    free(buf);
    return ok;
}

/* Decodes a base64 string field into a NUL-terminated malloc'd buffer. */
static dc_code
json_b64(const cJSON *obj, const char *name, char **out, size_t *len, dc_status *st)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
    const char *s  = cJSON_IsString(v) ? v->valuestring : "";
    size_t olen = 0, slen = strlen(s);
    char *buf;

    if (slen > ETCD_MAX_VALUE * 2) {
        return status_set(st, DC_UNAVAILABLE, "etcd: value too large");
    }
    if ((buf = malloc(slen + 1)) == NULL) {
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
    }
    if (mbedtls_base64_decode((unsigned char *)buf, slen, &olen, (const unsigned char *)s, slen) !=
        0) {
        free(buf);
        return status_set(st, DC_UNAVAILABLE, "etcd: %s is not base64", name);
    }
    buf[olen] = '\0';
    *out      = buf;
    *len      = olen;
    return DC_OK;
}

static dc_code
kv_from_json(const cJSON *kv, struct etcd_kv *out, dc_status *st)
{
    out->create_revision = json_i64(kv, "create_revision");
    out->lease           = json_i64(kv, "lease");
    return json_b64(kv, "value", &out->value, &out->len, st);
}

void
etcd_kv_clear(struct etcd_kv *kv)
{
    free(kv->value);
    memset(kv, 0, sizeof(*kv));
}

static dc_code
oom(cJSON *j, dc_status *st)
{
    cJSON_Delete(j);
    return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
}

/* ---- calls ----------------------------------------------------------------------------- */

dc_code
etcd_lease_grant(struct etcd *e, int64_t ttl_s, int64_t *id, int64_t *granted_s, dc_status *st)
{
    cJSON *req = cJSON_CreateObject(), *res = NULL;
    dc_code code;

    if (req == NULL || !json_add_i64(req, "TTL", ttl_s)) {
        return oom(req, st);
    }
    code = post(e, "/v3/lease/grant", req, &res, st);
    cJSON_Delete(req);
    if (code != DC_OK) {
        return code;
    }
    *id        = json_i64(res, "ID");
    *granted_s = json_i64(res, "TTL");
    cJSON_Delete(res);
    if (*id == 0 || *granted_s <= 0) {
        return status_set(st, DC_UNAVAILABLE, "etcd granted no lease");
    }
    return DC_OK;
}

dc_code
etcd_lease_keepalive(struct etcd *e, int64_t id, int64_t *ttl_s, dc_status *st)
{
    cJSON *req = cJSON_CreateObject(), *res = NULL;
    const cJSON *result, *err;
    dc_code code;

    if (req == NULL || !json_add_i64(req, "ID", id)) {
        return oom(req, st);
    }
    code = post(e, "/v3/lease/keepalive", req, &res, st);
    cJSON_Delete(req);
    if (code != DC_OK) {
        return code;
    }
    /* A stream's answer: {"result": {...}} or {"error": {...}}. */
    result = cJSON_GetObjectItemCaseSensitive(res, "result");
    err    = cJSON_GetObjectItemCaseSensitive(res, "error");
    if (!cJSON_IsObject(result)) {
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(err, "message");
        code           = status_set(st, DC_UNAVAILABLE, "etcd keepalive: %.200s",
                          cJSON_IsString(m) ? m->valuestring : "no result");
    } else {
        *ttl_s = json_i64(result, "TTL");
    }
    cJSON_Delete(res);
    return code;
}

dc_code
etcd_lease_revoke(struct etcd *e, int64_t id, dc_status *st)
{
    cJSON *req = cJSON_CreateObject(), *res = NULL;
    dc_code code;

    if (req == NULL || !json_add_i64(req, "ID", id)) {
        return oom(req, st);
    }
    code = post(e, "/v3/lease/revoke", req, &res, st);
    cJSON_Delete(req);
    cJSON_Delete(res);
    return code;
}

/* {"key": b64, ...} objects for a txn. */
static cJSON *
txn_compare_create(const char *key, int64_t rev)
{
    cJSON *c = cJSON_CreateObject();

    if (c == NULL || !json_add_b64(c, "key", key, strlen(key)) ||
        cJSON_AddStringToObject(c, "result", "EQUAL") == NULL ||
        cJSON_AddStringToObject(c, "target", "CREATE") == NULL ||
        !json_add_i64(c, "create_revision", rev)) {
        cJSON_Delete(c);
        return NULL;
    }
    return c;
}

static cJSON *
txn_put(const char *key, const void *value, size_t len, int64_t lease)
{
    cJSON *op = cJSON_CreateObject(), *put = cJSON_CreateObject();

    if (op == NULL || put == NULL || !json_add_b64(put, "key", key, strlen(key)) ||
        !json_add_b64(put, "value", value, len) ||
        (lease != 0 && !json_add_i64(put, "lease", lease))) {
        cJSON_Delete(op);
        cJSON_Delete(put);
        return NULL;
    }
    cJSON_AddItemToObject(op, "request_put", put);
    return op;
}

static cJSON *
txn_range(const char *key)
{
    cJSON *op = cJSON_CreateObject(), *r = cJSON_CreateObject();

    if (op == NULL || r == NULL || !json_add_b64(r, "key", key, strlen(key))) {
        cJSON_Delete(op);
        cJSON_Delete(r);
        return NULL;
    }
    cJSON_AddItemToObject(op, "request_range", r);
    return op;
}

/* A txn of one compare, one success op and one failure op (may be NULL). */
static cJSON *
txn_new(cJSON *compare, cJSON *success, cJSON *failure)
{
    cJSON *t = cJSON_CreateObject();
    cJSON *c = cJSON_CreateArray(), *s = cJSON_CreateArray(), *f = cJSON_CreateArray();

    if (t == NULL || c == NULL || s == NULL || f == NULL || compare == NULL || success == NULL) {
        cJSON_Delete(t);
        cJSON_Delete(c);
        cJSON_Delete(s);
        cJSON_Delete(f);
        cJSON_Delete(compare);
        cJSON_Delete(success);
        cJSON_Delete(failure);
        return NULL;
    }
    cJSON_AddItemToArray(c, compare);
    cJSON_AddItemToArray(s, success);
    if (failure != NULL) {
        cJSON_AddItemToArray(f, failure);
    }
    cJSON_AddItemToObject(t, "compare", c);
    cJSON_AddItemToObject(t, "success", s);
    cJSON_AddItemToObject(t, "failure", f);
    return t;
}

/* The first kv of a range response, or NULL. */
static const cJSON *
range_first(const cJSON *range)
{
    const cJSON *kvs = cJSON_GetObjectItemCaseSensitive(range, "kvs");
    return cJSON_IsArray(kvs) ? cJSON_GetArrayItem(kvs, 0) : NULL;
}

dc_code
etcd_create(struct etcd *e, const char *key, const char *value, int64_t lease, bool *won,
            struct etcd_kv *out, dc_status *st)
{
    cJSON *req = txn_new(txn_compare_create(key, 0), txn_put(key, value, strlen(value), lease),
                         txn_range(key));
    cJSON *res = NULL;
    const cJSON *responses, *first, *range, *kv;
    dc_code code;

    memset(out, 0, sizeof(*out));
    *won = false;
    if (req == NULL) {
        return oom(NULL, st);
    }
    code = post(e, "/v3/kv/txn", req, &res, st);
    cJSON_Delete(req);
    if (code != DC_OK) {
        return code;
    }
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(res, "succeeded"))) {
        *won = true;
        out->create_revision =
            json_i64(cJSON_GetObjectItemCaseSensitive(res, "header"), "revision");
        out->lease = lease;
        cJSON_Delete(res);
        if (out->create_revision <= 0) {
            return status_set(st, DC_UNAVAILABLE, "etcd txn answered no revision");
        }
        return DC_OK;
    }
    responses = cJSON_GetObjectItemCaseSensitive(res, "responses");
    first     = cJSON_IsArray(responses) ? cJSON_GetArrayItem(responses, 0) : NULL;
    range     = cJSON_GetObjectItemCaseSensitive(first, "response_range");
    if ((kv = range_first(range)) != NULL) {
        code = kv_from_json(kv, out, st);
    }
    cJSON_Delete(res);
    return code;
}

dc_code
etcd_get(struct etcd *e, const char *key, struct etcd_kv *out, dc_status *st)
{
    cJSON *req = cJSON_CreateObject(), *res = NULL;
    const cJSON *kv;
    dc_code code;

    memset(out, 0, sizeof(*out));
    if (req == NULL || !json_add_b64(req, "key", key, strlen(key))) {
        return oom(req, st);
    }
    code = post(e, "/v3/kv/range", req, &res, st);
    cJSON_Delete(req);
    if (code != DC_OK) {
        return code;
    }
    if ((kv = range_first(res)) == NULL) {
        code = status_set(st, DC_NOT_FOUND, "etcd: no key %s", key);
    } else {
        code = kv_from_json(kv, out, st);
    }
    cJSON_Delete(res);
    return code;
}

dc_code
etcd_put_guarded(struct etcd *e, const char *key, const void *value, size_t len, const char *guard,
                 int64_t guard_rev, dc_status *st)
{
    cJSON *req, *res = NULL;
    dc_code code;

    if (len > ETCD_MAX_VALUE) {
        return status_set(st, DC_RESOURCE_EXHAUSTED, "etcd: a value of %zu bytes is over %u", len,
                          ETCD_MAX_VALUE);
    }
    if ((req = txn_new(txn_compare_create(guard, guard_rev), txn_put(key, value, len, 0), NULL)) ==
        NULL) {
        return oom(NULL, st);
    }
    code = post(e, "/v3/kv/txn", req, &res, st);
    cJSON_Delete(req);
    if (code == DC_OK && !cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(res, "succeeded"))) {
        code = status_set(st, DC_FAILED_PRECONDITION,
                          "not written: this coordinator no longer leads (term %" PRId64 ")",
                          guard_rev);
    }
    cJSON_Delete(res);
    return code;
}
