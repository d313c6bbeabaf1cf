"""The per-op models: shipped learned weights, and the per-op prediction API.

``predict_op("linear", [(4096, 1024), (4096, 1024)], "H100-SXM5-80GB")`` runs
the op once on ``meta`` tensors to record the aten calls it makes, lowers them
through the same op-family registry as a traced graph, and returns the time of
an isolated execution (what a per-op benchmark measures, fixed per-call
overhead included). ``predict_rows`` is the vectorised form over OpTable-shaped
arrays (the accuracy harness uses it).
"""

from __future__ import annotations

import functools
import json
import zipfile
from importlib import resources
from typing import Any, Sequence

import numpy as np

from predictor import dtypes, hardware
from predictor.errors import InvalidArgumentError, WeightsError
from predictor.kernels import layout as L
from predictor.kernels.features import GROUP_NAMES, N_GROUPS
from predictor.kernels.mlp import HEADER, OTHER_CHIPS, floor_us, has_group
from predictor.kernels.optime import isolated_times_us, step_times_us
from predictor.kernels.roofline import default_params

WEIGHTS = "opmodels.npz"


# A chip's correction of its op models' times is a few tens of percent; a
# factor of 4 either way is a damaged file, not a GPU.
MAX_CHIP_CORRECTION = float(np.log(4.0))


def layout_problem(mlp: np.ndarray) -> str | None:
    """What is wrong with a packed weight array's layout (None: nothing), so a
    damaged or foreign array is refused before the numba forward pass reads
    past its end or divides by a zero scale. An empty array is valid: no
    learned models, the analytical model alone."""
    from predictor.kernels.features import (BOARD_FIELDS, G_BMM, G_CONV, G_MATMUL, N_FEATURES,
                                            N_GROUPS, SM_RANGE_FIELDS, has_sm_range)
    from predictor.kernels.tiles import tile_rule_problem
    from predictor.kernels.mlp import HEADER, layer_offsets
    from predictor.kernels.optime import MAX_HIDDEN

    if mlp.ndim != 1 or not np.isfinite(mlp).all():
        return "not a finite one-dimensional array"
    if mlp.size == 0:
        return None
    if mlp.size < 1 + HEADER * N_GROUPS or mlp[0] != N_GROUPS:
        return f"expected a header for {N_GROUPS} groups"
    for g in range(N_GROUPS):
        off, n_in, h1, h2, eta_max, floor = mlp[1 + HEADER * g:1 + HEADER * g + 6]
        if off == 0:
            continue  # group not trained: analytical model
        if n_in != N_FEATURES or not (1 <= h1 <= MAX_HIDDEN) or h2 < 1 \
                or off != int(off) or h1 != int(h1) or h2 != int(h2):
            return f"group {g}: bad shape ({n_in:g} inputs, {h1:g} x {h2:g} hidden)"
        # py_func: Python ints, so a huge count in a damaged file cannot overflow.
        mean, std, *_, end = layer_offsets.py_func(int(off), int(n_in), int(h1), int(h2))
        if mean < 1 + HEADER * N_GROUPS or end > mlp.size:
            return f"group {g}: weights run past the end of the array"
        if not eta_max > 0 or floor < 0 or not (mlp[std:std + int(n_in)] > 0).all():
            return f"group {g}: non-positive efficiency bound, floor or feature scale"
        a_off, n_aux = mlp[1 + HEADER * g + 8:1 + HEADER * g + 10]
        if n_aux != 0 and (a_off != int(a_off) or n_aux != int(n_aux) or n_aux < 0
                           or a_off < 1 + HEADER * N_GROUPS or a_off + n_aux > mlp.size):
            return f"group {g}: auxiliary numbers run past the end of the array"
        if g == G_BMM and n_aux != 0 and tile_rule_problem(int(n_aux)):
            return f"group {g}: {tile_rule_problem(int(n_aux))}"
        if g in (G_MATMUL, G_CONV) and n_aux != 0:
            # The SM range, then board records (kernels.clocks).
            ok = has_sm_range.py_func(int(n_aux))
            lo, hi = mlp[int(a_off):int(a_off) + 2] if ok else (0.0, 0.0)
            if not 0 < lo <= hi:
                return f"group {g}: the SM range is not two counts, fewest first"
            boards = mlp[int(a_off) + SM_RANGE_FIELDS:int(a_off + n_aux)].reshape(-1, BOARD_FIELDS)
            if not ((boards[:, 1:3] > 0).all() and (boards[:, 3] >= 0).all()
                    and (boards[:, 3] <= 1).all()):
                return (f"group {g}: a board record's power per SM, clock or clock "
                        "fraction is out of range")
        c_off, n_corr = mlp[1 + HEADER * g + 6:1 + HEADER * g + 8]
        if n_corr == 0:
            continue
        if c_off != int(c_off) or n_corr != int(n_corr) or n_corr < 0 \
                or c_off < 1 + HEADER * N_GROUPS or c_off + 2 * n_corr > mlp.size:
            return f"group {g}: per-chip corrections run past the end of the array"
        corr = mlp[int(c_off) + 1:int(c_off) + 2 * int(n_corr):2]
        if np.abs(corr).max() > MAX_CHIP_CORRECTION:
            return f"group {g}: a per-chip correction beyond a factor of {np.exp(MAX_CHIP_CORRECTION):g}"
    return None



