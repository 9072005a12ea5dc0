#include "state.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "device.h"

/* Format: a header line, one "<intent> <worker>" line per worker, and an end line holding
 * the count, so a truncated file is told from a short one. */
#define STATE_HEADER "devcoord-intent 1"
#define STATE_MAX    (16u << 20)

static const char *const intent_words[] = {
    [INTENT_NONE]   = "none",
    [INTENT_CORDON] = "cordon",
    [INTENT_DRAIN]  = "drain",
};

/* Entries the file lists: those with an intent. */
static size_t
state_count(const struct registry_intent_entry *entries, size_t n)
{
    size_t count = 0;

    for (size_t i = 0; i < n; i++) {
        count += entries[i].intent == INTENT_CORDON || entries[i].intent == INTENT_DRAIN;
    }
    return count;
}

/* The state file's path and the temporary file a save writes first; false when too long. */
static bool
state_paths(const char *dir, char path[4096], char tmp[4096])
{
    return snprintf(path, 4096, "%s/%s", dir, STATE_FILE) < 4096 &&
           snprintf(tmp, 4096, "%s/.%s.tmp", dir, STATE_FILE) < 4096;
}

static void
state_print(FILE *f, const struct registry_intent_entry *entries, size_t n)
{
    fprintf(f, "%s\n", STATE_HEADER);
    for (size_t i = 0; i < n; i++) {
        if (entries[i].intent == INTENT_CORDON || entries[i].intent == INTENT_DRAIN) {
            fprintf(f, "%s %s\n", intent_words[entries[i].intent], entries[i].name);
        }
    }
    fprintf(f, "end %zu\n", state_count(entries, n));
}

dc_code
state_format(const struct registry_intent_entry *entries, size_t n, char **text, size_t *len,
             dc_status *st)
{
    FILE *f = open_memstream(text, len);

    if (f == NULL) {
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
    }
    state_print(f, entries, n);
    if (ferror(f)) {
        fclose(f);
        free(*text);
        *text = NULL;
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
    }
    fclose(f);
    return DC_OK;
}

/* Writes the whole of entries to tmp and syncs it. The writes go through stdio, whose
 * errors (ENOSPC first of all) may only show at the flush: ferror is checked too. */
static dc_code
state_write_tmp(const char *tmp, const struct registry_intent_entry *entries, size_t n,
                dc_status *st)
{
    FILE *f = NULL;
    int fd, err;

    if ((fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600)) < 0) {
        return status_set(st, DC_UNAVAILABLE, "%s: %s", tmp, strerror(errno));
    }
    if ((f = fdopen(fd, "w")) == NULL) {
        err = errno;
        close(fd);
        goto fail;
    }
    errno = 0;
    state_print(f, entries, n);
    if (fflush(f) != 0 || ferror(f) || fsync(fd) != 0) {
        err = errno != 0 ? errno : EIO;
        fclose(f);
        goto fail;
    }
    if (fclose(f) != 0) {
        err = errno;
        goto fail;
    }
    return DC_OK;
fail:
    unlink(tmp);
    return status_set(st, DC_UNAVAILABLE, "%s: %s", tmp, strerror(err));
}

dc_code
state_save(const char *dir, const struct registry_intent_entry *entries, size_t n, dc_status *st)
{
    char path[4096], tmp[4096];
    dc_code code;
    int dfd;

    if (!state_paths(dir, path, tmp)) {
        return status_set(st, DC_INVALID_ARGUMENT, "state_dir path too long");
    }
    if ((code = state_write_tmp(tmp, entries, n, st)) != DC_OK) {
        return code;
    }
    if (rename(tmp, path) != 0) {
        int err = errno;
        unlink(tmp);
        return status_set(st, DC_UNAVAILABLE, "%s: %s", path, strerror(err));
    }
    /* The rename itself must reach the disk. */
    if ((dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) >= 0) {
        fsync(dfd);
        close(dfd);
    }
    return DC_OK;
}

dc_code
state_check(const char *dir, dc_status *st)
{
    char path[4096], tmp[4096];
    dc_code code;

    if (!state_paths(dir, path, tmp)) {
        return status_set(st, DC_INVALID_ARGUMENT, "state_dir %s: path too long", dir);
    }
    /* The very file a save writes: what stops this stops every save. */
    if ((code = state_write_tmp(tmp, NULL, 0, st)) != DC_OK) {
        status_prefix(st, "state_dir cannot keep operator intent");
        return code;
    }
    unlink(tmp);
    return DC_OK;
}

static dc_code
state_store_save(void *arg, const struct registry_intent_entry *entries, size_t n, dc_status *st)
{
    return state_save(arg, entries, n, st);
}

struct registry_store
state_store(const char *dir)
{
    struct registry_store store = { state_store_save, (void *)(uintptr_t)dir };
    return store;
}

