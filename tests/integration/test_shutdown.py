"""Issue 12, item 1, "Bounded shutdown": the coordinator and the workers exit with code 0
within 2 s of SIGTERM, however busy their RPC ports are when it comes.

nng 1.5.2's tcp transport can start reading a request body on a pipe that is already
closed; closing the socket then waits forever for that read. It happens when a request is
arriving at the moment the daemon closes, so the test stops the daemons many times: right
after the workers register, and under a flood of requests (many connections sending
pipelined requests in pieces, and connections that stop mid-header or mid-body).

The 2 s bound is the contract of issue 12 (daemons give nng about 1.5 s to close, then exit
anyway); the test measures from the signal to the reaped exit status.

    cd tests/integration && python3 -m unittest -v test_shutdown
"""

import signal
import socket
import struct
import threading
import time
import unittest

import harness
from harness import (COORDINATOR, HOST, RpcConnection, RpcError, F, frame, known_nng_leak,
                     pb_bytes, pb_uint, sp_greeting, SP_REQ0)

BOUND_S = 2.0
# How long a daemon that missed the bound is given before it is killed (only to report
# how late it was; a hung one never exits by itself).
GRACE_S = 4.0
WORKER = "/devcoord.v1.Worker/"


def request(method, body=b"", rid=1):
    header = (pb_uint(F("RequestHeader", "request_id"), rid)
              + pb_bytes(F("RequestHeader", "method"), method)
              + pb_uint(F("RequestHeader", "timeout_ms"), 5000))
    payload = struct.pack(">I", rid | 0x80000000) + frame(header, body)
    return struct.pack(">Q", len(payload)) + payload


