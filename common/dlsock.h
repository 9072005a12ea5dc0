/*
 * A raw link's connection (the data link, call links, control links): the bytes of one TCP
 * connection, read and written by blocking calls on the caller's thread.
 *
 * Two kinds behind one interface. A `tcp://` or `tls+tcp://` connection is a socket read and
 * written with system calls on the caller's thread: a frame that arrives wakes that thread
 * itself (tls+tcp:// through mbedTLS on that thread, dltls.h). A host given by name is
 * resolved on a thread of its own within the dial's bound (getaddrinfo has none), and its
 * addresses tried in the resolver's order (nng's resolver takes only the first; a listener
 * does too); a name whose resolution takes the whole bound ends the dial NNG_ETIMEDOUT.
 * Anything else, and a name the resolver failed, goes to nng as a stream (TLS nng's), whose
 * every completion first wakes nng's poller thread, which then wakes the caller: one thread
 * hop more per read, 58 µs against 30 µs for a 64-byte round trip on 127.0.0.1 here.
 *
 * Errors are nng's codes (NNG_ETIMEDOUT, NNG_ECLOSED, ...), whatever the kind. One reader
 * and one writer at a time; dlsock_shutdown may come from any thread.
 */
#ifndef DEVCOORD_COMMON_DLSOCK_H
#define DEVCOORD_COMMON_DLSOCK_H

#include <stdbool.h>
#include <stdint.h>

#include <nng/nng.h>

struct addrinfo;
struct dlsock;
struct dlsock_listener;
struct dltls;

/* Names resolved at once, at most: each on a thread that may outlive its dial, as
 * getaddrinfo has no bound of its own. A dial past it waits within its bound. */
#define DLSOCK_RESOLVE_MAX 32

/* Resolves host names as getaddrinfo does (its list freed with freeaddrinfo); for tests,
 * which set one before any dial (NULL: getaddrinfo again). Numeric addresses never reach
 * it. */
typedef int (*dlsock_resolve_fn)(const char *host, const char *port, const struct addrinfo *hints,
                                 struct addrinfo **res);
void dlsock_set_resolver(dlsock_resolve_fn fn);

/* Connects to url (tls: the client config for tls+tcp://, else NULL) within timeout_ms, with
 * Nagle off, its TLS handshake made within that bound too. 0 and *out, or nng's error
 * (NNG_EPEERAUTH: the server's certificate was refused; NNG_ECRYPTO: another TLS failure). */
int dlsock_dial(const char *url, struct dltls *tls, uint32_t timeout_ms, struct dlsock **out);

/* Receives (or sends) exactly the bytes of iov[0..n) (advanced in place), the whole of it
 * within timeout ms (NNG_DURATION_INFINITE: no bound; 0: only what goes at once). 0, or
 * nng's error (NNG_ECLOSED: the peer closed, or dlsock_shutdown). */
int dlsock_recv_all(struct dlsock *s, nng_iov *iov, unsigned n, nng_duration timeout);
int dlsock_send_all(struct dlsock *s, nng_iov *iov, unsigned n, nng_duration timeout);
/* Sends what of iov[0..n) the socket takes without waiting (*sent bytes: maybe none, maybe
 * all). 0, or nng's error; NNG_ENOTSUP (nothing sent) on an nng stream, which cannot say how
 * much of a write that timed out went. */
int dlsock_send_now(struct dlsock *s, const nng_iov *iov, unsigned n, size_t *sent);

/* A watch for the peer closing while the connection is idle: idle_begin before leaving it
 * unused, idle_end before using it again, true when nothing arrived and it did not close
 * (false: it is unusable). One watch at a time; no reads in between. */
void dlsock_idle_begin(struct dlsock *s);
bool dlsock_idle_end(struct dlsock *s);

/* Whether s is a plain socket without TLS (else TLS on one, or an nng stream). */
bool dlsock_is_plain(const struct dlsock *s);

/* Ends every wait on s, now and later (they fail NNG_ECLOSED). Any thread; s stays valid. */
void dlsock_shutdown(struct dlsock *s);
/* Closes and frees s (NULL: nothing). No other thread may be using it. */
void dlsock_free(struct dlsock *s);

/* Listens on url (tls: the server config for tls+tcp://, else NULL; the listener holds it);
 * *port is the port bound (url's, or the kernel's choice for port 0). 0 or nng's error. A
 * connection it accepts makes its TLS handshake at its first read, within that read's
 * bound. */
int dlsock_listen(const char *url, struct dltls *tls, struct dlsock_listener **out, int *port);
/* Waits for the next connection: 0 and *out, or nng's error (NNG_ECLOSED once closed). */
int dlsock_accept(struct dlsock_listener *l, struct dlsock **out);
/* Makes dlsock_accept fail NNG_ECLOSED, now and later. Any thread. */
void dlsock_listener_close(struct dlsock_listener *l);
/* Frees l (NULL: nothing) once no dlsock_accept is under way. */
void dlsock_listener_free(struct dlsock_listener *l);

#endif
