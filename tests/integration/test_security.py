"""Issue 6, "Auth and TLS": tokens and roles on every coordinator and worker method, tokens
kept out of the logs, and TLS on every listener and dialer, against the real binaries.

Tokens and certificates are made fresh for each cluster (secutil: random tokens, an
openssl CA with a certificate for 127.0.0.1 and a client certificate, and an unrelated CA).

    cd tests/integration && python3 -m unittest -v test_security
"""

from concurrent.futures import ThreadPoolExecutor
import json
import os
import re
import socket
import ssl
import struct
import time
import unittest

import harness
from harness import (F, SLACK_S, RpcError, _one, frame, pb_bytes, pb_decode, pb_uint,
                     sanitized)
from secutil import SecureTestCase, TokenRpcConnection

WORKER_SERVICE = "/devcoord.v1.Worker/"
ERROR_LINE = re.compile(r"^devcoordctl: ([A-Z][A-Z_]+): (.+)$")
ROLES = ("worker", "trainer", "operator")
AUTH_CODES = ("UNAUTHENTICATED", "PERMISSION_DENIED")

NODE_A = [{"device": "cuda:0", "memory": "1GiB"}, {"device": "cuda:1", "memory": "1GiB"}]
NODE_B = [{"device": "cuda:0", "memory": "1GiB"}]
ALL_REDUCE_DEVICES = "node-a/cuda:0,node-a/cuda:1,node-b/cuda:0"


def needs(method, roles):
    """The refusal message of a token whose role may not call `method` (design §8)."""
    return "%s needs role %s; this token has role " % (method, " or ".join(roles))


def device_pb(backend=2, index=0):
    return pb_uint(1, backend) + pb_uint(3, index)


def put_tensor_request(name, values_f32, device=None):
    """PutTensorRequest of a whole 1-D f32 tensor in one chunk, and its attachment."""
    body = (pb_bytes(1, device or device_pb()) + pb_bytes(2, name) + pb_uint(3, 1)
            + pb_uint(4, len(values_f32)) + pb_uint(5, 4242))
    return body, struct.pack("<%df" % len(values_f32), *values_f32)


class CtlChecks:
    """Assertions on devcoordctl results (design §10 error form)."""

    def error_of(self, r):
        lines = [l for l in r.err.splitlines() if l.strip()]
        self.assertTrue(lines, "nothing on stderr: %r" % (r,))
        m = ERROR_LINE.match(lines[0])
        self.assertIsNotNone(m, "stderr is not 'devcoordctl: CODE: message': %r" % (r,))
        return m.group(1), m.group(2)

    def assert_refused(self, r, code, mentions=None, rc=1):
        self.assertEqual(r.rc, rc, repr(r))
        got, message = self.error_of(r)
        self.assertEqual(got, code, repr(r))
        if mentions is not None:
            self.assertIn(mentions, message, repr(r))
        return message

    def assert_ok(self, r):
        self.assertEqual(r.rc, 0, repr(r))
        return r.out


def start_auth_cluster(test, **kw):
    """Coordinator and two workers, auth on everywhere. node-a presents the tokens file's
    first worker token (the one the coordinator uses to call workers), node-b another worker
    token, so both the coordinator's and the peers' tokens are checked."""
    c = test.make_secure_cluster(auth=True, **kw)
    c.start_coordinator()
    c.add_worker("node-a", NODE_A)
    c.add_worker("node-b", NODE_B, token=c.tokens.extra_workers[0])
    c.wait_workers(["node-a", "node-b"])
    return c


