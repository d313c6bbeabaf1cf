"""The ONNX frontend against the fx frontend on full-size models.

    python -m benchmarks.onnx_vs_fx                      # resnet50 and bert-large
    python -m benchmarks.onnx_vs_fx --models resnet50 --keep /tmp/onnx

Exports the zoo's ResNet-50 and bert-large (BertForPreTraining, 24 layers) with
``torch.onnx.export`` (TorchScript exporter, training mode so batch norm and
dropout stay in the graph, dynamic batch and sequence axes), traces both the
ONNX file and the same module with the fx frontend, and prints for training
and inference: op counts per family, GEMM FLOPs, predicted iteration time per
GPU and batch size, and peak memory per batch size, with the ONNX/fx
difference. The CI test
(``tests/test_onnx.py``) runs the same comparison on ResNet-50 and a 2-layer
model with bert-large's layer shapes; this script is the full-size check (the
bert-large export takes minutes and ~6 GB of memory).
"""

from __future__ import annotations

import argparse
import tempfile
import time
import warnings
from pathlib import Path

import torch

import predictor
from predictor.kernels import layout as L

GPUS = ("T4", "V100-SXM2-32GB", "A100-SXM4-80GB", "H100-SXM5-80GB")
GEMM = {"matmul", "conv", "conv_dgrad", "conv_wgrad", "attention", "attention_bwd"}


def _export(model, args, path: Path, names, outputs, dynamic, opset: int) -> float:
    model.train()
    start = time.perf_counter()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, args, str(path), dynamo=False, input_names=names,
                          output_names=outputs, dynamic_axes=dynamic, opset_version=opset,
                          training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=True)
    return time.perf_counter() - start


def _families(graph, batch):
    flops, _ = graph.ops.work(batch)
    out: dict = {}
    for i in range(len(graph.ops)):
        key = (L.PHASE_NAMES[graph.ops.phase[i]], L.FAMILY_NAMES[graph.ops.family[i]])
        c = out.setdefault(key, [0, 0.0])
        c[0] += int(graph.ops.count[i])
        c[1] += float(flops[i] * graph.ops.count[i])
    return out


def compare(name: str, fx, onnx_graph, batches) -> float:
    """Print the comparison; returns the largest |time difference| in %."""
    b0 = batches[-1]
    a, c = _families(fx, b0), _families(onnx_graph, b0)
    same = set(a) == set(c) and all(a[k][0] == c[k][0] for k in a)
    print(f"\n{name} ({fx.mode}): {'same' if same else 'DIFFERENT'} op families and counts"
          f" ({sum(v[0] for v in a.values())} ops fx, {sum(v[0] for v in c.values())} onnx);"
          f" parameters {fx.parameters:,} fx, {onnx_graph.parameters:,} onnx;"
          f" unsupported ONNX ops: {onnx_graph.unsupported or 'none'}")
    if not same:
        for k in sorted(set(a) | set(c)):
            if a.get(k, [0])[0] != c.get(k, [0])[0]:
                print(f"    {k}: {a.get(k, [0])[0]} fx, {c.get(k, [0])[0]} onnx")
    worst = 0.0
    print(f"  {'batch':>5} {'GEMM GFLOP fx':>14} {'onnx':>10} {'diff':>7}   "
          + "  ".join(f"{g:>22}" for g in GPUS))
    for b in batches:
        gf = sum(v[1] for (_, f), v in _families(fx, b).items() if f in GEMM)
        go = sum(v[1] for (_, f), v in _families(onnx_graph, b).items() if f in GEMM)
        cells = []
        for gpu in GPUS:
            tf = predictor.predict(fx, gpu, batch_size=b).iteration_ms
            to = predictor.predict(onnx_graph, gpu, batch_size=b).iteration_ms
            d = (to / tf - 1) * 100
            worst = max(worst, abs(d))
            cells.append(f"{tf:9.2f} {to:9.2f} {d:+5.2f}%")
        print(f"  {b:>5} {gf / 1e9:>14.1f} {go / 1e9:>10.1f} {(go / gf - 1) * 100:>+6.2f}%   "
              + "  ".join(cells))
    print(f"  (ms per iteration: fx, onnx, difference; largest |difference| {worst:.2f} %)")
    return worst


