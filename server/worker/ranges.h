/*
 * A set of disjoint byte ranges [off, off + len): what has come of one step of an op's data,
 * so that bytes which come a second time are told apart from new ones. A step is complete
 * when its bytes are all in; counting them alone would let a chunk sent twice stand in for
 * one never sent, leaving a hole of stale bytes in a result that is then committed.
 *
 * Ranges are kept sorted, and ranges that touch are merged: chunks that come in order keep
 * one range, chunks that come a few out of order (Exchange calls in flight) a few. A set
 * holds at most `max` ranges (a peer sending tiny pieces out of order could otherwise make
 * each claim cost a long move). Not thread-safe: collective.c claims under the op's lock.
 */
#ifndef DEVCOORD_WORKER_RANGES_H
#define DEVCOORD_WORKER_RANGES_H

#include <stddef.h>
#include <stdint.h>

struct ranges_span {
    uint64_t off, len;
};

struct ranges {
    struct ranges_span *v; /* sorted by off, disjoint, none touching the next */
    size_t len, cap;
    size_t max; /* 0: no bound */
};

enum ranges_claim {
    RANGES_CLAIMED, /* the bytes are now in the set */
    RANGES_OVERLAP, /* some of them were already: nothing changed */
    RANGES_FULL,    /* they would make more than max ranges: nothing changed */
    RANGES_NOMEM,   /* memory ran out: nothing changed */
};

/* Adds [off, off + len) unless any of its bytes is in the set. len 0 claims nothing.
 * off + len must not wrap. */
enum ranges_claim ranges_claim(struct ranges *s, uint64_t off, uint64_t len);

/* Releases the set's memory; it is then empty (max kept). */
void ranges_free(struct ranges *s);

#endif
