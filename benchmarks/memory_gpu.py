"""Check the peak-memory model on a real CUDA GPU (skips without one).

For each zoo model and batch size, one training step (forward, loss,
backward, ``torch.optim.Adam(foreach=True)``, ``zero_grad``) runs for real on
the GPU after a warm-up step; PyTorch's peak counters are compared with the
prediction for this GPU:

- ``torch.cuda.max_memory_allocated`` vs the predicted peak of live blocks
  (``graph.memory.peak(...)[0]``, 512-byte rounded);
- ``torch.cuda.max_memory_reserved`` vs the predicted reserved segments;
- the device's used memory (``mem_get_info``: context included) vs the
  predicted device total (``memory.device_bytes``).

``--oom`` also finds the first batch size that really runs out of memory
(doubling, then bisection) and compares it with
``memory.max_batch_size(..., max_memory_fraction=1.0)``.

    python benchmarks/memory_gpu.py --models resnet50,gpt2 --batches 8,32 [--oom]
"""

from __future__ import annotations

import argparse
import gc
import sys

import numpy as np
import torch

import predictor
from predictor import hardware, memory, zoo


def _gpu():
    name = torch.cuda.get_device_name()
    try:
        return hardware.get(name)
    except predictor.UnknownGPUError:
        return None


def run_step(name: str, batch: int) -> dict:
    """Peak counters of the second training step (bytes)."""
    entry = zoo.get(name)
    gc.collect()  # the previous configuration's model and optimizer
    torch.cuda.empty_cache()
    with torch.device("cuda"):
        built = entry.build()
        model = (built[0] if isinstance(built, tuple) else built).cuda().train()
        opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], foreach=True)

        def step() -> None:
            inputs = entry.make_inputs(batch, entry.default_seq_len)
            out = model(**inputs) if isinstance(inputs, dict) else model(*inputs)
            loss = entry.loss_fn(out)
            del out
            loss.backward()
            del loss
            opt.step()
            opt.zero_grad(set_to_none=True)

        step()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        step()
        torch.cuda.synchronize()
        free, total = torch.cuda.mem_get_info()
        out = {"allocated": torch.cuda.max_memory_allocated(),
               "reserved": torch.cuda.max_memory_reserved(), "device_used": total - free}
    return out


def fits_for_real(name: str, batch: int) -> bool:
    try:
        run_step(name, batch)
        return True
    except torch.cuda.OutOfMemoryError:
        gc.collect()
        torch.cuda.empty_cache()
        return False


def first_oom(name: str, start: int = 1, limit: int = 1 << 16) -> int | None:
    lo, hi = 0, start
    while hi <= limit and fits_for_real(name, hi):
        lo, hi = hi, hi * 2
    if hi > limit:
        return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits_for_real(name, mid) else (lo, mid)
    return hi


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="resnet50,bert-base,gpt2")
    ap.add_argument("--batches", default="8,32")
    ap.add_argument("--oom", action="store_true", help="also find the first batch that OOMs")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA GPU: nothing to check")
        return 0
    gpu = _gpu()
    print(f"device: {torch.cuda.get_device_name()} ({gpu.id if gpu else 'not in the spec database'})")
    print(f"{'model':<12}{'batch':>6}{'alloc GiB':>11}{'pred':>8}{'err':>8}{'reserved':>10}"
          f"{'pred':>8}{'err':>8}{'device':>9}{'pred':>8}{'err':>8}")
    for name in args.models.split(","):
        graph = predictor.trace(name)
        batches = [int(b) for b in args.batches.split(",")]
        alloc, reserved, _ = graph.memory.peak(batches)
        dev = memory.device_bytes(graph.memory, [gpu], np.asarray(batches))[0] if gpu else \
            [float("nan")] * len(batches)
        for b, pa, pr, pd in zip(batches, alloc, reserved, dev):
            m = run_step(name, b)
            row = [m["allocated"], pa, m["reserved"], pr, m["device_used"], pd]
            g = [x / 2**30 for x in row]
            print(f"{name:<12}{b:>6}{g[0]:>11.2f}{g[1]:>8.2f}{(g[1] - g[0]) / g[0]:>+8.1%}"
                  f"{g[2]:>10.2f}{g[3]:>8.2f}{(g[3] - g[2]) / g[2]:>+8.1%}"
                  f"{g[4]:>9.2f}{g[5]:>8.2f}{(g[5] - g[4]) / g[4]:>+8.1%}", flush=True)
        if args.oom and gpu is not None:
            real = first_oom(name)
            pred = memory.max_batch_size(graph, gpu, max_memory_fraction=1.0)
            print(f"{name}: first batch that runs out of memory {real}; predicted largest "
                  f"that fits {pred} (so predicted first OOM {pred + 1 if pred is not None else None})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
