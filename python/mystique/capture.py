"""Capture a training or inference step the way mystique's replay checks assume.

    import mystique
    mystique.capture(step, out="captures/", name="model")

`step` is a callable that runs one iteration (forward, backward and optimizer step for
training; a forward for inference). The capture:

1. warms the step up, then times it uninstrumented: each iteration's wall time and the time
   the thread waited for a CPU in it (the kernel's run delay);
2. records one iteration under the execution trace observer alone (a clean ET: what the
   replay runs);
3. profiles further iterations under the profiler alone (CPU activities, and CUDA ones when
   the step uses a GPU), after a warm-up inside the same profiling session (the profiler's
   own first-time costs are paid there): the original's time in and between ops, which
   `mystique replay --kineto --emulate-gaps` reproduces;
4. profiles one more iteration with profile_memory=True: where the original allocated and
   freed each tensor (`NAME.memory.json`, which `mystique replay --memory-profile` follows)
   and its peak memory;
5. writes `NAME.et.json`, `NAME.kineto.json`, `NAME.memory.json` and `NAME.meta.json` (the
   uninstrumented timing, CPU time and peak memory); with `reference=True` it also replays the trace on this host beside the original and
   writes `NAME.reference.json`, which `replay --emulate-gaps --reference` anchors on.

Under torch.distributed every rank writes its own files, `NAME.rankR.*`, its rank and the
world size in its meta. An error in `step` propagates unchanged; no partial file is left.
"""

import contextlib
import json
import math
import os
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

# Warm-up iterations before the uninstrumented timing.
WARMUP = 5
# Timed uninstrumented iterations.
ITERS = 20
# Profiled iterations: each is one sample of every gap; the replay takes each gap typical of
# them, so one iteration's stall does not count.
PROFILED = 10
# The profiler's warm-up inside its session, in milliseconds of iterations (at least one, at
# most 20): a fresh session's first events cost far more than later ones.
PROFILER_WARMUP_MS = 50.0


def _run_delay_ms():
    """How long this thread has waited for a CPU so far (ms): the second field of
    /proc/thread-self/schedstat (ns); None where the kernel does not say."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1]) / 1e6
    except (OSError, IndexError, ValueError):
        return None


def _rank():
    """(rank, world size) under an initialised torch.distributed, else None."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return None


def _dangling(path):
    """Whether the execution trace at `path` has a node whose parent it does not hold."""
    with open(path) as f:
        nodes = json.load(f).get("nodes", [])
    ids = {n.get("id") for n in nodes}
    for n in nodes:
        parent = n.get("ctrl_deps", n.get("parent"))
        if parent not in ids and parent not in (None, 0, n.get("id")):
            return True
    return False


def _observe(step, sync, path, ranked):
    """One `step` under the execution trace observer, written to `path`.

    On a rank, the observer is unregistered only once every collective its Gloo process
    groups have issued has finished, the end of its record included. Gloo completes a
    collective's future (what DDP waits on) before its worker thread ends the collective's
    record, and that end runs the observer's callback. An observer unregistered in between
    is freed under the worker, which then locks a freed mutex: the process aborts (in
    pthread_mutex_lock, or with SIGSEGV) now and then. Gloo's barrier waits for each
    earlier work item of its group to finish, record and all: one on the Gloo backend of each
    group this rank belongs to (_gloo_backends); the observer, stopped by then, records none
    of them."""
    from torch.profiler import ExecutionTraceObserver

    obs = ExecutionTraceObserver().register_callback(str(path))
    obs.start()
    stepped = False
    try:
        step()
        sync()
        stepped = True
    finally:
        obs.stop()
        # Not after a failed step: the other ranks may never reach their barriers.
        if ranked and stepped:
            for gloo in _gloo_backends():
                gloo.barrier().wait()
        obs.unregister_callback()


