"""The ONNX frontend: an ``.onnx`` file -> the same Graph the torch.fx frontend builds.

    g = predictor.trace("model.onnx", batch_size=64)            # training step
    g = predictor.trace("bert.onnx", batch_size=8, seq_len=128, mode="inference")

Pipeline:

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
   rules in ``predictor.families`` (``backward_calls``, ``loss_calls``,
   ``optimizer_calls``): which tensors need a gradient follows from the float
   initializers (the parameters) and the loss; a tensor read by several ops
   accumulates its gradients with adds, as autograd does.

Each distinct call is priced at batch 1, 2 and the sentinel to store its dims
as ``base + slope * batch``, exactly like the fx lowering.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import onnx
import torch
from onnx import numpy_helper

from predictor import families
from predictor.errors import FileFormatError, InvalidArgumentError
from predictor.families import Call, T
from predictor.kernels import layout as L
from predictor.optable import Graph, OpTable

aten = torch.ops.aten

# Must match predictor.frontend.fx.SENTINEL_BATCH (the lowering's convention).
SENTINEL_BATCH = 1009
MODES = ("train", "inference")

# Tensors up to this many elements get their values computed (shape arithmetic).
VALUE_LIMIT = 1 << 16
# No real tensor has more elements than this (2^50 fp32 = 4 PiB); more is a hostile file.
MAX_NUMEL = 1 << 50
MAX_DIM = 1 << 40

_DTYPES = {
    onnx.TensorProto.FLOAT: torch.float32, onnx.TensorProto.FLOAT16: torch.float16,
    onnx.TensorProto.BFLOAT16: torch.bfloat16, onnx.TensorProto.DOUBLE: torch.float64,
    onnx.TensorProto.INT64: torch.int64, onnx.TensorProto.INT32: torch.int32,
    onnx.TensorProto.INT16: torch.int16, onnx.TensorProto.INT8: torch.int8,
    onnx.TensorProto.UINT8: torch.uint8, onnx.TensorProto.BOOL: torch.bool,
    onnx.TensorProto.UINT16: torch.int32, onnx.TensorProto.UINT32: torch.int64,
    onnx.TensorProto.UINT64: torch.int64,
}
for _name in ("FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2", "FLOAT8E5M2FNUZ"):
    if hasattr(onnx.TensorProto, _name) and hasattr(torch, "float8_e4m3fn"):
        _DTYPES[getattr(onnx.TensorProto, _name)] = torch.float8_e4m3fn


def _torch_dtype(elem_type: int) -> torch.dtype:
    return _DTYPES.get(elem_type, torch.float32)


def _one_line(exc: BaseException) -> str:
    msg = " ".join(str(exc).split())
    if len(msg) > 240:
        msg = msg[:237] + "..."
    return msg or type(exc).__name__


# ============================================================ 1. loading ==

def load(path: str | Path) -> onnx.ModelProto:
    """Read and sanity-check an ONNX file (no weights are loaded from external data)."""
    p = Path(path)
    if not p.exists():
        raise FileFormatError(f"{p}: no such ONNX file")
    if not p.is_file():
        raise FileFormatError(f"{p}: not a file")
    try:
        size = p.stat().st_size
    except OSError as exc:
        raise FileFormatError(f"{p}: cannot read ({exc.strerror or exc})") from None
    if size == 0:
        raise FileFormatError(f"{p}: empty file, not an ONNX model")
    try:
        model = onnx.load(str(p), load_external_data=False)
    except OSError as exc:
        raise FileFormatError(f"{p}: cannot read ({exc.strerror or exc})") from None
    except Exception as exc:  # noqa: BLE001 - protobuf raises DecodeError, RuntimeError, ...
        raise FileFormatError(
            f"{p}: not a valid ONNX model (protobuf parse failed: {_one_line(exc)})") from None
    _check_model(model, p)
    if len(model.functions):
        try:
            from onnx import inliner
            model = inliner.inline_local_functions(model)
        except Exception as exc:  # noqa: BLE001
            raise FileFormatError(f"{p}: cannot inline its local functions ({_one_line(exc)})") \
                from None
    return model


def _check_model(model: onnx.ModelProto, p: Path) -> None:
    if not model.HasField("graph") or (not len(model.graph.node) and not len(model.graph.output)):
        raise FileFormatError(f"{p}: not an ONNX model (no graph in the file)")
    if model.ir_version <= 0:
        raise FileFormatError(f"{p}: not an ONNX model (no IR version)")
    if model.ir_version > onnx.IR_VERSION:
        raise FileFormatError(
            f"{p}: ONNX IR version {model.ir_version} is newer than this onnx package reads "
            f"(up to {onnx.IR_VERSION}); upgrade onnx or export with an older version")
    default = [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")]
    if not default:
        raise FileFormatError(f"{p}: the model declares no ai.onnx opset")
    newest = onnx.defs.onnx_opset_version()
    if default[0] > newest or default[0] < 1:
        raise FileFormatError(
            f"{p}: unsupported ai.onnx opset {default[0]} (this onnx package knows 1..{newest})")


def _opsets(model: onnx.ModelProto) -> dict[str, int]:
    out = {}
    for o in model.opset_import:
        out["" if o.domain == "ai.onnx" else o.domain] = int(o.version)
    return out


def _topological(graph: onnx.GraphProto, p: Path) -> list[onnx.NodeProto]:
    """Nodes in dependency order (Kahn's algorithm, preferring the file's own
    order); a cycle, a value defined twice or a read of an undefined name is an error."""
    import heapq

    defined = {i.name for i in graph.initializer} | {i.name for i in graph.input}
    producer: dict[str, int] = {}
    for idx, node in enumerate(graph.node):
        for o in node.output:
            if not o:
                continue
            if o in producer or o in defined:
                raise FileFormatError(
                    f"{p}: value {o!r} is defined twice (node {_node_label(node)})")
            producer[o] = idx
    indeg = [0] * len(graph.node)
    users: dict[int, list[int]] = defaultdict(list)
    for idx, node in enumerate(graph.node):
        for i in node.input:
            if not i or i in defined:
                continue
            src = producer.get(i)
            if src is None:
                raise FileFormatError(
                    f"{p}: node {_node_label(node)} reads {i!r}, which no node, input or "
                    "initializer defines")
            indeg[idx] += 1
            users[src].append(idx)
    heap = [i for i, d in enumerate(indeg) if d == 0]
    heapq.heapify(heap)
    order: list[onnx.NodeProto] = []
    while heap:
        idx = heapq.heappop(heap)
        order.append(graph.node[idx])
        for u in users[idx]:
            indeg[u] -= 1
            if indeg[u] == 0:
                heapq.heappush(heap, u)
    if len(order) != len(graph.node):
        stuck = next(graph.node[i] for i, d in enumerate(indeg) if d > 0)
        raise FileFormatError(f"{p}: the graph has a cycle (through node {_node_label(stuck)})")
    return order


def _node_label(node: onnx.NodeProto) -> str:
    return f"{node.name!r} ({node.op_type})" if node.name else f"{node.op_type}"


# ============================================================ 2. shapes ==

@dataclass
class _Value:
    shape: tuple[int, ...] | None
    elem: int
    data: np.ndarray | None = None

    @property
    def dtype(self) -> torch.dtype:
        return _torch_dtype(self.elem)

    @property
    def numel(self) -> int:
        return math.prod(self.shape) if self.shape is not None else 0


class _ShapeFailure(Exception):
    """Shape inference failed (tried again without the sentinel batch)."""


def _data_inputs(graph: onnx.GraphProto) -> list[onnx.ValueInfoProto]:
    inits = {i.name for i in graph.initializer}
    return [i for i in graph.input if i.name not in inits]


def _batch_symbol(inputs: list[onnx.ValueInfoProto]) -> str | None:
    """The dim_param that is the batch: one named like a batch anywhere, else
    the first input's first dim when it is symbolic."""
    first = None
    for k, inp in enumerate(inputs):
        if not inp.type.HasField("tensor_type"):
            continue
        for axis, d in enumerate(inp.type.tensor_type.shape.dim):
            if d.dim_param and "batch" in d.dim_param.lower():
                return d.dim_param
            if k == 0 and axis == 0 and d.dim_param:
                first = d.dim_param
    return first


