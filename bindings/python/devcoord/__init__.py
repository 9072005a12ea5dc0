"""devcoord: Python client of the devcoord device coordination service.

A thin layer over libdevcoord (the C client library) through ctypes; standard library only
(numpy is used when present, never required). Start with ``devcoord.Client``::

    import devcoord
    with devcoord.Client("tcp://127.0.0.1:7400") as c:
        c.put("node-a/cpu:0", "grad", [1.0, 2.0])
        c.put("node-b/cpu:0", "grad", [3.0, 4.0])
        c.submit("all-reduce", ["node-a/cpu:0", "node-b/cpu:0"], "grad", reduce="sum")
        print(c.get("node-a/cpu:0", "grad"))    # array('f', [4.0, 6.0])

Results are plain dataclasses (Worker, DeviceInfo, ClusterStatus, Op, TensorInfo) and
array.array / numpy arrays for tensor data. Failures raise devcoord.Error subclasses, one per
gRPC-style code (devcoord.NotFound, devcoord.InvalidArgument, devcoord.Unavailable, ...).

The library is loaded from $DEVCOORD_LIB (path to libdevcoord.so) when set, else found by
ctypes.util.find_library("devcoord"), else by its soname libdevcoord.so.0.

Trainer processes (or threads) use ``devcoord.Group(client, devices, self_device)`` for
in-place collectives on numpy arrays, array.array, buffers and CPU torch tensors;
``devcoord.torch.allreduce_hook`` is a DistributedDataParallel communication hook over it.
"""

from .client import (Client, ClusterStatus, DeviceInfo, Op, PlanWorker, TensorInfo, Worker,
                     WorkerResult, format_device, parse_device, version)
from .dtypes import DTYPES, DType, dtype
from .group import Group, Request
from .errors import *  # noqa: F401,F403  (Error and its per-code subclasses)
from .errors import __all__ as _error_names

__all__ = ["Client", "ClusterStatus", "DeviceInfo", "Op", "PlanWorker", "TensorInfo", "Worker",
           "WorkerResult", "format_device", "parse_device", "version", "DTYPES", "DType",
           "dtype", "Group", "Request"] + _error_names
