"""Per-op accuracy of the learned models against measured GPU kernels.

    python -m benchmarks.accuracy --data ../shared/data/neusight [--plot accuracy.png] [--md FILE]
    python -m benchmarks.accuracy --data ../shared/data/neusight --spread
    python -m benchmarks.accuracy --data ../shared/data/neusight --duration
    python -m benchmarks.accuracy --data ../shared/data/neusight --splits
    python -m benchmarks.accuracy --data ../shared/data/neusight --rows [--models-cache DIR]
    python -m benchmarks.accuracy --data ../shared/data/neusight --pairs

Two evaluations, per op family (linear, bmm, conv, elementwise, softmax, layer norm):

(a) in-distribution: trained on the training files of all five GPUs, tested on
    the held-out shapes of ``test/`` (conv has no test file: not reported);
(b) leave-one-GPU-out: trained on four GPUs, tested on the fifth (its test
    shapes; for conv, its training shapes), for each of the five GPUs. The
    mean over held-out GPUs excludes the power-throttled P4, which is shown.

Side by side, in the same run: the plain roofline (max of FLOPs/peak and
bytes/bandwidth, no efficiency), the analytical model the engine falls back to
(roofline + wave quantization + hand-set efficiencies + one launch), and a
Habitat-style MLP that regresses log milliseconds directly from log dims and
raw GPU specs (the baseline to beat). Metric: mean absolute percentage error
(MAPE) and the 90th percentile of absolute percentage error.

``--spread`` prints, instead, how far the GPUs' measured efficiencies lie
apart on identical test shapes: the LOGO MAPE of an oracle that knows the
other GPUs' measured efficiency on the very shape and predicts their median
(or max) for the held-out GPU. No model that prices a GPU by how ops meet its
spec sheet, without having seen it, can be expected far below this.

``--duration`` prints the training GEMMs' efficiency by waves and measured
duration, per GPU: where it falls with duration at a fixed number of waves,
the board does not hold its clock under sustained load.

``--splits`` prints the linear GEMMs' median efficiency by size, training
split against test split, per GPU. The training files hold random shapes
(none has M, N and K all multiples of 32); the test file holds transformer
shapes (80 % of them aligned so), which run faster at equal work, most of
all on the slowest boards (T4, P100, P4). The test GEMMs are also larger:
median 168 GFLOP against the training files' 11, and 5 % of them larger
than any training GEMM.

``--rows`` prints the softmax and layer-norm kernels' sustained DRAM
bandwidth (the minimum bytes, one read and one write of the tensor, over the
measured time, as a fraction of the spec sheet's) by row length, training
split against test split, per GPU, over tensors of 16x the L2 and more.
The training files' softmax rows end at 4,094 elements (layer norm's at
4,100); the test rows go to 16,384. PyTorch's softmax kernel for rows over 1,024
reads its row three times (maximum, sum of exponentials, then the write
pass); the re-reads come from the caches while the rows of every resident
block fit in them, and from DRAM once they do not. Past 8k elements the
test split's softmax sustains 0.38-0.55 of the bandwidth on every GPU,
against 0.67-0.87 for rows of up to 1k; no training row is that long, so
no model fitted to the training files sees it. Layer norm (two passes over
its row) falls with row length on the A100 only.

``--pairs`` sets the two splits side by side where they overlap: each test
kernel with the training kernel of the same GPU and op whose dims are
nearest (each within PAIR_LOG2 in log2, 23 %), for GEMMs also run with the
same output tile (their kernel names), and the ratio of their times per
unit of work (FLOPs for GEMMs, elements otherwise), training over test, by
the training kernel's duration; beside it the shipped op models' median
predicted / measured time on both rows of the pairs. Memory-bound kernels
of nearly the same shape take the same time in both splits; GEMMs of the
same tile run faster in the test split (P100, T4, V100), by more than the
op models make of the small shape differences. That rest lies in how the
two were measured, which no model fitted to the training files can follow.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import pandas as pd

from benchmarks.regression import add_extra_arguments, extra_files
from predictor import hardware
from predictor.calibration import datasets as D
from predictor.calibration import train as T
from predictor.kernels import layout as L
from predictor.kernels.optime import isolated_times_us
from predictor.kernels.roofline import is_gemm
from predictor.kernels.work import flops_and_elems, gemm_shape

FAMILIES = ("linear", "bmm", "conv", "elementwise", "softmax", "layer_norm")
EXCLUDED_FROM_MEAN = ("P4",)


def family_of(op: np.ndarray) -> np.ndarray:
    names = {"ln": "layer_norm", **{o: "elementwise" for o in D.BINARY + D.UNARY}}
    return np.array([names.get(o, o) for o in op], dtype=object)


def _gpu_arrays(samples: D.OpSamples):
    ids = sorted(set(samples.gpu))
    db = hardware.database()
    feats = db.features([db.get(i) for i in ids])
    index = np.array([ids.index(g) for g in samples.gpu], dtype=np.int64)
    return feats, index


def predict_learned(mlp: np.ndarray, s: D.OpSamples) -> np.ndarray:
    feats, index = _gpu_arrays(s)
    return isolated_times_us(s.family.astype(np.int64), np.zeros(len(s), np.int64),
                             np.ascontiguousarray(s.dims), feats, index, T.training_params(),
                             mlp) * 1e-3


def predict_analytical(s: D.OpSamples) -> np.ndarray:
    return predict_learned(np.zeros(0), s)


def predict_roofline(s: D.OpSamples) -> np.ndarray:
    _, ideal, _, _ = T.features(s)
    return ideal * 1e-3


# ---- Habitat-style baseline: an MLP regressing log(ms) directly -------------------

def _raw_features(s: D.OpSamples) -> np.ndarray:
    feats, index = _gpu_arrays(s)
    g = feats[index]
    gpu = np.log2(np.stack([g[:, L.G_FP32_TFLOPS], g[:, L.G_MEM_BW_GBS], g[:, L.G_SMS],
                            g[:, L.G_L2_MB], g[:, L.G_CLOCK_MHZ]], axis=1))
    dims = np.log2(np.maximum(s.dims[:, :11], 1).astype(np.float64))
    ops = np.stack([(s.op == o).astype(np.float64) for o in D.OPS], axis=1)
    return np.concatenate([dims, gpu, ops], axis=1)


def fit_habitat_mlp(s: D.OpSamples, *, seed: int = 0, epochs: int = 30):
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(seed)
    x = _raw_features(s)
    mean, std = x.mean(0), x.std(0) + 1e-6
    xt = torch.tensor((x - mean) / std, dtype=torch.float32)
    yt = torch.tensor(np.log(s.latency_ms), dtype=torch.float32)
    net = torch.nn.Sequential(torch.nn.Linear(x.shape[1], 128), torch.nn.ReLU(),
                              torch.nn.Linear(128, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1))
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    rng = np.random.default_rng(seed)
    for _ in range(epochs):
        order = torch.tensor(rng.permutation(len(xt)))
        for i in range(0, len(xt), 2048):
            idx = order[i:i + 2048]
            loss = ((net(xt[idx]).squeeze(-1) - yt[idx]) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()

    def predict(t: D.OpSamples) -> np.ndarray:
        with torch.no_grad():
            z = torch.tensor((_raw_features(t) - mean) / std, dtype=torch.float32)
            return np.exp(net(z).squeeze(-1).double().numpy())

    return predict


# ---- evaluation ------------------------------------------------------------------------

def errors(pred: np.ndarray, s: D.OpSamples) -> np.ndarray:
    return np.abs(pred - s.latency_ms) / s.latency_ms * 100.0


def summarise(rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame(rows)


def score(split: str, gpu: str, model: str, err: np.ndarray, fams: np.ndarray) -> list[dict]:
    out = []
    for fam in FAMILIES:
        m = fams == fam
        if m.any():
            out.append({"split": split, "gpu": gpu, "model": model, "family": fam,
                        "n": int(m.sum()), "mape": float(err[m].mean()),
                        "p90": float(np.percentile(err[m], 90))})
    return out


def shipped_weights(seed: int, epochs: int, train: D.OpSamples):
    """The shipped weights when they are exactly what training on `train` with
    this seed and epoch count produces (same recipe, same data), else None."""
    from predictor import opmodel

    from predictor.kernels.features import GROUP_NAMES

    mlp, meta = opmodel.shipped()
    # The harness trains every group; shipped weights that leave one out
    # (analytical in its place) are another model.
    every_group = meta.get("shipped_groups", list(GROUP_NAMES)) == list(GROUP_NAMES)
    if mlp.size and meta.get("seed") == seed and meta.get("epochs") == epochs \
            and meta.get("samples") == len(train) and every_group \
            and meta.get("ensemble", 1) == T.ENSEMBLE \
            and meta.get("distil_rows_per_gpu", 0) == \
            (T.DISTIL_ROWS_PER_GPU if T.ENSEMBLE > 1 else 0):
        return mlp
    return None


def serving_groups(samples: D.OpSamples) -> tuple[int, ...]:
    """The op-model groups that price `samples`' rows (a GEMM's: the matmul
    network and, for a batched one, the batched-GEMM network)."""
    from predictor.kernels.features import G_BMM, G_MATMUL, G_NONE

    groups = set(T.row_groups(samples).tolist()) - {G_NONE}
    if G_BMM in groups:
        groups.add(G_MATMUL)
    return tuple(sorted(groups))


def run(data: Path, *, epochs: int = 60, seed: int = 0, habitat_epochs: int = 30,
        log=print, baselines: bool = True, train_fn=None,
        extra=()) -> tuple[pd.DataFrame, dict]:
    """Scores of every model (see the module docstring). `baselines=False`
    scores the learned models only (no Habitat-style MLP to fit); `train_fn`
    replaces ``T.train`` (same signature), e.g. to reuse weights trained once.
    `extra`: measured-kernel files (``benchmarks.measure_kernels``) of other
    GPUs, in every training set and never scored."""
    train_fn = train_fn or T.train
    train = D.load_train(data)
    more = D.load_measured(extra, log=log) if extra else None

    def fit_set(s: D.OpSamples) -> D.OpSamples:
        """A training set: `s` and the extra files' rows."""
        return s if more is None else D.OpSamples.concat([s, more])

    test = D.load_test(data)
    rows: list[dict] = []
    points = {}
    gpus = sorted(set(train.gpu))

    def evaluate(split: str, gpu: str, fit_on: D.OpSamples, ev: D.OpSamples, mlp=None):
        t0 = time.perf_counter()
        if mlp is None:
            # Only the groups that price the scored rows: the others cannot
            # move a score (the A100-PCIE-80GB, scored on conv only, trains one).
            mlp = train_fn(fit_on, seed=seed, epochs=epochs, groups=serving_groups(ev))
        fams = family_of(ev.op)
        preds = {"learned": predict_learned(mlp, ev)}
        if baselines:
            habitat = fit_habitat_mlp(fit_on, seed=seed, epochs=habitat_epochs)
            preds.update({"roofline": predict_roofline(ev), "analytical": predict_analytical(ev),
                          "habitat-mlp": habitat(ev)})
        for model, pred in preds.items():
            rows.extend(score(split, gpu, model, errors(pred, ev), fams))
        points[(split, gpu)] = (ev.latency_ms, preds["learned"], fams)
        mine = [r for r in rows if r["split"] == split and r["gpu"] == gpu
                and r["model"] == "learned"]
        log(f"  {split:>9} {gpu:<16} {len(ev):>6} ops  {time.perf_counter() - t0:5.1f} s  "
            "learned MAPE " + ", ".join(f"{r['family']} {r['mape']:.1f}" for r in mine))

    log("in-distribution: train on all GPUs, test on test/ shapes")
    everything = fit_set(train)
    evaluate("test", "all", everything, test, shipped_weights(seed, epochs, everything))
    log("leave-one-GPU-out")
    for held in gpus:
        ev = D.OpSamples.concat([test.subset(test.gpu == held),
                                 train.subset((train.gpu == held) & (train.op == "conv"))])
        if held == "A100-PCIE-80GB":  # the conv files' A100: only conv data
            ev = train.subset((train.gpu == held) & (train.op == "conv"))
        evaluate("logo", held, fit_set(train.subset(train.gpu != held)), ev)
    return summarise(rows), points