class AuthTest(CtlChecks, SecureTestCase):
    """Roles x methods at the coordinator and at a worker."""

    def setUp(self):
        self.cluster = start_auth_cluster(self)

    # -- coordinator, through the CLI

    def test_coordinator_roles_through_the_cli(self):
        c = self.cluster
        # (CLI command, RPC it makes, roles allowed), one per group of methods.
        plan = ("plan", "--op", "all-reduce", "--reduce", "sum", "--devices",
                "node-a/cuda:0,node-b/cuda:0")
        cases = [
            (("workers", "list"), "ListWorkers", ("trainer", "operator")),
            (("devices", "list"), "ListDevices", ("trainer", "operator")),
            (("ops", "list"), "ListOps", ("trainer", "operator")),
            (plan, "SubmitOp", ("trainer",)),
            (("workers", "drain", "node-b"), "DrainWorker", ("operator",)),
            (("workers", "cordon", "node-b"), "CordonWorker", ("operator",)),
            (("workers", "uncordon", "node-b"), "UncordonWorker", ("operator",)),
            (("status",), "GetClusterStatus", ROLES),
        ]
        for args, method, allowed in cases:
            for role in ROLES:
                with self.subTest(method=method, role=role):
                    r = c.ctl(*args, auth=role)
                    if role in allowed:
                        self.assert_ok(r)
                    else:
                        self.assert_refused(r, "PERMISSION_DENIED", needs(method, allowed) + role)
            with self.subTest(method=method, token="none"):
                message = self.assert_refused(c.ctl(*args, auth=None), "UNAUTHENTICATED")
                self.assertIn(method, message)
                self.assertIn("token", message)
            with self.subTest(method=method, token="unknown"):
                self.assert_refused(c.ctl(*args, auth="unknown"), "UNAUTHENTICATED",
                                    "unknown token")
        # The operator's steps above left node-b as it was.
        self.assertEqual(c.registry_workers()["node-b"]["state"], "alive")

    def test_token_from_the_environment(self):
        c = self.cluster
        r = c.ctl("workers", "list", auth=None,
                  env={"DEVCOORD_TOKEN": c.tokens.by_role["trainer"]})
        self.assertEqual(sorted(w["name"] for w in self.assert_ok(r)["workers"]),
                         ["node-a", "node-b"])
        r = c.ctl("workers", "cordon", "node-a", auth=None,
                  env={"DEVCOORD_TOKEN": c.tokens.by_role["trainer"]})
        self.assert_refused(r, "PERMISSION_DENIED", needs("CordonWorker", ["operator"]) + "trainer")
        r = c.ctl("status", auth=None, env={"DEVCOORD_TOKEN": c.tokens.unknown})
        self.assert_refused(r, "UNAUTHENTICATED", "unknown token")

    # -- coordinator, raw: the worker-only methods

    def test_worker_methods_need_the_worker_role(self):
        c = self.cluster
        epoch = c.registry_workers()["node-a"]["epoch"]
        heartbeat = pb_bytes(1, "node-a") + pb_uint(2, epoch)
        bodies = {"RegisterWorker": b"", "Heartbeat": heartbeat,
                  "DeregisterWorker": pb_bytes(1, "node-nobody") + pb_uint(2, 1)}
        for method, body in bodies.items():
            for role in ("trainer", "operator"):
                with self.subTest(method=method, role=role):
                    code, message, _ = c.rpc(method, body, token=c.tokens.by_role[role])
                    self.assertEqual((code, message),
                                     ("PERMISSION_DENIED", needs(method, ["worker"]) + role))
            with self.subTest(method=method, token="none"):
                code, message, _ = c.rpc(method, body, token="")
                self.assertEqual(code, "UNAUTHENTICATED", message)
                self.assertIn(method, message)
            with self.subTest(method=method, token="unknown"):
                code, message, _ = c.rpc(method, body, token=c.tokens.unknown)
                self.assertEqual((code, message), ("UNAUTHENTICATED", "unknown token"))
            with self.subTest(method=method, role="worker"):
                code, message, _ = c.rpc(method, body, token=c.tokens.by_role["worker"])
                self.assertNotIn(code, AUTH_CODES, message)
        # node-a's epoch and a worker token are not enough to heartbeat for it: that takes
        # its session secret too (WorkerIdentityTest). The refusal disturbed nobody.
        code, message, _ = c.rpc("Heartbeat", heartbeat, token=c.tokens.by_role["worker"])
        self.assertEqual(code, "FAILED_PRECONDITION", message)
        self.assertEqual(sorted(c.registry_workers()), ["node-a", "node-b"])

    # -- workers, raw

    def test_worker_checks_its_callers(self):
        c = self.cluster
        port = c.worker_port("node-a")
        t = c.tokens.by_role
        empty_device = pb_bytes(1, device_pb())
        cases = [  # method, body, roles allowed
            ("Execute", b"", ("worker",)),
            ("Abort", pb_bytes(1, "op-none"), ("worker",)),
            ("Exchange", b"", ("worker",)),
            ("ListTensors", empty_device, ("trainer", "operator")),
            ("GetTensor", empty_device + pb_bytes(2, "absent"), ("trainer", "operator")),
            ("DeleteTensor", empty_device + pb_bytes(2, "absent"), ("trainer",)),
        ]
        for method, body, allowed in cases:
            for role in ROLES:
                with self.subTest(method=method, role=role):
                    code, message, _ = c.rpc(WORKER_SERVICE + method, body, port=port,
                                             token=t[role])
                    if role in allowed:
                        self.assertNotIn(code, AUTH_CODES, message)
                    else:
                        self.assertEqual((code, message),
                                         ("PERMISSION_DENIED", needs(method, allowed) + role))
            with self.subTest(method=method, token="none"):
                code, message, _ = c.rpc(WORKER_SERVICE + method, body, port=port, token="")
                self.assertEqual(code, "UNAUTHENTICATED", message)
            with self.subTest(method=method, token="unknown"):
                code, message, _ = c.rpc(WORKER_SERVICE + method, body, port=port,
                                         token=c.tokens.unknown)
                self.assertEqual((code, message), ("UNAUTHENTICATED", "unknown token"))

    def test_worker_refuses_a_put_without_token(self):
        c = self.cluster
        port = c.worker_port("node-a")
        body, data = put_tensor_request("raw", [1.0, 2.0])
        method = WORKER_SERVICE + "PutTensor"

        def put(token):
            with c.connect(port, token=token) as conn:
                header = (pb_uint(1, 9) + pb_bytes(2, method) + pb_uint(3, 5000)
                          + pb_bytes(4, token))
                return conn.call_raw(frame(header, body, data), 9)

        code, message, _ = put("")
        self.assertEqual(code, "UNAUTHENTICATED", message)
        self.assertIn("PutTensor", message)
        code, message, _ = put(c.tokens.unknown)
        self.assertEqual((code, message), ("UNAUTHENTICATED", "unknown token"))
        for role in ("operator", "worker"):
            code, message, _ = put(c.tokens.by_role[role])
            self.assertEqual((code, message),
                             ("PERMISSION_DENIED", needs("PutTensor", ["trainer"]) + role))
        # Nothing was stored by the refused calls...
        r = c.ctl("tensor", "get", "node-a/cuda:0", "raw", auth="trainer")
        self.assert_refused(r, "NOT_FOUND")
        # ...and the trainer's token stores it.
        code, message, _ = put(c.tokens.by_role["trainer"])
        self.assertEqual(code, "OK", message)
        out = self.assert_ok(c.ctl("tensor", "get", "node-a/cuda:0", "raw", auth="operator"))
        self.assertEqual(out["values"], [1, 2])

    def test_tensor_roles_through_the_cli(self):
        c = self.cluster
        put = ("tensor", "put", "node-b/cuda:0", "w", "--dtype", "f32", "--values", "4,5")
        self.assert_ok(c.ctl(*put, auth="trainer"))
        self.assert_refused(c.ctl(*put, auth="operator"), "PERMISSION_DENIED",
                            needs("PutTensor", ["trainer"]) + "operator")
        self.assert_refused(c.ctl(*put, auth=None), "UNAUTHENTICATED")
        for role in ("trainer", "operator"):
            out = self.assert_ok(c.ctl("tensor", "get", "node-b/cuda:0", "w", auth=role))
            self.assertEqual(out["values"], [4, 5])
            self.assert_ok(c.ctl("tensor", "list", "node-b/cuda:0", auth=role))
        self.assert_refused(c.ctl("tensor", "delete", "node-b/cuda:0", "w", auth="operator"),
                            "PERMISSION_DENIED", needs("DeleteTensor", ["trainer"]) + "operator")
        self.assert_ok(c.ctl("tensor", "delete", "node-b/cuda:0", "w", auth="trainer"))

    # -- the data plane between daemons

    def test_all_reduce_with_auth_everywhere(self):
        """The coordinator's Execute and the workers' Exchange carry worker tokens the callee
        checks (node-a's and node-b's differ): the op works, and neither worker logged a
        refused call."""
        c = self.cluster
        values = {"node-a/cuda:0": [1, 2, 3], "node-a/cuda:1": [10, 20, 30],
                  "node-b/cuda:0": [100, 200, 300]}
        for dev, v in values.items():
            self.assert_ok(c.ctl("tensor", "put", dev, "g", "--dtype", "f32", "--values",
                                 ",".join(map(str, v)), auth="trainer"))
        out = self.assert_ok(c.ctl("submit", "--op", "all-reduce", "--reduce", "sum",
                                   "--tensor", "g", "--devices", ALL_REDUCE_DEVICES,
                                   auth="trainer"))
        self.assertEqual(out["status"], "OK", out)
        self.assertEqual(sorted(w["name"] for w in out["workers"]), ["node-a", "node-b"], out)
        for dev in values:
            got = self.assert_ok(c.ctl("tensor", "get", dev, "g", auth="trainer"))
            self.assertEqual(got["values"], [111, 222, 333], dev)
        for name in ("node-a", "node-b"):
            log = c.worker(name).log_text()
            for code in AUTH_CODES:
                self.assertNotIn(code, log, "%s refused a call during the op:\n%s" % (name, log))

    def test_control_link_calls_need_the_worker_role(self):
        """Execute and Commit on a control link (the data port, with the secret only a worker
        token gets from GroupLink) are authorized like their RPCs: the token inside each frame
        is checked; and the coordinator's own calls there pass, op after op."""
        c = self.cluster
        worker = c.tokens.by_role["worker"]
        port = c.worker_port("node-a")
        code, message, _ = c.rpc("GroupLink", port=port, token=c.tokens.by_role["trainer"],
                                 service=WORKER_SERVICE)
        self.assertEqual((code, message), ("PERMISSION_DENIED",
                                           needs("GroupLink", ["worker"]) + "trainer"))
        code, message, body = c.rpc("GroupLink", port=port, token=worker, service=WORKER_SERVICE)
        self.assertEqual(code, "OK", message)
        fields = pb_decode(body)
        data_port, secret = int(fields[1][0].decode().rsplit(":", 1)[1]), fields[2][0]
        commit = pb_bytes(F("CommitRequest", "op_id"), "op-1-1")
        with socket.create_connection(("127.0.0.1", data_port), timeout=10) as sock:
            sock.sendall(harness.dlink_header(1, 32 + 1, flags=1) + secret + b"x")
            for seq, (token, want) in enumerate([
                    (c.tokens.by_role["trainer"], "PERMISSION_DENIED"),
                    (c.tokens.by_role["operator"], "PERMISSION_DENIED"),
                    ("", "UNAUTHENTICATED"), (c.tokens.unknown, "UNAUTHENTICATED"),
                    (worker, "NOT_FOUND")], 1):
                header = (pb_uint(1, seq) + pb_bytes(2, WORKER_SERVICE + "Commit")
                          + pb_uint(3, 3000) + pb_bytes(4, token))
                payload = frame(header, commit)
                sock.sendall(harness.dlink_header(3, len(payload), seq=seq, total=len(payload))
                             + payload)
                hdr = harness.recv_exactly(sock, 56)
                self.assertEqual(struct.unpack_from("<Q", hdr, 40)[0], 0)  # an RPC reply frame
                code, message, _ = harness.parse_reply(
                    harness.recv_exactly(sock, struct.unpack_from("<I", hdr, 12)[0]))
                with self.subTest(seq=seq):
                    self.assertEqual(code, want, message)
        values = {"node-a/cuda:0": [1], "node-a/cuda:1": [2], "node-b/cuda:0": [3]}
        for dev, v in values.items():
            self.assert_ok(c.ctl("tensor", "put", dev, "h", "--dtype", "f32", "--values",
                                 ",".join(map(str, v)), auth="trainer"))
        for i in range(4):  # the first op's calls go as RPCs, the later ones on links
            out = self.assert_ok(c.ctl("submit", "--op", "all-reduce", "--reduce", "sum",
                                       "--tensor", "h", "--devices", ALL_REDUCE_DEVICES,
                                       auth="trainer"))
            self.assertEqual(out["status"], "OK", out)
        for dev in values:
            got = self.assert_ok(c.ctl("tensor", "get", dev, "h", auth="trainer"))
            self.assertEqual(got["values"], [6 * 3 ** 3], dev)
        for name in ("node-a", "node-b"):
            log = c.worker(name).log_text()
            self.assertEqual(log.count("PERMISSION_DENIED"), 0, log)

    def test_workers_exchange_tokens_are_checked(self):
        """A worker whose token its peer does not know: registration works (the coordinator
        knows it) but the peer refuses its Exchange calls, so the op fails with
        UNAUTHENTICATED naming it instead of hanging, and changes no tensor."""
        c = self.cluster
        # node-c's token is in the coordinator's tokens file, not in node-d's.
        narrow = c.write("narrow-tokens.yaml", "%s: worker\n%s: trainer\n%s: operator\n" % (
            c.tokens.by_role["worker"], c.tokens.by_role["trainer"],
            c.tokens.by_role["operator"]))
        c.add_worker("node-c", [{"device": "cuda:0", "memory": "1GiB"}],
                     token=c.tokens.extra_workers[0])
        c.add_worker("node-d", [{"device": "cuda:0", "memory": "1GiB"}],
                     extra={"auth": {"tokens_file": narrow}})
        c.wait_workers(["node-c", "node-d"])
        for dev in ("node-c/cuda:0", "node-d/cuda:0"):
            self.assert_ok(c.ctl("tensor", "put", dev, "x", "--dtype", "f32", "--values", "1",
                                 auth="trainer"))
        r = c.ctl("submit", "--op", "all-reduce", "--reduce", "sum", "--tensor", "x",
                  "--devices", "node-c/cuda:0,node-d/cuda:0", "--timeout-ms", "5000",
                  auth="trainer")
        self.assertEqual(r.rc, 1, repr(r))
        self.assertEqual(r.out.get("status"), "UNAUTHENTICATED", repr(r))
        self.assertIn("node-c", r.out.get("message"), repr(r))
        for dev in ("node-c/cuda:0", "node-d/cuda:0"):
            with self.subTest("the failed op left %s as it was" % dev):
                got = self.assert_ok(c.ctl("tensor", "get", dev, "x", auth="trainer"))
                self.assertEqual(got["values"], [1], "the op failed, yet %s holds a result"
                                 % dev)

    # -- workers presenting the wrong token

    def start_refused_worker(self, name, token):
        return self.cluster.add_worker(name, [{"device": "cuda:0", "memory": "1GiB"}],
                                       token=token)

    def wait_refusal(self, w, what):
        harness.wait_until(lambda: what in w.log_text(), 10 + SLACK_S,
                           "%s's log to say %r" % (w.name, what))

    def test_worker_with_a_wrong_token_cannot_register(self):
        c = self.cluster
        cases = [("node-x", c.tokens.unknown, "unknown token"),
                 ("node-y", c.tokens.by_role["trainer"],
                  needs("RegisterWorker", ["worker"]) + "trainer")]
        for name, token, said in cases:
            with self.subTest(worker=name):
                w = self.start_refused_worker(name, token)
                self.wait_refusal(w, said)
                # Five heartbeats later it is still not in the registry.
                time.sleep(5 * c.heartbeat_s)
                self.assertNotIn(name, c.registry_workers())
                w.expected_exit = True  # whether it retries or gives up is the next test's
        self.assertEqual(sorted(c.registry_workers()), ["node-a", "node-b"])

    def test_worker_refused_registration_is_a_failure_exit(self):
        """A worker that gives up after its registration is refused must not report
        success: exit status 0 tells systemd and compose all went well."""
        c = self.cluster
        w = self.start_refused_worker("node-x", c.tokens.unknown)
        self.wait_refusal(w, "unknown token")
        rc = w.wait(5 * c.heartbeat_s + SLACK_S)
        w.expected_exit = True
        if rc is None:
            return  # it keeps retrying: fine too
        self.assertGreater(rc, 0, "node-x exited with %s after its registration was refused:\n%s"
                           % (rc, w.log_tail()))