def _bind_inputs(graph: onnx.GraphProto, p: Path, batch: int | None, seq_len: int | None,
                 dims: dict[str, int]) -> tuple[dict[str, tuple[int, ...]], dict[str, int],
                                                 int | None]:
    """Concrete input shapes: the batch set to `batch` (None: keep the file's),
    other symbols from `dims` / `seq_len`. Returns (shapes, elem types, the
    file's own batch when it is fixed)."""
    inputs = _data_inputs(graph)
    symbol = _batch_symbol(inputs)
    shapes: dict[str, tuple[int, ...]] = {}
    elems: dict[str, int] = {}
    file_batch = None
    for k, inp in enumerate(inputs):
        tt = inp.type.tensor_type if inp.type.HasField("tensor_type") else None
        if tt is None:
            raise FileFormatError(
                f"{p}: input {inp.name!r} is not a tensor (sequences, maps and optionals "
                "are not supported as model inputs)")
        if not tt.HasField("shape"):
            raise FileFormatError(f"{p}: input {inp.name!r} has no shape; re-export it with one")
        out = []
        for axis, d in enumerate(tt.shape.dim):
            if d.HasField("dim_value"):
                v = int(d.dim_value)
                # No batch symbol: the first input's first dim is the batch, and
                # every input whose first dim has the same size.
                if symbol is None and axis == 0:
                    if k == 0:
                        file_batch = v
                    if batch is not None and v == file_batch:
                        v = batch
            elif symbol is not None and d.dim_param == symbol:
                v = batch if batch is not None else 1
            elif d.dim_param and d.dim_param in dims:
                v = dims[d.dim_param]
            elif seq_len is not None:
                v = seq_len
            else:
                what = f"symbolic dim {d.dim_param!r}" if d.dim_param else "an unnamed dim"
                raise InvalidArgumentError(
                    f"{p}: input {inp.name!r} has {what} (axis {axis}); give its size with "
                    "seq_len= (--seq-len) or dims={name: size}")
            if v < 0 or v > MAX_DIM:
                raise FileFormatError(
                    f"{p}: input {inp.name!r} has an absurd dim {v} (axis {axis})")
            out.append(v)
        shapes[inp.name] = tuple(out)
        elems[inp.name] = tt.elem_type
    return shapes, elems, file_batch


def _initializer_values(graph: onnx.GraphProto, p: Path) -> dict[str, _Value]:
    values = {}
    for init in graph.initializer:
        shape = tuple(int(d) for d in init.dims)
        _check_shape(shape, init.name, p)
        data = None
        if math.prod(shape) <= VALUE_LIMIT and init.data_type not in (
                onnx.TensorProto.STRING, onnx.TensorProto.UNDEFINED):
            try:
                if not onnx.external_data_helper.uses_external_data(init):
                    data = numpy_helper.to_array(init)
            except Exception:  # noqa: BLE001 - a malformed small tensor: no value, shape only
                data = None
        values[init.name] = _Value(shape, init.data_type, data)
    return values


def _check_shape(shape: tuple[int, ...], name: str, p: Path) -> None:
    n = 1
    for d in shape:
        if d < 0 or d > MAX_DIM:
            raise FileFormatError(f"{p}: tensor {name!r} has an absurd shape {list(shape)}")
        n *= d
    if n > MAX_NUMEL:
        raise FileFormatError(
            f"{p}: tensor {name!r} has {n:.3g} elements (shape {list(shape)}); that is not a "
            "real model")


def _type_of(v: _Value) -> onnx.TypeProto:
    t = onnx.TypeProto()
    t.tensor_type.elem_type = v.elem or onnx.TensorProto.FLOAT
    if v.shape is not None:
        shp = t.tensor_type.shape
        shp.SetInParent()
        for d in v.shape:
            shp.dim.add().dim_value = d
    return t


def _value_from_type(tp: onnx.TypeProto) -> _Value | None:
    if not tp.HasField("tensor_type"):
        return None
    tt = tp.tensor_type
    if not tt.HasField("shape"):
        return _Value(None, tt.elem_type)
    dims = []
    for d in tt.shape.dim:
        if not d.HasField("dim_value"):
            return _Value(None, tt.elem_type)
        dims.append(int(d.dim_value))
    return _Value(tuple(dims), tt.elem_type)


_RUN_PARAMS = {"log": lambda *a: None, "opsets": {}, "verbose": 0, "new_ops": None,
               "existing_functions": {}, "evaluator_cls": None}


def _evaluate(node: onnx.NodeProto, opset: int, inputs: list[np.ndarray | None]):
    from onnx.reference.ops import load_op

    cls = load_op(node.domain, node.op_type, opset)
    params = dict(_RUN_PARAMS, opsets={node.domain: opset})
    op = cls(node, params)
    return op.run(*inputs)


def _infer(nodes: list[onnx.NodeProto], model: onnx.ModelProto, p: Path,
           inputs: dict[str, tuple[int, ...]], elems: dict[str, int],
           strict: bool) -> dict[str, _Value]:
    """Shapes (and small values) of every tensor, node by node."""
    graph = model.graph
    opsets = _opsets(model)
    values = _initializer_values(graph, p)
    for name, shape in inputs.items():
        values[name] = _Value(shape, elems[name])
    declared = {vi.name: vi.type for vi in list(graph.value_info) + list(graph.output)}
    opset_protos = list(model.opset_import)
    for node in nodes:
        domain = "" if node.domain == "ai.onnx" else node.domain
        version = opsets.get(domain)
        ins = [values.get(i) if i else None for i in node.input]
        outs: dict[str, _Value | None] = {}
        schema = None
        if version is not None:
            try:
                schema = onnx.defs.get_schema(node.op_type, version, domain)
            except Exception:  # noqa: BLE001 - SchemaError: an op this onnx does not know
                schema = None
        if node.op_type == "Constant" and domain == "":
            try:
                (data,) = _evaluate(node, version, [])
                data = np.asarray(data)
                outs[node.output[0]] = _Value(tuple(int(d) for d in data.shape),
                                              numpy_helper.from_array(data).data_type,
                                              data if data.size <= VALUE_LIMIT else None)
            except Exception as exc:  # noqa: BLE001
                raise FileFormatError(
                    f"{p}: constant {_node_label(node)} is malformed ({_one_line(exc)})") from None
        elif schema is not None and all(v is not None and v.shape is not None
                                        for i, v in zip(node.input, ins) if i):
            types = {i: _type_of(v) for i, v in zip(node.input, ins) if i}
            data = {}
            for i, v in zip(node.input, ins):
                if i and v is not None and v.data is not None:
                    try:
                        data[i] = numpy_helper.from_array(np.asarray(v.data), i)
                    except Exception:  # noqa: BLE001
                        pass
            try:
                inferred = onnx.shape_inference.infer_node_outputs(
                    schema, node, types, data, opset_imports=opset_protos,
                    ir_version=model.ir_version)
            except Exception as exc:  # noqa: BLE001 - InferenceError and friends
                if strict:
                    raise FileFormatError(
                        f"{p}: shape inference failed at node {_node_label(node)}: "
                        f"{_one_line(exc)}") from None
                raise _ShapeFailure(_node_label(node)) from None
            for o in node.output:
                if o and o in inferred:
                    outs[o] = _value_from_type(inferred[o])
        for o in node.output:
            if not o:
                continue
            v = outs.get(o)
            if (v is None or v.shape is None) and o in declared:
                d = _value_from_type(declared[o])
                if d is not None and d.shape is not None:
                    v = d
            if (v is None or v.shape is None) and schema is None and len(node.output) == 1 \
                    and ins and ins[0] is not None and ins[0].shape is not None:
                # An op this onnx does not know: assume it keeps its input's shape.
                v = _Value(ins[0].shape, ins[0].elem)
            outs[o] = v
        # Values of small tensors: shape arithmetic feeding Reshape, Slice, Expand...
        if domain == "" and node.op_type in ("Shape", "Size") and ins and ins[0] is not None \
                and ins[0].shape is not None:
            shape = ins[0].shape
            if node.op_type == "Size":
                data = np.array(math.prod(shape), dtype=np.int64)
            else:
                start, end = _attr(node, "start", 0), _attr(node, "end", None)
                data = np.array(shape[start:end] if end is not None else shape[start:],
                                dtype=np.int64)
            outs[node.output[0]] = _Value(tuple(data.shape), onnx.TensorProto.INT64, data)
        elif domain == "" and node.op_type != "Constant" and ins and all(
                (v is not None and v.data is not None) for i, v in zip(node.input, ins) if i) \
                and all(v is not None and v.shape is not None and v.numel <= VALUE_LIMIT
                        for v in (outs.get(o) for o in node.output if o)) \
                and not any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                            for a in node.attribute):
            try:
                results = _evaluate(node, version, [v.data if v is not None else None
                                                    for v in ins])
                for o, r in zip(node.output, results):
                    if o and r is not None and outs.get(o) is not None:
                        arr = np.asarray(r)
                        if tuple(arr.shape) == outs[o].shape:
                            outs[o].data = arr
            except Exception:  # noqa: BLE001 - no value, the shape is still known
                pass
        for o, v in outs.items():
            if v is not None and v.shape is not None:
                _check_shape(v.shape, o, p)
            if v is not None:
                values[o] = v
    return values


