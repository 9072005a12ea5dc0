"""Issue 15 item 9: the daemons as an operator runs them.

- `--check-config FILE` loads a config and what it names as a start would and exits 0
  ("FILE: ok") or 1 (the loader's file:line:column message, or the path that failed),
  binding nothing; `--version` prints the program's name and the project's version.
- SIGHUP reloads the tokens file and log.level from the config file: a token added is let
  in, a token removed is refused (UNAUTHENTICATED), a connection opened before the reload
  keeps working, a tokens file that does not load keeps the old tokens (logged as an error).
- $NOTIFY_SOCKET: READY=1 once serving, RELOADING=1 then READY=1 around a reload,
  STOPPING=1 on SIGTERM, as single datagrams (a path, or an abstract name with '@').
- A daemon started with a soft open-files limit of 256 raises it to the hard limit (and takes
  512 connections), and warns when the hard limit is under what its limits may need; past
  limits.max_connections a new connection is closed as it comes, and logged.
"""

import os
import re
import resource
import secrets
import signal
import socket
import subprocess
import threading

import harness
import secutil
from harness import REPO, Daemon, F, pb_bytes, pb_uint, wait_until

WORKER_SERVICE = "/devcoord.v1.Worker/"
BACKEND_CUDA = 2  # devcoord.proto, enum Backend
KEPT = "keeping the tokens loaded before"
VERSION = re.search(r"project\(devcoord VERSION (\d+\.\d+\.\d+)",
                    open(os.path.join(REPO, "CMakeLists.txt")).read()).group(1)


