"""Per-op calibrated mode across GPUs, on NeuSight's measured kernels.

Habitat's claim, tested on our per-op model: a kernel time measured on the GPU
you have (the *origin*), scaled by a ratio of model predictions,

    t_target = t_measured(origin) x f(op, target) / f(op, origin),

beats the model's own prediction f(op, target). Origin measurements come from
one training GPU (default the V100: ``train/*/Tesla_V100-PCIE-32GB.csv`` and
the V100 rows of ``test/*.csv``); targets are the other GPUs' rows of
``test/*.csv`` (held-out shapes) whose shape was also measured on the origin.
Convolutions have no test file: their rows come from the training files and
are reported apart (``conv (train shapes)``).

Side by side, per op family and (origin -> target) pair, mean absolute
percentage error (MAPE) of:

- ``pure``          f(op, target) alone, the engine's per-op model (the shipped
                    learned weights where there are any, else analytical);
- ``calibrated``    origin measurement x ratio of the same model;
- ``blended``       the two blended in log space, ``f_t x (measured / f_o) ** w``,
                    with the per-group ``w`` of ``predictor.calibrated`` (the
                    shipped ``calibration_blend.json``; with ``--logo``, ``w``
                    refitted on the training GPUs' pairs that exclude the target,
                    see ``predictor.calibration.blend``); 1 between boards of
                    one chip;
- ``pure-analytical`` / ``calibrated-analytical``  the same two with the
                    analytical roofline + wave model as f;
- ``origin as-is``  the origin measurement unscaled (what a ratio must beat).

Every model is evaluated in the data's conditions (fp32, TF32 off for
matmuls and convolutions alike: ``calibration.train.training_params``).

With ``--logo`` the learned model used for each target is retrained without
that target GPU (leave-one-GPU-out: the honest setting for an unseen GPU),
and so is the blend's ``w``; this trains one model per GPU held out (six, about
a minute each on one core); ``--models-cache DIR`` keeps them for the next run.

    python -m benchmarks.calibration_neusight --data ../shared/data/neusight
    python -m benchmarks.calibration_neusight --data ../shared/data/neusight --origin T4 --logo \
        --models-cache /tmp/logo-models
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from predictor import hardware
from predictor.calibrated import alike, blend_weights
from predictor.calibration import datasets as D
from predictor.calibration import train as T
from predictor.opmodel import predict_rows, weights

DEFAULT_DATA = Path(os.environ.get("PREDICTOR_DATA", Path(__file__).resolve().parents[2]
                                   / "shared" / "data" / "neusight"))
MODELS = ("pure", "calibrated", "blended", "pure-analytical", "calibrated-analytical",
          "origin as-is")
# The requirement on the blend: never worse than pure by more than this (MAPE points).
TOLERANCE = 1.0


def family_of(op: np.ndarray) -> np.ndarray:
    names = {"ln": "layer_norm", **{o: "elementwise" for o in D.BINARY + D.UNARY}}
    return np.array([names.get(o, o) for o in op], dtype=object)


def _keys(s: D.OpSamples) -> list[tuple]:
    return [(op, d.tobytes()) for op, d in zip(s.op, s.dims)]


def origin_table(samples: D.OpSamples, origin: str) -> dict[tuple, float]:
    """Median measured ms of each (op, shape) on the origin GPU."""
    mine = samples.subset(samples.gpu == origin)
    frame = pd.DataFrame({"key": _keys(mine), "ms": mine.latency_ms})
    return frame.groupby("key")["ms"].median().to_dict()


def matched(targets: D.OpSamples, table: dict) -> tuple[D.OpSamples, np.ndarray]:
    """Target rows whose shape the origin measured, and that measurement (ms)."""
    keys = _keys(targets)
    have = np.array([k in table for k in keys], dtype=bool)
    sub = targets.subset(have)
    return sub, np.array([table[k] for k, h in zip(keys, have) if h], dtype=np.float64)


def row_weights(rows: D.OpSamples, origin: str, w_family: np.ndarray) -> np.ndarray:
    """The blend weight of each row: its family's, 1 where the target is a
    board of the origin's chip."""
    w = np.asarray(w_family, dtype=np.float64)[rows.family]
    same = np.array([alike(origin, g) for g in rows.gpu], dtype=bool)
    return np.where(same, 1.0, w)


