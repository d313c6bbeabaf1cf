"""The torch.fx frontend: trace one whole training step at aten level.

``make_fx`` records forward, loss, backward (``torch.autograd.grad``) and the
optimizer's foreach kernels as one aten graph. Everything runs under a
``FakeTensorMode`` on fake *CPU* tensors: no parameter memory, no compute, so a
model far larger than this machine's RAM traces in seconds (a CPU-only torch
cannot fake CUDA through autograd). Lowering maps CPU-only aten ops (mkldnn
LSTM, CPU flash attention) onto the kernel families a GPU runs.

The step is traced at a sentinel batch size (``SENTINEL_BATCH``) so that the
lowering can tell which dims scale with the batch; fake tensors make the size
free.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import time
from typing import Any, Callable

import numpy as np
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.func import functional_call
from torch.fx.experimental.proxy_tensor import get_proxy_mode, make_fx

from predictor import zoo
from predictor.errors import InvalidArgumentError, PredictorError, TraceError
from predictor.frontend import autocast, blocks, float8, layout_pass, memory_pass, optimizers
from predictor.frontend.construction import build_model, real_constants
from predictor.frontend.cuda_paths import CudaPaths, strides_like_channels_last
from predictor.frontend.devices import OnTraceDevice
from predictor.io import printable
from predictor.kernels import layout as L
from predictor.limits import check_batch_size, check_seq_len
from predictor.lowering import is_channels_last, lower
from predictor.optable import Graph

# A prime that no model dimension is a multiple of (see predictor.lowering).
SENTINEL_BATCH = 1009

MODES = ("train", "inference")

# memory_format= of trace(): how the model's 4-D (5-D) weights and inputs are
# stored, as model.to(memory_format=...) and inputs.to(memory_format=...) store
# them; None keeps the strides the model's parameters and inputs have.
MEMORY_FORMATS = ("channels_last", "contiguous")


def check_memory_format(memory_format: str | None) -> str | None:
    """None, "channels_last" or "contiguous" ("nhwc" / "nchw" are accepted)."""
    if memory_format is None:
        return None
    name = {"nhwc": "channels_last", "nchw": "contiguous"}.get(
        str(memory_format).strip().lower(), str(memory_format).strip().lower())
    if name not in MEMORY_FORMATS:
        raise InvalidArgumentError(
            f"unknown memory format {memory_format!r}; use channels_last (NHWC) or "
            "contiguous (NCHW, PyTorch's default)")
    return name


def in_format(t: torch.Tensor, memory_format: str | None) -> torch.Tensor:
    """`t` stored in `memory_format` (4-D and 5-D tensors; others as they are),
    as ``t.to(memory_format=...)`` stores it: a 1x1 filter too gets
    channels-last strides (C, 1, C, C), which ``contiguous(memory_format=)``
    leaves at (C, 1, 1, 1) since the two formats hold its bytes alike, and by
    which ATen decides that its convolution runs channels-last."""
    if memory_format is None or t.dim() not in (4, 5):
        return t
    if memory_format == "contiguous":
        return t.contiguous()
    return t.to(memory_format=torch.channels_last if t.dim() == 4 else torch.channels_last_3d)


def inputs_in_format(x: Any, memory_format: str | None) -> Any:
    """Floating-point 4-D/5-D inputs stored in `memory_format`."""
    if memory_format is None:
        return x
    return torch.utils._pytree.tree_map(
        lambda t: in_format(t, memory_format)
        if isinstance(t, torch.Tensor) and t.dtype.is_floating_point else t, x)


@contextlib.contextmanager
def _quiet_torch_logs():
    """FakeTensorMode logs a full traceback for every op that fails its shape
    check; the trace error we raise already says what failed, in one line."""
    logger = logging.getLogger("torch._subclasses.fake_tensor")
    old = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(old)


def default_loss(output: Any) -> torch.Tensor:
    """`.loss` when the model computes one, else the mean of the first tensor."""
    loss = getattr(output, "loss", None)
    if isinstance(output, dict):
        loss = output.get("loss", loss)
    if isinstance(loss, torch.Tensor):
        return loss
    return _mean_loss(output)


def _first_tensor(x: Any) -> torch.Tensor | None:
    found = _all_tensors(x)
    return found[0] if found else None


def _all_tensors(x: Any) -> list[torch.Tensor]:
    """Every tensor in a model's output or inputs (containers and their values, in order)."""
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, dict) or hasattr(x, "values") and callable(x.values):
        x = list(x.values())
    if isinstance(x, (list, tuple)):
        return [t for item in x for t in _all_tensors(item)]
    return []


