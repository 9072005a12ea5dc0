"""Helpers of the operations tests (test_ops.py): test values, the expected result of each
collective computed in Python, and devcoordctl runs in parallel or in the background.

Expected values follow design §5 and issue 4: integer sum and prod wrap (two's complement),
mean divides by the number of devices (integers truncate toward zero), min and max are
exact. Float results are compared with a bound on the rounding error of any summation
order, since the ring and the local reduce add in an order the test does not fix:
|got - exact| <= 2 * N * u * sum(|x_i|) for a sum of N terms (u = 2^-24 for f32, 2^-53 for
f64, 2^-11 for f16, 2^-8 for bf16: every combination rounds to the dtype once), the same
bound over N plus one rounding for mean, and 2 * (N + 1) * u * |exact| for a product. Everything else (integers, min, max, broadcast, all-gather) must match exactly.
"""

import array
import json
import math
import os
import random
import struct
import subprocess
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction

import harness

DTYPES = ("f32", "f64", "i32", "i64", "f16", "bf16")
REDUCE_OPS = ("sum", "mean", "min", "max", "prod")
KINDS = ("all-reduce", "reduce", "broadcast", "all-gather", "barrier")

_BITS = {"i32": 32, "i64": 64}
_UNIT_ROUNDOFF = {"f32": 2.0 ** -24, "f64": 2.0 ** -53, "f16": 2.0 ** -11, "bf16": 2.0 ** -8}
_TYPECODE = {"f32": "f", "f64": "d", "i32": "i", "i64": "q"}  # native byte order (--file)


def is_float(dtype):
    return dtype in _UNIT_ROUNDOFF


def round_f32(x):
    return array.array("f", [x])[0]


def round_bf16(x):
    """x rounded to bfloat16 (nearest, ties to even), through its f32 bits."""
    (bits,) = struct.unpack("<I", struct.pack("<f", x))
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def round_to(dtype, x):
    """x as the float dtype stores it (f64: unchanged)."""
    if dtype == "f32":
        return round_f32(x)
    if dtype == "f16":
        return struct.unpack("<e", struct.pack("<e", x))[0]
    if dtype == "bf16":
        return round_bf16(round_f32(x))
    return x


def wrap(v, dtype):
    bits = _BITS[dtype]
    v &= (1 << bits) - 1
    return v - (1 << bits) if v >> (bits - 1) else v


def int_range(dtype):
    bits = _BITS[dtype]
    return -(1 << (bits - 1)), (1 << (bits - 1)) - 1


