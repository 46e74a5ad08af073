#!/usr/bin/env python3
"""Capture a data-parallel training step that also issues every collective kind Gloo runs, on
WORLD ranks over loopback: per rank an execution trace of one step and a Kineto trace of the
next one, profiled with the observer attached (a linked pair: the replay's --paced-by-trace
reads when each collective was issued from it).

Usage: every_collective.py OUTDIR [WORLD]
Writes OUTDIR/every_w<WORLD>.rank<R>.et.json.gz (the ET linked to the profile) and
.kineto.json.gz.
"""
import gzip, os, shutil, sys
import torch, torch.nn as nn, torch.nn.functional as F
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import ExecutionTraceObserver, profile, ProfilerActivity


def worker(rank, world, out, port):
    torch.manual_seed(rank)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    m = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    ddp = DDP(m, bucket_cap_mb=0.01)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    x, y = torch.randn(16, 64), torch.randint(0, 10, (16,))
    # An all-to-all with uneven splits: rank r sends r + k + 1 rows of 8 to rank k.
    send_rows = [rank + k + 1 for k in range(world)]
    recv_rows = [k + rank + 1 for k in range(world)]

    def step():
        opt.zero_grad()
        F.cross_entropy(ddp(x), y).backward()
        opt.step()
        t = torch.ones(4096)
        dist.all_reduce(t)
        dist.broadcast(t, 1 % world)
        dist.reduce(t, 0)
        g = [torch.zeros(256) for _ in range(world)]
        dist.all_gather(g, torch.ones(256) * rank)
        flat = torch.zeros(256 * world)
        dist.all_gather_into_tensor(flat, torch.ones(256))
        a = torch.ones(sum(send_rows), 8)
        b = torch.zeros(sum(recv_rows), 8)
        dist.all_to_all_single(b, a, recv_rows, send_rows)
        even = torch.ones(world * 32)
        dist.all_to_all_single(torch.zeros(world * 32), even)
        dist.gather(torch.ones(128), [torch.zeros(128) for _ in range(world)] if rank == 0 else None, dst=0)
        dist.scatter(torch.zeros(128), [torch.ones(128) for _ in range(world)] if rank == 0 else None, src=0)
        nxt, prv = (rank + 1) % world, (rank - 1) % world
        reqs = [dist.isend(torch.ones(512), nxt), dist.irecv(torch.zeros(512), prv)]
        for r in reqs:
            r.wait()
        w = dist.all_reduce(torch.ones(1024), async_op=True)
        w.wait()
        dist.barrier()

    for _ in range(3):
        step()
    base = os.path.join(out, f"every_w{world}.rank{rank}")
    obs = ExecutionTraceObserver().register_callback(base + ".et.json")
    obs.start(); step(); obs.stop(); obs.unregister_callback()
    obs2 = ExecutionTraceObserver().register_callback(base + ".linked.et.json")
    with profile(activities=[ProfilerActivity.CPU], execution_trace_observer=obs2,
                 on_trace_ready=lambda p: p.export_chrome_trace(base + ".kineto.json")):
        step()
    dist.destroy_process_group()
    # The linked pair is what the paced replay reads: it is kept, under the plain name.
    os.remove(base + ".et.json")
    for src, dst in ((".linked.et.json", ".et.json.gz"), (".kineto.json", ".kineto.json.gz")):
        with open(base + src, "rb") as f, gzip.open(base + dst, "wb", 9) as g:
            shutil.copyfileobj(f, g)
        os.remove(base + src)


if __name__ == "__main__":
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    world = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    mp.spawn(worker, args=(world, out, 29500 + os.getpid() % 1000), nprocs=world)