# Rows shorter than this are left out of `unseen_scores`: the fixed cost of
# a measurement (a few microseconds with CUDA events) stays under a tenth.
UNSEEN_MIN_MS = 0.05


def unseen_scores(paths, mlp=None) -> pd.DataFrame:
    """The op models' error on measured-kernel files (``benchmarks.measure_kernels``)
    of a GPU the weights `mlp` (default: the shipped ones) were not trained on:
    per family and pass, MAPE and the median predicted/measured ratio over the
    rows of at least UNSEEN_MIN_MS, each priced as the engine prices it in a
    step (``kernels.optime.op_time_us``, no per-measurement floor). Rows that
    ran on TF32 tensor cores are scored apart (family "<family> (TF32)"),
    against the engine's TF32 pricing."""
    from predictor import opmodel
    from predictor.engine import model_params
    from predictor.kernels.optime import op_time_us

    mlp = opmodel.weights() if mlp is None else mlp
    db = hardware.database()
    rows = []
    for tf32 in (False, True):
        s = D.load_measured(paths, tf32=tf32)
        params = model_params(tf32_matmul=tf32, tf32_conv=tf32)
        s = s.subset(s.latency_ms >= UNSEEN_MIN_MS)
        pred_ms = np.array([op_time_us(int(s.family[i]), L.F32, 1,
                                       np.ascontiguousarray(s.dims[i]),
                                       db.get(s.gpu[i]).features, params, mlp)
                            for i in range(len(s))]) * 1e-3
        backward = np.array([o.endswith("_backward") for o in s.op], dtype=bool)
        fams = family_of(np.array([o.removesuffix("_backward") for o in s.op], dtype=object))
        rows.append(pd.DataFrame({"gpu": s.gpu, "family": fams + (" (TF32)" if tf32 else ""),
                                  "pass": np.where(backward, "backward", "forward"),
                                  "ratio": pred_ms / s.latency_ms}))
    df = pd.concat(rows, ignore_index=True)
    df["err"] = 100.0 * (df.ratio - 1.0).abs()
    return df.groupby(["gpu", "family", "pass"]).agg(
        n=("err", "size"), mape=("err", "mean"), median_ratio=("ratio", "median")).reset_index()


