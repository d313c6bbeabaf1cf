"""Sanity checks of a calibration's measurements, before it is saved.

A calibration taken on a busy machine can be wrong without looking wrong:
per-op sums of 615 / 624 / 616 ms at batches 8 / 32 / 64 (threads fighting
other work: the time is the machine's, not the model's) fit an overhead
model of ``(1 + 0.000) x ops - 35.17 ms`` that then predicts every other
batch size from noise. Each check below returns one line saying what is
wrong and what to try; ``predictor calibrate`` refuses to save a calibration
with a problem unless told to keep it (``--keep``), and the Python API
records the lines in ``Calibration.notes``.

- **Time grows with the batch.** Between the smallest and the largest
  calibrated batch the measured per-op sum must grow by at least a quarter
  of the growth the pure model expects on this device (a model that expects
  8x and a measurement that shows 1.0x is not a measurement of the model),
  and it must never fall by more than 10 % from one batch to the next.
- **Bounded variance.** The real iterations at one batch size must agree:
  the spread between their fastest and slowest (interquartile range over
  median) at most 50 %.
- **A non-degenerate fit.** The overhead model must not take away more than
  half of the smallest batch's per-op sum (a large negative fixed cost is a
  fit to noise), nor scale the per-op sum below half or above 10x.
"""

from __future__ import annotations

import numpy as np

# Thresholds of the checks (see the module docstring).
MIN_GROWTH_SHARE = 0.25
MAX_DROP = 0.10
MAX_SPREAD = 0.50
MAX_NEGATIVE_FIXED_SHARE = 0.5
SCALE_RANGE = (-0.5, 9.0)

ADVICE = "re-run on an idle machine, or with --threads 1 --clock cpu"


def _ms(values) -> str:
    return " / ".join(f"{v:,.1f}" for v in values)


def growth_problem(batches, ops_ms, model_ms) -> str | None:
    """Per-op sums that do not grow with the batch as the model says they should."""
    b, ops, model = (np.asarray(x, dtype=float) for x in (batches, ops_ms, model_ms))
    if b.size < 2 or not np.all(np.isfinite(ops)) or np.any(ops <= 0):
        return None
    where = f"per-op sums {_ms(ops)} ms at batches {' / '.join(str(int(x)) for x in b)}"
    drops = ops[1:] < (1 - MAX_DROP) * ops[:-1]
    if drops.any():
        j = int(np.argmax(drops))
        return (f"the measured time falls as the batch grows ({where}: batch {int(b[j + 1])} "
                f"is faster than batch {int(b[j])}); {ADVICE}")
    expected = model[-1] / model[0] if model[0] > 0 else 1.0
    measured = ops[-1] / ops[0]
    if expected > 1.2 and measured - 1 < MIN_GROWTH_SHARE * (expected - 1):
        return (f"the measured time hardly grows with the batch ({where}: {measured:.2f}x, "
                f"where the model expects {expected:.1f}x); {ADVICE}")
    return None


def spread_problem(batches, samples) -> str | None:
    """Real iterations at one batch size that disagree with each other."""
    for b, s in zip(batches, samples):
        s = np.asarray([x for x in s if np.isfinite(x) and x > 0], dtype=float)
        if s.size < 3:
            continue
        q1, med, q3 = np.percentile(s, [25, 50, 75])
        if med > 0 and (q3 - q1) / med > MAX_SPREAD:
            return (f"the real iterations at batch {int(b)} vary too much "
                    f"({s.min():,.1f} to {s.max():,.1f} ms, interquartile range "
                    f"{(q3 - q1) / med:.0%} of the median); {ADVICE}")
    return None


def fit_problem(ops_ms, overhead) -> str | None:
    """An overhead model fitted to noise."""
    ops = np.asarray(ops_ms, dtype=float)
    if not getattr(overhead, "points", 0) or ops.size == 0 or ops.min() <= 0:
        return None
    fixed, scale = float(overhead.fixed_ms), float(overhead.scale)
    model = f"iteration = (1 {scale:+.3f}) x per-op sum {fixed:+.2f} ms"
    if fixed < -MAX_NEGATIVE_FIXED_SHARE * ops.min():
        return (f"the overhead fit is degenerate ({model}: a negative fixed cost of more than "
                f"half the smallest per-op sum, {ops.min():,.1f} ms); {ADVICE}")
    if not SCALE_RANGE[0] <= scale <= SCALE_RANGE[1]:
        return f"the overhead fit is degenerate ({model}); {ADVICE}"
    return None


def problems(batches, ops_ms, model_ms, iteration_samples, overhead) -> list[str]:
    """Every check's line (empty: the calibration looks sane)."""
    out = [growth_problem(batches, ops_ms, model_ms),
           spread_problem(batches, iteration_samples),
           fit_problem(ops_ms, overhead)]
    return [p for p in out if p]