def _mean_loss(output: Any) -> torch.Tensor:
    """The mean of the first tensor the model returns."""
    first = _first_tensor(output)
    if first is None:
        raise TraceError("the model returned no tensor to build a loss from; pass loss_fn=")
    return first.float().mean() if first.dtype.is_floating_point else first.sum().float()


def _cross_entropy_loss(output: Any) -> torch.Tensor:
    """Class-index cross entropy of every floating tensor the model returns,
    over its last dim, summed (targets: zeros), as the ONNX frontend's
    ``loss="cross_entropy"`` synthesises it."""
    ys = [t for t in _all_tensors(output) if t.dtype.is_floating_point and t.dim() >= 1]
    if not ys:
        raise TraceError("the model returned no floating tensor for a cross entropy")
    total = None
    for y in ys:
        flat = y.reshape(-1, y.shape[-1])
        target = torch.zeros(flat.shape[0], dtype=torch.long, device=y.device)
        term = torch.nn.functional.cross_entropy(flat, target)
        total = term if total is None else total + term
    return total


# Losses by name, as predictor.trace(..., loss_fn="cross_entropy") takes them
# for a PyTorch model and an ONNX file alike.
NAMED_LOSSES: dict[str, Callable] = {"mean": _mean_loss, "cross_entropy": _cross_entropy_loss}


def _loss_by_name(loss_fn: Any) -> Callable | None:
    if loss_fn is None or callable(loss_fn):
        return loss_fn
    if isinstance(loss_fn, str) and loss_fn in NAMED_LOSSES:
        return NAMED_LOSSES[loss_fn]
    raise InvalidArgumentError(
        f"loss_fn must be a function (output -> scalar) or one of "
        f"{', '.join(repr(n) for n in NAMED_LOSSES)}, got {printable(repr(loss_fn), 80)}")


def _one_line(exc: BaseException) -> str:
    msg = " ".join(str(exc).split())
    if len(msg) > 300:
        msg = msg[:297] + "..."
    return f"{type(exc).__name__}: {msg}" if msg else type(exc).__name__


class _Spec:
    """What to trace: a module builder, an inputs builder, a loss, a name."""

    def __init__(self, name: str, build: Callable[[], Any], inputs: Callable[[int], Any],
                 loss_fn: Callable | None, batch_size: int, seq_len: int | None,
                 build_inference: Callable[[], Any] | None = None,
                 prebuilt: tuple | None = None, source: str | None = None):
        self.name, self.build, self.inputs, self.loss_fn = name, build, inputs, loss_fn
        # The file the model was read from (a Hugging Face config), named in errors.
        self.source = source
        self.batch_size, self.seq_len = batch_size, seq_len
        self.build_inference = build_inference
        # (FakeTensorMode, module): a user factory's one call, traced in that
        # mode instead of calling the factory again.
        self.prebuilt = prebuilt
        # The sequence length of the inputs as traced (_input_seq_len), set by _trace_once.
        self.input_seq_len: int | None = None


def _check_positive(value: Any, what: str) -> int:
    """A batch size or sequence length in the supported range (predictor.limits)."""
    if what == "sequence length":
        return check_seq_len(value, what)
    return check_batch_size(value, what)


