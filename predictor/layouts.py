"""Large-model training layouts: tensor, pipeline and sharded data
parallelism, activation recomputation and the network between GPUs.

``predict(graph, gpu, batch_size=micro, parallel=Parallel(...), checkpoint=...)``
transforms the traced step; nothing is retraced. The graph's
:class:`~predictor.optable.LayoutProfile` (``predictor.frontend.layout_pass``)
says which rows are tensor-parallel and by how much each dim shrinks, which
block each row and storage belongs to, and where the all-reduces are.

Model (Megatron-LM / DeepSpeed semantics):

- **Ranks.** TP is the fastest-varying rank, then DP, then PP (Megatron's
  order): a TP group of ``tp <= gpus_per_node`` stays in a node, DP groups span
  ``tp * dp`` consecutive ranks, pipeline neighbours are ``tp * dp`` apart.
- **Tensor parallelism.** Sharded rows run with their sharded dims divided by
  ``tp``; every all-reduce point of the graph (after a row-parallel linear in
  forward, after a column-parallel one's input gradient in backward, the
  vocab-parallel embedding and head) is a ring all-reduce over the TP group,
  on the critical path. Sequence parallelism replaces each by a reduce-scatter
  + all-gather (the same bytes) and also divides the unsharded memory-bound
  ops of the blocks (norms, dropouts, residual adds) and their stored
  activations by ``tp``.
- **Pipeline.** Blocks are split into ``pp * interleave`` contiguous chunks of
  equal block count; stage ``s`` runs chunks ``s, s + pp, ...``; everything
  before the first block runs on stage 0, after the last on the last stage.
  1F1B: iteration = ``(m + (pp - 1) / interleave) x`` the slowest stage's time
  per micro-batch, so the bubble is ``(pp - 1) / (interleave m)`` of the
  compute. Activations cross stages point to point (``1/tp`` of the block
  boundary per rank: Megatron's scatter/gather), once forward, once backward.
- **Recomputation.** ``"full"``: only each block's input is stored; the
  block's forward rows run again in backward (and its forward all-reduces);
  during a block's backward its full activations live again (one block).
  ``"selective"``: the attention core (score-shaped tensors: QK^T, softmax,
  dropout of the scores) is not stored and is recomputed (Korthikanti et al.
  2022). With a fused attention kernel there is nothing to drop.
- **Data parallelism / ZeRO.** Per GPU and Adam: weights ``w``, gradients
  ``g``, optimizer state ``k`` bytes per parameter (fp32: 4 + 4 + 8; a 16-bit
  dtype: mixed precision 2 + 2 + 12, fp32 master + moments). ZeRO-1 divides
  ``k`` by ``dp``, ZeRO-2 ``g + k``, ZeRO-3 (FSDP) all three. Gradients are
  all-reduced (ZeRO-0/1), reduce-scattered with the updated weights
  all-gathered after the step (ZeRO-2), or ZeRO-3 all-gathers the weights in
  forward and again in backward and reduce-scatters gradients, every
  micro-batch. Communication overlaps the backward pass (and ZeRO-3's forward
  all-gathers the forward pass) one block at a time: the exposed part is
  ``max(T / k, T - t (1 - 1 / k))`` for ``k`` blocks on the stage.
- **Network.** Within a node: the GPU's NVLink/NVSwitch or PCIe bandwidth per
  direction (``interconnect_gbs / 2``) at ``parallel.ALLREDUCE_EFFICIENCY``;
  across nodes: ``inter_node_gbs`` per GPU per direction (``specs/network.toml``
  by system, or the user's) at ``INTER_NODE_EFFICIENCY``; a group that spans
  nodes runs at the slower of the two. Ring: ``2 (n-1)/n B / bw + 2 (n-1) a``;
  tree: ``2 B / bw + 2 ceil(log2 n) a``; the cheaper is taken (NCCL picks).

- **Mixed precision.** Under autocast (a graph traced with ``amp=``) the
  model states are fp32 weights (the master copy), fp32 gradients and the
  optimizer's fp32 state (Adam: 4 + 4 + 8 bytes per parameter), sharded by
  ZeRO as above; the half copies autocast makes every step are stored
  activations (``weight_copies``, 2 bytes per parameter, per micro-batch in
  flight, dropped with their block under full recomputation). ZeRO-3 under
  autocast is FSDP's mixed-precision policy: it all-gathers 16-bit weights
  (and holds two blocks of them) and reduce-scatters fp32 gradients.
- **Memory per GPU.** Model states + activations in flight + the peak of
  the stage's temporaries (see ``_Temporaries``) + ZeRO-3's gathered blocks +
  CUDA context and workspaces, at the forward/backward peak; or model states
  + the optimizer step's temporaries, whichever is larger.
- **Tied embedding.** With pipeline stages the last stage holds its own
  copy of a word embedding the head shares (states included), and its
  gradient is all-reduced with the first stage's after backward.
- **Host.** Each stage's forward, backward (with recomputation) and
  optimizer time is at least the host's launch time for its share of the
  kernels (``predictor.overhead``): ``ParallelPrediction.overhead_ms``.

Not modelled: overlap of TP communication with compute, context
parallelism, activation offload, FP8.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field, replace
from importlib import resources
from typing import Any

import numpy as np

from predictor import dtypes, hardware, parallel as ddp
from predictor.errors import InvalidArgumentError
from predictor.kernels import layout as L
from predictor.optable import ACTIVATIONS, OpTable
from predictor.results import Prediction

CHECKPOINTS = (None, "full", "selective")
INTER_NODE_EFFICIENCY = 0.85   # NCCL bus bandwidth over InfiniBand NDR/HDR, ~85-90 % of line rate
INTER_NODE_LATENCY_US = 10.0
SHARDED, ATTENTION_CORE = 1, 2


def _int(name: str, v, lo: int, hi: int) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not lo <= v <= hi:
        raise InvalidArgumentError(f"{name} must be an integer in {lo}..{hi}, got {v!r}")
    return int(v)


@dataclass(frozen=True)
class Parallel:
    """A training layout: ``dp x tp x pp`` GPUs, ``microbatches`` per
    optimizer step (per pipeline / gradient-accumulation steps), pipeline
    ``interleave`` (virtual stages per GPU), Megatron sequence parallelism,
    ZeRO stage (``fsdp=True`` is ``zero=3``), GPUs per node and the inter-node
    bandwidth per GPU (GB/s per direction; None: the system default)."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    microbatches: int = 1
    interleave: int = 1
    sequence_parallel: bool = False
    zero: int = 0
    gpus_per_node: int = 8
    fsdp: bool = False
    inter_node_gbs: float | None = None

    def __post_init__(self):
        for name, hi in (("dp", 1 << 20), ("tp", 1024), ("pp", 1024),
                         ("microbatches", 1 << 20), ("interleave", 64)):
            _int(name, getattr(self, name), 1, hi)
        _int("zero", self.zero, 0, 3)
        ddp.check_gpus_per_node(self.gpus_per_node)
        if not isinstance(self.sequence_parallel, bool) or not isinstance(self.fsdp, bool):
            raise InvalidArgumentError("sequence_parallel and fsdp must be True or False")
        if self.fsdp:
            if self.zero not in (0, 3):
                raise InvalidArgumentError(f"fsdp=True is zero=3; got zero={self.zero} as well")
            object.__setattr__(self, "zero", 3)
        if self.inter_node_gbs is not None:
            v = self.inter_node_gbs
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                    or not 0 < v <= 1e5:
                raise InvalidArgumentError(f"inter_node_gbs must be in (0, 1e5] GB/s, got {v!r}")
        if self.interleave > 1 and self.pp == 1:
            raise InvalidArgumentError("interleave > 1 needs pipeline parallelism (pp > 1)")
        if self.interleave > 1 and self.microbatches % self.pp:
            raise InvalidArgumentError(
                f"the interleaved schedule needs microbatches ({self.microbatches}) to be a "
                f"multiple of pp ({self.pp})")
        if self.sequence_parallel and self.tp == 1:
            raise InvalidArgumentError("sequence_parallel needs tensor parallelism (tp > 1)")

    @property
    def gpus(self) -> int:
        return self.dp * self.tp * self.pp

    @property
    def trivial(self) -> bool:
        return self.gpus == 1 and self.microbatches == 1

    def describe(self) -> str:
        s = f"DP{self.dp} x TP{self.tp} x PP{self.pp}"
        if self.interleave > 1:
            s += f" (interleave {self.interleave})"
        if self.sequence_parallel:
            s += " +SP"
        if self.zero:
            s += f", ZeRO-{self.zero}"
        return s + f", {self.microbatches} micro-batch(es)"


