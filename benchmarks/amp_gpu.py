"""Mixed precision on a real GPU: the matmul rate in each math mode, and whole
training steps in fp32, TF32, AMP bf16 and AMP fp16, measured against the
prediction for this GPU.

    python -m benchmarks.amp_gpu --json amp_gpu.json
    python -m benchmarks.amp_gpu --device cpu --models tiny   # smoke test, no GPU
    python -m benchmarks.amp_gpu --reprice benchmarks/data/h200/amp_gpu.json   # no GPU

1. ``torch.mm`` of square matrices (random data; warm-up, CUDA events, the
   median of ``--repeats``) in fp32 with TF32 off, with TF32 on, in bf16 and in
   fp16: TFLOP/s measured, the fraction of the spec's rated peak for that math
   mode, and the TFLOP/s the per-op model predicts (``kernels.optime``).
2. One training step (forward, loss, backward, optimizer) of each model: plain
   fp32 (PyTorch's defaults: fp32 matmuls, TF32 convolutions), fp32 with TF32
   matmuls, ``torch.autocast`` bf16, and autocast fp16 with a ``GradScaler``,
   built by ``predictor.calibration.step.build_step`` as the trace runs it;
   the measured median step against ``predictor.predict`` for this GPU
   (pure mode: no calibration).

Made for a lent GPU inside one short session script (``benchmarks/gpu_session.sh``).
``--reprice FILE`` prices the steps of a stored run again with the model as it
is now (any machine): the measured steps stay what they were.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import torch

# name -> (zoo name, batch); "tiny" exercises the script on any device.
MODELS = {"resnet50": ("resnet50", 128), "bert-large": ("bert-large", 16),
          "gpt2": ("gpt2", 8), "tiny": ("dcgan", 2)}
# precision -> (amp, TF32 matmuls)
PRECISIONS = {"fp32": (None, False), "tf32": (None, True), "amp-bf16": ("bf16", False),
              "amp-fp16": ("fp16", False)}
MM_DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16,
             "fp16": torch.float16}


def _spec(device: torch.device):
    from predictor import hardware
    from predictor.errors import UnknownGPUError

    if device.type != "cuda":
        return None
    try:
        return hardware.get(torch.cuda.get_device_name(device))
    except UnknownGPUError:  # a board the spec database lacks: measured figures only
        return None


def _time_ms(fn, device: torch.device, repeats: int) -> float:
    for _ in range(3):
        fn()
    if device.type != "cuda":
        samples = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e3)
        return float(np.median(samples))
    samples = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        samples.append(a.elapsed_time(b))
    return float(np.median(samples))


def _predicted_mm_tflops(spec, mode: str, n: int) -> float | None:
    if spec is None:
        return None
    from predictor import opmodel
    from predictor.engine import model_params
    from predictor.kernels import layout as L
    from predictor.kernels.optime import op_time_us

    code = {"fp32": L.F32, "tf32": L.F32, "bf16": L.BF16, "fp16": L.F16}[mode]
    d = np.zeros(L.MAX_DIMS, dtype=np.int64)
    d[:4] = (1, n, n, n)
    t_us = op_time_us(L.MATMUL, code, 1, d, spec.features, model_params(mode == "tf32"),
                      opmodel.weights())
    return 2.0 * n ** 3 / (t_us * 1e-6) / 1e12


def _rated_tflops(spec, mode: str) -> float | None:
    if spec is None:
        return None
    field = {"fp32": "fp32_tflops", "tf32": "tf32_tflops", "bf16": "bf16_tflops",
             "fp16": "fp16_tflops"}[mode]
    return spec.spec.get(field)


def matmuls(device: torch.device, sizes, repeats: int, log=print) -> list[dict]:
    spec = _spec(device)
    rows = []
    for n in sizes:
        for mode, dtype in MM_DTYPES.items():
            if device.type == "cuda":
                torch.backends.cuda.matmul.allow_tf32 = mode == "tf32"
            a = torch.randn(n, n, device=device, dtype=dtype)
            b = torch.randn(n, n, device=device, dtype=dtype)
            ms = _time_ms(lambda: torch.mm(a, b), device, repeats)
            tflops = 2.0 * n ** 3 / (ms * 1e-3) / 1e12
            rated = _rated_tflops(spec, mode)
            row = {"n": n, "mode": mode, "ms": ms, "tflops": tflops, "rated_tflops": rated,
                   "fraction_of_rated": tflops / rated if rated else None,
                   "predicted_tflops": _predicted_mm_tflops(spec, mode, n)}
            rows.append(row)
            log(f"  mm {n:5d} {mode:<5} {tflops:8.1f} TFLOP/s"
                + (f"  ({row['fraction_of_rated']:.3f} of rated {rated:g})" if rated else "")
                + (f"  predicted {row['predicted_tflops']:.1f}"
                   if row["predicted_tflops"] else ""))
            del a, b
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
    return rows


def steps(device: torch.device, models, iterations: int, log=print) -> list[dict]:
    import predictor
    from predictor.calibration.step import build_step, time_step

    spec = _spec(device)
    rows = []
    for name in models:
        zoo_name, batch = MODELS[name]
        graphs: dict = {}  # amp -> trace (fp32 and TF32 share one)
        for prec, (amp, tf32) in PRECISIONS.items():
            row = {"model": name, "batch": batch, "precision": prec}
            try:
                if amp not in graphs:
                    graphs[amp] = predictor.trace(zoo_name, batch_size=batch, amp=amp,
                                                  optimizer="adam")
                graph = graphs[amp]
                if spec is not None:
                    row["predicted_ms"] = predictor.predict(
                        graph, spec.id, tf32_matmul=tf32 or None).iteration_ms
                if device.type == "cuda":
                    torch.backends.cuda.matmul.allow_tf32 = tf32
                step = build_step(graph.source, graph.mode, graph.optimizer, batch, device, amp)
                row["measured_ms"] = time_step(step, device, iterations=iterations)
                del step
            except Exception as exc:  # noqa: BLE001 - one failed row must not stop the rest
                row["error"] = " ".join(f"{type(exc).__name__}: {exc}".split())[:160]
            if device.type == "cuda":
                torch.backends.cuda.matmul.allow_tf32 = False
                torch.cuda.empty_cache()
            p, m = row.get("predicted_ms"), row.get("measured_ms")
            if p and m:
                row["error_pct"] = 100.0 * (p - m) / m
            rows.append(row)
            log(f"  {name} b{batch} {prec:<8} measured {m if m is None else round(m, 2)} ms, "
                f"predicted {p if p is None else round(p, 2)} ms"
                + (f" ({row['error_pct']:+.1f} %)" if "error_pct" in row else "")
                + (f"  [{row['error']}]" if "error" in row else ""))
    return rows


def reprice(path: str, log=print) -> list[dict]:
    """The steps of a stored run (``--json``), predicted again for its GPU."""
    import predictor

    with open(path, encoding="utf-8") as f:
        stored = json.load(f)
    graphs: dict = {}
    rows = []
    for r in stored["steps"]:
        if not r.get("measured_ms"):
            continue
        zoo_name, _ = MODELS[r["model"]]
        amp, tf32 = PRECISIONS[r["precision"]]
        key = (zoo_name, r["batch"], amp)
        if key not in graphs:
            graphs[key] = predictor.trace(zoo_name, batch_size=r["batch"], amp=amp,
                                          optimizer="adam")
        now = predictor.predict(graphs[key], stored["device"],
                                tf32_matmul=tf32 or None).iteration_ms
        m = r["measured_ms"]
        row = {"model": r["model"], "batch": r["batch"], "precision": r["precision"],
               "measured_ms": m, "stored_predicted_ms": r.get("predicted_ms"),
               "predicted_ms": now, "error_pct": 100.0 * (now - m) / m}
        rows.append(row)
        was = r.get("error_pct")
        log(f"  {r['model']} b{r['batch']} {r['precision']:<8} measured {m:.2f} ms, predicted "
            f"{now:.2f} ms ({row['error_pct']:+.1f} %"
            + (f"; stored {r['predicted_ms']:.2f} ms, {was:+.1f} %)" if was is not None else ")"))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="resnet50,bert-large",
                    help=f"comma-separated, from {', '.join(MODELS)}")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--sizes", default="4096,8192", help="square matmul sizes")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--iterations", type=int, default=10, help="timed steps per model")
    ap.add_argument("--json", help="also write the figures to this file")
    ap.add_argument("--reprice", metavar="FILE",
                    help="no measuring: predict the steps of a stored --json run again")
    args = ap.parse_args(argv)
    if args.reprice:
        errs = [abs(r["error_pct"]) for r in reprice(args.reprice)]
        if errs:
            print(f"steps: mean |error| {np.mean(errs):.1f} % over {len(errs)}")
        return 0
    models = [m for m in args.models.split(",") if m]
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        ap.error(f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(MODELS)}")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        ap.error("CUDA is not available on this machine")
    sizes = [int(s) for s in args.sizes.split(",")]
    if device.type != "cuda":
        sizes = [min(s, 256) for s in sizes]
    spec = _spec(device)
    print(f"device {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}"
          f" -> spec {spec.id if spec else None}; torch {torch.__version__}", file=sys.stderr)
    out = {"device": spec.id if spec else str(device), "torch": torch.__version__,
           "matmuls": matmuls(device, sizes, args.repeats),
           "steps": steps(device, models, args.iterations)}
    if args.json:
        from predictor.io import atomic_write_text

        atomic_write_text(args.json, json.dumps(out, indent=1))
    errs = [abs(r["error_pct"]) for r in out["steps"] if "error_pct" in r]
    if errs:
        print(f"steps: mean |error| {np.mean(errs):.1f} % over {len(errs)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