def _resize_batch(x: Any, batch: int, batch_dim: int | None) -> Any:
    """A fake copy of the example inputs with the batch dim set to `batch`."""
    if isinstance(x, torch.Tensor):
        shape = list(x.shape)
        if batch_dim is not None and len(shape) > batch_dim:
            shape[batch_dim] = batch
        out = torch.zeros(shape, dtype=x.dtype)
        return in_format(out, "channels_last") if is_channels_last(x) else out
    if isinstance(x, (list, tuple)):
        return type(x)(_resize_batch(i, batch, batch_dim) for i in x)
    if isinstance(x, dict):
        return {k: _resize_batch(v, batch, batch_dim) for k, v in x.items()}
    return x


def _batch_of(x: Any, batch_dim: int | None) -> int | None:
    t = _first_tensor(x) if not isinstance(x, dict) else _first_tensor(list(x.values()))
    if t is None or batch_dim is None or t.dim() <= batch_dim:
        return None
    return int(t.shape[batch_dim])


def _entry_of(model: Any) -> zoo.ZooModel | None:
    """The zoo record of a model given by name: a zoo name, a factory spec, a
    Hugging Face config (``config.json`` or a ``PretrainedConfig``); None for
    a module or a factory function."""
    if isinstance(model, zoo.ZooModel):
        return model
    if isinstance(model, str) or zoo.hf_config.is_config(model) \
            or zoo.hf_config.is_config_path(model):
        return zoo.resolve(model)
    return None


def _spec_for(model: Any, example_inputs: Any, loss_fn: Callable | None, batch_dim: int | None,
              batch_size: int | None, seq_len: int | None, name: str | None) -> _Spec:
    entry = _entry_of(model)
    if entry is not None:
        if seq_len is not None and entry.default_seq_len is None:
            # Never a sequence length in the results that the trace did not use.
            raise InvalidArgumentError(
                f"the sequence length (--seq-len) does not apply to {entry.name}: "
                + ("a factory's example inputs set every shape; return inputs of the length "
                   "you want" if entry.family == "custom" else
                   "it takes no sequence input"))
        b = batch_size if batch_size is not None else entry.default_batch_size
        s = seq_len if seq_len is not None else entry.default_seq_len
        # Validate the sequence length up front (make_inputs checks limits), on
        # fake tensors: a real (1, 2**31) int64 input would take 16 GiB.
        if s is not None:
            with FakeTensorMode(allow_non_fake_inputs=True):
                entry.make_inputs(1, s)
        return _Spec(name or entry.name, entry.build, lambda n: entry.make_inputs(n, s),
                     loss_fn or entry.loss_fn, b, s, entry.inference_fn, entry.prebuilt,
                     entry.source)
    if isinstance(model, torch.nn.Module):
        module = model
        build = lambda: module  # noqa: E731
    elif callable(model):
        build = model
    else:
        raise InvalidArgumentError(
            f"model must be an nn.Module, a zero-argument factory or a zoo name, got {type(model).__name__}")
    prebuilt = None
    if example_inputs is None and not isinstance(model, torch.nn.Module):
        # A factory returning (model, example_inputs): its one call, under a
        # fake mode the trace then reuses (the factory is never called again).
        fake = FakeTensorMode(allow_non_fake_inputs=True)
        try:
            with fake:
                built = build_model(model)
        except Exception as exc:  # noqa: BLE001 — user code
            raise TraceError(f"the model factory raised {_one_line(exc)}") from exc
        if isinstance(built, tuple) and len(built) == 2:
            example_inputs = built[1]
            if isinstance(built[0], torch.nn.Module):
                prebuilt = (fake, built[0])
            build = lambda: model()[0]  # noqa: E731 - a real model (calibration)
    if example_inputs is None:
        raise InvalidArgumentError(
            "example_inputs is required for a model object (a tuple of tensors)")
    if callable(example_inputs):
        make = example_inputs
        b = batch_size or 1
    else:
        if isinstance(example_inputs, torch.Tensor):
            example_inputs = (example_inputs,)
        given = _batch_of(example_inputs, 0 if batch_dim is None else batch_dim)
        b = batch_size or given or 1
        shapes = example_inputs
        make = lambda n: _resize_batch(shapes, n, batch_dim)  # noqa: E731
    return _Spec(name or type(model).__name__, build, make, loss_fn, b, seq_len,
                 prebuilt=prebuilt)


