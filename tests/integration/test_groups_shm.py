"""Issue 13: group calls on shared memory (dc_group_alloc) for ranks on their worker's host.

The ranks are threads of devcoord-group-shm (group_shm.c), which checks every result itself.
Here: that their blocks were shared, and the worker's counters, which prove that the calls on
shared memory carried no byte in the GroupCall request (only the plain calls did, 40 bytes
each); then hostile GroupMap and GroupCall requests, refused with their codes, and nothing
left mapped when the generation ends.

    cd tests/integration && python3 -m unittest -v test_groups_shm
"""

import os
import secrets
import struct
import subprocess
import threading
import time
import unittest

import harness
from harness import F, pb_bytes
import test_groups
from test_groups import GroupsTestCase, call_desc, pb_msg, plan, setup_body

SHM = os.environ.get("DEVCOORD_GROUP_SHM") or os.path.join(
    os.path.dirname(os.path.abspath(harness.CTL)), "..", "tests", "devcoord-group-shm")
ITERATIONS = 20
# Per rank: ITERATIONS all-reduces, a broadcast, an all-gather, a reduce-scatter on its block,
# a large reduce-scatter on a block of its own, and last an asynchronous all-reduce of 80 KB
# of plain memory in a staging block, rank 0 leaving under it (leave_with_a_staged_call).
SHM_CALLS = ITERATIONS + 5
# Per rank: three plain calls of five i64 in (all-reduce, all-gather, all-reduce on the
# block the worker's bound refused).
PLAIN_BYTES = 3 * 5 * 8


def map_body(gid, name, size, rank=0, unmap=0, generation=1):
    return (pb_bytes(F("GroupMapRequest", "group_id"), gid)
            + harness.pb_uint(F("GroupMapRequest", "generation"), generation)
            + harness.pb_uint(F("GroupMapRequest", "rank"), rank)
            + pb_bytes(F("GroupMapRequest", "name"), name)
            + harness.pb_uint(F("GroupMapRequest", "bytes"), size)
            + harness.pb_uint(F("GroupMapRequest", "unmap"), unmap))


def call_body(gid, seq, rank, count, region=0, send=0, recv=None):
    """An all-reduce of count f32; on shared memory when region, the result after the input
    unless recv says where."""
    body = (pb_bytes(F("GroupCallRequest", "group_id"), gid)
            + harness.pb_uint(F("GroupCallRequest", "generation"), 1)
            + harness.pb_uint(F("GroupCallRequest", "seq"), seq)
            + pb_msg(F("GroupCallRequest", "call"), call_desc(rank, 1, 1, count)))
    if region:
        body += (harness.pb_uint(F("GroupCallRequest", "region"), region)
                 + harness.pb_uint(F("GroupCallRequest", "send_offset"), send)
                 + harness.pb_uint(F("GroupCallRequest", "recv_offset"),
                                   send + 4 * count if recv is None else recv))
    return body


def shm_object(test, size):
    """A fresh shared memory object of size bytes, as a client would make one: (fd, name);
    closed and unlinked when the test ends."""
    name = "/devcoord-" + secrets.token_hex(16)
    path = "/dev/shm" + name
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    test.addCleanup(os.close, fd)
    test.addCleanup(lambda: os.path.exists(path) and os.unlink(path))
    os.ftruncate(fd, size)
    return fd, name


