"""The ONNX frontend: an ``.onnx`` file -> the same Graph the torch.fx frontend builds.

    g = predictor.trace("model.onnx", batch_size=64)            # training step
    g = predictor.trace("bert.onnx", batch_size=8, seq_len=128, mode="inference")

Pipeline (one module each: ``onnx_load`` -> ``onnx_ops`` -> here):

1. **Load** with ``onnx`` (weights are never needed: ``load_external_data=False``)
   and check what a corrupt or hostile file could break: the protobuf, the IR
   and opset versions, names read before they are defined, cycles, absurd
   shapes. Every problem is a :class:`FileFormatError` naming the file.
2. **Shapes.** The batch is the first dim of the inputs (a ``dim_param`` such as
   ``"batch"``, or a fixed size); it is bound to the same sentinel batch size
   the fx frontend traces at (a prime no model dim is a multiple of), other
   symbolic dims to ``seq_len`` (or ``dims={"name": size}``). ONNX shape
   inference then runs node by node, with the values of small shape-computing
   tensors (``Shape`` -> ``Gather`` -> ``Concat`` -> ``Reshape``) evaluated by
   ``onnx.reference`` so that every shape is concrete.
3. **Ops.** Each ONNX node becomes the aten call(s) PyTorch would run for it
   (Conv -> ``convolution``, MatMul with a weight (+ bias Add) -> ``mm``/``addmm``,
   batched MatMul -> ``bmm``, ...) and the rows come from the same op-family
   registry as the fx path (``predictor.families``). Views (Reshape, Flatten,
   Squeeze, Expand, a Transpose of the last two dims) and host-side shape
   arithmetic cost nothing; a Transpose that moves other axes is a copy, as
   PyTorch's ``contiguous`` is. Unsupported ops are priced from bytes moved and
   listed on the Graph, never dropped.
4. **Training.** An ONNX file is an inference graph. For ``mode="train"`` the
   loss, backward pass and optimizer step are synthesised with the shared
   rules in ``predictor.frontend.training_synthesis`` (``backward_calls``,
   ``loss_calls``, ``optimizer_calls``): which tensors need a gradient follows
   from the float initializers (the parameters) and the loss; a tensor read by
   several ops accumulates its gradients with adds, as autograd does.

Each distinct call is priced at batch 1, 2 and the sentinel to store its dims
as ``base + slope * batch``, exactly like the fx lowering.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
try:
    import onnx
except ImportError:  # an optional dependency
    from predictor.errors import MissingExtraError
    raise MissingExtraError("onnx", "onnx", "ONNX files") from None
import torch
from onnx import numpy_helper

from predictor import families
from predictor.errors import FileFormatError, InvalidArgumentError
from predictor.io import printable
from predictor.limits import check_batch_size, check_seq_len
from predictor.families import TensorMeta
from predictor.frontend import autocast, onnx_memory, optimizers
from predictor.frontend import training_synthesis as synthesis
from predictor.frontend.training_synthesis import Call
from predictor.frontend.onnx_load import (
    OnnxValue, _ShapeFailure, _bind_inputs, _infer, _node_label, _one_line, _opsets,
    _topological, load,
)
from predictor.frontend.onnx_autocast import OnnxAutocast
from predictor.frontend.onnx_ops import (
    ACT, META, ONNX_OPS, PARAM, _VIEWS, _Ctx, _diff_inputs, _erf_gelus, _Fwd, _host,
    _sdpa_attentions, _unsupported,
)
from predictor.kernels import layout as L
from predictor.optable import Graph, OpTable, check_graph

aten = torch.ops.aten

# Must match predictor.frontend.fx.SENTINEL_BATCH (the lowering's convention).
SENTINEL_BATCH = 1009
MODES = ("train", "inference")
# Tensors up to this size computed from shapes and constants alone are host-side
# arithmetic (data-sized tensors have at least the sentinel batch's 1009 elements).
SHAPE_SIZED = 64

__all__ = ["trace_onnx", "load", "ONNX_OPS", "SENTINEL_BATCH"]


# ============================================================ the graph ==

def _classify(nodes: list[onnx.NodeProto], graph: onnx.GraphProto,
              values: dict[str, OnnxValue]) -> dict[str, str]:
    """PARAM: initializers and what is computed from them alone (folded at load);
    META: shapes and the small arithmetic on them (the sizes feeding Reshape,
    Slice, Expand; an attention scale 1/sqrt(d)), host side in PyTorch; ACT:
    the rest (tensors of the size of the data, such as token ids built from
    shapes, run kernels like any other)."""
    kinds = {i.name: PARAM for i in graph.initializer}
    for inp in graph.input:
        kinds.setdefault(inp.name, ACT)
    for node in nodes:
        srcs = [kinds.get(i, ACT) for i in node.input if i]
        outs = [o for o in node.output if o]
        if node.op_type in ("Shape", "Size") and node.domain in ("", "ai.onnx"):
            kind = META
        elif all(s == PARAM for s in srcs) and not node.op_type.startswith("Random"):
            kind = PARAM
        elif all(s in (PARAM, META) for s in srcs) and all(
                values.get(o) is not None and values[o].shape is not None
                and values[o].numel <= SHAPE_SIZED for o in outs):
            kind = META
        else:
            kind = ACT
        for o in outs:
            kinds[o] = kind
    return kinds


def _tied_initializers(graph: onnx.GraphProto) -> dict[str, str]:
    """Initializers that hold the same weights as an embedding table (possibly
    transposed): exporters untie shared weights (a language model's output
    projection is its word embedding), but training updates one parameter.
    Returns {copy: original}."""
    tables = {n.input[0] for n in graph.node if n.op_type == "Gather" and n.input}
    groups: dict[tuple, list[onnx.TensorProto]] = defaultdict(list)
    for init in graph.initializer:
        if len(init.dims) == 2 and math.prod(init.dims) >= 1024 and init.data_type in (
                onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16,
                onnx.TensorProto.DOUBLE) \
                and not onnx.external_data_helper.uses_external_data(init):
            groups[(init.data_type, tuple(sorted(init.dims)))].append(init)
    tied: dict[str, str] = {}
    for members in groups.values():
        if len(members) < 2 or not any(m.name in tables for m in members):
            continue
        arrays = {}
        for init in members:
            try:
                if init.HasField("raw_data"):  # a view of the bytes, no conversion
                    dt = onnx.helper.tensor_dtype_to_np_dtype(init.data_type)
                    arrays[init.name] = np.frombuffer(init.raw_data, dt).reshape(tuple(init.dims))
                else:
                    arrays[init.name] = numpy_helper.to_array(init)
            except Exception:  # noqa: BLE001 - unreadable data: not tied
                continue
        names = list(arrays)
        for i, a in enumerate(names):
            if a in tied:
                continue
            x = arrays[a]
            if not np.any(x[:4, :4]):
                continue  # zero-initialised: equal by accident, not tied
            for b in names[i + 1:]:
                y = arrays[b]
                # Compare a corner first: almost every pair differs there.
                if y.shape == x.shape and np.array_equal(x[:4, :4], y[:4, :4]) \
                        and np.array_equal(x, y):
                    tied[b] = a
                elif y.shape == x.shape[::-1] and np.array_equal(x[:4, :4], y[:4, :4].T) \
                        and np.array_equal(x, y.T):
                    tied[b] = a
    return tied


def _flat_sources(sources: tuple) -> list[str]:
    out = []
    for s in sources:
        if isinstance(s, tuple):
            out.extend(x for x in s if x)
        elif s:
            out.append(s)
    return out


def _needs(sources: tuple, grad: set) -> tuple:
    return tuple(any(x in grad for x in s if x) if isinstance(s, tuple) else (s in grad)
                 for s in sources)


@dataclass
class _Lowered:
    forward: list[Call]
    backward: list[Call]
    optimizer: list[Call]
    unsupported: dict[str, int]
    params: int
    trainable: int
    param_bytes: int
    host_ops: list[int]   # aten ops the host dispatches per phase, views included
    step: onnx_memory.Step   # what the memory pass reads


def _lower(model: onnx.ModelProto, nodes: list[onnx.NodeProto], values: dict[str, OnnxValue],
           p: Path, *, train: bool, optimizer: str | None, loss: str,
           amp: str | None = None) -> _Lowered:
    graph = model.graph
    kinds = _classify(nodes, graph, values)
    # Mixed precision: the forward calls under CUDA's autocast policy (casts as calls).
    policy = OnnxAutocast(amp, values, kinds) if amp is not None else None
    consumers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
    for node in nodes:
        for i in node.input:
            if i:
                consumers[i].append(node)
    ctx = _Ctx(values, kinds, train, _opsets(model).get("", 1), p, consumers)
    fwd: list[_Fwd] = []
    unsupported: dict[str, int] = {}
    views = 0
    # Where gradients flow, in node order: (inputs, outputs) of every call, and
    # of every view or identity (no kernel, but its output's gradient is its input's).
    edges: list[tuple[tuple[str, ...], tuple[str, ...]]] = []
    aliases: dict[str, str] = {}   # a view or identity -> the value whose storage it shares

    def passthrough(node: onnx.NodeProto, inputs: list[int]) -> None:
        edges.append((tuple(node.input[i] for i in inputs), (node.output[0],)))
        if inputs and node.input[inputs[0]]:
            aliases[node.output[0]] = node.input[inputs[0]]
        if policy is not None and inputs:
            policy.view(node.input[inputs[0]], node.output[0])

    gelu = _erf_gelus(nodes, ctx)
    attention = _sdpa_attentions(nodes, ctx)
    # Dead code (nothing reaches an output, e.g. a causal mask a fused attention
    # replaced) runs no kernel, as in any ONNX runtime.
    reads = {**{k: tuple(_flat_sources(f.sources)) for k, f in attention.items()},
             **{k: (x,) for k, (x, _) in gelu.items()}}
    live = {o.name for o in graph.output}
    alive: set[int] = set()
    for node in reversed(nodes):
        if id(node) not in ctx.skip and any(o in live for o in node.output if o):
            alive.add(id(node))
            live.update(i for i in reads.get(id(node), node.input) if i)
    for node in nodes:
        if id(node) in ctx.skip or id(node) not in alive:
            continue
        outs = [o for o in node.output if o]
        if all(kinds.get(o) in (PARAM, META) for o in outs):
            # Folded constants and shape arithmetic: no kernel. A parameter's
            # gradient still flows through a view of it (W^T feeding a MatMul).
            if any(kinds.get(o) == PARAM for o in outs):
                passthrough(node, _diff_inputs(node, values))
            continue
        domain = "" if node.domain in ("", "ai.onnx") else node.domain
        # Shown in tables and messages: control characters escaped, length capped
        # (a known op's name is unchanged by both).
        key = printable(node.op_type if not domain else f"{domain}.{node.op_type}", 100)
        if any(values.get(o) is None or values[o].shape is None for o in outs) or any(
                i and (values.get(i) is None or values[i].shape is None) for i in node.input):
            label = f"{key}(shape unknown)"
            mapped = _unsupported(ctx, node, label)
            unsupported[label] = unsupported.get(label, 0) + 1
        elif id(node) in attention:
            mapped = [attention[id(node)]]
        elif id(node) in gelu:
            x, y = gelu[id(node)]
            mapped = [_Fwd(Call(aten.gelu.default, (ctx.t(x),), out=ctx.t(y),
                                kind="elementwise"), (x,), (y,))]
        elif (node.op_type in _VIEWS and not domain) or id(node) in ctx.views:
            views += 1
            passthrough(node, [0])
            if node.op_type == "Expand" and values[node.input[0]].shape != values[outs[0]].shape:
                # An expand is a view; its gradient is a sum over the broadcast dims.
                mapped = [_Fwd(Call(aten.expand.default, (ctx.t(node.input[0]),),
                                    out=ctx.t(outs[0])), (node.input[0],), (outs[0],), free=True)]
            else:
                continue
        elif ONNX_OPS.get(key) is None or any(
                a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                for a in node.attribute):
            mapped = _unsupported(ctx, node, key)
            unsupported[key] = unsupported.get(key, 0) + 1
        else:
            try:
                mapped = ONNX_OPS[key](ctx, node)
            except (KeyError, IndexError, TypeError, ValueError, AttributeError,
                    ArithmeticError) as exc:
                raise FileFormatError(
                    f"{p}: cannot read node {_node_label(node)}: {_one_line(exc)}") from None
            if not mapped:
                # An identity (Dropout at inference, a same-type Cast): the gradient passes.
                views += 1
                if node.input and node.input[0]:
                    passthrough(node, [0])
                continue
        if policy is not None:
            mapped = [g for f in mapped for g in policy.apply(f)]
        for f in mapped:
            edges.append((tuple(_flat_sources(f.sources)), tuple(f.outputs)))
            if f.free and f.outputs and f.sources and isinstance(f.sources[0], str):
                aliases[f.outputs[0]] = f.sources[0]
        fwd.extend(mapped)

    # Parameters: float initializers (not scalars: those are constants) that
    # some op differentiates through; a tied copy is a view of its original.
    init_names = {i.name for i in graph.initializer}
    tied = _tied_initializers(graph)
    edges[:0] = [((orig,), (copy,)) for copy, orig in tied.items()]
    aliases.update(tied)
    diff_params: set[str] = set()
    for node in nodes:
        for i in _diff_inputs(node, values):
            name = node.input[i]
            if name in init_names and values[name].numel > 1:
                diff_params.add(tied.get(name, name))
    n_params = sum(values[n].numel for n in diff_params)
    n_bytes = sum(values[n].numel * values[n].dtype.itemsize for n in diff_params)
    forward = [f.call for f in fwd if not f.free]
    # Host ops: every call, every view (a free entry is a view too), and the
    # kernel-free ops eager PyTorch adds around each call.
    views += sum(1 for f in fwd if f.free)
    host_fwd = len(forward) + views + sum(_host(f, train)[0] for f in fwd)
    step = _memory_step(graph, fwd, aliases, values, diff_params, tied, policy)
    if not train:
        return _Lowered(forward, [], [], unsupported, n_params, 0, n_bytes, [host_fwd, 0, 0],
                        step)

    # ---- which tensors carry a gradient: reachable from a parameter, and the loss from them.
    def floating(name: str) -> bool:
        v = values.get(name)
        return v is not None and v.dtype.is_floating_point

    requires = set(diff_params)
    for ins, outs in edges:
        if any(i in requires for i in ins):
            requires.update(o for o in outs if floating(o))
    out_names = [o.name for o in graph.output if o.name in requires
                 and values[o.name].shape is not None]
    loss_outputs = out_names[:1] if loss == "mean" else out_names
    contrib = set(loss_outputs)
    for ins, outs in reversed(edges):
        if any(o in contrib for o in outs):
            contrib.update(ins)
    grad = requires & contrib

    loss_metas = [ctx.t(o) for o in loss_outputs]
    if policy is not None:  # the outputs in the dtypes autocast left them in
        loss_metas = [TensorMeta(t.shape, policy.dtype_of(o, t))
                      for o, t in zip(loss_outputs, loss_metas)]
    loss_fwd, loss_bwd = synthesis.loss_calls(loss_metas, loss, autocast=policy is not None) \
        if loss_outputs else ([], [])
    scaling = amp == "fp16" and bool(loss_fwd)
    if scaling:  # GradScaler: the loss times the scale, and its backward
        scalar = families.tensors(loss_fwd[-1].out)[0]
        loss_fwd.append(Call(aten.mul.Tensor, (scalar, TensorMeta((), torch.float32)),
                             out=scalar))
        loss_bwd.insert(1, Call(aten.mul.Tensor, (scalar, TensorMeta((), torch.float32)),
                                out=scalar))
    backward: list[Call] = list(loss_bwd)
    host_bwd = views + (1 if loss == "mean" and loss_bwd else 0)  # the mean's expand
    for k in range(len(fwd) - 1, -1, -1):
        f = fwd[k]
        if any(o in grad for o in f.outputs):
            needs = _needs(f.sources, grad)
            calls = synthesis.backward_calls(f.call, needs)
            backward.extend(calls)
            host_bwd += _host(f, True, needs)[1]
            step.backward.append((k, needs, calls))
    # A tensor read by k ops that each send it a gradient: k - 1 accumulating adds.
    uses: dict[str, int] = defaultdict(int)
    for ins, outs in edges:
        if any(o in grad for o in outs):
            for i in set(ins):
                if i in grad:
                    uses[i] += 1
    for name, k in uses.items():
        if k > 1:
            t = ctx.t(name)
            backward.extend([Call(aten.add.Tensor, (t, t), out=t)] * (k - 1))
    trainable = sorted(n for n in diff_params if n in grad)
    if train and not trainable:
        # As the fx path says it: a step with nothing to update is no training step.
        raise InvalidArgumentError(
            f"{p}: no trainable parameters (no float initializer the loss depends "
            "on), so a training step has nothing to update; predict its forward pass "
            "instead (--inference, mode='inference')")
    opt = synthesis.optimizer_calls([ctx.t(n) for n in trainable], optimizer)
    if scaling and trainable:
        unscale, update = synthesis.grad_scaler_calls([ctx.t(n) for n in trainable])
        opt = unscale + opt + update
    n_train = sum(values[n].numel for n in trainable)
    # A cross entropy per output also flattens it (a view) and keeps its
    # log_softmax (a detach) in the forward, and does both again in the
    # backward, as the fx trace records them.
    ce_host = 2 * sum(1 for c in loss_fwd if c.op is aten._log_softmax.default)
    host = [host_fwd + len(loss_fwd) + ce_host, host_bwd + len(backward) + ce_host, len(opt)]
    step.loss_fwd, step.loss_bwd, step.loss_outputs = loss_fwd, loss_bwd, list(loss_outputs)
    for name, meta in zip(loss_outputs, loss_metas):
        step.metas[name] = meta
    step.trainable, step.optimizer, step.opt_calls = trainable, optimizer, opt
    return _Lowered(forward + loss_fwd, backward, opt, unsupported, n_params, n_train, n_bytes,
                    host, step)


def _memory_step(graph: onnx.GraphProto, fwd: list[_Fwd], aliases: dict[str, str],
                 values: dict[str, OnnxValue], params: set[str], tied: dict[str, str],
                 policy: OnnxAutocast | None) -> onnx_memory.Step:
    """The forward half of what the memory pass reads; `_lower` adds the rest."""
    metas = {n: TensorMeta(tuple(v.shape), v.dtype) for n, v in values.items()
             if v is not None and v.shape is not None}
    if policy is not None:   # values whose dtype autocast changed
        metas = {n: TensorMeta(m.shape, policy.dtype_of(n, m)) for n, m in metas.items()}
    inits = [i.name for i in graph.initializer]
    buffers = [n for n in inits if n not in params and n not in tied
               and n in metas and metas[n].numel > SHAPE_SIZED]
    init_names = set(inits)
    inputs = [i.name for i in graph.input if i.name not in init_names]
    return onnx_memory.Step(entries=fwd, aliases=aliases, metas=metas, params=set(params),
                            buffers=buffers, inputs=inputs,
                            outputs=[o.name for o in graph.output],
                            amp=policy.amp if policy is not None else None)


# ============================================================ 5. rows ==

def _scale(x: Any, sentinel: int | None, batch: int) -> Any:
    if isinstance(x, TensorMeta):
        return TensorMeta(tuple(_scale_dim(d, sentinel, batch) for d in x.shape), x.dtype,
                          x.transposed, x.channels_last, x.contiguous)
    if isinstance(x, bool):
        return x
    if isinstance(x, int):
        return _scale_dim(x, sentinel, batch)
    if isinstance(x, list):
        return [_scale(i, sentinel, batch) for i in x]
    if isinstance(x, tuple):
        return tuple(_scale(i, sentinel, batch) for i in x)
    return x


def _scale_dim(d: int, sentinel: int | None, batch: int) -> int:
    if sentinel is None or d == 0 or d % sentinel:
        return d
    return d // sentinel * batch


def _rows_at(call: Call, sentinel: int | None, batch: int):
    c = Call(call.op, _scale(call.args, sentinel, batch), _scale(call.kwargs, sentinel, batch),
             _scale(call.out, sentinel, batch), call.kind, call.name, call.tag)
    return synthesis.call_rows(c)


def _key(x: Any) -> Any:
    if isinstance(x, list):
        return ("L",) + tuple(_key(i) for i in x)
    if isinstance(x, tuple):
        return tuple(_key(i) for i in x)
    if isinstance(x, float) and math.isnan(x):
        return "nan"
    return x


def _affine(call: Call, sentinel: int | None, batch: int):
    """(rows as (family, base, slope, kernels), unsupported?, affine?) - the fx
    lowering's rule: extract at batch 1 and 2, check at the sentinel, take
    kernel counts at the requested batch."""
    if sentinel is None:
        rows, bad = synthesis.call_rows(call)
        return [(f, tuple(d), (0,) * len(d), k) for f, d, k in rows], bad, True
    r1, bad = _rows_at(call, sentinel, 1)
    r2, _ = _rows_at(call, sentinel, 2)
    rs, _ = synthesis.call_rows(call)
    rb, _ = _rows_at(call, sentinel, batch)
    out = []
    affine = len(r1) == len(r2) == len(rs) == len(rb)
    if affine:
        for (f1, d1, _), (f2, d2, _), (fs, ds, _), (_, _, kb) in zip(r1, r2, rs, rb):
            slope = tuple(b - a for a, b in zip(d1, d2))
            base = tuple(a - s for a, s in zip(d1, slope))
            if f1 != f2 or f1 != fs or any(b + s * sentinel != x
                                           for b, s, x in zip(base, slope, ds)):
                affine = False
                break
            out.append((f1, base, slope, kb))
    if not affine:
        out = [(f, tuple(d), (0,) * len(d), k) for f, d, k in rb]
    return out, bad, affine


def _call_dtype(call: Call) -> int:
    """A row's dtype, as the fx lowering gives it (``families.row_dtype_code``)."""
    return families.row_dtype_code(families.tensors(call.args) + families.tensors(call.out))


