"""Batch norm in training: an NCHW tensor's per-channel passes
(kernels.roofline.per_channel_batch_norm_us), the channels-last flag, and the
H200's measured rows."""

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn

import predictor
from predictor import hardware, opmodel, reference
from predictor.kernels import layout as L
from predictor.kernels.optime import isolated_time_us, op_time_us
from predictor.kernels.roofline import (BN_CHANNEL_THREADS, BN_STEP_US, P_LAUNCH_US,
                                        default_params, per_channel_batch_norm_us)
from predictor.kernels.roofline import op_time_us as analytical_us

ROWS = Path(__file__).resolve().parent.parent / "benchmarks" / "data" / "h200" / "rows"


def _dims(family, n, c, hw, training=True, channels_last=False):
    """A row as predictor.families._bn_rows writes it (element counts)."""
    numel = n * c * hw
    reads = (2 if training else 1) if family == L.BATCH_NORM else 4
    d = np.zeros(L.MAX_DIMS, dtype=np.int64)
    d[:5] = (reads * numel, numel, 6 * numel, n * hw, c)
    d[L.MEM_LAYOUT] = int(channels_last)
    return d


def _both(family, dtype, d, gpu, kernels=2):
    """The kernel's and the pure-Python reference's time of one row."""
    params, mlp = default_params(), opmodel.weights()
    f = hardware.get(gpu).features
    t = op_time_us(family, dtype, kernels, d, f, params, mlp)
    ref = reference.op_time_us(family, dtype, kernels, list(d), list(f), params, mlp)
    assert ref == pytest.approx(t, rel=1e-9)
    return t, analytical_us(family, L.F32, kernels, d, f, params), params[P_LAUNCH_US]


