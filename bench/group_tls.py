#!/usr/bin/env python3
"""A group all-reduce's time with the workers' data link on tcp:// and on tls+tcp:// (issue 17
asks for the TLS figure beside the plain one): 2 ranks, one process each, on 2 workers, each
rank's buffer a Group.alloc block (shared with its worker), f32 "mean".

Each round starts a cluster of real daemons on plain tcp:// and one on tls+tcp:// (every
listener and dialer, the integration tests' certificates), one after the other, with the
integration tests' harness; rank 0's median time of --reps calls (after 3 warm-up calls) is
that round's figure, and the medians of the rounds are printed. Every call's result is
checked (the mean of the two ranks' values). Needs python3-numpy.

    /usr/bin/python3 bench/group_tls.py [--build DIR] [--mib 16] [--reps 20] [--rounds 3]
"""

import argparse
import multiprocessing
import os
import statistics
import sys
import time

import benchutil

DEVICES = ["node-a/cuda:0", "node-b/cuda:0"]


def rank_main(rank, address, ca, count, reps, results):
    import devcoord
    try:
        with devcoord.Client(address, tls_ca=ca, timeout_ms=60000) as c:
            with devcoord.Group(c, DEVICES, DEVICES[rank], timeout_ms=60000) as g:
                buf = g.alloc(count, "f32")
                times, ok = [], True
                for i in range(3 + reps):
                    buf[:] = rank + 1
                    t = time.perf_counter()
                    g.all_reduce(buf, "mean")
                    if i >= 3:
                        times.append(time.perf_counter() - t)
                    ok = ok and bool((buf == 1.5).all())
                g.free(buf)
        results.put((rank, statistics.median(times), ok, None))
    except Exception as e:  # reported by the parent, which fails
        results.put((rank, None, False, repr(e)))


def one_round(harness, tls, count, reps):
    """Rank 0's median seconds a call on a fresh cluster (tls: every hop on tls+tcp://)."""
    c, _ = benchutil.start_cluster(harness, ["node-a", "node-b"], ["cuda:0"],
                                   "devcoord-tls-bench-", tls=tls)
    try:
        ctx = multiprocessing.get_context("spawn")
        results = ctx.Queue()
        procs = [ctx.Process(target=rank_main,
                             args=(r, c.addr, c.pki.ca if tls else None, count, reps, results))
                 for r in range(2)]
        for p in procs:
            p.start()
        try:  # a rank that died without a word must not hang the bench
            got = {r[0]: r[1:] for r in (results.get(timeout=600) for _ in procs)}
        finally:
            for p in procs:
                p.join(10)
                if p.is_alive():
                    p.kill()
    finally:
        c.close()
    for rank, (_, ok, err) in sorted(got.items()):
        if err is not None or not ok:
            raise SystemExit("rank %d: %s" % (rank, err or "a wrong result"))
    return got[0][0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(benchutil.REPO, "build-bench"))
    ap.add_argument("--mib", type=float, default=16)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    harness = benchutil.use_build(a.build)
    count = int(a.mib * (1 << 20)) // 4
    figures = {False: [], True: []}
    for _ in range(a.rounds):
        for tls in (False, True):
            figures[tls].append(one_round(harness, tls, count, a.reps))
    print("Group all-reduce f32 mean, %g MiB, 2 ranks on 2 workers, Group.alloc buffers: rank "
          "0's time a call, median of %d rounds (each the median of %d calls)"
          % (a.mib, a.rounds, a.reps))
    for tls in (False, True):
        med = statistics.median(figures[tls])
        print("  %-8s %8.2f ms  bus BW %5.2f GB/s   (rounds: %s)"
              % ("tls+tcp" if tls else "tcp", med * 1e3, count * 4 / med / 1e9,
                 " ".join("%.2f" % (x * 1e3) for x in figures[tls])))
    print("  tls+tcp / tcp: %.2fx the time"
          % (statistics.median(figures[True]) / statistics.median(figures[False])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