def cross_gpu_spread(data: Path) -> pd.DataFrame:
    """LOGO MAPE % of the same-shape oracle (see the module docstring), per
    family, held-out GPU and summary (median or max of the other GPUs except
    P4; P4 itself is predicted from the other four)."""
    test = D.load_test(data)
    _, ideal, _, target = T.features(test)
    df = pd.DataFrame({"gpu": test.gpu, "family": family_of(test.op), "eta": ideal / target,
                       "shape": [o + str(tuple(d)) for o, d in zip(test.op, test.dims)]})
    eta = df.pivot_table(index=["family", "shape"], columns="gpu", values="eta", aggfunc="first")
    gpus = list(eta.columns)
    rows = []
    for held in gpus:
        others = [g for g in gpus if g != held
                  and (held in EXCLUDED_FROM_MEAN or g not in EXCLUDED_FROM_MEAN)]
        common = eta.dropna(subset=[held] + others)
        for fam, grp in common.groupby(level=0):
            for how in ("median", "max"):
                guess = getattr(grp[others], how)(axis=1)
                # t = ideal / eta, so predicted / measured time = eta_true / eta_guess.
                err = (np.abs(grp[held] / guess - 1.0) * 100.0).mean()
                rows.append({"family": fam, "oracle": how, "gpu": held, "n": len(grp),
                             "mape": float(err)})
    return pd.DataFrame(rows)


