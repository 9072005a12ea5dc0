#!/usr/bin/env python3
"""Asynchronous group all-reduces on plain memory: 2 ranks (threads of this process, a
client each) on 2 workers start `--inflight` all-reduces (f32 sum, numpy arrays) and wait for
them, repeated; prints the time per call for each size, and the bytes the ranks' calls
carried to the workers (0 when every call went through shared memory).

Starts a coordinator and the workers from a build tree with the integration tests' harness
(workers serving /metrics). Needs Debian's python3-numpy.

    /usr/bin/python3 bench/group_async.py [--build DIR] [--inflight 4]
        [--sizes 1000:10,20000:30,262144:30]   (elements:rounds, ...)
"""

import argparse
import os
import sys
import threading
import time

import benchutil



def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(benchutil.REPO, "build-bench"))
    ap.add_argument("--inflight", type=int, default=4)
    ap.add_argument("--sizes", default="262144:30,20000:30,1000:10")
    a = ap.parse_args()
    sizes = [tuple(int(x) for x in s.split(":")) for s in a.sizes.split(",")]
    harness = benchutil.use_build(a.build)
    import numpy  # noqa: E402
    import devcoord  # noqa: E402

    c, http = benchutil.start_cluster(harness, ["node-a", "node-b"], ["cuda:0"],
                                      "devcoord-async-")
    out, errors = {}, []
    try:
        devs = ["node-a/cuda:0", "node-b/cuda:0"]

        def rank(me):
            try:
                with devcoord.Client(c.addr, timeout_ms=60000) as cl:
                    with devcoord.Group(cl, devs, me, timeout_ms=60000) as g:
                        for n, rounds in sizes:
                            bufs = [numpy.full(n, 1.0, dtype=numpy.float32)
                                    for _ in range(a.inflight)]
                            g.barrier()
                            t0 = time.perf_counter()
                            for _ in range(rounds):
                                for q in [g.all_reduce_async(b, "max") for b in bufs]:
                                    q.wait()
                            out[(me, n)] = (time.perf_counter() - t0) / rounds / a.inflight
                            if not all(bool(numpy.all(b == 1.0)) for b in bufs):
                                errors.append("%s: wrong result at %d elements" % (me, n))
            except Exception as e:  # reported below
                errors.append("%s: %r" % (me, e))

        threads = [threading.Thread(target=rank, args=(d,)) for d in devs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        carried = benchutil.call_bytes(harness, http)
    finally:
        c.close()
    if errors:
        print("\n".join(errors))
        return 1
    print("async all-reduce f32, 2 ranks on 2 workers, plain numpy buffers, %d in flight: "
          "time per call (rank 0)" % a.inflight)
    for n, rounds in sizes:
        print("  %9d B  %8.1f us   (%d rounds)" % (4 * n, out[(devs[0], n)] * 1e6, rounds))
    print("  bytes the calls carried to the workers: %.0f" % carried)
    return 0


if __name__ == "__main__":
    sys.exit(main())
