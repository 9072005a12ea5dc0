"""Coordinators in high availability on etcd (issue 16): three coordinators elect a leader
through Debian's etcd (started here on free loopback ports, its own data directory), three
workers follow the leader, and the leader is killed, paused, or loses etcd for a while.

Skipped, saying so, only when /usr/bin/etcd is missing (.ci/setup-debian.sh test installs
etcd-server).
"""

import os
import shutil
import signal
import subprocess
import sys
import time
import unittest
import urllib.request

import harness
from harness import F, SLACK_S, Daemon, free_port, pb_bytes, pb_uint, rpc_call, tcp_addr, \
    wait_until

ETCD = os.environ.get("DEVCOORD_ETCD", "/usr/bin/etcd")
LEASE_TTL_MS = 3000
HEARTBEAT_MS = 1000


class HACluster(harness.Cluster):
    """etcd, three coordinators on it, and workers (harness.Cluster's) listing all three."""

    def __init__(self, n_coordinators=3):
        super().__init__(heartbeat_ms=HEARTBEAT_MS, dead_after_ms=4 * HEARTBEAT_MS,
                         tmp_prefix="devcoord-ha-")
        self.etcd_port, self.etcd_peer = free_port(), free_port()
        self.etcd = Daemon("etcd", [
            ETCD, "--name", "default", "--data-dir", self.path("etcd-data"),
            "--listen-client-urls", "http://127.0.0.1:%d" % self.etcd_port,
            "--advertise-client-urls", "http://127.0.0.1:%d" % self.etcd_port,
            "--listen-peer-urls", "http://127.0.0.1:%d" % self.etcd_peer,
            "--initial-advertise-peer-urls", "http://127.0.0.1:%d" % self.etcd_peer,
            "--initial-cluster", "default=http://127.0.0.1:%d" % self.etcd_peer,
            "--initial-cluster-state", "new"], self.path("etcd.log"))
        self.coord_ports = [free_port() for _ in range(n_coordinators)]
        self.coords = []
        for i, port in enumerate(self.coord_ports):
            cfg = {"listen": tcp_addr(port), "http": "",
                   "heartbeat": {"interval_ms": self.heartbeat_ms,
                                 "dead_after_ms": self.dead_after_ms},
                   "log": {"level": "info"},
                   "state": {"backend": "etcd",
                             "endpoints": ["http://127.0.0.1:%d" % self.etcd_port],
                             "prefix": "/devcoord/test", "lease_ttl_ms": LEASE_TTL_MS}}
            path = self.write_yaml("coordinator-%d.yaml" % i, cfg)
            self.coords.append(Daemon("coordinator-%d" % i, [harness.SERVER, "--config", path],
                                      self.path("coordinator-%d.log" % i)))

    @property
    def addr(self):  # what workers and the CLI are given: every coordinator
        return ",".join(tcp_addr(p) for p in self.coord_ports)

    def start_etcd(self):
        self.etcd.start()

        def healthy():
            if not self.etcd.running():
                raise AssertionError("etcd exited:\n%s" % self.etcd.log_tail())
            try:
                with urllib.request.urlopen("http://127.0.0.1:%d/health" % self.etcd_port,
                                            timeout=1) as r:
                    return b"true" in r.read()
            except OSError:
                return False
        wait_until(healthy, 20, "etcd to be healthy")

    def start(self):
        self.start_etcd()
        for c in self.coords:
            c.start()
        return self.wait_leader()

    def answers(self, i):
        """(code, message) of ListWorkers at coordinator i; ("DOWN", why) when unreachable."""
        try:
            code, msg, _ = rpc_call(self.coord_ports[i], "ListWorkers", timeout=1.0)
            return code, msg
        except (OSError, harness.RpcError) as e:
            return "DOWN", str(e)

    def leaders(self):
        return [i for i, c in enumerate(self.coords)
                if c.running() and self.answers(i)[0] == "OK"]

    def wait_leader(self, timeout=20.0, exclude=()):
        def one():
            ls = [i for i in self.leaders() if i not in exclude]
            return ls[0] + 1 if len(ls) == 1 else None
        return wait_until(one, timeout, "one leader among the coordinators") - 1

    def leader_workers(self, i):
        code, msg, body = rpc_call(self.coord_ports[i], "ListWorkers", timeout=2.0)
        if code != "OK":
            raise harness.RpcError("%s: %s" % (code, msg))
        return {w["name"]: w for w in harness.decode_workers(body)}

    def wait_registered(self, i, names, timeout=20.0, state=None):
        def check():
            try:
                ws = self.leader_workers(i)
            except (OSError, harness.RpcError):
                return False
            return ws if all(n in ws and (state is None or ws[n]["state"] == state[n])
                             for n in names) else False
        return wait_until(check, timeout, "workers %s registered with coordinator %d"
                          % (names, i))

    def all_daemons(self):
        return list(self.workers.values()) + self.coords + [self.etcd]

    def close(self):
        if self.closed:
            return
        self.closed = True
        problems = []
        try:
            for group in (list(self.workers.values()), self.coords, [self.etcd]):
                live = [d for d in group if d.proc is not None and d.running()]
                for d in live:
                    d.expected_exit = True
                    d.signal(signal.SIGCONT)
                    d.signal(signal.SIGTERM)
                deadline = time.monotonic() + 10.0
                for d in live:
                    rc = d.wait(max(0.1, deadline - time.monotonic()))
                    if rc is None:
                        problems.append("%s did not exit within 10 s of SIGTERM" % d.name)
                        d.kill_quietly()
                    elif rc != 0 and d is not self.etcd:
                        problems.append("%s exited with %s on SIGTERM" % (d.name, rc))
        finally:
            for d in self.all_daemons():
                d.kill_quietly()
            self.tails = self.log_tails()
            if harness.KEEP:
                sys.stderr.write("\nkept %s\n" % self.dir)
            else:
                shutil.rmtree(self.dir, ignore_errors=True)
        if problems:
            raise AssertionError("; ".join(problems))