def dram_fractions(data: Path) -> pd.DataFrame:
    """Sustained DRAM bandwidth of every memory-bound training kernel as a
    fraction of its GPU's spec-sheet bandwidth (minimum bytes moved over the
    measured time), with its working set against the GPU's L2. The training
    split only: the learned models' bandwidth bound
    (``kernels.features.ACHIEVABLE_DRAM``) is read from it."""
    s = D.load_train(data, ops=D.BINARY + D.UNARY + ("softmax", "ln"))
    nbytes = np.array([flops_and_elems(int(f), d)[1] * 4.0 for f, d in zip(s.family, s.dims)])
    return pd.DataFrame({"gpu": s.gpu, "op": s.op, **_dram_columns(s, nbytes)})


def _dram_columns(s: D.OpSamples, nbytes: np.ndarray) -> dict[str, np.ndarray]:
    """Each sample's `nbytes` over its measured time as a fraction of its
    GPU's spec-sheet bandwidth, and `nbytes` against the GPU's L2."""
    feats, index = _gpu_arrays(s)
    return {"fraction": nbytes / (s.latency_ms * 1e-3) / (feats[index, L.G_MEM_BW_GBS] * 1e9),
            "bytes_over_l2": nbytes / (feats[index, L.G_L2_MB] * 2.0 ** 20)}


def dram_table(df: pd.DataFrame) -> str:
    bins = pd.cut(df.bytes_over_l2, [0, 1, 4, 16, np.inf], right=False,
                  labels=["< L2", "1-4x L2", "4-16x L2", ">= 16x L2"])
    t = df.groupby([bins, "gpu"], observed=True).fraction.max().unstack()
    t["all GPUs"] = df.groupby(bins, observed=True).fraction.max()
    return t.round(3).to_string()


WAVE_BINS = (-np.inf, 3.0, 5.0, 7.0, np.inf)  # log2 waves: < 8, 8-32, 32-128, > 128
WAVE_LABELS = ("< 8", "8-32", "32-128", "> 128")
DURATION_BINS_MS = (0.0, 0.1, 0.3, 1.0, 3.0, 10.0, np.inf)
DURATION_LABELS = ("< 0.1 ms", "0.1-0.3", "0.3-1", "1-3", "3-10", "> 10 ms")


def gemm_durations(data: Path) -> pd.DataFrame:
    """Every training GEMM (linear and bmm) with its efficiency (ideal time at
    the spec sheet's peaks over the measured time), its waves (features
    column 5) and its measured duration. The training split only."""
    s = D.load_train(data, ops=("linear", "bmm"))
    x, ideal, _, meas_us = T.features(s)
    return pd.DataFrame({"gpu": s.gpu, "op": s.op, "eta": ideal / meas_us,
                         "log2_waves": x[:, 5], "ms": meas_us * 1e-3})


