/* Operator intent on disk (server/coordinator/state.c) with a real registry. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "arena.h"
#include "registry.h"
#include "state.h"

static char dir[] = "/tmp/devcoord-state-XXXXXX";

static void
collect(void *arg, const char *name, enum registry_intent intent)
{
    char *out = arg;
    size_t n  = strlen(out);
    snprintf(out + n, 256 - n, "%s=%d;", name, (int)intent);
}

static void
write_file(const char *text)
{
    char path[256];
    FILE *f;

    snprintf(path, sizeof(path), "%s/%s", dir, STATE_FILE);
    assert_non_null(f = fopen(path, "w"));
    fputs(text, f);
    fclose(f);
}

static struct registry *
fresh(void)
{
    struct registry_opts o = { .heartbeat_interval_ms = 1000, .dead_after_ms = 5000 };
    return registry_new(&o);
}

static void
test_round_trip(void **state)
{
    static const struct registry_intent_entry entries[] = {
        { "node-a", INTENT_CORDON },
        { "node-b", INTENT_DRAIN },
        { "node-c", INTENT_NONE }, /* not written */
    };
    struct registry *b = fresh();
    char seen[256]     = "";
    size_t n;
    dc_status st;

    (void)state;
    assert_int_equal(state_save(dir, entries, 3, &st), DC_OK);
    assert_int_equal(state_load(dir, b, &n, &st), DC_OK);
    assert_int_equal(n, 2);
    registry_each_intent(b, collect, seen);
    assert_non_null(strstr(seen, "node-a=1;"));
    assert_non_null(strstr(seen, "node-b=2;"));
    assert_null(strstr(seen, "node-c"));
    registry_free(b);
}

/* The text the etcd backend stores (issue 16): the file's format, checked the same way,
 * and registry_reset forgets it all before a new leader loads it. */
static void
test_text_round_trip_and_reset(void **state)
{
    static const struct registry_intent_entry entries[] = {
        { "node-a", INTENT_DRAIN },
        { "node-b", INTENT_NONE },
    };
    struct registry *r = fresh();
    char seen[256] = "", *text = NULL;
    size_t n, len              = 0;
    dc_status st;

    (void)state;
    assert_int_equal(state_format(entries, 2, &text, &len, &st), DC_OK);
    assert_string_equal(text, "devcoord-intent 1\ndrain node-a\nend 1\n");
    assert_int_equal(state_load_text("etcd", text, len, r, &n, &st), DC_OK);
    assert_int_equal(n, 1);
    registry_each_intent(r, collect, seen);
    assert_string_equal(seen, "node-a=2;");
    /* Truncated text restores nothing. */
    registry_reset(r);
    seen[0] = '\0';
    assert_int_equal(state_load_text("etcd", text, len - 6, r, &n, &st), DC_DATA_LOSS);
    assert_non_null(strstr(st.message, "etcd"));
    registry_each_intent(r, collect, seen);
    assert_string_equal(seen, "");
    assert_int_equal(state_load_text("etcd", "", 0, r, &n, &st), DC_OK);
    assert_int_equal(n, 0);
    free(text);
    registry_free(r);
}

static void
read_file(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "r");
    size_t n;

    assert_non_null(f);
    n      = fread(buf, 1, cap - 1, f);
    buf[n] = '\0';
    fclose(f);
}

/* Tests run as root, for whom no permission bit stops a write. Two ways that stop root: a
 * full disk (the temporary file a save writes is made a symlink to /dev/full, so writes
 * fail with ENOSPC) and a state_dir that is a regular file (ENOTDIR). */
static char tmp_path[300], file_dir[300];

static void
disk_full(void)
{
    unlink(tmp_path);
    assert_int_equal(symlink("/dev/full", tmp_path), 0);
}

static void
test_failed_save_keeps_the_old_file(void **state)
{
    static const struct registry_intent_entry one[] = { { "node-a", INTENT_CORDON } };
    static const struct registry_intent_entry two[] = { { "node-a", INTENT_CORDON },
                                                        { "node-b", INTENT_DRAIN } };
    char path[300], before[256], after[256];
    dc_status st;

    (void)state;
    snprintf(path, sizeof(path), "%s/%s", dir, STATE_FILE);
    assert_int_equal(state_save(dir, one, 1, &st), DC_OK);
    read_file(path, before, sizeof(before));

    disk_full();
    assert_int_equal(state_save(dir, two, 2, &st), DC_UNAVAILABLE);
    assert_non_null(strstr(st.message, "No space left on device"));
    assert_non_null(strstr(st.message, tmp_path));
    read_file(path, after, sizeof(after));
    assert_string_equal(after, before);
    assert_int_equal(access(tmp_path, F_OK), -1); /* nothing left behind */

    assert_int_equal(state_save(file_dir, two, 2, &st), DC_UNAVAILABLE);
    assert_non_null(strstr(st.message, "Not a directory"));
}

