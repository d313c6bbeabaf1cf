"""The GPU kernels of real training steps, from torch.profiler: what each
step's time is spent on, to check the per-row measurements
(``benchmarks.rows_gpu``) and the per-row prices against.

    python -m benchmarks.profile_gpu --out DIR          # on a CUDA GPU
    python -m benchmarks.profile_gpu --out DIR --smoke  # any device, one small model

Per configuration: three warm-up steps, then three profiled steps; writes
``<config>.csv`` (kernel name, calls, total device microseconds per step),
sorted by time, and prints the top kernels.
"""

from __future__ import annotations

import argparse
from pathlib import Path

# name -> (zoo model, batch, amp)
CONFIGS = {"resnet50-b128-fp32": ("resnet50", 128, None),
           "resnet50-b128-bf16": ("resnet50", 128, "bf16"),
           "bert-large-b16-bf16": ("bert-large", 16, "bf16"),
           # A second transformer under autocast: its casts, head copies and
           # mixed-dtype adds (a broadcast fp32 mask on bf16 scores) check the
           # element rates of kernels.roofline.generic_kernel_us off the step
           # they were read from.
           "gpt2-b8-bf16": ("gpt2", 8, "bf16")}
SMOKE = {"dcgan-b2": ("dcgan", 2, None)}
STEPS = 3


def profile(name: str, cfg, device, out: Path) -> None:
    import pandas as pd
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    import predictor
    from predictor.calibration.step import build_step

    model, batch, amp = cfg
    graph = predictor.trace(model, batch_size=batch, amp=amp, optimizer="adam")
    step = build_step(graph.source, "train", "adam", batch, device, amp)
    for _ in range(3):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with torch_profile(activities=acts) as prof:
        for _ in range(STEPS):
            step()
        if device.type == "cuda":
            torch.cuda.synchronize()
    recs = []
    for ev in prof.events():
        dev_type = getattr(ev, "device_type", None)
        on_gpu = dev_type is not None and str(dev_type).endswith("CUDA")
        if device.type == "cuda" and not on_gpu:
            continue
        if on_gpu and getattr(ev, "is_user_annotation", False):
            # A record_function range (the optimizer's step) shown on the GPU
            # timeline: it spans kernels listed on their own.
            continue
        if device.type != "cuda" and ev.cpu_parent is not None:
            continue
        dur = ev.time_range.elapsed_us() if on_gpu else ev.cpu_time_total
        recs.append({"kernel": ev.name, "us": float(dur)})
    df = pd.DataFrame.from_records(recs, columns=["kernel", "us"])
    by = df.groupby("kernel").agg(calls=("us", "size"), us=("us", "sum")).reset_index()
    by["calls"] = by["calls"] / STEPS
    by["us_per_step"] = by.pop("us") / STEPS
    by = by.sort_values("us_per_step", ascending=False)
    by.to_csv(out / f"{name}.csv", index=False)
    total = by.us_per_step.sum() / 1e3
    print(f"{name}: {total:.2f} ms of kernels per step, {len(by)} distinct kernels")
    for r in by.head(12).itertuples():
        print(f"  {r.us_per_step / 1e3:8.3f} ms  {r.calls:6.1f} x  {r.kernel[:110]}")
    del step
    if device.type == "cuda":
        torch.cuda.empty_cache()


def main(argv=None) -> int:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    device = torch.device(args.device)
    for name, cfg in (SMOKE if args.smoke else CONFIGS).items():
        try:
            profile(name, cfg, device, args.out)
        except Exception as exc:  # noqa: BLE001 - one failed configuration must not stop the rest
            print(f"{name}: failed: {type(exc).__name__}: {exc}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
