"""Issue 12, item 6, "Admission control": request bytes received and not yet answered are
capped (limits.max_inflight_bytes, limits.max_inflight_bytes_per_connection), so a burst of
big pipelined requests costs the coordinator a bounded amount of memory, and that memory
comes back after the burst.

Before the cap, pipelined 3.9 MB SubmitOp requests on 8 connections queued without a byte
limit (up to 4096 contexts) and drove the coordinator to 4.2 GB. Here 8 connections each
pipeline 16 such requests (about 500 MB in all) before reading any answer: some are refused
with RESOURCE_EXHAUSTED naming the limit, every one is answered, the coordinator stays up,
answers a normal call after, and its VmRSS settles under 300 MiB (a generous bound: the
defaults let 64 MiB of requests in, plus what decoding them costs; measured about 220 MiB,
the same after three times the burst, and 320 MiB before the cap, growing with the burst).
Not checked under ASan, whose quarantine keeps freed memory.

    cd tests/integration && python3 -m unittest -v test_admission
"""

import collections
import struct
import threading
import time
import unittest

import harness
from harness import (COORDINATOR, F, RpcConnection, RpcError, frame, pb_bytes, pb_uint,
                     sanitized)
from secutil import settle_rss, vm_rss_kib

CONNECTIONS = 8
PIPELINED = 16
REQUEST_BYTES = 3900000
RSS_BOUND_KIB = 300 * 1024


def vm_hwm_kib(pid):
    """Peak VmRSS of the process so far."""
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise AssertionError("no VmHWM for pid %d" % pid)


def big_submit():
    """A SubmitOpRequest of about REQUEST_BYTES: an all-reduce over as many device
    references as fit (far over limits.max_group_devices, so it is refused once decoded)."""
    dev = pb_uint(F("Device", "backend"), 2) + pb_uint(F("Device", "index"), 1)
    ref = pb_bytes(F("DeviceRef", "worker"), "node-a") + pb_bytes(F("DeviceRef", "device"), dev)
    entry = pb_bytes(F("SubmitOpRequest", "devices"), ref)
    head = pb_uint(F("SubmitOpRequest", "kind"), 1) + pb_uint(F("SubmitOpRequest", "reduce"), 1) \
        + pb_bytes(F("SubmitOpRequest", "tensor"), "t")
    return head + entry * ((REQUEST_BYTES - len(head)) // len(entry))


class AdmissionTest(harness.ClusterTestCase):

    def test_pipelined_big_submits(self):
        c = self.make_cluster()
        c.start_coordinator()
        pid = c.coordinator.pid
        body = big_submit()
        codes = collections.Counter()
        messages = {}
        errors = []
        lock = threading.Lock()

        def connection(i):
            try:
                with RpcConnection(c.port, timeout=120.0) as conn:
                    for k in range(PIPELINED):
                        rid = (i << 16) + k + 1
                        header = (pb_uint(F("RequestHeader", "request_id"), rid)
                                  + pb_bytes(F("RequestHeader", "method"),
                                             COORDINATOR + "SubmitOp")
                                  + pb_uint(F("RequestHeader", "timeout_ms"), 60000))
                        conn.send_message(struct.pack(">I", rid | 0x80000000)
                                          + frame(header, body))
                    for _ in range(PIPELINED):
                        code, msg, _ = harness.parse_reply(conn.recv_message()[4:])
                        with lock:
                            codes[code] += 1
                            messages.setdefault(code, msg)
            except (OSError, RpcError) as e:
                with lock:
                    errors.append("connection %d: %r" % (i, e))

        baseline = vm_rss_kib(pid)
        t0 = time.monotonic()
        threads = [threading.Thread(target=connection, args=(i,)) for i in range(CONNECTIONS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        elapsed = time.monotonic() - t0
        peak = vm_hwm_kib(pid)
        self.assertTrue(c.coordinator.running(), "the coordinator died in the burst")
        after = settle_rss(pid)
        print("\n  %d x %d pipelined SubmitOp of %d bytes in %.1f s: %r; VmRSS KiB before %d, "
              "peak %d, after %d" % (CONNECTIONS, PIPELINED, len(body), elapsed, dict(codes),
                                     baseline, peak, after))
        self.assertEqual(errors, [])
        self.assertEqual(sum(codes.values()), CONNECTIONS * PIPELINED, codes)
        self.assertGreater(codes["RESOURCE_EXHAUSTED"], 0, codes)
        self.assertIn("limits.max_inflight_bytes", messages["RESOURCE_EXHAUSTED"])
        # The ones taken were decoded and refused by validation, not by memory.
        self.assertGreater(codes["INVALID_ARGUMENT"], 0, (codes, messages))
        self.assertIn("too many devices", messages["INVALID_ARGUMENT"])

        code, msg, _ = harness.rpc_call(c.port, "GetClusterStatus")
        self.assertEqual(code, "OK", msg)
        if sanitized(harness.SERVER):
            return  # freed memory sits in ASan's quarantine: RSS says nothing
        self.assertLess(after, RSS_BOUND_KIB,
                        "VmRSS %d KiB after the burst (bound %d KiB)" % (after, RSS_BOUND_KIB))


if __name__ == "__main__":
    unittest.main()