def _gloo_backends():
    """The Gloo backends of the process groups this rank belongs to, in the order the groups
    were made: the same order on every rank (groups are made by all ranks alike), so that the
    barriers of ranks that share several groups pair up. The default group's alone where
    torch's registry of groups is not where torch 2.11 keeps it.

    A group's collectives on a device run on that device's backend: Gloo for a "gloo" group
    (CPU and CUDA tensors alike), and for CPU tensors in a group of several backends
    (`init_process_group()` without one makes "cpu:gloo,cuda:nccl") whether or not a GPU is
    in use. Its barrier is taken on each Gloo backend directly: the group's own barrier would
    run on NCCL where a GPU is present, and not wait for Gloo's work. Under
    TORCH_DISTRIBUTED_DEBUG=DETAIL each backend is wrapped (`_ProcessGroupWrapper`): the
    barrier is taken on the Gloo backend inside. A group without a Gloo backend (NCCL alone)
    has none to wait for."""
    import torch.distributed as dist

    try:
        groups = list(dist.distributed_c10d._world.pg_map)
    except AttributeError:
        groups = [dist.group.WORLD]
    gloo_type = getattr(dist, "ProcessGroupGloo", None)
    wrapper_type = getattr(dist.distributed_c10d, "_ProcessGroupWrapper", None)
    if gloo_type is None:
        return []
    backends, seen = [], set()
    for g in groups:
        try:
            devices = list(g._device_types)
        except AttributeError:
            continue
        for device in devices:
            try:
                backend = g._get_backend(device)
            except RuntimeError:
                continue
            while wrapper_type is not None and isinstance(backend, wrapper_type):
                backend = backend.wrapped_pg
            if isinstance(backend, gloo_type) and id(backend) not in seen:
                seen.add(id(backend))
                backends.append(backend)
    return backends


@contextlib.contextmanager
def _quiet_profiler():
    """torch.profiler's sessions here without its warning that "Profiler clears events at the
    end of each cycle": each session is one cycle, whose events are what it exports. (Its
    `acc_events=True` also silences it, at the cost of turning every event into a Python
    object as the session stops.)"""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Warning: Profiler clears events")
        yield


def _agree_max(value):
    """The largest `value` over the ranks of the default process group."""
    import torch
    import torch.distributed as dist

    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    t = torch.tensor([int(value)], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def capture(step, out="captures/", name="model", *, warmup=WARMUP, iters=ITERS,
            profiled=PROFILED, reference=False):
    """Captures `step` (a callable running one iteration) into `out`; returns the paths
    written, by kind (`et`, `kineto`, `meta`, and `reference` when asked for)."""
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    if not callable(step):
        raise TypeError("mystique.capture: `step` must be a callable that runs one iteration")
    if iters < 1 or profiled < 1 or warmup < 1:
        # At least one warm-up step: whether the step uses CUDA shows once it has run.
        raise ValueError("mystique.capture: warmup, iters and profiled must be at least 1")
    if not name or os.sep in name:
        raise ValueError(f"mystique.capture: name {name!r} must be a plain file name")
    if torch.autograd._profiler_enabled():
        # Its instrumentation would be in the "uninstrumented" timing, and the capture's own
        # profiles would stop the user's profiler under it.
        raise RuntimeError("mystique.capture: a torch.profiler session is already running: "
                           "call capture outside it")
    ranked = _rank()
    if reference and ranked is not None and ranked[1] > 1:
        raise ValueError(
            "mystique.capture: reference=True replays the trace alone, which a rank of a "
            "distributed job cannot (its collectives need the other ranks)"
        )
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    base = name if ranked is None else f"{name}.rank{ranked[0]}"
    kinds = ["et", "kineto", "memory", "meta"] + (["reference"] if reference else [])
    # An earlier capture's files of the name, all of them, are set aside and replaced: a
    # reference it made describes its trace, not this one, and is removed when none is made.
    every = ["et", "kineto", "memory", "meta", "reference"]
    final = {k: out / f"{base}.{k}.json" for k in every}
    partial = {k: out / f".{base}.{k}.json.partial-{os.getpid()}" for k in kinds}
    kept = {k: out / f".{base}.{k}.json.previous-{os.getpid()}" for k in every}

    placed = []

    def sync():
        if uses_cuda:
            torch.cuda.synchronize()

    try:
        for _ in range(warmup):
            step()
        uses_cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        sync()
        times, waited0, cpu0 = [], _run_delay_ms(), time.process_time()
        for _ in range(iters):
            t = time.perf_counter()
            step()
            sync()
            times.append((time.perf_counter() - t) * 1e3)
        cpu_ms = (time.process_time() - cpu0) * 1e3 / iters
        waited1 = _run_delay_ms()
        wait_ms = None
        if waited0 is not None and waited1 is not None:
            wait_ms = min(max(waited1 - waited0, 0.0) / iters, statistics.median(times) * 0.99)

        # The observer now and then writes a node whose parent it never wrote (seen under DDP:
        # the ops of one iteration under a parent missing from the file; around activation
        # checkpointing, autograd's backward nodes), which mystique reads with those ops at top
        # level: such an iteration is recorded again, in case the next one is whole (every rank
        # again, if any rank's was).
        for attempt in range(3):
            _observe(step, sync, partial["et"], ranked is not None)
            broken = _dangling(partial["et"])
            if ranked is not None:
                broken = bool(_agree_max(int(broken)))
            if not broken:
                break
            if attempt == 2:
                sys.stderr.write(f"mystique.capture: the execution trace names parents it does "
                                 f"not hold, after 3 tries: {final['et']} is read with their "
                                 f"children as top-level ops\n")

        median = statistics.median(times)
        prof_warmup = min(20, max(1, math.ceil(PROFILER_WARMUP_MS / max(median, 1e-3))))
        if ranked is not None:
            # Every rank must run as many steps as the others (their collectives pair up): the
            # largest warm-up any rank asks for.
            prof_warmup = _agree_max(prof_warmup)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if uses_cuda else [])
        # One cycle (no empty one started after it), without torch's warning that cycles
        # clear their events (_quiet_profiler).
        with _quiet_profiler(), profile(
                activities=activities, record_shapes=True,
                schedule=schedule(wait=0, warmup=prof_warmup, active=profiled, repeat=1),
                on_trace_ready=lambda p: p.export_chrome_trace(str(partial["kineto"]))) as prof:
            for _ in range(prof_warmup + profiled):
                step()
                sync()
                prof.step()

        peak_over_start = _peak_over_start(step, sync, uses_cuda, partial["memory"])
        meta = dict(
            model=name, torch=torch.__version__, threads=torch.get_num_threads(),
            device="cuda" if uses_cuda else "cpu", iters=iters,
            iter_ms_median=median, iter_ms_min=min(times), iter_ms_max=max(times),
            cpu_ms=cpu_ms, wait_ms=wait_ms, profiled_iterations=profiled,
            profiler_warmup=prof_warmup, peak_over_start_bytes=peak_over_start,
            captured_by="mystique.capture",
        )
        if ranked is not None:
            meta.update(rank=ranked[0], world=ranked[1])
        partial["meta"].write_text(json.dumps(meta, indent=1) + "\n")
        # The capture's files in place (an earlier capture of the name kept aside until this
        # one is complete), then the reference of the trace under its own name.
        for k in every:
            if final[k].exists():
                os.replace(final[k], kept[k])
        for k in ("et", "kineto", "memory", "meta"):
            os.replace(partial[k], final[k])
            placed.append(final[k])
        if reference:
            _reference(final["et"], partial["reference"], median, wait_ms,
                       torch.get_num_threads(), uses_cuda)
            os.replace(partial["reference"], final["reference"])
    except BaseException:
        for p in list(partial.values()) + placed:
            try:
                p.unlink()
            except FileNotFoundError:
                pass
        for k in every:
            if kept[k].exists():
                os.replace(kept[k], final[k])
        raise
    for k in every:
        try:
            kept[k].unlink()
        except FileNotFoundError:
            pass
    return {k: str(final[k]) for k in kinds}


