"""Coordinators in high availability on etcd (issue 16): three coordinators elect a leader
through Debian's etcd (started here on free loopback ports, its own data directory), three
workers follow the leader, and the leader is killed, paused, or loses etcd for a while.

Skipped, saying so, only when /usr/bin/etcd is missing (.ci/setup-debian.sh test installs
etcd-server).
"""

import base64
import http.client
import http.server
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import unittest
import urllib.error
import urllib.request

import harness
import secutil
from harness import F, SLACK_S, Daemon, free_port, pb_bytes, pb_uint, rpc_call, tcp_addr, \
    wait_until

ETCD = os.environ.get("DEVCOORD_ETCD", "/usr/bin/etcd")
LEASE_TTL_MS = 3000
HEARTBEAT_MS = 1000


ETCD_USER = "devcoord"
ETCD_ROOT_PASSWORD = "root-pw-for-the-test"


class EtcdProxy:
    """A plain HTTP proxy in front of etcd's gateway that answers one path with HTTP 503
    while fail_path names it: etcd answering some of a coordinator's requests and not
    others."""

    def __init__(self, target_port):
        self.fail_path = None
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if proxy.fail_path is not None and self.path == proxy.fail_path:
                    status, out = 503, b'{"error": "failed by the test proxy", "code": 14}'
                else:
                    conn = http.client.HTTPConnection("127.0.0.1", target_port, timeout=5)
                    try:
                        conn.request(self.command, self.path, body,
                                     {"Content-Type": "application/json"})
                        r = conn.getresponse()
                        status, out = r.status, r.read()
                    finally:
                        conn.close()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            do_GET = do_POST

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = "http://127.0.0.1:%d" % self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


