"""Issue 6, "Faults and load": workers killed and hung mid-op, the coordinator killed and
restarted mid-op, epoch fencing, operator intent across restarts, health and metrics, and
64 concurrent clients, against the real binaries.

Heartbeats are short (200 ms) so liveness is quick; bounds are the contract (design §7) plus
$DEVCOORD_TEST_SLACK_MS, never a performance figure. The load test needs the load driver
($DEVCOORD_LOAD_DRIVER, set by CTest; else build/tests/devcoord-load-driver). ValgrindRun
runs only with DEVCOORD_VALGRIND=1.

    cd tests/integration && python3 -m unittest -v test_faults
"""

import json
import os
import random
import re
import shutil
import struct
import signal
import subprocess
import time
import unittest

import harness
from harness import SLACK_S, pb_bytes, pb_uint, sanitized, wait_until
from secutil import SecureTestCase, http_get, http_status, settle_rss

LOAD_DRIVER = os.environ.get("DEVCOORD_LOAD_DRIVER") or os.path.join(
    os.environ.get("DEVCOORD_BUILD_DIR", os.path.join(harness.REPO, "build")),
    "tests", "devcoord-load-driver")

ERROR_LINE = re.compile(r"^devcoordctl: ([A-Z][A-Z_]+): (.+)$")
THREE = ("node-a", "node-b", "node-c")
# Distinct values per worker, so one application of a sum is told from two or a mix.
VALUES = {"node-a": [1, 2], "node-b": [10, 20], "node-c": [100, 200]}


def dev(worker):
    return worker + "/cuda:0"


def devices(workers):
    return ",".join(dev(w) for w in workers)


class OpsMixin:
    """Tensors and ops through devcoordctl -o json."""

    def ok(self, *args, **kw):
        r = self.cluster.ctl(*args, **kw)
        self.assertEqual(r.rc, 0, repr(r))
        return r.out

    def put_values(self, values=None):
        for w, v in (values or VALUES).items():
            self.ok("tensor", "put", dev(w), "t", "--dtype", "f64", "--values",
                    ",".join(map(str, v)))

    def values(self, worker, tensor="t"):
        return self.ok("tensor", "get", dev(worker), tensor)["values"]

    def submit_args(self, workers, timeout_ms=None, tensor="t"):
        args = ["submit", "--op", "all-reduce", "--reduce", "sum", "--tensor", tensor,
                "--devices", devices(workers)]
        if timeout_ms:
            args += ["--timeout-ms", str(timeout_ms)]
        return args

    def submit(self, workers, timeout_ms=None):
        return self.cluster.ctl(*self.submit_args(workers, timeout_ms))

    def submit_in_background(self, workers, timeout_ms):
        c = self.cluster
        argv = [harness.CTL, "-s", c.addr, "-o", "json"] + self.submit_args(workers, timeout_ms)
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, start_new_session=True)

        def reap():
            if p.poll() is None:
                p.kill()
            p.communicate()
        self.addCleanup(reap)
        return p

    def wait_op_running(self, timeout=10.0):
        """The op in flight, once `ops list` shows one running."""
        def running():
            r = self.cluster.ctl("ops", "list")
            if r.rc != 0 or not isinstance(r.out, dict):
                return None
            live = [o for o in r.out.get("ops", []) if o.get("state") in ("queued", "running")]
            return live[0] if live else None
        return wait_until(running, timeout, "an op to be running")

    def assert_released(self, op_id, workers):
        """The coordinator's abort reached `workers`: each has ended its part of op_id
        (its log says so) within two heartbeats + slack, not at the op's own deadline. A
        part left running holds the worker's SIGTERM until that deadline."""
        c = self.cluster
        for w in workers:
            wait_until(lambda: re.search(r"op %s failed" % re.escape(op_id),
                                         c.worker(w).log_text()),
                       2 * c.heartbeat_s + SLACK_S,
                       "%s to end its part of the failed op %s (its log)" % (w, op_id))

    def assert_all_reduce_works(self, workers):
        """One more sum over `workers` adds up exactly what they hold now."""
        before = {w: self.values(w) for w in workers}
        r = self.submit(workers)
        self.assertEqual(r.rc, 0, repr(r))
        self.assertEqual(r.out["status"], "OK", r.out)
        want = [sum(col) for col in zip(*before.values())]
        for w in workers:
            self.assertEqual(self.values(w), want, "%s after a sum over %s" % (w, workers))


def start_three(test, **kw):
    c = test.make_secure_cluster(**kw)
    c.start_coordinator()
    for w in THREE:
        c.add_worker(w, [{"device": "cuda:0", "memory": "1GiB"}])
    c.wait_workers(list(THREE))
    return c


# ---- workers killed and hung ---------------------------------------------------------------