def register_request(name, address="tcp://127.0.0.1:1"):
    """A valid RegisterWorkerRequest: one cuda device."""
    spec = pb_bytes(1, device_pb()) + pb_uint(2, 1 << 30) + pb_uint(3, 1)
    return pb_bytes(1, name) + pb_bytes(2, address) + pb_bytes(4, spec)


def session_request(method, name, epoch, secret=b""):
    """A HeartbeatRequest or DeregisterWorkerRequest body."""
    message = method + "Request"
    return (pb_bytes(F(message, "name"), name) + pb_uint(F(message, "epoch"), epoch)
            + pb_bytes(F(message, "session_secret"), secret))


class WorkerIdentityTest(CtlChecks, SecureTestCase):
    """Issue 12: a worker token names the workers it may register, and only the registrant
    of an epoch (holding its session secret) may heartbeat or deregister it. Epochs are no
    secret (ListWorkers shows them), and errors never say one.

    Tokens in the list form: the coordinator's own worker token (the file's first) may
    register nobody; node-a's and node-b's tokens one name each; a fourth token node-z."""

    def setUp(self):
        c = self.cluster = self.make_secure_cluster(
            auth=True, extra_worker_tokens=3,
            worker_names=[[], ["node-a"], ["node-b"], ["node-z"]])
        self.token_a, self.token_b, self.token_z = c.tokens.extra_workers
        c.start_coordinator()
        c.add_worker("node-a", NODE_A, token=self.token_a)
        c.add_worker("node-b", NODE_B, token=self.token_b)
        c.wait_workers(["node-a", "node-b"])

    def assert_no_epoch(self, message, *epochs):
        for e in epochs:
            self.assertNotIn(str(e), message, "an error names epoch %d" % e)

    def assert_undisturbed(self, name, epoch):
        """name is alive in the same epoch after two more heartbeats, and never fenced."""
        c = self.cluster
        time.sleep(2 * c.heartbeat_s)
        w = c.registry_workers()[name]
        self.assertEqual((w["state"], w["epoch"]), ("alive", epoch))
        self.assertTrue(c.worker(name).running(), c.worker(name).log_tail())
        self.assertNotIn("fenced", c.worker(name).log_text())

    def test_a_worker_token_registers_only_its_names(self):
        c = self.cluster
        epoch_a = c.registry_workers()["node-a"]["epoch"]
        cases = [("node-b's token", self.token_b), ("node-z's token", self.token_z),
                 ("the coordinator's token (names: [])", c.tokens.by_role["worker"])]
        for what, token in cases:
            with self.subTest(what):
                code, message, _ = c.rpc("RegisterWorker", register_request("node-a"),
                                         token=token)
                self.assertEqual((code, message),
                                 ("PERMISSION_DENIED", "this token may not register worker node-a"))
        # The real node-a was neither replaced nor fenced, and an op over it works.
        self.assert_undisturbed("node-a", epoch_a)
        for dev in ("node-a/cuda:0", "node-b/cuda:0"):
            self.assert_ok(c.ctl("tensor", "put", dev, "g", "--dtype", "f32", "--values", "1,2",
                                 auth="trainer"))
        out = self.assert_ok(c.ctl("submit", "--op", "all-reduce", "--reduce", "sum",
                                   "--tensor", "g", "--devices", "node-a/cuda:0,node-b/cuda:0",
                                   auth="trainer"))
        self.assertEqual(out["status"], "OK", out)
        # Its own name, it may: node-z registers.
        code, message, _ = c.rpc("RegisterWorker", register_request("node-z"),
                                 token=self.token_z)
        self.assertEqual(code, "OK", message)

    def test_heartbeat_and_deregister_need_the_session_secret(self):
        c = self.cluster
        epoch = c.registry_workers()["node-a"]["epoch"]
        secrets_sent = [("no secret", b""), ("a wrong secret", os.urandom(32))]
        for method in ("Heartbeat", "DeregisterWorker"):
            for what, secret in secrets_sent:
                # Even node-a's own token: the epoch, which anyone may list, is not enough.
                for token in (self.token_a, self.token_b):
                    with self.subTest(method=method, secret=what, token=token[:10]):
                        code, message, _ = c.rpc(method, session_request(method, "node-a", epoch,
                                                                         secret), token=token)
                        self.assertEqual(code, "FAILED_PRECONDITION", message)
                        self.assertIn("node-a", message)
                        self.assert_no_epoch(message, epoch)
            with self.subTest(method=method, secret="a stale epoch"):
                code, message, _ = c.rpc(method, session_request(method, "node-a", epoch - 1),
                                         token=self.token_a)
                self.assertEqual(code, "FAILED_PRECONDITION", message)
                self.assert_no_epoch(message, epoch, epoch - 1)
        self.assert_undisturbed("node-a", epoch)

    def test_the_registrant_holds_the_session_secret(self):
        c = self.cluster
        code, message, body = c.rpc("RegisterWorker", register_request("node-z"),
                                    token=self.token_z)
        self.assertEqual(code, "OK", message)
        reply = pb_decode(body)
        epoch = _one(reply, F("RegisterWorkerResponse", "epoch"), 0)
        secret = _one(reply, F("RegisterWorkerResponse", "session_secret"), b"")
        self.assertEqual(len(secret), 32)
        self.assertEqual(c.registry_workers()["node-z"]["epoch"], epoch)
        code, message, _ = c.rpc("Heartbeat", session_request("Heartbeat", "node-z", epoch,
                                                                secret), token=self.token_z)
        self.assertEqual(code, "OK", message)
        # A second registration gets another secret; the first no longer works.
        code, message, body = c.rpc("RegisterWorker", register_request("node-z"),
                                    token=self.token_z)
        self.assertEqual(code, "OK", message)
        reply = pb_decode(body)
        epoch2 = _one(reply, F("RegisterWorkerResponse", "epoch"), 0)
        secret2 = _one(reply, F("RegisterWorkerResponse", "session_secret"), b"")
        self.assertNotEqual(secret2, secret)
        for epoch_sent, secret_sent in ((epoch, secret), (epoch2, secret)):
            code, message, _ = c.rpc("DeregisterWorker", session_request(
                "DeregisterWorker", "node-z", epoch_sent, secret_sent), token=self.token_z)
            self.assertEqual(code, "FAILED_PRECONDITION", message)
            self.assert_no_epoch(message, epoch, epoch2)
        code, message, _ = c.rpc("DeregisterWorker", session_request(
            "DeregisterWorker", "node-z", epoch2, secret2), token=self.token_z)
        self.assertEqual(code, "OK", message)
        self.assertNotIn("node-z", c.registry_workers())
        self.assertEqual(sorted(c.registry_workers()), ["node-a", "node-b"])

    def test_the_worker_daemon_keeps_its_secret(self):
        """The real workers heartbeat with their secret (they stay alive) and deregister
        with it when stopped (gone at once, not dead after a timeout)."""
        c = self.cluster
        self.assert_undisturbed("node-b", c.registry_workers()["node-b"]["epoch"])
        c.terminate_worker("node-b")
        self.assertNotIn("node-b", c.registry_workers())
        self.assertIn("deregistered from", c.worker("node-b").log_text())


