"""Lowering: an aten-level FX graph -> an OpTable.

Each call node is mapped through the op-family registry (``families``) to rows
of dims. The trace ran at a *sentinel* batch size (a prime no model dimension
is a multiple of), so a tensor dim divisible by it carries the batch:
``d = k * sentinel`` means ``k * b`` at batch ``b``. Each distinct op is
extracted at b = 1 and b = 2 to get its dims as ``base + slope * b``, and checked
at the sentinel itself; a dim that is not affine in the batch (rare: an op whose
size is quadratic in it) is frozen at the requested batch size and the graph
is marked as not rescalable.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx

from predictor import families
from predictor.families import TensorMeta
from predictor.kernels import layout as L
from predictor.optable import OpTable, _empty_gemm

aten = torch.ops.aten


@dataclass
class Lowered:
    table: OpTable
    unsupported: dict[str, int] = field(default_factory=dict)
    batch_scalable: bool = True
    # aten ops the host dispatches per phase, views and other kernel-free ops
    # included: each costs CPU time even when it launches nothing.
    host_ops: list[int] = field(default_factory=lambda: [0] * len(L.PHASE_NAMES))
    # node index -> the table rows its kernels went to (-1: a row dropped as empty)
    node_rows: dict[int, list[int]] = field(default_factory=dict)


class BatchScaler:
    """Maps shapes traced at the sentinel batch to shapes at another batch: a
    dim ``k * sentinel`` becomes ``k * batch`` (``sentinel`` None: unchanged).
    The lowering extracts rows through it; the memory pass asks it which dims
    carry the batch."""

    def __init__(self, sentinel: int | None, batch: int):
        self.sentinel = sentinel
        self.batch = batch

    def dim(self, d: int) -> int:
        s = self.sentinel
        if s is None or d == 0 or d % s:
            return d
        return d // s * self.batch

    def convert(self, x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            return TensorMeta(tuple(self.dim(int(d)) for d in x.shape), x.dtype,
                              is_transposed_view(x), is_channels_last(x), is_contiguous(x))
        if isinstance(x, bool):
            return x
        if isinstance(x, int):
            return self.dim(x)
        if isinstance(x, torch.SymInt):
            return self.dim(int(x))
        if isinstance(x, (list, tuple)):
            return type(x)(self.convert(i) for i in x) if isinstance(x, list) else tuple(
                self.convert(i) for i in x)
        if isinstance(x, torch.fx.Node):
            return self.convert(x.meta.get("val"))
        return x


def is_transposed_view(x: torch.Tensor) -> bool:
    """Last two dims stored column-major (a transposed view): the layout a GEMM
    library sees. Size-1 dims carry no layout."""
    if x.dim() < 2 or int(x.shape[-1]) == 1 or int(x.shape[-2]) == 1:
        return False
    try:
        return int(x.stride(-2)) == 1 and int(x.stride(-1)) != 1
    except (RuntimeError, NotImplementedError):  # tensors without strides (sparse, ...)
        return False


def is_channels_last(x: torch.Tensor) -> bool:
    """Stored channels-last (torch.channels_last for 4-D, channels_last_3d for
    5-D tensors) and not also plain contiguous: the memory format the strides
    of a traced tensor give (``model.to(memory_format=torch.channels_last)``
    and channels-last inputs make convolutions channels-last). A tensor whose
    channels or spatial extent is 1 is both, and counts as contiguous."""
    fmt = {4: torch.channels_last, 5: torch.channels_last_3d}.get(x.dim())
    if fmt is None:
        return False
    try:
        return bool(x.is_contiguous(memory_format=fmt)) and not bool(x.is_contiguous())
    except (RuntimeError, NotImplementedError):  # tensors without strides (sparse, ...)
        return False


def is_contiguous(x: torch.Tensor) -> bool:
    """Stored row-major and dense (torch.contiguous_format); a tensor without
    strides counts as contiguous."""
    try:
        return bool(x.is_contiguous())
    except (RuntimeError, NotImplementedError):  # tensors without strides (sparse, ...)
        return True


def _key(x: Any) -> Any:
    """A hashable identity of an argument structure (shapes, dtypes, layouts, scalars)."""
    if isinstance(x, torch.fx.Node):
        return _key(x.meta.get("val"))
    if isinstance(x, torch.Tensor):
        return ("T", tuple(int(d) for d in x.shape), x.dtype, is_transposed_view(x),
                is_channels_last(x), is_contiguous(x))
    if isinstance(x, (list, tuple)):
        return tuple(_key(i) for i in x)
    if isinstance(x, dict):
        return tuple(sorted((k, _key(v)) for k, v in x.items()))
    if isinstance(x, (int, float, bool, str, type(None), torch.dtype, torch.device,
                      torch.layout, torch.memory_format)):
        return x
    if isinstance(x, torch.SymInt):
        return int(x)
    return repr(x)


def _rows_at(op, node: torch.fx.Node, scaler: BatchScaler):
    args = scaler.convert(tuple(node.args))
    kwargs = {k: scaler.convert(v) for k, v in node.kwargs.items()}
    out = scaler.convert(node.meta.get("val"))
    return families.extract(op, args, kwargs, out)


def _row_dtype(node: torch.fx.Node) -> int:
    """The compute dtype of an op from its tensor arguments and outputs
    (``families.row_dtype_code``)."""
    cands: list[torch.Tensor] = []

    def collect(x):
        if isinstance(x, torch.fx.Node):
            collect(x.meta.get("val"))
        elif isinstance(x, torch.Tensor):
            cands.append(x)
        elif isinstance(x, (list, tuple)):
            for i in x:
                collect(i)

    collect(node.args)
    collect(node.meta.get("val"))
    return families.row_dtype_code(cands)


def lower(gm: torch.fx.GraphModule, phase_marks: tuple[int, ...], sentinel: int | None,
          batch: int) -> Lowered:
    """Lower a traced step. `phase_marks` are node indices where backward and the
    optimizer start; `sentinel` is the batch size the trace ran at (None: the
    trace ran at `batch` itself and nothing is rescaled)."""
    at = (BatchScaler(sentinel, 1), BatchScaler(sentinel, 2), BatchScaler(sentinel, batch))
    at_sentinel = BatchScaler(None, 0)
    cache: dict[Any, tuple] = {}
    rows: dict[tuple, int] = {}
    op_names: list[str] = []
    op_index: dict[str, int] = {}
    unsupported: dict[str, int] = {}
    host_ops = [0] * len(L.PHASE_NAMES)
    node_keys: dict[int, list[tuple]] = {}
    scalable = True

    into_zeros = _scatters_into_zeros(gm)
    for idx, node in enumerate(gm.graph.nodes):
        if node.op != "call_function" or node.target is operator.getitem:
            continue
        op = aten.scatter_add_.default if node in into_zeros else node.target
        if not isinstance(op, torch._ops.OpOverload):
            continue
        phase = L.FORWARD
        for i, mark in enumerate(phase_marks):
            if idx >= mark:
                phase = i + 1
        host_ops[phase] += 1
        if families.lookup(op) is None and families.is_free(op):
            continue
        key = (op, _key(node.args), _key(node.kwargs), _key(node.meta.get("val")))
        hit = cache.get(key)
        if hit is None:
            hit = _extract(op, node, at, at_sentinel, sentinel)
            cache[key] = hit
        extracted, is_unsupported, affine = hit
        scalable &= affine
        name = str(op.overloadpacket.__name__)
        if is_unsupported:
            unsupported[name] = unsupported.get(name, 0) + 1
        if name not in op_index:
            op_index[name] = len(op_names)
            op_names.append(name)
        dt = _row_dtype(node)
        keys = node_keys.setdefault(idx, [])
        for fam, base, slope, kern in extracted:
            row_key = (fam, phase, dt, kern, base, slope, op_index[name])
            rows[row_key] = rows.get(row_key, 0) + 1
            keys.append(row_key)

    table = OpTable.from_rows(rows, op_names, where="traced graph")
    kept = [k for k in rows if not _empty_gemm(k)]
    where = {k: i for i, k in enumerate(kept)}
    node_rows = {idx: [where.get(k, -1) for k in ks] for idx, ks in node_keys.items()}
    return Lowered(table, unsupported, scalable, host_ops, node_rows)


# Ops that make a tensor of zeros (the start of a scatter's gradient).
_ZEROS = {aten.new_zeros.default, aten.zeros.default, aten.zeros_like.default}


def _scatters_into_zeros(gm: torch.fx.GraphModule) -> set:
    """The out-of-place scatter-adds whose destination is a tensor of zeros
    nothing else uses. ATen's gradient of a gather is `zeros.scatter_add_(dim,
    index, grad)`, in place, on a GPU; on the trace's fake tensors (a tensor
    subclass) the same formula takes its out-of-place branch, which would
    copy the zeros whole before scattering. Such a node is priced as the
    in-place scatter a GPU runs (``families._scatter_rows``), the zeros' fill
    as its own row."""
    found = set()
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is aten.scatter_add.default \
                and node.args and isinstance(node.args[0], torch.fx.Node):
            dst = node.args[0]
            if dst.op == "call_function" and dst.target in _ZEROS and len(dst.users) == 1:
                found.add(node)
    return found


def _extract(op, node, at: tuple[BatchScaler, BatchScaler, BatchScaler], at_sentinel: BatchScaler,
             sentinel: int | None):
    """Rows of one distinct op as (family, base dims, slope dims, kernels);
    `at` converts shapes to batch 1, batch 2 and the requested batch."""
    if sentinel is None:
        rows, unsupported = _rows_at(op, node, at_sentinel)
        return [(f, tuple(d), (0,) * len(d), k) for f, d, k in rows], unsupported, True
    r1, unsupported = _rows_at(op, node, at[0])
    r2, _ = _rows_at(op, node, at[1])
    rs, _ = _rows_at(op, node, at_sentinel)
    # Kernel launches can depend on the size (embedding backward switches
    # algorithm with the index count): take them at the requested batch.
    rb, _ = _rows_at(op, node, at[2])
    out = []
    affine = len(r1) == len(r2) == len(rs) == len(rb)
    if affine:
        for (f1, d1, k1), (f2, d2, k2), (fs, ds, ks), (_, _, kb) in zip(r1, r2, rs, rb):
            slope = tuple(b - a for a, b in zip(d1, d2))
            base = tuple(a - s for a, s in zip(d1, slope))
            if f1 != f2 or f1 != fs or any(b + s * sentinel != x for b, s, x in zip(base, slope, ds)):
                affine = False
                break
            out.append((f1, base, slope, kb))
    if not affine:
        out = [(f, tuple(d), (0,) * len(d), k) for f, d, k in rb]
    return out, unsupported, affine
