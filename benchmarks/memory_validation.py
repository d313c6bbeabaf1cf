"""Validate the static peak-memory model against PyTorch's own tracker.

For each model and batch size, the same training step (forward, loss,
``loss.backward()``, ``torch.optim.Adam(foreach=True).step()``,
``zero_grad()``) runs *eagerly* under ``FakeTensorMode`` on CPU inside
``torch.distributed._tools.mem_tracker.MemTracker``, which follows every
storage PyTorch creates and frees; its peak is compared with the predictor's
peak tensor bytes from one trace of the step (``graph.memory``), evaluated at
that batch size without retracing. Both sides count exact tensor bytes: no
allocator rounding, no CUDA context, no library workspaces (those exist only on
a GPU; see ``predictor/memory.py``).

The measured step is the second one (the first creates Adam's state), like the
steady state the predictor models. Dropout runs as ``native_dropout`` (a
boolean mask), as on a GPU: CPU eager dropout would instead keep a float32
noise tensor per dropout for backward, which no GPU run holds.

    python benchmarks/memory_validation.py                       # all zoo models
    python benchmarks/memory_validation.py --models resnet50,gpt2 --batches 8,32
    python benchmarks/memory_validation.py --json out.json
    python benchmarks/memory_validation.py --amp bf16 --models resnet50,gpt2   # autocast
    python benchmarks/memory_validation.py --optimizer adamw-loop+clip --models gpt2

``--optimizer`` runs another step on both sides (``predictor.frontend.optimizers``
names): torch.optim's Adam, AdamW or SGD, ``foreach=False`` for ``-loop``, and
``torch.nn.utils.clip_grad_norm_`` before it for ``+clip``.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import predictor
from predictor import zoo

# Batch sizes per model (small, the zoo default, larger); sequence models use
# their zoo sequence length.
DEFAULT_BATCHES = {
    "resnet50": (8, 64, 256),
    "inception_v3": (8, 64, 128),
    "transformer": (8, 64, 128),
    "gnmt": (16, 64, 128),
    "dcgan": (16, 64, 256),
    "bert-base": (2, 8, 32),
    "bert-large": (2, 8, 16),
    "gpt2": (1, 4, 16),
    "gpt2-large": (1, 4, 8),
    "gpt3-xl": (1, 2, 4),
    "gpt3-2.7b": (1, 2, 4),
    "opt-1.3b": (1, 2, 4),
}


def _gpu_dropout(input, p=0.5, training=True, inplace=False):
    """F.dropout as CUDA runs it: the fused kernel with a boolean mask."""
    if not training or p == 0:
        return input
    out, _ = torch.native_dropout(input, p, True)
    if inplace:
        return input.copy_(out)
    return out


def _fresh_parameters(model: torch.nn.Module) -> None:
    """Replace every parameter and buffer by a fresh fake tensor (ties kept).

    Under FakeTensorMode a deep-copied fake tensor (``nn.Transformer`` deep-
    copies its layers) gives views that do not share its storage, so a tracker
    would count ``weight.t()`` as a new allocation. The tracer makes fresh fake
    parameters the same way."""
    fresh: dict[int, torch.Tensor] = {}
    for mod in model.modules():
        for key, p in list(mod._parameters.items()):
            if p is not None:
                if id(p) not in fresh:
                    fresh[id(p)] = torch.nn.Parameter(torch.empty(p.shape, dtype=p.dtype),
                                                      requires_grad=p.requires_grad)
                mod._parameters[key] = fresh[id(p)]
        for key, b in list(mod._buffers.items()):
            if b is not None:
                if id(b) not in fresh:
                    fresh[id(b)] = torch.empty(b.shape, dtype=b.dtype)
                mod._buffers[key] = fresh[id(b)]


def measured_peak(name: str, batch: int, seq_len: int | None = None,
                  amp: str | None = None, optimizer: str = "adam") -> int:
    """Peak bytes of the second eager training step of zoo model `name`."""
    entry = zoo.get(name)
    seq = seq_len if seq_len is not None else entry.default_seq_len
    return measure_step(entry.build, lambda b: entry.make_inputs(b, seq), entry.loss_fn, batch,
                        amp, optimizer)


def measure_step(build, make_inputs, loss_fn, batch: int, amp: str | None = None,
                 optimizer: str = "adam") -> int:
    """Peak bytes of the second eager training step under MemTracker: `build()`
    returns the module (or (module, ...)), `make_inputs(batch)` its inputs (a
    tuple or a dict), `loss_fn(output)` the loss. Everything is fake. `amp`
    ("bf16"/"fp16"): forward and loss run eagerly under CUDA's autocast policy
    (the same ``CudaAutocast`` kernels the tracer uses, weight-cast cache
    included), fp16 with the GradScaler's scale, unscale and update."""
    cpu_dropout = torch.nn.functional.dropout
    torch.nn.functional.dropout = _gpu_dropout
    try:
        if amp is None:
            return _measure(build, make_inputs, loss_fn, batch, None, optimizer)
        from predictor.frontend.autocast import CudaAutocast

        with CudaAutocast(amp) as policy:
            return _measure(build, make_inputs, loss_fn, batch, policy, optimizer)
    finally:
        torch.nn.functional.dropout = cpu_dropout