class TokenLogTest(CtlChecks, SecureTestCase):
    """Tokens never appear in a daemon's log, even at debug level, whatever happens."""

    def test_tokens_absent_from_every_log(self):
        c = self.make_secure_cluster(auth=True)
        c.coordinator_config["log"] = {"level": "debug"}
        c.start_coordinator()
        debug = {"log": {"level": "debug", "format": "json"}}
        c.add_worker("node-a", NODE_A, extra=debug)
        c.add_worker("node-b", NODE_B, token=c.tokens.extra_workers[0], extra=debug)
        c.add_worker("node-x", NODE_B, token=c.tokens.unknown, extra=debug)
        c.add_worker("node-y", NODE_B, token=c.tokens.by_role["operator"], extra=debug)
        c.wait_workers(["node-a", "node-b"])
        harness.wait_until(lambda: "unknown token" in c.worker("node-x").log_text(), 10,
                           "node-x to be refused")
        c.worker("node-x").expected_exit = True
        c.worker("node-y").expected_exit = True
        # Everything that carries a token: registration, heartbeats, ops (Execute and
        # Exchange), tensors, refused calls with every kind of wrong token.
        for dev, v in (("node-a/cuda:0", "1"), ("node-a/cuda:1", "2"), ("node-b/cuda:0", "3")):
            self.assert_ok(c.ctl("tensor", "put", dev, "t", "--dtype", "f32", "--values", v,
                                 auth="trainer"))
        self.assert_ok(c.ctl("submit", "--op", "all-reduce", "--reduce", "sum", "--tensor", "t",
                             "--devices", ALL_REDUCE_DEVICES, auth="trainer"))
        c.ctl("submit", "--op", "all-reduce", "--reduce", "sum", "--tensor", "absent",
              "--devices", ALL_REDUCE_DEVICES, auth="trainer")
        for role in ("worker", "trainer", "operator", "unknown", None):
            c.ctl("workers", "cordon", "node-b", auth=role)
            c.ctl("workers", "uncordon", "node-b", auth=role)
            c.ctl("tensor", "put", "node-a/cuda:0", "u", "--dtype", "f32", "--values", "1",
                  auth=role)
        for token in c.tokens.all():
            c.rpc(WORKER_SERVICE + "PutTensor", b"", port=c.worker_port("node-a"), token=token)
            c.rpc("RegisterWorker", b"", token=token)
            c.rpc("Heartbeat", pb_bytes(1, "node-a"), token=token)
        # A token with a byte a log line would need to escape.
        c.rpc("ListWorkers", token=c.tokens.unknown + "\x1b[31m\n")
        c.restart_worker("node-a")
        c.wait_workers(["node-a", "node-b"])
        c.terminate_worker("node-b")  # deregistration
        # Stop them here, so that what they log on the way out is read too.
        for d in c.all_daemons():
            if d.running():
                self.assertEqual(d.terminate(15), 0, "%s on SIGTERM" % d.name)
        logs = {d.name: d.log_text() for d in c.all_daemons()}
        self.assertIn("unknown token", logs["node-x"])
        for token in c.tokens.all():
            secret = token.split("-")[-1]
            for name, text in logs.items():
                with self.subTest(daemon=name, token=token[:12] + "..."):
                    self.assertNotIn(secret[:12], text,
                                     "a token (or its first 12 secret characters) in the log "
                                     "of %s" % name)


