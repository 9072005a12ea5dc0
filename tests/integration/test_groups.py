"""Issue 13 (first slice): groups, collectives called by every rank, against the real binaries.

Each rank is its own `devcoordctl collective` process (as a trainer runs one process per
device), all started at once: they join the group through the coordinator, make their calls
straight to their workers, print the result and leave. Expected numbers are computed in Python
(opsutil.py); the order every worker reduces in is fixed (rank order within a worker, then
worker order), so f32/f64 results are checked within opsutil's rounding bound and must be the
same bytes on every rank.

    cd tests/integration && python3 -m unittest -v test_groups
"""

import os
import random
from concurrent.futures import ThreadPoolExecutor
import re
import socket
import struct
import subprocess
import time
import unittest
import unittest.mock
import urllib.request

import harness
import opsutil
from harness import F, ClusterTestCase, pb_bytes
from harness import dlink_closed_by_worker, dlink_header
from opsutil import ctl_popen, finish

GRID = ("node-a", "node-b", "node-c")
ERROR_LINE = re.compile(r"^devcoordctl: ([A-Z][A-Z_]+): (.+)$", re.M)


def error_of(r):
    m = ERROR_LINE.search(r.err)
    return (m.group(1), m.group(2)) if m else (None, r.err)


class GroupsTestCase(ClusterTestCase):
    heartbeat_ms = 500
    dead_after_ms = 5000

    def start(self, workers, coordinator_config=None, http=False, worker_extra=None,
              only=None):
        """workers: {name: [device, ...]}; worker_extra: config of every worker, only: of
        one ({name: {key: value}})."""
        c = self.cluster = self.make_cluster(coordinator_config=coordinator_config)
        c.start_coordinator()
        for name, devices in workers.items():
            extra = dict(worker_extra or {})
            extra.update((only or {}).get(name, {}))
            if http:
                extra["http"] = "127.0.0.1:%d" % harness.free_port()
            c.add_worker(name, [{"device": d, "memory": "8GiB"} for d in devices], extra=extra)
        c.wait_workers(list(workers))
        return c

    def ranks(self, devices_arg, selves, *args, orders=None, timeout=60.0):
        """Runs `collective ARGS --devices D --self S` once per self, all at once; returns
        their results in the order of selves. orders: one --devices text per self."""
        procs = []
        for i, s in enumerate(selves):
            devs = orders[i] if orders else devices_arg
            procs.append(ctl_popen(self.cluster, "collective", *args, "--devices", devs,
                                   "--self", s))
        return [finish(p, timeout=timeout) for p in procs]

    def sorted_devices(self, devices):
        """Rank order: the sorted canonical list (worker name, then device; all cuda here)."""
        return sorted(devices, key=lambda d: (d.split("/")[0], int(d.rsplit(":", 1)[1])))


class JoinTest(GroupsTestCase):
    def test_ranks_and_group_id_do_not_depend_on_the_order_given(self):
        c = self.start({"node-a": ["cuda:0", "cuda:1"], "node-b": ["cuda:0"]})
        devs = ["node-b/cuda:0", "node-a/cuda:1", "node-a/cuda:0"]
        orders = [",".join(devs), ",".join(reversed(devs)), ",".join(devs[1:] + devs[:1])]
        rs = self.ranks(None, devs, "barrier", orders=orders)
        for r in rs:
            self.assertEqual(r.rc, 0, r)
        ranked = self.sorted_devices(devs)
        self.assertEqual({r.out["group_id"] for r in rs}, {rs[0].out["group_id"]})
        self.assertEqual([r.out["rank"] for r in rs], [ranked.index(d) for d in devs])
        self.assertEqual({r.out["size"] for r in rs}, {3})
        self.assertEqual({r.out["generation"] for r in rs}, {1})
        # The coordinator's view: same id, devices in rank order, generation 1.
        doc = c.ctl_ok("groups", "show", rs[0].out["group_id"])
        self.assertEqual(doc["devices"], ranked)
        self.assertEqual(doc["generation"], 1)
        self.assertEqual((doc["calls"], doc["stalled"]), (1, []))
        listed = c.ctl_ok("groups", "list")["groups"]
        self.assertIn(rs[0].out["group_id"], [g["group_id"] for g in listed])
        # Joining again is the next generation.
        rs = self.ranks(",".join(devs), devs, "barrier")
        self.assertEqual({r.out["generation"] for r in rs}, {2}, rs)

    def test_self_not_in_the_list_is_refused(self):
        c = self.start({"node-a": ["cuda:0", "cuda:1"]})
        r = c.ctl("collective", "barrier", "--devices", "node-a/cuda:0", "--self",
                  "node-a/cuda:1")
        self.assertEqual(r.rc, 1, r)
        self.assertEqual(r.out["status"], "INVALID_ARGUMENT")
        self.assertIn("self node-a/cuda:1 is not in the group's device list", r.out["message"])
        self.assertEqual(error_of(r)[0], "INVALID_ARGUMENT")

    def test_double_autodiff_wrap_is_refused_like_submit(self):
        c = self.start({"node-a": ["cuda:0", "cuda:1"]})
        devs = "node-a/autodiff(autodiff(cuda:0)),node-a/autodiff(cuda:1)"
        r = c.ctl("collective", "barrier", "--devices", devs, "--self", "node-a/cuda:1")
        self.assertEqual(r.rc, 1, r)
        sub = c.ctl("submit", "--op", "barrier", "--devices", devs)
        self.assertEqual(sub.rc, 1, sub)
        self.assertEqual(r.out["status"], "INVALID_ARGUMENT")
        self.assertIn("autodiff should not wrap an autodiff device", r.out["message"])
        self.assertEqual(r.out["message"], sub.out["message"])
        # Wrapped once is stripped (the `strip` policy): the join works.
        rs = self.ranks("node-a/autodiff(cuda:0),node-a/autodiff(cuda:1)",
                        ["node-a/cuda:0", "node-a/autodiff(cuda:1)"], "barrier")
        self.assertEqual([r.rc for r in rs], [0, 0], rs)

    def test_a_second_live_join_of_the_same_self_is_already_exists(self):
        c = self.start({"node-a": ["cuda:0", "cuda:1"]})
        devs = "node-a/cuda:0,node-a/cuda:1"
        first = ctl_popen(c, "--timeout", "20s", "collective", "barrier", "--devices", devs,
                          "--self", "node-a/cuda:0")
        harness.wait_until(lambda: any(g["joining"] == 1 for g in
                                       c.ctl_ok("groups", "list")["groups"]),
                           10, "the first join to wait")
        second = c.ctl("collective", "barrier", "--devices", devs, "--self", "node-a/cuda:0")
        self.assertEqual(second.rc, 1, second)
        self.assertEqual(second.out["status"], "ALREADY_EXISTS", second)
        self.assertIn("node-a/cuda:0", second.out["message"])
        # The other rank comes: the first join completes.
        other = c.ctl("collective", "barrier", "--devices", devs, "--self", "node-a/cuda:1")
        self.assertEqual(other.rc, 0, other)
        r = finish(first)
        self.assertEqual(r.rc, 0, r)

    def test_a_join_whose_caller_went_away_does_not_hold_its_rank(self):
        c = self.start({"node-a": ["cuda:0", "cuda:1"]})
        devs = "node-a/cuda:0,node-a/cuda:1"

        def joining():
            return sum(g["joining"] for g in c.ctl_ok("groups", "list")["groups"])

        first = ctl_popen(c, "--timeout", "60s", "collective", "barrier", "--devices", devs,
                          "--self", "node-a/cuda:0")
        harness.wait_until(lambda: joining() == 1, 10, "the first join to wait")
        first.kill()
        first.communicate()
        # The coordinator lets the join go when its connection closes, well before its
        # deadline: the rank joins again, without ALREADY_EXISTS.
        harness.wait_until(lambda: joining() == 0, 10, "the dead caller's join to go")
        rs = self.ranks(devs, devs.split(","), "barrier")
        self.assertEqual([r.rc for r in rs], [0, 0], rs)

    def test_deadline_names_the_devices_that_did_not_join(self):
        c = self.start({"node-a": ["cuda:0"], "node-b": ["cuda:0", "cuda:1"]})
        r = c.ctl("--timeout", "1s", "collective", "barrier", "--devices",
                  "node-a/cuda:0,node-b/cuda:0,node-b/cuda:1", "--self", "node-b/cuda:0")
        self.assertEqual(r.rc, 1, r)
        self.assertEqual(r.out["status"], "DEADLINE_EXCEEDED", r)
        m = r.out["message"]
        self.assertIn("node-a/cuda:0", m)
        self.assertIn("node-b/cuda:1", m)
        self.assertNotIn("not joined: node-b/cuda:0", m)
        # Nothing stays parked.
        self.assertTrue(all(g["joining"] == 0 for g in c.ctl_ok("groups", "list")["groups"]))


# Three workers with one or two devices each: five ranks, interleaved across workers in the
# sorted order (node-a: ranks 0-1, node-b: rank 2, node-c: ranks 3-4).
SPEC3 = {"node-a": ["cuda:0", "cuda:1"], "node-b": ["cuda:0"], "node-c": ["cuda:0", "cuda:1"]}
DEVS3 = ["node-a/cuda:0", "node-a/cuda:1", "node-b/cuda:0", "node-c/cuda:0", "node-c/cuda:1"]
THREADS = os.environ.get("DEVCOORD_GROUP_THREADS") or os.path.join(
    os.path.dirname(os.path.abspath(harness.CTL)), "..", "tests", "devcoord-group-threads")