def evaluate(rows: D.OpSamples, origin_ms: np.ndarray, origin: str, mlp: np.ndarray,
             w_family: np.ndarray | None = None) -> dict:
    """Predicted ms of every row by every model."""
    fam, dims = rows.family, rows.dims
    no_mlp = np.zeros(0)
    p = T.training_params()
    f_t = predict_rows(fam, dims, list(rows.gpu), mlp=mlp, params=p)
    f_o = predict_rows(fam, dims, origin, mlp=mlp, params=p)
    a_t = predict_rows(fam, dims, list(rows.gpu), mlp=no_mlp, params=p)
    a_o = predict_rows(fam, dims, origin, mlp=no_mlp, params=p)
    w = row_weights(rows, origin, blend_weights() if w_family is None else w_family)
    return {"pure": f_t, "calibrated": origin_ms * f_t / f_o,
            "blended": f_t * np.exp(w * np.log(origin_ms / f_o)), "pure-analytical": a_t,
            "calibrated-analytical": origin_ms * a_t / a_o, "origin as-is": origin_ms}


def logo_blend(target: str, res, log=print) -> np.ndarray:
    """Blend weight per family code, fitted on the training GPUs' pairs that
    exclude `target` (``predictor.calibration.blend``)."""
    from predictor.calibrated import family_weights
    from predictor.calibration import blend as B

    fitted = B.fit_weights(res, exclude={target})
    log(f"  w without {target}: " + ", ".join(f"{k} {v:.2f}" for k, v in sorted(fitted.items())))
    return family_weights(fitted)


def score(rows: D.OpSamples, preds: dict, origin_ms: np.ndarray,
          label_family=None) -> pd.DataFrame:
    """Absolute % errors per row and model, plus the pure model's log residual
    on the target and on the origin (why a ratio helps or not)."""
    fams = family_of(rows.op) if label_family is None else np.full(len(rows), label_family)
    out = []
    for model, pred in preds.items():
        ape = np.abs(pred - rows.latency_ms) / rows.latency_ms * 100
        out.append(pd.DataFrame({"family": fams, "gpu": rows.gpu, "model": model, "ape": ape}))
    df = pd.concat(out, ignore_index=True)
    n = len(rows)
    f_o = preds["pure"] / (preds["calibrated"] / origin_ms)  # f(origin) recovered
    df["res_target"] = np.tile(np.log(rows.latency_ms / preds["pure"]), len(preds))
    df["res_origin"] = np.tile(np.log(origin_ms / f_o), len(preds))
    assert len(df) == n * len(preds)
    return df


def run(data: Path, origin_name: str, logo: bool, epochs: int, log=print,
        cache: Path | None = None) -> pd.DataFrame:
    origin = hardware.get(origin_name).id
    train, test = D.load_train(data), D.load_test(data)
    table = origin_table(D.OpSamples.concat([train, test]), origin)
    if origin not in set(train.gpu):
        raise SystemExit(f"origin {origin} has no measurements in {data}")
    test_rows, test_origin = matched(test.subset(test.gpu != origin), table)
    conv = train.subset((train.op == "conv") & (train.gpu != origin))
    conv_rows, conv_origin = matched(conv, table)
    log(f"origin {origin}: {len(table)} measured shapes; {len(test_rows)} test rows and "
        f"{len(conv_rows)} conv rows (training shapes) on other GPUs share a shape with it")
    parts = []
    targets = sorted(set(test_rows.gpu) | set(conv_rows.gpu))
    res = None
    if logo:
        from predictor.calibration import blend as B

        res = B.residuals(train, epochs=epochs, cache=cache, log=log)
    for target in targets:
        t0 = time.perf_counter()
        w_family = None
        if logo:
            mlp = B.held_out_model(train, target, epochs=epochs, cache=cache, log=log)
            w_family = logo_blend(target, res, log)
        else:
            mlp = weights()
        for rows, ms, label in ((test_rows, test_origin, None),
                                (conv_rows, conv_origin, "conv (train shapes)")):
            pick = rows.gpu == target
            if not pick.any():
                continue
            sub = rows.subset(pick)
            parts.append(score(sub, evaluate(sub, ms[pick], origin, mlp, w_family), ms[pick],
                               label))
        log(f"  {origin} -> {target}: {int((test_rows.gpu == target).sum())} test + "
            f"{int((conv_rows.gpu == target).sum())} conv rows ({time.perf_counter() - t0:.1f} s)")
    df = pd.concat(parts, ignore_index=True)
    df["pair"] = origin + " -> " + df["gpu"]
    return df


