#!/usr/bin/env python3
"""Capture a small step (CPU, one thread) as a linked pair whose profile also recorded memory,
as people capture who want the memory view: the execution trace observer attached to
torch.profiler(profile_memory=True, record_shapes=True), one profiled step after a profiler
warm-up step. Also the step's uninstrumented time in a meta file.

Usage: memory_pair.py OUTDIR [mlp_mem | loop_mem]
  mlp_mem   an MLP's training step with Adam (the default)
  loop_mem  `h = tanh(h @ w)` in a Python loop, inference: each step holds the old `h` and
            the product beside the new `h`, which a free at last use would not
Writes OUTDIR/NAME.et.json.gz, .kineto.json.gz and .meta.json.
"""
import gzip, json, os, shutil, statistics, sys, time
import torch, torch.nn as nn, torch.nn.functional as F
from torch.profiler import ExecutionTraceObserver, profile, ProfilerActivity, schedule

torch.manual_seed(0)
torch.set_num_threads(1)
name = sys.argv[2] if len(sys.argv) > 2 else "mlp_mem"
if name == "mlp_mem":
    m = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))

    def step():
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(m(x), y).backward()
        opt.step()
elif name == "loop_mem":
    ws = [torch.randn(256, 256) / 16 for _ in range(6)]
    x = torch.randn(128, 256)

    @torch.no_grad()
    def step():
        h = x
        for w in ws:
            h = torch.tanh(h @ w)
        return h.sum()
else:
    sys.exit(__doc__)


out = sys.argv[1]
os.makedirs(out, exist_ok=True)
base = os.path.join(out, name)
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
    json.dump(dict(model=name, torch=torch.__version__, threads=1, iters=len(times),
                   iter_ms_median=statistics.median(times)), f, indent=1)
for ext in (".et.json", ".kineto.json"):
    with open(base + ext, "rb") as a, gzip.open(base + ext + ".gz", "wb", 9) as b:
        shutil.copyfileobj(a, b)
    os.remove(base + ext)
