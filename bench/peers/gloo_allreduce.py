#!/usr/bin/python3
"""The torch.distributed (gloo) peer of bench_allreduce.

Runs WORLD processes on 127.0.0.1 (init_method tcp://127.0.0.1:PORT), one CPU thread each,
and times dist.all_reduce(SUM) of an f32 tensor of every size the same way bench_allreduce
times devcoord: warmup, then a number of repeats chosen from the warmup so each size takes
about BUDGET seconds (clamped to MIN..MAX repeats), each op timed on its own on rank 0;
the median is reported. Writes one line per size to --out: "bytes median_s reps min_s max_s".

    /usr/bin/python3 gloo_allreduce.py --world 2 --sizes 4096,16384 --out FILE
"""

import argparse
import datetime
import multiprocessing
import os
import signal
import socket
import statistics
import sys
import time


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_main(rank, world, port, sizes, budget, min_reps, max_reps, out):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=300))
    lines = []
    for size in sizes:
        t = torch.full((size // 4,), 1e-3, dtype=torch.float32)
        warm = []
        for _ in range(1 if size >= (16 << 20) else 2):
            t0 = time.perf_counter()
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
            warm.append(time.perf_counter() - t0)
        # Rank 0 decides the repeat count so every rank runs the same number of ops.
        reps = torch.tensor([max(min_reps, min(max_reps, int(budget / max(min(warm), 1e-6))))])
        dist.broadcast(reps, 0)
        times = []
        for _ in range(int(reps.item())):
            t0 = time.perf_counter()
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
            times.append(time.perf_counter() - t0)
        lines.append("%d %.9f %d %.9f %.9f\n" % (size, statistics.median(times), len(times),
                                                  min(times), max(times)))
        del t
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        with open(out, "w") as f:
            f.writelines(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--sizes", required=True, help="comma-separated byte counts")
    ap.add_argument("--budget", type=float, default=2.0, help="seconds per size (about)")
    ap.add_argument("--min-reps", type=int, default=5)
    ap.add_argument("--max-reps", type=int, default=50)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    sizes = [int(s) for s in a.sizes.split(",") if s]
    port = free_port()
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=rank_main,
                         args=(r, a.world, port, sizes, a.budget, a.min_reps, a.max_reps, a.out))
             for r in range(a.world)]

    def stop(signum, frame):
        for p in procs:
            if p.is_alive():
                p.kill()
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    for p in procs:
        p.start()
    rc = 0
    for p in procs:
        p.join()
        rc = rc or p.exitcode
    return 1 if rc else 0


if __name__ == "__main__":
    sys.exit(main())
