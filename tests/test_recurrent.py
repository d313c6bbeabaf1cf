"""A recurrent layer is priced as the kernels cuDNN runs for it
(kernels.recurrent, kernels.optime.recurrent_us)."""

import numpy as np
import pytest
import torch

import predictor
from predictor import opmodel
from predictor.kernels import layout as L
from predictor.kernels.optime import is_learned, recurrent_params
from predictor.kernels.recurrent import MAX_KERNELS, lstm_kernels
from predictor.kernels.roofline import P_TF32_CONV, default_params
from predictor.kernels.work import flops_and_elems


def _kernels_of(d, family=L.LSTM):
    """(families, dims, counts) of the kernels of the recurrent row `d`."""
    fam = np.empty(MAX_KERNELS, np.int64)
    dims = np.zeros((MAX_KERNELS, L.MAX_DIMS), np.int64)
    counts = np.empty(MAX_KERNELS, np.int64)
    n = lstm_kernels(family, d, fam, dims, counts)
    return fam[:n], dims[:n], counts[:n]


def _kernels(family, t, b, i, h):
    d = np.zeros(L.MAX_DIMS, np.int64)
    d[:4] = (t, b, i, h)
    return (d, *_kernels_of(d, family))


@pytest.mark.parametrize("family", [L.LSTM, L.LSTM_BWD])
@pytest.mark.parametrize("t,b,i,h", [(25, 128, 1024, 1024), (7, 3, 40, 96), (1, 1, 0, 8)])
def test_the_kernels_do_the_layers_gemm_work(family, t, b, i, h):
    """The GEMMs of the expansion do the layer's multiply-adds: 2 T B 4H (I + H)
    forward, twice that backward (data and weight gradients)."""
    d, fam, dims, counts = _kernels(family, t, b, i, h)
    gemm = sum(c * flops_and_elems(f, x)[0] for f, x, c in zip(fam, dims, counts)
               if f == L.MATMUL)
    pointwise = 10.0 * t * b * 4 * h * (2 if family == L.LSTM_BWD else 1)
    assert gemm == pytest.approx(flops_and_elems(family, d)[0] - pointwise)
    # One step's recurrent GEMM and pointwise kernel run once per step.
    assert sorted(c for c in counts if c != 1 or t == 1)[:2] == [t, t]


def test_an_lstm_costs_its_kernels():
    """optime's price of an LSTM row is the sum of its kernels priced as rows
    of their own families, one launch each (kernels=1)."""
    for family in (L.LSTM, L.LSTM_BWD):
        d, fam, dims, counts = _kernels(family, 25, 128, 2048, 1024)
        parts = opmodel.predict_rows(fam, dims, "V100-PCIE-32GB", kernels=np.ones(len(fam)))
        whole = opmodel.predict_rows(np.array([family]), d[None], "V100-PCIE-32GB",
                                     kernels=np.ones(1))
        assert whole[0] == pytest.approx((parts * counts).sum(), rel=1e-9)


def test_fp32_lstm_gemms_follow_cudnns_tf32_switch():
    """cuDNN runs an fp32 layer's GEMMs on TF32 tensor cores when
    torch.backends.cudnn.allow_tf32 allows (the default), whatever the matmul
    switch: on an A100 turning the cuDNN switch off makes the layer slower;
    on a V100 (no TF32) it changes nothing."""
    d, *_ = _kernels(L.LSTM, 25, 128, 1024, 1024)
    on = default_params()
    off = on.copy()
    off[P_TF32_CONV] = 0.0
    assert recurrent_params(L.F32, on)[P_TF32_CONV] == 1.0
    for gpu, slower in (("A100-SXM4-80GB", True), ("V100-SXM2-16GB", False)):
        t_on, t_off = (opmodel.predict_rows(np.array([L.LSTM]), d[None], gpu, params=p,
                                            kernels=np.ones(1))[0] for p in (on, off))
        assert (t_off > 1.5 * t_on) if slower else t_off == pytest.approx(t_on)