def check_checkpoint(checkpoint) -> str | None:
    if checkpoint not in CHECKPOINTS:
        raise InvalidArgumentError(
            f"checkpoint must be None, 'full' or 'selective', got {checkpoint!r}")
    return checkpoint


# ------------------------------------------------------------------ network --

_NETWORK: dict[str, float] | None = None


def _network_table() -> dict[str, float]:
    global _NETWORK
    if _NETWORK is None:
        text = resources.files("predictor.specs").joinpath("network.toml").read_text("utf-8")
        _NETWORK = {s["interconnect"]: float(s["inter_node_gbs"])
                    for s in tomllib.loads(text)["system"]}
    return _NETWORK


def inter_node_gbs(gpu, par: Parallel) -> float:
    """GB/s per GPU per direction between nodes."""
    if par.inter_node_gbs is not None:
        return float(par.inter_node_gbs)
    table = _network_table()
    kind = str(getattr(gpu, "spec", {}).get("interconnect", ""))
    return table.get(kind, table["default"])


@dataclass(frozen=True)
class Link:
    gbs: float        # achievable GB/s per direction
    alpha_us: float   # per-hop latency


def link(gpu, par: Parallel, n: int, stride: int) -> Link:
    """The link a group of `n` ranks `stride` apart runs on.

    A group that spans nodes with ``k`` of its ranks in each node runs its
    ring collectives at ``k`` NICs' bandwidth (NCCL runs one ring per NIC, each
    crossing between nodes on its own NIC; within a node the ring hops over
    NVLink): the bus bandwidth of a ring across whole 8-GPU nodes is the
    node's NIC bandwidth (nccl-tests: 4 x 200 Gb/s HDR per node, 100 GB/s bus
    bandwidth, 85-96 GB/s measured, NVIDIA/nccl-tests#119), never more than
    NVLink's. A group with one rank per node (``stride >= gpus_per_node``)
    crosses on one NIC per rank."""
    intra = Link(ddp.link_gbs(gpu) * ddp.ALLREDUCE_EFFICIENCY, ddp.HOP_LATENCY_US)
    if n * stride <= par.gpus_per_node:
        return intra
    per_node = max(1, min(n, par.gpus_per_node // max(stride, 1)))
    inter = inter_node_gbs(gpu, par) * INTER_NODE_EFFICIENCY * per_node
    return Link(min(intra.gbs, inter), INTER_NODE_LATENCY_US)


def allreduce_ms(nbytes: float, n: int, ln: Link) -> float:
    """Ring or tree all-reduce of `nbytes` over `n` ranks, whichever is faster."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    bw = ln.gbs * 1e9
    ring = 2.0 * (n - 1) / n * nbytes / bw + 2 * (n - 1) * ln.alpha_us * 1e-6
    tree = 2.0 * nbytes / bw + 2 * math.ceil(math.log2(n)) * ln.alpha_us * 1e-6
    return min(ring, tree) * 1e3


def gather_ms(nbytes: float, n: int, ln: Link) -> float:
    """Ring all-gather (or reduce-scatter) whose full result is `nbytes`."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    return ((n - 1) / n * nbytes / (ln.gbs * 1e9) + (n - 1) * ln.alpha_us * 1e-6) * 1e3


def p2p_ms(nbytes: float, ln: Link) -> float:
    if nbytes <= 0:
        return 0.0
    return (nbytes / (ln.gbs * 1e9) + ln.alpha_us * 1e-6) * 1e3


def overlapped(t_comm: float, t_compute: float, k: int) -> float:
    """Exposed time of `t_comm` split in `k` pieces behind `t_compute`."""
    if t_comm <= 0:
        return 0.0
    k = max(1, k)
    return max(t_comm / k, t_comm - t_compute * (1.0 - 1.0 / k))


# ------------------------------------------------------------- memory states --

def state_bytes_per_param(dtype_code: int | None, optimizer: str | None,
                          opt_state_per_param: float,
                          amp: str | None = None) -> tuple[float, float, float]:
    """(weights, gradients, optimizer state) bytes per parameter.
    `opt_state_per_param`: the traced optimizer's fp32 state bytes (Adam 8).

    Under autocast (``amp``) the parameters stay fp32 (they are the master
    weights), so do their gradients and the optimizer state: 4 + 4 + 8 for
    Adam; the half copies autocast makes each step are stored activations of
    the traced step (batch-independent, 2 bytes per parameter), not model
    states. A 16-bit ``dtype`` is Megatron/DeepSpeed mixed precision: 16-bit
    weights and gradients, fp32 master weights in the optimizer state (2 + 2 + 12)."""
    if amp is not None:
        return 4.0, 4.0, float(opt_state_per_param)
    mixed = dtype_code in (L.F16, L.BF16)
    if not mixed:
        item = L.DTYPE_BYTES[dtype_code] if dtype_code is not None else 4
        return float(item), float(item), float(opt_state_per_param) * item / 4.0
    # mixed precision: 16-bit weights and gradients, fp32 master weights + state
    return 2.0, 2.0, 4.0 + float(opt_state_per_param)


def zero_bytes_per_param(w: float, g: float, k: float, zero: int, dp: int) -> float:
    """Model-state bytes per parameter per GPU under ZeRO stage `zero`."""
    if zero == 0:
        return w + g + k
    if zero == 1:
        return w + g + k / dp
    if zero == 2:
        return w + (g + k) / dp
    return (w + g + k) / dp


# ------------------------------------------------------------- the transform --

def _ceil_div(a: np.ndarray, t: int) -> np.ndarray:
    return -((-a) // t)


def stages(n_blocks: int, par: Parallel) -> list[set[int]]:
    """Block groups (0: before the blocks, 1..n, n+1: after) of each stage."""
    chunks = par.pp * par.interleave
    if n_blocks < chunks:
        raise InvalidArgumentError(
            f"the model has {n_blocks} block(s): too few for {par.pp} pipeline stage(s) x "
            f"{par.interleave} interleaved chunk(s)")
    out = [set() for _ in range(par.pp)]
    for c in range(chunks):
        lo, hi = c * n_blocks // chunks, (c + 1) * n_blocks // chunks
        out[c % par.pp].update(range(lo + 1, hi + 1))
    out[0].add(0)
    out[-1].add(n_blocks + 1)
    return out


def _table(ops: OpTable, lp, sel: np.ndarray, tp: int, sp: bool) -> OpTable:
    rows = lp.split_row[sel]
    dbase = ops.dbase[rows].copy()
    dslope = ops.dslope[rows].copy()
    sb, ss = lp.split_sbase[sel], lp.split_sslope[sel]
    if tp > 1:
        dbase = dbase - sb + _ceil_div(sb, tp)
        dslope = dslope - ss + _ceil_div(ss, tp)
        if sp:
            fam = ops.family[rows]
            grp = lp.split_group[sel]
            mem = (fam >= L.ELEMENTWISE) & ((lp.split_flags[sel] & SHARDED) == 0) \
                & (grp >= 1) & (grp <= lp.n_blocks) & (fam != L.OPTIMIZER)
            for c in (L.MEM_READ, L.MEM_WRITTEN, L.MEM_FLOPS, L.MEM_OUTER):
                dbase[mem, c] = _ceil_div(dbase[mem, c], tp)
                dslope[mem, c] = _ceil_div(dslope[mem, c], tp)
    return OpTable(ops.family[rows], ops.phase[rows], ops.dtype[rows], lp.split_count[sel],
                   ops.kernels[rows], dbase, dslope, ops.op[rows], ops.op_names)


_NO_CALIBRATION = (np.zeros(0), np.zeros(0, dtype=np.int64), np.zeros(L.N_GPU_FEATURES))


def _model(tf32: tuple, mlp) -> tuple[np.ndarray, np.ndarray]:
    """The per-op model's parameters (PyTorch's TF32 switches applied, as the
    engine does) and op-model weights (the engine passes the ones in use)."""
    from predictor import opmodel
    from predictor.kernels.roofline import P_TF32_CONV, P_TF32_MATMUL, default_params

    p = default_params()
    if tf32[0] is not None:
        p[P_TF32_MATMUL] = float(bool(tf32[0]))
    if len(tf32) > 1 and tf32[1] is not None:
        p[P_TF32_CONV] = float(bool(tf32[1]))
    return p, (opmodel.weights() if mlp is None else mlp)


def _phase_ms(table: OpTable, batch: int, gpu, dtype_code, model) -> np.ndarray:
    from predictor.kernels.grid import evaluate_grid
    out = np.zeros((1, 1, len(L.PHASE_NAMES)))
    if len(table) == 0:
        return out[0, 0]
    t = table.with_dtype(dtype_code) if dtype_code is not None else table
    evaluate_grid(t.family, t.phase, t.dtype, t.count, t.kernels, t.dbase, t.dslope,
                  np.asarray([batch], np.int64), gpu.features[None, :],
                  model[0], model[1], *_NO_CALIBRATION, out)
    return out[0, 0]


@dataclass
class ParallelPrediction(Prediction):
    """A prediction of one optimizer step under a parallel layout. Phase
    times (forward, backward with recomputation, optimizer) are the slowest
    stage's over all micro-batches; ``iteration_ms`` adds communication and
    the pipeline bubble. ``memory_gb`` is per GPU on the fullest stage."""

    parallel: Parallel | None = None
    checkpoint: str | None = None
    compute_ms: float = 0.0
    comm_ms: float = 0.0
    bubble_ms: float = 0.0
    recompute_ms: float = 0.0
    tp_comm_ms: float = 0.0
    pp_comm_ms: float = 0.0
    dp_comm_ms: float = 0.0
    stage_ms: list = field(default_factory=list)        # per micro-batch, per stage
    stage_memory_gb: list = field(default_factory=list)
    memory_parts_gb: dict = field(default_factory=dict)  # fullest stage's memory by kind
    sharded: dict = field(default_factory=dict)          # which linears were sharded
    global_batch: int = 0

    @property
    def iteration_ms(self) -> float:
        return self.compute_ms + self.comm_ms + self.bubble_ms + self.optimizer_ms

    @property
    def throughput(self) -> float:
        return self.global_batch / (self.iteration_ms / 1e3) if self.iteration_ms > 0 else 0.0

    @property
    def seq_len(self) -> int | None:
        return getattr(self.graph, "seq_len", None)

    @property
    def tokens_per_s(self) -> float | None:
        s = self.seq_len
        return None if s is None else self.throughput * s

    def to_dict(self) -> dict:
        return {
            "model": self.model, "gpu": self.gpu, "micro_batch": self.batch_size,
            "global_batch": self.global_batch, "gpus": self.parallel.gpus,
            "dp": self.parallel.dp, "tp": self.parallel.tp, "pp": self.parallel.pp,
            "microbatches": self.parallel.microbatches, "interleave": self.parallel.interleave,
            "sequence_parallel": self.parallel.sequence_parallel, "zero": self.parallel.zero,
            "checkpoint": self.checkpoint, "iteration_ms": self.iteration_ms,
            "compute_ms": self.compute_ms, "comm_ms": self.comm_ms, "bubble_ms": self.bubble_ms,
            "optimizer_ms": self.optimizer_ms, "recompute_ms": self.recompute_ms,
            "tp_comm_ms": self.tp_comm_ms, "pp_comm_ms": self.pp_comm_ms,
            "dp_comm_ms": self.dp_comm_ms, "overhead_ms": self.overhead_ms,
            "memory_gb": self.memory_gb, "fits": self.fits,
            "samples_per_s": self.throughput, "tokens_per_s": self.tokens_per_s,
            "stage_memory_gb": list(self.stage_memory_gb), "memory_parts_gb": self.memory_parts_gb,
        }

    def __repr__(self) -> str:
        mem = "?" if self.memory_gb is None else f"{self.memory_gb:.1f} GB/GPU"
        return (f"ParallelPrediction({self.model} on {self.parallel.gpus}x {self.gpu}, "
                f"{self.parallel.describe()}, checkpoint={self.checkpoint}: "
                f"{self.iteration_ms:.1f} ms = compute {self.compute_ms:.1f} + comm "
                f"{self.comm_ms:.1f} + bubble {self.bubble_ms:.1f} + optimizer "
                f"{self.optimizer_ms:.1f}; {mem})")


class _Temporaries:
    """The peak of a stage's temporaries (intermediates, gradients of
    activations, library workspaces) on one GPU. Forward temporaries of a
    TP-sharded op are divided by ``tp`` (all of a block's with sequence
    parallelism); backward ones by the ratio the stage's stored activations
    shrink by (the gradient of an activation has its shape); those of other
    stages are not on this GPU; the optimizer step's (parameter-sized) follow
    the parameters this GPU updates. Two peaks: forward/backward, when the
    activations are alive, and the optimizer step, when they are not."""

    def __init__(self, prof, lp, size: np.ndarray, tp: int, sp: bool):
        from predictor.optable import TEMPORARIES, WORKSPACE
        self.prof, self.lp = prof, lp
        self.tmp = (prof.category == TEMPORARIES) | (prof.category == WORKSPACE)
        marks = list(prof.phase_marks)
        fwd_end = marks[0] if marks else prof.n_steps
        opt_start = marks[1] if len(marks) > 1 else prof.n_steps
        self.is_opt = prof.alloc >= opt_start
        self.is_fwd = prof.alloc < fwd_end
        in_block = (lp.act_group >= 1) & (lp.act_group <= lp.n_blocks)
        shard = ((lp.act_flags & SHARDED) > 0) | (sp & in_block)
        act = prof.category == ACTIVATIONS
        whole = float(size[act & in_block].sum())
        split = float((size / np.where(shard, tp, 1))[act & in_block].sum())
        bwd_div = whole / split if split > 0 else 1.0
        self.size = size.astype(np.float64)
        self.fb = np.where(self.is_fwd, np.where(shard, self.size / tp, self.size),
                           self.size / bwd_div)

    def _peak(self, sel: np.ndarray, size: np.ndarray) -> float:
        if not sel.any():
            return 0.0
        n = int(self.prof.n_steps) + 2
        ev = np.zeros(n)
        np.add.at(ev, np.clip(self.prof.alloc[sel], 0, n - 1), size[sel])
        np.add.at(ev, np.clip(self.prof.free[sel] + 1, 0, n - 1), -size[sel])
        return float(np.cumsum(ev).max())

    def peaks(self, groups: set[int], opt_share: float) -> tuple[float, float]:
        here = np.isin(self.lp.act_group, list(groups))
        fb = self._peak(self.tmp & ~self.is_opt & here, self.fb)
        opt = self._peak(self.tmp & self.is_opt, self.size) * opt_share
        return fb, opt


def check_layout_profile(graph) -> Any:
    lp = getattr(graph, "layout", None)
    if lp is None:
        raise InvalidArgumentError(
            f"{graph.name} has no layout analysis (an inference graph, an ONNX model or a "
            "graph saved by an older version): trace the PyTorch model's training step to "
            "predict parallel layouts or recomputation; data parallelism alone (DDP) is "
            "predicted for any training graph by `predictor search MODEL --gpus-per-node N` "
            "(search(..., gpus_per_node=N))")
    n = len(graph.ops)
    m = len(lp.split_row)
    ok = (lp.split_row.shape == (m,) and lp.split_sbase.shape == (m, L.MAX_DIMS)
          and lp.split_sslope.shape == (m, L.MAX_DIMS) and lp.split_count.shape == (m,)
          and (m == 0 or (lp.split_row.min() >= 0 and lp.split_row.max() < n))
          and (lp.split_count >= 0).all() and (lp.split_sbase >= 0).all()
          and (lp.split_sslope >= 0).all() and isinstance(lp.n_blocks, int) and lp.n_blocks >= 1)
    if not ok:
        raise InvalidArgumentError(f"{graph.name}: its layout analysis is inconsistent with "
                                   "its op table; trace it again")
    return lp


def predict_parallel(graph, gpu, batch: int, par: Parallel, checkpoint: str | None, *,
                     dtype=None, tf32: tuple = (None, None), mlp=None,
                     max_memory_fraction: float = 0.9,
                     _cache: dict | None = None) -> ParallelPrediction:
    """See the module docstring; `batch` is the micro-batch per GPU; `mlp`:
    the op-model weights (None: the shipped ones). `_cache`: a dict shared by
    calls on one graph, GPU, dtype and model (``search_layouts``), which keeps
    stage times and temporaries that the ZeRO stage and recomputation do not
    change."""
    lp = check_layout_profile(graph)
    model = _model(tf32, mlp) if _cache is None else _cache.setdefault("model", _model(tf32, mlp))
    g = hardware.get(gpu) if isinstance(gpu, str) else gpu

    def phase_ms(sel: np.ndarray, t: int, sp: bool) -> np.ndarray:
        key = ("ms", sel.tobytes(), t, sp, batch)
        if _cache is not None and key in _cache:
            return _cache[key]
        table = _table(ops, lp, sel, t, sp)
        out = (_phase_ms(table, batch, g, code, model), host(table))
        if _cache is not None:
            _cache[key] = out
        return out
    code = dtypes.parse(dtype)
    amp = getattr(graph, "amp", None)
    if amp is not None and code is not None:
        raise InvalidArgumentError(
            f"{graph.name} was traced with amp={amp!r}: its ops already have autocast's dtypes; "
            "drop dtype= (or trace without amp)")
    if amp == "fp8":
        hardware.float8_gpus([g], [g.id])
    tp, pp, dp, m, v = par.tp, par.pp, par.dp, par.microbatches, par.interleave
    ops = graph.ops
    groups = stages(lp.n_blocks, par)
    in_block = (lp.split_group >= 1) & (lp.split_group <= lp.n_blocks)
    fwd = ops.phase[lp.split_row] == L.FORWARD

    # links: TP innermost, then DP, then PP
    tp_link = link(g, par, tp, 1)
    dp_link = link(g, par, dp, tp)
    pp_link = link(g, par, 2, tp * dp) if tp * dp >= par.gpus_per_node else link(g, par, 1, 1)

    # model states
    trainable = lp.param_trainable.astype(bool)
    total_trainable = float(lp.param_numel[trainable].sum()) or 1.0
    prof = graph.memory
    opt_state = 0.0
    if prof is not None:
        opt_state = prof.category_bytes(2, 1, None) / total_trainable   # OPTIMIZER_STATE, fp32 as traced
    if graph.optimizer is None:
        opt_state = 0.0
    w_b, g_b, k_b = state_bytes_per_param(code, graph.optimizer, opt_state, amp)
    per_param = zero_bytes_per_param(w_b, g_b, k_b, par.zero, dp)
    # ZeRO-3 under autocast gathers half-precision weights (FSDP's mixed-precision
    # policy: param_dtype 16-bit, gradients reduced in fp32)
    gather_b = 2.0 if amp is not None else w_b
    tied = lp.param_tied.astype(bool) if getattr(lp, "param_tied", None) is not None \
        and len(lp.param_tied) == len(lp.param_numel) else np.zeros(len(lp.param_numel), bool)
    numel_gpu = np.where(lp.param_sharded.astype(bool), lp.param_numel / tp, lp.param_numel)
    total_params = float(lp.param_numel.sum()) or 1.0
    # the optimizer step's time on one GPU, scaled by the parameters each GPU updates
    opt_rows = lp.split_group < 0
    if _cache is not None and "opt" in _cache:
        opt_ms_full = _cache["opt"]
    else:
        opt_ms_full = float(_phase_ms(_table(ops, lp, opt_rows, 1, False), 1, g, code,
                                      model)[2]) if opt_rows.any() else 0.0
        if _cache is not None:
            _cache["opt"] = opt_ms_full

    # host launch time per phase, shared out by each stage's kernel launches
    from predictor import overhead
    host_all = overhead.host_ms(graph)
    kern_all = np.maximum(overhead.kernels_per_phase(ops), 1.0)

    def host(table: OpTable) -> np.ndarray:
        return host_all * overhead.kernels_per_phase(table) / kern_all

    # activations: bytes at the micro-batch of every stored forward tensor
    act_bytes = None
    if prof is not None and lp.act_group is not None and len(lp.act_group) == len(prof.coef):
        size = prof.bytes_at(batch, code).astype(np.float64)
        is_act = prof.category == ACTIVATIONS
        shard = (lp.act_flags & SHARDED) > 0
        act_in_block = (lp.act_group >= 1) & (lp.act_group <= lp.n_blocks)
        div = np.where(shard | (par.sequence_parallel & act_in_block), tp, 1)
        act_bytes = np.where(is_act, size / div, 0.0)
        if checkpoint == "selective":
            act_bytes = np.where((lp.act_flags & ATTENTION_CORE) > 0, 0.0, act_bytes)
        # autocast's half copies of the weights (stored for backward, batch-independent);
        # under ZeRO-3 the gathered half weights are used directly (no copies)
        copies = is_act & (prof.power == 0) & np.isin(prof.dtype, (L.F16, L.BF16)) \
            if amp is not None else np.zeros(len(size), bool)
        if par.zero == 3 and dp > 1:
            act_bytes = np.where(copies, 0.0, act_bytes)
        key = ("tmp", tp, par.sequence_parallel, batch)
        tmp = _cache.get(key) if _cache is not None else None
        if tmp is None:
            tmp = _Temporaries(prof, lp, size, tp, par.sequence_parallel)
            if _cache is not None:
                _cache[key] = tmp
    else:
        copies = tmp = None
    item = L.DTYPE_BYTES[code] if code is not None else 4
    boundary_bytes = max(lp.boundary_base + lp.boundary_slope * batch, 0) * item

    stage_ms, stage_parts, stage_mem = [], [], []
    tp_ms_max = pp_ms_max = rec_max = 0.0
    fwd_max = bwd_max = 0.0
    dp_exposed_max = opt_max = overhead_max = 0.0
    worst = None
    for s, grp in enumerate(groups):
        sel_g = np.isin(lp.split_group, list(grp))
        t, h = phase_ms(sel_g, tp, par.sequence_parallel)
        f_ms, b_ms = float(t[0]), float(t[1])
        rec_sel = sel_g & fwd & in_block
        if checkpoint == "selective":
            rec_sel &= (lp.split_flags & ATTENTION_CORE) > 0
        rec_ms = h_rec = 0.0
        if checkpoint and rec_sel.any():
            t_rec, h_rec = phase_ms(rec_sel, tp, par.sequence_parallel)
            rec_ms, h_rec = float(t_rec[0]), float(h_rec[0])
        # the GPU waits for the host where launching takes longer (predictor.overhead)
        exposed = max(0.0, float(h[0]) - f_ms) + max(0.0, float(h[1]) + h_rec - b_ms - rec_ms)
        f_ms = max(f_ms, float(h[0]))
        b_ms = max(b_ms, float(h[1]) + h_rec - rec_ms)
        # TP all-reduces of this stage, per micro-batch
        tp_ms = 0.0
        if tp > 1:
            for ph, cg, cb, cs, cd in zip(lp.comm_phase, lp.comm_group, lp.comm_base,
                                          lp.comm_slope, lp.comm_dtype):
                if int(cg) not in grp:
                    continue
                dt = code if code is not None and cd in dtypes.OVERRIDABLE else int(cd)
                nbytes = max(int(cb) + int(cs) * batch, 0) * L.DTYPE_BYTES[dt]
                c = allreduce_ms(nbytes, tp, tp_link)
                tp_ms += c
                if checkpoint == "full" and ph == L.FORWARD and 1 <= cg <= lp.n_blocks:
                    tp_ms += c
        p2p = 2 * p2p_ms(boundary_bytes / tp, pp_link) * v if pp > 1 else 0.0
        per_mb = f_ms + b_ms + rec_ms + tp_ms + p2p
        # parameters of the stage
        psel = np.isin(lp.param_group, list(grp))
        tied_here = np.zeros_like(psel)
        if s == len(groups) - 1 and s > 0:
            # a tied word embedding: the last stage keeps its own copy (Megatron), whose
            # gradient is all-reduced with the first stage's after backward
            tied_here = tied
            psel = psel | tied
        n_stage = float(numel_gpu[psel].sum())
        n_train = float(numel_gpu[psel & trainable].sum())
        states = n_stage * w_b + n_train * (per_param - w_b)
        if par.zero == 3:
            states = n_stage * w_b / dp + n_train * (per_param - w_b / dp)
        # DP communication
        blocks_here = max(1, len([x for x in grp if 1 <= x <= lp.n_blocks]))
        tied_ms = allreduce_ms(float(numel_gpu[tied_here & trainable].sum()) * g_b, 2,
                               pp_link) if tied_here.any() else 0.0
        if dp > 1:
            if par.zero <= 1:
                dp_ms = overlapped(allreduce_ms(n_train * g_b, dp, dp_link), b_ms + rec_ms,
                                   blocks_here)
            elif par.zero == 2:
                dp_ms = overlapped(gather_ms(n_train * g_b, dp, dp_link), b_ms + rec_ms,
                                   blocks_here) + gather_ms(n_stage * w_b, dp, dp_link)
            else:
                ag = gather_ms(n_stage * gather_b, dp, dp_link)
                rs = gather_ms(n_train * g_b, dp, dp_link)
                dp_ms = m * (overlapped(ag, f_ms, blocks_here)
                             + overlapped(ag + rs, b_ms + rec_ms, blocks_here))
        else:
            dp_ms = 0.0
        dp_ms += tied_ms
        upd = n_train / (dp if par.zero >= 1 else 1)
        opt_ms = opt_ms_full * upd / total_trainable
        if opt_rows.any():
            # the optimizer's launches: one set per tensor however it is sharded
            h_opt = float(host_all[2]) * float(lp.param_numel[psel].sum()) / total_params
            exposed += max(0.0, h_opt - opt_ms) / m
            opt_ms = max(opt_ms, h_opt)
        # memory
        if act_bytes is not None:
            in_stage = np.isin(lp.act_group, list(grp))
            acts = float(act_bytes[in_stage].sum())
            copies_here = float(act_bytes[in_stage & copies].sum())
            if checkpoint == "full":
                blk = act_bytes[in_stage & (lp.act_group >= 1) & (lp.act_group <= lp.n_blocks)]
                per_block = [float(act_bytes[lp.act_group == b_].sum()) for b_ in grp
                             if 1 <= b_ <= lp.n_blocks]
                keep = boundary_bytes / (tp if par.sequence_parallel else 1)
                acts = acts - float(blk.sum()) + keep * blocks_here \
                    + (max(per_block) if per_block else 0.0)
                in_flight_extra = max(per_block) if per_block else 0.0
            else:
                in_flight_extra = 0.0
            in_flight = min(m, pp - s) if pp > 1 else 1
            if v > 1:
                in_flight *= 1 + (pp - 1) / (pp * v)
            acts = (acts - in_flight_extra) * in_flight + in_flight_extra
            if checkpoint == "full":   # dropped with their blocks but the one in backward
                blk_c = in_stage & copies & (lp.act_group >= 1) & (lp.act_group <= lp.n_blocks)
                per_block_c = [float(act_bytes[copies & (lp.act_group == b_)].sum())
                               for b_ in grp if 1 <= b_ <= lp.n_blocks]
                copies_here = copies_here - float(act_bytes[blk_c].sum()) \
                    + max(per_block_c, default=0.0)
            else:
                copies_here *= in_flight
        else:
            acts = copies_here = 0.0
        gathered = 0.0
        if par.zero == 3 and dp > 1:
            per_block_params = [float(numel_gpu[lp.param_group == b_].sum()) for b_ in grp]
            gathered = 2 * max(per_block_params, default=0.0) * gather_b
        from predictor import memory as memmodel
        fixed = memmodel._fixed_bytes(prof, g) if prof is not None else 0.0
        upd_share = upd / total_trainable
        tmp_fb, tmp_opt = tmp.peaks(grp, upd_share) if tmp is not None else (0.0, 0.0)
        at_fb = acts + gathered + tmp_fb
        if at_fb >= tmp_opt:   # the peak falls in forward/backward (activations alive)
            parts = {"model_states": states / 2**30,
                     "activations": (acts - copies_here) / 2**30,
                     "weight_copies": copies_here / 2**30, "transient": tmp_fb / 2**30,
                     "gathered_params": gathered / 2**30, "context_workspace": fixed / 2**30}
        else:                  # in the optimizer step (activations freed)
            parts = {"model_states": states / 2**30, "activations": 0.0, "weight_copies": 0.0,
                     "transient": tmp_opt / 2**30, "gathered_params": 0.0,
                     "context_workspace": fixed / 2**30}
        mem = sum(parts.values())
        overhead_max = max(overhead_max, m * exposed) if per_mb >= max(stage_ms, default=0.0) \
            else overhead_max
        stage_ms.append(per_mb)
        stage_mem.append(mem)
        stage_parts.append(parts)
        if per_mb >= max(stage_ms):
            fwd_max, bwd_max, rec_max, tp_ms_max, pp_ms_max = f_ms, b_ms, rec_ms, tp_ms, p2p
        dp_exposed_max = max(dp_exposed_max, dp_ms)
        opt_max = max(opt_max, opt_ms)
        if worst is None or mem > stage_mem[worst]:
            worst = s
    slowest = max(stage_ms)
    bubble = (pp - 1) / v * slowest if pp > 1 else 0.0
    tp_total, pp_total = m * tp_ms_max, m * pp_ms_max
    comm = tp_total + pp_total + dp_exposed_max
    compute = m * (fwd_max + bwd_max + rec_max)
    sharded = {"column_parallel": list(lp.column_parallel), "row_parallel": list(lp.row_parallel),
               "vocab_parallel": list(lp.vocab_parallel),
               "unsharded_linears": list(lp.unsharded_linears), "kept_whole": dict(lp.kept_whole)}
    return ParallelPrediction(
        model=graph.name, gpu=g.id, batch_size=batch, forward_ms=m * fwd_max,
        backward_ms=m * (bwd_max + rec_max), optimizer_ms=opt_max, graph=graph,
        op_table=None, op_us=None, unsupported=dict(graph.unsupported),
        memory_gb=stage_mem[worst], memory_capacity_gb=g.memory_gb, overhead_ms=overhead_max,
        max_memory_fraction=max_memory_fraction, parallel=par, checkpoint=checkpoint,
        compute_ms=compute, comm_ms=comm, bubble_ms=bubble, recompute_ms=m * rec_max,
        tp_comm_ms=tp_total, pp_comm_ms=pp_total, dp_comm_ms=dp_exposed_max,
        stage_ms=stage_ms, stage_memory_gb=stage_mem, memory_parts_gb=stage_parts[worst],
        sharded=sharded, global_batch=batch * m * dp)


def search_layouts(graph, gpu: str, n_gpus: int, global_batch: int, *,
                   objective: str = "time", dtype=None, gpus_per_node: int = 8,
                   checkpoints=(None, "selective", "full"), zeros=(0, 1, 2, 3),
                   max_micro_batch: int = 64, inter_node_gbs: float | None = None,
                   max_memory_fraction: float = 0.9, sequence_parallel: bool = False,
                   tf32: tuple = (None, None)) -> list[dict]:
    """Every layout of `n_gpus` GPUs (dp x tp x pp, tp within a node) that
    runs `global_batch` samples per step, with its micro-batch, ZeRO stage and
    recomputation; rows sorted by iteration time (``objective="time"``) or
    GPU-hours per step (``"cost"``; the same order for one GPU type), those
    that fit first. Every row carries every choice. `sequence_parallel`:
    Megatron SP in every layout with ``tp > 1``."""
    _int("n_gpus", n_gpus, 1, 1 << 20)
    _int("global batch", global_batch, 1, 1 << 30)
    if objective not in ("time", "cost"):
        raise InvalidArgumentError(f"objective must be 'time' or 'cost', got {objective!r}")
    lp = check_layout_profile(graph)
    g = hardware.get(gpu) if isinstance(gpu, str) else gpu
    cache: dict = {}
    rows = []
    for tp, pp, dp, micro, mb, zero, ck in _layouts(graph, lp, n_gpus, global_batch,
                                                    gpus_per_node, max_micro_batch, zeros,
                                                    checkpoints):
        par = Parallel(dp=dp, tp=tp, pp=pp, microbatches=mb, zero=zero,
                       gpus_per_node=gpus_per_node,
                       inter_node_gbs=inter_node_gbs,
                       sequence_parallel=sequence_parallel and tp > 1)
        p = predict_parallel(graph, g, micro, par, ck, dtype=dtype, tf32=tf32,
                             max_memory_fraction=max_memory_fraction,
                             _cache=cache)
        d = p.to_dict()
        d["gpu_hours_per_step"] = p.iteration_ms / 3.6e6 * n_gpus
        d["memory_limit_gb"] = g.memory_gb * max_memory_fraction
        rows.append(d)
    key = "iteration_ms" if objective == "time" else "gpu_hours_per_step"
    rows.sort(key=lambda r: (not r["fits"], r[key]))
    return rows


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


MAX_LAYOUTS = 50_000


def _layouts(graph, lp, n_gpus: int, global_batch: int, gpus_per_node: int,
             max_micro_batch: int, zeros, checkpoints):
    """(tp, pp, dp, micro-batch, micro-batches, zero, checkpoint) of every layout."""
    out = []
    for tp in _divisors(n_gpus):
        if tp > gpus_per_node:
            continue
        for pp in _divisors(n_gpus // tp):
            if pp > lp.n_blocks:
                continue
            dp = n_gpus // tp // pp
            if global_batch % dp:
                continue
            per_dp = global_batch // dp
            for micro in _divisors(per_dp):
                if micro > max_micro_batch:
                    break
                mb = per_dp // micro
                if pp > 1 and mb < pp:
                    continue
                for zero in zeros:
                    if zero and dp == 1:
                        continue
                    for ck in checkpoints:
                        out.append((tp, pp, dp, micro, mb, zero, ck))
                        if len(out) > MAX_LAYOUTS:
                            raise InvalidArgumentError(
                                f"more than {MAX_LAYOUTS:,} layouts of {n_gpus:,} GPUs at global "
                                f"batch {global_batch:,}: narrow the search (ZeRO stages, "
                                "recomputation, the largest micro-batch)")
    return out
