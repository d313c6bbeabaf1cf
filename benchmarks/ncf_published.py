"""Neural collaborative filtering (NeuMF) training throughput predicted against
NVIDIA's published single-GPU figures: a check of embedding-heavy steps.

    python -m benchmarks.ncf_published

A reported check, not a fit: nothing in the predictor is tuned to these
figures. NVIDIA's DeepLearningExamples README for its PyTorch NCF
(PyTorch/Recommendation/NCF/README.md, the PyTorch 21.04 NGC container,
"Training performance results", 1 GPU, batch 2^20) gives samples/s averaged
over an epoch of MovieLens-20m on a DGX A100 (A100 40GB: TF32 and mixed
precision) and a DGX-1 (V100 16GB: fp32 and mixed precision).

What `ncf.py` runs there (same README's version; the model as `neumf.py`
defines it, written again here): NeuMF with 138,493 users and 26,744 items,
64 matrix-factorisation factors, an MLP of 256-256-128-64 fed by two
128-wide embeddings, ReLU and dropout 0.5 after each MLP layer, a 128 -> 1
output layer, `BCEWithLogitsLoss(reduction="none")` then a mean, apex's
FusedAdam (one multi-tensor kernel; traced as PyTorch's fused Adam,
`adam-fused`), `torch.cuda.amp` autocast with a GradScaler
for mixed precision, and TF32 matmuls on the A100 (PyTorch 1.9's default).
The published figure is the epoch's samples over its wall time, which also
holds each epoch's negative sampling on the GPU (not modelled here).

A second table, ten GPUs from a Quadro RTX 8000 to an H100 PCIe: Lambda's
PyTorch benchmark (`LAMBDA`), the same script in the pytorch-22.10 NGC
container, one GPU, at the largest batch each GPU's memory took (1.3 to 10
million samples). Its "fp32" column is TF32 on Ampere and newer (NGC
containers switch TF32 on for cuBLAS), its fp16 column the script's `--amp`.
Each row is priced at its own batch; Spearman's rank correlation across the
ten GPUs says whether they come out in the published order.
"""

from __future__ import annotations

import argparse
import functools

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from benchmarks.amp_published import lambda_source, print_lambda_summary

SOURCE = ("NVIDIA DeepLearningExamples, PyTorch/Recommendation/NCF/README.md (commit 05ee986), "
          "'Training performance results', 1 GPU, batch 1,048,576, PyTorch 21.04 NGC container")
USERS, ITEMS, FACTORS, LAYERS = 138_493, 26_744, 64, (256, 256, 128, 64)
BATCH = 2 ** 20

# (GPU, precision, batch, published samples/s)
PUBLISHED = [
    ("A100-SXM4-40GB", "tf32", BATCH, 22.59e6),
    ("A100-SXM4-40GB", "amp", BATCH, 34.08e6),
    ("V100-SXM2-16GB", "fp32", BATCH, 10.42e6),
    ("V100-SXM2-16GB", "amp", BATCH, 21.84e6),
]

LAMBDA_SOURCE = lambda_source("ncf")
# The GPUs of benchmarks.amp_published's Lambda rows ("LambdaCloud V100
# 16GB" is the SXM2 part, "Ada A6000" the RTX 6000 Ada). "fp32" where the
# GPU has no TF32 (Volta, Turing), "tf32" on Ampere and newer.
LAMBDA = [
    ("QUADRO-RTX-8000", "amp", 10_000_000, 19_801_310),
    ("V100-SXM2-16GB", "amp", 2_560_000, 23_476_979),
    ("RTX-3090", "amp", 4_278_184, 25_118_176),
    ("A100-PCIE-40GB", "amp", 7_500_000, 37_012_517),
    ("A100-PCIE-80GB", "amp", 10_000_000, 29_393_923),
    ("A100-SXM4-80GB", "amp", 10_000_000, 30_787_381),
    ("RTX-6000-ADA", "amp", 10_000_000, 33_148_978),
    ("RTX-A6000", "amp", 10_000_000, 25_357_954),
    ("RTX-4090", "amp", 4_278_184, 32_192_491),
    ("H100-PCIE-80GB", "amp", 10_000_000, 34_483_571),
    ("QUADRO-RTX-8000", "fp32", 5_000_000, 8_501_458),
    ("V100-SXM2-16GB", "fp32", 1_280_000, 9_932_793),
    ("RTX-3090", "tf32", 2_516_582, 14_714_953),
    ("A100-PCIE-40GB", "tf32", 4_000_000, 24_053_576),
    ("A100-PCIE-80GB", "tf32", 8_000_000, 27_394_043),
    ("A100-SXM4-80GB", "tf32", 8_000_000, 28_653_595),
    ("RTX-6000-ADA", "tf32", 5_000_000, 16_916_224),
    ("RTX-A6000", "tf32", 5_000_000, 13_803_937),
    ("RTX-4090", "tf32", 2_516_582, 17_476_573),
    ("H100-PCIE-80GB", "tf32", 8_000_000, 32_325_375),
]


