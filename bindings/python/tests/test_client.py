"""devcoord (Python) against real daemons: registry, tensors of every dtype, ops, refusals and
auth. The daemons come from tests/integration/harness.py and secutil.py (imported by path);
the library from $DEVCOORD_LIB (set by CTest), else build/client/libdevcoord.so.

    DEVCOORD_LIB=build/client/libdevcoord.so /usr/bin/python3 -m unittest -v \
        discover -s bindings/python/tests
"""

import array
import os
import socket
import sys
import threading
import time
import unittest
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, os.path.join(REPO, "tests", "integration"))
sys.path.insert(0, os.path.dirname(HERE))
os.environ.setdefault("DEVCOORD_LIB", os.path.join(
    os.environ.get("DEVCOORD_BUILD_DIR", os.path.join(REPO, "build")), "client", "libdevcoord.so"))

import harness  # noqa: E402
import secutil  # noqa: E402

import devcoord  # noqa: E402

try:
    import numpy
except ImportError:
    numpy = None

A, B = "node-a/cuda:0", "node-b/cuda:0"


def start_cluster(cluster, tc, http=False):
    """Coordinator and workers node-a, node-b (cuda:0 and cuda:1 each) on `cluster`, closed
    at the end of the test class `tc`. http: each worker serves /metrics on a port of its
    own, cluster.worker_http[name]."""
    tc.addClassCleanup(cluster.close)
    cluster.start_coordinator()
    cluster.worker_http = {}
    for name in ("node-a", "node-b"):
        extra = None
        if http:
            cluster.worker_http[name] = harness.free_port()
            extra = {"http": "127.0.0.1:%d" % cluster.worker_http[name]}
        cluster.add_worker(name, [{"device": "cuda:0", "memory": "8GiB"},
                                  {"device": "cuda:1", "memory": "8GiB"}],
                           labels={"rack": name[-1]}, extra=extra)
    cluster.wait_workers(["node-a", "node-b"])
    return cluster