class HACluster(harness.Cluster):
    """etcd, three coordinators on it, and workers (harness.Cluster's) listing all three.

    tls: etcd serves https:// with the harness's test PKI and asks for a client certificate
    (--client-cert-auth); the coordinators trust the test CA (ca="other": an unrelated CA) and present the
    test client certificate. auth: etcd has auth enabled with a user ETCD_USER allowed on
    the prefix only; the coordinators log in with `password` (default the right one).
    proxy: the coordinators reach etcd through an EtcdProxy (self.proxy), plain http only."""

    def __init__(self, n_coordinators=3, tls=False, ca=None, auth=False, password=None,
                 proxy=False):
        super().__init__(heartbeat_ms=HEARTBEAT_MS, dead_after_ms=4 * HEARTBEAT_MS,
                         tmp_prefix="devcoord-ha-")
        self.etcd_port, self.etcd_peer = free_port(), free_port()
        self.pki = secutil.Pki(self.path("pki")) if tls else None
        client_cert = (self.pki.client, self.pki.client_key) if tls else None
        if tls and auth:
            # etcd 3.4's gateway refuses (HTTP 400 "CommonName of client sending a request
            # against gateway will be ignored ...") a client certificate with a CommonName
            # once auth is on: the coordinators present one without.
            client_cert = self.client_cert_without_cn()
        self.auth = auth
        self.etcd_password = "dc-etcd-" + os.urandom(8).hex()
        scheme = "https" if tls else "http"
        self.etcd_url = "%s://127.0.0.1:%d" % (scheme, self.etcd_port)
        args = [ETCD, "--name", "default", "--data-dir", self.path("etcd-data"),
                "--listen-client-urls", self.etcd_url,
                "--advertise-client-urls", self.etcd_url,
                "--listen-peer-urls", "http://127.0.0.1:%d" % self.etcd_peer,
                "--initial-advertise-peer-urls", "http://127.0.0.1:%d" % self.etcd_peer,
                "--initial-cluster", "default=http://127.0.0.1:%d" % self.etcd_peer,
                "--initial-cluster-state", "new"]
        if tls:
            args += ["--cert-file", self.pki.server, "--key-file", self.pki.server_key,
                     "--trusted-ca-file", self.pki.ca, "--client-cert-auth"]
        self.etcd = Daemon("etcd", args, self.path("etcd.log"))
        self.proxy = EtcdProxy(self.etcd_port) if proxy else None
        self.coord_ports = [free_port() for _ in range(n_coordinators)]
        self.coords = []
        for i, port in enumerate(self.coord_ports):
            state = {"backend": "etcd",
                     "endpoints": [self.proxy.url if proxy else self.etcd_url],
                     "prefix": "/devcoord/test", "lease_ttl_ms": LEASE_TTL_MS}
            if tls:
                state.update({"ca": self.pki.other_ca if ca == "other" else self.pki.ca,
                              "cert": client_cert[0], "key": client_cert[1]})
            if auth:
                pw = self.path("etcd-password-%d" % i)
                with open(pw, "w") as f:
                    f.write((password or self.etcd_password) + "\n")
                state.update({"username": ETCD_USER, "password_file": pw})
            cfg = {"listen": tcp_addr(port), "http": "",
                   "heartbeat": {"interval_ms": self.heartbeat_ms,
                                 "dead_after_ms": self.dead_after_ms},
                   "log": {"level": "info"}, "state": state}
            path = self.write_yaml("coordinator-%d.yaml" % i, cfg)
            self.coords.append(Daemon("coordinator-%d" % i, [harness.SERVER, "--config", path],
                                      self.path("coordinator-%d.log" % i)))

    @property
    def addr(self):  # what workers and the CLI are given: every coordinator
        return ",".join(tcp_addr(p) for p in self.coord_ports)

    def client_cert_without_cn(self):
        d = self.pki.dir
        with open(os.path.join(d, "nocn.ext"), "w") as f:
            f.write("basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n"
                    "extendedKeyUsage=clientAuth\n")
        secutil._openssl(d, "req", "-new", "-newkey", "ec", "-pkeyopt",
                         "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", "nocn.key",
                         "-out", "nocn.csr", "-subj", "/O=devcoord test client")
        secutil._openssl(d, "x509", "-req", "-in", "nocn.csr", "-CA", "ca.pem", "-CAkey",
                         "ca.key", "-CAcreateserial", "-out", "nocn.pem", "-days", "2",
                         "-extfile", "nocn.ext")
        return os.path.join(d, "nocn.pem"), os.path.join(d, "nocn.key")

    def etcd_request(self, path, body=None, token=None):
        """(HTTP status, JSON) of a request to etcd's gateway, as the test client."""
        ctx = self.pki.ssl_context(self.pki.client, self.pki.client_key) if self.pki else None
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.etcd_url + path, data=data)
        if token:
            req.add_header("Authorization", token)
        try:
            with urllib.request.urlopen(req, timeout=2, context=ctx) as r:
                return r.status, json.loads(r.read() or b"{}")
        except urllib.error.HTTPError as e:
            text = e.read()
            try:
                return e.code, json.loads(text or b"{}")
            except ValueError:
                return e.code, {"raw": text.decode("utf-8", "replace")}

    def start_etcd(self):
        self.etcd.start()

        def healthy():
            if not self.etcd.running():
                raise AssertionError("etcd exited:\n%s" % self.etcd.log_tail())
            try:
                status, body = self.etcd_request("/health")
                return status == 200 and body.get("health") == "true"
            except (OSError, ValueError):
                return False
        wait_until(healthy, 20, "etcd to be healthy")

    def enable_auth(self):
        """root (needed to enable auth) and ETCD_USER, read-write on the prefix only."""
        def b64(s):
            return base64.b64encode(s.encode()).decode()
        steps = [
            ("/v3/auth/user/add", {"name": "root", "password": ETCD_ROOT_PASSWORD}),
            ("/v3/auth/role/add", {"name": "root"}),
            ("/v3/auth/user/grant", {"user": "root", "role": "root"}),
            ("/v3/auth/user/add", {"name": ETCD_USER, "password": self.etcd_password}),
            ("/v3/auth/role/add", {"name": "devcoord"}),
            ("/v3/auth/role/grant", {"name": "devcoord", "perm": {
                "permType": "READWRITE", "key": b64("/devcoord/test"),
                "range_end": b64("/devcoord/tesu")}}),
            ("/v3/auth/user/grant", {"user": ETCD_USER, "role": "devcoord"}),
            ("/v3/auth/enable", {}),
        ]
        for path, body in steps:
            status, res = self.etcd_request(path, body)
            if status != 200:
                raise AssertionError("etcd %s: HTTP %d %s" % (path, status, res))
        # Auth is on: a request without a token is refused.
        status, res = self.etcd_request("/v3/kv/range", {"key": b64("/devcoord/test/leader")})
        if status == 200:
            raise AssertionError("etcd answered a range without a token: %s" % res)

    def start(self, wait=True):
        self.start_etcd()
        if self.auth:
            self.enable_auth()
        for c in self.coords:
            c.start()
        return self.wait_leader() if wait else None

    def answers(self, i):
        """(code, message) of ListWorkers at coordinator i; ("DOWN", why) when unreachable."""
        try:
            code, msg, _ = rpc_call(self.coord_ports[i], "ListWorkers", timeout=1.0)
            return code, msg
        except (OSError, harness.RpcError) as e:
            return "DOWN", str(e)

    def leaders(self):
        return [i for i, c in enumerate(self.coords)
                if c.running() and self.answers(i)[0] == "OK"]

    def wait_leader(self, timeout=20.0, exclude=()):
        def one():
            ls = [i for i in self.leaders() if i not in exclude]
            return ls[0] + 1 if len(ls) == 1 else None
        return wait_until(one, timeout, "one leader among the coordinators") - 1

    def leader_workers(self, i):
        code, msg, body = rpc_call(self.coord_ports[i], "ListWorkers", timeout=2.0)
        if code != "OK":
            raise harness.RpcError("%s: %s" % (code, msg))
        return {w["name"]: w for w in harness.decode_workers(body)}

    def wait_registered(self, i, names, timeout=20.0, state=None):
        def check():
            try:
                ws = self.leader_workers(i)
            except (OSError, harness.RpcError):
                return False
            return ws if all(n in ws and (state is None or ws[n]["state"] == state[n])
                             for n in names) else False
        return wait_until(check, timeout, "workers %s registered with coordinator %d"
                          % (names, i))

    def all_daemons(self):
        return list(self.workers.values()) + self.coords + [self.etcd]

    def close(self):
        if self.closed:
            return
        self.closed = True
        problems = []
        try:
            harness.stop_groups([list(self.workers.values()), self.coords, [self.etcd]],
                                problems, any_exit=[self.etcd])
        finally:
            if self.proxy is not None:
                self.proxy.close()
            for d in self.all_daemons():
                d.kill_quietly()
            self.tails = self.log_tails()
            if harness.KEEP:
                sys.stderr.write("\nkept %s\n" % self.dir)
            else:
                shutil.rmtree(self.dir, ignore_errors=True)
        if problems:
            raise AssertionError("; ".join(problems))


