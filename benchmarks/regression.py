"""Gate: the shipped accuracy figures must not get worse.

    python -m benchmarks.regression --data ../shared/data/neusight            # compare, exit 1 on a regression
    python -m benchmarks.regression --data ../shared/data/neusight --update   # rewrite the shipped figures

The figures (all errors in %, lower is better), computed by the harnesses' own
functions with their defaults (seed 0, 60 epochs):

- ``accuracy.logo.<family>``: the learned op models' leave-one-GPU-out MAPE,
  mean over the held-out GPUs except P4 (``benchmarks.accuracy``, the "learned
  LOGO" column of its table);
- ``accuracy.in-dist.<family>``: their in-distribution test MAPE (the
  "learned test" column; conv has no test file);
- ``e2e.logo.<gpu>.<mode>`` and ``e2e.logo.all``: end-to-end mean |error| of
  the measured iterations predicted with op models trained without that GPU
  (``benchmarks.e2e --logo``), per GPU and mode and over all labels;
- ``e2e.in-dist.<mode>`` and ``e2e.in-dist.all``: the same with the shipped
  weights (``benchmarks.e2e``), per mode over all GPUs and overall;
- ``e2e.in-dist.p90`` and ``e2e.logo.p90``: the 90th percentile of |error|
  over all labels of each run: the ``trained`` band the predictions quote
  (``predictor.expected_error``), and the part of the ``unseen`` band the
  leave-one-GPU-out labels give (the band also takes published fp32
  figures of boards outside the data, ``benchmarks.expected_error``). Beside the
  comparison, a quoted band below the run's figure by more than the
  tolerance fails too: a prediction must not promise more than is measured
  (rewrite the bands with ``python -m benchmarks.expected_error``).

They live in ``benchmarks/figures/shipped.json``. Without ``--update`` a fresh
run is compared with it: a figure worse than shipped by more than
``--tolerance`` percentage points (2.0) fails (exit 1); a figure the file does
not have is reported as new; a shipped figure the run no longer produces
fails. ``--update`` rewrites the file from a fresh run: commit it with the
change that moved the figures. The baselines of the accuracy harness are not
fitted, and a training set met twice (the four GPUs that leave alone are held
out by both harnesses) is trained once.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import io
import json
import math
import sys
import time
from pathlib import Path

from benchmarks.expected_error import p90
from predictor import expected_error
from predictor.errors import FileFormatError, PredictorError

SHIPPED = Path(__file__).resolve().parent / "figures" / "shipped.json"
TOLERANCE = 2.0


# ---------------------------------------------------------------- the file ----

def load_figures(path: str | Path) -> dict[str, float]:
    """The figures of a shipped.json (name -> %); FileFormatError naming the
    file when it is missing or not such a file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FileFormatError(f"{path}: not found (create it with --update)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise FileFormatError(f"{path}: cannot read ({getattr(exc, 'strerror', None) or exc})") \
            from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise FileFormatError(f"{path}: not valid JSON ({exc.msg}, line {exc.lineno} column "
                              f"{exc.colno})") from None
    figures = doc.get("figures") if isinstance(doc, dict) else None
    if not isinstance(figures, dict):
        raise FileFormatError(f"{path}: no \"figures\" table (name -> value in %)")
    for name, value in figures.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value):
            raise FileFormatError(f"{path}: figure {name!r} is {value!r}, not a finite number")
    return {str(k): float(v) for k, v in figures.items()}


def write_figures(path: str | Path, figures: dict[str, float], command: str) -> None:
    from predictor.io import atomic_write_text

    doc = {"command": command, "date": datetime.date.today().isoformat(), "unit": "%",
           "figures": {k: round(float(v), 2) for k, v in figures.items()}}
    atomic_write_text(path, json.dumps(doc, indent=1) + "\n")


# ---------------------------------------------------------- comparison ----

@dataclasses.dataclass(frozen=True)
class Row:
    name: str
    shipped: float | None
    now: float | None
    status: str  # "ok" | "better" | "WORSE" | "new" | "MISSING"

    @property
    def change(self) -> float | None:
        if self.shipped is None or self.now is None:
            return None
        return self.now - self.shipped

    @property
    def failed(self) -> bool:
        return self.status in ("WORSE", "MISSING")


def compare(shipped: dict[str, float], now: dict[str, float],
            tolerance: float = TOLERANCE) -> list[Row]:
    """One row per figure, shipped order first, then the new ones. Every figure
    is an error: higher is worse."""
    rows = []
    for name, old in shipped.items():
        new = now.get(name)
        if new is None or not math.isfinite(new):
            rows.append(Row(name, old, None, "MISSING"))
            continue
        change = new - old
        status = "WORSE" if change > tolerance else "better" if change < -tolerance else "ok"
        rows.append(Row(name, old, new, status))
    rows += [Row(name, None, value, "new") for name, value in now.items() if name not in shipped]
    return rows


