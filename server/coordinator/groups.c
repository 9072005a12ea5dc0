/* The group table: rendezvous, generations and leaves of design §13 (see groups.h). */
#include "groups.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device.h"
#include "status.h"

struct parked {
    bool on;
    void *tag;
    uint64_t deadline_ms;
};

struct group {
    char id[VALIDATE_GROUP_ID_SIZE];
    dc_device_ref *ranked;
    char (*names)[DC_DEVICE_TEXT_SIZE];
    const char **name_ptrs;
    size_t n;
    uint64_t generation;
    bool *member;          /* rank r is in the current generation and has not left */
    struct parked *parked; /* rank r's join in the next rendezvous */
    size_t n_parked;
    struct group *next;
};

struct group_table {
    size_t max_parked, parked;
    size_t max_groups, n_groups;
    struct group *first, **last;
};

void
group_done_fini(struct group_done *d)
{
    free(d->tags);
    memset(d, 0, sizeof(*d));
}

static void
group_free(struct group *g)
{
    if (g != NULL) {
        free(g->ranked);
        free(g->names);
        free(g->name_ptrs);
        free(g->member);
        free(g->parked);
        free(g);
    }
}

static struct group *
group_new(const char *id, const dc_device_ref *ranked, size_t n)
{
    struct group *g = calloc(1, sizeof(*g));

    if (g == NULL || (g->ranked = calloc(n, sizeof(*g->ranked))) == NULL ||
        (g->names = calloc(n, sizeof(*g->names))) == NULL ||
        (g->name_ptrs = calloc(n, sizeof(*g->name_ptrs))) == NULL ||
        (g->member = calloc(n, sizeof(*g->member))) == NULL ||
        (g->parked = calloc(n, sizeof(*g->parked))) == NULL) {
        group_free(g);
        return NULL;
    }
    snprintf(g->id, sizeof(g->id), "%s", id);
    memcpy(g->ranked, ranked, n * sizeof(*ranked));
    g->n = n;
    for (size_t i = 0; i < n; i++) {
        dc_device_ref_format(&ranked[i], g->names[i], sizeof(g->names[i]));
        g->name_ptrs[i] = g->names[i];
    }
    return g;
}

struct group_table *
group_table_new(size_t max_parked, size_t max_groups)
{
    struct group_table *t = calloc(1, sizeof(*t));

    if (t != NULL) {
        t->max_parked = max_parked;
        t->max_groups = max_groups;
        t->last       = &t->first;
    }
    return t;
}

void
group_table_free(struct group_table *t)
{
    if (t == NULL) {
        return;
    }
    for (struct group *g = t->first, *next; g != NULL; g = next) {
        next = g->next;
        group_free(g);
    }
    free(t);
}

static struct group *
group_find(const struct group_table *t, const char *id)
{
    for (struct group *g = t->first; g != NULL; g = g->next) {
        if (strcmp(g->id, id) == 0) {
            return g;
        }
    }
    return NULL;
}

static bool
group_same_devices(const struct group *g, const dc_device_ref *ranked, size_t n)
{
    if (g->n != n) {
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        if (device_ref_compare_concrete(&g->ranked[i], &ranked[i]) != 0) {
            return false;
        }
    }
    return true;
}

static bool
group_idle(const struct group *g)
{
    if (g->n_parked > 0) {
        return false;
    }
    for (size_t i = 0; i < g->n; i++) {
        if (g->member[i]) {
            return false;
        }
    }
    return true;
}

/* Unlinks and frees g. */
static void
group_drop(struct group_table *t, struct group *g)
{
    for (struct group **pp = &t->first; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == g) {
            *pp = g->next;
            if (t->last == &g->next) {
                t->last = pp;
            }
            break;
        }
    }
    t->n_groups--;
    group_free(g);
}

/* A group nobody is in nor joining stays listed (with its generation) until room is needed:
 * then the oldest such goes. A group that never completed a rendezvous goes at once. */
static void
group_maybe_drop(struct group_table *t, struct group *g)
{
    if (group_idle(g) && g->generation == 0) {
        group_drop(t, g);
    }
}

/* Room for one more group: false when every group is in use. */
static bool
group_make_room(struct group_table *t)
{
    if (t->n_groups < t->max_groups) {
        return true;
    }
    for (struct group *g = t->first; g != NULL; g = g->next) {
        if (group_idle(g)) {
            group_drop(t, g);
            return true;
        }
    }
    return false;
}

static void
unpark_at(struct group_table *t, struct group *g, size_t r)
{
    g->parked[r].on  = false;
    g->parked[r].tag = NULL;
    g->n_parked--;
    t->parked--;
}

