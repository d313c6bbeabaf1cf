"""Convolutions outside the conv data's shapes (kernels.work.as_implicit_gemm,
fewer_multiplies_possible): the data holds 3x3 stride-1 undilated
convolutions only, which cuDNN may run with fewer multiplies (Winograd, FFT)
than the direct formula counts."""

import numpy as np
import pytest
import torch
import torch.nn as nn

import predictor
from predictor import hardware, opmodel, reference
from predictor.kernels import layout as L
from predictor.kernels.optime import isolated_time_us, op_time_us
from predictor.kernels.roofline import P_TF32_CONV, P_TF32_MATMUL, default_params
from predictor.kernels.work import (as_implicit_gemm, fewer_multiplies_possible,
                                    flops_and_elems, implicit_gemm_dims)

pytestmark = pytest.mark.skipif(not len(opmodel.weights()), reason="no shipped op-model weights")


def _conv(n, c, h, w, k, r, s, p, q, groups=1, stride=1, dilation=0):
    d = np.zeros(L.MAX_DIMS, dtype=np.int64)
    d[:12] = (n, c, h, w, k, r, s, p, q, groups, stride, dilation)
    return d


# WaveGlow's dilated 1-D convolution (batch 8, 512 -> 1,024 channels over
# 1,000 steps, kernel 3, dilation 4) and a 1-D convolution without dilation.
DILATED = _conv(8, 512, 1000, 1, 1024, 3, 1, 1000, 1, dilation=4)
ONE_D = _conv(8, 512, 1000, 1, 1024, 3, 1, 1000, 1)
SQUARE = _conv(8, 256, 28, 28, 256, 3, 3, 28, 28)
POINTWISE = _conv(64, 256, 56, 56, 512, 1, 1, 28, 28, stride=2)


def test_the_lowering_records_a_convolutions_dilation():
    ops = predictor.trace(lambda: nn.Conv1d(8, 16, 3, dilation=4, padding=4),
                          lambda b: torch.zeros(b, 8, 100), batch_size=2).ops
    convs = np.isin(ops.family, (L.CONV, L.CONV_DGRAD, L.CONV_WGRAD))
    assert convs.any()
    assert (ops.dbase[convs, L.CONV_DILATION] == 4).all()
    plain = predictor.trace(lambda: nn.Conv1d(8, 16, 3, padding=1),
                            lambda b: torch.zeros(b, 8, 100), batch_size=2).ops
    assert (plain.dbase[np.isin(plain.family, (L.CONV, L.CONV_DGRAD, L.CONV_WGRAD)),
                        L.CONV_DILATION] == 0).all()


def test_which_convolutions_leave_the_convolution_network():
    for fam in (L.CONV, L.CONV_DGRAD, L.CONV_WGRAD):
        assert as_implicit_gemm(fam, DILATED) and as_implicit_gemm(fam, ONE_D)
        assert not as_implicit_gemm(fam, SQUARE) and not as_implicit_gemm(fam, POINTWISE)
        assert fewer_multiplies_possible(fam, SQUARE)
        assert not fewer_multiplies_possible(fam, POINTWISE)
        assert not fewer_multiplies_possible(fam, DILATED)
        for d in (DILATED, ONE_D, SQUARE, POINTWISE):
            assert reference.as_implicit_gemm(fam, list(d)) == as_implicit_gemm(fam, d)
            assert reference.fewer_multiplies_possible(fam, list(d)) \
                == fewer_multiplies_possible(fam, d)
    grouped, strided = DILATED.copy(), DILATED.copy()
    grouped[9] = 512
    strided[10], strided[7] = 2, 500  # its data gradient's GEMM would count 4x the work
    assert not as_implicit_gemm(L.CONV, grouped) and not as_implicit_gemm(L.CONV_DGRAD, strided)
    assert not as_implicit_gemm(L.MATMUL, DILATED)


@pytest.mark.parametrize("fam", [L.CONV, L.CONV_DGRAD, L.CONV_WGRAD])
def test_the_implicit_gemm_does_the_convolutions_multiply_adds(fam):
    g = np.zeros(L.MAX_DIMS, dtype=np.int64)
    implicit_gemm_dims(fam, DILATED, g)
    assert flops_and_elems(L.MATMUL, g)[0] == flops_and_elems(fam, DILATED)[0]
    assert reference.implicit_gemm_dims(fam, list(DILATED)) == [int(v) for v in g]


@pytest.mark.parametrize("gpu", ["V100-SXM2-16GB", "A100-SXM4-80GB", "RTX-4090"])
@pytest.mark.parametrize("fam", [L.CONV, L.CONV_DGRAD, L.CONV_WGRAD])
def test_a_dilated_convolution_costs_its_implicit_gemm(gpu, fam):
    """In TF32 where cuDNN may use it (its switch, not the matmul one), unless
    its FMA kernels are faster (cuDNN's search keeps the fastest), in the
    kernels, the reference and isolated alike."""
    mlp, f = opmodel.weights(), hardware.get(gpu).features
    g = np.zeros(L.MAX_DIMS, dtype=np.int64)
    implicit_gemm_dims(fam, DILATED, g)
    fma = default_params()
    fma[P_TF32_CONV] = fma[P_TF32_MATMUL] = 0.0
    for tf32 in (0.0, 1.0):
        p = default_params()
        p[P_TF32_CONV], p[P_TF32_MATMUL] = tf32, 0.0
        q = p.copy()
        q[P_TF32_MATMUL] = tf32
        want = min(op_time_us(L.MATMUL, L.F32, 1, g, f, q, mlp),
                   op_time_us(L.MATMUL, L.F32, 1, g, f, fma, mlp))
        t = op_time_us(fam, L.F32, 1, DILATED, f, p, mlp)
        assert t == pytest.approx(want, rel=1e-12)
        assert reference.op_time_us(fam, L.F32, 1, list(DILATED), list(f), p, list(mlp)) \
            == pytest.approx(t, rel=1e-9)
        assert isolated_time_us(fam, L.F32, DILATED, f, p, mlp) == pytest.approx(
            min(isolated_time_us(L.MATMUL, L.F32, g, f, q, mlp),
                isolated_time_us(L.MATMUL, L.F32, g, f, fma, mlp)), rel=1e-12)


