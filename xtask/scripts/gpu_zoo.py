"""A few models captured on a CUDA GPU, as a user captures one: for `cargo xtask gpu-check`.

    python3 gpu_zoo.py OUT [NAME ...]

For each model: warm-up, the uninstrumented iteration timed (each iteration synchronised, as a
training loop that reads its loss does) with the process's CPU time, one more iteration for its
peak memory (the caching allocator's peak over the iteration's start, after
reset_peak_memory_stats), then one iteration under ExecutionTraceObserver alone
(OUT/NAME.et.json) and, after a warm-up step inside the profiling session, one under the
observer and the profiler, CPU and CUDA activities (OUT/NAME.linked.et.json,
OUT/NAME.kineto.json). Writes OUT/NAME.meta.json (iter_ms_median,
cpu_ms, peak_over_start_bytes: what `mystique compare` sets beside the replay's figures) and
prints it as one JSON line per model; a model that fails is reported on stderr, the others
still run, and the exit status is 1. None of these
models is used to tune anything: gpu-check reports the replay's ratio to them as measured.
"""
import json
import os
import statistics
import sys
import time
import traceback

import torch
import torch.nn as nn
from torch.profiler import ExecutionTraceObserver, ProfilerActivity, profile, schedule

# `GPU_ZOO_DEVICE=cpu` runs the same captures on the CPU (to check the script without a GPU).
DEV = os.environ.get("GPU_ZOO_DEVICE", "cuda")


def sync():
    if DEV.startswith("cuda"):
        torch.cuda.synchronize()


def train_step(model, opt, make_batch, loss_fn, autocast=None):
    x, y = make_batch()

    def step():
        opt.zero_grad(set_to_none=True)
        if autocast is not None:
            with torch.autocast(DEV.split(":")[0], dtype=autocast):
                loss = loss_fn(model(x), y)
        else:
            loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()

    return step


def mlp_adam():
    torch.manual_seed(0)
    m = nn.Sequential(*[nn.Sequential(nn.Linear(1024, 1024), nn.ReLU()) for _ in range(4)],
                      nn.Linear(1024, 10)).to(DEV)
    opt = torch.optim.Adam(m.parameters(), lr=1e-3, foreach=True)
    return train_step(m, opt, lambda: (torch.randn(256, 1024, device=DEV),
                                       torch.randint(0, 10, (256,), device=DEV)),
                      nn.functional.cross_entropy)


def transformer_bf16():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(512, 8, 2048, batch_first=True, dropout=0.0)
    m = nn.Sequential(nn.TransformerEncoder(layer, 4, enable_nested_tensor=False),
                      nn.Flatten(1), nn.LazyLinear(10)).to(DEV)
    m(torch.randn(16, 128, 512, device=DEV))
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4, fused=True)
    return train_step(m, opt, lambda: (torch.randn(16, 128, 512, device=DEV),
                                       torch.randint(0, 10, (16,), device=DEV)),
                      nn.functional.cross_entropy, autocast=torch.bfloat16)


def cnn_sgd():
    torch.manual_seed(0)

    def block(i, o):
        return nn.Sequential(nn.Conv2d(i, o, 3, padding=1, bias=False), nn.BatchNorm2d(o), nn.ReLU())

    m = nn.Sequential(block(3, 32), block(32, 64), nn.MaxPool2d(2), block(64, 128), block(128, 128),
                      nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 100)).to(DEV)
    opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
    return train_step(m, opt, lambda: (torch.randn(64, 3, 64, 64, device=DEV),
                                       torch.randint(0, 100, (64,), device=DEV)),
                      nn.functional.cross_entropy)


def tiny_ops_infer():
    """Launch-bound: many small kernels, the host's time per op is the iteration."""
    torch.manual_seed(0)
    ws = [torch.randn(64, 64, device=DEV) for _ in range(8)]
    x = torch.randn(32, 64, device=DEV)

    @torch.no_grad()
    def step():
        h = x
        for w in ws:
            h = torch.tanh(h @ w) * 0.5 + h.sigmoid()
            h = h - h.mean(dim=1, keepdim=True)
        return h.sum()

    return step


MODELS = {
    "mlp_adam": mlp_adam,
    "transformer_bf16": transformer_bf16,
    "cnn_sgd": cnn_sgd,
    "tiny_ops_infer": tiny_ops_infer,
}


def capture(out, name, iters=50):
    step = MODELS[name]()
    for _ in range(10):
        step()
    sync()
    times = []
    cpu0 = time.process_time()
    for _ in range(iters):
        t = time.perf_counter()
        step()
        sync()
        times.append((time.perf_counter() - t) * 1e3)
    cpu_ms = (time.process_time() - cpu0) * 1e3 / iters
    peak = None
    if DEV.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
        start = torch.cuda.memory_allocated()
        step()
        sync()
        peak = torch.cuda.max_memory_allocated() - start
    obs = ExecutionTraceObserver().register_callback(os.path.join(out, f"{name}.et.json"))
    obs.start()
    try:
        step()
        sync()
    finally:
        # Unregistered whatever happens: a registered observer would swallow the next
        # model's trace (the observer is one per process).
        obs.stop()
        obs.unregister_callback()
    kineto = os.path.join(out, f"{name}.kineto.json")
    obs2 = ExecutionTraceObserver().register_callback(os.path.join(out, f"{name}.linked.et.json"))
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if DEV.startswith("cuda") else [])
    # One profiled step after a warm-up step inside the session (the schedule PyTorch's docs
    # recommend): the first step under the profiler (and CUPTI) pays one-time costs that would
    # land in the original's op times and gaps. The ET holds the profiled step alone.
    with profile(activities=activities,
                 execution_trace_observer=obs2, record_shapes=True,
                 schedule=schedule(wait=0, warmup=1, active=1, repeat=1),
                 on_trace_ready=lambda p: p.export_chrome_trace(kineto)) as prof:
        for _ in range(2):
            step()
            sync()
            prof.step()
    meta = dict(model=name, torch=torch.__version__, device=DEV,
                gpu=torch.cuda.get_device_name() if DEV.startswith("cuda") else None, iters=iters,
                iter_ms_median=statistics.median(times), iter_ms_min=min(times), cpu_ms=cpu_ms,
                peak_over_start_bytes=peak)
    with open(os.path.join(out, f"{name}.meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print(json.dumps(meta), flush=True)


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    failed = []
    for name in sys.argv[2:] or list(MODELS):
        # One model's failure is reported and the others still run: gpu-check prints each
        # captured model's card and names what failed from stderr's last lines.
        try:
            capture(out, name)
        except Exception as e:
            failed.append(f"gpu_zoo.py: {name} failed: {type(e).__name__}: {e}")
            sys.stderr.write(f"gpu_zoo.py: {name} failed:\n{traceback.format_exc()}")
            sys.stderr.flush()
    # Last, one line each: what gpu-check keeps of stderr names every model that failed.
    for line in failed:
        sys.stderr.write(line.splitlines()[0][:300] + "\n")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
