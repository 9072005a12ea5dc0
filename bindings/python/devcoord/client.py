"""devcoord.Client: the registry, operations, tensors and cluster status of a devcoord cluster.

Every method returns plain Python values (the dataclasses below, lists of them, array.array
or numpy arrays) and raises a devcoord.Error subclass on failure. A Client may be used from
many threads at once (libdevcoord's dc_client is thread-safe and ctypes releases the GIL
during each call); close() must not race with calls in flight.
"""

import array
import ctypes
import threading
import weakref
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from . import _lib
from ._lib import lib, name_of, text
from .dtypes import BY_NUMBER, DTYPES, dtype as _dtype, from_format
from .errors import error_for

try:  # optional
    import numpy as _np
except ImportError:  # pragma: no cover - depends on the machine
    _np = None


# ---- results -----------------------------------------------------------------------------


@dataclass
class Worker:
    """A worker as the registry has it; state is "alive", "dead", "cordoned" or "draining"."""

    name: str
    address: str
    state: str
    epoch: int
    device_count: int
    executor: str
    since_heartbeat_ms: int
    max_message_bytes: int
    labels: Dict[str, str] = field(default_factory=dict)


@dataclass
class DeviceInfo:
    """A registered device: its cluster name ("node-a/cuda:0"), worker, concrete device text
    ("cuda:0"), backend, kind (None for backends without kinds), index, state ("healthy",
    "unhealthy", "dead") and memory in bytes."""

    name: str
    worker: str
    device: str
    backend: str
    kind: Optional[str]
    index: int
    state: str
    memory_bytes: int


@dataclass
class ClusterStatus:
    """Worker counts by state, device counts by backend name, op counters and readiness."""

    workers_alive: int
    workers_dead: int
    workers_cordoned: int
    workers_draining: int
    devices_by_backend: Dict[str, int]
    ops_in_flight: int
    ops_done: int
    ops_failed: int
    ready: bool


@dataclass
class PlanWorker:
    """One worker of an op's plan: its data address and the ranks (indices into Op.devices)
    it holds."""

    name: str
    address: str
    ranks: List[int]


@dataclass
class WorkerResult:
    """One worker's answer to an op: code name, message and time spent."""

    name: str
    code: str
    message: str
    elapsed_us: int


@dataclass
class Op:
    """An operation (submitted, planned, or from the history): kind ("all-reduce", ...),
    reduce op name (or None), root rank, tensor names, state ("queued", "running", "done",
    "failed"), final code name and message, the concrete devices in rank order (text form),
    the plan, per-worker results and the workers not answered yet."""

    op_id: str
    kind: str
    reduce: Optional[str]
    root: int
    tensor: str
    output_tensor: str
    state: str
    code: str
    message: str
    group_id: str
    devices: List[str]
    plan: List[PlanWorker]
    results: List[WorkerResult]
    waiting_on: List[str]
    submitted_unix_ms: int
    elapsed_us: int


@dataclass
class TensorInfo:
    """A stored tensor as a listing shows it (no data): device cluster name, name, dtype name,
    shape and size in bytes."""

    device: str
    name: str
    dtype: str
    shape: List[int]
    size_bytes: int


# ---- helpers -----------------------------------------------------------------------------


def _b(s):
    return None if s is None else s.encode("utf-8")


def _raise(code, st, op=None):
    raise error_for(code, text(st.message), transport=bool(st.transport),
                    device_index=st.device_index, worker=text(st.worker), op=op)


def _check(code, st):
    if code != 0:
        _raise(code, st)


def version():
    """libdevcoord's version, "0.3.0"."""
    return text(lib.dc_version())


def _ref_text(ref):
    buf = ctypes.create_string_buffer(_lib.DEVICE_TEXT_SIZE)
    lib.dc_device_ref_format(ctypes.byref(ref), buf, len(buf))
    return text(buf.value)


def _device_text(dev):
    buf = ctypes.create_string_buffer(_lib.DEVICE_TEXT_SIZE)
    lib.dc_device_format(ctypes.byref(dev), buf, len(buf))
    return text(buf.value)


def _parse_ref(s):
    ref = _lib.DeviceRef()
    st = _lib.Status()
    raw = _b(s)
    _check(lib.dc_device_ref_parse(raw, len(raw), ctypes.byref(ref), ctypes.byref(st)), st)
    return ref


