"""Load the NeuSight per-kernel measurements into OpTable-shaped arrays.

Each measured op becomes one row with the same family code and dims layout the
lowering produces for a traced graph, so the learned models see exactly the
features they will see at prediction time. The data is read from a path
(``--data DIR``); nothing from it is stored in this repository.
"""

from __future__ import annotations

import ast
import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from predictor import hardware
from predictor.errors import InvalidArgumentError, UnknownGPUError
from predictor.kernels import layout as L
from predictor.kernels import precision
from predictor.kernels import tiles as T

BINARY = ("add", "mul", "div", "pow")
UNARY = ("addu", "mulu", "divu", "powu", "relu", "tanh", "gelu")
OPS = ("linear", "bmm", "conv", "softmax", "ln") + BINARY + UNARY
# FLOPs per element of each elementwise op (pow and gelu are transcendental).
ELEM_FLOPS = {"pow": 8, "powu": 8, "gelu": 8, "tanh": 8}


@dataclass
class OpSamples:
    """Measured ops as arrays: one row per measurement."""

    op: np.ndarray        # object[n] source op name (linear, add, ...)
    family: np.ndarray    # int64[n]
    dims: np.ndarray      # int64[n, MAX_DIMS]
    gpu: np.ndarray       # object[n] spec id
    latency_ms: np.ndarray
    # int64[n]: a GEMM's output tile as its kernel name records it (an index
    # into kernels.tiles.CANDIDATES), -1 where none is known; the GEMM tile
    # rule of the batched-GEMM model is fitted on these (calibration.tiles).
    tile: np.ndarray | None = None
    # int64[n]: which timing harness measured the row, 0 the dataset's, 1 this
    # project's (``benchmarks.measure_kernels``: CUDA events around one launch).
    # Each has its own fixed cost per measurement, fitted apart (train.fit_group).
    harness: np.ndarray | None = None

    def __post_init__(self):
        if self.tile is None:
            self.tile = np.full(len(self.op), -1, dtype=np.int64)
        if self.harness is None:
            self.harness = np.zeros(len(self.op), dtype=np.int64)

    def __len__(self) -> int:
        return len(self.op)

    def subset(self, mask: np.ndarray) -> "OpSamples":
        return OpSamples(self.op[mask], self.family[mask], self.dims[mask], self.gpu[mask],
                         self.latency_ms[mask], self.tile[mask], self.harness[mask])

    def fingerprint(self) -> str:
        """A hash of every column: equal samples, equal fingerprint (what
        training on them gives is then the same)."""
        h = hashlib.sha256()
        for name in ("op", "gpu"):
            h.update("\0".join(map(str, getattr(self, name))).encode())
        # (the harness only where one row is not the dataset's, so that the
        # dataset's own fingerprints stay what they were)
        names = ("family", "dims", "latency_ms", "tile") + (("harness",) if self.harness.any()
                                                            else ())
        for name in names:
            arr = np.ascontiguousarray(getattr(self, name))
            h.update(str((arr.dtype, arr.shape)).encode())
            h.update(arr.tobytes())
        return h.hexdigest()

    @staticmethod
    def concat(parts: list["OpSamples"]) -> "OpSamples":
        return OpSamples(*(np.concatenate([getattr(p, f) for p in parts])
                           for f in ("op", "family", "dims", "gpu", "latency_ms", "tile",
                                     "harness")))


