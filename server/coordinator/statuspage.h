/*
 * The coordinator's status page (GET / on its HTTP port): one HTML document for operators,
 * with inline CSS, no script and nothing fetched from elsewhere, that reloads itself every
 * few seconds. It is rendered from a snapshot of what the API answers (GetClusterStatus,
 * ListWorkers, ListOps, the registry's counts), which http.c takes; the renderer itself is
 * pure (no lock, no clock, no socket) so it can be tested on a made-up snapshot. Every
 * string that comes from the cluster is HTML-escaped and cut to a bounded length, and the
 * tables show a bounded number of rows, so the page's size is bounded whatever the cluster.
 */
#ifndef DEVCOORD_COORDINATOR_STATUSPAGE_H
#define DEVCOORD_COORDINATOR_STATUSPAGE_H

#include <stddef.h>
#include <stdint.h>

#include "devcoord/v1/devcoord.pb-c.h"
#include "registry.h"

struct mbuf;

#define STATUSPAGE_REFRESH_S         2
#define STATUSPAGE_MAX_WORKERS       200 /* rows; dead, draining and cordoned ones first */
#define STATUSPAGE_MAX_OPS           50  /* rows, in flight and recent together */
#define STATUSPAGE_MAX_LABELS        8   /* per worker */
#define STATUSPAGE_MAX_WAITING       8   /* worker names an op waits on */
#define STATUSPAGE_MAX_TEXT          160 /* bytes of one string from the cluster */
#define STATUSPAGE_MAX_GROUPS        50  /* rows */
#define STATUSPAGE_MAX_GROUP_DEVICES 16  /* device names per group row */
#define STATUSPAGE_WORKER_WAIT_MS    300 /* for the groups' workers to say what they know */

/* What the page shows; the caller owns every part. */
struct statuspage_snapshot {
    const char *version;  /* the coordinator's */
    uint64_t now_unix_ms; /* for the ops' ages and the page's time */
    const Devcoord__V1__GetClusterStatusResponse *status;
    const struct registry_counts *counts;
    const Devcoord__V1__ListWorkersResponse *workers;
    /* In flight first, then the history, newest first (ops_list_into), of ops_total. */
    const Devcoord__V1__ListOpsResponse *ops;
    size_t ops_total;
    /* The coordinator's groups (groupsvc_list_into); NULL: none. */
    const Devcoord__V1__ListGroupsResponse *groups;
};

/* The response headers the page goes with (http_route.headers): no caching, and a
 * Content-Security-Policy that lets the page load nothing and run nothing. */
extern const char *const statuspage_headers[];

/* Appends the page to b (b->oom tells whether it all fit in memory). */
void statuspage_render(struct mbuf *b, const struct statuspage_snapshot *s);

#endif
