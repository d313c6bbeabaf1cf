"""Copies and elementwise ops PyTorch runs with its non-vectorised kernels
(layout.MEM_GENERIC): which rows the lowering flags, their price by elements
per SM clock (kernels.roofline.generic_kernel_us), and the H200 profile the
rates come from."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import predictor
from predictor import hardware, opmodel, reference
from predictor.families import TensorMeta, copy_kernel
from predictor.kernels import layout as L
from predictor.kernels.optime import isolated_time_us, op_time_us
from predictor.kernels.roofline import (CAST_BINARY_ELEMS_PER_SM_CLOCK,
                                        CAST_COPY_ELEMS_PER_SM_CLOCK, P_LAUNCH_US,
                                        STRIDED_COPY_ELEMS_PER_SM_CLOCK, default_params)

PROFILE = Path(__file__).resolve().parent.parent / "benchmarks" / "data" / "h200" / "profile"
F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16


def _meta(dtype, layout="contiguous", shape=(8, 512, 16, 64)):
    return TensorMeta(shape, dtype, channels_last=layout == "channels_last",
                      contiguous=layout == "contiguous")


@pytest.mark.parametrize("src, dst, kind", [
    (_meta(F32, "strided"), _meta(F32), L.COPY_STRIDED),        # permute(...).contiguous()
    (_meta(BF16, "strided"), _meta(F32), L.COPY_STRIDED),       # strided with a cast
    (_meta(F32), _meta(F32, "channels_last"), L.COPY_STRIDED),  # NCHW -> NHWC
    (_meta(F32, "strided"), _meta(F32, "strided"), 0),          # clone keeping the layout
    (_meta(F32), _meta(F32), 0),                                 # cudaMemcpy
    (_meta(F32), _meta(BF16), 0),                                # vectorised fp32 -> bf16
    (_meta(F32), _meta(F16), 0),                                 # vectorised fp32 -> fp16
    (_meta(BF16), _meta(F32), L.COPY_CAST),                      # autocast's bf16 -> fp32
    (_meta(F16), _meta(F32), L.COPY_CAST),
    (_meta(torch.int64), _meta(F32), L.COPY_CAST),
])
def test_copy_kernel_follows_atens_copy_dispatch(src, dst, kind):
    assert copy_kernel(src, dst) == kind


class Heads(torch.nn.Module):
    """Attention's head split and merge, and an fp32 tail, as an autocast
    transformer layer runs them."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(64, 64)

    def forward(self, x):
        b, s, _ = x.shape
        h = self.proj(x).view(b, s, 4, 16).permute(0, 2, 1, 3).contiguous()
        h = h.permute(0, 2, 1, 3).reshape(b, s, 64)
        return torch.softmax(h.float(), -1)


def _copy_rows(graph):
    ops = graph.ops
    d = ops.dims(graph.batch_size)
    m = ops.family == L.COPY
    names = [ops.op_names[i] for i in ops.op[m]]
    return list(zip(names, d[m, L.MEM_GENERIC], ops.phase[m]))


def test_trace_flags_head_permutes_and_widening_casts():
    g = predictor.trace(Heads(), (torch.zeros(8, 32, 64),), amp="bf16",
                        loss_fn=lambda out: out.mean())
    rows = _copy_rows(g)
    forward = [(n, int(k)) for n, k, p in rows if p == L.FORWARD]
    assert ("clone", L.COPY_STRIDED) in forward  # .contiguous() of the permuted heads
    assert ("_to_copy", L.COPY_CAST) in forward  # the bf16 activations to fp32 for softmax
    assert ("_to_copy", 0) in forward            # fp32 weights to bf16: vectorised
    # In fp32 the same model has the strided copies and no casts.
    g32 = predictor.trace(Heads(), (torch.zeros(8, 32, 64),), loss_fn=lambda out: out.mean())
    kinds = {(n, int(k)) for n, k, _ in _copy_rows(g32)}
    assert ("clone", L.COPY_STRIDED) in kinds and not any(n == "_to_copy" for n, _ in kinds)


