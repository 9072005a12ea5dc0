#!/usr/bin/env python3
"""CPU the workers spend on group all-reduces across workers: a figure that holds up on a
loaded machine, where wall-clock times do not (issue 17).

Starts a coordinator and N workers (one device each) from a build tree with the integration
tests' harness, runs `devcoordctl collective all-reduce --count C --repeat R` once per rank
at the same time (f32 sum; the CLI splits calls larger than one message), and prints the
wall time, the CPU the worker processes used (utime + stime from /proc) and the CPU of the
devcoordctl processes, per all-reduce.

    bench/group_cpu.py [--build DIR] [--count 4194304] [--repeat 10] [--workers 2,4]
"""

import argparse
import os
import resource
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def cpu_seconds(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(harness, opsutil, n_workers, count, repeat):
    c = harness.Cluster(heartbeat_ms=1000, dead_after_ms=10000, tmp_prefix="devcoord-cpu-")
    try:
        c.start_coordinator()
        names = ["node-%c" % (ord("a") + i) for i in range(n_workers)]
        for n in names:
            c.add_worker(n, [{"device": "cuda:0", "memory": "8GiB"}])
        c.wait_workers(names)
        devs = ",".join(n + "/cuda:0" for n in names)
        pids = [c.workers[n].pid() if callable(c.workers[n].pid) else c.workers[n].pid
                for n in names]
        before = sum(cpu_seconds(p) for p in pids)
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.monotonic()
        procs = [opsutil.ctl_popen(c, "--timeout", "600s", "collective", "all-reduce",
                                   "--devices", devs, "--self", d, "--dtype", "f32",
                                   "--count", str(count), "--reduce", "sum",
                                   "--repeat", str(repeat))
                 for d in devs.split(",")]
        results = [opsutil.finish(p, timeout=900) for p in procs]
        wall = time.monotonic() - t0
        after_children = resource.getrusage(resource.RUSAGE_CHILDREN)
        for r in results:
            if r.rc != 0:
                raise SystemExit("group_cpu: a rank failed: %r" % (r,))
        workers = sum(cpu_seconds(p) for p in pids) - before
        ctl = (after_children.ru_utime + after_children.ru_stime
               - children.ru_utime - children.ru_stime)
        print("%d workers, %d x %d f32: wall %.1f ms, workers' CPU %.1f ms, devcoordctl CPU "
              "%.1f ms per all-reduce (load average %s)"
              % (n_workers, repeat, count, wall / repeat * 1e3, workers / repeat * 1e3,
                 ctl / repeat * 1e3, open("/proc/loadavg").read().split()[0]), flush=True)
    finally:
        c.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(REPO, "build-bench"))
    ap.add_argument("--count", type=int, default=4 << 20)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--workers", default="2,4")
    a = ap.parse_args()
    os.environ["DEVCOORD_BUILD_DIR"] = os.path.abspath(a.build)
    sys.path.insert(0, os.path.join(REPO, "tests", "integration"))
    import harness  # noqa: E402  (reads DEVCOORD_BUILD_DIR)
    import opsutil  # noqa: E402
    for n in (int(x) for x in a.workers.split(",")):
        run(harness, opsutil, n, a.count, a.repeat)


if __name__ == "__main__":
    main()
