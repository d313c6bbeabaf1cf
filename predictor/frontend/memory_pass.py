"""The memory pass: every storage of a traced step with its liveness.

It walks the same aten graph the time model is lowered from, in execution
order, and records every *storage* (views and in-place ops share their
input's storage and allocate nothing): when it is allocated, when it is last
used, how big it is as a function of the batch size, and what it holds.
Liveness follows eager PyTorch:

- parameters, buffers, optimizer state and the input batch live through the
  whole step (the optimizer state is the steady state after the first step);
- an op's outputs are allocated while its inputs are still alive, and a
  storage is freed after the last op that reads it — so a forward tensor that
  autograd saved for backward lives until its backward op has run;
- gradients of parameters live from the backward op that makes them to the end
  of the step (``param.grad`` holds them until ``zero_grad``);
- under autocast, the 16-bit copy of an fp32 parameter lives at least to the
  end of the autocast region (forward and loss): the cast cache holds it;
- transient library workspaces live during one op: cuDNN convolutions
  (``min(largest operand, CUDNN_WORKSPACE_CAP)``: an assumption, not
  measured) and the fp32 ``dq`` accumulator of flash-attention backward.

Sizes come from the fake tensors of the trace at the sentinel batch (1009):
a dim the lowering's :class:`~predictor.lowering.BatchScaler` recognises as
``k * batch`` contributes one power of the batch, so each storage holds
``coef * b**power`` elements at batch ``b`` — exact at every batch size,
without retracing. The result is a :class:`~predictor.optable.MemoryProfile`,
which the memory model (``predictor.memory``) prices per GPU and batch size.

It lives with the fx frontend because it reads torch's fake tensors and
storages; the profile it returns needs numpy only.
"""

from __future__ import annotations

import operator
from typing import Any, Sequence

import numpy as np
import torch
import torch.fx
from torch.multiprocessing.reductions import StorageWeakRef

from predictor import dtypes
from predictor.kernels import layout as L
from predictor.lowering import BatchScaler
from predictor.memory import CUDNN_WORKSPACE_CAP
from predictor.optable import (
    ACTIVATIONS, BUFFERS, GRADIENTS, INPUTS, OPTIMIZER_STATE, PARAMETERS, TEMPORARIES,
    WORKSPACE, MemoryProfile, StorageColumns,
)

# make_fx names placeholders after the traced step's arguments
# (predictor.frontend.fx: train_step(params, buffers, opt_state, inputs)).
_PLACEHOLDER_ROLES = (("params", PARAMETERS), ("buffers", BUFFERS),
                      ("opt_state", OPTIMIZER_STATE), ("inputs", INPUTS))


def _tensors(val: Any) -> list:
    if isinstance(val, torch.Tensor):
        return [val]
    if isinstance(val, (list, tuple)):
        out = []
        for v in val:
            out.extend(_tensors(v))
        return out
    return []


def _storage_key(t) -> int | None:
    try:
        return StorageWeakRef(t.untyped_storage()).cdata
    except Exception:  # noqa: BLE001 — tensors without a storage (sparse, nested)
        return None


def _size_of(t, scale2, sentinel: int | None, storage: bool = True) -> tuple[float, int]:
    """(coef, power): the storage of `t` (`storage` False: `t` itself, for a
    workspace sized like an operand that may be a view) holds ``coef * b**power``
    elements at batch b. A dim that the lowering's BatchScaler maps to a
    multiple of the batch contributes one power."""
    power = sum(1 for d in t.shape if scale2.dim(int(d)) != int(d))
    try:
        elems = t.untyped_storage().nbytes() // max(t.element_size(), 1) if storage else 0
    except Exception:  # noqa: BLE001
        elems = t.numel()
    elems = max(int(elems), int(t.numel()))
    if sentinel is None or power == 0:
        return float(elems), 0
    return elems / float(sentinel) ** power, power


_CONV_OPS: set = set()
_ATTN_BWD_OPS: set = set()


def _overloads(names: tuple[str, ...]) -> set:
    """Every overload of the named aten ops: a traced node's target is an
    overload (``aten.convolution.default``), never the packet."""
    aten = torch.ops.aten
    out = set()
    for name in names:
        packet = getattr(aten, name, None)
        if packet is not None:
            out.update(getattr(packet, o) for o in packet.overloads())
    return out


def _op_sets():
    if not _CONV_OPS:
        _CONV_OPS.update(_overloads((
            "convolution", "_convolution", "convolution_backward", "cudnn_convolution",
            "mkldnn_convolution", "cudnn_convolution_transpose")))
        _ATTN_BWD_OPS.update(_overloads((
            "_scaled_dot_product_flash_attention_for_cpu_backward",
            "_scaled_dot_product_flash_attention_backward",
            "_scaled_dot_product_efficient_attention_backward",
            "_scaled_dot_product_cudnn_attention_backward",
            "_flash_attention_backward", "_efficient_attention_backward")))
    return _CONV_OPS, _ATTN_BWD_OPS


def _casts_a_parameter(node, of_node: dict, category: list[int]) -> bool:
    """Whether a ``_to_copy`` node casts an fp32 parameter to 16 bits (what
    autocast's cast cache holds)."""
    src = node.args[0] if node.args else None
    val, out = (src.meta.get("val") if isinstance(src, torch.fx.Node) else None), \
        node.meta.get("val")
    if not (isinstance(val, torch.Tensor) and isinstance(out, torch.Tensor)):
        return False
    if val.dtype != torch.float32 or out.dtype not in (torch.float16, torch.bfloat16):
        return False
    return any(category[e] == PARAMETERS for e in of_node.get(src, ()))


