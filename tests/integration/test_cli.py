"""Issue 15: devcoordctl as a user runs it, against the real binaries.

- ExitCodes: one table over every kind of outcome (0 ok, 1 the server said no, 2 usage
  error, 3 cannot reach), with the server up and down, including an address whose host does
  not resolve, a worker whose advertised address does not resolve from here, and a stopped
  coordinator with --timeout; usage errors carry no server code, refusals do.
- Help: COMMAND --help and `help COMMAND` print that command's usage; a typo gets the
  nearest command or option; the token options say what the variables hold.
  (That every example of the help runs: test_readme.)
- Completion: the bash script loads and completes commands, options, values, and worker
  and device names from the coordinator.
- Version: the client's version, and the coordinator's from its /metrics with --http.
- Tables: memory in binary units, AGE and LAST_HB as durations, raw values kept in JSON.
- Watch: workers list -w writes a frame per change into a pipe and ends cleanly on SIGINT.
- Drain: drain names the ops in flight on the worker; --wait waits for them, bounded by
  --timeout.
- Tensors: tensor get --file writes the raw bytes; progress on a terminal, not in a pipe.
- Tokens: $DEVCOORD_TOKEN holds the token, $DEVCOORD_TOKEN_FILE a file holding it.

No test asserts how long anything took: a bound is checked only as "ended, with this
outcome".
"""

import json
import os
import pty
import re
import select
import signal
import struct
import subprocess
import unittest

import harness
import opsutil
import secutil

ERROR_LINE = re.compile(r"^devcoordctl: ([A-Z][A-Z_]+): (.+)$")
USAGE_LINE = re.compile(
    r"^devcoordctl: (?![A-Z][A-Z_]+: )(.+) \(see 'devcoordctl ([a-z ]*)--help'\)$")
USAGE = "usage"  # stands for "no server code" in the tables below
ROOT_DIR = harness.REPO

CUDA2 = [{"device": "cuda:0", "memory": "80GiB"}, {"device": "cuda:1", "memory": "512MiB"}]


def run_ctl(args, env=None, stdin=None, binary=False, timeout=60):
    """devcoordctl ARGS without any DEVCOORD_* variable of ours (env adds some); stdout as
    text, or as bytes when binary."""
    run_env = {k: v for k, v in os.environ.items() if not k.startswith("DEVCOORD_")}
    run_env.update(env or {})
    p = subprocess.run([harness.CTL] + list(args), input=stdin, capture_output=True,
                       env=run_env, timeout=timeout)
    out = p.stdout if binary else p.stdout.decode("utf-8", "replace")
    r = harness.CtlResult([harness.CTL] + list(args), p.returncode, out,
                          p.stderr.decode("utf-8", "replace"))
    if binary:
        r.out, r.raw = "(%d bytes)" % len(p.stdout), p.stdout
    return r


class OutcomeAssertions:
    def assert_outcome(self, r, rc, code=None, mentions=None):
        """rc, and for a failure the stderr form: USAGE (no code, a hint naming the help to
        read) or 'devcoordctl: CODE: message'."""
        self.assertEqual(r.rc, rc, repr(r))
        if rc == 0:
            return
        lines = [l for l in r.err.splitlines() if l.strip()]
        self.assertTrue(lines, "nothing on stderr: %r" % (r,))
        if code == USAGE:
            self.assertEqual(len(lines), 1, "one line for a usage error: %r" % (r,))
            m = USAGE_LINE.match(lines[0])
            self.assertIsNotNone(m, "not 'devcoordctl: message (see ...)': %r" % (r,))
            message = m.group(1)
        else:
            m = ERROR_LINE.match(lines[0])
            self.assertIsNotNone(m, "stderr is not 'devcoordctl: CODE: message': %r" % (r,))
            if code is not None:
                self.assertEqual(m.group(1), code, repr(r))
            message = m.group(2)
        if mentions is not None:
            self.assertIn(mentions, message, repr(r))
        return message


