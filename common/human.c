#include "human.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WORD_MAX 64

bool
human_parse_duration(const char *text, uint32_t *ms)
{
    static const struct {
        const char *unit;
        uint64_t ms;
    } units[] = { { "ms", 1 }, { "s", 1000 }, { "m", 60000 }, { "h", 3600000 } };
    unsigned long long v;
    char *end;

    /* strtoull alone would take blanks and a sign. */
    if (text[0] < '0' || text[0] > '9') {
        return false;
    }
    errno = 0;
    v     = strtoull(text, &end, 10);
    if (errno != 0 || v == 0) {
        return false;
    }
    for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
        if (strcmp(end, units[i].unit) == 0) {
            if (v > UINT32_MAX / units[i].ms) {
                return false;
            }
            *ms = (uint32_t)(v * units[i].ms);
            return true;
        }
    }
    return false;
}

void
human_bytes(char *buf, size_t cap, uint64_t bytes)
{
    static const char *const units[] = { "Ki", "Mi", "Gi", "Ti", "Pi", "Ei" };
    uint64_t unit                    = 1024;
    size_t u                         = 0;

    if (bytes < 1024) {
        snprintf(buf, cap, "%" PRIu64, bytes);
        return;
    }
    while (u + 1 < sizeof(units) / sizeof(units[0]) && bytes / 1024 >= unit) {
        unit *= 1024;
        u++;
    }
    for (;;) {
        /* Tenths of the unit, rounded; r * 10 fits since r < unit <= 2^60. */
        uint64_t q = bytes / unit, r = bytes % unit;
        uint64_t tenths = q * 10 + (r * 10 + unit / 2) / unit;

        if (tenths >= 10240 && u + 1 < sizeof(units) / sizeof(units[0])) {
            unit *= 1024; /* 1023.96Mi rounds to 1.0Gi, not to 1024.0Mi */
            u++;
            continue;
        }
        if (r == 0) {
            snprintf(buf, cap, "%" PRIu64 "%s", q, units[u]);
        } else {
            snprintf(buf, cap, "%" PRIu64 ".%" PRIu64 "%s", tenths / 10, tenths % 10, units[u]);
        }
        return;
    }
}

void
human_age(char *buf, size_t cap, uint64_t ms)
{
    uint64_t s = ms / 1000;

    if (ms < 1000) {
        snprintf(buf, cap, "%" PRIu64 "ms", ms);
    } else if (s < 120) {
        snprintf(buf, cap, "%" PRIu64 "s", s);
    } else if (s < 2 * 3600) {
        snprintf(buf, cap, "%" PRIu64 "m", s / 60);
    } else if (s < 48 * 3600) {
        snprintf(buf, cap, "%" PRIu64 "h", s / 3600);
    } else {
        snprintf(buf, cap, "%" PRIu64 "d", s / 86400);
    }
}

void
human_elapsed_us(char *buf, size_t cap, uint64_t us)
{
    if (us < 1000) {
        snprintf(buf, cap, "%" PRIu64 "us", us);
    } else if (us < 1000000) {
        snprintf(buf, cap, "%.1fms", (double)us / 1e3);
    } else if (us < 60000000) {
        snprintf(buf, cap, "%.2fs", (double)us / 1e6);
    } else {
        human_age(buf, cap, us / 1000);
    }
}

size_t
human_edit_distance(const char *a, const char *b)
{
    /* Three rows of the optimal-string-alignment table: two back for the swaps. */
    size_t rows[3][WORD_MAX + 1];
    size_t la = strlen(a), lb = strlen(b);

    if (la > WORD_MAX || lb > WORD_MAX) {
        return SIZE_MAX;
    }
    for (size_t j = 0; j <= lb; j++) {
        rows[0][j] = j;
    }
    for (size_t i = 1; i <= la; i++) {
        size_t *cur = rows[i % 3], *prev = rows[(i - 1) % 3], *prev2 = rows[(i + 1) % 3];

        cur[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
            size_t best = prev[j] + 1;

            if (cur[j - 1] + 1 < best) {
                best = cur[j - 1] + 1;
            }
            if (prev[j - 1] + cost < best) {
                best = prev[j - 1] + cost;
            }
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
                prev2[j - 2] + 1 < best) {
                best = prev2[j - 2] + 1;
            }
            cur[j] = best;
        }
    }
    return rows[la % 3][lb];
}

const char *
human_nearest(const char *word, const char *const *candidates, size_t n)
{
    size_t len = strlen(word), limit = len >= 5 ? 2 : 1, best_d = SIZE_MAX;
    const char *best = NULL, *prefixed = NULL;
    size_t n_prefixed = 0;

    if (len == 0) {
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        size_t d = human_edit_distance(word, candidates[i]);
        if (d < best_d) {
            best_d = d;
            best   = candidates[i];
        }
        if (strncmp(candidates[i], word, len) == 0) {
            prefixed = candidates[i];
            n_prefixed++;
        }
    }
    /* A one-letter word is one edit from every other one-letter word: not a hint. */
    if (best != NULL && best_d <= limit && best_d < len) {
        return best;
    }
    return n_prefixed == 1 ? prefixed : NULL;
}