@unittest.skipUnless(os.path.exists(ETCD), "%s missing: install etcd-server "
                     "(.ci/setup-debian.sh test) to run the HA tests" % ETCD)
class HATest(harness.ClusterTestCase):
    def setUp(self):
        self.c = HACluster()
        self._clusters.append(self.c)
        self.addCleanup(self.c.close)
        self.leader = self.c.start()
        for n in ("w1", "w2", "w3"):
            self.c.add_worker(n, [{"device": "cpu:0"}])
        self.c.wait_registered(self.leader, ["w1", "w2", "w3"])

    def ctl(self, *args, **kw):
        return self.c.ctl(*args, **kw)

    def barrier(self, devices, timeout_ms=10000):
        return self.ctl("submit", "--op", "barrier", "--devices", ",".join(devices),
                        "--timeout-ms", str(timeout_ms))

    def test_followers_refuse_naming_the_leader(self):
        for i in range(3):
            code, msg = self.c.answers(i)
            if i == self.leader:
                self.assertEqual(code, "OK")
            else:
                self.assertEqual(code, "UNAVAILABLE", msg)
                self.assertIn("leader: %s" % tcp_addr(self.c.coord_ports[self.leader]), msg)
        # The CLI given every address finds the leader by itself, from any order.
        others = [tcp_addr(p) for i, p in enumerate(self.c.coord_ports) if i != self.leader]
        out = self.c.ctl_ok("workers", "list", server=",".join(others + [
            tcp_addr(self.c.coord_ports[self.leader])]))
        self.assertEqual(sorted(w["name"] for w in out["workers"]), ["w1", "w2", "w3"])

    def test_sigkill_leader_fails_over_with_intent_and_workers(self):
        self.c.ctl_ok("workers", "cordon", "w1")
        r = self.barrier(["w2/cpu:0", "w3/cpu:0"])
        self.assertEqual(r.rc, 0, r)
        old = self.leader
        killed = time.monotonic()
        self.c.coords[old].kill()
        new = self.c.wait_leader(timeout=30, exclude=(old,))
        self.assertNotEqual(new, old)
        ws = self.c.wait_registered(new, ["w1", "w2", "w3"], timeout=30)
        took = time.monotonic() - killed
        bound = (LEASE_TTL_MS + 2 * HEARTBEAT_MS) / 1000.0 + SLACK_S
        self.assertLessEqual(took, bound, "workers registered with the new leader %.2f s after "
                             "the kill (lease TTL + 2 heartbeats = %.1f s)" % (took, bound))
        self.assertEqual(ws["w1"]["state"], "cordoned", ws)
        self.assertEqual(ws["w2"]["state"], "alive", ws)
        # The next op runs, through the CLI given all three addresses (one dead).
        r = self.barrier(["w2/cpu:0", "w3/cpu:0"])
        self.assertEqual(r.rc, 0, r)
        # A cordoned worker is still refused by the new leader.
        r = self.barrier(["w1/cpu:0", "w2/cpu:0"])
        self.assertNotEqual(r.rc, 0, r)
        # The killed coordinator comes back as a follower of the new leader.
        self.c.coords[old].start()
        wait_until(lambda: "leader: %s" % tcp_addr(self.c.coord_ports[new])
                   in self.c.answers(old)[1], 20, "the old leader to follow the new one")

    def test_sigstop_leader_never_answers_as_leader_again(self):
        old = self.leader
        self.c.coords[old].signal(signal.SIGSTOP)
        try:
            new = self.c.wait_leader(timeout=30, exclude=(old,))
            time.sleep(0.5)
        finally:
            self.c.coords[old].signal(signal.SIGCONT)
        # From the moment it runs again, and for a few lease periods after, it only refuses.
        deadline = time.monotonic() + 3 * LEASE_TTL_MS / 1000.0
        seen = set()
        while time.monotonic() < deadline:
            code, msg = self.c.answers(old)
            self.assertNotEqual(code, "OK", "the paused leader answered as leader: %s" % msg)
            seen.add(code)
            time.sleep(0.05)
        self.assertEqual(seen, {"UNAVAILABLE"})
        self.assertIn("leader: %s" % tcp_addr(self.c.coord_ports[new]), self.c.answers(old)[1])
        self.assertIn("stepping down", self.c.coords[old].log_text())
        self.assertEqual(self.c.leaders(), [new])
        self.c.wait_registered(new, ["w1", "w2", "w3"], timeout=30)
        r = self.barrier(["w1/cpu:0", "w2/cpu:0", "w3/cpu:0"])
        self.assertEqual(r.rc, 0, r)

    def test_etcd_restart_is_ridden_out(self):
        self.c.ctl_ok("workers", "cordon", "w2")
        leader = self.leader
        self.c.etcd.kill()
        time.sleep(0.5)
        self.c.etcd.start()
        time.sleep(2 * LEASE_TTL_MS / 1000.0)
        leader = self.c.wait_leader(timeout=30)
        ws = self.c.wait_registered(leader, ["w1", "w2", "w3"], timeout=30,
                                    state={"w1": "alive", "w2": "cordoned", "w3": "alive"})
        self.assertEqual(ws["w2"]["state"], "cordoned")
        for d in self.c.coords:
            self.assertTrue(d.running(), "%s exited:\n%s" % (d.name, d.log_tail()))
        r = self.barrier(["w1/cpu:0", "w3/cpu:0"])
        self.assertEqual(r.rc, 0, r)

    def test_op_in_flight_at_leader_change_fails_unavailable_once(self):
        import opsutil
        old = self.leader
        # w3 frozen: the op's Execute there cannot answer, so the op stays in flight.
        self.c.workers["w3"].signal(signal.SIGSTOP)
        try:
            p = opsutil.ctl_popen(self.c, "submit", "--op", "barrier", "--devices",
                                  "w2/cpu:0,w3/cpu:0", "--timeout-ms", "60000")
            wait_until(lambda: self.in_flight(old), 10,
                       "the op to be in flight")
            self.c.coords[old].signal(signal.SIGSTOP)
            new = self.c.wait_leader(timeout=30, exclude=(old,))
            self.c.coords[old].signal(signal.SIGCONT)
            r = opsutil.finish(p, timeout=30)
        finally:
            self.c.workers["w3"].signal(signal.SIGCONT)
            self.c.coords[old].signal(signal.SIGCONT)
        self.assertNotEqual(r.rc, 0, r)
        self.assertIn("UNAVAILABLE", r.err + str(r.out), r)
        self.assertIn("leadership", r.err + str(r.out), r)
        # Never run again by the new leader: it has no op in its history.
        self.c.wait_registered(new, ["w1", "w2", "w3"], timeout=30)
        ops = self.c.ctl_ok("ops", "list")
        self.assertEqual(ops.get("ops", []), [], ops)
        # The worker that saw the new term refuses the old one's orders (fencing).
        r = self.barrier(["w2/cpu:0", "w3/cpu:0"])
        self.assertEqual(r.rc, 0, r)
        old_term = int(self.term_named(old))
        port = int(self.c.worker_specs["w2"]["listen"].rsplit(":", 1)[1])
        body = (pb_bytes(F("ExecuteRequest", "op_id"), b"op-fenced")
                + pb_uint(F("ExecuteRequest", "term"), old_term))
        code, msg, _ = rpc_call(port, "/devcoord.v1.Worker/Execute", body)
        self.assertEqual(code, "FAILED_PRECONDITION", msg)
        self.assertIn("order from an older coordinator term %d <" % old_term, msg)

    def test_a_leader_whose_lease_went_stale_starts_and_commits_nothing(self):
        """etcd out of reach: the leader's lease goes stale by its own clock (another
        coordinator may lead by now), and no RPC is admitted. An op it prepared meanwhile
        is not committed, and one queued behind it does not start: both fail UNAVAILABLE
        and every tensor stays as it was (before, both ran to OK)."""
        import opsutil
        devices = "w2/cpu:0,w3/cpu:0"
        for d in ("w2/cpu:0", "w3/cpu:0"):
            self.c.ctl_ok("tensor", "put", d, "t", "--dtype", "f32", "--values", "1,2")
        self.c.workers["w3"].signal(signal.SIGSTOP)
        try:
            runs = []
            for _ in range(2):  # the second waits for the first: same devices
                runs.append(opsutil.ctl_popen(self.c, "submit", "--op", "all-reduce",
                                              "--reduce", "sum", "--tensor", "t",
                                              "--devices", devices, "--timeout-ms", "60000"))
                wait_until(lambda: self.in_flight(self.leader), 10, "the op to be in flight")
            time.sleep(0.5)  # the second is queued too
            self.c.etcd.kill()
            # Stale once two thirds of the TTL pass without a renewal; then w3 answers.
            time.sleep(LEASE_TTL_MS / 1000.0)
        finally:
            self.c.workers["w3"].signal(signal.SIGCONT)
        results = [opsutil.finish(p, timeout=60) for p in runs]
        for r in results:
            self.assertNotEqual(r.rc, 0, r)
            self.assertIn("UNAVAILABLE", r.err + str(r.out), r)
        self.assertIn("nothing was committed", str(results[0].out), results[0])
        self.assertIn("no longer leads", str(results[1].out), results[1])
        self.c.etcd.start()
        leader = self.c.wait_leader(timeout=30)
        self.c.wait_registered(leader, ["w1", "w2", "w3"], timeout=30)
        for d in ("w2/cpu:0", "w3/cpu:0"):
            self.assertEqual(self.c.ctl_ok("tensor", "get", d, "t")["values"], [1, 2], d)

    def test_an_etcd_outage_the_lease_survives_declares_no_worker_dead(self):
        """etcd down longer than heartbeat.dead_after_ms, then back with the lease (etcd
        extends leases when it elects itself): the same leader serves again in the same
        term, and the workers whose heartbeats it refused meanwhile are not judged on that
        silence (before, the first sweep declared every one of them dead)."""
        leader = self.leader
        epochs = {n: w["epoch"] for n, w in self.c.leader_workers(leader).items()}
        self.c.etcd.kill()
        time.sleep(4 * HEARTBEAT_MS / 1000.0 + 1.0)
        self.c.etcd.start()
        self.assertEqual(self.c.wait_leader(timeout=30), leader)
        time.sleep(2 * HEARTBEAT_MS / 1000.0)  # what a sweep would have done, it has done
        ws = self.c.leader_workers(leader)
        self.assertEqual({n: w["epoch"] for n, w in ws.items()}, epochs, ws)
        self.assertEqual({n: w["state"] for n, w in ws.items()},
                         {n: "alive" for n in epochs}, ws)
        # (A dead worker that heartbeats again is alive again: the log says what happened.)
        self.assertNotIn("is dead (no heartbeat)", self.c.coords[leader].log_text())

    def in_flight(self, i):
        code, _, body = rpc_call(self.c.coord_ports[i], "GetClusterStatus", timeout=1.0)
        return code == "OK" and harness._one(harness.pb_decode(body), F(
            "GetClusterStatusResponse", "ops_in_flight"), 0) > 0

    def term_named(self, i):
        """The term coordinator i led in, from its log."""
        import re
        terms = re.findall(r"leading as \S+ \(term (\d+)\)", self.c.coords[i].log_text())
        self.assertTrue(terms, "coordinator %d never led" % i)
        return terms[-1]