class CallsTest(GroupsTestCase):
    def run_ranks(self, kind, dtype, inputs, *extra, devices=DEVS3, timeout=60.0):
        """One process per rank of `devices` (rank order), each passing inputs[rank]."""
        procs = []
        order = ",".join(reversed(devices))  # the order given does not matter
        for rank, dev in enumerate(devices):
            args = ["collective", kind, "--devices", order, "--self", dev] + list(extra)
            if kind != "barrier":
                args += ["--dtype", dtype, "--values", opsutil.values_arg(dtype, inputs[rank])]
            procs.append(ctl_popen(self.cluster, *args))
        rs = [finish(p, timeout=timeout) for p in procs]
        for rank, r in enumerate(rs):
            self.assertEqual(r.rc, 0, r)
            self.assertEqual((r.out["rank"], r.out["size"], r.out["status"]),
                             (rank, len(devices), "OK"), r)
        return rs

    def check(self, r, expected, what):
        why = opsutil.mismatch(expected, {"dtype": expected.dtype, "shape": expected.shape,
                                          "values": r.out["values"]})
        self.assertIsNone(why, "%s: %s" % (what, why))

    def test_all_reduce_every_op_and_dtype(self):
        self.start(SPEC3)
        rng = random.Random(self.id())
        n = 7  # not a multiple of the 5 ranks nor of the 3 workers
        for dtype in opsutil.DTYPES:
            for op in opsutil.REDUCE_OPS:
                with self.subTest(dtype=dtype, op=op):
                    ins = [opsutil.gen_values(rng, dtype, n, op, ranks=5) for _ in DEVS3]
                    rs = self.run_ranks("all-reduce", dtype, ins, "--reduce", op)
                    cols = [opsutil.reduce_column(dtype, op, [x[j] for x in ins])
                            for j in range(n)]
                    want = opsutil.Tensor(dtype, [n], [c[0] for c in cols], [c[1] for c in cols])
                    for r in rs:
                        self.check(r, want, "rank %d" % r.out["rank"])
                    # Every rank holds the same result, to the bit.
                    self.assertEqual(len({tuple(r.out["values"]) for r in rs}), 1, rs)

    def test_broadcast_reduce_all_gather_and_barrier(self):
        self.start(SPEC3)
        rng = random.Random(self.id())
        ins = [opsutil.gen_values(rng, "f64", 5) for _ in DEVS3]
        # Broadcast from rank 3 (on node-c): everybody gets its values, exactly.
        for r in self.run_ranks("broadcast", "f64", ins, "--root", "3"):
            self.assertEqual(r.out["values"], ins[3], r)
        # Reduce to rank 2: the root gets the max, the others keep their own values.
        rs = self.run_ranks("reduce", "i64", [[i + 10 * k for i in range(5)] for k in range(5)],
                            "--reduce", "max", "--root", "2")
        for k, r in enumerate(rs):
            want = [i + 40 for i in range(5)] if k == 2 else [i + 10 * k for i in range(5)]
            self.assertEqual(r.out["values"], want, r)
        # All-gather: every rank's values in rank order.
        ins = [[k * 100 + i for i in range(3)] for k in range(5)]
        for r in self.run_ranks("all-gather", "i32", ins):
            self.assertEqual(r.out["values"], [v for x in ins for v in x], r)
        self.run_ranks("barrier", None, None)

    def test_reduce_scatter_gives_each_rank_its_block(self):
        c = self.start(SPEC3)
        rng = random.Random(self.id())
        block = 3
        for dtype, op in (("i64", "sum"), ("f64", "mean"), ("i32", "min")):
            with self.subTest(dtype=dtype, op=op):
                ins = [opsutil.gen_values(rng, dtype, block * 5, op, ranks=5) for _ in DEVS3]
                rs = self.run_ranks("reduce-scatter", dtype, ins, "--reduce", op)
                cols = [opsutil.reduce_column(dtype, op, [x[j] for x in ins])
                        for j in range(block * 5)]
                for r in rs:
                    k = r.out["rank"]
                    mine = cols[k * block:(k + 1) * block]
                    want = opsutil.Tensor(dtype, [block], [m[0] for m in mine],
                                          [m[1] for m in mine])
                    self.check(r, want, "rank %d" % k)
        # Seven values do not split among five ranks: refused, clearly.
        rs = [finish(p) for p in
              [ctl_popen(c, "collective", "reduce-scatter", "--devices", ",".join(DEVS3),
                         "--self", d, "--dtype", "i32", "--values", "1,2,3,4,5,6,7",
                         "--reduce", "sum") for d in DEVS3]]
        for r in rs:
            self.assertEqual(r.rc, 1, r)
            self.assertEqual(r.out["status"], "INVALID_ARGUMENT", r)
            self.assertIn("not a multiple of the 5 ranks", r.out["message"])
        # Not a single-controller op.
        sub = c.ctl("submit", "--op", "reduce-scatter", "--reduce", "sum", "--tensor", "t",
                    "--devices", "node-a/cuda:0")
        self.assertEqual(sub.rc, 1, sub)
        self.assertIn("reduce-scatter is a group call", sub.out["message"])

    def test_one_element_and_two_ranks_on_one_worker(self):
        self.start({"node-a": ["cuda:0", "cuda:1"], "node-b": ["cuda:0"]})
        devs = ["node-a/cuda:0", "node-a/cuda:1"]
        rs = self.run_ranks("all-reduce", "i32", [[5], [-7]], "--reduce", "sum", devices=devs)
        self.assertEqual([r.out["values"] for r in rs], [[-2], [-2]])
        rs = self.run_ranks("all-reduce", "f32", [[1.5], [2.5]], "--reduce", "prod",
                            devices=["node-a/cuda:1", "node-b/cuda:0"])
        self.assertEqual([r.out["values"] for r in rs], [[3.75], [3.75]])

    def test_count_zero_is_refused_clearly(self):
        c = self.start({"node-a": ["cuda:0"], "node-b": ["cuda:0"]})
        r = c.ctl("collective", "all-reduce", "--devices", "node-a/cuda:0", "--self",
                  "node-a/cuda:0", "--dtype", "f32", "--count", "0", "--reduce", "sum")
        self.assertEqual(r.rc, 1, r)
        self.assertEqual(r.out["status"], "INVALID_ARGUMENT", r)
        self.assertIn("count 0", r.out["message"])
        self.assertIn("at least one element", r.out["message"])
        # No values at all is count 0 too.
        r = c.ctl("collective", "all-reduce", "--devices", "node-a/cuda:0", "--self",
                  "node-a/cuda:0", "--dtype", "f32", "--values", "", "--reduce", "sum")
        self.assertEqual(r.rc, 1, r)
        self.assertEqual(r.out["status"], "INVALID_ARGUMENT", r)
        self.assertIn("count 0", r.out["message"])
        # Every rank with 0: each hears that; one rank with 0: every rank hears who differs.
        devs = "node-a/cuda:0,node-b/cuda:0"
        for counts, text in ((("0", "0"), "count 0: a group all-reduce needs at least one element"),
                             (("3", "0"), "rank 1 (node-b/cuda:0) passed f32[0], rank 0 passed "
                                          "f32[3]")):
            with self.subTest(counts=counts):
                rs = [finish(p) for p in
                      [ctl_popen(c, "collective", "all-reduce", "--devices", devs, "--self", d,
                                 "--dtype", "f32", "--count", n, "--reduce", "sum")
                       for d, n in zip(devs.split(","), counts)]]
                for r in rs:
                    self.assertEqual(r.rc, 1, r)
                    self.assertEqual(r.out["status"], "INVALID_ARGUMENT", r)
                    self.assertIn(text, r.out["message"])

    def test_count_fills_rank_plus_one_and_repeat_times_calls(self):
        self.start({"node-a": ["cuda:0"], "node-b": ["cuda:0"]})
        devs = "node-a/cuda:0,node-b/cuda:0"
        procs = [ctl_popen(self.cluster, "collective", "all-reduce", "--devices", devs, "--self",
                           d, "--dtype", "i64", "--count", "1001", "--reduce", "sum",
                           "--repeat", "5") for d in devs.split(",")]
        for p in procs:
            r = finish(p)
            self.assertEqual(r.rc, 0, r)
            self.assertEqual(r.out["calls"], 5)
            self.assertNotIn("values", r.out)
            s = r.out["seconds"]
            self.assertTrue(0 < s["min"] <= s["median"] <= s["max"], s)