class ExitCodes(harness.ClusterTestCase, OutcomeAssertions):
    # A stopped worker stays alive for the op's own deadline to be what ends the op.
    dead_after_ms = 60000

    def setUp(self):
        c = self.cluster = self.make_cluster()
        c.start_coordinator()
        c.add_worker("node-a", CUDA2)
        c.add_worker("node-b", CUDA2)
        # Registers an address that resolves nowhere; it listens on another.
        port = harness.free_port()
        c.add_worker("node-x", [{"device": "cuda:0"}],
                     extra={"listen": harness.tcp_addr(port),
                            "advertise": "tcp://no-such-host.invalid:%d" % port})
        c.wait_workers()
        c.ctl_ok("tensor", "put", "node-a/cuda:0", "g", "--dtype", "f32", "--values", "1,2")
        self.dead = harness.DeadPort()
        self.addCleanup(self.dead.close)
        self.down = self.dead.addr

    CASES = [
        # what, args, server ("up", "down" or an address), rc, code or USAGE, mentions
        ("ok", ["status"], "up", 0, None, None),
        ("ok, -s HOST:PORT", ["status"], "host:port", 0, None, None),
        ("unknown command", ["stauts"], "up", 2, USAGE, "did you mean 'status'?"),
        ("unknown command, server down", ["stauts"], "down", 2, USAGE, "did you mean"),
        ("unknown subcommand", ["workers", "lst"], "up", 2, USAGE,
         "did you mean 'workers list'?"),
        ("unknown option", ["devices", "list", "--backnd", "cuda"], "up", 2, USAGE,
         "did you mean '--backend'?"),
        ("option of another command", ["status", "--backend", "cuda"], "up", 2, USAGE,
         "does not apply to 'status'"),
        ("missing argument", ["workers", "cordon"], "up", 2, USAGE, "NAME"),
        ("missing subcommand", ["workers"], "up", 2, USAGE, "needs a subcommand"),
        ("no command", [], "up", 2, USAGE, "no command"),
        ("bad value", ["plan", "--op", "all-reduce", "--reduce", "average", "--devices",
                       "node-a/cuda:0"], "up", 2, USAGE, "average"),
        ("bad -o", ["-o", "yaml", "status"], "up", 2, USAGE, "yaml"),
        ("bad --timeout", ["--timeout", "10", "status"], "up", 2, USAGE, "--timeout"),
        ("bad filter", ["devices", "list", "--backend", "tpu"], "up", 2, USAGE, "tpu"),
        ("device list does not parse", ["plan", "--op", "all-reduce", "--reduce", "sum",
                                        "--devices", "node-a/cuda:0,node-b/cuda:x"],
         "up", 2, USAGE, "devices[1] = 'node-b/cuda:x'"),
        ("device list does not parse, server down",
         ["submit", "--op", "all-reduce", "--reduce", "sum", "--tensor", "g", "--devices",
          "node-a/cuda:0,node-b/cuda:x"], "down", 2, USAGE, "devices[1]"),
        ("device does not parse", ["tensor", "get", "node-a/cuda:x", "g"], "down", 2, USAGE,
         "node-a/cuda:x"),
        ("unreadable --file", ["tensor", "put", "node-a/cuda:0", "g", "--dtype", "f32",
                               "--file", "/nonexistent/values.bin"], "up", 2, USAGE,
         "/nonexistent/values.bin"),
        ("unreadable token file", ["--token-file", "/nonexistent/token", "status"], "up", 2,
         USAGE, "/nonexistent/token"),
        ("malformed address", ["status"], "bogus://x", 2, USAGE, "bad address"),
        ("port out of range", ["status"], "127.0.0.1:99999", 2, USAGE, "bad address"),
        ("unknown worker", ["workers", "show", "node-z"], "up", 1, "NOT_FOUND", "node-z"),
        ("refused plan", ["plan", "--op", "all-reduce", "--reduce", "sum", "--devices",
                          "node-a/cuda:0,node-b/autodiff(cuda:0)"], "up", 1,
         "INVALID_ARGUMENT", "devices[1] = node-b/autodiff(cuda:0)"),
        ("unknown tensor", ["tensor", "get", "node-a/cuda:0", "absent"], "up", 1,
         "NOT_FOUND", None),
        ("server down", ["status"], "down", 3, "UNAVAILABLE", "cannot reach"),
        ("health, server down", ["health"], "down", 3, "UNAVAILABLE", None),
        ("host does not resolve", ["status"], "tcp://no-such-host.invalid:7400", 3,
         "UNAVAILABLE", "host 'no-such-host.invalid' does not resolve"),
        ("HOST:PORT does not resolve", ["status"], "no-such-host.invalid:7400", 3,
         "UNAVAILABLE", "does not resolve"),
        ("worker's address does not resolve",
         ["tensor", "put", "node-x/cuda:0", "g", "--dtype", "f32", "--values", "1"], "up", 3,
         "UNAVAILABLE", "data address advertised by worker node-x"),
        ("worker's address does not resolve, get", ["tensor", "get", "node-x/cuda:0", "g"],
         "up", 3, "UNAVAILABLE", "does not resolve from here"),
    ]

    def server(self, which):
        if which == "up":
            return self.cluster.addr
        if which == "down":
            return self.down
        if which == "host:port":
            return "127.0.0.1:%d" % self.cluster.port
        return which

    def test_every_outcome(self):
        for what, args, server, rc, code, mentions in self.CASES:
            for output in ("table", "json"):
                with self.subTest(what, output=output):
                    r = self.cluster.ctl(*args, output=output, server=self.server(server))
                    self.assert_outcome(r, rc, code, mentions)
                    if code == USAGE:
                        self.assertEqual(r.out, "", "a usage error prints nothing on stdout")

    def test_stopped_coordinator_and_timeout(self):
        """A coordinator that accepts connections but does not answer (SIGSTOP): --timeout
        ends the call with DEADLINE_EXCEEDED, exit 3; the same when connected already."""
        c = self.cluster
        c.coordinator.signal(signal.SIGSTOP)
        try:
            r = c.ctl("status", "--timeout", "300ms")
            self.assert_outcome(r, 3, "DEADLINE_EXCEEDED", "cannot reach %s" % c.addr)
            r = c.ctl("--timeout", "300ms", "health", output=None)
            self.assertEqual(r.rc, 3, repr(r))
        finally:
            c.coordinator.signal(signal.SIGCONT)
        c.ctl_ok("status", "--timeout", "10s")

    def test_submit_takes_timeout_as_the_op_deadline(self):
        """A stopped worker: the op's deadline is --timeout, so the coordinator answers
        DEADLINE_EXCEEDED (the server said no: exit 1) and aborts it."""
        c = self.cluster
        c.ctl_ok("tensor", "put", "node-b/cuda:0", "g", "--dtype", "f32", "--values", "3,4")
        c.stop_worker("node-b")
        try:
            r = c.ctl("submit", "--op", "all-reduce", "--reduce", "sum", "--tensor", "g",
                      "--devices", "node-a/cuda:0,node-b/cuda:0", "--timeout", "1s")
        finally:
            c.cont_worker("node-b")
        self.assert_outcome(r, 1, "DEADLINE_EXCEEDED")
        self.assertEqual(r.out["status"], "DEADLINE_EXCEEDED", repr(r))


