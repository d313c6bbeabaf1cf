"""Loading an ONNX file for the ONNX frontend: read it, check it, and infer
the shape of every tensor.

A corrupt or hostile file must give a clear :class:`FileFormatError` naming the
file, never a traceback or a hang: the protobuf, the IR and opset versions,
names read before they are defined, values defined twice, cycles and absurd
shapes are all checked here. Weights are never loaded from external data.

Shapes: the inputs' symbolic dims are bound to concrete sizes (the batch to the
sentinel batch the fx frontend traces at) and ONNX shape inference runs node by
node, with the values of small tensors (shape arithmetic: ``Shape`` ->
``Gather`` -> ``Concat`` -> ``Reshape``) computed by ``onnx.reference``, so that
every shape is concrete.
"""

from __future__ import annotations

import math
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

from predictor import dtypes
from predictor.errors import FileFormatError, InvalidArgumentError
from predictor.io import MiB, printable, read_regular

# Tensors up to this many elements get their values computed (shape arithmetic).
VALUE_LIMIT = 1 << 16
# No real tensor has more elements than this (2^50 fp32 = 4 PiB); more is a hostile file.
MAX_NUMEL = 1 << 50
MAX_DIM = 1 << 40

_DTYPES = {getattr(onnx.TensorProto, elem): getattr(torch, name)
           for elem, name in dtypes.ONNX_ELEMENT_TYPES.items()
           if hasattr(onnx.TensorProto, elem) and hasattr(torch, name)}


def _torch_dtype(elem_type: int) -> torch.dtype:
    return _DTYPES.get(elem_type, torch.float32)


def _one_line(exc: BaseException) -> str:
    msg = " ".join(str(exc).split())
    if len(msg) > 240:
        msg = msg[:237] + "..."
    return msg or type(exc).__name__


# ============================================================ 1. loading ==

MAX_ONNX_FILE_BYTES = 2 * 1024 * MiB


def load(path: str | Path) -> onnx.ModelProto:
    """Read and sanity-check an ONNX file (no weights are loaded from external data)."""
    p = Path(path)
    # A regular file (not a FIFO, a device or a link to one) within protobuf's 2 GiB.
    data = read_regular(p, MAX_ONNX_FILE_BYTES, "ONNX file")
    p = Path(printable(p, 300))
    if not data:
        raise FileFormatError(f"{p}: empty file, not an ONNX model")
    try:
        model = onnx.load_model_from_string(data)
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
    # Protobuf hands back bytes for a string field that is not valid UTF-8.
    g = model.graph
    names = [o.domain for o in model.opset_import]
    names += [v.name for v in list(g.input) + list(g.output) + list(g.value_info)]
    # ... and for a symbolic dim's name (dim_param), which names the batch.
    names += [d.dim_param for v in list(g.input) + list(g.output) + list(g.value_info)
              if v.type.HasField("tensor_type") and v.type.tensor_type.HasField("shape")
              for d in v.type.tensor_type.shape.dim if d.HasField("dim_param")]
    names += [i.name for i in g.initializer]
    for node in g.node:
        names += [node.op_type, node.domain, node.name, *node.input, *node.output]
        names += [a.name for a in node.attribute]
    if not all(isinstance(n, str) for n in names):
        raise FileFormatError(f"{p}: not a valid ONNX model (a name is not UTF-8 text)")
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
                    f"{p}: value {printable(repr(o), 100)} is defined twice (node {_node_label(node)})")
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
                    f"{p}: node {_node_label(node)} reads {printable(repr(i), 100)}, which no node, input or "
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
    op = printable(node.op_type, 100)
    return f"{printable(repr(node.name), 100)} ({op})" if node.name else op


# ============================================================ 2. shapes ==

@dataclass
class OnnxValue:
    """A value of the ONNX graph as shape inference leaves it: its shape (None
    while unknown), ONNX element type, and the data of a constant or a small
    shape-computing tensor. Public: the op mappers and the lowering read it."""

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


def _initializer_values(graph: onnx.GraphProto, p: Path) -> dict[str, OnnxValue]:
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
        values[init.name] = OnnxValue(shape, init.data_type, data)
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


def _type_of(v: OnnxValue) -> onnx.TypeProto:
    t = onnx.TypeProto()
    t.tensor_type.elem_type = v.elem or onnx.TensorProto.FLOAT
    if v.shape is not None:
        shp = t.tensor_type.shape
        shp.SetInParent()
        for d in v.shape:
            shp.dim.add().dim_value = d
    return t


def _value_from_type(tp: onnx.TypeProto) -> OnnxValue | None:
    if not tp.HasField("tensor_type"):
        return None
    tt = tp.tensor_type
    if not tt.HasField("shape"):
        return OnnxValue(None, tt.elem_type)
    dims = []
    for d in tt.shape.dim:
        if not d.HasField("dim_value"):
            return OnnxValue(None, tt.elem_type)
        dims.append(int(d.dim_value))
    return OnnxValue(tuple(dims), tt.elem_type)


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
           strict: bool) -> dict[str, OnnxValue]:
    """Shapes (and small values) of every tensor, node by node."""
    graph = model.graph
    opsets = _opsets(model)
    values = _initializer_values(graph, p)
    for name, shape in inputs.items():
        values[name] = OnnxValue(shape, elems[name])
    declared = {vi.name: vi.type for vi in list(graph.value_info) + list(graph.output)}
    opset_protos = list(model.opset_import)
    for node in nodes:
        domain = "" if node.domain == "ai.onnx" else node.domain
        version = opsets.get(domain)
        ins = [values.get(i) if i else None for i in node.input]
        outs: dict[str, OnnxValue | None] = {}
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
                outs[node.output[0]] = OnnxValue(tuple(int(d) for d in data.shape),
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
                v = OnnxValue(ins[0].shape, ins[0].elem)
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
            outs[node.output[0]] = OnnxValue(tuple(data.shape), onnx.TensorProto.INT64, data)
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
                try:
                    _check_shape(v.shape, o, p)
                except FileFormatError:
                    if strict:
                        raise
                    raise _ShapeFailure(o) from None  # say it at the file's own shapes
            if v is not None:
                values[o] = v
        if node.op_type in _SAME_SIZE and not domain and ins and ins[0] is not None:
            # ONNX inference takes a Reshape's target on trust: a size baked into
            # the graph (a fixed batch) must still hold every element.
            v = values.get(node.output[0])
            if ins[0].shape is not None and v is not None and v.shape is not None \
                    and ins[0].numel != v.numel:
                msg = (f"node {_node_label(node)} turns {list(ins[0].shape)} into "
                       f"{list(v.shape)}")
                if strict:
                    raise FileFormatError(f"{p}: {msg}, a different number of elements")
                raise _ShapeFailure(msg)
    return values


_SAME_SIZE = {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"}


def _attr(node: onnx.NodeProto, name: str, default: Any = None) -> Any:
    for a in node.attribute:
        if a.name == name:
            v = onnx.helper.get_attribute_value(a)
            return v.decode() if isinstance(v, bytes) else v
    return default