def _table(phases: list[list[Call]], sentinel: int | None, batch: int, p: Path
           ) -> tuple[OpTable, bool]:
    cache: dict[Any, tuple] = {}
    rows: dict[tuple, int] = {}
    names: list[str] = []
    index: dict[str, int] = {}
    scalable = True
    for phase, calls in enumerate(phases):
        for call in calls:
            key = (call.op, call.kind, call.name, call.tag, _key(call.args), _key(call.kwargs),
                   _key(call.out))
            hit = cache.get(key)
            if hit is None:
                try:
                    hit = _affine(call, sentinel, batch) + (_call_dtype(call),)
                except (ArithmeticError, TypeError, ValueError, IndexError) as exc:
                    raise FileFormatError(
                        f"{p}: cannot price {call.op_name} on shapes "
                        f"{[list(t.shape) for t in families.tensors(call.args)][:3]}: "
                        f"{_one_line(exc)}") from None
                cache[key] = hit
            extracted, _, affine, dt = hit
            scalable &= affine
            name = call.op_name
            if name not in index:
                index[name] = len(names)
                names.append(name)
            for fam, base, slope, kern in extracted:
                k = (fam, phase, dt, kern, base, slope, index[name])
                rows[k] = rows.get(k, 0) + 1
    return OpTable.from_rows(rows, names, where=str(p)), scalable