class FailuresTest(GroupsTestCase):
    def waiting_in_second_call(self, devs, stopper):
        """Every rank of devs all-reduces once; all but the one on worker `stopper` (the last
        rank) then start a second call, whose deadline is far (60 s), and wait in it. Returns
        their processes."""
        procs = [ctl_popen(self.cluster, "--timeout", "60s", "collective", "all-reduce",
                           "--devices", devs, "--self", d, "--dtype", "f32", "--values", "1,2",
                           "--reduce", "sum", "--repeat", "1" if d.startswith(stopper) else "2")
                 for d in devs.split(",")]
        self.assertEqual(finish(procs[-1]).rc, 0)
        time.sleep(0.3)  # the others' second calls reach their workers
        return procs[:-1]
    def test_a_disagreement_fails_every_rank_naming_the_first_that_differs(self):
        self.start({"node-a": ["cuda:0"], "node-b": ["cuda:0"], "node-c": ["cuda:0"]})
        devs = "node-a/cuda:0,node-b/cuda:0,node-c/cuda:0"
        cases = [
            # (per-rank extra args, what the message must say)
            ([["--dtype", "f32"], ["--dtype", "f32"], ["--dtype", "f64"]],
             "rank 2 (node-c/cuda:0) passed f64[4], rank 0 passed f32[4]"),
            ([["--dtype", "f32"], ["--dtype", "f32", "--values", "1,2,3"], ["--dtype", "f32"]],
             "rank 1 (node-b/cuda:0) passed f32[3], rank 0 passed f32[4]"),
            ([["--dtype", "f32"], ["--dtype", "f32", "--reduce", "max"], ["--dtype", "f32"]],
             "rank 1 (node-b/cuda:0) passed reduce max, rank 0 passed reduce sum"),
        ]
        for extras, text in cases:
            with self.subTest(text=text):
                procs = []
                for i, d in enumerate(devs.split(",")):
                    args = ["collective", "all-reduce", "--devices", devs, "--self", d]
                    e = list(extras[i])
                    if "--values" not in e:
                        e += ["--values", "1,2,3,4"]
                    if "--reduce" not in e:
                        e += ["--reduce", "sum"]
                    procs.append(ctl_popen(self.cluster, *(args + e)))
                for p in procs:
                    r = finish(p)
                    self.assertEqual(r.rc, 1, r)
                    self.assertEqual(r.out["status"], "INVALID_ARGUMENT", r)
                    self.assertIn(text, r.out["message"])
        # A broadcast whose ranks disagree on the root.
        procs = [ctl_popen(self.cluster, "collective", "broadcast", "--devices", devs, "--self", d,
                           "--dtype", "i32", "--values", "1", "--root", root)
                 for d, root in zip(devs.split(","), ("0", "0", "1"))]
        for p in procs:
            r = finish(p)
            self.assertEqual(r.out["status"], "INVALID_ARGUMENT", r)
            self.assertIn("rank 2 (node-c/cuda:0) passed root 1, rank 0 passed root 0",
                          r.out["message"])

    def test_a_rank_that_never_calls_is_named_at_the_deadline(self):
        c = self.start({"node-a": ["cuda:0"], "node-b": ["cuda:0", "cuda:1"]},
                       worker_extra={"groups": {"stall_warn_ms": 300}})
        devs = "node-a/cuda:0,node-b/cuda:0,node-b/cuda:1"
        # Every rank joins and makes call 1; node-b/cuda:1 (rank 2) then stops.
        procs = [ctl_popen(self.cluster, "--timeout", "6s", "collective", "barrier", "--devices",
                           devs, "--self", d, "--repeat", "2" if d != "node-b/cuda:1" else "1")
                 for d in devs.split(",")]
        self.assertEqual(finish(procs[2]).rc, 0)
        # Before the deadline, groups show names it as stalled (past stall_warn_ms).
        shown = []

        def stalled():
            groups = c.ctl_ok("groups", "list")["groups"]
            shown[:] = [s for g in groups for s in g["stalled"]]
            return shown

        harness.wait_until(stalled, 5, "groups list to show a stalled rank")
        self.assertEqual([(s["rank"], s["device"]) for s in shown], [(2, "node-b/cuda:1")])
        self.assertGreaterEqual(shown[0]["waiting_ms"], 300)
        rs = [finish(p) for p in procs]
        self.assertEqual(rs[2].rc, 0, rs[2])
        for r in rs[:2]:
            self.assertEqual(r.rc, 1, r)
            self.assertEqual(r.out["status"], "DEADLINE_EXCEEDED", r)
            self.assertEqual(r.out["calls"], 1, r)
            self.assertIn("rank 2 (node-b/cuda:1)", r.out["message"])
            self.assertNotIn("rank 0 (", r.out["message"])
            self.assertNotIn("rank 1 (", r.out["message"])
        self.assertIn("stalled", c.worker("node-b").log_text())

    def test_a_killed_worker_fails_the_others_naming_it_then_a_rejoin_works(self):
        c = self.start({"node-a": ["cuda:0"], "node-b": ["cuda:0"], "node-c": ["cuda:0"]})
        devs = "node-a/cuda:0,node-b/cuda:0,node-c/cuda:0"
        # Ranks on node-a and node-b wait in their second call, for node-c's rank which
        # stopped after one.
        procs = self.waiting_in_second_call(devs, "node-c")
        c.kill_worker("node-c")
        for p in procs:
            r = finish(p, timeout=30)
            self.assertEqual(r.rc, 1, r)
            self.assertEqual(r.out["status"], "UNAVAILABLE", r)
            self.assertIn("node-c", r.out["message"])
            self.assertEqual(r.out["calls"], 1, r)
        # node-c comes back; the ranks join again (the next generation) and all-reduce.
        c.restart_worker("node-c")
        c.wait_workers(["node-c"])
        rs = [finish(p) for p in
              [ctl_popen(c, "collective", "all-reduce", "--devices", devs, "--self", d,
                         "--dtype", "f32", "--values", "1,2", "--reduce", "sum")
               for d in devs.split(",")]]
        for r in rs:
            self.assertEqual(r.rc, 0, r)
            self.assertEqual(r.out["values"], [3.0, 6.0])
            self.assertEqual(r.out["generation"], 2)

    def test_a_worker_killed_while_parts_stream_fails_the_others_naming_it(self):
        # Issue 17: three workers all-reduce 4 MiB parts (round the ring on the data link)
        # call after call; node-c is killed while they stream. The others' ranks fail
        # UNAVAILABLE naming it, long before any call's deadline (60 s here).
        c = self.start({"node-a": ["cuda:0"], "node-b": ["cuda:0"], "node-c": ["cuda:0"]})
        devs = "node-a/cuda:0,node-b/cuda:0,node-c/cuda:0"
        procs = {d: ctl_popen(c, "--timeout", "60s", "collective", "all-reduce", "--devices",
                              devs, "--self", d, "--dtype", "f32", "--count", str(1 << 20),
                              "--reduce", "sum", "--repeat", "100000")
                 for d in devs.split(",")}
        # The first GroupSetup opens the data port: the join is complete.
        harness.wait_until(lambda: "data link listening" in c.worker("node-a").log_text(), 60,
                           "the ranks to join")
        time.sleep(1.5)  # calls under way, parts on the wire
        c.kill_worker("node-c")
        killed = time.monotonic()
        for d in ("node-a/cuda:0", "node-b/cuda:0"):
            r = finish(procs[d], timeout=60)
            self.assertEqual(r.rc, 1, r)
            self.assertEqual(r.out["status"], "UNAVAILABLE", r)
            self.assertIn("node-c", r.out["message"])
            self.assertGreater(r.out["calls"], 0, r)
        self.assertLess(time.monotonic() - killed, 30, "the ranks waited for a deadline")
        # node-c's own rank lost its worker: how long its client waits is not this test's.
        procs["node-c/cuda:0"].kill()
        procs["node-c/cuda:0"].communicate()

    def test_a_stopping_worker_answers_its_waiting_ranks_and_exits_cleanly(self):
        c = self.start({"node-a": ["cuda:0", "cuda:1"], "node-b": ["cuda:0"]})
        devs = "node-a/cuda:0,node-a/cuda:1,node-b/cuda:0"
        # node-a's two ranks wait in their second call for node-b's, which stopped.
        procs = self.waiting_in_second_call(devs, "node-b")
        self.assertEqual(c.terminate_worker("node-a"), 0)
        for p in procs:
            # The worker's own connections close first (its stop order): the ranks hear
            # UNAVAILABLE, as an unreachable worker (exit 3) or its refusal (exit 1).
            r = finish(p, timeout=30)
            self.assertIn(r.rc, (1, 3), r)
            self.assertEqual(r.out["status"], "UNAVAILABLE", r)
            self.assertEqual(r.out["calls"], 1, r)


class DataPathTest(GroupsTestCase):
    def metrics(self, port):
        return harness.metrics(port)

    def test_many_calls_reach_no_coordinator(self):
        http = harness.free_port()
        c = self.start({"node-a": ["cuda:0"], "node-b": ["cuda:0"]},
                       coordinator_config={"http": "127.0.0.1:%d" % http}, http=True)
        devs = "node-a/cuda:0,node-b/cuda:0"

        def coordinator_calls():
            m = self.metrics(http)
            return sum(v for k, v in m.items()
                       if k.startswith("devcoord_rpc_requests_total{") and
                       "Heartbeat" not in k)

        def group_rpcs():
            m = self.metrics(http)
            return {meth: m['devcoord_group_coordinator_rpcs_total{method="%s"}' % meth]
                    for meth in ("GroupJoin", "GroupLeave", "ListGroups")}

        before = coordinator_calls()
        rpcs_before = group_rpcs()
        procs = [ctl_popen(c, "--timeout", "60s", "collective", "all-reduce", "--devices", devs,
                           "--self", d, "--dtype", "f32", "--count", "16", "--reduce", "sum",
                           "--repeat", "1000") for d in devs.split(",")]
        for p in procs:
            r = finish(p, timeout=300)
            self.assertEqual(r.rc, 0, r)
            self.assertEqual(r.out["calls"], 1000, r)
        # Each rank called the coordinator twice (GroupJoin, GroupLeave), whatever the number
        # of group calls: none of them went through it.
        self.assertEqual(coordinator_calls() - before, 4)
        # The metric says the same: one GroupJoin and one GroupLeave per rank, none per call
        # (coordinator RPCs per group call after the join: 0).
        rpcs = group_rpcs()
        self.assertEqual({k: rpcs[k] - rpcs_before[k] for k in rpcs},
                         {"GroupJoin": 2, "GroupLeave": 2, "ListGroups": 0})
        port = int(c.worker_specs["node-a"]["http"].rsplit(":", 1)[1])
        wm = self.metrics(port)
        self.assertEqual(wm['devcoord_group_calls_total{kind="all-reduce"}'], 1000)
        self.assertEqual(wm["devcoord_group_call_seconds_count"], 1000)
        # Parts this small (16 f32) go whole as one frame each on the data link (no
        # GroupExchange RPC), none as bulk data frames, and the data port refused nobody.
        self.assertEqual(wm["devcoord_group_link_parts_sent_total"], 1000)
        self.assertEqual(wm["devcoord_group_link_parts_received_total"], 1000)
        self.assertEqual(wm['devcoord_rpc_requests_total{service="Worker",'
                            'method="GroupExchange",code="OK"}'], 0)
        self.assertEqual(wm["devcoord_group_link_bytes_sent_total"], 0)
        self.assertEqual(wm["devcoord_group_link_refused_total"], 0)


WORKER_SVC = "/devcoord.v1.Worker/"
CUDA = 2  # Backend.BACKEND_CUDA


def pb_msg(field, data):
    """A length-delimited field, even when empty (pb_bytes drops empty values)."""
    return harness.pb_varint(field << 3 | 2) + harness.pb_varint(len(data)) + data


def device_ref(worker, index):
    dev = harness.pb_uint(F("Device", "backend"), CUDA) + harness.pb_uint(F("Device", "index"),
                                                                          index)
    return pb_bytes(F("DeviceRef", "worker"), worker) + pb_msg(F("DeviceRef", "device"), dev)


def plan(devices, workers):
    """devices: [(worker, index)]; workers: [(name, address, [rank, ...])]."""
    body = b"".join(pb_msg(F("Plan", "devices"), device_ref(w, i)) for w, i in devices)
    for name, address, ranks in workers:
        pw = (pb_bytes(F("PlanWorker", "name"), name) + pb_bytes(F("PlanWorker", "address"), address)
              + pb_msg(F("PlanWorker", "ranks"), b"".join(harness.pb_varint(r) for r in ranks)))
        body += pb_msg(F("Plan", "workers"), pw)
    return body


