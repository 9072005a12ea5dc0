"""bindings/python/examples/ddp_train.py run as a user would, against real daemons: 2 ranks,
50 steps with DDP's gloo all-reduce and with devcoord.torch.allreduce_hook; the parameters
must agree (the example exits 1 otherwise). Skipped only when torch is not importable."""

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
                            "--devices", "node-b/cuda:1,node-a/cuda:0", "--steps", "50"],
                           capture_output=True, text=True, timeout=180,
                           stdin=subprocess.DEVNULL)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertRegex(p.stdout, r"gloo all-reduce: \d+\.\d+ ms/step")
        hook = re.search(r"devcoord hook: +\d+\.\d+ ms/step \((\d+) bucket all-reduces on "
                         r"rank 0, (\d+) of them in shared memory", p.stdout)
        self.assertIsNotNone(hook, p.stdout)
        self.assertGreaterEqual(int(hook.group(1)), 50)  # the gradients went through devcoord
        # From the fourth step (DDP rebuilds its buckets after the first), the results were
        # left in the hook's shared block (both workers run on this host).
        self.assertGreaterEqual(int(hook.group(2)), 47)
        m = re.search(r"50 steps, (\d+) parameters, max relative difference (\S+): agree",
                      p.stdout)
        self.assertIsNotNone(m, p.stdout)
        self.assertEqual(int(m.group(1)), 16 * 32 + 32 + 32 + 1)
        self.assertLessEqual(float(m.group(2)), 1e-5)


if __name__ == "__main__":
    unittest.main()