def format_table(rows: list[Row]) -> str:
    cell = lambda x, fmt: f"{'-':>8s}" if x is None else format(x, fmt)  # noqa: E731
    width = max([len("figure")] + [len(r.name) for r in rows])
    lines = [f"{'figure':{width}s} {'shipped':>8s} {'now':>8s} {'change':>8s}  status",
             "-" * (width + 36)]
    for r in rows:
        lines.append(f"{r.name:{width}s} {cell(r.shipped, '8.2f')} {cell(r.now, '8.2f')} "
                     f"{cell(r.change, '+8.2f')}  {r.status}")
    return "\n".join(lines)


def verdict(rows: list[Row], tolerance: float) -> str:
    worse = [r.name for r in rows if r.status == "WORSE"]
    missing = [r.name for r in rows if r.status == "MISSING"]
    new = [r.name for r in rows if r.status == "new"]
    parts = []
    if worse:
        parts.append(f"{len(worse)} worse than shipped by more than {tolerance:g} points")
    if missing:
        parts.append(f"{len(missing)} shipped but not produced")
    if new:
        parts.append(f"{len(new)} new (not in the shipped file)")
    if not (worse or missing):
        return f"ok: {len(rows)} figures" + (f"; {parts[0]}" if parts else "")
    return ("FAILED: " + "; ".join(parts) + ". If the change is deliberate, rerun with --update "
            "and commit benchmarks/figures/shipped.json with it.")


# ------------------------------------------------------------- figures ----

def trained_once(train_fn):
    """`train_fn` (``T.train``'s signature) remembering its results: training is
    deterministic for given samples, seed, epochs and groups."""
    from predictor.calibration import train as T

    memo = {}
    # Networks by group and training rows: the two harnesses' held-out sets
    # share most groups' rows (the A100-PCIE-80GB has conv files only, so
    # holding out both A100 boards trains no group the two single boards'
    # sets did not).
    group_cache = {}
    all_groups = tuple(range(T.N_GROUPS))

    @functools.wraps(train_fn)
    def train(samples, *, seed=0, epochs=60, groups=None, **kw):
        groups = all_groups if groups is None else tuple(sorted(set(groups)))
        key = (samples.fingerprint(), seed, epochs, groups, tuple(sorted(kw.items())))
        if key not in memo:
            memo[key] = train_fn(samples, seed=seed, epochs=epochs, groups=groups,
                                 group_cache=group_cache, **kw)
        return memo[key]

    return train


def accuracy_figures(df) -> dict[str, float]:
    """The learned model's columns of ``accuracy.table``: in-distribution test
    MAPE and LOGO MAPE averaged over held-out GPUs except P4, per family."""
    from benchmarks import accuracy as A

    learned = df[df.model == "learned"]
    test = learned[learned.split == "test"]
    logo = learned[(learned.split == "logo") & ~learned.gpu.isin(A.EXCLUDED_FROM_MEAN)]
    out = {}
    for split, src in (("logo", logo), ("in-dist", test)):
        for fam in A.FAMILIES:
            sel = src[src.family == fam]
            if len(sel):
                out[f"accuracy.{split}.{fam}"] = float(sel.mape.mean())
    return out


def e2e_figures(summary, setting: str) -> dict[str, float]:
    """Mean |error| % from ``e2e.summary_frame``: per GPU and mode plus overall
    for "logo", per mode (all GPUs) plus overall for "in-dist"."""
    out = {}
    for r in summary.itertuples():
        if r.gpu == "all" and r.mode == "all":
            out[f"e2e.{setting}.all"] = float(r.mean_abs_err_pct)
        elif setting == "logo" and r.gpu != "all":
            out[f"e2e.logo.{r.gpu}.{r.mode}"] = float(r.mean_abs_err_pct)
        elif setting == "in-dist" and r.gpu == "all":
            out[f"e2e.in-dist.{r.mode}"] = float(r.mean_abs_err_pct)
    return out


def band_figure(results, setting: str) -> dict[str, float]:
    """The 90th percentile of |error| % over all labels of an
    ``e2e.results_frame`` (``benchmarks.expected_error.p90``)."""
    return {f"e2e.{setting}.p90": p90(results["err_pct"])}


# The quoted band (predictor.expected_error) each run's p90 checks.
QUOTED_BANDS = {"e2e.in-dist.p90": "trained", "e2e.logo.p90": "unseen"}


def quoted_band_problems(now: dict[str, float], quoted: dict[str, float],
                         tolerance: float = TOLERANCE) -> list[str]:
    """One line per band the predictions quote that is narrower than this
    run measures by more than `tolerance` points."""
    out = []
    for name, standing in QUOTED_BANDS.items():
        if name in now and standing in quoted and quoted[standing] < now[name] - tolerance:
            out.append(f"the {standing!r} band quoted with predictions ({quoted[standing]:g} %) "
                       f"is below {name} measured now ({now[name]:g} %); rewrite it with "
                       "python -m benchmarks.expected_error")
    return out


def _summary_text(E, summary) -> str:
    """The end-to-end harness's per-GPU table, as it prints it."""
    buf = io.StringIO()
    E.print_summary(summary, out=buf)
    return buf.getvalue().rstrip()


