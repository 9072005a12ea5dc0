"""Helpers of the security, fault and load tests: throwaway certificates, tokens files, and a
Cluster that runs with auth and TLS (and, for the valgrind run, a command in front of each
daemon).

harness.Cluster checks readiness and registration with a raw RPC client that sends no token
over plain TCP. SecureCluster keeps that fixture and only swaps the pieces that have to speak
TLS or carry a token: the raw client (TokenRpcConnection), the readiness and registry checks,
the addresses it writes into the configs, and the devcoordctl options it passes by default.
"""

import http.client
import os
import random
import secrets
import shutil
import socket
import ssl
import subprocess
import time

import harness
from harness import (COORDINATOR, HOST, Cluster, Daemon, RpcConnection, RpcError, _one,
                     decode_workers, frame, pb_bytes, pb_decode, pb_uint, wait_until)

ROLES = ("worker", "trainer", "operator")


# ---- certificates -----------------------------------------------------------------------


def _openssl(cwd, *args):
    p = subprocess.run(["openssl"] + list(args), cwd=cwd, capture_output=True,
                       stdin=subprocess.DEVNULL, timeout=60)
    if p.returncode != 0:
        raise AssertionError("openssl %s failed:\n%s" % (" ".join(args),
                                                         p.stderr.decode("utf-8", "replace")))


class Pki:
    """A CA, a certificate for 127.0.0.1 that both daemons use as server and as client
    certificate, a client certificate for devcoordctl, and an unrelated second CA with a
    client certificate of its own. All PEM files in `directory`.

    mbedTLS 2.28 (nng's TLS on bookworm) does not match IP subjectAltNames, so the
    certificate for 127.0.0.1 carries DNS:127.0.0.1 (and CN=127.0.0.1) as well."""

    def __init__(self, directory):
        self.dir = directory
        os.makedirs(directory, exist_ok=True)
        self.ca, self.ca_key = self._ca("ca", "devcoord test CA")
        self.server, self.server_key = self._leaf(
            "server", "127.0.0.1", "ca", "subjectAltName=DNS:127.0.0.1,IP:127.0.0.1\n"
            "extendedKeyUsage=serverAuth,clientAuth\n")
        self.client, self.client_key = self._leaf(
            "client", "devcoord-test-client", "ca", "extendedKeyUsage=clientAuth\n")
        self.other_ca, self.other_ca_key = self._ca("other-ca", "unrelated CA")
        self.other_client, self.other_client_key = self._leaf(
            "other-client", "devcoord-stranger", "other-ca", "extendedKeyUsage=clientAuth\n")

    def path(self, name):
        return os.path.join(self.dir, name)

    def _ca(self, name, cn):
        _openssl(self.dir, "req", "-x509", "-newkey", "ec", "-pkeyopt",
                 "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", name + ".key", "-out",
                 name + ".pem", "-days", "2", "-subj", "/CN=" + cn, "-addext",
                 "basicConstraints=critical,CA:TRUE", "-addext",
                 "keyUsage=critical,keyCertSign,cRLSign")
        return self.path(name + ".pem"), self.path(name + ".key")

    def _leaf(self, name, cn, ca, extensions):
        with open(self.path(name + ".ext"), "w") as f:
            f.write("basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n" + extensions)
        _openssl(self.dir, "req", "-new", "-newkey", "ec", "-pkeyopt",
                 "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", name + ".key", "-out",
                 name + ".csr", "-subj", "/CN=" + cn)
        _openssl(self.dir, "x509", "-req", "-in", name + ".csr", "-CA", ca + ".pem", "-CAkey",
                 ca + ".key", "-CAcreateserial", "-out", name + ".pem", "-days", "2",
                 "-extfile", name + ".ext")
        return self.path(name + ".pem"), self.path(name + ".key")

    def daemon_tls(self, require_client_cert=False):
        """The `tls:` mapping of a daemon's config."""
        return {"cert": self.server, "key": self.server_key, "ca": self.ca,
                "require_client_cert": require_client_cert}

    def ssl_context(self, cert=None, key=None, ca=None):
        """A Python TLS client context trusting `ca` (default: the test CA)."""
        ctx = ssl.create_default_context(cafile=ca or self.ca)
        ctx.check_hostname = False  # the certificate names 127.0.0.1 by DNS, see above
        if cert:
            ctx.load_cert_chain(cert, key)
        return ctx