def compare_memory(fx, onnx_graph, batches) -> float:
    """Print the peak memory of both (tensors, allocator-rounded, GiB), with the
    phase it falls in; returns the largest |difference| in %."""
    worst = 0.0
    cells = []
    for b in batches:
        mf = float(fx.memory.peak([b])[1][0]) / 2**30
        mo = float(onnx_graph.memory.peak([b])[1][0]) / 2**30
        d = (mo / mf - 1) * 100
        worst = max(worst, abs(d))
        cells.append(f"batch {b}: {mf:.3f} / {mo:.3f} GiB {d:+.2f}% "
                     f"({onnx_graph.memory.breakdown(b)['peak_phase']})")
    print("  peak tensor memory fx / onnx: " + "; ".join(cells))
    return worst


def resnet50(folder: Path):
    from predictor.zoo import vision

    path = folder / "resnet50.onnx"
    if not path.exists():
        s = _export(vision.build_resnet50(), (torch.randn(2, 3, 224, 224),), path, ["images"],
                    ["logits"], {"images": {0: "batch"}, "logits": {0: "batch"}}, 17)
        print(f"exported {path} in {s:.0f} s ({path.stat().st_size / 1e6:.0f} MB)")
    for mode in ("train", "inference"):
        fx = predictor.trace("resnet50", batch_size=64, mode=mode)
        t = time.perf_counter()
        og = predictor.trace(str(path), batch_size=64, mode=mode, loss_fn="cross_entropy")
        print(f"traced {path.name} ({mode}) in {time.perf_counter() - t:.1f} s")
        yield compare("resnet50", fx, og, (8, 64, 256)), compare_memory(fx, og, (8, 64, 256))


def bert_large(folder: Path):
    from predictor.zoo import hf

    path = folder / "bert-large.onnx"
    if not path.exists():
        model = hf.build_bert_pretraining("bert-large")
        dyn = {"input_ids": {0: "batch", 1: "sequence"}, "mlm": {0: "batch", 1: "sequence"},
               "nsp": {0: "batch"}}
        s = _export(model, (torch.zeros(1, 16, dtype=torch.long),), path, ["input_ids"],
                    ["mlm", "nsp"], dyn, 17)
        del model
        print(f"exported {path} in {s:.0f} s ({path.stat().st_size / 1e6:.0f} MB)")
    for mode in ("train", "inference"):
        fx = predictor.trace(lambda: hf.build_bert_pretraining("bert-large"),
                             (torch.zeros(8, 512, dtype=torch.long),),
                             loss_fn=hf.bert_pretraining_loss, mode=mode, name="bert-large")
        t = time.perf_counter()
        og = predictor.trace(str(path), batch_size=8, seq_len=512, mode=mode,
                             loss_fn="cross_entropy")
        print(f"traced {path.name} ({mode}) in {time.perf_counter() - t:.1f} s")
        yield compare("bert-large", fx, og, (1, 8, 32)), compare_memory(fx, og, (1, 8, 32))


MODELS = {"resnet50": resnet50, "bert-large": bert_large}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="resnet50,bert-large")
    ap.add_argument("--keep", type=Path, help="folder for the exported files (kept)")
    args = ap.parse_args(argv)
    folder = args.keep or Path(tempfile.mkdtemp(prefix="onnx-vs-fx-"))
    folder.mkdir(parents=True, exist_ok=True)
    worst = worst_mem = 0.0
    for name in args.models.split(","):
        for w, m in MODELS[name.strip()](folder):
            worst, worst_mem = max(worst, w), max(worst_mem, m)
    print(f"\nlargest iteration-time difference, ONNX vs fx: {worst:.2f} %")
    print(f"largest peak-memory difference, ONNX vs fx: {worst_mem:.2f} %")
    return 0 if worst <= 5.0 and worst_mem <= 10.0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