class LogInjectionTest(CtlChecks, SecureTestCase):
    """Issue 12, item 8: a peer's text with a newline could forge a log line. Names, labels,
    addresses and the executor name with a control character are refused at registration
    (INVALID_ARGUMENT), and whatever a log line carries is escaped, in text and in JSON."""

    # What a forged line would start with: a timestamp no real line of this run has.
    FORGED = "1999-01-01T00:00:00.000Z error coordinator: FORGED"

    def register(self, name="node-z", address="tcp://127.0.0.1:1", labels=(), executor=None):
        spec = pb_bytes(4, pb_bytes(1, device_pb()) + pb_uint(2, 1 << 30) + pb_uint(3, 1))
        body = pb_bytes(1, name) + pb_bytes(2, address)
        body += b"".join(pb_bytes(3, pb_bytes(1, k) + pb_bytes(2, v)) for k, v in labels)
        body += spec
        if executor is not None:
            body += pb_bytes(5, executor)
        return self.cluster.rpc("RegisterWorker", body)

    def check(self, log_format):
        c = self.cluster = self.make_secure_cluster()
        c.coordinator_config["log"] = {"level": "debug", "format": log_format}
        c.start_coordinator()
        forged = "\n" + self.FORGED
        cases = [
            ("a newline in the name", dict(name="node-z" + forged), "invalid worker name"),
            ("a newline in the address", dict(address="tcp://127.0.0.1:1" + forged),
             "control character in address"),
            ("a newline in a label value", dict(labels=[("rack", "r1" + forged)]),
             "label 0"),
            ("a newline in a label key", dict(labels=[("rack" + forged, "r1")]), "label 0"),
            ("an escape in a label value", dict(labels=[("rack", "\x1b[31mred")]), "label 0"),
            ("a carriage return in a label", dict(labels=[("rack", "r1\rFORGED")]), "label 0"),
            ("a newline in the executor name", dict(executor="host" + forged), "executor"),
        ]
        for what, kw, says in cases:
            with self.subTest(what=what, log_format=log_format):
                code, message, _ = self.register(**kw)
                self.assertEqual(code, "INVALID_ARGUMENT", message)
                self.assertIn(says, message)
                self.assertNotIn("\n", message)
        self.assertEqual(c.registry_workers(), {})
        # A well-formed registration still goes through, and is logged on one line.
        code, message, _ = self.register(labels=[("rack", "r1")])
        self.assertEqual(code, "OK", message)
        self.assertEqual(c.coordinator.terminate(10), 0)
        log = c.coordinator.log_text()
        self.assertIn("FORGED", log, "the refusals should have been logged, escaped")
        for line in log.splitlines():
            self.assertFalse(line.startswith(self.FORGED[:24]), "a forged log line: %r" % line)
            self.assertFalse(line.startswith("FORGED"), "a forged log line: %r" % line)
            self.assertNotIn("\x1b", line, "a raw escape in the log: %r" % line)
            self.assertNotIn("\r", line, "a raw carriage return in the log: %r" % line)
            if log_format == "json" and not line.startswith("===="):
                json.loads(line)

    def test_text_log(self):
        self.check("text")

    def test_json_log(self):
        self.check("json")


# ---- limits ---------------------------------------------------------------------------------


