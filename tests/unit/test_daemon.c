/* The bounded stop of common/daemon.c: a stop that hangs ends the process with the exit code
 * it was given, a stop that finishes in time leaves nothing behind. Each case runs in a child
 * process, since the watchdog ends the process it runs in. Also: the command line
 * (--check-config) and the notices to $NOTIFY_SOCKET. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <sys/socket.h>
#include <sys/time.h>
#include <sys/types.h>
#include <sys/un.h>
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

static void
test_check_config_args(void **state)
{
    char *ok[]       = { "prog", "--check-config", "a.yaml", "--listen", "tcp://h:1" };
    char *same[]     = { "prog", "--config=a.yaml", "--check-config=a.yaml" };
    char *differ[]   = { "prog", "--config", "a.yaml", "--check-config", "b.yaml" };
    char *no_value[] = { "prog", "--check-config" };
    struct daemon_args args;

    (void)state;
    assert_int_equal(daemon_parse_args(5, ok, "prog", "usage", &args), -1);
    assert_string_equal(args.check_config, "a.yaml");
    assert_string_equal(args.config, "a.yaml");
    assert_string_equal(args.listen, "tcp://h:1");
    assert_int_equal(daemon_parse_args(3, same, "prog", "usage", &args), -1);
    assert_string_equal(args.check_config, "a.yaml");
    assert_int_equal(daemon_parse_args(5, differ, "prog", "usage", &args), 2);
    assert_int_equal(daemon_parse_args(2, no_value, "prog", "usage", &args), 2);
}

/* Receives one datagram within 5 s into buf (NUL-terminated); its length, or -1. */
static ssize_t
recv_notice(int fd, char *buf, size_t cap)
{
    struct timeval tv = { .tv_sec = 5 };
    ssize_t n;

    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    n                  = recv(fd, buf, cap - 1, 0);
    buf[n > 0 ? n : 0] = '\0';
    return n;
}

static void
test_notify(void **state)
{
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    char name[64], env[80], buf[64];
    int fd;

    (void)state;
    /* Unset: nothing is sent, nothing fails. */
    unsetenv("NOTIFY_SOCKET");
    daemon_notify("READY=1");

    /* An abstract name: '@' in the variable, a leading NUL in the address. */
    snprintf(name, sizeof(name), "devcoord-unit-%d", (int)getpid());
    snprintf(sa.sun_path + 1, sizeof(sa.sun_path) - 1, "%s", name);
    assert_true((fd = socket(AF_UNIX, SOCK_DGRAM, 0)) >= 0);
    assert_int_equal(bind(fd, (struct sockaddr *)&sa,
                          (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + strlen(name))),
                     0);
    snprintf(env, sizeof(env), "@%s", name);
    setenv("NOTIFY_SOCKET", env, 1);
    daemon_notify("READY=1");
    assert_int_equal(recv_notice(fd, buf, sizeof(buf)), 7);
    assert_string_equal(buf, "READY=1");
    daemon_notify("STOPPING=1");
    assert_int_equal(recv_notice(fd, buf, sizeof(buf)), 10);
    assert_string_equal(buf, "STOPPING=1");
    close(fd);

    /* A path. */
    memset(&sa, 0, sizeof(sa));
    sa.sun_family = AF_UNIX;
    snprintf(sa.sun_path, sizeof(sa.sun_path), "/tmp/devcoord-unit-notify-%d", (int)getpid());
    unlink(sa.sun_path);
    assert_true((fd = socket(AF_UNIX, SOCK_DGRAM, 0)) >= 0);
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    setenv("NOTIFY_SOCKET", sa.sun_path, 1);
    daemon_notify("RELOADING=1");
    assert_int_equal(recv_notice(fd, buf, sizeof(buf)), 11);
    assert_string_equal(buf, "RELOADING=1");
    close(fd);
    unlink(sa.sun_path);

    /* Neither a path nor an abstract name, or nobody listening: ignored. */
    setenv("NOTIFY_SOCKET", "relative/path", 1);
    daemon_notify("READY=1");
    setenv("NOTIFY_SOCKET", sa.sun_path, 1);
    daemon_notify("READY=1");
    unsetenv("NOTIFY_SOCKET");
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hung_stop_exits_with_its_code),
        cmocka_unit_test(test_clean_stop_leaves_nothing_behind),
        cmocka_unit_test(test_end_without_begin),
        cmocka_unit_test(test_check_config_args),
        cmocka_unit_test(test_notify),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
