/*
 * Operator intent on disk: the cordon and drain decisions survive a coordinator restart.
 * The state file (state_dir/intent.state) is rewritten whole on every change: temp file,
 * fsync, rename, fsync of the directory. A corrupt or truncated file is reported and
 * ignored, never fatal.
 */
#ifndef DEVCOORD_COORDINATOR_STATE_H
#define DEVCOORD_COORDINATOR_STATE_H

#include "registry.h"
#include "status.h"

#define STATE_FILE "intent.state"

/* Restores intent from dir into r. DC_OK when there is no file; DC_DATA_LOSS (with st) when
 * the file is unusable — then nothing is restored. */
dc_code state_load(const char *dir, struct registry *r, size_t *restored, dc_status *st);

/* Writes r's intent to dir atomically. */
dc_code state_save(const char *dir, struct registry *r, dc_status *st);

#endif