class NeuMFStep(nn.Module):
    """NeuMF and its loss: (users, items, labels) -> mean binary cross entropy."""

    def __init__(self, users=USERS, items=ITEMS, factors=FACTORS, layers=LAYERS, dropout=0.5):
        super().__init__()
        self.mf_user = nn.Embedding(users, factors)
        self.mf_item = nn.Embedding(items, factors)
        self.mlp_user = nn.Embedding(users, layers[0] // 2)
        self.mlp_item = nn.Embedding(items, layers[0] // 2)
        self.mlp = nn.ModuleList(nn.Linear(a, b) for a, b in zip(layers[:-1], layers[1:]))
        self.final = nn.Linear(layers[-1] + factors, 1)
        self.dropout = dropout

    def forward(self, user, item, label):
        mf = self.mf_user(user) * self.mf_item(item)
        x = torch.cat((self.mlp_user(user), self.mlp_item(item)), dim=1)
        for layer in self.mlp:
            x = F.dropout(F.relu(layer(x)), self.dropout, self.training)
        logits = self.final(torch.cat((mf, x), dim=1))
        loss = F.binary_cross_entropy_with_logits(logits, label.view(-1, 1), reduction="none")
        return loss.float().view(-1).mean()


def build(batch: int = BATCH):
    """The factory `predictor.trace` takes: (model, example inputs)."""
    inputs = (torch.randint(0, USERS, (batch,)), torch.randint(0, ITEMS, (batch,)),
              torch.rand(batch))
    return NeuMFStep(), inputs


@functools.lru_cache(maxsize=None)
def _graphs() -> dict:
    """The traced steps by program, once per process: both tables price the
    same graphs (read, never changed)."""
    import predictor

    return {prec: predictor.trace(build, loss_fn="mean", optimizer="adam-fused",
                                  amp="fp16" if prec == "amp" else None)
            for prec in ("fp32", "amp")}


def predict_rows(table=None) -> list[dict]:
    """One dict per figure of `table` (default PUBLISHED; LAMBDA), priced at
    its own batch."""
    import predictor

    graphs = _graphs()
    out = []
    for gpu, prec, batch, published in (PUBLISHED if table is None else table):
        g = graphs["amp" if prec == "amp" else "fp32"]
        p = predictor.predict(g, gpu, batch_size=batch, tf32_matmul=prec == "tf32")
        predicted = batch / p.iteration_ms * 1e3
        out.append({"gpu": gpu, "precision": prec, "batch": batch, "published": published,
                    "predicted": predicted, "error_pct": 100 * (predicted / published - 1),
                    "step_ms": p.iteration_ms, "by_family": p.by_family()})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--breakdown", action="store_true", help="each row's time by op family")
    args = ap.parse_args(argv)
    nvidia, lam = predict_rows(), predict_rows(LAMBDA)
    for source, rows in ((SOURCE, nvidia), (LAMBDA_SOURCE, lam)):
        print(source)
        print("\n| GPU | precision | batch | published samples/s | predicted | error "
              "| predicted step ms |")
        print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
        for r in rows:
            print(f"| {r['gpu']} | {r['precision']} | {r['batch']:,} | "
                  f"{r['published'] / 1e6:.2f}M | {r['predicted'] / 1e6:.2f}M | "
                  f"{r['error_pct']:+.1f} % | {r['step_ms']:.1f} |")
        print_summary(rows, args.breakdown)
        print()
    print_lambda_summary(nvidia, lam)
    return 0


def print_summary(rows: list[dict], breakdown: bool) -> None:
    """The mean |error| of `rows`, and with `breakdown` each row's time by
    op family (the published-throughput harnesses' closing lines)."""
    print(f"\nmean |error| {np.mean([abs(r['error_pct']) for r in rows]):.1f} % "
          f"over {len(rows)} figures")
    if breakdown:
        for r in rows:
            print(f"\n{r['gpu']} {r['precision']}:\n{r['by_family'].round(2).to_string()}")


if __name__ == "__main__":
    raise SystemExit(main())
