"""The layout pass: what tensor parallelism, pipeline stages and recomputation
would do to a traced step, found once in the aten graph and stored on the
Graph (``Graph.layout``, a :class:`~predictor.optable.LayoutProfile`), so that
``predict(..., parallel=, checkpoint=)`` transforms the graph for any layout
without retracing.

Three analyses over the same graph the lowering and memory pass walk:

- **Blocks.** Parameters named ``<list>.<i>.…`` (``transformer.h.3.attn…``,
  ``model.layers.12.mlp…``) belong to block ``i`` of the longest module list;
  a model without one (a CNN) takes its top-level modules as blocks. Forward
  ops belong to the latest block among their inputs, backward ops to the
  earliest (the gradient flows from the loss towards the inputs), so each op
  lands in the block whose weights it computes with. Group 0 is everything
  before the first block (embeddings), group ``n + 1`` everything after the
  last (final norm, head, loss).
- **Megatron pairs.** A forward linear (mm/addmm/bmm with a 2-D parameter
  operand) is *column-parallel* when its output reaches exactly one other
  linear — the *row-parallel* one — without passing a normalisation, another
  linear or the loss: q/k/v → attention → output projection, fc1/gate/up →
  activation → fc2/down. A head whose output only reaches the loss is
  vocab-parallel (its weight's output dim is sharded, and a word embedding
  sharing its vocabulary is sharded with it). Sharding is then propagated
  through the whole step (forward, backward) by op rules — views, transposes,
  pointwise ops with broadcasting, matmuls, attention, softmax, reductions,
  losses — as a sharded tensor axis per tensor. A matmul or reduction that
  contracts a sharded axis is an all-reduce point (its output bytes are the
  collective's); an op whose rule does not apply runs whole (listed in
  ``kept_whole``).
- **Shapes.** Each op's rows are extracted a second time with every sharded
  axis doubled: the difference is the *sharded part* of each dim, so at tensor
  parallel degree ``t`` a row's dims are ``dims - sharded * (1 - 1/t)``
  whatever the family (matmul M/N/K, attention heads, element counts).
"""

from __future__ import annotations

import math
import operator
import re
from collections import defaultdict
from typing import Any, Sequence

import numpy as np
import torch
import torch.fx

from predictor import families
from predictor.families import TensorMeta
from predictor.kernels import layout as L
from predictor.lowering import (BatchScaler, _rows_at, is_channels_last, is_contiguous,
                                is_transposed_view)
from predictor.optable import LayoutProfile, OpTable

aten = torch.ops.aten

SHARDED, ATTENTION_CORE = 1, 2   # LayoutProfile.split_flags / act_flags bits
PARTIAL = "P"                    # a tensor that is a partial sum over the TP group
PROBE = 2                        # sharded axes are multiplied by this to find sharded dims

_VIEW_OPS = {"view", "_unsafe_view", "reshape", "view_as", "_reshape_alias"}
_SAME_OPS = {"clone", "_to_copy", "detach", "alias", "contiguous", "copy", "lift_fresh_copy",
             "native_dropout_backward", "gelu_backward", "silu_backward", "threshold_backward",
             "tanh_backward", "sigmoid_backward", "fill", "zeros_like", "ones_like",
             "empty_like", "masked_fill", "where", "_masked_scale", "native_dropout"}
_NORM_OPS = {"native_layer_norm", "layer_norm", "rms_norm", "_fused_rms_norm",
             "native_group_norm", "native_batch_norm", "_native_batch_norm_legit",
             "_native_batch_norm_legit_functional", "cudnn_batch_norm"}
_LOSS_OPS = {"nll_loss_forward", "nll_loss2d_forward", "mse_loss", "binary_cross_entropy",
             "binary_cross_entropy_with_logits", "smooth_l1_loss", "cross_entropy_loss"}
_MM_OPS = {"mm", "addmm", "bmm", "baddbmm"}
_REDUCE_OPS = {"sum", "mean", "amax", "amin", "var", "std", "prod", "logsumexp", "max", "min",
               "var_mean", "norm", "linalg_vector_norm"}


def _name(node) -> str:
    t = node.target
    return str(t.overloadpacket.__name__) if isinstance(t, torch._ops.OpOverload) else ""


def _shape(x) -> tuple[int, ...] | None:
    v = x.meta.get("val") if isinstance(x, torch.fx.Node) else x
    return tuple(int(d) for d in v.shape) if isinstance(v, torch.Tensor) else None


# ------------------------------------------------------------------ blocks --

_INDEX = re.compile(r"^(.*?)\.(\d+)(?:\.|$)")