def test_an_lstm_step_reports_its_basis():
    """fp32 on CUDA cores: learned (its GEMMs and pointwise kernels are the
    learned models'); half precision: analytical (tensor-core GEMMs)."""
    import torch

    def build():
        lstm = torch.nn.LSTM(64, 128, batch_first=True)
        return lstm, torch.randn(8, 10, 64)

    g = predictor.trace(build, loss_fn="mean")
    assert is_learned(L.LSTM, opmodel.weights()) == bool(opmodel.weights().size)
    ops = predictor.predict(g, "V100-PCIE-32GB").ops
    lstm = ops[ops.family.isin(["lstm", "lstm_bwd"])]
    assert len(lstm) == 2
    expect = "learned" if opmodel.weights().size else "analytical"
    assert set(lstm.basis) == {expect}
    ops = predictor.predict(g, "V100-PCIE-32GB", dtype="float16").ops
    assert set(ops[ops.family.isin(["lstm", "lstm_bwd"])].basis) == {"analytical"}


class _Recurrent(torch.nn.Module):
    def __init__(self, kind, **kw):
        super().__init__()
        self.rnn = kind(64, 96, **kw)
        self.head = torch.nn.Linear(96 * (2 if kw.get("bidirectional") else 1), 10)

    def forward(self, x):
        return self.head(self.rnn(x)[0])


@pytest.mark.parametrize("amp", [None, "bf16", "fp16"])
@pytest.mark.parametrize("kind,kw,gates", [
    (torch.nn.GRU, dict(num_layers=2, bidirectional=True, dropout=0.1, batch_first=True), 3),
    (torch.nn.RNN, dict(nonlinearity="relu", bias=False, batch_first=True), 1),
    (torch.nn.RNN, dict(batch_first=True), 1),
])
def test_gru_and_rnn_trace_as_cudnns_layers(kind, kw, gates, amp):
    """A CPU has no fused GRU or RNN layer and decomposes every step into GEMMs,
    unsafe_split and pointwise ops (2,660 ops, 160 of them unmodelled, for a
    2-layer GRU over 40 steps); the trace takes CUDA's path, one _cudnn_rnn
    and its backward, one recurrent row per layer and direction carrying its
    gates, in the autocast dtype under amp."""
    def build():
        return _Recurrent(kind, **kw), torch.randn(8, 20, 64)

    g = predictor.trace(build, loss_fn="mean", amp=amp)
    assert not g.unsupported and len(g.ops) < 60
    ops = g.ops
    rec = np.isin(ops.family, (L.LSTM, L.LSTM_BWD))
    layers = kw.get("num_layers", 1) * (2 if kw.get("bidirectional") else 1)
    assert int(ops.count[rec & (ops.family == L.LSTM)].sum()) == layers
    assert int(ops.count[rec & (ops.family == L.LSTM_BWD)].sum()) == layers
    dims = ops.dims(8)[rec]
    assert set(dims[:, 0]) == {20} and set(dims[:, 1]) == {8} and set(dims[:, 4]) == {gates}
    want = {None: L.F32, "bf16": L.BF16, "fp16": L.F16}[amp]
    assert set(ops.dtype[rec]) == {want}
    p = predictor.predict(g, "A100-SXM4-80GB")
    assert np.isfinite(p.iteration_ms) and p.iteration_ms > 0
    shapes = set(p.ops[p.ops.family.isin(["lstm", "lstm_bwd"])]["shape"])
    assert all(s.endswith(" GRU" if gates == 3 else " RNN") for s in shapes)


def test_gate_count_sets_the_work():
    """A GRU layer's GEMMs are three quarters of an LSTM layer's of the same
    sizes, a plain RNN's a quarter; 0 (a graph saved before the column) is an
    LSTM."""
    flops = {}
    for gates in (0, 4, 3, 1):
        d = _kernels(L.LSTM, 25, 64, 512, 512)[0]
        d[4] = gates
        fam, dims, counts = _kernels_of(d)
        flops[gates] = sum(c * flops_and_elems(f, x)[0] for f, x, c in zip(fam, dims, counts)
                           if f == L.MATMUL)
    assert flops[0] == flops[4]
    assert flops[3] == pytest.approx(0.75 * flops[4])
    assert flops[1] == pytest.approx(0.25 * flops[4])