class WorkerKillTest(OpsMixin, SecureTestCase):
    heartbeat_ms = 200
    dead_after_ms = 1000

    def setUp(self):
        self.cluster = start_three(self)
        self.put_values()

    def test_sigkill_idle_worker(self):
        c = self.cluster
        epoch = c.registry_workers()["node-c"]["epoch"]
        c.kill_worker("node-c")
        t0 = time.monotonic()
        c.wait_workers(["node-c"], "dead", timeout=c.dead_after_s + c.heartbeat_s + SLACK_S + 10)
        self.assertLessEqual(time.monotonic() - t0, c.dead_after_s + c.heartbeat_s + SLACK_S,
                             "node-c not dead within dead_after_ms + a heartbeat")
        r = self.submit(THREE)
        self.assertEqual(r.rc, 1, repr(r))
        self.assertEqual(r.out["status"], "UNAVAILABLE", r.out)
        self.assertIn("worker node-c is dead", r.out["message"])
        self.assert_all_reduce_works(("node-a", "node-b"))
        # Back under the same name: a new epoch, and it takes part again.
        c.restart_worker("node-c")
        w = c.wait_workers(["node-c"])["node-c"]
        self.assertGreater(w["epoch"], epoch)
        self.put_values()
        self.assert_all_reduce_works(THREE)

    def kill_mid_op(self):
        """node-c is held (SIGSTOP) so the op is surely in flight, with node-a and node-b in
        the middle of the ring waiting for it; then it is SIGKILLed. The op must end with
        UNAVAILABLE naming node-c once its connections drop or it is found dead, not at its
        20 s deadline, and node-a and node-b must be released and unchanged."""
        c = self.cluster
        c.stop_worker("node-c")
        p = self.submit_in_background(THREE, 20000)
        op = self.wait_op_running()
        self.assertIn("node-c", op.get("waiting_on", []), op)
        t0 = time.monotonic()
        c.kill_worker("node-c")
        try:
            out, err = p.communicate(timeout=c.dead_after_s + SLACK_S + 10)
        except subprocess.TimeoutExpired:
            self.fail("the op was still running 10 s after node-c was killed")
        elapsed = time.monotonic() - t0
        self.assertLessEqual(elapsed, c.dead_after_s + c.heartbeat_s + SLACK_S,
                             "the op outlived node-c by %.2f s" % elapsed)
        self.assertEqual(p.returncode, 1, err)
        result = json.loads(out)
        self.assertEqual(result["status"], "UNAVAILABLE", result)
        with self.subTest("the message names the dead worker"):
            self.assertIn("node-c", result["message"], result)
        shown = self.ok("ops", "show", result["op_id"])
        self.assertEqual(shown["state"], "failed", shown)
        for w in shown["workers"]:
            if w["name"] != "node-c":
                self.assertNotEqual(w["status"], "OK", shown)
        for w in ("node-a", "node-b"):
            self.assertEqual(self.values(w), VALUES[w], "%s after the failed op" % w)
        self.assert_all_reduce_works(("node-a", "node-b"))
        self.assert_released(result["op_id"], ("node-a", "node-b"))

    def test_sigkill_worker_mid_op(self):
        # Connections between all of them exist from an earlier op (the usual case).
        self.assert_all_reduce_works(THREE)
        self.put_values()
        self.kill_mid_op()

    def test_sigkill_worker_mid_op_first_contact(self):
        # No connection to node-c yet: the coordinator's and node-b's dials to it are pending
        # when it dies.
        self.kill_mid_op()


class WorkerHangTest(OpsMixin, SecureTestCase):
    """A SIGSTOPped worker is hung, not dead, until dead_after_ms: an op with a shorter
    timeout fails at its deadline, DEADLINE_EXCEEDED, naming it; the others are aborted."""

    heartbeat_ms = 200
    dead_after_ms = 4000
    OP_TIMEOUT_MS = 1000

    def setUp(self):
        self.cluster = start_three(self)
        self.put_values()

    def test_sigstop_worker_mid_op(self):
        # Connections between all of them exist from an earlier op (the usual case): node-c
        # receives Execute and Exchange calls into its socket and never answers.
        self.assert_all_reduce_works(THREE)
        self.put_values()
        self.hang_mid_op()

    def test_sigstop_worker_mid_op_first_contact(self):
        # No connection to node-c yet: the dials to it connect (the kernel accepts) but the
        # SP handshake never completes. Still a hung worker, still DEADLINE_EXCEEDED.
        self.hang_mid_op()

    def hang_mid_op(self):
        c = self.cluster
        c.stop_worker("node-c")
        stopped_at = time.monotonic()
        try:
            t0 = time.monotonic()
            r = self.submit(THREE, self.OP_TIMEOUT_MS)
            elapsed = time.monotonic() - t0
            self.assertEqual(r.rc, 1, repr(r))
            result = r.out
            self.assertLessEqual(elapsed, self.OP_TIMEOUT_MS / 1000 + 2 * SLACK_S + 1,
                                 "the op ended %.2f s after it was submitted" % elapsed)
            # What the op's result says is checked in subtests, so that the rest (the others
            # let go, node-c back) is checked whatever it says.
            with self.subTest("the op failed with DEADLINE_EXCEEDED"):
                self.assertEqual(result["status"], "DEADLINE_EXCEEDED", result)
            with self.subTest("the message names the hung worker"):
                self.assertIn("node-c", result["message"], result)
            with self.subTest("the status's worker is the hung one, not the one reporting"):
                if result.get("worker"):
                    self.assertEqual(result["worker"], "node-c", result)
            shown = self.ok("ops", "show", result["op_id"])
            self.assertEqual(shown["state"], "failed", shown)
            self.assertEqual(shown["status"], result["status"], shown)
            results = {w["name"]: w for w in shown["workers"]}
            for w in ("node-a", "node-b"):
                self.assertIn(w, results, "no result of %s in %r" % (w, shown))
                self.assertNotEqual(results[w]["status"], "OK", shown)
            self.assert_released(result["op_id"], ("node-a", "node-b"))
            # The others were let go: they serve, unchanged, and run an op without node-c.
            for w in ("node-a", "node-b"):
                self.assertEqual(self.values(w), VALUES[w], "%s after the failed op" % w)
            self.assert_all_reduce_works(("node-a", "node-b"))
            with self.subTest("ops show gives the hung worker's result: DEADLINE_EXCEEDED"):
                def hung_result():
                    ws = self.ok("ops", "show", result["op_id"])["workers"]
                    return {w["name"]: w for w in ws}.get("node-c")
                got = wait_until(hung_result, self.OP_TIMEOUT_MS / 1000 + SLACK_S,
                                 "a result for node-c in ops show")
                self.assertEqual(got["status"], "DEADLINE_EXCEEDED", got)
            # All of this happened while node-c was hung but not yet dead.
            self.assertLess(time.monotonic() - stopped_at, c.dead_after_s)
            self.assertEqual(c.registry_workers()["node-c"]["state"], "alive")
        finally:
            c.cont_worker("node-c")
        # Woken up, node-c has not applied the stale op and takes part again.
        c.wait_workers(["node-c"])
        self.assertEqual(self.values("node-c"), VALUES["node-c"])
        self.put_values()
        self.assert_all_reduce_works(THREE)


