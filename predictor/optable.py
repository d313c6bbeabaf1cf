"""The OpTable (columnar op list), the MemoryProfile, the Graph that carries
both, and the Graph's file format with the checks that guard the kernels.

One row per distinct GPU kernel family invocation; identical rows are merged
with a count. Dims are stored as an affine function of the batch size,
``dims(b) = dbase + dslope * b``, so a graph traced once is evaluated at any
batch size with integer arithmetic and no retracing.

Everything a Graph holds is defined here, next to it, so that the frontends
that build one, the engine and memory model that evaluate it and the file
format that stores it all depend on this module and it on none of them.
"""

from __future__ import annotations

import dataclasses
import importlib
import io
import json
import math
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np

from predictor import dtypes
from predictor.errors import FileFormatError, InvalidArgumentError
from predictor.frontend import optimizers
from predictor.io import MAX_NAME_CHARS, atomic_writer, printable, read_regular
from predictor.kernels import layout as L
from predictor.kernels.memory import peak_memory
from predictor.kernels.work import largest_count, work_table
from predictor import limits
from predictor.limits import check_batch_size

# Sizes of GEMM-like rows that must be >= 1 for a kernel to run at all (the
# kernels divide by them): the first GEMM_DIMS[family] dims of a row.
GEMM_DIMS = {L.MATMUL: 4, L.CONV: 11, L.CONV_DGRAD: 11, L.CONV_WGRAD: 11, L.ATTENTION: 6,
             L.ATTENTION_BWD: 6, L.LSTM: 4, L.LSTM_BWD: 4}
# A row's sizes stay below this so that the kernels' int64 products cannot wrap.
MAX_ROW_SIZE = 1 << 62


@dataclass
class OpTable:
    family: np.ndarray   # int64[n]  layout family code
    phase: np.ndarray    # int64[n]  FORWARD / BACKWARD / OPTIMIZER_PHASE
    dtype: np.ndarray    # int64[n]  layout dtype code
    count: np.ndarray    # int64[n]  how many times this row runs per iteration
    kernels: np.ndarray  # int64[n]  GPU kernel launches per execution
    dbase: np.ndarray    # int64[n, MAX_DIMS]
    dslope: np.ndarray   # int64[n, MAX_DIMS]
    op: np.ndarray       # int64[n]  index into op_names (the aten op that produced it)
    op_names: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return int(self.family.shape[0])

    def dims(self, batch: int) -> np.ndarray:
        return self.dbase + self.dslope * np.int64(batch)

    def work(self, batch: int) -> tuple[np.ndarray, np.ndarray]:
        """(FLOPs, elements moved) per execution of each row at `batch`."""
        return work_table(self.family, self.dbase, self.dslope, batch)

    def with_dtype(self, dtype_code: int) -> "OpTable":
        """The same ops with every floating-point row cast to `dtype_code`."""
        floating = np.isin(self.dtype, dtypes.OVERRIDABLE)
        new = np.where(floating, dtype_code, self.dtype).astype(np.int64)
        return OpTable(self.family, self.phase, new, self.count, self.kernels, self.dbase,
                       self.dslope, self.op, self.op_names)

    def with_rows(self, name: str, rows: list[tuple[int, int, int, tuple, int, int]]) -> "OpTable":
        """These ops and `rows` of (family, phase, dtype, base dims, kernels,
        count) appended as a new op `name`, their dims independent of the
        batch: a step's work no aten op of the trace records (an edit of the
        traced program)."""
        n = len(rows)
        dbase = np.zeros((n, L.MAX_DIMS), np.int64)
        for i, (_, _, _, dims, _, _) in enumerate(rows):
            dbase[i, :len(dims)] = dims
        col = lambda j: np.array([r[j] for r in rows], dtype=np.int64)  # noqa: E731
        cat = lambda a, b: np.concatenate([a, b])  # noqa: E731
        return OpTable(cat(self.family, col(0)), cat(self.phase, col(1)), cat(self.dtype, col(2)),
                       cat(self.count, col(5)), cat(self.kernels, col(4)),
                       np.vstack([self.dbase, dbase]),
                       np.vstack([self.dslope, np.zeros_like(dbase)]),
                       cat(self.op, np.full(n, len(self.op_names), np.int64)),
                       list(self.op_names) + [name])

    @staticmethod
    def empty() -> "OpTable":
        z = np.zeros(0, dtype=np.int64)
        d = np.zeros((0, L.MAX_DIMS), dtype=np.int64)
        return OpTable(z, z, z, z, z, d, d, z, [])

    @classmethod
    def from_rows(cls, rows: Mapping[tuple, int], op_names: list[str],
                  where: str = "graph") -> "OpTable":
        """The table of the rows a frontend merged, ``{(family, phase, dtype,
        kernels, base dims, slope dims, op index): count}``, in their order.

        A GEMM-like row whose size is 0 at every batch (a zero-size weight)
        launches no kernel and is dropped; a size the kernels' 64-bit
        arithmetic cannot hold is refused (FileFormatError naming `where`)."""
        kept = [(key, cnt) for key, cnt in rows.items() if not _empty_gemm(key)]
        n = len(kept)
        table = cls(
            family=np.empty(n, np.int64), phase=np.empty(n, np.int64),
            dtype=np.empty(n, np.int64), count=np.empty(n, np.int64),
            kernels=np.empty(n, np.int64), dbase=np.zeros((n, L.MAX_DIMS), np.int64),
            dslope=np.zeros((n, L.MAX_DIMS), np.int64), op=np.empty(n, np.int64),
            op_names=op_names)
        for i, ((fam, phase, dt, kern, base, slope, opi), cnt) in enumerate(kept):
            if any(abs(v) >= MAX_ROW_SIZE for v in base + slope):
                raise FileFormatError(f"{where}: an op's size overflows 64-bit integers; "
                                      "absurd shapes")
            table.family[i], table.phase[i], table.dtype[i] = fam, phase, dt
            table.kernels[i], table.op[i], table.count[i] = kern, opi, cnt
            table.dbase[i, :len(base)] = base
            table.dslope[i, :len(slope)] = slope
        return table