def gen_values(rng, dtype, n, reduce_op=None, ranks=6):
    """n test values of dtype for a reduction with reduce_op over `ranks` devices.

    Integers span the whole range (so sum and prod wrap), with the extremes, -1, 0 and 1
    mixed in; for mean they stay small enough that the sum of `ranks` of them cannot
    overflow (the design does not say what mean of an overflowing sum is). Floats have a
    full mantissa (f32 ones rounded to f32); for prod they lie in +-[0.5, 2] so a product of
    a few stays far from overflow and underflow."""
    out = []
    if is_float(dtype):
        for _ in range(n):
            if reduce_op == "prod":
                v = rng.choice((-1.0, 1.0)) * rng.uniform(0.5, 2.0)
            elif rng.random() < 0.1:
                v = float(rng.randint(-8, 8))
            else:
                v = rng.uniform(-1e6, 1e6) if dtype == "f64" else rng.uniform(-1000.0, 1000.0)
            out.append(round_to(dtype, v))
        return out
    lo, hi = int_range(dtype)
    if reduce_op == "mean":
        bound = (hi // ranks) // 2
        return [rng.randint(-bound, bound) for _ in range(n)]
    specials = (lo, hi, -1, 0, 1) if reduce_op != "prod" else (lo, hi, -1, 1)
    for _ in range(n):
        if rng.random() < 0.1:
            out.append(rng.choice(specials))
        else:
            v = rng.randint(lo, hi)
            out.append(v if v != 0 or reduce_op != "prod" else 3)
    return out


def values_arg(dtype, values):
    """The --values text: shortest round-tripping decimals (f32 values are exactly f32)."""
    if is_float(dtype):
        return ",".join(repr(float(v)) for v in values)
    return ",".join(str(int(v)) for v in values)


def raw_bytes(dtype, values):
    """The --file content: raw values in this machine's byte order."""
    if dtype == "f16":
        return struct.pack("=%de" % len(values), *values)
    if dtype == "bf16":  # the high half of each (exactly bf16) f32
        f32 = struct.pack("<%df" % len(values), *values)
        return b"".join(f32[i + 2:i + 4] for i in range(0, len(f32), 4))
    return array.array(_TYPECODE[dtype], values).tobytes()


class Tensor:
    """An expected tensor: dtype, shape, values and a per-value tolerance (0 = exact)."""

    def __init__(self, dtype, shape, values, tols=None):
        self.dtype = dtype
        self.shape = list(shape)
        self.values = list(values)
        self.tols = list(tols) if tols is not None else [0.0] * len(self.values)

    def copy(self):
        return Tensor(self.dtype, self.shape, self.values, self.tols)


def reduce_column(dtype, op, xs):
    """(expected value, tolerance) of reducing xs (one value per rank) with op."""
    n = len(xs)
    if op == "min":
        return min(xs), 0.0
    if op == "max":
        return max(xs), 0.0
    if not is_float(dtype):
        if op == "sum":
            return wrap(sum(xs), dtype), 0.0
        if op == "prod":
            p = 1
            for x in xs:
                p = wrap(p * x, dtype)
            return p, 0.0
        s = sum(xs)  # mean: inputs chosen so that s does not overflow
        q = abs(s) // n
        return (q if s >= 0 else -q), 0.0
    u = _UNIT_ROUNDOFF[dtype]
    if op == "prod":
        p = Fraction(1)
        for x in xs:
            p *= Fraction(x)
        ref = float(p)
        return ref, 2.0 * (n + 1) * u * abs(ref)
    ref = math.fsum(xs)
    err = 2.0 * n * u * math.fsum(abs(x) for x in xs)
    if op == "sum":
        return ref, err
    ref /= n
    return ref, err / n + 2.0 * u * abs(ref)


class Model:
    """What every (device, tensor name) should hold; apply() runs an op in Python."""

    def __init__(self):
        self.tensors = {}  # (device cluster name, tensor name) -> Tensor

    def put(self, device, name, dtype, values, shape=None):
        self.tensors[(device, name)] = Tensor(dtype, shape or [len(values)], values)

    def get(self, device, name):
        return self.tensors[(device, name)]

    def apply(self, kind, devices, tensor, reduce=None, root=0, output=None):
        """devices: concrete cluster names in rank order."""
        if kind == "barrier":
            return
        ins = [self.tensors[(d, tensor)] for d in devices]
        if kind == "broadcast":
            src = ins[root]
            for d in devices:
                self.tensors[(d, tensor)] = Tensor(src.dtype, src.shape, src.values)
            return
        if kind == "all-gather":
            values = [v for t in ins for v in t.values]
            out = output or tensor + ".gathered"
            for d in devices:
                self.tensors[(d, out)] = Tensor(ins[0].dtype, [len(devices)] + ins[0].shape,
                                                values)
            return
        dtype = ins[0].dtype
        cols = [reduce_column(dtype, reduce, [t.values[j] for t in ins])
                for j in range(len(ins[0].values))]
        result = Tensor(dtype, ins[0].shape, [c[0] for c in cols], [c[1] for c in cols])
        targets = devices if kind == "all-reduce" else [devices[root]]
        for d in targets:
            self.tensors[(d, tensor)] = result.copy()


def mismatch(expected, got, limit=5):
    """None when `tensor get -o json` output `got` matches Tensor `expected`, else why not."""
    if not isinstance(got, dict):
        return "not a JSON document: %r" % (got,)
    if got.get("dtype") != expected.dtype:
        return "dtype %r, want %r" % (got.get("dtype"), expected.dtype)
    if got.get("shape") != expected.shape:
        return "shape %r, want %r" % (got.get("shape"), expected.shape)
    values = got.get("values")
    if not isinstance(values, list) or len(values) != len(expected.values):
        return "%s values, want %d" % (len(values) if isinstance(values, list) else values,
                                       len(expected.values))
    bad = []
    for i, (g, e, tol) in enumerate(zip(values, expected.values, expected.tols)):
        if is_float(expected.dtype):
            # devcoordctl prints f32, f16 and bf16 values with the fewest digits that read
            # back as that f32.
            ok = isinstance(g, (int, float))
            if ok:
                g = round_to(expected.dtype, g)
            ok = ok and abs(g - e) <= tol
        else:
            ok = isinstance(g, int) and g == e
        if not ok:
            bad.append("[%d] got %r want %r%s" % (i, g, e, " +- %.3g" % tol if tol else ""))
    if bad:
        return "%d of %d values differ: %s" % (len(bad), len(values), "; ".join(bad[:limit]))
    return None


def parallel(fn, items, jobs=4):
    """[fn(item) for item in items], run `jobs` at a time (each one is a CLI process)."""
    with ThreadPoolExecutor(jobs) as ex:
        return list(ex.map(fn, items))


def ctl_popen(cluster, *args):
    """Starts devcoordctl -s ADDR -o json ARGS in the background; finish() it."""
    argv = [harness.CTL, "-s", cluster.addr, "-o", "json"] + list(args)
    env = dict(os.environ)
    env.pop("DEVCOORD_ADDR", None)
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=env)
    p.argv = argv
    return p


