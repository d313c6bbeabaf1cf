"""Predicted against published single-GPU training throughput, fp32/TF32 and AMP.

    python -m benchmarks.amp_published
    python -m benchmarks.amp_published --models bert-large-squad

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

BERT = ("NVIDIA DeepLearningExamples, PyTorch/LanguageModeling/BERT/README.md, 'Fine-tuning "
        "NVIDIA DGX A100 (8x A100 80GB)' and 'Fine-tuning NVIDIA DGX-1 With 32G', SQuAD v1.1, "
        "1 GPU, pytorch:21.11-py3 NGC container")

PUBLISHED = [
    ("resnet50", "A100-SXM4-80GB", "tf32", 256, 938.0, RN50),
    ("resnet50", "A100-SXM4-80GB", "amp", 256, 2470.0, RN50),
    ("resnet50", "V100-SXM2-16GB", "fp32", 256, 367.0, RN50),
    ("resnet50", "V100-SXM2-16GB", "amp", 256, 1200.0, RN50),
    ("resnet50", "V100-SXM2-32GB", "fp32", 256, 356.0, RN50),
    ("resnet50", "V100-SXM2-32GB", "amp", 256, 1156.0, RN50),
    # BERT-large fine-tuned on SQuAD v1.1 (sequence length 384, run_squad.py).
    ("bert-large-squad", "A100-SXM4-80GB", "tf32", 32, 61.5, BERT),
    ("bert-large-squad", "A100-SXM4-80GB", "amp", 32, 110.5, BERT),
    ("bert-large-squad", "V100-SXM2-32GB", "fp32", 8, 12.0, BERT),
    ("bert-large-squad", "V100-SXM2-32GB", "amp", 16, 52.0, BERT),
]

SQUAD_SEQ = 384


def _bert_squad():
    """BERT-large with a span head (BertForQuestionAnswering), as run_squad.py trains it."""
    from predictor.zoo import hf

    return hf._from_config("AutoModelForQuestionAnswering", hf.bert_config("bert-large"))


def _squad_inputs(batch: int) -> dict:
    import torch

    ids = torch.zeros(batch, SQUAD_SEQ, dtype=torch.long)
    return {"input_ids": ids, "token_type_ids": ids, "attention_mask": torch.ones_like(ids)}


def _squad_loss(out):
    """(cross entropy of the start positions + of the end positions) / 2."""
    import torch
    import torch.nn.functional as F

    start, end = out["start_logits"], out["end_logits"]
    target = start.new_zeros(start.shape[0], dtype=torch.long)
    return (F.cross_entropy(start, target) + F.cross_entropy(end, target)) / 2


def _trace(model: str, batch: int, amp):
    import predictor

    if model == "bert-large-squad":
        return predictor.trace(_bert_squad, _squad_inputs, loss_fn=_squad_loss,
                               batch_size=batch, amp=amp, optimizer="adamw",
                               name="bert-large-squad")
    return predictor.trace(model, batch_size=batch, amp=amp)


def run(models=None) -> list[dict]:
    import predictor

    graphs: dict = {}
    out = []
    for model, gpu, prec, batch, published, source in PUBLISHED:
        if models is not None and model not in models:
            continue
        amp = "fp16" if prec == "amp" else None
        key = (model, amp)
        if key not in graphs:
            graphs[key] = _trace(model, batch, amp)
        p = predictor.predict(graphs[key], gpu, batch_size=batch,
                              tf32_matmul=True if prec == "tf32" else None)
        predicted = batch / p.iteration_ms * 1e3
        out.append({"model": model, "gpu": gpu, "precision": prec, "batch": batch,
                    "published": published, "predicted": predicted,
                    "error_pct": 100.0 * (predicted - published) / published, "source": source})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=None,
                    help="comma-separated models of the table (default: all)")
    args = ap.parse_args(argv)
    rows = run(None if args.models is None else args.models.split(","))
    print("| model | GPU | precision | batch | published samples/s | predicted | error |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['model']} | {r['gpu']} | {r['precision']} | {r['batch']} | "
              f"{r['published']:,g} | {r['predicted']:,.1f} | {r['error_pct']:+.1f} % |")
    err = np.array([abs(r["error_pct"]) for r in rows])
    print(f"\nmean |error| {err.mean():.1f} % over {len(rows)} figures")
    for model in dict.fromkeys(r["model"] for r in rows):
        e = np.array([abs(r["error_pct"]) for r in rows if r["model"] == model])
        print(f"{model}: mean |error| {e.mean():.1f} % over {len(e)} figures")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