def test_a_convolution_without_reduced_arithmetic_never_beats_its_direct_flops():
    """The network may price a 3x3 convolution above the peak rate (Winograd
    does fewer multiplies); a 1x1 strided one runs GEMM-like kernels only."""
    mlp, p = opmodel.weights(), default_params()
    p[P_TF32_CONV] = 0.0
    for gpu in ("V100-SXM2-16GB", "T4", "P100-PCIE-16GB", "RTX-3090"):
        f = hardware.get(gpu).features
        for fam in (L.CONV, L.CONV_DGRAD, L.CONV_WGRAD):
            flops = flops_and_elems(fam, POINTWISE)[0]
            direct = flops / (f[L.G_FP32_TFLOPS] * 1e12) * 1e6
            t = op_time_us(fam, L.F32, 1, POINTWISE, f, p, mlp)
            assert t >= direct
            assert reference.op_time_us(fam, L.F32, 1, list(POINTWISE), list(f), p,
                                        list(mlp)) == pytest.approx(t, rel=1e-9)


def test_the_sweep_prices_an_implicit_gemm_row_as_the_per_op_table_does():
    """The sweep's block form of the learned models (kernels.grid) leaves such
    a row to optime, as the per-op table prices it."""
    graph = predictor.trace(lambda: nn.Conv1d(64, 128, 3, dilation=2, padding=2),
                            lambda b: torch.zeros(b, 64, 500), batch_size=4)
    for gpu in ("V100-SXM2-16GB", "A100-SXM4-80GB"):
        p = predictor.predict(graph, gpu, batch_size=4)
        assert p.ops.ms.sum() == pytest.approx(p.iteration_ms - p.overhead_ms, rel=1e-9)
        swept = predictor.sweep(graph, [gpu], [4]).phase_ms[0, 0].sum()
        assert swept == pytest.approx(p.iteration_ms, rel=1e-9)


def test_weight_normalisation_is_a_row_op_not_a_fallback():
    """torch.nn.utils weight normalisation recomputes w = g v / ||v|| every
    forward (WaveGlow's WN layers, wav2vec 2.0's positional convolution):
    one row kernel a slice along dim 0, forward and backward."""
    conv = nn.Conv1d(64, 128, 3, padding=1)
    graph = predictor.trace(lambda: nn.utils.parametrizations.weight_norm(conv),
                            lambda b: torch.zeros(b, 64, 100), batch_size=2)
    p = predictor.predict(graph, "A100-SXM4-80GB", batch_size=2)
    assert not p.unsupported
    ops = p.ops.set_index("op")
    n = 128 * 64 * 3
    assert ops.loc["_weight_norm_interface", "dims"][:2] == (n + 128, n + 128)
    assert ops.loc["_weight_norm_interface_backward", "family"] == "layer_norm_bwd"


def test_an_implicit_gemm_convolution_pays_its_transposes_where_tf32_runs_it():
    """cuDNN's TF32 tensor-core kernels are NHWC: around an fp32 NCHW
    convolution priced as its (tensor-core) implicit GEMM the lowering writes
    the layout transposes, flagged LAYOUT_IMPLICIT_GEMM, which cost time
    where TF32 convolutions run on tensor cores and nothing elsewhere."""
    graph = predictor.trace(lambda: nn.Conv1d(64, 128, 3, dilation=2, padding=2),
                            lambda b: torch.zeros(b, 64, 500, requires_grad=True), batch_size=4)
    ops = graph.ops
    flagged = (ops.family == L.COPY) & (ops.dbase[:, L.MEM_LAYOUT] == L.LAYOUT_IMPLICIT_GEMM)
    assert flagged.sum() >= 3
    plain = predictor.trace(lambda: nn.Conv2d(64, 128, 3, padding=1),
                            lambda b: torch.zeros(b, 64, 20, 20), batch_size=4).ops
    assert not ((plain.family == L.COPY) & (plain.dbase[:, L.MEM_LAYOUT] > 0)).any()

    def transposes_ms(gpu, **kw):
        p = predictor.predict(graph, gpu, batch_size=4, **kw)
        assert p.ops.ms.sum() == pytest.approx(p.iteration_ms - p.overhead_ms, rel=1e-9)
        swept = predictor.sweep(graph, [gpu], [4], **kw).phase_ms[0, 0].sum()
        assert swept == pytest.approx(p.iteration_ms, rel=1e-9)
        return p.ops[p.ops["shape"].str.contains("transpose")].ms.sum()

    assert transposes_ms("A100-SXM4-80GB") > 0
    assert transposes_ms("A100-SXM4-80GB", tf32_conv=False) == 0
    assert transposes_ms("V100-SXM2-16GB") == 0
    mlp, p = opmodel.weights(), default_params()
    d = ops.dims(4)
    for gpu in ("A100-SXM4-80GB", "V100-SXM2-16GB"):
        f = hardware.get(gpu).features
        for i in np.flatnonzero(flagged):
            assert reference.op_time_us(L.COPY, L.F32, 1, [int(v) for v in d[i]], list(f), p,
                                        list(mlp)) \
                == pytest.approx(op_time_us(L.COPY, L.F32, 1, d[i], f, p, mlp), rel=1e-9)
