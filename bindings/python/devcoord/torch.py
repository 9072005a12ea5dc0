"""devcoord.torch: torch integration, imported only on demand (needs torch).

allreduce_hook is a DistributedDataParallel communication hook that averages each gradient
bucket through a devcoord Group instead of DDP's process group::

    group = devcoord.Group(client, devices, my_device)
    model = torch.nn.parallel.DistributedDataParallel(net)
    model.register_comm_hook(devcoord.torch.HookState(group), devcoord.torch.allreduce_hook)

The state is a HookState, any object with a ``group`` attribute, or the Group itself.

The hook starts the bucket's all-reduce and returns at once with a future that a thread of
this module completes when the call ends, as DDP's own hooks do: the backward pass goes on
computing the next buckets' gradients while this one is averaged. With
``HookState(group, overlap=False)`` it waits for the call instead (the future is complete
when returned).
"""

import collections
import threading
import weakref

import torch

from .group import Group


class HookState:
    """The state DDP passes to allreduce_hook: the devcoord Group of this rank, whether
    buckets overlap the backward pass (overlap), and how many buckets the hook has started
    (calls)."""

    def __init__(self, group, overlap=True):
        self.group = group
        self.overlap = overlap
        self.calls = 0


class _Caller:
    """The hook's calls of one group, made blocking on a thread of their own in the order
    the hook was called (the order every rank's DDP calls it in), each completing its
    future. A blocking call takes the library's fastest way for plain memory (through the
    group's staging block when the worker is on this host) and releases the GIL while it
    runs. The thread ends when no call is left (one thread per group, so ranks of one
    process never wait behind each other)."""

    def __init__(self):
        self._q = collections.deque()
        self._lock = threading.Lock()
        self._running = False

    def put(self, group, buf, fut):
        group._hold()  # leave() waits for the call (released once its future is set)
        item = (group, buf, fut)
        with self._lock:
            self._q.append(item)
            if self._running:
                return
            self._running = True
        try:
            threading.Thread(target=self._run, name="devcoord-hook", daemon=True).start()
        except BaseException:
            with self._lock:
                self._running = False
                for i, queued in enumerate(self._q):
                    if queued is item:
                        del self._q[i]
                        break
            group._release()
            raise

    def _run(self):
        while True:
            with self._lock:
                if not self._q:
                    self._running = False
                    return
                group, buf, fut = self._q.popleft()
            try:
                group.all_reduce(buf, "mean")
            except BaseException as e:  # the call's devcoord.Error, raised where DDP waits
                fut.set_exception(e)
            else:
                fut.set_result(buf)
            group._release()
            del group, buf, fut


_callers = weakref.WeakKeyDictionary()  # Group -> its _Caller
_callers_lock = threading.Lock()


def _caller(group):
    with _callers_lock:
        c = _callers.get(group)
        if c is None:
            c = _callers[group] = _Caller()
        return c


_DTYPES = {torch.float32: "f32", torch.float64: "f64", torch.int32: "i32", torch.int64: "i64",
           torch.float16: "f16", torch.bfloat16: "bf16"}


def empty(group, shape, dtype=torch.float32):
    """A zeroed CPU tensor of `shape` (an int or a tuple) and `dtype` in the group's
    dc_group_alloc memory (Group.alloc): shared with this rank's worker when it runs on
    this host (group.shared(t) says whether it is), so a call on it, or on a contiguous
    slice of it, moves no byte between this process and the worker. Valid until
    group.free(t) or leave(), which frees what is left: do not use it after that."""
    if dtype not in _DTYPES:
        raise TypeError("devcoord.torch.empty: dtype %s: one of %s"
                        % (dtype, ", ".join(str(d) for d in _DTYPES)))
    arr = group.alloc(shape, _DTYPES[dtype])
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    count = 1
    for n in shape:
        count *= n
    if count == 0:
        group.free(arr)  # nothing to share
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(arr, dtype=dtype, count=count).view(shape)


def allreduce_hook(state, bucket):
    """Averages bucket.buffer() in place over the group (one all-reduce "mean") and returns a
    torch.futures.Future holding it, completed when the call ends; a failed call sets its
    devcoord.Error on the future (DDP raises it when it waits for the bucket). With a state
    whose overlap is false it returns once the call has ended (raising its error)."""
    group = state if isinstance(state, Group) else state.group
    overlap = getattr(state, "overlap", True)
    buf = bucket.buffer()
    fut = torch.futures.Future()
    _caller(group).put(group, buf, fut)  # after the calls still queued, as every rank
    if hasattr(state, "calls"):
        state.calls += 1
    if not overlap:
        fut.wait()  # raises the call's error here
    return fut