def finish(p, timeout=60.0):
    """Waits for a ctl_popen() process; returns harness.CtlResult (stdout parsed as JSON)."""
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        raise AssertionError("devcoordctl %s did not return within %.0f s"
                             % (" ".join(p.argv[1:]), timeout))
    out = out.decode("utf-8", "replace")
    err = err.decode("utf-8", "replace")
    try:
        doc = json.loads(out) if out.strip() else out
    except ValueError:
        doc = out
    return harness.CtlResult(p.argv, p.returncode, doc, err)


# ---- the Worker service by hand (issue 12: prepared ops, Commit, Abort) -------------------

WORKER_SERVICE = "/devcoord.v1.Worker/"
_BACKENDS = {"cpu": 1, "cuda": 2}


def worker_port(cluster, name):
    """The data port of worker `name` (its listen address, tcp://127.0.0.1:PORT)."""
    return int(cluster.worker_specs[name]["listen"].rsplit(":", 1)[1])


def device_pb(device):
    """Device message of "cuda:1" (the backends these tests use)."""
    backend, _, index = device.partition(":")
    return (harness.pb_uint(harness.F("Device", "backend"), _BACKENDS[backend])
            + harness.pb_uint(harness.F("Device", "index"), int(index or 0)))


def worker_call(cluster, worker, method, body, timeout=10.0, token=None, attachment=b""):
    """One call to a worker's data port: (code name, message, body, attachment)."""
    F = harness.F
    rid = random.randrange(1, 1 << 31)
    header = (harness.pb_uint(F("RequestHeader", "request_id"), rid)
              + harness.pb_bytes(F("RequestHeader", "method"), WORKER_SERVICE + method)
              + harness.pb_uint(F("RequestHeader", "timeout_ms"), int(timeout * 1000))
              + harness.pb_bytes(F("RequestHeader", "token"), token or ""))
    with harness.RpcConnection(worker_port(cluster, worker), timeout) as conn:
        conn.send_message(struct.pack(">I", rid | 0x80000000)
                          + harness.frame(header, body, attachment))
        while True:
            reply = conn.recv_message()
            if struct.unpack(">I", reply[:4])[0] == rid | 0x80000000:
                break
    data = reply[4:]
    (hlen,) = struct.unpack(">I", data[:4])
    rest = data[4 + hlen:]
    (blen,) = struct.unpack(">I", rest[:4])
    code, message, _ = harness.parse_reply(data)
    return code, message, rest[4:4 + blen], rest[4 + blen:]