# ---- the coordinator killed ------------------------------------------------------------------


class ExchangeFloodTest(OpsMixin, SecureTestCase):
    """Issue 12: Exchange calls for ops a worker does not know may wait for their Execute,
    but only a few per connection; the rest are refused at once, so a flood cannot hold the
    RPC contexts every other method needs (4,800 calls once made a worker deaf for ~10 s)."""

    FLOOD = 4800

    def setUp(self):
        self.cluster = start_three(self)
        self.put_values()

    def test_flood_of_exchanges_for_unknown_ops(self):
        c = self.cluster
        port = c.worker_port("node-a")
        method = b"/devcoord.v1.Worker/Exchange"
        flood = harness.RpcConnection(port, timeout=60)
        try:
            out = bytearray()
            for i in range(self.FLOOD):
                rid = i + 1
                header = (pb_uint(harness.F("RequestHeader", "request_id"), rid)
                          + pb_bytes(harness.F("RequestHeader", "method"), method)
                          + pb_uint(harness.F("RequestHeader", "timeout_ms"), 60000))
                body = pb_bytes(harness.F("ExchangeRequest", "op_id"), b"op-flood-%d" % i)
                payload = struct.pack(">I", rid | 0x80000000) + harness.frame(header, body)
                out += struct.pack(">Q", len(payload)) + payload
            flood.sock.sendall(bytes(out))
            # Meanwhile the worker answers its other methods, and an op runs through it.
            r = c.ctl("tensor", "list", "node-a/cuda:0", "--timeout", "5s")
            self.assertEqual(r.rc, 0, repr(r))
            self.assert_all_reduce_works(THREE)
            codes = {}
            for _ in range(self.FLOOD):
                code, message, _ = harness.parse_reply(flood.recv_message()[4:])
                codes[code] = codes.get(code, 0) + 1
                if code == "RESOURCE_EXHAUSTED":
                    self.assertIn("per connection", message)
        finally:
            flood.close()
        # At most a few windows of calls waited (then NOT_FOUND: their op never came).
        self.assertGreaterEqual(codes.get("RESOURCE_EXHAUSTED", 0), self.FLOOD - 32, codes)
        self.assertEqual(sum(codes.values()), self.FLOOD, codes)
        self.assertTrue(c.worker("node-a").running())


class UnreadRepliesTest(OpsMixin, SecureTestCase):
    """A client that sends requests and never reads the replies: once the sockets' buffers
    are full, nng holds each further reply's context in a send that waits for it. Past 16
    replies not taken, that connection's requests are dropped unanswered and every reply's
    send has a bound, so the contexts stay free for other clients (before, 100,000 garbage
    requests left the coordinator answering nobody until that client went)."""

    FLOOD = 100000

    def test_a_client_that_never_reads_its_replies_does_not_deafen_the_server(self):
        import socket
        import threading
        c = self.cluster = start_three(self)
        flood = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        flood.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # full at once
        flood.settimeout(30)
        flood.connect((harness.HOST, c.port))
        self.addCleanup(flood.close)
        flood.sendall(harness.sp_greeting(harness.SP_REQ0))
        out = bytearray()
        for i in range(self.FLOOD):  # undecodable: each is refused with a small reply
            payload = struct.pack(">I", (i + 1) | 0x80000000) + b"\xff" * 12
            out += struct.pack(">Q", len(payload)) + payload
        sent = {}

        def send():
            try:
                flood.sendall(bytes(out))
                sent["all"] = True
            except OSError as e:
                sent["error"] = str(e)
        t = threading.Thread(target=send)
        t.start()
        self.addCleanup(t.join, 60)
        time.sleep(3)  # the replies it does not read fill both sockets' buffers
        for _ in range(3):
            r = c.ctl("status", "--timeout", "5s")
            self.assertEqual(r.rc, 0, repr(r))
        t.join(60)
        self.assertEqual(sent, {"all": True}, "the coordinator stopped reading the client")
        wait_until(lambda: "requests dropped unanswered" in c.coordinator.log_text(), 10,
                   "the coordinator to say it dropped requests")
        self.assertTrue(c.coordinator.running())