static void
test_check(void **state)
{
    char missing[320];
    dc_status st;

    (void)state;
    assert_int_equal(state_check(dir, &st), DC_OK);
    assert_int_equal(access(tmp_path, F_OK), -1);

    assert_int_equal(state_check(file_dir, &st), DC_UNAVAILABLE);
    assert_non_null(strstr(st.message, "state_dir cannot keep operator intent: "));
    assert_non_null(strstr(st.message, file_dir));
    assert_non_null(strstr(st.message, "Not a directory"));
    snprintf(missing, sizeof(missing), "%s/missing", dir);
    assert_int_equal(state_check(missing, &st), DC_UNAVAILABLE);
    assert_non_null(strstr(st.message, "No such file or directory"));
    disk_full();
    assert_int_equal(state_check(dir, &st), DC_UNAVAILABLE);
    assert_non_null(strstr(st.message, "No space left on device"));
}

static void
reg(struct registry *r, const char *name)
{
    Devcoord__V1__RegisterWorkerRequest req = DEVCOORD__V1__REGISTER_WORKER_REQUEST__INIT;
    Devcoord__V1__DeviceSpec spec = DEVCOORD__V1__DEVICE_SPEC__INIT, *specs[1] = { &spec };
    Devcoord__V1__Device dev = DEVCOORD__V1__DEVICE__INIT;
    struct registry_session session;
    dc_status st;

    dev.backend   = DEVCOORD__V1__BACKEND__BACKEND_CUDA;
    spec.device   = &dev;
    spec.healthy  = true;
    req.name      = (char *)name;
    req.address   = "tcp://127.0.0.1:1";
    req.executor  = "host";
    req.devices   = specs;
    req.n_devices = 1;
    if (registry_register(r, &req, 1000, &session, &st) != DC_OK) {
        fail_msg("register %s: %s", name, st.message);
    }
}

static dc_worker_state
state_of(struct registry *r, const char *name)
{
    Devcoord__V1__ListWorkersResponse out;
    struct arena *a = arena_new(1 << 20);
    int found       = -1;
    dc_status st;

    assert_int_equal(registry_list_workers(r, 1000, a, &out, &st), DC_OK);
    for (size_t i = 0; i < out.n_workers; i++) {
        if (strcmp(out.workers[i]->name, name) == 0) {
            found = (int)out.workers[i]->state;
        }
    }
    arena_free(a);
    assert_true(found >= 0);
    return (dc_worker_state)found;
}

/* Issue 12, item 3: a drain answered OK that a full disk had not saved was gone after a
 * restart. A change that cannot be saved is refused, and changes nothing. */
static void
test_registry_change_that_cannot_be_saved_is_refused(void **state)
{
    struct registry_opts o = { .heartbeat_interval_ms = 1000, .dead_after_ms = 5000 };
    struct registry *r, *back;
    char path[300], before[256], after[256], seen[256];
    dc_status st;
    size_t n;

    (void)state;
    o.store = state_store(dir);
    r       = registry_new(&o);
    reg(r, "node-a");
    reg(r, "node-b");
    snprintf(path, sizeof(path), "%s/%s", dir, STATE_FILE);
    assert_int_equal(registry_set_intent(r, "node-a", INTENT_CORDON, 1000, NULL, NULL, &st), DC_OK);
    read_file(path, before, sizeof(before));
    assert_string_equal(before, "devcoord-intent 1\ncordon node-a\nend 1\n");

    /* A new intent, a changed one, a cleared one: each refused with the cause. */
    for (int i = 0; i < 3; i++) {
        static const struct {
            const char *name;
            enum registry_intent intent;
        } change[] = { { "node-b", INTENT_DRAIN },
                       { "node-a", INTENT_DRAIN },
                       { "node-a", INTENT_NONE } };
        disk_full();
        assert_int_equal(
            registry_set_intent(r, change[i].name, change[i].intent, 1000, NULL, NULL, &st),
            DC_UNAVAILABLE);
        assert_non_null(strstr(st.message, "cannot save operator intent: "));
        assert_non_null(strstr(st.message, "No space left on device"));
        assert_int_equal(state_of(r, "node-a"), DC_WORKER_CORDONED);
        assert_int_equal(state_of(r, "node-b"), DC_WORKER_ALIVE);
        seen[0] = '\0';
        registry_each_intent(r, collect, seen);
        assert_string_equal(seen, "node-a=1;");
        read_file(path, after, sizeof(after));
        assert_string_equal(after, before);
    }
    /* The same change, once the disk has room, is saved and applied. */
    assert_int_equal(registry_set_intent(r, "node-b", INTENT_DRAIN, 1000, NULL, NULL, &st), DC_OK);
    assert_int_equal(state_of(r, "node-b"), DC_WORKER_DRAINING);
    back = fresh();
    assert_int_equal(state_load(dir, back, &n, &st), DC_OK);
    assert_int_equal(n, 2);
    registry_free(back);
    registry_free(r);
}

