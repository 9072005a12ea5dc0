/*
 * Names for the daemons' and the library's own threads, as `top -H`, `ps -L`, gdb and
 * `perf` show them (/proc/PID/task/TID/comm). Every thread devcoord starts names itself
 * "dc-<role>"; nng's own threads keep nng's names (nng:task, nng:poll, ...).
 */
#ifndef DEVCOORD_COMMON_THREADNAME_H
#define DEVCOORD_COMMON_THREADNAME_H

/* Names the calling thread; a name longer than the kernel's 15 bytes is cut there. A
 * failure (no /proc, a seccomp filter) only leaves the inherited name. */
void thread_name_set(const char *name);

#endif
