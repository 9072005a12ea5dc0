/*
 * A small client of etcd's v3 JSON gateway (POST /v3/..., keys and values base64): what
 * the coordinator's election (ha.c) and its operator intent in etcd need, and no more.
 *
 * HTTP goes through nng's HTTP client, one connection per request (etcd is local to the
 * cluster; a connect costs well under a millisecond next to a raft round), TLS when the
 * endpoint is https:// (state.ca verifies the server). Every request has one deadline for
 * its connect, write and read; a response body is read only up to ETCD_MAX_RESPONSE bytes
 * (Content-Length or chunked, which the gateway's streaming keepalive uses) and parsed with
 * cJSON. A failed endpoint makes the next request start at the next endpoint of the list.
 *
 * With state.username, the first request authenticates (POST /v3/auth/authenticate with the
 * password from state.password_file) and every request carries the token in the
 * Authorization header; a request refused for its token (it expired, or etcd restarted and
 * forgot it) authenticates again once and is sent again.
 *
 * Calls block: they run on the election thread and on server threads (a cordon's write),
 * never on an nng callback.
 */
#ifndef DEVCOORD_COORDINATOR_ETCD_H
#define DEVCOORD_COORDINATOR_ETCD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "status.h"

#define ETCD_MAX_RESPONSE  (1u << 20) /* bytes of one response body */
#define ETCD_MAX_VALUE     (512u << 10)
#define ETCD_MAX_ENDPOINTS 8

struct etcd;

/* From cfg (config state:): endpoints "http://h:p,https://h:p"; ca, a PEM file that verifies
 * https:// endpoints (NULL: https:// is refused); cert and key, the client certificate for
 * etcd's --client-cert-auth; username and password_file, etcd auth (the password is read
 * here, once). timeout_ms bounds each request. */
dc_code etcd_open(const struct config_state *cfg, uint32_t timeout_ms, struct etcd **out,
                  dc_status *st);
void etcd_free(struct etcd *e);

/* A lease of ttl_s seconds; *granted_s is what etcd granted (it may round up). */
dc_code etcd_lease_grant(struct etcd *e, int64_t ttl_s, int64_t *id, int64_t *granted_s,
                         dc_status *st);
/* Renews the lease; *ttl_s 0 when etcd no longer has it (expired or revoked). */
dc_code etcd_lease_keepalive(struct etcd *e, int64_t id, int64_t *ttl_s, dc_status *st);
dc_code etcd_lease_revoke(struct etcd *e, int64_t id, dc_status *st);

/* A key as etcd holds it; value is NUL-terminated, malloc'd. */
struct etcd_kv {
    char *value;
    size_t len;
    int64_t create_revision;
    int64_t lease;
};

void etcd_kv_clear(struct etcd_kv *kv);

/* Puts key = value attached to lease if the key does not exist (create_revision == 0):
 * *won true, and out->create_revision is the revision of the put. Otherwise *won false and
 * out holds the key as it is (out->create_revision 0 when it vanished in between). */
dc_code etcd_create(struct etcd *e, const char *key, const char *value, int64_t lease, bool *won,
                    struct etcd_kv *out, dc_status *st);

/* The key's value; DC_NOT_FOUND when it does not exist. */
dc_code etcd_get(struct etcd *e, const char *key, struct etcd_kv *out, dc_status *st);

/* Puts key = value only while guard's create_revision is guard_rev (the writer still
 * holds the leadership it had): DC_FAILED_PRECONDITION when it is not. */
dc_code etcd_put_guarded(struct etcd *e, const char *key, const void *value, size_t len,
                         const char *guard, int64_t guard_rev, dc_status *st);

/* An HTTP/1.1 chunked body decoded in place as it comes: buf[0, out) is decoded, raw bytes
 * resume at buf[in]. Zero before the first call. */
struct etcd_dechunk {
    size_t in, out;
    bool trailers; /* past the last chunk: in is a trailer line's start */
};

/* Decodes buf[0, n), of which an earlier call with the same d saw a prefix, as far as whole
 * chunks go. 1: complete (d->out bytes), 0: more bytes needed, -1: malformed. */
int etcd_dechunk_more(char *buf, size_t n, struct etcd_dechunk *d);

/* Exposed for unit tests: decodes a whole chunked body in place. 1: complete (*len is the
 * decoded length), 0: more bytes needed, -1: malformed. */
int etcd_dechunk(char *buf, size_t *len);

#endif
