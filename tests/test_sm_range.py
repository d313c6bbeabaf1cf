"""GEMM and convolution networks outside the SM counts they were trained on:
the GPU is described as its SM-count-clamped self (each SM keeping its own
FLOP/s and bandwidth) and priced at that efficiency over its own ideal time
(``kernels.features.sm_clamped``, ``sm_range``, ``group_features``)."""

import math

import numpy as np
import pytest

from predictor import hardware, opmodel, reference
from predictor.calibration import datasets as D
from predictor.calibration import train as T
from predictor.calibration.train import pack
from predictor.engine import model_params
from predictor.kernels import layout as L
from predictor.kernels.features import (G_BMM, G_CONV, G_ELEMENTWISE, G_MATMUL, N_FEATURES,
                                        PER_SM_FIELDS, group_features, ideal_us, sm_clamped,
                                        sm_range)
from predictor.kernels.mlp import group_aux
from predictor.kernels.optime import learned_row_us, op_time_us
from predictor.tiles import shipped_params
from random_nets import random_net


def _gemm(bt, m, n, k, layout=L.GEMM_B_T):
    d = np.zeros(L.MAX_DIMS, dtype=np.int64)
    d[:4] = (bt, m, n, k)
    d[L.GEMM_LAYOUT] = layout
    return d


def test_a_clamped_gpu_keeps_each_sms_share():
    h100 = hardware.get("H100-SXM5-80GB").features
    c = sm_clamped(h100, 20.0, 108.0)
    share = 108.0 / h100[L.G_SMS]
    assert c[L.G_SMS] == 108.0
    for j in PER_SM_FIELDS:
        assert c[j] == pytest.approx(h100[j] * share, rel=1e-12)
    others = [j for j in range(len(h100)) if j not in PER_SM_FIELDS]
    assert np.array_equal(c[others], h100[others])  # clock, SM design, chip: its own
    p4 = hardware.get("P4").features
    assert sm_clamped(p4, 40.0, 108.0)[L.G_FP32_TFLOPS] == pytest.approx(2 * p4[L.G_FP32_TFLOPS])
    assert np.array_equal(sm_clamped(p4, 20.0, 108.0), p4)  # inside: itself
    assert np.array_equal(reference.sm_clamped(h100, 20.0, 108.0), c)


def test_the_range_is_read_from_the_gemm_and_conv_groups_only():
    mlp = pack({G_MATMUL: random_net(G_MATMUL, 0, [40, 108]),
                G_CONV: random_net(G_CONV, 1, [20, 80]),
                G_BMM: random_net(G_BMM, 2, shipped_params()),
                G_ELEMENTWISE: random_net(G_ELEMENTWISE, 3)})
    assert opmodel.layout_problem(mlp) is None
    assert sm_range(mlp, G_MATMUL) == (40.0, 108.0)
    assert sm_range(mlp, G_CONV) == (20.0, 80.0)
    assert sm_range(mlp, G_BMM) == (40.0, 108.0)  # fitted on every GEMM: the matmul group's
    assert sm_range(mlp, G_ELEMENTWISE) == (0.0, math.inf)
    old = pack({G_MATMUL: random_net(G_MATMUL, 0)})  # weights from before the range: no clamp
    assert sm_range(old, G_MATMUL) == (0.0, math.inf)
    assert reference.sm_range(mlp, G_BMM) == (40.0, 108.0)


@pytest.mark.parametrize("gpu_id", ["P4", "H100-SXM5-80GB"])
def test_outside_the_range_a_gemm_runs_at_its_clamped_selfs_efficiency(gpu_id):
    mlp = pack({G_MATMUL: random_net(G_MATMUL, 0, [40, 108])} if gpu_id == "P4"
               else {G_MATMUL: random_net(G_MATMUL, 0, [20, 80])})
    lo, hi = sm_range(mlp, G_MATMUL)
    gpu = hardware.get(gpu_id).features
    clamped = sm_clamped(gpu, lo, hi)
    params = model_params()
    x, xc = np.zeros(N_FEATURES), np.zeros(N_FEATURES)
    for shape in ((1, 8192, 1024, 1024), (1, 300, 77, 4096), (4, 512, 512, 64)):
        d = _gemm(*shape)
        ideal = group_features(G_MATMUL, L.MATMUL, L.F32, d, gpu, params, mlp, x)
        assert ideal == ideal_us(L.MATMUL, L.F32, d, gpu, params)  # its own ideal time
        ideal_c = group_features(G_MATMUL, L.MATMUL, L.F32, d, clamped, params, mlp, xc)
        assert np.array_equal(x, xc)  # described as its clamped self
        t = learned_row_us(G_MATMUL, L.MATMUL, L.F32, d, gpu, params, mlp, False)
        t_c = learned_row_us(G_MATMUL, L.MATMUL, L.F32, d, clamped, params, mlp, False)
        # Same efficiency, each over its own ideal (both compute-bound here).
        assert t / ideal == pytest.approx(t_c / ideal_c, rel=1e-9)
        ref = reference.op_time_us(L.MATMUL, L.F32, 0, d, gpu, params, mlp)
        assert ref == pytest.approx(t, rel=1e-9)