class Help(unittest.TestCase, OutcomeAssertions):
    COMMANDS = [["status"], ["workers", "list"], ["workers", "show"], ["workers", "cordon"],
                ["workers", "drain"], ["workers", "uncordon"], ["devices", "list"],
                ["tensor", "put"], ["tensor", "get"], ["tensor", "list"],
                ["tensor", "delete"], ["plan"], ["submit"], ["ops", "list"], ["ops", "show"],
                ["health"], ["version"], ["completion"]]

    def test_command_help(self):
        top = run_ctl(["--help"])
        self.assertEqual(top.rc, 0)
        for words in self.COMMANDS:
            with self.subTest(words=words):
                r = run_ctl(words + ["--help"])
                self.assertEqual(r.rc, 0, repr(r))
                text = r.out
                self.assertTrue(text.startswith("Usage: devcoordctl %s" % " ".join(words)), text)
                self.assertIn("\nExamples:\n  devcoordctl %s" % words[0], text)
                self.assertNotEqual(text, top.out)
                # The same from `help`, and with -h, and with the option first.
                for argv in (["help"] + words, words + ["-h"], ["--help"] + words):
                    self.assertEqual(run_ctl(argv).out, text, argv)
        # A command's help needs none of its required options or arguments.
        r = run_ctl(["submit", "--help"])
        self.assertIn("--timeout-ms N", r.out)
        r = run_ctl(["workers", "--help"])
        self.assertEqual(r.rc, 0)
        for sub in ("list", "show", "cordon", "drain", "uncordon"):
            self.assertIn("workers %s" % sub, r.out)

    def test_unknown_words_get_the_nearest(self):
        cases = [
            (["stauts"], "unknown command 'stauts' (did you mean 'status'?)", ""),
            (["wrokers", "list"], "did you mean 'workers'?", ""),
            (["workers", "lst"], "did you mean 'workers list'?", "workers "),
            (["tensor", "get", "--fiel", "x", "node-a/cuda:0", "g"],
             "unknown option '--fiel' (did you mean '--file'?)", "tensor get "),
            (["submit", "--reduec", "sum"], "did you mean '--reduce'?", "submit "),
            (["help", "tensr"], "did you mean 'tensor'?", ""),
            (["stauts", "--help"], "did you mean 'status'?", ""),
        ]
        for argv, mentions, hint in cases:
            with self.subTest(argv=argv):
                r = run_ctl(argv)
                message = self.assert_outcome(r, 2, USAGE, mentions)
                self.assertEqual(USAGE_LINE.match(r.err.strip()).group(2), hint, message)
        for argv in (["frobnicate"], ["devices", "list", "--zzzzzz"]):
            r = run_ctl(argv)
            self.assert_outcome(r, 2, USAGE)
            self.assertNotIn("did you mean", r.err)

    def test_token_variables_are_described_as_they_are(self):
        text = run_ctl(["--help"]).out
        self.assertRegex(text, r"\$DEVCOORD_TOKEN,\s+which holds the token itself")
        self.assertIn("$DEVCOORD_TOKEN_FILE", text)
        with open(os.path.join(ROOT_DIR, "client", "man", "devcoordctl.1")) as f:
            man = f.read()
        self.assertIn("holds the token itself", man)
        self.assertIn("DEVCOORD_TOKEN_FILE", man)

    def test_version_flag(self):
        r = run_ctl(["--version"])
        self.assertEqual(r.rc, 0)
        self.assertRegex(r.out, r"^devcoordctl \d+\.\d+\.\d+\n$")