# ---- tokens -----------------------------------------------------------------------------


class Tokens:
    """Random tokens, one per role (plus extra worker tokens), in a tokens file, and a token
    file (first line the token) for each.

    worker_names: None writes the `token: role` form, where a worker token may register any
    worker. Otherwise the list form, with the names each worker token may register: one
    list (or None: any name) per worker token, the role's first, then the extra ones."""

    def __init__(self, directory, extra_workers=0, worker_names=None):
        self.dir = directory
        self.by_role = {role: "dc-%s-%s" % (role, secrets.token_hex(16)) for role in ROLES}
        self.extra_workers = ["dc-worker%d-%s" % (i, secrets.token_hex(16))
                              for i in range(extra_workers)]
        # A token that no tokens file knows, shaped like the real ones.
        self.unknown = "dc-trainer-%s" % secrets.token_hex(16)
        if worker_names is None:
            text = "".join("%s: %s\n" % (t, r) for t, r in self.pairs())
        else:
            names = dict(zip([self.by_role["worker"]] + self.extra_workers, worker_names))
            text = ""
            for t, r in self.pairs():
                text += "- {token: %s, role: %s" % (t, r)
                if names.get(t) is not None:
                    text += ", names: [%s]" % ", ".join(names[t])
                text += "}\n"
        self.tokens_file = self._write("tokens.yaml", text)
        self.files = {}
        for role, token in self.by_role.items():
            self.files[role] = self._write("%s.token" % role, token + "\n")
        self.files["unknown"] = self._write("unknown.token", self.unknown + "\n")

    def pairs(self):
        """(token, role) in file order: the coordinator's worker token comes first."""
        out = [(self.by_role["worker"], "worker")]
        out += [(t, "worker") for t in self.extra_workers]
        out += [(self.by_role["trainer"], "trainer"), (self.by_role["operator"], "operator")]
        return out

    def all(self):
        return [t for t, _ in self.pairs()] + [self.unknown]

    def _write(self, name, text):
        p = os.path.join(self.dir, name)
        with open(p, "w") as f:
            f.write(text)
        os.chmod(p, 0o600)
        return p

    def file_for(self, token, name):
        return self._write(name, token + "\n")


# ---- the raw client, with a token and over TLS -------------------------------------------


class TokenRpcConnection(RpcConnection):
    """harness.RpcConnection that sends a bearer token and, given an ssl context, speaks
    tls+tcp:// (TLS around the same SP stream)."""

    def __init__(self, port, token=None, ssl_context=None, timeout=5.0):
        self.token = token
        raw = socket.create_connection((HOST, port), timeout=timeout)
        try:
            self.sock = ssl_context.wrap_socket(raw) if ssl_context else raw
        except Exception:
            raw.close()
            raise
        self.sock.settimeout(timeout)
        self.sock.sendall(harness.sp_greeting(harness.SP_REQ0))
        peer = self.recv_exact(8)
        if peer != harness.sp_greeting(harness.SP_REP0):
            self.close()
            raise RpcError("unexpected SP greeting %r" % peer)

    def call(self, method, body=b"", timeout_ms=5000, token=None):
        rid = random.randrange(1, 1 << 31)
        header = pb_uint(1, rid) + pb_bytes(2, method) + pb_uint(3, timeout_ms)
        header += pb_bytes(4, token if token is not None else (self.token or ""))
        return self.call_raw(frame(header, body), rid)


# ---- a cluster with auth, TLS and a command prefix ----------------------------------------