SPLIT_GFLOP_BINS = (0.0, 1.0, 10.0, 100.0, np.inf)
SPLIT_GFLOP_LABELS = ("< 1 GFLOP", "1-10", "10-100", "> 100")


def split_efficiencies(data: Path) -> pd.DataFrame:
    """Every linear GEMM of both splits with its efficiency (ideal time at the
    spec sheet's peaks over the measured time), its work and whether M, N and
    K are all multiples of 32."""
    parts = []
    for split, s in (("train", D.load_train(data, ops=("linear",))),
                     ("test", D.load_test(data, ops=("linear",)))):
        _, ideal, _, meas_us = T.features(s)
        shapes = np.array([gemm_shape(L.MATMUL, d) for d in s.dims], dtype=np.int64)
        parts.append(pd.DataFrame({
            "split": split, "gpu": s.gpu, "eta": ideal / meas_us,
            "gflop": np.prod(shapes.astype(np.float64), axis=1) * 2.0 / 1e9,
            "aligned": (shapes[:, 1:] % 32 == 0).all(axis=1)}))
    return pd.concat(parts, ignore_index=True)


ROW_BINS = (0, 1024, 2048, 4096, 8192, np.inf)  # elements a row; a bin holds its upper edge
ROW_LABELS = ("<= 1k", "1k-2k", "2k-4k", "4k-8k", "> 8k")


def row_bandwidths(data: Path) -> pd.DataFrame:
    """Every softmax and layer-norm kernel of both splits with its row length
    and its sustained DRAM bandwidth as a fraction of the spec sheet's (the
    tensor read once and written once, over the measured time)."""
    parts = []
    for split, s in (("train", D.load_train(data, ops=("softmax", "ln"))),
                     ("test", D.load_test(data, ops=("softmax", "ln")))):
        parts.append(pd.DataFrame({"split": split, "gpu": s.gpu, "op": s.op,
                                   "row": s.dims[:, L.MEM_INNER],
                                   **_dram_columns(s, 8.0 * s.dims[:, L.MEM_INNER]
                                                   * s.dims[:, L.MEM_OUTER])}))
    return pd.concat(parts, ignore_index=True)


def row_table(df: pd.DataFrame) -> str:
    """Median DRAM fraction per op, GPU and row-length bin over the kernels
    whose tensor is at least 16x the GPU's L2 (streamed from DRAM, as every
    test-split kernel is); each cell training split / test split, "-" where
    a split has no such kernel of that row length."""
    longest = df.groupby(["op", "split"]).row.max()   # over every kernel
    df = df[df.bytes_over_l2 >= 16.0]
    bins = pd.cut(df.row, ROW_BINS, labels=ROW_LABELS)
    med = df.groupby(["op", "gpu", bins, "split"], observed=True).fraction.median()
    out = []
    for op in sorted(set(df.op)):
        t = med[op].unstack("split")
        cells = pd.DataFrame(index=t.index)
        cells["cell"] = [f"{a:.2f} / {b:.2f}".replace("nan", "-")
                         for a, b in zip(t.get("train", np.nan), t.get("test", np.nan))]
        grid = cells.cell.unstack(fill_value="- / -")
        grid.columns.name = "row elements"
        out.append(f"{op}: median DRAM fraction, training / test split\n" + grid.to_string())
    return ("\n\n".join(out) + "\n\nlongest row: "
            + ", ".join(f"{op} {split} {int(v):,}" for (op, split), v in longest.items()))


def row_errors(data: Path, cache: Path | None, log=print) -> pd.DataFrame:
    """LOGO MAPE % of the held-out op models (the shipped recipe, seed 0;
    ``predictor.calibration.blend.held_out_model``, cached in `cache`) on each
    GPU's softmax and layer-norm test rows, rows of up to 8k elements apart
    from longer ones (MAPE % and the median predicted / measured time)."""
    from predictor.calibration import blend as B

    train, test = D.load_train(data), D.load_test(data, ops=("softmax", "ln"))
    out = []
    for held in sorted(set(test.gpu)):
        ev = test.subset(test.gpu == held)
        pred = predict_learned(B.held_out_model(train, held, cache=cache, log=log), ev)
        ratio = pred / ev.latency_ms
        long = ev.dims[:, L.MEM_INNER] > 8192
        for op in ("softmax", "ln"):
            for name, pick in (("<= 8k", ~long), ("> 8k", long)):
                sel = (ev.op == op) & pick
                out.append({"op": op, "gpu": held, "rows": name, "n": int(sel.sum()),
                            "mape": float(np.mean(np.abs(ratio[sel] - 1.0)) * 100.0),
                            "median pred / meas": float(np.median(ratio[sel]))})
    return pd.DataFrame(out)