def _empty_gemm(key: tuple) -> bool:
    fam, base, slope = key[0], key[4], key[5]
    width = GEMM_DIMS.get(fam, 0)
    return any(b == 0 and s == 0 for b, s in zip(base[:width], slope[:width]))


# ------------------------------------------------------------ memory profile --
# What a storage of the step holds (MemoryProfile.category).
PARAMETERS = 0
BUFFERS = 1
OPTIMIZER_STATE = 2
INPUTS = 3
ACTIVATIONS = 4   # forward tensors kept for backward
GRADIENTS = 5     # parameter gradients
TEMPORARIES = 6   # everything else: forward temporaries, gradients of activations, optimizer temporaries
WORKSPACE = 7     # library workspaces inside one op (cuDNN, flash-attention backward)
CATEGORY_NAMES = ("parameters", "buffers", "optimizer_state", "inputs", "activations",
                  "gradients", "temporaries", "workspace")


@dataclass
class MemoryProfile:
    """Every storage of one traced step: size ``coef * b**power`` elements of
    dtype ``dtype``, alive from op ``alloc`` to op ``free`` (inclusive)."""

    coef: np.ndarray       # float64[n]
    power: np.ndarray      # int64[n]
    dtype: np.ndarray      # int64[n] layout dtype code
    alloc: np.ndarray      # int64[n]
    free: np.ndarray       # int64[n]
    category: np.ndarray   # int64[n]
    cap: np.ndarray        # int64[n] size cap in bytes (0: none), for workspaces
    n_steps: int
    phase_marks: tuple[int, ...] = ()
    training: bool = True

    def __len__(self) -> int:
        return int(self.coef.shape[0])

    def _itemsize(self, dtype_code: int | None) -> np.ndarray:
        codes = self.dtype
        if dtype_code is not None:
            floating = np.isin(codes, dtypes.FLOATING) & (self.category != WORKSPACE)
            codes = np.where(floating, dtype_code, codes)
        return np.asarray(L.DTYPE_BYTES, dtype=np.int64)[codes]

    def bytes_at(self, batch: int, dtype_code: int | None = None) -> np.ndarray:
        """Exact bytes of every storage at `batch` (no allocator rounding)."""
        elems = np.ceil(self.coef * float(batch) ** self.power - 1e-9)
        size = elems.astype(np.int64) * self._itemsize(dtype_code)
        return np.where(self.cap > 0, np.minimum(size, self.cap), size)

    def peak(self, batches: Iterable[int] | int, *, dtype_code: int | None = None,
             rounding: bool = True, workspaces: bool = True):
        """(allocated, reserved, step): peak tensor bytes per batch size, the
        segments holding them (``rounding``: caching allocator; else both are
        exact tensor bytes) and the op index at which the peak occurs."""
        b = np.atleast_1d(np.asarray(batches, dtype=np.int64))
        keep = slice(None) if workspaces else self.category != WORKSPACE
        out_a = np.zeros(len(b), np.int64)
        out_r = np.zeros(len(b), np.int64)
        out_s = np.zeros(len(b), np.int64)
        itemsize = self._itemsize(dtype_code)
        coef, power, alloc, free = self.coef[keep], self.power[keep], self.alloc[keep], self.free[keep]
        itemsize, cap = itemsize[keep], self.cap[keep]
        peak_memory(coef, power, itemsize, cap, alloc, free, self.n_steps, b, int(rounding),
                    out_a, out_r, out_s)
        return out_a, out_r, out_s

    def breakdown(self, batch: int, dtype_code: int | None = None) -> dict[str, float | str]:
        """Bytes by category alive at the peak of `batch` (allocator-rounded),
        and the phase (forward, backward, optimizer) the peak falls in."""
        _, _, step = self.peak([batch], dtype_code=dtype_code)
        t = int(step[0])
        size = self.bytes_at(batch, dtype_code)
        size = np.where(size > 0, (size + 511) // 512 * 512, 0)
        live = (self.alloc <= t) & (self.free >= t)
        out = {name: float(size[live & (self.category == c)].sum())
               for c, name in enumerate(CATEGORY_NAMES)}
        out["peak_phase"] = self.phase_at(t)
        return out

    def phase_at(self, step: int) -> str:
        phase = 0
        for i, mark in enumerate(self.phase_marks):
            if step >= mark:
                phase = i + 1
        return L.PHASE_NAMES[min(phase, len(L.PHASE_NAMES) - 1)]

    def category_bytes(self, category: int, batch: int = 1, dtype_code: int | None = None) -> int:
        """Total bytes of one category's storages at `batch` (not a peak: a sum)."""
        return int(self.bytes_at(batch, dtype_code)[self.category == category].sum())



@dataclass
class StorageColumns:
    """A :class:`MemoryProfile`'s columns as a memory pass fills them, one
    storage at a time (the fx and the ONNX frontends' passes)."""

    coef: list = field(default_factory=list)
    power: list = field(default_factory=list)
    dtype: list = field(default_factory=list)
    alloc: list = field(default_factory=list)
    free: list = field(default_factory=list)
    category: list = field(default_factory=list)
    cap: list = field(default_factory=list)

    def add(self, coef: float, power: int, dtype: int, alloc: int, free: int, category: int,
            cap: int = 0) -> int:
        """Record a storage; returns its index."""
        self.coef.append(coef), self.power.append(power), self.dtype.append(dtype)
        self.alloc.append(alloc), self.free.append(free), self.category.append(category)
        self.cap.append(cap)
        return len(self.coef) - 1

    def use(self, entry: int | None, step: int) -> None:
        """`entry` is read (or written) at `step`: it lives at least until then."""
        if entry is not None and self.free[entry] < step:
            self.free[entry] = step

    def profile(self, n_steps: int, phase_marks: tuple[int, ...], training: bool, *,
                category: np.ndarray | None = None,
                free: np.ndarray | None = None) -> MemoryProfile:
        """The profile, with `category` / `free` arrays in place of the
        recorded ones where a pass revised them."""
        return MemoryProfile(
            coef=np.asarray(self.coef, np.float64), power=np.asarray(self.power, np.int64),
            dtype=np.asarray(self.dtype, np.int64), alloc=np.asarray(self.alloc, np.int64),
            free=np.asarray(self.free, np.int64) if free is None else free,
            category=np.asarray(self.category, np.int64) if category is None else category,
            cap=np.asarray(self.cap, np.int64), n_steps=n_steps,
            phase_marks=tuple(phase_marks), training=training)


@dataclass
class LayoutProfile:
    """What tensor parallelism, pipeline stages and recomputation do to a
    traced step (``predictor.frontend.layout_pass``): every OpTable row split by
    block group (0: before the blocks, 1..n_blocks, n_blocks+1: after; -1: the
    optimizer) with the TP-sharded part of its dims, the all-reduce points,
    the parameters' groups and sharding, and the group and flags of every
    memory-profile storage. ``predictor.layouts`` evaluates it."""

    n_blocks: int
    block_names: list[str]
    split_row: np.ndarray      # int64[m] OpTable row
    split_group: np.ndarray    # int64[m]
    split_count: np.ndarray    # int64[m] executions of the row in this split
    split_flags: np.ndarray    # int64[m] 1: TP-sharded, 2: attention core (score-shaped)
    split_sbase: np.ndarray    # int64[m, MAX_DIMS] sharded part of the dims (base)
    split_sslope: np.ndarray   # int64[m, MAX_DIMS] sharded part of the dims (slope)
    comm_phase: np.ndarray     # int64[c] all-reduce points (TP): phase
    comm_group: np.ndarray     # int64[c] block group
    comm_base: np.ndarray      # int64[c] elements at batch b: base + slope * b
    comm_slope: np.ndarray     # int64[c]
    comm_dtype: np.ndarray     # int64[c]
    param_numel: np.ndarray    # int64[p]
    param_group: np.ndarray    # int64[p]
    param_sharded: np.ndarray  # int64[p] 1: divided over the TP group
    param_trainable: np.ndarray  # int64[p]
    param_tied: np.ndarray | None = None  # int64[p] 1: before the blocks and used by the head too
    boundary_base: int = 0     # elements passed from one block to the next (base)
    boundary_slope: int = 0
    act_group: np.ndarray | None = None   # int64[storages] group of the op that allocated it
    act_flags: np.ndarray | None = None   # int64[storages] SHARDED / ATTENTION_CORE bits
    column_parallel: list[str] = field(default_factory=list)
    row_parallel: list[str] = field(default_factory=list)
    vocab_parallel: list[str] = field(default_factory=list)
    unsharded_linears: list[str] = field(default_factory=list)
    kept_whole: dict[str, int] = field(default_factory=dict)


@dataclass
class Graph:
    """A traced training (or inference) step, ready to be evaluated anywhere."""

    name: str
    ops: OpTable
    batch_size: int
    mode: str = "train"
    optimizer: str | None = "adam"
    seq_len: int | None = None
    parameters: int = 0
    trainable_parameters: int = 0
    parameter_bytes: int = 0
    unsupported: dict[str, int] = field(default_factory=dict)
    batch_scalable: bool = True
    trace_seconds: float = 0.0
    torch_version: str = ""
    # aten ops the host dispatches per phase, kernel-free views included (the
    # CPU launch-overhead term, predictor.overhead); empty: not recorded.
    host_ops: list[int] = field(default_factory=list)
    # Storages of the step with their liveness (predictor.frontend.memory_pass);
    # None when the frontend did not run the memory pass.
    memory: MemoryProfile | None = field(default=None, repr=False)
    # Blocks, TP sharding and recomputation of the step (predictor.frontend.layout_pass);
    # None: not analysed (inference, ONNX, graphs saved before it existed).
    layout: LayoutProfile | None = field(default=None, repr=False)
    # Mixed precision the step was traced under ("bf16", "fp16", "fp8"; None: none),
    # predictor.frontend.autocast.
    amp: str | None = None

    def check_batch(self, batch_size: int | None, extent: bool = True) -> int:
        """`batch_size` (None: the traced one) as an int, checked: in the
        supported range (predictor.limits), one the graph scales to, and (with
        `extent`) within what the kernels count exactly (``check_extent``)."""
        b = check_batch_size(self.batch_size if batch_size is None else batch_size)
        if not self.batch_scalable and b != self.batch_size:
            raise InvalidArgumentError(
                f"{self.name} was traced at batch {self.batch_size} and its shapes do not scale "
                f"with the batch; trace it again at batch {b}")
        if extent:
            self.check_extent(b)
        return b

    def check_extent(self, batch_size: int) -> None:
        """Refuse, in one line, a batch at which an op or the step's memory
        would count more than predictor.limits.MAX_COUNT elements or bytes
        (only a huge batch with a huge sequence length gets there): beyond it
        the kernels' int64 counts would wrap around or saturate."""
        b = float(batch_size)
        top = float(largest_count(self.ops.family, self.ops.dbase, self.ops.dslope, b)) \
            if len(self.ops) else 0.0
        what = "an op's elements"
        if self.memory is not None and len(self.memory):
            # At most 8 bytes an element whatever the dtype.
            mem = float(np.sum(self.memory.coef * b ** self.memory.power)) * 8.0
            if mem > top:
                top, what = mem, "the step's memory (bytes)"
        if not top <= limits.MAX_COUNT:
            raise InvalidArgumentError(
                f"{self.name} at batch {batch_size}: {what} would reach {top:.3g}, beyond the "
                f"2**{limits.MAX_COUNT.bit_length() - 1} the predictor counts exactly; use a smaller "
                "batch size or sequence length")

    def flops(self, batch_size: int | None = None) -> dict[str, float]:
        """FLOPs per iteration by phase."""
        b = self.check_batch(batch_size)
        flops, _ = self.ops.work(b)
        total = flops * self.ops.count
        return {name: float(total[self.ops.phase == i].sum())
                for i, name in enumerate(L.PHASE_NAMES)}

    def family_counts(self) -> dict[str, int]:
        """Op executions per iteration by family."""
        out: dict[str, int] = {}
        for fam, cnt in zip(self.ops.family, self.ops.count):
            name = L.FAMILY_NAMES[fam]
            out[name] = out.get(name, 0) + int(cnt)
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))

    def summary(self, batch_size: int | None = None) -> dict:
        b = self.check_batch(batch_size)
        return {
            "model": self.name,
            "mode": self.mode,
            "optimizer": self.optimizer,
            "batch_size": b,
            "seq_len": self.seq_len,
            "amp": self.amp,
            "parameters": self.parameters,
            "trainable_parameters": self.trainable_parameters,
            "flops": self.flops(b),
            "ops": int(self.ops.count.sum()),
            "distinct_ops": len(self.ops),
            "families": self.family_counts(),
            "unsupported": dict(self.unsupported),
        }

    def save(self, path: str | Path) -> Path:
        """Write the graph to `path` (.npz: the OpTable's arrays plus a JSON
        header), atomically. Loading it back needs numpy only, not torch."""
        return save_graph(self, path)

    @staticmethod
    def load(path: str | Path) -> "Graph":
        """A graph written by :meth:`save`."""
        return load_graph(path)

    def __repr__(self) -> str:
        from predictor.text import flops_text

        return (f"Graph({self.name!r}, mode={self.mode}, batch={self.batch_size}, "
                f"params={self.parameters / 1e6:.1f}M, {flops_text(sum(self.flops().values()))}, "
                f"{int(self.ops.count.sum())} ops in {len(self.ops)} rows, "
                f"unsupported={sum(self.unsupported.values())})")