class Flood:
    """Connections to one RPC port that keep requests arriving until stop(): `streams`
    connections each sending pipelined requests cut into pieces (so the daemon is often
    between a frame's length and its body) and reading the replies; `stalled` connections
    that send part of a frame and then nothing (half a length, or a length and part of the
    body it announces)."""

    PIPELINE = 4

    def __init__(self, port, methods, streams=8, stalled=4):
        self.port = port
        self.methods = methods
        self.streams = streams
        self.stalled = stalled
        self.done = threading.Event()
        self.threads = []
        self.sockets = []
        self.replies = 0
        self.lock = threading.Lock()

    def start(self):
        for i in range(self.stalled):
            try:
                s = socket.create_connection((HOST, self.port), timeout=2.0)
                s.sendall(sp_greeting(SP_REQ0))
                if i % 2 == 0:
                    s.sendall(struct.pack(">Q", 4096)[:4])
                else:
                    s.sendall(struct.pack(">Q", 4096) + b"\x00" * 100)
                self.sockets.append(s)
            except OSError:
                pass
        for i in range(self.streams):
            t = threading.Thread(target=self.stream, args=(i,), daemon=True)
            t.start()
            self.threads.append(t)
        return self

    def stream(self, i):
        rid = i << 20
        while not self.done.is_set():
            try:
                with RpcConnection(self.port, timeout=2.0) as c:
                    while not self.done.is_set():
                        for k in range(self.PIPELINE):
                            rid += 1
                            m = self.methods[(rid + k) % len(self.methods)]
                            data = request(m, rid=rid)
                            # Length, then the payload in two pieces.
                            c.sock.sendall(data[:8])
                            c.sock.sendall(data[8:20])
                            c.sock.sendall(data[20:])
                        for _ in range(self.PIPELINE):
                            c.recv_message()
                        with self.lock:
                            self.replies += self.PIPELINE
            except (OSError, RpcError):
                # The daemon closed the connection or is gone: try again until stopped.
                time.sleep(0.01)

    def wait_replies(self, n, timeout=10.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if self.replies >= n:
                    return True
            time.sleep(0.005)
        return False

    def stop(self):
        self.done.set()
        for t in self.threads:
            t.join(5.0)
        for s in self.sockets:
            s.close()


class BoundedShutdownTest(harness.ClusterTestCase):
    heartbeat_ms = 200
    dead_after_ms = 2000

    def start_cluster(self, workers=2):
        c = self.make_cluster()
        c.start_coordinator()
        names = ["node-%d" % i for i in range(workers)]
        for n in names:
            c.add_worker(n, [{"device": "cuda:0"}, {"device": "cuda:1"}])
        c.wait_workers(names)
        return c

    def stop(self, groups):
        """SIGTERM to each group of daemons in turn, all of a group at once, the next group
        once the previous one has exited (or was killed); {name: (exit code or None,
        seconds from its SIGTERM to its exit)}."""
        out = {}
        for group in groups:
            t0 = time.monotonic()
            for d in group:
                d.expected_exit = True
                d.signal(signal.SIGTERM)
            pending = list(group)
            while pending and time.monotonic() - t0 < BOUND_S + GRACE_S:
                for d in list(pending):
                    rc = d.poll()
                    if rc is not None:
                        out[d.name] = (rc, time.monotonic() - t0)
                        pending.remove(d)
                time.sleep(0.005)
            for d in pending:
                out[d.name] = (None, time.monotonic() - t0)
                d.kill_quietly()
        return out

    def run_rounds(self, rounds, flood):
        problems = []
        slowest = 0.0
        cut = 0  # stops the watchdog ended
        forgiven = 0  # exits with only nng's send leak to report (ASan builds)
        for r in range(rounds):
            c = self.start_cluster()
            floods = []
            if flood:
                floods.append(Flood(c.port, [COORDINATOR + "GetClusterStatus",
                                             COORDINATOR + "ListDevices",
                                             COORDINATOR + "Nope"]).start())
                for w in c.workers.values():
                    port = int(c.worker_specs[w.name]["listen"].rsplit(":", 1)[1])
                    floods.append(Flood(port, [WORKER + "ListTensors", WORKER + "GetTensor",
                                               WORKER + "Nope"]).start())
                for f in floods:
                    self.assertTrue(f.wait_replies(200), "the flood got no replies")
            workers = list(c.workers.values())
            # Everything at once (compose down: the workers' deregistrations meet a closing
            # coordinator), or the workers first (the coordinator stops right after their
            # DeregisterWorker calls came in).
            groups = [workers + [c.coordinator]] if r % 2 == 0 else [workers, [c.coordinator]]
            try:
                result = self.stop(groups)
            finally:
                for f in floods:
                    f.stop()
            cut += sum("not stopped" in d.log_text() for d in c.all_daemons())
            before = len(problems)
            daemons = {d.name: d for d in c.all_daemons()}
            for name, (rc, secs) in sorted(result.items()):
                slowest = max(slowest, secs)
                if rc is None:
                    problems.append("round %d: %s still running %.1f s after SIGTERM (killed)"
                                    % (r, name, secs))
                elif secs > BOUND_S:
                    problems.append("round %d: %s exited %s after %.2f s" % (r, name, rc, secs))
                elif rc != 0 and known_nng_leak(daemons[name].log_text()):
                    forgiven += 1
                elif rc != 0:
                    problems.append("round %d: %s exited %s" % (r, name, rc))
            c.close()
            if len(problems) == before:
                c.tails = ""  # a failure shows the logs of the rounds that went wrong only
        print("\n  %d rounds%s: slowest exit %.2f s after SIGTERM; %d ended by the stop "
              "watchdog; %d with nng's send leak only; %d late or failed"
              % (rounds, " under a flood" if flood else "", slowest, cut, forgiven,
                 len(problems)))
        self.assertEqual(problems, [], "\n".join(problems))

    def test_stop_right_after_register(self):
        self.run_rounds(50, flood=False)

    def test_stop_under_request_flood(self):
        self.run_rounds(20, flood=True)


if __name__ == "__main__":
    unittest.main()
