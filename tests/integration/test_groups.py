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
import re
import signal
import time
import unittest
import urllib.request

import harness
import opsutil
from harness import ClusterTestCase
from opsutil import ctl_popen, finish

GRID = ("node-a", "node-b", "node-c")
ERROR_LINE = re.compile(r"^devcoordctl: ([A-Z][A-Z_]+): (.+)$", re.M)


def error_of(r):
    m = ERROR_LINE.search(r.err)
    return (m.group(1), m.group(2)) if m else (None, r.err)


class GroupsTestCase(ClusterTestCase):
    heartbeat_ms = 500
    dead_after_ms = 5000

    def start(self, workers, coordinator_config=None, http=False):
        """workers: {name: [device, ...]}"""
        c = self.cluster = self.make_cluster(coordinator_config=coordinator_config)
        c.start_coordinator()
        for name, devices in workers.items():
            extra = {}
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


if __name__ == "__main__":
    unittest.main()
