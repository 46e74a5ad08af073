#!/usr/bin/env python3
"""Collectives on loopback with torch.distributed (gloo), the baseline of `cargo xtask bench comms`.

Usage: comms_bench.py OUTDIR WORLD SIZE_BYTES ITERS
Each rank times ITERS rounds of all_reduce, broadcast, all_gather and all_to_all_single of
SIZE_BYTES float32 per rank, issued back to back as the replay issues them (median per op, in
us, printed by rank 0 as one JSON line), then
records one round under the ExecutionTraceObserver to OUTDIR/rank<R>.et.json for the replay.
"""
import json, os, statistics, sys, time
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.profiler import ExecutionTraceObserver


def ops(world, n):
    x = torch.ones(n)
    g = [torch.zeros(n) for _ in range(world)]
    a_in, a_out = torch.ones(n * world), torch.zeros(n * world)
    return [
        ("all_reduce", lambda: dist.all_reduce(x)),
        ("broadcast", lambda: dist.broadcast(x, 0)),
        ("all_gather", lambda: dist.all_gather(g, x)),
        ("all_to_all", lambda: dist.all_to_all_single(a_out, a_in)),
    ]


def worker(rank, world, out, size, iters, port):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    n = max(1, size // 4)
    todo = ops(world, n)
    # As the replay issues them: the four back to back, each timed, no barrier between.
    for _ in range(3):
        for _, f in todo:
            f()
    ts = {name: [] for name, _ in todo}
    for _ in range(iters):
        for name, f in todo:
            t0 = time.perf_counter()
            f()
            ts[name].append((time.perf_counter() - t0) * 1e6)
    res = {name: statistics.median(v) for name, v in ts.items()}
    obs = ExecutionTraceObserver().register_callback(os.path.join(out, f"rank{rank}.et.json"))
    obs.start()
    for _, f in todo:
        f()
    obs.stop()
    obs.unregister_callback()
    if rank == 0:
        print(json.dumps({"bytes": n * 4, "us": res}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    out, world, size, iters = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    os.makedirs(out, exist_ok=True)
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    mp.spawn(worker, args=(world, out, size, iters, port), nprocs=world)
