"""The trace records the kernels a GPU runs, not the CPU decomposition: fused
dropout, kernel counts per aten op, host ops per phase, CPU launch overhead."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import predictor
from predictor import families, overhead
from predictor.kernels import layout as L


class Tiny(nn.Module):
    def __init__(self, vocab=1000, d=64):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.ln = nn.LayerNorm(d)
        self.fc = nn.Linear(d, vocab)
        self.drop = nn.Dropout(0.1)

    def forward(self, ids):
        h = self.drop(self.ln(self.emb(ids)))
        return self.fc(h)


def tiny_loss(logits):
    flat = logits.reshape(-1, logits.shape[-1])
    return F.cross_entropy(flat, torch.zeros(flat.shape[0], dtype=torch.long))


def trace_tiny(batch, seq=64, mode="train"):
    return predictor.trace(Tiny, lambda b: (torch.zeros(b, seq, dtype=torch.long),),
                           loss_fn=tiny_loss, optimizer=None, mode=mode, batch_size=batch)


@pytest.fixture(scope="module")
def small():
    return trace_tiny(4)          # 256 indices: embedding backward's atomic path


@pytest.fixture(scope="module")
def large():
    return trace_tiny(64)         # 4096 indices: the sort path


def rows(graph, op):
    t = graph.ops
    names = np.asarray(t.op_names, dtype=object)[t.op]
    return np.flatnonzero(names == op)


def test_dropout_is_the_fused_cuda_kernel(small):
    names = set(small.ops.op_names)
    assert "native_dropout" in names and "native_dropout_backward" in names
    assert not names & {"bernoulli_", "bernoulli", "div_"}
    (fwd,) = rows(small, "native_dropout")
    assert small.ops.kernels[fwd] == 1 and small.ops.family[fwd] == L.DROPOUT
    # Output (fp32) plus a bool mask: 1.25 x the input in fp32 elements.
    d = small.ops.dims(4)[fwd]
    assert d[L.MEM_WRITTEN] == d[L.MEM_READ] + d[L.MEM_READ] // 4


def test_inference_runs_no_dropout():
    g = trace_tiny(4, mode="inference")
    assert not set(g.ops.op_names) & {"native_dropout", "bernoulli_"}


def test_layer_norm_backward_launches_two_kernels(small):
    (i,) = rows(small, "native_layer_norm_backward")
    assert small.ops.kernels[i] == 2


def test_embedding_backward_kernels_follow_the_index_count(small, large):
    (i,) = rows(small, "embedding_dense_backward")
    (j,) = rows(large, "embedding_dense_backward")
    assert small.ops.kernels[i] == 2
    assert large.ops.kernels[j] == families.EMBEDDING_BWD_SORT_KERNELS


def test_nll_loss_backward_zeroes_then_scatters(small):
    idx = rows(small, "nll_loss_backward")
    fams = sorted(int(small.ops.family[i]) for i in idx)
    assert fams == sorted([L.FILL, L.LOSS])
    fill = [i for i in idx if small.ops.family[i] == L.FILL][0]
    d = small.ops.dims(4)[fill]
    assert d[L.MEM_READ] == 0 and d[L.MEM_WRITTEN] == 4 * 64 * 1000


def test_host_ops_count_views_too(small):
    assert len(small.host_ops) == len(L.PHASE_NAMES)
    fwd_rows = small.ops.count[small.ops.phase == L.FORWARD].sum()
    assert small.host_ops[L.FORWARD] > fwd_rows  # views dispatch but launch nothing
    assert small.host_ops[L.BACKWARD] > 0 and small.host_ops[L.OPTIMIZER_PHASE] == 0


def test_host_time_is_dispatch_plus_launch(small):
    h = overhead.host_ms(small, dispatch_us=1.0, launch_us=0.0)
    np.testing.assert_allclose(h, np.asarray(small.host_ops) * 1e-3)
    k = overhead.host_ms(small, dispatch_us=0.0, launch_us=1.0)
    np.testing.assert_allclose(k, overhead.kernels_per_phase(small.ops) * 1e-3)


def test_combine_is_the_larger_of_gpu_and_host():
    gpu = np.array([[[1.0, 5.0, 0.0]]])
    host = np.array([2.0, 1.0, 0.0])
    total, exposed = overhead.combine(gpu, host)
    np.testing.assert_allclose(total, [[[2.0, 5.0, 0.0]]])
    np.testing.assert_allclose(exposed, [[[1.0, 0.0, 0.0]]])


def test_small_batch_on_a_fast_gpu_is_host_bound(small):
    p = predictor.predict(small, "H100-SXM5-80GB", batch_size=1)
    host = overhead.host_ms(small).sum()
    assert p.overhead_ms > 0
    assert p.iteration_ms == pytest.approx(max(host, p.iteration_ms), rel=1e-9)
    assert 0 < p.overhead_share < 1
    assert p.to_dict()["overhead_ms"] == p.overhead_ms


def test_large_batch_hides_the_host(small):
    p = predictor.predict(small, "T4", batch_size=4096)
    assert p.overhead_ms == 0.0


def test_sweep_reports_overhead_per_configuration(small):
    s = predictor.sweep(small, ["T4", "H100-SXM5-80GB"], [1, 4096])
    assert s.overhead_ms.shape == (2, 2)
    assert (s.overhead_ms >= 0).all() and s.overhead_ms[1, 0] > 0
    df = s.to_pandas()
    assert "overhead_ms" in df.columns
    p = predictor.predict(small, "H100-SXM5-80GB", batch_size=1)
    assert s.overhead_ms[1, 0] == pytest.approx(p.overhead_ms)


def test_old_graphs_without_host_ops_still_predict(small):
    import dataclasses

    g = dataclasses.replace(small, host_ops=[])
    p = predictor.predict(g, "H100-SXM5-80GB", batch_size=1)
    assert np.isfinite(p.iteration_ms) and p.overhead_ms >= 0


def test_gemm_layout_follows_the_operands():
    """F.linear multiplies by a transposed weight view; a weight stored
    [in, out] (GPT-2's Conv1D) and its backward's dX GEMM are plain row-major;
    a weight gradient dY^T @ X has a transposed first operand."""

    class Conv1D(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.zeros(64, 32))
            self.bias = nn.Parameter(torch.zeros(32))

        def forward(self, x):
            return torch.addmm(self.bias, x, self.weight)

    def layouts(module):
        g = predictor.trace(module, (torch.zeros(8, 64, requires_grad=True),), optimizer=None,
                            batch_size=8)
        t = g.ops
        names = np.asarray(t.op_names, dtype=object)[t.op]
        mm = t.family == L.MATMUL
        return sorted((L.PHASE_NAMES[p], n, int(d[4]))
                      for p, n, d in zip(t.phase[mm], names[mm], t.dims(8)[mm]))

    assert ("forward", "addmm", L.GEMM_B_T) in layouts(nn.Linear(64, 32))
    conv1d = layouts(Conv1D())
    assert ("forward", "addmm", 0) in conv1d
    assert ("backward", "mm", L.GEMM_A_T) in conv1d       # dW = x^T @ dY


def test_memory_rows_have_inner_times_outer_elements():
    """inner x outer spans the tensor for every memory-bound row the per-op
    models see (dropout, clone and the optimizer's foreach rows included)."""
    g = predictor.trace(Tiny, lambda b: (torch.zeros(b, 64, dtype=torch.long),), loss_fn=tiny_loss,
                        optimizer="adam", batch_size=4)
    t = g.ops
    d = t.dims(4)
    names = np.asarray(t.op_names, dtype=object)[t.op]
    checked = set()
    for i in range(len(t)):
        if t.family[i] in (L.DROPOUT, L.COPY, L.OPTIMIZER) or names[i] == "native_dropout_backward":
            inner, outer = d[i, L.MEM_INNER], d[i, L.MEM_OUTER]
            written = d[i, L.MEM_WRITTEN]
            assert inner * outer <= written + outer and inner * outer * 2 >= written // 2, names[i]
            checked.add(int(t.family[i]))
    assert {L.DROPOUT, L.OPTIMIZER} <= checked


class GatherLoss(nn.Module):
    """A label-smoothing-style loss: the target's log-probability gathered."""

    def __init__(self, vocab=1001, d=64):
        super().__init__()
        self.fc = nn.Linear(d, vocab)

    def forward(self, x, target):
        lp = torch.log_softmax(self.fc(x), dim=-1)
        return -lp.gather(1, target[:, None]).mean()


def _memory_row(graph, name):
    ops = graph.ops
    rows = [i for i, n in enumerate(ops.op_names) if n == name]
    assert rows, (name, ops.op_names)
    at = [j for j, o in enumerate(ops.op) if o in rows]
    return [ops.dims(4096)[j] for j in at]


def test_a_gathers_gradient_scatters_only_the_gathered_elements():
    """ATen's gradient of a gather is zeros, then an in-place scatter-add of
    the gathered elements' gradients (one per index element); the fake
    tensors' trace takes the out-of-place form, which would copy the whole
    [tokens, vocabulary] zeros first. It is priced as the GPU runs it: the
    fill writes the tensor, the scatter touches 4,096 elements."""
    g = predictor.trace(GatherLoss, lambda b: (torch.randn(b, 64), torch.zeros(b, dtype=torch.long)),
                        loss_fn=lambda out: out, batch_size=8, optimizer=None)
    names = list(g.ops.op_names)
    assert "scatter_add_" in names and "scatter_add" not in names
    (scatter,) = _memory_row(g, "scatter_add_")
    assert scatter[L.MEM_WRITTEN] == 4096 and scatter[L.MEM_READ] == 3 * 4096
    (fill,) = _memory_row(g, "new_zeros")
    assert fill[L.MEM_WRITTEN] == 4096 * 1001


def test_a_scatter_into_a_tensor_in_use_keeps_its_copy():
    """An out-of-place scatter-add whose destination is used again is a real
    copy and a scatter; a user's in-place one touches only its index's
    elements."""
    def step(x, idx):
        base = torch.zeros_like(x)
        y = base.scatter_add(1, idx, x[:, :8])
        return (y + base).sum()

    def inplace(x, idx):
        return torch.zeros_like(x).scatter_add_(1, idx, x[:, :8]).sum()

    for fn, name, written in ((step, "scatter_add", 4096 * 512), (inplace, "scatter_add_", 4096 * 8)):
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.w = nn.Parameter(torch.ones(512))

            def forward(self, x, idx, fn=fn):
                return fn(x * self.w, idx)

        g = predictor.trace(M, lambda b: (torch.randn(b, 512), torch.zeros(b, 8, dtype=torch.long)),
                            loss_fn=lambda out: out, batch_size=8, optimizer=None, mode="inference")
        (row,) = _memory_row(g, name)
        assert row[L.MEM_WRITTEN] == written, name


class RMSNormed(nn.Module):
    def __init__(self, d=64, weight_dtype=None):
        super().__init__()
        self.inp = nn.Linear(d, d)
        self.norm = nn.RMSNorm(d, dtype=weight_dtype)
        self.fc = nn.Linear(d, d)

    def forward(self, x):
        return self.fc(self.norm(self.inp(x)).float())


def _names_by_phase(graph):
    t = graph.ops
    names = np.asarray(t.op_names, dtype=object)[t.op]
    return {(str(n), int(p)): int(c) for n, p, c in zip(names, t.phase, t.count)}


@pytest.mark.parametrize("amp", [None, "bf16"])
def test_rms_norm_is_the_fused_cuda_kernel(amp):
    """nn.RMSNorm / F.rms_norm: ATen runs CUDA's fused kernel, one forward and
    its backward (the input's gradient and the weight's column sum), where
    the CPU's composite is a power, a mean, an add, a rsqrt and two products
    and their gradients; under autocast in fp32, as CUDA's autocast runs it."""
    g = predictor.trace(RMSNormed(), (torch.randn(8, 16, 64),), loss_fn="mean", amp=amp)
    assert g.unsupported == {}
    seen = _names_by_phase(g)
    assert seen[("_fused_rms_norm", L.FORWARD)] == 1
    assert seen[("_fused_rms_norm_backward", L.BACKWARD)] == 1
    assert not {n for n, _ in seen} & {"rsqrt", "pow", "pow_backward"}
    t = g.ops
    names = np.asarray(t.op_names, dtype=object)[t.op]
    fwd = np.flatnonzero(names == "_fused_rms_norm")[0]
    bwd = np.flatnonzero(names == "_fused_rms_norm_backward")[0]
    assert t.family[fwd] == L.LAYER_NORM and t.family[bwd] == L.LAYER_NORM_BWD
    assert t.kernels[fwd] == 1 and t.kernels[bwd] == 2
    d = t.dims(8)
    assert d[fwd, L.MEM_INNER] == 64 and d[fwd, L.MEM_OUTER] == 8 * 16
    assert t.dtype[fwd] == L.F32  # autocast's fp32 list holds rms_norm
    p = predictor.predict(g, "H100-SXM5-80GB")
    assert np.isfinite(p.iteration_ms) and p.iteration_ms > 0


def test_rms_norm_with_a_weight_of_another_dtype_stays_composite():
    """A weight of another dtype than the input sends ATen to the composite
    on a GPU too (rms_norm_symint's dtype check)."""
    g = predictor.trace(RMSNormed(weight_dtype=torch.float64), (torch.randn(8, 16, 64),),
                        loss_fn="mean")
    seen = {n for n, _ in _names_by_phase(g)}
    assert "_fused_rms_norm" not in seen and "rsqrt" in seen


def test_the_fused_rms_norm_op_computes_rms_norm():
    """On real tensors the trace's op is ATen's composite, forward and backward."""
    from predictor.fused_ops import fused_rms_norm

    x = torch.randn(4, 8, dtype=torch.float64, requires_grad=True)
    w = torch.randn(8, dtype=torch.float64, requires_grad=True)
    out, rstd = fused_rms_norm(x, [8], w, 1e-6)
    want = F.rms_norm(x, [8], w, 1e-6)
    assert torch.allclose(out, want)
    assert torch.allclose(rstd, torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
    assert torch.autograd.gradcheck(lambda a, b: fused_rms_norm(a, [8], b, 1e-6)[0], (x, w))
