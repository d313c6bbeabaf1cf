"""`predictor train-models`: reproduce the shipped per-op model weights
(opmodels.npz: each group's networks fitted from several seeds and
distilled into one, about 5 minutes on two cores) and, with ``--blend`` /
``--blend-only``, the calibrated mode's blend weights (calibration_blend.json: five op models
trained leave-one-GPU-out, about 20 minutes on two cores;
``predictor.calibration.blend``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from predictor.commands.common import console, positive_int

NAME = "train-models"
# Largest difference of a weight that --verify accepts as reproduced. A
# float64 fit on the same data differs across CPUs by about 1e-8 (an
# AVX-512 machine against its own AVX2 path); a changed recipe, data file
# or training code moves weights by 1e-3 and more.
VERIFY_TOLERANCE = 1e-6


def add_parser(sub) -> None:
    p = sub.add_parser(
        NAME, help="train the learned per-op models from measured kernels",
        description="Fit the per-op efficiency networks on the NeuSight per-kernel "
                    "measurements (train/ folder) and write opmodels.npz. Seeded, and in "
                    "float64: the same seed gives the same weights on CPUs of other "
                    "instruction sets, to about 1e-8 (--verify checks a file).")
    p.add_argument("--data", required=True, metavar="DIR",
                   help="the NeuSight data folder (holds train/ and test/)")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="where to write opmodels.npz (default: the package's weights folder, "
                        "over the shipped weights: only with their recipe (same --extra "
                        "files, seed, epochs and ensemble; for calibration_blend.json its "
                        "own), or with --replace-shipped)")
    p.add_argument("--replace-shipped", action="store_true",
                   help="without --out: replace the shipped weights even with another recipe")
    p.add_argument("--extra", action="append", default=[], metavar="CSV",
                   help="also train on a measured-kernel file of `python -m "
                        "benchmarks.measure_kernels` (another GPU's forward and backward "
                        "kernels); repeatable")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epochs", type=int, default=60)
    p.add_argument("--ensemble", type=positive_int, default=None, metavar="N",
                   help="networks fitted per group from different seeds and distilled into "
                        "one (default: the shipped recipe's); 1 trains one network, faster")
    p.add_argument("--blend", action="store_true",
                   help="also fit calibrated mode's blend weights (calibration_blend.json; "
                        "trains one model per GPU held out, about 20 minutes on two "
                        "cores)")
    p.add_argument("--blend-only", action="store_true",
                   help="fit calibration_blend.json only; leave opmodels.npz as it is")
    p.add_argument("--models-cache", default=None, metavar="DIR",
                   help="keep (and reuse) the held-out models of the blend fit in DIR")
    p.add_argument("--verify", action="store_true",
                   help="train into a temporary folder with the recipe of the weights at "
                        "--out (default: the shipped ones) and compare: exit 1 where a weight "
                        f"differs by more than {VERIFY_TOLERANCE:g} (training runs in float64, "
                        "so CPUs of other instruction sets agree to about 1e-8); opmodels.npz "
                        "only")


def recipe(meta: dict) -> dict:
    """What, beside the dataset, decides a weights file: the measured-kernel
    files it trained on (by name), seed, epochs and ensemble size."""
    return {"--extra": sorted(meta.get("extra", [])), "--seed": meta.get("seed"),
            "--epochs": meta.get("epochs"), "--ensemble": meta.get("ensemble")}


def _refuse_another_recipe(out: Path, args: argparse.Namespace, ensemble: int) -> None:
    """Writing over the package's weights (opmodels.npz, or with --blend /
    --blend-only calibration_blend.json) with another recipe than the file's
    own would lose the shipped ones (only a reinstall brings them back):
    refused, in one line that says what the shipped recipe was."""
    import json

    from predictor import opmodel
    from predictor.calibration import blend as B
    from predictor.calibration import train as T
    from predictor.errors import InvalidArgumentError, WeightsError

    asked = _asked_recipe(args, ensemble)
    files = ([] if args.blend_only else [out / T.WEIGHTS_FILE]) \
        + ([out / B.BLEND_FILE] if args.blend or args.blend_only else [])
    for path in files:
        if not path.exists():
            continue
        try:
            meta = (opmodel.read_weights(path)[1] if path.suffix == ".npz"
                    else json.loads(path.read_text(encoding="utf-8")))
        except (WeightsError, OSError, ValueError):
            continue  # a damaged file is not worth keeping
        differ = _recipe_differences(asked, recipe(meta), "shipped")
        if differ:
            raise InvalidArgumentError(
                f"this would replace the shipped {path.name} ({path}) with another recipe: "
                f"{differ}; pass --out DIR to write elsewhere, or --replace-shipped")


def _asked_recipe(args: argparse.Namespace, ensemble: int) -> dict:
    """The recipe the command line asks for, in `recipe`'s form."""
    return recipe({"extra": [Path(f).name for f in args.extra], "seed": args.seed,
                   "epochs": args.epochs, "ensemble": ensemble})


