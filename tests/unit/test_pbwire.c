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

/* A DeviceInfo with the room its strings and device need. */
struct sample {
    Devcoord__V1__DeviceInfo pb;
    Devcoord__V1__Device dev;
    char name[DC_DEVICE_TEXT_SIZE];
    char worker[DC_WORKER_NAME_MAX + 1];
};

/* A varied DeviceInfo: empty and long strings, zero and huge numbers, negative enums, no
 * device. */
static void
random_info(struct sample *x)
{
    static const uint64_t mems[] = { 0, 1, 127, 128, 16384, (uint64_t)80 << 30, UINT64_MAX };
    size_t nlen                  = rnd() % 4 == 0 ? 0 : rnd() % (DC_DEVICE_TEXT_MAX + 1);
    size_t wlen                  = rnd() % 4 == 0 ? 0 : rnd() % (DC_WORKER_NAME_MAX + 1);

    for (size_t i = 0; i < nlen; i++) {
        x->name[i] = (char)('a' + rnd() % 26);
    }
    x->name[nlen] = '\0';
    for (size_t i = 0; i < wlen; i++) {
        x->worker[i] = (char)('0' + rnd() % 10);
    }
    x->worker[wlen] = '\0';
    devcoord__v1__device_info__init(&x->pb);
    devcoord__v1__device__init(&x->dev);
    x->dev.backend     = (Devcoord__V1__Backend)(rnd() % 8 == 0 ? -1 : (int)(rnd() % 5));
    x->dev.kind        = (Devcoord__V1__Kind)(rnd() % 8 == 0 ? -1 : (int)(rnd() % 4));
    x->dev.index       = rnd() % 3 == 0 ? 0 : (uint32_t)rnd();
    x->pb.name         = x->name;
    x->pb.worker       = x->worker;
    x->pb.device       = rnd() % 8 == 0 ? NULL : &x->dev;
    x->pb.state        = (Devcoord__V1__DeviceState)(rnd() % 8 == 0 ? -1 : (int)(rnd() % 4));
    x->pb.memory_bytes = mems[rnd() % (sizeof(mems) / sizeof(mems[0]))];
}