def read_weights(path) -> tuple[np.ndarray, dict]:
    """Load a weights file written by ``predictor train-models``."""
    try:
        with open(path, "rb") as fh:
            is_zip = zipfile.is_zipfile(fh)
        if not is_zip:
            # numpy would try it as a pickle and say so
            raise ValueError("truncated or corrupt: not an .npz archive")
        with np.load(path, allow_pickle=False) as z:
            mlp = np.asarray(z["mlp"], dtype=np.float64)
            meta = json.loads(bytes(z["meta"]).decode())
    except (OSError, ValueError, KeyError, json.JSONDecodeError) as exc:
        raise WeightsError(f"{path}: not a readable op-model weights file ({exc})") from exc
    if meta.get("format") != 1:
        raise WeightsError(f"{path}: op-model weights file has an unknown format")
    from predictor.kernels.features import N_FEATURES

    if meta.get("features") != N_FEATURES:
        raise WeightsError(f"{path}: weights were trained for {meta.get('features')} features, "
                           f"this version builds {N_FEATURES}; run `predictor train-models`")
    problem = layout_problem(mlp)
    if problem:
        raise WeightsError(f"{path}: damaged op-model weights file ({problem})")
    return mlp, meta


@functools.lru_cache(maxsize=1)
def shipped() -> tuple[np.ndarray, dict]:
    """The weights shipped with the package (empty: analytical model only)."""
    ref = resources.files("predictor").joinpath("weights", WEIGHTS)
    if not ref.is_file():
        return np.zeros(0), {}
    with resources.as_file(ref) as path:
        return read_weights(path)


def weights() -> np.ndarray:
    return shipped()[0]


def measured_chips(mlp: np.ndarray | None = None) -> frozenset[float]:
    """The chip keys (``hardware.chip_key``) whose own kernels trained the
    weights: those with a per-chip correction of their own in some group.
    Every other GPU is predicted from its spec sheet alone."""
    mlp = weights() if mlp is None else mlp
    if mlp.size == 0:
        return frozenset()
    keys = set()
    for g in range(N_GROUPS):
        # (key, correction) pairs, read as layout_problem reads them.
        off, n = (int(v) for v in mlp[1 + HEADER * g + 6:1 + HEADER * g + 8])
        keys.update(mlp[off:off + 2 * n:2].tolist())
    return frozenset(keys - {OTHER_CHIPS, 0.0})


def outside_training_data(gpus) -> list[str]:
    """Ids of the GPUs among `gpus` (hardware.GPU) whose chip none of the
    shipped weights' measured kernels ran on (empty when no learned weights
    ship: nothing is learned from any GPU then)."""
    chips = measured_chips()
    if not chips:
        return []
    return [g.id for g in gpus if g.features[L.G_CHIP] not in chips]


# The longest softmax row of the training files (`python -m benchmarks.accuracy
# --rows` prints it). PyTorch's softmax kernel for rows over 1,024 elements
# reads its row three times, and once the rows of the resident blocks
# outgrow the caches the re-reads come from DRAM: the test split's rows of
# 8k-16k elements run at 0.38-0.55 of the DRAM bandwidth against 0.67-0.87
# for short ones, on every GPU of the data, and the models, which never saw
# such a row, price them up to 2x too fast (benchmarks/README.md, "Softmax
# rows longer than any training row").
LONGEST_MEASURED_SOFTMAX_ROW = 4094
# Below this share of the step's bytes moved, rows priced up to 2x too fast move
# the prediction by a few percent at most (GPT-2 small's log-softmax over its 50k
# vocabulary, 3 % of its training step's bytes at batch 2): no note.
UNMEASURED_SHARE_NOTED = 0.05