def run(argv, timeout=60):
    p = subprocess.run(argv, capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


class CheckConfig(harness.ClusterTestCase):
    def setUp(self):
        self.cluster = self.make_cluster()

    def check(self, program, text, name="config.yaml"):
        path = self.cluster.write(name, text)
        return (path,) + run([program, "--check-config", path])

    def test_version(self):
        for program, name in ((harness.SERVER, "devcoord-server"),
                              (harness.WORKER, "devcoord-worker")):
            rc, out, err = run([program, "--version"])
            self.assertEqual((rc, out, err), (0, "%s %s\n" % (name, VERSION), ""))
            rc, out, _ = run([program, "--help"])
            self.assertEqual(rc, 0)
            for flag in ("--config", "--check-config", "--version", "--help", "SIGHUP"):
                self.assertIn(flag, out)

    def test_good_files_are_ok_and_nothing_is_bound(self):
        # The port the config names is held here: a check that bound it would fail.
        with socket.socket() as held:
            held.bind((harness.HOST, 0))
            held.listen()
            port = held.getsockname()[1]
            tokens = secutil.Tokens(self.cluster.dir)
            state = self.cluster.path("state")
            os.mkdir(state)
            path, rc, out, err = self.check(harness.SERVER, harness.to_yaml({
                "listen": harness.tcp_addr(port), "http": "127.0.0.1:%d" % port,
                "auth": {"tokens_file": tokens.tokens_file}, "state_dir": state}) + "\n")
            self.assertEqual((rc, out, err), (0, "%s: ok\n" % path, ""))
            path, rc, out, err = self.check(harness.WORKER, harness.to_yaml({
                "name": "w1", "listen": harness.tcp_addr(port),
                "coordinator": harness.tcp_addr(port), "token_file": tokens.files["worker"],
                "auth": {"tokens_file": tokens.tokens_file},
                "devices": [{"device": "cuda:0", "memory": "1GiB"}]}) + "\n", "worker.yaml")
            self.assertEqual((rc, out, err), (0, "%s: ok\n" % path, ""))
        # The shipped examples that need no file from /etc.
        for program, example in ((harness.SERVER, "coordinator.yaml"),
                                 (harness.WORKER, "node-a.yaml")):
            path = os.path.join(REPO, "deploy", "config", "quickstart", example)
            self.assertEqual(run([program, "--check-config", path]),
                             (0, "%s: ok\n" % path, ""))

    def test_syntax_error_names_file_and_line(self):
        for program in (harness.SERVER, harness.WORKER):
            path, rc, out, err = self.check(program, "log: {level: info}\nheartbeat: [1, 2\n")
            self.assertEqual(rc, 1, err)
            self.assertEqual(out, "")
            self.assertRegex(err, r"^devcoord-(server|worker): %s:\d+:\d+: " % re.escape(path))
            path, rc, out, err = self.check(program, "log:\n  level: loud\n")
            self.assertEqual(rc, 1, err)
            self.assertIn("%s:2:" % path, err)
            self.assertIn("log.level", err)

    def test_missing_tokens_file_names_the_path(self):
        missing = self.cluster.path("no-such-tokens.yaml")
        for program in (harness.SERVER, harness.WORKER):
            _, rc, out, err = self.check(program, "auth: {tokens_file: %s}\n" % missing)
            self.assertEqual((rc, out), (1, ""), err)
            self.assertIn(missing, err)
        # A tokens file that exists but does not parse: its own file:line.
        bad = self.cluster.write("bad-tokens.yaml", "tok-1: trainer\ntok-2: admiral\n")
        _, rc, _, err = self.check(harness.SERVER, "auth: {tokens_file: %s}\n" % bad)
        self.assertEqual(rc, 1, err)
        self.assertIn("%s:2:" % bad, err)

    def test_what_only_a_start_would_find(self):
        missing = self.cluster.path("no-such.pem")
        a_file = self.cluster.write("plain-file", "x\n")
        cases = [
            (harness.SERVER, {"listen": "tls+tcp://127.0.0.1:1",
                              "tls": {"cert": missing, "key": missing}}, missing),
            (harness.SERVER, {"state_dir": os.path.join(a_file, "state")}, "state_dir"),
            (harness.WORKER, {"token_file": missing}, missing),
            (harness.WORKER, {"coordinator": "tls+tcp://127.0.0.1:1",
                              "tls": {"ca": missing}}, missing),
        ]
        for program, cfg, named in cases:
            with self.subTest(program=os.path.basename(program), cfg=cfg):
                _, rc, out, err = self.check(program, harness.to_yaml(cfg) + "\n")
                self.assertEqual((rc, out), (1, ""), err)
                self.assertIn(named, err)

    def test_check_config_and_config_disagree(self):
        rc, _, err = run([harness.SERVER, "--config", "a.yaml", "--check-config", "b.yaml"])
        self.assertEqual(rc, 2)
        self.assertIn("--check-config", err)


class Reload(secutil.SecureTestCase):
    def setUp(self):
        self.c = self.make_secure_cluster(auth=True)
        self.c.start_coordinator()
        self.tokens = self.c.tokens

    def write_tokens(self, pairs):
        with open(self.tokens.tokens_file, "w") as f:
            f.write("".join("%s: %s\n" % p for p in pairs))

    def code(self, token, method="ListWorkers", port=None, service=harness.COORDINATOR,
             body=b""):
        try:
            return self.c.rpc(method, body, token=token, port=port, service=service)[0]
        except (OSError, harness.RpcError) as e:
            return "error %s" % e

    def reloads(self, daemon):
        return daemon.log_text().count("reload: tokens of %s in use" % self.tokens.tokens_file)

    def hup(self, daemon, marker=None):
        """SIGHUP, then wait until the daemon logged `marker` once more (default: the new
        tokens are in use), the last line that reload writes."""
        marker = marker or "reload: tokens of %s in use" % self.tokens.tokens_file
        before = daemon.log_text().count(marker)
        daemon.signal(signal.SIGHUP)
        wait_until(lambda: daemon.log_text().count(marker) > before, 10,
                   "%s to log %r" % (daemon.name, marker))

    def test_added_token_in_removed_token_out_connection_kept(self):
        self.c.add_worker("w1", [{"device": "cuda:0", "memory": "1GiB"}])
        self.c.wait_workers(["w1"])
        trainer = self.tokens.by_role["trainer"]
        new = "dc-trainer-new-%s" % secrets.token_hex(16)
        conn = self.c.connect(token=trainer)
        self.addCleanup(conn.close)
        self.assertEqual(conn.call(harness.COORDINATOR + "ListWorkers")[0], "OK")
        self.assertEqual(self.code(new), "UNAUTHENTICATED")

        self.write_tokens(self.tokens.pairs() + [(new, "trainer")])
        self.hup(self.c.coordinator)
        self.assertEqual(self.code(new), "OK")
        self.assertEqual(self.code(trainer), "OK")
        # The connection opened before the reload: still open, still served.
        self.assertEqual(conn.call(harness.COORDINATOR + "ListWorkers")[0], "OK")

        self.write_tokens([p for p in self.tokens.pairs() if p[0] != trainer] + [(new, "trainer")])
        self.hup(self.c.coordinator)
        self.assertEqual(self.code(trainer), "UNAUTHENTICATED")
        self.assertEqual(self.code(new), "OK")
        # Same connection: the removed token is refused on it, the new one served.
        self.assertEqual(conn.call(harness.COORDINATOR + "ListWorkers")[0], "UNAUTHENTICATED")
        self.assertEqual(conn.call(harness.COORDINATOR + "ListWorkers", token=new)[0], "OK")
        self.assertEqual(self.reloads(self.c.coordinator), 2)
        # The worker's token was kept: it still heartbeats, and nothing restarted.
        before = self.c.registry_workers()["w1"]
        wait_until(lambda: self.c.registry_workers()["w1"]["state"] == "alive", 5, "w1 alive")
        self.assertEqual(self.c.registry_workers()["w1"]["epoch"], before["epoch"])
        self.assertEqual(self.c.coordinator.starts, 1)
        self.assertTrue(self.c.coordinator.running())

    def test_calls_in_flight_across_reloads(self):
        """Connections calling without pause while the table is swapped again and again:
        every call is answered OK, none is dropped or refused."""
        trainer = self.tokens.by_role["trainer"]
        stop = threading.Event()
        results = []

        def caller():
            codes = []
            try:
                with self.c.connect(token=trainer) as conn:
                    while not stop.is_set():
                        codes.append(conn.call(harness.COORDINATOR + "ListWorkers")[0])
            except (OSError, harness.RpcError) as e:
                codes.append("error %s" % e)
            results.append(codes)

        threads = [threading.Thread(target=caller) for _ in range(4)]
        for t in threads:
            t.start()
        try:
            for i in range(20):
                # Each file holds the caller's token and a different extra one.
                extra = "dc-extra-%d-%s" % (i, secrets.token_hex(8))
                self.write_tokens(self.tokens.pairs() + [(extra, "trainer")])
                self.hup(self.c.coordinator)
        finally:
            stop.set()
            for t in threads:
                t.join(30)
        self.assertEqual(self.reloads(self.c.coordinator), 20)
        self.assertEqual(len(results), 4)
        for codes in results:
            self.assertTrue(codes)
            self.assertEqual(set(codes), {"OK"}, codes[-5:])
        self.assertTrue(self.c.coordinator.running())

    def test_broken_tokens_file_keeps_the_old_tokens(self):
        trainer = self.tokens.by_role["trainer"]
        for broken in ("%s: trainer\n%s: trainer\n" % (trainer, trainer),  # listed twice
                       "- [unclosed\n", ""):
            with self.subTest(broken=broken):
                with open(self.tokens.tokens_file, "w") as f:
                    f.write(broken)
                log = self.c.coordinator.log_text()
                self.hup(self.c.coordinator, KEPT)
                new_lines = self.c.coordinator.log_text()[len(log):]
                self.assertRegex(new_lines, r"(?m)^.*error.*reload: %s.*keeping the tokens "
                                 % re.escape(self.tokens.tokens_file))
                self.assertNotIn(trainer, new_lines)  # tokens never reach the log
                self.assertTrue(self.c.coordinator.running())
                self.assertEqual(self.code(trainer), "OK")
        os.unlink(self.tokens.tokens_file)
        self.hup(self.c.coordinator, KEPT)
        self.assertEqual(self.code(trainer), "OK")
        self.assertEqual(self.reloads(self.c.coordinator), 0)

    def test_worker_reloads_its_tokens(self):
        w = self.c.add_worker("w1", [{"device": "cuda:0", "memory": "1GiB"}])
        self.c.wait_workers(["w1"])
        port = self.c.worker_port("w1")
        new = "dc-trainer-new-%s" % secrets.token_hex(16)
        cuda0 = pb_uint(F("Device", "backend"), BACKEND_CUDA) + pb_uint(F("Device", "index"), 0)
        args = ("ListTensors", port, WORKER_SERVICE, pb_bytes(F("ListTensorsRequest", "device"),
                                                              cuda0))
        self.assertEqual(self.code(new, *args), "UNAUTHENTICATED")
        self.write_tokens(self.tokens.pairs() + [(new, "trainer")])
        self.hup(w)
        self.assertEqual(self.code(new, *args), "OK")
        self.assertEqual(self.reloads(w), 1)
        wait_until(lambda: self.c.registry_workers()["w1"]["state"] == "alive", 5, "w1 alive")

    def test_log_level(self):
        cfg_path = self.c.path("coordinator.yaml")
        cfg = self.c.coordinator_yaml()
        # warn: the reload's own info lines are not written; the warning about a tokens file
        # that moved (it takes a restart) is.
        cfg["log"] = {"level": "warn"}
        cfg["auth"] = {"tokens_file": self.c.path("elsewhere.yaml")}
        self.c.write_yaml("coordinator.yaml", cfg)
        self.hup(self.c.coordinator, "that takes a restart")
        cfg["log"] = {"level": "info"}
        cfg["auth"] = {"tokens_file": self.tokens.tokens_file}
        self.c.write_yaml("coordinator.yaml", cfg)
        self.hup(self.c.coordinator)
        log = self.c.coordinator.log_text()
        self.assertIn("reload: %s: log level info" % cfg_path, log)
        self.assertNotIn("log level warn", log)
        self.assertEqual(self.reloads(self.c.coordinator), 1)
        # A config that does not load changes nothing, and says why.
        self.c.write("coordinator.yaml", "log: {level: shouting}\n")
        self.hup(self.c.coordinator, "keeping the running configuration")
        self.assertRegex(self.c.coordinator.log_text(),
                         r"reload: %s:1:\d+: .*keeping the running configuration"
                         % re.escape(cfg_path))
        self.assertEqual(self.code(self.tokens.by_role["trainer"]), "OK")


class Notify(secutil.SecureTestCase):
    """The daemon's notices, read from a datagram socket the test binds, as systemd does."""

    def notify_socket(self, abstract):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.addCleanup(s.close)
        if abstract:
            name = "devcoord-test-%s" % secrets.token_hex(8)
            s.bind("\0" + name)
            env = "@" + name
        else:
            env = self.c.path("notify.sock")
            s.bind(env)
        s.settimeout(20)
        return s, env

    def expect(self, s, *states):
        for state in states:
            try:
                got = s.recv(4096).decode()
            except socket.timeout:
                self.fail("no %s within 20 s" % state)
            self.assertEqual(got, state)

    def test_coordinator(self):
        self.c = self.make_secure_cluster(auth=True)
        s, env = self.notify_socket(abstract=False)
        self.c.port = harness.free_port()
        config = self.c.write_yaml("coordinator.yaml", self.c.coordinator_yaml())
        d = self.c.coordinator = Daemon("coordinator", [harness.SERVER, "--config", config],
                                        self.c.path("coordinator.log"), {"NOTIFY_SOCKET": env})
        d.start()
        self.expect(s, "READY=1")
        # Ready means serving: the first call needs no retry.
        self.assertEqual(self.c.rpc("GetClusterStatus")[0], "OK")
        d.signal(signal.SIGHUP)
        self.expect(s, "RELOADING=1", "READY=1")
        self.assertEqual(d.terminate(), 0)
        self.expect(s, "STOPPING=1")

    def test_worker_abstract_socket(self):
        self.c = self.make_secure_cluster(auth=True)
        self.c.start_coordinator()
        s, env = self.notify_socket(abstract=True)
        w = self.c.add_worker("w1", [{"device": "cuda:0", "memory": "1GiB"}], start=False)
        w.env["NOTIFY_SOCKET"] = env
        w.start()
        self.expect(s, "READY=1")
        self.c.wait_workers(["w1"])
        w.signal(signal.SIGHUP)
        self.expect(s, "RELOADING=1", "READY=1")
        self.assertEqual(w.terminate(), 0)
        self.expect(s, "STOPPING=1")


def nofile_limits(pid):
    """(soft, hard) open-files limit of a running process, from /proc."""
    with open("/proc/%d/limits" % pid) as f:
        for line in f:
            if line.startswith("Max open files"):
                soft, hard = line.split()[3:5]
                return int(soft), int(hard)
    raise AssertionError("no open files line in /proc/%d/limits" % pid)


class OpenFiles(harness.ClusterTestCase):
    """A daemon started with a low soft limit on open files (a shell's is often 1024) raises it
    to the hard limit, so connections past the soft one are still accepted, and warns when the
    hard limit is under what its own limits may need."""

    SOFT = 256

    def setUp(self):
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY or hard < 4 * self.SOFT:
            self.skipTest("the runner's hard open-files limit (%d) does not suit this test" % hard)
        self.hard = hard

    def test_coordinator_takes_more_connections_than_its_soft_limit(self):
        hard = self.hard
        c = self.make_cluster()
        c.port = harness.free_port()
        config = c.write_yaml("coordinator.yaml", c.coordinator_yaml())
        c.coordinator = Daemon("coordinator", [harness.SERVER, "--config", config],
                               c.path("coordinator.log"))
        c.coordinator.nofile = (self.SOFT, hard)
        c.coordinator.start()
        c.wait_coordinator_ready()
        self.assertEqual(nofile_limits(c.coordinator.pid), (hard, hard))
        self.assertIn("open files limit raised from %d to %d" % (self.SOFT, hard),
                      c.coordinator.log_text())
        # More connections than the soft limit it started with: all accepted, and a call
        # made after them is answered.
        held = []
        self.addCleanup(lambda: [s.close() for s in held])
        for _ in range(2 * self.SOFT):
            held.append(socket.create_connection(("127.0.0.1", c.port), timeout=5))
        self.assertEqual(harness.rpc_call(c.port, "GetClusterStatus", timeout=5.0)[0], "OK")

    def test_worker_raises_it_and_a_low_hard_limit_is_warned_about(self):
        hard = self.hard
        c = self.make_cluster()
        c.start_coordinator()
        w = c.add_worker("w1", [{"device": "cpu:0"}], start=False)
        w.nofile = (self.SOFT, hard)
        w.start()
        c.wait_workers(["w1"])
        self.assertEqual(nofile_limits(w.pid)[0], hard)
        self.assertEqual(c.terminate_worker("w1"), 0)
        # A hard limit of 600 is under the 2 x 256 data connections and room a worker keeps.
        w.nofile = (self.SOFT, 600)
        w.start()
        c.wait_workers(["w1"])
        self.assertEqual(nofile_limits(w.pid), (600, 600))
        wait_until(lambda: "open files limited to 600, under the 1536" in w.log_text(), 10,
                   "the worker's warning about its open-files limit")



class Connections(harness.ClusterTestCase):
    """Past limits.max_connections a new connection is closed as it comes, and logged and
    counted in /metrics."""

    def test_connections_past_max_connections_are_closed(self):
        http = harness.free_port()
        c = self.make_cluster(coordinator_config={"limits": {"max_connections": 3},
                                                  "http": "127.0.0.1:%d" % http})
        c.start_coordinator()
        # The readiness check's connection is counted out (asynchronously) first.
        wait_until(lambda: harness.metrics(http)["devcoord_rpc_connections"] == 0, 10,
                   "the readiness check's connection to be counted out")
        held = [harness.RpcConnection(c.port) for _ in range(3)]
        self.addCleanup(lambda: [h.close() for h in held])
        for h in held:
            self.assertEqual(h.call(harness.COORDINATOR + "GetClusterStatus")[0], "OK")
        # A fourth is closed before it carries a request (its greeting may or may not come
        # back first), and the coordinator says why.
        with self.assertRaises((harness.RpcError, OSError)):
            with harness.RpcConnection(c.port) as extra:
                extra.call(harness.COORDINATOR + "GetClusterStatus")
        wait_until(lambda: "connection refused: 3 open, the most limits.max_connections allows"
                   in c.coordinator.log_text(), 5, "the coordinator's refusal in its log")
        m = harness.metrics(http)
        self.assertEqual(m["devcoord_rpc_connections"], 3)
        self.assertEqual(m["devcoord_rpc_connections_limit"], 3)
        self.assertGreaterEqual(m["devcoord_rpc_connections_refused_total"], 1)
        # One leaves: another is taken.
        held.pop().close()

        def answered():
            try:
                return harness.rpc_call(c.port, "GetClusterStatus", timeout=1.0)[0] == "OK"
            except (harness.RpcError, OSError):
                return False
        wait_until(answered, 10, "a connection to be taken once one closed")
        # Counted out as they close.
        for h in held:
            h.close()
        wait_until(lambda: harness.metrics(http)["devcoord_rpc_connections"] == 0, 10,
                   "the connections to be counted out")


if __name__ == "__main__":
    import unittest
    unittest.main()
