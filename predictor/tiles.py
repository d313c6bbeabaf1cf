"""The GEMM tile choice as the core uses it: the shipped rule
(``weights/gemm_tiles.json``) read and checked, and the tile of one GEMM or
of an OpTable's fp32 matmul rows. The rule itself, its features and the
fallback are numba functions in ``predictor.kernels.tiles``."""

from __future__ import annotations

import functools
import json
from importlib import resources

import numpy as np

from predictor import hardware
from predictor.hardware import cc_major
from predictor.errors import PredictorError, WeightsError
from predictor.kernels import layout as L
from predictor.kernels.tiles import (CANDIDATES, TILES_FILE, TILES_FORMAT, choose_tile,
                                     choose_tiles, tile_rule_problem)

MAX_TILES_FILE_BYTES = 1 << 20


def read_params(path) -> np.ndarray:
    """The flat parameter array of a ``gemm_tiles.json``; a one-line
    WeightsError when the file is not one (wrong format, other candidates,
    non-finite or misplaced numbers)."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_TILES_FILE_BYTES + 1)
        if len(raw) > MAX_TILES_FILE_BYTES:
            raise ValueError("larger than 1 MiB")
        doc = json.loads(raw.decode())
        if doc.get("format") != TILES_FORMAT:
            raise ValueError(f"expected format {TILES_FORMAT}")
        if doc.get("candidates") != CANDIDATES.tolist():
            raise ValueError("its candidate tiles are not this version's")
        params = np.asarray([float(v) for v in doc["params"]], dtype=np.float64)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise WeightsError(f"{path}: not a readable GEMM tile file ({exc})") from exc
    problem = tile_rule_problem(params.size) or \
        (None if np.all(np.isfinite(params)) else "parameters that are not finite")
    if problem:
        raise WeightsError(f"{path}: damaged GEMM tile file ({problem})")
    return params


@functools.lru_cache(maxsize=1)
def shipped_params() -> np.ndarray:
    """The shipped tile rule (empty, the analytical fallback, when the
    package ships none)."""
    ref = resources.files("predictor").joinpath("weights", TILES_FILE)
    if not ref.is_file():
        return np.zeros(0)
    with resources.as_file(ref) as path:
        return read_params(path)


def predict_tile(compute_capability, sms: int, bt: int, m: int, n: int, k: int,
                 b_transposed: bool, params: np.ndarray | None = None) -> tuple[int, int]:
    """(tile_m, tile_n) a GEMM of `bt` x (M x N, reduction K) runs with on a
    GPU of this compute capability ("8.0", 8.0 or 8) and SM count: the
    learned rule where it has seen the architecture, else the analytical
    fallback. `params` defaults to the shipped rule."""
    p = shipped_params() if params is None else np.asarray(params, dtype=np.float64)
    c = choose_tile(p, cc_major(compute_capability), int(max(sms, 1)), int(max(bt, 1)),
                    int(max(m, 1)), int(max(n, 1)), int(max(k, 1)), bool(b_transposed), True)
    return int(CANDIDATES[c, 0]), int(CANDIDATES[c, 1])


def row_tiles(family: np.ndarray, dims: np.ndarray, dtype: np.ndarray, gpu) -> list[str]:
    """The predicted sgemm tile ("64x128", rows x columns) of each fp32
    matmul OpTable row on one GPU (a spec id or record), "" for other rows
    and on a device without a GPU spec: the learned rule covers cuBLAS's
    fp32 sgemm kernels only."""
    out = [""] * len(family)
    rows = np.flatnonzero((np.asarray(family) == L.MATMUL) & (np.asarray(dtype) == L.F32))
    if rows.size == 0:
        return out
    try:
        spec = hardware.get(gpu).spec
    except PredictorError:  # a calibrated CPU, or a device no spec describes: no tile to show
        return out
    d = np.ascontiguousarray(dims[rows], dtype=np.int64)
    n = rows.size
    chosen = choose_tiles(shipped_params(), np.full(n, cc_major(spec.get("compute_capability"))),
                          np.full(n, int(spec.get("sms") or 1)), d[:, 0], d[:, 1], d[:, 2],
                          d[:, 3], (d[:, L.GEMM_LAYOUT] & L.GEMM_B_T) != 0, True)
    for i, c in zip(rows, chosen):
        out[i] = f"{CANDIDATES[c, 0]}x{CANDIDATES[c, 1]}"
    return out