def _measure(build, make_inputs, loss_fn, batch: int, policy=None,
             optimizer: str = "adam") -> int:
    import contextlib

    from torch.distributed._tools.mem_tracker import MemTracker

    from predictor.frontend import autocast, optimizers

    region = policy.region if policy is not None else contextlib.nullcontext
    scaling = policy is not None and policy.amp == "fp16"
    with FakeTensorMode(allow_non_fake_inputs=True):
        built = build()
        model = built[0] if isinstance(built, tuple) else built
        _fresh_parameters(model)
        model.train()
        params = [p for p in model.parameters() if p.requires_grad]
        name = optimizers.check(optimizer)
        opt, clip = optimizers.torch_optimizer(name, params), optimizers.parse(name)[2]
        scale, growth = autocast.scaler_state() if scaling else (None, None)

        def step(inputs) -> None:
            with region():
                out = model(**inputs) if isinstance(inputs, dict) else model(*inputs)
                loss = loss_fn(out)
            del out
            if scaling:
                loss = autocast.scale_loss(loss, scale)
            loss.backward()
            del loss
            if scaling:
                with torch.no_grad():
                    found_inf = autocast.unscale([p.grad for p in params if p.grad is not None],
                                                 scale)
            if clip:
                torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            if scaling:
                autocast.update_scale(scale, growth, found_inf)
            opt.zero_grad(set_to_none=True)

        step(make_inputs(batch))  # creates the optimizer state
        inputs = make_inputs(batch)
        tracker = MemTracker()
        tracker.track_external(model, opt, inputs)
        with tracker:
            step(inputs)
        snap = tracker.get_tracker_snapshot("peak")
    peaks = [dev["Total"] for dev in snap.values()]
    return int(max(peaks)) if peaks else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(DEFAULT_BATCHES),
                    help="comma-separated zoo names (default: all)")
    ap.add_argument("--batches", default=None,
                    help="comma-separated batch sizes for every model (default: per model)")
    ap.add_argument("--json", default=None, metavar="FILE", help="also write the rows as JSON")
    ap.add_argument("--amp", default=None, choices=("bf16", "fp16", "fp8"),
                    help="the step under CUDA's autocast policy (both sides)")
    ap.add_argument("--optimizer", default="adam",
                    help="the optimizer step on both sides (default adam; e.g. adamw+clip, "
                         "adamw-loop)")
    args = ap.parse_args(argv)
    rows = []
    print(f"{'model':<14}{'batch':>6}{'MemTracker GiB':>16}{'predicted GiB':>15}{'error':>9}"
          f"{'peak in':>10}{'trace s':>9}{'eager s':>9}")
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        batches = ([int(b) for b in args.batches.split(",")] if args.batches
                   else DEFAULT_BATCHES.get(name, (1, 8, 32)))
        t0 = time.perf_counter()
        graph = predictor.trace(name, batch_size=batches[0], amp=args.amp,
                                optimizer=args.optimizer)
        trace_s = time.perf_counter() - t0
        exact, _, step = graph.memory.peak(batches, rounding=False, workspaces=False)
        for b, pred, st in zip(batches, exact, step):
            t0 = time.perf_counter()
            meas = measured_peak(name, b, amp=args.amp, optimizer=args.optimizer)
            eager_s = time.perf_counter() - t0
            err = (pred - meas) / meas
            phase = graph.memory.phase_at(int(st))
            rows.append({"model": name, "batch_size": b, "amp": args.amp,
                         "optimizer": args.optimizer, "measured_bytes": meas,
                         "predicted_bytes": int(pred), "error": err, "peak_phase": phase})
            print(f"{name:<14}{b:>6}{meas / 2**30:>16.3f}{pred / 2**30:>15.3f}{err:>+9.1%}"
                  f"{phase:>10}{trace_s:>9.1f}{eager_s:>9.1f}", flush=True)
            gc.collect()
        del graph
        gc.collect()
    if rows:
        errs = [abs(r["error"]) for r in rows]
        print(f"\n{len(rows)} configurations: mean |error| {sum(errs) / len(errs):.1%}, "
              f"max |error| {max(errs):.1%}, within 10 %: "
              f"{sum(e <= 0.10 for e in errs)}/{len(errs)}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
