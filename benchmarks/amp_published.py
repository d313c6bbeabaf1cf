"""Predicted against published single-GPU training throughput, fp32/TF32 and AMP.

    python -m benchmarks.amp_published

A reported check, not a fit: nothing in the predictor is tuned to these
figures. Each row: (model, GPU, precision, batch size per GPU, published
samples/s, source). Precision "tf32" is fp32 with TF32 matmuls and convolutions
(what NVIDIA's "TF32" columns run), "fp32" is fp32 on a GPU without TF32, "amp"
is torch.autocast fp16 with a GradScaler.
"""

from __future__ import annotations

import argparse

import numpy as np

RN50 = ("NVIDIA DeepLearningExamples, PyTorch/Classification/ConvNets/resnet50v1.5/README.md, "
        "'Training performance results', 1 GPU, pytorch-21.03 NGC container")

PUBLISHED = [
    ("resnet50", "A100-SXM4-80GB", "tf32", 256, 938.0, RN50),
    ("resnet50", "A100-SXM4-80GB", "amp", 256, 2470.0, RN50),
    ("resnet50", "V100-SXM2-16GB", "fp32", 256, 367.0, RN50),
    ("resnet50", "V100-SXM2-16GB", "amp", 256, 1200.0, RN50),
    ("resnet50", "V100-SXM2-32GB", "fp32", 256, 356.0, RN50),
    ("resnet50", "V100-SXM2-32GB", "amp", 256, 1156.0, RN50),
]


def run() -> list[dict]:
    import predictor

    graphs: dict = {}
    out = []
    for model, gpu, prec, batch, published, source in PUBLISHED:
        amp = "fp16" if prec == "amp" else None
        key = (model, amp)
        if key not in graphs:
            graphs[key] = predictor.trace(model, batch_size=batch, amp=amp)
        p = predictor.predict(graphs[key], gpu, batch_size=batch,
                              tf32_matmul=True if prec == "tf32" else None)
        predicted = batch / p.iteration_ms * 1e3
        out.append({"model": model, "gpu": gpu, "precision": prec, "batch": batch,
                    "published": published, "predicted": predicted,
                    "error_pct": 100.0 * (predicted - published) / published, "source": source})
    return out


def main(argv=None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    rows = run()
    print("| model | GPU | precision | batch | published samples/s | predicted | error |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['model']} | {r['gpu']} | {r['precision']} | {r['batch']} | "
              f"{r['published']:,.0f} | {r['predicted']:,.0f} | {r['error_pct']:+.1f} % |")
    err = np.array([abs(r["error_pct"]) for r in rows])
    print(f"\nmean |error| {err.mean():.1f} % over {len(rows)} figures")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
