"""Issue 3: worker membership, liveness and the operator CLI against the real binaries.

Heartbeats are shortened (interval 200 ms, dead after 1000 ms) so the liveness tests are
quick; the bounds asserted are the liveness contract of design §7 plus a scheduling slack
($DEVCOORD_TEST_SLACK_MS, default 500 ms), never a performance figure.

    cd tests/integration && python3 -m unittest -v test_membership
"""

import json
import os
import random
import re
import shutil
import socket
import struct
import subprocess
import tempfile
import time
import unittest

import harness
from harness import (COORDINATOR, SLACK_S, ClusterTestCase, RpcConnection, RpcError, frame,
                     pb_bytes, pb_uint)

GiB = 1 << 30

# Three workers with different device sets: two cuda:0 on different workers (cluster names
# must keep them apart), an unhealthy device, non-canonical spellings in the config, and a
# worker without labels.
WORKERS = {
    "node-a": {
        "labels": {"rack": "r1", "zone": "z1"},
        "collectives": ["cuda"],
        "devices": [
            {"device": "cuda:0", "memory": "80GiB"},
            {"device": "cuda:1", "memory": "80GiB", "healthy": True},
        ],
    },
    "node-b": {
        "labels": {"rack": "r2"},
        "devices": [
            {"device": "rocm:0", "memory": "64GiB"},
            {"device": "rocm:1", "memory": "64GiB", "healthy": False},
            {"device": "cpu:0", "memory": "16GiB"},
        ],
    },
    "node-c": {
        "labels": {},
        "devices": [
            {"device": "cuda:0", "memory": "24GiB"},
            {"device": "wgpu:discrete:0", "memory": "8GiB"},
            {"device": "wgpu:1", "memory": "512MiB"},
            {"device": "ndarray", "memory": "1GB"},
        ],
    },
}


def _device(worker, device, backend, memory, state="healthy"):
    return {"name": "%s/%s" % (worker, device), "worker": worker, "device": device,
            "backend": backend, "state": state, "memory_bytes": memory}


# What `devices list -o json` must show, in canonical spelling (design §3).
EXPECTED_DEVICES = [
    _device("node-a", "cuda:0", "cuda", 80 * GiB),
    _device("node-a", "cuda:1", "cuda", 80 * GiB),
    _device("node-b", "rocm:0", "rocm", 64 * GiB),
    _device("node-b", "rocm:1", "rocm", 64 * GiB, "unhealthy"),
    _device("node-b", "cpu:0", "cpu", 16 * GiB),
    _device("node-c", "cuda:0", "cuda", 24 * GiB),
    _device("node-c", "wgpu:discrete:0", "wgpu", 8 * GiB),
    _device("node-c", "wgpu:default:1", "wgpu", 512 << 20),
    _device("node-c", "ndarray:0", "ndarray", 1000 * 1000 * 1000),
]
DEVICE_KEYS = ("name", "worker", "device", "backend", "state", "memory_bytes")
WORKER_STATES = ("alive", "dead", "cordoned", "draining")
DEVICE_STATES = ("healthy", "unhealthy", "dead")
ERROR_LINE = re.compile(r"^devcoordctl: ([A-Z][A-Z_]+): (.+)$")


def expected_devices(pred=lambda d: True, dead_workers=()):
    out = []
    for d in EXPECTED_DEVICES:
        d = dict(d)
        if d["worker"] in dead_workers:
            d["state"] = "dead"
        if pred(d):
            out.append(d)
    return sorted(out, key=lambda d: d["name"])


