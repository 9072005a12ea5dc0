"""devcoord.Group: one rank's membership of a group, and its in-place collectives.

Every rank (a process or a thread) builds a Group with the same device list and the entry it
is; the constructor returns once every rank has joined (README, "Groups"). The calls work in
place on the caller's memory, handed to libdevcoord without a Python-level copy: numpy
arrays, array.array, any C-contiguous writable buffer, and contiguous CPU torch tensors
(through data_ptr()). The element type comes from the buffer: numpy / torch dtype
(float16 and torch.bfloat16 are f16 and bf16) or buffer format / array typecode.
"""

import copy
import ctypes
import threading
import weakref

from . import _lib
from ._lib import lib, text
from .client import _b, _check, _raise
from .dtypes import DTYPES, dtype as _dtype, from_format
from .errors import error_for

try:  # optional
    import numpy as _np
except ImportError:  # pragma: no cover - depends on the machine
    _np = None

_TORCH_DTYPES = {"torch.float32": "f32", "torch.float64": "f64", "torch.int32": "i32",
                 "torch.int64": "i64", "torch.float16": "f16", "torch.bfloat16": "bf16"}
_REDUCE = {"sum": 1, "mean": 2, "min": 3, "max": 4, "prod": 5}


def _reduce_op(op):
    if op not in _REDUCE:
        raise error_for(3, "unknown reduce op %r (expected one of %s)" % (op, ", ".join(_REDUCE)))
    return _REDUCE[op]


def _is_torch(obj):
    return type(obj).__module__.startswith("torch") and hasattr(obj, "data_ptr")


def _buffer(obj, what, writable=True):
    """(pointer, element count, DType, objects to keep alive) of `obj`'s memory."""
    if _is_torch(obj):
        name = _TORCH_DTYPES.get(str(obj.dtype))
        if name is None:
            raise error_for(3, "%s: torch dtype %s is not one of %s"
                            % (what, obj.dtype, ", ".join(_TORCH_DTYPES)))
        if obj.device.type != "cpu" or not obj.is_contiguous():
            raise error_for(3, "%s: only contiguous CPU torch tensors are supported (got a %s "
                            "tensor%s)" % (what, obj.device.type,
                                           "" if obj.is_contiguous() else ", not contiguous"))
        if writable:
            # Written in place: bump autograd's version counter (shared with views and
            # detach()) as torch's in-place ops do, so that backward() through a tensor saved
            # before the call raises instead of using the new values. An in-place op on an
            # empty view costs ~2 us; Debian's torch 1.13 has no increment_version. An
            # inference tensor has no version counter (and refuses in-place ops outside
            # inference mode).
            if not obj.is_inference():
                obj.detach().view(-1)[:0].zero_()
        return ctypes.c_void_p(obj.data_ptr()), obj.numel(), DTYPES[name], obj
    if _np is not None and isinstance(obj, _np.ndarray):
        if not obj.flags.c_contiguous:
            raise error_for(3, "%s: the numpy array is not C-contiguous" % what)
        if writable and not obj.flags.writeable:
            raise error_for(3, "%s: the numpy array is read-only" % what)
        return ctypes.c_void_p(obj.ctypes.data), obj.size, _dtype(obj.dtype), obj
    try:
        mv = memoryview(obj)
    except TypeError:
        raise error_for(3, "%s: %s is neither a buffer nor a torch tensor"
                        % (what, type(obj).__name__)) from None
    if not mv.c_contiguous:
        raise error_for(3, "%s: the buffer is not C-contiguous" % what)
    # An alloc() block without numpy: its memoryview's format cannot say f16 or bf16 (both
    # "H"), the block remembers which.
    dt = getattr(mv.obj, "_dtype", None)
    if dt is None or mv.format != dt.typecode:
        dt = from_format(mv.format, mv.itemsize)
    if dt is None:
        raise error_for(3, "%s: cannot tell the dtype of a buffer of format %r"
                        % (what, mv.format))
    count = mv.nbytes // dt.size
    if mv.readonly:
        if writable or not isinstance(mv.obj, bytes):
            raise error_for(3, "%s: the buffer is read-only" % what)
        # ctypes passes a bytes object as a pointer to its start: a view of part of it is
        # copied out (a send buffer is only read).
        raw = mv.obj if mv.nbytes == len(mv.obj) else mv.tobytes()
        return raw, count, dt, (mv, raw)
    if mv.nbytes == 0:
        return None, 0, dt, mv
    flat = mv.cast("B") if mv.format != "B" or mv.ndim != 1 else mv
    cbuf = (ctypes.c_char * mv.nbytes).from_buffer(flat)
    return ctypes.cast(cbuf, ctypes.c_void_p), count, dt, (mv, flat, cbuf)