PAIR_LOG2 = 0.3   # a pair's dims lie within 2**0.3 (23 %) of each other, each
PAIR_MS_BINS = (0.0, 0.1, 1.0, 10.0, np.inf)
PAIR_MS_LABELS = ("< 0.1 ms", "0.1-1", "1-10", "> 10 ms")


def matched_pairs(data: Path, mlp: np.ndarray | None = None) -> pd.DataFrame:
    """Every test-split kernel paired with the nearest training kernel of
    the same GPU and op (largest log2 distance over the dims at most
    PAIR_LOG2; GEMMs: the same output tile by their kernel names, where both
    name one), with the ratio of their times per unit of work (training /
    test: above 1 where the test split ran faster) and the op models' (`mlp`,
    default the shipped ones) predicted / measured time on each of the two."""
    from predictor import opmodel

    mlp = opmodel.weights() if mlp is None else mlp
    train, test = D.load_train(data), D.load_test(data)
    parts = []
    for (gpu, op), idx in pd.Series(range(len(test))).groupby([test.gpu, test.op]):
        b = test.subset(idx.to_numpy())
        a = train.subset((train.gpu == gpu) & (train.op == op))
        if len(a) == 0:
            continue
        xa = np.log2(np.maximum(a.dims, 1).astype(np.float64))
        xb = np.log2(np.maximum(b.dims, 1).astype(np.float64))
        gemm = is_gemm(int(b.family[0]))   # one op, one family
        near = np.empty(len(b), dtype=np.int64)
        keep = np.empty(len(b), dtype=bool)
        for lo in range(0, len(b), 256):   # 256 test rows at a time: bounded memory
            sl = slice(lo, lo + 256)
            dist = np.abs(xb[sl, None, :] - xa[None, :, :]).max(axis=2)
            if gemm:   # a known tile on both sides must be the same
                other = (b.tile[sl, None] >= 0) & (a.tile[None, :] >= 0) \
                    & (b.tile[sl, None] != a.tile[None, :])
                dist[other] = np.inf
            near[sl] = dist.argmin(axis=1)
            keep[sl] = dist[np.arange(len(near[sl])), near[sl]] <= PAIR_LOG2
        if not keep.any():
            continue
        a, b = a.subset(near[keep]), b.subset(keep)
        work = [np.array([flops_and_elems(int(f), d)[0 if gemm else 1]
                          for f, d in zip(s.family, s.dims)]) for s in (a, b)]
        parts.append(pd.DataFrame({
            "gpu": gpu, "op": op, "train_ms": a.latency_ms,
            "ratio": (a.latency_ms / work[0]) / (b.latency_ms / work[1]),
            "model_train": predict_learned(mlp, a) / a.latency_ms,
            "model_test": predict_learned(mlp, b) / b.latency_ms}))
    return pd.concat(parts, ignore_index=True)


def pairs_table(df: pd.DataFrame) -> str:
    """Per op and GPU: pairs, median time ratio per unit of work (training /
    test) overall and by the training kernel's duration, and the op models'
    median predicted / measured time on the pairs' training and test rows."""
    g = df.groupby(["op", "gpu"])
    out = pd.DataFrame({"pairs": g.size(), "train / test": g.ratio.median(),
                        "model on train": g.model_train.median(),
                        "model on test": g.model_test.median()})
    dur = pd.cut(df.train_ms, PAIR_MS_BINS, labels=PAIR_MS_LABELS)
    by_ms = df.groupby(["op", "gpu", dur], observed=True).ratio.median().unstack()
    return out.join(by_ms).round(2).to_string(na_rep="-")


def split_table(df: pd.DataFrame) -> str:
    """Median efficiency per GPU and size bin, training split / test split,
    and the share of aligned shapes in each split."""
    bins = pd.cut(df.gflop, SPLIT_GFLOP_BINS, labels=SPLIT_GFLOP_LABELS)
    t = df.groupby(["gpu", bins, "split"], observed=True).eta.median().unstack()
    n = df.groupby(["gpu", bins, "split"], observed=True).eta.size().unstack()
    out = pd.DataFrame({"train": t.get("train"), "test": t.get("test"),
                        "test / train": t.get("test") / t.get("train"),
                        "n train": n.get("train"), "n test": n.get("test")})
    aligned = df.groupby("split").aligned.mean()
    return (out.round(3).to_string() + "\n\nshare of shapes with M, N, K all multiples of 32: "
            + ", ".join(f"{k} {v:.0%}" for k, v in aligned.items()))