def _recipe_differences(asked: dict, own: dict, whose: str) -> str:
    """The options where `asked` differs from a file's `own` recipe, as
    "--seed 1 (shipped: 0), ..."; empty where they agree."""
    return ", ".join(f"{k} {_show(asked[k])} ({whose}: {_show(own[k])})"
                     for k in own if asked[k] != own[k])


def _show(value) -> str:
    if isinstance(value, list):
        return " ".join(value) if value else "none"
    return str(value)


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from predictor import opmodel
    from predictor.calibration import train as T

    out = Path(args.out) if args.out else Path(opmodel.__file__).resolve().parent / "weights"
    ensemble = T.ENSEMBLE if args.ensemble is None else args.ensemble
    if args.verify:
        return _verify(args, out, ensemble)
    if args.out is None and not args.replace_shipped:
        from predictor.calibration.datasets import check_folder

        check_folder(args.data)  # a wrong --data is said first
        _refuse_another_recipe(out, args, ensemble)
    if not args.blend_only:
        # A bar on a terminal only: a log or a pipe gets the one line at the end.
        fits = ensemble + (ensemble > 1)  # the ensemble, then the distilled network
        bar = tqdm(total=args.epochs * len(T.SHIPPED_GROUPS) * fits, desc="training", unit="epoch",
                   leave=False, disable=not sys.stderr.isatty())
        mlp, meta = T.train_from_data(args.data, out, seed=args.seed, epochs=args.epochs,
                                      progress=bar.update, extra=args.extra, ensemble=ensemble,
                                      log=console().print)
        bar.close()
        console().print(f"wrote {out / T.WEIGHTS_FILE}: {meta['samples']:,} measured ops on "
                        f"{', '.join(meta['gpus'])}; {mlp.size:,} weights")
    if args.blend or args.blend_only:
        from predictor.calibration import blend as B

        cache = Path(args.models_cache) if args.models_cache else None
        w, meta = B.fit_and_save(args.data, out, seed=args.seed, epochs=args.epochs, cache=cache,
                                 log=console().print, extra=args.extra, ensemble=ensemble)
        console().print(f"wrote {out / B.BLEND_FILE}: w " + ", ".join(
            f"{k} {v:.2f}" for k, v in sorted(w.items())) + f" ({len(meta['pairs'])} GPU pairs)")
    return 0


def _verify(args: argparse.Namespace, out: Path, ensemble: int) -> int:
    """Retrain the weights file at `out` with its own recipe in a temporary
    folder and compare, weight by weight: 0 when every weight is within
    VERIFY_TOLERANCE, else 1; one line either way."""
    import tempfile

    import numpy as np

    from predictor import opmodel
    from predictor.calibration import train as T
    from predictor.calibration.datasets import check_folder
    from predictor.errors import InvalidArgumentError

    if args.blend or args.blend_only:
        raise InvalidArgumentError("--verify checks opmodels.npz only; leave out --blend and "
                                   "--blend-only")
    path = out / T.WEIGHTS_FILE
    if not path.is_file():
        raise InvalidArgumentError(f"--verify: no weights file to compare with at {path}")
    check_folder(args.data)
    kept, meta = opmodel.read_weights(path)
    differ = _recipe_differences(_asked_recipe(args, ensemble), recipe(meta), "the file's")
    if differ:
        raise InvalidArgumentError(f"--verify: {path} was trained with another recipe: {differ}")
    trained_in = meta.get("train_dtype", "float32")  # files from before the field were float32
    if trained_in != T.TRAIN_DTYPE:
        console().print(f"note: {path} was trained in {trained_in}, this version trains in "
                        f"{T.TRAIN_DTYPE}: expect differences")
    with tempfile.TemporaryDirectory(prefix="predictor-verify-") as tmp:
        fresh, _ = T.train_from_data(args.data, tmp, seed=args.seed, epochs=args.epochs,
                                     extra=args.extra, ensemble=ensemble)
    if fresh.shape != kept.shape:
        console().print(f"differs: {path} holds {kept.size:,} weights, the retrain "
                        f"{fresh.size:,}")
        return 1
    diff = np.abs(fresh - kept)
    worst = float(diff.max()) if diff.size else 0.0
    over = int((diff > VERIFY_TOLERANCE).sum())
    if over:
        console().print(f"differs: {over:,} of {kept.size:,} weights of {path} are more than "
                        f"{VERIFY_TOLERANCE:g} from the retrain (largest {worst:.3g})")
        return 1
    console().print(f"reproduced: {kept.size:,} weights of {path}, largest difference "
                    f"{worst:.3g} (tolerance {VERIFY_TOLERANCE:g})")
    return 0