def _attr(node: onnx.NodeProto, name: str, default: Any = None) -> Any:
    for a in node.attribute:
        if a.name == name:
            v = onnx.helper.get_attribute_value(a)
            return v.decode() if isinstance(v, bytes) else v
    return default


# ============================================================ 3. ops ==

PARAM, META, ACT = "param", "meta", "act"


@dataclass
class _Fwd:
    """One forward aten call and where its tensors come from in the ONNX graph."""

    call: Call
    sources: tuple          # ONNX value feeding each arg (None: not a graph tensor)
    outputs: tuple          # ONNX values the call produces (gradients flow back from them)
    free: bool = False      # a view: no forward kernel, but a backward rule may cost
    host: tuple | None = None  # ("linear", input folded?, bias?): see _host


@dataclass
class _Ctx:
    values: dict[str, _Value]
    kinds: dict[str, str]
    train: bool
    opset: int
    p: Path
    consumers: dict[str, list[onnx.NodeProto]]
    skip: set = field(default_factory=set)   # nodes folded into an earlier call

    def t(self, name: str, shape: tuple | None = None) -> T:
        v = self.values[name]
        return T(tuple(v.shape if shape is None else shape), v.dtype)

    def shape(self, name: str) -> tuple[int, ...]:
        return self.values[name].shape

    def data(self, name: str) -> np.ndarray | None:
        v = self.values.get(name) if name else None
        return None if v is None else v.data

    def is_param(self, name: str) -> bool:
        return self.kinds.get(name) == PARAM


Mapper = Callable[[_Ctx, onnx.NodeProto], list[_Fwd]]
ONNX_OPS: dict[str, Mapper] = {}


def onnx_op(*names: str) -> Callable[[Mapper], Mapper]:
    def wrap(fn: Mapper) -> Mapper:
        for n in names:
            ONNX_OPS[n] = fn
        return fn

    return wrap


def _simple(op: Any, ctx: _Ctx, node, *, kind: str | None = None, name: str | None = None,
            extra: tuple = (), kwargs: tuple = ()) -> list[_Fwd]:
    """One call over all tensor inputs -> all tensor outputs."""
    srcs = [i for i in node.input if i]
    args = tuple(ctx.t(i) for i in srcs) + extra
    outs = [o for o in node.output if o and ctx.values.get(o) is not None]
    out = tuple(ctx.t(o) for o in outs)
    call = Call(op, args, kwargs, out[0] if len(out) == 1 else out, kind=kind, name=name)
    return [_Fwd(call, tuple(srcs) + (None,) * len(extra), tuple(outs))]