class CoordinatorKillTest(OpsMixin, SecureTestCase):
    heartbeat_ms = 200
    dead_after_ms = 5000
    OP_TIMEOUT_MS = 3000

    def setUp(self):
        self.cluster = start_three(self)
        self.put_values()

    def test_coordinator_killed_and_restarted_mid_op(self):
        """SIGKILL the coordinator while an all-reduce (held in flight by a stopped node-c)
        runs, start it again at once. The client gets a clear UNAVAILABLE; every worker is
        back within two heartbeats of the new coordinator being ready; and however the
        pieces of the old op end, no device changed: the workers may finish the exchange
        among themselves, but only the coordinator that started the op could have told them
        to commit it (issue 12), and it died."""
        c = self.cluster
        old = {n: w["epoch"] for n, w in c.registry_workers().items()}
        c.stop_worker("node-c")
        p = self.submit_in_background(THREE, self.OP_TIMEOUT_MS)
        submitted = time.monotonic()
        self.wait_op_running()
        c.kill_coordinator()
        c.cont_worker("node-c")
        ready_at = c.restart_coordinator()
        try:
            out, err = p.communicate(timeout=self.OP_TIMEOUT_MS / 1000 + 10)
        except subprocess.TimeoutExpired:
            self.fail("the client still waits 10 s past the op's deadline")
        self.assertIn(p.returncode, (1, 3), err)
        m = ERROR_LINE.match(err.decode().strip().splitlines()[0])
        self.assertIsNotNone(m, err)
        self.assertEqual(m.group(1), "UNAVAILABLE", err)
        self.assertIn(c.addr, m.group(2), "the error should name the coordinator: %r" % err)
        # Converged within two heartbeats of the coordinator being ready.
        bound = 2 * c.heartbeat_s + SLACK_S
        back = {}
        while len(back) < 3 and time.monotonic() < ready_at + bound + 10:
            for n, w in c.registry_workers().items():
                if w["state"] == "alive" and n not in back:
                    back[n] = round(time.monotonic() - ready_at, 3)
                    self.assertGreater(w["epoch"], old[n])
            time.sleep(0.01)
        self.assertEqual(sorted(back), list(THREE), back)
        late = {n: t for n, t in back.items() if t > bound}
        self.assertFalse(late, "back later than two heartbeats + slack (%.2f s): %r"
                         % (bound, late))
        # Past the old op's deadline every worker has given it up; nothing re-ran it.
        time.sleep(max(0.0, submitted + self.OP_TIMEOUT_MS / 1000 + 1 + SLACK_S
                       - time.monotonic()))
        got = {w: self.values(w) for w in THREE}
        for w in THREE:
            self.assertEqual(got[w], VALUES[w], "%s changed by an op nobody committed (all: %r)"
                             % (w, got))
        self.assertEqual(self.ok("ops", "list")["ops"], [],
                         "the new coordinator runs or remembers an op nobody submitted to it")
        print("\n  coordinator restart: client said %r; workers back after %r s; values %r"
              % (err.decode().strip(), back, got))
        self.put_values()
        self.assert_all_reduce_works(THREE)


    def test_coordinator_killed_after_the_workers_prepared_changes_nothing(self):
        """Issue 12: the coordinator freezes while an all-reduce is in flight, the workers
        finish it among themselves (each prepares its result and answers), and the
        coordinator is killed before it could tell them to commit. No tensor changes, and the
        next op (through the new coordinator) computes from the old values."""
        c = self.cluster
        # Connections from the coordinator to every worker exist from an earlier op: node-c
        # gets its Execute however long the coordinator is frozen.
        self.assert_all_reduce_works(THREE)
        self.put_values()
        c.stop_worker("node-c")
        p = self.submit_in_background(THREE, 20000)
        try:
            self.wait_op_running()
            c.coordinator.signal(signal.SIGSTOP)
        finally:
            c.cont_worker("node-c")
        # The exchange takes milliseconds; the workers have all the time they need to
        # finish it and answer into the frozen coordinator's socket.
        time.sleep(2)
        c.restart_coordinator()  # SIGKILL, then a new one
        out, err = p.communicate(timeout=30)
        self.assertNotEqual(p.returncode, 0, "the op outlived its coordinator: %r" % out)
        c.wait_workers(list(THREE))
        for w in THREE:
            self.assertEqual(self.values(w), VALUES[w], "%s changed by an op nobody committed"
                             % w)
        self.assert_all_reduce_works(THREE)


class EpochFencingTest(OpsMixin, SecureTestCase):
    def setUp(self):
        self.cluster = start_three(self)

    def heartbeat(self, name, epoch):
        return self.cluster.rpc("Heartbeat", pb_bytes(1, name) + pb_uint(2, epoch))

    def test_restarted_worker_gets_a_new_epoch_and_stale_calls_are_refused(self):
        """Only the worker holds its session secret (test_security.WorkerIdentityTest), so
        the current epoch's heartbeats here are the worker's own: it stays alive."""
        c = self.cluster
        old = c.registry_workers()["node-b"]["epoch"]
        c.restart_worker("node-b")
        new = wait_until(lambda: c.registry_workers()["node-b"]["epoch"] != old and
                         c.registry_workers()["node-b"]["epoch"], 10, "a new epoch of node-b")
        self.assertGreater(new, old)
        code, message, _ = self.heartbeat("node-b", old)
        self.assertEqual(code, "FAILED_PRECONDITION", message)
        self.assertIn("epoch", message)
        self.assertNotIn(str(new), message)
        code, message, _ = c.rpc("DeregisterWorker", pb_bytes(1, "node-b") + pb_uint(2, old))
        self.assertEqual(code, "FAILED_PRECONDITION", message)
        self.assertNotIn(str(new), message)
        # The stale calls changed nothing.
        time.sleep(2 * c.heartbeat_s)
        w = c.registry_workers()["node-b"]
        self.assertEqual((w["state"], w["epoch"]), ("alive", new))
        self.put_values()
        self.assert_all_reduce_works(THREE)


# ---- operator intent on disk -------------------------------------------------------------------