@unittest.skipUnless(os.path.exists(ETCD), "%s missing: install etcd-server "
                     "(.ci/setup-debian.sh test) to run the HA tests" % ETCD)
class HALeaderKeyTest(harness.ClusterTestCase):
    def test_a_leader_that_cannot_read_its_key_back_stops_serving(self):
        """etcd renews the leader's lease but fails every txn (the proxy answers 503): the
        leader cannot see whether its leader key is still its own, and stops serving once
        its last confirmation is two thirds of the TTL old (before, each renewal alone kept
        it serving, also after another coordinator had deleted the key and made it again).
        When the txns come back, it follows whoever holds the key now."""
        c = HACluster(n_coordinators=1, proxy=True)
        self._clusters.append(c)
        self.addCleanup(c.close)
        self.assertEqual(c.start(), 0)
        c.proxy.fail_path = "/v3/kv/txn"
        code, msg = wait_until(lambda: (lambda a: a if a[0] != "OK" else None)(c.answers(0)),
                               LEASE_TTL_MS / 1000.0 * 3, "the leader to stop serving")
        self.assertEqual(code, "UNAVAILABLE", msg)
        self.assertIn("is not confirmed", msg)
        self.assertIn("cannot read the leader key back from etcd", c.coords[0].log_text())

        # Meanwhile another coordinator's key replaced it, with a lease of its own.
        def b64(text):
            return base64.b64encode(text.encode()).decode()
        key = b64("/devcoord/test/leader")
        status, granted = c.etcd_request("/v3/lease/grant", {"TTL": 60})
        self.assertEqual(status, 200, granted)
        self.assertEqual(c.etcd_request("/v3/kv/deleterange", {"key": key})[0], 200)
        status, res = c.etcd_request("/v3/kv/put", {"key": key, "value": b64("tcp://10.9.9.9:1"),
                                                    "lease": granted["ID"]})
        self.assertEqual(status, 200, res)
        c.proxy.fail_path = None
        code, msg = wait_until(
            lambda: (lambda a: a if "tcp://10.9.9.9:1" in a[1] else None)(c.answers(0)),
            LEASE_TTL_MS / 1000.0 * 3, "the old leader to follow the new key's holder")
        self.assertEqual(code, "UNAVAILABLE", msg)
        self.assertIn("the leader key is read back from etcd again", c.coords[0].log_text())

    def test_unreadable_intent_is_kept_aside_before_a_change_replaces_it(self):
        """PREFIX/intent that does not parse: the leader leads without it, as before, but
        first keeps it under PREFIX/intent.unreadable, which the next change (a cordon
        here) leaves as it was (before, that change overwrote it and it was gone)."""
        c = HACluster(n_coordinators=1)
        self._clusters.append(c)
        self.addCleanup(c.close)

        def b64(text):
            return base64.b64encode(text.encode()).decode()

        def value(key):
            status, res = c.etcd_request("/v3/kv/range", {"key": b64(key)})
            self.assertEqual(status, 200, res)
            kvs = res.get("kvs", [])
            return base64.b64decode(kvs[0].get("value", "")).decode() if kvs else None
        c.start_etcd()
        garbage = "devcoord-intent 1\ncordon w9\n"  # cut: no end line
        self.assertEqual(c.etcd_request("/v3/kv/put", {"key": b64("/devcoord/test/intent"),
                                                       "value": b64(garbage)})[0], 200)
        c.coords[0].start()
        self.assertEqual(c.wait_leader(), 0)
        self.assertIn("kept as /devcoord/test/intent.unreadable", c.coords[0].log_text())
        self.assertEqual(value("/devcoord/test/intent.unreadable"), garbage)
        c.add_worker("w1", [{"device": "cpu:0"}])
        c.wait_registered(0, ["w1"])
        c.ctl_ok("workers", "cordon", "w1")
        self.assertIn("cordon w1", value("/devcoord/test/intent"))
        self.assertEqual(value("/devcoord/test/intent.unreadable"), garbage)


