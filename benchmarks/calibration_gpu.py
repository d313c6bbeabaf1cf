"""Calibrated mode on a real GPU: calibrate at one batch size, predict others,
measure them; and the pure-mode prediction for the same GPU side by side.

For each model (default: the zoo's resnet50 at 224 x 224 and bert-base at
sequence 512, both trained with Adam, fp32): trace at batch b, calibrate on
the GPU at b alone (every op and the real step), then for each batch size in
``--predict`` predict the iteration with the calibration and without it (pure
mode: the learned/analytical per-op model for this GPU's spec id), run the
real step there (warm, CUDA-synchronised, median) and print measured,
calibrated, pure and the errors. Batch sizes that do not fit in memory are
reported as such.

Made to run as one short script on a lent GPU (a few minutes on an H100/H200):

    python -m benchmarks.calibration_gpu                          # both models
    python -m benchmarks.calibration_gpu --models resnet50 --batch 32 --predict 16,64,128
    python -m benchmarks.calibration_gpu --device cpu --models tiny  # smoke test, no GPU

With ``--json FILE`` the figures are also written as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch
import torch.nn as nn

MODELS = {  # name -> (zoo name or None, default batch, predicted batches)
    "resnet50": ("resnet50", 32, (8, 16, 64, 128)),
    "bert-base": ("bert-base", 8, (2, 4, 16, 32)),
    "tiny": (None, 4, (2, 8)),  # a small CNN: exercises the script on any device
}


def _tiny_graph(batch: int):
    import predictor

    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))
    return predictor.trace(model, (torch.randn(batch, 3, 32, 32),), name="tiny")


def run_model(name: str, batch: int, targets: list[int], device: str, repeats: int | None,
              iterations: int, log=print) -> dict:
    import predictor
    from predictor.calibration.step import build_step, time_step

    zoo_name = MODELS[name][0]
    graph = _tiny_graph(batch) if zoo_name is None else predictor.trace(zoo_name, batch_size=batch)
    t0 = time.perf_counter()
    cal = predictor.calibrate(graph, device=device, repeats=repeats, batch_sizes=[batch],
                              iterations=iterations, progress=False)
    log(f"{name}: {cal!r} in {time.perf_counter() - t0:.0f} s; overhead "
        f"{cal.overhead.to_json()}; skipped {cal.skipped}")
    dev = torch.device(device)
    gpu = cal.device
    rows = []
    for b in sorted({batch, *targets}):
        row = {"batch": b, "calibrated_at": batch}
        row["calibrated_ms"] = predictor.predict(graph, gpu, calibration=cal,
                                                 batch_size=b).iteration_ms
        row["pure_ms"] = (predictor.predict(graph, gpu, batch_size=b).iteration_ms
                          if not cal.is_cpu else None)
        try:
            step = build_step(graph.source, graph.mode, graph.optimizer, b, dev, graph.amp)
            row["measured_ms"] = time_step(step, dev, iterations=iterations)
            del step
        except (RuntimeError, torch.cuda.OutOfMemoryError) as exc:
            row["measured_ms"] = None
            row["error"] = " ".join(str(exc).split())[:80]
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        rows.append(row)
        log(f"  batch {b}: {row}")
    return {"model": name, "device": gpu, "device_name": cal.device_info.name,
            "calibration": cal.summary(), "rows": rows}


def _ms(x) -> str:
    return "-" if x is None else f"{x:.2f}"


def _err(pred, meas) -> str:
    if pred is None or meas is None:
        return "-"
    return f"{(pred - meas) / meas * 100:+.1f} %"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="resnet50,bert-base")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batch", type=int, help="calibration batch (default per model)")
    ap.add_argument("--predict", help="comma-separated batch sizes to predict and measure")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument("--json", help="also write the results to this JSON file")
    args = ap.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device; use --device cpu --models tiny for a smoke test", file=sys.stderr)
        return 2
    results = []
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        if name not in MODELS:
            print(f"unknown model {name!r}; choose from {', '.join(MODELS)}", file=sys.stderr)
            return 2
        _, b, targets = MODELS[name]
        b = args.batch or b
        if args.predict:
            targets = [int(x) for x in args.predict.split(",") if x.strip()]
        results.append(run_model(name, b, list(targets), args.device, args.repeats,
                                 args.iterations))
    print("\n| model | device | calibrated at | batch | measured ms | calibrated ms | error "
          "| pure ms | error |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        for row in r["rows"]:
            m, pure = row.get("measured_ms"), row["pure_ms"]
            print(f"| {r['model']} | {r['device']} | {row['calibrated_at']} | {row['batch']} | "
                  f"{_ms(m)} | {row['calibrated_ms']:.2f} | {_err(row['calibrated_ms'], m)} | "
                  f"{_ms(pure)} | {_err(pure, m)} |")
    if args.json:
        from predictor.io import atomic_write_text

        atomic_write_text(args.json, json.dumps(results, indent=1, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
