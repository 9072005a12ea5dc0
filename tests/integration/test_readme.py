"""Issue 15, items 1 and 2: the documentation runs as printed.

Each test starts the cluster of `bash deploy/quickstart.sh` (the same script and configs, on
free ports, from the build under test: DEVCOORD_BIN_DIR skips its setup and build) and runs
documented commands against it, checking each exits 0 and prints what the text says:

- the README's tour (the ```sh block under "## A tour"), line by line, and its refusal
  example (exit 1, the error line exactly as printed);
- the README's client-library blocks: an install under another prefix, and the example
  trainer built against it with pkg-config and run;
- the man page's EXAMPLES, in order;
- the examples of `devcoordctl --help` and of every `devcoordctl COMMAND --help`, in the
  order the help lists them.

And no text a user reads (README, man page, --help, public headers, example configs) points
at a "design §N": the design document is not in the repository.

Commands run in a scratch folder whose `build` is the build under test, so `build/client/
devcoordctl` means what the README says, and with the folder of devcoordctl first on PATH.
The cluster's ports are free ones, not 7400 and 7480: the README's way to move them
(DEVCOORD_ADDR) is what the tour gets; a --help example naming 127.0.0.1:7400 or :7480 gets
the test's ports in their place, the only change made to any documented command.

Every ```sh block of the README is accounted for: run here, or listed in NOT_RUN with why.
"""

import json
import os
import re
import shutil
import signal
import struct
import subprocess
import tempfile
import unittest

import harness

REPO = harness.REPO
README = os.path.join(REPO, "README.md")
MAN = os.path.join(REPO, "client", "man", "devcoordctl.1")
QUICKSTART = os.path.join(REPO, "deploy", "quickstart.sh")
BUILD = os.path.dirname(os.path.dirname(os.path.abspath(harness.CTL)))


def sanitized_build(build=BUILD):
    """Whether the build under test has the sanitizers on: its libdevcoord then needs the
    ASan runtime loaded first, which a program built with plain `cc` does not do."""
    try:
        with open(os.path.join(build, "CMakeCache.txt")) as f:
            return any(re.match(r"DEVCOORD_(SANITIZE|FUZZ):BOOL=ON$", l.strip()) for l in f)
    except OSError:
        return False

# ```sh blocks of the README no test here runs, by their first line, and why.
NOT_RUN = {
    "bash deploy/quickstart.sh": "runs in every test, with ports and a build given",
    "bash tests/run.sh": "the test suite itself",
    "cc client/examples/trainer.c $(pkg-config --cflags --libs devcoord) -o trainer && "
    "./trainer": "needs an install under /usr/local; run against a temporary prefix in "
                 "test_library_blocks",
    "devcoord-server --check-config /etc/devcoord/coordinator.yaml   # FILE: ok, exit 0; else 1":
        "an installed node's files under /etc; test_daemons runs --check-config, --version "
        "and SIGHUP on the build under test",
}


def sh_blocks(text):
    """[(heading, body)] of the ```sh blocks of a Markdown text, with the heading above."""
    blocks, heading, body = [], "", None
    for line in text.splitlines():
        if body is None:
            if line.startswith("#"):
                heading = line.lstrip("#").strip()
            elif line.strip() == "```sh":
                body = []
        elif line.strip() == "```":
            blocks.append((heading, "\n".join(body)))
            body = None
        else:
            body.append(line)
    return blocks


def commands(body):
    """The commands of a shell block: continuation lines joined, blank lines dropped."""
    out, cur = [], ""
    for line in body.splitlines():
        if line.rstrip().endswith("\\"):
            cur += line.rstrip()[:-1] + " "
            continue
        cur += line
        if cur.strip():
            out.append(cur.strip())
        cur = ""
    return out


def man_examples(path=MAN):
    """The lines of the man page's EXAMPLES (.nf block), unescaped, continuations joined."""
    with open(path) as f:
        text = f.read()
    section = text.split(".SH EXAMPLES", 1)[1].split(".SH ", 1)[0]
    block = section.split(".nf\n", 1)[1].split(".fi", 1)[0]
    block = block.replace("\\-", "-").replace("\\e", "\\")
    return commands(block)


