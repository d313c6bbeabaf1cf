"""Checks that a Graph read from disk (or built by hand) is one the engine can
evaluate: every array of the right shape and integer type, every code in range,
every size non-negative and below what 64-bit arithmetic in the kernels can
hold. The numba kernels index tables with these codes and multiply these dims
without bounds checks, so a corrupt or hostile file must stop here, with a
one-line :class:`FileFormatError` naming it, never reach them (where it would
give a wrong number, an exception from deep inside, or a crashed process).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from predictor.errors import FileFormatError
from predictor.kernels import layout as L

# A dim at batch 1, and its growth per sample, are at most this (2^40 elements
# in one dim is 4 TiB of fp32: no model has that).
MAX_DIM = 1 << 40
MAX_BATCH = 1 << 31
MAX_COUNT = 1 << 40
MAX_KERNELS = 1 << 20


def _int_array(a: Any, name: str, ndim: int, bad) -> np.ndarray:
    if not isinstance(a, np.ndarray) or a.ndim != ndim or a.dtype.kind not in "iu":
        raise bad(f"{name} must be a {ndim}-D integer array")
    if a.dtype.kind == "u" and a.size and int(a.max()) > np.iinfo(np.int64).max:
        raise bad(f"{name} holds values beyond 64-bit integers")
    return np.ascontiguousarray(a, dtype=np.int64)


def _in_range(a: np.ndarray, lo: int, hi: int, name: str, bad) -> None:
    if a.size and (int(a.min()) < lo or int(a.max()) >= hi):
        raise bad(f"{name} has values outside {lo}..{hi - 1}")


def _whole(value: Any, name: str, lo: int, hi: int, bad, optional: bool = False) -> None:
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or \
            not lo <= int(value) <= hi:
        raise bad(f"{name} must be a whole number in {lo}..{hi}, got {value!r}")


def check_optable(ops: Any, where: str = "graph") -> None:
    """Validate an OpTable in place (its arrays become contiguous int64)."""
    from predictor.optable import OpTable

    def bad(msg: str) -> FileFormatError:
        return FileFormatError(f"{where}: {msg}")

    if not isinstance(ops, OpTable):
        raise bad("no op table")
    cols = {}
    for name in ("family", "phase", "dtype", "count", "kernels", "op"):
        cols[name] = _int_array(getattr(ops, name), f"ops.{name}", 1, bad)
    n = len(cols["family"])
    if any(len(a) != n for a in cols.values()):
        raise bad("the op table's columns have different lengths")
    for name in ("dbase", "dslope"):
        a = _int_array(getattr(ops, name), f"ops.{name}", 2, bad)
        if a.shape != (n, L.MAX_DIMS):
            raise bad(f"ops.{name} has shape {a.shape}, expected ({n}, {L.MAX_DIMS})")
        cols[name] = a
    names = ops.op_names
    if not isinstance(names, list) or not all(isinstance(s, str) for s in names):
        raise bad("ops.op_names must be a list of op names")
    _in_range(cols["family"], 0, L.N_FAMILIES, "ops.family", bad)
    _in_range(cols["phase"], 0, len(L.PHASE_NAMES), "ops.phase", bad)
    _in_range(cols["dtype"], 0, len(L.DTYPE_NAMES), "ops.dtype", bad)
    _in_range(cols["count"], 0, MAX_COUNT, "ops.count", bad)
    _in_range(cols["kernels"], 0, MAX_KERNELS, "ops.kernels", bad)
    _in_range(cols["op"], 0, max(len(names), 1), "ops.op", bad)
    if n and not names:
        raise bad("ops.op_names is empty")
    base, slope = cols["dbase"], cols["dslope"]
    _in_range(slope, 0, MAX_DIM + 1, "ops.dslope", bad)
    _in_range(base + slope, 0, MAX_DIM + 1, "the op dims at batch 1", bad)
    _in_range(base, -MAX_DIM, MAX_DIM + 1, "ops.dbase", bad)
    # GEMM-like rows need every size >= 1 (the kernels divide by them).
    at1 = base + slope
    fam = cols["family"]
    for codes, width, what in (((L.MATMUL,), 4, "matmul"),
                               ((L.CONV, L.CONV_DGRAD, L.CONV_WGRAD), 11, "convolution"),
                               ((L.ATTENTION, L.ATTENTION_BWD), 6, "attention"),
                               ((L.LSTM, L.LSTM_BWD), 4, "LSTM")):
        rows = np.isin(fam, codes)
        if rows.any() and int(at1[rows, :width].min()) < 1:
            raise bad(f"a {what} row has a size below 1")
    conv = np.isin(fam, (L.CONV, L.CONV_DGRAD, L.CONV_WGRAD))
    if conv.any():
        c, k, groups = at1[conv, 1], at1[conv, 4], at1[conv, 9]
        if np.any(c % groups) or np.any(k % groups):
            raise bad("a convolution row's groups do not divide its channels")
    attn = np.isin(fam, (L.ATTENTION, L.ATTENTION_BWD))
    if attn.any() and not np.isin(at1[attn, 6], (0, 1)).all():
        raise bad("an attention row's causal flag is not 0 or 1")
    for name, a in cols.items():
        setattr(ops, name, a)


def check_graph(graph: Any, where: str = "graph"):
    """Validate a Graph (fields and op table); returns it."""
    from predictor.optable import Graph

    def bad(msg: str) -> FileFormatError:
        return FileFormatError(f"{where}: {msg}")

    if not isinstance(graph, Graph):
        raise bad("no graph inside")
    if not isinstance(graph.name, str):
        raise bad(f"the model name must be text, got {type(graph.name).__name__}")
    if graph.mode not in ("train", "inference"):
        raise bad(f"mode must be 'train' or 'inference', got {graph.mode!r}")
    if graph.optimizer is not None and graph.optimizer not in ("adam", "adamw", "sgd"):
        raise bad(f"unknown optimizer {graph.optimizer!r}")
    _whole(graph.batch_size, "batch_size", 1, MAX_BATCH, bad)
    _whole(graph.seq_len, "seq_len", 1, MAX_BATCH, bad, optional=True)
    for name in ("parameters", "trainable_parameters", "parameter_bytes"):
        _whole(getattr(graph, name), name, 0, 1 << 62, bad)
    if not isinstance(graph.batch_scalable, (bool, np.bool_)):
        raise bad("batch_scalable must be true or false")
    unsupported = graph.unsupported
    if not isinstance(unsupported, dict) or not all(
            isinstance(k, str) and isinstance(v, (int, np.integer)) and not isinstance(v, bool)
            and v >= 0 for k, v in unsupported.items()):
        raise bad("unsupported must map op names to counts")
    seconds = getattr(graph, "trace_seconds", 0.0)
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or \
            not math.isfinite(seconds) or seconds < 0:
        raise bad(f"trace_seconds must be a non-negative number, got {seconds!r}")
    host = getattr(graph, "host_ops", [])
    if not isinstance(host, list) or len(host) not in (0, len(L.PHASE_NAMES)) or not all(
            isinstance(h, (int, np.integer)) and not isinstance(h, bool) and 0 <= h < MAX_COUNT
            for h in host):
        raise bad(f"host_ops must be {len(L.PHASE_NAMES)} op counts, got {host!r}")
    check_optable(graph.ops, where)
    if len(graph.ops) == 0:
        # A time of 0 ms would be a wrong answer, not a prediction.
        raise bad("the model computes nothing from its inputs (no ops): nothing to predict")
    memory = getattr(graph, "memory", None)
    if memory is not None:
        _check_memory(memory, bad)
    return graph


def _check_memory(mem: Any, bad) -> None:
    from predictor.memory import MemoryProfile

    if not isinstance(mem, MemoryProfile):
        raise bad("the memory profile is not one")
    cols = {}
    for name in ("power", "dtype", "alloc", "free", "category", "cap"):
        cols[name] = _int_array(getattr(mem, name), f"memory.{name}", 1, bad)
    coef = mem.coef
    if not isinstance(coef, np.ndarray) or coef.ndim != 1 or coef.dtype.kind != "f":
        raise bad("memory.coef must be a 1-D float array")
    n = len(coef)
    if any(len(a) != n for a in cols.values()):
        raise bad("the memory profile's columns have different lengths")
    if n and (not np.all(np.isfinite(coef)) or float(coef.min()) < 0 or float(coef.max()) > 2.0 ** 50):
        raise bad("memory.coef must be finite sizes")
    _whole(mem.n_steps, "memory.n_steps", 0, 1 << 40, bad)
    _in_range(cols["power"], 0, 5, "memory.power", bad)
    _in_range(cols["dtype"], 0, len(L.DTYPE_NAMES), "memory.dtype", bad)
    _in_range(cols["alloc"], 0, int(mem.n_steps) + 1, "memory.alloc", bad)
    _in_range(cols["free"], 0, int(mem.n_steps) + 1, "memory.free", bad)
    _in_range(cols["category"], 0, 64, "memory.category", bad)
    _in_range(cols["cap"], 0, 1 << 50, "memory.cap", bad)
    if n and np.any(cols["alloc"] > cols["free"]):
        raise bad("memory: a storage freed before it is allocated")
    for name, a in cols.items():
        setattr(mem, name, a)
    mem.coef = np.ascontiguousarray(coef, dtype=np.float64)