def parse_device(s):
    """The canonical text form of device reference `s` (README, "Devices": "node-a/cuda" gives
    "node-a/cuda:0"); raises InvalidArgument saying where the text is wrong."""
    return _ref_text(_parse_ref(s))


def format_device(backend, index=0, kind=None, worker=None, autodiff=0):
    """The text form of a device from its parts: format_device("cuda", 1, worker="node-a",
    autodiff=1) is "node-a/autodiff(cuda:1)". The result is checked by parsing it."""
    concrete = backend + (":" + kind if kind else "") + ":%d" % index
    for _ in range(autodiff):
        concrete = "autodiff(%s)" % concrete
    return parse_device((worker + "/" if worker else "") + concrete)


def _worker(w):
    labels = {text(w.labels[i].key): text(w.labels[i].value) for i in range(w.n_labels)}
    return Worker(text(w.name), text(w.address), name_of(lib.dc_worker_state_name, w.state),
                  w.epoch, w.device_count, text(w.executor), w.since_heartbeat_ms,
                  w.max_message_bytes, labels)


def _device_info(d):
    kind = lib.dc_kind_name(d.device.kind)
    return DeviceInfo(text(d.name), text(d.worker), _device_text(d.device),
                      name_of(lib.dc_backend_name, d.device.backend), text(kind),
                      d.device.index, name_of(lib.dc_device_state_name, d.state), d.memory_bytes)


def _op(r):
    reduce = lib.dc_reduce_op_name(r.reduce) if r.reduce else None
    plan = [PlanWorker(text(p.name), text(p.address), [p.ranks[i] for i in range(p.n_ranks)])
            for p in (r.plan_workers[i] for i in range(r.n_plan_workers))]
    results = [WorkerResult(text(w.name), name_of(lib.dc_status_name, w.code), text(w.message),
                            w.elapsed_us)
               for w in (r.results[i] for i in range(r.n_results))]
    return Op(text(r.op_id), name_of(lib.dc_op_kind_name, r.kind), text(reduce), r.root,
              text(r.tensor), text(r.output_tensor), name_of(lib.dc_op_state_name, r.state),
              name_of(lib.dc_status_name, r.status.code), text(r.status.message),
              text(r.group_id), [_ref_text(r.devices[i]) for i in range(r.n_devices)], plan,
              results, [text(r.waiting_on[i].value) for i in range(r.n_waiting)],
              r.submitted_unix_ms, r.elapsed_us)


def _lookup(fn, what, value):
    number = fn(_b(value))
    if number <= 0:
        raise error_for(3, "unknown %s %r" % (what, value))
    return number