def profile(gm, phase_marks: Sequence[int], sentinel: int | None,
            origins: list | None = None, amp: str | None = None) -> MemoryProfile:
    """The memory pass over a traced step (see the module docstring).

    `phase_marks` are the node indices where backward and the optimizer start
    (as for the lowering); `sentinel` is the batch size the trace ran at (None:
    sizes are taken as traced). `origins`, when given, receives per storage
    (node index, position among the node's output tensors; -1 for a
    workspace): where it was first seen (predictor.frontend.blocks).

    `amp`: the step ran under autocast, whose cast cache keeps the 16-bit copy
    of every fp32 parameter it casts until the autocast region (forward and
    loss) ends, used again or not: such a copy lives to the end of the
    forward (the whole step in inference, where nothing else holds it;
    MemTracker on BERT-base inference under bf16 autocast: 1.107 GiB against
    0.900 in fp32)."""
    scale2 = BatchScaler(sentinel, 2)
    conv_ops, attn_bwd_ops = _op_sets()
    nodes = list(gm.graph.nodes)
    n_steps = max(len(nodes), 1)
    last = n_steps - 1
    marks = tuple(phase_marks)
    training = len(marks) >= 1

    def phase_of(idx: int) -> int:
        p = 0
        for i, m in enumerate(marks):
            if idx >= m:
                p = i + 1
        return p

    cols = StorageColumns()
    last_phase: list[int] = []   # the latest phase that reads each storage
    index: dict[int, int] = {}   # storage key -> entry
    of_node: dict[Any, list[int]] = {}
    cached: list[int] = []       # 16-bit copies of parameters in autocast's cast cache

    def add(c: float, p: int, dt: int, a: int, f: int, category: int, cp: int = 0) -> int:
        last_phase.append(phase_of(a))
        return cols.add(c, p, dt, a, f, category, cp)

    for idx, node in enumerate(nodes):
        if node.op == "output":
            for arg in node.all_input_nodes:
                for e in of_node.get(arg, ()):
                    cols.free[e] = last
            continue
        val = node.meta.get("val")
        entries: list[int] = []
        role = None
        if node.op == "placeholder":
            role = INPUTS
            for prefix, r in _PLACEHOLDER_ROLES:
                if node.name.startswith(prefix):
                    role = r
                    break
        elif node.op == "get_attr":
            role = BUFFERS
        for k, t in enumerate(_tensors(val)):
            key = _storage_key(t)
            if key is None:
                continue
            e = index.get(key)
            if e is None:
                c, p = _size_of(t, scale2, sentinel)
                if role is not None:
                    e = add(c, p, dtypes.of_torch(t.dtype), 0, last, role)
                else:
                    e = add(c, p, dtypes.of_torch(t.dtype), idx, idx, TEMPORARIES)
                index[key] = e
                if origins is not None:
                    origins.append((idx, k))
            entries.append(e)
        of_node[node] = entries
        if node.op != "call_function":
            continue
        if node.target is operator.getitem:
            continue  # an element of a multi-output op: an alias, not a read
        ph = phase_of(idx)
        for arg in node.all_input_nodes:
            for e in of_node.get(arg, ()):
                cols.use(e, idx)
                if ph > last_phase[e]:
                    last_phase[e] = ph
        for e in entries:  # an op writing in place into a storage also uses it
            cols.use(e, idx)
        target = node.target
        if amp is not None and target is torch.ops.aten._to_copy.default and entries \
                and _casts_a_parameter(node, of_node, cols.category):
            cached.extend(entries)
        if target in conv_ops:
            biggest = max((t for a in node.all_input_nodes for t in _tensors(a.meta.get("val")))
                          , key=lambda t: t.numel(), default=None)
            if biggest is not None:
                c, p = _size_of(biggest, scale2, sentinel, storage=False)
                add(c, p, dtypes.of_torch(biggest.dtype), idx, idx, WORKSPACE, CUDNN_WORKSPACE_CAP)
                if origins is not None:
                    origins.append((idx, -1))
        elif target in attn_bwd_ops:
            q = node.args[1] if len(node.args) > 1 else None   # (grad_out, q, k, v, ...)
            qv = q.meta.get("val") if isinstance(q, torch.fx.Node) else None
            if isinstance(qv, torch.Tensor):
                c, p = _size_of(qv, scale2, sentinel, storage=False)
                add(c, p, L.F32, idx, idx, WORKSPACE)
                if origins is not None:
                    origins.append((idx, -1))

    cat_a = np.asarray(cols.category, np.int64)
    free_a = np.asarray(cols.free, np.int64)
    if cached:
        region_end = marks[0] - 1 if training else last
        c = np.asarray(cached, np.int64)
        free_a[c] = np.maximum(free_a[c], region_end)
    if training and len(marks) >= 1:
        born = np.asarray([phase_of(a) for a in cols.alloc], np.int64)
        read = np.asarray(last_phase, np.int64)
        made = cat_a == TEMPORARIES
        cat_a[made & (born == L.FORWARD) & (read >= L.BACKWARD)] = ACTIVATIONS
        grads = made & (born == L.BACKWARD) & (read == L.OPTIMIZER_PHASE)
        cat_a[grads] = GRADIENTS
        free_a[grads] = last
    return cols.profile(n_steps, marks, training, category=cat_a, free=free_a)
