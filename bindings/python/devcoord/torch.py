"""devcoord.torch: torch integration, imported only on demand (needs torch).

allreduce_hook is a DistributedDataParallel communication hook that averages each gradient
bucket through a devcoord Group instead of DDP's process group::

    group = devcoord.Group(client, devices, my_device)
    model = torch.nn.parallel.DistributedDataParallel(net)
    model.register_comm_hook(devcoord.torch.HookState(group), devcoord.torch.allreduce_hook)

The state is a HookState, any object with a ``group`` attribute, or the Group itself.
"""

import torch

from .group import Group


class HookState:
    """The state DDP passes to allreduce_hook: the devcoord Group of this rank, and how many
    buckets the hook has averaged (calls)."""

    def __init__(self, group):
        self.group = group
        self.calls = 0


def allreduce_hook(state, bucket):
    """Averages bucket.buffer() in place over the group (one all-reduce "mean") and returns a
    completed torch.futures.Future holding it; a failed call raises its devcoord.Error."""
    group = state if isinstance(state, Group) else state.group
    buf = bucket.buffer()
    group.all_reduce(buf, "mean")
    if hasattr(state, "calls"):
        state.calls += 1
    fut = torch.futures.Future()
    fut.set_result(buf)
    return fut