def duration_table(df: pd.DataFrame, stat: str = "median") -> str:
    """Per GPU, the median efficiency (or, with stat="size", the count) by
    waves (rows) and measured duration (columns). At a fixed number of waves
    a longer kernel amortises its start-up and runs closer to its plateau;
    where efficiency falls with duration instead, the board cannot hold its
    clock under sustained load (a power cap)."""
    waves = pd.cut(df.log2_waves, WAVE_BINS, labels=WAVE_LABELS)
    dur = pd.cut(df.ms, DURATION_BINS_MS, labels=DURATION_LABELS)
    out = []
    for gpu, sel in df.groupby("gpu"):
        t = sel.eta.groupby([waves[sel.index], dur[sel.index]], observed=True).agg(stat).unstack()
        t.index.name, t.columns.name = "waves", "duration"
        out.append(f"{gpu} ({'kernels' if stat == 'size' else stat + ' efficiency'})\n"
                   + (t.round(2) if stat != "size" else t.fillna(0).astype(int)).to_string())
    return "\n\n".join(out)


def spread_table(df: pd.DataFrame) -> str:
    pivot = df.pivot_table(index=["family", "oracle"], columns="gpu", values="mape")
    pivot["mean (no P4)"] = pivot[[g for g in pivot.columns if g not in EXCLUDED_FROM_MEAN]].mean(axis=1)
    return pivot.round(1).to_string()


