/*
 * The fingerprint of a SubmitOp request, kept with its idempotency key: a key names one
 * request, and the same key sent with another request is refused rather than answered with
 * an op it did not ask for. Workers remember it with the keys they committed, so the check
 * holds after a coordinator restart too. Pure.
 */
#ifndef DEVCOORD_COORDINATOR_OPKEY_H
#define DEVCOORD_COORDINATOR_OPKEY_H

#include <stdint.h>

#include "devcoord/v1/devcoord.pb-c.h"

/* A 64-bit hash of what the request asks, as sent: kind, reduce op, root, tensor, output
 * tensor and the device list in order. Not of how long to wait (timeout_ms), whether to run
 * (dry_run) or the key itself: a retry may wait longer and still be the same op. */
uint64_t opkey_fingerprint(const Devcoord__V1__SubmitOpRequest *in);

#endif
