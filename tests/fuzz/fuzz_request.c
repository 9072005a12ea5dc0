/* The request envelope and every request message of both services, decoded as the server
 * decodes them (rpc_request_open, rpc_request_body), then read field by field; SubmitOp goes
 * on through validation rules 1-5 as the coordinator runs them, GetDevice through the
 * device grammar. The input is one frame as it arrives in an nng message. */
#include <stdlib.h>
#include <string.h>

#include "device.h"
#include "fuzz.h"
#include "rpc.h"
#include "validate.h"

/* limits.max_group_devices by default (config.h). */
#define MAX_GROUP_DEVICES 4096

/* Rules 1-5 over the request's devices, as ops_submit does before it asks the registry. */
static void
check_submit(const Devcoord__V1__SubmitOpRequest *in)
{
    static const enum autodiff_policy policies[] = { AUTODIFF_STRIP, AUTODIFF_UNWRAP_ALL,
                                                     AUTODIFF_REJECT };
    char group_id[VALIDATE_GROUP_ID_SIZE];
    dc_device_ref *refs, *out;
    dc_status st;

    if (in->n_devices == 0 || in->n_devices > MAX_GROUP_DEVICES) {
        return;
    }
    refs = calloc(in->n_devices, sizeof(*refs));
    out  = calloc(in->n_devices, sizeof(*out));
    if (refs == NULL || out == NULL) {
        goto out;
    }
    for (size_t i = 0; i < in->n_devices; i++) {
        if (device_ref_from_pb(in->devices[i], &refs[i], &st) != DC_OK) {
            goto out;
        }
    }
    for (size_t p = 0; p < sizeof(policies) / sizeof(policies[0]); p++) {
        struct op_spec op             = { .kind      = (dc_op_kind)in->kind,
                                          .reduce    = (dc_reduce_op)in->reduce,
                                          .root      = in->root,
                                          .devices   = refs,
                                          .n_devices = in->n_devices };
        struct validate_limits limits = { .max_group_devices = MAX_GROUP_DEVICES,
                                          .autodiff          = policies[p] };

        status_clear(&st);
        if (validate_op(&op, &limits, NULL, out, group_id, &st) != DC_OK) {
            fuzz_check_status(&st);
            if (st.device_index >= (int32_t)in->n_devices) {
                fuzz_finding("validation blames devices[%d] of %zu", st.device_index,
                             in->n_devices);
            }
            continue;
        }
        if (strlen(group_id) != VALIDATE_GROUP_ID_SIZE - 1) {
            fuzz_finding("group id '%s' is not 16 hex digits", group_id);
        }
        for (size_t i = 0; i < in->n_devices; i++) {
            if (out[i].autodiff_depth != 0) {
                fuzz_finding("plan device %zu still wrapped in autodiff", i);
            }
        }
    }
out:
    free(refs);
    free(out);
}

static void
check_input(const ProtobufCMessage *in)
{
    if (fuzz_walk_message(in) == 0) {
        fuzz_check_repack(in);
    }
    if (in->descriptor == &devcoord__v1__submit_op_request__descriptor) {
        check_submit((const Devcoord__V1__SubmitOpRequest *)in);
    } else if (in->descriptor == &devcoord__v1__get_device_request__descriptor) {
        const char *name = ((const Devcoord__V1__GetDeviceRequest *)in)->name;
        dc_device_ref ref;
        dc_status st;

        status_clear(&st);
        if (dc_device_ref_parse(name, strnlen(name, DC_DEVICE_TEXT_MAX + 1), &ref, &st) != DC_OK) {
            fuzz_check_status(&st);
        }
    }
}

static void
decode(const ProtobufCServiceDescriptor *svc, const uint8_t *data, size_t size)
{
    struct rpc_request r;
    dc_status st;

    status_clear(&st);
    if (rpc_request_open(data, size, svc, &r, &st) != DC_OK) {
        fuzz_check_status(&st);
        goto out;
    }
    fuzz_walk_message(&r.header->base);
    if (r.method < svc->methods || r.method >= svc->methods + svc->n_methods) {
        fuzz_finding("request opened with a method outside %s", svc->name);
    }
    if (r.frame.attachment + r.frame.attachment_len != data + size) {
        fuzz_finding("frame split leaves bytes out");
    }
    if (rpc_request_body(&r, &st) != DC_OK) {
        fuzz_check_status(&st);
        goto out;
    }
    if (r.input->descriptor != r.method->input) {
        fuzz_finding("%s decoded as %s", r.method->name, r.input->descriptor->name);
    }
    check_input(r.input);
out:
    rpc_request_close(&r);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    decode(&devcoord__v1__coordinator__descriptor, data, size);
    decode(&devcoord__v1__worker__descriptor, data, size);
    return 0;
}