def setup_body(group_id, generation, plan_body, self_index):
    return (pb_bytes(F("GroupSetupRequest", "group_id"), group_id)
            + harness.pb_uint(F("GroupSetupRequest", "generation"), generation)
            + (pb_msg(F("GroupSetupRequest", "plan"), plan_body) if plan_body is not None else b"")
            + harness.pb_uint(F("GroupSetupRequest", "self"), self_index))


def call_desc(rank, kind, dtype, count, reduce=1):
    return (harness.pb_uint(F("GroupCallDesc", "rank"), rank)
            + harness.pb_uint(F("GroupCallDesc", "kind"), kind)
            + harness.pb_uint(F("GroupCallDesc", "dtype"), dtype)
            + harness.pb_uint(F("GroupCallDesc", "count"), count)
            + harness.pb_uint(F("GroupCallDesc", "reduce"), reduce))


class PeerInputTest(GroupsTestCase):
    """What a peer (or anyone with the token) sends a worker's group methods is checked:
    refused with a code and a message, and the worker keeps serving."""

    def call(self, port, method, body, attachment=b"", timeout_ms=3000):
        with harness.RpcConnection(port) as conn:
            rid = random.randrange(1, 1 << 31)
            header = (harness.pb_uint(F("RequestHeader", "request_id"), rid)
                      + pb_bytes(F("RequestHeader", "method"), WORKER_SVC + method)
                      + harness.pb_uint(F("RequestHeader", "timeout_ms"), timeout_ms))
            return conn.call_raw(harness.frame(header, body, attachment), rid)

    def test_malformed_group_messages_are_refused_and_the_worker_goes_on(self):
        c = self.start({"node-a": ["cuda:0", "cuda:1"]})
        address = c.worker_specs["node-a"]["listen"]
        port = int(address.rsplit(":", 1)[1])
        gid = "00000000000000ab"
        two = [("node-a", 0), ("node-a", 1)]
        refusals = [
            ("GroupSetup", setup_body(gid, 1, None, 0)),
            ("GroupSetup", setup_body(gid, 1, plan(two, [("node-a", address, [0, 1])]), 5)),
            ("GroupSetup", setup_body(gid, 1, plan(two, [("node-a", address, [0, 0])]), 0)),
            ("GroupSetup", setup_body(gid, 1, plan(two, [("node-a", address, [0])]), 0)),
            ("GroupSetup", setup_body(gid, 1, plan(two, [("node-a", address, [0, 9])]), 0)),
            ("GroupSetup", setup_body(gid, 1, plan(two[:1], [("a", address, [0]),
                                                            ("b", address, [0])]), 0)),
            ("GroupSetup", setup_body("x" * 40, 1, plan(two, [("node-a", address, [0, 1])]), 0)),
        ]
        for method, body in refusals:
            code, message, _ = self.call(port, method, body)
            self.assertEqual(code, "INVALID_ARGUMENT", message)
            self.assertIn("malformed group setup", message)
        # Calls and exchanges for a group the worker does not have.
        code, message, _ = self.call(port, "GroupCall",
                                     pb_bytes(F("GroupCallRequest", "group_id"), gid))
        self.assertEqual(code, "INVALID_ARGUMENT", message)  # no call in it
        call = lambda rank, kind, dtype, count, gen=1, seq=1: (
            pb_bytes(F("GroupCallRequest", "group_id"), gid)
            + harness.pb_uint(F("GroupCallRequest", "generation"), gen)
            + harness.pb_uint(F("GroupCallRequest", "seq"), seq)
            + pb_msg(F("GroupCallRequest", "call"), call_desc(rank, kind, dtype, count)))
        code, message, _ = self.call(port, "GroupCall", call(0, 1, 1, 4))
        self.assertEqual(code, "FAILED_PRECONDITION", message)
        exchange = (pb_bytes(F("GroupExchangeRequest", "group_id"), gid)
                    + harness.pb_uint(F("GroupExchangeRequest", "generation"), 1)
                    + harness.pb_uint(F("GroupExchangeRequest", "seq"), 1))
        code, message, _ = self.call(port, "GroupExchange", exchange)
        self.assertEqual(code, "FAILED_PRECONDITION", message)
        # A well-formed setup: one worker, two ranks. Then calls that do not hold.
        code, message, _ = self.call(
            port, "GroupSetup", setup_body(gid, 1, plan(two, [("node-a", address, [0, 1])]), 0))
        self.assertEqual(code, "OK", message)
        # Malformed: refused at once.
        bad_calls = [
            (call(0, 1, 1, 4, gen=2), b"\0" * 16, "FAILED_PRECONDITION", "generation"),
            (call(7, 1, 1, 4), b"\0" * 16, "INVALID_ARGUMENT", "not on this worker"),
            (call(0, 1, 1, 4), b"\0" * 15, "INVALID_ARGUMENT", "carries 15 bytes"),
        ]
        for body, att, want, text in bad_calls:
            code, message, _ = self.call(port, "GroupCall", body, att)
            self.assertEqual(code, want, message)
            self.assertIn(text, message)
        # Well formed but not a call that can be made: both ranks make it, both hear why.
        undoable = [
            ((99, 1, 4), b"\0" * 16, "INVALID_ARGUMENT", "unknown group call kind"),
            ((1, 99, 4), b"\0" * 16, "INVALID_ARGUMENT", "unknown dtype"),
            ((1, 1, 1 << 60), b"\0" * 16, "OUT_OF_RANGE", "larger than one message"),
            ((4, 1, 1 << 20), b"", "OUT_OF_RANGE", "larger than one message"),
        ]
        for seq, (desc, att, want, text) in enumerate(undoable, start=1):
            with ThreadPoolExecutor(2) as ex:
                futures = [ex.submit(self.call, port, "GroupCall", call(r, *desc, seq=seq), att)
                           for r in (0, 1)]
                for f in futures:
                    code, message, _ = f.result()
                    self.assertEqual(code, want, message)
                    self.assertIn(text, message)
        bad_exchange = exchange + harness.pb_uint(F("GroupExchangeRequest", "from"), 0)
        code, message, _ = self.call(port, "GroupExchange", bad_exchange)
        self.assertEqual(code, "INVALID_ARGUMENT", message)
        code, message, _ = self.call(port, "GroupStatus",
                                     pb_bytes(F("GroupStatusRequest", "group_id"), gid))
        self.assertEqual(code, "OK", message)
        # The worker still serves a real group.
        rs = [finish(p) for p in
              [ctl_popen(c, "collective", "all-reduce", "--devices", "node-a/cuda:0,node-a/cuda:1",
                         "--self", d, "--dtype", "i64", "--values", "2,3", "--reduce", "prod")
               for d in ("node-a/cuda:0", "node-a/cuda:1")]]
        self.assertEqual([r.out.get("values") for r in rs], [[4, 9], [4, 9]], rs)


class RingTest(DataPathTest):
    @unittest.skipUnless(os.path.exists(os.environ.get("DEVCOORD_GROUP_THREADS") or ""),
                         "devcoord-group-threads is not built")
    def run_program(self, only=None, huge=None):
        """devcoord-group-threads, one rank on each of three workers: its all-reduces several
        messages long (i32 sum, f64 mean, every result checked) go round the ring of
        workers; huge: then an all-reduce and a reduce of that many i32. Returns the
        program's run and each worker's metrics."""
        c = self.start({"node-a": ["cuda:0"], "node-b": ["cuda:0"], "node-c": ["cuda:0"]},
                       http=True, only=only)
        devs = "node-a/cuda:0,node-b/cuda:0,node-c/cuda:0"
        p = subprocess.run([os.environ["DEVCOORD_GROUP_THREADS"], c.addr, devs, "1"]
                           + ([str(huge)] if huge else []),
                           capture_output=True, timeout=300, text=True)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout.strip(), "ok 3")
        return p, {name: self.metrics(int(c.worker_specs[name]["http"].rsplit(":", 1)[1]))
                   for name in ("node-a", "node-b", "node-c")}

    @unittest.skipUnless(os.path.exists(os.environ.get("DEVCOORD_GROUP_THREADS") or ""),
                         "devcoord-group-threads is not built")
    def test_large_all_reduces_go_round_the_ring_with_right_results(self):
        _, ms = self.run_program()
        for name, m in ms.items():
            # Every rank stages its buffers on shared memory with its worker, so each of the
            # three big all-reduces (blocking i32, f64 mean, the asynchronous i32) is one
            # call, one ring; the small ones and the all-gathers go direct.
            self.assertEqual(m["devcoord_group_ring_calls_total"], 3, name)
            # Each in place in the rank's staging block, the only rank on its worker: the
            # ring runs there, no copy in or out.
            self.assertEqual(m["devcoord_group_ring_in_region_calls_total"], 3, name)
            self.assertGreater(m["devcoord_group_shm_calls_total"], 0, name)
            # The big reduce-scatter is one call round the ring, its reduce-scatter steps
            # alone; the small one goes to every worker directly.
            self.assertEqual(m['devcoord_group_calls_total{kind="reduce-scatter"}'], 2, name)
            self.assertEqual(m["devcoord_group_ring_reduce_scatter_calls_total"], 1, name)
            # The big all-gather's parts go to every worker on the data link.
            self.assertGreater(m["devcoord_group_link_bytes_sent_total"], 4 << 20, name)

    @unittest.skipUnless(os.path.exists(os.environ.get("DEVCOORD_GROUP_THREADS") or ""),
                         "devcoord-group-threads is not built")
    def test_reduce_scatter_rings_with_two_ranks_on_a_worker(self):
        # Two ranks on node-a, one on node-b: ranks go by worker name, so node-a's are 0 and
        # 1, and their two blocks make one segment of node-a's ring (twice node-b's).
        # group_threads checks each rank's block (rank-dependent inputs, each counted once).
        c = self.start({"node-a": ["cuda:0", "cuda:1"], "node-b": ["cuda:0"]}, http=True)
        p = subprocess.run([os.environ["DEVCOORD_GROUP_THREADS"], c.addr,
                            "node-b/cuda:0,node-a/cuda:1,node-a/cuda:0", "1"],
                           capture_output=True, timeout=300, text=True)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout.strip(), "ok 3")
        for name in ("node-a", "node-b"):
            m = self.metrics(int(c.worker_specs[name]["http"].rsplit(":", 1)[1]))
            self.assertEqual(m['devcoord_group_calls_total{kind="reduce-scatter"}'], 2, name)
            self.assertEqual(m["devcoord_group_ring_reduce_scatter_calls_total"], 1, name)
            # The three big all-reduces go round the ring in place, on node-a in rank 0's
            # region with rank 1's input reduced in segment by segment (group_threads
            # checks every rank's result; its inputs depend on the rank).
            self.assertEqual(m["devcoord_group_ring_calls_total"], 3, name)
            self.assertEqual(m["devcoord_group_ring_in_region_calls_total"], 3, name)

    @unittest.skipUnless(os.path.exists(os.environ.get("DEVCOORD_GROUP_THREADS") or ""),
                         "devcoord-group-threads is not built")
    def test_calls_past_64_mib_go_as_several_whole_calls(self):
        # 17,000,003 i32 (68 MB): across workers a whole call holds at most 64 MiB on a
        # worker, so the all-reduce is two rings (64 MiB, then the rest) and the reduce,
        # whose workers each hold a part from the two others, three calls of 32 MiB or less.
        _, ms = self.run_program(huge=17000003)
        for name, m in ms.items():
            self.assertEqual(m["devcoord_group_ring_calls_total"], 3 + 2, name)
            self.assertEqual(m["devcoord_group_ring_in_region_calls_total"], 3 + 2, name)
            self.assertEqual(m['devcoord_group_calls_total{kind="reduce"}'], 1 + 3, name)

    @unittest.skipUnless(os.path.exists(os.environ.get("DEVCOORD_GROUP_THREADS") or ""),
                         "devcoord-group-threads is not built")
    def test_a_rank_without_shared_memory_makes_every_rank_go_in_parts(self):
        # node-c maps nothing: its rank can have no staging block, the ranks agree before
        # the first big call to make it in parts, each part one ring, with the same results.
        p, ms = self.run_program(only={"node-c": {"groups": {"shm_max_bytes": 0}}})
        self.assertIn("this call goes in parts", p.stderr)
        for name, m in ms.items():
            self.assertEqual(m["devcoord_group_ring_calls_total"], 6, name)
            self.assertEqual(m["devcoord_group_ring_in_region_calls_total"], 0, name)
            self.assertEqual(m["devcoord_group_shm_calls_total"], 0, name)

    test_many_calls_reach_no_coordinator = None