class Request:
    """A call started by a Group's *_async method: wait() finishes it (raising its error),
    test() says whether it has ended. The buffers stay referenced until wait() returns.
    Threads may wait for one request at once (Group.leave() does beside the thread that
    started it): the library's request is finished once, and every wait() sees its
    outcome."""

    def __init__(self, handle, keep):
        self._h = handle
        self._keep = keep
        self._error = None
        self._lock = threading.Lock()  # held while the library's request is used
        self._ended = False  # dc_wait has returned

    def test(self):
        """True when the call has ended (wait() then returns at once); raises its error if
        it failed. False while another thread waits inside wait() for it to end."""
        if self._ended:
            self.wait()  # raises its error again if it failed
            return True
        if not self._lock.acquire(blocking=False):
            return self._ended
        try:
            if not self._h:
                return True
            done = ctypes.c_bool(False)
            st = _lib.Status()
            code = lib.dc_test(self._h, ctypes.byref(done), ctypes.byref(st))
            if not done.value or code == 0:
                return bool(done.value)
        finally:
            self._lock.release()
        self.wait()  # ended: finished here, raising its error if it failed
        return True

    def wait(self):
        """Waits for the call to end; raises its devcoord.Error if it failed. Idempotent."""
        with self._lock:
            h, self._h = self._h, None
            if h:
                st = _lib.Status()
                code = lib.dc_wait(h, ctypes.byref(st))
                self._keep = None
                self._ended = True
                if code != 0:
                    try:
                        _raise(code, st)
                    except Exception as e:  # kept so that a later wait() raises it again
                        self._error = e
        if self._error is not None:
            # A copy each time: raising the kept object again would add to its traceback
            # with every wait(), and threads waiting at once would share one traceback.
            raise copy.copy(self._error)

    def __del__(self):
        # The library may still write into the buffers: never let them go before the end.
        if getattr(self, "_h", None):
            try:
                self.wait()
            except Exception:
                pass


