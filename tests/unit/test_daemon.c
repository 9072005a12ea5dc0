/* The bounded stop of common/daemon.c: a stop that hangs ends the process with the exit code
 * it was given, a stop that finishes in time leaves nothing behind. Each case runs in a child
 * process, since the watchdog ends the process it runs in. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <signal.h>
#include <stdint.h>
#include <time.h>

#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "daemon.h"

/* Runs body in a child and returns its wait status; fails when the child is still running
 * after 30 s (a generous bound: the watchdogs here are set to 100 ms). */
static int
in_child(void (*body)(void))
{
    struct timespec tick = { .tv_sec = 0, .tv_nsec = 10 * 1000000L };
    pid_t pid            = fork();
    int status;

    assert_true(pid >= 0);
    if (pid == 0) {
        body();
        _exit(99);
    }
    for (int i = 0; i < 3000; i++) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        assert_true(r >= 0);
        if (r == pid) {
            return status;
        }
        nanosleep(&tick, NULL);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    fail_msg("the child was still running 30 s later");
    return -1;
}

/* A stop that never finishes (nng hung in a close). */
static void
hung_stop(void)
{
    daemon_stop_begin(100, 7);
    for (;;) {
        pause();
    }
}

static void
test_hung_stop_exits_with_its_code(void **state)
{
    int status = in_child(hung_stop);

    (void)state;
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 7);
}

/* A stop that finishes in time: the watchdog is joined and the process goes on. */
static void
clean_stop(void)
{
    daemon_stop_begin(100, 7);
    daemon_stop_end();
    /* Past the bound: a watchdog still armed would end the process with 7 by now. */
    sleep(1);
    _exit(0);
}

static void
test_clean_stop_leaves_nothing_behind(void **state)
{
    int status = in_child(clean_stop);

    (void)state;
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

static void
test_end_without_begin(void **state)
{
    (void)state;
    daemon_stop_end();
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hung_stop_exits_with_its_code),
        cmocka_unit_test(test_clean_stop_leaves_nothing_behind),
        cmocka_unit_test(test_end_without_begin),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
