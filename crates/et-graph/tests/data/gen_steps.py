#!/usr/bin/env python3
"""Generates steps.linked.et.json.gz + steps.kineto.json.gz: a small MLP training step (SGD)
profiled for 4 iterations after one warm-up step (torch.profiler's schedule, the execution trace
observer attached), on CPU with 1 thread. The ET holds ProfilerStep#1..4 and the Kineto trace
their events, linked by record function id. Used by et-graph's tests of `typical_timing`.

    python3 gen_steps.py OUTDIR      (PYTHONPATH at a torch 2.11 install, e.g. `cargo xtask setup`'s)
"""
import gzip, os, shutil, sys, tempfile
import torch, torch.nn as nn
from torch.profiler import ExecutionTraceObserver, ProfilerActivity, profile, schedule

torch.set_num_threads(1)
torch.manual_seed(0)
out = sys.argv[1]
m = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
opt = torch.optim.SGD(m.parameters(), lr=0.01)
x = torch.randn(8, 16)


def step():
    opt.zero_grad()
    m(x).pow(2).mean().backward()
    opt.step()


for _ in range(5):
    step()
with tempfile.TemporaryDirectory() as d:
    et, kineto = os.path.join(d, "et.json"), os.path.join(d, "kineto.json")
    obs = ExecutionTraceObserver().register_callback(et)
    with profile(activities=[ProfilerActivity.CPU], execution_trace_observer=obs, record_shapes=True,
                 schedule=schedule(wait=0, warmup=1, active=4),
                 on_trace_ready=lambda p: p.export_chrome_trace(kineto)) as p:
        for _ in range(5):
            step()
            p.step()
    for src, name in [(et, "steps.linked.et.json.gz"), (kineto, "steps.kineto.json.gz")]:
        with open(src, "rb") as f, gzip.open(os.path.join(out, name), "wb", 9) as g:
            shutil.copyfileobj(f, g)