/* Reads an intent text from f (path names it in messages) and restores it into r. */
static dc_code
state_load_stream(FILE *f, const char *path, struct registry *r, size_t *restored, dc_status *st)
{
    struct entry {
        enum registry_intent intent;
        char name[DC_WORKER_NAME_MAX + 1];
    } *entries = NULL;
    char line[256];
    size_t n = 0, lineno = 0, end = SIZE_MAX;
    dc_code code = DC_OK;

    *restored = 0;
    /* Everything is read and checked before anything is applied. */
    while (code == DC_OK && fgets(line, sizeof(line), f) != NULL) {
        char *sp, *name;
        size_t len = strlen(line);

        lineno++;
        if (len == 0 || line[len - 1] != '\n' || end != SIZE_MAX) {
            code = status_set(st, DC_DATA_LOSS, "%s:%zu: truncated or garbled", path, lineno);
            break;
        }
        line[len - 1] = '\0';
        if (lineno == 1) {
            if (strcmp(line, STATE_HEADER) != 0) {
                code = status_set(st, DC_DATA_LOSS, "%s:1: not a devcoord intent file", path);
            }
            continue;
        }
        if (strncmp(line, "end ", 4) == 0) {
            char *e;
            unsigned long long v = strtoull(line + 4, &e, 10);
            if (*e != '\0' || e == line + 4 || v != n) {
                code = status_set(st, DC_DATA_LOSS, "%s:%zu: count does not match", path, lineno);
            }
            end = (size_t)v;
            continue;
        }
        if ((sp = strchr(line, ' ')) == NULL) {
            code = status_set(st, DC_DATA_LOSS, "%s:%zu: garbled line", path, lineno);
            break;
        }
        *sp  = '\0';
        name = sp + 1;
        {
            struct entry *grow;
            enum registry_intent in = strcmp(line, "cordon") == 0  ? INTENT_CORDON
                                      : strcmp(line, "drain") == 0 ? INTENT_DRAIN
                                                                   : INTENT_NONE;
            if (in == INTENT_NONE || !device_worker_name_valid(name, strlen(name))) {
                code = status_set(st, DC_DATA_LOSS, "%s:%zu: garbled line", path, lineno);
                break;
            }
            if (n * sizeof(*entries) >= STATE_MAX ||
                (grow = realloc(entries, (n + 1) * sizeof(*entries))) == NULL) {
                code = status_set(st, DC_RESOURCE_EXHAUSTED, "%s: too large", path);
                break;
            }
            entries           = grow;
            entries[n].intent = in;
            snprintf(entries[n].name, sizeof(entries[n].name), "%s", name);
            n++;
        }
    }
    if (code == DC_OK && (ferror(f) || lineno == 0 || end == SIZE_MAX)) {
        code = status_set(st, DC_DATA_LOSS, "%s: truncated (no end line)", path);
    }
    for (size_t i = 0; code == DC_OK && i < n; i++) {
        if (!registry_restore_intent(r, entries[i].name, entries[i].intent)) {
            code = status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory restoring intent");
        }
        (*restored)++;
    }
    free(entries);
    return code;
}

dc_code
state_load(const char *dir, struct registry *r, size_t *restored, dc_status *st)
{
    char path[4096];
    dc_code code;
    FILE *f;

    *restored = 0;
    if (snprintf(path, sizeof(path), "%s/%s", dir, STATE_FILE) >= (int)sizeof(path)) {
        return status_set(st, DC_INVALID_ARGUMENT, "state_dir path too long");
    }
    if ((f = fopen(path, "r")) == NULL) {
        if (errno == ENOENT) {
            return DC_OK;
        }
        return status_set(st, DC_DATA_LOSS, "%s: %s", path, strerror(errno));
    }
    code = state_load_stream(f, path, r, restored, st);
    fclose(f);
    if (code == DC_DATA_LOSS) {
        /* The next save would replace it: what it held stays beside it, for the operator. */
        char kept[4096 + sizeof(STATE_UNREADABLE_SUFFIX)];
        snprintf(kept, sizeof(kept), "%s%s", path, STATE_UNREADABLE_SUFFIX);
        state_note_kept(st, kept, rename(path, kept) == 0 ? NULL : strerror(errno));
    }
    return code;
}

void
state_note_kept(dc_status *st, const char *kept, const char *failed)
{
    size_t at = strnlen(st->message, sizeof(st->message) - 1);

    snprintf(st->message + at, sizeof(st->message) - at, "; %s %s%s%s",
             failed == NULL ? "kept as" : "could not keep it as", kept, failed == NULL ? "" : ": ",
             failed == NULL ? "" : failed);
}

dc_code
state_load_text(const char *name, const char *text, size_t len, struct registry *r,
                size_t *restored, dc_status *st)
{
    dc_code code;
    FILE *f;

    *restored = 0;
    if (len == 0) {
        return DC_OK;
    }
    if ((f = fmemopen((void *)(uintptr_t)text, len, "r")) == NULL) {
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
    }
    code = state_load_stream(f, name, r, restored, st);
    fclose(f);
    return code;
}