static void
test_missing_is_fine(void **state)
{
    struct registry *r = fresh();
    char path[256];
    size_t n = 9;
    dc_status st;

    (void)state;
    snprintf(path, sizeof(path), "%s/%s", dir, STATE_FILE);
    unlink(path);
    assert_int_equal(state_load(dir, r, &n, &st), DC_OK);
    assert_int_equal(n, 0);
    registry_free(r);
}

static void
test_corrupt_is_reported_and_ignored(void **state)
{
    static const char *bad[] = {
        "devcoord-intent 1\ncordon node-a\n",           /* truncated: no end line */
        "devcoord-intent 1\ncordon node-a\nend 2\n",    /* count mismatch */
        "devcoord-intent 1\ncordon node-a\nend 1",      /* last line cut */
        "something else\nend 0\n",                      /* not ours */
        "devcoord-intent 1\nexplode node-a\nend 1\n",   /* unknown intent */
        "devcoord-intent 1\ncordon -bad name\nend 1\n", /* bad worker name */
        "",                                             /* empty */
        "devcoord-intent 1\nend 0\ncordon node-a\n",    /* data after the end */
    };
    static const struct registry_intent_entry later[] = { { "node-z", INTENT_CORDON } };
    char seen[256], path[256], kept[300], back[256];
    size_t n;
    dc_status st;
    FILE *f;

    (void)state;
    snprintf(path, sizeof(path), "%s/%s", dir, STATE_FILE);
    snprintf(kept, sizeof(kept), "%s%s", path, STATE_UNREADABLE_SUFFIX);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct registry *r = fresh();
        write_file(bad[i]);
        if (state_load(dir, r, &n, &st) != DC_DATA_LOSS) {
            fail_msg("case %zu accepted", i);
        }
        seen[0] = '\0';
        registry_each_intent(r, collect, seen);
        assert_string_equal(seen, ""); /* nothing half-applied */
        registry_free(r);
        /* What it held is kept beside it, and the message says where. */
        assert_non_null(strstr(st.message, "; kept as "));
        assert_non_null(strstr(st.message, kept));
        assert_int_equal(access(path, F_OK), -1);
        assert_non_null(f = fopen(kept, "r"));
        n = fread(back, 1, sizeof(back) - 1, f);
        fclose(f);
        back[n] = '\0';
        assert_string_equal(back, bad[i]);
    }
    /* The next save writes a new file and leaves the kept one as it was. */
    assert_int_equal(state_save(dir, later, 1, &st), DC_OK);
    assert_int_equal(access(kept, F_OK), 0);
    assert_int_equal(access(path, F_OK), 0);
    unlink(kept);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_text_round_trip_and_reset),
        cmocka_unit_test(test_failed_save_keeps_the_old_file),
        cmocka_unit_test(test_check),
        cmocka_unit_test(test_registry_change_that_cannot_be_saved_is_refused),
        cmocka_unit_test(test_missing_is_fine),
        cmocka_unit_test(test_corrupt_is_reported_and_ignored),
    };
    int rv;

    if (mkdtemp(dir) == NULL) {
        return 1;
    }
    snprintf(tmp_path, sizeof(tmp_path), "%s/.%s.tmp", dir, STATE_FILE);
    snprintf(file_dir, sizeof(file_dir), "%s/a-file", dir);
    {
        FILE *f = fopen(file_dir, "w");
        if (f == NULL) {
            return 1;
        }
        fclose(f);
    }
    rv = cmocka_run_group_tests(tests, NULL, NULL);
    {
        char path[256];
        snprintf(path, sizeof(path), "%s/%s", dir, STATE_FILE);
        unlink(path);
        unlink(tmp_path);
        unlink(file_dir);
        rmdir(dir);
    }
    return rv;
}
