/*
 * A trainer's view of devcoord: find the devices, put a gradient on each, average them
 * with an all-reduce, read the result back.
 *
 *   cc trainer.c $(pkg-config --cflags --libs devcoord) -o trainer
 *   ./trainer [COORDINATOR]     (default $DEVCOORD_ADDR, then tcp://127.0.0.1:7400)
 *
 * Every device of one backend takes part (the cluster's first backend). Device i holds the
 * gradient [i, i, i, i]; after a mean all-reduce each holds the mean, (n - 1) / 2.
 */
#include <stdio.h>
#include <stdlib.h>

#include <devcoord/devcoord.h>

#define GRAD_LEN 4

static int
fail(const char *what, const dc_status *st)
{
    fprintf(stderr, "trainer: %s: %s: %s\n", what, dc_status_name(st->code), st->message);
    return 1;
}

int
main(int argc, char **argv)
{
    dc_client_options opts   = { .fail_fast = true };
    dc_device_filter healthy = { .state = DC_DEVICE_HEALTHY };
    dc_client *c             = NULL;
    dc_device_list *devs     = NULL;
    dc_device_ref *refs      = NULL;
    dc_op_result *result     = NULL;
    dc_status st;
    size_t n = 0;
    int rc   = 1;

    if (dc_client_open(argc > 1 ? argv[1] : NULL, &opts, &c, &st) != DC_OK) {
        return fail("connect", &st);
    }
    if (dc_list_devices(c, &healthy, &devs, &st) != DC_OK) {
        rc = fail("list devices", &st);
        goto out;
    }
    if (devs->n == 0 || (refs = calloc(devs->n, sizeof(*refs))) == NULL) {
        fprintf(stderr, "trainer: no healthy device\n");
        goto out;
    }

    /* One gradient per device of the first backend listed. */
    for (size_t i = 0; i < devs->n; i++) {
        const dc_device_info *d = &devs->devices[i];
        const uint64_t shape[1] = { GRAD_LEN };
        float grad[GRAD_LEN];

        if (d->device.backend != devs->devices[0].device.backend) {
            continue;
        }
        for (int k = 0; k < GRAD_LEN; k++) {
            grad[k] = (float)n;
        }
        if (dc_tensor_put(c, d->name, "grad", DC_DTYPE_F32, shape, 1, grad, sizeof(grad), &st) !=
            DC_OK) {
            rc = fail(d->name, &st);
            goto out;
        }
        snprintf(refs[n].worker, sizeof(refs[n].worker), "%s", d->worker);
        refs[n].device = d->device;
        n++;
    }

    {
        dc_op_request req = { .kind      = DC_OP_ALL_REDUCE,
                              .reduce    = DC_REDUCE_MEAN,
                              .devices   = refs,
                              .n_devices = n,
                              .tensor    = "grad" };
        if (dc_submit(c, &req, &result, &st) != DC_OK) {
            rc = fail("all-reduce", &st);
            goto out;
        }
        printf("all-reduce %s over %zu devices on %zu workers: %s in %llu us\n", result->op_id, n,
               result->n_plan_workers, dc_status_name(result->status.code),
               (unsigned long long)result->elapsed_us);
    }

    for (size_t i = 0; i < devs->n; i++) {
        dc_tensor *t = NULL;
        if (devs->devices[i].device.backend != devs->devices[0].device.backend) {
            continue;
        }
        if (dc_tensor_get(c, devs->devices[i].name, "grad", &t, &st) != DC_OK) {
            rc = fail(devs->devices[i].name, &st);
            goto out;
        }
        printf("  %-24s grad[0] = %g (expected %g)\n", t->device, ((float *)t->data)[0],
               (double)(n - 1) / 2);
        dc_tensor_free(t);
    }
    rc = 0;
out:
    dc_op_result_free(result);
    free(refs);
    dc_device_list_free(devs);
    dc_client_close(c);
    return rc;
}
