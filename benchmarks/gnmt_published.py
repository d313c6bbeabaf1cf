"""GNMT v2 training throughput predicted against NVIDIA's published single-GPU
figures: the check of the recurrent layers' pricing (kernels.recurrent).

    python -m benchmarks.gnmt_published

A reported check, not a fit: nothing in the predictor is tuned to these
figures. NVIDIA's DeepLearningExamples README for its PyTorch GNMT
(PyTorch/Translation/GNMT/README.md, the pytorch-20.06-py3 NGC container,
"Training throughput results", 1 GPU, batch 128 a GPU) gives tokens/s
averaged over a training epoch of WMT16 English-German on a DGX-1 (V100
16GB: fp32 and mixed precision) and a DGX A100 (A100 40GB: TF32 and mixed
precision). Its DGX-2H row is of the 450 W V100 SXM3 32GB H, which the GPU
database does not hold.

What `train.py` runs there (`seq2seq/train/trainer.py` of that version): the
zoo's GNMT (`predictor.zoo.seq2seq`: 4 + 4 LSTM layers of 1,024, the first
encoder layer bidirectional, Bahdanau attention on the first decoder layer,
a 32,320-token classifier), Adam from `torch.optim` (PyTorch 1.6: one
parameter at a time, so `adam-loop`), `clip_grad_norm_` at 5.0 (`+clip`);
"mixed precision" is apex's `amp.initialize(opt_level="O2")`: the model in
fp16, fp32 master weights for the optimizer, dynamic loss scaling; "TF32"
(`--math tf32`) the fp32 program with TF32 matmuls and convolutions
(`tf32_matmul=True` here). The
figure is (source + target tokens) over the wall time of each iteration,
averaged; batches are bucketed by length up to 50 tokens.

Traced here at batch 128 with source and target of L tokens, predicted
tokens/s = 2 x 128 x L over the predicted step. The step is nearly
proportional to L, so the figure moves little with it; the table gives L = 25
and 50. Mixed precision is traced two ways: under `amp="fp16"` (autocast: the
LSTMs and GEMMs in fp16, softmax and loss in fp32, fp32 weights cast every
step, fp32 Adam; the headline) and as a half-precision model
(`dtype="float16"`: O2's fp16 activations everywhere, but its optimizer in
fp16 too, without O2's fp32 master weights).

A second table, ten GPUs from a Quadro RTX 8000 to an H100 PCIe: Lambda's
PyTorch benchmark (`LAMBDA`), the same DeepLearningExamples script in the
pytorch-22.10 NGC container, one GPU, at the largest batch each GPU's memory
took. Its "fp32" column is TF32 on Ampere and newer: NGC containers switch
TF32 on for cuBLAS (TORCH_ALLOW_TF32_CUBLAS_OVERRIDE) and PyTorch for
cuDNN, and the script's `--math fp32` leaves both as they are. Its fp16
column is the script's `--math fp16`, apex O2 as above. Each row is priced at
its own batch; Spearman's rank correlation across the ten GPUs says whether
they come out in the published order.
"""

from __future__ import annotations

import argparse
import functools

import numpy as np

from benchmarks.amp_published import lambda_source, print_lambda_summary

SOURCE = ("NVIDIA DeepLearningExamples, PyTorch/Translation/GNMT/README.md (the version of "
          "the pytorch-20.06-py3 container; stored copy: github.com/nlqq/NVIDIA-DeepLearningExamples "
          "commit 68c8ab4), 'Training throughput results', 1 GPU, batch 128")

BATCH = 128
# (GPU, precision, batch, published tokens/s)
PUBLISHED = [
    ("V100-SXM2-16GB", "fp32", BATCH, 21860),
    ("V100-SXM2-16GB", "amp", BATCH, 76438),
    ("A100-SXM4-40GB", "tf32", BATCH, 83214),
    ("A100-SXM4-40GB", "amp", BATCH, 140909),
]

LAMBDA_SOURCE = lambda_source("gnmt")
# The GPUs of benchmarks.amp_published's Lambda rows ("LambdaCloud V100
# 16GB" is the SXM2 part, "Ada A6000" the RTX 6000 Ada). "fp32" where the
# GPU has no TF32 (Volta, Turing), "tf32" on Ampere and newer.
LAMBDA = [
    ("QUADRO-RTX-8000", "amp", 968, 88498),
    ("V100-SXM2-16GB", "amp", 256, 79111),
    ("RTX-3090", "amp", 464, 86080),
    ("A100-PCIE-40GB", "amp", 800, 186947),
    ("A100-PCIE-80GB", "amp", 1520, 227949),
    ("A100-SXM4-80GB", "amp", 1520, 243500),
    ("RTX-6000-ADA", "amp", 968, 160184),
    ("RTX-A6000", "amp", 968, 116438),
    ("RTX-4090", "amp", 464, 159511),
    ("H100-PCIE-80GB", "amp", 1520, 332521),
    ("QUADRO-RTX-8000", "fp32", 576, 21616),
    ("V100-SXM2-16GB", "fp32", 128, 24109),
    ("RTX-3090", "tf32", 288, 44869),
    ("A100-PCIE-40GB", "tf32", 512, 101476),
    ("A100-PCIE-80GB", "tf32", 1024, 120980),
    ("A100-SXM4-80GB", "tf32", 1024, 129911),
    ("RTX-6000-ADA", "tf32", 576, 80854),
    ("RTX-A6000", "tf32", 576, 62271),
    ("RTX-4090", "tf32", 288, 84598),
    ("H100-PCIE-80GB", "tf32", 1024, 162431),
]
LENGTHS = (25, 50)
OPTIMIZER = "adam-loop+clip"


