"""Would calibrated mode gain from a blend weight per *kind of GPU pair*?

The shipped blend (``predictor.calibration.blend``) fits one weight per model
group over every pair of training GPUs. This asks whether pairs of one SM
generation (both before Volta, or both Volta and later: the SM change behind
the softmax and layer-norm networks' pre-Volta input) or of one memory type
(HBM or GDDR) would earn a weight of their own: per group and class, the
shipped rule (the grid weight of lowest mean MAPE among those that make no
training pair worse than the model alone), fitted leave-one-GPU-out (each
target's weight without the pairs that contain it) and scored on that
target's pairs, on the training files' shapes.

    python -m benchmarks.blend_pair_classes --data ../shared/data/neusight --models-cache DIR

DIR holds the held-out models (``predictor train-models --blend-only
--models-cache DIR`` trains them, ~30 min on 2 cores; this script then takes
under a minute).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from predictor import hardware
from predictor.calibration import blend as B
from predictor.calibration import datasets as D


def _pre_volta(gpu: str) -> bool:
    return hardware.pre_volta(hardware.get(gpu).spec) > 0.5


def _hbm(gpu: str) -> bool:
    return "HBM" in str(hardware.get(gpu).spec.get("memory_type", ""))


CLASSINGS = {
    "one weight (shipped)": lambda o, t: True,
    "SM generation": lambda o, t: _pre_volta(o) == _pre_volta(t),
    "memory type": lambda o, t: _hbm(o) == _hbm(t),
}


def scores(res: pd.DataFrame) -> pd.DataFrame:
    """Per classing, group, origin and target: the weight used and the pure
    and blended MAPE % of that pair."""
    out = []
    pairs = set(zip(res.origin, res.target))
    for name, same in CLASSINGS.items():
        cls = {p: same(*p) for p in pairs}
        flag = np.array([cls[p] for p in zip(res.origin, res.target)])
        for value in (True, False):
            part = res[flag == value]
            for target in sorted(set(part.target)):
                w = B.fit_weights(part, exclude={target})
                ev = part[(part.target == target) & (part.group != "")]
                for group, g in ev.groupby("group"):
                    ww = w.get(group, 0.0)
                    pure, blend = B.pair_errors(g)  # pairs in origin order
                    col = int(np.argmin(np.abs(B.WEIGHT_GRID - ww)))
                    for origin, p_pure, p_blend in zip(sorted(set(g.origin)), pure,
                                                       blend[:, col]):
                        out.append({"classing": name, "group": group, "origin": origin,
                                    "target": target, "w": ww, "pure": p_pure,
                                    "blend": p_blend})
    return pd.DataFrame(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=Path("../shared/data/neusight"))
    ap.add_argument("--models-cache", type=Path, required=True)
    args = ap.parse_args(argv)
    res = B.residuals(D.load_train(args.data), cache=args.models_cache)
    df = scores(res)
    df["worse"] = df.blend > df.pure + 1.0
    table = df.groupby(["classing", "group"]).agg(
        pairs=("pure", "size"), pure=("pure", "mean"), blend=("blend", "mean"),
        worse_by_1pt=("worse", "sum"))
    pd.set_option("display.width", 160)
    print("MAPE % over held-out targets' training pairs (training shapes)\n")
    print(table.round(2).to_string())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
