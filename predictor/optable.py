"""The OpTable (columnar op list) and the Graph that carries it.

One row per distinct GPU kernel family invocation; identical rows are merged
with a count. Dims are stored as an affine function of the batch size,
``dims(b) = dbase + dslope * b``, so a graph traced once is evaluated at any
batch size with integer arithmetic and no retracing.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from predictor.errors import FileFormatError, InvalidArgumentError
from predictor.io import atomic_writer
from predictor.kernels import layout as L
from predictor.kernels.work import work_table

if TYPE_CHECKING:
    from predictor.memory import MemoryProfile


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
        floating = np.isin(self.dtype, (L.F32, L.F16, L.BF16, L.F64))
        new = np.where(floating, dtype_code, self.dtype).astype(np.int64)
        return OpTable(self.family, self.phase, new, self.count, self.kernels, self.dbase,
                       self.dslope, self.op, self.op_names)

    @staticmethod
    def empty() -> "OpTable":
        z = np.zeros(0, dtype=np.int64)
        d = np.zeros((0, L.MAX_DIMS), dtype=np.int64)
        return OpTable(z, z, z, z, z, d, d, z, [])


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
    # Storages of the step with their liveness (predictor.memory); None when
    # the frontend did not run the memory pass.
    memory: "MemoryProfile | None" = field(default=None, repr=False)

    def check_batch(self, batch_size: int | None) -> int:
        b = self.batch_size if batch_size is None else batch_size
        if isinstance(b, bool) or not isinstance(b, (int, np.integer)) or b <= 0:
            raise InvalidArgumentError(f"batch size must be a positive integer, got {b!r}")
        if not self.batch_scalable and b != self.batch_size:
            raise InvalidArgumentError(
                f"{self.name} was traced at batch {self.batch_size} and its shapes do not scale "
                f"with the batch; trace it again at batch {b}")
        return int(b)

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
        f = self.flops()
        tf = sum(f.values()) / 1e12
        return (f"Graph({self.name!r}, mode={self.mode}, batch={self.batch_size}, "
                f"params={self.parameters / 1e6:.1f}M, {tf:.2f} TFLOP/iter, "
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


def save_graph(graph: Graph, path: str | Path) -> Path:
    arrays: dict[str, np.ndarray] = {}
    try:
        text = json.dumps({"format": GRAPH_FORMAT, "graph": _encode(graph, "g", arrays)},
                          sort_keys=True)
    except TypeError as exc:
        raise InvalidArgumentError(f"cannot save {graph.name}: {exc}") from exc
    arrays["header"] = np.frombuffer(text.encode(), dtype=np.uint8)
    with atomic_writer(path) as fh:
        np.savez(fh, **arrays)
    return Path(path)


def load_graph(path: str | Path) -> Graph:
    path = Path(path)
    try:
        with zipfile.ZipFile(path) as zf:  # a zip bomb would exhaust memory below
            unpacked = sum(i.file_size for i in zf.infolist())
    except (OSError, zipfile.BadZipFile, EOFError, ValueError, NotImplementedError):
        unpacked = 0  # np.load below says what is wrong with it
    if unpacked > MAX_GRAPH_FILE_BYTES:
        raise FileFormatError(f"{path}: {unpacked / 2**30:.0f} GiB unpacked, too large for a "
                              "saved graph")
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except FileNotFoundError:
        raise FileFormatError(f"no saved graph at {path}") from None
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
    except (KeyError, TypeError, ValueError, AttributeError, ImportError,
            UnicodeDecodeError, RecursionError) as exc:
        raise FileFormatError(f"{path} is not a saved graph ({exc})") from None
    from predictor.validate import check_graph

    return check_graph(graph, f"{path} (saved graph)")  # codes and sizes the kernels can take


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
