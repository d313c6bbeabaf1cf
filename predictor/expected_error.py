"""How far off a prediction may be: the measured error of predictions made the
same way, quoted beside each one.

A prediction's trust depends on where the GPU stands against the op models'
data more than on the model: on a board whose own kernels trained the models
the whole-iteration error is a few percent; on a GPU the models never saw it
is about 11 % on average and over 20 % for a board that sustains its clock
unlike the training boards (README, "How accurate"). Each prediction carries
its *standing* and the 90th percentile of |error| that predictions of that
standing showed against measured iterations:

- ``trained``: fp32 on a board of the training data; NeuSight's measured
  iterations of those boards, predicted with the shipped op models.
- ``unseen``: fp32 on any other GPU, including other boards of a training
  chip (an A100 SXM4 for the A100 PCIe: same kernels, another power limit
  and clock); the same iterations, each GPU's predicted by op models trained
  without it (leave-one-GPU-out), and the published and logged fp32
  training throughput of boards outside the data (V100 SXM2, Quadro RTX
  8000, GTX 1080 Ti and TU102 boards: ResNet-50, BERT, GNMT, NCF,
  Transformer-big).
- ``tensor cores``: half precision (``amp=``, ``dtype=float16|bfloat16``) or
  TF32 matmuls; published throughput of ResNet-50 and BERT-large training
  (NVIDIA, Lambda) and of ResNets and Inception v3 training and inference
  (timm) on ten GPUs (the data holds no measured half-precision kernel).
- ``emulated``: half precision on a GPU without tensor cores for it (bf16
  on a V100 or T4, fp16 on a P100 or P4); nothing of the kind was measured:
  no figure. TF32 asked of a GPU without TF32 tensor cores runs plain fp32
  and takes the fp32 standing.
- ``calibrated``: measured op times scaled to the GPU; no figure (its error
  is the calibration's: ``benchmarks/README.md``, "Calibrated mode").

Whether a GPU runs the step's GEMMs on tensor cores is the pricing's own
rule (``kernels.precision.tensor_core_peak``).

The figures ship in ``weights/expected_error.json``, written by
``python -m benchmarks.expected_error`` from those harnesses' per-label
results; that command also checks that each band holds its 90 % for a GPU
left out of it. A package without the file quotes no figure (None)."""

from __future__ import annotations

import functools
import json
import math
from importlib import resources

from predictor import dtypes, opmodel
from predictor.errors import WeightsError
from predictor.kernels import layout as L
from predictor.kernels.precision import tensor_core_peak

FILE = "expected_error.json"
FORMAT = 1
STANDINGS = ("trained", "unseen", "tensor cores", "emulated", "calibrated")


def read(path) -> dict[str, float]:
    """{standing: 90th percentile of |error| in %} from an expected-error
    file; a damaged file is an error naming it."""
    try:
        with open(path, "rb") as f:
            doc = json.loads(f.read().decode())
        if doc.get("format") != FORMAT or not isinstance(doc.get("standings"), dict):
            raise ValueError(f"expected format {FORMAT} with a 'standings' object")
        out = {str(k): float(v["p90_abs_error_pct"]) for k, v in doc["standings"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise WeightsError(f"{path}: not a readable expected-error file ({exc})") from exc
    bad = [k for k, v in out.items()
           if k not in STANDINGS or not (math.isfinite(v) and 0.0 < v < 1000.0)]
    if bad:
        raise WeightsError(f"{path}: damaged expected-error file (unknown standing or a figure "
                           f"outside (0, 1000) %: {', '.join(bad)})")
    return out


@functools.lru_cache(maxsize=1)
def shipped() -> dict[str, float]:
    """The shipped figures ({} when the package ships none)."""
    ref = resources.files("predictor").joinpath("weights", FILE)
    if not ref.is_file():
        return {}
    with resources.as_file(ref) as path:
        return read(path)


def standing(gpu, gemm_dtype: int | None = None, params=None, *,
             calibrated: bool = False) -> str:
    """Where a prediction on `gpu` (a ``hardware.GPU``) stands against the
    data (module docstring), for a step whose GEMMs are asked to run in
    `gemm_dtype` (``gemm_dtype()``; None: fp32) under the pricing's `params`."""
    if calibrated:
        return "calibrated"
    if gemm_dtype is not None:
        if tensor_core_peak(L.MATMUL, gemm_dtype, gpu.features, params) > 0.0:
            return "tensor cores"
        if gemm_dtype != L.F32:
            return "emulated"
    return "trained" if gpu.id in opmodel.shipped()[1].get("gpus", []) else "unseen"


def p90_pct(kind: str) -> float | None:
    """90th percentile of |error| (%) measured for predictions of standing
    `kind`; None where none was measured."""
    return shipped().get(kind)


def gemm_dtype(graph, dtype=None, tf32_matmul: bool | None = None) -> int | None:
    """The dtype a prediction asks the step's GEMMs to run in where it is not
    plain fp32: autocast's half dtype (float8 under amp="fp8", whose
    linears' GEMMs dominate), `dtype` or the traced one when half
    precision, fp32 with TF32 matmuls asked for; None for plain fp32."""
    amp = getattr(graph, "amp", None)
    if amp is not None:
        return {"bf16": L.BF16, "fp16": L.F16, "fp8": L.F8}.get(amp, L.F16)
    code = dtypes.parse(dtype)
    if code is None and dtypes.mostly(graph, (L.F16, L.BF16)):
        code = L.BF16 if dtypes.mostly(graph, (L.BF16,)) else L.F16
    if code in (L.F16, L.BF16):
        return code
    return L.F32 if tf32_matmul else None
