#!/usr/bin/env python3
"""DistributedDataParallel's time per training step with gradients averaged by gloo (DDP's
own all-reduce), by devcoord.torch.allreduce_hook waiting for each bucket (overlap=False),
by the hook overlapping the backward pass (the default), and overlapping with its results
copied back into DDP's buckets (shared_results=False, as the hook did before its shared
block): 2 ranks, one process each, on 2 workers (TCP between them) or both on 1 worker.

Starts a coordinator and the workers from a build tree with the integration tests' harness.
The model is an MLP of `--depth` hidden layers of `--width` (4 MiB of f32 gradients a layer
at 1024), a small batch so that the gradients' exchange weighs against the computation.
The three ways run in interleaved rounds on the same cluster and the same processes; each
round's figure is the median step (after 3 warm-up steps) of the slower rank; the medians
of the rounds are printed. Needs Debian's python3-torch.

    /usr/bin/python3 bench/ddp_hook.py [--build DIR] [--workers 2] [--width 1024]
        [--depth 4] [--bucket-mb 4] [--bucket-view] [--batch 2] [--steps 20] [--rounds 5]
        [--ways gloo,waiting,overlapped,copied]

Beside each way's step time it prints the CPU both rank processes used a step (all their
threads, the median over rounds: a figure that compares builds on a noisy machine), and
the gradient bytes the ranks sent their workers on the call link (0 when every bucket went
through shared memory: a blocking call of plain memory is staged when the worker is on the
host).
"""

import argparse
import os
import statistics
import sys
import time

import benchutil

WAYS = ("gloo", "waiting", "overlapped", "copied")
LABEL = {"gloo": "gloo", "waiting": "hook, waiting", "overlapped": "hook, overlapped",
         "copied": "hook, copied back"}


def make_model(width, depth):
    import torch
    torch.manual_seed(0)
    layers = [torch.nn.Linear(256, width), torch.nn.Tanh()]
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.Tanh()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(width, 1))


def train(rank, a, state):
    """a.steps steps; the median step time (s) after 3 warm-up steps, and the parameters."""
    import torch
    from torch.nn.parallel import DistributedDataParallel
    import devcoord.torch
    model = DistributedDataParallel(make_model(a.width, a.depth), bucket_cap_mb=a.bucket_mb,
                                    gradient_as_bucket_view=a.bucket_view)
    if state is not None:
        model.register_comm_hook(state, devcoord.torch.allreduce_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(100 + rank)
    times = []
    for i in range(a.steps):
        if i == 3:
            cpu = time.process_time()
        x = torch.randn(a.batch, 256, generator=gen)
        y = torch.randn(a.batch, 1, generator=gen)
        t = time.perf_counter()
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        times.append(time.perf_counter() - t)
    cpu = (time.process_time() - cpu) / (a.steps - 3)
    return (statistics.median(times[3:]), cpu), torch.cat([p.detach().flatten()
                                                           for p in model.parameters()])


def rank_main(rank, a, devices, port, results):
    import torch
    import torch.distributed as dist
    import devcoord
    import devcoord.torch
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank,
                            world_size=2)
    steps = {w: [] for w in a.ways}
    params = {}
    try:
        with devcoord.Client(a.address, timeout_ms=60000) as c:
            with devcoord.Group(c, devices, devices[rank], timeout_ms=60000) as g:
                for _ in range(a.rounds):
                    for w in a.ways:
                        state = None if w == "gloo" else devcoord.torch.HookState(
                            g, overlap=w != "waiting", shared_results=w != "copied")
                        s, params[w] = train(rank, a, state)
                        steps[w].append(s)
    finally:
        dist.destroy_process_group()
    # Every way's last round trained the same model on the same data: the hook's parameters
    # must be gloo's, to 1e-5 relative.
    ref = params.get("gloo")
    agree = ref is None or all(
        ((p - ref).abs().max() / ref.abs().max()).item() <= 1e-5 for p in params.values())
    results.put((rank, steps, agree))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(benchutil.REPO, "build-bench"))
    ap.add_argument("--workers", type=int, choices=(1, 2), default=2)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--bucket-mb", type=float, default=4)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--bucket-view", action="store_true",
                    help="DDP's gradient_as_bucket_view: gradients live in the buckets")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--ways", default=",".join(WAYS),
                    help="which of gloo, waiting, overlapped, copied to run, comma-separated "
                    "(to profile one)")
    a = ap.parse_args()
    a.ways = [w for w in WAYS if w in a.ways.split(",")]
    harness = benchutil.use_build(a.build)
    import torch.multiprocessing as mp

    c, http = benchutil.start_cluster(harness, ["node-a", "node-b"][:a.workers],
                                      ["cuda:0", "cuda:1"], "devcoord-ddp-")
    try:
        a.address = c.addr
        devices = ["node-a/cuda:0", "node-b/cuda:0" if a.workers == 2 else "node-a/cuda:1"]
        port = harness.free_port()  # gloo's rendezvous
        results = mp.get_context("spawn").SimpleQueue()
        mp.spawn(rank_main, args=(a, devices, port, results), nprocs=2, join=True)
        got = [results.get() for _ in range(2)]
        call_link = benchutil.call_bytes(harness, http)
    finally:
        c.close()
    print("DDP, 2 ranks on %d worker%s, MLP 256-%d x%d, batch %d, buckets of %g MiB%s: step "
          "time, median of %d rounds (each the slower rank's median of %d steps)"
          % (a.workers, "s" if a.workers > 1 else "", a.width, a.depth, a.batch, a.bucket_mb,
             " (gradients as bucket views)" if a.bucket_view else "", a.rounds, a.steps - 3))
    for w in a.ways:
        per_round = [max(r[1][w][k][0] for r in got) for k in range(a.rounds)]
        cpu = statistics.median(sum(r[1][w][k][1] for r in got) for k in range(a.rounds))
        print("  %-17s %7.1f ms   (rounds: %s); CPU of both rank processes %.1f ms a step"
              % (LABEL[w], statistics.median(per_round) * 1e3,
                 " ".join("%.1f" % (x * 1e3) for x in per_round), cpu * 1e3))
    print("  gradient bytes the ranks' calls carried to their workers: %.0f a step (0 when "
          "every bucket went through shared memory)"
          % (call_link / max(1, len(a.ways) - ("gloo" in a.ways)) / a.rounds / a.steps))
    if not all(r[2] for r in got):
        print("the hook's parameters differ from gloo's")
        return 1
    if "gloo" in a.ways:
        print("  every way's parameters are gloo's (to 1e-5 relative)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
