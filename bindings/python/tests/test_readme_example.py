"""The ```python block under "## Python" in README.md runs as printed against a cluster shaped
like the quickstart's (node-a and node-b with cuda:0 and cuda:1), found through
$DEVCOORD_ADDR as the block says, and prints what its comments say."""

import os
import re
import subprocess
import sys
import unittest

from test_client import REPO, start_cluster

import harness

try:
    import numpy
except ImportError:
    numpy = None


def readme_block(n=1):
    """The n-th (from 1) ```python block under "## Python"."""
    with open(os.path.join(REPO, "README.md")) as f:
        text = f.read()
    section = text.split("\n## Python\n", 1)[1].split("\n## ", 1)[0]
    return section.split("```python\n")[n].split("```", 1)[0]


class ReadmeExample(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cluster = start_cluster(harness.Cluster(heartbeat_ms=500, dead_after_ms=5000), cls)

    def test_block_runs_as_printed(self):
        block = readme_block()
        self.assertGreaterEqual(len(block.splitlines()), 10)
        env = dict(os.environ, DEVCOORD_ADDR=self.cluster.addr,
                   PYTHONPATH=os.path.join(REPO, "bindings", "python"))
        p = subprocess.run([sys.executable, "-c", block], env=env, capture_output=True,
                           text=True, timeout=60, stdin=subprocess.DEVNULL)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        lines = p.stdout.splitlines()
        self.assertEqual(lines[0], repr(["node-a/cuda:0", "node-a/cuda:1", "node-b/cuda:0",
                                         "node-b/cuda:1"]))
        self.assertEqual(lines[1], "done array('f', [11.0, 22.0, 33.0])")
        self.assertTrue(re.match(r"INVALID_ARGUMENT: autodiff should not wrap an autodiff "
                                 r"device: devices\[0\] = node-a/autodiff\(autodiff\(cuda:0\)\)",
                                 lines[2]), lines[2])

    @unittest.skipIf(numpy is None, "numpy is not installed")
    def test_group_block_runs_once_per_rank(self):
        block = readme_block(2)
        self.assertGreaterEqual(len(block.splitlines()), 10)
        env = dict(os.environ, DEVCOORD_ADDR=self.cluster.addr,
                   PYTHONPATH=os.path.join(REPO, "bindings", "python"))
        procs = [subprocess.Popen([sys.executable, "-c", block, me], env=env, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  stdin=subprocess.DEVNULL)
                 for me in ("node-b/cuda:0", "node-a/cuda:0")]
        outs = []
        for p in procs:
            try:
                out, err = p.communicate(timeout=60)
            finally:
                p.kill()
            self.assertEqual(p.returncode, 0, out + err)
            outs.append(out.strip())
        every = "[1.5 1.5 1.5 1.5 1.5 1.5]"
        self.assertEqual(outs, ["1 2 [1.5 1.5 1.5] " + every, "0 2 [1.5 1.5 1.5] " + every])


if __name__ == "__main__":
    unittest.main()