def test_inside_the_range_nothing_changes():
    with_range = pack({G_MATMUL: random_net(G_MATMUL, 0, [20, 108]),
                       G_CONV: random_net(G_CONV, 1, [20, 108])})
    without = pack({G_MATMUL: random_net(G_MATMUL, 0), G_CONV: random_net(G_CONV, 1)})
    fam = np.full(1, L.MATMUL)
    for gpu in ("T4", "V100-PCIE-32GB", "A100-PCIE-40GB", "P4"):
        d = _gemm(1, 4096, 1024, 1024)[None]
        assert opmodel.predict_rows(fam, d, gpu, mlp=with_range)[0] \
            == opmodel.predict_rows(fam, d, gpu, mlp=without)[0]


def test_many_waves_on_half_the_sms_take_twice_the_time():
    """The invariance the clamp rests on, as the clamp applies it: the P4 (20
    SMs) under a network trained on 40 or more runs a GEMM of many waves in
    twice the time of its clamped self (40 SMs, twice its FLOP/s)."""
    mlp = pack({G_MATMUL: random_net(G_MATMUL, 0, [40, 108])})
    p4 = hardware.get("P4").features
    params = model_params()
    d = _gemm(1, 8192, 4096, 2048)
    t = learned_row_us(G_MATMUL, L.MATMUL, L.F32, d, p4, params, mlp, False)
    t_c = learned_row_us(G_MATMUL, L.MATMUL, L.F32, d, sm_clamped(p4, 40.0, 108.0), params, mlp,
                         False)
    assert t / t_c == pytest.approx(2.0, rel=1e-6)


def test_a_batched_gemm_outside_the_range():
    """The batched-GEMM network's inputs from the clamped GPU, its ideal (waves
    of tiles) from the GPU itself; engine, per-op path and reference agree."""
    rule = shipped_params()
    mlp = pack({G_MATMUL: random_net(G_MATMUL, 0, [40, 108]),
                G_BMM: random_net(G_BMM, 1, rule)})
    params = model_params()
    p4 = hardware.get("P4").features
    d = _gemm(16, 512, 512, 64, 0)
    x = np.zeros(N_FEATURES)
    ideal = group_features(G_BMM, L.MATMUL, L.F32, d, p4, params, mlp, x)
    x_own = np.zeros(N_FEATURES)
    ideal_own = group_features(G_BMM, L.MATMUL, L.F32, d, p4, params,
                               pack({G_MATMUL: random_net(G_MATMUL, 0),
                                     G_BMM: random_net(G_BMM, 1, rule)}),
                               x_own)
    assert ideal == ideal_own and not np.array_equal(x, x_own)
    t = op_time_us(L.MATMUL, L.F32, 1, d, p4, params, mlp)
    ref = reference.op_time_us(L.MATMUL, L.F32, 1, d, p4, params, mlp)
    assert np.isfinite(t) and t > 0 and ref == pytest.approx(t, rel=1e-9)


def test_a_damaged_range_is_refused():
    w = pack({G_MATMUL: random_net(G_MATMUL, 0, [108, 40])})
    assert "SM range" in opmodel.layout_problem(w)
    w = pack({G_CONV: random_net(G_CONV, 0, [20, 80, 3])})
    assert "SM range" in opmodel.layout_problem(w)


def test_the_shipped_gemm_and_conv_networks_carry_their_training_gpus_range():
    mlp = opmodel.weights()
    if not mlp.size:
        pytest.skip("no shipped weights")
    _, meta = opmodel.shipped()
    sms = [hardware.get(g).features[L.G_SMS] for g in meta["gpus"]]
    # (after the range, the board records of kernels.clocks: tests/test_clocks.py)
    assert list(group_aux(mlp, G_MATMUL)[:2]) == [min(sms), max(sms)]
    # The conv network's range is that of the GPUs with fp32 convolutions in
    # the data: the H200's ran in TF32 and are not trained on.
    lo, hi = group_aux(mlp, G_CONV)[:2]
    assert lo == min(sms) and hi in sms and hi <= max(sms)


def test_training_stores_the_range_of_the_rows_it_fitted(data_dir):
    s = D.load_train(data_dir)
    without_p4 = s.subset(s.gpu != "P4")
    assert list(T.sm_range(without_p4)) == [40.0, 108.0]
    assert list(T.sm_range(s)) == [20.0, 108.0]