def _as_buffer(data, dtype, shape):
    """(pointer argument, byte count, DType, shape, objects to keep alive) for put."""
    dt = _dtype(dtype) if dtype is not None else None
    if isinstance(shape, int):
        shape = [shape]
    elif shape is not None:
        try:
            shape = [int(n) for n in shape]
        except (TypeError, ValueError):
            raise error_for(3, "shape %r: expected a list of ints" % (shape,)) from None
    if _np is not None and isinstance(data, _np.ndarray):
        # Any byte order: ascontiguousarray converts to this machine's.
        dt = dt or _dtype(data.dtype.newbyteorder("="))
        if dt.name == "bf16" and data.dtype != _np.uint16:
            raise error_for(3, "bf16 tensors are put from numpy arrays of uint16 bit patterns")
        arr = _np.ascontiguousarray(data, dtype=dt.numpy)
        return (ctypes.c_void_p(arr.ctypes.data), arr.nbytes, dt,
                shape if shape is not None else list(data.shape), arr)  # arr is 1-d at least
    if isinstance(data, (list, tuple)):
        dt = dt or DTYPES["f32"]
        if dt.typecode == "H":
            raise error_for(3, "%s tensors are put from a numpy array or a buffer of "
                            "16-bit patterns, not from a list" % dt.name)
        try:
            data = array.array(dt.typecode, data)  # converted in C, no Python loop
        except (TypeError, ValueError, OverflowError) as e:
            raise error_for(3, "cannot put the list as %s: %s" % (dt.name, e)) from None
    try:
        mv = memoryview(data)
    except TypeError:
        raise error_for(3, "put takes a list, a numpy array or a buffer, not %s"
                        % type(data).__name__) from None
    if not mv.c_contiguous:
        raise error_for(3, "put needs a C-contiguous buffer")
    held = from_format(mv.format, mv.itemsize)
    if dt is None:
        dt = held
        if dt is None:
            raise error_for(3, "cannot tell the dtype of a buffer of format %r; pass "
                            "dtype=" % mv.format)
    elif held is not None and held is not dt:
        # Its bytes would be read as the other type's, not converted as a list's or numpy's.
        raise error_for(3, "the buffer holds %s elements (format %r), not %s: convert them "
                        "(a list or numpy array is converted), or pass its bytes"
                        % (held.name, mv.format, dt.name))
    if mv.nbytes % dt.size:
        raise error_for(3, "%d bytes are not a whole number of %s elements"
                        % (mv.nbytes, dt.name))
    if shape is None:
        same = mv.itemsize == dt.size and mv.ndim > 0
        shape = list(mv.shape) if same else [mv.nbytes // dt.size]
    if mv.readonly:
        raw = mv.obj if isinstance(mv.obj, bytes) and mv.nbytes == len(mv.obj) else mv.tobytes()
        return raw, mv.nbytes, dt, shape, (mv, raw)
    flat = mv.cast("B") if mv.format != "B" or mv.ndim != 1 else mv
    cbuf = (ctypes.c_char * mv.nbytes).from_buffer(flat) if mv.nbytes else None
    return (ctypes.cast(cbuf, ctypes.c_void_p) if cbuf is not None else None, mv.nbytes, dt,
            shape, (mv, flat, cbuf))


# ---- the client ----------------------------------------------------------------------------


class Client:
    """A connection to a devcoord coordinator (and, for tensors, to the workers).

    address: "tcp://HOST:PORT", "tls+tcp://HOST:PORT" or "HOST:PORT" (None: $DEVCOORD_ADDR,
    then tcp://127.0.0.1:7400). token / token_file: bearer token (None: $DEVCOORD_TOKEN, then
    $DEVCOORD_TOKEN_FILE). tls_ca, tls_cert, tls_key, tls_server_name: PEM files and name
    check for TLS addresses. timeout_ms: deadline of each call (None: the library's 30000).
    fail_fast: raise at once (devcoord.Unavailable) when the coordinator cannot be reached;
    False keeps dialing in the background and lets each call time out.

    Use as a context manager or call close(); raises devcoord.Error subclasses.
    """

    def __init__(self, address=None, token=None, tls_ca=None, tls_cert=None, tls_key=None,
                 timeout_ms=None, token_file=None, tls_server_name=None, fail_fast=False):
        self._h = None
        self._groups = weakref.WeakSet()  # devcoord.Group joined through this client
        self._live = {}  # id(Group) -> its library handle, until left (Group.leave)
        # Reentrant: a finalizer the collector runs while it is held (Group.__del__) takes it.
        self._live_lock = threading.RLock()
        opts = _lib.ClientOptions(_b(token), _b(token_file), timeout_ms or 0, fail_fast,
                                  _b(tls_ca), _b(tls_cert), _b(tls_key), _b(tls_server_name))
        handle = ctypes.c_void_p()
        st = _lib.Status()
        _check(lib.dc_client_open(_b(address), ctypes.byref(opts), ctypes.byref(handle),
                                  ctypes.byref(st)), st)
        self._h = handle

    def close(self):
        """Leaves the groups joined through this client, then closes the connection;
        further calls raise FailedPrecondition. Idempotent."""
        for group in list(getattr(self, "_groups", ())):
            try:
                group.leave()
            except Exception:  # the membership is gone either way
                pass
        # Groups the cycle collector took out of _groups before finalizing this client: left
        # here, while the client they use is still open (their own leave() then skips it).
        with self._live_lock:
            live, self._live = self._live, {}
        for g in list(live.values()):
            lib.dc_group_leave(g, ctypes.byref(_lib.Status()))
        h, self._h = self._h, None
        if h:
            lib.dc_client_close(h)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown may have torn the module down already
            pass

    def _call(self, fn, *args):
        if not self._h:
            raise error_for(9, "the client is closed")
        st = _lib.Status()
        _check(fn(self._h, *args, ctypes.byref(st)), st)

    # -- registry

    def workers(self):
        """Every registered worker, as a list of Worker."""
        out = ctypes.POINTER(_lib.WorkerList)()
        self._call(lib.dc_list_workers, ctypes.byref(out))
        try:
            return [_worker(out.contents.workers[i]) for i in range(out.contents.n)]
        finally:
            lib.dc_worker_list_free(out)

    def devices(self, backend=None, worker=None, state=None, label=None):
        """Registered devices (list of DeviceInfo) in registry order, optionally only those of
        a backend ("cuda"), a worker, a state ("healthy") or a label ("key=value")."""
        filt = _lib.DeviceFilter(
            _lookup(lib.dc_backend_from_name, "backend", backend) if backend else 0,
            _b(worker),
            _lookup(lib.dc_device_state_from_name, "device state", state) if state else 0,
            _b(label))
        out = ctypes.POINTER(_lib.DeviceList)()
        self._call(lib.dc_list_devices, ctypes.byref(filt), ctypes.byref(out))
        try:
            return [_device_info(out.contents.devices[i]) for i in range(out.contents.n)]
        finally:
            lib.dc_device_list_free(out)

    def device(self, name):
        """One device by cluster name ("node-a/cuda:0"), as DeviceInfo."""
        info = _lib.DeviceInfo()
        try:
            self._call(lib.dc_get_device, _b(name), ctypes.byref(info))
            return _device_info(info)
        finally:
            lib.dc_device_info_clear(ctypes.byref(info))

    def _steer(self, fn, name):
        info = _lib.WorkerInfo()
        try:
            self._call(fn, _b(name), ctypes.byref(info))
            return _worker(info)
        finally:
            lib.dc_worker_info_clear(ctypes.byref(info))

    def cordon(self, worker):
        """Cordons a worker (no new ops on it); returns the Worker as it is afterwards."""
        return self._steer(lib.dc_cordon_worker, worker)

    def uncordon(self, worker):
        """Undoes cordon (and drain); returns the Worker afterwards."""
        return self._steer(lib.dc_uncordon_worker, worker)

    def drain(self, worker):
        """Drains a worker (no new ops; running ones finish); returns the Worker afterwards."""
        return self._steer(lib.dc_drain_worker, worker)

    def cluster_status(self):
        """Counts of workers, devices and ops, and readiness, as ClusterStatus."""
        s = _lib.ClusterStatus()
        self._call(lib.dc_cluster_status_get, ctypes.byref(s))
        by_backend = {}
        for number in range(1, _lib.BACKEND_COUNT):
            by_backend[name_of(lib.dc_backend_name, number)] = s.devices_by_backend[number]
        return ClusterStatus(s.workers_alive, s.workers_dead, s.workers_cordoned,
                             s.workers_draining, by_backend, s.ops_in_flight, s.ops_done,
                             s.ops_failed, bool(s.ready))

    def health(self):
        """Returns True when the coordinator answers and is ready; raises otherwise."""
        self._call(lib.dc_health)
        return True

    # -- operations

    def submit(self, kind, devices, tensor, reduce=None, root=0, output_tensor=None,
               timeout_ms=0, dry_run=False):
        """Runs an operation and waits for it; returns the Op.

        kind: "all-reduce", "reduce", "broadcast", "all-gather" or "barrier". devices: device
        references in rank order, in the text form of the README's "Devices"
        ("node-a/cuda:0"). reduce: "sum", "mean", "min", "max" or "prod" (all-reduce and
        reduce). root: rank of the root (broadcast, reduce). output_tensor: all-gather's
        output (None: "<tensor>.gathered"). timeout_ms: 0 for the coordinator's default.
        dry_run: plan only.

        A refused or failed op raises the Error of its code, with .op set to the Op when the
        coordinator answered.
        """
        if not self._h:
            raise error_for(9, "the client is closed")
        refs = (_lib.DeviceRef * len(devices))(*[_parse_ref(d) for d in devices])
        req = _lib.OpRequest(_lookup(lib.dc_op_kind_from_name, "op kind", kind),
                             _lookup(lib.dc_reduce_op_from_name, "reduce op", reduce)
                             if reduce else 0, root, refs, len(devices), _b(tensor),
                             _b(output_tensor), timeout_ms, dry_run)
        out = ctypes.POINTER(_lib.OpResult)()
        st = _lib.Status()
        code = lib.dc_submit(self._h, ctypes.byref(req), ctypes.byref(out), ctypes.byref(st))
        op = None
        if out:
            try:
                op = _op(out.contents)
            finally:
                lib.dc_op_result_free(out)
        if code != 0:
            _raise(code, st, op)
        return op

    def plan(self, kind, devices, tensor, **kw):
        """submit(..., dry_run=True): checks and plans the op without running it; returns the
        Op with its concrete devices and plan."""
        return self.submit(kind, devices, tensor, dry_run=True, **kw)

    def get_op(self, op_id):
        """One op (in flight or from the history) by id, as Op."""
        out = ctypes.POINTER(_lib.OpResult)()
        try:
            self._call(lib.dc_get_op, _b(op_id), ctypes.byref(out))
            return _op(out.contents)
        finally:
            if out:
                lib.dc_op_result_free(out)

    def list_ops(self, limit=0):
        """Recent and in-flight ops, newest first (limit 0: the server's default)."""
        out = ctypes.POINTER(_lib.OpList)()
        self._call(lib.dc_list_ops, limit, ctypes.byref(out))
        try:
            return [_op(out.contents.ops[i]) for i in range(out.contents.n)]
        finally:
            lib.dc_op_list_free(out)

    # -- tensors

    def put(self, device, name, data, dtype=None, shape=None):
        """Stores `data` as tensor `name` on `device` (a cluster name "node-a/cpu:0").

        data: a list or tuple (dtype default "f32"), an array.array, a numpy array or any
        C-contiguous buffer-protocol object; its memory is handed to the library as it is (a
        read-only buffer other than bytes is copied once, in C). dtype: "f32", "f64", "i32",
        "i64", "f16", "bf16" (default: from the buffer's format / numpy dtype). shape: default
        the buffer's shape, or one dimension.
        """
        ptr, nbytes, dt, shp, keep = _as_buffer(data, dtype, shape)
        dims = (ctypes.c_uint64 * max(1, len(shp)))(*shp)
        self._call(lib.dc_tensor_put, _b(device), _b(name), dt.number, dims, len(shp), ptr,
                   nbytes)
        del keep

    def get(self, device, name, numpy=False):
        """Reads tensor `name` from `device`: an array.array of its elements (flat; f16/bf16
        as 16-bit patterns, typecode "H"), or with numpy=True a numpy array of its shape
        (FailedPrecondition when numpy is not installed)."""
        if numpy and _np is None:
            raise error_for(9, "numpy=True needs numpy, which is not installed")
        out = ctypes.POINTER(_lib.Tensor)()
        self._call(lib.dc_tensor_get, _b(device), _b(name), ctypes.byref(out))
        try:
            t = out.contents
            dt = BY_NUMBER.get(t.dtype)
            if dt is None:
                raise error_for(12, "tensor %s has dtype %d, unknown to this package"
                                % (name, t.dtype))
            if numpy:
                arr = _np.empty([t.shape[i] for i in range(t.ndim)], dtype=dt.numpy)
                if t.size_bytes:
                    ctypes.memmove(arr.ctypes.data, t.data, min(t.size_bytes, arr.nbytes))
                return arr
            arr = array.array(dt.typecode)
            if t.size_bytes:
                arr.frombytes(ctypes.string_at(t.data, t.size_bytes))
            return arr
        finally:
            lib.dc_tensor_free(out)

    def delete(self, device, name):
        """Deletes tensor `name` from `device`."""
        self._call(lib.dc_tensor_delete, _b(device), _b(name))

    def tensors(self, device):
        """The tensors stored on `device`, as a list of TensorInfo."""
        out = ctypes.POINTER(_lib.TensorList)()
        self._call(lib.dc_tensor_list_get, _b(device), ctypes.byref(out))
        try:
            res = []
            for i in range(out.contents.n):
                t = out.contents.tensors[i]
                dt = BY_NUMBER.get(t.dtype)
                res.append(TensorInfo(text(t.device), text(t.name),
                                      dt.name if dt else str(t.dtype),
                                      [t.shape[k] for k in range(t.ndim)], t.size_bytes))
            return res
        finally:
            lib.dc_tensor_list_free(out)