class Group:
    """This rank's membership of the group of `devices` (a list of device references, or a
    "ref,ref" string, in any order) as `self_device` (one of them). Joins in the
    constructor, waiting for every rank (at most timeout_ms, None: the coordinator's
    limit); call_timeout_ms bounds each call (None: 30000). Use as a context manager or
    call leave(). Calls on one Group are matched by order with the other ranks' calls.
    """

    def __init__(self, client, devices, self_device, timeout_ms=None, call_timeout_ms=None):
        self._g = None
        self._client = client  # the group uses the client's connection
        self._pending = weakref.WeakSet()  # Requests not waited for yet
        self._calls = 0  # blocking calls in the library now (other threads' too)
        self._idle = threading.Condition()  # _calls fell to 0; guards _calls and _g
        self._blocks = {}  # address -> ctypes array of each alloc() block not freed
        if not client._h:
            raise error_for(9, "the client is closed")
        if not isinstance(devices, str):
            devices = ",".join(devices)
        opts = _lib.GroupOptions(timeout_ms or 0, call_timeout_ms or 0)
        handle = ctypes.c_void_p()
        st = _lib.Status()
        _check(lib.dc_group_join(client._h, _b(devices), _b(self_device), ctypes.byref(opts),
                                 ctypes.byref(handle), ctypes.byref(st)), st)
        self._g = handle
        client._groups.add(self)
        with client._live_lock:
            # Strong, unlike _groups: the cycle collector clears weak references before it
            # finalizes, so a Client collected with this Group still leaves it first.
            client._live[id(self)] = handle

    def _with(self, fn, *args):
        """fn(the library's group, *args), with leave() held off until it returns."""
        self._hold()
        try:
            return fn(self._g, *args)
        finally:
            self._release()

    @property
    def rank(self):
        return self._with(lib.dc_group_rank)

    @property
    def size(self):
        return self._with(lib.dc_group_size)

    @property
    def group_id(self):
        return text(self._with(lib.dc_group_id))

    @property
    def generation(self):
        return self._with(lib.dc_group_generation)

    @property
    def devices(self):
        """Cluster names of the ranks, in rank order."""
        return self._with(
            lambda g: [text(lib.dc_group_device(g, r)) for r in range(lib.dc_group_size(g))])

    def leave(self):
        """Waits for the calls still in flight (their errors are left to their requests;
        blocking calls other threads are making end first), then tells the coordinator this
        rank leaves; idempotent. Raises if that call fails (the membership is gone either
        way). Client.close() leaves the client's groups."""
        for req in list(self._pending):
            try:
                req.wait()
            except Exception:
                pass
        with self._idle:
            while self._calls > 0:
                self._idle.wait()
            g, self._g = self._g, None
        self._blocks.clear()  # dc_group_leave frees them
        if g:
            with self._client._live_lock:
                mine = self._client._live.pop(id(self), None) is not None
            if mine:  # else the client's close() has left it already
                st = _lib.Status()
                _check(lib.dc_group_leave(g, ctypes.byref(st)), st)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.leave()

    def __del__(self):
        try:
            self.leave()
        except Exception:
            pass

    def alloc(self, shape, dtype="f32"):
        """A zeroed array of `shape` (an int or a tuple) and `dtype` in memory from
        dc_group_alloc: shared with this rank's worker when it runs on this host, so a call on
        it moves no byte between this process and the worker (shared() says whether it is).
        A numpy array when numpy is present, else a memoryview of that shape (flat when the
        shape has a 0; f16 and bf16 as "H", 16-bit patterns, which calls take as the dtype
        asked for). Valid until free(array) or leave(), which frees what is left: do not
        use it after that."""
        d = _dtype(dtype)
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        count = 1
        for n in shape:
            if not isinstance(n, int) or n < 0:
                raise error_for(3, "shape %r: dimensions are non-negative ints" % (shape,))
            count *= n
        nbytes = max(count * d.size, 1)
        st = _lib.Status()
        ptr = self._with(lib.dc_group_alloc, nbytes, ctypes.byref(st))
        if not ptr:
            _raise(st.code or 8, st)
        ctypes.memset(ptr, 0, nbytes)
        raw = (ctypes.c_char * nbytes).from_address(ptr)
        raw._group = self  # the array (its base) keeps the group, so the block, alive
        raw._dtype = d
        self._blocks[ptr] = raw
        if _np is not None:
            # numpy has no bf16: uint16 bit patterns, marked so that calls take them as bf16.
            nd = _np.dtype(d.numpy, metadata={"devcoord": d.name}) if d.name == "bf16" else d.numpy
            arr = _np.frombuffer(raw, dtype=nd, count=count).reshape(shape)
        elif count == 0:  # memoryview has no zero in a shape: a flat empty one
            arr = memoryview(raw).cast("B")[:0].cast(d.typecode)
        else:
            arr = memoryview(raw).cast("B").cast(d.typecode, shape)
        return arr

    def _address(self, buf):
        if _is_torch(buf):
            return buf.data_ptr()
        if _np is not None and isinstance(buf, _np.ndarray):
            return buf.ctypes.data
        try:
            mv = memoryview(buf)
            if mv.nbytes == 0 and isinstance(mv.obj, ctypes.Array):
                return ctypes.addressof(mv.obj)  # an empty view of a block (alloc without numpy)
            return ctypes.addressof(ctypes.c_char.from_buffer(buf))
        except (TypeError, ValueError):  # read-only, empty, or no buffer at all
            raise error_for(3, "%s is no array from alloc()" % type(buf).__name__) from None

    def shared(self, buf):
        """Whether buf (from alloc, or devcoord.torch.empty) is memory this rank's worker
        maps too."""
        return bool(self._with(lib.dc_group_buffer_shared, self._address(buf)))

    def free(self, buf):
        """Gives back an array from alloc, or a tensor from devcoord.torch.empty (before
        leave(), which frees the rest)."""
        ptr = self._address(buf)
        if ptr in self._blocks:
            self._with(lib.dc_group_free, ptr)
            del self._blocks[ptr]

    def _handle(self):
        if not self._g:
            raise error_for(9, "the group has been left")
        if not self._client._h:
            raise error_for(9, "the client is closed")
        return self._g

    def _hold(self):
        """Counts a call in flight, or one another thread will make (devcoord.torch's hook
        calls queued): leave() waits until none is left. Raises once left."""
        with self._idle:
            self._handle()
            self._calls += 1

    def _release(self):
        with self._idle:
            self._calls -= 1
            self._idle.notify_all()

    def _run(self, name, async_, args, keep):
        st = _lib.Status()
        self._hold()  # leave() must not free the group under this call
        g = self._g
        try:
            if async_:
                req = getattr(lib, "dc_%s_async" % name)(g, *args, ctypes.byref(st))
                if not req:
                    _raise(st.code or 2, st)
                r = Request(req, keep)
                self._pending.add(r)
                return r
            code = getattr(lib, "dc_" + name)(g, *args, ctypes.byref(st))
        finally:
            self._release()
        _check(code, st)
        return None

    def _pair(self, send, recv, send_per_recv):
        sp, sn, sdt, skeep = _buffer(send, "send", writable=False)
        rp, rn, rdt, rkeep = _buffer(recv, "recv")
        if sdt != rdt:
            raise error_for(3, "send is %s but recv is %s" % (sdt.name, rdt.name))
        size = self.size
        count = sn if send_per_recv else rn
        if (rn if send_per_recv else sn) != size * count:
            raise error_for(3, "%s has %d elements, expected %d (group size %d x %d)"
                            % ("recv" if send_per_recv else "send",
                               rn if send_per_recv else sn, size * count, size, count))
        return (sp, rp, count, sdt.number), (skeep, rkeep, send, recv)

    # -- the calls (each also *_async, returning a Request)

    def all_reduce(self, buf, op="sum", _async=False):
        """Every rank's buf becomes op ("sum", "mean", "min", "max", "prod") over all ranks'."""
        p, n, dt, keep = _buffer(buf, "buf")
        return self._run("all_reduce", _async, (p, n, dt.number, _reduce_op(op)), (keep, buf))

    def reduce(self, buf, root, op="sum", _async=False):
        """The root's buf becomes op over all ranks' bufs; the others' stay as they were."""
        p, n, dt, keep = _buffer(buf, "buf")
        return self._run("reduce", _async, (p, n, dt.number, _reduce_op(op), root), (keep, buf))

    def broadcast(self, buf, root, _async=False):
        """Every rank's buf becomes the root's."""
        p, n, dt, keep = _buffer(buf, "buf")
        return self._run("broadcast", _async, (p, n, dt.number, root), (keep, buf))

    def all_gather(self, send, recv, _async=False):
        """recv (size x len(send) elements) gets every rank's send, in rank order."""
        args, keep = self._pair(send, recv, True)
        return self._run("all_gather", _async, args, keep)

    def reduce_scatter(self, send, recv, op="sum", _async=False):
        """send (size x len(recv) elements) is reduced over all ranks; recv gets this rank's
        block of the result."""
        args, keep = self._pair(send, recv, False)
        return self._run("reduce_scatter", _async, args + (_reduce_op(op),), keep)

    def barrier(self, _async=False):
        """Returns when every rank has called it."""
        return self._run("barrier", _async, (), None)

    def all_reduce_async(self, buf, op="sum"):
        return self.all_reduce(buf, op, _async=True)

    def reduce_async(self, buf, root, op="sum"):
        return self.reduce(buf, root, op, _async=True)

    def broadcast_async(self, buf, root):
        return self.broadcast(buf, root, _async=True)

    def all_gather_async(self, send, recv):
        return self.all_gather(send, recv, _async=True)

    def reduce_scatter_async(self, send, recv, op="sum"):
        return self.reduce_scatter(send, recv, op, _async=True)

    def barrier_async(self):
        return self.barrier(_async=True)