def _input_seq_len(inputs: Any, batch: int) -> int | None:
    """The sequence length of token inputs: dim 1 of ``input_ids`` (a dict's),
    else of the first 2-D integer tensor whose dim 0 is the batch; None when
    there is none (images, features)."""
    if isinstance(inputs, dict) and isinstance(inputs.get("input_ids"), torch.Tensor):
        candidates = [inputs["input_ids"]]
    else:
        candidates = torch.utils._pytree.tree_leaves(inputs)
    for t in candidates:
        if (isinstance(t, torch.Tensor) and t.dim() == 2 and t.shape[0] == batch
                and not t.dtype.is_floating_point and not t.dtype.is_complex
                and t.dtype != torch.bool):
            return int(t.shape[1])
    return None


def _fake_params(module: torch.nn.Module,
                 memory_format: str | None = None) -> tuple[dict, dict]:
    """Fake CPU stand-ins for every parameter and buffer (meta, CUDA or real),
    channels-last where the module's are (``memory_format`` None) or in
    `memory_format` (4-D and 5-D tensors, as ``module.to(memory_format=)``)."""
    def like(t: torch.Tensor) -> torch.Tensor:
        out = torch.empty(t.shape, dtype=t.dtype)
        if memory_format is None:
            return in_format(out, "channels_last") if strides_like_channels_last(t) else out
        return in_format(out, memory_format)

    params, buffers = {}, {}
    for k, p in module.named_parameters():
        params[k] = like(p).requires_grad_(p.requires_grad)
    for k, b in module.named_buffers():
        buffers[k] = like(b)
    return params, buffers


def _call(module: torch.nn.Module, state: dict, inputs: Any, extra: dict | None = None) -> Any:
    """``module(*inputs)`` (or ``module(**inputs)``) with `state`; `extra`
    adds keyword arguments."""
    if isinstance(inputs, dict):
        return functional_call(module, state, (), {**inputs, **(extra or {})})
    if not isinstance(inputs, (list, tuple)):
        inputs = (inputs,)
    return functional_call(module, state, tuple(inputs), extra or None)


NO_CACHE_NOTE = ("traced without the KV cache (use_cache=False): a forward pass over the "
                 "whole sequence, not one generation step")


def _no_cache_kwargs(module: torch.nn.Module, inputs: Any) -> dict:
    """``{"use_cache": False}`` for a forward pass that would build a KV cache
    (Hugging Face models: ``use_cache`` defaults to the config's, True for
    causal LMs), when the call does not set it itself; else ``{}``."""
    if getattr(getattr(module, "config", None), "use_cache", None) is not True:
        return {}
    try:
        params = list(inspect.signature(module.forward).parameters)
    except (TypeError, ValueError):
        return {}
    if "use_cache" not in params:
        return {}
    if isinstance(inputs, dict):
        return {} if "use_cache" in inputs else {"use_cache": False}
    n_positional = len(inputs) if isinstance(inputs, (list, tuple)) else 1
    return {} if params.index("use_cache") < n_positional else {"use_cache": False}