@unittest.skipUnless(os.path.exists(ETCD), "%s missing: install etcd-server "
                     "(.ci/setup-debian.sh test) to run the HA tests" % ETCD)
class HASecureEtcdTest(harness.ClusterTestCase):
    """TLS with a client certificate and username/password to etcd (state.ca, cert, key,
    username, password_file): the coordinators elect a leader through it, and a wrong CA or
    a wrong password is refused with a log line naming etcd, without leading."""

    def cluster(self, **kw):
        c = HACluster(**kw)
        self._clusters.append(c)
        self.addCleanup(c.close)
        return c

    def elect_and_run(self, c):
        leader = c.start()
        for n in ("w1", "w2"):
            c.add_worker(n, [{"device": "cpu:0"}])
        c.wait_registered(leader, ["w1", "w2"])
        r = c.ctl("submit", "--op", "barrier", "--devices", "w1/cpu:0,w2/cpu:0",
                  "--timeout-ms", "10000")
        self.assertEqual(r.rc, 0, r)
        want = "leader: %s" % tcp_addr(c.coord_ports[leader])
        for i in range(len(c.coords)):
            if i != leader:
                # A follower whose first lease came late may still be campaigning ("no
                # leader elected yet"): it names the leader once it has read who leads.
                wait_until(lambda: want in c.answers(i)[1], 20,
                           "coordinator %d to name the leader" % i)
                code, msg = c.answers(i)
                self.assertEqual(code, "UNAVAILABLE", msg)
                self.assertIn(want, msg)
        return leader

    def never_leads(self, c, expect_log):
        c.start(wait=False)
        wait_until(lambda: expect_log in c.coords[0].log_text(), 20,
                   "the coordinator to log %r" % expect_log)
        # Refused for several lease periods: never leads, keeps running.
        deadline = time.monotonic() + LEASE_TTL_MS / 1000.0
        while time.monotonic() < deadline:
            code, msg = c.answers(0)
            self.assertEqual(code, "UNAVAILABLE", msg)
            time.sleep(0.1)
        self.assertTrue(c.coords[0].running(), c.coords[0].log_tail())
        self.assertNotIn("leading as", c.coords[0].log_text())
        # Logged once per cause, not every tick.
        self.assertEqual(c.coords[0].log_text().count(expect_log), 1,
                         c.coords[0].log_tail())
        return c.coords[0].log_text()

    def test_https_with_client_certificate_elects_a_leader(self):
        c = self.cluster(tls=True)
        self.assertTrue(c.etcd_url.startswith("https://"))
        self.elect_and_run(c)
        # etcd really asks for the client certificate: without one, no answer.
        ctx = c.pki.ssl_context()
        with self.assertRaises(OSError):
            urllib.request.urlopen(c.etcd_url + "/health", timeout=2, context=ctx).read()

    def test_https_wrong_ca_is_refused_naming_etcd(self):
        c = self.cluster(n_coordinators=1, tls=True, ca="other")
        log = self.never_leads(c, "cannot campaign for leadership, no lease from etcd: etcd "
                               + c.etcd_url)
        self.assertIn("TLS to etcd refused: check state.ca", log)

    def test_username_password_elects_a_leader_and_reauthenticates(self):
        c = self.cluster(auth=True)
        leader = self.elect_and_run(c)
        log = c.coords[leader].log_text()
        self.assertNotIn(c.etcd_password, log)
        # etcd's simple tokens live in its memory: after a restart every token is refused
        # (401 invalid auth token) and the coordinators authenticate again by themselves.
        # Once in CI and 1 in 13 runs here the leader was never refused: its token was good
        # after the restart. Likely (not verified) etcd replayed the authentication from its
        # log, its applied index not yet committed to its backend (batched, 100 ms) at the
        # kill; a second first lets that settle.
        time.sleep(1.0)
        c.etcd.kill()
        time.sleep(0.5)
        c.etcd.start()
        time.sleep(2 * LEASE_TTL_MS / 1000.0)
        leader = c.wait_leader(timeout=30)
        c.wait_registered(leader, ["w1", "w2"], timeout=30)
        # The lease outlives the restart (keepalive needs no token); a cordon is a write to
        # etcd under the new token.
        c.ctl_ok("workers", "cordon", "w1")
        c.wait_registered(leader, ["w1", "w2"], state={"w1": "cordoned", "w2": "alive"})
        c.ctl_ok("workers", "uncordon", "w1")
        c.wait_registered(leader, ["w1", "w2"], state={"w1": "alive", "w2": "alive"})
        r = c.ctl("submit", "--op", "barrier", "--devices", "w1/cpu:0,w2/cpu:0",
                  "--timeout-ms", "10000")
        self.assertEqual(r.rc, 0, r)
        self.assertIn("etcd refused the auth token", c.coords[leader].log_text())
        self.assertIn("invalid auth token", c.coords[leader].log_text())
        for d in c.coords:
            self.assertNotIn(c.etcd_password, d.log_text())

    def test_https_client_certificate_and_password_together(self):
        c = self.cluster(tls=True, auth=True)
        self.elect_and_run(c)

    def test_wrong_password_is_refused_naming_etcd(self):
        c = self.cluster(n_coordinators=1, auth=True, password="not-the-password")
        log = self.never_leads(c, "etcd authentication as %s failed" % ETCD_USER)
        self.assertIn("cannot campaign", log)
        # etcd's own reason, read from its answer.
        self.assertIn("authentication failed, invalid user ID or password", log)
        self.assertNotIn("not-the-password", log)


if __name__ == "__main__":
    unittest.main()
