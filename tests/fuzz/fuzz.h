/*
 * What the libFuzzer targets of tests/fuzz share: the entry point's prototype, a way to
 * report a finding, and a walk that reads every field of a decoded message (so a pointer or
 * length the decoder got wrong shows under ASan) and checks the device messages in it.
 */
#ifndef DEVCOORD_FUZZ_H
#define DEVCOORD_FUZZ_H

#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

#include "devcoord/v1/devcoord.pb-c.h"
#include "status.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A broken property, not a sanitizer report: prints why and aborts, which libFuzzer saves
 * as a crash. */
void fuzz_finding(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

/* Reads every field of m, recursing into submessages; every DeviceRef and Device met is
 * converted as a server would and checked (fuzz_check_device_ref). Returns how many unknown
 * fields m holds, submessages included. */
size_t fuzz_walk_message(const ProtobufCMessage *m);

/* device_ref_from_pb, then format; when the reference is within the text grammar
 * (depth <= DC_AUTODIFF_MAX), the text must parse back to the same reference. */
void fuzz_check_device_ref(const Devcoord__V1__DeviceRef *pb);
void fuzz_check_device(const Devcoord__V1__Device *pb);

/* A status a function filled must be one of the codes and carry a terminated message. */
void fuzz_check_status(const dc_status *st);

/* Packs m, decodes the bytes again and packs that: both encodings must be equal. Only for
 * messages without unknown fields: protobuf-c keeps some it cannot read back (field number
 * 0 in an overlong tag, 80 00, is kept and re-encoded as 00, which it refuses), and
 * devcoord never re-encodes what a peer sent. */
void fuzz_check_repack(const ProtobufCMessage *m);

#endif
