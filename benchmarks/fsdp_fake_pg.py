"""Parallel layouts against torch's own FSDP2 and tensor parallelism on a fake
process group: one CPU process, no GPU, fake tensors (issue 17's validation).

- **Memory.** A small GPT (4 blocks, hidden 256, fp32, Adam) is sharded with
  ``torch.distributed.fsdp.fully_shard`` (each block, then the root) over a
  fake process group of N ranks; its second training step runs under
  ``FakeTensorMode`` inside ``torch.distributed._tools.FSDPMemTracker``, whose
  peak per rank is set beside ``predictor.predict(..., parallel=Parallel(dp=N,
  zero=3)).memory_gb`` less its CUDA context and workspaces (the tracker
  counts tensor bytes only).
- **Collective volumes.** The c10d collectives torch issues in that step
  (FSDP2's all-gathers and reduce-scatters) and in one step of the same model
  under ``parallelize_module`` (Colwise fused QKV and fc1, Rowwise proj and
  fc2, TP over N ranks: the all-reduces) are recorded with their byte counts,
  and compared with the bytes ``predictor.layouts`` prices.

    python benchmarks/fsdp_fake_pg.py                    # world sizes 2, 4, 8; batch 2
    python benchmarks/fsdp_fake_pg.py --worlds 2,8 --batch 4 --json out.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

S, H, A, V, NL = 128, 256, 8, 2048, 4
GPU = "H100-SXM5-80GB"
FOREACH = False


class Block(nn.Module):
    """A GPT block without dropout; heads counted from the local width so the
    same code runs whole and tensor-parallel."""

    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(H), nn.LayerNorm(H)
        self.qkv, self.proj = nn.Linear(H, 3 * H), nn.Linear(H, H)
        self.fc1, self.fc2 = nn.Linear(H, 4 * H), nn.Linear(4 * H, H)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
        q, k, v = (t.reshape(b, s, -1, H // A).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, s, -1))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(V, H)
        self.blocks = nn.ModuleList(Block() for _ in range(NL))
        self.ln_f = nn.LayerNorm(H)
        self.head = nn.Linear(H, V, bias=False)

    def forward(self, ids):
        x = self.wte(ids)
        for blk in self.blocks:
            x = blk(x)
        return F.cross_entropy(self.head(self.ln_f(x)).view(-1, V), ids.view(-1))


def unavailable() -> str | None:
    """Why this torch cannot run the fake-process-group checks, or None."""
    try:
        import torch.distributed as dist
        if not dist.is_available():
            return "torch.distributed is not available in this torch build"
        from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker  # noqa: F401
        from torch.distributed.fsdp import fully_shard  # noqa: F401
        from torch.distributed.tensor.parallel import parallelize_module  # noqa: F401
        from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: F401
    except Exception as e:   # an older or a stripped torch
        return f"torch {torch.__version__} lacks FSDP2/FSDPMemTracker/fake process group ({e})"
    if dist.is_initialized():
        return "a process group is already initialized in this process"
    return None


@contextlib.contextmanager
def fake_world(n: int):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore
    dist.init_process_group("fake", rank=0, world_size=n, store=FakeStore())
    try:
        yield init_device_mesh("cpu", (n,))
    finally:
        dist.destroy_process_group()


class Collectives(TorchDispatchMode):
    """Records every c10d collective with its byte count: the gathered output
    of an all-gather, the input of a reduce-scatter, the tensor of an all-reduce."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple[str, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        ns, name = func.namespace, func._schema.name.split("::")[-1]
        if ns in ("c10d", "_c10d_functional"):
            def nb(t):
                if isinstance(t, (list, tuple)):
                    return sum(nb(x) for x in t)
                return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0
            if "allgather" in name or "all_gather" in name:
                kind, size = "all_gather", (nb(args[0]) if ns == "c10d" else nb(args[0]) * int(args[1]))
            elif "reduce_scatter" in name:
                kind, size = "reduce_scatter", nb(args[1]) if ns == "c10d" else nb(args[0])
            elif "allreduce" in name or "all_reduce" in name:
                kind, size = "all_reduce", nb(args[0])
            else:
                kind, size = name, 0
            if kind in ("all_gather", "reduce_scatter", "all_reduce"):
                self.calls.append((kind, int(size)))
        return func(*args, **kwargs)

    def total(self, kind: str) -> int:
        return sum(s for k, s in self.calls if k == kind)