def complete(words, env=None):
    """COMPREPLY of the bash completion for the words typed so far (the last one is the word
    being completed)."""
    script = ('source <("$CTL" completion bash) || exit 9\n'
              'COMP_WORDS=(%s); COMP_CWORD=%d; _devcoordctl\n'
              'printf "%%s\\n" "${COMPREPLY[@]}"\n') % (
        " ".join("'%s'" % w for w in words), len(words) - 1)
    run_env = {k: v for k, v in os.environ.items() if not k.startswith("DEVCOORD_")}
    run_env.update(env or {}, CTL=harness.CTL)
    p = subprocess.run(["bash", "-c", script], capture_output=True, env=run_env, timeout=60)
    assert p.returncode == 0, p
    return [l for l in p.stdout.decode().splitlines() if l]


class Completion(harness.ClusterTestCase):
    def test_script_loads(self):
        p = subprocess.run(["bash", "-c", 'source <("$CTL" completion bash); complete -p '
                            'devcoordctl'], capture_output=True, timeout=60,
                           env=dict(os.environ, CTL=harness.CTL))
        self.assertEqual(p.returncode, 0, p)
        self.assertEqual(p.stdout.decode().strip(), "complete -F _devcoordctl devcoordctl")
        r = run_ctl(["completion", "zsh"])
        self.assertEqual(r.rc, 2, repr(r))

    def test_static_words(self):
        cases = [
            (["devcoordctl", "wor"], ["workers"]),
            (["devcoordctl", "workers", "d"], ["drain"]),
            (["devcoordctl", "tensor", ""], ["put", "get", "list", "delete"]),
            (["devcoordctl", "devices", "list", "--ba"], ["--backend"]),
            (["devcoordctl", "submit", "--op", "all-"], ["all-reduce", "all-gather"]),
            (["devcoordctl", "-o", ""], ["table", "json"]),
            (["devcoordctl", "-s", "x:1", "sta"], ["status"]),
            (["devcoordctl", "tensor", "put", "--dt"], ["--dtype"]),
            (["devcoordctl", "help", "ten"], ["tensor"]),
            (["devcoordctl", "completion", ""], ["bash"]),
        ]
        for words, want in cases:
            with self.subTest(words=words):
                self.assertEqual(sorted(complete(words)), sorted(want))

    def test_names_from_the_coordinator(self):
        c = self.make_cluster()
        c.start_coordinator()
        c.add_worker("node-a", CUDA2)
        c.add_worker("node-b", CUDA2[:1])
        c.wait_workers()
        env = {"DEVCOORD_ADDR": c.addr}
        # The names come from the devcoordctl being completed (the first word).
        self.assertEqual(complete([harness.CTL, "workers", "cordon", ""], env),
                         ["node-a", "node-b"])
        self.assertEqual(complete([harness.CTL, "tensor", "get", "node-a"], env),
                         ["node-a/cuda:0", "node-a/cuda:1"])