def param_blocks(names: Sequence[str]) -> tuple[list[int], list[str]]:
    """Block group of every parameter (0: before the blocks, 1..n the blocks,
    n+1 after them) and the blocks' names."""
    lists: dict[str, set[int]] = defaultdict(set)
    for n in names:
        m = _INDEX.match(n)
        if m:
            lists[m.group(1)].add(int(m.group(2)))
    keys: list[str | None] = []
    if lists:
        prefix = max(lists, key=lambda k: (len(lists[k]), -len(k)))
    if lists and len(lists[prefix]) >= 2:
        for n in names:
            m = _INDEX.match(n)
            keys.append(f"{prefix}.{m.group(2)}" if m and m.group(1) == prefix else None)
    else:
        keys = [n.split(".")[0] if "." in n else None for n in names]
    order: list[str] = []
    for k in keys:
        if k is not None and k not in order:
            order.append(k)
    if not order:
        return [1] * len(names), ["model"]
    first = {k: names[keys.index(k)] for k in order}
    del first
    idx = {k: i + 1 for i, k in enumerate(order)}
    out: list[int] = []
    seen_block = False
    for i, k in enumerate(keys):
        if k is not None:
            seen_block = True
            out.append(idx[k])
        else:
            # Outside the blocks: before them if registered before any block.
            out.append(len(order) + 1 if seen_block else 0)
    return out, order


# ------------------------------------------------------- sharding rules --