class _CellLoop(torch.nn.Module):
    """A cell stepped from Python over the sequence dim of [batch, steps, 16]."""

    def __init__(self, cell, bias=True):
        super().__init__()
        self.cell = cell(16, 24, bias=bias)

    def forward(self, x):
        h = torch.zeros(x.shape[0], 24)
        state = (h, torch.zeros_like(h)) if isinstance(self.cell, torch.nn.LSTMCell) else h
        for t in range(x.shape[1]):
            state = self.cell(x[:, t], state)
        return state[0] if isinstance(state, tuple) else state


@pytest.mark.parametrize("cell", [torch.nn.GRUCell, torch.nn.LSTMCell, torch.nn.RNNCell])
def test_a_cell_loop_has_nothing_unmodelled(cell):
    """A cell stepped from Python traces to nothing the predictor does not
    price; the CPU chunks an RNN cell's gates with unsafe_split, a view that
    costs nothing (it was priced from its bytes, and listed as unmodelled)."""
    g = predictor.trace(_CellLoop(cell), (torch.randn(4, 6, 16),), loss_fn="mean")
    assert g.unsupported == {}
    p = predictor.predict(g, "T4")
    assert np.isfinite(p.iteration_ms) and p.iteration_ms > 0


@pytest.mark.parametrize("amp", [None, "fp16"])
@pytest.mark.parametrize("cell,fused,gates,bias", [
    (torch.nn.LSTMCell, "_thnn_fused_lstm_cell", 4, True),
    (torch.nn.GRUCell, "_thnn_fused_gru_cell", 3, True),
    (torch.nn.GRUCell, "_thnn_fused_gru_cell", 3, False),
])
def test_lstm_and_gru_cells_run_cudas_fused_kernel(cell, fused, gates, bias, amp):
    """On a GPU an LSTM or GRU cell is its two gate GEMMs (no bias) and one
    fused pointwise kernel forward, one backward plus the biases' column
    sums; a CPU runs each gate's sigmoid, tanh, product and sum as a kernel
    of its own. Six steps: six fused kernels each way, 12 gate GEMMs
    forward, and no other pointwise kernel in the forward but the loss's;
    the fused kernels in the autocast dtype under amp."""
    steps = 6
    g = predictor.trace(_CellLoop(cell, bias), (torch.randn(4, steps, 16),), loss_fn="mean",
                        amp=amp)
    assert g.unsupported == {}
    p = predictor.predict(g, "A100-SXM4-80GB")
    assert np.isfinite(p.iteration_ms) and p.iteration_ms > 0
    df = p.ops
    fwd = df[df.phase == "forward"]
    assert int(fwd[fwd.op == fused]["count"].sum()) == steps
    assert int(fwd[fwd.family == "matmul"]["count"].sum()) == 2 * steps
    assert set(fwd[fwd.family == "matmul"]["op"]) == {"mm"}
    assert set(fwd[fwd.family == "elementwise"]["op"]) <= {fused, "mul"}  # "mean"'s scale
    bwd = df[(df.phase == "backward") & (df.op == fused + ("_backward_impl" if gates == 4
                                                            else "_backward"))]
    assert int(bwd[bwd.family == "elementwise"]["count"].sum()) == steps
    sums = int(bwd[bwd.family == "reduction"]["count"].sum())
    assert sums == (0 if not bias else steps * (1 if gates == 4 else 2))
    want = {None: "float32", "fp16": "float16"}[amp]
    assert set(df[df.op.str.startswith("_thnn_fused")]["dtype"]) == {want}
    # every fused row describes the elements it writes, a whole number of
    # [batch, hidden] slices, as the elementwise training rows do
    dims = g.ops.dims(4)
    rows = np.array([g.ops.op_names[i].startswith("_thnn_fused") for i in g.ops.op])
    rows &= g.ops.family == L.ELEMENTWISE
    assert rows.any()
    assert (dims[rows, 3] == 24).all()
    assert (dims[rows, 1] == dims[rows, 3] * dims[rows, 4]).all()