class BufferCacheTest(DataPathTest):
    """Issue 17: a call's large buffers come from the worker's cache (groups.buffer_cache_bytes)
    and go back to it, so calls of one size allocate nothing large after the first few."""

    CACHE = "devcoord_group_buffer_cache_"

    def cache(self, m):
        return {k: v for k, v in m.items() if k.startswith(self.CACHE)}

    def settled(self, port):
        """The worker's metrics once every buffer is back (the last call's parts may still be
        on their way out when its ranks have the result)."""
        deadline = time.monotonic() + 10
        while True:
            m = self.metrics(port)
            if (m[self.CACHE + "mapped_bytes"] == m[self.CACHE + "kept_bytes"]
                    or time.monotonic() > deadline):
                return m
            time.sleep(0.05)

    def test_calls_of_one_size_reuse_their_buffers(self):
        # The workers map no shared memory, so the ranks' bytes come on the call link, into
        # buffers of the cache (with it, the library would stage them: test_groups_shm).
        c = self.start({"node-a": ["cuda:0"], "node-b": ["cuda:0"]}, http=True,
                       worker_extra={"groups": {"shm_max_bytes": 0}})
        devs = "node-a/cuda:0,node-b/cuda:0"
        ports = {n: int(c.worker_specs[n]["http"].rsplit(":", 1)[1]) for n in c.worker_specs}
        # 20,000 f32 (80 KB): parts over the data link to each other directly. Each rank's
        # values differ; the sums are exact in f32.
        n = 20000
        vals = {"node-a/cuda:0": [float(i % 7) for i in range(n)],
                "node-b/cuda:0": [(i % 5) * 0.5 for i in range(n)]}
        procs = [ctl_popen(c, "--timeout", "60s", "collective", "all-reduce", "--devices", devs,
                           "--self", d, "--dtype", "f32", "--reduce", "sum", "--repeat", "30",
                           "--values", ",".join("%g" % v for v in vals[d]))
                 for d in devs.split(",")]
        want = [a + b for a, b in zip(vals["node-a/cuda:0"], vals["node-b/cuda:0"])]
        for p in procs:
            r = finish(p, timeout=120)
            self.assertEqual(r.rc, 0, r)
            self.assertEqual(r.out["calls"], 30, r)
            self.assertEqual(r.out["values"], want)
        small = {name: self.settled(port) for name, port in ports.items()}
        for name, m in small.items():
            # Per call: this worker's part, the peer's part and the result, 80 KB each. The
            # first call (and a call overlapping the last one's sends) maps; the rest reuse.
            takes = m[self.CACHE + "hits_total"] + m[self.CACHE + "misses_total"]
            self.assertGreaterEqual(takes, 90, name)
            self.assertLessEqual(m[self.CACHE + "misses_total"], 8, (name, self.cache(m)))
            self.assertEqual(m[self.CACHE + "unmapped_total"], 0, name)
            self.assertEqual(m[self.CACHE + "max_bytes"], 256 << 20, name)
            self.assertGreater(m[self.CACHE + "kept_bytes"], 0, name)
        # 1 MiB parts go round the ring, another size class: two buffers per worker, ever
        # (issue 17's flat RSS). The call link reads the rank's bytes into one, which the ring
        # reduces in and the answer is written from; it goes back once the answer is written
        # and no send reads it, before the rank's next call is read. The ring's receive buffer
        # goes back when the reduce-scatter is over, before the peer can start its next call.
        procs = [ctl_popen(c, "--timeout", "60s", "collective", "all-reduce", "--devices", devs,
                           "--self", d, "--dtype", "f32", "--count", str(1 << 18), "--reduce",
                           "sum", "--repeat", "1000") for d in devs.split(",")]
        for p in procs:
            r = finish(p, timeout=120)
            self.assertEqual(r.rc, 0, r)
            self.assertEqual(r.out["calls"], 1000, r)
        for name, port in ports.items():
            m = self.settled(port)
            self.assertEqual(m["devcoord_group_ring_calls_total"], 1000, name)
            misses = m[self.CACHE + "misses_total"] - small[name][self.CACHE + "misses_total"]
            hits = m[self.CACHE + "hits_total"] - small[name][self.CACHE + "hits_total"]
            self.assertGreaterEqual(hits + misses, 2000, name)
            self.assertGreaterEqual(m["devcoord_group_call_link_calls_total"], 1000, name)
            self.assertLessEqual(misses, 2, (name, self.cache(m)))
            self.assertEqual(m[self.CACHE + "mapped_bytes"], m[self.CACHE + "kept_bytes"], name)

    @unittest.skipUnless(os.path.exists(THREADS), "devcoord-group-threads is not built")
    def test_a_small_cache_stays_in_its_bound_and_concurrent_calls_stay_right(self):
        # Ranks as threads making calls of several sizes at once, some in flight together
        # (every result checked by the program), against a cache of 3 MiB: buffers given back
        # to a full cache are unmapped, none is handed to two calls.
        bound = 3 << 20
        c = self.start(SPEC3, http=True,
                       worker_extra={"groups": {"buffer_cache_bytes": bound}})
        p = subprocess.run([THREADS, c.addr, ",".join(DEVS3), "20"], capture_output=True,
                           timeout=300, text=True)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout.strip(), "ok 5")
        unmapped = 0
        for name in SPEC3:
            m = self.settled(int(c.worker_specs[name]["http"].rsplit(":", 1)[1]))
            self.assertEqual(m[self.CACHE + "max_bytes"], bound, name)
            self.assertLessEqual(m[self.CACHE + "kept_bytes"], bound, name)
            self.assertEqual(m[self.CACHE + "mapped_bytes"], m[self.CACHE + "kept_bytes"], name)
            self.assertGreater(m[self.CACHE + "hits_total"], 0, name)
            unmapped += m[self.CACHE + "unmapped_total"]
        self.assertGreater(unmapped, 0)

    test_many_calls_reach_no_coordinator = None


