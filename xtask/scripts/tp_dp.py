#!/usr/bin/env python3
"""Capture a training step of a tensor- x data-parallel MLP block on WORLD ranks over loopback
(Gloo, CPU): a 2-D device mesh ("dp", "tp") of WORLD/TP x TP ranks, TP ranks adjacent.

Each rank holds one column-parallel and one row-parallel shard of a Megatron-style MLP: the
forward all-reduces the block's output on its "tp" group and the backward the input's
gradient; after the backward the gradients are all-reduced (one flat bucket) on the "dp"
group, each rank's loss is all-gathered on the "dp" group and the mean loss all-reduced on the
world. Per rank one execution trace of one step (no profiler), after warm-up steps.

PyTorch's CPU traces do not say which process group a collective ran on (Gloo writes no
`record_param_comms`, whose `pg_name` names it in NCCL traces); this script knows, since it
issues every collective itself, and writes the group's `pg_name` and `pg_desc` on each c10d
node, as NCCL traces name it on the collective's record. Nothing else in the trace is changed.

Usage: tp_dp.py OUTDIR [WORLD] [TP]
Writes OUTDIR/tpdp_w<WORLD>.rank<R>.et.json.gz.
"""
import gzip, json, os, sys
import torch, torch.nn.functional as F
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh
from torch.profiler import ExecutionTraceObserver

H, FF, B = 64, 128, 16
LOG = []


def issue(kind, group, *args, **kw):
    """Issues collective `kind` on `group`, noting the group's name and description."""
    LOG.append((dist._get_process_group_name(group) if group is not None else "0",
                group.group_desc if group is not None else "default_pg"))
    return getattr(dist, kind)(*args, group=group, **kw)


class ToTp(torch.autograd.Function):
    """Identity forward; the input gradient all-reduced over the tensor-parallel group."""
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, g):
        g = g.contiguous()
        issue("all_reduce", ctx.group, g)
        return g, None


class FromTp(torch.autograd.Function):
    """The row-parallel partial sums all-reduced over the tensor-parallel group."""
    @staticmethod
    def forward(ctx, x, group):
        x = x.contiguous()
        issue("all_reduce", group, x)
        return x

    @staticmethod
    def backward(ctx, g):
        return g, None


def worker(rank, world, tp, out, port):
    torch.manual_seed(rank)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    mesh = init_device_mesh("cpu", (world // tp, tp), mesh_dim_names=("dp", "tp"))
    dp_g, tp_g = mesh.get_group("dp"), mesh.get_group("tp")
    dp_n = dist.get_world_size(dp_g)
    w1 = torch.randn(H, FF // tp, requires_grad=True)
    w2 = torch.randn(FF // tp, H, requires_grad=True)
    params = [w1, w2]
    # The block's input comes from an earlier layer: its gradient is wanted.
    x, y = torch.randn(B, H, requires_grad=True), torch.randn(B, H)

    def step():
        for p in params + [x]:
            p.grad = None
        h = F.gelu(ToTp.apply(x, tp_g) @ w1)
        o = FromTp.apply(h @ w2, tp_g)
        loss = F.mse_loss(o, y)
        loss.backward()
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        issue("all_reduce", dp_g, flat)
        flat /= dp_n
        off = 0
        with torch.no_grad():
            for p in params:
                n = p.numel()
                p -= 0.01 * flat[off:off + n].view_as(p)
                off += n
        losses = [torch.zeros(1) for _ in range(dp_n)]
        issue("all_gather", dp_g, losses, loss.detach().reshape(1))
        mean = torch.stack(losses).mean()
        issue("all_reduce", None, mean)

    for _ in range(3):
        step()
    base = os.path.join(out, f"tpdp_w{world}.rank{rank}")
    LOG.clear()
    obs = ExecutionTraceObserver().register_callback(base + ".et.json")
    obs.start(); step(); obs.stop(); obs.unregister_callback()
    dist.destroy_process_group()
    with open(base + ".et.json") as f:
        et = json.load(f)
    name_group(et, LOG, rank)
    with gzip.open(base + ".et.json.gz", "wt", 9) as g:
        json.dump(et, g)
    os.remove(base + ".et.json")


def name_group(et, log, rank):
    """Writes each issued collective's group on its c10d node (the outermost c10d node of
    each call, in the order they were issued)."""
    by_id = {n["id"]: n for n in et["nodes"]}

    def inside_c10d(n):
        seen = {n["id"]}
        p = by_id.get(n.get("ctrl_deps"))
        # The root names itself as its parent.
        while p is not None and p["id"] not in seen:
            if p["name"].startswith("c10d::"):
                return True
            seen.add(p["id"])
            p = by_id.get(p.get("ctrl_deps"))
        return False

    calls = [n for n in sorted(et["nodes"], key=lambda n: n["id"])
             if n["name"].startswith("c10d::") and not inside_c10d(n)]
    if len(calls) != len(log):
        sys.exit(f"rank {rank}: {len(calls)} c10d nodes for {len(log)} collectives issued")
    for n, (name, desc) in zip(calls, log):
        n.setdefault("attrs", []).extend([
            {"name": "pg_name", "type": "string", "value": name},
            {"name": "pg_desc", "type": "string", "value": desc},
        ])


if __name__ == "__main__":
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    world = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    tp = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    mp.spawn(worker, args=(world, tp, out, 29500 + os.getpid() % 1000), nprocs=world)
