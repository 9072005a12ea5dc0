/*
 * pbwire against protobuf-c: what it writes must be protobuf-c's bytes, and what it reads
 * must be what protobuf-c reads, including where protobuf-c refuses (every cut and every
 * corrupted byte of real messages).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "pbwire.h"

static uint64_t rng = 0x9e3779b97f4a7c15u;

static uint64_t
rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* A varied DeviceInfo: empty and long strings, zero and huge numbers, negative enums. */
static void
random_info(Devcoord__V1__DeviceInfo *pb, Devcoord__V1__Device *dev, char *name, char *worker)
{
    static const uint64_t mems[] = { 0, 1, 127, 128, 16384, (uint64_t)80 << 30, UINT64_MAX };
    size_t nlen                  = rnd() % 4 == 0 ? 0 : rnd() % (DC_DEVICE_TEXT_MAX + 1);
    size_t wlen                  = rnd() % 4 == 0 ? 0 : rnd() % (DC_WORKER_NAME_MAX + 1);

    for (size_t i = 0; i < nlen; i++) {
        name[i] = (char)('a' + rnd() % 26);
    }
    name[nlen] = '\0';
    for (size_t i = 0; i < wlen; i++) {
        worker[i] = (char)('0' + rnd() % 10);
    }
    worker[wlen] = '\0';
    devcoord__v1__device_info__init(pb);
    devcoord__v1__device__init(dev);
    dev->backend     = (Devcoord__V1__Backend)(rnd() % 5);
    dev->kind        = (Devcoord__V1__Kind)(rnd() % 8 == 0 ? -1 : (int)(rnd() % 4));
    dev->index       = rnd() % 3 == 0 ? 0 : (uint32_t)rnd();
    pb->name         = name;
    pb->worker       = worker;
    pb->device       = dev;
    pb->state        = (Devcoord__V1__DeviceState)(rnd() % 4);
    pb->memory_bytes = mems[rnd() % (sizeof(mems) / sizeof(mems[0]))];
}

static size_t
write_info(const Devcoord__V1__DeviceInfo *pb, uint8_t *out)
{
    dc_device d = { .backend = (dc_backend)pb->device->backend,
                    .kind    = (dc_kind)pb->device->kind,
                    .index   = pb->device->index };

    return pbwire_device_info(out, pb->name, strlen(pb->name), pb->worker, strlen(pb->worker), &d,
                              (uint32_t)pb->state, pb->memory_bytes);
}

static void
test_writes_protobuf_c_bytes(void **state)
{
    (void)state;
    for (int i = 0; i < 5000; i++) {
        char name[DC_DEVICE_TEXT_SIZE], worker[DC_WORKER_NAME_MAX + 1];
        Devcoord__V1__DeviceInfo pb;
        Devcoord__V1__Device dev;
        uint8_t ours[PBWIRE_DEVICE_INFO_MAX], theirs[2 * PBWIRE_DEVICE_INFO_MAX];
        size_t n, m;

        random_info(&pb, &dev, name, worker);
        n = write_info(&pb, ours);
        m = protobuf_c_message_pack(&pb.base, theirs);
        assert_true(n <= PBWIRE_DEVICE_INFO_MAX);
        assert_int_equal(n, m);
        assert_memory_equal(ours, theirs, n);
    }
}

/* What protobuf-c makes of bytes, against what pbwire makes of them: both refuse, or both
 * read the same fields. */
static void
same_reading(const uint8_t *p, size_t len)
{
    char name[DC_DEVICE_TEXT_MAX + 2], worker[DC_WORKER_NAME_MAX + 2];
    Devcoord__V1__DeviceInfo ours;
    Devcoord__V1__Device dev;
    Devcoord__V1__DeviceInfo *theirs = devcoord__v1__device_info__unpack(NULL, len, p);
    bool ok                          = pbwire_read_device_info(p, len, &ours, &dev, name, worker);

    assert_int_equal(ok, theirs != NULL);
    if (ok) {
        /* Strings as far as a client looks: one byte past the limit. */
        assert_int_equal(strncmp(ours.name, theirs->name, DC_DEVICE_TEXT_MAX + 1), 0);
        assert_int_equal(strncmp(ours.worker, theirs->worker, DC_WORKER_NAME_MAX + 1), 0);
        assert_int_equal(ours.device == NULL, theirs->device == NULL);
        if (ours.device != NULL) {
            assert_int_equal(ours.device->backend, theirs->device->backend);
            assert_int_equal(ours.device->kind, theirs->device->kind);
            assert_int_equal(ours.device->index, theirs->device->index);
        }
        assert_int_equal(ours.state, theirs->state);
        assert_true(ours.memory_bytes == theirs->memory_bytes);
    }
    devcoord__v1__device_info__free_unpacked(theirs, NULL);
}

static void
test_reads_what_protobuf_c_reads(void **state)
{
    (void)state;
    for (int i = 0; i < 300; i++) {
        char name[DC_DEVICE_TEXT_SIZE], worker[DC_WORKER_NAME_MAX + 1];
        Devcoord__V1__DeviceInfo pb;
        Devcoord__V1__Device dev;
        uint8_t buf[PBWIRE_DEVICE_INFO_MAX + 64];
        size_t n;

        random_info(&pb, &dev, name, worker);
        n = protobuf_c_message_pack(&pb.base, buf);
        same_reading(buf, n);
        /* Every cut: most refused (a string or varint cut short), some valid shorter. */
        for (size_t cut = 0; cut < n; cut++) {
            same_reading(buf, cut);
        }
        /* Corrupted bytes: wire types, lengths, field numbers gone wrong. */
        for (int k = 0; k < 40; k++) {
            uint8_t bad[sizeof(buf)];
            memcpy(bad, buf, n);
            bad[rnd() % (n ? n : 1)] ^= (uint8_t)(1u << (rnd() % 8));
            same_reading(bad, n);
        }
    }
}

