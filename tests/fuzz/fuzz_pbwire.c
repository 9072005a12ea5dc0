/* common/pbwire.c, the hand-written reading of ListDevices pages, against protobuf-c on the
 * same bytes: as a DeviceInfo, both refuse or both read the same fields; as a page, what
 * protobuf-c reads pbwire reads too (count, token, total, every device), and what pbwire
 * refuses protobuf-c refuses. What pbwire reads, written again, reads back the same. */
#include <string.h>

#include "fuzz.h"
#include "pbwire.h"

static void
same_info(const Devcoord__V1__DeviceInfo *a, const Devcoord__V1__DeviceInfo *b, const char *what)
{
    if (strncmp(a->name, b->name, DC_DEVICE_TEXT_MAX + 1) != 0 ||
        strncmp(a->worker, b->worker, DC_WORKER_NAME_MAX + 1) != 0 ||
        (a->device == NULL) != (b->device == NULL) || a->state != b->state ||
        a->memory_bytes != b->memory_bytes ||
        (a->device != NULL &&
         (a->device->backend != b->device->backend || a->device->kind != b->device->kind ||
          a->device->index != b->device->index))) {
        fuzz_finding("%s: pbwire and protobuf-c read different fields", what);
    }
}

/* The bytes as one DeviceInfo; returns whether pbwire read it. */
static bool
check_info(const uint8_t *p, size_t len)
{
    char name[DC_DEVICE_TEXT_MAX + 2], worker[DC_WORKER_NAME_MAX + 2];
    char name2[DC_DEVICE_TEXT_MAX + 2], worker2[DC_WORKER_NAME_MAX + 2];
    Devcoord__V1__DeviceInfo ours, again;
    Devcoord__V1__Device dev, dev2;
    Devcoord__V1__DeviceInfo *theirs = devcoord__v1__device_info__unpack(NULL, len, p);
    bool ok                          = pbwire_read_device_info(p, len, &ours, &dev, name, worker);

    if (ok != (theirs != NULL)) {
        fuzz_finding("DeviceInfo of %zu bytes: pbwire %s, protobuf-c %s", len,
                     ok ? "reads" : "refuses", theirs != NULL ? "reads" : "refuses");
    }
    if (ok) {
        same_info(&ours, theirs, "DeviceInfo");
        /* Within the limits, writing it again gives the same message. */
        if (strlen(ours.name) <= DC_DEVICE_TEXT_MAX && strlen(ours.worker) <= DC_WORKER_NAME_MAX) {
            uint8_t buf[PBWIRE_DEVICE_INFO_MAX];
            size_t n = pbwire_device_info(buf, &ours);
            if (n > sizeof(buf) ||
                !pbwire_read_device_info(buf, n, &again, &dev2, name2, worker2)) {
                fuzz_finding("a DeviceInfo pbwire read does not read back once written");
            }
            same_info(&ours, &again, "DeviceInfo written again");
        }
    }
    devcoord__v1__device_info__free_unpacked(theirs, NULL);
    return ok;
}

static void
check_page(const uint8_t *p, size_t len)
{
    Devcoord__V1__ListDevicesResponse *theirs =
        devcoord__v1__list_devices_response__unpack(NULL, len, p);
    struct pbwire_page page;
    bool ok   = pbwire_scan_page(p, len, &page);
    size_t at = 0, k = 0, dlen;
    const uint8_t *d;

    if (!ok && theirs != NULL) {
        fuzz_finding("a page protobuf-c reads, pbwire refuses");
    }
    if (!ok) {
        return;
    }
    while (pbwire_next_device(p, len, &at, &d, &dlen)) {
        if (d < p || dlen > len || d - p > (ptrdiff_t)(len - dlen)) {
            fuzz_finding("a device outside its page");
        }
        if (theirs != NULL) {
            char name[DC_DEVICE_TEXT_MAX + 2], worker[DC_WORKER_NAME_MAX + 2];
            Devcoord__V1__DeviceInfo ours;
            Devcoord__V1__Device dev;
            if (k >= theirs->n_devices ||
                !pbwire_read_device_info(d, dlen, &ours, &dev, name, worker)) {
                fuzz_finding("device %zu of a page protobuf-c reads: pbwire cannot", k);
            }
            same_info(&ours, theirs->devices[k], "a page's device");
        } else {
            (void)check_info(d, dlen);
        }
        k++;
    }
    if (k != page.n_devices) {
        fuzz_finding("scan counted %zu devices, the walk found %zu", page.n_devices, k);
    }
    if (theirs != NULL) {
        const char *tok = theirs->next_page_token;
        if (k != theirs->n_devices || page.total != theirs->total ||
            (page.token == NULL
                 ? tok[0] != '\0'
                 : strlen(tok) != strnlen((const char *)page.token, page.token_len) ||
                       memcmp(tok, page.token, strlen(tok)) != 0)) {
            fuzz_finding("the page's count, total or token differ from protobuf-c's");
        }
    }
    devcoord__v1__list_devices_response__free_unpacked(theirs, NULL);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    (void)check_info(data, size);
    check_page(data, size);
    return 0;
}