# ============================================================ the entry point ==

def trace_onnx(path: str | Path, *, batch_size: int | None = None, seq_len: int | None = None,
               mode: str = "train", optimizer: str | None = "adam", loss: str = "mean",
               dims: dict[str, int] | None = None, name: str | None = None,
               amp: str | None = None) -> Graph:
    """Build a Graph from an ONNX file (see the module docstring).

    batch_size: the batch to report and check (default: the file's fixed batch,
        else 1). A symbolic first input dim makes the graph valid at any batch.
    seq_len: the size of every other symbolic input dim (sequence length);
        `dims` names sizes one by one instead ({"sequence": 128}).
    mode: "train" synthesises loss, backward and optimizer; "inference" does not.
    loss: "mean" (of the first output, the fx frontend's default) or
        "cross_entropy" (one per floating output, over its last dim).
    amp: "bf16" or "fp16": the step as ``torch.autocast("cuda", dtype)`` runs
        the fp32 model (predictor.frontend.onnx_autocast; fp16 adds the
        GradScaler's kernels); None: every op in the file's own dtypes.
    """
    start = time.perf_counter()
    if mode not in MODES:
        raise InvalidArgumentError(f"mode must be 'train' or 'inference', got {mode!r}")
    optimizer = optimizers.check(optimizer) if mode == "train" else None
    amp = autocast.check(amp)
    if batch_size is not None:
        batch_size = check_batch_size(batch_size)
    if seq_len is not None:
        seq_len = check_seq_len(seq_len)
    if callable(loss):
        raise InvalidArgumentError(
            f"{path}: an ONNX model takes a loss by name ('mean' or 'cross_entropy'), "
            "not a function")
    if loss not in synthesis.LOSSES:
        raise InvalidArgumentError(
            f"unknown loss {loss!r} for an ONNX model; choose one of {', '.join(synthesis.LOSSES)}")
    dims = dict(dims or {})
    for k, v in dims.items():
        check_seq_len(v, f"dims[{k!r}]")
    p = Path(path)
    model = load(p)
    nodes = _topological(model.graph, p)
    # Trace at the sentinel batch when the model lets us; else at its own batch.
    sentinel: int | None = SENTINEL_BATCH
    shapes, elems, file_batch = _bind_inputs(model.graph, p, SENTINEL_BATCH, seq_len, dims)
    if not shapes:
        raise FileFormatError(f"{p}: the model has no inputs")
    try:
        values = _infer(nodes, model, p, shapes, elems, strict=False)
        batch = batch_size or file_batch or 1
    except _ShapeFailure:
        sentinel = None
        shapes, elems, file_batch = _bind_inputs(model.graph, p, None, seq_len, dims)
        values = _infer(nodes, model, p, shapes, elems, strict=True)
        batch = file_batch or 1
        if batch_size is not None and batch_size != batch:
            raise InvalidArgumentError(
                f"{p}: the model only runs at batch {batch} (its shapes do not scale with the "
                "batch); export it with a dynamic batch axis (torch.onnx.export(..., "
                "dynamic_axes={'input': {0: 'batch'}})) to predict other batch sizes")
    if amp == "fp8":
        raise InvalidArgumentError(
            f"{p}: amp='fp8' converts a PyTorch model's nn.Linear layers to float8 (torchao's "
            "recipe), which an ONNX graph does not have; use amp='bf16', or trace the "
            "PyTorch model")
    if amp is not None:
        halves = sorted({onnx.TensorProto.DataType.Name(i.data_type) for i in
                         model.graph.initializer if i.data_type in (
                             onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)})
        if halves:
            raise InvalidArgumentError(
                f"{p}: amp={amp!r} applies to an fp32 model, and this file holds "
                f"{'/'.join(halves)} weights (exported in half precision); trace it without "
                "amp, or export the fp32 model")
    lowered = _lower(model, nodes, values, p, train=mode == "train", optimizer=optimizer,
                     loss=loss, amp=amp)
    table, scalable = _table([lowered.forward, lowered.backward, lowered.optimizer], sentinel,
                             batch, p)
    memory, memory_note = None, None
    try:
        memory = onnx_memory.profile(lowered.step, sentinel, training=mode == "train")
    except (ArithmeticError, TypeError, ValueError, IndexError, KeyError, AttributeError) as exc:
        # Peak memory is an addition to the time prediction: without it the
        # prediction stands, and the commands say that memory is not checked.
        memory_note = f"peak memory could not be derived from {p.name}: {_one_line(exc)}"
    graph = Graph(
        name=name or p.stem, ops=table, memory=memory, batch_size=batch, mode=mode,
        optimizer=optimizer,
        seq_len=seq_len, parameters=lowered.params, trainable_parameters=lowered.trainable,
        parameter_bytes=lowered.param_bytes, unsupported=dict(lowered.unsupported),
        batch_scalable=scalable and sentinel is not None,
        trace_seconds=time.perf_counter() - start, torch_version=torch.__version__, amp=amp)
    _set_host_ops(graph, lowered)
    graph = check_graph(graph, str(p))  # what the kernels can take, or a clear error
    # One-line notes the CLI prints (as the fx frontend's graph.notes).
    graph.notes = [n for n in (folded_norm_note(nodes) if mode == "train" else None,
                               memory_note) if n]
    return graph