static void
test_reads_any_order_and_skips_unknown_fields(void **state)
{
    /* state 2, an unknown fixed64 (field 9), name "n", device twice (the
     * second wins whole, as protobuf-c 1.4 reads it: backend 0, index 7), an unknown string (field
     * 12), worker "w". */
    static const uint8_t msg[] = { 0x20, 0x02, 0x49, 1,    2,    3,    4,    5,    6,    7,
                                   8,    0x0a, 0x01, 'n',  0x1a, 0x02, 0x08, 0x02, 0x1a, 0x02,
                                   0x18, 0x07, 0x62, 0x02, 'x',  'y',  0x12, 0x01, 'w' };
    char name[DC_DEVICE_TEXT_MAX + 2], worker[DC_WORKER_NAME_MAX + 2];
    Devcoord__V1__DeviceInfo pb;
    Devcoord__V1__Device dev;

    (void)state;
    assert_true(pbwire_read_device_info(msg, sizeof(msg), &pb, &dev, name, worker));
    assert_string_equal(pb.name, "n");
    assert_string_equal(pb.worker, "w");
    assert_int_equal(pb.state, 2);
    assert_non_null(pb.device);
    assert_int_equal(pb.device->backend, 0);
    assert_int_equal(pb.device->index, 7);
    same_reading(msg, sizeof(msg));
}

/* Found by fuzz_pbwire: a key of four bytes whose number is 0 (0x80 0x80 0x80 0x00).
 * protobuf-c reads it as an unknown field, since only a first byte without number bits is
 * refused; so does pbwire. */
static void
test_reads_keys_as_protobuf_c_does(void **state)
{
    static const uint8_t msg[] = { 0x0a, 0x02, 'a',  'b',  0x20, 0x01, 0x28, 0xbc,
                                   0xbc, 0x80, 0x22, 0x80, 0x80, 0x80, 0x00, 0x6f };
    /* A five-byte key, and one of six (refused). */
    static const uint8_t five[] = { 0x0a, 0x01, 'a', 0xf8, 0xff, 0xff, 0xff, 0x0f, 0x00 };
    static const uint8_t six[]  = { 0x0a, 0x01, 'a', 0xf8, 0xff, 0xff, 0xff, 0x8f, 0x00, 0x00 };
    char name[DC_DEVICE_TEXT_MAX + 2], worker[DC_WORKER_NAME_MAX + 2];
    Devcoord__V1__DeviceInfo pb;
    Devcoord__V1__Device dev;

    (void)state;
    assert_true(pbwire_read_device_info(msg, sizeof(msg), &pb, &dev, name, worker));
    same_reading(msg, sizeof(msg));
    same_reading(five, sizeof(five));
    same_reading(six, sizeof(six));
    assert_false(pbwire_read_device_info(six, sizeof(six), &pb, &dev, name, worker));
}

static void
test_scans_a_page(void **state)
{
    Devcoord__V1__ListDevicesResponse resp = DEVCOORD__V1__LIST_DEVICES_RESPONSE__INIT;
    Devcoord__V1__DeviceInfo infos[3], *ptrs[3];
    Devcoord__V1__Device devs[3];
    char names[3][DC_DEVICE_TEXT_SIZE], workers[3][DC_WORKER_NAME_MAX + 1];
    struct pbwire_page page;
    uint8_t *buf;
    size_t len, at = 0, dlen, k = 0;
    const uint8_t *d;

    (void)state;
    for (int i = 0; i < 3; i++) {
        random_info(&infos[i], &devs[i], names[i], workers[i]);
        ptrs[i] = &infos[i];
    }
    resp.n_devices       = 3;
    resp.devices         = ptrs;
    resp.next_page_token = "node-b/4";
    resp.total           = 100000;
    buf                  = malloc(protobuf_c_message_get_packed_size(&resp.base));
    len                  = protobuf_c_message_pack(&resp.base, buf);
    assert_true(pbwire_scan_page(buf, len, &page));
    assert_int_equal(page.n_devices, 3);
    assert_int_equal(page.token_len, 8);
    assert_memory_equal(page.token, "node-b/4", 8);
    assert_true(page.total == 100000);
    while (pbwire_next_device(buf, len, &at, &d, &dlen)) {
        uint8_t want[PBWIRE_DEVICE_INFO_MAX];
        assert_true(k < 3);
        assert_int_equal(dlen, write_info(&infos[k], want));
        assert_memory_equal(d, want, dlen);
        k++;
    }
    assert_int_equal(k, 3);
    /* Cut anywhere inside, the page is refused or reads as fewer devices, never past its end. */
    for (size_t cut = 0; cut < len; cut++) {
        if (pbwire_scan_page(buf, cut, &page)) {
            assert_true(page.n_devices <= 3);
        }
    }
    /* A wrong wire type for a known field is refused, as protobuf-c refuses it. */
    buf[0] = 0x08; /* devices as a varint */
    assert_false(pbwire_scan_page(buf, len, &page));
    free(buf);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_writes_protobuf_c_bytes),
        cmocka_unit_test(test_reads_what_protobuf_c_reads),
        cmocka_unit_test(test_reads_any_order_and_skips_unknown_fields),
        cmocka_unit_test(test_reads_keys_as_protobuf_c_does),
        cmocka_unit_test(test_scans_a_page),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