def test_a_fused_cell_step_costs_less_than_its_pointwise_ops():
    """The fused LSTM cell replaces about ten forward and twenty backward
    pointwise kernels a step: a cell loop at a small batch, where those
    kernels' launches and ramps dominate, is predicted faster than the same
    loop's CPU decomposition (the `lstm_cell` call left to the CPU path)."""
    from predictor.frontend import cuda_paths

    x = (torch.randn(8, 20, 16),)
    fused = predictor.predict(predictor.trace(_CellLoop(torch.nn.LSTMCell), x,
                                              loss_fn="mean"), "V100-SXM2-16GB")
    cells = cuda_paths._CELLS
    try:
        cuda_paths._CELLS = ()
        plain = predictor.predict(predictor.trace(_CellLoop(torch.nn.LSTMCell), x,
                                                  loss_fn="mean"), "V100-SXM2-16GB")
    finally:
        cuda_paths._CELLS = cells
    k = lambda p: int(p.ops.kernels.sum())
    assert k(fused) < 0.5 * k(plain)
    assert fused.iteration_ms < 0.8 * plain.iteration_ms


@pytest.mark.parametrize("kind", [torch.nn.LSTM, torch.nn.GRU])
def test_a_recurrent_row_launches_its_kernels(kind):
    """The host pays a launch for every kernel cuDNN runs (predictor.overhead):
    a recurrent row counts the kernels of its expansion, 2 T + 1 forward and
    2 T + 4 backward for a layer with an input projection (the transpose of
    W_hh among them), not one."""
    def build():
        return _Recurrent(kind, num_layers=2, batch_first=True), torch.randn(8, 20, 64)

    ops = predictor.trace(build, loss_fn="mean").ops
    rec = np.nonzero(np.isin(ops.family, (L.LSTM, L.LSTM_BWD)))[0]
    assert len(rec) == 4
    dims = ops.dims(8)
    for i in rec:
        counts = _kernels_of(dims[i], ops.family[i])[2]
        assert ops.kernels[i] == counts.sum()
        assert ops.kernels[i] == (41 if ops.family[i] == L.LSTM else 44)


def test_the_backward_steps_read_a_transposed_copy_of_the_weights():
    """cuDNN transposes W_hh once per call and runs each step's data
    gradient on the copy, K-major, as the forward's recurrent GEMM reads it
    (Appleyard, "Optimizing Recurrent Neural Networks in cuDNN 5",
    optimization 4): one copy kernel of 4H x H elements, and every per-step
    GEMM of either pass reads its weights K-major. The reference agrees."""
    from predictor import reference

    for family in (L.LSTM, L.LSTM_BWD):
        d, fam, dims, counts = _kernels(family, 25, 128, 1024, 512)
        steps = [j for j in range(len(fam)) if fam[j] == L.MATMUL and counts[j] == 25]
        assert len(steps) == 1 and dims[steps[0], L.GEMM_LAYOUT] & L.GEMM_B_T
        copies = [j for j in range(len(fam)) if fam[j] == L.COPY]
        if family == L.LSTM:
            assert not copies
        else:
            (j,) = copies
            assert counts[j] == 1 and dims[j, L.MEM_READ] == dims[j, L.MEM_WRITTEN] == 4 * 512 * 512
        ref = reference.lstm_kernels(family, [int(x) for x in d])
        assert [(f, c) for f, _, c in ref] == list(zip(fam.tolist(), counts.tolist()))
        assert all(list(x[:L.GEMM_LAYOUT + 1]) == list(r[:L.GEMM_LAYOUT + 1])
                   for (_, r, _), x in zip(ref, dims))


def test_a_packed_sequence_is_refused_with_what_to_trace_instead():
    """pack_padded_sequence's output shape is the sum of the lengths' values,
    which a trace does not know: one line that says to trace the padded
    batch."""
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

    class Packed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = torch.nn.LSTM(16, 24, batch_first=True)

        def forward(self, x):
            lengths = torch.full((x.shape[0],), x.shape[1], dtype=torch.long)
            out, _ = self.lstm(pack_padded_sequence(x, lengths, batch_first=True))
            return pad_packed_sequence(out, batch_first=True)[0]

    with pytest.raises(predictor.TraceError) as err:
        predictor.trace(Packed(), (torch.randn(4, 6, 16),), loss_fn="mean")
    msg = str(err.value)
    assert "\n" not in msg and "trace the padded batch" in msg
