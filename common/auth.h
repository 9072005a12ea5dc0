/*
 * Bearer-token authentication and roles (design §8). A tokens file maps each token to a
 * role (roles worker, trainer, operator) and a worker token to the worker names it may
 * register; every call names the roles that may make it. Tokens are compared in constant
 * time and never logged. Also: TLS configurations for listeners and dialers from PEM files,
 * and the random bytes and constant-time comparison the registry's session secrets use.
 */
#ifndef DEVCOORD_COMMON_AUTH_H
#define DEVCOORD_COMMON_AUTH_H

#include <stdbool.h>
#include <stddef.h>

#include <nng/nng.h>
#include <nng/supplemental/tls/tls.h>
#include <protobuf-c/protobuf-c.h>

#include "config.h"
#include "status.h"

enum auth_role {
    ROLE_NONE     = 0,
    ROLE_WORKER   = 1 << 0,
    ROLE_TRAINER  = 1 << 1,
    ROLE_OPERATOR = 1 << 2,
    ROLE_ANY      = ROLE_WORKER | ROLE_TRAINER | ROLE_OPERATOR,
};

#define AUTH_TOKEN_MAX 512
/* Bytes of the session secret a worker's registration gets (RegisterWorkerResponse). */
#define AUTH_SESSION_SECRET_SIZE 32

/* Which roles may call a method (by its name in the service descriptor). */
struct auth_rule {
    const char *method;
    unsigned roles;
};

struct auth;

/* Loads a tokens file, in either of two forms. Errors name file:line:column.
 *
 *   token-1: trainer                 # a mapping of token to role; a worker token in this
 *   token-2: worker                  # form may register any worker name
 *
 *   - {token: token-1, role: trainer}
 *   - {token: token-2, role: worker, names: [wa, wb]}   # may register wa and wb only
 *   - {token: token-3, role: worker, names: []}         # may register no worker
 *
 * In the second form, a worker entry without names may register any name, as in the first.
 * Caller frees with auth_free. */
dc_code auth_load(const char *path, struct auth **out, dc_status *st);
dc_code auth_parse(const char *name, const char *data, size_t len, struct auth **out,
                   dc_status *st);
/* A loaded table is reference counted: auth_hold takes one more reference (returns a),
 * auth_free drops one and frees the table with the last. A load returns one reference. */
struct auth *auth_hold(struct auth *a);
void auth_free(struct auth *a);

/* The table a daemon checks calls against, replaced as a whole when its tokens file is
 * reloaded (SIGHUP) while RPC threads keep checking: a reader takes a reference under a
 * mutex held only for that (auth_current_get, released with auth_free), so a swap never
 * frees a table a check still reads; the old table goes with its last reader. */
struct auth_current;

/* Takes over the reference to a. */
dc_code auth_current_new(struct auth *a, struct auth_current **out, dc_status *st);
struct auth *auth_current_get(struct auth_current *c);
/* Takes over the reference to a and drops the one to the table it replaces. */
void auth_current_set(struct auth_current *c, struct auth *a);
void auth_current_free(struct auth_current *c);
/* auth_check and auth_worker_may_be against the current table. */
dc_code auth_current_check(struct auth_current *c, const struct auth_rule *rules, size_t n_rules,
                           const ProtobufCMethodDescriptor *method, const char *token,
                           dc_status *st);
bool auth_current_worker_may_be(struct auth_current *c, const char *token, const char *name);

/* The role of token, ROLE_NONE when unknown. Time depends on the token's length and on
 * whether it is known, not on how much of it matches a known token. */
enum auth_role auth_role_of(const struct auth *a, const char *token);

/* Whether token is a worker token that may register as worker `name`: its entry names it,
 * or names no workers at all (the `token: role` form). */
bool auth_worker_may_be(const struct auth *a, const char *token, const char *name);

/* A token holding `role` (the first in the file), or NULL. */
const char *auth_token_with(const struct auth *a, enum auth_role role);

/* UNAUTHENTICATED without a known token, PERMISSION_DENIED when its role may not call the
 * method (methods missing from rules are refused). */
dc_code auth_check(const struct auth *a, const struct auth_rule *rules, size_t n_rules,
                   const ProtobufCMethodDescriptor *method, const char *token, dc_status *st);

/* Fills buf with len bytes from the kernel's random generator (getrandom(2)). */
dc_code auth_random_bytes(void *buf, size_t len, dc_status *st);

/* Equal bytes, without an early exit: the time depends on the lengths only. */
bool auth_equal(const void *a, size_t alen, const void *b, size_t blen);

/* The first line of a token file, without surrounding blanks; caller frees. */
dc_code auth_read_token_file(const char *path, char **out, dc_status *st);

/* TLS configuration for a listener (cert and key required; ca needed to verify clients
 * when require_client_cert) or a dialer (ca verifies the server; cert+key, when given, are
 * the client certificate; server_name checked against the server's certificate). Caller
 * frees with nng_tls_config_free. */
dc_code auth_tls_server(const struct config_tls *tls, nng_tls_config **out, dc_status *st);
dc_code auth_tls_client(const char *ca, const char *cert, const char *key, const char *server_name,
                        nng_tls_config **out, dc_status *st);
/* The same for a raw link (dlsock.h, dltls.h): the mbedTLS configuration its plain sockets
 * use, holding the nng one (for a host given by name) made by the calls above from the same
 * files. Caller frees with dltls_free. */
struct dltls;
dc_code auth_dltls_server(const struct config_tls *tls, struct dltls **out, dc_status *st);
dc_code auth_dltls_client(const char *ca, const char *cert, const char *key,
                          const char *server_name, struct dltls **out, dc_status *st);

struct rpc_client;

/* Opens an RPC client to url carrying token (may be NULL), with TLS from tls when url is
 * tls+tcp:// (its ca verifies the server, its cert and key are the client certificate). */
dc_code auth_client_open(const char *url, const char *token, const struct config_tls *tls,
                         size_t max_message_bytes, uint32_t reconnect_max_ms,
                         struct rpc_client **out, dc_status *st);

/* auth_client_open, telling on_connection (nng thread, no blocking) when the connection comes
 * up and drops (rpc_client_opts.on_connection). */
dc_code auth_client_open_watched(const char *url, const char *token, const struct config_tls *tls,
                                 size_t max_message_bytes, uint32_t reconnect_max_ms,
                                 void (*on_connection)(void *arg, bool up), void *arg,
                                 struct rpc_client **out, dc_status *st);

/* The host part of a tls+tcp://host:port address, for the server name. */
void auth_url_host(const char *url, char *host, size_t cap);

#endif
