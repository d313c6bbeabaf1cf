"""Group norm as ATen's CUDA build runs it: a row reduction and an elementwise
pass (not a layer norm's one-pass kernel), on NCHW tensors only, so a
channels-last model pays a copy into NCHW and the next convolution's copy
back; and models whose factory converts them (``.half()``) trace."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import predictor
from predictor.kernels import layout as L


class NormBlock(nn.Module):
    """conv -> group norm -> SiLU -> conv, as a diffusion UNet's ResNet block."""

    def __init__(self, c=64, groups=8):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1)
        self.norm = nn.GroupNorm(groups, c)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1)

    def forward(self, x):
        return self.conv2(F.silu(self.norm(self.conv1(x))))


class NormAndSilu(nn.Module):
    def __init__(self, c=320):
        super().__init__()
        self.norm = nn.GroupNorm(32, c)

    def forward(self, x):
        return self.norm(x), F.silu(x)


def _trace(model, c, hw, mode="inference", fmt=None, dtype=torch.float16):
    return predictor.trace(model, lambda b: (torch.zeros(b, c, hw, hw, dtype=dtype),), mode=mode,
                           batch_size=2, memory_format=fmt, optimizer=None)


def _ops(graph, gpu="A100-SXM4-40GB", batch=32):
    return predictor.predict(graph, gpu, batch_size=batch).ops


def test_group_norm_is_a_row_reduction_and_an_elementwise_pass():
    """[32, 320, 64, 64] in fp16, Stable Diffusion's first level: rows of
    40,960 elements, ten times the layer-norm network's longest. Priced as
    ATen's kernels it costs about two passes over the tensor; the layer-norm
    network priced it at 20 times a SiLU of the same tensor."""
    ops = _ops(_trace(lambda: NormAndSilu().half(), 320, 64))
    norm = ops[ops.op == "native_group_norm"]
    assert sorted(norm.family) == ["elementwise", "reduction"]
    assert int(norm.kernels.sum()) == 3           # moments, fused params, apply
    silu = float(ops[ops.op == "silu"].ms.sum())
    assert 1.2 * silu < float(norm.ms.sum()) < 3 * silu


def test_group_norm_backward_reduces_then_writes_the_input_gradient():
    ops = _ops(_trace(lambda: NormBlock(), 64, 32, mode="train", dtype=torch.float32))
    bwd = ops[ops.op == "native_group_norm_backward"]
    assert sorted(bwd.family) == ["elementwise", "reduction"]
    assert int(bwd.kernels.sum()) == 5
    assert np.isfinite(bwd.ms).all() and (bwd.ms > 0).all()


def _strided_copies(graph, phase="forward"):
    t = graph.ops
    names = np.asarray(t.op_names, dtype=object)[t.op]
    d = t.dims(8)
    return sorted(str(names[i]) for i in range(len(t)) for _ in range(int(t.count[i]))
                  if t.family[i] == L.COPY and t.phase[i] == L.PHASE_NAMES.index(phase)
                  and d.shape[1] > L.MEM_GENERIC and d[i, L.MEM_GENERIC] == L.COPY_STRIDED)


def test_channels_last_group_norm_runs_on_an_nchw_copy():
    """On a GPU the norm reads an NCHW copy and writes NCHW (the CPU build
    keeps channels-last); the SiLU runs on NCHW and the next convolution,
    whose filter is channels-last, copies its input back (once: the trace
    makes that copy itself, and the convolution's row adds none). NCHW
    models pay neither copy."""
    cl = _trace(NormBlock, 64, 32, fmt="channels_last", dtype=torch.float32)
    assert _strided_copies(cl) == ["clone", "clone"]
    nchw = _trace(NormBlock, 64, 32, fmt="contiguous", dtype=torch.float32)
    assert _strided_copies(nchw) == []


def test_channels_last_training_copies_what_the_convolution_backward_reads():
    cl = _trace(NormBlock, 64, 32, mode="train", fmt="channels_last", dtype=torch.float32)
    assert "convolution_backward" in _strided_copies(cl, "backward")
    nchw = _trace(NormBlock, 64, 32, mode="train", fmt="contiguous", dtype=torch.float32)
    assert _strided_copies(nchw, "backward") == []


@pytest.mark.parametrize("convert, dtype", [
    (lambda m: m.half(), torch.float16),
    (lambda m: m.to(torch.bfloat16), torch.bfloat16),
    (lambda m: m.to(memory_format=torch.channels_last), torch.float32)])
def test_a_factory_that_converts_its_model_traces(convert, dtype):
    """`Model().half()` in a factory: under fake tensors torch swaps each
    converted parameter in, which the fake mode refuses; the model is built
    on the meta device instead, in the dtype and format the factory gave it."""
    g = predictor.trace(lambda: convert(NormBlock()),
                        lambda b: (torch.zeros(b, 64, 16, 16, dtype=dtype),),
                        mode="inference", batch_size=2)
    p = predictor.predict(g, "T4", batch_size=4)
    assert np.isfinite(p.iteration_ms) and p.iteration_ms > 0
    assert set(p.ops[p.ops.op == "convolution"].dtype) == {str(dtype).split(".")[1]}


class Projection(nn.Module):
    """A group norm, then a 1x1 convolution (a diffusion transformer's proj_in)."""

    def __init__(self, c=64):
        super().__init__()
        self.norm = nn.GroupNorm(8, c)
        self.proj = nn.Conv2d(c, c, 1)
        self.conv = nn.Conv2d(c, c, 3, padding=1)

    def forward(self, x):
        return self.conv(self.proj(self.norm(x)))


def test_a_channels_last_1x1_filter_makes_its_convolution_channels_last():
    """`model.to(memory_format=torch.channels_last)` gives a 1x1 filter the
    strides (C, 1, C, C), by which ATen runs its convolution channels-last:
    the NCHW norm output is copied in once, and the 3x3 convolution after it
    reads channels-last with no copy of its own."""
    cl = _trace(Projection, 64, 32, fmt="channels_last", dtype=torch.float32)
    assert _strided_copies(cl) == ["clone", "clone"]


def test_strides_like_channels_last_is_atens_rule():
    from predictor.frontend.cuda_paths import strides_like_channels_last as like_cl

    w = torch.empty(8, 4, 1, 1)
    assert not like_cl(w) and like_cl(w.to(memory_format=torch.channels_last))
    x = torch.empty(2, 4, 5, 5)
    assert not like_cl(x) and like_cl(x.to(memory_format=torch.channels_last))
    assert not like_cl(torch.empty(2, 4, 1, 1)) and not like_cl(torch.empty(3, 1, 1, 1))
    v = torch.empty(2, 4, 3, 5, 5)
    assert like_cl(v.to(memory_format=torch.channels_last_3d)) and not like_cl(v)
