/*
 * Protocol buffers wire format by hand, for the one message big enough for protobuf-c's
 * generic code to be most of its cost: a page of ListDevices (32k DeviceInfo). protobuf-c
 * walks each message's descriptor once to size it and again to pack it, and unpacks every
 * device into its own structs before the client copies them out again; here a device is
 * written in one pass from the registry, and read in one pass into the caller's structs.
 *
 * What is written is what protobuf-c writes for the same DeviceInfo, byte for byte (proto3:
 * fields in number order, defaults left out). Reading takes what protobuf-c 1.4 takes (fields
 * in any order, repeated, unknown ones skipped) and refuses what it refuses.
 */
#ifndef DEVCOORD_COMMON_PBWIRE_H
#define DEVCOORD_COMMON_PBWIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "arena.h"
#include "devcoord/types.h"
#include "devcoord/v1/devcoord.pb-c.h"

/* The most bytes a Device takes: backend and kind as negative enums (an enum is written as an
 * int32: ten bytes when negative), each with its tag, then the index (uint32) with its tag. */
#define PBWIRE_DEVICE_MAX ((1 + 10) + (1 + 10) + (1 + 5))
/* The most bytes pbwire_device_info writes: tags, lengths and the strings at their limits
 * (name: a tag and a two-byte length; worker: a tag and a one-byte length), the device with
 * its tag and one-byte length, state (an enum, negative at most) and memory_bytes (uint64),
 * each with its tag. */
#define PBWIRE_DEVICE_INFO_MAX                                                                  \
    ((3 + DC_DEVICE_TEXT_MAX) + (2 + DC_WORKER_NAME_MAX) + (2 + PBWIRE_DEVICE_MAX) + (1 + 10) + \
     (1 + 10))

/* pb's bytes (its fields, without a tag or length of its own) into out, which holds
 * PBWIRE_DEVICE_INFO_MAX bytes; returns how many. name and worker are cut at their limits
 * (DC_DEVICE_TEXT_MAX, DC_WORKER_NAME_MAX); the device is left out when NULL. */
size_t pbwire_device_info(uint8_t *out, const Devcoord__V1__DeviceInfo *pb);

/* pb as field `field` of the message around it, for protobuf-c to write as one of that
 * message's unknown fields (*f): its length and its bytes, in memory from a. False when a is
 * spent. */
bool pbwire_device_info_field(struct arena *a, uint32_t field, const Devcoord__V1__DeviceInfo *pb,
                              ProtobufCMessageUnknownField *f);

/* A DeviceInfo read from its bytes into *pb, as protobuf-c would unpack it: strings copied,
 * NUL-terminated, into name (room for DC_DEVICE_TEXT_MAX + 2 bytes) and worker
 * (DC_WORKER_NAME_MAX + 2), cut one byte past their limit so that a longer one still reads as
 * too long; pb->device points to *dev when the message has one. False when malformed. */
bool pbwire_read_device_info(const uint8_t *p, size_t len, Devcoord__V1__DeviceInfo *pb,
                             Devcoord__V1__Device *dev, char *name, char *worker);

/* A ListDevicesResponse's top level, without reading its devices. */
struct pbwire_page {
    size_t n_devices;
    const uint8_t *token; /* next_page_token, not NUL-terminated; NULL when absent */
    size_t token_len;
    uint64_t total;
};

/* Scans a ListDevicesResponse; false when malformed. */
bool pbwire_scan_page(const uint8_t *p, size_t len, struct pbwire_page *out);

/* Walks a ListDevicesResponse's devices in order: *at starts at 0; each call gives the next
 * device's bytes and returns true, false at the end. The body must have passed
 * pbwire_scan_page. */
bool pbwire_next_device(const uint8_t *p, size_t len, size_t *at, const uint8_t **dev,
                        size_t *dev_len);

#endif