class SecureCluster(Cluster):
    """harness.Cluster with optional tokens (auth on at the coordinator, and at the workers
    when worker_auth; worker_names as in Tokens), optional TLS on every listener and dialer,
    and an optional command (valgrind) in front of every daemon: prefix is a list, or a
    function of the daemon's name returning one.

    The fixture's own calls (readiness, registry) and ctl() use the operator token and the
    test CA by default; ctl(..., auth=None, tls=False) runs devcoordctl bare."""

    def __init__(self, auth=False, tls=False, worker_auth=True, require_client_cert=False,
                 prefix=None, extra_worker_tokens=1, worker_names=None, **kw):
        super().__init__(**kw)
        try:
            self.tokens = Tokens(self.dir, extra_worker_tokens, worker_names) if auth else None
            self.pki = Pki(os.path.join(self.dir, "pki")) if tls else None
        except BaseException:
            shutil.rmtree(self.dir, ignore_errors=True)
            raise
        self.worker_auth = worker_auth
        self.require_client_cert = require_client_cert
        self.prefix = prefix if callable(prefix) else (lambda name, p=list(prefix or []): p)

    # -- addresses and configs

    @property
    def scheme(self):
        return "tls+tcp" if self.pki else "tcp"

    def url(self, port):
        return "%s://%s:%d" % (self.scheme, HOST, port)

    @property
    def addr(self):
        return self.url(self.port)

    def coordinator_yaml(self):
        cfg = super().coordinator_yaml()
        if self.tokens:
            cfg["auth"] = {"tokens_file": self.tokens.tokens_file}
        if self.pki:
            cfg["tls"] = self.pki.daemon_tls(self.require_client_cert)
        return cfg

    def start_coordinator(self, timeout=20.0, port=None, wait=True):
        """As Cluster.start_coordinator, with the prefix in front of the server; on `port`
        when given (a port the workers were told before it was up), and without waiting for
        it to be ready when not `wait`."""
        for _ in range(1 if port else 3):
            self.port = port or harness.free_port()
            config = self.write_yaml("coordinator.yaml", self.coordinator_yaml())
            self.coordinator = Daemon("coordinator",
                                      self.prefix("coordinator")
                                      + [harness.SERVER, "--config", config],
                                      self.path("coordinator.log")).start()
            if not wait:
                return self.coordinator
            try:
                return self.wait_coordinator_ready(timeout)
            except AssertionError:
                if port or self.coordinator.running() \
                        or "in use" not in self.coordinator.log_text():
                    raise
        raise AssertionError("could not find a free port for the coordinator")

    def add_worker(self, name, devices, labels=None, collectives=None, start=True, extra=None,
                   token=None, http_port=None):
        """As Cluster.add_worker; the worker presents `token` (default: the worker role's),
        checks callers against the tokens file when worker_auth, and uses TLS when the
        cluster does. http_port: serve /readyz there."""
        port = harness.free_port()
        cfg = {"listen": self.url(port), "advertise": self.url(port)}
        if self.tokens:
            tok = token if token is not None else self.tokens.by_role["worker"]
            cfg["token_file"] = self.tokens.file_for(tok, "worker-%s.token" % name)
            if self.worker_auth:
                cfg["auth"] = {"tokens_file": self.tokens.tokens_file}
        if self.pki:
            cfg["tls"] = self.pki.daemon_tls(self.require_client_cert)
        if http_port:
            cfg["http"] = "%s:%d" % (HOST, http_port)
        cfg.update(extra or {})
        w = super().add_worker(name, devices, labels=labels, collectives=collectives,
                               start=False, extra=cfg)
        w.argv = self.prefix(name) + w.argv
        if start:
            w.start()
        return w

    def worker_port(self, name):
        return int(self.worker_specs[name]["listen"].rsplit(":", 1)[1])

    # -- the fixture's own calls

    def connect(self, port=None, token=None, timeout=5.0, client_cert=True):
        ctx = None
        if self.pki:
            if client_cert and self.require_client_cert:
                ctx = self.pki.ssl_context(self.pki.client, self.pki.client_key)
            else:
                ctx = self.pki.ssl_context()
        if token is None and self.tokens:
            token = self.tokens.by_role["operator"]
        return TokenRpcConnection(port or self.port, token, ctx, timeout)

    def rpc(self, method, body=b"", port=None, token=None, timeout=5.0, service=COORDINATOR):
        with self.connect(port, token, timeout) as c:
            return c.call(method if method.startswith("/") else service + method, body,
                          int(timeout * 1000))

    def wait_coordinator_ready(self, timeout=20.0):
        def ready():
            if not self.coordinator.running():
                raise AssertionError("coordinator exited with %s:\n%s" % (
                    self.coordinator.poll(), self.coordinator.log_tail()))
            try:
                code, _, body = self.rpc("GetClusterStatus", timeout=2.0)
            except (OSError, RpcError, ssl.SSLError):
                return False
            return code == "OK" and _one(pb_decode(body), 9, 0) == 1
        wait_until(ready, timeout, "the coordinator to be ready on %s" % self.addr, 0.05)
        return self.coordinator

    def registry_workers(self, timeout=5.0):
        code, msg, body = self.rpc("ListWorkers", timeout=timeout)
        if code != "OK":
            raise RpcError("ListWorkers: %s: %s" % (code, msg))
        return {w["name"]: w for w in decode_workers(body)}

    def wait_workers(self, names=None, state="alive", timeout=20.0):
        try:
            return super().wait_workers(names, state, timeout)
        except ssl.SSLError as e:
            raise AssertionError("TLS error talking to the coordinator: %s" % e)

    # -- devcoordctl

    def ctl(self, *args, auth="operator", tls=True, **kw):
        """devcoordctl with the `auth` role's token file (None: no token; a path: that
        file) and, when the cluster uses TLS and tls is True, the test CA (and the client
        certificate when the servers require one)."""
        pre = []
        if self.tokens and auth:
            pre += ["--token-file", self.tokens.files.get(auth, auth)]
        if self.pki and tls:
            pre += ["--tls-ca", self.pki.ca]
            if self.require_client_cert:
                pre += ["--tls-cert", self.pki.client, "--tls-key", self.pki.client_key]
        return self.run_ctl(pre + list(args), **kw)

    def run_ctl(self, args, **kw):
        """harness.Cluster.ctl without the caller's $DEVCOORD_TOKEN, $DEVCOORD_TLS_CA and
        $DEVCOORD_ADDR (kw: output, server, timeout, env, which adds variables back)."""
        return Cluster.ctl(self, *args,
                           unset=("DEVCOORD_ADDR", "DEVCOORD_TOKEN", "DEVCOORD_TLS_CA"), **kw)


