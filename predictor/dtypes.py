"""The one dtype table: names and torch dtypes -> the kernels' dtype codes.

Every layer speaks of dtypes: the user passes ``dtype="bf16"``, the frontends
see ``torch.bfloat16`` on traced tensors, the OpTable and the memory profile
store ``predictor.kernels.layout`` codes. One module maps between them so that
they cannot drift apart. It sits just above the kernels' layout and imports
nothing else of the project but the errors, and never torch: a torch dtype is
read by its name.
"""

from __future__ import annotations

from predictor.errors import InvalidArgumentError
from predictor.kernels import layout as L

# What a user may write for a dtype (``dtype=`` of predict, sweep, predict_op).
ALIASES = {
    "float32": L.F32, "fp32": L.F32, "float": L.F32,
    "float16": L.F16, "fp16": L.F16, "half": L.F16,
    "bfloat16": L.BF16, "bf16": L.BF16,
    "float64": L.F64, "fp64": L.F64, "double": L.F64,
}

# torch dtypes by name (``str(torch.bfloat16)`` without "torch."); any other
# dtype is priced as fp32.
_TORCH_NAMES = {
    "float32": L.F32, "float16": L.F16, "bfloat16": L.BF16, "float64": L.F64,
    "int64": L.I64, "int32": L.I32, "int8": L.I8, "uint8": L.I8, "bool": L.BOOL,
    "float8_e4m3fn": L.F8, "float8_e5m2": L.F8,
}

# ONNX element types (onnx.TensorProto names) -> the torch dtype the ONNX
# frontend builds its tensors in: unsigned types widen to a signed one that
# holds them, every fp8 is e4m3fn; an element type not listed is fp32.
ONNX_ELEMENT_TYPES = {
    "FLOAT": "float32", "FLOAT16": "float16", "BFLOAT16": "bfloat16", "DOUBLE": "float64",
    "INT64": "int64", "INT32": "int32", "INT16": "int16", "INT8": "int8", "UINT8": "uint8",
    "BOOL": "bool", "UINT16": "int32", "UINT32": "int64", "UINT64": "int64",
    "FLOAT8E4M3FN": "float8_e4m3fn", "FLOAT8E4M3FNUZ": "float8_e4m3fn",
    "FLOAT8E5M2": "float8_e4m3fn", "FLOAT8E5M2FNUZ": "float8_e4m3fn",
}

# Rows a dtype override recasts (OpTable.with_dtype): fp8 rows keep their dtype.
OVERRIDABLE = (L.F32, L.F16, L.BF16, L.F64)
# Storages a dtype override resizes (the memory profile): every floating one.
FLOATING = (L.F32, L.F16, L.BF16, L.F64, L.F8)
# What predict_op can build its meta tensors in.
OP_DTYPES = (L.F32, L.F16, L.BF16)

_BY_TORCH: dict = {}


def parse(dtype) -> int | None:
    """The code of a user-given dtype (a name or a torch dtype); None stays None."""
    if dtype is None:
        return None
    key = str(dtype).replace("torch.", "").lower()
    if key not in ALIASES:
        raise InvalidArgumentError(
            f"unknown dtype {dtype!r}; choose one of float32, float16, bfloat16, float64")
    return ALIASES[key]


def of_torch(dtype) -> int:
    """The code of a torch dtype (fp32 for one the kernels do not know)."""
    code = _BY_TORCH.get(dtype)
    if code is None:
        code = _BY_TORCH[dtype] = _TORCH_NAMES.get(str(dtype).replace("torch.", ""), L.F32)
    return code


def mostly(graph, codes) -> bool:
    """Whether more than half of a traced step's rows (``graph.ops.dtype``)
    have one of the dtype `codes` (False for a graph without rows)."""
    import numpy as np

    rows = np.asarray(getattr(getattr(graph, "ops", None), "dtype", ()))
    return rows.size > 0 and float(np.isin(rows, codes).mean()) > 0.5


def name(code: int) -> str:
    """The dtype's name (``torch.<name>`` for the floating ones but fp8)."""
    return L.DTYPE_NAMES[code]