def unmeasured_shape_notes(graph, batch_size: int | None = None) -> list[str]:
    """One-line notes on ops of `graph` whose shapes no measured kernel
    covers and which the models are known to misprice, where they carry at
    least UNMEASURED_SHARE_NOTED of the step's bytes moved at `batch_size`
    (None: the traced batch): softmax over rows longer than
    LONGEST_MEASURED_SOFTMAX_ROW."""
    ops = graph.ops
    if not len(ops):
        return []
    batch = graph.batch_size if batch_size is None else int(batch_size)
    dims = ops.dims(batch)
    elems = ops.work(batch)[1].astype(np.float64)
    moved = elems * np.asarray(L.DTYPE_BYTES, dtype=np.float64)[ops.dtype] * ops.count
    long = np.isin(ops.family, (L.SOFTMAX, L.SOFTMAX_BWD)) \
        & (dims[:, L.MEM_INNER] > LONGEST_MEASURED_SOFTMAX_ROW)
    total = float(moved.sum())
    if not long.any() or total <= 0.0:
        return []
    share = float(moved[long].sum()) / total
    if share < UNMEASURED_SHARE_NOTED:
        return []
    n = int(ops.count[long].sum())
    return [f"{n:,} softmax {'op' if n == 1 else 'ops'} over rows of up to "
            f"{int(dims[long, L.MEM_INNER].max()):,} elements ({share:.0%} of the step's bytes "
            f"moved), longer than any measured ({LONGEST_MEASURED_SOFTMAX_ROW:,}): past the "
            "caches the kernel re-reads each row from DRAM, so expect them up to 2x slower "
            "than predicted (README, 'How accurate')"]


def predict_rows(family: np.ndarray, dims: np.ndarray,
                 gpus: Sequence[str | hardware.GPU] | str | hardware.GPU,
                 dtype: np.ndarray | None = None, *, mlp: np.ndarray | None = None,
                 params: np.ndarray | None = None,
                 kernels: np.ndarray | None = None) -> np.ndarray:
    """Isolated-op time (ms) of each row on its GPU (one id, or one per row),
    as a per-op benchmark times it: the learned families with the training
    data's fixed per-measurement floor. With `kernels` (the rows' kernel
    counts), each row's time inside a step instead, as the engine sums it:
    no such floor, a launch cost per kernel."""
    family = np.ascontiguousarray(family, dtype=np.int64)
    dims = np.ascontiguousarray(dims, dtype=np.int64)
    if isinstance(gpus, (str, hardware.GPU)):
        gpus = [gpus] * len(family)
    ids = list(dict.fromkeys(gpus))
    db = hardware.database()
    feats = db.features([db.get(g) for g in ids])
    index = np.array([ids.index(g) for g in gpus], dtype=np.int64)
    dtype = np.zeros(len(family), np.int64) if dtype is None else np.asarray(dtype, np.int64)
    params = default_params() if params is None else params
    mlp = weights() if mlp is None else mlp
    if kernels is not None:
        kernels = np.ascontiguousarray(kernels, dtype=np.int64)
        return step_times_us(family, dtype, kernels, dims, feats, index, params, mlp) * 1e-3
    return isolated_times_us(family, dtype, dims, feats, index, params, mlp) * 1e-3


def floors_us(mlp: np.ndarray | None = None) -> dict[str, float]:
    """Per learned model group, the fixed cost (us) of one timed call in the
    training data's harness: part of every `predict_rows` / `predict_op`
    time of the group's ops, and of no time inside a step."""
    mlp = weights() if mlp is None else mlp
    return {GROUP_NAMES[g]: float(floor_us(mlp, g)) for g in range(N_GROUPS)
            if len(mlp) and has_group(mlp, g)}


# ---------------------------------------------------------------- predict_op --

def _op_call(op: str, tensors: list, attrs: dict):
    """A callable that runs `op` on meta tensors the way PyTorch users call it."""
    import torch
    import torch.nn.functional as F

    name = op.lower()
    scalar = attrs.pop("scalar", False)
    if name == "linear":
        return lambda: F.linear(tensors[0], tensors[1], tensors[2] if len(tensors) > 2 else None)
    if name in ("matmul", "mm"):
        return lambda: torch.matmul(tensors[0], tensors[1])
    if name == "bmm":
        return lambda: torch.bmm(tensors[0], tensors[1])
    if name in ("conv2d", "conv"):
        kw = {k: attrs[k] for k in ("stride", "padding", "dilation", "groups") if k in attrs}
        return lambda: F.conv2d(tensors[0], tensors[1], tensors[2] if len(tensors) > 2 else None,
                                **kw)
    if name == "softmax":
        return lambda: torch.softmax(tensors[0], dim=attrs.get("dim", -1))
    if name in ("layer_norm", "layernorm", "ln"):
        shape = attrs.get("normalized_shape", (tensors[0].shape[-1],))
        return lambda: F.layer_norm(tensors[0], tuple(shape))
    fn = getattr(torch, name, None) or getattr(F, name, None)
    if fn is None or not callable(fn):
        raise InvalidArgumentError(f"unknown op {op!r}; use an aten/torch function name such as "
                                   "linear, bmm, conv2d, add, mul, relu, softmax, layer_norm")
    if scalar:
        return lambda: fn(tensors[0], attrs.get("value", 2.0))
    return lambda: fn(*tensors)