class ShmCallsTest(GroupsTestCase):
    def worker_metrics(self, c, name):
        return harness.metrics(int(c.worker_specs[name]["http"].rsplit(":", 1)[1]))

    def run_ranks(self, spec, devices, shared=True, worker_extra=None):
        c = self.start(spec, http=True, worker_extra=worker_extra)
        p = subprocess.run([SHM, c.addr, ",".join(devices), str(ITERATIONS)], capture_output=True,
                           timeout=240, text=True)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout.strip(),
                         "ok %d shared %d" % (len(devices), len(devices) if shared else 0))
        return c, p

    def check_worker(self, c, name, even, odd):
        """even, odd: the worker's ranks of each parity (the mixed all-reduce: even ranks on
        their block, odd ones on plain memory, 40 bytes each way)."""
        m = self.worker_metrics(c, name)
        ranks = even + odd
        self.assertEqual(m["devcoord_group_shm_calls_total"], ranks * SHM_CALLS + even, m)
        self.assertEqual(m["devcoord_group_call_bytes_received_total"],
                         ranks * PLAIN_BYTES + odd * 40, m)
        # The plain calls' results only: all-reduce 40, all-gather 40 per rank in the group,
        # all-reduce 40.
        n = 2
        self.assertEqual(m["devcoord_group_call_bytes_sent_total"],
                         ranks * (80 + 40 * n) + odd * 40, m)

    @unittest.skipUnless(os.path.exists(SHM), "devcoord-group-shm is not built")
    def test_two_ranks_on_one_worker(self):
        c, _ = self.run_ranks({"node-a": ["cuda:0", "cuda:1"]}, ["node-a/cuda:0", "node-a/cuda:1"])
        self.check_worker(c, "node-a", 1, 1)

    @unittest.skipUnless(os.path.exists(SHM), "devcoord-group-shm is not built")
    def test_two_ranks_on_two_workers(self):
        c, _ = self.run_ranks({"node-a": ["cuda:0"], "node-b": ["cuda:0"]},
                              ["node-a/cuda:0", "node-b/cuda:0"])
        self.check_worker(c, "node-a", 1, 0)
        self.check_worker(c, "node-b", 0, 1)

    @unittest.skipUnless(os.path.exists(SHM), "devcoord-group-shm is not built")
    def test_a_worker_that_maps_nothing_leaves_plain_memory_that_works(self):
        # groups.shm_max_bytes 0: every GroupMap is refused, every block is plain memory, and
        # the same calls give the same results, all their bytes through the RPC.
        c, p = self.run_ranks({"node-a": ["cuda:0", "cuda:1"]}, ["node-a/cuda:0", "node-a/cuda:1"],
                              shared=False, worker_extra={"groups": {"shm_max_bytes": 0}})
        self.assertIn("not shared with worker", p.stderr)
        self.assertIn("RESOURCE_EXHAUSTED", p.stderr)
        m = self.worker_metrics(c, "node-a")
        self.assertEqual(m["devcoord_group_shm_calls_total"], 0)
        self.assertEqual(m["devcoord_group_shm_mapped_bytes"], 0)
        self.assertGreater(m["devcoord_group_call_bytes_received_total"], 2 * PLAIN_BYTES)


NUMERIC = os.environ.get("DEVCOORD_GROUP_SHM_NUMERIC") or os.path.join(
    os.path.dirname(os.path.abspath(harness.CTL)), "..", "tests", "devcoord-group-shm-numeric")
# Every kind at these counts (1001: no number of ranks divides it), all-reduce also at
# these: 300007 is past two 256 KiB slices in every dtype but f16 (split across the worker's
# threads), 1300003 past one message in f32, f64 and (not) f16, so split into parts.
COUNTS = [1, 1001]
AR_COUNTS = [300007, 1300003]
DTYPE_SIZES = [4, 8, 4, 8, 2, 2]  # f32 f64 i32 i64 f16 bf16
OPS = 5


ONE_MESSAGE = 4 << 20  # about what one message carries (4 MiB less an envelope)


def agreements():
    """Before the first call past one message of a size larger than any agreed before, the
    ranks agree that they can make it whole: one all-reduce of one element (plain memory).
    The program's all-reduces go count by count, dtype by dtype: two here, f32's 1300003
    (5.2 MB), then f64's."""
    n = most = 0
    for count in AR_COUNTS:
        for size in DTYPE_SIZES:
            if count * size > ONE_MESSAGE and count * size > most:
                n, most = n + 1, count * size
    return n


def all_reduce_calls():
    """The group calls the all-reduces of devcoord-group-shm-numeric make, in place: one each,
    those past one message too (every rank shares memory, so none is split)."""
    return OPS * len(COUNTS + AR_COUNTS) * len(DTYPE_SIZES)


def reduce_scatter_calls():
    """The reduce-scatters it makes, and as many reduces, in place too: one each."""
    return OPS * len(COUNTS) * len(DTYPE_SIZES)


def all_gather_calls():
    """The all-gathers it makes (no op), and as many broadcasts, in place too: one each."""
    return len(COUNTS) * len(DTYPE_SIZES)


