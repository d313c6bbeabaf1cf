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

Each step is traced at the padded length its batch runs at, and the
prediction is averaged as the script averages its figure. The script buckets
its batches by length (`padded_length`, `bucket_mix`): every batch comes from
one of five length buckets and is padded to that bucket's limit, 9, 19, 29,
39 or 50 tokens a side, while the figure counts real tokens only, a quarter
fewer. Predicted tokens/s = the mean over batches of their real tokens over
the predicted step at their padded length. Mixed precision is traced two
ways: under `amp="fp16"` (autocast: the LSTMs and GEMMs in fp16, softmax and
loss in fp32, fp32 weights cast every step, fp32 Adam; the headline) and as
a half-precision model (`dtype="float16"`: O2's fp16 activations
everywhere, but its optimizer in fp16 too, without O2's fp32 master
weights). Not modelled: the first encoder layer runs packed sequences, so
its two directions (2 of the 9 recurrent layers' passes) skip the padding.
Lambda's runs train on a 160,078-pair part of the corpus whose vocabulary
the script pads to 31,800 in fp16 and leaves at 31,794 in fp32; each of its
runs is traced with its own (`LAMBDA_VOCAB`), NVIDIA's with the zoo's
32,320.

A second table, ten GPUs from a Quadro RTX 8000 to an H100 PCIe: Lambda's
PyTorch benchmark (`LAMBDA`), the same DeepLearningExamples script in the
pytorch-22.10 NGC container, one GPU, at the largest batch each GPU's memory
took. Its "fp32" column is TF32 on Ampere and newer: NGC containers switch
TF32 on for cuBLAS (TORCH_ALLOW_TF32_CUBLAS_OVERRIDE) and PyTorch for
cuDNN, and the script's `--math fp32` leaves both as they are. Its fp16
column is the script's `--math fp16`, apex O2 as above. Each row is priced at
its own batch, over the batches its run logged (Lambda's result logs, every
tenth iteration's wall time and tokens/s: `LOGS`), which give each logged
batch's real tokens and so its bucket; the published figure is the last
epoch's mean of the per-iteration rates. NVIDIA's runs, over the full
corpus, are priced over the bucket mix pooled from those logs. Spearman's
rank correlation across the ten GPUs says whether they come out in the
published order.
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path

import numpy as np

from benchmarks.amp_published import (LAMBDA_EARLY_FOLDERS, LAMBDA_FOLDERS,
                                      lambda_precision, lambda_source, print_by_standing,
                                      print_lambda_summary, standing_of)
import predictor
from benchmarks.plotting import identity_axes, new_figure, save
from predictor.zoo.base import token_loss
from predictor.zoo.seq2seq import GNMT, GNMT_VOCAB, gnmt_inputs

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
    # Lambda's later A10 and H100 SXM5 rows (benchmarks.amp_published,
    # LAMBDA_LATER_*), at the batch each run's log prints.
    ("A10", "amp", 400, 67836),
    ("A10", "tf32", 256, 37527),
    ("H100-SXM5-80GB", "amp", 1520, 467071),
    ("H100-SXM5-80GB", "tf32", 1024, 220229),
    # The GH200 and the B200 (benchmarks.amp_published, LAMBDA_V2_*): the
    # GH200's from Lambda's v2 tables, the B200's fp16 from its fp16 table
    # and its fp32 from the run's log (its last epoch's figure, as the
    # tables are compiled); batches as each run's log prints.
    ("GH200-96GB", "amp", 1648, 536445),
    ("GH200-96GB", "tf32", 1152, 262102),
    ("B200", "amp", 3968, 852308),
    ("B200", "tf32", 2688, 433179),
]
OPTIMIZER = "adam-loop+clip"

# Lambda's logs of the runs above (pytorch/results/<folder>/PyTorch_gnmt_FP16|FP32/
# in the same repository; each file names its log): every tenth iteration's
# wall time and tokens/s as printed, one file per run
# (benchmarks/data/lambda_gnmt/<folder>__<FP16|FP32>.tsv).
LOGS = Path(__file__).resolve().parent / "data" / "lambda_gnmt"

# The script's batching (seq2seq/data/sampler.py, BucketingSampler, and
# train.py's defaults): sentence pairs of at most 50 tokens a side (BOS and
# EOS included) fall into 5 buckets of width 10 by the longer side, the last
# also taking 50; every batch is drawn from one bucket and padded to its
# longest source and its longest target. At these batch sizes (128 or more
# from a bucket) the longest is the bucket's limit, so a batch of bucket k
# runs at L = 10k + 9 tokens a side (50 in the last), whatever its sentences'
# own lengths: a quarter of the positions are padding on average. The
# published figure counts real tokens (source + target - 1) and is the
# mean over an epoch's iterations of each one's tokens / wall time.
BUCKET_WIDTH = 10
MAX_LEN = 50
BUCKETS = 5


def padded_length(tokens_a_side: float) -> int:
    """The padded length of a bucketed batch whose sentences have
    `tokens_a_side` real tokens a side on average. A bucket's sentences
    average 6.7, 13.5, 22.5, 31.5 and 40.8 tokens a side in Lambda's logs,
    each well inside its bucket, so the mean says the bucket."""
    k = min(int(tokens_a_side // BUCKET_WIDTH), BUCKETS - 1)
    return MAX_LEN if k == BUCKETS - 1 else BUCKET_WIDTH * (k + 1) - 1


def read_log(path: Path, folders: dict | None = None) -> dict:
    """One run's log (`folders`: its folder's GPU, default LAMBDA_FOLDERS):
    GPU, program, batch, the figure Lambda publishes (its last epoch's
    training tokens/s) and the logged iterations (epoch, i, wall s,
    tokens/s)."""
    folder, math = path.stem.split("__")[:2]
    meta = {}
    rows = []
    for line in path.read_text().splitlines():
        if line.startswith("#"):
            if "train_batch_size=" in line:
                meta["batch"] = int(line.split("=")[1])
            elif "Performance:" in line:
                meta["published"] = float(line.split("Training:")[1].split()[0])
        elif line and line[0].isdigit():
            ep, i, _n, t, _ta, _d, tok, _tka = line.split("\t")
            rows.append((int(ep), int(i), float(t), float(tok)))
    gpu = (LAMBDA_FOLDERS if folders is None else folders)[folder]
    return {"gpu": gpu, "precision": lambda_precision(gpu, math == "FP16"), "batch": meta["batch"],
            "published": meta["published"], "iterations": np.array(rows, dtype=float),
            "file": path.name}


@functools.lru_cache(maxsize=None)
def lambda_logs() -> tuple:
    """Every run's log (`read_log`), once per process."""
    return tuple(read_log(p) for p in sorted(LOGS.glob("*.tsv")))


def logged_batches(log: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(padded length, real tokens, wall s) of each logged iteration but the
    first of an epoch, whose time is the data loader's start."""
    it = log["iterations"]
    it = it[it[:, 1] > 0]
    tokens = it[:, 2] * it[:, 3]
    lengths = np.array([padded_length(t / (2 * log["batch"])) for t in tokens])
    return lengths, tokens, it[:, 2]


@functools.lru_cache(maxsize=None)
def bucket_mix() -> tuple:
    """((padded length, share of batches, real tokens a side), ...) pooled
    over every logged iteration of Lambda's twenty runs: the corpus's length
    mix under the script's bucketing (Lambda's 148,120 pairs of WMT16
    English-German; NVIDIA's runs take the full corpus, assumed to mix alike)."""
    lengths, sides = [], []
    for log in lambda_logs():
        ln, tok, _ = logged_batches(log)
        lengths.append(ln)
        sides.append(tok / (2 * log["batch"]))
    lengths, sides = np.concatenate(lengths), np.concatenate(sides)
    return tuple((int(n), float(np.mean(lengths == n)), float(sides[lengths == n].mean()))
                 for n in np.unique(lengths))


# The vocabulary a run's classifier and embedding have: the script pads the
# BPE vocabulary to a multiple of 8 for `--math fp16` and leaves it as read
# for `--math fp32` (seq2seq/utils.py, pad_vocabulary, in the container's
# version), and Lambda's logs print 31,794 for their fp32 runs
# (`Linear(in_features=1024, out_features=31794)`), so 31,800 for fp16. Its
# fp32 runs on TF32 boards therefore run the classifier's three GEMMs on
# tensor cores with a dim that is not a multiple of 4 (kernels.precision's
# alignment rule). NVIDIA's runs take the full corpus's vocabulary padded
# (its A100 runs `--math tf32`, which that README's version pads too): the
# zoo's 32,320.
LAMBDA_VOCAB = {"amp": 31800, "fp32": 31794, "tf32": 31794}


@functools.lru_cache(maxsize=None)
def _graph(precision: str, seq: int, vocab: int = GNMT_VOCAB):
    """The traced step at `seq` tokens a side with a classifier of `vocab`
    classes, once per process (read, never changed)."""
    return predictor.trace(lambda: GNMT(vocab), lambda b: gnmt_inputs(b, seq),
                           loss_fn=token_loss, batch_size=BATCH, optimizer=OPTIMIZER,
                           amp="fp16" if precision == "amp" else None, name="gnmt")


def step_s(gpu: str, precision: str, batch: int, seq: int, dtype=None,
           vocab: int = GNMT_VOCAB) -> float:
    """Predicted seconds of one step of `batch` pairs padded to `seq`."""
    graph = _graph("fp32" if dtype else precision, seq, vocab)
    p = predictor.predict(graph, gpu, batch_size=batch, tf32_matmul=precision == "tf32",
                          dtype=dtype)
    return p.iteration_ms / 1e3


def logged_run_step_s(log: dict, seq: int, dtype=None) -> float:
    """Predicted seconds of one step of a logged Lambda run (`read_log`) at
    padded length `seq`, with the vocabulary its script built."""
    return step_s(log["gpu"], log["precision"], log["batch"], seq, dtype,
                  LAMBDA_VOCAB[log["precision"]])


def _log_for(gpu: str, precision: str, batch: int) -> dict | None:
    for log in lambda_logs():
        if (log["gpu"], log["precision"], log["batch"]) == (gpu, precision, batch):
            return log
    return None


def _rate_from_log(log: dict, dtype=None) -> tuple[float, float]:
    """(predicted tokens/s over a logged run's batches, median error of the
    predicted step against the logged ones, %)."""
    lengths, tokens, wall = logged_batches(log)
    steps = {int(n): logged_run_step_s(log, int(n), dtype) for n in np.unique(lengths)}
    pred = np.array([steps[int(n)] for n in lengths])
    return float(np.mean(tokens / pred)), float(100 * np.median(wall / pred - 1))


def _predicted_rate(gpu, precision, batch, dtype=None) -> tuple[float, float | None]:
    """(predicted tokens/s as the script averages it, median per-iteration
    error of the step or None). With a log of the run: the mean over its
    logged batches of their real tokens over the predicted step at their
    padded length; without one: the same over the pooled bucket mix."""
    log = _log_for(gpu, precision, batch)
    if log is not None:
        return _rate_from_log(log, dtype)
    rate = sum(share * 2 * batch * side / step_s(gpu, precision, batch, n, dtype)
               for n, share, side in bucket_mix())
    return float(rate), None


def predict_rows(table=None) -> list[dict]:
    """One dict per published figure of `table` (default PUBLISHED;
    LAMBDA): the predicted tokens/s of the script's bucketed batches and its
    error; for mixed precision also the figure as a half-precision model."""
    out = []
    for gpu, prec, batch, published in (PUBLISHED if table is None else table):
        row = {"gpu": gpu, "precision": prec, "batch": batch, "published": published}
        row["predicted"], row["step_error_pct"] = _predicted_rate(gpu, prec, batch)
        row["error_pct"] = 100 * (row["predicted"] / published - 1)
        if prec == "amp":
            row["half_model"] = _predicted_rate(gpu, prec, batch, dtype="float16")[0]
            row["half_model_error_pct"] = 100 * (row["half_model"] / published - 1)
        out.append(row)
    return out


# Lambda's 2020-2022 runs of the same script (pytorch/results/<folder>/, the
# NGC containers of those years; benchmarks.amp_published.LAMBDA_EARLY_FOLDERS
# names each folder's board), one file per log in the format above
# (data/lambda_gnmt_early/<folder>__<FP16|FP32>__<log date>.tsv). No table
# row of theirs was kept: the figure is the last epoch's training tokens/s
# the log prints. They are not in LAMBDA's figures or the bucket mix; their
# fp32 runs on boards outside the data join the `unseen` band
# (benchmarks.expected_error).
EARLY_LOGS = LOGS.parent / "lambda_gnmt_early"


@functools.lru_cache(maxsize=None)
def early_logs() -> tuple:
    return tuple(read_log(p, LAMBDA_EARLY_FOLDERS) for p in sorted(EARLY_LOGS.glob("*.tsv")))


def early_rows() -> list[dict]:
    """Each early run priced over its own logged batches (`_rate_from_log`),
    with the standing its prediction quotes."""
    out = []
    for log in early_logs():
        row = {"gpu": log["gpu"], "precision": log["precision"], "batch": log["batch"],
               "published": int(log["published"]), "file": log["file"],
               "standing": standing_of(log["gpu"], log["precision"])}
        row["predicted"], row["step_error_pct"] = _rate_from_log(log)
        row["error_pct"] = 100 * (row["predicted"] / row["published"] - 1)
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
    print("\n| GPU | precision | batch | published tokens/s | predicted | error "
          "| median step error | as a half-precision model |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        half = (f"{r['half_model']:,.0f} ({r['half_model_error_pct']:+.1f} %)"
                if "half_model" in r else "-")
        step = "-" if r["step_error_pct"] is None else f"{r['step_error_pct']:+.1f} %"
        print(f"| {r['gpu']} | {r['precision']} | {r['batch']:,} | {r['published']:,} | "
              f"{r['predicted']:,.0f} | {r['error_pct']:+.1f} % | {step} | {half} |")
    errs = [abs(r["error_pct"]) for r in rows]
    print(f"\nmean |error| {np.mean(errs):.1f} % over {len(rows)} figures")
    for gpu, pub, pred in speedups(rows):
        print(f"{gpu}: mixed-precision speedup published {pub:.2f}x, predicted {pred:.2f}x")


def step_points() -> list[dict]:
    """One point per Lambda run and padded length: the logged steps' median
    wall time and the predicted step (ms)."""
    out = []
    for log in lambda_logs():
        lengths, _, wall = logged_batches(log)
        for n in np.unique(lengths):
            sel = wall[lengths == n]
            out.append({"gpu": log["gpu"], "precision": log["precision"], "length": int(n),
                        "batches": int(sel.size), "logged_ms": 1e3 * float(np.median(sel)),
                        "predicted_ms": 1e3 * logged_run_step_s(log, int(n))})
    return out


def print_buckets() -> None:
    """Per run and padded length (`step_points`): the logged steps' median
    wall time against the predicted step."""
    lengths = [n for n, _, _ in bucket_mix()]
    points = {(q["gpu"], q["precision"], q["length"]): q for q in step_points()}
    print("| GPU | precision | batch | " + " | ".join(f"L = {n}: logged / predicted ms"
                                                     for n in lengths) + " |")
    print("| --- | --- | ---: |" + " ---: |" * len(lengths))
    for log in lambda_logs():
        cells = []
        for n in lengths:
            q = points.get((log["gpu"], log["precision"], n))
            cells.append("-" if q is None else
                         f"{q['logged_ms']:.0f} / {q['predicted_ms']:.0f} ({q['batches']})")
        print(f"| {log['gpu']} | {log['precision']} | {log['batch']:,} | " + " | ".join(cells) + " |")


def plot_steps(points: list[dict], path) -> Path:
    """Predicted against logged step, log-log, one marker per program."""
    logged = np.array([q["logged_ms"] for q in points])
    pred = np.array([q["predicted_ms"] for q in points])
    fig = new_figure()
    ax = identity_axes(fig, logged, pred, "logged step, median (ms)",
                       "predicted step at the padded length (ms)")
    for prec, marker in {"amp": "o", "tf32": "s", "fp32": "^"}.items():
        sel = [q for q in points if q["precision"] == prec]
        if sel:
            ax.scatter([q["logged_ms"] for q in sel], [q["predicted_ms"] for q in sel],
                       marker=marker, label=prec, zorder=3)
    err = np.abs(pred / logged - 1)
    ax.set_title(f"GNMT, Lambda's runs: {len(points)} (GPU, precision, length) points, "
                 f"median |error| {100 * np.median(err):.1f} %", fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
    return save(fig, path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--buckets", action="store_true",
                    help="also print, per Lambda run and padded length, the logged steps' "
                         "median time against the predicted step")
    ap.add_argument("--plot", metavar="FILE", default=None,
                    help="also draw the logged against the predicted steps (per run and padded "
                         "length, log-log) into FILE (.png, .svg, .pdf)")
    args = ap.parse_args(argv)
    print("bucket mix (padded tokens a side, share of batches, real tokens a side): "
          + ", ".join(f"{n}: {w:.3f}, {s:.1f}" for n, w, s in bucket_mix()))
    nvidia = predict_rows()
    print_table(SOURCE, nvidia)
    lam = predict_rows(table=LAMBDA)
    print()
    print_table(LAMBDA_SOURCE, lam)
    print_lambda_summary(nvidia, lam)
    early = early_rows()
    if early:
        print("\nLambda's 2020-2022 runs (a separate check, in no figure above): each log's "
              "last-epoch tokens/s against the prediction over its logged batches, by the "
              "standing its prediction quotes:\n")
        print("| GPU | precision | batch | logged tokens/s | predicted | error "
              "| median step error | standing |")
        print("| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |")
        for r in early:
            print(f"| {r['gpu']} | {r['precision']} | {r['batch']:,} | {r['published']:,} | "
                  f"{r['predicted']:,.0f} | {r['error_pct']:+.1f} % | "
                  f"{r['step_error_pct']:+.1f} % | {r['standing']} |")
        print_by_standing(early, [r["error_pct"] for r in early], "runs")
    if args.buckets:
        print()
        print_buckets()
    if args.plot:
        print(f"\nwrote {plot_steps(step_points(), args.plot)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
