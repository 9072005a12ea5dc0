"""bindings/python/examples/ddp_train.py run as a user would, against real daemons: 2 ranks,
50 steps with DDP's gloo all-reduce and with devcoord.torch.allreduce_hook, a model of
several buckets; the parameters must agree (the example exits 1 otherwise). Skipped only
when torch is not importable."""

import os
import re
import subprocess
import sys
import unittest

from test_client import HERE, start_cluster

import harness

try:
    import torch  # noqa: F401
except ImportError:
    torch = None

EXAMPLE = os.path.join(os.path.dirname(HERE), "examples", "ddp_train.py")


@unittest.skipIf(torch is None, "torch is not importable (Debian: apt-get install python3-torch)")
class DdpExample(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cluster = start_cluster(harness.Cluster(heartbeat_ms=500, dead_after_ms=5000), cls)

    def test_ddp_train_agrees_with_gloo(self):
        p = subprocess.run([sys.executable, EXAMPLE, "--address", self.cluster.addr,
                            "--devices", "node-b/cuda:1,node-a/cuda:0", "--steps", "50",
                            # 2 MiB of gradients in buckets of 1 MiB (DDP's first), then of
                            # 0.25 MiB: each bucket past the first starts inside the block
                            "--width", "512", "--depth", "3", "--bucket-mb", "0.25"],
                           capture_output=True, text=True, timeout=180,
                           stdin=subprocess.DEVNULL)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertRegex(p.stdout, r"gloo all-reduce: \d+\.\d+ ms/step")
        hook = re.search(r"devcoord hook: +\d+\.\d+ ms/step \((\d+) bucket all-reduces on "
                         r"rank 0, (\d+) of them in shared memory", p.stdout)
        self.assertIsNotNone(hook, p.stdout)
        # the gradients went through devcoord: 3 buckets a step once DDP rebuilt them
        self.assertGreaterEqual(int(hook.group(1)), 3 * 49)
        # From the fourth step (DDP rebuilds its buckets after the first), the results were
        # left in the hook's shared block (both workers run on this host), each bucket's
        # read by DDP right (the parameters agree with gloo's, below).
        self.assertGreaterEqual(int(hook.group(2)), 3 * 45)
        m = re.search(r"50 steps, (\d+) parameters, max relative difference (\S+): agree",
                      p.stdout)
        self.assertIsNotNone(m, p.stdout)
        self.assertEqual(int(m.group(1)), 16 * 512 + 512 + 2 * (512 * 512 + 512) + 512 + 1)
        self.assertLessEqual(float(m.group(2)), 1e-5)


if __name__ == "__main__":
    unittest.main()
