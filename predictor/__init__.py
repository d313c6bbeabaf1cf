"""dnn-predictor: predict one training iteration of a PyTorch model on GPUs you
do not have, from a static trace of the step.

    >>> import predictor
    >>> g = predictor.trace("resnet50", batch_size=64)
    >>> predictor.predict(g, "H100-SXM5-80GB").iteration_ms

Pipeline (one module each): frontend (``predictor.frontend.fx``) -> lowering
(``predictor.lowering`` with the op-family registry ``predictor.families``) ->
engine (``predictor.engine`` over the numba kernels in ``predictor.kernels``)
-> results (``predictor.results``).
"""

from __future__ import annotations

__version__ = "0.1.0"

from predictor.errors import (  # noqa: E402
    InvalidArgumentError, PredictorError, SpecError, TraceError, UnknownGPUError,
    UnknownModelError,
)

__all__ = [
    "trace", "predict", "sweep", "gpus", "load_specs", "Graph", "Prediction", "SweepResult",
    "PredictorError", "UnknownGPUError", "UnknownModelError", "SpecError", "TraceError",
    "InvalidArgumentError", "__version__", "calibrate", "load_calibration", "search",
    "predict_op", "Parallel", "search_layouts", "Space", "explore",
]


def __getattr__(name: str):
    # Import lazily: prediction-only use need not import torch.
    if name == "trace":
        from predictor.frontend.fx import trace
        return trace
    if name in ("predict", "sweep"):
        from predictor import engine
        return getattr(engine, name)
    if name in ("gpus", "load_specs"):
        from predictor import hardware
        return getattr(hardware, name)
    if name in ("calibrate", "load_calibration"):
        from predictor.calibration import calibrate as _c
        return getattr(_c, name)
    if name in ("Parallel", "search_layouts"):
        from predictor import layouts
        return getattr(layouts, name)
    if name == "search":
        from predictor.design_search import search
        return search
    if name in ("Space", "explore", "ExploreResult"):
        from predictor import exploration
        return getattr(exploration, name)
    if name == "predict_op":
        from predictor.opmodel import predict_op
        return predict_op
    if name == "Graph":
        from predictor.optable import Graph
        return Graph
    if name in ("Prediction", "SweepResult"):
        from predictor import results
        return getattr(results, name)
    raise AttributeError(f"module 'predictor' has no attribute {name!r}")