class CliMixin:
    """Reads of the registry through devcoordctl -o json, checking the §10 shapes."""

    def ctl(self, *args, **kw):
        return self.cluster.ctl(*args, **kw)

    def workers_json(self):
        out = self.cluster.ctl_ok("workers", "list")
        self.assertIsInstance(out, dict, "workers list: %r" % (out,))
        self.assertIsInstance(out.get("workers"), list, "workers list: %r" % (out,))
        by_name = {}
        for w in out["workers"]:
            for key in ("name", "address", "state", "epoch", "devices", "labels"):
                self.assertIn(key, w, "workers list entry %r lacks %r" % (w, key))
            self.assertIn(w["state"], WORKER_STATES, w)
            self.assertNotIn(w["name"], by_name, "worker listed twice: %r" % (out,))
            by_name[w["name"]] = w
        return by_name

    def devices_json(self, *filters):
        out = self.cluster.ctl_ok("devices", "list", *filters)
        self.assertIsInstance(out, dict, "devices list: %r" % (out,))
        self.assertIsInstance(out.get("devices"), list, "devices list: %r" % (out,))
        for d in out["devices"]:
            for key in DEVICE_KEYS:
                self.assertIn(key, d, "devices list entry %r lacks %r" % (d, key))
            self.assertIn(d["state"], DEVICE_STATES, d)
        return out["devices"]

    def assert_devices(self, filters, expected, msg=""):
        got = self.devices_json(*filters)
        names = [d["name"] for d in got]
        self.assertEqual(len(names), len(set(names)), "a device listed twice: %r" % names)
        got = sorted(({k: d[k] for k in DEVICE_KEYS} for d in got), key=lambda d: d["name"])
        self.assertEqual(got, expected, "devices list %s %s" % (" ".join(filters), msg))

    def assert_error(self, r, rc, code, mentions=None):
        """An error as design §10 says: exit code, stderr 'devcoordctl: CODE: message'."""
        self.assertEqual(r.rc, rc, repr(r))
        lines = [l for l in r.err.splitlines() if l.strip()]
        self.assertTrue(lines, "nothing on stderr: %r" % (r,))
        m = ERROR_LINE.match(lines[0])
        self.assertIsNotNone(m, "stderr is not 'devcoordctl: CODE: message': %r" % (r,))
        if code is not None:
            self.assertEqual(m.group(1), code, repr(r))
        if mentions is not None:
            self.assertIn(mentions, m.group(2), repr(r))

    def poll_worker_state(self, name, state, bound, since=None, grace=10.0):
        """Polls `workers list` until `name` is in `state`; returns the seconds it took from
        `since` (a time.monotonic(); default now) to a reply showing it. Keeps polling past
        `bound` (up to bound + grace) only so the failure can say when, or whether, the
        state was reached."""
        t0 = since if since is not None else time.monotonic()
        seen = []
        while True:
            w = self.workers_json().get(name)
            elapsed = time.monotonic() - t0
            st = w["state"] if w else "absent"
            if not seen or seen[-1][1] != st:
                seen.append((round(elapsed, 3), st))
            if st == state:
                self.assertLessEqual(
                    elapsed, bound, "worker %s became %s after %.3f s, bound %.3f s (states "
                    "seen: %r)" % (name, state, elapsed, bound, seen))
                return elapsed
            if elapsed > bound + grace:
                self.fail("worker %s not %s after %.1f s (bound %.3f s; states seen: %r)"
                          % (name, state, elapsed, bound, seen))
            time.sleep(0.01)

    def restart_coordinator_and_check(self, outage_s):
        """SIGKILLs the coordinator, keeps it down outage_s, starts it on the same port and
        checks every worker is registered again (alive, a higher epoch, its devices) within
        two heartbeats plus the slack of the moment the coordinator answers."""
        c = self.cluster
        old = {n: w["epoch"] for n, w in self.workers_json().items()}
        c.kill_coordinator()
        time.sleep(outage_s)  # the outage being simulated, not a wait for a condition
        ready_at = c.restart_coordinator()
        bound = 2 * c.heartbeat_s + SLACK_S
        back = {}
        while len(back) < len(WORKERS) and time.monotonic() < ready_at + bound + 10.0:
            workers = self.workers_json()
            now = time.monotonic()
            for n, w in workers.items():
                if w["state"] == "alive" and n not in back:
                    back[n] = round(now - ready_at, 3)
            time.sleep(0.01)
        print("\n  after a %.1f s outage, workers back (s after the coordinator was ready, "
              "bound %.3f s): %r" % (outage_s, bound, back))
        self.assertEqual(sorted(back), sorted(WORKERS),
                         "workers not back 10 s after the coordinator restart: %r" % back)
        late = {n: t for n, t in back.items() if t > bound}
        self.assertFalse(late, "workers back later than two heartbeats (%d ms) + %d ms slack "
                         "after the coordinator was ready: %r"
                         % (c.heartbeat_ms, SLACK_S * 1000, late))
        workers = self.workers_json()
        for n, w in workers.items():
            self.assertGreater(w["epoch"], old.get(n, 0), "epochs grow across coordinator restarts")
        self.assert_devices([], expected_devices())
        for name in WORKERS:
            self.assertTrue(c.worker(name).running(), "%s exited" % name)


def start_three(test):
    c = test.make_cluster()
    c.start_coordinator()
    for name, spec in WORKERS.items():
        c.add_worker(name, spec["devices"], labels=spec["labels"],
                     collectives=spec.get("collectives"))
    c.wait_workers(list(WORKERS))
    return c