def _row(kind, elems=8 * 16 * 512 * 64, dtype_bytes_units=1):
    d = np.zeros(L.MAX_DIMS, dtype=np.int64)
    inner = 64
    d[:5] = (elems, elems * dtype_bytes_units, 0, inner, elems // inner)
    d[L.MEM_GENERIC] = kind
    return d


def _both(d, dtype, gpu):
    params, mlp = default_params(), opmodel.weights()
    f = hardware.get(gpu).features
    t = op_time_us(L.COPY, dtype, 1, d, f, params, mlp)
    assert reference.op_time_us(L.COPY, dtype, 1, list(d), list(f), params, mlp) \
        == pytest.approx(t, rel=1e-9)
    return t, params[P_LAUNCH_US], f


@pytest.mark.parametrize("kind, rate, units", [
    (L.COPY_STRIDED, STRIDED_COPY_ELEMS_PER_SM_CLOCK, 1),
    (L.COPY_CAST, CAST_COPY_ELEMS_PER_SM_CLOCK, 2),
])
def test_a_generic_copy_on_an_h200_is_bound_by_its_elements(kind, rate, units):
    d = _row(kind, dtype_bytes_units=units)
    t, launch, f = _both(d, L.BF16, "H200-SXM-141GB")
    elems = d[L.MEM_INNER] * d[L.MEM_OUTER]
    assert t - launch == pytest.approx(elems / (rate * f[L.G_SMS] * f[L.G_CLOCK_MHZ]))
    plain = d.copy()
    plain[L.MEM_GENERIC] = 0
    t_plain, _, _ = _both(plain, L.BF16, "H200-SXM-141GB")
    assert t > 1.5 * t_plain  # the bytes alone would be priced well under half of it
    iso = isolated_time_us(L.COPY, L.BF16, d, f, default_params(), opmodel.weights())
    assert iso >= elems / (rate * f[L.G_SMS] * f[L.G_CLOCK_MHZ])


@pytest.mark.parametrize("gpu", ["T4", "MI300X"])
def test_where_the_element_rate_does_not_bind(gpu):
    # A T4 moves 5 bytes of DRAM per SM clock: an fp32 strided copy's 8 bytes
    # an element bind first. An AMD GPU's kernels are not these.
    d = _row(L.COPY_STRIDED)
    t, _, _ = _both(d, L.F32, gpu)
    plain = d.copy()
    plain[L.MEM_GENERIC] = 0
    assert t == pytest.approx(_both(plain, L.F32, gpu)[0], rel=1e-12)


def test_h200_profile_rates_reproduce_bert_large_copy_kernels():
    """The rates are the H200's measured kernels of a BERT-large bf16 autocast
    step (batch 16) over the traced rows' elements: each kernel kind's summed
    time is what the flagged rows add up to at their rate."""
    prof = pd.read_csv(PROFILE / "bert-large-b16-bf16.csv")
    strided = prof.kernel.str.contains("elementwise_kernel<128, 4")
    strided &= prof.kernel.str.contains("direct_copy_kernel_cuda")
    cast = prof.kernel.str.startswith("void at::native::unrolled_elementwise_kernel<at::native::"
                                      "direct_copy_kernel_cuda")
    g = predictor.trace("bert-large", batch_size=16, amp="bf16", optimizer="adam")
    ops = g.ops
    d = ops.dims(16)
    f = hardware.get("H200-SXM-141GB").features
    cycles_us = f[L.G_SMS] * f[L.G_CLOCK_MHZ]
    for mask, kind, rate in ((strided, L.COPY_STRIDED, STRIDED_COPY_ELEMS_PER_SM_CLOCK),
                             (cast, L.COPY_CAST, CAST_COPY_ELEMS_PER_SM_CLOCK)):
        rows = (ops.family == L.COPY) & (d[:, L.MEM_GENERIC] == kind)
        assert int(ops.count[rows].sum()) == pytest.approx(prof.calls[mask].sum(), abs=1)
        elems = (d[rows, L.MEM_INNER] * d[rows, L.MEM_OUTER] * ops.count[rows]).sum()
        assert elems / (rate * cycles_us) == pytest.approx(prof.us_per_step[mask].sum(),
                                                           rel=0.02)


def test_profile_totals_leave_out_the_optimizer_annotation():
    # torch.profiler lists record_function ranges (the optimizer's step) on the
    # GPU timeline too; they span kernels already counted.
    prof = pd.read_csv(PROFILE / "bert-large-b16-bf16.csv")
    assert prof.kernel.str.contains("#").sum() > 1  # kernel names hold '#'
    annotation = prof.kernel.str.startswith("Optimizer.step")
    assert annotation.sum() == 1
    assert prof.us_per_step[~annotation].sum() / 1e3 == pytest.approx(108.4, abs=0.1)


@pytest.mark.parametrize("kind", [L.COPY_STRIDED, L.COPY_CAST])
def test_calibration_measures_the_copy_kernel_the_row_names(kind):
    from calibration.measure import RowContext, build_runner

    units = 2 if kind == L.COPY_CAST else 1
    d = tuple(int(v) for v in _row(kind, elems=6 * 10 * 16, dtype_bytes_units=units))
    name = "clone" if kind == L.COPY_STRIDED else "_to_copy"
    ctx = RowContext(L.COPY, torch.bfloat16, 1, d, name, 1, torch.device("cpu"))
    out = build_runner(ctx)()
    assert out.numel() == 6 * 10 * 16
    assert out.dtype == (torch.float32 if kind == L.COPY_CAST else torch.bfloat16)
    assert out.is_contiguous()


def test_float8_copies_are_compiled_kernels():
    e4m3 = torch.float8_e4m3fn
    assert copy_kernel(_meta(BF16), _meta(e4m3)) == 0
    assert copy_kernel(_meta(e4m3, "strided"), _meta(e4m3)) == 0


@pytest.mark.parametrize("amp", [None, "bf16"])
def test_the_sweep_prices_flagged_copies_as_the_per_op_table_does(amp):
    # The sweep's block form of the learned models (kernels.grid) and the
    # per-op times (p.ops) must agree on an fp32 strided copy too, which the
    # learned elementwise network serves directly.
    g = predictor.trace(Heads(), (torch.zeros(64, 512, 64),), amp=amp,
                        loss_fn=lambda out: out.mean())
    for gpu in ("H200-SXM-141GB", "A100-SXM4-80GB", "T4"):
        p = predictor.predict(g, gpu)
        ops = p.ops
        assert ops["shape"].str.contains("strided").any()
        gpu_ms = p.iteration_ms - p.overhead_ms  # the phases without the host's wait
        assert ops.ms.sum() == pytest.approx(gpu_ms, rel=1e-9)


class Split(Heads):
    """The head split alone: its transpose stays in the exported graph."""

    def forward(self, x):
        b, s, _ = x.shape
        h = self.proj(x).view(b, s, 4, 16).permute(0, 2, 1, 3).contiguous()
        return torch.softmax(h.reshape(b, -1), -1)


def test_onnx_transposes_are_strided_copies_as_in_the_fx_trace(tmp_path):
    pytest.importorskip("onnx")
    import warnings

    path = tmp_path / "split.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Split(), (torch.zeros(8, 32, 64),), str(path), dynamo=False,
                          input_names=["x"], output_names=["y"], dynamic_axes={"x": {0: "b"}})
    go = predictor.trace(str(path), batch_size=8, mode="inference")
    gf = predictor.trace(Split(), (torch.zeros(8, 32, 64),), mode="inference")
    strided = {name for name, kind, _ in _copy_rows(go) if kind == L.COPY_STRIDED}
    assert strided == {"clone"}
    # Training, in fp32 and under autocast: the synthesised backward copies
    # the gradient back between the same layouts and dtypes as fx's does.
    for amp in (None, "bf16"):
        go = predictor.trace(str(path), batch_size=8, amp=amp)
        gf = predictor.trace(Split(), (torch.zeros(8, 32, 64),), amp=amp,
                             loss_fn=lambda out: out.float().mean())
        assert sorted((int(k), int(p)) for _, k, p in _copy_rows(go)) \
            == sorted((int(k), int(p)) for _, k, p in _copy_rows(gf))