# ---- on disk: one .npz, every array of the graph plus a JSON header ------------
# The header is the graph's dataclass tree in JSON: arrays are references to
# members of the .npz, nested dataclasses (the OpTable, a memory profile) name
# their class, so fields added to any of them later are saved without changes
# here. Loading never unpickles anything and only builds predictor classes.

GRAPH_FORMAT = 1
# Unpacked size beyond which a file is not a saved graph (the largest zoo graph is ~1 MB).
MAX_GRAPH_FILE_BYTES = 1 << 31


def save_graph(graph: Graph, path: str | Path, meta: Mapping[str, Any] | None = None) -> Path:
    """Write `graph` (and `meta`, JSON-able facts about the file such as a
    cache key, read back by ``load_graph_meta``) atomically."""
    arrays: dict[str, np.ndarray] = {}
    head: dict[str, Any] = {"format": GRAPH_FORMAT}
    if meta:
        head["meta"] = dict(meta)
    try:
        text = json.dumps({**head, "graph": _encode(graph, "g", arrays)}, sort_keys=True)
    except TypeError as exc:
        raise InvalidArgumentError(f"cannot save {graph.name}: {exc}") from exc
    arrays["header"] = np.frombuffer(text.encode(), dtype=np.uint8)
    with atomic_writer(path) as fh:
        np.savez(fh, **arrays)
    return Path(path)


