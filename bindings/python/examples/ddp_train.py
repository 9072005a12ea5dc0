#!/usr/bin/env python3
"""Trains a small MLP on synthetic data with 2 ranks (processes) under torch's
DistributedDataParallel, once with DDP's default gloo all-reduce and once with gradients
averaged through a devcoord group (devcoord.torch.allreduce_hook), checks that the final
parameters agree to 1e-5 relative and prints the time per step of both.

    DEVCOORD_LIB=build/client/libdevcoord.so /usr/bin/python3 \
        bindings/python/examples/ddp_train.py --address tcp://127.0.0.1:7400 \
        --devices node-a/cuda:0,node-b/cuda:0

Rank i uses devices[i]. Exit status 0 when the parameters agree, 1 when they do not.
"""

import argparse
import hashlib
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import devcoord  # noqa: E402
import devcoord.torch  # noqa: E402

WORLD = 2


def make_model(width, depth):
    torch.manual_seed(0)  # the same initial parameters on every rank and in both runs
    layers = [torch.nn.Linear(16, width), torch.nn.Tanh()]
    for _ in range(depth - 1):
        layers += [torch.nn.Linear(width, width), torch.nn.Tanh()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(width, 1))


def train(rank, args, hook_state):
    """args.steps of SGD on this rank's synthetic data; returns (flat parameters, s per
    step)."""
    model = DistributedDataParallel(make_model(args.width, args.depth),
                                    bucket_cap_mb=args.bucket_mb)
    if hook_state is not None:
        model.register_comm_hook(hook_state, devcoord.torch.allreduce_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(100 + rank)  # each rank its own data
    w_true = torch.linspace(-1, 1, 16)
    start = time.perf_counter()
    for _ in range(args.steps):
        x = torch.randn(32, 16, generator=gen)
        y = (x @ w_true).unsqueeze(1) + 0.1 * torch.randn(32, 1, generator=gen)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    per_step = (time.perf_counter() - start) / args.steps
    return torch.cat([p.detach().flatten() for p in model.parameters()]), per_step


def rank_main(rank, args, port, results):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank,
                            world_size=WORLD)
    try:
        gloo_params, gloo_step = train(rank, args, None)
        with devcoord.Client(args.address, timeout_ms=30000) as client:
            with devcoord.Group(client, args.devices, args.devices[rank],
                                timeout_ms=30000) as group:
                state = devcoord.torch.HookState(group)
                dc_params, dc_step = train(rank, args, state)
        # Small results only: the parent reads the queue once every rank has ended, and a
        # pipe holds 64 KiB. Replicas are compared by digest.
        rel = ((gloo_params - dc_params).abs().max() / gloo_params.abs().max()).item()
        results.put((rank, rel, digest(gloo_params), digest(dc_params), gloo_params.numel(),
                     gloo_step, dc_step, state.calls, state.shared_calls))
    finally:
        dist.destroy_process_group()


def digest(t):
    return hashlib.sha256(t.numpy().tobytes()).hexdigest()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--address", default=os.environ.get("DEVCOORD_ADDR", "tcp://127.0.0.1:7400"))
    ap.add_argument("--devices", default="node-a/cuda:0,node-b/cuda:0",
                    help="two device references, rank 0's first")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--width", type=int, default=32, help="hidden layers' width")
    ap.add_argument("--depth", type=int, default=1, help="hidden layers")
    ap.add_argument("--bucket-mb", type=float, default=25,
                    help="DDP's bucket_cap_mb (its first bucket takes up to 1 MiB whatever "
                    "this says: only a model larger than that has several)")
    args = ap.parse_args()
    args.devices = args.devices.split(",")
    if len(args.devices) != WORLD:
        ap.error("--devices needs %d devices" % WORLD)

    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    mp.spawn(rank_main, args=(args, free_port(), results), nprocs=WORLD, join=True)
    got = sorted(results.get() for _ in range(WORLD))
    if len({(r[2], r[3]) for r in got}) != 1:  # DDP keeps every rank's replica identical
        print("ranks disagree")
        return 1
    rel = got[0][1]
    print("gloo all-reduce: %.3f ms/step" % (1000 * max(r[5] for r in got)))
    print("devcoord hook:   %.3f ms/step (%d bucket all-reduces on rank 0, %d of them in "
          "shared memory)" % (1000 * max(r[6] for r in got), got[0][7], got[0][8]))
    print("%d steps, %d parameters, max relative difference %.3g: %s"
          % (args.steps, got[0][4], rel, "agree" if rel <= 1e-5 else "DISAGREE"))
    return 0 if rel <= 1e-5 else 1


if __name__ == "__main__":
    sys.exit(main())
