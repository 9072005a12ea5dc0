#!/usr/bin/env python3
"""Coordinators in high availability (issue 16): failover time, and what the etcd backend
costs against the local state_dir.

1. Failover: etcd (Debian's, on free loopback ports, its own data directory) and three
   coordinators (lease 3000 ms, heartbeat 1000 ms) with three workers that list all three.
   The leader is SIGKILLed KILLS times (default 10); each time the script measures, from the
   kill, (a) when another coordinator first answers ListWorkers as leader and (b) when all
   three workers are registered with it. The killed coordinator is started again (it comes
   back a follower) before the next kill.
2. Cost of the backend: one coordinator with state_dir (fsync'd file) and one on etcd
   (alone, so it leads), each timed on N RegisterWorker calls (distinct names, one cpu
   device) and N CordonWorker/UncordonWorker calls (each writes the intent through: a file
   rename + fsync, or an etcd txn), over one connection, one call at a time; median and p99.

Real binaries from build/ (or $DEVCOORD_BUILD_DIR); Python standard library only, reusing
tests/integration/harness.py. Every process started is stopped at the end.

  python3 bench/bench_failover.py [--kills 10] [--calls 300]
"""

import argparse
import os
import signal
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))

import harness  # noqa: E402
from harness import F, Daemon, RpcConnection, free_port, pb_bytes, pb_uint, tcp_addr  # noqa: E402
import test_ha  # noqa: E402


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100.0 * (len(xs) - 1))))]


def failover(kills):
    c = test_ha.HACluster()
    leader_ms, workers_ms = [], []
    try:
        leader = c.start()
        for n in ("w1", "w2", "w3"):
            c.add_worker(n, [{"device": "cpu:0"}])
        c.wait_registered(leader, ["w1", "w2", "w3"])
        for k in range(kills):
            t0 = time.monotonic()
            c.coords[leader].kill()
            def other_leader():
                ls = [i for i in c.leaders() if i != leader]
                return ls[0] + 1 if ls else None
            new = harness.wait_until(other_leader, 60, "a new leader") - 1
            t1 = time.monotonic()
            c.wait_registered(new, ["w1", "w2", "w3"], timeout=60)
            t2 = time.monotonic()
            leader_ms.append((t1 - t0) * 1000)
            workers_ms.append((t2 - t0) * 1000)
            print("kill %2d: coordinator-%d -> coordinator-%d leads after %5.0f ms, "
                  "3 workers registered after %5.0f ms" % (k + 1, leader, new, leader_ms[-1],
                                                           workers_ms[-1]), flush=True)
            c.coords[leader].start()
            old = leader
            harness.wait_until(lambda: "leader: " in c.answers(old)[1], 30,
                               "the killed coordinator back as a follower")
            leader = new
    finally:
        c.close()
    return leader_ms, workers_ms


def register_body(name, port):
    device = pb_uint(F("Device", "backend"), 1)  # cpu, its default kind
    spec = pb_bytes(F("DeviceSpec", "device"), device) + pb_uint(F("DeviceSpec", "healthy"), 1)
    return (pb_bytes(F("RegisterWorkerRequest", "name"), name.encode())
            + pb_bytes(F("RegisterWorkerRequest", "address"), tcp_addr(port).encode())
            + pb_bytes(F("RegisterWorkerRequest", "devices"), spec))


def backend_cost(calls):
    """{backend: (register latencies ms, cordon latencies ms)}."""
    out = {}
    for backend in ("state_dir", "etcd"):
        cl = test_ha.HACluster(n_coordinators=1)
        try:
            if backend == "state_dir":
                cfg = {"listen": tcp_addr(cl.coord_ports[0]), "http": "",
                       "heartbeat": {"interval_ms": 1000, "dead_after_ms": 86400000},
                       "log": {"level": "warn"}, "state_dir": cl.path("state")}
                os.mkdir(cl.path("state"))
                path = cl.write_yaml("coordinator-0.yaml", cfg)
                cl.coords[0] = Daemon("coordinator-0", [harness.SERVER, "--config", path],
                                      cl.path("coordinator-0.log"))
                cl.coords[0].start()
                cl.wait_leader()
            else:
                cl.start()
            port = cl.coord_ports[0]
            reg, cordon = [], []
            with RpcConnection(port, timeout=10) as conn:
                for i in range(calls):
                    body = register_body("bench-%04d" % i, free_port())
                    t = time.perf_counter()
                    code, msg, _ = conn.call(harness.COORDINATOR + "RegisterWorker", body)
                    reg.append((time.perf_counter() - t) * 1000)
                    assert code == "OK", (code, msg)
                name = pb_bytes(F("WorkerNameRequest", "name"), b"bench-0000")
                for i in range(calls):
                    verb = "CordonWorker" if i % 2 == 0 else "UncordonWorker"
                    t = time.perf_counter()
                    code, msg, _ = conn.call(harness.COORDINATOR + verb, name)
                    cordon.append((time.perf_counter() - t) * 1000)
                    assert code == "OK", (verb, code, msg)
            out[backend] = (reg, cordon)
        finally:
            cl.close()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kills", type=int, default=10)
    ap.add_argument("--calls", type=int, default=300)
    args = ap.parse_args()
    if not os.path.exists(test_ha.ETCD):
        sys.exit("bench_failover: %s missing (apt-get install etcd-server)" % test_ha.ETCD)
    signal.signal(signal.SIGINT, signal.default_int_handler)

    leader_ms, workers_ms = failover(args.kills)
    costs = backend_cost(args.calls)
    print()
    print("failover over %d SIGKILLs of the leader (lease 3000 ms, heartbeat 1000 ms):"
          % args.kills)
    print("  new leader answers      median %5.0f ms  worst %5.0f ms"
          % (statistics.median(leader_ms), max(leader_ms)))
    print("  3 workers registered    median %5.0f ms  worst %5.0f ms"
          % (statistics.median(workers_ms), max(workers_ms)))
    print()
    print("%-10s %-16s %9s %9s" % ("backend", "call", "median", "p99"))
    for backend, (reg, cordon) in costs.items():
        for what, xs in (("RegisterWorker", reg), ("Cordon/Uncordon", cordon)):
            print("%-10s %-16s %7.2f ms %7.2f ms" % (backend, what, statistics.median(xs),
                                                    pct(xs, 99)))


if __name__ == "__main__":
    main()