def load_graph(path: str | Path) -> Graph:
    return load_graph_meta(path)[0]


def load_graph_meta(path: str | Path) -> tuple[Graph, dict]:
    """(graph, meta) of a saved graph: `meta` as ``save_graph`` wrote it ({} if none)."""
    path = Path(path)
    # A regular file of bounded size (not a FIFO, /dev/zero or a link to one).
    data = io.BytesIO(read_regular(path, MAX_GRAPH_FILE_BYTES, "saved graph",
                                   missing="no saved graph there (no such file)"))
    path = printable(path, 300)
    try:
        with zipfile.ZipFile(data) as zf:  # a zip bomb would exhaust memory below
            unpacked = sum(i.file_size for i in zf.infolist())
    except (OSError, zipfile.BadZipFile, EOFError, ValueError, NotImplementedError):
        # Not a zip: numpy would try it as a pickle and say so, which reads as
        # advice to unpickle it.
        raise FileFormatError(f"{path} is not a saved graph (truncated or corrupt: not an "
                              ".npz archive)") from None
    if unpacked > MAX_GRAPH_FILE_BYTES:
        raise FileFormatError(f"{path}: {unpacked / 2**30:.0f} GiB unpacked, too large for a "
                              "saved graph")
    try:
        data.seek(0)
        with np.load(data, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (OSError, ValueError, EOFError, MemoryError, NotImplementedError,
            zipfile.BadZipFile) as exc:
        raise FileFormatError(f"{path} is not a saved graph ({exc})") from None
    try:
        header = json.loads(arrays.pop("header").tobytes().decode())
        if header.get("format") != GRAPH_FORMAT:
            raise ValueError(f"format {header.get('format')!r}, this version reads "
                             f"{GRAPH_FORMAT}")
        graph = _decode(header["graph"], arrays)
        if not isinstance(graph, Graph):
            raise ValueError("no graph in the file")
        meta = header.get("meta", {})
        if not isinstance(meta, dict):
            raise ValueError("meta is not a table")
    except (KeyError, TypeError, ValueError, AttributeError, ImportError,
            UnicodeDecodeError, RecursionError) as exc:
        raise FileFormatError(f"{path} is not a saved graph ({exc})") from None
    # codes and sizes the kernels can take
    return check_graph(graph, f"{path} (saved graph)"), meta


def _encode(value, key: str, arrays: dict):
    if isinstance(value, np.ndarray):
        arrays[key] = np.ascontiguousarray(value)
        return {"__array__": key}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        cls = type(value)
        return {"__dataclass__": f"{cls.__module__}:{cls.__qualname__}",
                "fields": {f.name: _encode(getattr(value, f.name), f"{key}.{f.name}", arrays)
                           for f in dataclasses.fields(value)}}
    if isinstance(value, tuple):
        return {"__tuple__": [_encode(v, f"{key}.{i}", arrays) for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [_encode(v, f"{key}.{i}", arrays) for i, v in enumerate(value)]
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise TypeError(f"{key}: dict keys must be strings")
        return {"__dict__": {k: _encode(v, f"{key}.{k}", arrays) for k, v in value.items()}}
    if isinstance(value, np.generic):
        return value.item()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"{key}: {type(value).__name__} cannot be saved")


def _decode(value, arrays: dict):
    if isinstance(value, list):
        return [_decode(v, arrays) for v in value]
    if not isinstance(value, dict):
        return value
    if "__array__" in value:
        return arrays[value["__array__"]]
    if "__tuple__" in value:
        return tuple(_decode(v, arrays) for v in value["__tuple__"])
    if "__dict__" in value:
        return {k: _decode(v, arrays) for k, v in value["__dict__"].items()}
    module, _, name = value["__dataclass__"].partition(":")
    if module != "predictor" and not module.startswith("predictor."):
        raise ValueError(f"refusing to build {module}:{name}")
    cls = getattr(importlib.import_module(module), name)
    if not dataclasses.is_dataclass(cls):
        raise ValueError(f"{module}:{name} is not a dataclass")
    known = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: _decode(v, arrays) for k, v in value["fields"].items() if k in known})


