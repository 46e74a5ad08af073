#!/usr/bin/env python3
"""Capture a tensor-parallel-like step on CPU: every layer makes an fp16 activation and
all-reduces it over gloo, as Megatron's row-parallel layers do.

Usage: tp_allreduce.py OUTDIR WORLD LAYERS MIB
Writes OUTDIR/tp_w<WORLD>_rank<R>.et.json (one execution trace per rank, one iteration).
A comm-only replay of such a trace needs one activation's bytes at a time; holding every
collective's tensor at once needs LAYERS x MIB per rank.
"""
import os, sys
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.profiler import ExecutionTraceObserver


def worker(rank, world, out, layers, mib, port):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    n = mib * (1 << 20) // 2
    w = torch.full((n,), 0.5, dtype=torch.float16)

    def step():
        x = torch.ones(n, dtype=torch.float16)
        for _ in range(layers):
            y = x.mul(w)  # the layer's partial output
            dist.all_reduce(y)  # summed over the tensor-parallel group
            x = y
        return x

    step()
    obs = ExecutionTraceObserver().register_callback(os.path.join(out, f"tp_w{world}_rank{rank}.et.json"))
    obs.start()
    step()
    obs.stop()
    obs.unregister_callback()
    dist.destroy_process_group()


if __name__ == "__main__":
    out = sys.argv[1]
    world, layers, mib = (int(a) for a in sys.argv[2:5])
    os.makedirs(out, exist_ok=True)
    mp.spawn(worker, args=(world, out, layers, mib, 29500 + os.getpid() % 1000), nprocs=world)