class DataLinkInputTest(GroupsTestCase):
    """Issue 17: anything a client sends the data port is refused without a crash, a hang or
    an allocation of what it announces, and the worker goes on serving groups."""

    call = PeerInputTest.call

    def link(self, port):
        code, message, body = self.call(port, "GroupLink", b"")
        self.assertEqual(code, "OK", message)
        fields = harness.pb_decode(body)
        address = fields[1][0].decode()
        secret = fields[2][0]
        self.assertEqual(len(secret), 32)
        return int(address.rsplit(":", 1)[1]), secret

    def setup_with_a_fake_peer(self, gid, http=False):
        """node-a alone, in generation 1 of group gid with rank 1 on a "node-b" nobody serves
        (never dialed). Returns the cluster, node-a's RPC port and node-b's address."""
        c = self.start({"node-a": ["cuda:0"]}, http=http)
        address = c.worker_specs["node-a"]["listen"]
        rpc_port = int(address.rsplit(":", 1)[1])
        peer_b = "tcp://127.0.0.1:%d" % harness.free_port()
        code, message, _ = self.call(rpc_port, "GroupSetup", setup_body(
            gid, 1, plan([("node-a", 0), ("node-b", 0)],
                         [("node-a", address, [0]), ("node-b", peer_b, [1])]), 0))
        self.assertEqual(code, "OK", message)
        return c, rpc_port, peer_b

    def test_a_part_frame_is_taken_only_from_the_worker_it_names(self):
        gid = "00000000000000ef"
        c, rpc_port, peer_b = self.setup_with_a_fake_peer(gid, http=True)
        port, secret = self.link(rpc_port)
        part = (pb_bytes(F("GroupExchangeRequest", "group_id"), gid)
                + harness.pb_uint(F("GroupExchangeRequest", "generation"), 1)
                + harness.pb_uint(F("GroupExchangeRequest", "seq"), 1)
                + harness.pb_uint(F("GroupExchangeRequest", "from"), 1)
                + pb_msg(F("GroupExchangeRequest", "calls"), call_desc(1, 1, 3, 4))
                + harness.pb_uint(F("GroupExchangeRequest", "has_data"), 1))
        data = struct.pack("<4i", 1, 2, 3, 4)
        frame = dlink_header(5, len(part) + len(data), sender=1, seq=1, offset=len(part),
                             total=len(part) + len(data)) + part + data

        def hello(addr):
            return dlink_header(1, 32 + len(addr)) + secret + addr.encode()

        # From a connection that says it is someone else: refused, the connection dropped.
        self.assertTrue(dlink_closed_by_worker(port, hello("tcp://127.0.0.1:9") + frame))
        wport = int(c.worker_specs["node-a"]["http"].rsplit(":", 1)[1])
        metrics = DataPathTest.metrics
        self.assertEqual(metrics(self, wport)["devcoord_group_link_parts_received_total"], 0)
        # From node-b's address: taken (the call now waits for rank 0), the connection stays.
        self.assertFalse(dlink_closed_by_worker(port, hello(peer_b) + frame, wait=1.0))
        m = metrics(self, wport)
        self.assertEqual(m["devcoord_group_link_parts_received_total"], 1)
        self.assertEqual(m["devcoord_group_link_refused_total"], 1)

    def two_workers_and_a_link_posing_as_node_a(self, gid):
        """node-a and node-b in generation 1 of group gid (rank 0 on node-a, 1 on node-b),
        and a data connection to node-b that says it is node-a (it knows the secret).
        Returns the RPC ports by worker and that connection."""
        c = self.start({"node-a": ["cuda:0"], "node-b": ["cuda:0"]})
        addr = {w: c.worker_specs[w]["listen"] for w in ("node-a", "node-b")}
        rpc = {w: int(a.rsplit(":", 1)[1]) for w, a in addr.items()}
        two = plan([("node-a", 0), ("node-b", 0)],
                   [("node-a", addr["node-a"], [0]), ("node-b", addr["node-b"], [1])])
        for index, w in enumerate(("node-a", "node-b")):
            code, message, _ = self.call(rpc[w], "GroupSetup", setup_body(gid, 1, two, index))
            self.assertEqual(code, "OK", message)
        port, secret = self.link(rpc["node-b"])
        fake = socket.create_connection(("127.0.0.1", port), timeout=60.0)
        self.addCleanup(fake.close)
        fake.sendall(dlink_header(1, 32 + len(addr["node-a"])) + secret + addr["node-a"].encode())
        return rpc, fake

    @staticmethod
    def group_call(gid, rank, seq):
        return (pb_bytes(F("GroupCallRequest", "group_id"), gid)
                + harness.pb_uint(F("GroupCallRequest", "generation"), 1)
                + harness.pb_uint(F("GroupCallRequest", "seq"), seq)
                + pb_msg(F("GroupCallRequest", "call"), call_desc(rank, 1, 3, 4)))

    def call_with_a_long_deadline(self, port, body, data):
        """GroupCall with a 30 s deadline: an answer before it is the worker's own."""
        with harness.RpcConnection(port, timeout=60.0) as conn:
            rid = random.randrange(1, 1 << 31)
            header = (harness.pb_uint(F("RequestHeader", "request_id"), rid)
                      + pb_bytes(F("RequestHeader", "method"), WORKER_SVC + "GroupCall")
                      + harness.pb_uint(F("RequestHeader", "timeout_ms"), 30000))
            return conn.call_raw(harness.frame(header, body, data), rid)

    def test_a_refused_part_ends_the_generation_on_its_sender_at_once(self):
        """A worker that refuses a peer's part ends the generation and tells its peers
        (GroupEnd): the sender's rank hears why, not DEADLINE_EXCEEDED at its deadline."""
        gid = "00000000000000ee"
        rpc, fake = self.two_workers_and_a_link_posing_as_node_a(gid)
        # node-b first gets a part of call 1 "from node-a": it keeps it, waiting for its
        # own rank. The connection stays open (its close would end the group: see below).
        part = (pb_bytes(F("GroupExchangeRequest", "group_id"), gid)
                + harness.pb_uint(F("GroupExchangeRequest", "generation"), 1)
                + harness.pb_uint(F("GroupExchangeRequest", "seq"), 1)
                + pb_msg(F("GroupExchangeRequest", "calls"), call_desc(0, 1, 3, 4))
                + harness.pb_uint(F("GroupExchangeRequest", "has_data"), 1))
        data = struct.pack("<4i", 1, 2, 3, 4)
        fake.sendall(dlink_header(5, len(part) + len(data), sender=0, seq=1, offset=len(part),
                                  total=len(part) + len(data)) + part + data)
        fake.settimeout(1.0)
        with self.assertRaises(socket.timeout):  # taken: the connection is not closed
            fake.recv(1)
        # node-a's rank calls: node-a's real part is a duplicate to node-b, which refuses it.
        code, message, _ = self.call_with_a_long_deadline(
            rpc["node-a"], self.group_call(gid, 0, 1), data)
        self.assertEqual(code, "ALREADY_EXISTS", message)
        self.assertIn("worker node-b ended generation 1 of group " + gid, message)
        self.assertIn("duplicate group exchange", message)
        # Every later call of the generation fails the same way, on both workers.
        for w, rank, seq in (("node-a", 0, 2), ("node-b", 1, 1)):
            code, message, _ = self.call(rpc[w], "GroupCall", self.group_call(gid, rank, seq),
                                         data)
            self.assertEqual(code, "ALREADY_EXISTS", (w, message))
            self.assertIn("duplicate group exchange", message)

    def test_a_dropped_data_connection_ends_the_generation_on_both_sides(self):
        """node-b takes the close of node-a's data connection for node-a's going away and
        ends the generation; node-a, alive, hears it from node-b (GroupEnd), so its rank
        fails at once instead of waiting for node-b's part until its deadline."""
        gid = "00000000000000ec"
        rpc, fake = self.two_workers_and_a_link_posing_as_node_a(gid)
        fake.settimeout(1.0)
        with self.assertRaises(socket.timeout):  # the hello is taken
            fake.recv(1)
        fake.close()
        code, message, _ = self.call_with_a_long_deadline(
            rpc["node-a"], self.group_call(gid, 0, 1), struct.pack("<4i", 1, 2, 3, 4))
        self.assertEqual(code, "UNAVAILABLE", message)
        self.assertIn("worker node-b ended generation 1 of group " + gid, message)
        self.assertIn("its data connection dropped", message)

    def test_a_repeated_data_frame_ends_the_generation_naming_it(self):
        """A part's frames come in order on one connection: a frame sent twice would complete
        the part with bytes that never came. node-b refuses it and ends the generation, so
        its rank hears why at once, not DEADLINE_EXCEEDED."""
        gid = "00000000000000eb"
        rpc, fake = self.two_workers_and_a_link_posing_as_node_a(gid)
        half = dlink_header(2, 8, sender=0, group=harness.dlink_group_hash(gid), generation=1,
                            seq=1, offset=0, total=16) + b"\1" * 8
        fake.sendall(half + half)
        code, message, _ = self.call_with_a_long_deadline(
            rpc["node-b"], self.group_call(gid, 1, 1), struct.pack("<4i", 1, 2, 3, 4))
        self.assertEqual(code, "INVALID_ARGUMENT", message)
        self.assertIn("worker node-a of group %s sent call 1's data: a data frame at byte 0 "
                      "where byte 8 was next (repeated or out of order)" % gid, message)

    def test_a_repeated_ring_frame_ends_the_generation_naming_it(self):
        """The same for a ring step: node-a's first reduce-scatter step is node-b's half
        (bytes 8-16 of 16); a frame of it sent twice is refused, not counted twice."""
        gid = "00000000000000e9"
        _, rpc_port, peer_b = self.setup_with_a_fake_peer(gid)
        port, secret = self.link(rpc_port)
        step0 = dlink_header(2, 8, flags=1, sender=1, group=harness.dlink_group_hash(gid),
                             generation=1, seq=1, offset=8, total=16) + b"\1" * 8
        fake = socket.create_connection(("127.0.0.1", port), timeout=60.0)
        self.addCleanup(fake.close)  # open until the end: its close would end the generation
        fake.sendall(dlink_header(1, 32 + len(peer_b)) + secret + peer_b.encode()
                     + step0 + step0)
        code, message, _ = self.call_with_a_long_deadline(
            rpc_port, self.group_call(gid, 0, 1), struct.pack("<4i", 1, 2, 3, 4))
        self.assertEqual(code, "INVALID_ARGUMENT", message)
        self.assertIn("worker node-b of group %s sent call 1's data: a data frame at byte 8 "
                      "where byte 16 was next (repeated or out of order)" % gid, message)

    def test_what_comes_for_a_call_that_ended_is_dropped_and_the_group_goes_on(self):
        """A call that ended here (its deadline passed) is remembered: the rank calling it
        again hears so at once, and a late ring frame of it is read and dropped instead of
        being taken for a new call (an all-gather frame would have ended the generation)."""
        gid = "00000000000000ea"
        _, rpc_port, peer_b = self.setup_with_a_fake_peer(gid)

        def call(seq):
            body = (self.group_call(gid, 0, seq)
                    + harness.pb_uint(F("GroupCallRequest", "timeout_ms"), 300))
            return self.call(rpc_port, "GroupCall", body, struct.pack("<4i", 1, 2, 3, 4))

        code, message, _ = call(1)  # node-b never sends its part
        self.assertEqual(code, "DEADLINE_EXCEEDED", message)
        code, message, _ = call(1)
        self.assertEqual(code, "ABORTED", message)
        self.assertIn("call 1 of group %s already ended on this worker" % gid, message)
        port, secret = self.link(rpc_port)
        frame = dlink_header(2, 8, flags=2, sender=1, group=harness.dlink_group_hash(gid),
                             generation=1, seq=1, offset=8, total=16) + b"\0" * 8
        fake = socket.create_connection(("127.0.0.1", port), timeout=60.0)
        self.addCleanup(fake.close)  # open until the end: its close would end the generation
        fake.sendall(dlink_header(1, 32 + len(peer_b)) + secret + peer_b.encode() + frame)
        fake.settimeout(1.0)
        with self.assertRaises(socket.timeout):  # taken: the connection is not closed
            fake.recv(1)
        code, message, _ = call(2)  # the generation goes on: this one waits for node-b
        self.assertEqual(code, "DEADLINE_EXCEEDED", message)

    def test_group_end_from_a_peer_is_checked_then_ends_the_generation(self):
        gid = "00000000000000ed"
        _, rpc_port, _ = self.setup_with_a_fake_peer(gid)

        def end(frm, code=harness.CODES.index("RESOURCE_EXHAUSTED"), gen=1, status=True):
            st = (harness.pb_uint(F("Status", "code"), code)
                  + pb_bytes(F("Status", "message"), "parts over the limit"))
            return (pb_bytes(F("GroupEndRequest", "group_id"), gid)
                    + harness.pb_uint(F("GroupEndRequest", "generation"), gen)
                    + harness.pb_uint(F("GroupEndRequest", "from"), frm)
                    + (pb_msg(F("GroupEndRequest", "status"), st) if status else b""))

        for body in (end(0), end(2), end(1, code=0), end(1, status=False)):
            code, message, _ = self.call(rpc_port, "GroupEnd", body)
            self.assertEqual(code, "INVALID_ARGUMENT", message)
            self.assertIn("malformed group end", message)
        # Another generation: nothing to end.
        code, message, _ = self.call(rpc_port, "GroupEnd", end(1, gen=7))
        self.assertEqual(code, "OK", message)
        call = (pb_bytes(F("GroupCallRequest", "group_id"), gid)
                + harness.pb_uint(F("GroupCallRequest", "generation"), 1)
                + harness.pb_uint(F("GroupCallRequest", "seq"), 1)
                + pb_msg(F("GroupCallRequest", "call"), call_desc(0, 1, 3, 4)))
        code, message, _ = self.call(rpc_port, "GroupEnd", end(1))
        self.assertEqual(code, "OK", message)
        code, message, _ = self.call(rpc_port, "GroupCall", call, b"\0" * 16)
        self.assertEqual(code, "RESOURCE_EXHAUSTED", message)
        self.assertIn("worker node-b ended generation 1 of group %s: parts over the limit" % gid,
                      message)

    def test_garbage_on_the_data_port_is_refused_and_the_worker_goes_on(self):
        c = self.start({"node-a": ["cuda:0"], "node-b": ["cuda:0"]}, http=True,
                       worker_extra={"limits": {"handshake_timeout_ms": 500}})
        rpc_port = int(c.worker_specs["node-a"]["listen"].rsplit(":", 1)[1])
        port, secret = self.link(rpc_port)
        hello = dlink_header(1, 32 + 9) + secret + b"tcp://x:1"
        hostile = [
            os.urandom(4096),                                   # noise
            b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",               # another protocol
            b"DCDL",                                            # a short frame, then silence
            b"",                                                # nothing at all
            dlink_header(1, 32, version=9) + secret,             # a version it does not speak
            dlink_header(1, 32) + b"\0" * 32,                    # a wrong secret
            dlink_header(2, 16, total=16) + b"\0" * 16,          # data before HELLO
            hello + dlink_header(2, 0xFFFFFFFF, total=1 << 40),  # 4 GiB announced
            hello + dlink_header(2, 64, total=16),               # bytes outside the part
            hello + dlink_header(5, 8, offset=4, total=8) + b"\xff" * 8,  # a part's garbage
            hello + dlink_header(5, 600000, total=600000),       # a part past one chunk
            hello + dlink_header(5, 8, offset=9, total=8),       # its request past its end
        ]
        for i, data in enumerate(hostile):
            self.assertTrue(dlink_closed_by_worker(port, data), "case %d stayed open" % i)
        # A good HELLO and a frame for no group here: read, dropped, the connection stays.
        self.assertFalse(dlink_closed_by_worker(
            port, hello + dlink_header(2, 8, total=8, group=1, generation=1, seq=1) + b"x" * 8,
            wait=1.0))
        wport = int(c.worker_specs["node-a"]["http"].rsplit(":", 1)[1])
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % wport, timeout=10) as f:
            text = f.read().decode()
        self.assertIn("devcoord_group_link_refused_total %d" % len(hostile), text)
        self.assertTrue(c.workers["node-a"].running())
        # The worker still serves a group across workers, its bytes over the data link.
        devs = "node-a/cuda:0,node-b/cuda:0"
        rs = [finish(p) for p in
              [ctl_popen(c, "collective", "all-reduce", "--devices", devs, "--self", d,
                         "--dtype", "f32", "--values", "1.5,2", "--reduce", "sum")
               for d in devs.split(",")]]
        self.assertEqual([r.out.get("values") for r in rs], [[3.0, 4.0], [3.0, 4.0]], rs)