def _tensor_outputs(output: Any, notes: list[str]) -> tuple:
    """The tensors of a forward's output, for the inference graph: objects that
    are not tensors (a KV cache, Python values) are dropped; dropping a cache
    adds a note."""
    leaves = torch.utils._pytree.tree_leaves(output)
    dropped = {type(x).__name__ for x in leaves
               if not isinstance(x, torch.Tensor) and "cache" in type(x).__name__.lower()}
    if dropped and not any(n.startswith("dropped the") for n in notes):
        notes.append(f"dropped the {', '.join(sorted(dropped))} from the outputs "
                     "(a KV cache is not a tensor output)")
    return tuple(x for x in leaves if isinstance(x, torch.Tensor))


def _trace_once(spec: _Spec, mode: str, optimizer: str | None, batch: int,
                notes: list[str] | None = None, amp: str | None = None,
                memory_format: str | None = None):
    """Trace the step at `batch`; returns (GraphModule, phase marks, counts).
    One-line notes on how it was traced are appended to `notes`. `amp`
    ("bf16" / "fp16"): forward and loss under CUDA's autocast policy, fp16
    with a GradScaler (predictor.frontend.autocast). `memory_format`: weights
    and inputs stored so (check_memory_format), None: as they are."""
    fake = FakeTensorMode(allow_non_fake_inputs=True)
    policy = autocast.CudaAutocast(amp) if amp is not None else None
    region = policy.region if policy is not None else contextlib.nullcontext
    scaling = amp == "fp16" and mode == "train"
    if spec.prebuilt is not None and not (mode == "inference" and spec.build_inference):
        fake = spec.prebuilt[0]
    with fake:
        if mode == "inference" and spec.build_inference is not None:
            module = build_model(spec.build_inference)
        elif spec.prebuilt is not None:
            module = spec.prebuilt[1]
        else:
            built = build_model(spec.build)
            module = built[0] if isinstance(built, tuple) else built
        if not isinstance(module, torch.nn.Module):
            raise InvalidArgumentError(
                f"{spec.name}: the factory returned {type(module).__name__}, not an nn.Module")
        params, buffers = _fake_params(module, memory_format)
        if amp == "fp8" and mode == "inference":
            params = float8.stored_weights(module, params)
        inputs = inputs_in_format(spec.inputs(batch), memory_format)
        spec.input_seq_len = _input_seq_len(inputs, batch)
        trainable = [k for k, p in params.items() if p.requires_grad]
        if mode == "train" and not trainable:
            # A training step needs something to differentiate: say so rather
            # than let autograd fail on an empty list of inputs.
            raise InvalidArgumentError(
                f"{spec.name}: no trainable parameters (none, or all with "
                "requires_grad=False), so a training step has nothing to update; "
                "predict its forward pass instead (--inference, mode='inference')")
        opt_state = optimizers.state_for(optimizer, [params[k] for k in trainable])
        if scaling:
            opt_state = [list(autocast.scaler_state())] + opt_state
    was_training = module.training
    module.train(mode == "train")
    marks: list[int] = []
    notes = [] if notes is None else notes
    loss_fn = spec.loss_fn or default_loss

    def mark() -> None:
        proxy = get_proxy_mode()
        marks.append(len(proxy.tracer.graph.nodes) if proxy is not None else 0)

    def train_step(params, buffers, opt_state, inputs):
        if scaling:
            (scale, growth), opt_state = opt_state[0], opt_state[1:]
        with region():
            out = _call(module, {**params, **buffers}, inputs)
            loss = loss_fn(out)
        if scaling:
            loss = autocast.scale_loss(loss, scale)
        mark()
        wrt = [params[k] for k in trainable]
        grads = torch.autograd.grad(loss, wrt, allow_unused=True)
        mark()
        used = [(p, g) for p, g in zip(wrt, grads) if g is not None]
        with torch.no_grad():
            if scaling:
                found_inf = autocast.unscale([g for _, g in used], scale)
            optimizers.step(optimizer, [p for p, _ in used], [g for _, g in used],
                            [[s[i] for i, (_, g) in enumerate(zip(wrt, grads)) if g is not None]
                             for s in opt_state])
            if scaling:
                autocast.update_scale(scale, growth, found_inf)
        return loss

    # Inference: a forward pass without building a KV cache (see NO_CACHE_NOTE).
    no_cache = _no_cache_kwargs(module, inputs) if mode == "inference" else {}
    if no_cache:
        notes.append(NO_CACHE_NOTE)

    def inference_step(params, buffers, opt_state, inputs):
        with torch.no_grad(), region():
            return _tensor_outputs(_call(module, {**params, **buffers}, inputs, no_cache), notes)

    step = train_step if mode == "train" else inference_step
    try:
        with CudaPaths(policy.dtype if policy is not None else None), OnTraceDevice(), fake, \
                (policy if policy is not None else contextlib.nullcontext()):
            gm = make_fx(step, tracing_mode="real")(params, buffers, opt_state, inputs)
    finally:
        module.train(was_training)
    # The parameters' names in placeholder order, for the layout pass.
    gm.meta["param_names"] = list(params)
    gm.meta["trainable"] = set(trainable)
    n_params = sum(p.numel() for p in params.values())
    n_train = sum(params[k].numel() for k in trainable) if mode == "train" else 0
    n_bytes = sum(p.numel() * p.element_size() for p in params.values())
    return gm, tuple(marks), (n_params, n_train, n_bytes)


