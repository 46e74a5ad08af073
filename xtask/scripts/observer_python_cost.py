#!/usr/bin/env python3
"""How much slower a program's own Python runs between ops under the execution trace observer.

The gap model takes the instrumentation's cost out of a profile's gaps by replaying the ops
under it (docs/gap-model.md). What it cannot replay is the original's Python: the observer's
callbacks, which run on either side of every op, leave the caches and branch predictors cold
for the Python that follows, and that Python runs slower than it does uninstrumented. This
script measures that on the host it runs on, where no replay can: a step of 20 ops (linear
and ReLU on 64x64), after each op a piece of Python timed alone with `perf_counter_ns`, run
plain, under torch.profiler, and under torch.profiler with the observer attached (a linked
capture's instrumentation), in alternating order over ROUNDS rounds; each figure is the median
over the rounds of each run's median piece.

  observer_python_cost.py [ROUNDS]     one JSON line per piece of Python: its time per mode
                                       (µs) and the observer's and the profiler's extra

Pieces: `modules N`, a call through N nested identity modules (nn.Module's call path, no op);
`loop N`, a Python loop of N dictionary lookups. Single-threaded.
"""
import json, os, statistics, sys, tempfile, time
import torch
from torch.profiler import ExecutionTraceObserver, profile, ProfilerActivity, schedule

torch.set_num_threads(1)
OPS = 20
ITERS = 30
X, LINEAR = torch.randn(64, 64), torch.nn.Linear(64, 64)
TABLE = {i: str(i) for i in range(2000)}


def loop(n):
    def piece(_):
        s = 0
        for i in range(n):
            s += len(TABLE[i % 2000])
        return s
    return piece


def modules(n):
    seq = torch.nn.Sequential(*[torch.nn.Identity() for _ in range(n)])
    return seq


def step_of(piece, samples):
    def step():
        y, times = X, []
        for k in range(OPS):
            y = LINEAR(y) if k % 2 else torch.relu(y)
            t = time.perf_counter_ns()
            piece(y)
            times.append(time.perf_counter_ns() - t)
        samples.append(statistics.median(times) / 1e3)
    return step


def run(step, samples, mode, et_path):
    samples.clear()
    if mode == "plain":
        for _ in range(ITERS):
            step()
        return statistics.median(samples)
    obs = ExecutionTraceObserver().register_callback(et_path) if mode == "observer" else None
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, execution_trace_observer=obs,
                 schedule=schedule(wait=0, warmup=1, active=ITERS)) as p:
        for _ in range(ITERS + 1):
            step()
            p.step()
    if obs is not None:
        obs.unregister_callback()
    return statistics.median(samples[1:])


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    modes = ("plain", "profiler", "observer")
    with tempfile.TemporaryDirectory() as d:
        et_path = os.path.join(d, "observer.et.json")
        for name, piece in (("modules 1", modules(1)), ("modules 8", modules(8)),
                            ("loop 10", loop(10)), ("loop 100", loop(100))):
            samples = []
            step = step_of(piece, samples)
            for _ in range(5):
                step()
            got = {m: [] for m in modes}
            for r in range(rounds):
                for m in (modes if r % 2 else modes[::-1]):
                    got[m].append(run(step, samples, m, et_path))
            us = {m: statistics.median(v) for m, v in got.items()}
            print(json.dumps(dict(piece=name, us={m: round(v, 3) for m, v in us.items()},
                                  observer_extra_us=round(us["observer"] - us["plain"], 3),
                                  profiler_extra_us=round(us["profiler"] - us["plain"], 3))),
                  flush=True)


if __name__ == "__main__":
    main()
