"""ATen's NCHW max-pool kernels (layout.MAX_POOL_NCHW): which rows the
lowering flags, their price by the window elements they visit
(kernels.roofline.generic_kernel_us), the H200 profile the rates come from
and the two public measurements they are checked against."""

from __future__ import annotations

import copy
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import predictor
from predictor import hardware, opmodel, reference
from predictor.kernels import layout as L
from predictor.kernels.optime import isolated_time_us, op_time_us
from predictor.kernels.roofline import (MAX_POOL_BWD_BYTES_PER_WINDOW_ELEM,
                                        MAX_POOL_FWD_WINDOW_ELEMS_PER_SM_CLOCK, P_LAUNCH_US,
                                        default_params)

PROFILE = Path(__file__).resolve().parent.parent / "benchmarks" / "data" / "h200" / "profile"


class Stem(torch.nn.Module):
    """ResNet's stem: a 7x7 stride-2 convolution, then a 3x3 stride-2 max
    pool with padding 1."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 7, 2, 3)
        self.pool = torch.nn.MaxPool2d(3, 2, 1)

    def forward(self, x):
        return self.pool(self.conv(x)).flatten(1).sum(1)


def _pool_rows(g, batch):
    d = g.ops.dims(batch)
    rows = np.nonzero((g.ops.family == L.POOL) | (g.ops.family == L.POOL_BWD))[0]
    return [(int(g.ops.family[i]), d[i]) for i in rows]


def _time(family, d, gpu):
    f = hardware.get(gpu).features
    p, mlp = default_params(), opmodel.weights()
    return op_time_us(family, L.F32, 1, d, f, p, mlp), p[P_LAUNCH_US], f


def test_resnet_pools_are_flagged_with_their_window_elements():
    g = predictor.trace("resnet50", batch_size=128, optimizer="adam")
    rows = _pool_rows(g, 128)
    assert sorted(f for f, _ in rows) == [L.POOL, L.POOL_BWD]
    for _, d in rows:
        assert d[L.MEM_GENERIC] == L.MAX_POOL_NCHW
        assert d[L.MEM_WINDOW_ELEMS] == 128 * 64 * 56 * 56 * 9
    # Channels-last runs ATen's NHWC kernels: not these.
    g = predictor.trace("resnet50", batch_size=8, optimizer="adam",
                        memory_format="channels_last")
    assert all(d[L.MEM_GENERIC] == 0 for _, d in _pool_rows(g, 8))
    # Average pools are other kernels.
    g = predictor.trace(torch.nn.AvgPool2d(2), (torch.zeros(2, 4, 8, 8),), mode="inference")
    assert all(d[L.MEM_GENERIC] == 0 for _, d in _pool_rows(g, 2))


def test_h200_profile_rates_reproduce_resnet50_max_pool_kernels():
    """The rates are the H200's measured max-pool kernels of ResNet-50 steps
    at batch 128, bf16 and fp32 alike: priced again from the traced rows."""
    g = predictor.trace("resnet50", batch_size=128, amp="bf16", optimizer="adam")
    p = predictor.predict(g, "H200-SXM-141GB")
    rows = (g.ops.family == L.POOL) | (g.ops.family == L.POOL_BWD)
    launch = default_params()[P_LAUNCH_US]
    for precision in ("bf16", "fp32"):
        prof = pd.read_csv(PROFILE / f"resnet50-b128-{precision}.csv")
        for family, kernel in ((L.POOL, "max_pool_forward_nchw"),
                               (L.POOL_BWD, "max_pool_backward_nchw")):
            measured = prof.us_per_step[prof.kernel.str.contains(kernel)].sum()
            priced = p.op_us[rows & (g.ops.family == family)].sum() - launch
            assert priced == pytest.approx(measured, rel=0.03), (precision, kernel)


def test_the_rates_against_two_public_measurements():
    """Not fitted: an A100's ResNet-sized pool (32 x 64 x 112 x 112, PyTorch's
    column of Oneflow-Inc/oneflow pull 7426: 852 us backward, 206 forward)
    and a Titan V's 3 x 3 stride-3 pool (32 x 256 x 112 x 112, pytorch/pytorch
    pull 42182: 4.97 ms fp32 and 3.98 fp16 backward with the gradient's
    accumulation into x.grad, about 2.1 and 1.1 ms of it at that board's
    652.8 GB/s)."""
    a100 = hardware.get("A100-PCIE-40GB").features
    window = 32 * 64 * 56 * 56 * 9
    bwd = window * MAX_POOL_BWD_BYTES_PER_WINDOW_ELEM / (a100[L.G_MEM_BW_GBS] * 1e3)
    assert bwd == pytest.approx(852, rel=0.05)
    # Forward: the A100's bytes bind first (the element rate is a floor).
    fwd = window / (MAX_POOL_FWD_WINDOW_ELEMS_PER_SM_CLOCK * a100[L.G_SMS]
                    * a100[L.G_CLOCK_MHZ])
    assert fwd < 206
    window = 32 * 256 * 37 * 37 * 9
    titan_v = window * MAX_POOL_BWD_BYTES_PER_WINDOW_ELEM / 652.8e3
    for total, accumulation in ((4970, 2100), (3980, 1100)):
        assert titan_v == pytest.approx(total - accumulation, rel=0.3)


@pytest.mark.parametrize("gpu", ["H200-SXM-141GB", "A100-SXM4-80GB", "V100-PCIE-32GB", "T4"])
def test_engine_reference_and_isolated_times_apply_the_bound(gpu):
    g = predictor.trace("resnet50", batch_size=32, optimizer="adam")
    for family, d in _pool_rows(g, 32):
        t, launch, f = _time(family, d, gpu)
        if family == L.POOL:
            walk = d[L.MEM_WINDOW_ELEMS] / (MAX_POOL_FWD_WINDOW_ELEMS_PER_SM_CLOCK
                                            * f[L.G_SMS] * f[L.G_CLOCK_MHZ])
        else:
            walk = d[L.MEM_WINDOW_ELEMS] * MAX_POOL_BWD_BYTES_PER_WINDOW_ELEM \
                / (f[L.G_MEM_BW_GBS] * 1e3)
        assert t - launch >= walk * (1 - 1e-9)
        plain = d.copy()
        plain[L.MEM_GENERIC] = 0
        t_plain, _, _ = _time(family, plain, gpu)
        assert t == pytest.approx(max(t_plain - launch, walk) + launch, rel=1e-9)
        ref = reference.op_time_us(family, L.F32, 1, [int(v) for v in d], list(f),
                                   default_params(), opmodel.weights())
        assert ref == pytest.approx(t, rel=1e-6)
        iso = isolated_time_us(family, L.F32, d, f, default_params(), opmodel.weights())
        assert iso >= walk


def test_an_amd_gpu_keeps_the_bytes_price():
    g = predictor.trace("resnet50", batch_size=32, optimizer="adam")
    for family, d in _pool_rows(g, 32):
        plain = d.copy()
        plain[L.MEM_GENERIC] = 0
        assert _time(family, d, "MI300X")[0] == pytest.approx(
            _time(family, plain, "MI300X")[0], rel=1e-12)


def test_the_sweep_prices_max_pools_as_the_per_op_table_does():
    g = predictor.trace(Stem(), (torch.zeros(16, 3, 224, 224),))
    for gpu in ("H200-SXM-141GB", "A100-SXM4-80GB", "T4"):
        p = predictor.predict(g, gpu)
        assert p.ops["shape"].str.contains("NCHW max pool").sum() == 2
        assert p.ops.ms.sum() == pytest.approx(p.iteration_ms - p.overhead_ms, rel=1e-9)
        sweep = predictor.sweep(g, [gpu], batch_sizes=[16, 32])
        again = predictor.predict(g, gpu, batch_size=32)
        assert sweep.iteration_ms[0, 1] == pytest.approx(again.iteration_ms, rel=1e-6)


def test_bound_rows_say_analytical():
    g = predictor.trace("resnet50", batch_size=128, amp="bf16", optimizer="adam")
    ops = predictor.predict(g, "H200-SXM-141GB").ops
    pools = ops[ops.family.isin(["pool", "pool_bwd"])]
    assert len(pools) == 2 and (pools.basis == "analytical").all()


def test_onnx_max_pool_rows_match_the_fx_trace(tmp_path):
    pytest.importorskip("onnx")
    path = tmp_path / "stem.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Stem(), (torch.zeros(2, 3, 64, 64),), str(path), dynamo=False,
                          input_names=["x"], output_names=["y"], dynamic_axes={"x": {0: "b"}})
    go = predictor.trace(str(path), batch_size=4)
    gf = predictor.trace(Stem(), (torch.zeros(4, 3, 64, 64),))
    fx = sorted((f, int(d[L.MEM_GENERIC]), int(d[L.MEM_WINDOW_ELEMS])) for f, d in _pool_rows(gf, 4))
    onnx = sorted((f, int(d[L.MEM_GENERIC]), int(d[L.MEM_WINDOW_ELEMS]))
                  for f, d in _pool_rows(go, 4))
    assert onnx == fx and len(fx) == 2


@pytest.mark.parametrize("family", [L.POOL, L.POOL_BWD])
def test_calibration_measures_the_pool_the_row_names(family):
    from calibration.measure import RowContext, _pool_setup

    g = predictor.trace("resnet50", batch_size=4, optimizer="adam")
    (d,) = [d for f, d in _pool_rows(g, 4) if f == family]
    ctx = RowContext(family, torch.float32, 1, tuple(int(v) for v in d),
                     "max_pool2d_with_indices", 4, torch.device("cpu"))
    x, fn = _pool_setup(ctx, family == L.POOL_BWD)
    assert tuple(x.shape) == (4, 64, 112, 112)
    assert tuple(fn(x).shape) == (4, 64, 56, 56)


def test_calibrations_made_before_the_flag_still_match():
    from calibration.file import graph_fingerprint

    g = predictor.trace(Stem(), (torch.zeros(4, 3, 64, 64),))
    before = graph_fingerprint(g)
    old = copy.deepcopy(g)
    pools = (old.ops.family == L.POOL) | (old.ops.family == L.POOL_BWD)
    old.ops.dbase[np.ix_(pools, [L.MEM_GENERIC, L.MEM_WINDOW_ELEMS])] = 0
    old.ops.dslope[np.ix_(pools, [L.MEM_GENERIC, L.MEM_WINDOW_ELEMS])] = 0
    assert graph_fingerprint(old) == before
