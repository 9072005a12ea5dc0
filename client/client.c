/*
 * libdevcoord's connection, registry and operation calls: each public call builds its wire
 * request, makes one synchronous RPC to the coordinator and copies the reply into the
 * caller's types, checking every string and count that came over the wire.
 */
#include "address.h"
#include "auth.h"
#include "client.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "device.h"
#include "pbwire.h"
#include "rpc_leader.h"
#include "status.h"
#include "text.h"
#include "threadname.h"
#include "wire.h"
#include "clock.h"

#define STR_(x) #x
#define STR(x)  STR_(x)

/* Pages of ListDevices a single listing may take: a guard against a server that never ends
 * its token chain. */
#define LIST_DEVICES_MAX_PAGES 65536
#define PAGE_TOKEN_MAX         4096
#define TOKEN_LINE_MAX         4096

/* A submit waits for the op itself: its deadline is the op's plus this much, so the
 * coordinator's answer (even a DEADLINE_EXCEEDED one) arrives before ours runs out. */
#define SUBMIT_MARGIN_MS 5000u
/* What a submit naming no timeout waits for when the coordinator cannot say its own
 * (limits.op_timeout_ms): the default of that key. */
#define OP_FALLBACK_TIMEOUT_MS 30000u

const char *
dc_version(void)
{
    return STR(DC_VERSION_MAJOR) "." STR(DC_VERSION_MINOR) "." STR(DC_VERSION_PATCH);
}

/* ---- helpers ------------------------------------------------------------------------- */

dc_code
client_copy_field(char *dst, size_t cap, const char *src, const char *what, dc_status *st)
{
    size_t n = src != NULL ? strnlen(src, cap) : 0;

    if (n == cap) {
        dst[0] = '\0';
        return status_set(st, DC_INTERNAL, "malformed reply: %s longer than %zu bytes", what,
                          cap - 1);
    }
    if (n > 0) {
        memcpy(dst, src, n);
    }
    dst[n] = '\0';
    return DC_OK;
}

/* Rewrites st as `prefix: <message>` with a new code; st may be NULL. */
static dc_code
status_recode(dc_status *st, dc_code code, const char *prefix)
{
    status_prefix(st, prefix);
    if (st != NULL) {
        st->code = code;
    }
    return code;
}

/* The most devices a server's first page may announce for the client to allocate at once. */
#define LIST_DEVICES_MAX_TOTAL (4u << 20)

static dc_code
need_client(const dc_client *c, dc_status *st)
{
    if (c == NULL) {
        return status_set(st, DC_INVALID_ARGUMENT, "client is NULL");
    }
    return DC_OK;
}

dc_code
client_coord_call(dc_client *c, unsigned method, const ProtobufCMessage *req, uint32_t timeout_ms,
                  struct rpc_reply *r, dc_status *st)
{
    dc_code code;

    if (c->leader != NULL) {
        return rpc_leader_call(c->leader, COORD_SVC, method, req, timeout_ms, r, st);
    }
    if (method == M_COORDINATOR_SUBMIT_OP &&
        coord_link_call(c, method, req, timeout_ms, r, st, &code)) {
        return code;
    }
    return rpc_call(c->coord, COORD_SVC, method, req, NULL, 0, timeout_ms, r, st);
}

static dc_code
coord_call(dc_client *c, unsigned method, const ProtobufCMessage *req, struct rpc_reply *r,
           dc_status *st)
{
    return client_coord_call(c, method, req, c->timeout_ms, r, st);
}

/* ---- connection ---------------------------------------------------------------------- */

const char *
client_address(const char *address)
{
    const char *env;

    if (address != NULL && address[0] != '\0') {
        return address;
    }
    env = getenv("DEVCOORD_ADDR");
    if (env != NULL && env[0] != '\0') {
        return env;
    }
    return CLIENT_DEFAULT_ADDR;
}

