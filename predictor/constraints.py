"""Numeric bounds on the columns of a ranked table, shared by ``search`` and
``explore``: each caller names its constraints in a table of
``name -> (column, "max" | "min")``."""

from __future__ import annotations

import math
from typing import Mapping

import numpy as np

from predictor.errors import InvalidArgumentError
from predictor.io import printable


def check_bounds(bounds: Mapping, table: Mapping[str, tuple[str, str]],
                 also: tuple[str, ...] = ()) -> None:
    """One-line errors for an unknown constraint name or a value that is not a
    finite number; `also`: other names the caller accepts (for the message)."""
    for key, value in bounds.items():
        if key not in table:
            raise InvalidArgumentError(f"unknown constraint {printable(repr(key), 100)}; choose "
                                       f"from {', '.join((*also, *table))}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise InvalidArgumentError(f"constraint {key} must be a number, got {value!r}")


def within_bounds(df, bounds: Mapping, table: Mapping[str, tuple[str, str]]) -> np.ndarray:
    """Rows of `df` inside every bound (NaN, e.g. no price, never is)."""
    ok = np.ones(len(df), dtype=bool)
    for key, value in bounds.items():
        col, kind = table[key]
        vals = df[col].to_numpy(dtype=float)
        with np.errstate(invalid="ignore"):
            ok &= vals <= value if kind == "max" else vals >= value
    return ok