class LimitsTest(CtlChecks, SecureTestCase):
    """Counts and lengths from the wire are bounded, with the bound in the error; memory the
    worker cannot get is RESOURCE_EXHAUSTED, not a crash. node-a has small configured
    limits; node-m runs under a 1 GiB address-space limit (prlimit), so a tensor within its
    limits.max_tensor_bytes (default 4 GiB) fails in the allocator itself."""

    MAX_TENSOR = 1 << 20
    ADDRESS_SPACE = 1 << 30

    def setUp(self):
        def prefix(name):
            return ["prlimit", "--as=%d" % self.ADDRESS_SPACE, "--"] if name == "node-m" else []
        c = self.cluster = self.make_secure_cluster(
            prefix=prefix, coordinator_config={"limits": {"max_group_devices": 4}})
        c.start_coordinator()
        # cuda:4's memory holds two tensors of MAX_TENSOR (test_device_memory_...).
        c.add_worker("node-a", [{"device": "cuda:%d" % i,
                                 "memory": "2MiB" if i == 4 else "1GiB"} for i in range(5)],
                     extra={"limits": {"max_tensor_bytes": self.MAX_TENSOR,
                                       "max_message_bytes": 65536}})
        names = ["node-a"]
        if not sanitized(harness.WORKER):
            # Its memory (4 GiB) is above the 2 GiB tensor its allocator cannot give.
            c.add_worker("node-m", [{"device": "cuda:0", "memory": "4GiB"}])
            names.append("node-m")
        c.wait_workers(names)

    def worker_call(self, worker, method, body, attachment=b""):
        with self.cluster.connect(self.cluster.worker_port(worker)) as conn:
            header = pb_uint(1, 3) + pb_bytes(2, WORKER_SERVICE + method) + pb_uint(3, 10000)
            return conn.call_raw(frame(header, body, attachment), 3)

    def put(self, worker, name, shape, attachment=b"", dtype=1, offset=0, upload=1, index=0):
        body = pb_bytes(1, device_pb(index=index)) + pb_bytes(2, name) + pb_uint(3, dtype)
        body += b"".join(pb_uint(4, d) for d in shape) + pb_uint(5, upload) + pb_uint(6, offset)
        return self.worker_call(worker, "PutTensor", body, attachment)

    def assert_serving(self):
        c = self.cluster
        for d in c.all_daemons():
            self.assertTrue(d.running(), "%s died:\n%s" % (d.name, d.log_tail()))
        for w in c.workers:
            self.assert_ok(c.ctl("tensor", "put", "%s/cuda:0" % w, "ok", "--dtype", "f32",
                                 "--values", "1,2"))
            self.assertEqual(self.assert_ok(c.ctl("tensor", "get", "%s/cuda:0" % w, "ok"))
                             ["values"], [1, 2])

    def test_registration_bounds(self):
        c = self.cluster
        spec = pb_bytes(4, pb_bytes(1, device_pb()) + pb_uint(2, 1 << 30) + pb_uint(3, 1))

        def register(name="node-z", address="tcp://127.0.0.1:1", devices=1, labels=()):
            body = pb_bytes(1, name) + pb_bytes(2, address)
            body += b"".join(pb_bytes(3, pb_bytes(1, k) + pb_bytes(2, v)) for k, v in labels)
            body += spec * devices
            return c.rpc("RegisterWorker", body)

        cases = [
            ("1025 devices", register(devices=1025), "RESOURCE_EXHAUSTED",
             "1025 devices, over limits.max_devices_per_worker (1024)"),
            ("no device", register(devices=0), "INVALID_ARGUMENT", "0 devices"),
            ("65 labels", register(labels=[("k%d" % i, "v") for i in range(65)]),
             "INVALID_ARGUMENT", "65 labels (at most 64)"),
            ("a 257-byte label key", register(labels=[("k" * 257, "v")]), "INVALID_ARGUMENT",
             "label 0 invalid"),
            ("a 257-byte label value", register(labels=[("k", "v" * 257)]), "INVALID_ARGUMENT",
             "label 0 invalid"),
            ("a 64-character name", register(name="n" * 64), "INVALID_ARGUMENT",
             "invalid worker name"),
            ("a 256-byte address", register(address="tcp://" + "h" * 250), "INVALID_ARGUMENT",
             "invalid data address"),
        ]
        for what, (code, message, _), want, says in cases:
            with self.subTest(what):
                self.assertEqual(code, want, message)
                self.assertIn(says, message)
        self.assertEqual(sorted(c.registry_workers()), sorted(c.workers))
        self.assert_serving()

    def test_group_size_bound(self):
        r = self.cluster.ctl("plan", "--op", "all-reduce", "--reduce", "sum", "--devices",
                             ",".join("node-a/cuda:%d" % i for i in range(5)))
        self.assertEqual(r.rc, 1, repr(r))
        self.assertEqual(r.out["status"], "INVALID_ARGUMENT", r.out)
        self.assertTrue(r.out["message"].startswith("too many devices"), r.out)
        r = self.cluster.ctl("plan", "--op", "all-reduce", "--reduce", "sum", "--devices",
                             ",".join("node-a/cuda:%d" % i for i in range(4)))
        self.assertEqual(r.rc, 0, repr(r))

    def test_tensor_bounds(self):
        cases = [
            ("over limits.max_tensor_bytes", self.put("node-a", "big", [self.MAX_TENSOR // 4 + 1]),
             "RESOURCE_EXHAUSTED", "max_tensor_bytes"),
            ("a shape whose size overflows", self.put("node-a", "wrap", [1 << 32, 1 << 32, 4]),
             "INVALID_ARGUMENT", None),
            ("9 dimensions", self.put("node-a", "deep", [1] * 9), "INVALID_ARGUMENT", None),
            ("an unknown dtype", self.put("node-a", "odd", [1], dtype=99), "INVALID_ARGUMENT",
             None),
            ("a 300-byte name", self.put("node-a", "n" * 300, [1]), "INVALID_ARGUMENT", None),
            ("a chunk past the end", self.put("node-a", "past", [2], b"\0" * 16),
             "OUT_OF_RANGE", None),
            ("a chunk at an offset never started", self.put("node-a", "late", [4], b"\0" * 4,
                                                            offset=4, upload=99),
             "FAILED_PRECONDITION", None),
        ]
        for what, (code, message, _), want, says in cases:
            with self.subTest(what):
                self.assertEqual(code, want, message)
                if says:
                    self.assertIn(says, message)
        # A later chunk of an upload must say what its first said: the same bytes in
        # another shape would publish the tensor with the first chunk's shape.
        code, message, _ = self.put("node-a", "reshaped", [2, 3], b"\0" * 12, upload=77)
        self.assertEqual(code, "OK", message)
        code, message, _ = self.put("node-a", "reshaped", [6], b"\0" * 12, offset=12, upload=77)
        self.assertEqual(code, "INVALID_ARGUMENT", message)
        self.assertIn("chunk does not match upload 77", message)
        # Through the CLI as well: a file one element over the limit. The registry carries
        # node-a's message limit, so the CLI's chunks fit it from the first one.
        c = self.cluster
        shown = {w["name"]: w for w in self.assert_ok(c.ctl("workers", "list"))["workers"]}
        self.assertEqual(shown["node-a"]["max_message_bytes"], 65536)
        path = c.write("big.f32", "")
        with open(path, "wb") as f:
            f.write(b"\0" * (self.MAX_TENSOR + 4))
        r = c.ctl("tensor", "put", "node-a/cuda:0", "big", "--dtype", "f32", "--file", path)
        self.assert_refused(r, "RESOURCE_EXHAUSTED", "max_tensor_bytes")
        # A message over the worker's limits.max_message_bytes is dropped, nothing else.
        try:
            code, message, _ = self.put("node-a", "huge-chunk", [1 << 16], b"\0" * (1 << 18))
            self.assertNotEqual(code, "OK", "a 256 KiB chunk through a 64 KiB message limit")
        except (RpcError, OSError):
            pass  # dropped: what nng does with an oversized message
        self.assert_serving()

    def test_a_read_in_chunks_never_mixes_two_tensors(self):
        # Each GetTensor chunk looks the name up again: a put between two chunks gave the first
        # from the old tensor and the rest from the new, same layout, and the client took it
        # whole. The first chunk says which tensor it came from (TensorInfo.version), and a
        # later chunk that names it is refused once the name holds another.
        code, message, _ = self.put("node-a", "v", [4], struct.pack("<4f", 1, 2, 3, 4), upload=501)
        self.assertEqual(code, "OK", message)

        def get(offset, version=0):
            body = (pb_bytes(1, device_pb()) + pb_bytes(2, "v") + pb_uint(3, offset)
                    + pb_uint(4, 8) + pb_uint(5, version))
            return self.worker_call("node-a", "GetTensor", body)

        code, message, body = get(0)
        self.assertEqual(code, "OK", message)
        first = pb_decode(pb_decode(body)[1][0])[6][0]
        code, message, _ = self.put("node-a", "v", [4], struct.pack("<4f", 5, 6, 7, 8), upload=502)
        self.assertEqual(code, "OK", message)
        code, message, _ = get(8, first)
        self.assertEqual(code, "ABORTED", message)
        self.assertIn("tensor 'v' was replaced while it was being read; read it again", message)
        code, message, body = get(8)  # without a version, as an older client asks
        self.assertEqual(code, "OK", message)
        self.assertNotEqual(pb_decode(pb_decode(body)[1][0])[6][0], first)
        self.assert_serving()

    def put_whole(self, name, index, value, upload, start=0):
        """A MAX_TENSOR f32 tensor of `value` on node-a/cuda:index, in 32 KiB chunks from
        byte `start` on."""
        chunk = struct.pack("<f", value) * 8192
        for offset in range(start, self.MAX_TENSOR, len(chunk)):
            code, message, _ = self.put("node-a", name, [self.MAX_TENSOR // 4], chunk,
                                        offset=offset, upload=upload, index=index)
            self.assertEqual(code, "OK", message)

    def test_device_memory_bounds_its_tensors(self):
        """A device's `memory` bounds the bytes of its tensors: stored ones, uploads in
        progress and an op's results waiting for Commit. node-a/cuda:4 has 2 MiB: two 1 MiB
        tensors. Past it, RESOURCE_EXHAUSTED naming the device and the key; an op refused
        this way changes nothing; a deleted tensor gives its room back."""
        c = self.cluster
        elements = self.MAX_TENSOR // 4
        self.put_whole("x", 3, 1.0, upload=301)
        self.put_whole("x", 4, 2.0, upload=302)
        # An upload in progress holds its whole tensor from its first chunk.
        code, message, _ = self.put("node-a", "pending", [elements], b"\0" * 32768,
                                    upload=303, index=4)
        self.assertEqual(code, "OK", message)
        code, message, _ = self.put("node-a", "third", [elements], b"\0" * 4096,
                                    upload=304, index=4)
        self.assertEqual(code, "RESOURCE_EXHAUSTED", message)
        self.assertIn("cuda:4", message)
        self.assertIn("devices[].memory", message)
        # The all-reduce's result for cuda:4 has no room: the op fails everywhere.
        r = c.ctl("submit", "--op", "all-reduce", "--reduce", "sum", "--tensor", "x",
                  "--devices", "node-a/cuda:3,node-a/cuda:4")
        self.assertEqual(r.rc, 1, repr(r))
        code, message = self.error_of(r)
        self.assertEqual(code, "RESOURCE_EXHAUSTED", repr(r))
        self.assertIn("devices[].memory", message)
        for index, want in ((3, 1.0), (4, 2.0)):
            got = self.assert_ok(c.ctl("tensor", "get", "node-a/cuda:%d" % index, "x"))
            self.assertEqual(got["shape"], [elements])
            self.assertEqual(set(got["values"]), {want})
        # The upload in progress completes; deleting x gives cuda:4 its room back.
        self.put_whole("pending", 4, 0.0, upload=303, start=32768)
        self.assert_ok(c.ctl("tensor", "delete", "node-a/cuda:4", "x"))
        self.put_whole("third", 4, 3.0, upload=305)
        self.assertEqual(set(self.assert_ok(c.ctl("tensor", "get", "node-a/cuda:4", "third"))
                             ["values"]), {3.0})
        self.assert_serving()

    def test_a_long_listing_comes_in_pages(self):
        """1,500 tensors with 100-byte names on one device: more than one reply of node-a's
        (64 KiB messages) can hold. ListTensors pages them in name order, each page within
        the reply limit; devcoordctl lists them all, sorted, once each."""
        c = self.cluster
        names = ["t%04d-%s" % (i, "x" * 94) for i in range(1500)]
        order = list(range(1500))
        order = order[1::2] + order[::2]  # not put in name order
        with c.connect(c.worker_port("node-a")) as conn:
            for k, i in enumerate(order):
                body = (pb_bytes(1, device_pb(index=2)) + pb_bytes(2, names[i]) + pb_uint(3, 1)
                        + pb_uint(4, 1) + pb_uint(5, 5000 + k) + pb_uint(6, 0))
                header = (pb_uint(1, 10 + k) + pb_bytes(2, WORKER_SERVICE + "PutTensor")
                          + pb_uint(3, 10000))
                code, message, _ = conn.call_raw(frame(header, body, b"\0" * 4), 10 + k)
                self.assertEqual(code, "OK", message)
            # One page by hand: at most page_size, in order, the reply within the limit.
            body = pb_bytes(1, device_pb(index=2)) + pb_uint(2, 1000) + pb_bytes(3, names[9])
            header = (pb_uint(1, 9) + pb_bytes(2, WORKER_SERVICE + "ListTensors")
                      + pb_uint(3, 10000))
            code, message, reply = conn.call_raw(frame(header, body, b""), 9)
            self.assertEqual(code, "OK", message)
            fields = pb_decode(reply)
            listed = [pb_decode(t)[2][0].decode() for t in fields[1]]
            self.assertLess(len(reply), 65536)
            self.assertEqual(listed, names[10:10 + len(listed)])
            self.assertGreater(len(listed), 100)
            self.assertEqual(fields[2], [1])  # more
        out = self.assert_ok(c.ctl("tensor", "list", "node-a/cuda:2"))
        self.assertEqual([t["name"] for t in out["tensors"]], names)

    def test_allocation_failure_is_resource_exhausted(self):
        if "node-m" not in self.cluster.workers:
            self.skipTest("an ASan build cannot run under an address-space limit")
        # 2 GiB: within limits.max_tensor_bytes, over what node-m's allocator can give.
        for attempt in range(3):
            code, message, _ = self.put("node-m", "huge", [1 << 29], b"\0" * 4096,
                                        upload=100 + attempt)
            self.assertEqual(code, "RESOURCE_EXHAUSTED", message)
            self.assertIn("memory", message)
        self.assert_serving()


# ---- TLS --------------------------------------------------------------------------------


class TlsChecks(CtlChecks):
    def assert_tls_refused(self, r, codes=("UNAUTHENTICATED",)):
        """A TLS failure: exit 3 (cannot reach the server), the address in the message."""
        self.assertEqual(r.rc, 3, repr(r))
        code, message = self.error_of(r)
        self.assertIn(code, codes, repr(r))
        self.assertIn("cannot reach", message, repr(r))
        return code, message

    def assert_still_serving(self, what):
        c = self.cluster
        for d in c.all_daemons():
            self.assertTrue(d.running(), "%s died after %s:\n%s" % (d.name, what, d.log_tail()))
        out = self.assert_ok(c.ctl("status"))
        self.assertEqual(out["workers"]["alive"], 2, "after %s: %r" % (what, out))
        for name in ("node-a", "node-b"):
            self.assertEqual(c.registry_workers()[name]["state"], "alive", what)
        got = self.assert_ok(c.ctl("tensor", "list", "node-b/cuda:0", auth="trainer"))
        self.assertIn("tensors", got)

    def all_reduce_works(self):
        c = self.cluster
        values = {"node-a/cuda:0": "1,2", "node-a/cuda:1": "3,4", "node-b/cuda:0": "5,6"}
        for dev, v in values.items():
            self.assert_ok(c.ctl("tensor", "put", dev, "g", "--dtype", "i32", "--values", v,
                                 auth="trainer"))
        out = self.assert_ok(c.ctl("submit", "--op", "all-reduce", "--reduce", "sum", "--tensor",
                                   "g", "--devices", ALL_REDUCE_DEVICES, auth="trainer"))
        self.assertEqual(out["status"], "OK", out)
        for dev in values:
            got = self.assert_ok(c.ctl("tensor", "get", dev, "g", auth="trainer"))
            self.assertEqual(got["values"], [9, 12], dev)


    def group_all_reduce_works(self):
        """Three ranks of a group on both workers: their bytes cross between the workers on
        the data link, on tls+tcp:// like the RPC address (issue 17)."""
        c = self.cluster
        values = {"node-a/cuda:0": "1,2", "node-a/cuda:1": "3,4", "node-b/cuda:0": "5,6"}
        with ThreadPoolExecutor(len(values)) as ex:
            runs = [ex.submit(c.ctl, "collective", "all-reduce", "--devices", ALL_REDUCE_DEVICES,
                              "--self", dev, "--dtype", "i32", "--values", v, "--reduce", "sum",
                              auth="trainer", timeout=60)
                    for dev, v in values.items()]
            for r in runs:
                self.assertEqual(self.assert_ok(r.result())["values"], [9, 12])
        for name in ("node-a", "node-b"):
            self.assertIn("data link listening on tls+tcp://", c.worker(name).log_text())


class TlsTest(TlsChecks, SecureTestCase):
    """Coordinator and workers on tls+tcp:// with tokens on (as the compose deployment)."""

    def setUp(self):
        self.cluster = start_auth_cluster(self, tls=True)

    def test_group_all_reduce_over_the_tls_data_link(self):
        self.group_all_reduce_works()

    def test_registration_all_reduce_and_tensors_over_tls(self):
        c = self.cluster
        workers = c.registry_workers()
        for name in ("node-a", "node-b"):
            self.assertTrue(workers[name]["address"].startswith("tls+tcp://127.0.0.1:"),
                            workers[name])
        self.all_reduce_works()

    def test_wrong_ca_fails_cleanly(self):
        c = self.cluster
        for args in (("status",), ("workers", "list")):
            r = c.ctl("--tls-ca", c.pki.other_ca, *args, tls=False)
            code, message = self.assert_tls_refused(r)
            self.assertIn(c.addr, message)
            self.assertIn("Cryptographic error", message)
        # The same through $DEVCOORD_TLS_CA.
        r = c.ctl("status", tls=False, env={"DEVCOORD_TLS_CA": c.pki.other_ca})
        self.assert_tls_refused(r)
        r = c.ctl("status", tls=False, env={"DEVCOORD_TLS_CA": c.pki.ca})
        self.assert_ok(r)
        # A client trusting another CA, straight at a worker's data port.
        raw = socket.create_connection((harness.HOST, c.worker_port("node-a")), 5)
        try:
            with self.assertRaises(ssl.SSLError):
                c.pki.ssl_context(ca=c.pki.other_ca).wrap_socket(raw)
        finally:
            raw.close()
        self.assert_still_serving("handshakes with the wrong CA")

    def test_no_ca_is_a_usage_error(self):
        r = self.cluster.ctl("status", tls=False)
        self.assertEqual(r.rc, 2, repr(r))
        self.assertIn("CA", r.err)

    def test_plain_tcp_client_against_the_tls_listener(self):
        c = self.cluster
        for port in (c.port, c.worker_port("node-a")):
            r = c.ctl("status", server="tcp://127.0.0.1:%d" % port)
            self.assertEqual(r.rc, 3, repr(r))
            code, message = self.error_of(r)
            self.assertIn(code, ("UNAVAILABLE", "UNAUTHENTICATED"), repr(r))
            self.assertIn("cannot reach", message)
            # The raw SP handshake in clear text gets no SP greeting back.
            with socket.create_connection((harness.HOST, port), timeout=5) as s:
                s.settimeout(5)
                try:
                    s.sendall(harness.sp_greeting(harness.SP_REQ0))
                    reply = s.recv(8)
                except (OSError, socket.timeout):
                    reply = b""
                self.assertNotEqual(reply, harness.sp_greeting(harness.SP_REP0),
                                    "an SP greeting over plain TCP from a TLS listener")
            # Nor do a few KiB of junk in place of a ClientHello upset it.
            with socket.create_connection((harness.HOST, port), timeout=5) as s:
                try:
                    s.sendall(os.urandom(4096))
                    s.settimeout(5)
                    while s.recv(4096):
                        pass
                except (OSError, socket.timeout):
                    pass
        self.assert_still_serving("plain TCP clients")
        self.all_reduce_works()


class TlsHandshakeTest(TlsChecks, SecureTestCase):
    """Issue 12: a TLS handshake that stalls is ended (nng 1.5.2 holds it forever: its
    handshake timeout cancels a send while the handshake waits on a receive)."""

    LIMIT_MS = 1000

    def setUp(self):
        limits = {"limits": {"handshake_timeout_ms": self.LIMIT_MS}}
        c = self.cluster = self.make_secure_cluster(auth=True, tls=True,
                                                    coordinator_config=limits)
        c.start_coordinator()
        c.add_worker("node-a", NODE_A, extra=limits)
        c.add_worker("node-b", NODE_B, token=c.tokens.extra_workers[0])
        c.wait_workers(["node-a", "node-b"])

    def test_stalled_handshakes_are_closed(self):
        c = self.cluster
        stalls = []
        # The worker's data link (issue 17) listens on tls+tcp:// too, on a port of its own,
        # opened by the first group.
        self.group_all_reduce_works()
        m = re.search(r"data link listening on \S+ \(advertised as tls\+tcp://[^:]+:(\d+)\)",
                      c.worker("node-a").log_text())
        self.assertIsNotNone(m, "no data link in the worker's log")
        for port in (c.port, c.worker_port("node-a"), int(m.group(1))):
            for first in (b"", bytes.fromhex("1603010200010001fc0303")):  # half a ClientHello
                s = socket.create_connection((harness.HOST, port), timeout=5)
                if first:
                    s.sendall(first)
                stalls.append(s)
        # Meanwhile a real client gets through.
        self.all_reduce_works()
        for s in stalls:
            # Closed by the daemon well before this generous bound (the limit is 1 s); the
            # bug held them for good.
            s.settimeout(self.LIMIT_MS / 1000.0 * 10 + SLACK_S)
            try:
                got = s.recv(4096)
            except ConnectionResetError:
                got = b""
            except socket.timeout:
                self.fail("a stalled TLS handshake on port %d was still open" %
                          s.getpeername()[1])
            finally:
                s.close()
            self.assertEqual(got, b"", "the daemon answered a stalled handshake")
        for d in (c.coordinator, c.worker("node-a")):
            self.assertIn("did not finish its TLS handshake", d.log_text())
        self.assertIn("data link: refused a connection", c.worker("node-a").log_text())
        self.assert_still_serving("stalled handshakes")
        self.all_reduce_works()


    def test_a_tls_data_link_peer_that_trickles_or_stalls_is_dropped(self):
        """On a tls+tcp:// data link (an nng stream, not a plain socket) a HELLO gets the
        handshake bound for all of it however its bytes are spread, and a frame's payload
        the bound plus a millisecond per KB once its header came."""
        c = self.cluster
        self.group_all_reduce_works()  # opens node-a's data link
        code, message, body = c.rpc("GroupLink", port=c.worker_port("node-a"),
                                    token=c.tokens.by_role["worker"], service=WORKER_SERVICE)
        self.assertEqual(code, "OK", message)
        fields = pb_decode(body)
        data_port, secret = int(fields[1][0].decode().rsplit(":", 1)[1]), fields[2][0]
        hello = harness.dlink_header(1, 32) + secret

        def closed_within(s, wait):
            s.settimeout(wait)
            try:
                return s.recv(4096) == b""
            except (ConnectionResetError, ssl.SSLError):
                return True
            except socket.timeout:
                return False

        # A HELLO one byte every 100 ms (8.8 s in all): closed while bytes are still to come
        # (before the whole-call bound, each byte restarted it).
        s = c.pki.ssl_context().wrap_socket(
            socket.create_connection((harness.HOST, data_port), timeout=5))
        try:
            sent = 0
            for b in hello:
                try:
                    s.sendall(bytes([b]))
                except OSError:
                    break
                sent += 1
                if closed_within(s, 0.1):
                    break
            self.assertLess(sent, len(hello), "a trickled HELLO was taken")
        finally:
            s.close()
        # A whole HELLO, then a frame announcing 64 KiB that sends 1 KiB and stops: dropped
        # (before, its reader waited for the rest for good).
        s = c.pki.ssl_context().wrap_socket(
            socket.create_connection((harness.HOST, data_port), timeout=5))
        try:
            s.sendall(hello + harness.dlink_header(2, 64 << 10, total=64 << 10) + b"\0" * 1024)
            self.assertTrue(closed_within(s, self.LIMIT_MS / 1000.0 * 10 + SLACK_S),
                            "a frame stalled mid-payload kept its TLS data link")
        finally:
            s.close()
        harness.wait_until(lambda: "did not come whole within" in c.worker("node-a").log_text(),
                           10, "the worker to log the stalled frame")
        self.assert_still_serving("data link peers that trickle or stall")
        self.group_all_reduce_works()


class ClientCertTest(TlsChecks, SecureTestCase):
    """require_client_cert on both daemons: the daemons' own calls present their certificate,
    and a client must present one signed by the CA."""

    def setUp(self):
        self.cluster = start_auth_cluster(self, tls=True, require_client_cert=True)

    def test_group_all_reduce_over_the_tls_data_link(self):
        self.group_all_reduce_works()

    def test_client_certificates(self):
        c = self.cluster
        bare = ("--tls-ca", c.pki.ca)
        with self.subTest("no client certificate"):
            self.assert_tls_refused(c.ctl(*bare, "status", tls=False),
                                    ("UNAUTHENTICATED", "UNAVAILABLE"))
        with self.subTest("a certificate from another CA"):
            r = c.ctl(*bare, "--tls-cert", c.pki.other_client, "--tls-key",
                      c.pki.other_client_key, "status", tls=False)
            self.assert_tls_refused(r, ("UNAUTHENTICATED", "UNAVAILABLE"))
        with self.subTest("a worker's data port without a client certificate"):
            ctx = c.pki.ssl_context()
            with self.assertRaises((ssl.SSLError, RpcError, OSError)):
                with TokenRpcConnection(c.worker_port("node-a"), c.tokens.by_role["trainer"],
                                        ctx, 5) as conn:
                    conn.call(WORKER_SERVICE + "ListTensors", pb_bytes(1, device_pb()))
        with self.subTest("with the client certificate"):
            out = self.assert_ok(c.ctl("status"))
            self.assertEqual(out["workers"]["alive"], 2, out)
        self.assert_still_serving("refused client certificates")
        self.all_reduce_works()


if __name__ == "__main__":
    unittest.main()
