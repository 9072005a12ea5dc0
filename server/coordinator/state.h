/*
 * Operator intent on disk: the cordon and drain decisions survive a coordinator restart.
 * The state file (state_dir/intent.state) is rewritten whole on every change: temp file,
 * fsync, rename, fsync of the directory. A corrupt or truncated file is reported and
 * ignored, never fatal; a state_dir that cannot be written is fatal at start (state_check),
 * and a change that cannot be saved is refused (registry_store).
 */
#ifndef DEVCOORD_COORDINATOR_STATE_H
#define DEVCOORD_COORDINATOR_STATE_H

#include "registry.h"
#include "status.h"

#define STATE_FILE "intent.state"
/* Where unreadable intent is kept (a file's name, an etcd key's), as the next save would
 * replace it. */
#define STATE_UNREADABLE_SUFFIX ".unreadable"

/* Restores intent from dir into r. DC_OK when there is no file; DC_DATA_LOSS (with st) when
 * the file is unusable — then nothing is restored, and a file that was read but does not
 * parse is renamed with STATE_UNREADABLE_SUFFIX (st says where it went). */
dc_code state_load(const char *dir, struct registry *r, size_t *restored, dc_status *st);

/* Appends to st's message where unreadable intent was kept ("; kept as KEPT"), or why it
 * could not be (failed: "; could not keep it as KEPT: FAILED"). */
void state_note_kept(dc_status *st, const char *kept, const char *failed);

/* Writes entries (every worker's intent) to dir atomically. DC_UNAVAILABLE with the path
 * and the system's reason ("No space left on device") when it cannot; the old file is then
 * left as it was. */
dc_code state_save(const char *dir, const struct registry_intent_entry *entries, size_t n,
                   dc_status *st);

/* Whether dir can take a save: writes, syncs and removes the temporary file a save uses.
 * DC_UNAVAILABLE naming state_dir and the reason when it cannot. */
dc_code state_check(const char *dir, dc_status *st);

/* The intent text a save writes (what the etcd backend stores under PREFIX/intent);
 * *text malloc'd. */
dc_code state_format(const struct registry_intent_entry *entries, size_t n, char **text,
                     size_t *len, dc_status *st);

/* Restores intent from text (as state_format writes it; name stands for it in messages),
 * checked whole before anything is applied as state_load does. "" restores nothing. */
dc_code state_load_text(const char *name, const char *text, size_t len, struct registry *r,
                        size_t *restored, dc_status *st);

/* The registry_store that saves into dir, which must outlive the registry. */
struct registry_store state_store(const char *dir);

#endif