class Version(harness.ClusterTestCase, OutcomeAssertions):
    def test_client_and_server(self):
        http = harness.free_port()
        c = self.make_cluster(coordinator_config={"http": "127.0.0.1:%d" % http})
        c.start_coordinator()
        mine = run_ctl(["--version"]).out.split()[1]
        r = c.ctl("version", "--http", "127.0.0.1:%d" % http, output="table")
        self.assertEqual(r.rc, 0, repr(r))
        self.assertIn("client: devcoordctl %s, libdevcoord %s" % (mine, mine), r.out)
        self.assertIn("server: %s (" % mine, r.out)
        doc = c.ctl_ok("version", "--http", "127.0.0.1:%d" % http)
        self.assertEqual(doc["client"]["devcoordctl"], mine)
        self.assertEqual(doc["server"]["version"], mine)
        self.assertTrue(doc["server"]["reachable"])
        # Without --http no RPC tells: unknown, said as such, still exit 0.
        r = c.ctl("version", output="table")
        self.assertEqual(r.rc, 0, repr(r))
        self.assertIn("server: unknown (", r.out)
        self.assertIsNone(c.ctl_ok("version")["server"]["version"])
        # Nobody there: the client's version, then exit 3.
        with harness.DeadPort() as dead:
            r = c.ctl("version", output="table", server=dead.addr)
        self.assertEqual(r.rc, 3, repr(r))
        self.assertIn("client: devcoordctl %s" % mine, r.out)
        self.assertIn("server: unknown (UNAVAILABLE: cannot reach", r.out)


class Tables(harness.ClusterTestCase):
    def test_human_units_in_tables_raw_in_json(self):
        c = self.make_cluster()
        c.start_coordinator()
        c.add_worker("node-a", CUDA2)
        c.wait_workers()
        r = c.ctl("devices", "list", output="table")
        self.assertEqual(r.rc, 0, repr(r))
        self.assertEqual(r.out.splitlines()[0].split(),
                         ["NAME", "WORKER", "DEVICE", "BACKEND", "STATE", "MEMORY"])
        self.assertRegex(r.out, r"(?m)^node-a/cuda:0\s.*\s80Gi$")
        self.assertRegex(r.out, r"(?m)^node-a/cuda:1\s.*\s512Mi$")
        mem = {d["name"]: d["memory_bytes"] for d in c.ctl_ok("devices", "list")["devices"]}
        self.assertEqual(mem, {"node-a/cuda:0": 80 << 30, "node-a/cuda:1": 512 << 20})

        age = r"\d+(ms|s|m|h|d)"
        r = c.ctl("workers", "list", output="table")
        header, row = r.out.splitlines()[:2]
        self.assertEqual(header.split(), ["NAME", "ADDRESS", "STATE", "AGE", "DEVICES",
                                          "EXECUTOR", "LAST_HB", "LABELS"])
        cells = dict(zip(header.split(), row.split()))
        self.assertRegex(cells["AGE"], "^%s$" % age)
        self.assertRegex(cells["LAST_HB"], "^%s$" % age)
        w = c.ctl_ok("workers", "list")["workers"][0]
        self.assertIsInstance(w["epoch"], int)
        self.assertIsInstance(w["since_heartbeat_ms"], int)

        c.ctl_ok("tensor", "put", "node-a/cuda:0", "t", "--dtype", "i32", "--values", "1")
        c.ctl_ok("tensor", "put", "node-a/cuda:1", "t", "--dtype", "i32", "--values", "2")
        c.ctl_ok("submit", "--op", "all-reduce", "--reduce", "sum", "--tensor", "t",
                 "--devices", "node-a/cuda:0,node-a/cuda:1")
        r = c.ctl("ops", "list", output="table")
        header, row = r.out.splitlines()[:2]
        self.assertEqual(header.split(), ["OP_ID", "KIND", "STATE", "STATUS", "DEVICES",
                                          "TENSOR", "AGE", "ELAPSED", "WAITING_ON"])
        cells = dict(zip(header.split(), row.split()))
        self.assertRegex(cells["AGE"], "^%s$" % age)
        self.assertRegex(cells["ELAPSED"], r"^\d+(\.\d+)?(us|ms|s|m|h|d)$")
        op = c.ctl_ok("ops", "list")["ops"][0]
        self.assertIsInstance(op["submitted_unix_ms"], int)
        self.assertIsInstance(op["elapsed_us"], int)


