/*
 * TLS for the raw links (dlsock.h) on plain sockets: OpenSSL driven on the caller's thread.
 *
 * nng 1.5.2's TLS streams move at most 16 KiB through a ring buffer per TCP send and wake
 * nng's poller thread for every completion: a data link on tls+tcp:// ran at 0.05-0.08 GB/s
 * per direction against 1.8-2.7 GB/s plain, and a profile showed the time in thread
 * wake-ups, not in the cipher. Here a connection's records are read and written by the
 * thread that reads or writes it, with OpenSSL: TLS 1.2 as nng's (so either end may be
 * nng's), AEAD suites with forward secrecy, AES-128-GCM first. mbedTLS 2.28 (the library
 * nng's TLS is built on) was used here first: its ciphers held the link at 0.15-0.17 GB/s.
 *
 * The dialer checks the server's certificate against the CA and the name it dialed: a DNS
 * name of the certificate (its common name when it has no subjectAltName; no partial
 * wildcards), as nng's mbedTLS checks it, or, for an IP address, an IP address of the
 * certificate too. A key with a passphrase is refused (never prompted for).
 *
 * A write that waits for the handshake's input looks again every 10 ms: the other thread's
 * read may take that input and end the handshake while the write waits.
 *
 * A connection may have one reader and one writer at once (dlsock.h): an SSL object is not
 * for two threads, so every call into it holds the connection's lock and never blocks (its
 * socket I/O does not wait); the waiting for the socket is done outside the lock. The
 * handshake is made by the first read or write (a server's by its first read, within that
 * read's bound, so a peer that stalls it holds no accepting thread), or at once by
 * dltls_handshake (a dialer's, within the dial's bound).
 *
 * A configuration also holds the nng one made from the same files (dltls_nng), for a link
 * dlsock hands to nng (a name that did not resolve within the dial's bound).
 */
#ifndef DEVCOORD_COMMON_DLTLS_H
#define DEVCOORD_COMMON_DLTLS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <nng/nng.h>
#include <nng/supplemental/tls/tls.h>
#include <nng/supplemental/util/platform.h>

#include "status.h"

struct dltls;
struct dltls_conn;

/* A configuration from PEM text (NUL-terminated; NULL: none): a server's (server true: its
 * certificate and key; with verify_peer, a client's certificate is required and checked
 * against ca_pem) or a client's (the server's certificate checked against ca_pem, which is
 * required, and against server_name when not NULL; cert_pem and key_pem its own, if any).
 * nng is the nng configuration made from the same files: taken over (freed with the
 * configuration, or at once on failure). DC_OK and *out, or DC_INVALID_ARGUMENT (a PEM that
 * does not parse) / DC_RESOURCE_EXHAUSTED in st. */
dc_code dltls_new(bool server, const char *ca_pem, const char *cert_pem, const char *key_pem,
                  bool verify_peer, const char *server_name, nng_tls_config *nng,
                  struct dltls **out, dc_status *st);
/* Another hold on t (each connection keeps one); dltls_free lets one go. */
struct dltls *dltls_hold(struct dltls *t);
void dltls_free(struct dltls *t);
nng_tls_config *dltls_nng(const struct dltls *t);

/* A connection's TLS state over the connected socket fd (not taken over: the caller closes
 * it after dltls_conn_free). NULL when out of memory. */
struct dltls_conn *dltls_conn_new(struct dltls *t, int fd);
void dltls_conn_free(struct dltls_conn *c);

/* Each waits for the socket until `timeout` ms counted from `start` (nng_clock) have passed
 * (NNG_DURATION_INFINITE: no bound; 0: only what goes at once), and gives up once *closed.
 * 0, or nng's error: NNG_ETIMEDOUT (a read's leaves the connection usable; a write's or a
 * handshake's does not, as part of a record may have gone), NNG_ECLOSED (the peer
 * closed, or *closed), NNG_EPEERAUTH (the peer's certificate was refused), NNG_ECRYPTO
 * (any other TLS failure), or the socket's. A failure other than a timeout is the
 * connection's for good. */
int dltls_handshake(struct dltls_conn *c, nng_time start, nng_duration timeout,
                    const atomic_bool *closed);
/* Reads at most len bytes of the peer's data (*done: how many; at least one on success). */
int dltls_recv(struct dltls_conn *c, uint8_t *buf, size_t len, size_t *done, nng_time start,
               nng_duration timeout, const atomic_bool *closed);
/* Whether bytes the peer sent are held unread in c (records read ahead of the reads): a poll
 * of the socket does not see them. */
bool dltls_pending(struct dltls_conn *c);
/* Writes at most len bytes (*done: how many; at least one on success, at most a record's). */
int dltls_send(struct dltls_conn *c, const uint8_t *buf, size_t len, size_t *done, nng_time start,
               nng_duration timeout, const atomic_bool *closed);

#endif