static void
test_writes_protobuf_c_bytes(void **state)
{
    (void)state;
    /* Every field at its longest: the bound is met exactly, protobuf-c writes the same. */
    {
        uint8_t ours[PBWIRE_DEVICE_INFO_MAX], theirs[2 * PBWIRE_DEVICE_INFO_MAX];
        struct sample x;
        memset(x.name, 'n', DC_DEVICE_TEXT_MAX);
        x.name[DC_DEVICE_TEXT_MAX] = '\0';
        memset(x.worker, 'w', DC_WORKER_NAME_MAX);
        x.worker[DC_WORKER_NAME_MAX] = '\0';
        devcoord__v1__device_info__init(&x.pb);
        devcoord__v1__device__init(&x.dev);
        x.dev.backend     = (Devcoord__V1__Backend)INT32_MIN;
        x.dev.kind        = (Devcoord__V1__Kind)-1;
        x.dev.index       = UINT32_MAX;
        x.pb.name         = x.name;
        x.pb.worker       = x.worker;
        x.pb.device       = &x.dev;
        x.pb.state        = (Devcoord__V1__DeviceState)-2;
        x.pb.memory_bytes = UINT64_MAX;
        assert_int_equal(pbwire_device_info(ours, &x.pb), PBWIRE_DEVICE_INFO_MAX);
        assert_int_equal(protobuf_c_message_pack(&x.pb.base, theirs), PBWIRE_DEVICE_INFO_MAX);
        assert_memory_equal(ours, theirs, PBWIRE_DEVICE_INFO_MAX);
    }
    for (int i = 0; i < 5000; i++) {
        uint8_t ours[PBWIRE_DEVICE_INFO_MAX], theirs[2 * PBWIRE_DEVICE_INFO_MAX];
        struct sample x;
        size_t n;

        random_info(&x);
        n = pbwire_device_info(ours, &x.pb);
        assert_true(n <= PBWIRE_DEVICE_INFO_MAX);
        assert_int_equal(n, protobuf_c_message_pack(&x.pb.base, theirs));
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
        uint8_t buf[PBWIRE_DEVICE_INFO_MAX + 64];
        struct sample x;
        size_t n;

        random_info(&x);
        n = protobuf_c_message_pack(&x.pb.base, buf);
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
    /* state 2, an unknown fixed64 (field 9), name "n", device twice (the second wins whole,
     * as protobuf-c 1.4 reads it: backend 0, index 7), an unknown string (field 12), worker
     * "w". */
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

/* A page as protobuf-c packs it (devices first) and as the coordinator sends it (devices as
 * unknown fields written by pbwire_device_info_field, after token and total): both scan to
 * the same count, token and total, and walk to the same devices' bytes. */
static void
test_scans_a_page_either_way(void **state)
{
    Devcoord__V1__ListDevicesResponse resp = DEVCOORD__V1__LIST_DEVICES_RESPONSE__INIT;
    Devcoord__V1__DeviceInfo *ptrs[3];
    ProtobufCMessageUnknownField fields[3];
    struct arena *a = arena_new(1 << 16);
    struct sample x[3];

    (void)state;
    assert_non_null(a);
    for (int i = 0; i < 3; i++) {
        random_info(&x[i]);
        ptrs[i] = &x[i].pb;
        assert_true(pbwire_device_info_field(a, 1, &x[i].pb, &fields[i]));
    }
    resp.next_page_token = "node-b/4";
    resp.total           = 100000;
    for (int way = 0; way < 2; way++) {
        struct pbwire_page page;
        size_t len, at = 0, dlen, k = 0;
        const uint8_t *d;
        uint8_t *buf;

        resp.n_devices             = way == 0 ? 3 : 0;
        resp.devices               = way == 0 ? ptrs : NULL;
        resp.base.n_unknown_fields = way == 0 ? 0 : 3;
        resp.base.unknown_fields   = way == 0 ? NULL : fields;
        assert_non_null(buf = malloc(protobuf_c_message_get_packed_size(&resp.base)));
        len = protobuf_c_message_pack(&resp.base, buf);
        assert_true(pbwire_scan_page(buf, len, &page));
        assert_int_equal(page.n_devices, 3);
        assert_int_equal(page.token_len, 8);
        assert_memory_equal(page.token, "node-b/4", 8);
        assert_true(page.total == 100000);
        while (pbwire_next_device(buf, len, &at, &d, &dlen)) {
            uint8_t want[PBWIRE_DEVICE_INFO_MAX];
            assert_true(k < 3);
            assert_int_equal(dlen, pbwire_device_info(want, &x[k].pb));
            assert_memory_equal(d, want, dlen);
            k++;
        }
        assert_int_equal(k, 3);
        /* Cut anywhere, the page is refused or reads as fewer devices, never past its end. */
        for (size_t cut = 0; cut < len; cut++) {
            if (pbwire_scan_page(buf, cut, &page)) {
                assert_true(page.n_devices <= 3);
            }
        }
        free(buf);
    }
    arena_free(a);
}

/* A known field of the wrong wire type is refused, as protobuf-c refuses it. */
static void
test_a_page_field_of_the_wrong_type_is_refused(void **state)
{
    static const uint8_t devices_as_varint[] = { 0x08, 0x01 };
    static const uint8_t total_as_string[]   = { 0x1a, 0x01, '7' };
    struct pbwire_page page;

    (void)state;
    assert_false(pbwire_scan_page(devices_as_varint, sizeof(devices_as_varint), &page));
    assert_false(pbwire_scan_page(total_as_string, sizeof(total_as_string), &page));
    assert_null(devcoord__v1__list_devices_response__unpack(NULL, sizeof(total_as_string),
                                                            total_as_string));
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_writes_protobuf_c_bytes),
        cmocka_unit_test(test_reads_what_protobuf_c_reads),
        cmocka_unit_test(test_reads_any_order_and_skips_unknown_fields),
        cmocka_unit_test(test_reads_keys_as_protobuf_c_does),
        cmocka_unit_test(test_scans_a_page_either_way),
        cmocka_unit_test(test_a_page_field_of_the_wrong_type_is_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
