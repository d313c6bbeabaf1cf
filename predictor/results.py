"""Results: a single prediction and a sweep over configurations, both easy to
turn into pandas, JSON or a table."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from predictor.errors import InvalidArgumentError
from predictor.kernels import layout as L
from predictor.tiles import row_tiles


def describe(family: int, d) -> str:
    """A short human-readable shape for one OpTable row's dims."""
    d = [int(x) for x in d]
    if family == L.MATMUL:
        b, m, n, k = d[:4]
        return (f"{b}x" if b > 1 else "") + f"[{m}x{k}]@[{k}x{n}]"
    if family in (L.CONV, L.CONV_DGRAD, L.CONV_WGRAD):
        n, c, h, w, k, r, s, p, q, g, st = d[:11]
        grp = f" g{g}" if g > 1 else ""
        dil = d[L.CONV_DILATION] if len(d) > L.CONV_DILATION else 0
        return f"{n}x{c}x{h}x{w} -> {k}x{p}x{q} k{r}x{s} s{st}" + (f" d{dil}" if dil > 1 else "") \
            + grp
    if family in (L.ATTENTION, L.ATTENTION_BWD):
        b, h, sq, sk, dd, dv, causal = d[:7]
        return f"{b}x{h}h q{sq} k{sk} d{dd}" + (" causal" if causal else "")
    if family in (L.LSTM, L.LSTM_BWD):
        t, b, i, h = d[:4]
        kind = {3: " GRU", 1: " RNN"}.get(int(d[4]) if len(d) > 4 else 0, "")
        return f"T{t} B{b} in{i} h{h}{kind}"
    read, written = d[L.MEM_READ], d[L.MEM_WRITTEN]
    if family == L.COPY and len(d) > L.MEM_LAYOUT and d[L.MEM_LAYOUT] > 0:
        # cuDNN's layout transpose around an NCHW tensor-core convolution.
        return f"conv NCHW<->NHWC transpose {_si(read)} elems"
    text = f"read {_si(read)} write {_si(written)} elems"
    if family in (L.POOL, L.POOL_BWD) and len(d) > L.MEM_WINDOW_ELEMS \
            and d[L.MEM_GENERIC] == L.MAX_POOL_NCHW:
        # ATen's NCHW max-pool kernels (kernels.roofline.generic_kernel_us).
        text += f" (NCHW max pool, {_si(d[L.MEM_WINDOW_ELEMS])} window elems)"
    elif family in (L.COPY, L.ELEMENTWISE) and len(d) > L.MEM_GENERIC and d[L.MEM_GENERIC] > 0:
        # PyTorch's non-vectorised kernels (kernels.roofline.generic_kernel_us).
        kind = "strided" if d[L.MEM_GENERIC] == L.COPY_STRIDED else "cast"
        text += f" ({kind})"
    return text