def trace(model: Any, example_inputs: Any = None, *, loss_fn: Callable | None = None,
          optimizer: str | None = "adam", mode: str = "train", batch_dim: int | None = 0,
          batch_size: int | None = None, seq_len: int | None = None,
          name: str | None = None, amp: str | None = None,
          memory_format: str | None = None, replicate: bool = True) -> Graph:
    """Trace one training iteration (or an inference forward) into a Graph.

    model: an ``nn.Module`` (any device, ``meta`` included), a zero-argument
        factory returning one (or ``(model, inputs)``), a zoo name /
        ``file.py:factory`` spec, or an ``.onnx`` file (``predictor.frontend.onnx``).
    example_inputs: a tuple of tensors (only shapes and dtypes are used), a
        dict of keyword inputs, or a callable ``batch_size -> inputs``.
    loss_fn: ``output -> scalar``, or a loss by name: "mean" (of the first output)
        or "cross_entropy" (class-index cross entropy over the last dim of every
        floating output, as an ONNX file takes them); default ``.loss`` or the
        mean of the first tensor.
    optimizer: "adam", "adamw", "sgd" or None (no optimizer step), with "-loop"
        for PyTorch's for-loop step (foreach=False) and/or "+clip" for
        ``clip_grad_norm_`` before it (``predictor.frontend.optimizers``).
    mode: "train" (forward + loss + backward + optimizer) or "inference" (no-grad forward).
    batch_dim: the input dim that is the batch (None: nothing scales with it).
    seq_len: a zoo text model's sequence length (refused for models without one:
        vision models, factories); for a model object its inputs set the
        shapes, and ``Graph.seq_len`` is their length: dim 1 of ``input_ids`` or
        of the first 2-D integer input (token ids), else None.
    amp: "bf16", "fp16" or "fp8": mixed precision as ``torch.autocast("cuda", dtype)``
        runs it (forward and loss under CUDA's autocast policy, fp32 master
        weights cast every step, the optimizer on fp32 weights; fp16 adds a
        ``GradScaler``); "fp8": bf16 autocast with every ``nn.Linear`` whose
        weight dims are multiples of 16 in float8, as torchao's
        ``convert_to_float8_training`` (tensorwise scaling) runs it
        (predictor.frontend.float8; predicted only on GPUs with float8
        tensor cores); None: every op in the model's own dtypes.
    memory_format: "channels_last" or "contiguous": trace as if the model and
        its 4-D inputs had been converted with ``.to(memory_format=...)``
        (``torch.channels_last`` / NCHW, PyTorch's default); None: the memory
        format the parameters' and inputs' strides have. Convolutions in
        half precision on tensor cores pay cuDNN's NCHW<->NHWC transposes when
        they run in NCHW (predictor.families).
    replicate: a zoo model of N identical blocks is traced with 3 and the
        Graph assembled for N (predictor.frontend.blocks: the same Graph, several
        times faster; it falls back to the full trace when that is not exact);
        False: always trace every block.
    """
    if mode not in MODES:
        raise InvalidArgumentError(f"mode must be 'train' or 'inference', got {mode!r}")
    optimizer = optimizers.check(optimizer) if mode == "train" else None
    amp = autocast.check(amp)
    memory_format = check_memory_format(memory_format)
    if batch_size is not None:
        _check_positive(batch_size, "batch size")
    if seq_len is not None:
        _check_positive(seq_len, "sequence length")
    if (isinstance(model, str) or hasattr(model, "__fspath__")) \
            and str(model).lower().endswith(".onnx"):
        if memory_format == "channels_last":
            raise InvalidArgumentError(
                "memory_format='channels_last' applies to PyTorch models; an ONNX graph is "
                "traced in NCHW, PyTorch's default")
        # An ONNX file: its own frontend (loss_fn names a loss: "mean" or "cross_entropy").
        from predictor.frontend.onnx import trace_onnx
        return trace_onnx(model, batch_size=batch_size, seq_len=seq_len, mode=mode,
                          optimizer=optimizer, loss=loss_fn or "mean", name=name, amp=amp)
    entry = _entry_of(model)
    spec = _spec_for(entry or model, example_inputs, _loss_by_name(loss_fn), batch_dim,
                     batch_size, seq_len, name)
    _check_positive(spec.batch_size, "batch size")
    start = time.perf_counter()
    sentinel: int | None = SENTINEL_BATCH if batch_dim is not None else None
    if replicate and memory_format is None and entry is not None:
        graph = blocks.replicated_zoo(entry, spec, mode, optimizer, amp,
                                      _small_tracer(mode, optimizer, amp, sentinel))
        if graph is not None:
            return graph
    try:
        with _quiet_torch_logs():
            gm, marks, counts, notes, sentinel = _trace_with_fallback(spec, mode, optimizer,
                                                                      sentinel, amp,
                                                                      memory_format)
    except PredictorError:
        raise
    except Exception as exc:  # noqa: BLE001 — any failure inside user code
        what = f"{spec.name} ({printable(spec.source, 300)})" if spec.source else spec.name
        raise TraceError(f"could not trace {what}: {_one_line(exc)} ({_hint(exc)})") from exc
    seq = spec.seq_len if spec.seq_len is not None else spec.input_seq_len
    if (not isinstance(model, str) and spec.seq_len is not None
            and spec.input_seq_len not in (None, spec.seq_len)):
        raise InvalidArgumentError(
            f"seq_len={spec.seq_len} but {spec.name}'s example inputs have sequence length "
            f"{spec.input_seq_len}; the inputs set the shapes")
    lowered = lower(gm, marks, sentinel, spec.batch_size)
    mem = memory_pass.profile(gm, marks if mode == "train" else (), sentinel, amp=amp)
    graph = Graph(
        name=spec.name, ops=lowered.table, batch_size=spec.batch_size, mode=mode,
        optimizer=optimizer, seq_len=seq, parameters=counts[0],
        trainable_parameters=counts[1], parameter_bytes=counts[2],
        unsupported=lowered.unsupported,
        batch_scalable=lowered.batch_scalable and sentinel is not None,
        trace_seconds=time.perf_counter() - start, torch_version=torch.__version__,
        host_ops=list(lowered.host_ops),
        memory=mem, amp=amp)
    if mode == "train":
        try:
            graph.layout = layout_pass.analyse(
                gm, marks, sentinel, spec.batch_size, lowered.node_rows, lowered.table,
                gm.meta.get("param_names", ()), seq, mem)
        except Exception as exc:  # noqa: BLE001 — the analysis is optional, the trace is not
            notes.append(f"no layout analysis (parallel layouts unavailable): {_one_line(exc)}")
    # How to build and feed the model for real (calibration runs the real step);
    # an attribute, not a field: callables are not saved with the graph.
    graph.source = spec
    spec.memory_format = memory_format  # the real step stores its tensors so too
    if memory_format is not None and not _has_convolutions(lowered.table):
        notes.append(f"memory_format={memory_format!r} changes nothing here: {spec.name} has "
                     "no convolutions (only they are priced by memory format)")
    # One-line notes on how the step was traced (e.g. NO_CACHE_NOTE), for the
    # CLI and the user; an attribute, not saved with the graph.
    graph.notes = notes
    return graph