@unittest.skipUnless(os.path.exists(ETCD), "%s missing: install etcd-server "
                     "(.ci/setup-debian.sh test) to run the HA tests" % ETCD)
class HATest(harness.ClusterTestCase):
    def setUp(self):
        self.c = HACluster()
        self._clusters.append(self.c)
        self.addCleanup(self.c.close)
        self.leader = self.c.start()
        for n in ("w1", "w2", "w3"):
            self.c.add_worker(n, [{"device": "cpu:0"}])
        self.c.wait_registered(self.leader, ["w1", "w2", "w3"])

    def ctl(self, *args, **kw):
        return self.c.ctl(*args, **kw)

    def barrier(self, devices, timeout_ms=10000):
        return self.ctl("submit", "--op", "barrier", "--devices", ",".join(devices),
                        "--timeout-ms", str(timeout_ms))

    def test_followers_refuse_naming_the_leader(self):
        for i in range(3):
            code, msg = self.c.answers(i)
            if i == self.leader:
                self.assertEqual(code, "OK")
            else:
                self.assertEqual(code, "UNAVAILABLE", msg)
                self.assertIn("leader: %s" % tcp_addr(self.c.coord_ports[self.leader]), msg)
        # The CLI given every address finds the leader by itself, from any order.
        others = [tcp_addr(p) for i, p in enumerate(self.c.coord_ports) if i != self.leader]
        out = self.c.ctl_ok("workers", "list", server=",".join(others + [
            tcp_addr(self.c.coord_ports[self.leader])]))
        self.assertEqual(sorted(w["name"] for w in out["workers"]), ["w1", "w2", "w3"])

    def test_sigkill_leader_fails_over_with_intent_and_workers(self):
        self.c.ctl_ok("workers", "cordon", "w1")
        r = self.barrier(["w2/cpu:0", "w3/cpu:0"])
        self.assertEqual(r.rc, 0, r)
        old = self.leader
        killed = time.monotonic()
        self.c.coords[old].kill()
        new = self.c.wait_leader(timeout=30, exclude=(old,))
        self.assertNotEqual(new, old)
        ws = self.c.wait_registered(new, ["w1", "w2", "w3"], timeout=30)
        took = time.monotonic() - killed
        bound = (LEASE_TTL_MS + 2 * HEARTBEAT_MS) / 1000.0 + SLACK_S
        self.assertLessEqual(took, bound, "workers registered with the new leader %.2f s after "
                             "the kill (lease TTL + 2 heartbeats = %.1f s)" % (took, bound))
        self.assertEqual(ws["w1"]["state"], "cordoned", ws)
        self.assertEqual(ws["w2"]["state"], "alive", ws)
        # The next op runs, through the CLI given all three addresses (one dead).
        r = self.barrier(["w2/cpu:0", "w3/cpu:0"])
        self.assertEqual(r.rc, 0, r)
        # A cordoned worker is still refused by the new leader.
        r = self.barrier(["w1/cpu:0", "w2/cpu:0"])
        self.assertNotEqual(r.rc, 0, r)
        # The killed coordinator comes back as a follower of the new leader.
        self.c.coords[old].start()
        wait_until(lambda: "leader: %s" % tcp_addr(self.c.coord_ports[new])
                   in self.c.answers(old)[1], 20, "the old leader to follow the new one")

    def test_sigstop_leader_never_answers_as_leader_again(self):
        old = self.leader
        self.c.coords[old].signal(signal.SIGSTOP)
        try:
            new = self.c.wait_leader(timeout=30, exclude=(old,))
            time.sleep(0.5)
        finally:
            self.c.coords[old].signal(signal.SIGCONT)
        # From the moment it runs again, and for a few lease periods after, it only refuses.
        deadline = time.monotonic() + 3 * LEASE_TTL_MS / 1000.0
        seen = set()
        while time.monotonic() < deadline:
            code, msg = self.c.answers(old)
            self.assertNotEqual(code, "OK", "the paused leader answered as leader: %s" % msg)
            seen.add(code)
            time.sleep(0.05)
        self.assertEqual(seen, {"UNAVAILABLE"})
        self.assertIn("leader: %s" % tcp_addr(self.c.coord_ports[new]), self.c.answers(old)[1])
        self.assertIn("stepping down", self.c.coords[old].log_text())
        self.assertEqual(self.c.leaders(), [new])
        self.c.wait_registered(new, ["w1", "w2", "w3"], timeout=30)
        r = self.barrier(["w1/cpu:0", "w2/cpu:0", "w3/cpu:0"])
        self.assertEqual(r.rc, 0, r)

    def test_etcd_restart_is_ridden_out(self):
        self.c.ctl_ok("workers", "cordon", "w2")
        leader = self.leader
        self.c.etcd.kill()
        time.sleep(0.5)
        self.c.etcd.start()
        time.sleep(2 * LEASE_TTL_MS / 1000.0)
        leader = self.c.wait_leader(timeout=30)
        ws = self.c.wait_registered(leader, ["w1", "w2", "w3"], timeout=30,
                                    state={"w1": "alive", "w2": "cordoned", "w3": "alive"})
        self.assertEqual(ws["w2"]["state"], "cordoned")
        for d in self.c.coords:
            self.assertTrue(d.running(), "%s exited:\n%s" % (d.name, d.log_tail()))
        r = self.barrier(["w1/cpu:0", "w3/cpu:0"])
        self.assertEqual(r.rc, 0, r)

    def test_op_in_flight_at_leader_change_fails_unavailable_once(self):
        import opsutil
        old = self.leader
        # w3 frozen: the op's Execute there cannot answer, so the op stays in flight.
        self.c.workers["w3"].signal(signal.SIGSTOP)
        try:
            p = opsutil.ctl_popen(self.c, "submit", "--op", "barrier", "--devices",
                                  "w2/cpu:0,w3/cpu:0", "--timeout-ms", "60000")
            wait_until(lambda: self.in_flight(old), 10,
                       "the op to be in flight")
            self.c.coords[old].signal(signal.SIGSTOP)
            new = self.c.wait_leader(timeout=30, exclude=(old,))
            self.c.coords[old].signal(signal.SIGCONT)
            r = opsutil.finish(p, timeout=30)
        finally:
            self.c.workers["w3"].signal(signal.SIGCONT)
            self.c.coords[old].signal(signal.SIGCONT)
        self.assertNotEqual(r.rc, 0, r)
        self.assertIn("UNAVAILABLE", r.err + str(r.out), r)
        self.assertIn("leadership", r.err + str(r.out), r)
        # Never run again by the new leader: it has no op in its history.
        self.c.wait_registered(new, ["w1", "w2", "w3"], timeout=30)
        ops = self.c.ctl_ok("ops", "list")
        self.assertEqual(ops.get("ops", []), [], ops)
        # The worker that saw the new term refuses the old one's orders (fencing).
        r = self.barrier(["w2/cpu:0", "w3/cpu:0"])
        self.assertEqual(r.rc, 0, r)
        old_term = int(self.term_named(old))
        port = int(self.c.worker_specs["w2"]["listen"].rsplit(":", 1)[1])
        body = (pb_bytes(F("ExecuteRequest", "op_id"), b"op-fenced")
                + pb_uint(F("ExecuteRequest", "term"), old_term))
        code, msg, _ = rpc_call(port, "/devcoord.v1.Worker/Execute", body)
        self.assertEqual(code, "FAILED_PRECONDITION", msg)
        self.assertIn("order from an older coordinator term %d <" % old_term, msg)

    def in_flight(self, i):
        code, _, body = rpc_call(self.c.coord_ports[i], "GetClusterStatus", timeout=1.0)
        return code == "OK" and harness._one(harness.pb_decode(body), F(
            "GetClusterStatusResponse", "ops_in_flight"), 0) > 0

    def term_named(self, i):
        """The term coordinator i led in, from its log."""
        import re
        terms = re.findall(r"leading as \S+ \(term (\d+)\)", self.c.coords[i].log_text())
        self.assertTrue(terms, "coordinator %d never led" % i)
        return terms[-1]


if __name__ == "__main__":
    unittest.main()
