"""Every op row of a training step measured on a real GPU in the precision it
runs in (autocast bf16/fp16, TF32, fp32), against the per-row prediction.

On the GPU (one calibration file per configuration, in --out):

    python -m benchmarks.rows_gpu measure --out DIR

Anywhere, afterwards (re-traces each configuration, loads its file, and
compares the measured time of each row with the pure-mode prediction for the
GPU the file names, summed by family and dtype):

    python -m benchmarks.rows_gpu compare DIR

A calibration (``predictor.calibrate``) times each row of the trace as the
lowering writes it, in the row's dtype, under the TF32 settings of the moment,
and the real step (``calibration.step.build_step``: contiguous tensors).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

# name -> (zoo model, batch, amp, TF32 matmuls, memory format)
CONFIGS = {
    "resnet50-b128-tf32conv": ("resnet50", 128, None, False, None),
    "resnet50-b128-bf16": ("resnet50", 128, "bf16", False, None),
    "resnet50-b128-bf16-cl": ("resnet50", 128, "bf16", False, "channels_last"),
    "bert-large-b16-tf32": ("bert-large", 16, None, True, None),
    "bert-large-b16-bf16": ("bert-large", 16, "bf16", False, None),
    "bert-large-b16-fp16": ("bert-large", 16, "fp16", False, None),
}
SMOKE = {"dcgan-b2-bf16": ("dcgan", 2, "bf16", False, None)}


def _trace(cfg):
    import predictor

    model, batch, amp, _, fmt = cfg
    return predictor.trace(model, batch_size=batch, amp=amp, optimizer="adam",
                           memory_format=fmt)


def measure(out: Path, configs: dict, device: str) -> int:
    import torch

    import predictor

    out.mkdir(parents=True, exist_ok=True)
    for name, cfg in configs.items():
        try:
            graph = _trace(cfg)
            if torch.cuda.is_available():
                torch.backends.cuda.matmul.allow_tf32 = cfg[3]
            cal = predictor.calibrate(graph, device=device, batch_sizes=[cfg[1]],
                                      iterations=5, progress=False)
            cal.save(out / f"{name}.npz")
            print(f"{name}: {cal!r}", flush=True)
        except Exception as exc:  # noqa: BLE001 - one failed configuration must not stop the rest
            print(f"{name}: failed: {type(exc).__name__}: {exc}", flush=True)
        finally:
            if torch.cuda.is_available():
                torch.backends.cuda.matmul.allow_tf32 = False
                torch.cuda.empty_cache()
    return 0


def rows(name: str, cfg, path: Path):
    """(meta, per-row table) of one configuration: measured and predicted us
    per execution (the engine's own per-row prices, ``Prediction.op_us``),
    executions per step, family and dtype names."""
    import pandas as pd

    import predictor
    from predictor.calibration.file import load
    from predictor.kernels import layout as L

    graph = _trace(cfg)
    cal = load(path, graph)
    # A CPU calibration (the smoke test) is compared with an H200's prediction.
    spec_id = "H200-SXM-141GB" if cal.is_cpu else cal.device
    p = predictor.predict(graph, spec_id, tf32_matmul=cfg[3] or None)
    ops = graph.ops
    dims = ops.dims(cfg[1])
    df = pd.DataFrame({"config": name, "row": np.arange(len(ops.family)),
                       "family": [L.FAMILY_NAMES[int(f)] for f in ops.family],
                       "dtype": [L.DTYPE_NAMES[int(t)] for t in ops.dtype],
                       "count": ops.count.astype(float),
                       "dims": [" ".join(str(x) for x in d[d != 0][:8]) for d in dims],
                       "measured_us": cal.measured_us[0], "predicted_us": p.op_us})
    meta = {"config": name, "real_ms": float(cal.iteration_ms[0]),
            "ops_ms": float(cal.ops_ms[0]), "unmeasured_ms": float(cal.unmeasured_ms[0]),
            "predicted_ms": p.iteration_ms}
    return meta, df


def compare(folder: Path, configs: dict) -> int:
    import pandas as pd

    metas, frames = [], []
    for name, cfg in configs.items():
        path = folder / f"{name}.npz"
        if not path.exists():
            print(f"{name}: no {path}")
            continue
        meta, df = rows(name, cfg, path)
        metas.append(meta)
        frames.append(df)
    if not frames:
        return 1
    df = pd.concat(frames)
    df = df[df.measured_us > 0]
    df["measured_ms"] = df.measured_us * df["count"] / 1e3
    df["predicted_ms"] = df.predicted_us * df["count"] / 1e3
    pd.set_option("display.width", 200)
    print(pd.DataFrame(metas).round(2).to_string(index=False))
    by = df.groupby(["config", "family", "dtype"])[["measured_ms", "predicted_ms"]].sum()
    by["ratio"] = by.predicted_ms / by.measured_ms
    print(by.round(2).to_string())
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure")
    m.add_argument("--out", type=Path, required=True)
    m.add_argument("--device", default="cuda")
    m.add_argument("--smoke", action="store_true", help="one small model (any device)")
    c = sub.add_parser("compare")
    c.add_argument("folder", type=Path)
    c.add_argument("--smoke", action="store_true")
    args = ap.parse_args(argv)
    configs = SMOKE if args.smoke else CONFIGS
    if args.cmd == "measure":
        return measure(args.out, configs, args.device)
    return compare(args.folder, configs)


if __name__ == "__main__":
    raise SystemExit(main())
