/* The worker's checks on shared memory regions (issue 13): names and ranges; the SIGBUS guard's
 * registry and handler. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "groups.h"
#include "shmguard.h"

static void
test_names(void **state)
{
    (void)state;
    assert_true(wgroups_shm_name_ok("/devcoord-0123456789abcdef0123456789abcdef"));
    assert_false(wgroups_shm_name_ok(NULL));
    assert_false(wgroups_shm_name_ok(""));
    assert_false(wgroups_shm_name_ok("/devcoord-"));
    /* One digit short or long, upper case, other characters, another prefix. */
    assert_false(wgroups_shm_name_ok("/devcoord-0123456789abcdef0123456789abcde"));
    assert_false(wgroups_shm_name_ok("/devcoord-0123456789abcdef0123456789abcdef0"));
    assert_false(wgroups_shm_name_ok("/devcoord-0123456789ABCDEF0123456789abcdef"));
    assert_false(wgroups_shm_name_ok("/devcoord-0123456789abcdef0123456789abcd/."));
    assert_false(wgroups_shm_name_ok("/devcoord-../../../etc/passwd000000000000000"));
    assert_false(wgroups_shm_name_ok("devcoord-0123456789abcdef0123456789abcdef0"));
    assert_false(wgroups_shm_name_ok("/dev/shm/devcoord-0123456789abcdef0123456789ab"));
}

static void
test_ranges(void **state)
{
    (void)state;
    assert_true(wgroups_shm_range_ok(0, 64, 64));
    assert_true(wgroups_shm_range_ok(48, 16, 64));
    assert_true(wgroups_shm_range_ok(64, 0, 64));
    assert_false(wgroups_shm_range_ok(49, 16, 64));
    assert_false(wgroups_shm_range_ok(0, 65, 64));
    assert_false(wgroups_shm_range_ok(65, 0, 64));
    /* No wrap-around. */
    assert_false(wgroups_shm_range_ok(UINT64_MAX - 7, 16, 64));
    assert_false(wgroups_shm_range_ok(8, UINT64_MAX - 4, 64));
}

static void
test_guard_registry(void **state)
{
    int a, b, c;

    (void)state;
    /* Fake ranges: the lookup only compares addresses. */
    a = shmguard_publish((void *)0x10000, 0x1000);
    b = shmguard_publish((void *)0x20000, 0x10);
    assert_true(a >= 0 && b >= 0 && a != b);
    assert_int_equal(shmguard_find(0x10000), a);
    assert_int_equal(shmguard_find(0x10fff), a);
    assert_int_equal(shmguard_find(0x11000), -1);
    assert_int_equal(shmguard_find(0xffff), -1);
    assert_int_equal(shmguard_find(0x2000f), b);
    assert_int_equal(shmguard_find(0x20010), -1);
    assert_false(shmguard_broken(a));
    shmguard_retire(a);
    assert_int_equal(shmguard_find(0x10000), -1);
    assert_int_equal(shmguard_find(0x20000), b);
    /* A freed slot is used again; all SHMGUARD_MAX in use, publishing fails. */
    c = shmguard_publish((void *)0x30000, 0x10);
    assert_int_equal(c, a);
    shmguard_retire(b);
    shmguard_retire(c);
    for (int i = 0; i < SHMGUARD_MAX; i++) {
        assert_int_equal(shmguard_publish((void *)(uintptr_t)(0x100000 + i * 0x100), 0x100), i);
    }
    assert_int_equal(shmguard_publish((void *)0x1, 1), -1);
    for (int i = 0; i < SHMGUARD_MAX; i++) {
        shmguard_retire(i);
    }
    assert_int_equal(shmguard_find(0x100000), -1);
}

/* In a child: maps a file of two pages, truncates it to none, reads it. guarded: the region is
 * in the registry. Exits 0 when the read gave zeros and the region is marked broken. */
static void
truncated_read(bool guarded)
{
    long page = sysconf(_SC_PAGESIZE);
    int fd    = memfd_create("shmguard", 0);
    uint8_t *p;
    int slot = -1;

    /* cmocka catches SIGBUS itself: the guard must chain to the default disposition here. */
    signal(SIGBUS, SIG_DFL);
    if (fd < 0 || ftruncate(fd, 2 * page) != 0 || shmguard_install() != 0) {
        _exit(2);
    }
    p = mmap(NULL, (size_t)(2 * page), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        _exit(2);
    }
    memset(p, 7, (size_t)(2 * page));
    if (guarded && (slot = shmguard_publish(p, (size_t)(2 * page))) < 0) {
        _exit(2);
    }
    if (ftruncate(fd, 0) != 0) {
        _exit(2);
    }
    if (((volatile uint8_t *)p)[page + 1] != 0 || !shmguard_broken(slot)) {
        _exit(3);
    }
    p[page] = 1; /* writable too */
    _exit(0);
}

static int
child_status(bool guarded)
{
    int status = 0;
    pid_t pid  = fork();

    assert_true(pid >= 0);
    if (pid == 0) {
        truncated_read(guarded);
    }
    assert_int_equal(waitpid(pid, &status, 0), pid);
    return status;
}

static void
test_guard_handler(void **state)
{
    int status;

    (void)state;
    status = child_status(true);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    /* Not a registered region: a real bug still kills (SIGBUS, or SIGABRT when a sanitizer
     * handled it first). */
    status = child_status(false);
    assert_true(WIFSIGNALED(status));
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_ranges),
        cmocka_unit_test(test_guard_registry),
        cmocka_unit_test(test_guard_handler),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
