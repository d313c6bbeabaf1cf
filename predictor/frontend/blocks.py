"""Repeated blocks traced once and replicated.

A deep transformer is N identical blocks between an embedding and a head;
``make_fx`` spends almost all of a trace on the blocks (gpt3-2.7b: 32 blocks
of about 0.09 s each in a 3 s trace, see benchmarks/README.md). Here the same model is
built with 3 blocks instead of N and traced, lowered and analysed as usual;
the Graph of the N-block model is then assembled from that trace: the first
block as traced, the second (the *middle* template: a block between two
blocks) N - 2 times, the third as the last block. Every per-node result is
carried over: the op table's counts, the memory profile's storages (their
allocation and free steps moved to where the copy runs), the layout
analysis's per-block rows, all-reduce points, parameters and boundaries, and
the optimizer's ``_foreach_*`` rows are extracted again over the N-block
parameter lists (their dims hold the parameter count and the mean per tensor,
which no count scales).

Where each node belongs comes from the model, not from guessing: hooks on the
stack's modules mark, as ``make_fx`` records, the node index where each
block's forward starts and ends and where the gradients of its output and
input arrive; placeholders and optimizer lists belong to the block of their
parameter (its name: ``<stack>.<i>.``).

Exactness is checked, never assumed. The result is built only when the three
blocks' nodes, storages and rows are alike, position by position, in every
region (forward, backward, each placeholder and optimizer list), and when
every reference of the middle block (a storage freed in the next block, a
row's block group) means the same relative to the first and the last block;
otherwise :func:`replicated` returns None and the caller traces the full
model. Tests compare replicated and full traces of several models field by
field (tests/test_blocks.py).

Applies to zoo models whose stack is known (:func:`zoo_stack`: GPT-2/GPT-3,
BERT, OPT, Llama) with more than 4 blocks, in training and inference, with or
without mixed precision; not with ``memory_format`` (no zoo transformer has
4-D weights). User models are traced in full: their forward may depend on
the depth in ways no check here sees.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import logging
import operator
import time
from typing import Any, Callable

import numpy as np
import torch
from torch.fx.experimental.proxy_tensor import get_proxy_mode

from predictor import families, lowering, zoo
from predictor.frontend import autocast, layout_pass, memory_pass, optimizers
from predictor.kernels import layout as L
from predictor.lowering import BatchScaler
from predictor.optable import Graph, LayoutProfile, MemoryProfile, OpTable
from predictor.zoo import hf

log = logging.getLogger(__name__)

# The template: first, middle and last block. A 3-block trace is the
# smallest with a block between two blocks.
TEMPLATE_BLOCKS = 3

# The fields this module sets; a field added to Graph / MemoryProfile /
# LayoutProfile that is not here makes replication decline (a field it did
# not scale would be silently the 3-block model's).
_GRAPH_FIELDS = {"name", "ops", "batch_size", "mode", "optimizer", "seq_len", "parameters",
                 "trainable_parameters", "parameter_bytes", "unsupported", "batch_scalable",
                 "trace_seconds", "torch_version", "host_ops", "memory", "layout", "amp"}
_MEMORY_FIELDS = {"coef", "power", "dtype", "alloc", "free", "category", "cap", "n_steps",
                  "phase_marks", "training"}
_LAYOUT_FIELDS = {"n_blocks", "block_names", "split_row", "split_group", "split_count",
                  "split_flags", "split_sbase", "split_sslope", "comm_phase", "comm_group",
                  "comm_base", "comm_slope", "comm_dtype", "param_numel", "param_group",
                  "param_sharded", "param_trainable", "param_tied", "boundary_base",
                  "boundary_slope", "act_group", "act_flags", "column_parallel", "row_parallel",
                  "vocab_parallel", "unsharded_linears", "kept_whole"}


class NotReplicable(Exception):
    """The 3-block trace does not replicate exactly; trace the full model."""


@dataclasses.dataclass(frozen=True)
class Stack:
    """A model's repeated stack: `layers` blocks in the ModuleList at `path`;
    `build(k)` (and `build_inference(k)`) build the model with k blocks."""
    path: str
    layers: int
    build: Callable[[int], torch.nn.Module]
    build_inference: Callable[[int], torch.nn.Module] | None = None


# --------------------------------------------------------------- zoo stacks --

def _gpt2(name: str, k: int):
    cfg = hf.gpt2_config(name)
    cfg.n_layer = k
    return hf._causal_lm(cfg)


def _bert(name: str, head: str, k: int):
    cfg = hf.bert_config(name)
    cfg.num_hidden_layers = k
    if head == "AutoModelForSequenceClassification":
        cfg.num_labels = 2   # as hf.build_bert_classifier
    return hf._from_config(head, cfg)


def _opt(k: int):
    cfg = hf.opt_config()
    cfg.num_hidden_layers = k
    return hf._causal_lm(cfg)


def _llama(name: str, k: int):
    return hf.build_llama(name, layers=k)


def zoo_stack(name: str) -> Stack | None:
    """The repeated stack of zoo model `name` (None: none known)."""
    if name in hf.GPT2_SIZES:
        return Stack("transformer.h", hf.GPT2_SIZES[name][1], functools.partial(_gpt2, name))
    if name in hf.BERT_SIZES:
        return Stack("bert.encoder.layer", hf.BERT_SIZES[name][1],
                     functools.partial(_bert, name, "AutoModelForPreTraining"),
                     functools.partial(_bert, name, "AutoModelForSequenceClassification"))
    if name == "opt-1.3b":
        return Stack("model.decoder.layers", hf.OPT_1_3B["num_hidden_layers"], _opt)
    if name in hf.LLAMA_SIZES:
        return Stack("model.layers", hf.LLAMA_SIZES[name][2], functools.partial(_llama, name))
    return None


def replicated_zoo(entry, spec, mode: str, optimizer: str | None, amp: str | None,
                   trace_small: Callable) -> Graph | None:
    """:func:`replicated` for the zoo record `entry` when its stack is known:
    a zoo model's by name, a Hugging Face config's from its record (a factory
    spec never: its model is the user's); else None."""
    stack = zoo_stack(entry.name) if zoo.ZOO.get(entry.name) is entry else None
    if stack is None and entry.stack is not None:
        stack = Stack(*entry.stack)
    return None if stack is None else replicated(spec, stack, mode, optimizer, amp, trace_small)


# ------------------------------------------------------------ the hooks --

class _Marks:
    """Node indices, recorded while make_fx traces, where each block's forward
    starts ("fs") and ends ("fe") and where the gradient of its output ("bo")
    and of its input ("bi") arrive. Hooks record; they change no op."""

    def __init__(self, path: str, k: int):
        self.path, self.k = path, k
        self.events: list[tuple[str, int, int]] = []
        self.param_names: list[str] = []
        self.buffer_names: list[str] = []

    def install(self, module: torch.nn.Module) -> torch.nn.Module:
        self.events.clear()   # a retrace (sentinel fallback) builds again
        self.param_names = [n for n, _ in module.named_parameters()]
        self.buffer_names = [n for n, _ in module.named_buffers()]
        stack = module.get_submodule(self.path)
        if not isinstance(stack, torch.nn.ModuleList) or len(stack) != self.k:
            raise NotReplicable(f"{self.path} is not a ModuleList of {self.k} blocks")
        for i, block in enumerate(stack):
            block.register_forward_pre_hook(functools.partial(self._pre, i), with_kwargs=True)
            block.register_forward_hook(functools.partial(self._post, i), with_kwargs=True)
        return module

    def _at(self, what: str, i: int, *_: Any) -> None:
        proxy = get_proxy_mode()
        self.events.append((what, i, len(proxy.tracer.graph.nodes) if proxy is not None else -1))

    def _pre(self, i, module, args, kwargs):
        self._at("fs", i)
        x = args[0] if args else kwargs.get("hidden_states")
        if isinstance(x, torch.Tensor) and x.requires_grad:
            x.register_hook(functools.partial(self._at, "bi", i))

    def _post(self, i, module, args, kwargs, out):
        self._at("fe", i)
        y = next((t for t in torch.utils._pytree.tree_leaves(out)
                  if isinstance(t, torch.Tensor)), None)
        if isinstance(y, torch.Tensor) and y.requires_grad:
            y.register_hook(functools.partial(self._at, "bo", i))

    def ranges(self, kinds: tuple[str, str]) -> list[tuple[int, int]]:
        got: dict[str, dict[int, int]] = {kinds[0]: {}, kinds[1]: {}}
        for what, i, at in self.events:
            if what in got:
                if i in got[what]:
                    raise NotReplicable(f"block {i} ran twice")
                got[what][i] = at
        if any(sorted(v) != list(range(self.k)) for v in got.values()):
            raise NotReplicable("not every block was marked")
        return [(got[kinds[0]][i], got[kinds[1]][i]) for i in range(self.k)]


# -------------------------------------------------------- the expansion --

def _tmpl(b: int, n: int) -> int:
    """The template block (1 first, 2 middle, 3 last) of block b of n."""
    return 1 if b == 1 else TEMPLATE_BLOCKS if b == n else 2


class _Expansion:
    """A sequence of the 3-block trace (nodes, storages, list elements, ...)
    as the N-block model's: items tagged 0 (outside the blocks) stay once;
    within a segment, a region of runs tagged 1, 2, 3 (or 3, 2, 1, as
    backward runs) of equal length becomes the runs of blocks 1..N (or N..1),
    run 2 standing for every middle block.

    ``order``: [(item, block)] in the N-block order (block 0: outside);
    ``twin(i, t)``: the item at i's place in template block t's run."""

    def __init__(self, tags: list[int], segs: list[Any], n: int, sig: Callable | None = None,
                 what: str = "items"):
        self.tags, self.n = tags, n
        self.order: list[tuple[int, int]] = []
        self.starts: dict[int, tuple[dict[int, int], int]] = {}
        i, m_all = 0, len(tags)
        while i < m_all:
            if tags[i] == 0:
                self.order.append((i, 0))
                i += 1
                continue
            runs: list[tuple[int, int, int]] = []
            j = i
            while j < m_all and tags[j] != 0 and segs[j] == segs[i]:
                k = j
                while k < m_all and tags[k] == tags[j] and segs[k] == segs[i]:
                    k += 1
                runs.append((tags[j], j, k - j))
                j = k
            seq = [t for t, _, _ in runs]
            if seq == [1, 2, 3]:
                blocks = range(1, n + 1)
            elif seq == [3, 2, 1]:
                blocks = range(n, 0, -1)
            else:
                raise NotReplicable(f"{what}: blocks in the order {seq}")
            m = runs[0][2]
            if any(r[2] != m for r in runs):
                raise NotReplicable(f"{what}: blocks of {[r[2] for r in runs]} items")
            start = {t: s for t, s, _ in runs}
            if sig is not None:
                for o in range(m):
                    a, b, c = (sig(start[t] + o) for t in (1, 2, 3))
                    if not a == b == c:
                        raise NotReplicable(f"{what}: the blocks differ at item {o}: {a} {b} {c}")
            for x in range(i, j):
                self.starts[x] = (start, x - start[tags[x]])
            for b in blocks:
                s = start[_tmpl(b, n)]
                self.order.extend((s + o, b) for o in range(m))
            i = j

    def twin(self, i: int, t: int) -> int:
        start, off = self.starts[i]
        return start[t] + off

    def region(self, i: int) -> int:
        return id(self.starts[i][0])


def _remap_group(g: int, src: int, b: int, n: int, post3: int) -> int:
    """Block group g (3-block numbering: 0 before, 1..3, post3 after, -1 the
    optimizer) of an item of template block `src` (0: outside) in copy block
    b, as the N-block model's group."""
    if g <= 0:
        return g
    if g == post3:
        return n + 1
    if src == 0:
        if g == 2:
            raise NotReplicable("an item outside the blocks refers to the middle block")
        return 1 if g == 1 else n
    out = b + (g - src)
    if not 1 <= out <= n or abs(g - src) > 1:
        raise NotReplicable("a reference across more than one block")
    return out


def _check_relative(exp: _Expansion, values: Callable[[int, int], list], what: str) -> None:
    """Translation invariance: what the middle template refers to, relative
    to its block (``values(item, its block)``: hashable, one per reference,
    ``("rel", d, ...)`` or absolute), is what the first and last blocks' items
    at the same place refer to, wherever their reference stays inside the 3
    blocks (d >= 0 for the first, d <= 0 for the last)."""
    for i, (start, off) in exp.starts.items():
        if exp.tags[i] != 2:
            continue
        mid = values(i, 2)
        first = values(start[1] + off, 1)
        last = values(start[3] + off, 3)
        if not len(mid) == len(first) == len(last):
            raise NotReplicable(f"{what}: the blocks differ")
        for r2, r1, r3 in zip(mid, first, last):
            d = r2[1] if r2[0] == "rel" else 0
            if d >= 0 and r1 != r2 or d <= 0 and r3 != r2:
                raise NotReplicable(f"{what}: the middle block refers to its neighbours "
                                    "unlike the first and last")


# ------------------------------------------------------------ the entry --

def replicated(spec, stack: Stack, mode: str, optimizer: str | None, amp: str | None,
               trace_small: Callable) -> Graph | None:
    """The Graph of `spec` (predictor.frontend.fx's spec of a model of
    ``stack.layers`` blocks) from a trace of its 3-block copy; None when that
    cannot be exact (the reason is logged at debug level) or the model has
    too few blocks to gain anything. ``trace_small(spec)`` traces a spec as
    fx.trace does: (GraphModule, phase marks, parameter counts, notes,
    sentinel batch or None)."""
    n = stack.layers
    if n <= TEMPLATE_BLOCKS + 1:
        return None
    unknown = ({f.name for f in dataclasses.fields(Graph)} - _GRAPH_FIELDS
               or {f.name for f in dataclasses.fields(MemoryProfile)} - _MEMORY_FIELDS
               or {f.name for f in dataclasses.fields(LayoutProfile)} - _LAYOUT_FIELDS)
    if unknown:
        log.debug("blocks: not replicating, unknown fields %s", sorted(unknown))
        return None
    try:
        _, loop, clip = optimizers.parse(optimizer)
        if mode == "train" and (loop or clip or optimizers.fused(optimizer)):
            # A for-loop step's ops are one per parameter, outside every
            # per-parameter list this extracts again over the N blocks; the
            # clip's stacked norms are a tensor one element per parameter.
            raise NotReplicable(f"the optimizer {optimizer}: ops sized by the parameter count")
        return _replicate(spec, stack, mode, optimizer, amp, trace_small)
    except NotReplicable as exc:
        log.debug("blocks: tracing %s in full: %s", spec.name, exc)
        return None


def _replicate(spec, stack: Stack, mode, optimizer, amp, trace_small) -> Graph:
    start_time = time.perf_counter()
    k = TEMPLATE_BLOCKS
    marks_of = _Marks(stack.path, k)
    infer = stack.build_inference if mode == "inference" and spec.build_inference else None
    if mode == "inference" and spec.build_inference and infer is None:
        raise NotReplicable("no inference builder for the stack")
    # The same spec (inputs, loss, batch, sequence length), built with 3 blocks.
    small = copy.copy(spec)
    small.build = lambda: marks_of.install(stack.build(k))
    small.build_inference = (lambda: marks_of.install(infer(k))) if infer else None
    small.prebuilt = None
    try:
        gm, marks, counts, notes, sentinel = trace_small(small)
    except NotReplicable:
        raise
    except Exception as exc:  # noqa: BLE001 — the full trace reports the model's own errors
        raise NotReplicable(f"the 3-block model did not trace: {exc}") from exc
    spec.input_seq_len = small.input_seq_len
    seq = spec.seq_len if spec.seq_len is not None else spec.input_seq_len
    lowered = lowering.lower(gm, marks, sentinel, spec.batch_size)
    origins: list = []
    mem = memory_pass.profile(gm, marks if mode == "train" else (), sentinel, origins, amp=amp)
    detail: dict = {}
    layout = None
    if mode == "train":
        try:
            layout = layout_pass.analyse(
                gm, marks, sentinel, spec.batch_size, lowered.node_rows, lowered.table,
                gm.meta.get("param_names", ()), seq, mem, detail)
        except Exception as exc:  # noqa: BLE001 — as the full trace: analysis is optional
            raise NotReplicable(f"no layout analysis: {exc}") from exc
    r = _Replica(gm, marks, marks_of, stack, mode, sentinel, spec.batch_size, amp)
    table, node_keys = r.table(lowered)
    graph = Graph(
        name=spec.name, ops=table, batch_size=spec.batch_size, mode=mode,
        optimizer=optimizer, seq_len=seq, parameters=r.count(counts, "all"),
        trainable_parameters=r.count(counts, "trainable"),
        parameter_bytes=r.count(counts, "bytes"),
        unsupported=r.unsupported(lowered.unsupported),
        batch_scalable=lowered.batch_scalable and r.affine and sentinel is not None,
        trace_seconds=0.0, torch_version=torch.__version__,
        host_ops=r.host_ops(len(lowered.host_ops)), memory=None, amp=amp)
    graph.memory, storage_at = r.memory(mem, origins)
    if layout is not None:
        graph.layout = r.layout(layout, detail, node_keys, table, storage_at, mem)
    graph.trace_seconds = time.perf_counter() - start_time
    graph.source = spec
    graph.notes = notes
    return graph


class _Replica:
    """The 3-block trace's nodes, tagged by block, and their N-block order."""

    def __init__(self, gm, marks, marks_of: _Marks, stack: Stack, mode: str,
                 sentinel: int | None, batch: int, amp: str | None):
        self.n, self.path, self.mode = stack.layers, stack.path, mode
        self.sentinel, self.batch = sentinel, batch
        self.nodes = nodes = list(gm.graph.nodes)
        self.marks = tuple(marks)
        self.affine = True
        names = list(gm.meta.get("param_names", ()))
        if names != marks_of.param_names:
            raise NotReplicable("parameters not in the module's order")
        trainable = gm.meta.get("trainable", set())
        self.ptag = [self.block_of(p) for p in names]
        self.trainable = [i for i, p in enumerate(names) if p in trainable]
        self.names = names
        btag = [self.block_of(b) for b in marks_of.buffer_names]
        tags, segs = [0] * len(nodes), [None] * len(nodes)
        ph = {"params": [], "buffers": [], "opt_state": [], "inputs": []}
        for i, node in enumerate(nodes):
            if node.op == "placeholder":
                for prefix in ph:
                    if node.name.startswith(prefix):
                        ph[prefix].append(i)
                        break
                else:
                    raise NotReplicable(f"placeholder {node.name}")
        if len(ph["params"]) != len(names) or len(ph["buffers"]) != len(btag):
            raise NotReplicable("placeholders do not match the parameters")
        for i, t in zip(ph["params"], self.ptag):
            tags[i], segs[i] = t, "params"
        for i, t in zip(ph["buffers"], btag):
            tags[i], segs[i] = t, "buffers"
        # fp16 training: the GradScaler's scale and growth tracker come first
        # (predictor.frontend.fx), outside the blocks.
        n_scaler = len(autocast.scaler_state()) if amp == "fp16" and mode == "train" else 0
        per_state = ph["opt_state"][n_scaler:]
        n_opt, n_train = len(per_state), len(self.trainable)
        if len(ph["opt_state"]) < n_scaler or n_opt and (not n_train or n_opt % n_train):
            raise NotReplicable("optimizer state not one per parameter")
        for i in ph["opt_state"][:n_scaler]:
            segs[i] = "scaler"
        for j, i in enumerate(per_state):
            tags[i] = self.ptag[self.trainable[j % n_train]]
            segs[i] = ("opt_state", j // n_train)
        for i in ph["inputs"]:
            segs[i] = "inputs"
        fwd_end = self.marks[0] if self.marks else len(nodes)
        fwd = marks_of.ranges(("fs", "fe"))
        for b, (s, e) in enumerate(fwd):
            if b and s != fwd[b - 1][1]:
                raise NotReplicable("nodes between two blocks' forwards")
            if not 0 <= s <= e <= fwd_end:
                raise NotReplicable("a block's forward outside the forward phase")
            for i in range(s, e):
                tags[i], segs[i] = b + 1, "forward"
        # The list elements of the optimizer's per-parameter lists: their block.
        self.elem_tags: dict[int, list[int]] = {}
        # Optimizer ops over per-parameter lists: extracted again over the N-block lists.
        self.per_param_ops: set[int] = set()
        elem_index: dict[Any, int] = {}
        per_param = [self.ptag[i] for i in self.trainable] if mode == "train" else []
        if mode == "train" and len(self.marks) >= 2:
            bwd = marks_of.ranges(("bo", "bi"))
            for b, (s, e) in enumerate(bwd):
                if b + 1 < len(bwd) and bwd[b + 1][1] != s:
                    raise NotReplicable("nodes between two blocks' backwards")
                if not self.marks[0] <= s <= e <= self.marks[1]:
                    raise NotReplicable("a block's backward outside the backward phase")
                for i in range(s, e):
                    tags[i], segs[i] = b + 1, "backward"
            for i in range(self.marks[1], len(nodes)):
                node = nodes[i]
                val = node.meta.get("val")
                if node.op != "call_function":
                    continue
                if node.target is operator.getitem and node.args[0] in elem_index:
                    src = elem_index[node.args[0]]
                    tags[i] = self.elem_tags[src][node.args[1]]
                    segs[i] = ("getitem", src)
                    continue
                if isinstance(val, (list, tuple)) and len(val) == n_train:
                    self.elem_tags[i] = per_param
                    elem_index[node] = i
                if self.elem_tags.get(i) is not None or any(
                        isinstance(a, (list, tuple)) and len(a) == n_train
                        for a in list(node.args) + list(node.kwargs.values())):
                    self.per_param_ops.add(i)
        elif marks_of.events and any(w in ("bo", "bi") for w, _, _ in marks_of.events):
            raise NotReplicable("gradients in an inference trace")
        self.tags = tags
        self.exp = _Expansion(tags, segs, self.n, self._sig, "nodes")
        self.order = self.exp.order
        self.pos = {ib: p for p, ib in enumerate(self.order)}
        self.last3, self.lastn = len(nodes) - 1, len(self.order) - 1
        # The N-block parameter order, and the trainable parameters' one.
        self.pexp = _Expansion(self.ptag, ["p"] * len(names), self.n, None, "parameters")
        self.texp = _Expansion(per_param, ["p"] * len(per_param), self.n, None, "trainable")

    def block_of(self, name: str) -> int:
        prefix = self.path + "."
        if not name.startswith(prefix):
            return 0
        head = name[len(prefix):].split(".", 1)[0]
        if not head.isdigit() or int(head) >= TEMPLATE_BLOCKS:
            raise NotReplicable(f"{name}: not a block of {self.path}")
        return int(head) + 1

    def rename(self, name: str, b: int) -> str:
        t = self.block_of(name)
        if t == 0:
            return name
        prefix = f"{self.path}.{t - 1}"
        return f"{self.path}.{b - 1}" + name[len(prefix):]

    def _sig(self, i: int) -> tuple:
        node = self.nodes[i]
        val = node.meta.get("val")

        def meta(v):
            if isinstance(v, torch.Tensor):
                return (tuple(int(d) for d in v.shape), tuple(int(s) for s in v.stride()),
                        v.dtype)
            if isinstance(v, (list, tuple)):
                return tuple(meta(x) for x in v)
            return type(v).__name__
        target = str(node.target) if node.op == "call_function" else ""
        args = node.args[1:] if node.target is operator.getitem else node.args
        return (node.op, target, meta(val), len(args))

    # -- references ------------------------------------------------------
    def ref(self, x: int, src: int, b: int) -> int:
        """N-block index of node x (3-block index) referred to by an item of
        template block `src` in copy block b."""
        if x == 0:
            return 0
        if x == self.last3:
            return self.lastn
        tx = self.tags[x]
        if tx == 0:
            return self.pos[(x, 0)]
        if src == 0:
            if tx == 2:
                raise NotReplicable("a storage outside the blocks used by the middle block")
            bt = 1 if tx == 1 else self.n
        else:
            if abs(tx - src) > 1:
                raise NotReplicable("a storage used more than one block away")
            bt = b + tx - src
        return self.pos[(self.exp.twin(x, _tmpl(bt, self.n)), bt)]

    def rel(self, x: int, src: int) -> tuple:
        if x in (0, self.last3) or self.tags[x] == 0:
            return ("abs", x)
        return ("rel", self.tags[x] - src, self.exp.region(x), self.exp.starts[x][1])

    # -- the op table ----------------------------------------------------
    def table(self, lowered) -> tuple[OpTable, dict[int, list[tuple]]]:
        """The op table, counted over the N-block nodes; the optimizer's
        per-parameter list ops extracted again over the N-block lists.
        Returns it and the row keys of each 3-block node (N-block rows)."""
        t3 = lowered.table
        keys = [(int(t3.family[r]), int(t3.phase[r]), int(t3.dtype[r]), int(t3.kernels[r]),
                 tuple(int(v) for v in t3.dbase[r]), tuple(int(v) for v in t3.dslope[r]),
                 int(t3.op[r])) for r in range(len(t3))]
        node_keys: dict[int, list] = {}
        at = tuple(_MemoScaler(self.sentinel, b) for b in (1, 2, self.batch))
        at_sentinel = _MemoScaler(None, 0)
        for i, rows in lowered.node_rows.items():
            if i in self.per_param_ops and rows:
                node_keys[i] = self._extract_again(i, rows, keys, at, at_sentinel)
            else:
                node_keys[i] = [keys[r] if r >= 0 else None for r in rows]
        counts: dict[tuple, int] = {}
        for i, _ in self.order:
            for key in node_keys.get(i, ()):
                if key is not None:
                    counts[key] = counts.get(key, 0) + 1
        table = OpTable.from_rows(counts, list(t3.op_names), where="traced graph")
        if len(table) != len(t3):
            raise NotReplicable("rows merge or split in the N-block table")
        return table, node_keys

    def _extract_again(self, i, rows, keys, at, at_sentinel) -> list:
        node = self.nodes[i]
        n_train = len(self.trainable)

        def grow(x):
            if isinstance(x, (list, tuple)) and len(x) == n_train:
                return type(x)(x[j] for j, _ in self.texp.order)
            if isinstance(x, (list, tuple)) and len(x) and any(
                    isinstance(v, (torch.fx.Node, torch.Tensor)) for v in x):
                raise NotReplicable(f"{node.target}: a list not one per parameter")
            return x

        stand = _Stand(tuple(grow(a) for a in node.args),
                       {kk: grow(v) for kk, v in node.kwargs.items()}, grow(node.meta.get("val")))
        got, _, affine = lowering._extract(node.target, stand, at, at_sentinel, self.sentinel)
        self.affine &= affine
        if len(got) != len(rows):
            raise NotReplicable(f"{node.target}: rows change with the parameter count")
        out = []
        for (fam, base, slope, kern), r in zip(got, rows):
            if r < 0:
                raise NotReplicable(f"{node.target}: an empty row")
            old = keys[r]
            pad = (0,) * (L.MAX_DIMS - len(base))
            out.append((fam, old[1], old[2], kern, tuple(base) + pad, tuple(slope) + pad, old[6]))
        return out

    def count(self, counts3: tuple, what: str) -> int:
        """Parameter count, trainable count or bytes of the N-block model."""
        ph = [n for n in self.nodes if n.op == "placeholder" and n.name.startswith("params")]
        total = 0
        trainable = set(self.trainable)
        for j, _ in self.pexp.order:
            v = ph[j].meta.get("val")
            if what == "trainable" and (self.mode != "train" or j not in trainable):
                continue
            total += v.numel() * (v.element_size() if what == "bytes" else 1)
        # The same sum over the 3-block model must be what the trace counted.
        check = 0
        for j, node in enumerate(ph):
            v = node.meta.get("val")
            if what == "trainable" and (self.mode != "train" or j not in trainable):
                continue
            check += v.numel() * (v.element_size() if what == "bytes" else 1)
        if check != counts3[{"all": 0, "trainable": 1, "bytes": 2}[what]]:
            raise NotReplicable("parameter counts disagree with the trace")
        return int(total)

    def unsupported(self, unsup3: dict[str, int]) -> dict[str, int]:
        """Unsupported ops: carried over only when every node of that op is."""
        if not unsup3:
            return {}
        per: dict[str, list[int]] = {}
        for i, node in enumerate(self.nodes):
            op = node.target
            if node.op != "call_function" or not isinstance(op, torch._ops.OpOverload):
                continue
            if families.lookup(op) is None and families.is_free(op):
                continue
            per.setdefault(str(op.overloadpacket.__name__), []).append(i)
        mult = self.multiplicity()
        out = {}
        for name, c in unsup3.items():
            if len(per.get(name, ())) != c:
                raise NotReplicable(f"{name}: only some of its nodes unsupported")
            out[name] = int(sum(mult[i] for i in per[name]))
        return out

    def multiplicity(self) -> np.ndarray:
        mult = np.zeros(len(self.nodes), np.int64)
        for i, _ in self.order:
            mult[i] += 1
        return mult

    def host_ops(self, n_phases: int) -> list[int]:
        mult = self.multiplicity()
        out = [0] * n_phases
        for i, node in enumerate(self.nodes):
            if node.op != "call_function" or node.target is operator.getitem \
                    or not isinstance(node.target, torch._ops.OpOverload):
                continue
            ph = sum(1 for m in self.marks if i >= m)
            out[ph] += int(mult[i])
        return out

    # -- the memory profile --------------------------------------------
    def memory(self, mem: MemoryProfile, origins: list) -> tuple[MemoryProfile, list]:
        """The N-block storages; returns the profile and, per N-block
        storage, (3-block storage, block of its alloc node)."""
        if len(origins) != len(mem.coef):
            raise NotReplicable("storages without a first node")
        tags, segs = [], []
        for idx, k in origins:
            et = self.elem_tags.get(idx)
            if et is not None and k >= 0:
                tags.append(et[k] if k < len(et) else 0)
                segs.append(("elements", idx))
            else:
                tags.append(self.tags[idx])
                segs.append(("node", self.exp.region(idx) if self.tags[idx] else None))
        fields = (mem.coef, mem.power, mem.dtype, mem.category, mem.cap)

        def sig(e):
            return tuple(f[e].item() for f in fields)
        exp = _Expansion(tags, segs, self.n, sig, "storages")
        alloc3, free3 = mem.alloc, mem.free
        _check_relative(exp, lambda e, t: [self.rel(int(alloc3[e]), t),
                                           self.rel(int(free3[e]), t)], "storages")
        picks = np.asarray([e for e, _ in exp.order], np.int64)
        alloc = np.empty(len(picks), np.int64)
        free = np.empty(len(picks), np.int64)
        at = []
        for p, (e, b) in enumerate(exp.order):
            t = tags[e]
            alloc[p] = self.ref(int(alloc3[e]), t, b)
            free[p] = self.ref(int(free3[e]), t, b)
            at.append((e, self.order[alloc[p]][1]))
        marks = tuple(int(sum(1 for i, _ in self.order if i < m)) for m in mem.phase_marks)
        prof = MemoryProfile(coef=mem.coef[picks], power=mem.power[picks],
                             dtype=mem.dtype[picks], alloc=alloc, free=free,
                             category=mem.category[picks], cap=mem.cap[picks],
                             n_steps=len(self.order), phase_marks=marks, training=mem.training)
        return prof, at

    # -- the layout analysis -------------------------------------------
    def layout(self, lp: LayoutProfile, detail: dict, node_keys: dict, table: OpTable,
               storage_at: list, mem3: MemoryProfile) -> LayoutProfile:
        n, post3 = self.n, TEMPLATE_BLOCKS + 1
        if lp.n_blocks != TEMPLATE_BLOCKS or list(lp.block_names) != [
                f"{self.path}.{i}" for i in range(TEMPLATE_BLOCKS)]:
            raise NotReplicable(f"the layout pass's blocks are {lp.block_names}")
        row_of = {}
        for r in range(len(table)):
            row_of[(int(table.family[r]), int(table.phase[r]), int(table.dtype[r]),
                    int(table.kernels[r]), tuple(int(v) for v in table.dbase[r]),
                    tuple(int(v) for v in table.dslope[r]), int(table.op[r]))] = r
        splits3 = detail.get("splits", {})

        comm3 = detail.get("comm", [])
        kept3 = detail.get("kept", [])
        comm_at, kept_at = set(comm3), {i for i, _ in kept3}

        def split_rel(i, t):
            # per row: its block group relative to the node's, and the rest
            # of the split key; whether the node is an all-reduce point or
            # runs whole
            out = [("rel" if 1 <= g <= TEMPLATE_BLOCKS else "abs",
                    g - t if 1 <= g <= TEMPLATE_BLOCKS else g, j, sb, ss, f)
                   for j, (_, g, sb, ss, f) in splits3.get(i, ())]
            return out + [("abs", i in comm_at, i in kept_at)]
        _check_relative(self.exp, split_rel, "layout rows")
        splits: dict[tuple, int] = {}
        for i, b in self.order:
            for j, (_, g, sb, ss, f) in splits3.get(i, ()):
                key = node_keys[i][j]
                s = (row_of[key], _remap_group(g, self.tags[i], b, n, post3), sb, ss, f)
                splits[s] = splits.get(s, 0) + 1
        m = len(splits)
        cols = {k: np.zeros(m, np.int64) for k in ("row", "grp", "cnt", "flags")}
        sbase = np.zeros((m, L.MAX_DIMS), np.int64)
        sslope = np.zeros((m, L.MAX_DIMS), np.int64)
        for x, ((r, g, sb, ss, f), c) in enumerate(splits.items()):
            cols["row"][x], cols["grp"][x], cols["cnt"][x], cols["flags"][x] = r, g, c, f
            sbase[x], sslope[x] = sb, ss

        # all-reduce points, in node order
        if len(comm3) != len(lp.comm_phase):
            raise NotReplicable("all-reduce points without their nodes")
        where = {i: c for c, i in enumerate(comm3)}
        comm: dict[str, list] = {k: [] for k in ("phase", "group", "base", "slope", "dtype")}
        for i, b in self.order:
            c = where.get(i)
            if c is None:
                continue
            comm["phase"].append(lp.comm_phase[c])
            comm["group"].append(_remap_group(int(lp.comm_group[c]), self.tags[i], b, n, post3))
            comm["base"].append(lp.comm_base[c])
            comm["slope"].append(lp.comm_slope[c])
            comm["dtype"].append(lp.comm_dtype[c])

        kept: dict[str, int] = {}
        kept_3: dict[str, int] = {}
        mult = self.multiplicity()
        for i, name in kept3:
            kept[name] = kept.get(name, 0) + int(mult[i])
            kept_3[name] = kept_3.get(name, 0) + 1
        if kept_3 != {k: int(v) for k, v in lp.kept_whole.items()}:
            raise NotReplicable("ops run whole without their nodes")

        # parameters, in the N-block order
        picks = np.asarray([j for j, _ in self.pexp.order], np.int64)
        names = [self.rename(self.names[j], b) for j, b in self.pexp.order]
        pgroup, block_names = layout_pass.param_blocks(names)
        mine = [_remap_group(int(lp.param_group[j]), self.ptag[j], b, n, post3)
                for j, b in self.pexp.order]
        if list(pgroup) != mine or list(block_names) != [f"{self.path}.{i}" for i in range(n)]:
            raise NotReplicable("the N-block parameters' blocks")

        # boundaries: block 1 as the first, blocks 2..N-1 as the middle one
        best3 = detail.get("boundary", {})
        if best3 and not {1, 2} <= set(best3):
            raise NotReplicable("block boundaries missing")
        best = {g: best3[1 if g == 1 else 2] for g in range(1, n)} if best3 else {}
        boundary = layout_pass.boundary_of(best)

        # storages: group and flags of the op that allocated them
        act_group = act_flags = None
        if lp.act_group is not None:
            act_group = np.asarray([_remap_group(int(lp.act_group[e]),
                                                 self.tags[int(mem3.alloc[e])], b, n, post3)
                                    for e, b in storage_at], np.int64)
            act_flags = np.asarray([lp.act_flags[e] for e, _ in storage_at], np.int64)

        def names_of(lst: list[str]) -> list[str]:
            tags = [self.block_of(x) for x in lst]
            e = _Expansion(tags, ["n"] * len(lst), n, None, "linears")
            return [self.rename(lst[j], b) for j, b in e.order]

        def arr(x):
            return None if x is None else np.asarray(x)[picks]
        return LayoutProfile(
            n_blocks=n, block_names=list(block_names),
            split_row=cols["row"], split_group=cols["grp"], split_count=cols["cnt"],
            split_flags=cols["flags"], split_sbase=sbase, split_sslope=sslope,
            comm_phase=np.asarray(comm["phase"], np.int64),
            comm_group=np.asarray(comm["group"], np.int64),
            comm_base=np.asarray(comm["base"], np.int64),
            comm_slope=np.asarray(comm["slope"], np.int64),
            comm_dtype=np.asarray(comm["dtype"], np.int64),
            param_numel=arr(lp.param_numel), param_group=np.asarray(pgroup, np.int64),
            param_sharded=arr(lp.param_sharded), param_trainable=arr(lp.param_trainable),
            param_tied=arr(lp.param_tied),
            boundary_base=int(boundary[0]), boundary_slope=int(boundary[1]),
            act_group=act_group, act_flags=act_flags,
            column_parallel=names_of(lp.column_parallel), row_parallel=names_of(lp.row_parallel),
            vocab_parallel=names_of(lp.vocab_parallel),
            unsharded_linears=names_of(lp.unsharded_linears), kept_whole=kept)


class _MemoScaler(BatchScaler):
    """The lowering's BatchScaler, remembering each node's shapes: an
    N-block parameter list repeats the middle block's nodes N - 2 times."""

    def __init__(self, sentinel: int | None, batch: int):
        super().__init__(sentinel, batch)
        self.memo: dict = {}

    def convert(self, x: Any) -> Any:
        if isinstance(x, torch.fx.Node):
            got = self.memo.get(x)
            if got is None:
                got = self.memo[x] = super().convert(x)
            return got
        return super().convert(x)


class _Stand:
    """A node's stand-in for the lowering's extractors: the same op over the
    N-block model's per-parameter lists."""

    def __init__(self, args, kwargs, val):
        self.args, self.kwargs, self.meta = args, kwargs, {"val": val}