def _peak_over_start(step, sync, cuda, path):
    """One more step under torch.profiler(profile_memory=True), its profile written to `path`
    (where the original allocated and freed each tensor: `mystique replay --memory-profile`
    frees each tensor there), and its memory: what it allocated and held at once, at most
    (bytes). On the CPU from the profile's events (Total Allocated at its peak over what was
    held before the step's first allocation); on a GPU the caching allocator's peak allocated
    over its start. It runs on its own, so the timing profile is not slowed."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        start = torch.cuda.memory_allocated()
    with _quiet_profiler(), profile(activities=activities, profile_memory=True,
                                    on_trace_ready=lambda p: p.export_chrome_trace(str(path))):
        step()
        sync()
    if cuda:
        return torch.cuda.max_memory_allocated() - start
    with open(path) as f:
        events = json.load(f).get("traceEvents", [])
    mems = [e["args"] for e in events if e.get("name") == "[memory]" and "args" in e
            and e["args"].get("Device Type", 0) == 0]
    if not mems:
        return 0
    start = mems[0].get("Total Allocated", 0) - mems[0].get("Bytes", 0)
    return max(m.get("Total Allocated", 0) for m in mems) - start


def _reference(et, out, original_ms, wait_ms, threads, cuda):
    """Replays `et` plainly on this host, right after the original was timed, and writes the
    reference (`replay --reference-out`): the pair's ratio here."""
    cmd = [sys.executable, "-m", "mystique", "replay", str(et), "--reference-out", str(out),
           "--original-ms", repr(original_ms), "--threads", str(threads)]
    if wait_ms is not None:
        cmd += ["--original-wait-ms", repr(wait_ms)]
    if cuda:
        cmd += ["--device", "cuda"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    # Exit 3: some ops failed; the reference (of the ops that ran) is written all the same.
    if done.returncode == 3:
        sys.stderr.write("mystique.capture: some ops failed in the reference replay: "
                         f"{done.stderr.strip()[-500:]}\n")
    elif done.returncode != 0:
        raise RuntimeError(
            f"mystique.capture: the reference replay failed (exit {done.returncode}): "
            f"{done.stderr.strip()[-2000:]}"
        )
