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

A second table, twelve GPUs from a Quadro RTX 8000 to an H100 SXM5: Lambda's
PyTorch benchmark (`LAMBDA_COLUMNS`), the script in the pytorch-22.10 NGC
container, one GPU, at the largest batch each GPU's memory took (1.3 to 10
million samples). Each figure is priced as its run's log says it trained
(`lambda_runs`, `lambda_table`): the fp16 column ran apex's O2 (a 16-bit
model with fp32 master weights: the fp32 trace priced in float16), except on
the A100 80GB boards and the two H100s, whose fp16-column runs printed
`amp : False` and trained in fp32 with TF32 matmuls, as the fp32 column does
on Ampere and newer. The published figure is the better of the run's two
epochs. Spearman's rank correlation across the GPUs, per column, says
whether they come out in the published order.
"""

from __future__ import annotations

import argparse
import csv
import functools
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from benchmarks.amp_published import (LAMBDA_FOLDERS, lambda_precision, lambda_source,
                                      o2_graph, print_lambda_summary)

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
# Lambda's columns: (GPU, column, batch, published samples/s), "LambdaCloud
# V100 16GB" the SXM2 part, "Ada A6000" the RTX 6000 Ada. What each run
# trained in is its log's, not its column's (`lambda_runs`): the fp16
# column's runs on the A100 80GB boards and both H100s print `amp : False`
# (no apex block: fp32, TF32 matmuls), the others `amp : True` with apex's
# O2 (the model cast to fp16, fp32 master weights), not torch.autocast.
LAMBDA_COLUMNS = [
    ("QUADRO-RTX-8000", "fp16", 10_000_000, 19_801_310),
    ("V100-SXM2-16GB", "fp16", 2_560_000, 23_476_979),
    ("RTX-3090", "fp16", 4_278_184, 25_118_176),
    ("A100-PCIE-40GB", "fp16", 7_500_000, 37_012_517),
    ("A100-PCIE-80GB", "fp16", 10_000_000, 29_393_923),
    ("A100-SXM4-80GB", "fp16", 10_000_000, 30_787_381),
    ("RTX-6000-ADA", "fp16", 10_000_000, 33_148_978),
    ("RTX-A6000", "fp16", 10_000_000, 25_357_954),
    ("RTX-4090", "fp16", 4_278_184, 32_192_491),
    ("H100-PCIE-80GB", "fp16", 10_000_000, 34_483_571),
    ("A10", "fp16", 4_278_184, 15_343_208),
    ("H100-SXM5-80GB", "fp16", 10_000_000, 52_418_903),
    ("QUADRO-RTX-8000", "fp32", 5_000_000, 8_501_458),
    ("V100-SXM2-16GB", "fp32", 1_280_000, 9_932_793),
    ("RTX-3090", "fp32", 2_516_582, 14_714_953),
    ("A100-PCIE-40GB", "fp32", 4_000_000, 24_053_576),
    ("A100-PCIE-80GB", "fp32", 8_000_000, 27_394_043),
    ("A100-SXM4-80GB", "fp32", 8_000_000, 28_653_595),
    ("RTX-6000-ADA", "fp32", 5_000_000, 16_916_224),
    ("RTX-A6000", "fp32", 5_000_000, 13_803_937),
    ("RTX-4090", "fp32", 2_516_582, 17_476_573),
    ("H100-PCIE-80GB", "fp32", 8_000_000, 32_325_375),
    ("A10", "fp32", 2_516_582, 9_069_169),
    ("H100-SXM5-80GB", "fp32", 8_000_000, 49_094_300),
]
# Lambda's logs of those runs (pytorch/results/<folder>/PyTorch_ncf_FP16|FP32/
# <log> in the same repository): batch, the amp flag, apex's level, each
# epoch's throughput; one row per log, some subfolders holding several runs.
LAMBDA_RUNS = Path(__file__).resolve().parent / "data" / "lambda_ncf" / "runs.tsv"


@functools.lru_cache(maxsize=None)
def lambda_runs() -> tuple:
    """Every logged run (`LAMBDA_RUNS`) as a dict: GPU, column, batch,
    whether it ran apex's O2 (`o2`), its best epoch's samples/s."""
    rows = csv.DictReader((line for line in LAMBDA_RUNS.read_text().splitlines()
                           if not line.startswith("#")), delimiter="\t")
    return tuple({"gpu": LAMBDA_FOLDERS[r["folder"]],
                  "column": r["subfolder"].rsplit("_", 1)[1].lower(),
                  "batch": int(r["batch_size"]), "o2": r["apex_opt_level"] == "O2",
                  "best": float(r["best_train_throughput"]), "log": r["log_filename"]}
                 for r in rows)


def lambda_run(gpu: str, column: str, published: float) -> dict:
    """The logged run a published figure is: the one of that GPU and column
    whose best epoch is it, to the sample/s (the table's RTX 6000 Ada figure
    is its log's 33,148,979.008 less one)."""
    for run in lambda_runs():
        if run["gpu"] == gpu and run["column"] == column and abs(run["best"] - published) < 1.5:
            return run
    raise LookupError(f"no logged NCF run of {gpu} ({column}) gives {published:,.0f}")


def lambda_table() -> list[tuple]:
    """Lambda's figures as their runs trained: (GPU, precision, batch,
    published, column), precision "amp" for apex O2, else "fp32" / "tf32"."""
    out = []
    for gpu, column, batch, published in LAMBDA_COLUMNS:
        o2 = lambda_run(gpu, column, published)["o2"]
        out.append((gpu, "amp" if o2 else lambda_precision(gpu, False), batch, published, column))
    return out


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
    same graphs (read, never changed). Apex's O2 prices the fp32 trace as a
    16-bit model with fp32 master weights (`amp_published.o2_graph`), as
    benchmarks.amp_published does for BERT's O2 rows."""
    import predictor

    return {prec: predictor.trace(build, loss_fn="mean", optimizer="adam-fused",
                                  amp="fp16" if prec == "amp" else None)
            for prec in ("fp32", "amp")}


def predict_rows(table=None) -> list[dict]:
    """One dict per figure of `table` (default PUBLISHED, NVIDIA's runs,
    mixed precision under autocast; `lambda_table()`, Lambda's, mixed
    precision under apex O2), priced at its own batch."""
    import predictor

    graphs = _graphs()
    out = []
    for row in (PUBLISHED if table is None else table):
        gpu, prec, batch, published = row[:4]
        column = row[4] if len(row) > 4 else None
        o2 = prec == "amp" and column is not None
        g = graphs["amp" if prec == "amp" and not o2 else "fp32"]
        p = predictor.predict(o2_graph(g) if o2 else g, gpu, batch_size=batch,
                              tf32_matmul=prec == "tf32")
        predicted = batch / p.iteration_ms * 1e3
        r = {"gpu": gpu, "precision": prec, "batch": batch, "published": published,
             "program": "o2" if o2 else ("autocast" if prec == "amp" else "fp32"),
             "predicted": predicted, "error_pct": 100 * (predicted / published - 1),
             "step_ms": p.iteration_ms, "by_family": p.by_family()}
        if column is not None:
            r["group"] = f"{column} column"
        out.append(r)
    return out


def main(argv=None) -> int:
    args = breakdown_args(__doc__, argv)
    nvidia, lam = predict_rows(), predict_rows(lambda_table())
    for source, rows in ((SOURCE, nvidia), (LAMBDA_SOURCE, lam)):
        print(source)
        print("\n| GPU | column | precision | traced as | batch | published samples/s "
              "| predicted | error | predicted step ms |")
        print("| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: |")
        for r in rows:
            print(f"| {r['gpu']} | {r.get('group', '-').split()[0]} | {r['precision']} | "
                  f"{r['program']} | {r['batch']:,} | "
                  f"{r['published'] / 1e6:.2f}M | {r['predicted'] / 1e6:.2f}M | "
                  f"{r['error_pct']:+.1f} % | {r['step_ms']:.1f} |")
        print_summary(rows, args.breakdown)
        print()
    print_lambda_summary(nvidia, lam)
    return 0


def breakdown_parser(doc: str) -> argparse.ArgumentParser:
    """The published-throughput harnesses' command line (`--breakdown`),
    described by the first paragraph of their docstring `doc`."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--breakdown", action="store_true", help="each row's time by op family")
    return ap


def breakdown_args(doc: str, argv=None) -> argparse.Namespace:
    """`breakdown_parser`'s arguments from `argv`."""
    return breakdown_parser(doc).parse_args(argv)


def step_row(model: str, gpu: str, precision: str, batch: int, published: float, items: float,
             p, source: str) -> dict:
    """One published throughput figure against the predicted step `p`
    (a `predictor.Prediction`): `items` (samples, frames, tokens) a step at
    `published` a second, the shared row of the Transformer-XL, WaveGlow and
    Tacotron 2 harnesses."""
    predicted = items / p.iteration_ms * 1e3
    return {"model": model, "gpu": gpu, "precision": precision, "batch": batch,
            "published": float(published), "predicted": predicted, "step_ms": p.iteration_ms,
            "overhead_ms": p.overhead_ms, "published_step_ms": items / published * 1e3,
            "error_pct": 100.0 * (predicted / published - 1),
            "unsupported": dict(p.unsupported), "by_family": p.by_family(), "source": source}


def print_precision_means(rows: list[dict], groups: dict[str, tuple]) -> None:
    """The mean |error| of each group of precisions (name -> precisions)."""
    for name, precs in groups.items():
        g = [r for r in rows if r["precision"] in precs]
        if g:
            print(f"{name}: mean |error| {np.mean([abs(r['error_pct']) for r in g]):.1f} % "
                  f"over {len(g)}")


def lambda_fp32_rows(graph, model: str, table, per_sample: float, source: str) -> list[dict]:
    """A Lambda fp32-column table's figures, (GPU, batch, published) each,
    priced on `graph`: TF32 where the GPU has it (the NGC containers switch
    it on, `amp_published.lambda_precision`), `per_sample` items a sample."""
    import predictor

    out = []
    for gpu, batch, published in table:
        prec = lambda_precision(gpu, False)
        p = predictor.predict(graph, gpu, batch_size=batch,
                              tf32_matmul=True if prec == "tf32" else None)
        out.append(step_row(model, gpu, prec, batch, published, batch * per_sample, p, source))
    return out


def print_fp32_check(rows: list[dict], unit: str) -> None:
    """Such a table's step table, mean |error| by precision, rank correlation
    and unpriced ops (the WaveGlow and Tacotron 2 harnesses' report)."""
    from benchmarks.amp_published import spearman

    print_step_table(rows, unit)
    print_precision_means(rows, {"fp32": ("fp32",), "tf32": ("tf32",)})
    rho = spearman([r["published"] for r in rows], [r["predicted"] for r in rows])
    print(f"Spearman across GPUs {rho:.2f}")
    if rows[0]["unsupported"]:
        print(f"priced by the fallback estimate: {rows[0]['unsupported']}")


def print_step_table(rows: list[dict], unit: str) -> None:
    """Each row's published and predicted throughput (`unit` a second), its
    error and both step times, with a model column where `rows` hold more
    than one model (the Transformer-XL and WaveGlow harnesses' table)."""
    models = len({r["model"] for r in rows}) > 1
    head = "| model " if models else ""
    print(f"\n{head}| GPU | precision | batch | published {unit}/s | predicted | error "
          "| published step ms | predicted |")
    print(("| --- " if models else "") + "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        first = f"| {r['model']} " if models else ""
        print(f"{first}| {r['gpu']} | {r['precision']} | {r['batch']} | "
              f"{r['published']:,.0f} | {r['predicted']:,.0f} | {r['error_pct']:+.1f} % | "
              f"{r['published_step_ms']:.0f} | {r['step_ms']:.0f} |")


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