recv_exactly = harness.recv_exactly


def call_link_answer(sock):
    """(code, payload) of a DLINK_ANSWER read from sock."""
    hdr = recv_exactly(sock, 56)
    kind, length = struct.unpack_from("<BxxxI", hdr, 5)[0], struct.unpack_from("<I", hdr, 12)[0]
    code = struct.unpack_from("<Q", hdr, 40)[0]
    if hdr[:4] != b"DCDL" or kind != 4:
        raise AssertionError("not an answer: %r" % hdr)
    return code, recv_exactly(sock, length)


class ControlLinkTest(GroupsTestCase):
    """Issue 17: the coordinator's Execute and Commit come as RPC frames on control links to
    the worker's data port (HELLO flag DLINK_HELLO_CONTROL with the peers' secret); each frame
    is served by the worker's RPC server as if it had come as an RPC, and anything else there
    drops the connection."""

    call = PeerInputTest.call

    @staticmethod
    def rpc_frame(method, body, rid, token=b""):
        header = (harness.pb_uint(F("RequestHeader", "request_id"), rid)
                  + pb_bytes(F("RequestHeader", "method"), method)
                  + harness.pb_uint(F("RequestHeader", "timeout_ms"), 3000)
                  + pb_bytes(F("RequestHeader", "token"), token))
        return harness.frame(header, body)

    def control_call(self, sock, seq, payload):
        sock.sendall(dlink_header(3, len(payload), seq=seq, total=len(payload)) + payload)
        code, reply = call_link_answer(sock)
        self.assertEqual(code, 0, reply)
        return harness.parse_reply(reply)

    def test_rpc_frames_on_a_control_link_and_what_it_refuses(self):
        c = self.start({"node-a": ["cuda:0"]})
        rpc_port = int(c.worker_specs["node-a"]["listen"].rsplit(":", 1)[1])
        code, message, body = self.call(rpc_port, "GroupLink", b"")
        self.assertEqual(code, "OK", message)
        fields = harness.pb_decode(body)
        port, secret = int(fields[1][0].decode().rsplit(":", 1)[1]), fields[2][0]
        self.assertEqual(fields[3][0] & 4, 4, "GroupLink offers control links (features bit 2)")
        hello = dlink_header(1, 32 + 11, flags=1) + secret + b"coordinator"
        commit = pb_bytes(F("CommitRequest", "op_id"), "op-1-1")
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(hello)
            # Served by the RPC server: Commit's own refusal, then a method it lacks, then
            # bytes that are no frame at all; the link stays usable after each.
            self.assertEqual(self.control_call(sock, 1, self.rpc_frame(
                WORKER_SVC + "Commit", commit, 7))[:2],
                ("NOT_FOUND", "no prepared op op-1-1 on this worker"))
            code, message, _ = self.control_call(sock, 2, self.rpc_frame(
                WORKER_SVC + "Nope", b"", 8))
            self.assertEqual(code, "UNIMPLEMENTED", message)
            code, message, _ = self.control_call(sock, 3, b"\xff" * 16)
            self.assertEqual(code, "INVALID_ARGUMENT", message)
            self.assertIn("undecodable request", message)
            code, message, _ = self.control_call(sock, 4, self.rpc_frame(
                WORKER_SVC + "Commit", b"\xff\xff\xff", 9))
            self.assertEqual(code, "INVALID_ARGUMENT", message)
            # A Worker method the coordinator never sends there (it goes as an RPC) is refused
            # before its handler runs.
            self.assertEqual(self.control_call(sock, 5, self.rpc_frame(
                WORKER_SVC + "GroupLink", b"", 10))[:2],
                ("UNIMPLEMENTED", "GroupLink is not served on this link; call it as an RPC"))
        code, _, body = self.call(rpc_port, "GroupCallLink", b"")
        call_secret = harness.pb_decode(body)[2][0]
        frame = self.rpc_frame(WORKER_SVC + "Commit", commit, 7)
        hostile = [
            # A rank's secret does not open a control link.
            dlink_header(1, 32 + 4, flags=1) + call_secret + b"rank",
            dlink_header(1, 32 + 4, flags=1) + b"\0" * 32 + b"rank",           # a wrong secret
            hello + dlink_header(3, 0xFFFFFFF0, total=0xFFFFFFF0),              # 4 GiB announced
            hello + dlink_header(3, len(frame), offset=4, total=len(frame)) + frame,  # a pb part
            hello + dlink_header(2, 8, total=8) + b"x" * 8,                     # data, not a call
            hello + dlink_header(4, 0),                                          # an answer
        ]
        for i, data in enumerate(hostile):
            self.assertTrue(dlink_closed_by_worker(port, data), "case %d stayed open" % i)
        self.assertEqual(self.call(rpc_port, "GroupLink", b"")[0], "OK")