def tensor_bytes(cluster, worker, device, name, chunk=1 << 20):
    """The raw bytes of tensor `name` on worker/device, straight from the worker in chunks
    (a big tensor through `tensor get -o json` would cost seconds); None when missing."""
    F = harness.F
    out = bytearray()
    while True:
        body = (harness.pb_bytes(F("GetTensorRequest", "device"), device_pb(device))
                + harness.pb_bytes(F("GetTensorRequest", "name"), name)
                + harness.pb_uint(F("GetTensorRequest", "offset"), len(out))
                + harness.pb_uint(F("GetTensorRequest", "max_bytes"), chunk))
        code, message, reply, att = worker_call(cluster, worker, "GetTensor", body)
        if code == "NOT_FOUND":
            return None
        if code != "OK":
            raise AssertionError("GetTensor %s/%s %s: %s: %s" % (worker, device, name, code,
                                                                 message))
        info = harness.pb_decode(harness.pb_decode(reply)[F("GetTensorResponse", "tensor")][0])
        size = info.get(F("TensorInfo", "size_bytes"), [0])[0]
        out += att
        if len(out) >= size or not att:
            return bytes(out)


def execute_pb(op_id, kind, worker, address, epoch, devices, tensor, reduce=None,
               timeout_ms=10000, hold_ms=30000, key="", request_hash=0):
    """An ExecuteRequest for a plan of one worker owning `devices` (ranks in that order), as
    the coordinator would send it. kind and reduce are enum numbers."""
    F = harness.F
    refs = b"".join(harness.pb_bytes(F("Plan", "devices"),
                                     harness.pb_bytes(F("DeviceRef", "worker"), worker)
                                     + harness.pb_bytes(F("DeviceRef", "device"), device_pb(d)))
                    for d in devices)
    pw = (harness.pb_bytes(F("PlanWorker", "name"), worker)
          + harness.pb_bytes(F("PlanWorker", "address"), address)
          + b"".join(harness.pb_uint(F("PlanWorker", "ranks"), r) if r else
                     harness.pb_varint(F("PlanWorker", "ranks") << 3) + b"\x00"
                     for r in range(len(devices))))
    plan = (harness.pb_bytes(F("Plan", "group_id"), "test") + refs
            + harness.pb_bytes(F("Plan", "workers"), pw))
    return (harness.pb_bytes(F("ExecuteRequest", "op_id"), op_id)
            + harness.pb_uint(F("ExecuteRequest", "kind"), kind)
            + harness.pb_uint(F("ExecuteRequest", "reduce"), reduce or 0)
            + harness.pb_bytes(F("ExecuteRequest", "tensor"), tensor)
            + harness.pb_bytes(F("ExecuteRequest", "plan"), plan)
            + harness.pb_uint(F("ExecuteRequest", "timeout_ms"), timeout_ms)
            + harness.pb_uint(F("ExecuteRequest", "epoch"), epoch)
            + harness.pb_bytes(F("ExecuteRequest", "idempotency_key"), key)
            + harness.pb_uint(F("ExecuteRequest", "request_hash"), request_hash)
            + harness.pb_uint(F("ExecuteRequest", "hold_ms"), hold_ms))


def op_id_pb(message, op_id):
    """CommitRequest / AbortRequest naming op_id."""
    return harness.pb_bytes(harness.F(message, "op_id"), op_id)