def test_rows_priced_by_their_elements_say_analytical():
    g = predictor.trace(Heads(), (torch.zeros(64, 512, 64),), amp="bf16",
                        loss_fn=lambda out: out.mean())
    ops = predictor.predict(g, "H200-SXM-141GB").ops
    flagged = ops["shape"].str.contains(r"\((strided|cast)\)")
    large = ops.dims.map(lambda d: len(d) > 4 and d[3] * d[4] >= 1 << 20)
    assert flagged[large].any()
    assert (ops.basis[flagged & large] == "analytical").all()
    # Small copies stay at the learned model's price, above their element bound.
    assert (ops.basis[(ops.family == "copy") & ~(flagged & large)] == "learned").all()
    # An fp32 strided copy on a T4 (8 bytes an element, 5 bytes of DRAM
    # bandwidth per SM clock): the bytes bind, the learned price stands.
    g32 = predictor.trace(Heads(), (torch.zeros(64, 512, 64),), loss_fn=lambda out: out.mean())
    ops = predictor.predict(g32, "T4").ops
    strided = ops["shape"].str.contains("strided")
    assert (ops.basis[strided] == "learned").all()


def test_mixed_dtype_elementwise_ops_load_through_casts():
    from predictor.families import casting_inputs

    assert casting_inputs([_meta(F32), _meta(BF16)]) == 2     # autocast's residual add
    assert casting_inputs([_meta(BF16), _meta(BF16)]) == 0
    assert casting_inputs([_meta(BF16), TensorMeta((), F32)]) == 0  # a 0-dim scalar
    assert casting_inputs([_meta(torch.float8_e4m3fn), _meta(BF16)]) == 0
    # The flag reaches the row, and prices it at its rate on an H200.
    g = predictor.trace(Residual(), (torch.zeros(64, 512, 64),), amp="bf16",
                        loss_fn=lambda out: out.float().mean())
    ops = predictor.predict(g, "H200-SXM-141GB").ops
    adds = ops[(ops.family == "elementwise") & (ops.op == "add") & (ops.phase == "forward")]
    assert adds["shape"].str.contains(r"\(cast\)").all() and len(adds) == 1
    d = adds.dims.iloc[0]
    f = hardware.get("H200-SXM-141GB").features
    elems = d[3] * d[4]
    assert adds.ms_each.iloc[0] * 1e3 >= elems / (
        CAST_BINARY_ELEMS_PER_SM_CLOCK * f[L.G_SMS] * f[L.G_CLOCK_MHZ])