def read_line(stream, timeout):
    """One line from a pipe, or None when none came within timeout (a bound for the test,
    not an assertion about speed)."""
    ready, _, _ = select.select([stream], [], [], timeout)
    if not ready:
        return None
    return stream.readline().decode()


class Watch(harness.ClusterTestCase, OutcomeAssertions):
    def setUp(self):
        c = self.cluster = self.make_cluster()
        c.start_coordinator()
        c.add_worker("node-a", CUDA2[:1])
        c.add_worker("node-b", CUDA2[:1])
        c.wait_workers()

    def watch(self, *args):
        argv = [harness.CTL, "-s", self.cluster.addr] + list(args) + [
            "workers", "list", "-w", "--watch-interval", "100ms"]
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, bufsize=0)
        self.addCleanup(lambda: (p.poll() is None and p.kill(), p.wait(),
                                 p.stdout.close(), p.stderr.close()))
        return p

    def test_a_frame_per_change_then_sigint(self):
        p = self.watch("-o", "json")
        first = read_line(p.stdout, 30)
        self.assertIsNotNone(first, "no first frame")
        states = {w["name"]: w["state"] for w in json.loads(first)["workers"]}
        self.assertEqual(states, {"node-a": "alive", "node-b": "alive"})
        self.cluster.ctl_ok("workers", "cordon", "node-b")
        second = read_line(p.stdout, 30)
        self.assertIsNotNone(second, "no frame after the change")
        states = {w["name"]: w["state"] for w in json.loads(second)["workers"]}
        self.assertEqual(states, {"node-a": "alive", "node-b": "cordoned"})
        p.send_signal(signal.SIGINT)
        self.assertEqual(p.wait(timeout=30), 0)
        self.assertEqual(p.stdout.read().decode(), "", "a frame without a change")

    def test_table_frames_in_a_pipe(self):
        p = self.watch()
        lines = []
        while len([l for l in lines if l.startswith("NAME")]) < 1:
            lines.append(read_line(p.stdout, 30))
            self.assertIsNotNone(lines[-1])
        for _ in range(2):  # the two workers' rows
            lines.append(read_line(p.stdout, 30))
        self.cluster.ctl_ok("workers", "drain", "node-a")
        blank = read_line(p.stdout, 30)
        self.assertEqual(blank, "\n", "frames are separated by a blank line")
        self.assertTrue(read_line(p.stdout, 30).startswith("NAME"))
        p.send_signal(signal.SIGTERM)
        self.assertEqual(p.wait(timeout=30), 0)

    def test_flags(self):
        c = self.cluster
        self.assert_outcome(c.ctl("workers", "list", "--watch-interval", "1s"), 2, USAGE,
                            "needs --watch")
        self.assert_outcome(c.ctl("workers", "list", "-w", "--watch-interval", "0s"), 2, USAGE,
                            "--watch-interval")
        self.assert_outcome(c.ctl("status", "-w"), 2, USAGE, "does not apply")