def _view_axis(src: tuple, dst: tuple, a: int, sub: tuple[int, int] | None = None):
    """After a reshape of `src` to `dst`: (axis, (size, inner)) of `dst` that
    holds the sharded factor of axis `a` of `src` — a factor of `size`
    elements at stride `inner` inside the axis (``sub``; default the whole
    axis) — or None when no head split explains where it went."""
    size, inner = sub if sub is not None else (src[a], 1)
    if size <= 1:
        return None
    lo = math.prod(src[a + 1:]) * inner      # flat stride of the factor
    hi = lo * size
    cands = []
    for j in range(len(dst)):
        s_j = math.prod(dst[j + 1:])
        e_j = s_j * dst[j]
        if dst[j] == 1:
            continue
        if s_j <= lo and e_j >= hi:          # inside one output axis
            return j, (size, lo // s_j)
        if s_j >= lo and e_j <= hi:          # split over several output axes
            cands.append(j)
    if not cands:
        return None
    if len(cands) == 1:
        return cands[0], (dst[cands[0]], 1)
    # [3h] -> [3, heads, head_dim], [h] -> [heads, head_dim]: the heads axis
    # (Megatron's layout), the largest but the innermost.
    j = max(cands[:-1], key=lambda c: dst[c])
    return j, (dst[j], 1)


def _norm_axis(a: int, ndim: int) -> int:
    return a + ndim if a < 0 else a


class _Propagator:
    """Per fx node: the sharded axis of each output tensor (int), None
    (replicated) or PARTIAL; and whether the op itself runs sharded."""

    def __init__(self, gm, seeds: dict, fwd_end: int):
        self.ax: dict[Any, Any] = dict(seeds)
        self.sharded_op: set = set()
        self.kept_whole: dict[str, int] = defaultdict(int)
        self.kept_at: list = []   # (node index, name) of every op counted in kept_whole
        self.partial: list = []   # (node, element count) all-reduce points
        self.fwd_end = fwd_end
        self.lazy_params: set = set()
        self.sub: dict = {}       # node -> (size, inner) of a factor inside its sharded axis

    def get(self, x, i: int | None = None):
        if not isinstance(x, torch.fx.Node):
            return None
        a = self.ax.get(x)
        if isinstance(a, (list, tuple)):
            return a[i] if i is not None and i < len(a) else None
        return a

    def run(self, idx: int, node) -> None:
        name = _name(node)
        if node.target is operator.getitem:
            src, i = node.args
            a = self.ax.get(src)
            self.ax[node] = a[i] if isinstance(a, (list, tuple)) and i < len(a) else None
            return
        ins = [a for a in node.all_input_nodes]
        if not any(self._is_sharded(a) for a in ins):
            return
        out = self._rule(name, node)
        if out is _WHOLE:
            self.kept_whole[name or str(node.target)] += 1
            self.kept_at.append((idx, name or str(node.target)))
            self.ax[node] = None
            return
        self.ax[node] = out
        if isinstance(out, int) and not isinstance(out, bool) and node not in self.sub:
            # the sharded factor's place inside the axis, from an input whose
            # axis has the same size (a pointwise op, a transpose, a copy)
            dst = _shape(node)
            for a in ins:
                ai = self.get(a)
                if a in self.sub and isinstance(ai, int) and dst is not None and out < len(dst):
                    src = _shape(a)
                    if src is not None and ai < len(src) and src[ai] == dst[out]:
                        self.sub[node] = self.sub[a]
                        break
        if _any_sharded(out) or out == PARTIAL:
            self.sharded_op.add(node)
        if out == PARTIAL:
            self.partial.append(node)
            self.ax[node] = None

    def _is_sharded(self, n) -> bool:
        a = self.ax.get(n)
        return _any_sharded(a)

    # -- the op rules ----------------------------------------------------------
    def _rule(self, name: str, node):
        args = node.args
        val = node.meta.get("val")
        if name in _VIEW_OPS or name == "expand":
            a, src, dst = self.get(args[0]), _shape(args[0]), _shape(node)
            if a is None or src is None or dst is None:
                return _WHOLE
            if name == "expand":
                return a + len(dst) - len(src)
            if src == dst:
                return a
            got = _view_axis(src, dst, a, self.sub.get(args[0]))
            if got is None:
                return _WHOLE
            self.sub[node] = got[1]
            return got[0]
        if name in ("t", "transpose", "permute", "unsqueeze", "squeeze", "select", "slice",
                    "unfold", "numpy_T"):
            return self._layout_rule(name, node)
        if name in ("split", "split_with_sizes", "chunk", "unbind", "unsafe_split"):
            a = self.get(args[0])
            dim = _norm_axis(int(args[2]) if len(args) > 2 else 0, len(_shape(args[0]) or ()))
            if a is None:
                return _WHOLE
            if name == "unbind":
                return _WHOLE if a == dim else [a - (1 if a > dim else 0)] * len(val)
            return [a] * len(val)
        if name in ("slice_backward", "select_backward"):
            # the gradient of a slice (RoPE's rotate_half) scattered back into the
            # input's shape: sharded the same way unless the slice cut the sharded axis
            a = self.get(args[0])
            rank = len(_shape(args[0]) or ())
            dim = _norm_axis(int(args[2]), rank + (1 if name == "select_backward" else 0))
            if a is None or isinstance(a, (list, tuple)) or a == PARTIAL:
                return _WHOLE
            if name == "select_backward":
                a = a + (1 if a >= dim else 0)
            return _WHOLE if a == dim else a
        if name == "cat":
            axes = {self.get(t) for t in args[0]}
            return axes.pop() if len(axes) == 1 and None not in axes else _WHOLE
        if name in _MM_OPS:
            return self._mm_rule(name, node)
        if "scaled_dot_product" in name:
            return self._attention_rule(node)
        if name in ("_softmax", "_log_softmax", "softmax", "log_softmax",
                    "_softmax_backward_data", "_log_softmax_backward_data"):
            a = self.get(args[0])
            return a if a is not None else self.get(args[1])
        if name in _NORM_OPS or name.endswith("_norm_backward") or name.startswith("native_layer_norm"):
            return self._norm_rule(node)
        if name in _LOSS_OPS:
            return PARTIAL if self.get(args[0]) is not None else _WHOLE
        if name in ("nll_loss_backward", "nll_loss2d_backward"):
            return self.get(args[1])
        if name == "embedding":
            return PARTIAL if self.get(args[0]) == 0 else _WHOLE
        if name == "embedding_dense_backward":
            return 0 if node in self.lazy_params else _WHOLE
        if name in _REDUCE_OPS:
            return self._reduce_rule(node)
        op = node.target
        if name in _SAME_OPS or torch.Tag.pointwise in families.tags(op):
            return self._pointwise_rule(node)
        return _WHOLE

    def _layout_rule(self, name, node):
        args = node.args
        a = self.get(args[0])
        src = _shape(args[0])
        if a is None or src is None:
            return _WHOLE
        nd = len(src)
        if name in ("t", "numpy_T"):
            return nd - 1 - a if nd == 2 else a
        if name == "transpose":
            d0, d1 = _norm_axis(int(args[1]), nd), _norm_axis(int(args[2]), nd)
            return d1 if a == d0 else d0 if a == d1 else a
        if name == "permute":
            dims = [_norm_axis(int(d), nd) for d in args[1]]
            return dims.index(a)
        if name == "unsqueeze":
            d = _norm_axis(int(args[1]), nd + 1)
            return a + 1 if d <= a else a
        if name == "squeeze":
            dst = _shape(node)
            got = _view_axis(src, dst, a, self.sub.get(args[0])) if dst is not None else None
            if got is None:
                return _WHOLE
            self.sub[node] = got[1]
            return got[0]
        if name == "select":
            d = _norm_axis(int(args[1]), nd)
            return _WHOLE if d == a else a - (1 if d < a else 0)
        if name in ("slice", "unfold"):
            d = _norm_axis(int(args[1]) if len(args) > 1 else 0, nd)
            return _WHOLE if d == a else a
        return _WHOLE

    def _mm_rule(self, name, node):
        args = node.args
        off = 1 if name in ("addmm", "baddbmm") else 0
        x, w = args[off], args[off + 1]
        ax, aw = self.get(x), self.get(w)
        bmm = name in ("bmm", "baddbmm")
        m_ax, k_ax_x, k_ax_w, n_ax = (1, 2, 1, 2) if bmm else (0, 1, 0, 1)
        if bmm and ax == 0 and aw == 0:
            return 0
        if ax == k_ax_x and aw == k_ax_w:
            return PARTIAL
        if ax == m_ax and aw is None:
            out = m_ax
        elif aw == n_ax and ax is None:
            out = n_ax
        else:
            return _WHOLE
        if off:
            ab = self.get(args[0])
            bias = _shape(args[0]) or ()
            if ab is None and len(bias) >= 1 and bias[-1] > 1 and out == n_ax:
                if not self._lazy_shard(args[0], len(bias) - 1):
                    return _WHOLE
        return out

    def _attention_rule(self, node):
        q = node.args[0] if "backward" not in _name(node) else node.args[1]
        aq = self.get(q)
        qs = _shape(q)
        if aq != 1 or qs is None:
            return _WHOLE
        val = node.meta.get("val")
        vals = val if isinstance(val, (list, tuple)) else [val]
        out = []
        for v in vals:
            ok = isinstance(v, torch.Tensor) and v.dim() >= 2 and int(v.shape[1]) == qs[1]
            out.append(1 if ok else None)
        return out if isinstance(val, (list, tuple)) else out[0]

    def _norm_rule(self, node):
        name = _name(node)
        xi = 1 if "backward" in name else 0
        x = node.args[xi]
        a = self.get(x)
        xs = _shape(x)
        if a is None or xs is None:
            return _WHOLE
        if "layer_norm" in name or "rms_norm" in name:
            nshape = node.args[xi + 1]
            if a >= len(xs) - len(nshape):
                return _WHOLE
        elif a == 1:   # batch/group norm over channels: channel-sharded is fine
            pass
        val = node.meta.get("val")
        if isinstance(val, (list, tuple)):
            return [a if isinstance(v, torch.Tensor) and v.dim() == len(xs) and
                    int(v.shape[a]) == xs[a] else None for v in val]
        return a

    def _reduce_rule(self, node):
        x = node.args[0]
        a, xs = self.get(x), _shape(x)
        if a is None or xs is None:
            return _WHOLE
        dims = node.args[1] if len(node.args) > 1 else None
        keep = bool(node.args[2]) if len(node.args) > 2 and isinstance(node.args[2], bool) else \
            bool(node.kwargs.get("keepdim", False))
        if dims is None or dims == [] or isinstance(dims, torch.dtype):
            return PARTIAL
        dims = [dims] if isinstance(dims, int) else list(dims)
        dims = [_norm_axis(int(d), len(xs)) for d in dims]
        if a in dims:
            return PARTIAL
        return a if keep else a - sum(1 for d in dims if d < a)

    def _pointwise_rule(self, node):
        val = node.meta.get("val")
        first = val[0] if isinstance(val, (list, tuple)) else val
        if not isinstance(first, torch.Tensor):
            return _WHOLE
        out_nd = first.dim()
        out_shape = tuple(int(d) for d in first.shape)
        axis = None
        tensor_args = [a for a in node.all_input_nodes
                       if isinstance(a.meta.get("val"), torch.Tensor)]
        for t in tensor_args:
            a = self.get(t)
            if a is None:
                continue
            o = a + out_nd - t.meta["val"].dim()
            if axis is not None and axis != o:
                return _WHOLE
            axis = o
        if axis is None or axis < 0:
            return _WHOLE
        for t in tensor_args:
            if self.get(t) is not None:
                continue
            ts = _shape(t)
            o = axis - (out_nd - len(ts))
            if o < 0 or ts[o] == 1:
                continue    # broadcast along the sharded axis: fine
            if not self._lazy_shard(t, o):
                return _WHOLE
        if isinstance(val, (list, tuple)):
            return [axis if isinstance(v, torch.Tensor) and v.dim() == out_nd else None
                    for v in val]
        return axis

    def _lazy_shard(self, t, axis: int) -> bool:
        """A parameter (through views) met a sharded tensor along `axis`: a
        column-parallel bias; shard it."""
        cur = t
        while cur.op == "call_function" and _name(cur) in _VIEW_OPS | {"_to_copy", "clone", "expand"}:
            if _shape(cur.args[0]) != _shape(cur):
                return False
            cur = cur.args[0]
        if cur.op != "placeholder" or not cur.name.startswith("params"):
            return False
        self.ax[cur] = axis
        self.ax[t] = axis
        self.lazy_params.add(cur)
        return True


class _Whole:
    def __repr__(self):
        return "WHOLE"


_WHOLE = _Whole()


def _any_sharded(a) -> bool:
    if isinstance(a, (list, tuple)):
        return any(isinstance(x, int) and not isinstance(x, bool) for x in a)
    return isinstance(a, int) and not isinstance(a, bool)


# ------------------------------------------------------ linear detection --

def _param_source(n, params: set):
    """(placeholder, axis map) when `n` is a parameter seen through views
    that keep its two axes (t, transpose, casts); axis map: n's axis -> param's."""
    perm = [0, 1]
    cur = n
    for _ in range(8):
        if not isinstance(cur, torch.fx.Node):
            return None
        if cur.op == "placeholder":
            return (cur, perm) if cur in params else None
        name = _name(cur)
        if name in ("t", "transpose", "numpy_T", "permute"):
            perm = [perm[1], perm[0]]
        elif name in ("_to_copy", "clone", "detach", "alias", "contiguous", "view", "_unsafe_view"):
            if _shape(cur) != _shape(cur.args[0]):
                return None
        else:
            return None
        cur = cur.args[0]
    return None


def _linears(nodes, fwd_end: int, params: set):
    """Forward linears: node -> (weight placeholder, weight axis of the
    output features, weight axis of the input features, activation arg)."""
    out = {}
    for idx, node in enumerate(nodes[:fwd_end]):
        name = _name(node)
        if name not in ("mm", "addmm"):
            continue
        off = 1 if name == "addmm" else 0
        x, w = node.args[off], node.args[off + 1]
        src = _param_source(w, params)
        if src is None or len(_shape(w) or ()) != 2:
            continue
        ph, perm = src
        # w is [k, n]: its axis 1 is the output features, axis 0 the input.
        out[node] = (ph, perm[1], perm[0], x)
    return out


_STOP = _NORM_OPS | _LOSS_OPS | {"_log_softmax", "log_softmax", "embedding"}


def _reach(start, linears: dict, fwd_nodes: set, limit: int = 400):
    """Linears whose activation input `start`'s output reaches, and whether a
    loss is reached, without passing a norm, another linear or the loss."""
    found, loss = set(), False
    stack, seen = [start], {start}
    while stack and len(seen) < limit:
        cur = stack.pop()
        for u in cur.users:
            if u in seen or u not in fwd_nodes:
                continue
            seen.add(u)
            name = _name(u)
            if u in linears:
                if linears[u][3] is cur or _feeds(cur, linears[u][3]):
                    found.add(u)
                continue
            if name in _STOP or name in ("_log_softmax",):
                loss |= name in _LOSS_OPS or name in ("_log_softmax", "log_softmax")
                continue
            if name in _REDUCE_OPS and _reduces_last(u):
                continue
            stack.append(u)
    return found, loss


def _feeds(a, b) -> bool:
    return a is b


def _reduces_last(node) -> bool:
    xs = _shape(node.args[0]) or ()
    dims = node.args[1] if len(node.args) > 1 else None
    if not isinstance(dims, (list, tuple, int)):
        return True
    dims = [dims] if isinstance(dims, int) else dims
    return any(_norm_axis(int(d), len(xs)) == len(xs) - 1 for d in dims) if xs else True


def megatron_pairs(nodes, fwd_end: int, params: set, param_names: dict):
    """Seeds of the TP propagation {placeholder: sharded axis} and the names
    of the column-, row- and vocab-parallel weights and the unsharded linears."""
    linears = _linears(nodes, fwd_end, params)
    fwd_nodes = set(nodes[:fwd_end])
    reached_by: dict = defaultdict(set)
    reaches: dict = {}
    head = []
    for lin in linears:
        found, loss = _reach(lin, linears, fwd_nodes)
        reaches[lin] = found
        for f in found:
            reached_by[f].add(lin)
        if not found and loss:
            head.append(lin)
    seeds: dict = {}
    column, row = set(), set()
    for lin in linears:   # forward order
        if lin in column or lin in row:
            continue
        targets = reaches[lin]
        if len(targets) != 1:
            continue
        r = next(iter(targets))
        if r in column or r in row:
            continue
        group = {c for c in reached_by[r] if reaches[c] == {r} and c not in row}
        if lin not in group:
            continue
        column |= group
        row.add(r)
    weight_uses: dict = defaultdict(int)
    for lin, (ph, *_rest) in linears.items():
        weight_uses[ph] += 1
    vocab = set()
    for lin in head:
        ph, out_ax, _, _ = linears[lin]
        n_out = (_shape(ph) or (0, 0))[out_ax]
        if n_out >= 1000 and lin not in column and lin not in row:
            vocab.add(lin)
    names = {"column": [], "row": [], "vocab": [], "whole": []}
    for lin, (ph, out_ax, in_ax, _) in linears.items():
        pn = param_names.get(ph, ph.name)
        if weight_uses[ph] > 1 and lin not in vocab:
            names["whole"].append(pn)
            continue
        if lin in column:
            seeds[ph] = out_ax
            names["column"].append(pn)
        elif lin in row:
            seeds[ph] = in_ax
            names["row"].append(pn)
        elif lin in vocab:
            seeds[ph] = out_ax
            names["vocab"].append(pn)
        else:
            names["whole"].append(pn)
    return seeds, names, {ph for lin in vocab for ph in [linears[lin][0]]}


# ----------------------------------------------------------- the pass --

def analyse(gm, phase_marks: Sequence[int], sentinel: int | None, batch: int,
            node_rows: dict[int, list[int]], table: OpTable, param_names: Sequence[str],
            seq_len: int | None, memory=None, detail: dict | None = None) -> LayoutProfile | None:
    """The LayoutProfile of a traced training step (None for an inference
    graph or one without parameters).

    `detail`, when given, receives what each node contributed (for
    predictor.frontend.blocks, which replicates a block's share): "splits"
    {node index: [(index into its node_rows, split key)]}, "comm" [node index
    of each all-reduce point], "kept" [(node index, name)] and "boundary"
    {block group: (base, slope)}."""
    nodes = list(gm.graph.nodes)
    if len(phase_marks) < 2:
        return None
    fwd_end, bwd_end = int(phase_marks[0]), int(phase_marks[1])
    placeholders = [n for n in nodes if n.op == "placeholder" and n.name.startswith("params")]
    if not placeholders:
        return None
    names = list(param_names)[:len(placeholders)]
    names += [p.name for p in placeholders[len(names):]]
    pname = dict(zip(placeholders, names))
    pblock, block_names = param_blocks(names)
    n_blocks = len(block_names)
    post = n_blocks + 1
    params = set(placeholders)

    seeds, lin_names, vocab_heads = megatron_pairs(nodes, fwd_end, params, pname)
    # A word embedding whose table has the vocab-parallel head's vocabulary.
    vocab_sizes = {(_shape(ph) or (0,))[0] for ph in vocab_heads} | \
        {(_shape(ph) or (0, 0))[1] for ph in vocab_heads}
    prop = _Propagator(gm, seeds, fwd_end)
    for node in nodes[:fwd_end]:
        if _name(node) == "embedding":
            w = node.args[0]
            ws = _shape(w)
            if w in params and ws and len(ws) == 2 and vocab_heads and ws[0] in vocab_sizes:
                prop.ax[w] = 0
                if pname[w] not in lin_names["vocab"]:
                    lin_names["vocab"].append(pname[w])
    embed_weights = {ph for ph, a in prop.ax.items() if ph in params and a == 0}
    for idx, node in enumerate(nodes[:bwd_end]):
        if node.op != "call_function":
            continue
        if _name(node) == "embedding_dense_backward":
            # the gradient of a vocab-parallel embedding is sharded by rows
            fwd = [n for n in nodes[:fwd_end] if _name(n) == "embedding" and n.args[0] in embed_weights
                   and prop.ax.get(n.args[0]) == 0 and _shape(n.args[0])[0] == node.args[2]]
            if fwd:
                prop.lazy_params.add(node)
                prop.ax[node] = 0
                prop.sharded_op.add(node)
                continue
        prop.run(idx, node)

    # ---- block of every node
    grp: dict[Any, int] = {}
    for ph, b in zip(placeholders, pblock):
        grp[ph] = b
    for idx, node in enumerate(nodes[:bwd_end]):
        if node.op != "call_function":
            if node not in grp:
                grp[node] = 0
            continue
        ins = [grp.get(a, 0) for a in node.all_input_nodes]
        if idx < fwd_end:
            grp[node] = max(ins, default=0)
        else:
            inner = [g for g in ins if g > 0]
            grp[node] = min(inner) if inner else (0 if ins else post)

    # ---- parameters before the blocks that the head uses too (a tied word
    # embedding): with pipeline stages the last stage holds a copy
    fwd_nodes = set(nodes[:fwd_end])
    passthrough = _VIEW_OPS | {"t", "transpose", "permute", "expand", "_to_copy", "detach",
                               "alias", "clone"}

    def used_after_blocks(ph) -> bool:
        todo, seen = [ph], set()
        while todo:
            for u in todo.pop().users:
                if u in seen or u not in fwd_nodes:
                    continue
                seen.add(u)
                if _name(u) in passthrough:
                    todo.append(u)
                elif grp.get(u) == post:
                    return True
        return False

    p_tied = np.asarray([1 if b == 0 and used_after_blocks(ph) else 0
                         for ph, b in zip(placeholders, pblock)], np.int64)

    # ---- rows: (row, group, sharded part of dims, flags) -> count
    scal = (BatchScaler(sentinel, 1), BatchScaler(sentinel, 2))
    splits: dict[tuple, int] = defaultdict(int)
    cache: dict = {}
    score = None if not seq_len else int(seq_len)
    for idx, node in enumerate(nodes):
        rows = node_rows.get(idx)
        if not rows:
            continue
        g = grp.get(node, 0) if idx < bwd_end else -1
        flags = 0
        sb = ss = None
        if node in prop.sharded_op:
            key = (node.target, _probe_key(node, prop))
            hit = cache.get(key)
            if hit is None:
                hit = _sharded_parts(node, prop, scal)
                cache[key] = hit
            sb, ss = hit
            if sb is not None:
                flags |= SHARDED
        if idx < fwd_end and score and _score_shaped(node, score) and 0 < g <= n_blocks:
            flags |= ATTENTION_CORE
        for j, r in enumerate(rows):
            if r < 0:
                continue
            if sb is not None and j < len(sb):
                b_, s_ = tuple(sb[j]), tuple(ss[j])
            else:
                b_ = s_ = (0,) * L.MAX_DIMS
            f = flags if any(b_) or any(s_) else flags & ~SHARDED
            splits[(r, g, b_, s_, f)] += 1
            if detail is not None:
                detail.setdefault("splits", {}).setdefault(idx, []).append((j, (r, g, b_, s_, f)))

    m = len(splits)
    prof_rows = np.zeros(m, np.int64)
    prof_grp = np.zeros(m, np.int64)
    prof_cnt = np.zeros(m, np.int64)
    prof_flags = np.zeros(m, np.int64)
    sbase = np.zeros((m, L.MAX_DIMS), np.int64)
    sslope = np.zeros((m, L.MAX_DIMS), np.int64)
    for i, ((r, g, b_, s_, f), c) in enumerate(splits.items()):
        prof_rows[i], prof_grp[i], prof_cnt[i], prof_flags[i] = r, g, c, f
        sbase[i], sslope[i] = b_, s_

    # ---- all-reduce points
    comm_phase, comm_grp, comm_base, comm_slope, comm_dtype = [], [], [], [], []
    for node in prop.partial:
        v = node.meta.get("val")
        v = v[0] if isinstance(v, (list, tuple)) else v
        if not isinstance(v, torch.Tensor):
            continue
        e1 = math.prod(scal[0].dim(int(d)) for d in v.shape)
        e2 = math.prod(scal[1].dim(int(d)) for d in v.shape)
        idx = nodes.index(node)
        if detail is not None:
            detail.setdefault("comm", []).append(idx)
        comm_phase.append(L.FORWARD if idx < fwd_end else L.BACKWARD)
        comm_grp.append(grp.get(node, 0))
        comm_base.append(2 * e1 - e2)
        comm_slope.append(e2 - e1)
        from predictor import dtypes
        comm_dtype.append(dtypes.of_torch(v.dtype))

    # ---- parameters
    p_numel = np.asarray([math.prod(_shape(p) or ()) for p in placeholders], np.int64)
    p_sharded = np.asarray([1 if _any_sharded(prop.ax.get(p)) else 0 for p in placeholders],
                           np.int64)
    trainable = gm.meta.get("trainable")
    p_grad = np.asarray([1 if trainable is None or pname[p] in trainable else 0
                         for p in placeholders], np.int64)

    # ---- block boundaries: the largest forward tensor passed from block k to k+1
    best = _boundary_best(nodes[:fwd_end], grp, n_blocks, scal)
    boundary = boundary_of(best)
    if detail is not None:
        detail["kept"] = list(prop.kept_at)
        detail["boundary"] = dict(best)

    # ---- storages of the memory profile: block and flags of the op that made them
    act_grp = act_flags = None
    if memory is not None:
        alloc = memory.alloc
        node_grp = np.asarray([grp.get(n, 0) if i < bwd_end else -1 for i, n in enumerate(nodes)]
                              + [0], np.int64)
        node_flag = np.zeros(len(nodes) + 1, np.int64)
        for i, n in enumerate(nodes[:fwd_end]):
            a = prop.ax.get(n)
            if _any_sharded(a):
                node_flag[i] |= SHARDED
            if score and _score_shaped(n, score):
                node_flag[i] |= ATTENTION_CORE
        for ph in placeholders:
            pass
        clip = np.clip(alloc, 0, len(nodes))
        act_grp = node_grp[clip]
        act_flags = node_flag[clip]

    return LayoutProfile(
        n_blocks=n_blocks, block_names=list(block_names),
        split_row=prof_rows, split_group=prof_grp, split_count=prof_cnt, split_flags=prof_flags,
        split_sbase=sbase, split_sslope=sslope,
        comm_phase=np.asarray(comm_phase, np.int64), comm_group=np.asarray(comm_grp, np.int64),
        comm_base=np.asarray(comm_base, np.int64), comm_slope=np.asarray(comm_slope, np.int64),
        comm_dtype=np.asarray(comm_dtype, np.int64),
        param_numel=p_numel, param_group=np.asarray(pblock, np.int64), param_sharded=p_sharded,
        param_trainable=p_grad, param_tied=p_tied,
        boundary_base=int(boundary[0]), boundary_slope=int(boundary[1]),
        act_group=act_grp, act_flags=act_flags,
        column_parallel=lin_names["column"], row_parallel=lin_names["row"],
        vocab_parallel=lin_names["vocab"], unsharded_linears=lin_names["whole"],
        kept_whole=dict(prop.kept_whole),
    )


def _score_shaped(node, s: int) -> bool:
    v = node.meta.get("val")
    v = v[0] if isinstance(v, (list, tuple)) and v else v
    return isinstance(v, torch.Tensor) and v.dim() >= 3 and int(v.shape[-1]) == s \
        and int(v.shape[-2]) == s


def _boundary_best(fwd_nodes, grp, n_blocks: int, scal) -> dict[int, tuple[int, int]]:
    """Per block group g: the largest forward tensor (base, slope) passed to g + 1."""
    best: dict[int, tuple[int, int]] = {}
    for node in fwd_nodes:
        g = grp.get(node, 0)
        if not 1 <= g < n_blocks:
            continue
        if not any(grp.get(u, 0) == g + 1 for u in node.users):
            continue
        v = node.meta.get("val")
        if not isinstance(v, torch.Tensor):
            continue
        e1 = math.prod(scal[0].dim(int(d)) for d in v.shape)
        e2 = math.prod(scal[1].dim(int(d)) for d in v.shape)
        base, slope = 2 * e1 - e2, e2 - e1
        if g not in best or slope * 8 + base > best[g][1] * 8 + best[g][0]:
            best[g] = (base, slope)
    return best


def boundary_of(best: dict[int, tuple[int, int]]) -> tuple[int, int]:
    """The boundary of the LayoutProfile: the median of the blocks' largest."""
    if not best:
        return (0, 0)
    vals = sorted(best.values(), key=lambda x: x[1] * 8 + x[0])
    return vals[len(vals) // 2]


def _probe_key(node, prop) -> tuple:
    from predictor.lowering import _key
    axes = tuple(str(prop.ax.get(a)) for a in node.all_input_nodes)
    return (_key(node.args), _key(node.kwargs), _key(node.meta.get("val")), axes,
            str(prop.ax.get(node)))


class _ProbeScaler(BatchScaler):
    """Shapes at a batch with every sharded axis multiplied by PROBE."""

    def __init__(self, base: BatchScaler, prop: _Propagator):
        super().__init__(base.sentinel, base.batch)
        self.prop = prop

    def convert(self, x: Any) -> Any:
        if isinstance(x, torch.fx.Node):
            a = self.prop.ax.get(x)
            return self._probe(x.meta.get("val"), a)
        return super().convert(x)

    def _probe(self, v, a):
        if isinstance(v, torch.Tensor):
            shape = [self.dim(int(d)) for d in v.shape]
            if isinstance(a, int) and not isinstance(a, bool) and 0 <= a < len(shape):
                shape[a] *= PROBE
            return TensorMeta(tuple(shape), v.dtype, is_transposed_view(v), is_channels_last(v),
                              is_contiguous(v))
        if isinstance(v, (list, tuple)):
            axes = a if isinstance(a, (list, tuple)) else [None] * len(v)
            return type(v)(self._probe(i, ai) for i, ai in zip(v, axes)) \
                if isinstance(v, list) else tuple(self._probe(i, ai) for i, ai in zip(v, axes))
        return super().convert(v)


def _sharded_parts(node, prop, scal):
    """Per extracted row, the sharded part of each dim at batch 1 (base) and
    its slope: dims(probe) - dims."""
    try:
        parts = []
        for sc in scal:
            plain, _ = _rows_at(node.target, node, sc)
            probe = _ProbeScaler(sc, prop)
            args = probe.convert(tuple(node.args))
            kwargs = {k: probe.convert(v) for k, v in node.kwargs.items()}
            out = probe._probe(node.meta.get("val"), prop.ax.get(node))
            probed, _ = families.extract(node.target, args, kwargs, out)
            if len(plain) != len(probed):
                return None, None
            rows = []
            for (f0, d0, _), (f1, d1, _) in zip(plain, probed):
                if f0 != f1:
                    return None, None
                diff = [(b - a) // (PROBE - 1) for a, b in zip(d0, d1)]
                if any(x < 0 for x in diff):
                    diff = [max(x, 0) for x in diff]
                rows.append(tuple(diff) + (0,) * (L.MAX_DIMS - len(diff)))
            parts.append(rows)
    except Exception:  # noqa: BLE001 — an extractor that cannot take the probe shape
        return None, None
    s1, s2 = parts
    base = [tuple(2 * a - b for a, b in zip(r1, r2)) for r1, r2 in zip(s1, s2)]
    slope = [tuple(b - a for a, b in zip(r1, r2)) for r1, r2 in zip(s1, s2)]
    # MATMUL's layout flag is not a size.
    return base, slope