# Ops that cost nothing: views, metadata, identities. The gradient of their
# first input is the gradient of their output (a view), nothing is launched.
_VIEWS = {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Expand"}
_NON_DIFF = {"Shape", "Size", "ConstantOfShape", "Range", "NonZero", "ArgMax", "ArgMin",
             "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Not", "And", "Or",
             "Xor", "IsNaN", "IsInf", "Sign", "Floor", "Ceil", "Round", "TopK_indices",
             "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
             "Bernoulli", "Multinomial", "EyeLike", "OneHot"}
# Which inputs of an op carry a gradient (default: every floating input).
_DIFF_INPUTS = {
    "Gather": (0,), "GatherElements": (0,), "GatherND": (0,), "Reshape": (0,), "Expand": (0,),
    "Slice": (0,), "Pad": (0,), "Dropout": (0,), "Tile": (0,), "Resize": (0,), "Upsample": (0,),
    "Split": (0,), "Squeeze": (0,), "Unsqueeze": (0,), "BatchNormalization": (0, 1, 2),
    "Where": (1, 2), "ScatterND": (0, 2), "ScatterElements": (0, 2), "TopK": (0,),
    "LSTM": (0, 1, 2, 3, 5, 6), "CumSum": (0,), "Clip": (0,), "Trilu": (0,),
    "ReduceMean": (0,), "ReduceSum": (0,), "ReduceMax": (0,), "ReduceMin": (0,),
    "ReduceProd": (0,), "ReduceL2": (0,), "ReduceL1": (0,), "ReduceSumSquare": (0,),
    "ReduceLogSumExp": (0,), "Attention": (0, 1, 2), "LayerNormalization": (0, 1, 2),
}

_UNARY = {
    "Relu": aten.relu.default, "Gelu": aten.gelu.default, "Tanh": aten.tanh.default,
    "Sigmoid": aten.sigmoid.default, "Erf": aten.erf.default, "Exp": aten.exp.default,
    "Log": aten.log.default, "Sqrt": aten.sqrt.default, "Reciprocal": aten.reciprocal.default,
    "Neg": aten.neg.default, "Abs": aten.abs.default, "Sin": aten.sin.default,
    "Cos": aten.cos.default, "Softplus": aten.softplus.default,
    "LeakyRelu": aten.leaky_relu.default, "Elu": aten.elu.default, "Selu": aten.elu.default,
    "Celu": aten.elu.default, "HardSigmoid": aten.hardsigmoid.default,
    "HardSwish": aten.hardswish.default, "Mish": aten.mish.default,
    "Floor": aten.floor.default, "Ceil": aten.ceil.default, "Round": aten.round.default,
    "Sign": aten.sign.default, "Not": aten.logical_not.default, "IsNaN": aten.isnan.default,
    "IsInf": aten.isinf.default, "Tan": aten.tan.default, "Asin": aten.asin.default,
    "Acos": aten.acos.default, "Atan": aten.atan.default, "Sinh": aten.sinh.default,
    "Cosh": aten.cosh.default, "Asinh": aten.asinh.default, "Acosh": aten.acosh.default,
    "Atanh": aten.atanh.default, "Softsign": aten.abs.default, "ThresholdedRelu": aten.relu.default,
    "Shrink": aten.relu.default, "BitwiseNot": aten.bitwise_not.default,
    "Swish": aten.silu.default,
}
_BINARY = {
    "Add": aten.add.Tensor, "Sub": aten.sub.Tensor, "Mul": aten.mul.Tensor,
    "Div": aten.div.Tensor, "Pow": aten.pow.Tensor_Tensor, "Equal": aten.eq.Tensor,
    "Less": aten.lt.Tensor, "LessOrEqual": aten.le.Tensor, "Greater": aten.gt.Tensor,
    "GreaterOrEqual": aten.ge.Tensor, "And": aten.logical_and.default,
    "Or": aten.logical_or.default, "Xor": aten.logical_xor.default,
    "Mod": aten.remainder.Tensor, "BitShift": aten.bitwise_left_shift.Tensor,
    "BitwiseAnd": aten.bitwise_and.Tensor, "BitwiseOr": aten.bitwise_or.Tensor,
    "BitwiseXor": aten.bitwise_xor.Tensor, "PRelu": aten.mul.Tensor,
}
_VARIADIC = {"Max": aten.maximum.default, "Min": aten.minimum.default, "Sum": aten.add.Tensor,
             "Mean": aten.add.Tensor}


@onnx_op(*_UNARY)
def _unary(ctx: _Ctx, node) -> list[_Fwd]:
    op = _UNARY[node.op_type]
    kw = ()
    if node.op_type == "Gelu" and _attr(node, "approximate", "none") == "tanh":
        kw = (("approximate", "tanh"),)
    return _simple(op, ctx, node, kind="elementwise", kwargs=kw)


@onnx_op(*_BINARY)
def _binary(ctx: _Ctx, node) -> list[_Fwd]:
    return _simple(_BINARY[node.op_type], ctx, node, kind="elementwise")


@onnx_op(*_VARIADIC)
def _variadic(ctx: _Ctx, node) -> list[_Fwd]:
    srcs = [i for i in node.input if i]
    y = node.output[0]
    op = _VARIADIC[node.op_type]
    if len(srcs) == 1:
        return []
    out = []
    for i, s in enumerate(srcs[1:]):
        left = srcs[0] if i == 0 else None
        call = Call(op, (ctx.t(srcs[0]) if i == 0 else ctx.t(y), ctx.t(s)), out=ctx.t(y),
                    kind="elementwise")
        out.append(_Fwd(call, (left, s), (y,)))
    if node.op_type == "Mean":
        out.append(_Fwd(Call(aten.div.Scalar, (ctx.t(y), len(srcs)), out=ctx.t(y),
                             kind="elementwise"), (None, None), (y,)))
    return out


@onnx_op("Clip")
def _clip(ctx: _Ctx, node) -> list[_Fwd]:
    x = node.input[0]
    call = Call(aten.clamp.default, (ctx.t(x),), out=ctx.t(node.output[0]), kind="elementwise")
    return [_Fwd(call, (x,), (node.output[0],))]


@onnx_op("Where")
def _where(ctx: _Ctx, node) -> list[_Fwd]:
    return _simple(aten.where.self, ctx, node, kind="elementwise")


@onnx_op("Cast", "CastLike")
def _cast(ctx: _Ctx, node) -> list[_Fwd]:
    x, y = node.input[0], node.output[0]
    if ctx.values[x].elem == ctx.values[y].elem:
        return []
    return [_Fwd(Call(aten._to_copy.default, (ctx.t(x),), out=ctx.t(y)), (x,), (y,))]


@onnx_op("Transpose")
def _transpose(ctx: _Ctx, node) -> list[_Fwd]:
    x, y = node.input[0], node.output[0]
    shape = ctx.shape(x)
    perm = list(_attr(node, "perm", list(range(len(shape)))[::-1]))
    # Axes of size 1 can move freely; a swap of the last two axes is absorbed
    # by the GEMM that reads it (cuBLAS transposes): both stay views.
    moved = [a for a in perm if shape[a] != 1]
    kept = sorted(moved)
    if moved == kept or (len(moved) >= 2 and moved[:-2] == kept[:-2]
                         and moved[-2:] == kept[-2:][::-1]):
        return []
    return [_Fwd(Call(aten.clone.default, (ctx.t(x),), out=ctx.t(y)), (x,), (y,))]


@onnx_op("Slice")
def _slice(ctx: _Ctx, node) -> list[_Fwd]:
    x, y = node.input[0], node.output[0]
    call = Call(aten.slice.Tensor, (ctx.t(x),), out=ctx.t(y))
    return [_Fwd(call, (x,), (y,), free=True)]  # a view; its backward writes into zeros


@onnx_op("Split")
def _split(ctx: _Ctx, node) -> list[_Fwd]:
    x = node.input[0]
    outs = [o for o in node.output if o]
    call = Call(aten.split.Tensor, (ctx.t(x),), out=tuple(ctx.t(o) for o in outs))
    return [_Fwd(call, (x,), tuple(outs), free=True)]


@onnx_op("Concat")
def _concat(ctx: _Ctx, node) -> list[_Fwd]:
    srcs = [i for i in node.input if i and ctx.values[i].numel > 0]
    y = node.output[0]
    if len(srcs) <= 1:
        return []
    call = Call(aten.cat.default, ([ctx.t(i) for i in srcs], _attr(node, "axis", 0)),
                out=ctx.t(y))
    return [_Fwd(call, (tuple(srcs), None), (y,))]


@onnx_op("Pad")
def _pad(ctx: _Ctx, node) -> list[_Fwd]:
    x, y = node.input[0], node.output[0]
    mode = _attr(node, "mode", "constant")
    op = aten.constant_pad_nd.default if mode == "constant" else aten.reflection_pad2d.default
    return [_Fwd(Call(op, (ctx.t(x),), out=ctx.t(y)), (x,), (y,))]


@onnx_op("Tile")
def _tile(ctx: _Ctx, node) -> list[_Fwd]:
    x, y = node.input[0], node.output[0]
    return [_Fwd(Call(aten.repeat.default, (ctx.t(x),), out=ctx.t(y)), (x,), (y,))]


@onnx_op("Resize", "Upsample")
def _resize(ctx: _Ctx, node) -> list[_Fwd]:
    x, y = node.input[0], node.output[0]
    mode = _attr(node, "mode", "nearest")
    op = aten.upsample_nearest2d.default if mode == "nearest" else aten.upsample_bilinear2d.default
    return [_Fwd(Call(op, (ctx.t(x),), out=ctx.t(y)), (x,), (y,))]


@onnx_op("DepthToSpace", "SpaceToDepth", "Trilu", "ReverseSequence", "Compress",
         "ScatterND", "ScatterElements", "Scatter", "GatherND", "GatherElements")
def _data_movement(ctx: _Ctx, node) -> list[_Fwd]:
    op = {"GatherElements": aten.gather.default, "GatherND": aten.index.Tensor,
          "Trilu": aten.tril.default}.get(node.op_type, aten.scatter.src)
    return _simple(op, ctx, node, kind="copy", name=node.op_type)


@onnx_op("Gather")
def _gather(ctx: _Ctx, node) -> list[_Fwd]:
    data, idx, y = node.input[0], node.input[1], node.output[0]
    axis = _attr(node, "axis", 0)
    dv, iv = ctx.values[data], ctx.values[idx]
    if ctx.is_param(data) and axis == 0 and dv.dtype.is_floating_point and len(dv.shape) == 2:
        call = Call(aten.embedding.default, (ctx.t(data), ctx.t(idx)), out=ctx.t(y))
        return [_Fwd(call, (data, idx), (y,))]
    if len(iv.shape) == 0 and ctx.kinds.get(idx) != ACT:
        # x[:, k]: a select view; its backward writes into zeros.
        return [_Fwd(Call(aten.select.int, (ctx.t(data),), out=ctx.t(y)), (data,), (y,),
                     free=True)]
    op = aten.index_select.default if len(iv.shape) == 1 else aten.index.Tensor
    call = Call(op, (ctx.t(data), axis, ctx.t(idx)), out=ctx.t(y))
    return [_Fwd(call, (data, None, idx), (y,))]


# ---- GEMMs ---------------------------------------------------------------------

def _matmul_calls(ctx: _Ctx, a: str, b: str, y: str, bias: str | None,
                  outputs: tuple) -> list[_Fwd]:
    sa, sb, sy = ctx.shape(a), ctx.shape(b), ctx.shape(y)
    ta, tb = ctx.values[a].dtype, ctx.values[b].dtype
    if len(sa) == 1:
        sa = (1,) + sa
    if len(sb) == 1:
        sb = sb + (1,)
    k, n = sb[-2], sb[-1]
    if len(sb) == 2:
        # x @ W (or x @ a 2-D activation): the leading dims fold into M, as
        # aten.matmul folds them into one mm.
        m = math.prod(sa[:-1])
        x2, w2, y2 = T((m, k), ta), T((k, n), tb), T((m, n), ta)
        tag = "linear" if ctx.is_param(b) else None
        folded = len(sa) > 2  # nn.Linear on [..., K]: view, t, mm, view
        if bias is not None:
            call = Call(aten.addmm.default, (ctx.t(bias), x2, w2), out=y2, tag=tag)
            return [_Fwd(call, (bias, a, b), outputs, host=("linear", folded, True))]
        return [_Fwd(Call(aten.mm.default, (x2, w2), out=y2, tag=tag), (a, b), outputs,
                     host=("linear", folded, False))]
    lead = tuple(np.broadcast_shapes(sa[:-2], sb[:-2]))
    bt = math.prod(lead)
    m = sa[-2]
    call = Call(aten.bmm.default, (T((bt, m, k), ta), T((bt, k, n), tb)), out=T((bt, m, n), ta))
    fwd = [_Fwd(call, (a, b), outputs)]
    if bias is not None:
        fwd.append(_Fwd(Call(aten.add.Tensor, (ctx.t(y), ctx.t(bias)), out=ctx.t(y)),
                        (None, bias), outputs))
    del sy
    return fwd


def _bias_add(ctx: _Ctx, node) -> tuple[str, onnx.NodeProto] | None:
    """A following Add of a 1-D parameter (a Linear's bias): fused into addmm."""
    y = node.output[0]
    users = ctx.consumers.get(y, [])
    if len(users) != 1 or users[0].op_type != "Add" or len(users[0].input) != 2:
        return None
    add = users[0]
    other = add.input[1] if add.input[0] == y else add.input[0]
    v = ctx.values.get(other)
    n = ctx.shape(y)[-1] if ctx.shape(y) else None
    if ctx.is_param(other) and v is not None and v.shape is not None and \
            math.prod(v.shape) == n and v.shape[-1:] == (n,):
        return other, add
    return None


@onnx_op("MatMul")
def _matmul(ctx: _Ctx, node) -> list[_Fwd]:
    a, b = node.input[0], node.input[1]
    y = node.output[0]
    fused = _bias_add(ctx, node) if len(ctx.shape(b)) == 2 else None
    if fused is not None:
        bias, add = fused
        ctx.skip.add(id(add))
        return _matmul_calls(ctx, a, b, add.output[0], bias, (add.output[0],))
    return _matmul_calls(ctx, a, b, y, None, (y,))


@onnx_op("Gemm")
def _gemm(ctx: _Ctx, node) -> list[_Fwd]:
    a, b = node.input[0], node.input[1]
    c = node.input[2] if len(node.input) > 2 and node.input[2] else None
    y = node.output[0]
    sa, sb = ctx.shape(a), ctx.shape(b)
    if _attr(node, "transA", 0):
        sa = sa[::-1]
    if _attr(node, "transB", 0):
        sb = sb[::-1]
    ta, tb = T(tuple(sa), ctx.values[a].dtype), T(tuple(sb), ctx.values[b].dtype)
    tag = "linear" if ctx.is_param(b) else None
    if c is not None:
        call = Call(aten.addmm.default, (ctx.t(c), ta, tb), out=ctx.t(y), tag=tag)
        return [_Fwd(call, (c, a, b), (y,), host=("linear", False, True))]
    return [_Fwd(Call(aten.mm.default, (ta, tb), out=ctx.t(y), tag=tag), (a, b), (y,),
                 host=("linear", False, False))]


# ---- convolution -----------------------------------------------------------------

def _conv(ctx: _Ctx, node, transposed: bool) -> list[_Fwd]:
    x, w = node.input[0], node.input[1]
    b = node.input[2] if len(node.input) > 2 and node.input[2] else None
    y = node.output[0]
    nsp = len(ctx.shape(x)) - 2
    strides = list(_attr(node, "strides", [1] * nsp))
    pads = list(_attr(node, "pads", [0] * (2 * nsp)))[:nsp]
    dil = list(_attr(node, "dilations", [1] * nsp))
    groups = int(_attr(node, "group", 1))
    opad = list(_attr(node, "output_padding", [0] * nsp))
    call = Call(aten.convolution.default,
                (ctx.t(x), ctx.t(w), ctx.t(b) if b else None, strides, pads, dil, transposed,
                 opad, groups), out=ctx.t(y))
    return [_Fwd(call, (x, w, b) + (None,) * 6, (y,))]


onnx_op("Conv")(lambda ctx, node: _conv(ctx, node, False))
onnx_op("ConvTranspose")(lambda ctx, node: _conv(ctx, node, True))


# ---- normalisation, softmax -------------------------------------------------------

@onnx_op("Softmax", "LogSoftmax")
def _softmax(ctx: _Ctx, node) -> list[_Fwd]:
    x, y = node.input[0], node.output[0]
    shape = ctx.shape(x)
    axis = _attr(node, "axis", -1 if ctx.opset >= 13 else 1)
    axis = axis + len(shape) if axis < 0 else axis
    op = aten._softmax.default if node.op_type == "Softmax" else aten._log_softmax.default
    if ctx.opset < 13:  # softmax over the flattened trailing dims
        inner = math.prod(shape[axis:])
        tx = T((math.prod(shape[:axis]), inner), ctx.values[x].dtype)
        call = Call(op, (tx, 1, False), out=tx)
    else:
        call = Call(op, (ctx.t(x), axis, False), out=ctx.t(y))
    return [_Fwd(call, (x, None, None), (y,))]


@onnx_op("LayerNormalization")
def _layer_norm(ctx: _Ctx, node) -> list[_Fwd]:
    x, w = node.input[0], node.input[1]
    b = node.input[2] if len(node.input) > 2 and node.input[2] else None
    y = node.output[0]
    shape = ctx.shape(x)
    axis = _attr(node, "axis", -1)
    axis = axis + len(shape) if axis < 0 else axis
    norm = list(shape[axis:])
    stats = T(tuple(shape[:axis]) + (1,) * len(norm), torch.float32)
    call = Call(aten.native_layer_norm.default,
                (ctx.t(x), norm, ctx.t(w), ctx.t(b) if b else None, _attr(node, "epsilon", 1e-5)),
                out=(ctx.t(y), stats, stats))
    return [_Fwd(call, (x, None, w, b, None), (y,))]


@onnx_op("GroupNormalization", "InstanceNormalization")
def _group_norm(ctx: _Ctx, node) -> list[_Fwd]:
    x, w, b = node.input[0], node.input[1], node.input[2]
    y = node.output[0]
    shape = ctx.shape(x)
    n, c = shape[0], shape[1] if len(shape) > 1 else 1
    groups = c if node.op_type == "InstanceNormalization" else int(_attr(node, "num_groups", 1))
    call = Call(aten.native_group_norm.default,
                (ctx.t(x), ctx.t(w), ctx.t(b), n, c, math.prod(shape[2:]), groups, 1e-5),
                out=ctx.t(y))
    return [_Fwd(call, (x, w, b) + (None,) * 5, (y,))]


@onnx_op("BatchNormalization")
def _batch_norm(ctx: _Ctx, node) -> list[_Fwd]:
    x, w, b, mean, var = (list(node.input) + [""] * 5)[:5]
    y = node.output[0]
    eps = _attr(node, "epsilon", 1e-5)
    tx, ty = ctx.t(x), ctx.t(y)
    tw, tb = ctx.t(w), ctx.t(b)
    tm = ctx.t(mean) if mean else tw
    tv = ctx.t(var) if var else tw
    if ctx.train:
        call = Call(aten._native_batch_norm_legit_functional.default,
                    (tx, tw, tb, tm, tv, True, _attr(node, "momentum", 0.9), eps),
                    out=(ty, tw, tw, tm, tv))
        # nn.BatchNorm's num_batches_tracked += 1: one scalar kernel per layer.
        counter = T((), torch.int64)
        bump = Call(aten.add_.Tensor, (counter, 1), out=counter, kind="elementwise")
        return [_Fwd(call, (x, w, b, None, None, None, None, None), (y,)),
                _Fwd(bump, (None, None), ())]
    call = Call(aten._native_batch_norm_legit_no_training.default,
                (tx, tw, tb, tm, tv, 0.1, eps), out=(ty, tw, tw))
    return [_Fwd(call, (x, w, b, None, None, None, None), (y,))]


@onnx_op("Dropout")
def _dropout(ctx: _Ctx, node) -> list[_Fwd]:
    x, y = node.input[0], node.output[0]
    ratio = ctx.data(node.input[1]) if len(node.input) > 1 and node.input[1] else None
    p = float(ratio) if ratio is not None and np.size(ratio) == 1 else _attr(node, "ratio", 0.5)
    if not ctx.train or p <= 0.0:
        return []  # an identity at inference (and with p = 0)
    ty = ctx.t(y)
    call = Call(aten.native_dropout.default, (ctx.t(x), p, True), out=(ty, T(ty.shape, torch.bool)))
    return [_Fwd(call, (x, None, None), (y,))]


# ---- pooling, reductions -------------------------------------------------------------

@onnx_op("MaxPool", "AveragePool", "LpPool")
def _pool(ctx: _Ctx, node) -> list[_Fwd]:
    x, y = node.input[0], node.output[0]
    ty = ctx.t(y)
    nsp = len(ctx.shape(x)) - 2
    ks = list(_attr(node, "kernel_shape", [1] * nsp))
    st = list(_attr(node, "strides", [1] * nsp))
    pads = list(_attr(node, "pads", [0] * (2 * nsp)))[:nsp]
    if node.op_type == "MaxPool":
        op = aten.max_pool3d_with_indices.default if nsp == 3 else \
            aten.max_pool2d_with_indices.default
        call = Call(op, (ctx.t(x), ks, st, pads, [1] * nsp, bool(_attr(node, "ceil_mode", 0))),
                    out=(ty, T(ty.shape, torch.int64)))
        return [_Fwd(call, (x,) + (None,) * 5, (y,))]
    op = aten.avg_pool3d.default if nsp == 3 else aten.avg_pool2d.default
    call = Call(op, (ctx.t(x), ks, st, pads), out=ty)
    return [_Fwd(call, (x, None, None, None), (y,))]


@onnx_op("GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool")
def _global_pool(ctx: _Ctx, node) -> list[_Fwd]:
    # adaptive_avg_pool2d(x, 1) runs as a mean over the spatial dims (as traced).
    x, y = node.input[0], node.output[0]
    op = aten.mean.dim if node.op_type == "GlobalAveragePool" else aten.amax.default
    call = Call(op, (ctx.t(x), [-2, -1], True), out=ctx.t(y))
    return [_Fwd(call, (x, None, None), (y,))]


_REDUCE = {"ReduceMean": aten.mean.dim, "ReduceSum": aten.sum.dim_IntList,
           "ReduceMax": aten.amax.default, "ReduceMin": aten.amin.default,
           "ReduceProd": aten.prod.dim_int, "ReduceL1": aten.linalg_vector_norm.default,
           "ReduceL2": aten.linalg_vector_norm.default,
           "ReduceSumSquare": aten.linalg_vector_norm.default,
           "ReduceLogSumExp": aten.logsumexp.default, "ReduceLogSum": aten.logsumexp.default,
           "ArgMax": aten.argmax.default, "ArgMin": aten.argmin.default,
           "CumSum": aten.sum.dim_IntList}


@onnx_op(*_REDUCE)
def _reduce(ctx: _Ctx, node) -> list[_Fwd]:
    x, y = node.input[0], node.output[0]
    if ctx.values[x].numel == ctx.values[y].numel and node.op_type != "CumSum":
        return []  # reducing size-1 axes: a view
    call = Call(_REDUCE[node.op_type], (ctx.t(x),), out=ctx.t(y), kind="reduction")
    return [_Fwd(call, (x,), (y,))]


# ---- recurrent layers, attention ---------------------------------------------------

@onnx_op("LSTM")
def _lstm(ctx: _Ctx, node) -> list[_Fwd]:
    ins = list(node.input) + [""] * 8
    x, w, r, b = ins[0], ins[1], ins[2], ins[3]
    hidden = int(_attr(node, "hidden_size", ctx.shape(r)[-1]))
    bidir = _attr(node, "direction", "forward") == "bidirectional"
    batch_first = bool(_attr(node, "layout", 0))
    outs = [o for o in node.output if o and ctx.values.get(o) is not None]
    weights = [ctx.t(w), ctx.t(r)] + ([ctx.t(b)] if b else [])
    call = Call(aten._cudnn_rnn.default,
                (ctx.t(x), weights, 4, None, None, None, 2, hidden, 0, 1, batch_first, 0.0,
                 ctx.train, bidir),
                out=tuple(ctx.t(o) for o in outs))
    srcs = (x, (w, r) + ((b,) if b else ())) + (None,) * 12
    return [_Fwd(call, srcs, tuple(outs))]


def _attention_call(ctx: _Ctx, q: T, k: T, v: T, causal: bool, y: str,
                    srcs: tuple) -> list[_Fwd]:
    call = Call(aten._scaled_dot_product_flash_attention.default, (q, k, v),
                kwargs=(("is_causal", bool(causal)),), out=(ctx.t(y),))
    return [_Fwd(call, srcs, (y,))]


def _heads(t: T, heads: int) -> T:
    if len(t.shape) == 4:
        return t
    b, s, hd = t.shape
    return T((b, heads, s, hd // max(heads, 1)), t.dtype)


@onnx_op("Attention")
def _attention(ctx: _Ctx, node) -> list[_Fwd]:
    # ai.onnx Attention (opset 23): Q, K, V as [B, H, S, D] or [B, S, H*D].
    q, k, v = node.input[0], node.input[1], node.input[2]
    y = node.output[0]
    qh = int(_attr(node, "q_num_heads", 1) or 1)
    kh = int(_attr(node, "kv_num_heads", qh) or qh)
    return _attention_call(ctx, _heads(ctx.t(q), qh), _heads(ctx.t(k), kh),
                           _heads(ctx.t(v), kh), _attr(node, "is_causal", 0), y, (q, k, v))


@onnx_op("com.microsoft.MultiHeadAttention")
def _ms_mha(ctx: _Ctx, node) -> list[_Fwd]:
    q, k, v = node.input[0], node.input[1], node.input[2]
    heads = int(_attr(node, "num_heads", 1))
    kt = _heads(ctx.t(k), heads) if k else _heads(ctx.t(q), heads)
    vt = _heads(ctx.t(v), heads) if v else kt
    return _attention_call(ctx, _heads(ctx.t(q), heads), kt, vt,
                           _attr(node, "unidirectional", 0), node.output[0], (q, k, v))


@onnx_op("com.microsoft.Attention")
def _ms_attention(ctx: _Ctx, node) -> list[_Fwd]:
    # Input [B, S, hidden] @ weights [hidden, 3*hidden] (+ bias), then attention.
    x, w = node.input[0], node.input[1]
    bias = node.input[2] if len(node.input) > 2 and node.input[2] else None
    heads = int(_attr(node, "num_heads", 1))
    b, s, hidden = ctx.shape(x)
    n = ctx.shape(w)[-1]
    dt = ctx.values[x].dtype
    qkv = T((b * s, n), dt)
    proj = Call(aten.addmm.default if bias else aten.mm.default,
                ((ctx.t(bias),) if bias else ()) + (T((b * s, hidden), dt), ctx.t(w)), out=qkv,
                tag="linear")
    d = n // 3 // max(heads, 1)
    qt = T((b, heads, s, d), dt)
    fwd = [_Fwd(proj, ((bias,) if bias else ()) + (x, w), (node.output[0],))]
    return fwd + _attention_call(ctx, qt, qt, qt, _attr(node, "unidirectional", 0),
                                 node.output[0], (None, None, None))


# ---- random numbers, fills ---------------------------------------------------------------

@onnx_op("RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Bernoulli")
def _random(ctx: _Ctx, node) -> list[_Fwd]:
    y = node.output[0]
    return [_Fwd(Call(aten.rand.default, (), out=ctx.t(y)), (), (y,))]


@onnx_op("ConstantOfShape", "Range", "EyeLike", "OneHot")
def _fill(ctx: _Ctx, node) -> list[_Fwd]:
    y = node.output[0]
    return [_Fwd(Call(aten.full.default, (), out=ctx.t(y)), (), (y,))]


# ============================================================ 4. the graph ==

def _unsupported(ctx: _Ctx, node, label: str) -> list[_Fwd]:
    srcs = [i for i in node.input if i and ctx.values.get(i) is not None
            and ctx.values[i].shape is not None]
    outs = [o for o in node.output if o and ctx.values.get(o) is not None
            and ctx.values[o].shape is not None]
    call = Call(None, tuple(ctx.t(i) for i in srcs), out=tuple(ctx.t(o) for o in outs),
                kind="unsupported", name=label)
    return [_Fwd(call, tuple(srcs), tuple(outs))]


def _classify(nodes: list[onnx.NodeProto], graph: onnx.GraphProto,
              values: dict[str, _Value]) -> dict[str, str]:
    """PARAM: initializers and what is computed from them alone (folded at load);
    META: shapes and integer arithmetic on them (host side); ACT: the rest."""
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
                values.get(o) is not None and not values[o].dtype.is_floating_point
                for o in outs):
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


def _diff_inputs(node: onnx.NodeProto, values: dict[str, _Value]) -> list[int]:
    if node.op_type in _NON_DIFF:
        return []
    fixed = _DIFF_INPUTS.get(node.op_type)
    idx = range(len(node.input)) if fixed is None else fixed
    out = []
    for i in idx:
        if i < len(node.input) and node.input[i]:
            v = values.get(node.input[i])
            if v is not None and v.dtype.is_floating_point:
                out.append(i)
    return out


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


# Kernel-free aten ops that eager PyTorch dispatches around a call (views such
# as t / view / expand / transpose, autograd's detach of a saved output, an
# empty for batch norm's saved statistics): they cost host time
# (predictor.overhead) but launch nothing. (forward, backward, forward at
# inference), counted from fx traces of single layers; see _host.
_HOST_EXTRA = {
    aten.bmm: (5, 3, 5),            # expand x2, _unsafe_view x3 / transposes of the operands
    aten.clone: (1, 1, 1),          # the transpose / permute view it copies
    aten.relu: (1, 1, 0),           # detach of the output saved for threshold_backward
    aten._softmax: (1, 1, 0),
    aten._log_softmax: (1, 1, 0),
    aten.tanh: (1, 1, 0),
    aten.sigmoid: (1, 1, 0),
    aten._native_batch_norm_legit_functional: (1, 0, 1),   # empty (saved statistics)
    aten._native_batch_norm_legit_no_training: (1, 0, 1),
    aten.mean: (0, 1, 0),           # its backward expands the gradient
}


def _host(f: _Fwd, train: bool, needs: tuple = ()) -> tuple[int, int]:
    """(forward, backward) kernel-free host ops around one forward call;
    `needs` says which of its arguments get a gradient."""
    if f.host is not None and f.host[0] == "linear":
        # nn.Linear: view, t, mm, view forward; backward t of the weight, t x2
        # around the weight gradient, t for the input gradient, a view of the
        # bias gradient, and the backward of each view.
        _, folded, bias = f.host
        dgrad = bool(len(needs) > 1 and needs[-2])
        back = 3 + dgrad + (1 + dgrad if folded else 0) + bias
        return (1 + 2 * folded, back if train else 0)
    packet = getattr(f.call.op, "overloadpacket", f.call.op)
    extra = _HOST_EXTRA.get(packet)
    if extra is None:
        return (0, 0)
    return (extra[0], extra[1]) if train else (extra[2], 0)


def _lower(model: onnx.ModelProto, nodes: list[onnx.NodeProto], values: dict[str, _Value],
           p: Path, *, train: bool, optimizer: str | None, loss: str) -> _Lowered:
    graph = model.graph
    kinds = _classify(nodes, graph, values)
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

    def passthrough(node: onnx.NodeProto, inputs: list[int]) -> None:
        edges.append((tuple(node.input[i] for i in inputs), (node.output[0],)))

    gelu = _erf_gelus(nodes, ctx)
    for node in nodes:
        if id(node) in ctx.skip:
            continue
        outs = [o for o in node.output if o]
        if all(kinds.get(o) in (PARAM, META) for o in outs):
            # Folded constants and shape arithmetic: no kernel. A parameter's
            # gradient still flows through a view of it (W^T feeding a MatMul).
            if any(kinds.get(o) == PARAM for o in outs):
                passthrough(node, _diff_inputs(node, values))
            continue
        domain = "" if node.domain in ("", "ai.onnx") else node.domain
        key = node.op_type if not domain else f"{domain}.{node.op_type}"
        if any(values.get(o) is None or values[o].shape is None for o in outs) or any(
                i and (values.get(i) is None or values[i].shape is None) for i in node.input):
            label = f"{key}(shape unknown)"
            mapped = _unsupported(ctx, node, label)
            unsupported[label] = unsupported.get(label, 0) + 1
        elif id(node) in gelu:
            x, y = gelu[id(node)]
            mapped = [_Fwd(Call(aten.gelu.default, (ctx.t(x),), out=ctx.t(y),
                                kind="elementwise"), (x,), (y,))]
        elif node.op_type in _VIEWS and not domain:
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
        for f in mapped:
            edges.append((tuple(_flat_sources(f.sources)), tuple(f.outputs)))
        fwd.extend(mapped)

    # Parameters: float initializers (not scalars: those are constants) that
    # some op differentiates through; a tied copy is a view of its original.
    init_names = {i.name for i in graph.initializer}
    tied = _tied_initializers(graph)
    edges[:0] = [((orig,), (copy,)) for copy, orig in tied.items()]
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
    if not train:
        return _Lowered(forward, [], [], unsupported, n_params, 0, n_bytes, [host_fwd, 0, 0])

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

    loss_fwd, loss_bwd = families.loss_calls([ctx.t(o) for o in loss_outputs], loss) \
        if loss_outputs else ([], [])
    backward: list[Call] = list(loss_bwd)
    host_bwd = views + (1 if loss == "mean" and loss_bwd else 0)  # the mean's expand
    for f in reversed(fwd):
        if any(o in grad for o in f.outputs):
            needs = _needs(f.sources, grad)
            backward.extend(families.backward_calls(f.call, needs))
            host_bwd += _host(f, True, needs)[1]
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
    opt = families.optimizer_calls([ctx.t(n) for n in trainable], optimizer)
    n_train = sum(values[n].numel for n in trainable)
    host = [host_fwd + len(loss_fwd), host_bwd + len(backward), len(opt)]
    return _Lowered(forward + loss_fwd, backward, opt, unsupported, n_params, n_train, n_bytes,
                    host)


def _erf_gelus(nodes: list[onnx.NodeProto], ctx: _Ctx) -> dict[int, tuple[str, str]]:
    """GELU written out with Erf (opsets before 20): x * 0.5 * (1 + erf(x / sqrt 2)).
    Returns {id(last node): (x, y)} and marks the other nodes of each match skipped,
    so the pattern prices as the one gelu kernel PyTorch runs."""
    producer = {o: n for n in nodes for o in n.output if o}
    found: dict[int, tuple[str, str]] = {}

    def const(name: str, target: float, tol: float = 1e-3) -> bool:
        d = ctx.data(name)
        return d is not None and np.size(d) == 1 and abs(float(np.asarray(d).ravel()[0]) - target) \
            < tol * max(abs(target), 1)

    def other(node, name):
        return node.input[1] if node.input[0] == name else node.input[0]

    for erf in nodes:
        if erf.op_type != "Erf":
            continue
        pre = producer.get(erf.input[0])
        if pre is None or pre.op_type not in ("Div", "Mul"):
            continue
        x = pre.input[0]
        if not (const(pre.input[1], math.sqrt(2)) if pre.op_type == "Div"
                else const(pre.input[1], 1 / math.sqrt(2))):
            continue
        users = ctx.consumers.get(erf.output[0], [])
        if len(users) != 1 or users[0].op_type != "Add" or not const(other(users[0],
                                                                            erf.output[0]), 1.0):
            continue
        add = users[0]
        chain = [pre, erf, add]
        cur = add.output[0]
        seen_x = seen_half = False
        for _ in range(2):
            users = ctx.consumers.get(cur, [])
            if len(users) != 1 or users[0].op_type != "Mul":
                break
            mul = users[0]
            o = other(mul, cur)
            if o == x or producer.get(o) is not None and producer[o].op_type == "Mul" and \
                    x in producer[o].input and any(const(i, 0.5) for i in producer[o].input):
                seen_x = True
                if o != x:
                    seen_half = True
                    chain.append(producer[o])
            elif const(o, 0.5):
                seen_half = True
            else:
                break
            chain.append(mul)
            cur = mul.output[0]
            if seen_x and seen_half:
                break
        if not (seen_x and seen_half):
            continue
        last = chain[-1]
        for n in chain:
            if n is not last:
                ctx.skip.add(id(n))
        found[id(last)] = (x, last.output[0])
    return found


# ============================================================ 5. rows ==

def _scale(x: Any, sentinel: int | None, batch: int) -> Any:
    if isinstance(x, T):
        return T(tuple(_scale_dim(d, sentinel, batch) for d in x.shape), x.dtype)
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
    return families.call_rows(c)


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
        rows, bad = families.call_rows(call)
        return [(f, tuple(d), (0,) * len(d), k) for f, d, k in rows], bad, True
    r1, bad = _rows_at(call, sentinel, 1)
    r2, _ = _rows_at(call, sentinel, 2)
    rs, _ = families.call_rows(call)
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
    from predictor.lowering import dtype_code

    cands = families.tensors(call.args) + families.tensors(call.out)
    for t in cands:
        if t.dtype.is_floating_point:
            return dtype_code(t.dtype)
    return dtype_code(cands[0].dtype) if cands else L.F32


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
    n = len(rows)
    table = OpTable(
        family=np.empty(n, np.int64), phase=np.empty(n, np.int64), dtype=np.empty(n, np.int64),
        count=np.empty(n, np.int64), kernels=np.empty(n, np.int64),
        dbase=np.zeros((n, L.MAX_DIMS), np.int64), dslope=np.zeros((n, L.MAX_DIMS), np.int64),
        op=np.empty(n, np.int64), op_names=names)
    for i, ((fam, phase, dt, kern, base, slope, opi), cnt) in enumerate(rows.items()):
        if any(abs(v) >= 1 << 62 for v in base + slope):
            raise FileFormatError(f"{p}: an op's size overflows 64-bit integers; absurd shapes")
        table.family[i], table.phase[i], table.dtype[i] = fam, phase, dt
        table.kernels[i], table.op[i], table.count[i] = kern, opi, cnt
        table.dbase[i, :len(base)] = base
        table.dslope[i, :len(slope)] = slope
    return table, scalable


# ============================================================ the entry point ==

def trace_onnx(path: str | Path, *, batch_size: int | None = None, seq_len: int | None = None,
               mode: str = "train", optimizer: str | None = "adam", loss: str = "mean",
               dims: dict[str, int] | None = None, name: str | None = None) -> Graph:
    """Build a Graph from an ONNX file (see the module docstring).

    batch_size: the batch to report and check (default: the file's fixed batch,
        else 1). A symbolic first input dim makes the graph valid at any batch.
    seq_len: the size of every other symbolic input dim (sequence length);
        `dims` names sizes one by one instead ({"sequence": 128}).
    mode: "train" synthesises loss, backward and optimizer; "inference" does not.
    loss: "mean" (of the first output, the fx frontend's default) or
        "cross_entropy" (one per floating output, over its last dim).
    """
    from predictor.frontend import optimizers

    start = time.perf_counter()
    if mode not in MODES:
        raise InvalidArgumentError(f"mode must be 'train' or 'inference', got {mode!r}")
    optimizer = optimizers.check(optimizer) if mode == "train" else None
    for value, what in ((batch_size, "batch size"), (seq_len, "sequence length")):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value <= 0):
            raise InvalidArgumentError(f"{what} must be a positive integer, got {value!r}")
    if callable(loss):
        raise InvalidArgumentError(
            f"{path}: an ONNX model takes a loss by name ('mean' or 'cross_entropy'), "
            "not a function")
    if loss not in families.LOSSES:
        raise InvalidArgumentError(
            f"unknown loss {loss!r} for an ONNX model; choose one of {', '.join(families.LOSSES)}")
    dims = dict(dims or {})
    for k, v in dims.items():
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise InvalidArgumentError(f"dims[{k!r}] must be a positive integer, got {v!r}")
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
    lowered = _lower(model, nodes, values, p, train=mode == "train", optimizer=optimizer,
                     loss=loss)
    table, scalable = _table([lowered.forward, lowered.backward, lowered.optimizer], sentinel,
                             batch, p)
    graph = Graph(
        name=name or p.stem, ops=table, batch_size=batch, mode=mode, optimizer=optimizer,
        seq_len=seq_len, parameters=lowered.params, trainable_parameters=lowered.trainable,
        parameter_bytes=lowered.param_bytes, unsupported=dict(lowered.unsupported),
        batch_scalable=scalable and sentinel is not None,
        trace_seconds=time.perf_counter() - start, torch_version=torch.__version__)
    _set_host_ops(graph, lowered)
    return graph


def _set_host_ops(graph: Graph, lowered: _Lowered) -> None:
    """Host-side op counts per phase, where the Graph records them (predictor.overhead)."""
    if hasattr(graph, "host_ops"):
        graph.host_ops = list(lowered.host_ops)