class Drain(harness.ClusterTestCase, OutcomeAssertions):
    """node-b is stopped (SIGSTOP) during an all-reduce over node-a and node-b: the op stays
    in flight, waiting on node-b, until node-b runs again (dead_after is long)."""

    dead_after_ms = 120000

    def test_drain_names_and_waits_for_the_ops_in_flight(self):
        c = self.make_cluster()
        c.start_coordinator()
        c.add_worker("node-a", CUDA2[:1])
        c.add_worker("node-b", CUDA2[:1])
        c.wait_workers()
        # Nothing in flight: drain --wait returns at once, drained.
        doc = c.ctl_ok("workers", "drain", "node-a", "--wait")
        self.assertEqual((doc["ops_in_flight"], doc["op_ids"], doc["drained"]), (0, [], True))
        c.ctl_ok("workers", "uncordon", "node-a")
        for dev, v in (("node-a/cuda:0", "1,2"), ("node-b/cuda:0", "3,4")):
            c.ctl_ok("tensor", "put", dev, "t", "--dtype", "f32", "--values", v)
        c.stop_worker("node-b")
        resumed = False
        try:
            submit = opsutil.ctl_popen(c, "submit", "--op", "all-reduce", "--reduce", "sum",
                                       "--tensor", "t", "--devices",
                                       "node-a/cuda:0,node-b/cuda:0", "--timeout-ms", "110000")
            op = harness.wait_until(lambda: next(
                (o for o in c.ctl_ok("ops", "list")["ops"] if o["state"] == "running"), None),
                30, "the op to run")
            # Without --wait: drain says which op still uses node-b, exit 0.
            r = c.ctl("workers", "drain", "node-b", output="table")
            self.assertEqual(r.rc, 0, repr(r))
            self.assertIn("still used by 1 op in flight: %s" % op["op_id"], r.out)
            # --wait, bounded by --timeout: it runs out, exit 1 naming the op.
            r = c.ctl("workers", "drain", "node-b", "--wait", "--timeout", "500ms",
                      output="table")
            self.assertIn("waiting for 1 op in flight: %s" % op["op_id"], r.out)
            self.assert_outcome(r, 1, "DEADLINE_EXCEEDED",
                                "node-b still has 1 op in flight after 500ms: %s" % op["op_id"])
            r = c.ctl("workers", "drain", "node-b", "--wait", "--timeout", "300ms")
            self.assertEqual(r.rc, 1, repr(r))
            self.assertEqual((r.out["ops_in_flight"], r.out["op_ids"], r.out["drained"]),
                             (1, [op["op_id"]], False))
            # --wait with room to wait: node-b runs again, answers, and the wait ends.
            waiter = opsutil.ctl_popen(c, "workers", "drain", "node-b", "--wait",
                                       "--timeout", "100s")
            c.cont_worker("node-b")
            resumed = True
            r = opsutil.finish(waiter, 120)
            self.assertEqual(r.rc, 0, repr(r))
            self.assertEqual((r.out["ops_in_flight"], r.out["drained"]), (0, True))
            self.assertEqual(r.out["worker"]["state"], "draining")
            r = opsutil.finish(submit, 120)
            self.assertEqual(r.rc, 0, repr(r))
        finally:
            if not resumed:
                c.cont_worker("node-b")