def record_rows(call) -> list:
    """Run `call` under a dispatch mode and lower every aten call it makes:
    the (family, dims, kernels) rows the op-family registry gives them, as a
    traced graph would hold them (views and other free calls dropped)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from predictor import families
    from predictor.lowering import is_channels_last, is_contiguous, is_transposed_view

    calls = []

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            calls.append((func, args, kwargs or {}, out))
            return out

    with Recorder():
        call()

    def conv(x):
        if isinstance(x, torch.Tensor):
            return families.TensorMeta(tuple(int(s) for s in x.shape), x.dtype,
                                       is_transposed_view(x), is_channels_last(x),
                                       is_contiguous(x))
        if isinstance(x, (list, tuple)):
            return type(x)(conv(i) for i in x)
        return x

    rows = []
    for func, args, kwargs, out in calls:
        if families.lookup(func) is None and families.is_free(func):
            continue
        extracted, _ = families.extract(func, conv(args), {k: conv(v) for k, v in kwargs.items()},
                                        conv(out))
        rows.extend(extracted)
    return rows


def predict_op(op: str, shapes: Sequence[Sequence[int]], gpu: str, dtype: str = "float32",
               origin: tuple[str, float] | None = None, in_step: bool = False,
               **attrs: Any) -> float:
    """Predicted time (ms) of one isolated op on `gpu`.

    By default as a per-op benchmark times one op on its own: for the
    learned families that includes the fixed cost of one timed call in the
    training data's harness (19-32 us, 123 for convolutions, with the shipped
    weights: ``opmodel.floors_us``),
    which dominates small ops. ``in_step=True``: the op's time inside a
    training step, as ``predict`` sums it (its kernels' launch costs, no
    per-call floor).

    origin: ``(gpu_id, measured_ms)``, the op's time measured on another GPU:
    calibrated mode, ``measured_ms x f(op, gpu) / f(op, origin)`` with ``f`` the
    model (its bias cancels in the ratio).

    Examples: ``predict_op("linear", [(B*M, K), (N, K)], "H100-SXM5-80GB")``,
    ``predict_op("conv2d", [(B, C, H, W), (Cout, C, 3, 3)], "T4", stride=1, padding=1)``,
    ``predict_op("mul", [(B, H)], "L4", scalar=True)``,
    ``predict_op("softmax", [(B, H)], "A100", dim=-1)``.
    """
    import torch

    hardware.get(gpu)  # unknown GPU -> clear error before any work
    origin_id, measured_ms = _check_origin(origin)
    dtype_code = dtypes.ALIASES.get(dtype)
    if dtype_code not in dtypes.OP_DTYPES:
        raise InvalidArgumentError(f"unknown dtype {dtype!r}; use float32, float16 or bfloat16")
    tdt = getattr(torch, dtypes.name(dtype_code))
    try:
        tensors = [torch.empty(tuple(int(s) for s in shape), dtype=tdt, device="meta")
                   for shape in shapes]
    except (TypeError, ValueError, RuntimeError) as exc:
        raise InvalidArgumentError(f"bad shapes {shapes!r}: {exc}") from exc
    call = _op_call(op, tensors, dict(attrs))
    try:
        rows = record_rows(call)
    except RuntimeError as exc:
        raise InvalidArgumentError(f"{op} does not accept shapes {list(shapes)}: "
                                   f"{str(exc).splitlines()[0]}") from exc
    if not rows:
        return 0.0
    fam = np.array([r[0] for r in rows], dtype=np.int64)
    dims = np.zeros((len(rows), L.MAX_DIMS), dtype=np.int64)
    for i, (_, d, _) in enumerate(rows):
        dims[i, :len(d)] = d
    code = np.full(len(rows), dtype_code, dtype=np.int64)
    kernels = np.array([r[2] for r in rows], dtype=np.int64) if in_step else None
    t = float(predict_rows(fam, dims, gpu, code, kernels=kernels).sum())
    if origin_id is None:
        return t
    return measured_ms * t / float(predict_rows(fam, dims, origin_id, code,
                                                kernels=kernels).sum())


def _check_origin(origin) -> tuple[str | None, float]:
    """(origin GPU id, measured ms) of predict_op's calibrated mode."""
    import math

    if origin is None:
        return None, 0.0
    try:
        gpu_id, measured = origin
        measured = float(measured)
    except (TypeError, ValueError):
        raise InvalidArgumentError(
            f"origin must be (gpu_id, measured_ms), got {origin!r}") from None
    if str(gpu_id).strip().lower() == "cpu":
        raise InvalidArgumentError("a time measured on a CPU cannot be scaled to a GPU; give "
                                   "a measurement from a GPU in the database")
    if not math.isfinite(measured) or measured <= 0:
        raise InvalidArgumentError(f"measured time must be a positive number of ms, got {measured!r}")
    return hardware.get(gpu_id).id, measured