def run_ranks(addr, devices, fn, selves=None, **client_kw):
    """Runs fn(group) in one thread per rank (each with its own Client, made with client_kw,
    and Group of `devices`); returns {self device: fn's result or the exception it raised}."""
    out = {}

    def rank(me):
        try:
            with devcoord.Client(addr, timeout_ms=30000, **client_kw) as c:
                with devcoord.Group(c, devices, me, timeout_ms=20000,
                                    call_timeout_ms=10000) as g:
                    out[me] = fn(g)
        except Exception as e:  # reported to the test
            out[me] = e

    threads = [threading.Thread(target=rank, args=(me,)) for me in (selves or devices)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    return out


class ClientTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cluster = start_cluster(harness.Cluster(heartbeat_ms=500, dead_after_ms=5000), cls)
        cls.client = devcoord.Client(cls.cluster.addr, timeout_ms=20000)
        cls.addClassCleanup(cls.client.close)

    def test_workers_and_devices(self):
        workers = {w.name: w for w in self.client.workers()}
        self.assertEqual(sorted(workers), ["node-a", "node-b"])
        self.assertEqual(workers["node-a"].state, "alive")
        self.assertEqual(workers["node-a"].device_count, 2)
        self.assertEqual(workers["node-b"].labels, {"rack": "b"})
        devices = self.client.devices()
        self.assertEqual([d.name for d in devices],
                         ["node-a/cuda:0", "node-a/cuda:1", "node-b/cuda:0", "node-b/cuda:1"])
        self.assertEqual((devices[1].backend, devices[1].index, devices[1].device,
                          devices[1].state, devices[1].memory_bytes),
                         ("cuda", 1, "cuda:1", "healthy", 8 << 30))
        self.assertEqual([d.name for d in self.client.devices(worker="node-b")],
                         ["node-b/cuda:0", "node-b/cuda:1"])
        self.assertEqual(self.client.devices(backend="rocm"), [])
        self.assertEqual([d.name for d in self.client.devices(label="rack=a")],
                         ["node-a/cuda:0", "node-a/cuda:1"])
        self.assertEqual(self.client.devices(label="rack=z"), [])
        self.assertEqual(self.client.device("node-b/cuda:1").worker, "node-b")
        status = self.client.cluster_status()
        self.assertEqual((status.workers_alive, status.devices_by_backend["cuda"], status.ready),
                         (2, 4, True))
        self.assertTrue(self.client.health())

    def test_put_refuses_what_it_would_store_wrong(self):
        """put refuses, with devcoord.InvalidArgument, what it cannot store as given: a typed
        buffer whose elements are not the dtype= asked for (its bytes would be read as the
        other type's), a buffer in the other byte order, values a list cannot hold as that
        dtype, an object that is no buffer. A numpy array in the other byte order is
        converted; a 0-d one keeps its shape (); an int shape is one dimension."""
        import ctypes
        bad = [lambda: self.client.put(A, "x", array.array("f", [1.0, 2.0]), dtype="f64"),
               lambda: self.client.put(A, "x", array.array("i", [1, 2]), dtype="f32"),
               lambda: self.client.put(A, "x", (ctypes.c_float.__ctype_be__ * 2)(1.0, 2.0)),
               lambda: self.client.put(A, "x", [2 ** 40], dtype="i32"),
               lambda: self.client.put(A, "x", [1.5], dtype="i32"),
               lambda: self.client.put(A, "x", ["a"]),
               lambda: self.client.put(A, "x", 7)]
        for i, call in enumerate(bad):
            with self.subTest(case=i):
                with self.assertRaises(devcoord.InvalidArgument):
                    call()
        self.client.put(A, "int-shape", [1.0, 2.0, 3.0], shape=3)
        self.assertEqual({t.name: t.shape for t in self.client.tensors(A)}["int-shape"], [3])
        if numpy is not None:
            self.client.put(A, "be", numpy.array([1.0, 2.0, 3.0], dtype=">f4"))
            self.assertEqual(self.client.get(A, "be").tolist(), [1.0, 2.0, 3.0])
            self.client.put(A, "scalar", numpy.array(2.5, dtype=numpy.float64))
            got = self.client.get(A, "scalar", numpy=True)
            self.assertEqual((got.shape, float(got)), ((), 2.5))

    def test_put_get_every_dtype(self):
        cases = {"f32": [1.5, -2.25, 3.0e10], "f64": [1.0 / 3, -1e300, 0.0],
                 "i32": [-(2 ** 31), 2 ** 31 - 1, 7], "i64": [-(2 ** 63), 2 ** 63 - 1, 7]}
        for dt, values in cases.items():
            with self.subTest(dtype=dt):
                self.client.put(A, "rt-" + dt, values, dtype=dt)
                got = self.client.get(A, "rt-" + dt)
                self.assertEqual(got.typecode, devcoord.DTYPES[dt].typecode)
                self.assertEqual(got.tolist(), array.array(got.typecode, values).tolist())
        listed = {t.name: t for t in self.client.tensors(A)}
        self.assertEqual((listed["rt-i64"].dtype, listed["rt-i64"].shape,
                          listed["rt-i64"].size_bytes), ("i64", [3], 24))
        # buffers: array.array keeps its dtype; a 2-D memoryview keeps its shape
        self.client.put(A, "buf", array.array("d", range(6)))
        self.assertEqual(self.client.get(A, "buf").tolist(), [0.0, 1.0, 2.0, 3.0, 4.0, 5.0])
        m = memoryview(bytearray(array.array("i", range(6)).tobytes())).cast("B").cast(
            "i", [2, 3])
        self.client.put(A, "mat", m)
        listed = {t.name: t for t in self.client.tensors(A)}
        self.assertEqual((listed["mat"].dtype, listed["mat"].shape), ("i32", [2, 3]))
        # shape= given: stored with that shape, the elements as they were
        self.client.put(A, "shaped", [1, 2, 3, 4, 5, 6], dtype="i64", shape=[3, 2])
        listed = {t.name: t for t in self.client.tensors(A)}
        self.assertEqual((listed["shaped"].dtype, listed["shaped"].shape), ("i64", [3, 2]))
        self.assertEqual(self.client.get(A, "shaped").tolist(), [1, 2, 3, 4, 5, 6])
        self.client.put(A, "raw", bytes(array.array("f", [9.0, 8.0])), dtype="f32")
        self.assertEqual(self.client.get(A, "raw").tolist(), [9.0, 8.0])
        self.client.delete(A, "raw")
        with self.assertRaises(devcoord.NotFound):
            self.client.get(A, "raw")

    @unittest.skipIf(numpy is None, "numpy is not installed")
    def test_numpy(self):
        for dt in ("float32", "float64", "int32", "int64"):
            with self.subTest(dtype=dt):
                x = numpy.arange(12, dtype=dt).reshape(3, 4) - 5
                self.client.put(A, "np", x)
                y = self.client.get(A, "np", numpy=True)
                self.assertEqual((y.dtype, y.shape), (x.dtype, (3, 4)))
                self.assertTrue((x == y).all())
        # not contiguous (made contiguous in C), read-only, and converted by dtype=
        x = numpy.arange(12, dtype="float64").reshape(3, 4).T
        x.flags.writeable = False
        self.client.put(A, "npt", x, dtype="f32")
        y = self.client.get(A, "npt", numpy=True)
        self.assertEqual((y.dtype, y.shape), (numpy.float32, (4, 3)))
        self.assertTrue((y == x).all())
        self.assertEqual(self.client.get(A, "npt").tolist(), x.ravel().tolist())
        with self.assertRaises(devcoord.InvalidArgument):  # bf16 comes as bit patterns
            self.client.put(A, "b", numpy.ones(3, dtype=numpy.float32), dtype="bf16")

    @unittest.skipIf(numpy is None, "numpy is not installed")
    def test_f16(self):
        """f16 round trips where the C library has it (DC_DTYPE_F16 = 5); before that the
        library refuses it with InvalidArgument, and the package passes that on."""
        from devcoord._lib import lib
        x = numpy.array([1.5, -2.0, 65504.0], dtype=numpy.float16)
        if lib.dc_dtype_size(5) == 2:
            self.client.put(A, "h", x)
            self.assertTrue((self.client.get(A, "h", numpy=True) == x).all())
            self.assertEqual(self.client.get(A, "h").tolist(), x.view(numpy.uint16).tolist())
        else:
            with self.assertRaises(devcoord.InvalidArgument):
                self.client.put(A, "h", x)

    def test_all_reduce(self):
        self.client.put(A, "g", [1.0, 2.0, 3.0])
        self.client.put(B, "g", [10.0, 20.0, 30.0])
        op = self.client.submit("all-reduce", [A, B], "g", reduce="sum")
        self.assertEqual((op.kind, op.reduce, op.state, op.code), ("all-reduce", "sum", "done",
                                                                   "OK"))
        self.assertEqual(op.devices, [A, B])
        self.assertEqual(sorted(p.name for p in op.plan), ["node-a", "node-b"])
        for dev in (A, B):
            self.assertEqual(self.client.get(dev, "g").tolist(), [11.0, 22.0, 33.0])
        self.assertEqual(self.client.get_op(op.op_id).state, "done")
        self.assertIn(op.op_id, [o.op_id for o in self.client.list_ops()])
        # plan(): the same op checked and planned, not run: no worker answered, the tensors
        # are as the all-reduce left them
        plan = self.client.plan("all-reduce", [A, B], "g", reduce="sum")
        self.assertEqual((plan.devices, plan.results), ([A, B], []))
        self.assertNotEqual(plan.state, "done")
        for dev in (A, B):
            self.assertEqual(self.client.get(dev, "g").tolist(), [11.0, 22.0, 33.0])

    def test_rooted_ops_output_tensor_and_list_limit(self):
        """submit passes root (broadcast from rank 1; reduce into rank 1 only) and
        output_tensor (all-gather's output under that name, Op.tensor / Op.output_tensor
        each the right one), and list_ops(limit) returns that many, newest first."""
        self.client.put(A, "bc", [1.0, 2.0])
        self.client.put(B, "bc", [3.0, 4.0])
        op = self.client.submit("broadcast", [A, B], "bc", root=1)
        self.assertEqual((op.kind, op.root, op.state), ("broadcast", 1, "done"))
        for dev in (A, B):
            self.assertEqual(self.client.get(dev, "bc").tolist(), [3.0, 4.0])
        self.client.put(A, "rd", [1.0, 2.0])
        self.client.put(B, "rd", [3.0, 4.0])
        reduced = self.client.submit("reduce", [A, B], "rd", reduce="sum", root=1)
        self.assertEqual((reduced.reduce, reduced.root), ("sum", 1))
        self.assertEqual(self.client.get(B, "rd").tolist(), [4.0, 6.0])
        self.assertEqual(self.client.get(A, "rd").tolist(), [1.0, 2.0])  # not the root
        self.client.put(A, "ag", [1.0, 2.0])
        self.client.put(B, "ag", [3.0, 4.0])
        gathered = self.client.submit("all-gather", [A, B], "ag", output_tensor="ag-out")
        self.assertEqual((gathered.tensor, gathered.output_tensor), ("ag", "ag-out"))
        self.assertEqual(self.client.get_op(gathered.op_id).output_tensor, "ag-out")
        for dev, mine in ((A, [1.0, 2.0]), (B, [3.0, 4.0])):
            self.assertEqual(self.client.get(dev, "ag-out").tolist(), [1.0, 2.0, 3.0, 4.0])
            self.assertEqual(self.client.get(dev, "ag").tolist(), mine)  # the input, as it was
        self.assertEqual([o.op_id for o in self.client.list_ops(limit=2)],
                         [gathered.op_id, reduced.op_id])
        self.assertEqual([o.op_id for o in self.client.list_ops(1)], [gathered.op_id])

    def test_plan_refuses_nested_autodiff(self):
        plan = self.client.plan("all-reduce", ["node-a/autodiff(cuda:0)",
                                               "node-b/autodiff(cuda:0)"], "g", reduce="sum")
        self.assertEqual(plan.devices, [A, B])
        self.assertEqual(sorted(p.name for p in plan.plan), ["node-a", "node-b"])
        with self.assertRaises(devcoord.InvalidArgument) as cm:
            self.client.plan("all-reduce", ["node-a/autodiff(autodiff(cuda:0))"], "g",
                             reduce="sum")
        e = cm.exception
        self.assertEqual(e.code, "INVALID_ARGUMENT")
        self.assertTrue(e.message.startswith("autodiff should not wrap an autodiff device"),
                        e.message)
        self.assertIn("node-a/autodiff(autodiff(cuda:0))", e.message)
        self.assertEqual(e.device_index, 0)
        self.assertFalse(e.transport)
        self.assertTrue(str(e).startswith("INVALID_ARGUMENT: autodiff should not"), str(e))

    def test_not_found(self):
        with self.assertRaises(devcoord.NotFound) as cm:
            self.client.get(A, "no-such-tensor")
        self.assertEqual(cm.exception.code, "NOT_FOUND")
        self.assertIn("no-such-tensor", cm.exception.message)
        with self.assertRaises(devcoord.NotFound):
            self.client.submit("all-reduce", ["node-z/cuda:0"], "g", reduce="sum")
        with self.assertRaises(devcoord.NotFound):
            self.client.device("node-a/cuda:7")

    def test_cordon_uncordon(self):
        self.assertEqual(self.client.cordon("node-b").state, "cordoned")
        try:
            with self.assertRaises(devcoord.Error) as cm:
                self.client.submit("all-reduce", [A, B], "g", reduce="sum")
            self.assertEqual(cm.exception.code, "FAILED_PRECONDITION")
            self.assertIn("cordoned", cm.exception.message)
            refused = cm.exception.op  # the coordinator answered: its Op is on the error
            self.assertIsNotNone(refused)
            self.assertEqual((refused.kind, refused.tensor, refused.state, refused.code),
                             ("all-reduce", "g", "failed", "FAILED_PRECONDITION"))
            self.assertEqual(refused.message, cm.exception.message)
        finally:
            self.assertEqual(self.client.uncordon("node-b").state, "alive")
        self.assertEqual(self.client.drain("node-b").state, "draining")
        try:
            self.assertEqual(self.client.cluster_status().workers_draining, 1)
            with self.assertRaises(devcoord.Error) as cm:
                self.client.submit("all-reduce", [A, B], "g", reduce="sum")
            self.assertIn("draining", cm.exception.message)
        finally:
            self.assertEqual(self.client.uncordon("node-b").state, "alive")

    def test_local_errors(self):
        with self.assertRaises(devcoord.InvalidArgument):
            self.client.submit("all-reduce", ["cuda:("], "g", reduce="sum")
        with self.assertRaises(devcoord.InvalidArgument) as cm:
            self.client.put(A, "x", [1.0], dtype="f128")
        self.assertIsInstance(cm.exception, ValueError)
        self.assertIn("f128", cm.exception.message)
        with self.assertRaises(devcoord.InvalidArgument):
            self.client.put(A, "x", [1.0], dtype="bf16")  # 16-bit patterns come as buffers
        with self.assertRaises(devcoord.InvalidArgument):
            self.client.submit("all-reduce", [A, B], "g", reduce="average")
        self.assertEqual(devcoord.dtype("bf16").number, 6)
        self.assertEqual(devcoord.dtype("f16").size, 2)


def call_link_metrics(http):
    """The coordinator's call link counts from its /metrics on port http: calls on the link,
    and SubmitOp and CallLink answered OK (on the link or as RPCs)."""
    with urllib.request.urlopen("http://%s:%d/metrics" % (harness.HOST, http),
                                timeout=10) as f:
        text = f.read().decode()
    ok = 'devcoord_rpc_requests_total{service="Coordinator",method="%s",code="OK"} '
    m = {"link": None, "submits": 0.0, "asks": 0.0}
    for line in text.splitlines():
        if line.startswith("devcoord_call_link_calls_total "):
            m["link"] = float(line.split()[1])
        elif line.startswith(ok % "SubmitOp"):
            m["submits"] = float(line.split()[1])
        elif line.startswith(ok % "CallLink"):
            m["asks"] = float(line.split()[1])
    return m


class CallLinkTest(unittest.TestCase):
    """SubmitOp on the coordinator's call link (README "SubmitOp on the call link"): a handle's
    SubmitOps after its first go as frames on a raw connection to the coordinator and are
    served like RPCs (counted with them); a link the coordinator dropped by restarting is
    found dead and opened again without failing an op; with the link off every op is an
    RPC."""

    def start(self, **config):
        self.http = harness.free_port()
        config["http"] = "%s:%d" % (harness.HOST, self.http)
        cluster = start_cluster(harness.Cluster(heartbeat_ms=200, dead_after_ms=2000,
                                                coordinator_config=config), self)
        self.addCleanup(cluster.close)
        client = devcoord.Client(cluster.addr, timeout_ms=20000)
        self.addCleanup(client.close)
        client.put(A, "cl", [1.0, 2.0])
        client.put(B, "cl", [3.0, 4.0])
        self.expect = [2.0, 3.0]  # half the first sum: each op doubles it
        return cluster, client

    def metrics(self):
        return call_link_metrics(self.http)

    def all_reduce(self, client):
        """One all-reduce of the two tensors (each op doubles them), checked on both."""
        op = client.submit("all-reduce", [A, B], "cl", reduce="sum")
        self.assertEqual((op.state, op.code), ("done", "OK"))
        self.expect = [2 * v for v in self.expect]
        for dev in (A, B):
            self.assertEqual(client.get(dev, "cl").tolist(), self.expect)

    def test_ops_after_the_first_go_on_the_link_and_survive_a_restart(self):
        port = harness.free_port()
        cluster, client = self.start(call_link={"port": port})
        for _ in range(5):
            self.all_reduce(client)
        # The first op went as an RPC (a one-shot client never opens the link). The second
        # asked where the link is (CallLink as an RPC), dialed it and made a CallLink on it
        # first, then it and the others went on it: five calls on the link, on the
        # configured port, every one in the RPC counts too.
        self.assertEqual(self.metrics(), {"link": 5.0, "submits": 5.0, "asks": 2.0})
        socket.create_connection((harness.HOST, port), timeout=5).close()
        # SIGKILL: the link's connection dies with the process. The client finds it dead
        # before its next op and asks the new coordinator again; no op fails for it.
        cluster.restart_coordinator()
        cluster.wait_workers(["node-a", "node-b"])
        deadline = time.monotonic() + 20
        while self.metrics()["link"] < 3:
            self.assertLess(time.monotonic(), deadline, self.metrics())
            self.all_reduce(client)
        # The new coordinator was asked where its link is (by RPC, then on the link) and
        # took ops on it; each call on the link was a SubmitOp or such a CallLink.
        m = self.metrics()
        self.assertGreaterEqual(m["asks"], 2, m)
        self.assertLessEqual(m["link"], m["submits"] + m["asks"], m)

    def test_with_the_link_off_every_op_is_an_rpc(self):
        cluster, client = self.start(call_link={"enabled": False})
        for _ in range(3):
            self.all_reduce(client)
        # The client asked once, heard port 0, and never again.
        self.assertEqual(self.metrics(), {"link": 0.0, "submits": 3.0, "asks": 1.0})


class UnreachableTest(unittest.TestCase):
    def test_dead_address(self):
        dead = harness.DeadPort()  # nothing listens there
        self.addCleanup(dead.close)
        with self.assertRaises(devcoord.Unavailable) as cm:
            devcoord.Client(dead.addr, fail_fast=True)
        self.assertTrue(cm.exception.transport)
        with devcoord.Client(dead.addr, timeout_ms=300) as c:
            with self.assertRaises(devcoord.Error) as cm:
                c.workers()
            self.assertIn(cm.exception.code, ("UNAVAILABLE", "DEADLINE_EXCEEDED"))
            self.assertTrue(cm.exception.transport)
        with self.assertRaises(devcoord.FailedPrecondition):
            c.workers()  # closed


class SecureTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.http = harness.free_port()
        cls.cluster = start_cluster(secutil.SecureCluster(
            auth=True, heartbeat_ms=500, dead_after_ms=5000,
            coordinator_config={"http": "%s:%d" % (harness.HOST, cls.http)}), cls)

    def test_token(self):
        tokens = self.cluster.tokens
        with devcoord.Client(self.cluster.addr, token=tokens.by_role["trainer"]) as c:
            self.assertEqual(sorted(w.name for w in c.workers()), ["node-a", "node-b"])
            c.put(A, "t", [1.0, 2.0])
            c.put(B, "t", [3.0, 4.0])
            c.submit("all-reduce", [A, B], "t", reduce="max")
            self.assertEqual(c.get(B, "t").tolist(), [3.0, 4.0])
            self.assertEqual(c.get(A, "t").tolist(), [3.0, 4.0])
            # The handle's second op goes on the coordinator's call link: its frame carries
            # the token, checked as an RPC's would be.
            c.put(A, "t", [5.0, 1.0])
            c.submit("all-reduce", [A, B], "t", reduce="max")
            self.assertEqual(c.get(B, "t").tolist(), [5.0, 4.0])
            self.assertEqual(call_link_metrics(self.http),
                             {"link": 2.0, "submits": 2.0, "asks": 2.0})
        with devcoord.Client(self.cluster.addr, token=tokens.unknown) as c:
            with self.assertRaises(devcoord.Unauthenticated):
                c.workers()
        with devcoord.Client(self.cluster.addr, token_file=tokens.files["trainer"]) as c:
            self.assertEqual(len(c.devices()), 4)


class TlsTest(unittest.TestCase):
    """tls+tcp:// with a client certificate the daemons require: the TLS options reach the
    library (coordinator and, for tensors, the workers)."""

    @classmethod
    def setUpClass(cls):
        cls.cluster = start_cluster(secutil.SecureCluster(tls=True, require_client_cert=True,
                                                          heartbeat_ms=500,
                                                          dead_after_ms=5000), cls, http=True)

    @unittest.skipIf(numpy is None, "numpy is not installed")
    def test_group_memory_is_shared_behind_tls(self):
        # A rank whose worker is on this host shares Group.alloc memory with it on
        # tls+tcp:// as on tcp://: the 4 MiB go round the ring between the workers (on TLS)
        # and never over a rank's call link.
        pki = self.cluster.pki

        def carried():  # bytes the ranks' calls carried to the workers on their call links
            return sum(harness.metrics(p)["devcoord_group_call_bytes_received_total"]
                       for p in self.cluster.worker_http.values())

        before = carried()

        def fn(g):
            x = g.alloc(1 << 20, "f32")
            x[:] = g.rank + 1
            g.all_reduce(x, "sum")
            return g.shared(x), bool((x == 3).all())

        out = run_ranks(self.cluster.addr, [A, B], fn, tls_ca=pki.ca, tls_cert=pki.client,
                        tls_key=pki.client_key)
        for me in (A, B):
            self.assertEqual(out.get(me), (True, True), me)
        # The group's own small calls carry a few bytes; the 8 MiB of the ranks' blocks none.
        self.assertLess(carried() - before, 4096)

    def test_tls(self):
        pki = self.cluster.pki
        self.assertTrue(self.cluster.addr.startswith("tls+tcp://"))
        with devcoord.Client(self.cluster.addr, tls_ca=pki.ca, tls_cert=pki.client,
                             tls_key=pki.client_key) as c:
            self.assertEqual(len(c.workers()), 2)
            c.put(A, "t", array.array("q", [5, -6]))
            self.assertEqual(c.get(A, "t").tolist(), [5, -6])
        with devcoord.Client(self.cluster.addr, tls_ca=pki.other_ca, tls_cert=pki.client,
                             tls_key=pki.client_key, timeout_ms=2000) as c:
            with self.assertRaises(devcoord.Error) as cm:
                c.workers()  # the servers' certificate does not verify against this CA
            self.assertTrue(cm.exception.transport, cm.exception)


if __name__ == "__main__":
    unittest.main()