# ---- HTTP and /proc -----------------------------------------------------------------------


def http_get(port, path, timeout=5.0):
    """(status, body text) of GET http://127.0.0.1:port/path."""
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        return r.status, r.read().decode("utf-8", "replace")
    finally:
        conn.close()


def http_status(port, path):
    try:
        return http_get(port, path, 2.0)[0]
    except OSError:
        return None


def vm_rss_kib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS for pid %d" % pid)


def settle_rss(pid, seconds=3.0, interval=0.25):
    """The smallest VmRSS seen over `seconds` (freed memory goes back to the OS a little
    after the load ends, through glibc's trim of the heap and the exit of nng's idle
    threads' stacks)."""
    best = vm_rss_kib(pid)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(interval)
        best = min(best, vm_rss_kib(pid))
    return best


class SecureTestCase(harness.ClusterTestCase):
    """ClusterTestCase whose make_secure_cluster gives a SecureCluster (closed and its logs
    shown on failure like the harness's own)."""

    def make_secure_cluster(self, **kw):
        kw.setdefault("heartbeat_ms", self.heartbeat_ms)
        kw.setdefault("dead_after_ms", self.dead_after_ms)
        c = SecureCluster(**kw)
        self._clusters.append(c)
        self.addCleanup(c.close)
        return c
