#!/usr/bin/env python3
"""Capture a small training step (an MLP with Adam, CPU, one thread) as a linked pair whose
profile also recorded memory, as people capture who want the memory view: the execution trace
observer attached to torch.profiler(profile_memory=True, record_shapes=True), one profiled
step after a profiler warm-up step. Also the step's uninstrumented time in a meta file.

Usage: memory_pair.py OUTDIR
Writes OUTDIR/mlp_mem.et.json.gz, .kineto.json.gz and .meta.json.
"""
import gzip, json, os, shutil, statistics, sys, time
import torch, torch.nn as nn, torch.nn.functional as F
from torch.profiler import ExecutionTraceObserver, profile, ProfilerActivity, schedule

torch.manual_seed(0)
torch.set_num_threads(1)
m = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
opt = torch.optim.Adam(m.parameters(), lr=1e-3)
x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))


def step():
    opt.zero_grad(set_to_none=True)
    F.cross_entropy(m(x), y).backward()
    opt.step()


out = sys.argv[1]
os.makedirs(out, exist_ok=True)
base = os.path.join(out, "mlp_mem")
for _ in range(5):
    step()
times = []
for _ in range(30):
    t = time.perf_counter()
    step()
    times.append((time.perf_counter() - t) * 1e3)
obs = ExecutionTraceObserver().register_callback(base + ".et.json")
with profile(activities=[ProfilerActivity.CPU], record_shapes=True, profile_memory=True,
             execution_trace_observer=obs, schedule=schedule(wait=0, warmup=1, active=1),
             on_trace_ready=lambda p: p.export_chrome_trace(base + ".kineto.json")) as p:
    for _ in range(2):
        step()
        p.step()
with open(base + ".meta.json", "w") as f:
    json.dump(dict(model="mlp_mem", torch=torch.__version__, threads=1, iters=len(times),
                   iter_ms_median=statistics.median(times)), f, indent=1)
for ext in (".et.json", ".kineto.json"):
    with open(base + ext, "rb") as a, gzip.open(base + ext + ".gz", "wb", 9) as b:
        shutil.copyfileobj(a, b)
    os.remove(base + ext)