def _rows(op: str, df: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Family and dims of each measured op, as the lowering would write them."""
    n = len(df)
    dims = np.zeros((n, L.MAX_DIMS), dtype=np.int64)
    if op in ("linear", "bmm"):
        b, m, nn, k = (df[c].to_numpy(np.int64) for c in ("B", "M", "N", "K"))
        # The files' N is the reduction dim and K an output dim (NeuSight's
        # (M x N) @ (N x K) naming): every recorded launch grid tiles an M x K
        # output with the kernel's tile (tests/test_opmodel.py checks this on
        # the data), whatever the data's README says.
        if op == "linear":  # x[B*M, N] @ W[K, N]^T: one GEMM, cuBLAS `*_tn` kernels
            dims[:, :4] = np.stack([np.ones(n, np.int64), b * m, k, nn], axis=1)
            dims[:, L.GEMM_LAYOUT] = L.GEMM_B_T
        else:  # torch.bmm of contiguous a[B, M, N] @ b[B, N, K]: `*_nn` kernels
            dims[:, :4] = np.stack([b, m, k, nn], axis=1)
        return np.full(n, L.MATMUL), dims
    if op == "conv":
        b = df["B"].to_numpy(np.int64)
        c = df["Input_Channel"].to_numpy(np.int64)
        k = df["Output_Channel"].to_numpy(np.int64)
        r = df["Kernel_Szie"].to_numpy(np.int64)
        h = df["Input_Size"].to_numpy(np.int64)
        st = df["Stride"].to_numpy(np.int64)
        pad = df["Padding"].to_numpy(np.int64)
        p = (h + 2 * pad - r) // st + 1
        dims[:, :11] = np.stack([b, c, h, h, k, r, r, p, p, np.ones(n, np.int64), st], axis=1)
        return np.full(n, L.CONV), dims
    b = df["B"].to_numpy(np.int64)
    h = df["H"].to_numpy(np.int64)
    numel = b * h
    if op == "softmax":
        fam, read, written, flops = L.SOFTMAX, numel, numel, 5 * numel
    elif op == "ln":
        fam, read, written, flops = L.LAYER_NORM, numel + 2 * h, numel + 2 * b, 8 * numel
    else:
        fam = L.ELEMENTWISE
        read = 2 * numel if op in BINARY else numel
        written = numel
        flops = ELEM_FLOPS.get(op, 1) * numel
    dims[:, L.MEM_READ] = read
    dims[:, L.MEM_WRITTEN] = written
    dims[:, L.MEM_FLOPS] = flops
    dims[:, L.MEM_INNER] = h
    dims[:, L.MEM_OUTER] = b
    return np.full(n, fam), dims


def _from_frame(op: str, df: pd.DataFrame) -> OpSamples:
    fam, dims = _rows(op, df)
    ids = {name: hardware.get(name).id for name in df["Device"].unique()}
    gpu = df["Device"].map(ids).to_numpy(object)
    lat = df["Latency"].to_numpy(np.float64)
    keep = np.isfinite(lat) & (lat > 0)
    tile = np.full(len(df), -1, dtype=np.int64)
    if op in ("linear", "bmm") and "Kernel Name" in df:
        parsed = T.parse_kernel_names(df["Kernel Name"].astype(str))
        tile = T.candidate_index(parsed[:, 0], parsed[:, 1])
    return OpSamples(np.full(len(df), op, dtype=object)[keep], fam[keep], dims[keep], gpu[keep],
                     lat[keep], tile[keep])


def check_folder(data: str | Path) -> Path:
    """`data` as a Path, refused in one line unless it holds a train/ folder."""
    data = Path(data)
    if not (data / "train").is_dir():
        raise InvalidArgumentError(
            f"{data}: not a NeuSight data folder (expected train/, test/ inside)")
    return data


def load_train(data: str | Path, ops=OPS, extra=(), log=None) -> OpSamples:
    """The training files of `ops`, and the rows of the measured-kernel files
    `extra` of those ops (see `load_measured`; `log` hears what it leaves out)."""
    data = check_folder(data)
    parts = []
    for op in ops:
        for f in sorted((data / "train" / op).glob("*.csv")):
            parts.append(_from_frame(op, pd.read_csv(f)))
    if extra:
        more = load_measured(extra, log=log)
        parts.append(more.subset(np.isin([o.split("_backward")[0] for o in more.op], ops)))
    return OpSamples.concat(parts)


MEASURED_COLUMNS = ("OPName", "Pass", "Family", "Latency", "Device",
                    *(f"d{j}" for j in range(L.MAX_DIMS)))


# The families whose kernels TF32 changes, and the column that says whether
# a measured-kernel file ran them in TF32. A file without the column ran
# PyTorch's defaults: fp32 matmuls, TF32 convolutions.
TF32_COLUMNS = {"matmul": ("TF32 Matmul", False), "conv": ("TF32 Conv", True),
                "conv_dgrad": ("TF32 Conv", True), "conv_wgrad": ("TF32 Conv", True)}


def ran_in_tf32(df: pd.DataFrame, gpu_ids: dict) -> np.ndarray:
    """Rows of a measured-kernel frame that ran on TF32 tensor cores: a
    matmul or convolution with TF32 allowed, on a GPU that has TF32
    (compute capability 8.0 on). They are another kernel than the fp32 one
    the learned models describe."""
    tf32_gpu = {name: bool(precision.has_tf32(hardware.get(i).features))
                for name, i in gpu_ids.items()}
    on_gpu = df["Device"].map(tf32_gpu).to_numpy(bool)
    out = np.zeros(len(df), dtype=bool)
    for fam, (col, default) in TF32_COLUMNS.items():
        rows = (df["Family"] == fam).to_numpy()
        allowed = (df[col].astype(str).str.lower().isin(("true", "1", "1.0")).to_numpy()
                   if col in df else np.full(len(df), default))
        out |= rows & allowed & on_gpu
    return out


def load_measured(paths, *, tf32: bool = False, log=None) -> OpSamples:
    """Rows of `python -m benchmarks.measure_kernels` files: each already
    holds the family and dims the lowering writes (forward and backward
    kernels alike), so nothing is reinterpreted here. A backward row's op is
    its source op + "_backward" (e.g. linear_backward: a linear's two
    gradient GEMMs). A file that is not such a file, or names an unknown
    family or GPU, is refused with its path.

    Rows that ran on TF32 tensor cores (`ran_in_tf32`) are left out, said
    through `log`; with `tf32=True` only those rows are kept."""
    parts = []
    for path in paths:
        path = Path(path)
        try:
            df = pd.read_csv(path)
        except (OSError, ValueError) as exc:
            raise InvalidArgumentError(f"{path}: not readable as a CSV file ({exc})") from exc
        missing = [c for c in MEASURED_COLUMNS if c not in df]
        if missing:
            raise InvalidArgumentError(f"{path}: not a measured-kernel file (no column "
                                       f"{', '.join(missing)}); see benchmarks/measure_kernels.py")
        unknown = sorted(set(df["Family"]) - set(L.FAMILY_NAMES))
        if unknown:
            raise InvalidArgumentError(f"{path}: unknown op family {', '.join(map(str, unknown))}")
        try:
            ids = {name: hardware.get(str(name)).id for name in df["Device"].unique()}
        except UnknownGPUError as exc:
            raise InvalidArgumentError(f"{path}: {exc}") from exc
        lat = pd.to_numeric(df["Latency"], errors="coerce").to_numpy(np.float64)
        in_tf32 = ran_in_tf32(df, ids)
        if in_tf32.any() and not tf32 and log is not None:
            log(f"{path.name}: {int(in_tf32.sum())} convolution/matmul rows ran in TF32 "
                "(tensor cores), not fp32: left out")
        keep = np.isfinite(lat) & (lat > 0) & (in_tf32 if tf32 else ~in_tf32)
        df = df[keep]
        op = np.where(df["Pass"].to_numpy() == "forward", df["OPName"].astype(str),
                      df["OPName"].astype(str) + "_backward").astype(object)
        family = np.array([L.FAMILY_NAMES.index(f) for f in df["Family"]], dtype=np.int64)
        dims = df[[f"d{j}" for j in range(L.MAX_DIMS)]].to_numpy(np.int64)
        parts.append(OpSamples(op, family, dims, df["Device"].map(ids).to_numpy(object),
                               lat[keep], harness=np.ones(len(df), dtype=np.int64)))
    return OpSamples.concat(parts)


def load_test(data: str | Path, ops=OPS) -> OpSamples:
    data = check_folder(data)
    parts = []
    files = {"linear": "linear", "bmm": "bmm", "softmax": "softmax", "ln": "ln"}
    for op in ops:
        if op in files:
            f = data / "test" / f"{files[op]}.csv"
            if f.exists():
                parts.append(_from_frame(op, pd.read_csv(f)))
    elem = data / "test" / "elem.csv"
    if elem.exists():
        df = pd.read_csv(elem)
        for op in sorted(set(df["OPName"]) & set(ops)):
            parts.append(_from_frame(op, df[df["OPName"] == op]))
    return OpSamples.concat(parts)


# The per-node label files (``labels/<GPU>/<label>.csv``: each node of a
# single-layer copy of a model, timed alone, forward and backward) hold the
# data's only unbatched `x @ W` GEMMs (GPT-2's Conv1D, `addmm` nodes) and its
# only model-shaped `x @ W^T` ones (`nn.Linear` modules). `load_label_gemms`
# reads their forward GEMMs as matmul rows of a timing harness of their own
# (a node timed from Python pays more than a kernel's launch). Not in the
# shipped training set: as extra rows of the training GPUs they made
# leave-one-GPU-out iterations worse (benchmarks/README.md, "The per-node
# files' GEMMs as training rows"); `benchmarks.e2e --logo --label-gemms N`
# repeats that check.
LABEL_GEMM_HARNESS = 2
# A linear module of the label models by its attribute name.
LABEL_LINEAR_MODULES = frozenset({
    "dense", "query", "key", "value", "q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2",
    "lm_head", "decoder", "classifier", "seq_relationship"})
# Nodes shorter than this are left out: the node harness's fixed cost dominates.
LABEL_GEMM_MIN_MS = 0.05


def _shape_list(text) -> list | None:
    try:
        value = ast.literal_eval(str(text))
    except (ValueError, SyntaxError):
        return None
    return value if isinstance(value, (list, tuple)) else None


def load_label_gemms(data: str | Path, gpus=None) -> OpSamples:
    """The forward GEMM nodes of the per-node label files (of `gpus` only,
    spec ids, where given) as matmul rows: an `nn.Linear` module as
    `x @ W^T` (layout GEMM_B_T) over every row of its input, an `addmm` node
    (`bias, x[M, K], W[K, N]`) as `x @ W`."""
    data = check_folder(data)
    gpu_of, rows = {}, []
    for f in sorted((data / "labels").glob("*/*.csv")):
        board = f.parent.name
        if board not in gpu_of:
            gpu_of[board] = hardware.get(board.replace("_", " ")).id
        gpu = gpu_of[board]
        if gpus is not None and gpu not in gpus:
            continue
        df = pd.read_csv(f)
        for op, target, name, shapes, out, ms in zip(
                df["op"], df["target"].astype(str), df["Name"].astype(str), df["input_shapes"],
                df["output_shape"], pd.to_numeric(df["fw_latency"], errors="coerce")):
            if not ms > LABEL_GEMM_MIN_MS:
                continue
            ins = _shape_list(shapes)
            if op == "call_module" and target.split(".")[-1] in LABEL_LINEAR_MODULES:
                outs = _shape_list(out)
                if not ins or not outs:
                    continue
                x = ins[0]
                rows.append((gpu, (1, int(np.prod(x[:-1])), int(outs[-1]), int(x[-1])),
                             L.GEMM_B_T, float(ms)))
            elif op == "call_function" and name.startswith("addmm") and ins and len(ins) == 3:
                _, a, b = ins
                rows.append((gpu, (1, int(a[0]), int(b[1]), int(a[1])), 0, float(ms)))
    dims = np.zeros((len(rows), L.MAX_DIMS), dtype=np.int64)
    for i, (_, d4, layout, _) in enumerate(rows):
        dims[i, :4] = d4
        dims[i, L.GEMM_LAYOUT] = layout
    n = len(rows)
    return OpSamples(np.full(n, "linear_node", dtype=object), np.full(n, L.MATMUL, dtype=np.int64),
                     dims, np.array([r[0] for r in rows], dtype=object),
                     np.array([r[3] for r in rows], dtype=np.float64),
                     harness=np.full(n, LABEL_GEMM_HARNESS, dtype=np.int64))