# ---- checks: a Graph read from disk (or built by hand) the engine can evaluate --
# Every array of the right shape and integer type, every code in range, every
# size non-negative and below what 64-bit arithmetic in the kernels can hold.
# The numba kernels index tables with these codes and multiply these dims
# without bounds checks, so a corrupt or hostile file must stop here, with a
# one-line FileFormatError naming it, never reach them (where it would give a
# wrong number, an exception from deep inside, or a crashed process).

# A dim at batch 1, and its growth per sample, are at most this (2^40 elements
# in one dim is 4 TiB of fp32: no model has that).
MAX_DIM = 1 << 40
MAX_BATCH = 1 << 31
MAX_COUNT = 1 << 40
MAX_KERNELS = 1 << 20
# Steps (traced nodes) of a memory profile: gpt2 has 2,610; 4M is far beyond any model.
MAX_STEPS = 1 << 22


def _int_array(a: Any, name: str, ndim: int, bad) -> np.ndarray:
    if not isinstance(a, np.ndarray) or a.ndim != ndim or a.dtype.kind not in "iu":
        raise bad(f"{name} must be a {ndim}-D integer array")
    if a.dtype.kind == "u" and a.size and int(a.max()) > np.iinfo(np.int64).max:
        raise bad(f"{name} holds values beyond 64-bit integers")
    return np.ascontiguousarray(a, dtype=np.int64)


