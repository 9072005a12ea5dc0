/*
 * One HTTP GET over plain TCP with a deadline, for what devcoordctl reads from a daemon's
 * HTTP port (the coordinator's /metrics, where its version is). Just enough HTTP/1.1 for
 * that: no TLS, no redirects, no chunked bodies.
 */
#ifndef DEVCOORD_CLIENT_HTTP_GET_H
#define DEVCOORD_CLIENT_HTTP_GET_H

#include <stddef.h>
#include <stdint.h>

/*
 * GET http://HOSTPORT/path ("HOST:PORT", "[v6]:PORT", optionally with "http://" in front).
 * On a 200 answer returns 0 and *body, NUL-terminated, at most max bytes, which the caller
 * frees; otherwise -1 and why in err.
 */
int http_get(const char *hostport, const char *path, uint32_t timeout_ms, size_t max, char **body,
             char *err, size_t errcap);

#endif