def _has_convolutions(table) -> bool:
    """Whether an op table has a convolution row (forward or backward)."""
    return bool(np.isin(table.family, (L.CONV, L.CONV_DGRAD, L.CONV_WGRAD)).any())


def _small_tracer(mode: str, optimizer: str | None, amp: str | None, sentinel: int | None):
    """``spec -> (gm, marks, counts, notes, sentinel)``: a spec traced as
    trace() traces it, for predictor.frontend.blocks (its 3-block model)."""
    def trace_small(spec: _Spec):
        with _quiet_torch_logs():
            return _trace_with_fallback(spec, mode, optimizer, sentinel, amp)
    return trace_small


def _hint(exc: BaseException) -> str:
    """What to check for a trace failure, by what failed."""
    msg = str(exc)
    if isinstance(exc, NotImplementedError) and "argument of type" in msg:
        return ("the model returned an object that is not a tensor; return tensors, or a "
                "dict/tuple of them, or pass loss_fn= to reduce the output")
    name = type(exc).__name__
    if "overflow" in msg.lower():
        return ("a tensor's size overflows torch's int64 sizes; use a smaller batch size or "
                "sequence length")
    if "DynamicOutputShape" in name:
        # torch.nonzero, masked_select, unique, pack_padded_sequence: no shape to price
        packed = "pack_padded_sequence" in msg
        return ("an op's output shape depends on the tensors' values, which a trace does not "
                "know; " + ("trace the padded batch instead of a packed sequence: cuDNN's RNN "
                            "over it costs what the packed one does when every sequence is full "
                            "length, and no less" if packed else
                            "give that op's result a fixed shape in the model"))
    if "DataDependent" in name or "data-dependent" in msg.lower() or "data dependent" in msg.lower():
        return "data-dependent control flow cannot be traced"
    if any(k in msg for k in ("BFloat16", "Half", "bfloat16", "float16")):
        # Under amp= an op outside autocast's lists gets a 16-bit input (torch.fft on
        # bf16: "Unsupported dtype BFloat16", on CUDA too).
        return ("an op of the model does not take that 16-bit dtype (nor does it under CUDA "
                "autocast); cast its input with .float() in the model, or trace without amp")
    return ("check the example inputs' shapes; data-dependent control flow cannot be traced")


def _trace_with_fallback(spec: _Spec, mode: str, optimizer: str | None, sentinel: int | None,
                         amp: str | None = None, memory_format: str | None = None):
    """Trace at the sentinel batch; if the model rejects it, at the requested batch."""
    notes: list[str] = []
    try:
        gm, marks, counts = _trace_once(spec, mode, optimizer, sentinel or spec.batch_size, notes,
                                        amp, memory_format)
    except PredictorError:
        raise
    except Exception:
        if sentinel is None:
            raise
        # Some models only accept particular batch sizes: trace at the
        # requested one; the graph is then valid at that batch only.
        sentinel = None
        notes.clear()
        gm, marks, counts = _trace_once(spec, mode, optimizer, spec.batch_size, notes, amp,
                                        memory_format)
    return gm, marks, counts, notes, sentinel