class PersistenceTest(OpsMixin, SecureTestCase):
    def setUp(self):
        c = self.cluster = self.make_secure_cluster()
        self.state_dir = c.path("state")
        os.mkdir(self.state_dir)
        c.coordinator_config["state_dir"] = self.state_dir
        self.state_file = os.path.join(self.state_dir, "intent.state")
        c.start_coordinator()
        for w in THREE:
            c.add_worker(w, [{"device": "cuda:0", "memory": "1GiB"}])
        c.wait_workers(list(THREE))

    def states(self):
        return {n: w["state"] for n, w in self.cluster.registry_workers().items()}

    def restart(self, how="kill"):
        c = self.cluster
        if how == "term":
            self.assertEqual(c.coordinator.terminate(10), 0, c.coordinator.log_tail())
        c.restart_coordinator()

    def test_cordon_and_drain_survive_restarts(self):
        c = self.cluster
        self.ok("workers", "cordon", "node-a")
        self.ok("workers", "drain", "node-b")
        self.assertTrue(os.path.exists(self.state_file))
        self.assertEqual(sorted(os.listdir(self.state_dir)), ["intent.state"],
                         "a temporary file left next to the state file")
        want = {"node-a": "cordoned", "node-b": "draining", "node-c": "alive"}
        self.restart("kill")
        c.wait_workers(["node-a"], "cordoned")
        c.wait_workers(["node-b"], "draining")
        c.wait_workers(["node-c"], "alive")
        self.assertEqual(self.states(), want)
        self.assertIn("restored operator intent", c.coordinator.log_text())
        r = c.ctl("plan", "--op", "all-reduce", "--reduce", "sum", "--devices",
                  devices(("node-a", "node-c")))
        self.assertEqual(r.rc, 1, repr(r))
        self.assertIn("node-a is cordoned", r.out["message"])
        # A change after the restart is saved too; a clean stop keeps it.
        self.ok("workers", "uncordon", "node-a")
        self.restart("term")
        c.wait_workers(["node-b"], "draining")
        c.wait_workers(["node-a", "node-c"], "alive")
        self.assertEqual(self.states(), {"node-a": "alive", "node-b": "draining",
                                         "node-c": "alive"})

    def test_corrupt_state_file_is_reported_and_ignored(self):
        c = self.cluster
        self.ok("workers", "cordon", "node-a")
        self.ok("workers", "drain", "node-b")
        with open(self.state_file, "rb") as f:
            good = f.read()
        rng = random.Random(6)
        cases = {
            "garbage": bytes(rng.getrandbits(8) for _ in range(512)),
            "truncated before the end line": good[:good.rindex(b"end ")],
            "truncated mid-line": good[:len(good) // 2],
            "empty": b"",
            "wrong count": good.replace(b"end 2", b"end 3"),
            "a line too long": good.replace(b"cordon node-a", b"cordon " + b"x" * 5000),
            "unknown intent": good.replace(b"cordon node-a", b"evict node-a"),
        }
        for what, data in cases.items():
            with self.subTest(what):
                c.kill_coordinator()
                with open(self.state_file, "wb") as f:
                    f.write(data)
                before = len(c.coordinator.log_text())
                c.restart_coordinator()
                log = c.coordinator.log_text()[before:]
                self.assertIn("operator intent not restored", log)
                self.assertIn(self.state_file, log)
                c.wait_workers(list(THREE), "alive")
                self.assertEqual(self.states(), {w: "alive" for w in THREE})
        # Starting without it, the next change writes a good file again.
        self.ok("workers", "cordon", "node-c")
        self.restart("kill")
        c.wait_workers(["node-c"], "cordoned")
        self.assertNotIn("not restored", c.coordinator.log_text().split("==== start")[-1])

    def shown_state(self, name):
        """The state `devcoordctl workers show NAME` prints."""
        shown = self.ok("workers", "show", name)["worker"]
        self.assertEqual(shown["name"], name)
        return shown["state"]

    def test_a_failed_save_fails_the_call_and_changes_nothing(self):
        """Issue 12, item 3: with the state file unwritable, DrainWorker and CordonWorker
        answer UNAVAILABLE with the cause, and neither memory nor disk changes. Tests run as
        root, for whom a read-only directory is writable: the disk is made full by putting a
        symlink to /dev/full where the save writes its temporary file, and the directory is
        made unusable by replacing it with a regular file."""
        c = self.cluster
        self.ok("workers", "cordon", "node-a")
        with open(self.state_file, "rb") as f:
            saved = f.read()
        tmp = os.path.join(self.state_dir, ".intent.state.tmp")
        away = self.state_dir + ".away"

        def disk_full():
            os.symlink("/dev/full", tmp)

        def disk_full_undo():
            if os.path.lexists(tmp):
                os.unlink(tmp)

        def dir_is_a_file():
            os.rename(self.state_dir, away)
            with open(self.state_dir, "w") as f:
                f.write("not a directory\n")

        def dir_is_a_file_undo():
            os.unlink(self.state_dir)
            os.rename(away, self.state_dir)

        cases = [("disk full", disk_full, disk_full_undo, "No space left on device"),
                 ("state_dir replaced by a file", dir_is_a_file, dir_is_a_file_undo,
                  "Not a directory")]
        for what, break_it, undo, cause in cases:
            for verb, name, before in (("drain", "node-b", "alive"),
                                       ("cordon", "node-c", "alive"),
                                       ("uncordon", "node-a", "cordoned")):
                with self.subTest(what=what, verb=verb):
                    break_it()
                    try:
                        r = c.ctl("workers", verb, name)
                    finally:
                        undo()
                    self.assertEqual(r.rc, 1, repr(r))
                    m = ERROR_LINE.match(r.err.strip().splitlines()[0])
                    self.assertIsNotNone(m, repr(r))
                    self.assertEqual(m.group(1), "UNAVAILABLE", repr(r))
                    self.assertIn("cannot save operator intent", m.group(2))
                    self.assertIn(cause, m.group(2))
                    self.assertEqual(self.shown_state(name), before)
                    with open(self.state_file, "rb") as f:
                        self.assertEqual(f.read(), saved)
        self.assertEqual(self.states(), {"node-a": "cordoned", "node-b": "alive",
                                         "node-c": "alive"})
        # What was refused was never half-kept: a restart finds the same, and a save that
        # can reach the disk again works.
        self.restart("kill")
        c.wait_workers(["node-a"], "cordoned")
        c.wait_workers(["node-b", "node-c"], "alive")
        self.ok("workers", "drain", "node-b")
        self.assertEqual(self.shown_state("node-b"), "draining")

    def test_an_unusable_state_dir_stops_the_start(self):
        """Issue 12, item 3: a coordinator that could not keep operator intent would
        answer every cordon with an error; it refuses to start instead, saying why."""
        c = self.cluster
        port = c.port  # where the workers look for it
        c.kill_coordinator()
        not_a_dir = c.write("plain-file", "x\n")
        for what, state_dir in (("a regular file", not_a_dir),
                                ("under a regular file", os.path.join(not_a_dir, "state")),
                                ("missing", c.path("no-such-dir"))):
            with self.subTest(what):
                c.coordinator_config["state_dir"] = state_dir
                before = len(c.coordinator.log_text())
                c.start_coordinator(port=port, wait=False)
                rc = c.coordinator.wait(20)
                c.coordinator.expected_exit = True
                log = c.coordinator.log_text()[before:]
                self.assertIsNotNone(rc, "still running with state_dir %s" % state_dir)
                self.assertNotEqual(rc, 0, log)
                self.assertIn("state_dir", log)
                self.assertIn(state_dir, log)
        c.coordinator_config["state_dir"] = self.state_dir
        c.start_coordinator(port=port)
        c.wait_workers(list(THREE))


# ---- health and metrics ------------------------------------------------------------------------


def parse_metrics(text):
    """{family name: family} through prometheus_client's parser (raises on bad text)."""
    from prometheus_client.parser import text_string_to_metric_families
    return {f.name: f for f in text_string_to_metric_families(text)}


def samples(family, name=None):
    return [s for s in family.samples if name is None or s.name == name]


class MetricsTest(OpsMixin, SecureTestCase):
    def setUp(self):
        c = self.cluster = self.make_secure_cluster()
        self.http = harness.free_port()
        c.coordinator_config["http"] = "%s:%d" % (harness.HOST, self.http)
        self.worker_http = {}

    def start(self):
        c = self.cluster
        c.start_coordinator()
        for w in ("node-a", "node-b"):
            self.worker_http[w] = harness.free_port()
            c.add_worker(w, [{"device": "cuda:0", "memory": "1GiB"}],
                         http_port=self.worker_http[w])
        c.wait_workers(["node-a", "node-b"])

    def test_metrics_are_valid_prometheus_text(self):
        c = self.cluster
        self.start()
        self.assertEqual(http_get(self.http, "/healthz")[0], 200)
        self.assertEqual(http_get(self.http, "/readyz")[0], 200)
        self.put_values({"node-a": [1, 2], "node-b": [3, 4]})
        self.assert_all_reduce_works(("node-a", "node-b"))
        self.submit(("node-a", "node-z"))  # refused: unknown device
        status, text = http_get(self.http, "/metrics")
        self.assertEqual(status, 200)
        fams = parse_metrics(text)

        workers = {s.labels["state"]: s.value for s in samples(fams["devcoord_workers"])}
        self.assertEqual(fams["devcoord_workers"].type, "gauge")
        self.assertEqual(workers.get("alive"), 2, workers)
        devs = samples(fams["devcoord_devices"])
        self.assertEqual(sum(s.value for s in devs), 2, devs)

        rpc = fams["devcoord_rpc_requests"]
        self.assertEqual(rpc.type, "counter")
        by_method = {}
        for s in samples(rpc, "devcoord_rpc_requests_total"):
            by_method.setdefault(s.labels["method"], {})[s.labels.get("code")] = s.value
        for m in ("RegisterWorker", "Heartbeat", "ListWorkers", "SubmitOp", "GetDevice"):
            self.assertIn(m, by_method, by_method)
        self.assertGreaterEqual(by_method["SubmitOp"].get("OK", 0), 1, by_method)
        self.assertGreaterEqual(sum(v for k, v in by_method["SubmitOp"].items() if k != "OK"),
                                1, "the refused SubmitOp is not counted: %r" % by_method)

        ops = fams["devcoord_ops"]
        self.assertEqual(ops.type, "counter")
        done = [s for s in samples(ops, "devcoord_ops_total")
                if s.labels.get("kind") == "all-reduce" and s.labels.get("code") == "OK"]
        self.assertEqual([s.value for s in done], [1], samples(ops))

        hb = fams["devcoord_heartbeats"]
        self.assertEqual(hb.type, "counter")
        # Workers heartbeat one interval after registering: the first scrape may come before
        # any. What matters is that the counter counts them.
        first = samples(hb, "devcoord_heartbeats_total")[0].value
        self.assertGreaterEqual(first, 0)
        time.sleep(3 * c.heartbeat_s)
        later = parse_metrics(http_get(self.http, "/metrics")[1])["devcoord_heartbeats"]
        self.assertGreater(samples(later, "devcoord_heartbeats_total")[0].value, first)

        histograms = [f for f in fams.values() if f.type == "histogram"]
        self.assertTrue(histograms, "no histogram in /metrics")
        for f in histograms:
            self.check_histogram(f)

        for w, port in self.worker_http.items():
            status, text = http_get(port, "/metrics")
            self.assertEqual(status, 200, w)
            wf = parse_metrics(text)
            self.assertIn("devcoord_rpc_requests", wf, w)
            for f in wf.values():
                if f.type == "histogram":
                    self.check_histogram(f)

    def check_histogram(self, family):
        """Per label set: cumulative buckets, +Inf equal to _count, a _sum."""
        series = {}
        for s in family.samples:
            key = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
            series.setdefault(key, {"buckets": [], "count": None, "sum": None})
            if s.name.endswith("_bucket"):
                series[key]["buckets"].append((float(s.labels["le"]), s.value))
            elif s.name.endswith("_count"):
                series[key]["count"] = s.value
            elif s.name.endswith("_sum"):
                series[key]["sum"] = s.value
        self.assertTrue(series, family.name)
        for key, h in series.items():
            b = sorted(h["buckets"])
            self.assertTrue(b and b[-1][0] == float("inf"), (family.name, key))
            counts = [v for _, v in b]
            self.assertEqual(counts, sorted(counts), "%s %r not cumulative" % (family.name, key))
            self.assertEqual(b[-1][1], h["count"], (family.name, key))
            self.assertIsNotNone(h["sum"], (family.name, key))

    def test_worker_readyz_follows_registration(self):
        c = self.cluster
        c.port = harness.free_port()  # where the coordinator will be, once it is up
        wport = self.worker_http["node-a"] = harness.free_port()
        c.add_worker("node-a", [{"device": "cuda:0", "memory": "1GiB"}], http_port=wport)
        wait_until(lambda: http_status(wport, "/healthz") == 200, 10, "node-a's /healthz")
        self.assertEqual(http_status(wport, "/readyz"), 503, "ready without a coordinator")
        time.sleep(3 * c.heartbeat_s)
        self.assertEqual(http_status(wport, "/readyz"), 503, "ready without a coordinator")
        c.start_coordinator(port=c.port)
        self.assertEqual(http_get(self.http, "/readyz")[0], 200)
        c.wait_workers(["node-a"])
        wait_until(lambda: http_status(wport, "/readyz") == 200, 2 * c.heartbeat_s + SLACK_S,
                   "node-a's /readyz to say 200 once registered")


# ---- load ----------------------------------------------------------------------------------------


class LoadTest(SecureTestCase):
    """64 clients x 500 calls (puts, all-reduces, gets, registry queries), every answer
    checked by the load driver; then the daemons' memory is back at its baseline.

    Baseline: VmRSS after a warm-up run of the same load, settled for a few seconds. glibc
    keeps freed memory in per-thread arenas and fragments a little more over the first runs
    (measured: +0.1 to +0.2 MiB after the warm-up, flat after a few runs); op history fills
    to limits.op_history during the warm-up. Slack: 1 MiB + 10 % of the baseline. A retained
    op record (~1 KiB x 5000 ops) or 64 bytes leaked per call (x 32000 calls) exceeds it.
    Under ASan, freed memory sits in its quarantine: RSS is reported, not compared (LSan checks
    leaks at exit)."""

    heartbeat_ms = 500
    dead_after_ms = 5000
    CLIENTS = 64
    OPS = 500
    DEVICES_PER_WORKER = 8

    def run_driver(self, c, ops):
        argv = [LOAD_DRIVER, "--address", c.addr, "--workers", "node-a,node-b",
                "--devices-per-worker", str(self.DEVICES_PER_WORKER), "--clients",
                str(self.CLIENTS), "--ops", str(ops)]
        p = subprocess.run(argv, capture_output=True, text=True, timeout=400,
                           stdin=subprocess.DEVNULL)
        try:
            summary = json.loads(p.stdout)
        except ValueError:
            self.fail("load driver exited %d without a summary:\n%s\n%s"
                      % (p.returncode, p.stdout, p.stderr))
        self.assertEqual(summary["clients_done"], self.CLIENTS, summary)
        self.assertEqual(summary["failed_calls"], 0, summary["errors"])
        self.assertEqual(summary["wrong"], 0, summary["wrong_results"])
        self.assertGreaterEqual(summary["calls"], self.CLIENTS * ops, summary)
        self.assertGreater(summary["by_kind"]["submit"], self.CLIENTS * ops // 8, summary)
        self.assertEqual(p.returncode, 0, p.stderr)
        return summary

    def test_64_clients_500_ops(self):
        if not os.path.exists(LOAD_DRIVER):
            self.fail("load driver not built: %s" % LOAD_DRIVER)
        c = self.make_secure_cluster(coordinator_config={"limits": {"op_history": 256}})
        c.start_coordinator()
        for w in ("node-a", "node-b"):
            c.add_worker(w, [{"device": "cuda:%d" % i, "memory": "1GiB"}
                             for i in range(self.DEVICES_PER_WORKER)])
        c.wait_workers(["node-a", "node-b"])
        daemons = [c.coordinator, c.worker("node-a"), c.worker("node-b")]

        self.run_driver(c, self.OPS)  # warm-up
        baseline = {d.name: settle_rss(d.pid) for d in daemons}
        t0 = time.monotonic()
        summary = self.run_driver(c, self.OPS)
        elapsed = time.monotonic() - t0
        after = {d.name: settle_rss(d.pid) for d in daemons}
        print("\n  load: %d calls (%r) in %.1f s; VmRSS KiB baseline %r, after %r"
              % (summary["calls"], summary["by_kind"], elapsed, baseline, after))
        for d in daemons:
            self.assertTrue(d.running(), "%s died under load" % d.name)
        if sanitized(harness.SERVER):
            return
        for name in baseline:
            slack = 1024 + baseline[name] // 10
            self.assertLessEqual(after[name] - baseline[name], slack,
                                 "%s: VmRSS %d KiB after the load, baseline %d KiB (slack %d)"
                                 % (name, after[name], baseline[name], slack))
        # Still answering, and every worker still registered.
        self.assertEqual({n: w["state"] for n, w in c.registry_workers().items()},
                         {"node-a": "alive", "node-b": "alive"})


# ---- valgrind ------------------------------------------------------------------------------------


@unittest.skipUnless(os.environ.get("DEVCOORD_VALGRIND") == "1",
                     "set DEVCOORD_VALGRIND=1 to run the daemons under valgrind")
class ValgrindRun(OpsMixin, SecureTestCase):
    """A short scenario with both daemons under valgrind (memcheck): zero errors and zero
    definite leaks on a clean stop. Auth, TLS, state_dir and http are on so their code runs."""

    heartbeat_ms = 500
    dead_after_ms = 10000

    def valgrind(self, name):
        return ["valgrind", "--leak-check=full", "--errors-for-leak-kinds=definite",
                "--error-exitcode=9", "--num-callers=30",
                "--log-file=%s" % self.cluster.path("valgrind-%s.log" % name)]

    def test_daemons_under_valgrind(self):
        if shutil.which("valgrind") is None:
            self.fail("valgrind is not installed")
        c = self.cluster = self.make_secure_cluster(auth=True, tls=True, prefix=self.valgrind)
        state = c.path("state")
        os.mkdir(state)
        http = harness.free_port()
        c.coordinator_config.update({"state_dir": state, "http": "%s:%d" % (harness.HOST, http)})
        c.start_coordinator(timeout=120)
        for w in ("node-a", "node-b"):
            c.add_worker(w, [{"device": "cuda:%d" % i, "memory": "1GiB"} for i in range(2)],
                         token=c.tokens.extra_workers[0] if w == "node-b" else None,
                         http_port=harness.free_port())
        c.wait_workers(["node-a", "node-b"], timeout=120)

        def ok(*args, auth="trainer"):
            r = c.ctl(*args, auth=auth, timeout=120)
            self.assertEqual(r.rc, 0, repr(r))
            return r.out

        def refused(rc, *args, auth="trainer", tls=True):
            r = c.ctl(*args, auth=auth, tls=tls, timeout=120)
            self.assertEqual(r.rc, rc, repr(r))

        both = ("node-a", "node-b")
        for w, v in (("node-a", "1,2"), ("node-b", "3,4")):
            ok("tensor", "put", dev(w), "t", "--dtype", "f64", "--values", v)
        out = ok(*self.submit_args(both))
        self.assertEqual(out["status"], "OK", out)
        self.assertEqual(ok("tensor", "get", dev("node-b"), "t")["values"], [4, 6])
        ok("devices", "list")
        ok("workers", "cordon", "node-a", auth="operator")
        ok("workers", "uncordon", "node-a", auth="operator")
        ok("ops", "list", auth="operator")
        refused(1, "workers", "cordon", "node-a")
        refused(1, "status", auth="unknown")
        refused(1, *self.submit_args(both, tensor="absent"))
        refused(3, "--tls-ca", c.pki.other_ca, "status", tls=False)
        self.assertEqual(http_get(http, "/metrics", 60)[0], 200)
        # A hung worker: the op fails at its deadline and is aborted on the other.
        c.stop_worker("node-b")
        try:
            refused(1, *self.submit_args(both, timeout_ms=2000))
        finally:
            c.cont_worker("node-b")
        c.wait_workers(["node-a", "node-b"], timeout=60)
        # Some concurrency: the load driver, small.
        p = subprocess.run([LOAD_DRIVER, "--address", c.addr, "--workers", "node-a,node-b",
                            "--devices-per-worker", "2", "--clients", "8", "--ops", "40",
                            "--tls-ca", c.pki.ca, "--token-file", c.tokens.files["trainer"]],
                           capture_output=True, text=True, timeout=600,
                           stdin=subprocess.DEVNULL)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)

        problems = []
        for d in list(c.workers.values()) + [c.coordinator]:
            rc = d.terminate(180)
            if rc is None:
                d.kill_quietly()
            problems += self.valgrind_report(d.name, rc)
        self.assertFalse(problems, "\n".join(problems))

    def valgrind_report(self, name, rc):
        path = self.cluster.path("valgrind-%s.log" % name)
        with open(path) as f:
            text = f.read()
        problems = []
        if rc != 0:
            problems.append("%s exited with %s on SIGTERM under valgrind" % (name, rc))
        errors = re.findall(r"ERROR SUMMARY: (\d+) errors", text)
        definite = re.findall(r"definitely lost: ([\d,]+) bytes", text)
        if not errors or int(errors[-1]) != 0:
            problems.append("%s: ERROR SUMMARY %s (%s)" % (name, errors[-1:] or "missing", path))
        if definite and int(definite[-1].replace(",", "")) != 0:
            problems.append("%s: definitely lost %s bytes (%s)" % (name, definite[-1], path))
        if problems:
            problems.append(text[-6000:])
        summary = [l.split("== ", 1)[-1] for l in text.splitlines()
                   if "ERROR SUMMARY" in l or "definitely lost" in l or "possibly lost" in l
                   or "All heap blocks were freed" in l]
        print("\n  %s (exit %s): %s" % (name, rc, "; ".join(summary)))
        return problems


if __name__ == "__main__":
    unittest.main()