@functools.lru_cache(maxsize=None)
def _graphs(lengths: tuple) -> dict:
    """The traced steps by (precision, length), once per process: both tables
    price the same graphs (read, never changed)."""
    import predictor

    graphs = {}
    for seq in lengths:
        graphs[("fp32", seq)] = predictor.trace("gnmt", batch_size=BATCH, seq_len=seq,
                                                optimizer=OPTIMIZER)
        graphs[("tf32", seq)] = graphs[("fp32", seq)]
        graphs[("amp", seq)] = predictor.trace("gnmt", batch_size=BATCH, seq_len=seq,
                                               optimizer=OPTIMIZER, amp="fp16")
    return graphs


def predict_rows(lengths=LENGTHS, table=None) -> list[dict]:
    """One dict per published figure of `table` (default PUBLISHED;
    LAMBDA): the predicted tokens/s at each length, and the errors of their
    mean."""
    import predictor

    graphs = _graphs(tuple(lengths))
    out = []
    for gpu, prec, batch, published in (PUBLISHED if table is None else table):
        row = {"gpu": gpu, "precision": prec, "batch": batch, "published": published}
        main, half = [], []
        for seq in lengths:
            tokens = 2 * batch * seq
            p = predictor.predict(graphs[(prec, seq)], gpu, batch_size=batch,
                                  tf32_matmul=prec == "tf32")
            main.append(tokens / p.iteration_ms * 1e3)
            row[f"L{seq}"] = main[-1]
            if prec == "amp":
                h = predictor.predict(graphs[("fp32", seq)], gpu, batch_size=batch,
                                      dtype="float16")
                half.append(tokens / h.iteration_ms * 1e3)
        row["predicted"] = float(np.mean(main))
        row["error_pct"] = 100 * (row["predicted"] / published - 1)
        if half:
            row["half_model"] = float(np.mean(half))
            row["half_model_error_pct"] = 100 * (row["half_model"] / published - 1)
        out.append(row)
    return out


def speedups(rows: list[dict]) -> list[tuple[str, float, float]]:
    """(GPU, published, predicted) mixed-precision speedup over fp32 (TF32
    where that is the other row)."""
    by = {(r["gpu"], r["precision"]): r for r in rows}
    out = []
    for gpu in dict.fromkeys(r["gpu"] for r in rows):
        base = by.get((gpu, "fp32")) or by.get((gpu, "tf32"))
        if (gpu, "amp") in by and base is not None:
            out.append((gpu, by[(gpu, "amp")]["published"] / base["published"],
                        by[(gpu, "amp")]["predicted"] / base["predicted"]))
    return out


def print_table(source: str, rows: list[dict]) -> None:
    print(source)
    cols = " | ".join(f"L = {s}" for s in LENGTHS)
    print(f"\n| GPU | precision | batch | published tokens/s | predicted, {cols} | mean | error "
          "| as a half-precision model |")
    print("| --- | --- | ---: | ---: |" + " ---: |" * len(LENGTHS) + " ---: | ---: | ---: |")
    for r in rows:
        half = (f"{r['half_model']:,.0f} ({r['half_model_error_pct']:+.1f} %)"
                if "half_model" in r else "-")
        lens = " | ".join(f"{r[f'L{s}']:,.0f}" for s in LENGTHS)
        print(f"| {r['gpu']} | {r['precision']} | {r['batch']:,} | {r['published']:,} | {lens} | "
              f"{r['predicted']:,.0f} | {r['error_pct']:+.1f} % | {half} |")
    errs = [abs(r["error_pct"]) for r in rows]
    print(f"\nmean |error| {np.mean(errs):.1f} % over {len(rows)} figures")
    for gpu, pub, pred in speedups(rows):
        print(f"{gpu}: mixed-precision speedup published {pub:.2f}x, predicted {pred:.2f}x")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.parse_args(argv)
    nvidia = predict_rows()
    print_table(SOURCE, nvidia)
    lam = predict_rows(table=LAMBDA)
    print()
    print_table(LAMBDA_SOURCE, lam)
    print_lambda_summary(nvidia, lam)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
