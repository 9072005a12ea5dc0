/*
 * Device model helpers beyond the public grammar (include/devcoord/types.h): kind
 * rules per backend family, worker-name checks, comparison of concrete devices and the
 * conversion to and from the wire DeviceRef. Plain values; nothing allocated.
 */
#ifndef DEVCOORD_COMMON_DEVICE_H
#define DEVCOORD_COMMON_DEVICE_H

#include <stdbool.h>
#include <stddef.h>

#include "devcoord/types.h"
#include "devcoord/v1/devcoord.pb-c.h"

/* Kind a backend gets when none is named: DC_KIND_DEFAULT (wgpu family), DC_KIND_CPU
 * (libtorch), DC_KIND_NONE (backends without kinds). */
dc_kind device_default_kind(dc_backend backend);

/* Whether `kind` (not DC_KIND_NONE) may follow `backend`. */
bool device_kind_allowed(dc_backend backend, dc_kind kind);

/* Checks backend and kind and fills in the default kind. DC_INVALID_ARGUMENT when the
 * backend is unknown or the kind does not belong to it. */
dc_code device_normalize(dc_device *dev, dc_status *st);

/* [A-Za-z0-9][A-Za-z0-9._-]{0,62}. */
bool device_worker_name_valid(const char *name, size_t len);

/* Orders concrete devices by worker, backend, kind, index; autodiff depth is ignored, so
 * autodiff(x) and x compare equal. */
int device_ref_compare_concrete(const dc_device_ref *a, const dc_device_ref *b);

/* Cluster name "worker/concrete" into buf (DC_DEVICE_TEXT_SIZE always suffices). */
size_t device_cluster_name(const char *worker, const dc_device *dev, char *buf, size_t cap);

/* Wire conversions. from_pb checks and normalizes what a peer sent: an unknown backend or
 * kind, a kind of another family or a bad worker name is DC_INVALID_ARGUMENT. to_pb points
 * the message at strings inside `ref`, which must outlive it. */
dc_code device_from_pb(const Devcoord__V1__Device *pb, dc_device *out, dc_status *st);
dc_code device_ref_from_pb(const Devcoord__V1__DeviceRef *pb, dc_device_ref *out, dc_status *st);
void device_to_pb(const dc_device *dev, Devcoord__V1__Device *pb);
void device_ref_to_pb(dc_device_ref *ref, Devcoord__V1__DeviceRef *pb, Devcoord__V1__Device *dev);

#endif