class Residual(torch.nn.Module):
    """A layer-norm residual stream (fp32 under autocast) plus a bf16 branch."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(64, 64)
        self.norm = torch.nn.LayerNorm(64)

    def forward(self, x):
        h = self.norm(x)
        return self.norm(h + self.proj(h))


def test_calibration_measures_a_mixed_dtype_add_with_two_dtypes():
    from calibration.measure import RowContext, build_runner

    n = 6 * 64
    d = np.zeros(L.MAX_DIMS, dtype=np.int64)
    d[:5] = (3 * n, 2 * n, n, 64, 6)  # bf16 units: n + 2n read, 2n written
    d[L.MEM_GENERIC] = L.CAST_BINARY
    ctx = RowContext(L.ELEMENTWISE, torch.bfloat16, 1, tuple(int(v) for v in d), "add", 1,
                     torch.device("cpu"))
    out = build_runner(ctx)()
    assert out.dtype == torch.float32 and out.numel() == n


def test_calibrations_made_before_the_flag_still_match():
    from calibration.file import graph_fingerprint

    g = predictor.trace(Residual(), (torch.zeros(8, 32, 64),), amp="bf16",
                        loss_fn=lambda out: out.float().mean())
    assert (g.ops.dbase[:, L.MEM_GENERIC] > 0).any()
    before = graph_fingerprint(g)
    old = copy.deepcopy(g)
    old.ops.dbase[:, L.MEM_GENERIC] = 0  # the graph as an older version traced it
    assert graph_fingerprint(old) == before


def _fill_and_copy_ms(gpu, n):
    d = np.zeros((2, L.MAX_DIMS), np.int64)
    d[0, L.MEM_WRITTEN], d[0, L.MEM_INNER], d[0, L.MEM_OUTER] = n, 1, n       # families._fill
    d[1, L.MEM_READ], d[1, L.MEM_WRITTEN], d[1, L.MEM_INNER], d[1, L.MEM_OUTER] = n, n, n, 1
    return opmodel.predict_rows(np.array([L.FILL, L.COPY]), d, gpu, kernels=np.ones(2))


@pytest.mark.parametrize("gpu", ["V100-SXM2-16GB", "A100-SXM4-40GB", "T4", "P4", "H200-SXM-141GB",
                                 "L4"])
def test_a_fill_is_a_stream_of_writes(gpu):
    """A fill moves half the bytes of a copy of as many elements: no slower
    than that copy (to the networks' few per cent at the launch floor), and
    half of it once the bytes dominate (the
    network, asked about a read-to-write ratio of 0, priced fills at 0.3-0.4
    of the bandwidth, slower than the copy)."""
    for n in (1, 1 << 10, 1 << 16, 1 << 20, 1 << 24):
        fill, copy_ = _fill_and_copy_ms(gpu, n)
        assert 0 < fill <= copy_ * 1.05
    fill, copy_ = _fill_and_copy_ms(gpu, 1 << 28)
    assert fill == pytest.approx(copy_ / 2, rel=0.05)


def test_bert_large_loss_gradient_fill_as_the_h200_ran_it():
    """BERT-large b16's cross-entropy backward zeroes a 8,192 x 30,522 fp32
    gradient: the H200 profile's fp32 FillFunctor kernels (that fill and six
    of a few elements) took 252 us a step."""
    prof = pd.read_csv(PROFILE / "bert-large-b16-bf16.csv")
    measured = prof[prof.kernel.str.contains("FillFunctor<float>", regex=False)].us_per_step.sum()
    assert measured == pytest.approx(252, abs=1)
    fill = _fill_and_copy_ms("H200-SXM-141GB", 16 * 512 * 30522)[0] * 1e3
    assert fill == pytest.approx(measured, rel=0.1)


@pytest.mark.parametrize("family", [L.FILL, L.DROPOUT, L.ELEMENTWISE])
@pytest.mark.parametrize("read,written", [(0, 1), (0, 2), (0, 3), (0, 1000), (0, 1 << 20),
                                          (1, 1000), (161024, 163840000)])
def test_write_streams_are_described_inside_the_measured_range(family, read, written):
    """A row that writes more than twice what it reads (a fill, random
    numbers, a broadcast mul) is described as the copy of its bytes, reading
    at least one element: never a read-to-write ratio below the measured
    kernels' (log2 0 for a fill), in the kernels and the reference alike."""
    from predictor.kernels.features import forward_equivalent
    d = np.zeros(L.MAX_DIMS, np.int64)
    d[L.MEM_READ], d[L.MEM_WRITTEN], d[L.MEM_FLOPS] = read, written, 4 * written
    d[L.MEM_INNER], d[L.MEM_OUTER] = 1, written
    fam, f = forward_equivalent(family, d.copy())
    rfam, rf = reference.forward_equivalent(family, d.copy())
    assert fam == rfam == L.COPY
    assert list(f) == list(rf)
    assert f[L.MEM_READ] >= 1 and f[L.MEM_READ] == f[L.MEM_WRITTEN]
    assert 2 * f[L.MEM_READ] - (read + written) in (0, 1) or read + written == 1


@pytest.mark.parametrize("read,written", [(1, 1), (2, 1), (1000, 1000), (2000, 1000), (500, 1000)])
def test_rows_inside_the_measured_ratios_are_their_own(read, written):
    from predictor.kernels.features import forward_equivalent
    d = np.zeros(L.MAX_DIMS, np.int64)
    d[L.MEM_READ], d[L.MEM_WRITTEN], d[L.MEM_INNER], d[L.MEM_OUTER] = read, written, written, 1
    fam, f = forward_equivalent(L.ELEMENTWISE, d.copy())
    assert fam == L.ELEMENTWISE and list(f) == list(d)
