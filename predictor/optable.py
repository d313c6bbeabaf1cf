"""The OpTable (columnar op list) and the Graph that carries it.

One row per distinct GPU kernel family invocation; identical rows are merged
with a count. Dims are stored as an affine function of the batch size,
``dims(b) = dbase + dslope * b``, so a graph traced once is evaluated at any
batch size with integer arithmetic and no retracing.
"""

from __future__ import annotations

import dataclasses
import json
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from predictor.atomic import atomic_write
from predictor.errors import InvalidArgumentError
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


# ---- on disk: one .npz, the OpTable's arrays plus a JSON header ----------------

GRAPH_FORMAT = 1


def save_graph(graph: Graph, path: str | Path) -> Path:
    path = Path(path)
    ops = graph.ops
    arrays = {f"ops.{f.name}": np.ascontiguousarray(getattr(ops, f.name))
              for f in dataclasses.fields(ops) if isinstance(getattr(ops, f.name), np.ndarray)}
    header = {"format": GRAPH_FORMAT, "op_names": list(ops.op_names), "graph": {}}
    for f in dataclasses.fields(graph):
        value = getattr(graph, f.name)
        if f.name == "ops":
            continue
        if isinstance(value, np.ndarray):
            arrays[f"graph.{f.name}"] = value
        else:
            header["graph"][f.name] = value
    try:
        text = json.dumps(header, sort_keys=True, default=_json_scalar)
    except TypeError as exc:
        raise InvalidArgumentError(f"cannot save {graph.name}: {exc}") from exc
    arrays["header"] = np.frombuffer(text.encode(), dtype=np.uint8)
    with atomic_write(path) as fh:
        np.savez(fh, **arrays)
    return path


def _json_scalar(value):
    if isinstance(value, np.generic):  # numpy ints and floats in graph metadata
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def load_graph(path: str | Path) -> Graph:
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as z:
            data = {k: z[k] for k in z.files}
    except FileNotFoundError:
        raise InvalidArgumentError(f"no saved graph at {path}") from None
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise InvalidArgumentError(f"{path} is not a saved graph ({exc})") from None
    try:
        header = json.loads(data.pop("header").tobytes().decode())
        if header.get("format") != GRAPH_FORMAT:
            raise ValueError(f"format {header.get('format')!r}, expected {GRAPH_FORMAT}")
        op_fields = {f.name for f in dataclasses.fields(OpTable)}
        ops = OpTable(op_names=list(header["op_names"]),
                      **{k[4:]: v for k, v in data.items()
                         if k.startswith("ops.") and k[4:] in op_fields})
        graph_fields = {f.name for f in dataclasses.fields(Graph)}
        kwargs = {k: v for k, v in header["graph"].items() if k in graph_fields}
        kwargs.update({k[6:]: v for k, v in data.items()
                       if k.startswith("graph.") and k[6:] in graph_fields})
        return Graph(ops=ops, **kwargs)
    except (KeyError, TypeError, ValueError, UnicodeDecodeError) as exc:
        raise InvalidArgumentError(f"{path} is not a saved graph ({exc})") from None