class Tensors(harness.ClusterTestCase, OutcomeAssertions):
    BIG = 8 << 20  # above the 4 MiB from which progress shows

    def setUp(self):
        c = self.cluster = self.make_cluster()
        c.start_coordinator()
        c.add_worker("node-a", CUDA2)
        c.wait_workers()
        self.dir = c.path("files")
        os.makedirs(self.dir)

    def test_get_to_a_file(self):
        c = self.cluster
        values = [1.5, -2.0, 3.25, 1e30]
        c.ctl_ok("tensor", "put", "node-a/cuda:0", "w", "--dtype", "f64", "--values",
                 ",".join(repr(v) for v in values), "--shape", "2,2")
        out = os.path.join(self.dir, "w.bin")
        r = c.ctl("tensor", "get", "node-a/cuda:0", "w", "--file", out, output="table")
        self.assertEqual(r.rc, 0, repr(r))
        self.assertIn("wrote 32 bytes to %s" % out, r.out)
        self.assertNotIn("1.5", r.out, "values printed although --file was given")
        with open(out, "rb") as f:
            self.assertEqual(list(struct.unpack("=4d", f.read())), values)
        doc = c.ctl_ok("tensor", "get", "node-a/cuda:0", "w", "--file", out)
        self.assertEqual((doc["values"], doc["file"], doc["shape"], doc["size_bytes"]),
                         (None, out, [2, 2], 32))
        # '-': the raw bytes are the output; and back in through standard input.
        r = run_ctl(["-s", c.addr, "tensor", "get", "node-a/cuda:0", "w", "--file", "-"],
                    binary=True)
        self.assertEqual(r.rc, 0, repr(r))
        self.assertEqual(list(struct.unpack("=4d", r.raw)), values)
        r = run_ctl(["-s", c.addr, "tensor", "put", "node-a/cuda:1", "w", "--dtype", "f64",
                     "--file", "-"], stdin=r.raw)
        self.assertEqual(r.rc, 0, repr(r))
        self.assertEqual(c.ctl_ok("tensor", "get", "node-a/cuda:1", "w")["values"], values)
        self.assert_outcome(c.ctl("tensor", "get", "node-a/cuda:0", "w", "--file", "-"), 2,
                            USAGE, "standard output")
        self.assert_outcome(c.ctl("tensor", "get", "node-a/cuda:0", "w", "--file",
                                  os.path.join(self.dir, "no", "such", "dir")), 2, USAGE,
                            "cannot write")

    def ctl_on_pty(self, args):
        """devcoordctl with stderr on a pseudo-terminal: (exit code, what the terminal got)."""
        master, slave = pty.openpty()
        try:
            p = subprocess.Popen([harness.CTL, "-s", self.cluster.addr] + args,
                                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                 stderr=slave)
            os.close(slave)
            slave = None
            got = b""
            while True:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: the other side is closed
                    break
                if not chunk:
                    break
                got += chunk
            return p.wait(timeout=120), got.decode("utf-8", "replace")
        finally:
            if slave is not None:
                os.close(slave)
            os.close(master)

    def test_progress_on_a_terminal_only(self):
        src = os.path.join(self.dir, "big.bin")
        with open(src, "wb") as f:
            f.write(os.urandom(self.BIG))
        dst = os.path.join(self.dir, "back.bin")
        put = ["tensor", "put", "node-a/cuda:0", "big", "--dtype", "f32", "--file", src]
        get = ["tensor", "get", "node-a/cuda:0", "big", "--file", dst]
        for verb, args in (("put", put), ("get", get)):
            with self.subTest(verb):
                rc, tty = self.ctl_on_pty(args)
                self.assertEqual(rc, 0, tty)
                self.assertIn("\r%s node-a/cuda:0 big: " % verb, tty)
                self.assertIn("8Mi" + "B of 8MiB (100%)", tty)
                r = self.cluster.ctl(*args, output="table")  # stderr a pipe: silent
                self.assertEqual((r.rc, r.err), (0, ""), repr(r))
        with open(src, "rb") as a, open(dst, "rb") as b:
            self.assertEqual(a.read(), b.read())
        # A small tensor shows nothing even on a terminal.
        rc, tty = self.ctl_on_pty(["tensor", "put", "node-a/cuda:1", "small", "--dtype", "f32",
                                   "--values", "1,2,3"])
        self.assertEqual((rc, tty), (0, ""))


class Tokens(secutil.SecureTestCase, OutcomeAssertions):
    def test_token_variables(self):
        c = self.make_secure_cluster(auth=True)
        c.start_coordinator()
        op_file, op_token = c.tokens.files["operator"], c.tokens.by_role["operator"]
        self.assert_outcome(c.ctl("status", auth=None), 1, "UNAUTHENTICATED")
        for what, env, extra in (
                ("--token-file", {}, ["--token-file", op_file]),
                ("$DEVCOORD_TOKEN holds the token", {"DEVCOORD_TOKEN": op_token}, []),
                ("$DEVCOORD_TOKEN_FILE names a file", {"DEVCOORD_TOKEN_FILE": op_file}, []),
                ("--token-file over the variables",
                 {"DEVCOORD_TOKEN": c.tokens.unknown, "DEVCOORD_TOKEN_FILE": "/nonexistent"},
                 ["--token-file", op_file]),
                ("$DEVCOORD_TOKEN over $DEVCOORD_TOKEN_FILE",
                 {"DEVCOORD_TOKEN": op_token, "DEVCOORD_TOKEN_FILE": "/nonexistent"}, [])):
            with self.subTest(what):
                r = c.ctl(*(extra + ["workers", "cordon", "nobody"]), auth=None, env=env)
                # Authenticated as an operator: the coordinator looks the worker up.
                self.assert_outcome(r, 1, "NOT_FOUND", "nobody")
        r = c.ctl("status", auth=None, env={"DEVCOORD_TOKEN_FILE": "/nonexistent/token"})
        self.assert_outcome(r, 2, USAGE, "$DEVCOORD_TOKEN_FILE: cannot read token file")


if __name__ == "__main__":
    unittest.main()