class Quickstart:
    """deploy/quickstart.sh on free ports, in a scratch folder; stop() stops it."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="devcoord-readme-")
        self.work = os.path.join(self.dir, "work")
        os.makedirs(self.work)
        # The scratch folder looks like the repository to a documented command.
        os.symlink(BUILD, os.path.join(self.work, "build"))
        os.symlink(os.path.join(REPO, "client"), os.path.join(self.work, "client"))
        self.port = harness.free_port()
        self.http_port = harness.free_port()
        while self.http_port == self.port:
            self.http_port = harness.free_port()
        self.addr = "127.0.0.1:%d" % self.port
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith("DEVCOORD_") and k not in ("PKG_CONFIG_PATH",
                                                                     "LD_LIBRARY_PATH")}
        self.env.update(DEVCOORD_QUICKSTART_DIR=os.path.join(self.dir, "cluster"),
                        DEVCOORD_QUICKSTART_PORT=str(self.port),
                        DEVCOORD_QUICKSTART_HTTP_PORT=str(self.http_port),
                        DEVCOORD_BIN_DIR=BUILD,
                        HOME=os.path.join(self.dir, "home"),
                        PATH=os.path.dirname(os.path.abspath(harness.CTL)) + os.pathsep
                        + os.environ.get("PATH", ""))
        os.makedirs(self.env["HOME"])
        self.started = False

    def start(self):
        p = subprocess.run(["bash", QUICKSTART], env=self.env, capture_output=True,
                           timeout=120, stdin=subprocess.DEVNULL)
        self.started = True
        out = p.stdout.decode("utf-8", "replace")
        if p.returncode != 0:
            raise AssertionError("quickstart.sh failed (%d):\n%s\n%s\n%s" % (
                p.returncode, out, p.stderr.decode("utf-8", "replace"), self.logs()))
        return out

    def logs(self):
        parts = []
        cluster = self.env["DEVCOORD_QUICKSTART_DIR"]
        if os.path.isdir(cluster):
            for name in sorted(os.listdir(cluster)):
                if name.endswith(".log"):
                    with open(os.path.join(cluster, name), errors="replace") as f:
                        parts.append("---- %s\n%s" % (name, "".join(f.readlines()[-30:])))
        return "\n".join(parts)

    def pids(self):
        cluster = self.env["DEVCOORD_QUICKSTART_DIR"]
        out = []
        for name in ("node-a", "node-b", "coordinator"):
            try:
                with open(os.path.join(cluster, name + ".pid")) as f:
                    out.append(int(f.read().strip()))
            except (OSError, ValueError):
                pass
        return out

    def stop(self):
        if self.started:
            pids = self.pids()
            p = subprocess.run(["bash", QUICKSTART, "stop"], env=self.env, capture_output=True,
                               timeout=60, stdin=subprocess.DEVNULL)
            for pid in pids:  # whatever `stop` missed: the test must leave nothing behind
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            self.started = False
            if p.returncode != 0:
                raise AssertionError("quickstart.sh stop failed: %r" % (p,))
        shutil.rmtree(self.dir, ignore_errors=True)

    def sh(self, command, env=None, timeout=120):
        """Runs one documented command with bash in the scratch folder."""
        run_env = dict(self.env)
        run_env.update(env or {})
        p = subprocess.run(["bash", "-c", command], cwd=self.work, env=run_env,
                           capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)
        return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode(
            "utf-8", "replace")


class DocsTestCase(unittest.TestCase):
    def setUp(self):
        self.qs = Quickstart()
        self.addCleanup(self.qs.stop)
        self.banner = self.qs.start()
        # The README's way of pointing devcoordctl at a quickstart on other ports.
        self.docs_env = {"DEVCOORD_ADDR": self.qs.addr}

    def run_ok(self, command, env=None):
        rc, out, err = self.qs.sh(command, env if env is not None else self.docs_env)
        if rc != 0:
            self.fail("documented command failed (exit %d): %s\nstdout:\n%s\nstderr:\n%s\n%s"
                      % (rc, command, out, err, self.qs.logs()))
        return out, err


class ReadmeTest(DocsTestCase):
    def readme(self):
        with open(README) as f:
            return f.read()

    def test_quickstart_starts_what_the_tour_uses(self):
        self.assertIn("node-a", self.banner)
        self.assertIn("node-b", self.banner)
        out, _ = self.run_ok("build/client/devcoordctl -o json devices list")
        names = sorted(d["name"] for d in json.loads(out)["devices"])
        self.assertEqual(names, ["node-a/cuda:0", "node-a/cuda:1", "node-b/cuda:0",
                                 "node-b/cuda:1"])
        # Run again, it says so and starts nothing twice.
        pids = self.qs.pids()
        self.qs.start()
        self.assertEqual(self.qs.pids(), pids)

    def test_tour(self):
        blocks = [body for heading, body in sh_blocks(self.readme()) if heading == "A tour"]
        self.assertEqual(len(blocks), 1, "one ```sh block under '## A tour'")
        lines = commands(blocks[0])
        prelude = [l for l in lines if re.match(r"^\w+=\S+(\s+#.*)?$", l)]
        self.assertEqual(len(prelude), 1, "the tour starts with ctl=...: %r" % lines)
        # What the tour's comments promise, checked on the output of the command (the line
        # without its comment) that makes it.
        expect = {
            "$ctl status": lambda out: self.assertRegex(out, r"workers\s+alive\s+2"),
            "$ctl devices list --backend cuda": self.check_devices,
            "$ctl tensor get node-b/cuda:0 grad": lambda out: self.assertIn(
                "2.5 3.5 4.5", out.splitlines()),
            "$ctl tensor get node-b/cuda:0 grad --file grad.bin": self.check_grad_file,
            "$ctl plan --op broadcast --root 1 --devices node-a/cuda:0,node-b/cuda:0":
                lambda out: self.assertRegex(out, r"1\s+node-b/cuda:0\s+node-b"),
            "$ctl workers drain node-b --wait": lambda out: self.assertIn(
                "node-b is drained", out),
            "$ctl workers list": lambda out: self.assertRegex(out, r"node-b\s+\S+\s+draining"),
            "$ctl workers uncordon node-b": lambda out: self.assertRegex(
                out, r"node-b\s+\S+\s+alive"),
            "$ctl -o json ops list": self.check_ops_json,
            "for r in node-a/cuda:0 node-b/cuda:0; do $ctl collective all-reduce --reduce sum "
            "--devices node-a/cuda:0,node-b/cuda:0 --self $r --dtype f32 --values 1,2 & done; "
            "wait": lambda out: self.assertEqual(out.count("all-reduce: 2 4\n"), 2, out),
            "$ctl groups list": lambda out: self.assertRegex(
                out, r"\s1\s+0/2\s+0\s+1\s+0\s+node-a/cuda:0,node-b/cuda:0"),
        }
        used = set()
        for line in lines:
            if line in prelude:
                continue
            out, _ = self.run_ok(prelude[0] + "\n" + line)
            command = line.split(" #", 1)[0].strip()
            if command in expect:
                with self.subTest(line=line):
                    expect[command](out)
                used.add(command)
        self.assertEqual(sorted(set(expect) - used), [],
                         "tour lines this test checks are gone from the README")

    def check_devices(self, out):
        for d in ("node-a/cuda:0", "node-a/cuda:1", "node-b/cuda:0", "node-b/cuda:1"):
            self.assertRegex(out, r"(?m)^%s\s.*\s80Gi$" % re.escape(d))

    def check_grad_file(self, out):
        path = os.path.join(self.qs.work, "grad.bin")
        with open(path, "rb") as f:
            data = f.read()
        self.assertEqual(len(data), 12, out)
        self.assertEqual(struct.unpack("=3f", data), (2.5, 3.5, 4.5))

    def check_ops_json(self, out):
        ops = json.loads(out)["ops"]
        self.assertTrue(any(o["kind"] == "all-reduce" and o["status"] == "OK" for o in ops), out)

    def test_refusal_example(self):
        text = self.readme()
        block = text.split("A refusal is typed and names the offending entry:", 1)[1]
        block = block.split("```\n", 1)[1].split("```", 1)[0]
        lines = block.splitlines()
        cmd_lines, shown = [], []
        for line in lines:
            if line.startswith("$ ") or (cmd_lines and cmd_lines[-1].endswith("\\")
                                         and not shown):
                cmd_lines.append(line[2:] if line.startswith("$ ") else line)
            else:
                shown.append(line)
        command = commands("\n".join(cmd_lines))
        self.assertEqual(len(command), 1, block)
        rc, out, err = self.qs.sh(command[0], self.docs_env)
        self.assertEqual(rc, 1, (out, err))
        self.assertEqual(err.strip().splitlines(), shown, "the README's error line")

    @unittest.skipIf(sanitized_build(), "a sanitizer build's libdevcoord cannot be loaded by a "
                     "program built with plain cc; the normal build runs this")
    def test_library_blocks(self):
        """The install under another prefix and the trainer built against it, as printed;
        then the /usr/local form of the build, with what a /usr/local install gives
        pkg-config and the dynamic linker pointed at that prefix."""
        blocks = {commands(body)[0]: body for _, body in sh_blocks(self.readme())}
        prefix_blocks = [b for first, b in blocks.items() if "cmake --install build --prefix"
                         in first]
        self.assertEqual(len(prefix_blocks), 1, "one block installs under another prefix")
        script = prefix_blocks[0]
        self.assertIn("PKG_CONFIG_PATH", script)
        self.assertIn("-Wl,-rpath", script)
        out, _ = self.run_ok("set -e\n" + script, dict(self.docs_env))
        self.assertRegex(out, r"all-reduce \S+ over 4 devices on 2 workers: OK")
        self.assertEqual(out.count("expected 1.5"), 4, out)
        prefix = os.path.join(self.qs.env["HOME"], ".local")
        self.assertTrue(os.path.exists(os.path.join(prefix, "lib", "pkgconfig", "devcoord.pc")))
        default = [first for first in blocks if first in NOT_RUN and first.startswith("cc ")]
        self.assertEqual(len(default), 1)
        env = dict(self.docs_env, PKG_CONFIG_PATH=os.path.join(prefix, "lib", "pkgconfig"),
                   LD_LIBRARY_PATH=os.path.join(prefix, "lib"))
        out, _ = self.run_ok(default[0], env)
        self.assertRegex(out, r"over 4 devices on 2 workers: OK")

    def test_every_sh_block_is_accounted_for(self):
        runs_here = ("A tour", "The client library")
        for heading, body in sh_blocks(self.readme()):
            first = commands(body)[0]
            with self.subTest(first=first):
                self.assertTrue(heading in runs_here or first in NOT_RUN,
                                "a README block no test runs: %r under %r" % (first, heading))
        for first in NOT_RUN:
            self.assertIn(first, [commands(b)[0] for _, b in sh_blocks(self.readme())],
                          "NOT_RUN names a block the README no longer has")


class ManPageTest(DocsTestCase):
    def test_examples(self):
        examples = man_examples()
        self.assertGreaterEqual(len(examples), 5, examples)
        for line in examples:
            with self.subTest(line=line):
                self.run_ok(line)
        out, _ = self.run_ok("devcoordctl tensor list node-b/cuda:0")
        self.assertRegex(out, r"grad\s+f32\s+\[3\]")
        with open(os.path.join(self.qs.work, "grad.bin"), "rb") as f:
            self.assertEqual(struct.unpack("=3f", f.read()), (2.5, 3.5, 4.5))


class HelpExamplesTest(DocsTestCase):
    def help_text(self, *words):
        rc, out, err = self.qs.sh(" ".join(["devcoordctl"] + list(words) + ["--help"]))
        self.assertEqual(rc, 0, err)
        return out

    def command_words(self):
        """The commands the global help lists, as word lists ("workers list")."""
        text = self.help_text()
        listing = text.split("Commands:\n", 1)[1].split("\n\n", 1)[0]
        out = []
        for line in listing.splitlines():
            # The command and its ARGS fill the first column; a summary follows.
            column = re.split(r"\s{2,}", line.strip())[0]
            out.append([w for w in column.split() if re.match(r"^[a-z][a-z-]*$", w)])
        return out

    @staticmethod
    def examples(text):
        if "\nExamples:\n" not in text:
            return []
        section = text.split("\nExamples:\n", 1)[1].split("\n\n", 1)[0]
        return [l.strip() for l in section.splitlines() if l.startswith("  devcoordctl ")]

    def test_examples(self):
        cmds = self.command_words()
        self.assertGreaterEqual(len(cmds), 15, cmds)
        all_examples = self.examples(self.help_text())
        self.assertTrue(all_examples, "the global help has examples")
        for words in cmds:
            if words[0] == "help":
                continue
            text = self.help_text(*words)
            self.assertTrue(text.startswith("Usage: devcoordctl " + " ".join(words)), text)
            ex = self.examples(text)
            self.assertTrue(ex, "'devcoordctl %s --help' has no example" % " ".join(words))
            all_examples += ex
        # Files and tensors the examples read before one of them writes them.
        with open(os.path.join(self.qs.work, "grad.bin"), "wb") as f:
            f.write(struct.pack("=3f", 4, 5, 6))
        ran = 0
        for ex in all_examples:
            ex = ex.replace("127.0.0.1:7400", self.qs.addr).replace(
                "127.0.0.1:7480", "127.0.0.1:%d" % self.qs.http_port)
            with self.subTest(example=ex):
                if " -w" in ex.split("devcoordctl", 1)[1]:
                    self.run_watch(ex)
                else:
                    out, _ = self.run_ok(ex)
                    if ex.startswith("devcoordctl version --http"):
                        self.assertRegex(out, r"server: \d+\.\d+\.\d+ ")
                ran += 1
        self.assertGreaterEqual(ran, 20)

    def run_watch(self, example):
        """A watch runs until interrupted: its first frame, then SIGINT, then exit 0."""
        env = dict(self.qs.env, **self.docs_env)
        p = subprocess.Popen(["bash", "-c", "exec " + example], cwd=self.qs.work, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             stdin=subprocess.DEVNULL)
        try:
            first = p.stdout.readline().decode()
            self.assertTrue(first.startswith("NAME"), first)
            p.send_signal(signal.SIGINT)
            rc = p.wait(timeout=30)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
            p.stdout.close()
            p.stderr.close()
        self.assertEqual(rc, 0, example)


class QuickstartBesideCompose(unittest.TestCase):
    """deploy/quickstart.sh and deploy/compose.yaml run on one host without a port clash,
    and the README says which ports each one takes."""

    @staticmethod
    def read(*path):
        with open(os.path.join(REPO, *path)) as f:
            return f.read()

    def default(self, text, variable):
        m = re.search(r"\$\{%s:-(\d+)\}" % variable, text)
        self.assertIsNotNone(m, "no default for %s" % variable)
        return int(m.group(1))

    def test_ports(self):
        script = self.read("deploy", "quickstart.sh")
        compose = self.read("deploy", "compose.yaml")
        readme = self.read("README.md")
        qs = {self.default(script, "DEVCOORD_QUICKSTART_PORT"),
              self.default(script, "DEVCOORD_QUICKSTART_HTTP_PORT")}
        published = {self.default(compose, "DEVCOORD_PORT"),
                     self.default(compose, "DEVCOORD_HTTP_PORT")}
        self.assertEqual(len(qs), 2)
        self.assertEqual(len(published), 2)
        self.assertEqual(qs & published, set(), "quickstart and compose share host ports")
        # The quickstart's own config names its default ports (the script rewrites them only
        # when moved), and the README names both the quickstart's and compose's.
        config = self.read("deploy", "config", "quickstart", "coordinator.yaml")
        self.assertEqual({int(p) for p in re.findall(r"(?m)^(?:listen|http): \S*:(\d+)", config)},
                         qs)
        for port in sorted(qs | published):
            self.assertIn("127.0.0.1:%d" % port if port in qs else ":%d" % port, readme)
        # The other ports the README and the script suggest for the quickstart are free of
        # compose's too.
        for text in (readme, script):
            moved = {int(p) for p in re.findall(r"DEVCOORD_QUICKSTART_(?:HTTP_)?PORT=(\d+)", text)}
            self.assertTrue(moved)
            self.assertEqual(moved & published, set())


class NoOutsideReferences(unittest.TestCase):
    COMMANDS = [[], ["status"], ["workers", "list"], ["workers", "show"],
                ["workers", "cordon"], ["workers", "drain"], ["workers", "uncordon"],
                ["devices", "list"], ["tensor", "put"], ["tensor", "get"], ["tensor", "list"],
                ["tensor", "delete"], ["plan"], ["submit"], ["ops", "list"], ["ops", "show"],
                ["health"], ["version"], ["completion"]]

    def test_no_design_section_references(self):
        texts = {}
        for words in self.COMMANDS:
            p = subprocess.run([harness.CTL] + words + ["--help"], capture_output=True,
                               timeout=60)
            self.assertEqual(p.returncode, 0, p)
            texts["devcoordctl %s --help" % " ".join(words)] = p.stdout
        paths = ["README.md", "client/man/devcoordctl.1", "include/devcoord/devcoord.h",
                 "include/devcoord/types.h", "include/devcoord/status.h"]
        for d in ("deploy/config", "deploy/config/quickstart"):
            paths += [os.path.join(d, n) for n in sorted(os.listdir(os.path.join(REPO, d)))
                      if n.endswith(".yaml")]
        for p in paths:
            with open(os.path.join(REPO, p), "rb") as f:
                texts[p] = f.read()
        for where, text in texts.items():
            self.assertNotIn("design §", text.decode("utf-8", "replace"), where)


if __name__ == "__main__":
    unittest.main()