class MembershipTest(CliMixin, ClusterTestCase):
    """Three workers registered with one coordinator; the CLI's view of them."""

    def setUp(self):
        self.cluster = start_three(self)

    # -- listing

    def test_devices_list_json_is_exactly_the_registered_devices(self):
        self.assert_devices([], expected_devices())

    def test_devices_list_table(self):
        r = self.ctl("devices", "list", output="table")
        self.assertEqual(r.rc, 0, repr(r))
        lines = [l for l in r.out.splitlines() if l.strip()]
        self.assertEqual(len(lines), 1 + len(EXPECTED_DEVICES),
                         "want a header row and one row per device:\n%s" % r.out)
        header, rows = lines[0], lines[1:]
        for d in EXPECTED_DEVICES:
            self.assertNotIn(d["name"], header.split(), "header row:\n%s" % r.out)
            mine = [row for row in rows if d["name"] in row.split()]
            self.assertEqual(len(mine), 1, "%s in one row:\n%s" % (d["name"], r.out))
            self.assertIn(d["state"], mine[0].split(), "state of %s:\n%s" % (d["name"], r.out))
        listed = {tok for row in rows for tok in row.split() if "/" in tok}
        self.assertEqual(listed, {d["name"] for d in EXPECTED_DEVICES}, r.out)
        self.assert_aligned(r.out)

    def assert_aligned(self, text):
        """Columns start where the header's do: every header word after the first starts
        right after a blank in every row."""
        lines = [l for l in text.splitlines() if l.strip()]
        header = lines[0]
        starts = [m.start() for m in re.finditer(r"(?<= )\S", header)]
        for row in lines[1:]:
            for s in starts:
                ok = s < len(row) and row[s - 1] == " " and row[s] != " "
                ok = ok or (s >= len(row.rstrip()))  # an empty last column
                self.assertTrue(ok, "row not aligned with the header at column %d:\n%s"
                                % (s, text))

    def test_workers_list_json_shape(self):
        workers = self.workers_json()
        self.assertEqual(sorted(workers), sorted(WORKERS))
        for name, spec in WORKERS.items():
            w = workers[name]
            self.assertEqual(w["address"], self.cluster.worker_specs[name]["advertise"], w)
            self.assertEqual(w["state"], "alive", w)
            self.assertIsInstance(w["epoch"], int, w)
            self.assertGreater(w["epoch"], 0, w)
            self.assertEqual(w["devices"], len(spec["devices"]), w)
            self.assertEqual(w["labels"], spec["labels"], w)
        self.assertEqual(len({w["epoch"] for w in workers.values()}), 3,
                         "each registration gets its own epoch: %r" % workers)

    def test_workers_list_table(self):
        r = self.ctl("workers", "list", output="table")
        self.assertEqual(r.rc, 0, repr(r))
        lines = [l for l in r.out.splitlines() if l.strip()]
        self.assertEqual(len(lines), 1 + len(WORKERS), r.out)
        for name in WORKERS:
            mine = [row for row in lines[1:] if name in row.split()]
            self.assertEqual(len(mine), 1, "%s in one row:\n%s" % (name, r.out))
            self.assertIn("alive", mine[0].split(), r.out)
        self.assert_aligned(r.out)

    def test_workers_show(self):
        out = self.cluster.ctl_ok("workers", "show", "node-b")
        found = find_worker(out, "node-b")
        self.assertIsNotNone(found, "workers show node-b: %r" % (out,))
        self.assertEqual(found.get("state"), "alive", out)
        self.assertEqual(found.get("labels"), {"rack": "r2"}, out)
        self.assert_error(self.ctl("workers", "show", "node-z"), 1, "NOT_FOUND", "node-z")

    def test_status_json_counts(self):
        out = self.cluster.ctl_ok("status")
        self.assertEqual(pick(out.get("workers"), WORKER_STATES),
                         {"alive": 3, "dead": 0, "cordoned": 0, "draining": 0}, out)
        devices = {k: v for k, v in out.get("devices", {}).items() if v}
        self.assertEqual(devices, {"cuda": 3, "rocm": 2, "cpu": 1, "wgpu": 2, "ndarray": 1}, out)
        self.assertEqual(pick(out.get("ops"), ("in_flight", "done", "failed")),
                         {"in_flight": 0, "done": 0, "failed": 0}, out)

    # -- filters

    def test_devices_list_filters(self):
        cases = [
            (["--state", "healthy"], lambda d: d["state"] == "healthy"),
            (["--state", "unhealthy"], lambda d: d["state"] == "unhealthy"),
            (["--state", "dead"], lambda d: False),
            (["--backend", "cuda"], lambda d: d["backend"] == "cuda"),
            (["--backend", "wgpu"], lambda d: d["backend"] == "wgpu"),
            (["--backend", "metal"], lambda d: False),
            (["--worker", "node-b"], lambda d: d["worker"] == "node-b"),
            (["--worker", "node-c"], lambda d: d["worker"] == "node-c"),
            (["--backend", "cuda", "--worker", "node-c"],
             lambda d: d["backend"] == "cuda" and d["worker"] == "node-c"),
            (["--worker", "node-b", "--state", "healthy"],
             lambda d: d["worker"] == "node-b" and d["state"] == "healthy"),
        ]
        for filters, pred in cases:
            with self.subTest(filters=filters):
                self.assert_devices(filters, expected_devices(pred))

    def test_devices_list_bad_filter_is_refused(self):
        for filters in (["--backend", "tpu"], ["--state", "sleepy"]):
            with self.subTest(filters=filters):
                r = self.ctl("devices", "list", *filters)
                # A usage error (found before asking the server) carries no server code.
                self.assertEqual(r.rc, 2, repr(r))
                self.assertRegex(r.err, r"^devcoordctl: (?![A-Z_]+: )\S", repr(r))

    # -- operator intent

    def test_cordon_uncordon_drain_show_in_workers_list(self):
        c = self.cluster
        steps = [
            (("workers", "cordon", "node-a"), {"node-a": "cordoned"}),
            (("workers", "drain", "node-b"), {"node-a": "cordoned", "node-b": "draining"}),
            (("workers", "uncordon", "node-a"), {"node-b": "draining"}),
            (("workers", "uncordon", "node-b"), {}),
            (("workers", "drain", "node-c"), {"node-c": "draining"}),
            (("workers", "cordon", "node-c"), {"node-c": "cordoned"}),
        ]
        for args, changed in steps:
            with self.subTest(command=" ".join(args)):
                c.ctl_ok(*args)
                want = {n: changed.get(n, "alive") for n in WORKERS}
                got = {n: w["state"] for n, w in self.workers_json().items()}
                self.assertEqual(got, want, "after devcoordctl %s" % " ".join(args))
                counts = {s: list(want.values()).count(s) for s in WORKER_STATES}
                self.assertEqual(pick(c.ctl_ok("status").get("workers"), WORKER_STATES), counts)
        # Intent is not liveness: a cordoned worker keeps heartbeating and stays cordoned,
        # its devices still healthy (they just take no new work).
        time.sleep(3 * c.heartbeat_s)
        self.assertEqual(self.workers_json()["node-c"]["state"], "cordoned")
        self.assert_devices(["--worker", "node-c"],
                            expected_devices(lambda d: d["worker"] == "node-c"))

    def test_steering_an_unknown_worker_is_not_found(self):
        for verb in ("cordon", "uncordon", "drain"):
            with self.subTest(verb=verb):
                self.assert_error(self.ctl("workers", verb, "node-z"), 1, "NOT_FOUND", "node-z")
                self.assert_error(self.ctl("workers", verb, "node-z", output="table"), 1,
                                  "NOT_FOUND", "node-z")
        self.assertEqual({w["state"] for w in self.workers_json().values()}, {"alive"})

    # -- liveness

    def test_sigkill_worker_is_dead_in_time_then_restarts_with_higher_epoch(self):
        c = self.cluster
        old_epoch = self.workers_json()["node-b"]["epoch"]
        killed_at = time.monotonic()
        c.kill_worker("node-b")
        bound = c.dead_after_s + c.heartbeat_s + SLACK_S
        took = self.poll_worker_state("node-b", "dead", bound, since=killed_at)
        print("\n  SIGKILLed worker dead after %.3f s (bound %.3f s)" % (took, bound))

        workers = self.workers_json()
        self.assertEqual({n: w["state"] for n, w in workers.items()},
                         {"node-a": "alive", "node-b": "dead", "node-c": "alive"})
        self.assertEqual(workers["node-b"]["epoch"], old_epoch)
        self.assert_devices([], expected_devices(dead_workers=("node-b",)))
        self.assert_devices(["--state", "dead"], expected_devices(
            lambda d: d["state"] == "dead", dead_workers=("node-b",)))
        self.assert_devices(["--state", "healthy"], expected_devices(
            lambda d: d["state"] == "healthy", dead_workers=("node-b",)))
        status = c.ctl_ok("status")
        self.assertEqual(pick(status.get("workers"), WORKER_STATES),
                         {"alive": 2, "dead": 1, "cordoned": 0, "draining": 0}, status)

        c.restart_worker("node-b")
        self.poll_worker_state("node-b", "alive", 20.0)
        workers = self.workers_json()
        self.assertGreater(workers["node-b"]["epoch"], old_epoch, workers["node-b"])
        self.assertEqual(workers["node-b"]["devices"], 3)
        self.assert_devices([], expected_devices())

    def test_sigstop_worker_is_dead_then_alive_after_sigcont(self):
        c = self.cluster
        stopped_at = time.monotonic()
        c.stop_worker("node-c")
        bound = c.dead_after_s + c.heartbeat_s + SLACK_S
        self.poll_worker_state("node-c", "dead", bound, since=stopped_at)
        self.assert_devices(["--worker", "node-c"], expected_devices(
            lambda d: d["worker"] == "node-c", dead_workers=("node-c",)))
        c.cont_worker("node-c")
        self.poll_worker_state("node-c", "alive", 10.0)
        self.assert_devices([], expected_devices())
        self.assertEqual({w["state"] for w in self.workers_json().values()}, {"alive"})

    def test_coordinator_restart_workers_are_back_within_two_heartbeats(self):
        self.restart_coordinator_and_check(outage_s=0.0)

    def test_sigterm_worker_deregisters(self):
        c = self.cluster
        rc = c.terminate_worker("node-c")
        self.assertEqual(rc, 0, "worker exit code on SIGTERM\n" + c.worker("node-c").log_tail())
        # It deregistered before exiting: gone at once, not dead after dead_after.
        workers = self.workers_json()
        self.assertEqual(sorted(workers), ["node-a", "node-b"], workers)
        self.assert_devices([], expected_devices(lambda d: d["worker"] != "node-c"))
        status = c.ctl_ok("status")
        self.assertEqual(pick(status.get("workers"), WORKER_STATES),
                         {"alive": 2, "dead": 0, "cordoned": 0, "draining": 0}, status)

    # -- health and errors

    def test_health(self):
        r = self.ctl("health", output=None)
        self.assertEqual(r.rc, 0, repr(r))
        with harness.DeadPort() as dead:
            r = self.ctl("health", output=None, server=dead.addr)
        self.assert_error(r, 3, "UNAVAILABLE")

    def test_server_address_from_environment(self):
        argv = [harness.CTL, "-o", "json", "workers", "list"]
        env = dict(os.environ, DEVCOORD_ADDR=self.cluster.addr)
        p = subprocess.run(argv, capture_output=True, timeout=30, env=env,
                           stdin=subprocess.DEVNULL)
        self.assertEqual(p.returncode, 0, p)
        self.assertEqual(sorted(w["name"] for w in json.loads(p.stdout)["workers"]),
                         sorted(WORKERS))

    def test_usage_errors_exit_2(self):
        for args in (["frobnicate"], ["workers", "cordon"], ["devices", "list", "--bogus"],
                     ["workers"]):
            with self.subTest(args=args):
                r = self.ctl(*args)
                self.assertEqual(r.rc, 2, repr(r))
                self.assertTrue(r.err.strip(), "usage error without a word on stderr: %r" % (r,))
        r = self.ctl("status", output="yaml")
        self.assertEqual(r.rc, 2, repr(r))