class CoordinatorCallLinkTest(GroupsTestCase):
    """The coordinator's call link (CallLink): SubmitOp and CallLink frames from a trainer,
    served as RPCs; any other method there is refused, so a GroupJoin, which ends with its RPC
    connection, can never be made on it."""

    def test_only_submit_op_and_call_link_are_served(self):
        c = self.start({"node-a": ["cuda:0"]})
        coord = "/devcoord.v1.Coordinator/"
        with harness.RpcConnection(c.port) as conn:
            code, message, body = conn.call(coord + "CallLink")
        self.assertEqual(code, "OK", message)
        fields = harness.pb_decode(body)
        port, secret = fields[1][0], fields[2][0]
        self.assertGreater(port, 0)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(dlink_header(1, 32 + 7, flags=1) + secret + b"trainer")

            def link_call(seq, method, body=b""):
                payload = ControlLinkTest.rpc_frame(coord + method, body, 100 + seq)
                sock.sendall(dlink_header(3, len(payload), seq=seq, total=len(payload)) + payload)
                code, reply = call_link_answer(sock)
                self.assertEqual(code, 0, reply)
                return harness.parse_reply(reply)[:2]

            self.assertEqual(link_call(1, "CallLink")[0], "OK")
            # SubmitOp reaches its handler: an op naming no devices is its own refusal.
            code, message = link_call(2, "SubmitOp")
            self.assertEqual(code, "INVALID_ARGUMENT", message)
            self.assertNotIn("not served", message)
            for seq, method in enumerate(["GroupJoin", "ListWorkers", "RegisterWorker"], 3):
                self.assertEqual(link_call(seq, method), (
                    "UNIMPLEMENTED", method + " is not served on this link; call it as an RPC"))
            self.assertEqual(link_call(9, "CallLink")[0], "OK")  # the link is still usable


class CallLinkTest(GroupsTestCase):
    """Issue 17: a rank's blocking calls go as frames on its worker's data port (the call
    link, GroupCallLink), not as GroupCall RPCs; what arrives there is checked like any peer
    input."""

    call = PeerInputTest.call
    metrics = DataPathTest.metrics

    def call_link(self, port):
        code, message, body = self.call(port, "GroupCallLink", b"")
        self.assertEqual(code, "OK", message)
        fields = harness.pb_decode(body)
        return int(fields[1][0].decode().rsplit(":", 1)[1]), fields[2][0]

    def call_frame(self, gid, rank, seq, values, pb=None):
        body = (pb_bytes(F("GroupCallRequest", "group_id"), gid)
                + harness.pb_uint(F("GroupCallRequest", "generation"), 1)
                + harness.pb_uint(F("GroupCallRequest", "seq"), seq)
                + pb_msg(F("GroupCallRequest", "call"), call_desc(rank, 1, 3, len(values))))
        pb = body if pb is None else pb
        data = struct.pack("<%di" % len(values), *values)
        return dlink_header(3, len(pb) + len(data), sender=rank, seq=seq, offset=len(pb),
                            total=len(pb) + len(data)) + pb + data

    def test_calls_on_the_call_link_and_what_it_refuses(self):
        c = self.start({"node-a": ["cuda:0", "cuda:1"]}, http=True,
                       worker_extra={"limits": {"handshake_timeout_ms": 500}})
        address = c.worker_specs["node-a"]["listen"]
        rpc_port = int(address.rsplit(":", 1)[1])
        gid = "00000000000000cd"
        two = [("node-a", 0), ("node-a", 1)]
        code, message, _ = self.call(
            rpc_port, "GroupSetup", setup_body(gid, 1, plan(two, [("node-a", address, [0, 1])]), 0))
        self.assertEqual(code, "OK", message)
        port, secret = self.call_link(rpc_port)
        code, _, body = self.call(rpc_port, "GroupLink", b"")
        self.assertNotEqual(harness.pb_decode(body)[2][0], secret)  # not the peers' secret
        hello = dlink_header(1, 32 + 4) + secret + b"rank"
        # Two ranks, each on its own link, make an all-reduce of four i32 (kind 1, dtype 3).
        socks = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(2)]
        try:
            for r, s in enumerate(socks):
                s.sendall(hello + self.call_frame(gid, r, 1, [r + 1, 10, -3, 7 * r]))
            answers = [call_link_answer(s) for s in socks]
            self.assertEqual(answers, [(0, struct.pack("<4i", 3, 20, -6, 7))] * 2)
            # A request that does not decode is answered with why; the link stays usable.
            socks[0].sendall(self.call_frame(gid, 0, 2, [1], pb=b"\xff\xff\xff"))
            code, text = call_link_answer(socks[0])
            self.assertEqual(code, 3, text)  # INVALID_ARGUMENT
            self.assertIn(b"does not decode", text)
            # A call the worker refuses (a rank not on it) names why, after the worker's name.
            socks[0].sendall(self.call_frame(gid, 7, 2, [1]))
            code, text = call_link_answer(socks[0])
            self.assertEqual(code, 3, text)
            self.assertIn(b"rank 7 of group %s is not on this worker" % gid.encode(), text)
            # Both ranks again, on the same links: seq 2.
            for r, s in enumerate(socks):
                s.sendall(self.call_frame(gid, r, 2, [5, r]))
            self.assertEqual([call_link_answer(s) for s in socks],
                             [(0, struct.pack("<2i", 10, 1))] * 2)
        finally:
            for s in socks:
                s.close()
        hostile = [
            hello + dlink_header(3, 0xFFFFFFF0, offset=16, total=0xFFFFFFF0),  # 4 GiB announced
            hello + dlink_header(3, 8, offset=64, total=8) + b"x" * 8,          # request past it
            hello + dlink_header(3, 4096, offset=2048, total=4096),             # request too big
            hello + dlink_header(2, 8, total=8) + b"x" * 8,                     # data, not a call
            hello + dlink_header(4, 0),                                          # an answer
            dlink_header(1, 32 + 4) + b"\0" * 32 + b"rank",                    # a wrong secret
        ]
        for i, data in enumerate(hostile):
            self.assertTrue(dlink_closed_by_worker(port, data), "case %d stayed open" % i)
        # The peers' secret does not open a call link: a call frame there drops the connection.
        peer_hello = dlink_header(1, 32 + 9) + harness.pb_decode(body)[2][0] + b"tcp://x:1"
        self.assertTrue(dlink_closed_by_worker(port, peer_hello + self.call_frame(gid, 0, 3, [1])))
        wm = self.metrics(int(c.worker_specs["node-a"]["http"].rsplit(":", 1)[1]))
        # Taken on the link: the two pairs of calls and the refused rank 7 (refused later, in
        # the call); the undecodable one never became a call.
        self.assertEqual(wm["devcoord_group_call_link_calls_total"], 4)
        self.assertEqual(wm["devcoord_group_link_refused_total"], len(hostile) + 1)
        self.assertTrue(c.workers["node-a"].running())

    def test_the_library_calls_on_the_link_unless_told_not_to(self):
        c = self.start({"node-a": ["cuda:0"], "node-b": ["cuda:0"]}, http=True)
        devs = "node-a/cuda:0,node-b/cuda:0"
        port = int(c.worker_specs["node-a"]["http"].rsplit(":", 1)[1])

        def run(env):
            with unittest.mock.patch.dict(os.environ, env):
                procs = [ctl_popen(c, "collective", "all-reduce", "--devices", devs, "--self", d,
                                   "--dtype", "f32", "--values", "1.5,2", "--reduce", "sum",
                                   "--repeat", "20") for d in devs.split(",")]
            rs = [finish(p) for p in procs]
            for r in rs:
                self.assertEqual(r.rc, 0, r)
                self.assertEqual(r.out.get("values"), [3.0, 4.0], r)
            m = self.metrics(port)
            return (m["devcoord_group_call_link_calls_total"],
                    m['devcoord_rpc_requests_total{service="Worker",'
                          'method="GroupCall",code="OK"}'])

        self.assertEqual(run({}), (20, 0))
        self.assertEqual(run({"DEVCOORD_GROUP_CALL_LINK": "0"}), (20, 20))

    def test_a_link_the_worker_turns_away_leaves_the_calls_to_rpcs(self):
        """A worker whose data port holds all the connections it takes (256) accepts a
        rank's call link and closes it unread: the rank's first call on it goes as a
        GroupCall RPC, and so do the later ones."""
        c = self.start({"node-a": ["cuda:0", "cuda:1"]}, http=True,
                       worker_extra={"limits": {"handshake_timeout_ms": 120000}})
        rpc_port = int(c.worker_specs["node-a"]["listen"].rsplit(":", 1)[1])
        port, _ = self.call_link(rpc_port)
        hogs = []
        self.addCleanup(lambda: [h.close() for h in hogs])
        for _ in range(256):  # no HELLO: each holds its place until the handshake bound
            hogs.append(socket.create_connection(("127.0.0.1", port), timeout=10))
        for _ in range(100):  # the worker has taken them all once it turns the next away
            if dlink_closed_by_worker(port, b"", wait=0.2):
                break
        else:
            self.fail("the data port never reached its connection bound")
        devs = "node-a/cuda:0,node-a/cuda:1"
        procs = [ctl_popen(c, "collective", "all-reduce", "--devices", devs, "--self", d,
                           "--dtype", "f32", "--values", "1.5,2", "--reduce", "sum",
                           "--repeat", "5") for d in devs.split(",")]
        for r in [finish(p) for p in procs]:
            self.assertEqual(r.rc, 0, r)
            self.assertEqual(r.out.get("values"), [3.0, 4.0], r)
        m = self.metrics(int(c.worker_specs["node-a"]["http"].rsplit(":", 1)[1]))
        self.assertEqual(m["devcoord_group_call_link_calls_total"], 0)
        self.assertEqual(m['devcoord_rpc_requests_total{service="Worker",'
                           'method="GroupCall",code="OK"}'], 10)


class ThreadsTest(GroupsTestCase):
    @unittest.skipUnless(os.path.exists(THREADS), "devcoord-group-threads is not built")
    def test_ranks_as_threads_of_one_process(self):
        # Five ranks, as threads sharing one client: two on node-a, one on node-b, two on
        # node-c. Every call's result is checked inside the program.
        c = self.start(SPEC3)
        p = subprocess.run([THREADS, c.addr, ",".join(DEVS3), "50"], capture_output=True,
                           timeout=300, text=True)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout.strip(), "ok 5")


if __name__ == "__main__":
    unittest.main()
