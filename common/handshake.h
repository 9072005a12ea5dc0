/*
 * Ends TLS handshakes that stall, which nng 1.5.2 cannot: its tls transport gives the
 * handshake a 10 s timeout, but the timeout only cancels a TCP send, and during a handshake
 * the connection waits on a TCP receive, so a peer that connects and then sends nothing (or
 * half a ClientHello) holds the connection and its descriptor forever.
 *
 * A handshake_watch looks at the listener from outside: every half second it lists this
 * process's TCP sockets whose local port is the listener's and shuts down (shutdown(2),
 * never close: the descriptor stays nng's) each one that has been connected longer than the
 * limit without becoming an nng pipe. nng then sees the connection fail and frees it itself.
 * The rpc server reports pipes as they come and go (handshake_watch_pipe). Linux only: it
 * reads /proc/self/fd.
 */
#ifndef DEVCOORD_COMMON_HANDSHAKE_H
#define DEVCOORD_COMMON_HANDSHAKE_H

#include <stdbool.h>
#include <stdint.h>

#include <nng/nng.h>

struct handshake_watch;

/* A watch that records pipes from now on (register its pipe callbacks before the listener
 * starts, so no pipe is missed); NULL when out of memory. */
struct handshake_watch *handshake_watch_new(uint32_t limit_ms);
/* Starts watching connections accepted on local TCP port `port`; false when no thread. */
bool handshake_watch_start(struct handshake_watch *w, uint16_t port);
/* Stops the thread, if started, and frees everything. */
void handshake_watch_stop(struct handshake_watch *w);
/* Pipe `id` from remote came up (up: remote its address), or pipe `id` went (remote unused:
 * by then nng may no longer know the address of a connection its peer closed). Any thread,
 * never blocks for long. */
void handshake_watch_pipe(struct handshake_watch *w, uint32_t id, const nng_sockaddr *remote,
                          bool up);
/* Connections shut down so far. */
uint64_t handshake_watch_reaped(struct handshake_watch *w);
/* Pipes recorded as live now. */
size_t handshake_watch_pipes(struct handshake_watch *w);

#endif