@unittest.skipUnless(os.path.exists(NUMERIC), "devcoord-group-shm-numeric is not built")
class InPlaceNumericTest(GroupsTestCase):
    """Issue 17: a one-worker group's calls on shared memory (all but the barrier) run in
    place, split across the worker's threads. Every kind x op x dtype checked element by
    element by the ranks themselves; the worker's counters show every kind took the in-place
    path."""
    worker_metrics = ShmCallsTest.worker_metrics

    def run_numeric(self, n, as_processes, workers=("node-a",)):
        """n ranks, as many on each of workers, run devcoord-group-shm-numeric (as one
        process of threads, or one process each); then, on one worker, its counters."""
        per = n // len(workers)
        devices = ["%s/cuda:%d" % (w, i) for w in workers for i in range(per)]
        c = self.start({w: ["cuda:%d" % i for i in range(per)] for w in workers}, http=True)
        lst = ",".join(devices)
        counts = ",".join(map(str, COUNTS))
        ar = ",".join(map(str, AR_COUNTS))
        selves = devices if as_processes else ["all"]
        procs = [subprocess.Popen([NUMERIC, c.addr, lst, s, counts, ar], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for s in selves]
        outs = []
        try:
            for p in procs:
                out, err = p.communicate(timeout=400)
                outs.append((p.returncode, out, err))
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        for rc, out, err in outs:
            self.assertEqual(rc, 0, err)
            ranks = 1 if as_processes else n
            self.assertTrue(out.startswith("ok %d shared %d calls " % (ranks, ranks)), out)
        if len(workers) > 1:
            return c
        m = self.worker_metrics(c, "node-a")
        calls = all_reduce_calls()
        self.assertEqual(m["devcoord_group_in_place_calls_total"],
                         calls + 2 * reduce_scatter_calls() + 2 * all_gather_calls(), m)
        # And one reduce-scatter (sum) per count and dtype whose results start their inputs,
        # which cannot run in place.
        self.assertEqual(m['devcoord_group_calls_total{kind="reduce-scatter"}'],
                         reduce_scatter_calls() + all_gather_calls(), m)
        self.assertEqual(m['devcoord_group_calls_total{kind="all-gather"}'], all_gather_calls(),
                         m)
        self.assertEqual(m['devcoord_group_calls_total{kind="reduce"}'], reduce_scatter_calls(),
                         m)
        self.assertEqual(m['devcoord_group_calls_total{kind="broadcast"}'], all_gather_calls(),
                         m)
        self.assertEqual(m['devcoord_group_calls_total{kind="all-reduce"}'],
                         calls + agreements(), m)
        # No byte of the all-reduces went through the RPC; only the blocks of reduce-scatter
        # and all-gather (staged through plain memory by the library when split) may have.
        self.assertEqual(m["devcoord_group_shm_mapped_bytes"], 0, m)

    def test_two_ranks_as_threads(self):
        self.run_numeric(2, as_processes=False)

    def test_a_mismatch_past_one_message_fails_every_rank_and_calls_stay_matched(self):
        # Rank 0 all-reduces 1300003 f32 (5.2 MB), rank 1 as many f64 (10.4 MB), each as one
        # call: both fail with INVALID_ARGUMENT, and the right all-reduce after it pairs the
        # ranks' calls as before (the driver checks both).
        c = self.start({"node-a": ["cuda:0", "cuda:1"]}, http=True)
        devices = "node-a/cuda:0,node-a/cuda:1"
        procs = [subprocess.Popen([NUMERIC, c.addr, devices, d, "mismatch", "1300003"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for d in devices.split(",")]
        try:
            for p in procs:
                out, err = p.communicate(timeout=120)
                self.assertEqual(p.returncode, 0, err)
                self.assertEqual(out.strip(), "ok 1 shared 1 calls 3")  # and a barrier
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        m = self.worker_metrics(c, "node-a")
        self.assertEqual(m["devcoord_group_in_place_calls_total"], 1, m)  # the right call, whole

    def test_two_ranks_as_processes(self):
        self.run_numeric(2, as_processes=True)

    def test_four_ranks_as_threads(self):
        self.run_numeric(4, as_processes=False)

    def test_four_ranks_as_processes(self):
        self.run_numeric(4, as_processes=True)

    def test_two_ranks_on_each_of_two_workers(self):
        # Every all-reduce of AR_COUNTS goes round the ring of the two workers in place: in
        # each worker's first rank's region, the other rank's input reduced in segment by
        # segment and the final segments copied to its result as they come (a MEAN's after
        # the division). Each rank checks every element of every result.
        c = self.run_numeric(4, as_processes=True, workers=("node-a", "node-b"))
        rings = OPS * len(AR_COUNTS) * len(DTYPE_SIZES)
        for name in ("node-a", "node-b"):
            m = self.worker_metrics(c, name)
            self.assertEqual(m["devcoord_group_ring_calls_total"], rings, m)
            self.assertEqual(m["devcoord_group_ring_in_region_calls_total"], rings, m)


@unittest.skipUnless(os.path.exists(test_groups.THREADS), "devcoord-group-threads is not built")
class OneWorkerWholeCallsTest(GroupsTestCase):
    """Issue 17: in a group on one worker an all-reduce past one message is one call, its
    plain buffers copied through the library's staging block in shared memory, and the worker
    reduces it in place there (in parts it was one call per message, none in place)."""
    worker_metrics = ShmCallsTest.worker_metrics

    def test_plain_buffers_past_one_message_go_whole_through_the_staging_block(self):
        c = self.start({"node-a": ["cuda:0", "cuda:1", "cuda:2"]}, http=True)
        devices = ["node-a/cuda:%d" % i for i in range(3)]
        # Every result checked in the program: small calls, _async ones, all-reduces past one
        # message (1300007 i32, 5.2 MB, blocking and _async; a mean of 900021 f64, 7.2 MB,
        # which makes the staging block grow), all-gathers and a reduce-scatter past one
        # message too (300007 i64 a rank's block): these go whole through the staging block
        # as well, one call each.
        p = subprocess.run([test_groups.THREADS, c.addr, ",".join(devices), "5"],
                           capture_output=True, timeout=300, text=True)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout.strip(), "ok 3")
        m = {k: v for k, v in self.worker_metrics(c, "node-a").items()
             if k.startswith("devcoord_group_")}
        # The three big all-reduces, the big reduce-scatter (each rank's result over its own
        # block of its input in the staging block) and the two big all-gathers (each rank's
        # input in its own block of the result there).
        self.assertEqual(m["devcoord_group_in_place_calls_total"], 6, m)
        # Those, the big reduce-scatter and the two big all-gathers, by each of 3 ranks.
        self.assertEqual(m["devcoord_group_shm_calls_total"], 6 * 3, m)
        # The big reduce-scatter and all-gathers as one call each, and the small ones.
        self.assertEqual(m['devcoord_group_calls_total{kind="reduce-scatter"}'], 2, m)
        self.assertEqual(m['devcoord_group_calls_total{kind="all-gather"}'], 3, m)
        # The ranks left: their staging blocks went with the generation.
        harness.wait_until(
            lambda: self.worker_metrics(c, "node-a")["devcoord_group_shm_mapped_bytes"] == 0,
            10, "the staging blocks unmapped")


class StagedPlainCallsTest(GroupsTestCase):
    """Issue 17: a blocking call of one message whose plain buffers hold 64 KiB or more goes
    through the library's staging block when the worker is on the rank's host: none of its
    bytes on the call link either way, the worker reading and writing them in place (across
    workers the ring runs in the rank's block). A smaller one carries its bytes."""
    worker_metrics = ShmCallsTest.worker_metrics

    def collective(self, c, devs, args):
        procs = [test_groups.ctl_popen(c, "--timeout", "60s", "collective", "all-reduce",
                                       "--devices", devs, "--self", d, "--dtype", "f32",
                                       "--reduce", "sum", *args(d))
                 for d in devs.split(",")]
        return [test_groups.finish(p, timeout=120) for p in procs]

    def test_plain_calls_of_one_message_go_through_the_staging_block(self):
        c = self.start({"node-a": ["cuda:0"], "node-b": ["cuda:0"]}, http=True)
        devs = "node-a/cuda:0,node-b/cuda:0"
        # 20,000 f32 (80 KB), each rank's own values: staged, the parts exchanged directly
        # (below the ring's 256 KiB).
        n = 20000
        vals = {"node-a/cuda:0": [float(i % 7) for i in range(n)],
                "node-b/cuda:0": [(i % 5) * 0.5 for i in range(n)]}
        want = [a + b for a, b in zip(vals["node-a/cuda:0"], vals["node-b/cuda:0"])]
        for r in self.collective(c, devs, lambda d: ["--repeat", "5", "--values",
                                                     ",".join("%g" % v for v in vals[d])]):
            self.assertEqual(r.rc, 0, r)
            self.assertEqual(r.out["calls"], 5, r)
            self.assertEqual(r.out["values"], want)
        # 2^18 f32 (1 MiB): round the ring, in each rank's staging block.
        for r in self.collective(c, devs, lambda d: ["--count", str(1 << 18), "--repeat", "5"]):
            self.assertEqual(r.rc, 0, r)
            self.assertEqual(r.out["calls"], 5, r)
        for name in ("node-a", "node-b"):
            m = self.worker_metrics(c, name)
            self.assertEqual(m["devcoord_group_shm_calls_total"], 10, m)
            self.assertEqual(m["devcoord_group_call_bytes_received_total"], 0, m)
            self.assertEqual(m["devcoord_group_call_bytes_sent_total"], 0, m)
            self.assertEqual(m["devcoord_group_ring_calls_total"], 5, m)
            self.assertEqual(m["devcoord_group_ring_in_region_calls_total"], 5, m)
        # 1,000 f32 (4 KB) carry their bytes, 4 KB each way a call.
        for r in self.collective(c, devs, lambda d: ["--count", "1000", "--repeat", "3"]):
            self.assertEqual(r.rc, 0, r)
        for name in ("node-a", "node-b"):
            m = self.worker_metrics(c, name)
            self.assertEqual(m["devcoord_group_shm_calls_total"], 10, m)
            self.assertEqual(m["devcoord_group_call_bytes_received_total"], 3 * 4000, m)


class HostileMapTest(GroupsTestCase):
    call = test_groups.PeerInputTest.call

    def test_hostile_maps_and_calls_are_refused(self):
        # 16 regions of 64 bytes fit the per-rank bound exactly.
        c = self.start({"node-a": ["cuda:0", "cuda:1"]}, http=True,
                       worker_extra={"groups": {"shm_max_bytes": 1024}})
        address = c.worker_specs["node-a"]["listen"]
        port = int(address.rsplit(":", 1)[1])
        gid = "00000000000000cd"
        two = [("node-a", 0), ("node-a", 1)]
        code, message, _ = self.call(
            port, "GroupSetup", setup_body(gid, 1, plan(two, [("node-a", address, [0, 1])]), 0))
        self.assertEqual(code, "OK", message)

        def gmap(name, size, rank=0, unmap=0):
            return map_body(gid, name, size, rank, unmap)

        good = "/devcoord-" + secrets.token_hex(16)
        path = "/dev/shm" + good
        with open(path, "wb") as f:
            f.write(b"\0" * 64)
        self.addCleanup(lambda: os.path.exists(path) and os.unlink(path))
        refusals = [
            (gmap("/etc/passwd", 64), "INVALID_ARGUMENT", "is not /devcoord-"),
            (gmap("/devcoord-../../etc/passwd" + "0" * 10, 64), "INVALID_ARGUMENT",
             "is not /devcoord-"),
            (gmap(good.upper().replace("/DEVCOORD-", "/devcoord-"), 64), "INVALID_ARGUMENT",
             "is not /devcoord-"),
            (gmap(good, 1 << 40), "RESOURCE_EXHAUSTED", "may not map"),
            (gmap(good, 1025), "RESOURCE_EXHAUSTED", "at most 1024 in 16: groups.shm_max_bytes"),
            (gmap(good, 0), "INVALID_ARGUMENT", "may not map"),
            (gmap("/devcoord-" + "0" * 32, 64), "INVALID_ARGUMENT", "cannot open"),
            (gmap(good, 128), "INVALID_ARGUMENT", "is not 128 bytes long"),
            (gmap(good, 64, rank=7), "INVALID_ARGUMENT", "not on this worker"),
        ]
        for body, want, text in refusals:
            code, message, _ = self.call(port, "GroupMap", body)
            self.assertEqual(code, want, message)
            self.assertIn(text, message)
        code, message, reply = self.call(port, "GroupMap", gmap(good, 64))
        self.assertEqual(code, "OK", message)
        region = harness.pb_decode(reply)[F("GroupMapResponse", "region")][0]
        self.assertGreater(region, 0)

        def call(region, send, recv, count=4, rank=0, seq=1):
            return call_body(gid, seq, rank, count, region, send, recv)

        # All-reduce of four f32 (16 bytes) in a 64-byte region.
        bad_calls = [
            (call(region, 49, 0), b"", "INVALID_ARGUMENT", "outside its 64 bytes"),
            (call(region, 0, 60), b"", "INVALID_ARGUMENT", "outside its 64 bytes"),
            (call(region, 1 << 63, 0), b"", "INVALID_ARGUMENT", "outside its 64 bytes"),
            (call(region, 0, (1 << 64) - 8), b"", "INVALID_ARGUMENT", "outside its 64 bytes"),
            (call(region, 0, 0, count=17), b"", "INVALID_ARGUMENT", "outside its 64 bytes"),
            (call(region + 5, 0, 0), b"", "INVALID_ARGUMENT", "no shared memory region"),
            (call(region, 0, 0, rank=1), b"", "INVALID_ARGUMENT", "no shared memory region"),
            (call(region, 0, 0), b"\0" * 16, "INVALID_ARGUMENT", "carries 16 bytes"),
        ]
        for body, att, want, text in bad_calls:
            code, message, _ = self.call(port, "GroupCall", body, att)
            self.assertEqual(code, want, message)
            self.assertIn(text, message)
        # Another rank's region cannot be unmapped, nor an unknown one.
        code, message, _ = self.call(port, "GroupMap", gmap("", 0, rank=1, unmap=region))
        self.assertEqual(code, "NOT_FOUND", message)
        m = ShmCallsTest.worker_metrics(self, c, "node-a")
        self.assertEqual(m["devcoord_group_shm_mapped_bytes"], 64)
        # The per-rank bound on regions: 16, then RESOURCE_EXHAUSTED.
        for _ in range(15):
            code, message, _ = self.call(port, "GroupMap", gmap(good, 64))
            self.assertEqual(code, "OK", message)
        code, message, _ = self.call(port, "GroupMap", gmap(good, 64))
        self.assertEqual(code, "RESOURCE_EXHAUSTED", message)
        self.assertIn("in 16 regions", message)
        code, message, _ = self.call(port, "GroupMap", gmap("", 0, unmap=region))
        self.assertEqual(code, "OK", message)
        m = ShmCallsTest.worker_metrics(self, c, "node-a")
        self.assertEqual(m["devcoord_group_shm_mapped_bytes"], 15 * 64)
        # The next generation unmaps everything of the last one.
        code, message, _ = self.call(
            port, "GroupSetup", setup_body(gid, 2, plan(two, [("node-a", address, [0, 1])]), 0))
        self.assertEqual(code, "OK", message)
        m = ShmCallsTest.worker_metrics(self, c, "node-a")
        self.assertEqual(m["devcoord_group_shm_mapped_bytes"], 0)
        code, message, _ = self.call(port, "GroupMap", gmap(good, 64))
        self.assertEqual(code, "FAILED_PRECONDITION", message)  # generation 1 is gone
        self.assertTrue(c.worker("node-a").running())

    def shrunk_region(self, port, gid, size=64 * 1024):
        """Maps a fresh object of rank 0 through GroupMap, keeping a writable fd as a hostile
        client would, and truncates it: returns (fd, region id)."""
        fd, name = shm_object(self, size)
        code, message, reply = self.call(port, "GroupMap", map_body(gid, name, size))
        self.assertEqual(code, "OK", message)
        os.ftruncate(fd, 0)
        return fd, harness.pb_decode(reply)[F("GroupMapResponse", "region")][0]

    def test_a_region_shrunk_under_the_worker_fails_the_call_not_the_worker(self):
        self.shrunk_case(64 * 1024, 1024)

    def test_a_region_shrunk_under_a_split_all_reduce_fails_it_too(self):
        # 2 MiB in, 2 MiB out: the in-place all-reduce splits it across the worker's threads
        # (on more than one core), so a helper thread takes a SIGBUS as well.
        self.shrunk_case(4 * 1024 * 1024, 512 * 1024)

    def shrunk_case(self, size, count):
        # A hostile client keeps a writable fd of its object and truncates it after GroupMap:
        # the worker's next access would die of SIGBUS without its guard.
        c = self.start({"node-a": ["cuda:0"]}, http=True)
        address = c.worker_specs["node-a"]["listen"]
        port = int(address.rsplit(":", 1)[1])
        gid = "00000000000000ce"
        code, message, _ = self.call(
            port, "GroupSetup", setup_body(gid, 1, plan([("node-a", 0)], [("node-a", address, [0])]), 0))
        self.assertEqual(code, "OK", message)
        fd, region = self.shrunk_region(port, gid, size)
        shrank = "shared memory region %d of rank 0 shrank under the worker" % region
        code, message, _ = self.call(port, "GroupCall", call_body(gid, 1, 0, count, region))
        self.assertEqual(code, "INVALID_ARGUMENT", message)
        self.assertIn(shrank, message)
        self.assertTrue(c.worker("node-a").running())
        # The region is refused from then on, even once the object has its size back.
        os.ftruncate(fd, size)
        code, message, _ = self.call(port, "GroupCall", call_body(gid, 2, 0, count, region))
        self.assertEqual(code, "INVALID_ARGUMENT", message)
        self.assertIn(shrank, message)
        # Plain memory still works, and the worker answers on every side.
        code, message, _ = self.call(port, "GroupCall", call_body(gid, 3, 0, 4), b"\0" * 16)
        self.assertEqual(code, "OK", message)
        m = ShmCallsTest.worker_metrics(self, c, "node-a")
        self.assertEqual(m["devcoord_group_shm_mapped_bytes"], size)
        code, message, _ = self.call(port, "GroupMap", map_body(gid, "", 0, unmap=region))
        self.assertEqual(code, "OK", message)
        m = ShmCallsTest.worker_metrics(self, c, "node-a")
        self.assertEqual(m["devcoord_group_shm_mapped_bytes"], 0)
        self.assertTrue(c.worker("node-a").running())
        warned = [line for line in c.worker("node-a").log_text().splitlines()
                  if shrank in line and "warn" in line.lower()]
        self.assertEqual(len(warned), 1, c.worker("node-a").log_text())

    def test_a_shrunk_region_fails_the_call_on_the_other_worker_too(self):
        c = self.start({"node-a": ["cuda:0"], "node-b": ["cuda:0"]})
        addrs = [c.worker_specs[w]["listen"] for w in ("node-a", "node-b")]
        ports = [int(a.rsplit(":", 1)[1]) for a in addrs]
        gid = "00000000000000cf"
        two = plan([("node-a", 0), ("node-b", 0)],
                   [("node-a", addrs[0], [0]), ("node-b", addrs[1], [1])])
        for i, port in enumerate(ports):
            code, message, _ = self.call(port, "GroupSetup", setup_body(gid, 1, two, i))
            self.assertEqual(code, "OK", message)
        _, region = self.shrunk_region(ports[0], gid)
        answers = {}
        b = threading.Thread(target=lambda: answers.update(b=self.call(
            ports[1], "GroupCall", call_body(gid, 1, 1, 4), b"\0" * 16, timeout_ms=20000)))
        b.start()
        answers["a"] = self.call(ports[0], "GroupCall", call_body(gid, 1, 0, 4, region),
                                 timeout_ms=20000)
        b.join(30)
        shrank = "shared memory region %d of rank 0 shrank under the worker" % region
        for rank in ("a", "b"):
            code, message, _ = answers[rank]
            self.assertEqual(code, "INVALID_ARGUMENT", message)
            self.assertIn(shrank, message)
        self.assertIn("worker node-a", answers["b"][1])
        self.assertTrue(c.worker("node-a").running())
        self.assertTrue(c.worker("node-b").running())

class RegionLandingTest(GroupsTestCase):
    """A ring that runs in its rank's region reads peers' frames straight into the rank's
    memory: a rank whose call fails hears so only once no frame is landing there, so nothing
    writes its memory after it has been answered."""

    call = test_groups.PeerInputTest.call
    link = test_groups.DataLinkInputTest.link
    two_workers_and_a_link_posing_as_node_a = \
        test_groups.DataLinkInputTest.two_workers_and_a_link_posing_as_node_a
    call_with_a_long_deadline = test_groups.DataLinkInputTest.call_with_a_long_deadline

    def test_a_failed_call_is_answered_after_the_frame_landing_in_its_region(self):
        gid = "00000000000000d1"
        rpc, fake = self.two_workers_and_a_link_posing_as_node_a(gid)
        size, half = 1 << 18, 1 << 17  # 65536 f32 in place: a ring call, in node-b's region
        fd, name = shm_object(self, size)
        code, message, reply = self.call(rpc["node-b"], "GroupMap", map_body(gid, name, size, 1))
        self.assertEqual(code, "OK", message)
        region = harness.pb_decode(reply)[F("GroupMapResponse", "region")][0]

        def start_call(seq):
            """node-b's rank calls with a 3 s deadline and waits for the answer 5 s more, as
            the client library does; returns (thread, answer)."""
            body = (call_body(gid, seq, 1, size // 4, region, send=0, recv=0)
                    + harness.pb_uint(F("GroupCallRequest", "timeout_ms"), 3000))
            answer = {}

            def call():
                rid = 77 + seq
                header = (harness.pb_uint(F("RequestHeader", "request_id"), rid)
                          + pb_bytes(F("RequestHeader", "method"),
                                     test_groups.WORKER_SVC + "GroupCall")
                          + harness.pb_uint(F("RequestHeader", "timeout_ms"), 8000))
                try:
                    with harness.RpcConnection(rpc["node-b"], timeout=8.0) as conn:
                        answer["r"] = conn.call_raw(harness.frame(header, body, b""), rid)
                except (OSError, harness.RpcError) as e:
                    answer["r"] = ("NO ANSWER", str(e), b"")
            t = threading.Thread(target=call)
            t.start()
            self.addCleanup(t.join, 60)
            time.sleep(1.0)  # node-b's rank has called: its ring takes all-gather frames
            return t, answer

        def all_gather_frame(seq):
            """node-b's all-gather step (segment 1: the region's second half) "from node-a",
            read straight into the region."""
            return harness.dlink_header(2, half, flags=2, sender=0,
                                        group=harness.dlink_group_hash(gid), generation=1,
                                        seq=seq, offset=half, total=size)

        # The header and half the bytes, then nothing until after the call's deadline (but
        # before the frame's own bound, deadline + 2 s): the rank is not answered meanwhile.
        seg = b"\x07" * half
        t, answer = start_call(1)
        fake.sendall(all_gather_frame(1) + seg[:half // 2])
        t.join(2.75)
        self.assertIsNone(answer.get("r"), "the rank was answered while a frame was landing "
                          "in its region")
        fake.sendall(seg[half // 2:])
        t.join(30)
        code, message, _ = answer["r"]
        self.assertEqual(code, "DEADLINE_EXCEEDED", message)
        self.assertIn("group %s call 1: deadline passed waiting for" % gid, message)
        self.assertEqual(os.pread(fd, half, half), seg)  # whole before the answer
        # A frame that never ends is cut at its bound, and the held answer goes then: the
        # rank hears within its client's margin (5 s past the deadline), not the link's
        # 10 s bound later.
        t, answer = start_call(2)
        fake.sendall(all_gather_frame(2) + seg[:half // 2])
        t.join(30)
        code, message, _ = answer["r"]
        self.assertEqual(code, "DEADLINE_EXCEEDED", message)
        self.assertIn("group %s call 2: deadline passed waiting for" % gid, message)
        harness.wait_until(lambda: "did not come whole" in self.cluster.worker("node-b")
                           .log_text(), 10, "node-b to log the frame it cut")

    def test_a_failed_call_is_answered_after_the_send_from_its_region(self):
        """The other way: node-b's ring sends its segment from the rank's region to node-a,
        which stopped reading. The call fails at its deadline, but the rank hears so only
        once no send reads its memory any more: the write that cannot end is cut
        (HELD_SEND_MS after the failure), and then the rank is answered. Before, it was
        answered at the deadline while the write went on from memory the rank could already
        be overwriting."""
        gid = "00000000000000d2"
        rpc, _ = self.two_workers_and_a_link_posing_as_node_a(gid)
        # A first call, small, opens node-b's data link to node-a while node-a runs.
        warm = {}
        t = threading.Thread(target=lambda: warm.update(
            a=self.call(rpc["node-a"], "GroupCall", call_body(gid, 1, 0, 4),
                        struct.pack("<4f", 1, 2, 3, 4))))
        t.start()
        code, message, _ = self.call(rpc["node-b"], "GroupCall", call_body(gid, 1, 1, 4),
                                     struct.pack("<4f", 1, 1, 1, 1))
        t.join(30)
        self.assertEqual(code, "OK", message)
        self.assertEqual(warm["a"][0], "OK", warm["a"][1])
        # 64 MiB in place: node-b's step 0 sends 32 MiB from the region, far past what the
        # sockets buffer once node-a stops reading.
        size = 64 << 20
        fd, name = shm_object(self, size)
        code, message, reply = self.call(rpc["node-b"], "GroupMap", map_body(gid, name, size, 1))
        self.assertEqual(code, "OK", message)
        region = harness.pb_decode(reply)[F("GroupMapResponse", "region")][0]
        self.cluster.stop_worker("node-a")
        self.addCleanup(self.cluster.cont_worker, "node-a")
        body = (call_body(gid, 2, 1, size // 4, region, send=0, recv=0)
                + harness.pb_uint(F("GroupCallRequest", "timeout_ms"), 3000))
        # The client library's wait: the deadline, then 5 s (GROUP_MARGIN_MS).
        with harness.RpcConnection(rpc["node-b"], timeout=8.0) as conn:
            header = (harness.pb_uint(F("RequestHeader", "request_id"), 79)
                      + pb_bytes(F("RequestHeader", "method"), test_groups.WORKER_SVC + "GroupCall")
                      + harness.pb_uint(F("RequestHeader", "timeout_ms"), 8000))
            code, message, _ = conn.call_raw(harness.frame(header, body, b""), 79)
        # At the deadline: the call's own, or its GroupExchange to node-a's (which ends the
        # generation), whichever node-b's threads see first.
        if code == "DEADLINE_EXCEEDED":
            self.assertIn("group %s call 2: deadline passed waiting for" % gid, message)
        else:
            self.assertEqual(code, "UNAVAILABLE", message)
            self.assertIn("worker node-a of group %s" % gid, message)
        # Answered only after the cut: the send no longer reads the region.
        self.assertIn("cut the data link to worker node-a: a send from rank 1's memory",
                      self.cluster.worker("node-b").log_text())


if __name__ == "__main__":
    unittest.main()
