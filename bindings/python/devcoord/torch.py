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

from .dtypes import DTYPES
from .group import Group


class HookState:
    """The state DDP passes to allreduce_hook: the devcoord Group of this rank, whether
    buckets overlap the backward pass (overlap), how many buckets the hook has started
    (calls) and how many of them went through the shared block below (shared_calls).

    With shared_results (the default), once DDP's buckets are the same two steps running
    (DDP rebuilds them once, after its first step, or its second with static_graph), the
    hook takes one block of the group's shared memory (Group.alloc) holding every bucket,
    copies each bucket there and all-reduces it in place: the worker reads and writes it
    where it lies, and the future's result is that bucket's part of the block, from which
    DDP copies the gradients as it would from its own bucket. That saves copying each
    result back into DDP's bucket. When the block cannot be shared (the worker on another
    host, no room in /dev/shm or the worker's groups.shm_max_bytes), or the buckets change
    again more than once, buckets go as before; so do they with DDP's
    gradient_as_bucket_view (the gradients are then the bucket, into which DDP would copy
    the result anyway: no copy to save). The block is the gradients' size (rounded
    up to a MiB), kept until the group is left: the state takes it again when DDP's buckets
    change, and a later HookState of the group once this one is collected."""

    # Blocks one state takes at most (a second time when DDP's buckets change).
    BLOCKS_MAX = 2

    def __init__(self, group, overlap=True, shared_results=True):
        self.group = group
        self.overlap = overlap
        self.calls = 0
        self.shared_calls = 0
        self.shared_results = shared_results
        self._step = {}  # bucket index -> (numel, dtype) of this step's buckets so far
        self._last = None  # the last whole step's
        self._views = None  # bucket index -> its part of the block, while the buckets fit
        self._blocks = 0

    def _result_view(self, group, bucket, buf):
        """buf's part of the shared block, or None: the bucket goes as it is (also for an
        object that is no GradBucket: no index() or is_last())."""
        if not (hasattr(bucket, "index") and hasattr(bucket, "is_last")):
            return None
        if _grads_in_bucket(bucket, buf):
            # gradient_as_bucket_view: the gradients are DDP's bucket, so a result left in the
            # block would be copied into it anyway; the copy back costs the same, no block.
            return None
        index, key = bucket.index(), (buf.numel(), buf.dtype)
        view = None
        if self._views is not None:
            view = self._views.get(index)
            if view is None or (view.numel(), view.dtype) != key:
                self._views = view = None  # the buckets changed: learned again
        self._step[index] = key
        if bucket.is_last():
            step, self._step = self._step, {}
            if self._views is None and step == self._last and self._blocks < self.BLOCKS_MAX:
                self._views = self._make_block(group, step)
            self._last = step
        self.shared_calls += view is not None
        return view

    def _make_block(self, group, step):
        """{bucket index: its tensor} in a block of the group's shared memory holding every
        bucket of step, or None: then never again. Each bucket's tensor is a storage of its
        own (torch.frombuffer at its offset), not a slice of one: DDP takes the gradients
        from the result with as_strided, whose offsets count from the storage's start."""
        dtypes = {dtype for _, dtype in step.values()}
        if len(dtypes) != 1 or next(iter(dtypes)) not in _DTYPES or not any(
                n for n, _ in step.values()):
            self._blocks = self.BLOCKS_MAX  # mixed or unknown dtypes, or nothing: never
            return None
        dtype = dtypes.pop()
        size = DTYPES[_DTYPES[dtype]].size
        offsets, total = {}, 0
        for index in sorted(step):  # each bucket 64-byte aligned
            offsets[index] = total
            total += -(-step[index][0] * size // 64) * 64
        self._blocks += 1
        arr = _block_take(group, self, total)
        if arr is None:  # no room, or the worker is not on this host: as before
            self._blocks = self.BLOCKS_MAX
            return None
        return {i: torch.frombuffer(arr, dtype=dtype, count=step[i][0], offset=off)
                if step[i][0] > 0 else torch.empty(0, dtype=dtype) for i, off in offsets.items()}


def _grads_in_bucket(bucket, buf):
    """Whether the bucket's first parameter's gradient lies in buf (DDP's
    gradient_as_bucket_view)."""
    params = bucket.parameters() if hasattr(bucket, "parameters") else None
    grad = params[0].grad if params else None
    if grad is None or grad.device.type != "cpu":
        return False
    start = buf.data_ptr()
    return start <= grad.data_ptr() < start + buf.numel() * buf.element_size()


_hook_blocks_lock = threading.Lock()
# Rounding of a block's size: a layout DDP rebuilds (the same gradients, more or fewer
# buckets, so other padding) still fits the block made for the first.
_BLOCK_ROUND = 1 << 20


def _block_take(group, state, nbytes):
    """An array from group.alloc of at least nbytes for state: the one state had before (a
    state makes a block only while none of its buckets' results is in one, and DDP has
    copied the last step's), one a collected HookState had (its DDP model, which held it,
    is gone with its futures), or a new one. Blocks are never freed before the group is
    left, so no tensor a hook returned ever points at memory unmapped. None when it cannot
    be shared."""
    with _hook_blocks_lock:
        # [[array, bytes, weakref to its HookState or None]], on the group (an array holds
        # the group: a cycle the collector can take, where a table here would keep every
        # group alive).
        blocks = group.__dict__.setdefault("_hook_blocks", [])
        own = [e for e in blocks if e[2] is not None and e[2]() is state]
        free = [e for e in blocks if e[2] is None or e[2]() is None]
        fits = [e for e in own + free if e[1] >= nbytes]
        for entry in own:
            entry[2] = None  # the state's blocks, for any state to take
        if fits:
            fits[0][2] = weakref.ref(state)
            return fits[0][0]
    nbytes = -(-nbytes // _BLOCK_ROUND) * _BLOCK_ROUND
    try:
        arr = group.alloc(nbytes // 4, "f32")  # bytes: each bucket's tensor has its dtype
    except Exception:  # no room in /dev/shm or the worker's groups.shm_max_bytes
        return None
    if not group.shared(arr):  # the worker is not on this host
        group.free(arr)
        return None
    with _hook_blocks_lock:
        blocks.append([arr, nbytes, weakref.ref(state)])
    return arr


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

    def put(self, group, buf, fut, view=None):
        group._hold()  # leave() waits for the call (released once its future is set)
        item = (group, buf, fut, view)
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
                group, buf, fut, view = self._q.popleft()
            try:
                if view is not None:  # in place in shared memory, the result left there
                    view.copy_(buf)
                    buf = view
                group.all_reduce(buf, "mean")
            except BaseException as e:  # the call's devcoord.Error, raised where DDP waits
                fut.set_exception(e)
            else:
                fut.set_result(buf)
            group._release()
            del group, buf, fut, view


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
    view = None
    if isinstance(state, HookState) and state.shared_results:
        view = state._result_view(group, bucket, buf)
    fut = torch.futures.Future()
    _caller(group).put(group, buf, fut, view)  # after the calls still queued, as every rank
    if hasattr(state, "calls"):
        state.calls += 1
    if not overlap:
        fut.wait()  # raises the call's error here
    return fut
