#!/usr/bin/env python3
"""Generates the bundled captures of a small MLP training step (SGD) on CPU with 1 thread:

- steps.linked.et.json.gz + steps.kineto.json.gz: profiled for 4 iterations after one warm-up
  step (torch.profiler's schedule, the execution trace observer attached). The ET holds
  ProfilerStep#1..4 and the Kineto trace their events, linked by record function id.
- steps.et.json.gz + steps.timing.json.gz, in the same process: one iteration under the
  execution trace observer alone (a clean ET, no ProfilerStep), then 4 profiled iterations
  after a warm-up step under the profiler alone (record_shapes): its events carry record
  function id 0, so the two link by order, one ProfilerStep#N at a time.

Used by et-graph's tests of `typical_timing` and `link_steps`.

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


def profiled(path, obs):
    with profile(activities=[ProfilerActivity.CPU], execution_trace_observer=obs, record_shapes=True,
                 schedule=schedule(wait=0, warmup=1, active=4),
                 on_trace_ready=lambda p: p.export_chrome_trace(path)) as p:
        for _ in range(5):
            step()
            p.step()


for _ in range(5):
    step()
with tempfile.TemporaryDirectory() as d:
    et, kineto = os.path.join(d, "et.json"), os.path.join(d, "kineto.json")
    clean, timing = os.path.join(d, "clean.json"), os.path.join(d, "timing.json")
    profiled(kineto, ExecutionTraceObserver().register_callback(et))
    obs = ExecutionTraceObserver().register_callback(clean)
    obs.start(); step(); obs.stop(); obs.unregister_callback()
    profiled(timing, None)
    for src, name in [(et, "steps.linked.et.json.gz"), (kineto, "steps.kineto.json.gz"),
                      (clean, "steps.et.json.gz"), (timing, "steps.timing.json.gz")]:
        with open(src, "rb") as f, gzip.open(os.path.join(out, name), "wb", 9) as g:
            shutil.copyfileobj(f, g)