def pick(d, keys):
    if not isinstance(d, dict):
        return d
    return {k: d.get(k) for k in keys}


def find_worker(doc, name):
    """The dict describing worker `name` in a `workers show` document, wherever it nests."""
    if isinstance(doc, dict):
        if doc.get("name") == name and "state" in doc:
            return doc
        for v in doc.values():
            found = find_worker(v, name)
            if found is not None:
                return found
    elif isinstance(doc, list):
        for v in doc:
            found = find_worker(v, name)
            if found is not None:
                return found
    return None


class CoordinatorOutageTest(CliMixin, ClusterTestCase):
    """A coordinator down for longer than the workers' reconnect backoff takes to grow to
    its cap: once it is back, every worker must be registered again within two heartbeats
    (design §7, issue 3), whatever the configured heartbeat interval. Three outages, since
    each worker's reconnect moment is random."""

    heartbeat_ms = 100
    dead_after_ms = 1000

    def setUp(self):
        self.cluster = start_three(self)

    def test_workers_back_within_two_heartbeats_after_long_outages(self):
        for i in range(3):
            with self.subTest(outage=i + 1):
                self.restart_coordinator_and_check(outage_s=2.0)


class BadInputTest(CliMixin, ClusterTestCase):
    """Garbage on the coordinator's RPC port: each input gets its code or a closed
    connection, and the coordinator goes on serving."""

    def setUp(self):
        c = self.cluster = self.make_cluster()
        c.start_coordinator()
        c.add_worker("node-a", [{"device": "cuda:0", "memory": "80GiB"}])
        c.wait_workers(["node-a"])
        self.rng = random.Random(3)

    def assert_still_serving(self, what):
        c = self.cluster
        self.assertTrue(c.coordinator.running(),
                        "coordinator died after %s:\n%s" % (what, c.coordinator.log_tail()))
        code, message, _ = harness.rpc_call(c.port, "GetClusterStatus")
        self.assertEqual(code, "OK", "GetClusterStatus after %s: %s" % (what, message))
        r = self.ctl("health", output=None)
        self.assertEqual(r.rc, 0, "health after %s: %r" % (what, r))
        self.assertEqual(self.workers_json()["node-a"]["state"], "alive", what)

    def connect(self):
        s = socket.create_connection((harness.HOST, self.cluster.port), timeout=10)
        s.settimeout(10)
        return s

    def assert_closed_by_server(self, s, what):
        """Reads until EOF or reset (skipping the server's own SP greeting); fails if the
        server keeps the connection open for 10 s."""
        try:
            while s.recv(65536):
                pass
        except (ConnectionResetError, BrokenPipeError):
            pass
        except socket.timeout:
            self.fail("the coordinator kept the connection open after %s" % what)

    def send_tolerating_close(self, s, data):
        """Sends data; True if the server closed the connection under us."""
        try:
            s.sendall(data)
            return False
        except (ConnectionResetError, BrokenPipeError):
            return True

    def test_random_bytes_before_handshake(self):
        for i in range(5):
            with self.connect() as s:
                self.send_tolerating_close(s, bytes(self.rng.getrandbits(8) for _ in range(4096)))
                self.assert_closed_by_server(s, "random bytes")
        self.assert_still_serving("random bytes")

    def test_http_request(self):
        with self.connect() as s:
            self.send_tolerating_close(
                s, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            self.assert_closed_by_server(s, "an HTTP request")
        self.assert_still_serving("an HTTP request")

    def test_truncated_handshake(self):
        # Half a greeting, held open: it must not hold up anyone else.
        held = []
        try:
            for _ in range(20):
                s = self.connect()
                s.sendall(harness.sp_greeting(harness.SP_REQ0)[:3])
                held.append(s)
            self.assert_still_serving("20 half-open handshakes")
        finally:
            for s in held:
                s.close()
        self.assert_still_serving("closed half-open handshakes")

    def test_64_mib_blob(self):
        blob = os.urandom(1 << 20) * 64
        # Without a handshake...
        with self.connect() as s:
            self.send_tolerating_close(s, blob)
            self.assert_closed_by_server(s, "64 MiB of bytes")
        self.assert_still_serving("64 MiB of bytes")
        # ...and as one SP message after a proper one, far over limits.max_message_bytes.
        with RpcConnection(self.cluster.port) as conn:
            closed = self.send_tolerating_close(conn.sock, struct.pack(">Q", len(blob)) + blob)
            if not closed:
                self.assert_closed_by_server(conn.sock, "a 64 MiB message")
        self.assert_still_serving("a 64 MiB message")

    def test_truncated_sp_message(self):
        with RpcConnection(self.cluster.port) as conn:
            conn.sock.sendall(struct.pack(">Q", 1000) + b"\x80\x00\x00\x01" + b"x" * 10)
        self.assert_still_serving("a truncated SP message")

    def test_bad_frames_get_their_codes(self):
        method = pb_bytes(2, COORDINATOR + "ListWorkers")
        cases = [
            ("unknown method", frame(pb_uint(1, 1) + pb_bytes(2, COORDINATOR + "Frobnicate")),
             "UNIMPLEMENTED"),
            ("unknown service", frame(pb_uint(1, 1) + pb_bytes(2, "/devcoord.v1.Nope/ListWorkers")),
             "UNIMPLEMENTED"),
            ("undecodable body", frame(pb_uint(1, 1) + pb_bytes(2, COORDINATOR + "ListDevices"),
                                       b"\xff\xff\xff\xff"), "INVALID_ARGUMENT"),
            ("undecodable header", frame(b"\x12\xff\x01abc"), "INVALID_ARGUMENT"),
            ("empty frame", b"", "INVALID_ARGUMENT"),
            ("truncated frame", frame(method)[:-3], "INVALID_ARGUMENT"),
            ("header length past the end", struct.pack(">I", 1000) + method, "INVALID_ARGUMENT"),
            ("body length past the end", struct.pack(">I", len(method)) + method
             + struct.pack(">I", 1 << 30), "INVALID_ARGUMENT"),
            ("huge header length", struct.pack(">I", 0xFFFFFFFF) + method, "INVALID_ARGUMENT"),
            ("random frame", bytes(self.rng.getrandbits(8) for _ in range(300)),
             "INVALID_ARGUMENT"),
        ]
        for what, payload, want in cases:
            with self.subTest(what):
                with RpcConnection(self.cluster.port) as conn:
                    code, message, _ = conn.call_raw(payload)
                    self.assertEqual(code, want, "%s: %s" % (what, message))
                    self.assertTrue(message, "%s: %s without a message" % (what, code))
                    # The connection still works for a proper call.
                    code, message, _ = conn.call(COORDINATOR + "ListWorkers")
                    self.assertEqual(code, "OK", "after %s: %s" % (what, message))
        self.assert_still_serving("bad frames")

    def test_sp_message_without_request_id(self):
        for payload in (b"", b"\x00", b"\x00\x00\x00\x01" + b"x" * 64):
            with self.subTest(payload=payload[:8]):
                try:
                    with RpcConnection(self.cluster.port) as conn:
                        conn.send_message(payload)
                        conn.sock.settimeout(0.5)
                        try:
                            reply = conn.recv_message()
                            self.fail("a reply to a request without an id: %r" % reply[:64])
                        except (socket.timeout, RpcError, ConnectionResetError):
                            pass
                except (ConnectionResetError, BrokenPipeError):
                    pass
                self.assert_still_serving("an SP message without a request id")


class MessageLimitTest(CliMixin, ClusterTestCase):
    """limits.max_message_bytes applies to the coordinator's receiving socket."""

    LIMIT = 64 * 1024

    def setUp(self):
        c = self.cluster = self.make_cluster(
            coordinator_config={"limits": {"max_message_bytes": self.LIMIT}})
        c.start_coordinator()

    def request(self, attachment):
        header = pb_uint(1, 7) + pb_bytes(2, COORDINATOR + "GetClusterStatus")
        return struct.pack(">I", 0x80000007) + frame(header, b"", attachment)

    def test_within_the_limit_is_answered(self):
        with RpcConnection(self.cluster.port) as conn:
            conn.send_message(self.request(b"\0" * (self.LIMIT // 2)))
            code, message, _ = harness.parse_reply(conn.recv_message()[4:])
            self.assertEqual(code, "OK", message)

    def test_over_the_limit_is_dropped(self):
        with RpcConnection(self.cluster.port) as conn:
            payload = self.request(b"\0" * (16 * self.LIMIT))
            try:
                conn.send_message(payload)
            except (ConnectionResetError, BrokenPipeError):
                pass
            try:
                reply = conn.recv_message()
                self.fail("a reply to a message 16 times over the limit: %r" % reply[:64])
            except (RpcError, ConnectionResetError):
                pass  # closed
            except socket.timeout:
                self.fail("the coordinator kept the connection open after a message 16 times "
                          "over limits.max_message_bytes")
        self.assertTrue(self.cluster.coordinator.running())
        r = self.ctl("health", output=None)
        self.assertEqual(r.rc, 0, repr(r))


class RegistryBoundsTest(CliMixin, ClusterTestCase):
    """Issue 12, item 7: fake workers with 65,536 devices each took 200 MB and stayed listed
    while dead. Registrations past limits.max_devices_per_worker or limits.max_workers are
    refused with RESOURCE_EXHAUSTED naming the limit; a worker dead for
    heartbeat.forget_after_ms leaves the registry, and finds its cordon again when it comes
    back."""

    FORGET_MS = 1500

    def setUp(self):
        c = self.cluster = self.make_cluster(coordinator_config={
            "heartbeat": {"interval_ms": self.heartbeat_ms, "dead_after_ms": self.dead_after_ms,
                          "forget_after_ms": self.FORGET_MS},
            "limits": {"max_workers": 2, "max_devices_per_worker": 2, "max_devices": 8}})
        c.start_coordinator()
        c.add_worker("node-a", [{"device": "cuda:0"}, {"device": "cuda:1"}])
        c.add_worker("node-b", [{"device": "cuda:0"}])
        c.wait_workers(["node-a", "node-b"])

    def register(self, name, devices):
        spec = b"".join(pb_bytes(4, pb_bytes(1, pb_uint(1, 2) + pb_uint(3, i)) + pb_uint(3, 1))
                        for i in range(devices))
        body = pb_bytes(1, name) + pb_bytes(2, "tcp://127.0.0.1:1") + spec
        return harness.rpc_call(self.cluster.port, "RegisterWorker", body)

    def assert_refused(self, name, devices, says):
        code, message, _ = self.register(name, devices)
        self.assertEqual(code, "RESOURCE_EXHAUSTED", message)
        self.assertIn(says, message)

    def test_limits_and_forgetting(self):
        c = self.cluster
        self.assert_refused("node-z", 3, "3 devices, over limits.max_devices_per_worker (2)")
        self.assert_refused("node-z", 1, "limits.max_workers (2) reached")
        self.assertEqual(sorted(self.workers_json()), ["node-a", "node-b"])

        c.ctl_ok("workers", "cordon", "node-b")
        killed_at = time.monotonic()
        c.kill_worker("node-b")
        self.poll_worker_state("node-b", "dead", c.dead_after_s + c.heartbeat_s + SLACK_S,
                               since=killed_at)
        self.assert_refused("node-z", 1, "limits.max_workers (2) reached, 1 of them dead")
        forget_s = self.FORGET_MS / 1000.0
        took = self.poll_worker_state("node-b", "absent",
                                      c.dead_after_s + c.heartbeat_s + forget_s + 2 * SLACK_S,
                                      since=killed_at)
        # Not before it had been dead for forget_after (its last heartbeat may have come up
        # to an interval before the kill).
        self.assertGreaterEqual(took, c.dead_after_s + forget_s - c.heartbeat_s)
        self.assertEqual([d["worker"] for d in self.devices_json()], ["node-a", "node-a"])
        status = c.ctl_ok("status")
        self.assertEqual(pick(status.get("workers"), WORKER_STATES),
                         {"alive": 1, "dead": 0, "cordoned": 0, "draining": 0}, status)
        self.assertIn("worker node-b forgotten", c.coordinator.log_text())

        # Back, it is cordoned as it was left; and the registry is full again.
        c.restart_worker("node-b")
        self.poll_worker_state("node-b", "cordoned", 20.0)
        self.assert_refused("node-z", 1, "limits.max_workers (2) reached, 0 of them dead")

    def test_a_forgotten_workers_cordon_can_be_cleared(self):
        # A cordon is kept for a forgotten worker; an operator who retired the name clears it
        # with uncordon (answered with the name, dead). Only an uncordon reaches a name not
        # registered: a cordon or drain of one, and an uncordon of one with nothing kept,
        # stay NOT_FOUND.
        c = self.cluster
        c.ctl_ok("workers", "cordon", "node-b")
        killed_at = time.monotonic()
        c.kill_worker("node-b")
        self.poll_worker_state("node-b", "absent",
                               c.dead_after_s + c.heartbeat_s + self.FORGET_MS / 1000.0
                               + 2 * SLACK_S, since=killed_at)
        out = c.ctl_ok("workers", "uncordon", "node-b")
        self.assertEqual(out["worker"]["name"], "node-b", out)
        self.assertEqual(out["worker"]["state"], "dead", out)
        self.assertIn("worker node-b uncordoned by an operator", c.coordinator.log_text())
        for verb, name in (("cordon", "node-b"), ("drain", "node-b"), ("uncordon", "node-b"),
                           ("cordon", "node-z"), ("uncordon", "node-z")):
            r = c.ctl("workers", verb, name)
            self.assertNotEqual(r.rc, 0, r)
            self.assertIn("NOT_FOUND", r.err, r)
            self.assertIn("worker %s is not registered" % name, r.err, r)
        # Back, it takes ops: nothing is kept for it any more.
        c.restart_worker("node-b")
        self.poll_worker_state("node-b", "alive", 20.0)


class ConfigErrorTest(unittest.TestCase):
    """A bad config stops a daemon at once with file:line:column and the key."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="devcoord-it-config-")
        self.addCleanup(shutil.rmtree, self.dir, True)

    def run_daemon(self, binary, text, name="bad.yaml"):
        path = os.path.join(self.dir, name)
        with open(path, "w") as f:
            f.write(text)
        try:
            p = subprocess.run([binary, "--config", path], stdin=subprocess.DEVNULL,
                               capture_output=True, timeout=20, start_new_session=True)
        except subprocess.TimeoutExpired as e:
            self.fail("%s did not exit on a bad config: %s" % (binary, e))
        return path, p.returncode, p.stderr.decode("utf-8", "replace")

    def assert_config_error(self, binary, text, line, column, key):
        path, rc, err = self.run_daemon(binary, text)
        self.assertNotEqual(rc, 0, "exit 0 on a bad config:\n%s" % text)
        self.assertGreater(rc, 0, "killed by signal %d on a bad config" % -rc)
        where = re.escape(path) + ":%d:%s" % (line, column if column else r"\d+")
        self.assertRegex(err, where, "stderr should name %s:%d:%s" % (path, line, column or "*"))
        self.assertIn(key, err, "stderr should name the key %r" % key)

    def test_coordinator_unknown_key(self):
        port = harness.free_port()
        text = ("listen: tcp://127.0.0.1:%d\nhttp: \"\"\nheartbeat:\n  interval_ms: 200\n"
                "  dead_after_msec: 1000\n" % port)
        self.assert_config_error(harness.SERVER, text, 5, 3, "heartbeat.dead_after_msec")
        # It did not start serving either.
        with self.assertRaises(OSError):
            socket.create_connection((harness.HOST, port), timeout=2).close()

    def test_coordinator_unknown_top_level_key(self):
        self.assert_config_error(harness.SERVER, 'http: ""\nlisten_on: tcp://127.0.0.1:1\n',
                                 2, 1, "listen_on")

    def test_coordinator_wrong_type(self):
        text = 'http: ""\nlog: {level: info}\nheartbeat: {interval_ms: fast, dead_after_ms: 1000}\n'
        self.assert_config_error(harness.SERVER, text, 3, 26, "heartbeat.interval_ms")

    def test_coordinator_bad_value(self):
        self.assert_config_error(harness.SERVER, 'http: ""\nautodiff: sometimes\n', 2, None,
                                 "autodiff")

    def test_worker_bad_device(self):
        text = ("name: node-a\nlisten: tcp://127.0.0.1:%d\ndevices:\n  - device: cuda:0\n"
                "  - device: cuda:x\n    memory: 1GiB\n" % harness.free_port())
        self.assert_config_error(harness.WORKER, text, 5, None, "cuda:x")

    def test_worker_unknown_key(self):
        self.assert_config_error(harness.WORKER, "name: node-a\nnmae: node-b\n", 2, 1, "nmae")

    def test_missing_config_file(self):
        path = os.path.join(self.dir, "absent.yaml")
        for binary in (harness.SERVER, harness.WORKER):
            with self.subTest(binary=os.path.basename(binary)):
                p = subprocess.run([binary, "--config", path], capture_output=True, timeout=20,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
                self.assertGreater(p.returncode, 0, p)
                self.assertIn(path, p.stderr.decode("utf-8", "replace"))


if __name__ == "__main__":
    unittest.main()