def _si(x: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if x >= scale:
            return f"{x / scale:.3g}{unit}"
    return str(int(x))


@dataclass
class Prediction:
    model: str
    gpu: str
    batch_size: int
    forward_ms: float
    backward_ms: float
    optimizer_ms: float
    graph: Any = field(repr=False, default=None)
    op_table: Any = field(repr=False, default=None)
    op_us: np.ndarray | None = field(repr=False, default=None)
    unsupported: dict[str, int] = field(default_factory=dict)
    # Per-row basis codes (layout.BASIS_*): what each op time rests on; None:
    # the per-op model alone (analytical).
    op_basis: np.ndarray | None = field(repr=False, default=None)
    # Host (CPU) dispatch and launch time not hidden behind GPU work, already
    # included in the phase times (predictor.overhead).
    overhead_ms: float = 0.0
    # Predicted peak device memory in GiB (predictor.memory); None: not modelled.
    memory_gb: float | None = None
    memory_capacity_gb: float | None = None
    max_memory_fraction: float = 0.9
    # Where the prediction stands against the op models' data, and the 90th
    # percentile of |error| (%) measured for predictions of that standing
    # (predictor.expected_error; None: none measured).
    standing: str = ""
    error_p90_pct: float | None = None

    @property
    def fits(self) -> bool | None:
        """Whether the peak fits in max_memory_fraction of the GPU's memory."""
        if self.memory_gb is None or self.memory_capacity_gb is None:
            return None
        return self.memory_gb <= self.max_memory_fraction * self.memory_capacity_gb

    @property
    def iteration_ms(self) -> float:
        return self.forward_ms + self.backward_ms + self.optimizer_ms

    @property
    def overhead_share(self) -> float:
        """Fraction of the iteration that is exposed host overhead."""
        return self.overhead_ms / self.iteration_ms if self.iteration_ms > 0 else 0.0

    @property
    def throughput(self) -> float:
        """Samples per second."""
        return self.batch_size / (self.iteration_ms / 1e3)

    @property
    def seq_len(self) -> int | None:
        """The traced sequence length (``Graph.seq_len``); None: no sequence dim."""
        return getattr(self.graph, "seq_len", None) or None

    @property
    def tokens_per_s(self) -> float | None:
        """Tokens per second, ``throughput × seq_len``; None without a sequence dim."""
        return None if self.seq_len is None else self.throughput * self.seq_len

    @property
    def ops(self):
        """Per-op breakdown as a DataFrame, slowest first: one row per distinct
        op with its family, aten op, dims at this batch size, count, time."""
        import pandas as pd

        t = self.op_table
        dims = t.dims(self.batch_size)
        total_ms = self.op_us * t.count * 1e-3
        if self.op_basis is None:
            basis = L.BASIS_NAMES[L.BASIS_ANALYTICAL]
        else:
            basis = [L.BASIS_NAMES[int(c)] for c in self.op_basis]
        df = pd.DataFrame({
            "family": [L.FAMILY_NAMES[f] for f in t.family],
            "op": [t.op_names[i] for i in t.op],
            "phase": [L.PHASE_NAMES[p] for p in t.phase],
            "dtype": [L.DTYPE_NAMES[d] for d in t.dtype],
            "shape": [describe(f, row) for f, row in zip(t.family, dims)],
            "dims": [tuple(int(x) for x in np.trim_zeros(row, "b")) for row in dims],
            "count": t.count,
            "kernels": t.kernels * t.count,
            "ms_each": self.op_us * 1e-3,
            "ms": total_ms,
            "share": total_ms / max(total_ms.sum(), 1e-30),
            "basis": basis,
            # The sgemm output tile fp32 matmuls are predicted to run with
            # (predictor.tiles; "" for other rows).
            "tile": row_tiles(t.family, dims, t.dtype, self.gpu),
        })
        return df.sort_values("ms", ascending=False, ignore_index=True)

    def by_family(self):
        df = self.ops
        return (df.groupby("family")[["ms", "count", "kernels"]].sum()
                .sort_values("ms", ascending=False))

    def to_dict(self) -> dict:
        return {
            "gpu": self.gpu,
            "batch_size": self.batch_size,
            "iteration_ms": self.iteration_ms,
            "forward_ms": self.forward_ms,
            "backward_ms": self.backward_ms,
            "optimizer_ms": self.optimizer_ms,
            "overhead_ms": self.overhead_ms,
            "throughput": self.throughput,
            **({"tokens_per_s": self.tokens_per_s} if self.seq_len else {}),
            "memory_gb": self.memory_gb,
            "fits": self.fits,
            "standing": self.standing,
            "error_p90_pct": self.error_p90_pct,
        }

    def __repr__(self) -> str:
        return (f"Prediction({self.model} on {self.gpu}, batch {self.batch_size}: "
                f"{self.iteration_ms:.2f} ms/iter = fwd {self.forward_ms:.2f} + bwd "
                f"{self.backward_ms:.2f} + opt {self.optimizer_ms:.2f} "
                f"(host overhead {self.overhead_ms:.2f}); {self.throughput:.1f} samples/s)")


@dataclass
class SweepResult:
    """Times for every (GPU, batch size); arrays are indexed [gpu, batch]."""

    model: str
    gpus: list[str]
    batch_sizes: np.ndarray
    phase_ms: np.ndarray  # [gpu, batch, phase]
    mode: str = "train"
    prices: list[float | None] = field(default_factory=list)
    # Exposed host overhead [gpu, batch, phase], included in phase_ms; None: not modelled.
    overhead_phase_ms: np.ndarray | None = None
    # Peak device memory [gpu, batch] in bytes (predictor.memory); None: not modelled.
    memory_bytes: np.ndarray | None = None
    memory_capacity_gb: list[float] = field(default_factory=list)
    max_memory_fraction: float = 0.9
    # The traced sequence length (Graph.seq_len); None: the input has no sequence dim.
    seq_len: int | None = None
    # Per GPU: where its predictions stand against the op models' data and the
    # 90th percentile of |error| (%) measured for that standing
    # (predictor.expected_error; None: none measured).
    standing: list[str] = field(default_factory=list)
    error_p90_pct: list[float | None] = field(default_factory=list)

    @property
    def memory_gb(self) -> np.ndarray:
        """Predicted peak device memory [gpu, batch] in GiB (NaN: not modelled)."""
        if self.memory_bytes is None:
            return np.full(self.phase_ms.shape[:2], np.nan)
        return self.memory_bytes / float(1 << 30)

    @property
    def fits(self) -> np.ndarray:
        """[gpu, batch]: peak memory within max_memory_fraction of each GPU's
        memory (True where memory is not modelled)."""
        if self.memory_bytes is None or not self.memory_capacity_gb:
            return np.ones(self.phase_ms.shape[:2], dtype=bool)
        cap = np.asarray(self.memory_capacity_gb, dtype=np.float64)[:, None]
        return self.memory_gb <= self.max_memory_fraction * cap

    @property
    def overhead_ms(self) -> np.ndarray:
        """Exposed host (CPU launch) overhead per iteration [gpu, batch]."""
        if self.overhead_phase_ms is None:
            return np.zeros(self.phase_ms.shape[:2])
        return self.overhead_phase_ms.sum(axis=2)

    @property
    def forward_ms(self) -> np.ndarray:
        return self.phase_ms[:, :, L.FORWARD]

    @property
    def backward_ms(self) -> np.ndarray:
        return self.phase_ms[:, :, L.BACKWARD]

    @property
    def optimizer_ms(self) -> np.ndarray:
        return self.phase_ms[:, :, L.OPTIMIZER_PHASE]

    @property
    def iteration_ms(self) -> np.ndarray:
        return self.phase_ms.sum(axis=2)

    @property
    def throughput(self) -> np.ndarray:
        """Samples per second [gpu, batch]."""
        return self.batch_sizes[None, :] / (self.iteration_ms / 1e3)

    @property
    def tokens_per_s(self) -> np.ndarray | None:
        """Tokens per second [gpu, batch], ``throughput × seq_len``; None
        without a sequence dim."""
        return None if not self.seq_len else self.throughput * self.seq_len

    def to_pandas(self):
        """Long format: one row per (GPU, batch size)."""
        import pandas as pd

        g, b = np.meshgrid(np.arange(len(self.gpus)), np.arange(len(self.batch_sizes)),
                           indexing="ij")
        g, b = g.ravel(), b.ravel()
        tokens = {} if not self.seq_len else {"tokens_per_s": self.tokens_per_s.ravel()}
        return pd.DataFrame({
            "gpu": np.asarray(self.gpus, dtype=object)[g],
            "batch_size": self.batch_sizes[b],
            "iteration_ms": self.iteration_ms.ravel(),
            "forward_ms": self.forward_ms.ravel(),
            "backward_ms": self.backward_ms.ravel(),
            "optimizer_ms": self.optimizer_ms.ravel(),
            "overhead_ms": self.overhead_ms.ravel(),
            "throughput": self.throughput.ravel(),
            **tokens,
            "memory_gb": self.memory_gb.ravel(),
            "fits": self.fits.ravel(),
            **self._per_gpu_columns(g),
        })

    @property
    def error_p90(self) -> np.ndarray:
        """`error_p90_pct` per GPU as an array (NaN where none was measured, or
        for a result built without it)."""
        if len(self.error_p90_pct) != len(self.gpus):
            return np.full(len(self.gpus), np.nan)
        return np.array([np.nan if v is None else v for v in self.error_p90_pct],
                        dtype=np.float64)

    def _per_gpu_columns(self, g: np.ndarray) -> dict:
        """The standing and expected-error columns of rows of GPU index `g`
        (none for a result built without them)."""
        if len(self.standing) != len(self.gpus):
            return {}
        return {"standing": np.asarray(self.standing, dtype=object)[g],
                "error_p90_pct": self.error_p90[g]}

    def best(self, objective: str = "throughput", *, fitting: bool = True):
        """Best batch size per GPU by `objective` ('throughput': most samples/s,
        or 'time': least ms per iteration), among the configurations that fit
        in memory (``fitting=False``: among all); rows ranked by the same
        objective, best first. A GPU on which nothing fits has no row."""
        if objective not in ("throughput", "time"):
            raise InvalidArgumentError(
                f"unknown objective {objective!r}; choose 'throughput' or 'time'")
        df = self.to_pandas()
        if fitting:
            df = df[df["fits"]]
        if objective == "time":
            idx = df.groupby("gpu", sort=False)["iteration_ms"].idxmin()
            return df.loc[idx].sort_values("iteration_ms", kind="stable").reset_index(drop=True)
        idx = df.groupby("gpu", sort=False)["throughput"].idxmax()
        return (df.loc[idx].sort_values("throughput", ascending=False, kind="stable")
                .reset_index(drop=True))
