"""The memory pass of an ONNX graph: every storage of the synthesised step
with its liveness, the :class:`~predictor.optable.MemoryProfile` the fx
frontend's memory pass (``predictor.frontend.memory_pass``) gives a traced one.

An ONNX file has no autograd to watch, so liveness follows eager PyTorch's
rules over the calls the lowering synthesised (one step per forward call, per
loss call, per forward op's backward, per optimizer call):

- parameters, the other initializers (buffers), the input batch and the
  optimizer state live through the whole step;
- a forward call's outputs are allocated at the call and freed after the last
  call that reads them, or after the op's backward when that backward reads
  them (``training_synthesis.saved_for_backward``, derivatives.yaml's saved
  values); views (Reshape, Flatten, an identity) share their input's storage;
- a tensor's gradient is allocated by the backward of its last reader and
  freed after the backward of the op that made it; a parameter's lives to the
  end of the step; an op whose backward launches nothing (add, concat, a
  view) hands its output's gradient on as its input's;
- under autocast, the 16-bit copy of a parameter lives to the end of the
  forward (the cast cache), as in the fx memory pass;
- cuDNN convolution workspaces and flash-attention backward's fp32 ``dq``
  accumulator live during their op, sized as the fx memory pass sizes them;
- the optimizer's out-of-place results live to the end of its step.

Sizes are the shapes at the sentinel batch: a dim that is a multiple of it
contributes one power of the batch, as the lowering scales it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
import numpy as np
import torch

from predictor import dtypes
from predictor.families import TensorMeta, tensors
from predictor.frontend import optimizers
from predictor.frontend import training_synthesis as synthesis
from predictor.frontend.training_synthesis import Call
from predictor.memory import CUDNN_WORKSPACE_CAP
from predictor.optable import (
    ACTIVATIONS, BUFFERS, GRADIENTS, INPUTS, OPTIMIZER_STATE, PARAMETERS, TEMPORARIES,
    WORKSPACE, MemoryProfile, StorageColumns,
)

aten = torch.ops.aten

_CONV_BWD = (aten.convolution_backward.default,)
_ATTN_BWD = (aten._scaled_dot_product_flash_attention_backward.default,)


@dataclass
class Step:
    """What the lowering synthesised, in the order a training step runs it."""

    entries: list                      # _Fwd (call, sources, outputs, free) in forward order
    aliases: dict[str, str]            # view or identity -> the value it shares storage with
    metas: dict[str, TensorMeta]       # graph value -> its tensor (runtime dtype under autocast)
    params: set[str]                   # differentiable float initializers
    buffers: list[str]                 # other initializers
    inputs: list[str]                  # the graph's data inputs
    outputs: list[str]                 # the graph's outputs
    loss_fwd: list[Call] = field(default_factory=list)
    loss_bwd: list[Call] = field(default_factory=list)
    loss_outputs: list[str] = field(default_factory=list)
    backward: list = field(default_factory=list)   # (entry index, needs, calls), backward order
    trainable: list[str] = field(default_factory=list)
    optimizer: str | None = None
    opt_calls: list[Call] = field(default_factory=list)
    amp: str | None = None


def _names(sources) -> list:
    """Argument position -> the graph values it reads (a list argument reads several)."""
    return [tuple(x for x in s if x) if isinstance(s, tuple) else ((s,) if s else ())
            for s in sources]


def profile(step: Step, sentinel: int | None, training: bool) -> MemoryProfile:
    cols = StorageColumns()
    n_fwd = len(step.entries) + len(step.loss_fwd)
    bwd_start = n_fwd
    loss_end = bwd_start + max(len(step.loss_bwd), 1) - 1   # the loss's backward, a step a call
    opt_start = loss_end + 1 + len(step.backward)
    n_steps = max(opt_start + len(step.opt_calls), 1) if training else max(n_fwd, 1)
    last = n_steps - 1

    def add(meta: TensorMeta, a: int, f: int, category: int, limit: int = 0) -> int:
        numel = 1
        p = 0
        for d in meta.shape:
            numel *= int(d)
            if sentinel and d and int(d) % sentinel == 0:
                p += 1
        return cols.add(numel / float(sentinel) ** p if p else float(numel), p,
                        dtypes.of_torch(meta.dtype), a, f, category, limit)

    def root(name: str) -> str:
        seen = 0
        while name in step.aliases and seen < 10_000:
            name = step.aliases[name]
            seen += 1
        return name

    use = cols.use

    storage: dict[str, int] = {}   # root value -> storage
    for name in step.params:
        if root(name) == name and name in step.metas:
            storage[name] = add(step.metas[name], 0, last, PARAMETERS)
    for name in step.buffers:
        if root(name) == name and name not in storage and name in step.metas:
            storage[name] = add(step.metas[name], 0, last, BUFFERS)
    for name in step.inputs:
        if name in step.metas:
            storage[name] = add(step.metas[name], 0, last, INPUTS)

    def of(name) -> int | None:
        return storage.get(root(name)) if name else None

    # ---- forward: each call's outputs, freed after their last reader
    made: dict[int, list[int]] = {}   # entry -> its output storages, by output position
    region_end = bwd_start - 1 if training else last
    for k, f in enumerate(step.entries):
        for srcs in _names(f.sources):
            for s in srcs:
                use(of(s), k)
        if f.free:
            continue
        outs = tensors(f.call.out)
        made[k] = []
        for j, t in enumerate(outs):
            name = f.outputs[j] if j < len(f.outputs) else None
            e = add(t, k, k, TEMPORARIES)
            made[k].append(e)
            if name and root(name) not in storage:
                storage[root(name)] = e
        if getattr(f.call.op, "overloadpacket", None) is aten.convolution:
            _workspace(f.call, k, add)
        if step.amp is not None and f.call.op is aten._to_copy.default and outs \
                and outs[0].dtype in (torch.float16, torch.bfloat16) \
                and any(root(s) in step.params for srcs in _names(f.sources) for s in srcs):
            for e in made[k]:   # autocast's cast cache holds the copy
                use(e, region_end)
    if not training:
        for name in step.outputs:
            use(of(name), last)
    else:
        # The loss reads the outputs; what it makes lives to its backward.
        for i, call in enumerate(step.loss_fwd):
            at = len(step.entries) + i
            if i == 0:
                for name in step.loss_outputs:
                    use(of(name), at)
            for t in tensors(call.out):
                add(t, at, loss_end if t.numel > 1 else at, TEMPORARIES)

    if training:
        _backward(step, storage, made, root, add, use, bwd_start, loss_end, last)
        _optimizer(step, add, opt_start, last)

    cat_a = np.asarray(cols.category, np.int64)
    if training:   # made in the forward, alive into the backward: kept for it
        saved = (cat_a == TEMPORARIES) & (np.asarray(cols.alloc) < bwd_start) \
            & (np.asarray(cols.free) >= bwd_start)
        cat_a[saved] = ACTIVATIONS
    return cols.profile(n_steps, (bwd_start, opt_start) if training else (), training,
                        category=cat_a)


def _backward(step: Step, storage, made, root, add, use, bwd_start: int, loss_end: int,
              last: int) -> None:
    """Gradients, saved tensors and backward workspaces (see the module docstring)."""
    grad: dict[str, int] = {}   # root value -> its gradient's storage
    params = {root(p) for p in step.params}

    def grad_of(name: str, meta: TensorMeta, at: int) -> int:
        r = root(name)
        kind = GRADIENTS if r in params else TEMPORARIES
        e = grad.get(r)
        if e is None:
            e = grad[r] = add(meta, at, last if r in params else at, kind)
        else:
            # Another reader's gradient: made, then added to the first, into a
            # new buffer (out of place, as the traced step runs it) except for
            # a parameter's, which accumulates into .grad.
            use(e, at)
            add(meta, at, at, TEMPORARIES)
            if r not in params:
                e = grad[r] = add(meta, at, at, kind)
        return e

    # The loss's backward: each call's result is read by the next one, and
    # the last ones are the outputs' gradients.
    for i, call in enumerate(step.loss_bwd[:-1]):
        for t in tensors(call.out):
            if t.numel > 1:
                add(t, bwd_start + i, bwd_start + i + 1, TEMPORARIES)
    for name in step.loss_outputs:
        meta = step.metas.get(name)
        if meta is not None:
            grad_of(name, meta, loss_end)
    for i, (k, needs, calls) in enumerate(step.backward):
        at = loss_end + 1 + i
        f = step.entries[k]
        outs = [root(o) for o in f.outputs if o]
        out_grads = [grad[o] for o in outs if o in grad]
        for e in out_grads:
            use(e, at)
        args_saved, outs_saved = synthesis.saved_for_backward(f.call, needs)
        srcs = _names(f.sources)
        for a in args_saved:
            for s in (srcs[a] if a < len(srcs) else ()):
                e = storage.get(root(s))
                if e is not None:
                    use(e, at)
        for j in outs_saved:
            if k in made and j < len(made[k]):
                use(made[k][j], at)
        out_numel = tensors(f.call.out)[0].numel if tensors(f.call.out) else -1
        passes = not calls or getattr(f.call.op, "overloadpacket", None) in (aten.add, aten.sub)
        for a, need in enumerate(needs):
            if not need or a >= len(srcs):
                continue
            arg = f.call.args[a] if a < len(f.call.args) else None
            for s in srcs[a]:
                r = root(s)
                meta = step.metas.get(s)
                if meta is None:
                    continue
                if isinstance(arg, TensorMeta):
                    meta = TensorMeta(meta.shape, arg.dtype)
                if r in grad:
                    grad_of(s, meta, at)
                elif passes and out_grads and r not in params and meta.numel == out_numel:
                    grad[r] = out_grads[0]   # the same gradient, handed on
                else:
                    grad_of(s, meta, at)
        for call in calls:
            if call.op in _CONV_BWD:
                _workspace(call, at, add)
            elif call.op in _ATTN_BWD and len(call.args) > 1:
                q = call.args[1]
                if isinstance(q, TensorMeta):
                    add(TensorMeta(q.shape, torch.float32), at, at, WORKSPACE)


def _workspace(call: Call, at: int, add) -> None:
    """cuDNN's workspace during a convolution: its largest operand, capped
    (the fx memory pass's assumption, not measured)."""
    biggest = max(tensors(call.args), key=lambda t: t.numel, default=None)
    if biggest is not None:
        add(biggest, at, at, WORKSPACE, CUDNN_WORKSPACE_CAP)


def _optimizer(step: Step, add, opt_start: int, last: int) -> None:
    """The optimizer's state (the steady state after its first step) and the
    out-of-place results of its kernels."""
    metas = [step.metas[n] for n in step.trainable if n in step.metas]
    if not metas:
        return
    ps = [torch.empty(m.shape, dtype=m.dtype, device="meta") for m in metas]
    for group in optimizers.state_for(step.optimizer, ps):
        for t in group:
            add(TensorMeta(tuple(int(d) for d in t.shape), t.dtype), 0, last, OPTIMIZER_STATE)
    for i, call in enumerate(step.opt_calls):
        name = str(getattr(getattr(call.op, "overloadpacket", call.op), "__name__", ""))
        if name.endswith("_"):
            continue   # in place
        for t in tensors(call.out):
            if t.numel > 1:
                add(t, opt_start + i, last, TEMPORARIES)

