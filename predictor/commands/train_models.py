"""`predictor train-models`: reproduce the shipped per-op model weights."""

from __future__ import annotations

import argparse
from pathlib import Path

from predictor.commands.common import console

NAME = "train-models"


def add_parser(sub) -> None:
    p = sub.add_parser(
        NAME, help="train the learned per-op models from measured kernels",
        description="Fit the per-op efficiency networks on the NeuSight per-kernel "
                    "measurements (train/ folder) and write opmodels.npz. Seeded: the same "
                    "seed gives the same weights up to floating-point noise.")
    p.add_argument("--data", required=True, metavar="DIR",
                   help="the NeuSight data folder (holds train/ and test/)")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="where to write opmodels.npz (default: the package's weights folder)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epochs", type=int, default=60)


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from predictor import opmodel
    from predictor.calibration import train as T

    out = Path(args.out) if args.out else Path(opmodel.__file__).resolve().parent / "weights"
    bar = tqdm(total=args.epochs * len(T.SHIPPED_GROUPS), desc="training", unit="epoch", leave=False)
    mlp, meta = T.train_from_data(args.data, out, seed=args.seed, epochs=args.epochs,
                                  progress=bar.update)
    bar.close()
    console().print(f"wrote {out / T.WEIGHTS_FILE}: {meta['samples']:,} measured ops on "
                    f"{', '.join(meta['gpus'])}; {mlp.size:,} weights")
    return 0
