#include "http_get.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define HEAD_MAX 8192

static int64_t
now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Waits until fd is ready for `events` or the deadline passes. */
static bool
wait_fd(int fd, short events, int64_t deadline)
{
    struct pollfd p = { .fd = fd, .events = events };
    int64_t left;
    int rv;

    do {
        left = deadline - now_ms();
        if (left <= 0) {
            return false;
        }
        rv = poll(&p, 1, left > 60000 ? 60000 : (int)left);
    } while (rv < 0 && errno == EINTR);
    return rv > 0;
}

/* Splits "HOST:PORT" (or "[v6]:PORT") into host and port. */
static bool
split_hostport(const char *hostport, char *host, size_t hcap, char *port, size_t pcap)
{
    const char *colon = strrchr(hostport, ':');
    size_t hlen;

    if (colon == NULL || colon == hostport || colon[1] == '\0' || strlen(colon + 1) >= pcap) {
        return false;
    }
    hlen = (size_t)(colon - hostport);
    if (hostport[0] == '[' && hlen >= 2 && hostport[hlen - 1] == ']') {
        hostport++;
        hlen -= 2;
    }
    if (hlen == 0 || hlen >= hcap) {
        return false;
    }
    memcpy(host, hostport, hlen);
    host[hlen] = '\0';
    snprintf(port, pcap, "%s", colon + 1);
    return true;
}

static int
connect_to(const char *host, const char *port, int64_t deadline, char *err, size_t errcap)
{
    struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM };
    struct addrinfo *res  = NULL;
    int fd                = -1;
    int rv;

    if ((rv = getaddrinfo(host, port, &hints, &res)) != 0) {
        snprintf(err, errcap, "cannot resolve %s: %s", host, gai_strerror(rv));
        return -1;
    }
    for (struct addrinfo *ai = res; ai != NULL; ai = ai->ai_next) {
        int soerr     = 0;
        socklen_t len = sizeof(soerr);

        if ((fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol)) < 0) {
            continue;
        }
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 ||
            (errno == EINPROGRESS && wait_fd(fd, POLLOUT, deadline) &&
             getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len) == 0 && soerr == 0)) {
            break;
        }
        snprintf(err, errcap, "cannot connect to %s:%s: %s", host, port,
                 soerr != 0             ? strerror(soerr)
                 : errno == EINPROGRESS ? "timed out"
                                        : strerror(errno));
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    return fd;
}

int
http_get(const char *hostport, const char *path, uint32_t timeout_ms, size_t max, char **body,
         char *err, size_t errcap)
{
    int64_t deadline = now_ms() + timeout_ms;
    char host[256], port[16], *buf = NULL, *head_end;
    size_t len = 0, cap = HEAD_MAX + max + 1, req_len, sent = 0, want = SIZE_MAX;
    char req[512];
    int fd = -1, rc = -1, status;

    *body  = NULL;
    err[0] = '\0';
    if (strncmp(hostport, "http://", 7) == 0) {
        hostport += 7;
    }
    if (!split_hostport(hostport, host, sizeof(host), port, sizeof(port))) {
        snprintf(err, errcap, "'%s' is not HOST:PORT", hostport);
        return -1;
    }
    if ((fd = connect_to(host, port, deadline, err, errcap)) < 0) {
        return -1;
    }
    req_len = (size_t)snprintf(req, sizeof(req),
                               "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", path,
                               hostport);
    while (sent < req_len) {
        ssize_t n = send(fd, req + sent, req_len - sent, MSG_NOSIGNAL);
        if (n < 0 && (errno == EAGAIN || errno == EINTR) && wait_fd(fd, POLLOUT, deadline)) {
            continue;
        }
        if (n <= 0) {
            snprintf(err, errcap, "cannot send to %s: %s", hostport,
                     n < 0 ? strerror(errno) : "closed");
            goto out;
        }
        sent += (size_t)n;
    }
    if ((buf = malloc(cap)) == NULL) {
        snprintf(err, errcap, "out of memory");
        goto out;
    }
    /* Until the whole body is in (Content-Length) or the server closes. */
    while (len < want) {
        ssize_t n;
        if (len == cap - 1) {
            snprintf(err, errcap, "answer of %s longer than %zu bytes", hostport, cap - 1);
            goto out;
        }
        if (!wait_fd(fd, POLLIN, deadline)) {
            snprintf(err, errcap, "no answer from %s in %u ms", hostport, timeout_ms);
            goto out;
        }
        n = recv(fd, buf + len, cap - 1 - len, 0);
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
            continue;
        }
        if (n <= 0) {
            break;
        }
        len += (size_t)n;
        buf[len] = '\0';
        if (want == SIZE_MAX && (head_end = strstr(buf, "\r\n\r\n")) != NULL) {
            const char *cl = strstr(buf, "\r\nContent-Length:");
            if (cl == NULL) {
                cl = strstr(buf, "\r\ncontent-length:");
            }
            if (cl != NULL && cl < head_end) {
                char *end;
                unsigned long long n_body = strtoull(cl + 17, &end, 10);
                if (end != cl + 17 && n_body <= max) {
                    want = (size_t)(head_end + 4 - buf) + (size_t)n_body;
                }
            }
        }
    }
    buf[len] = '\0';
    if (sscanf(buf, "HTTP/1.%*[01] %d", &status) != 1 ||
        (head_end = strstr(buf, "\r\n\r\n")) == NULL) {
        snprintf(err, errcap, "%s did not answer in HTTP", hostport);
        goto out;
    }
    if (status != 200) {
        snprintf(err, errcap, "GET http://%s%s: status %d", hostport, path, status);
        goto out;
    }
    if ((*body = strdup(head_end + 4)) == NULL) {
        snprintf(err, errcap, "out of memory");
        goto out;
    }
    rc = 0;
out:
    free(buf);
    close(fd);
    return rc;
}
