"""Depthwise convolutions are priced as PyTorch's direct kernels
(kernels.depthwise): issue-bound tap loops or a pass over their tensors,
never the GEMM tiles they cannot fill; the reference agrees; no cuDNN
layout transposes; the basis says analytical."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn

import predictor
from predictor import engine, families, hardware, reference
from predictor.kernels import depthwise as DW
from predictor.kernels import layout as L
from predictor.kernels.optime import op_time_us
from predictor.kernels.roofline import P_LAUNCH_US


class Block(nn.Module):
    """A ConvNeXt block's spatial mixing: a 7x7 depthwise convolution."""

    def __init__(self, c=96, k=7, groups=None):
        super().__init__()
        self.pw = nn.Conv2d(c, c, 1)   # so that the depthwise convolution has a data gradient
        self.dw = nn.Conv2d(c, c, k, padding=k // 2, groups=c if groups is None else groups)

    def forward(self, x):
        return self.dw(self.pw(x))


def _ops(model, c=96, hw=56, gpu="RTX-3090", batch=256, amp="fp16", mode="train"):
    g = predictor.trace(model, lambda b: (torch.zeros(b, c, hw, hw),), batch_size=2,
                        amp=amp, mode=mode, optimizer=None)
    return g, predictor.predict(g, gpu, batch_size=batch).ops


def _rows(graph, batch):
    t = graph.ops
    d = t.dims(batch)
    return [(int(t.family[i]), int(t.dtype[i]), int(t.kernels[i]), d[i])
            for i in range(len(t)) if DW.is_depthwise(int(t.family[i]), d[i])]


def test_a_convnext_depthwise_convolution_costs_milliseconds_not_tens():
    """[256, 96, 56, 56], 7x7, fp16 on an RTX 3090: 3.8 G taps. The GEMM
    model priced its forward at 33 ms; its bytes take 0.16 ms and its loop
    about 2 ms at 9 instructions a tap."""
    _, ops = _ops(Block)
    conv = ops[ops.family.str.startswith("conv") & ops["shape"].astype(str).str.contains("g96")]
    by = {f: float(conv[conv.family == f].ms.sum()) for f in ("conv", "conv_dgrad", "conv_wgrad")}
    assert 1.0 < by["conv"] < 3.0
    assert by["conv"] < by["conv_dgrad"] < by["conv_wgrad"] < 6.0
    assert set(conv.basis) == {"analytical"}

    # cuDNN's NCHW <-> NHWC transposes belong to its tensor-core kernels; PyTorch's
    # depthwise kernels read NCHW as it is
    x = families.TensorMeta((256, 96, 56, 56), torch.float16)
    w = families.TensorMeta((96, 1, 7, 7), torch.float16)
    dims = (256, 96, 56, 56, 96, 7, 7, 56, 56, 96, 1)
    assert families._layout_transposes(dims, x, w, x, w, x) == []
    assert families._layout_transposes(dims[:9] + (1, 1), x, w, x, w, x) != []


@pytest.mark.parametrize("gpu", ["RTX-3090", "V100-SXM2-16GB", "T4", "H100-SXM5-80GB", "P100-PCIE-16GB"])
@pytest.mark.parametrize("amp", ["fp16", None])
def test_the_engine_and_the_reference_agree(gpu, amp):
    graph, _ = _ops(Block, gpu=gpu, amp=amp)
    feats = hardware.get(gpu).features
    params, mlp = engine.model_params(), engine._mlp()
    rows = _rows(graph, 64)
    assert {fam for fam, *_ in rows} == {L.CONV, L.CONV_DGRAD, L.CONV_WGRAD}
    for fam, dt, kernels, d in rows:
        fast = op_time_us(fam, dt, kernels, d, feats, params, mlp)
        slow = reference.op_time_us(fam, dt, kernels, [int(v) for v in d], list(feats),
                                    list(params), [np.asarray(m) for m in mlp])
        assert fast == pytest.approx(slow, rel=1e-9)
        assert np.isfinite(fast) and fast > 0


def test_the_price_is_the_larger_of_issue_and_memory_time():
    feats = hardware.get("RTX-3090").features
    params = engine.model_params()
    d = np.array([256, 96, 56, 56, 96, 7, 7, 56, 56, 96, 1], dtype=np.int64)
    taps = 256.0 * 96 * 56 * 56 * 49
    issue = taps * DW.FORWARD_INSTR / (feats[L.G_SMS] * 128 * feats[L.G_CLOCK_MHZ] * 1e6) * 1e6
    t = DW.depthwise_us(L.CONV, L.F16, 1, d, feats, params, 1.0)
    assert t == pytest.approx(issue + params[P_LAUNCH_US])
    # a 1x1 "depthwise" scaling is its bytes: memory-bound
    d1 = np.array([256, 96, 56, 56, 96, 1, 1, 56, 56, 96, 1], dtype=np.int64)
    t1 = DW.depthwise_us(L.CONV, L.F16, 1, d1, feats, params, 1.0)
    mem = 2 * 256 * 96 * 56 * 56 * 2 / (feats[L.G_MEM_BW_GBS] * 1e9 * DW.MEMORY_EFFICIENCY) * 1e6
    assert t1 >= mem


def test_grouped_convolutions_with_channels_a_group_are_not_depthwise():
    d = np.array([8, 128, 56, 56, 128, 3, 3, 56, 56, 32, 1], dtype=np.int64)   # ResNeXt's 4 a group
    assert not DW.is_depthwise(L.CONV, d)
    d[9] = 128
    assert DW.is_depthwise(L.CONV, d) and DW.is_depthwise(L.CONV_WGRAD, d)
    assert not DW.is_depthwise(L.MATMUL, d)