def tables(df: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """MAPE per (family, pair) and per family over all pairs; columns: models."""
    per_pair = df.pivot_table(index=["family", "pair"], columns="model", values="ape",
                              aggfunc="mean")[list(MODELS)]
    pure = df[df.model == "pure"]
    per_pair["n"] = pure.groupby(["family", "pair"]).size()
    # Correlation of the pure model's log residuals on origin and target: the
    # ratio cancels the model's error only as far as the two are correlated
    # (calibrated beats pure when corr > sd_origin / (2 sd_target)).
    grouped = pure.groupby(["family", "pair"])
    per_pair["corr"] = grouped.apply(lambda g: g["res_target"].corr(g["res_origin"]))
    per_pair["sd_o/2sd_t"] = grouped.apply(
        lambda g: g["res_origin"].std() / (2 * g["res_target"].std()))
    # ... and as far as the model's mean bias is the same on both (% of time).
    per_pair["bias_o %"] = grouped["res_origin"].mean().map(lambda r: (np.exp(r) - 1) * 100)
    per_pair["bias_t %"] = grouped["res_target"].mean().map(lambda r: (np.exp(r) - 1) * 100)
    per_family = df.pivot_table(index="family", columns="model", values="ape",
                                aggfunc="mean")[list(MODELS)]
    per_family["n"] = df[df.model == "pure"].groupby("family").size()
    return per_pair, per_family


def verdict(per_pair: pd.DataFrame) -> str:
    """Whether calibrated and blended are never worse than pure by more than
    TOLERANCE points on any (family, pair), and where they are."""
    lines = []
    for model in ("calibrated", "blended"):
        worse = per_pair[per_pair[model] > per_pair["pure"] + TOLERANCE]
        where = "; ".join(f"{f} {p} ({r[model]:.1f} vs {r['pure']:.1f})"
                          for (f, p), r in worse.iterrows())
        lines.append(f"{model}: " + (f"worse than pure by more than {TOLERANCE:g} point on "
                                     f"{len(worse)} of {len(per_pair)}: {where}" if len(worse)
                                     else f"never worse than pure by more than {TOLERANCE:g} "
                                          f"point ({len(per_pair)} family/pair cells)"))
    return "\n".join(lines)


def markdown(frame: pd.DataFrame) -> str:
    cols = list(frame.columns)
    idx = list(frame.index.names)
    lines = ["| " + " | ".join(idx + cols) + " |", "|" + "---|" * (len(idx) + len(cols))]
    for key, row in frame.iterrows():
        key = key if isinstance(key, tuple) else (key,)
        best = min(row[m] for m in ("pure", "calibrated", "blended"))
        cells = []
        for c in cols:
            v = row[c]
            if c == "n":
                cells.append(str(int(v)))
            elif c in ("corr", "sd_o/2sd_t"):
                cells.append(f"{v:.2f}")
            elif c.startswith("bias"):
                cells.append(f"{v:+.0f}")
            else:
                text = f"{v:.1f}"
                cells.append(f"**{text}**" if c in ("pure", "calibrated", "blended") and v == best
                             else text)
        lines.append("| " + " | ".join(list(map(str, key)) + cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--origin", default="Tesla V100-PCIE-32GB",
                    help="the GPU whose measurements are scaled (default: the V100)")
    ap.add_argument("--logo", action="store_true",
                    help="retrain the learned model without each target GPU")
    ap.add_argument("--epochs", type=int, default=60, help="training epochs with --logo")
    ap.add_argument("--csv", type=Path, help="write every row's error to this CSV")
    ap.add_argument("--models-cache", type=Path, metavar="DIR",
                    help="with --logo: keep (and reuse) the held-out op models in DIR")
    args = ap.parse_args(argv)
    if not (args.data / "test").is_dir():
        print(f"NeuSight data not found at {args.data} (--data or PREDICTOR_DATA)", file=sys.stderr)
        return 2
    df = run(args.data, args.origin, args.logo, args.epochs, cache=args.models_cache)
    per_pair, per_family = tables(df)
    learned = "leave-target-out learned" if args.logo else (
        "shipped learned weights" if weights().size else "analytical (no shipped weights)")
    print(f"\nMAPE % (pure model: {learned}); bold: the best of pure, calibrated, blended\n")
    print(markdown(per_family))
    print()
    print(markdown(per_pair))
    print()
    print(verdict(per_pair))
    if args.csv:
        from predictor.io import atomic_writer

        with atomic_writer(args.csv, "w") as f:
            df.to_csv(f, index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
