/* Claims of byte ranges (ranges.h). */
#include "ranges.h"

#include <stdlib.h>
#include <string.h>

/* Index of the first span that ends after off (s->len if none). */
static size_t
ranges_after(const struct ranges *s, uint64_t off)
{
    size_t lo = 0, hi = s->len;

    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (s->v[mid].off + s->v[mid].len <= off) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return lo;
}

enum ranges_claim
ranges_claim(struct ranges *s, uint64_t off, uint64_t len)
{
    size_t i;
    int left, right;

    if (len == 0) {
        return RANGES_CLAIMED;
    }
    i = ranges_after(s, off);
    if (i < s->len && s->v[i].off < off + len) {
        return RANGES_OVERLAP;
    }
    left  = i > 0 && s->v[i - 1].off + s->v[i - 1].len == off;
    right = i < s->len && s->v[i].off == off + len;
    if (left && right) { /* fills the gap between two spans: they become one */
        s->v[i - 1].len += len + s->v[i].len;
        memmove(s->v + i, s->v + i + 1, (s->len - i - 1) * sizeof(*s->v));
        s->len--;
        return RANGES_CLAIMED;
    }
    if (left) {
        s->v[i - 1].len += len;
        return RANGES_CLAIMED;
    }
    if (right) {
        s->v[i].off = off;
        s->v[i].len += len;
        return RANGES_CLAIMED;
    }
    if (s->max != 0 && s->len >= s->max) {
        return RANGES_FULL;
    }
    if (s->len == s->cap) {
        size_t cap               = s->cap ? s->cap * 2 : 4;
        struct ranges_span *grow = realloc(s->v, cap * sizeof(*grow));
        if (grow == NULL) {
            return RANGES_NOMEM;
        }
        s->v   = grow;
        s->cap = cap;
    }
    memmove(s->v + i + 1, s->v + i, (s->len - i) * sizeof(*s->v));
    s->v[i] = (struct ranges_span){ off, len };
    s->len++;
    return RANGES_CLAIMED;
}

void
ranges_free(struct ranges *s)
{
    free(s->v);
    s->v   = NULL;
    s->len = 0;
    s->cap = 0;
}
