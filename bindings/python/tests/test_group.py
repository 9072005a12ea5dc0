"""devcoord.Group against real daemons: ranks as threads of this process and as separate
processes, every call, f16 through numpy, a mismatch naming the rank, async calls, and CPU
torch tensors in place (skipped only when torch is not importable)."""

import array
import ctypes
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import traceback
import unittest

from test_client import HERE, REPO, run_ranks, start_cluster

import harness

import devcoord

try:
    import numpy
except ImportError:
    numpy = None
try:
    import torch
except ImportError:
    torch = None

A0, A1, B0 = "node-a/cuda:0", "node-a/cuda:1", "node-b/cuda:0"


class GradBucket:
    """What DDP hands its communication hook (torch.distributed.GradBucket), as far as
    devcoord.torch uses it."""

    def __init__(self, index, last, t, params=()):
        self.i, self.last, self.t, self.params = index, last, t, list(params)

    def index(self):
        return self.i

    def is_last(self):
        return self.last

    def buffer(self):
        return self.t

    def parameters(self):
        return self.params


# One rank as its own process: joins, all-reduces [rank+1, 10*(rank+1), -rank] (i64 then
# f32 numpy when present), prints the results as JSON.
RANK_SCRIPT = r"""
import array, json, os, sys
import devcoord
devices, me = sys.argv[1].split(","), sys.argv[2]
with devcoord.Client(os.environ["DEVCOORD_ADDR"], timeout_ms=30000) as c:
    with devcoord.Group(c, devices, me, timeout_ms=20000) as g:
        r = g.rank
        a = array.array("q", [r + 1, 10 * (r + 1), -r])
        g.all_reduce(a, "sum")
        res = {"rank": r, "size": g.size, "id": g.group_id, "i64": a.tolist()}
        try:
            import numpy
        except ImportError:
            numpy = None
        if numpy is not None:
            x = numpy.full(5, float(r + 1), dtype=numpy.float32)
            g.all_reduce(x, "max")
            res["f32"] = x.tolist()
print(json.dumps(res))
"""


class GroupTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cluster = start_cluster(harness.Cluster(heartbeat_ms=500, dead_after_ms=5000), cls)

    def ranks(self, devices, fn, selves=None):
        out = run_ranks(self.cluster.addr, devices, fn, selves)
        self.assertEqual(sorted(out), sorted(selves or devices))
        for me, res in out.items():
            if isinstance(res, Exception):
                raise AssertionError("%s: %r" % (me, res))
        return out

    def test_threads_all_reduce_numpy_and_array(self):
        def fn(g):
            r = g.rank
            a = array.array("f", [r + 1.0, 2.0 * r, -1.0])
            g.all_reduce(a, "sum")
            b = array.array("i", [r, 7, -r])
            g.all_reduce(b, op="max")
            res = [g.rank, g.size, g.group_id, g.generation, g.devices, a.tolist(), b.tolist()]
            if numpy is not None:
                x = numpy.arange(6, dtype=numpy.float64) * (r + 1)
                g.all_reduce(x, "mean")
                res.append(x.tolist())
            return res

        out = self.ranks([B0, A1, A0], fn)
        self.assertEqual(sorted(res[0] for res in out.values()), [0, 1, 2])
        ids = {res[2] for res in out.values()}
        self.assertEqual(len(ids), 1)
        self.assertEqual(len(ids.pop()), 16)
        for me, res in out.items():
            self.assertEqual(res[1], 3)
            self.assertEqual(res[4], [A0, A1, B0])
            self.assertEqual(res[4][res[0]], me)
            self.assertGreaterEqual(res[3], 1)
            self.assertEqual(res[5], [6.0, 6.0, -3.0])
            self.assertEqual(res[6], [2, 7, 0])
            if numpy is not None:
                self.assertEqual(res[7], [float(i * 2) for i in range(6)])

    def test_objects_collected_together_or_out_of_order(self):
        """In a process of its own (a crash would end it): a Client and a Group unreachable
        together in a reference cycle (a caught exception kept in a local: frame and
        traceback), which the collector finalizes in any order after clearing weak
        references; and an array from alloc() used after its Group's last reference is gone.
        Neither may touch freed memory: the first crashed with SIGSEGV (dc_group_leave after
        dc_client_close), the second too (the block freed under the array)."""
        script = r"""
import gc, os, sys
import devcoord
addr, me = os.environ["DEVCOORD_ADDR"], sys.argv[1]

def cycle():
    c = devcoord.Client(addr, timeout_ms=20000)
    g = devcoord.Group(c, [me], me, timeout_ms=20000)
    try:
        raise RuntimeError("kept")
    except RuntimeError as e:
        saved = e  # saved -> traceback -> this frame -> saved

gc.disable()
for _ in range(3):
    cycle()
    gc.collect()
c = devcoord.Client(addr, timeout_ms=20000)
x = devcoord.Group(c, [me], me, timeout_ms=20000).alloc(1 << 20)
gc.collect()
x[:] = 2.0
print("sum", float(x.sum()) if hasattr(x, "sum") else None)
"""
        env = dict(os.environ, DEVCOORD_ADDR=self.cluster.addr, PYTHONPATH=os.path.dirname(HERE))
        p = subprocess.run([sys.executable, "-c", script, A0], env=env, capture_output=True,
                           text=True, timeout=120, stdin=subprocess.DEVNULL)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn("sum %s" % (2.0 * (1 << 20) if numpy is not None else None), p.stdout)

    def test_processes_all_reduce(self):
        devices = [A0, B0]
        env = dict(os.environ, DEVCOORD_ADDR=self.cluster.addr,
                   PYTHONPATH=os.path.dirname(HERE))
        procs = [subprocess.Popen([sys.executable, "-c", RANK_SCRIPT, ",".join(devices), me],
                                  env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, stdin=subprocess.DEVNULL) for me in devices]
        results = []
        for p in procs:
            try:
                out, err = p.communicate(timeout=90)
            finally:
                p.kill()
            self.assertEqual(p.returncode, 0, out + err)
            results.append(json.loads(out))
        self.assertEqual([r["rank"] for r in results], [0, 1])
        self.assertEqual(results[0]["id"], results[1]["id"])
        for r in results:
            self.assertEqual(r["size"], 2)
            self.assertEqual(r["i64"], [3, 30, -1])
            if numpy is not None:
                self.assertEqual(r["f32"], [2.0] * 5)

    def test_every_call_f64(self):
        def fn(g):
            r, n = g.rank, g.size
            res = {}
            buf = array.array("d", [r + 1.5, -r])
            g.reduce(buf, root=1, op="prod")
            res["reduce"] = buf.tolist()
            buf = array.array("d", [r * 10.0, r + 0.25])
            g.broadcast(buf, root=1)
            res["broadcast"] = buf.tolist()
            recv = array.array("d", [0.0] * (3 * n))
            g.all_gather(array.array("d", [r, r + 0.5, -r]), recv)
            res["all_gather"] = recv.tolist()
            mine = array.array("d", [0.0, 0.0])
            g.reduce_scatter(array.array("d", [r + i for i in range(2 * n)]), mine, "min")
            res["reduce_scatter"] = mine.tolist()
            g.barrier()
            buf = array.array("d", [1.0 + r])
            g.all_reduce(buf, "prod")
            res["all_reduce"] = buf.tolist()
            return r, res

        out = self.ranks([A0, B0], fn)
        for me, (r, res) in out.items():
            self.assertEqual(res["reduce"], [1.5 * 2.5, -0.0] if r == 1 else [1.5, 0.0])
            self.assertEqual(res["broadcast"], [10.0, 1.25])
            self.assertEqual(res["all_gather"], [0.0, 0.5, 0.0, 1.0, 1.5, -1.0])
            # min over ranks of [r + i] is i (rank 0); rank r gets elements [2r, 2r + 2)
            self.assertEqual(res["reduce_scatter"], [2.0 * r, 2.0 * r + 1])
            self.assertEqual(res["all_reduce"], [2.0])

    @unittest.skipIf(numpy is None, "numpy is not installed")
    def test_alloc_is_shared_with_the_worker(self):
        # Both workers run on this host: alloc's memory is mapped by the rank's worker, and a
        # call on it is done in place there.
        def fn(g):
            x = g.alloc((2, 3), "f32")
            x_shared = g.shared(x)
            if numpy is not None:
                x[:] = float(g.rank + 1)
                want = [[3.0] * 3] * 2
            else:
                for i in range(6):
                    x.cast("B").cast("f")[i] = float(g.rank + 1)
                want = [3.0] * 6
            g.all_reduce(x, "sum")
            got = x.tolist() if numpy is not None else x.cast("B").cast("f").tolist()
            plain = array.array("f", [1.0])
            g.free(x)
            # shared() only looks the address up: once freed it is no block of the group's
            res = (x_shared, g.shared(plain), got == want, g.shared(x), got)
            return res

        out = run_ranks(self.cluster.addr, [A0, A1], fn)
        for me, res in out.items():
            self.assertNotIsInstance(res, Exception, (me, res))
            self.assertEqual(res[:4], (True, False, True, False), (me, res))

    def test_alloc_without_numpy(self):
        """alloc() where numpy is missing (the package's numpy taken away for the test):
        memoryviews of the shape; f16 and bf16 as 16-bit patterns that calls take as the
        dtype asked for; a 0-d block; a shape with a 0 as a flat empty view, which shared()
        and free() take."""
        import struct
        import devcoord.group as dg

        def halves(fmt, m):  # 16-bit patterns <-> values: f16 is struct's "e"
            if fmt == "e":
                return [struct.unpack("e", struct.pack("H", b))[0] for b in m.tolist()]
            return [struct.unpack("f", struct.pack("I", b << 16))[0] for b in m.tolist()]

        def fn(g):
            r = g.rank
            x = g.alloc((2, 3), "f32")
            x.cast("B").cast("f")[:] = array.array("f", [r + 1.0] * 6)
            g.all_reduce(x, "sum")
            h = g.alloc(3, "f16")
            h[:] = array.array("H", struct.unpack("3H", struct.pack("3e", 0.5, -1.5, r + 1.0)))
            g.all_reduce(h, "sum")
            b = g.alloc(2, "bf16")  # bf16 is the upper half of an f32
            b[:] = array.array("H", [struct.unpack("I", struct.pack("f", v))[0] >> 16
                                     for v in (1.0, 2.0 * (r + 1))])
            g.all_reduce(b, "max")
            s = g.alloc((), "i64")
            s.cast("B").cast("q")[0] = 10 * (r + 1)
            g.all_reduce(s, "sum")
            z = g.alloc((0, 3), "f32")
            z_shared = g.shared(z)
            g.free(z)  # gone from the group's blocks
            return (x.shape, x.cast("B").cast("f").tolist(), halves("e", h), halves("b", b),
                    s.shape, s.cast("B").cast("q").tolist(), z.shape, z.nbytes, z_shared,
                    len(g._blocks))

        saved, dg._np = dg._np, None
        try:
            out = self.ranks([A0, B0], fn)
        finally:
            dg._np = saved
        for res in out.values():
            self.assertEqual(res, ((2, 3), [3.0] * 6, [1.0, -3.0, 3.0], [1.0, 4.0], (), [30],
                                   (0,), 0, True, 4))

    def test_bf16_block_of_alloc(self):
        """alloc(n, "bf16") gives uint16 bit patterns (numpy has no bf16) that the calls take
        as bf16, as they would a torch.bfloat16 tensor: 1.0 + 1.0 is 2.0 (0x4000)."""
        if numpy is None:
            self.skipTest("needs numpy")

        def fn(g):
            x = g.alloc(4, "bf16")
            x[:] = 0x3F80  # 1.0
            g.all_reduce(x, "sum")
            y = x[1:3]  # a view keeps the dtype
            g.all_reduce(y, "max")
            return x.tolist()

        for got in self.ranks([A0, B0], fn).values():
            self.assertEqual(got, [0x4000] * 4)

    def test_f16_through_numpy(self):
        def fn(g):
            x = numpy.array([0.5, 1.25, -2.0, 1000.0], dtype=numpy.float16) * (g.rank + 1)
            g.all_reduce(x, "sum")
            return x.dtype.name, x.tolist()

        out = self.ranks([A0, A1], fn)
        for dtname, values in out.values():
            self.assertEqual(dtname, "float16")
            self.assertEqual(values, [1.5, 3.75, -6.0, 3000.0])

    def test_mismatch_names_the_rank(self):
        def fn(g):
            buf = array.array("f", [1.0] * (4 if g.rank == 0 else 5))
            try:
                g.all_reduce(buf, "sum")
            except devcoord.InvalidArgument as e:
                return e
            return None

        out = run_ranks(self.cluster.addr, [A0, B0], fn)
        for me, e in out.items():
            self.assertIsInstance(e, devcoord.InvalidArgument, "%s: %r" % (me, e))
            self.assertEqual(e.code, "INVALID_ARGUMENT")
            self.assertRegex(e.message, r"rank 1")

    def test_async_wait_and_test(self):
        def fn(g):
            r = g.rank
            a = array.array("q", [r, 100 + r])
            b = array.array("f", [float(r)] * 3)
            ra = g.all_reduce_async(a, "sum")
            rb = g.broadcast_async(b, root=1)
            rc = g.barrier_async()
            rb.wait()
            rb.wait()  # idempotent
            ra.wait()
            rc.wait()
            self.assertTrue(ra.test())
            bad = g.all_reduce_async(array.array("f", [1.0] * (2 + r)), "sum")
            try:
                bad.wait()
                err = None
            except devcoord.InvalidArgument as e:
                err = e.code
            return a.tolist(), b.tolist(), err

        out = self.ranks([A1, B0], fn)
        for a, b, err in out.values():
            self.assertEqual(a, [1, 201])
            self.assertEqual(b, [1.0] * 3)
            self.assertEqual(err, "INVALID_ARGUMENT")

    def test_request_test_before_the_end_and_on_failure(self):
        """Request.test(): False while the call cannot have ended (rank 1 makes its call only
        once rank 0 has tested its own), True once waited for; on a call that fails (the
        ranks' sizes differ) it raises the call's error, as wait() then does too."""
        tested = threading.Event()

        def fn(g):
            r = g.rank
            a = array.array("q", [r + 1, 10 * (r + 1)])
            if r == 1:
                tested.wait(60)
                req = g.all_reduce_async(a, "sum")
                early = None
            else:
                try:
                    req = g.all_reduce_async(a, "sum")
                    early = req.test()
                finally:
                    tested.set()
            req.wait()
            ended = req.test()
            bad = g.all_reduce_async(array.array("f", [1.0] * (2 + r)), "sum")
            while True:  # ends: the call's deadline bounds it
                try:
                    if bad.test():
                        raised = "ended without an error"
                        break
                except devcoord.InvalidArgument as e:
                    raised = e.code
                    break
                time.sleep(0.002)
            again, depths = [], set()
            for call in (bad.wait, bad.test) * 3:  # both raise it again, every time
                try:
                    call()
                    again.append(None)
                except devcoord.InvalidArgument as e:
                    again.append(e.code)
                    # as raised by this call: its traceback does not grow with each raise
                    depths.add((call, len(traceback.extract_tb(e.__traceback__))))
            return r, early, ended, a.tolist(), raised, again, len(depths)

        out = self.ranks([A1, B0], fn)
        for r, early, ended, a, raised, again, depths in out.values():
            self.assertEqual(early, None if r == 1 else False)
            self.assertTrue(ended)
            self.assertEqual(a, [3, 30])
            self.assertEqual(raised, "INVALID_ARGUMENT")
            self.assertEqual(again, ["INVALID_ARGUMENT"] * 6)
            self.assertEqual(depths, 2)

    def test_one_request_waited_for_by_several_threads(self):
        """Threads waiting for one request at once (Group.leave() does beside the owner's
        wait): the library's request is finished once, each thread sees the outcome."""
        def fn(g):
            good = 0
            for k in range(30):
                a = array.array("q", [g.rank + k])
                req = g.all_reduce_async(a, "sum")
                seen = []
                threads = [threading.Thread(target=lambda: seen.append(
                    (req.wait(), req.test(), a[0]))) for _ in range(3)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join(30)
                good += seen == [(None, True, 2 * k + 1)] * 3
            return good

        out = self.ranks([A1, B0], fn)
        self.assertEqual(list(out.values()), [30, 30])

    def test_leave_waits_for_calls_and_close_leaves(self):
        """leave() waits for the requests in flight (rank 1 starts its call 0.5 s late): once
        it returns the request has ended and its result is in place before wait(); calls
        after leave() and on the groups close() left are refused."""
        def rank(me, out):
            c = devcoord.Client(self.cluster.addr, timeout_ms=30000)
            g = devcoord.Group(c, [A0, B0], me, timeout_ms=20000)
            a = array.array("f", [g.rank + 1.0] * 2)
            if g.rank == 1:
                time.sleep(0.5)
            req = g.all_reduce_async(a, "sum")
            g.leave()  # waits for the call first
            after_leave = (req.test(), a.tolist())
            try:
                g.barrier()
            except devcoord.FailedPrecondition as e:
                left = e.message
            g2 = devcoord.Group(c, [A0, B0], me, timeout_ms=20000)
            c.close()  # leaves g2
            try:
                g2.rank
            except devcoord.FailedPrecondition as e:
                closed = e.message
            req.wait()
            out[me] = (a.tolist(), left, closed, after_leave)

        out = {}
        threads = [threading.Thread(target=rank, args=(me, out)) for me in (A0, B0)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(90)
        self.assertEqual(sorted(out), [A0, B0])
        for a, left, closed, after_leave in out.values():
            self.assertEqual(a, [3.0, 3.0])
            self.assertEqual(after_leave, (True, [3.0, 3.0]))
            self.assertEqual(left, "the group has been left")
            self.assertEqual(closed, "the group has been left")

    def test_read_only_views_and_a_failed_alloc(self):
        """A send buffer that is a read-only view of part of a bytes object sends that part
        (all_gather, reduce_scatter), not the object from its start; an alloc the library
        cannot make raises a devcoord.Error."""
        def fn(g):
            r = g.rank
            whole = array.array("f", [100.0 + r, 1.0 + r, 2.0 + r]).tobytes()
            part = memoryview(whole).cast("f")[1:]  # read-only, 4 bytes into the object
            every = array.array("f", [0.0] * 4)
            g.all_gather(part, every)
            blocks = array.array("d", [-1.0, 10.0 * r, 20.0 * r]).tobytes()
            mine = array.array("d", [0.0])
            g.reduce_scatter(memoryview(blocks).cast("d")[1:], mine, "sum")
            try:
                g.alloc(1 << 58, "f32")  # 1 EiB
                failed = None
            except devcoord.Error as e:
                failed = (type(e).__name__, e.message)
            return every.tolist(), mine.tolist(), failed

        out = run_ranks(self.cluster.addr, [A0, B0], fn)
        for me, res in out.items():
            self.assertNotIsInstance(res, Exception, (me, res))
        got = {me: res for me, res in out.items()}
        self.assertEqual(got[A0][0], [1.0, 2.0, 2.0, 3.0])
        self.assertEqual(got[B0][0], [1.0, 2.0, 2.0, 3.0])
        self.assertEqual((got[A0][1], got[B0][1]), ([10.0], [20.0]))
        for me in (A0, B0):
            self.assertEqual(got[me][2][0], "ResourceExhausted", (me, got[me][2]))

    def test_local_refusals(self):
        """Calls the package refuses before the library sees them: a read-only buffer (a
        bytes object or a read-only numpy array) for an in-place call, an unknown reduce op,
        all_gather's recv / reduce_scatter's send of the wrong size, send and recv of two
        dtypes, a numpy array that is not C-contiguous, a buffer in the other byte order
        than this machine's (its bytes would be reduced as this machine's)."""
        def fn(g):
            errs = []
            calls = [lambda: g.all_reduce(memoryview(array.array("f", [1.0])).toreadonly()),
                     lambda: g.all_reduce(array.array("f", [1.0]), "avg"),
                     lambda: g.all_gather(array.array("f", [1.0]), array.array("f", [0.0])),
                     lambda: g.all_gather(array.array("f", [1.0]),
                                          array.array("d", [0.0, 0.0])),
                     lambda: g.all_reduce(memoryview(array.array("f", [1.0]).tobytes())
                                          .cast("f")),
                     lambda: g.reduce_scatter(array.array("f", [1.0] * 3),
                                              array.array("f", [0.0])),
                     lambda: g.all_reduce((ctypes.c_float.__ctype_be__ * 3)(1.0, 2.0, 3.0))]
            if numpy is not None:
                frozen = numpy.ones(2, numpy.float32)
                frozen.flags.writeable = False
                calls += [lambda: g.all_reduce(frozen),
                          lambda: g.all_reduce(numpy.zeros((2, 4), numpy.float32)[:, ::2]),
                          lambda: g.all_reduce(numpy.arange(3, dtype=">f4"))]
            for call in calls:
                try:
                    call()
                    errs.append(None)
                except devcoord.InvalidArgument as e:
                    errs.append(e.message)
            g.barrier()
            return errs

        out = self.ranks([A0, B0], fn)
        for errs in out.values():
            self.assertIn("read-only", errs[0])
            self.assertIn("unknown reduce op 'avg'", errs[1])
            self.assertIn("recv has 1 elements, expected 2", errs[2])
            self.assertIn("send is f32 but recv is f64", errs[3])
            self.assertIn("read-only", errs[4])  # a bytes object is never written to
            self.assertIn("send has 3 elements, expected 2", errs[5])
            self.assertIn("not in this machine's byte order", errs[6])  # big-endian ctypes
            if numpy is not None:
                self.assertIn("the numpy array is read-only", errs[7])
                self.assertIn("not C-contiguous", errs[8])
                self.assertIn("not in this machine's byte order", errs[9])  # numpy ">f4"

    def test_torch_tensor_in_place(self):
        if torch is None:
            self.skipTest("torch is not importable (Debian: apt-get install python3-torch)")

        def fn(g):
            r = g.rank
            t = torch.tensor([1.0, 2.0, 3.0]) * (r + 1)
            ptr = t.data_ptr()
            g.all_reduce(t, "sum")
            h = torch.tensor([0.5, -1.5], dtype=torch.float16) * (r + 1)
            g.all_reduce(h, "sum")
            bf = torch.tensor([1.0, 4.0], dtype=torch.bfloat16) * (r + 1)
            g.all_reduce(bf, "max")
            i = torch.arange(4, dtype=torch.int64) + r
            g.all_reduce_async(i, "min").wait()
            try:
                g.all_reduce(torch.zeros(4, 4).t(), "sum")
                err = None
            except devcoord.InvalidArgument as e:
                err = e.message
            # Written in place as torch's own in-place ops write: a tensor autograd saved for
            # backward (sin saves its input), then changed by a call, makes backward() raise
            # rather than compute with the new values; so does a call's recv.
            stale = []
            for call in (lambda x: g.all_reduce(x, "sum"), lambda x: g.broadcast(x, 0),
                         lambda x: g.all_gather(torch.ones(1), x)):
                w = torch.ones(2, requires_grad=True)
                x = w * 2
                y = x.sin()
                call(x.detach())  # detach() shares x's version counter, as views do
                try:
                    y.sum().backward()
                    stale.append("backward used the changed tensor")
                except RuntimeError as e:
                    stale.append("modified by an inplace operation" in str(e))
            with torch.inference_mode():  # no version counter: still written, no error
                inf = torch.ones(2) * (r + 1)
            g.all_reduce(inf, "sum")
            stale.append(inf.tolist())
            return (t.tolist(), t.data_ptr() == ptr, h.tolist(), bf.tolist(), i.tolist(), err,
                    stale)

        out = self.ranks([A0, B0], fn)
        for t, same, h, bf, i, err, stale in out.values():
            self.assertEqual(stale, [True] * 3 + [[3.0, 3.0]])
            self.assertEqual(t, [3.0, 6.0, 9.0])
            self.assertTrue(same)
            self.assertEqual(h, [1.5, -4.5])
            self.assertEqual(bf, [2.0, 8.0])
            self.assertEqual(i, [0, 1, 2, 3])
            self.assertIn("contiguous", err)

    def test_torch_empty_is_shared_with_the_worker(self):
        """devcoord.torch.empty: tensors of every dtype in the group's shared memory, zeroed,
        reduced in place (a whole one and a slice), shared() and free() taking them."""
        if torch is None:
            self.skipTest("torch is not importable (Debian: apt-get install python3-torch)")
        import devcoord.torch as dt

        def fn(g):
            r = g.rank
            out = []
            for dtype in (torch.float32, torch.float64, torch.int32, torch.int64,
                          torch.float16, torch.bfloat16):
                t = dt.empty(g, (2, 3), dtype)
                zeroed = bool(torch.all(t == 0))
                t += torch.arange(6, dtype=dtype).view(2, 3) + r
                g.all_reduce(t, "sum")
                g.all_reduce(t[1], "sum")  # a contiguous slice of the block: doubled
                out.append((str(dtype), zeroed, g.shared(t), t.tolist()))
                g.free(t)
            big = dt.empty(g, 300000)
            big.fill_(r + 1.0)
            g.all_reduce(big, "sum")
            out.append(("big", g.shared(big), bool(torch.all(big == 3.0))))
            try:
                dt.empty(g, 3, torch.uint8)
            except TypeError as e:
                out.append(str(e)[:28])
            return out

        res = self.ranks([A0, B0], fn)
        for out in res.values():
            for name, zeroed, shared, values in out[:6]:
                self.assertTrue(zeroed, name)
                self.assertTrue(shared, name)
                self.assertEqual(values, [[1, 3, 5], [14, 18, 22]], name)
            self.assertEqual(out[6], ("big", True, True))
            self.assertEqual(out[7], "devcoord.torch.empty: dtype ")

    def test_ddp_hook_overlaps_in_order(self):
        """devcoord.torch.allreduce_hook as DDP calls it: buckets of several sizes (the
        larger ones through the staging block) started back to back, each future holding the
        mean once its call ends; a failed call's error on its future, the group usable
        after; overlap=False complete on return; leave() waiting for the calls in flight and
        queued on the hook's thread (rank 1 comes 0.5 s late, rank 0 leaves at once)."""
        if torch is None:
            self.skipTest("torch is not importable (Debian: apt-get install python3-torch)")

        import devcoord.torch as dt

        class Bucket:
            def __init__(self, t):
                self.t = t

            def buffer(self):
                return self.t

        sizes = [3, 70000, 300000, 5, 1100000]

        def fn(g):
            r = g.rank
            state = dt.HookState(g)
            futs = [dt.allreduce_hook(state, Bucket(torch.full((n,), (r + 1.0) * (k + 1))))
                    for k, n in enumerate(sizes)]
            means = [f.wait() for f in futs]
            ok = [bool(torch.all(m == 1.5 * (k + 1))) and m.numel() == n
                  for k, (m, n) in enumerate(zip(means, sizes))]
            bad = dt.allreduce_hook(state, Bucket(torch.ones(4, dtype=(
                torch.float32 if r == 0 else torch.float64))))
            try:
                bad.wait()
                err = None
            except devcoord.InvalidArgument as e:
                err = e.message
            blocking = dt.allreduce_hook(dt.HookState(g, overlap=False),
                                         Bucket(torch.full((8,), r + 1.0)))
            done_on_return = blocking.done()
            after = blocking.wait().tolist()
            if r == 1:
                time.sleep(0.5)
            # Three more, rank 0 leaving at once: leave() waits for the one in flight and
            # for those still queued. Each is read as it is set (on the hook's thread).
            last = [dt.allreduce_hook(g, Bucket(torch.full((6,), 4.0 * r + k))).then(
                lambda f: f.value().tolist()) for k in range(3)]
            return ok, state.calls, err, done_on_return, after, last

        out = self.ranks([A0, B0], fn)
        for res in out.values():
            self.assertNotIsInstance(res, Exception, res)
            ok, calls, err, done_on_return, after, last = res
            self.assertEqual(ok, [True] * len(sizes))
            self.assertEqual(calls, len(sizes) + 1)
            self.assertIsNotNone(err)
            self.assertIn("rank 0 passed", err)
            self.assertTrue(done_on_return)
            self.assertEqual(after, [1.5] * 8)
            self.assertEqual([f.done() for f in last], [True] * 3)  # leave() waited
            self.assertEqual([f.wait() for f in last], [[2.0 + k] * 6 for k in range(3)])

    def test_ddp_hook_results_in_shared_memory(self):
        """HookState's shared block: buckets as DDP hands them (GradBucket's index(),
        is_last(), buffer()), ten steps of four layouts. Once a step's buckets are the
        last step's, one block holds them all, and from the next step each bucket is copied
        there and its future's result is its view of the block, shared with the worker; a
        changed layout goes as before and is learned again, once (BLOCKS_MAX: 2), in the
        same block. Every mean is right read as DDP reads it (as_strided from the storage's
        start); shared_results=False never shares; a state made once the first is
        collected takes its block over."""
        if torch is None:
            self.skipTest("torch is not importable (Debian: apt-get install python3-torch)")

        import devcoord.torch as dt

        # The layouts of steps 1..10: DDP's first buckets, its rebuilt ones (twice), a
        # change (three times), another change (three times).
        first, rebuilt, changed, again = [1000, 300000, 7], [1200, 300000], [5000], [10, 20]
        steps = [first, rebuilt, rebuilt, rebuilt, changed, changed, changed, again, again,
                 again]

        def fn(g):
            r = g.rank
            seen = []
            for shared_results in (True, False):
                state = dt.HookState(g, shared_results=shared_results)
                for step, sizes in enumerate(steps):
                    bufs = [torch.full((n,), (r + 1.0) * (k + 1) + step)
                            for k, n in enumerate(sizes)]
                    futs = [dt.allreduce_hook(state, GradBucket(k, k == len(sizes) - 1, b))
                            for k, b in enumerate(bufs)]
                    res = [f.wait() for f in futs]
                    # As DDP reads a result (as_strided, offsets from the storage's start)
                    right = all(bool(torch.all(m.as_strided((n,), (1,), 0) ==
                                               1.5 * (k + 1) + step)) and m.numel() == n
                                for k, (m, n) in enumerate(zip(res, sizes)))
                    shared = {g.shared(m) and m.data_ptr() != b.data_ptr()
                              for m, b in zip(res, bufs)}
                    seen.append((right, shared.pop() if len(shared) == 1 else "mixed"))
                seen.append(state.shared_calls)
            # The first state is gone: a new one takes over its block (the state took the
            # same one again when its buckets changed: one in all).
            seen.append(len(g._hook_blocks))
            state = dt.HookState(g)
            for step in range(4):
                buf = torch.full((1000,), r + 1.0 + step)
                fut = dt.allreduce_hook(state, GradBucket(0, True, buf))
                seen.append((bool(torch.all(fut.wait() == 1.5 + step)), g.shared(fut.wait())))
            seen.append(len(g._hook_blocks))
            return seen

        out = self.ranks([A0, B0], fn)
        shared = [False, False, False, True, False, False, True, False, False, False]
        for seen in out.values():
            self.assertEqual(seen[:11], [(True, s) for s in shared] + [2 + 1])
            self.assertEqual(seen[11:22], [(True, False)] * 10 + [0])
            self.assertEqual(seen[22:], [1, (True, False), (True, False), (True, True),
                                         (True, True), 1])

    def test_ddp_hook_no_block_for_gradients_as_bucket_views(self):
        """With DDP's gradient_as_bucket_view the gradients are views of the bucket: the hook
        makes no shared block (DDP would copy a result from it into the bucket anyway), and
        the means land in the bucket; with gradients of their own it does."""
        if torch is None:
            self.skipTest("torch is not importable (Debian: apt-get install python3-torch)")

        import devcoord.torch as dt

        def fn(g):
            r = g.rank
            seen = []
            for as_views in (True, False):
                state = dt.HookState(g)
                p = torch.nn.Parameter(torch.zeros(1000))
                for step in range(5):
                    buf = torch.full((1000,), r + 1.0 + step)
                    p.grad = buf.view(-1) if as_views else torch.zeros(1000)
                    res = dt.allreduce_hook(state, GradBucket(0, True, buf, [p])).wait()
                    seen.append((bool(torch.all(res == 1.5 + step)),
                                 res.data_ptr() == buf.data_ptr()))
                seen.append(state.shared_calls)
            return seen

        out = self.ranks([A0, B0], fn)
        for seen in out.values():
            self.assertEqual(seen, [(True, True)] * 5 + [0] +
                             [(True, True)] * 2 + [(True, False)] * 3 + [3])


@unittest.skipIf(numpy is None, "numpy is not importable (Debian: apt-get install python3-numpy)")
def agree_on_size(g, n):
    """A blocking all-reduce of n f32 on plain memory, rank r's elements r + 1: the ranks
    agree here whether calls of that size go whole. Whether its result is right."""
    first = numpy.full(n, g.rank + 1.0, dtype=numpy.float32)
    g.all_reduce(first, "sum")
    return bool(numpy.all(first == 3.0))


class AsyncStagedTest(unittest.TestCase):
    """Asynchronous calls of one message on plain memory of 64 KiB or more, the worker on the
    rank's host: each through a staging block of its own (up to four in flight), none of
    their bytes in the call either way; smaller ones, and a fifth in flight, carry theirs.
    Every result checked."""

    @classmethod
    def setUpClass(cls):
        cls.cluster = start_cluster(harness.Cluster(heartbeat_ms=500, dead_after_ms=5000), cls,
                                    http=True)

    def call_bytes(self):
        return {name: [harness.metrics(port)[k] for k in (
                    "devcoord_group_call_bytes_received_total",
                    "devcoord_group_call_bytes_sent_total", "devcoord_group_shm_calls_total")]
                for name, port in self.cluster.worker_http.items()}

    def test_async_calls_of_plain_memory_are_staged(self):
        def fn(g):
            r = g.rank
            res = []
            # Four all-reduces of 1 MiB and 80 KB in flight at once, then an all-gather and a
            # reduce-scatter of 80 KB (one block per rank), then waited for, newest first.
            bufs = [numpy.arange(n, dtype=numpy.float32) * (k + 1) + r
                    for k, n in enumerate((1 << 18, 20000, 1 << 18, 20000))]
            reqs = [g.all_reduce_async(b, "sum") for b in bufs]
            for q in reversed(reqs):
                q.wait()
            res.append(all(numpy.array_equal(b, numpy.arange(len(b), dtype=numpy.float32)
                                             * 2 * (k + 1) + 1) for k, b in enumerate(bufs)))
            send = numpy.full(10000, r + 1.5, dtype=numpy.float64)
            every = numpy.zeros(20000, dtype=numpy.float64)
            g.all_gather_async(send, every).wait()
            res.append(every.tolist() == [1.5] * 10000 + [2.5] * 10000)
            blocks = numpy.concatenate([numpy.full(10000, 1.0 + r), numpy.full(10000, 10.0)])
            mine = numpy.zeros(10000)
            g.reduce_scatter_async(blocks, mine, "max").wait()
            res.append(mine.tolist() == ([2.0] if r == 0 else [10.0]) * 10000)
            return res

        before = self.call_bytes()
        out = run_ranks(self.cluster.addr, [A0, B0], fn)
        for res in out.values():
            self.assertEqual(res, [True, True, True])
        after = self.call_bytes()
        for name in ("node-a", "node-b"):
            got = [a - b for a, b in zip(after[name], before[name])]
            self.assertEqual(got, [0, 0, 6], name)

        # Five in flight: the fifth carries its bytes (80 KB each way); 4 KB ones always do.
        # Rank 1 (node-b) comes late, so rank 0's (node-a) five are all in flight at once.
        def five(g):
            if g.rank == 1:
                time.sleep(0.5)
            bufs = [numpy.full(20000, g.rank + k, dtype=numpy.float32) for k in range(5)]
            bufs.append(numpy.full(1000, 1.0, dtype=numpy.float32))
            reqs = [g.all_reduce_async(b, "min") for b in bufs]
            for q in reqs:
                q.wait()
            return [float(b[0]) for b in bufs]

        before = after
        out = run_ranks(self.cluster.addr, [A0, B0], five)
        for res in out.values():
            self.assertEqual(res, [0.0, 1.0, 2.0, 3.0, 4.0, 1.0])
        after = self.call_bytes()
        got = {name: [a - b for a, b in zip(after[name], before[name])]
               for name in ("node-a", "node-b")}
        self.assertEqual(got["node-a"], [84000, 84000, 4])
        # Rank 1's calls may find a block free again: its fifth is staged or carries its bytes.
        self.assertIn(got["node-b"], ([84000, 84000, 4], [4000, 4000, 5]))

    def test_large_async_calls_start_without_waiting_for_each_other(self):
        """Asynchronous all-reduces larger than one message (5 MiB), of a size the ranks have
        agreed on before: each starts as one call that holds the group's order only until it
        has its seq (on plain memory through a staging block of its own, on a block of
        alloc() as it is), so a rank can start the next before the others have made the
        first. Rank 1 makes its calls only once rank 0 has started all three: were a start
        to wait for the call before it to end, which waits for rank 1, the ranks would wait
        for each other until the calls' deadline."""
        started = threading.Event()

        def fn(g):
            r = g.rank
            n = 5 << 18  # f32: 5 MiB
            first = agree_on_size(g, n)
            bufs = [numpy.full(n, (r + 1.0) * (k + 1), dtype=numpy.float32) for k in range(2)]
            shm = g.alloc(n, "f32")
            shm[:] = r + 10.0
            if r == 1:
                started.wait(60)
            reqs = [g.all_reduce_async(b, "sum") for b in bufs]
            reqs.append(g.all_reduce_async(shm, "max"))
            if r == 0:
                started.set()
            for q in reqs:
                q.wait()
            ok = [first]
            ok += [bool(numpy.all(b == 3.0 * (k + 1))) for k, b in enumerate(bufs)]
            ok.append(bool(numpy.all(shm == 11.0)))
            g.free(shm)
            # Calls that do not match (rank 1 one element short): refused for both ranks,
            # which then forget what they agreed, so the next call of the size is voted on
            # again (a one-element i64 all-reduce: its 8 bytes in a call, to each worker)
            # and works.
            bad = numpy.ones(n - r, dtype=numpy.float32)
            try:
                g.all_reduce_async(bad, "sum").wait()
                ok.append("no refusal")
            except devcoord.InvalidArgument as e:
                ok.append("rank 0 passed" in e.message)
            synced.wait()
            if r == 0:
                carried.append(self.call_bytes())
            synced.wait()
            again = numpy.full(n, r + 1.0, dtype=numpy.float32)
            g.all_reduce_async(again, "sum").wait()
            ok.append(bool(numpy.all(again == 3.0)))
            synced.wait()
            if r == 0:
                carried.append(self.call_bytes())
            return ok

        synced = threading.Barrier(2, timeout=60)
        carried = []
        out = run_ranks(self.cluster.addr, [A0, B0], fn)
        for res in out.values():
            self.assertEqual(res, [True] * 6)
        for name in ("node-a", "node-b"):
            self.assertEqual(carried[1][name][0] - carried[0][name][0], 8, name)

    def test_large_async_calls_with_one_rank_on_shared_memory(self):
        """Five asynchronous all-reduces of 5 MiB, rank 0's buffers in blocks of alloc(),
        rank 1's plain memory. Rank 1 starts all five first: four through staging blocks of
        its own, the fifth (none free: no call can end before rank 0 makes it) through the
        group's one staging block in a thread of its own, still one whole call, as rank 0's
        five are on its blocks. The ranks' calls stay matched and every result is right."""
        started = threading.Event()

        def fn(g):
            r = g.rank
            n = 5 << 18  # f32: 5 MiB
            first = agree_on_size(g, n)
            if r == 0:
                bufs = [g.alloc(n, "f32") for _ in range(5)]
                for k, b in enumerate(bufs):
                    b[:] = k + 1.0
                started.wait(60)
            else:
                bufs = [numpy.full(n, 2.0 * (k + 1), dtype=numpy.float32) for k in range(5)]
            reqs = [g.all_reduce_async(b, "sum") for b in bufs]
            if r == 1:
                started.set()
            for q in reqs:
                q.wait()
            ok = [first]
            ok += [bool(numpy.all(b == 3.0 * (k + 1))) for k, b in enumerate(bufs)]
            if r == 0:
                for b in bufs:
                    g.free(b)
            return ok

        out = run_ranks(self.cluster.addr, [A0, B0], fn)
        for res in out.values():
            self.assertEqual(res, [True] * 6)

class SmallShmTest(unittest.TestCase):
    """A /dev/shm smaller than what ranks ask for (a container's is 64 MiB by default; here a
    16 MiB tmpfs in a mount namespace of its own, cluster and ranks inside it): a block of
    alloc() that does not fit is plain memory and a call on it works, as does a call whose
    staging block does not fit; a block that fits is still shared. Had the library only sized
    the memory, the rank would die of SIGBUS writing past what /dev/shm holds. Needs root
    (unshare -m, mount); skipped otherwise."""

    INNER = "DEVCOORD_TEST_SMALL_SHM"

    def test_blocks_past_what_dev_shm_holds(self):
        if os.environ.get(self.INNER):
            return self.inside()
        if numpy is None:
            self.skipTest("needs numpy")
        if os.geteuid() != 0 or shutil.which("unshare") is None:
            self.skipTest("needs root and unshare for a /dev/shm of its own")
        script = 'mount -t tmpfs -o size=16m tmpfs /dev/shm && exec "$@"'
        p = subprocess.run(
            ["unshare", "-m", "sh", "-c", script, "sh", sys.executable, "-m", "unittest", "-v",
             "test_group.SmallShmTest"],
            env={**os.environ, self.INNER: "1"}, cwd=HERE, capture_output=True, text=True,
            timeout=240)
        self.assertEqual(p.returncode, 0, p.stdout[-3000:] + p.stderr[-3000:])
        self.assertIn("Ran 1 test", p.stderr)
        # The library's line on stderr says why the 32 MiB block is not shared.
        self.assertIn("33554432 bytes not shared with worker", p.stderr)
        self.assertIn("cannot allocate 33554432 bytes of shared memory: /dev/shm has no room",
                      p.stderr)

    def inside(self):
        self.assertLessEqual(os.statvfs("/dev/shm").f_blocks * os.statvfs("/dev/shm").f_frsize,
                             16 << 20)
        cluster = harness.Cluster(heartbeat_ms=500, dead_after_ms=5000)
        start_cluster(cluster, type(self))

        def fn(g):
            r = g.rank
            big = g.alloc(8 << 20, "f32")  # 32 MiB: more than /dev/shm holds
            big[:] = r + 1.0
            g.all_reduce(big, "sum")
            plain = numpy.full(6 << 20, r + 2.0, dtype=numpy.float32)  # 24 MiB, staged if it fit
            g.all_reduce(plain, "max")
            small = g.alloc(1 << 18, "f32")  # 1 MiB: fits
            small[:] = r
            g.all_reduce(small, "sum")
            res = (g.shared(big), bool(numpy.all(big == 3.0)), bool(numpy.all(plain == 3.0)),
                   g.shared(small), bool(numpy.all(small == 1.0)))
            g.free(big)
            g.free(small)
            return res

        out = run_ranks(cluster.addr, [A0, A1], fn)
        for me, res in out.items():
            self.assertEqual(res, (False, True, True, True, True), me)


if __name__ == "__main__":
    unittest.main()