# Normalisation ops an exporter writes (ai.onnx and com.microsoft's fused ones).
NORM_OPS = {"BatchNormalization", "LayerNormalization", "InstanceNormalization",
            "GroupNormalization", "RMSNormalization", "SimplifiedLayerNormalization",
            "SkipLayerNormalization", "SkipSimplifiedLayerNormalization", "LpNormalization",
            "MeanVarianceNormalization"}


def folded_norm_note(nodes: list[onnx.NodeProto]) -> str | None:
    """A note when a graph looks exported with batch norm folded into its
    convolutions (eval mode, or the dynamo exporter): at least two
    convolutions, every one with a bias, and no normalisation op. A training
    prediction of such a file leaves batch norm out."""
    convs = [n for n in nodes if n.op_type in ("Conv", "ConvTranspose") and n.domain in ("", "ai.onnx")]
    if len(convs) < 2 or any(n.op_type in NORM_OPS for n in nodes):
        return None
    if not all(len(n.input) > 2 and n.input[2] for n in convs):
        return None
    return (f"no normalisation op, and all {len(convs)} convolutions have a bias, as when batch "
            "norm is folded into them at export (eval mode, or the dynamo exporter): if the model "
            "trains with batch norm, this training prediction leaves it out; export with "
            "torch.onnx.export(..., dynamo=False, training=torch.onnx.TrainingMode.TRAINING)")


def _set_host_ops(graph: Graph, lowered: _Lowered) -> None:
    """Host-side op counts per phase, where the Graph records them (predictor.overhead)."""
    if hasattr(graph, "host_ops"):
        graph.host_ops = list(lowered.host_ops)