def table(df: pd.DataFrame) -> str:
    """Markdown: per family, in-distribution and LOGO mean (P4 excluded) per model."""
    lines = []
    models = ["learned", "habitat-mlp", "analytical", "roofline"]
    test = df[df.split == "test"]
    logo = df[(df.split == "logo") & ~df.gpu.isin(EXCLUDED_FROM_MEAN)]
    p4 = df[(df.split == "logo") & df.gpu.isin(EXCLUDED_FROM_MEAN)]
    head = "| family | " + " | ".join(f"{m} test" for m in models) + " | " + \
        " | ".join(f"{m} LOGO" for m in models) + " | learned LOGO P90 | learned P4 |"
    lines += [head, "|" + "---|" * (2 * len(models) + 3)]
    for fam in FAMILIES:
        cells = [fam]
        for src in (test, logo):
            for m in models:
                sel = src[(src.family == fam) & (src.model == m)]
                cells.append(f"{sel.mape.mean():.1f}" if len(sel) else "-")
        sel = logo[(logo.family == fam) & (logo.model == "learned")]
        cells.append(f"{sel.p90.mean():.1f}" if len(sel) else "-")
        sel = p4[(p4.family == fam) & (p4.model == "learned")]
        cells.append(f"{sel.mape.mean():.1f}" if len(sel) else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def per_gpu_table(df: pd.DataFrame) -> str:
    logo = df[(df.split == "logo") & (df.model == "learned")]
    pivot = logo.pivot_table(index="family", columns="gpu", values="mape")
    return pivot.round(1).to_string()


def plot(points: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [k for k in points if k[0] == "logo"] + [("test", "all")]
    fig, axes = plt.subplots(1, len(keys), figsize=(3.2 * len(keys), 3.4), sharey=True)
    colours = {fam: f"C{i}" for i, fam in enumerate(FAMILIES)}  # one colour per family
    handles = {}
    for ax, key in zip(np.atleast_1d(axes), keys):
        meas, pred, fams = points[key]
        for fam in FAMILIES:
            m = fams == fam
            if m.any():
                handles[fam] = ax.scatter(meas[m], pred[m], s=3, alpha=0.4, label=fam,
                                          color=colours[fam])
        lo, hi = 1e-2, 1e4
        ax.plot([lo, hi], [lo, hi], "k--", lw=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_title("held out: " + key[1] if key[0] == "logo" else "test split", fontsize=9)
        ax.set_xlabel("measured ms")
    np.atleast_1d(axes)[0].set_ylabel("predicted ms")
    np.atleast_1d(axes)[-1].legend([handles[f] for f in FAMILIES if f in handles],
                                   [f for f in FAMILIES if f in handles], fontsize=7,
                                   markerscale=3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="../shared/data/neusight")
    ap.add_argument("--epochs", type=int, default=60)
    ap.add_argument("--seed", type=int, default=0)
    add_extra_arguments(ap)
    ap.add_argument("--plot", default=None, help="write predicted-vs-measured PNG here")
    ap.add_argument("--csv", default=None, help="write all scores here")
    ap.add_argument("--unseen", action="append", default=[], metavar="CSV",
                    help="only score op models on a measured-kernel file, per family and pass "
                         "(a GPU outside their training data: see --weights); repeatable")
    ap.add_argument("--weights", type=Path, metavar="FILE",
                    help="with --unseen: these op models (an opmodels.npz of predictor "
                         "train-models) instead of the shipped ones, which the H200's file "
                         "trained")
    ap.add_argument("--spread", action="store_true",
                    help="only the cross-GPU spread of measured efficiency on identical shapes")
    ap.add_argument("--bandwidth", action="store_true",
                    help="only the highest sustained DRAM bandwidth fraction of the training "
                         "kernels, per GPU and working-set size")
    ap.add_argument("--duration", action="store_true",
                    help="only the training GEMMs' efficiency by waves and measured duration, "
                         "per GPU (where a power cap shows)")
    ap.add_argument("--splits", action="store_true",
                    help="only the linear GEMMs' efficiency by size, training split against "
                         "test split, per GPU")
    ap.add_argument("--rows", action="store_true",
                    help="only the softmax and layer-norm kernels' DRAM fraction by row "
                         "length, training split against test split, per GPU")
    ap.add_argument("--pairs", action="store_true",
                    help="only the test kernels paired with training kernels of the same GPU, "
                         "op, tile and nearly the same dims: their time per unit of work, "
                         "training / test, and the shipped op models on both")
    ap.add_argument("--models-cache", type=Path, default=None,
                    help="with --rows: also score the held-out op models (cached here, trained "
                         "where missing) on short and long rows")
    args = ap.parse_args(argv)
    if args.weights is not None and not args.unseen:
        ap.error("--weights applies to --unseen only")
    if args.unseen:
        from predictor.errors import PredictorError
        from predictor.opmodel import read_weights

        try:
            mlp = read_weights(args.weights)[0] if args.weights is not None else None
        except PredictorError as exc:
            ap.error(str(exc))
        print(f"{args.weights or 'Shipped op models'} on measured kernels: rows of at least "
              f"{UNSEEN_MIN_MS * 1e3:g} us, priced as in a step")
        print(unseen_scores(args.unseen, mlp).round(2).to_string(index=False))
        return 0
    if args.rows:
        print("Softmax and layer norm: sustained DRAM bandwidth (tensor read once and written")
        print("once, over the measured time) / spec-sheet bandwidth, by row length")
        print(row_table(row_bandwidths(Path(args.data))))
        if args.models_cache is not None:
            err = row_errors(Path(args.data), args.models_cache)
            print()
            print("Held-out op models (trained without the GPU): MAPE % on its test rows")
            print(err.pivot_table(index=["op", "gpu"], columns="rows",
                                  values=["mape", "median pred / meas", "n"]).round(2).to_string())
            for op, sel in err[~err.gpu.isin(EXCLUDED_FROM_MEAN)].groupby("op"):
                print(f"{op}, mean except {', '.join(EXCLUDED_FROM_MEAN)}: "
                      + ", ".join(f"rows {r} {m:.1f}" for r, m in sel.groupby("rows").mape.mean().items()))
        return 0
    if args.pairs:
        print("Test kernels paired with the nearest training kernel of the same GPU and op")
        print(f"(dims within {2 ** PAIR_LOG2 - 1:.0%} each; GEMMs with the same output tile):")
        print("time per unit of work, training / test (above 1: the test split ran faster),")
        print("by the training kernel's duration, and the shipped op models' median")
        print("predicted / measured time on the pairs' training and test rows")
        print(pairs_table(matched_pairs(Path(args.data))))
        return 0
    if args.splits:
        print("Linear GEMMs: median efficiency (ideal time at the spec sheet's peaks /")
        print("measured time) by work, training split against test split")
        print(split_table(split_efficiencies(Path(args.data))))
        return 0
    if args.duration:
        df = gemm_durations(Path(args.data))
        print("Training GEMMs (linear and bmm): efficiency = ideal time at the spec sheet's")
        print("peaks / measured time, by waves (rows) and measured duration (columns)")
        print(duration_table(df))
        print()
        print(duration_table(df, stat="size"))
        return 0
    if args.bandwidth:
        print("Highest sustained DRAM bandwidth / spec-sheet bandwidth of the memory-bound")
        print("training kernels (elementwise, softmax, layer norm), by working set against L2")
        print(dram_table(dram_fractions(Path(args.data))))
        return 0
    if args.spread:
        print("LOGO MAPE % of predicting a held-out GPU's efficiency from the other GPUs'")
        print("measured efficiency on the same test shape (median or max of them)")
        print(spread_table(cross_gpu_spread(Path(args.data))))
        return 0
    df, points = run(Path(args.data), epochs=args.epochs, seed=args.seed,
                     extra=extra_files(args))
    print()
    print(f"MAPE % by family (LOGO: mean over held-out GPUs except {', '.join(EXCLUDED_FROM_MEAN)})")
    print(table(df))
    print()
    print("learned, leave-one-GPU-out MAPE % per held-out GPU")
    print(per_gpu_table(df))
    if args.csv:
        df.to_csv(args.csv, index=False)
    if args.plot:
        plot(points, Path(args.plot))
        print(f"\nplot: {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
