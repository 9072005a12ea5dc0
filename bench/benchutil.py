"""What the Python benches share: the integration tests' harness pointed at a build, and a
cluster of real daemons whose workers serve /metrics."""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def use_build(build):
    """Points the harness (its daemons) and the Python binding (its libdevcoord) at build;
    returns the harness module."""
    build = os.path.abspath(build)
    os.environ["DEVCOORD_BUILD_DIR"] = build
    os.environ.setdefault("DEVCOORD_LIB", os.path.join(build, "client", "libdevcoord.so"))
    sys.path.insert(0, os.path.join(REPO, "tests", "integration"))
    sys.path.insert(0, os.path.join(REPO, "bindings", "python"))
    import harness  # noqa: E402  (reads DEVCOORD_BUILD_DIR)
    return harness


def start_cluster(harness, names, devices, prefix, tls=False):
    """A coordinator and workers `names`, each with `devices` (["cuda:0", ...], 8 GiB each)
    and /metrics on a port of its own: (cluster, {name: port}). Close the cluster after.
    tls: every listener and dialer on tls+tcp:// (the integration tests' certificates; a
    client needs tls_ca=cluster.pki.ca)."""
    if tls:
        import secutil  # beside harness, in tests/integration
        c = secutil.SecureCluster(tls=True, heartbeat_ms=1000, dead_after_ms=10000,
                                  tmp_prefix=prefix)
    else:
        c = harness.Cluster(heartbeat_ms=1000, dead_after_ms=10000, tmp_prefix=prefix)
    http = {}
    try:
        c.start_coordinator()
        for n in names:
            http[n] = harness.free_port()
            c.add_worker(n, [{"device": d, "memory": "8GiB"} for d in devices],
                         extra={"http": "127.0.0.1:%d" % http[n]})
        c.wait_workers(list(names))
    except BaseException:
        c.close()
        raise
    return c, http


def call_bytes(harness, http):
    """The bytes the ranks' group calls carried to the workers (0: all on shared memory)."""
    return sum(harness.metrics(port)["devcoord_group_call_bytes_received_total"]
               for port in http.values())