def _in_range(a: np.ndarray, lo: int, hi: int, name: str, bad) -> None:
    if a.size and (int(a.min()) < lo or int(a.max()) >= hi):
        raise bad(f"{name} has values outside {lo}..{hi - 1}")


def _one_line(text: str, name: str, bad) -> None:
    """Names are printed in tables and messages: one line, of a bounded length."""
    if len(text) > MAX_NAME_CHARS:
        raise bad(f"{name} has a name of {len(text):,} characters (at most {MAX_NAME_CHARS})")
    if printable(text, MAX_NAME_CHARS) != text:
        raise bad(f"{name} has control characters: {printable(text, 60)}")


def _whole(value: Any, name: str, lo: int, hi: int, bad, optional: bool = False) -> None:
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or \
            not lo <= int(value) <= hi:
        raise bad(f"{name} must be a whole number in {lo}..{hi}, got {value!r}")


def check_optable(ops: Any, where: str = "graph") -> None:
    """Validate an OpTable in place (its arrays become contiguous int64)."""
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
    for name in names:
        _one_line(name, "ops.op_names", bad)
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
    for codes, what in (((L.MATMUL,), "matmul"),
                        ((L.CONV, L.CONV_DGRAD, L.CONV_WGRAD), "convolution"),
                        ((L.ATTENTION, L.ATTENTION_BWD), "attention"),
                        ((L.LSTM, L.LSTM_BWD), "LSTM")):
        width = GEMM_DIMS[codes[0]]
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
    def bad(msg: str) -> FileFormatError:
        return FileFormatError(f"{where}: {msg}")

    if not isinstance(graph, Graph):
        raise bad("no graph inside")
    if not isinstance(graph.name, str):
        raise bad(f"the model name must be text, got {type(graph.name).__name__}")
    _one_line(graph.name, "name", bad)
    if graph.mode not in ("train", "inference"):
        raise bad(f"mode must be 'train' or 'inference', got {graph.mode!r}")
    if graph.optimizer is not None and (not isinstance(graph.optimizer, str)
                                        or optimizers.parse(graph.optimizer)[0]
                                        not in optimizers.BASES):
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
    for key in unsupported:
        _one_line(key, "unsupported", bad)
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
    # The memory kernel holds 3 int64 per step: a bound on the steps is one on its memory.
    _whole(mem.n_steps, "memory.n_steps", 0, MAX_STEPS, bad)
    marks = mem.phase_marks
    if not isinstance(marks, (tuple, list)) or len(marks) >= len(L.PHASE_NAMES):
        raise bad(f"memory.phase_marks must be at most {len(L.PHASE_NAMES) - 1} step indices")
    for i, mark in enumerate(marks):
        _whole(mark, f"memory.phase_marks[{i}]", int(marks[i - 1]) if i else 0,
               int(mem.n_steps), bad)
    mem.phase_marks = tuple(int(m) for m in marks)
    if not isinstance(mem.training, (bool, np.bool_)):
        raise bad("memory.training must be true or false")
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