/* The first line of `path` without its line end and surrounding blanks. */
static dc_code
token_from_file(const char *path, char **out, dc_status *st)
{
    FILE *f   = fopen(path, "r");
    char *buf = NULL;
    size_t len, start = 0;
    int ch;
    dc_code code = DC_OK;

    if (f == NULL) {
        char err[128];
        strerror_r(errno, err, sizeof(err));
        return status_set(st, DC_INVALID_ARGUMENT, "cannot read token file '%s': %s", path, err);
    }
    if ((buf = malloc(TOKEN_LINE_MAX + 1)) == NULL) {
        code = status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    len = 0;
    while ((ch = fgetc(f)) != EOF && ch != '\n') {
        if (len == TOKEN_LINE_MAX) {
            code = status_set(st, DC_INVALID_ARGUMENT,
                              "token file '%s': first line longer than %d bytes", path,
                              TOKEN_LINE_MAX);
            goto out;
        }
        buf[len++] = (char)ch;
    }
    if (ferror(f)) {
        code = status_set(st, DC_INVALID_ARGUMENT, "cannot read token file '%s'", path);
        goto out;
    }
    while (len > 0 && (buf[len - 1] == '\r' || buf[len - 1] == ' ' || buf[len - 1] == '\t')) {
        len--;
    }
    while (start < len && (buf[start] == ' ' || buf[start] == '\t')) {
        start++;
    }
    if (start == len) {
        code = status_set(st, DC_INVALID_ARGUMENT, "token file '%s' has no token on its first line",
                          path);
        goto out;
    }
    memmove(buf, buf + start, len - start);
    buf[len - start] = '\0';
    *out             = buf;
    buf              = NULL;
out:
    free(buf);
    fclose(f);
    return code;
}

/* The token, from the first of: opts->token, opts->token_file, $DEVCOORD_TOKEN (the token
 * itself), $DEVCOORD_TOKEN_FILE (a file holding it); none of them: no token. */
static dc_code
client_token(const dc_client_options *opts, char **out, dc_status *st)
{
    const char *env;

    *out = NULL;
    if (opts != NULL && opts->token != NULL) {
        if ((*out = strdup(opts->token)) == NULL) {
            return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
        }
        return DC_OK;
    }
    if (opts != NULL && opts->token_file != NULL) {
        return token_from_file(opts->token_file, out, st);
    }
    env = getenv("DEVCOORD_TOKEN");
    if (env != NULL && env[0] != '\0') {
        if ((*out = strdup(env)) == NULL) {
            return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
        }
        return DC_OK;
    }
    env = getenv("DEVCOORD_TOKEN_FILE");
    if (env != NULL && env[0] != '\0') {
        dc_code code = token_from_file(env, out, st);
        if (code != DC_OK) {
            status_prefix(st, "$DEVCOORD_TOKEN_FILE");
        }
        return code;
    }
    return DC_OK;
}

static void
client_free_options(dc_client *c)
{
    free(c->token);
    free(c->tls_ca);
    free(c->tls_cert);
    free(c->tls_key);
    free(c->tls_server_name);
}

/* Keeps copies of the TLS files, for the coordinator and every worker dialed later. */
static dc_code
client_tls_options(dc_client *c, const dc_client_options *opts, dc_status *st)
{
    const char *const src[] = { opts ? opts->tls_ca : NULL, opts ? opts->tls_cert : NULL,
                                opts ? opts->tls_key : NULL, opts ? opts->tls_server_name : NULL };
    char **const dst[] = { &c->tls_ca, &c->tls_cert, &c->tls_key, &c->tls_server_name };

    for (size_t i = 0; i < 4; i++) {
        if (src[i] != NULL && (*dst[i] = strdup(src[i])) == NULL) {
            return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
        }
    }
    return DC_OK;
}

/* What opening a connection needs besides its address. */
struct dial_spec {
    const char *url, *token, *tls_ca, *tls_cert, *tls_key, *tls_server_name;
};

/* An RPC client as spec says, with TLS for tls+tcp:// addresses. */
static dc_code
rpc_open_spec(const struct dial_spec *d, bool connect_now, struct rpc_client **out, dc_status *st)
{
    struct rpc_client_opts ro = { .url = d->url, .connect_now = connect_now, .token = d->token };
    nng_tls_config *tls       = NULL;
    char host[256];
    dc_code code;

    if (strncmp(d->url, "tls+", 4) == 0) {
        auth_url_host(d->url, host, sizeof(host));
        if ((code = auth_tls_client(d->tls_ca, d->tls_cert, d->tls_key,
                                    d->tls_server_name != NULL ? d->tls_server_name : host, &tls,
                                    st)) != DC_OK) {
            return code;
        }
        ro.tls = tls;
    }
    code = rpc_client_open(&ro, out, st);
    if (tls != NULL) {
        nng_tls_config_free(tls);
    }
    if (code == DC_INVALID_ARGUMENT && address_problem(d->url) == NULL) {
        /* The address is well formed (the coordinator checked a worker's when it
         * registered, dc_client_open the caller's), so nng refusing it means its host does
         * not resolve: the server cannot be reached from here, which is not the caller's
         * mistake in writing it. */
        auth_url_host(d->url, host, sizeof(host));
        code = status_set(st, DC_UNAVAILABLE,
                          "cannot reach %s: host '%s' does not resolve from here", d->url, host);
        if (st != NULL) {
            st->transport = true;
        }
    }
    return code;
}

/*
 * A connection made now, within the handle's call deadline. nng's blocking dial waits up to
 * its own fixed 10 s for a peer that accepts the TCP connection but never completes the
 * handshake (a stopped process), so the dial runs on a thread of its own and the caller
 * waits only its deadline. A caller that gives up leaves the thread to close what it
 * eventually opens and to free the job: whichever of the two finishes last frees it.
 */
struct dial_job {
    pthread_mutex_t mtx;
    pthread_cond_t cv;
    bool done, abandoned;
    struct dial_spec spec; /* points into strings */
    char *strings[6];      /* copies: the caller's handle may be gone when the dial ends */
    struct rpc_client *rpc;
    dc_code code;
    dc_status st;
};

static void
dial_job_free(struct dial_job *j)
{
    for (size_t i = 0; i < 6; i++) {
        free(j->strings[i]);
    }
    pthread_cond_destroy(&j->cv);
    pthread_mutex_destroy(&j->mtx);
    free(j);
}

static void *
dial_run(void *arg)
{
    struct dial_job *j     = arg;
    struct rpc_client *rpc = NULL;
    dc_status st;
    dc_code code;
    bool abandoned;

    thread_name_set("dc-dial");
    status_clear(&st); /* copied to the caller's whatever the outcome */
    code = rpc_open_spec(&j->spec, true, &rpc, &st);
    pthread_mutex_lock(&j->mtx);
    abandoned = j->abandoned;
    if (!abandoned) {
        j->rpc  = rpc;
        j->code = code;
        j->st   = st;
        j->done = true;
        pthread_cond_signal(&j->cv);
    }
    pthread_mutex_unlock(&j->mtx);
    if (abandoned) {
        rpc_client_close(rpc);
        dial_job_free(j);
    }
    return NULL;
}

static struct dial_job *
dial_job_new(const struct dial_spec *d)
{
    const char *src[6] = {
        d->url, d->token, d->tls_ca, d->tls_cert, d->tls_key, d->tls_server_name
    };
    struct dial_job *j = calloc(1, sizeof(*j));
    pthread_condattr_t ca;

    if (j == NULL) {
        return NULL;
    }
    pthread_mutex_init(&j->mtx, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&j->cv, &ca);
    pthread_condattr_destroy(&ca);
    for (size_t i = 0; i < 6; i++) {
        if (src[i] != NULL && (j->strings[i] = strdup(src[i])) == NULL) {
            dial_job_free(j);
            return NULL;
        }
    }
    j->spec = (struct dial_spec){ .url             = j->strings[0],
                                  .token           = j->strings[1],
                                  .tls_ca          = j->strings[2],
                                  .tls_cert        = j->strings[3],
                                  .tls_key         = j->strings[4],
                                  .tls_server_name = j->strings[5] };
    return j;
}

static dc_code
dial_bounded(const struct dial_spec *d, uint32_t timeout_ms, struct rpc_client **out, dc_status *st)
{
    struct dial_job *j = dial_job_new(d);
    struct timespec deadline;
    pthread_attr_t attr;
    pthread_t thread;
    int rv = 0;
    dc_code code;

    if (j == NULL) {
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
    }
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    rv = pthread_create(&thread, &attr, dial_run, j);
    pthread_attr_destroy(&attr);
    if (rv != 0) {
        dial_job_free(j);
        return rpc_open_spec(d, true, out, st); /* no thread to spare: nng's bound, then */
    }
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    deadline.tv_sec += (time_t)(timeout_ms / 1000);
    deadline.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (deadline.tv_nsec >= 1000000000L) {
        deadline.tv_sec++;
        deadline.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&j->mtx);
    while (!j->done && rv != ETIMEDOUT) {
        rv = pthread_cond_timedwait(&j->cv, &j->mtx, &deadline);
    }
    if (!j->done) {
        j->abandoned = true;
        pthread_mutex_unlock(&j->mtx);
        code = status_set(st, DC_DEADLINE_EXCEEDED, "cannot reach %s: no answer within %u ms",
                          d->url, timeout_ms);
        if (st != NULL) {
            st->transport = true;
        }
        return code;
    }
    pthread_mutex_unlock(&j->mtx);
    *out = j->rpc;
    code = j->code;
    if (st != NULL) {
        *st = j->st;
    }
    dial_job_free(j);
    return code;
}

/* An RPC client to url with the handle's token and TLS files; connected before returning
 * when connect_now, within the handle's call deadline. */
static dc_code
client_rpc_open(dc_client *c, const char *url, bool connect_now, struct rpc_client **out,
                dc_status *st)
{
    struct dial_spec d = { .url             = url,
                           .token           = c->token,
                           .tls_ca          = c->tls_ca,
                           .tls_cert        = c->tls_cert,
                           .tls_key         = c->tls_key,
                           .tls_server_name = c->tls_server_name };

    return connect_now ? dial_bounded(&d, c->timeout_ms, out, st)
                       : rpc_open_spec(&d, false, out, st);
}

static dc_code
client_leader_open(void *arg, const char *url, struct rpc_client **out, dc_status *st)
{
    return client_rpc_open(arg, url, false, out, st);
}

/* "a,b,c" with each address as dc_client_open takes one (HOST:PORT is tcp://), into out. */
static dc_code
client_address_list(const char *addr, char *out, size_t cap, dc_status *st)
{
    char buf[RPC_LEADER_MAX * (CLIENT_ADDRESS_MAX + 1)];
    const char *list[RPC_LEADER_MAX];
    size_t n   = address_split_list(addr, buf, sizeof(buf), list, RPC_LEADER_MAX);
    size_t len = 0;

    if (n == 0) {
        return status_set(st, DC_INVALID_ARGUMENT, "bad address list '%.64s': 1 to %d addresses",
                          addr, RPC_LEADER_MAX);
    }
    out[0] = '\0';
    for (size_t i = 0; i < n; i++) {
        const char *one = list[i], *problem;
        char url[CLIENT_ADDRESS_MAX + 8];

        if (strstr(one, "://") == NULL) {
            snprintf(url, sizeof(url), "tcp://%.*s", CLIENT_ADDRESS_MAX, one);
            one = url;
        }
        if ((problem = address_problem(one)) != NULL) {
            return status_set(st, DC_INVALID_ARGUMENT, "bad address '%.64s': %s", one, problem);
        }
        len += (size_t)snprintf(out + len, cap - len, "%s%s", i > 0 ? "," : "", one);
    }
    return DC_OK;
}

dc_code
dc_client_open(const char *address, const dc_client_options *opts, dc_client **out, dc_status *st)
{
    const char *addr = client_address(address);
    bool several     = strchr(addr, ',') != NULL; /* coordinators: follow their leader */
    char url[CLIENT_ADDRESS_MAX + 8];
    char list[RPC_LEADER_MAX * (CLIENT_ADDRESS_MAX + 8)];
    const char *problem;
    dc_client *c = NULL;
    dc_code code;

    status_clear(st);
    if (out == NULL) {
        return status_set(st, DC_INVALID_ARGUMENT, "out is NULL");
    }
    *out = NULL;
    if (several) {
        if (strlen(addr) >= RPC_LEADER_MAX * (CLIENT_ADDRESS_MAX + 1)) {
            return status_set(st, DC_INVALID_ARGUMENT, "address list too long");
        }
        if ((code = client_address_list(addr, list, sizeof(list), st)) != DC_OK) {
            return code;
        }
    } else {
        if (strlen(addr) > CLIENT_ADDRESS_MAX) {
            return status_set(st, DC_INVALID_ARGUMENT, "address longer than %d bytes",
                              CLIENT_ADDRESS_MAX);
        }
        /* HOST:PORT without a scheme is TCP, as people write it. */
        if (strstr(addr, "://") == NULL) {
            snprintf(url, sizeof(url), "tcp://%s", addr);
            addr = url;
        }
        if ((problem = address_problem(addr)) != NULL) {
            return status_set(st, DC_INVALID_ARGUMENT, "bad address '%s': %s", addr, problem);
        }
    }
    if ((c = calloc(1, sizeof(*c))) == NULL) {
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
    }
    pthread_mutex_init(&c->mtx, NULL);
    clock_cond_init(&c->conn_cv);
    c->timeout_ms =
        (opts != NULL && opts->timeout_ms != 0) ? opts->timeout_ms : CLIENT_DEFAULT_TIMEOUT_MS;
    if ((code = client_token(opts, &c->token, st)) != DC_OK ||
        (code = client_tls_options(c, opts, st)) != DC_OK ||
        (code = several ? rpc_leader_new(list, client_leader_open, c, &c->leader, st)
                        : client_rpc_open(c, addr, opts != NULL && opts->fail_fast, &c->coord,
                                          st)) != DC_OK ||
        (!several && (code = coord_link_new(c, addr, st)) != DC_OK)) {
        goto fail;
    }
    if (!several) {
        snprintf(c->coord_url, sizeof(c->coord_url), "%s", addr);
    }
    *out = c;
    return DC_OK;
fail:
    rpc_client_close(c->coord);
    client_free_options(c);
    pthread_cond_destroy(&c->conn_cv);
    pthread_mutex_destroy(&c->mtx);
    free(c);
    return code;
}

void
dc_client_close(dc_client *c)
{
    if (c == NULL) {
        return;
    }
    for (size_t i = 0; i < c->n_workers; i++) {
        rpc_client_close(c->workers[i]->rpc);
        free(c->workers[i]);
    }
    free(c->workers);
    coord_link_free(c);
    rpc_client_close(c->coord);
    rpc_leader_free(c->leader);
    client_free_options(c);
    pthread_cond_destroy(&c->conn_cv);
    pthread_mutex_destroy(&c->mtx);
    free(c);
}

static struct worker_conn *
worker_conn_find(dc_client *c, const char *address)
{
    for (size_t i = 0; i < c->n_workers; i++) {
        if (strcmp(c->workers[i]->address, address) == 0) {
            return c->workers[i];
        }
    }
    return NULL;
}

dc_code
client_worker_conn(dc_client *c, const char *address, struct worker_conn **out, dc_status *st)
{
    struct worker_conn *w;
    struct rpc_client *rpc = NULL;
    dc_code code;

    if (strlen(address) > CLIENT_ADDRESS_MAX) {
        return status_set(st, DC_INTERNAL, "worker address longer than %d bytes",
                          CLIENT_ADDRESS_MAX);
    }
    pthread_mutex_lock(&c->mtx);
    /* One dial per worker: the others wait for it. Two connections, one closed at once, would
     * close a socket nng 1.5.2 may still be setting up, and that close can hang. */
    while ((w = worker_conn_find(c, address)) != NULL && w->rpc == NULL) {
        pthread_cond_wait(&c->conn_cv, &c->mtx);
    }
    if (w != NULL) {
        pthread_mutex_unlock(&c->mtx);
        *out = w;
        return DC_OK;
    }
    if (c->n_workers == c->cap_workers) {
        size_t cap                = c->cap_workers ? c->cap_workers * 2 : 4;
        struct worker_conn **grow = realloc(c->workers, cap * sizeof(*grow));
        if (grow == NULL) {
            pthread_mutex_unlock(&c->mtx);
            return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
        }
        c->workers     = grow;
        c->cap_workers = cap;
    }
    if ((w = calloc(1, sizeof(*w))) == NULL) {
        pthread_mutex_unlock(&c->mtx);
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
    }
    snprintf(w->address, sizeof(w->address), "%s", address);
    atomic_init(&w->chunk, TENSOR_CHUNK_MAX);
    c->workers[c->n_workers++] = w; /* dialing (rpc NULL): found, waited for */
    pthread_mutex_unlock(&c->mtx);
    /* Dial without the lock: a slow or dead worker must not hold up calls to the others. */
    code = client_rpc_open(c, address, true, &rpc, st);
    pthread_mutex_lock(&c->mtx);
    if (code == DC_OK) {
        w->rpc = rpc;
    } else {
        for (size_t i = 0; i < c->n_workers; i++) {
            if (c->workers[i] == w) {
                c->workers[i] = c->workers[--c->n_workers];
                break;
            }
        }
        free(w);
        w = NULL;
    }
    pthread_cond_broadcast(&c->conn_cv);
    pthread_mutex_unlock(&c->mtx);
    *out = w;
    return code;
}

/* ---- registry ------------------------------------------------------------------------ */

void
dc_worker_info_clear(dc_worker_info *w)
{
    if (w == NULL) {
        return;
    }
    for (size_t i = 0; i < w->n_labels; i++) {
        free(w->labels[i].key);
        free(w->labels[i].value);
    }
    free(w->labels);
    memset(w, 0, sizeof(*w));
}

static dc_code
worker_info_from_pb(const Devcoord__V1__WorkerInfo *pb, dc_worker_info *out, dc_status *st)
{
    dc_code code;

    memset(out, 0, sizeof(*out));
    if (pb == NULL) {
        return status_set(st, DC_INTERNAL, "malformed reply: worker missing");
    }
    if ((code = client_copy_field(out->name, sizeof(out->name), pb->name, "worker name", st)) !=
            DC_OK ||
        (code = client_copy_field(out->address, sizeof(out->address), pb->address, "worker address",
                                  st)) != DC_OK) {
        return code;
    }
    /* The executor name is only shown; a long one may be cut. */
    snprintf(out->executor, sizeof(out->executor), "%s", pb->executor != NULL ? pb->executor : "");
    out->state =
        (unsigned)pb->state < DC_WORKER_STATE_COUNT ? (dc_worker_state)pb->state : DC_WORKER_NONE;
    out->epoch              = pb->epoch;
    out->device_count       = pb->device_count;
    out->since_heartbeat_ms = pb->since_heartbeat_ms;
    out->max_message_bytes  = pb->max_message_bytes;
    if (pb->n_labels > 0) {
        if ((out->labels = calloc(pb->n_labels, sizeof(*out->labels))) == NULL) {
            return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
        }
        for (size_t i = 0; i < pb->n_labels; i++) {
            const Devcoord__V1__Label *l = pb->labels[i];
            if (l == NULL) {
                code = status_set(st, DC_INTERNAL, "malformed reply: label missing");
                goto fail;
            }
            out->labels[i].key   = strdup(l->key != NULL ? l->key : "");
            out->labels[i].value = strdup(l->value != NULL ? l->value : "");
            out->n_labels        = i + 1;
            if (out->labels[i].key == NULL || out->labels[i].value == NULL) {
                code = status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
                goto fail;
            }
        }
    }
    return DC_OK;
fail:
    dc_worker_info_clear(out);
    return code;
}

void
dc_worker_list_free(dc_worker_list *list)
{
    if (list == NULL) {
        return;
    }
    for (size_t i = 0; i < list->n; i++) {
        dc_worker_info_clear(&list->workers[i]);
    }
    free(list->workers);
    free(list);
}

dc_code
dc_list_workers(dc_client *c, dc_worker_list **out, dc_status *st)
{
    static const Devcoord__V1__ListWorkersResponse empty =
        DEVCOORD__V1__LIST_WORKERS_RESPONSE__INIT;
    Devcoord__V1__ListWorkersRequest req = DEVCOORD__V1__LIST_WORKERS_REQUEST__INIT;
    const Devcoord__V1__ListWorkersResponse *resp;
    struct rpc_reply r   = { 0 };
    dc_worker_list *list = NULL;
    dc_code code;

    status_clear(st);
    if (out == NULL) {
        return status_set(st, DC_INVALID_ARGUMENT, "out is NULL");
    }
    *out = NULL;
    if ((code = need_client(c, st)) != DC_OK) {
        return code;
    }
    if ((code = coord_call(c, M_COORDINATOR_LIST_WORKERS, &req.base, &r, st)) != DC_OK) {
        goto out;
    }
    resp = r.body != NULL ? (const Devcoord__V1__ListWorkersResponse *)r.body : &empty;
    if ((list = calloc(1, sizeof(*list))) == NULL ||
        (resp->n_workers > 0 &&
         (list->workers = calloc(resp->n_workers, sizeof(*list->workers))) == NULL)) {
        code = status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < resp->n_workers; i++) {
        if ((code = worker_info_from_pb(resp->workers[i], &list->workers[i], st)) != DC_OK) {
            goto out;
        }
        list->n = i + 1;
    }
    *out = list;
    list = NULL;
out:
    dc_worker_list_free(list);
    rpc_reply_free(&r);
    return code;
}

/* The strings of a device listing, bump-allocated in chunks that never move (records point
 * into them) and freed with the list: one small allocation per 64 KiB of names, not two
 * fixed 320-byte arrays per device. */
#define STR_CHUNK_SIZE 65536

struct str_chunk {
    struct str_chunk *next;
    size_t used, cap;
    char data[];
};

struct device_list_impl {
    dc_device_list pub; /* first: a dc_device_list * is a struct device_list_impl * */
    struct str_chunk *strings;
};

static void
str_chunks_free(struct str_chunk *c)
{
    while (c != NULL) {
        struct str_chunk *next = c->next;
        free(c);
        c = next;
    }
}

/* A copy of s[0..n) in the pool, NUL-terminated; NULL when out of memory. */
static const char *
str_pool_add(struct str_chunk **pool, const char *s, size_t n)
{
    struct str_chunk *c = *pool;
    char *dst;

    if (c == NULL || c->cap - c->used < n + 1) {
        size_t cap = n + 1 > STR_CHUNK_SIZE ? n + 1 : STR_CHUNK_SIZE;
        if ((c = malloc(sizeof(*c) + cap)) == NULL) {
            return NULL;
        }
        c->next = *pool;
        c->used = 0;
        c->cap  = cap;
        *pool   = c;
    }
    dst = c->data + c->used;
    memcpy(dst, s, n);
    dst[n] = '\0';
    c->used += n + 1;
    return dst;
}

/* Fills out from pb, its strings in pool; `prev` (may be NULL) is the record before it, whose
 * worker name is shared when it is the same (listings come grouped by worker). */
static dc_code
device_info_from_pb(const Devcoord__V1__DeviceInfo *pb, const dc_device_info *prev,
                    struct str_chunk **pool, dc_device_info *out, dc_status *st)
{
    char name[DC_DEVICE_TEXT_SIZE];
    size_t wlen, nlen;

    memset(out, 0, sizeof(*out));
    if (pb == NULL) {
        return status_set(st, DC_INTERNAL, "malformed reply: device missing");
    }
    wlen = pb->worker != NULL ? strnlen(pb->worker, DC_WORKER_NAME_MAX + 1) : 0;
    if (wlen > DC_WORKER_NAME_MAX) {
        return status_set(st, DC_INTERNAL, "malformed reply: worker name longer than %d bytes",
                          DC_WORKER_NAME_MAX);
    }
    if (device_from_pb(pb->device, &out->device, st) != DC_OK) {
        return status_recode(st, DC_INTERNAL, "malformed reply");
    }
    nlen = pb->name != NULL ? strnlen(pb->name, DC_DEVICE_TEXT_MAX + 1) : 0;
    if (nlen > DC_DEVICE_TEXT_MAX) {
        return status_set(st, DC_INTERNAL, "malformed reply: device name longer than %d bytes",
                          DC_DEVICE_TEXT_MAX);
    }
    if (prev != NULL && strlen(prev->worker) == wlen &&
        (wlen == 0 || memcmp(prev->worker, pb->worker, wlen) == 0)) {
        out->worker = prev->worker;
    } else if ((out->worker = str_pool_add(pool, wlen > 0 ? pb->worker : "", wlen)) == NULL) {
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
    }
    if (nlen == 0) {
        device_cluster_name(out->worker, &out->device, name, sizeof(name));
        out->name = str_pool_add(pool, name, strlen(name));
    } else {
        out->name = str_pool_add(pool, pb->name, nlen);
    }
    if (out->name == NULL) {
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
    }
    out->state =
        (unsigned)pb->state < DC_DEVICE_STATE_COUNT ? (dc_device_state)pb->state : DC_DEVICE_NONE;
    out->memory_bytes = pb->memory_bytes;
    return DC_OK;
}

void
dc_device_info_clear(dc_device_info *d)
{
    if (d == NULL) {
        return;
    }
    free((char *)d->name); /* dc_get_device: one block, the name first */
    memset(d, 0, sizeof(*d));
}

void
dc_device_list_free(dc_device_list *list)
{
    struct device_list_impl *l = (struct device_list_impl *)list;

    if (l == NULL) {
        return;
    }
    str_chunks_free(l->strings);
    free(l->pub.devices);
    free(l);
}

/* The next page of a listing, fetched on a thread of its own while the caller reads the page
 * before it: the coordinator makes page n + 1 as the client decodes page n. */
struct page_fetch {
    dc_client *c;
    Devcoord__V1__ListDevicesRequest req; /* its page_token is token */
    char token[PAGE_TOKEN_MAX + 1];
    struct rpc_reply r;
    dc_status st;
    dc_code code;
    pthread_t thread;
    bool running;
};

static void *
page_fetch_run(void *arg)
{
    struct page_fetch *f = arg;

    thread_name_set("dc-list");
    status_clear(&f->st);
    f->code =
        coord_call(f->c, M_COORDINATOR_LIST_DEVICES | RPC_RAW_BODY, &f->req.base, &f->r, &f->st);
    return NULL;
}

/* Starts the call for the page after token (at most PAGE_TOKEN_MAX bytes). With no thread to
 * be had, nothing runs (the caller then makes the call itself). */
static void
page_fetch_start(struct page_fetch *f, const char *token)
{
    memcpy(f->token, token, strnlen(token, PAGE_TOKEN_MAX) + 1);
    f->req.page_token = f->token;
    f->running        = pthread_create(&f->thread, NULL, page_fetch_run, f) == 0;
}

/* Waits for the page being fetched, if any, and hands its reply to *r (freeing what r held). */
static dc_code
page_fetch_join(struct page_fetch *f, struct rpc_reply *r, dc_status *st)
{
    if (!f->running) {
        return DC_OK;
    }
    pthread_join(f->thread, NULL);
    f->running = false;
    rpc_reply_free(r);
    *r   = f->r;
    f->r = (struct rpc_reply){ 0 };
    if (f->code != DC_OK && st != NULL) {
        *st = f->st;
    }
    return f->code;
}

dc_code
dc_list_devices(dc_client *c, const dc_device_filter *filter, dc_device_list **out, dc_status *st)
{
    Devcoord__V1__ListDevicesRequest req = DEVCOORD__V1__LIST_DEVICES_REQUEST__INIT;
    struct rpc_reply r                   = { 0 };
    struct device_list_impl *impl        = NULL;
    dc_device_list *list                 = NULL;
    size_t cap                           = 0;
    char page_token[PAGE_TOKEN_MAX + 1]  = "";
    struct page_fetch *fetch             = NULL;
    dc_code code;

    status_clear(st);
    if (out == NULL) {
        return status_set(st, DC_INVALID_ARGUMENT, "out is NULL");
    }
    *out = NULL;
    if ((code = need_client(c, st)) != DC_OK) {
        return code;
    }
    if (filter != NULL) {
        if ((unsigned)filter->backend >= DC_BACKEND_COUNT ||
            (unsigned)filter->state >= DC_DEVICE_STATE_COUNT) {
            return status_set(st, DC_INVALID_ARGUMENT, "filter names an unknown %s",
                              (unsigned)filter->backend >= DC_BACKEND_COUNT ? "backend" : "state");
        }
        req.backend = (Devcoord__V1__Backend)filter->backend;
        req.worker  = (char *)(filter->worker != NULL ? filter->worker : "");
        req.state   = (Devcoord__V1__DeviceState)filter->state;
        req.label   = (char *)(filter->label != NULL ? filter->label : "");
    }
    if ((impl = calloc(1, sizeof(*impl))) == NULL) {
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
    }
    list           = &impl->pub;
    req.page_token = page_token;
    /* The page is read here, by pbwire, straight into the list: a third of the time
     * protobuf-c takes to unpack 32k devices that would then be copied out again. */
    if ((code = coord_call(c, M_COORDINATOR_LIST_DEVICES | RPC_RAW_BODY, &req.base, &r, st)) !=
        DC_OK) {
        goto out;
    }
    for (unsigned page = 0;; page++) {
        struct pbwire_page pg;
        char next[PAGE_TOKEN_MAX + 2];
        const uint8_t *d;
        size_t at = 0, dlen;

        if (!pbwire_scan_page(r.raw_body, r.raw_body_len, &pg)) {
            code = status_set(st, DC_INTERNAL, "malformed reply: undecodable ListDevices page");
            goto out;
        }
        /* The token as protobuf-c would give it (up to a NUL), one byte past its limit. */
        dlen = pg.token_len < sizeof(next) - 1 ? pg.token_len : sizeof(next) - 1;
        if (dlen > 0) {
            memcpy(next, pg.token, dlen);
        }
        next[dlen] = '\0';
        if (next[0] != '\0') {
            if (strnlen(next, PAGE_TOKEN_MAX + 1) > PAGE_TOKEN_MAX ||
                strcmp(page_token, next) == 0) {
                code = status_set(st, DC_INTERNAL, "malformed reply: bad next_page_token");
                goto out;
            }
            if (page + 1 == LIST_DEVICES_MAX_PAGES) {
                code = status_set(st, DC_INTERNAL, "device listing did not end after %d pages",
                                  LIST_DEVICES_MAX_PAGES);
                goto out;
            }
            /* A listing of several pages: the next one is asked for now, while this one is
             * read (a 100k-device listing took a fifth to two fifths less time on 2 cores). */
            if (fetch == NULL && (fetch = calloc(1, sizeof(*fetch))) != NULL) {
                fetch->c   = c;
                fetch->req = req;
            }
            if (fetch != NULL) {
                page_fetch_start(fetch, next);
            }
        }
        /* The first page says how many there are in all: one allocation, no copying. The
         * figure is the server's word: when it cannot be had, the pages grow the array. */
        if (page == 0 && pg.total > pg.n_devices && pg.total <= LIST_DEVICES_MAX_TOTAL &&
            (list->devices = malloc((size_t)pg.total * sizeof(*list->devices))) != NULL) {
            cap = (size_t)pg.total;
        }
        if (pg.n_devices > cap - list->n) {
            size_t want = list->n + pg.n_devices;
            dc_device_info *grow;
            /* Grow geometrically: a 100k-device listing comes in several pages. */
            if (want < 2 * cap && 2 * cap <= SIZE_MAX / sizeof(*grow)) {
                want = 2 * cap;
            }
            if (want < list->n || want > SIZE_MAX / sizeof(*grow) ||
                (grow = realloc(list->devices, want * sizeof(*grow))) == NULL) {
                code = status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
                goto out;
            }
            list->devices = grow;
            cap           = want;
        }
        while (pbwire_next_device(r.raw_body, r.raw_body_len, &at, &d, &dlen)) {
            const dc_device_info *prev = list->n > 0 ? &list->devices[list->n - 1] : NULL;
            char name[DC_DEVICE_TEXT_MAX + 2], worker[DC_WORKER_NAME_MAX + 2];
            Devcoord__V1__DeviceInfo pb;
            Devcoord__V1__Device dev;

            if (!pbwire_read_device_info(d, dlen, &pb, &dev, name, worker)) {
                code = status_set(st, DC_INTERNAL, "malformed reply: undecodable device");
                goto out;
            }
            if ((code = device_info_from_pb(&pb, prev, &impl->strings, &list->devices[list->n],
                                            st)) != DC_OK) {
                goto out;
            }
            list->n++;
        }
        if (next[0] == '\0') {
            break;
        }
        memcpy(page_token, next, strlen(next) + 1);
        if (fetch != NULL && fetch->running) {
            code = page_fetch_join(fetch, &r, st);
        } else {
            rpc_reply_free(&r);
            code = coord_call(c, M_COORDINATOR_LIST_DEVICES | RPC_RAW_BODY, &req.base, &r, st);
        }
        if (code != DC_OK) {
            goto out;
        }
    }
    /* The pages come in registry order already: by worker, then by device. */
    *out = list;
    list = NULL;
out:
    if (fetch != NULL) {
        page_fetch_join(fetch, &r, NULL); /* a page still coming when this one failed */
        free(fetch);
    }
    dc_device_list_free(list);
    rpc_reply_free(&r);
    return code;
}

dc_code
dc_get_device(dc_client *c, const char *name, dc_device_info *out, dc_status *st)
{
    Devcoord__V1__GetDeviceRequest req = DEVCOORD__V1__GET_DEVICE_REQUEST__INIT;
    const Devcoord__V1__GetDeviceResponse *resp;
    struct rpc_reply r     = { 0 };
    struct str_chunk *pool = NULL;
    dc_device_ref ref;
    char canonical[DC_DEVICE_TEXT_SIZE];
    dc_code code;

    status_clear(st);
    if (out == NULL || name == NULL) {
        return status_set(st, DC_INVALID_ARGUMENT, "%s is NULL", out == NULL ? "out" : "name");
    }
    memset(out, 0, sizeof(*out));
    if ((code = need_client(c, st)) != DC_OK) {
        return code;
    }
    /* Parsed here so a typo is refused with the character it failed at, and sent in
     * canonical form ("node-a/cuda" as "node-a/cuda:0"); autodiff(x) is the device x. */
    if ((code = dc_device_ref_parse(name, strlen(name), &ref, st)) != DC_OK) {
        char prefix[DC_DEVICE_TEXT_SIZE + 16];
        snprintf(prefix, sizeof(prefix), "device '%.*s'", DC_DEVICE_TEXT_MAX, name);
        status_prefix(st, prefix);
        return code;
    }
    ref.autodiff_depth = 0;
    dc_device_ref_format(&ref, canonical, sizeof(canonical));
    req.name = canonical;
    if ((code = coord_call(c, M_COORDINATOR_GET_DEVICE, &req.base, &r, st)) != DC_OK) {
        goto out;
    }
    resp = (const Devcoord__V1__GetDeviceResponse *)r.body;
    if (resp == NULL || resp->device == NULL) {
        code = status_set(st, DC_INTERNAL, "malformed reply: GetDevice without a device");
        goto out;
    }
    if ((code = device_info_from_pb(resp->device, NULL, &pool, out, st)) == DC_OK) {
        /* The caller's copy owns its strings in one block: dc_device_info_clear frees it. */
        size_t nlen = strlen(out->name), wlen = strlen(out->worker);
        char *block = malloc(nlen + wlen + 2);
        if (block == NULL) {
            memset(out, 0, sizeof(*out));
            code = status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
            goto out;
        }
        memcpy(block, out->name, nlen + 1);
        memcpy(block + nlen + 1, out->worker, wlen + 1);
        out->name   = block;
        out->worker = block + nlen + 1;
    } else {
        memset(out, 0, sizeof(*out)); /* nothing may point into the pool freed below */
    }
out:
    str_chunks_free(pool);
    rpc_reply_free(&r);
    return code;
}

static dc_code
worker_steer(dc_client *c, unsigned method, const char *name, dc_worker_info *out, dc_status *st)
{
    Devcoord__V1__WorkerNameRequest req = DEVCOORD__V1__WORKER_NAME_REQUEST__INIT;
    const Devcoord__V1__WorkerNameResponse *resp;
    struct rpc_reply r = { 0 };
    dc_code code;

    status_clear(st);
    if (out != NULL) {
        memset(out, 0, sizeof(*out));
    }
    if ((code = need_client(c, st)) != DC_OK) {
        return code;
    }
    if (name == NULL) {
        return status_set(st, DC_INVALID_ARGUMENT, "worker name is NULL");
    }
    req.name = (char *)name;
    if ((code = coord_call(c, method, &req.base, &r, st)) != DC_OK || out == NULL) {
        goto out;
    }
    resp = (const Devcoord__V1__WorkerNameResponse *)r.body;
    if (resp == NULL || resp->worker == NULL) {
        code = status_set(st, DC_INTERNAL, "malformed reply: no worker in the answer");
        goto out;
    }
    code = worker_info_from_pb(resp->worker, out, st);
out:
    rpc_reply_free(&r);
    return code;
}

dc_code
dc_cordon_worker(dc_client *c, const char *name, dc_worker_info *out, dc_status *st)
{
    return worker_steer(c, M_COORDINATOR_CORDON_WORKER, name, out, st);
}

dc_code
dc_uncordon_worker(dc_client *c, const char *name, dc_worker_info *out, dc_status *st)
{
    return worker_steer(c, M_COORDINATOR_UNCORDON_WORKER, name, out, st);
}

dc_code
dc_drain_worker(dc_client *c, const char *name, dc_worker_info *out, dc_status *st)
{
    return worker_steer(c, M_COORDINATOR_DRAIN_WORKER, name, out, st);
}

/* The coordinator's op timeout for a submit that names none: asked once (GetClusterStatus),
 * then kept; OP_FALLBACK_TIMEOUT_MS when it does not say. */
uint32_t
client_op_timeout(dc_client *c)
{
    Devcoord__V1__GetClusterStatusRequest req = DEVCOORD__V1__GET_CLUSTER_STATUS_REQUEST__INIT;
    const Devcoord__V1__GetClusterStatusResponse *resp;
    struct rpc_reply r = { 0 };
    uint32_t ms        = atomic_load(&c->op_timeout_ms);
    dc_status st;

    if (ms != 0) {
        return ms;
    }
    if (coord_call(c, M_COORDINATOR_GET_CLUSTER_STATUS, &req.base, &r, &st) == DC_OK &&
        (resp = (const Devcoord__V1__GetClusterStatusResponse *)r.body) != NULL &&
        resp->op_timeout_ms != 0) {
        ms = resp->op_timeout_ms;
        atomic_store(&c->op_timeout_ms, ms);
    }
    rpc_reply_free(&r);
    return ms != 0 ? ms : OP_FALLBACK_TIMEOUT_MS;
}

dc_code
dc_cluster_status_get(dc_client *c, dc_cluster_status *out, dc_status *st)
{
    static const Devcoord__V1__GetClusterStatusResponse empty =
        DEVCOORD__V1__GET_CLUSTER_STATUS_RESPONSE__INIT;
    Devcoord__V1__GetClusterStatusRequest req = DEVCOORD__V1__GET_CLUSTER_STATUS_REQUEST__INIT;
    const Devcoord__V1__GetClusterStatusResponse *resp;
    struct rpc_reply r = { 0 };
    dc_code code;

    status_clear(st);
    if (out == NULL) {
        return status_set(st, DC_INVALID_ARGUMENT, "out is NULL");
    }
    memset(out, 0, sizeof(*out));
    if ((code = need_client(c, st)) != DC_OK) {
        return code;
    }
    if ((code = coord_call(c, M_COORDINATOR_GET_CLUSTER_STATUS, &req.base, &r, st)) != DC_OK) {
        goto out;
    }
    resp = r.body != NULL ? (const Devcoord__V1__GetClusterStatusResponse *)r.body : &empty;
    out->workers_alive    = resp->workers_alive;
    out->workers_dead     = resp->workers_dead;
    out->workers_cordoned = resp->workers_cordoned;
    out->workers_draining = resp->workers_draining;
    for (size_t i = 0; i < resp->n_devices; i++) {
        const Devcoord__V1__BackendCount *bc = resp->devices[i];
        /* Backends this client does not know of (a newer server) are left out. */
        if (bc != NULL && (unsigned)bc->backend < DC_BACKEND_COUNT) {
            uint32_t *slot = &out->devices_by_backend[bc->backend];
            *slot          = bc->count > UINT32_MAX - *slot ? UINT32_MAX : *slot + bc->count;
        }
    }
    out->ops_in_flight = resp->ops_in_flight;
    out->ops_done      = resp->ops_done;
    out->ops_failed    = resp->ops_failed;
    out->ready         = resp->ready;
out:
    rpc_reply_free(&r);
    return code;
}

dc_code
dc_health(dc_client *c, dc_status *st)
{
    dc_cluster_status cs;
    dc_status local;
    dc_code code;

    if (st == NULL) {
        st = &local; /* the transport flag below decides the answer */
    }
    if ((code = dc_cluster_status_get(c, &cs, st)) != DC_OK) {
        /* For a health check, no answer in time means the coordinator is unavailable. */
        if (st->transport && code == DC_DEADLINE_EXCEEDED) {
            st->code = DC_UNAVAILABLE;
            return DC_UNAVAILABLE;
        }
        return code;
    }
    if (!cs.ready) {
        return status_set(st, DC_UNAVAILABLE, "coordinator not ready");
    }
    return DC_OK;
}

/* ---- operations ---------------------------------------------------------------------- */

static void
op_result_clear(dc_op_result *r)
{
    for (size_t i = 0; i < r->n_plan_workers; i++) {
        free(r->plan_workers[i].ranks);
    }
    free(r->plan_workers);
    free(r->devices);
    free(r->results);
    free(r->waiting_on);
    memset(r, 0, sizeof(*r));
}

void
dc_op_result_free(dc_op_result *r)
{
    if (r == NULL) {
        return;
    }
    op_result_clear(r);
    free(r);
}

void
dc_op_list_free(dc_op_list *list)
{
    if (list == NULL) {
        return;
    }
    for (size_t i = 0; i < list->n; i++) {
        op_result_clear(&list->ops[i]);
    }
    free(list->ops);
    free(list);
}

static dc_code
plan_from_pb(const Devcoord__V1__Plan *pb, dc_op_result *out, dc_status *st)
{
    dc_code code;

    if ((code = client_copy_field(out->group_id, sizeof(out->group_id), pb->group_id,
                                  "plan group id", st)) != DC_OK) {
        return code;
    }
    if (pb->n_devices > 0 &&
        (out->devices = calloc(pb->n_devices, sizeof(*out->devices))) == NULL) {
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
    }
    for (size_t i = 0; i < pb->n_devices; i++) {
        if (device_ref_from_pb(pb->devices[i], &out->devices[i], st) != DC_OK) {
            return status_recode(st, DC_INTERNAL, "malformed reply: plan device");
        }
        out->n_devices = i + 1;
    }
    if (pb->n_workers > 0 &&
        (out->plan_workers = calloc(pb->n_workers, sizeof(*out->plan_workers))) == NULL) {
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
    }
    for (size_t i = 0; i < pb->n_workers; i++) {
        const Devcoord__V1__PlanWorker *w = pb->workers[i];
        dc_plan_worker *pw                = &out->plan_workers[i];

        out->n_plan_workers = i + 1;
        if (w == NULL) {
            return status_set(st, DC_INTERNAL, "malformed reply: plan worker missing");
        }
        if ((code = client_copy_field(pw->name, sizeof(pw->name), w->name, "plan worker name",
                                      st)) != DC_OK ||
            (code = client_copy_field(pw->address, sizeof(pw->address), w->address,
                                      "plan worker address", st)) != DC_OK) {
            return code;
        }
        if (w->n_ranks > 0 && (pw->ranks = calloc(w->n_ranks, sizeof(*pw->ranks))) == NULL) {
            return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
        }
        for (size_t k = 0; k < w->n_ranks; k++) {
            if (w->ranks[k] >= out->n_devices) {
                return status_set(st, DC_INTERNAL,
                                  "malformed reply: plan worker %s has rank %u of %zu devices",
                                  pw->name, w->ranks[k], out->n_devices);
            }
            pw->ranks[k] = w->ranks[k];
        }
        pw->n_ranks = w->n_ranks;
    }
    return DC_OK;
}

/* Fills out from an OpInfo; on failure out holds what was filled so far (clear it). */
static dc_code
op_result_from_pb(const Devcoord__V1__OpInfo *pb, dc_op_result *out, dc_status *st)
{
    dc_code code;

    memset(out, 0, sizeof(*out));
    status_clear(&out->status);
    if ((code = client_copy_field(out->op_id, sizeof(out->op_id), pb->op_id, "op id", st)) !=
            DC_OK ||
        (code = client_copy_field(out->tensor, sizeof(out->tensor), pb->tensor, "tensor name",
                                  st)) != DC_OK ||
        (code = client_copy_field(out->output_tensor, sizeof(out->output_tensor), pb->output_tensor,
                                  "output tensor name", st)) != DC_OK) {
        return code;
    }
    out->kind = (unsigned)pb->kind < DC_OP_COUNT ? (dc_op_kind)pb->kind : DC_OP_NONE;
    out->reduce =
        (unsigned)pb->reduce < DC_REDUCE_COUNT ? (dc_reduce_op)pb->reduce : DC_REDUCE_NONE;
    out->root = pb->root;
    out->state =
        (unsigned)pb->state <= DC_OP_STATE_FAILED ? (dc_op_state)pb->state : DC_OP_STATE_NONE;
    wire_status_from_pb(pb->status, &out->status);
    if (pb->plan != NULL && (code = plan_from_pb(pb->plan, out, st)) != DC_OK) {
        return code;
    }
    if (pb->n_workers > 0 &&
        (out->results = calloc(pb->n_workers, sizeof(*out->results))) == NULL) {
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
    }
    for (size_t i = 0; i < pb->n_workers; i++) {
        const Devcoord__V1__WorkerResult *w = pb->workers[i];
        dc_worker_result *res               = &out->results[i];
        dc_status ws;

        if (w == NULL) {
            return status_set(st, DC_INTERNAL, "malformed reply: worker result missing");
        }
        if ((code = client_copy_field(res->name, sizeof(res->name), w->name, "worker result name",
                                      st)) != DC_OK) {
            return code;
        }
        wire_status_from_pb(w->status, &ws);
        res->code = ws.code;
        snprintf(res->message, sizeof(res->message), "%s", ws.message);
        res->elapsed_us = w->elapsed_us;
        out->n_results  = i + 1;
    }
    if (pb->n_waiting_on > 0 &&
        (out->waiting_on = calloc(pb->n_waiting_on, sizeof(*out->waiting_on))) == NULL) {
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
    }
    for (size_t i = 0; i < pb->n_waiting_on; i++) {
        if ((code = client_copy_field(out->waiting_on[i], sizeof(out->waiting_on[i]),
                                      pb->waiting_on[i], "waiting worker name", st)) != DC_OK) {
            return code;
        }
        out->n_waiting = i + 1;
    }
    out->submitted_unix_ms = pb->submitted_unix_ms;
    out->elapsed_us        = pb->elapsed_us;
    return DC_OK;
}

static dc_code
op_result_new(const Devcoord__V1__OpInfo *pb, dc_op_result **out, dc_status *st)
{
    dc_op_result *r = calloc(1, sizeof(*r));
    dc_code code;

    if (r == NULL) {
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
    }
    if ((code = op_result_from_pb(pb, r, st)) != DC_OK) {
        dc_op_result_free(r);
        return code;
    }
    *out = r;
    return DC_OK;
}

dc_code
dc_submit(dc_client *c, const dc_op_request *req, dc_op_result **out, dc_status *st)
{
    return dc_submit_keyed(c, req, NULL, out, st);
}

dc_code
dc_submit_keyed(dc_client *c, const dc_op_request *req, const char *idempotency_key,
                dc_op_result **out, dc_status *st)
{
    Devcoord__V1__SubmitOpRequest pb = DEVCOORD__V1__SUBMIT_OP_REQUEST__INIT;
    const Devcoord__V1__SubmitOpResponse *resp;
    Devcoord__V1__DeviceRef *refs  = NULL;
    Devcoord__V1__Device *devs     = NULL;
    Devcoord__V1__DeviceRef **ptrs = NULL;
    dc_device_ref *copy            = NULL;
    struct rpc_reply r             = { 0 };
    uint32_t op_ms, call_ms;
    dc_status call_st;
    dc_code code, conv;

    status_clear(st);
    if (out == NULL || req == NULL) {
        return status_set(st, DC_INVALID_ARGUMENT, "%s is NULL", out == NULL ? "out" : "req");
    }
    *out = NULL;
    if ((code = need_client(c, st)) != DC_OK) {
        return code;
    }
    if (req->n_devices > 0 && req->devices == NULL) {
        return status_set(st, DC_INVALID_ARGUMENT, "devices is NULL");
    }
    if (req->n_devices > 0) {
        /* device_ref_to_pb points the message into the refs, which need to be writable. */
        if ((copy = calloc(req->n_devices, sizeof(*copy))) == NULL ||
            (refs = calloc(req->n_devices, sizeof(*refs))) == NULL ||
            (devs = calloc(req->n_devices, sizeof(*devs))) == NULL ||
            (ptrs = calloc(req->n_devices, sizeof(*ptrs))) == NULL) {
            code = status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
            goto out;
        }
        memcpy(copy, req->devices, req->n_devices * sizeof(*copy));
        for (size_t i = 0; i < req->n_devices; i++) {
            copy[i].worker[DC_WORKER_NAME_MAX] = '\0';
            device_ref_to_pb(&copy[i], &refs[i], &devs[i]);
            ptrs[i] = &refs[i];
        }
    }
    pb.kind            = (Devcoord__V1__OpKind)req->kind;
    pb.reduce          = (Devcoord__V1__ReduceOp)req->reduce;
    pb.root            = req->root;
    pb.n_devices       = req->n_devices;
    pb.devices         = ptrs;
    pb.tensor          = (char *)(req->tensor != NULL ? req->tensor : "");
    pb.output_tensor   = (char *)(req->output_tensor != NULL ? req->output_tensor : "");
    pb.dry_run         = req->dry_run;
    pb.timeout_ms      = req->timeout_ms;
    pb.idempotency_key = (char *)(idempotency_key != NULL ? idempotency_key : "");

    op_ms   = req->timeout_ms != 0 ? req->timeout_ms : client_op_timeout(c);
    call_ms = op_ms > UINT32_MAX - SUBMIT_MARGIN_MS ? UINT32_MAX : op_ms + SUBMIT_MARGIN_MS;
    if (call_ms < c->timeout_ms) {
        call_ms = c->timeout_ms;
    }
    code = client_coord_call(c, M_COORDINATOR_SUBMIT_OP, &pb.base, call_ms, &r, &call_st);
    if (st != NULL) {
        *st = call_st;
    }
    resp = (const Devcoord__V1__SubmitOpResponse *)r.body;
    if (resp != NULL && resp->op != NULL) {
        if ((conv = op_result_new(resp->op, out, st)) != DC_OK) {
            code = conv;
            goto out;
        }
        /* The op's own status speaks when the call itself went through. */
        if (code == DC_OK && (*out)->status.code != DC_OK) {
            code = (*out)->status.code;
            if (st != NULL) {
                *st = (*out)->status;
            }
        } else if (code != DC_OK && (*out)->status.code == DC_OK) {
            (*out)->status = call_st;
        }
    } else if (r.msg != NULL) {
        /* The coordinator answered without an op (refused before one existed): the result
         * still tells the caller what it said. */
        if ((*out = calloc(1, sizeof(**out))) == NULL) {
            code = status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
            goto out;
        }
        (*out)->kind   = req->kind;
        (*out)->reduce = req->reduce;
        (*out)->root   = req->root;
        (*out)->status = call_st;
        if (code == DC_OK) {
            code = status_set(&call_st, DC_INTERNAL, "malformed reply: SubmitOp without an op");
            (*out)->status = call_st;
            if (st != NULL) {
                *st = call_st;
            }
        }
    }
out:
    rpc_reply_free(&r);
    free(copy);
    free(refs);
    free(devs);
    free(ptrs);
    return code;
}

dc_code
dc_get_op(dc_client *c, const char *op_id, dc_op_result **out, dc_status *st)
{
    Devcoord__V1__GetOpRequest req = DEVCOORD__V1__GET_OP_REQUEST__INIT;
    const Devcoord__V1__GetOpResponse *resp;
    struct rpc_reply r = { 0 };
    dc_code code;

    status_clear(st);
    if (out == NULL || op_id == NULL) {
        return status_set(st, DC_INVALID_ARGUMENT, "%s is NULL", out == NULL ? "out" : "op_id");
    }
    *out = NULL;
    if ((code = need_client(c, st)) != DC_OK) {
        return code;
    }
    req.op_id = (char *)op_id;
    if ((code = coord_call(c, M_COORDINATOR_GET_OP, &req.base, &r, st)) != DC_OK) {
        goto out;
    }
    resp = (const Devcoord__V1__GetOpResponse *)r.body;
    if (resp == NULL || resp->op == NULL) {
        code = status_set(st, DC_INTERNAL, "malformed reply: GetOp without an op");
        goto out;
    }
    code = op_result_new(resp->op, out, st);
out:
    rpc_reply_free(&r);
    return code;
}

dc_code
dc_list_ops(dc_client *c, uint32_t limit, dc_op_list **out, dc_status *st)
{
    static const Devcoord__V1__ListOpsResponse empty = DEVCOORD__V1__LIST_OPS_RESPONSE__INIT;
    Devcoord__V1__ListOpsRequest req                 = DEVCOORD__V1__LIST_OPS_REQUEST__INIT;
    const Devcoord__V1__ListOpsResponse *resp;
    struct rpc_reply r = { 0 };
    dc_op_list *list   = NULL;
    dc_code code;

    status_clear(st);
    if (out == NULL) {
        return status_set(st, DC_INVALID_ARGUMENT, "out is NULL");
    }
    *out = NULL;
    if ((code = need_client(c, st)) != DC_OK) {
        return code;
    }
    req.limit = limit;
    if ((code = coord_call(c, M_COORDINATOR_LIST_OPS, &req.base, &r, st)) != DC_OK) {
        goto out;
    }
    resp = r.body != NULL ? (const Devcoord__V1__ListOpsResponse *)r.body : &empty;
    if ((list = calloc(1, sizeof(*list))) == NULL ||
        (resp->n_ops > 0 && (list->ops = calloc(resp->n_ops, sizeof(*list->ops))) == NULL)) {
        code = status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < resp->n_ops; i++) {
        if (resp->ops[i] == NULL) {
            code = status_set(st, DC_INTERNAL, "malformed reply: op missing");
            goto out;
        }
        /* Counted before filling so a half-filled entry is freed with the list. */
        list->n = i + 1;
        if ((code = op_result_from_pb(resp->ops[i], &list->ops[i], st)) != DC_OK) {
            goto out;
        }
    }
    *out = list;
    list = NULL;
out:
    dc_op_list_free(list);
    rpc_reply_free(&r);
    return code;
}

/* ---- device lists -------------------------------------------------------------------- */

dc_code
dc_device_list_parse(const char *text, dc_device_ref **out, size_t *n, dc_status *st)
{
    dc_device_ref *refs = NULL;
    size_t count = 1, i = 0, len;
    const char *p;
    dc_code code;

    status_clear(st);
    if (text == NULL || out == NULL || n == NULL) {
        return status_set(st, DC_INVALID_ARGUMENT, "NULL argument");
    }
    *out = NULL;
    *n   = 0;
    len  = strlen(text);
    for (p = text; *p != '\0' && text_is_blank(*p); p++) {
    }
    if (*p == '\0') {
        /* No devices at all: the coordinator refuses that itself ("empty device list"). */
        if ((*out = calloc(1, sizeof(**out))) == NULL) {
            return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
        }
        return DC_OK;
    }
    for (p = text; (p = memchr(p, ',', len - (size_t)(p - text))) != NULL; p++) {
        count++;
    }
    if ((refs = calloc(count, sizeof(*refs))) == NULL) {
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
    }
    for (p = text; i < count; i++) {
        const char *end = memchr(p, ',', len - (size_t)(p - text));
        const char *e   = end != NULL ? end : text + len;
        const char *b   = p;

        text_trim(&b, &e);
        if ((code = dc_device_ref_parse(b, (size_t)(e - b), &refs[i], st)) != DC_OK) {
            char prefix[DC_DEVICE_TEXT_MAX + 64];
            size_t elen = (size_t)(e - b);
            int shown   = elen > DC_DEVICE_TEXT_MAX ? DC_DEVICE_TEXT_MAX : (int)elen;
            snprintf(prefix, sizeof(prefix), "devices[%zu] = '%.*s%s'", i, shown, b,
                     elen > DC_DEVICE_TEXT_MAX ? "..." : "");
            status_prefix(st, prefix);
            if (st != NULL) {
                st->device_index = i <= INT32_MAX ? (int32_t)i : -1;
            }
            free(refs);
            return code;
        }
        if (end != NULL) {
            p = end + 1;
        }
    }
    *out = refs;
    *n   = count;
    return DC_OK;
}