dc_code
group_join(struct group_table *t, const char group_id[VALIDATE_GROUP_ID_SIZE],
           const dc_device_ref *ranked, size_t n, uint32_t rank, uint64_t deadline_ms, void *tag,
           bool *completed, struct group_done *done, dc_status *st)
{
    struct group *g = group_find(t, group_id);
    bool fresh      = g == NULL;

    *completed = false;
    memset(done, 0, sizeof(*done));
    if (n == 0 || rank >= n) {
        return status_set(st, DC_INVALID_ARGUMENT, "rank %u outside a group of %zu", rank, n);
    }
    if (g != NULL && !group_same_devices(g, ranked, n)) {
        return status_set(st, DC_FAILED_PRECONDITION,
                          "group id %s is taken by another device list (hash collision)", group_id);
    }
    if (g != NULL && g->parked[rank].on) {
        return status_set(st, DC_ALREADY_EXISTS,
                          "%s has already joined group %s and waits for the other ranks",
                          g->names[rank], g->id);
    }
    if (t->parked >= t->max_parked) {
        return status_set(st, DC_RESOURCE_EXHAUSTED,
                          "too many joins waiting (%zu, the coordinator's limit)", t->max_parked);
    }
    if (fresh && !group_make_room(t)) {
        return status_set(st, DC_RESOURCE_EXHAUSTED,
                          "too many groups (%zu, the coordinator's "
                          "limit)",
                          t->max_groups);
    }
    if (fresh && (g = group_new(group_id, ranked, n)) == NULL) {
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
    }
    if (g->n_parked + 1 == g->n && (done->tags = calloc(n, sizeof(*done->tags))) == NULL) {
        if (fresh) {
            group_free(g);
        }
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
    }
    if (fresh) {
        *t->last = g;
        t->last  = &g->next;
        t->n_groups++;
    }
    g->parked[rank] = (struct parked){ true, tag, deadline_ms };
    g->n_parked++;
    t->parked++;
    if (g->n_parked < g->n) {
        return DC_OK;
    }
    /* The last rank: a new generation with every rank in it. */
    g->generation++;
    snprintf(done->group_id, sizeof(done->group_id), "%s", g->id);
    done->generation = g->generation;
    done->n          = n;
    for (size_t r = 0; r < n; r++) {
        done->tags[r] = g->parked[r].tag;
        g->member[r]  = true;
        unpark_at(t, g, r);
    }
    *completed = true;
    return DC_OK;
}

bool
group_unpark(struct group_table *t, void *tag)
{
    for (struct group *g = t->first; g != NULL; g = g->next) {
        for (size_t r = 0; r < g->n; r++) {
            if (g->parked[r].on && g->parked[r].tag == tag) {
                unpark_at(t, g, r);
                group_maybe_drop(t, g);
                return true;
            }
        }
    }
    return false;
}

/* "not joined: a, b, c" for the ranks of g with no join parked, within cap. */
static void
missing_names(const struct group *g, char *buf, size_t cap)
{
    size_t len = 0, shown = 0, missing = 0;

    len = (size_t)snprintf(buf, cap, "devices not joined:");
    for (size_t r = 0; r < g->n; r++) {
        if (g->parked[r].on) {
            continue;
        }
        missing++;
        if (len + strlen(g->names[r]) + 32 < cap) {
            len += (size_t)snprintf(buf + len, cap - len, "%s %s", shown ? "," : "", g->names[r]);
            shown++;
        }
    }
    if (shown < missing) {
        snprintf(buf + len, cap - len, " and %zu more", missing - shown);
    }
}

size_t
group_expire(struct group_table *t, uint64_t now, struct group_expired *out, size_t cap)
{
    size_t k = 0;

    for (struct group *g = t->first, *next; g != NULL && k < cap; g = next) {
        next = g->next;
        for (size_t r = 0; r < g->n && k < cap; r++) {
            char names[DC_STATUS_MESSAGE_MAX - 96];
            if (!g->parked[r].on || g->parked[r].deadline_ms > now) {
                continue;
            }
            missing_names(g, names, sizeof(names));
            out[k].tag = g->parked[r].tag;
            snprintf(out[k].message, sizeof(out[k].message), "group %s: join of %s timed out; %s",
                     g->id, g->names[r], names);
            k++;
            unpark_at(t, g, r);
        }
        group_maybe_drop(t, g);
    }
    return k;
}

size_t
group_take_if(struct group_table *t, bool (*pred)(void *tag, void *arg), void *arg, void **out,
              size_t cap)
{
    size_t k = 0;

    for (struct group *g = t->first, *next; g != NULL && k < cap; g = next) {
        next = g->next;
        for (size_t r = 0; r < g->n && k < cap; r++) {
            if (g->parked[r].on && (pred == NULL || pred(g->parked[r].tag, arg))) {
                out[k++] = g->parked[r].tag;
                unpark_at(t, g, r);
            }
        }
        group_maybe_drop(t, g);
    }
    return k;
}

size_t
group_take_all(struct group_table *t, void **out, size_t cap)
{
    return group_take_if(t, NULL, NULL, out, cap);
}

dc_code
group_leave(struct group_table *t, const char *group_id, uint64_t generation, uint32_t rank,
            dc_status *st)
{
    struct group *g = group_find(t, group_id);

    if (g == NULL) {
        return status_set(st, DC_NOT_FOUND, "no group %.32s", group_id);
    }
    if (rank >= g->n) {
        return status_set(st, DC_INVALID_ARGUMENT, "rank %u outside group %s of %zu ranks", rank,
                          g->id, g->n);
    }
    if (generation != g->generation) {
        return status_set(st, DC_FAILED_PRECONDITION, "group %s is at generation %llu, not %llu",
                          g->id, (unsigned long long)g->generation, (unsigned long long)generation);
    }
    g->member[rank] = false;
    group_maybe_drop(t, g);
    return DC_OK;
}

size_t
group_list(struct group_table *t, const char *group_id,
           void (*fn)(void *arg, const struct group_view *v), void *arg)
{
    size_t shown = 0;

    for (struct group *g = t->first; g != NULL; g = g->next) {
        struct group_view v = { g->id, g->name_ptrs, g->ranked, g->n, g->generation, 0, 0 };
        if (group_id != NULL && group_id[0] != '\0' && strcmp(group_id, g->id) != 0) {
            continue;
        }
        for (size_t r = 0; r < g->n; r++) {
            v.joined += g->member[r];
            v.joining += g->parked[r].on;
        }
        if (fn != NULL) {
            fn(arg, &v);
        }
        shown++;
    }
    return shown;
}

size_t
group_parked(const struct group_table *t)
{
    return t->parked;
}