def _steps(model, opt, ids, mt=None, rec=None) -> None:
    """Two training steps; the tracker's peak is reset after the first (Adam's
    state is created there), collectives are recorded in the second."""
    for i in range(2):
        ctx = rec if (rec is not None and i == 1) else contextlib.nullcontext()
        with ctx:
            model(ids).backward()
            opt.step()
            opt.zero_grad()
        if i == 0 and mt is not None:
            mt.reset_mod_stats()


def fsdp_measure(world: int, batch: int, reshard: bool = True) -> dict:
    """Peak bytes per rank (FSDPMemTracker) and the collectives of one FSDP2
    step. `reshard=True`: fully_shard's default (None: non-root units
    resharded after forward, the root kept gathered for backward);
    `reshard=False`: every unit kept gathered from forward to backward
    (FSDP's SHARD_GRAD_OP, ZeRO-2's communication)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor
    with fake_world(world) as mesh, FakeTensorMode():
        torch.manual_seed(0)
        model = GPT()
        for blk in model.blocks:
            fully_shard(blk, mesh=mesh, reshard_after_forward=None if reshard else False)
        fully_shard(model, mesh=mesh, reshard_after_forward=None if reshard else False)
        # foreach=False: with foreach=True the tracker counts ~3.3x the *unsharded*
        # parameter bytes as optimizer-step tensors at every world size (the
        # multi-tensor step over DTensors), which no sharded run holds
        opt = torch.optim.Adam(model.parameters(), foreach=FOREACH)
        ids = torch.zeros(batch, S, dtype=torch.long)
        mt = FSDPMemTracker(model, opt)
        mt.track_inputs((ids,))
        # what the tracker records in the optimizer step by shape: plain tensors of a
        # parameter's global (unsharded) shape exist on no rank in a sharded step
        glob = {tuple(p.shape) for p in model.parameters()} \
            - {tuple(p.to_local().shape) for p in model.parameters()}
        opt_global = [0]
        track = getattr(mt, "_track", None)   # the tracker's internals: counted where present

        def counting(reftype, t):
            if getattr(mt, "_in_opt", False) and type(t) is not DTensor \
                    and tuple(t.shape) in glob:
                opt_global[0] += t.numel() * t.element_size()
            return track(reftype, t)
        if track is not None:
            mt._track = counting
        with mt:
            _steps(model, opt, ids, mt)
        snap = next(iter(mt.get_tracker_snapshot("peak").values()))
        rec = Collectives()
        _steps(model, opt, ids, rec=rec)
    parts = {str(getattr(k, "value", k)): int(v) for k, v in snap.items()}
    return {"peak_bytes": parts.pop("Total"), "parts": parts, "opt_global_shape": opt_global[0],
            "all_gather": rec.total("all_gather"), "reduce_scatter": rec.total("reduce_scatter"),
            "all_gather_calls": sorted(b for k, b in rec.calls if k == "all_gather"),
            "reduce_scatter_calls": sorted(b for k, b in rec.calls if k == "reduce_scatter")}


def tp_measure(tp: int, batch: int) -> list[int]:
    """Byte counts of the all-reduces one training step issues under
    Megatron-style tensor parallelism of the blocks (torch's parallelize_module)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)
    with fake_world(tp) as mesh, FakeTensorMode():
        model = GPT()
        for blk in model.blocks:
            parallelize_module(blk, mesh, {"qkv": ColwiseParallel(), "fc1": ColwiseParallel(),
                                           "proj": RowwiseParallel(), "fc2": RowwiseParallel()})
        ids = torch.zeros(batch, S, dtype=torch.long)
        rec = Collectives()
        with rec:   # forward and backward (the optimizer step issues no collective)
            model(ids).backward()
    return [s for k, s in rec.calls if k == "all_reduce"]


def trace():
    import predictor
    return predictor.trace(GPT(), (torch.zeros(2, S, dtype=torch.long),),
                           loss_fn=lambda out: out, name="gpt-fsdp-check")


def predicted(g, world: int, batch: int) -> dict:
    """The predictor's per-GPU memory without CUDA context, and the bytes it
    prices for ZeRO-3's collectives per step (one micro-batch)."""
    import predictor
    from predictor.kernels import layout as L
    p = predictor.predict(g, GPU, batch_size=batch, parallel=predictor.Parallel(dp=world, zero=3))
    parts = dict(p.memory_parts_gb)
    tensors = (sum(parts.values()) - parts["context_workspace"]) * 2**30
    lp = g.layout
    w_b = L.DTYPE_BYTES[L.F32]
    params = float(lp.param_numel.sum()) * w_b
    return {"tensor_bytes": tensors, "parts": parts,
            # layouts.py: all-gather of every weight in forward and again in backward,
            # reduce-scatter of every gradient
            "all_gather": 2 * params, "reduce_scatter": params}


def unit_bytes(g) -> tuple[list[int], int]:
    """fp32 parameter bytes of each FSDP unit as the layout profile groups
    them: one per block, and the root (everything outside the blocks)."""
    lp = g.layout
    per = np.bincount(lp.param_group, weights=lp.param_numel).astype(np.int64) * 4
    blocks = [int(x) for x in per[1:lp.n_blocks + 1]]
    return blocks, int(per.sum()) - sum(blocks)


def tp_priced(g, batch: int) -> list[int]:
    """Bytes of the block all-reduces layouts.py prices (TP), forward and backward."""
    from predictor.kernels import layout as L
    lp = g.layout
    sel = (lp.comm_group >= 1) & (lp.comm_group <= lp.n_blocks)
    return sorted(int(max(b + s * batch, 0)) * L.DTYPE_BYTES[int(d)] for b, s, d in
                  zip(lp.comm_base[sel], lp.comm_slope[sel], lp.comm_dtype[sel]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", default="2,4,8")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--json")
    ap.add_argument("--foreach", action="store_true",
                    help="FSDP2 step with Adam(foreach=True) (see FOREACH)")
    a = ap.parse_args(argv)
    global FOREACH
    FOREACH = a.foreach
    why = unavailable()
    if why:
        print(f"error: {why}", file=sys.stderr)
        return 2
    try:
        worlds = [int(x) for x in a.worlds.split(",")]
    except ValueError:
        worlds = []
    if not worlds or any(n not in (2, 4, 8) for n in worlds):
        # tensor parallelism splits the 8 heads: at most 8 ranks
        print(f"error: --worlds {a.worlds!r}: comma-separated rank counts out of 2, 4, 8",
              file=sys.stderr)
        return 2
    if not 1 <= a.batch <= 64:
        print(f"error: --batch {a.batch}: from 1 to 64", file=sys.stderr)
        return 2
    g = trace()
    rows = []
    print(f"GPT {NL} blocks, hidden {H}, seq {S}, fp32, Adam; batch {a.batch} per rank; MiB")
    print(f"{'N':>3} {'FSDPMemTracker':>15} {'predicted':>10} {'err %':>7}  "
          f"{'AG torch':>9} {'AG priced':>9} {'RS torch':>9} {'RS priced':>9}")
    mib = 2**20
    for n in worlds:
        m, p = fsdp_measure(n, a.batch), predicted(g, n, a.batch)
        err = 100 * (p["tensor_bytes"] / m["peak_bytes"] - 1)
        rows.append({"world": n, "measured": m, "predicted": p, "error_pct": err})
        print("    torch:", {k: round(v / mib, 2) for k, v in m["parts"].items() if v},
              f"(optimizer step: {m['opt_global_shape'] / mib:.2f} MiB tracked in tensors of "
              "global parameter shapes)")
        print("    predicted:", {k: round(v * 1024, 2) for k, v in p["parts"].items()
                               if k != "context_workspace"})
        print(f"{n:>3} {m['peak_bytes'] / mib:>15.2f} {p['tensor_bytes'] / mib:>10.2f} {err:>+7.1f}  "
              f"{m['all_gather'] / mib:>9.2f} {p['all_gather'] / mib:>9.2f} "
              f"{m['reduce_scatter'] / mib:>9.2f} {p['reduce_scatter'] / mib:>9.2f}")
    for n in worlds:
        z2 = fsdp_measure(n, a.batch, reshard=False)
        priced = float(g.layout.param_numel.sum()) * 4
        rows.append({"world": n, "zero2_all_gather": z2["all_gather"],
                     "zero2_reduce_scatter": z2["reduce_scatter"], "zero2_priced": priced})
        print(f"ZeRO-2 (reshard_after_forward=False) {n}: torch all-gather "
              f"{z2['all_gather'] / 2**20:.2f} MiB, reduce-scatter "
              f"{z2['reduce_scatter'] / 2**20:.2f} MiB; priced {priced / 2**20:.2f} MiB each")
    tp_rows = []
    for n in worlds:
        got, want = sorted(tp_measure(n, a.batch)), tp_priced(g, a.batch)
        tp_rows.append({"tp": n, "torch": got, "priced": want})
        print(f"TP {n}: torch all-reduces {len(got)} x {sorted(set(got))} B, "
              f"priced {len(want)} x {sorted(set(want))} B: {'equal' if got == want else 'DIFFER'}")
    if a.json:
        from predictor.io import atomic_write_text
        atomic_write_text(a.json, json.dumps({"fsdp": rows, "tp": tp_rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