def test_resnet50_stem_is_bound_by_its_per_channel_steps():
    # ResNet-50's first batch norm at batch 128: 64 channels of 128 x 112 x 112.
    # 64 blocks fit the H200 at once; each walks 1.6 M elements 512 at a time.
    d = _dims(L.BATCH_NORM_BWD, 128, 64, 112 * 112)
    t, _, launch = _both(L.BATCH_NORM_BWD, L.F32, d, "H200-SXM-141GB")
    steps = -(-128 * 112 * 112 // BN_CHANNEL_THREADS)
    assert t - 2 * launch == pytest.approx(2 * steps * BN_STEP_US)
    # cuDNN's forward (fp32): one pass.
    t, _, launch = _both(L.BATCH_NORM, L.F32, _dims(L.BATCH_NORM, 128, 64, 112 * 112),
                         "H200-SXM-141GB")
    assert t - 2 * launch == pytest.approx(steps * BN_STEP_US)


def test_channels_past_the_resident_blocks_take_another_round():
    # 1536 threads per SM on an RTX 4090: 3 blocks of 512 on each of 128 SMs.
    f = hardware.get("RTX-4090").features
    for c, rounds in ((384, 1), (385, 2)):
        d = _dims(L.BATCH_NORM_BWD, 8, c, 64 * 64)
        passes = per_channel_batch_norm_us(L.BATCH_NORM_BWD, L.F32, d, f, 0.0)
        assert passes == pytest.approx(2 * rounds * 64 * BN_STEP_US)
        assert reference.per_channel_batch_norm_us(L.BATCH_NORM_BWD, L.F32, list(d), list(f),
                                                   0.0) == pytest.approx(passes)


def test_bf16_forward_adds_the_streaming_normalisation():
    d = _dims(L.BATCH_NORM, 128, 64, 112 * 112)
    t16, _, launch = _both(L.BATCH_NORM, L.BF16, d, "H200-SXM-141GB")
    t32, _, _ = _both(L.BATCH_NORM, L.F32, d, "H200-SXM-141GB")
    assert t16 > t32  # PyTorch's two kernels against cuDNN's one


@pytest.mark.parametrize("case", ["inference", "channels_last", "large_batch_small_c_cpu",
                                  "amd"])
def test_where_the_per_channel_passes_do_not_apply(case):
    gpu = {"amd": "MI300X"}.get(case, "H200-SXM-141GB")
    d = _dims(L.BATCH_NORM, 128, 64, 112 * 112, training=case != "inference",
              channels_last=case == "channels_last")
    f = hardware.get(gpu).features.copy()
    if case == "large_batch_small_c_cpu":
        f[L.G_CC_MAJOR] = 0.0  # a CPU's row (calibration.device.cpu_features) has none
    params, mlp = default_params(), opmodel.weights()
    kernels = 1 if case == "inference" else 2
    t = op_time_us(L.BATCH_NORM, L.F32, kernels, d, f, params, mlp)
    assert t == pytest.approx(analytical_us(L.BATCH_NORM, L.F32, kernels, d, f, params))
    assert isolated_time_us(L.BATCH_NORM, L.F32, d, f, params, mlp) == pytest.approx(
        analytical_us(L.BATCH_NORM, L.F32, 1, d, f, params))


def test_isolated_time_has_the_same_floor():
    d = _dims(L.BATCH_NORM_BWD, 128, 64, 56 * 56)
    f = hardware.get("A100-SXM4-80GB").features
    params, mlp = default_params(), opmodel.weights()
    t = isolated_time_us(L.BATCH_NORM_BWD, L.F32, d, f, params, mlp)
    steps = -(-128 * 56 * 56 // BN_CHANNEL_THREADS)
    assert t - params[P_LAUNCH_US] == pytest.approx(2 * steps * BN_STEP_US)


class _ConvBN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)

    def forward(self, x):
        return self.bn(self.conv(x)).sum()


@pytest.mark.parametrize("fmt,flag", [(None, 0), ("channels_last", 1)])
def test_trace_flags_channels_last_batch_norm_rows(fmt, flag):
    g = predictor.trace(_ConvBN(), (torch.randn(2, 3, 16, 16),), loss_fn=lambda out: out,
                        memory_format=fmt)
    dims = g.ops.dims(2)
    bn = np.isin(g.ops.family, (L.BATCH_NORM, L.BATCH_NORM_BWD))
    assert bn.sum() == 2
    assert (dims[bn, L.MEM_LAYOUT] == flag).all()


def test_h200_measured_batch_norm_rows_within_a_third():
    """PyTorch's own bf16 kernels, each row of a ResNet-50 step timed on an
    H200 (benchmarks/rows_gpu.py): predicted over measured, summed per
    direction. Before the per-channel passes: 0.21 forward, 0.23 backward."""
    path = ROWS / "resnet50-b128-bf16.npz"
    if not path.exists():
        pytest.skip(f"{path} is not in this checkout")
    from benchmarks.rows_gpu import CONFIGS, rows

    _, df = rows("resnet50-b128-bf16", CONFIGS["resnet50-b128-bf16"], path)
    df = df[df.measured_us > 0]
    for family in ("batch_norm", "batch_norm_bwd"):
        sel = df[df.family == family]
        ratio = (sel.predicted_us * sel["count"]).sum() / (sel.measured_us * sel["count"]).sum()
        assert 0.67 < ratio < 1.33, (family, ratio)


def test_committed_h200_row_files_belong_to_todays_traces():
    """`benchmarks.rows_gpu compare` refuses a calibration whose graph has
    changed: a change to the trace that alters a configuration's rows must
    come with its measured file re-keyed (or the file removed), not leave
    the harness failing."""
    from benchmarks.rows_gpu import CONFIGS, _trace
    from predictor.calibration.file import load

    files = {name: ROWS / f"{name}.npz" for name in CONFIGS}
    present = {name: path for name, path in files.items() if path.exists()}
    if not present:
        pytest.skip(f"no measured row files in {ROWS}")
    for name, path in present.items():
        load(path, _trace(CONFIGS[name]))