# The measured-kernel files (benchmarks.measure_kernels) the shipped weights
# are trained on beside the dataset's (`predictor train-models --extra`), so in
# every training set of the gate too: an H200's fp32 kernels, forward and
# backward (benchmarks/README.md, "Another training GPU").
EXTRA = (Path(__file__).resolve().parent / "data" / "NVIDIA_H200.csv",)


def add_extra_arguments(ap: argparse.ArgumentParser, when: str = "") -> None:
    """A harness's --extra CSV (repeatable) and --no-extra, `when` prefixing
    their help ("with --logo: ")."""
    ap.add_argument("--extra", action="append", default=None, metavar="CSV",
                    help=f"{when}train every set on this measured-kernel file of "
                         "benchmarks.measure_kernels (another GPU, never scored) beside the "
                         "dataset; repeatable (default: the shipped weights' own, "
                         "benchmarks/data/NVIDIA_H200.csv)")
    ap.add_argument("--no-extra", action="store_true",
                    help=f"{when}train on the dataset's five GPUs alone")


def extra_files(args: argparse.Namespace) -> list:
    """The files --extra / --no-extra name (default EXTRA)."""
    if args.extra is None:
        return [] if args.no_extra else list(EXTRA)
    return list(args.extra)


def compute(data: Path, log=print) -> dict[str, float]:
    """Every figure, from fresh runs of the two harnesses."""
    from benchmarks import accuracy as A
    from benchmarks import e2e as E
    from predictor.calibration import train as T

    train_fn = trained_once(T.train)
    figures: dict[str, float] = {}

    t0 = time.perf_counter()
    log("per-op accuracy (learned models only)")
    df, _ = A.run(data, log=log, baselines=False, train_fn=train_fn, extra=EXTRA)
    figures.update(accuracy_figures(df))
    log(f"per-op accuracy: {time.perf_counter() - t0:.0f} s")

    t0 = time.perf_counter()
    labels = E.discover(data)
    log(f"end-to-end, shipped weights: {len(labels)} labels")
    results = E.results_frame(E.evaluate(data, labels, log=log))
    shipped = E.summary_frame(results)
    log(_summary_text(E, shipped))
    figures.update(e2e_figures(shipped, "in-dist"))
    figures.update(band_figure(results, "in-dist"))
    log("end-to-end, leave-one-GPU-out")
    weights_for = E.logo_weights(data, labels, log, train_fn=train_fn, extra=EXTRA)
    results = E.results_frame(E.evaluate(data, labels, log=log, weights_for=weights_for))
    logo = E.summary_frame(results)
    log(_summary_text(E, logo))
    figures.update(e2e_figures(logo, "logo"))
    figures.update(band_figure(results, "logo"))
    log(f"end-to-end: {time.perf_counter() - t0:.0f} s")
    return {k: round(v, 2) for k, v in figures.items() if math.isfinite(v)}


# ---------------------------------------------------------------- main ----

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.regression",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=Path("../shared/data/neusight"),
                    help="the neusight data folder")
    ap.add_argument("--tolerance", type=float, default=TOLERANCE,
                    help="percentage points a figure may get worse (default %(default)s)")
    ap.add_argument("--shipped", type=Path, default=SHIPPED,
                    help="the shipped figures (default benchmarks/figures/shipped.json)")
    what = ap.add_mutually_exclusive_group()
    what.add_argument("--update", action="store_true",
                      help="rewrite the shipped figures from a fresh run")
    what.add_argument("--now", type=Path, metavar="FILE",
                      help="compare the figures of FILE (same format) instead of running")
    args = ap.parse_args(argv)
    log = functools.partial(print, file=sys.stderr, flush=True)
    if not args.tolerance >= 0:
        ap.error("--tolerance must be >= 0")
    start = time.perf_counter()
    try:
        shipped = None if args.update else load_figures(args.shipped)
        if args.now is not None:
            now = load_figures(args.now)
        else:
            for sub in ("train", "test", "labels"):
                if not (args.data / sub).is_dir():
                    raise FileFormatError(f"{args.data}: no {sub}/ folder (pass --data, the "
                                          "neusight data folder)")
            now = compute(args.data, log=log)
    except PredictorError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.update:
        try:
            before = load_figures(args.shipped)
        except PredictorError:
            before = {}
        command = f"python -m benchmarks.regression --data {args.data} --update"
        write_figures(args.shipped, now, command)
        print(format_table(compare(before, now, args.tolerance)))
        print(f"\nwrote {len(now)} figures to {args.shipped} in {time.perf_counter() - start:.0f} s")
        return 0
    rows = compare(shipped, now, args.tolerance)
    print(format_table(rows))
    print()
    print(verdict(rows, args.tolerance))
    bands = quoted_band_problems(now, expected_error.shipped(), args.tolerance)
    for line in bands:
        print(f"FAILED: {line}")
    log(f"done in {time.perf_counter() - start:.0f} s")
    return 1 if bands or any(r.failed for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
