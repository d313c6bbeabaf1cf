"""Depthwise convolutions (one input channel a group: MobileNets,
EfficientNets, ConvNeXt) priced as the kernels that run them, not as GEMMs.

As an implicit GEMM a depthwise convolution is `groups` GEMMs of one output
column (the channel multiplier) reducing over its R x S taps. No GEMM tile
fills that: the tensor-core model priced a [256, 96, 56, 56] 7x7 one in
fp16 at 33 ms on an RTX 3090, a hundred times the time of its bytes, and the
convolution network learned from dense 3x3 convolutions only. PyTorch runs
them on direct kernels of its own (aten/src/ATen/native/cuda/
DepthwiseConv2d.cu: `conv_depthwise2d_forward_kernel`, `_backward_kernel`,
`_grad_weight_kernel`; cuDNN's depthwise kernels for channels-last and for
some fp16 shapes do the same work): a thread an element, a loop over the
filter's taps, each tap one multiply-add in fp32 (`acc_type`) of two loads
that mostly hit the L1.

Such a loop is bound by instruction issue, not by its FMAs: a row costs the
larger of
- its taps times the instructions a tap, over the GPU's issue rate (four
  warp schedulers an SM, 32 threads an instruction, at its clock, as a
  power limit leaves it), and
- its tensors read and written once at the DRAM bandwidth, at the
  elementwise kernels' rule-of-thumb efficiency (kernels.roofline),
plus its launches.

Instructions a tap, counted by hand from those kernels' source (not fitted
to any measurement): the forward's two loads (weight, input), their two
conversions to fp32 for 16-bit tensors, the FMA, the four bounds compares
and the offset arithmetic (`FORWARD_INSTR`); the data gradient adds the
stride divisibility tests and loops over every tap of each input element
(`DGRAD_INSTR`); the weight gradient runs a block a filter tap whose warps
stride over N x P x Q, with a division and a modulo an element for its
position and a block reduction at the end (`WGRAD_INSTR`).
"""

from __future__ import annotations

from numba import njit

from predictor.kernels import layout as L
from predictor.kernels.roofline import P_LAUNCH_US, peak_flops
from predictor.kernels.work import flops_and_elems, is_conv, row_elem_bytes

FORWARD_INSTR = 9.0
DGRAD_INSTR = 12.0
WGRAD_INSTR = 18.0
# Thread-instructions an SM issues a clock: four warp schedulers of 32 threads.
ISSUE_PER_SM_CLOCK = 128.0
# The share of the DRAM bandwidth a pass over the tensors gets
# (kernels.roofline.default_params: the elementwise kernels' 0.75).
MEMORY_EFFICIENCY = 0.75


@njit(cache=True)
def is_depthwise(family, d):
    """A convolution row with one input channel a group (dims: n c h w k r s
    p q groups stride)."""
    return is_conv(family) and d[9] > 1 and d[1] // d[9] == 1


@njit(cache=True)
def taps(family, d):
    """Multiply-adds the row's kernel loops over: the output's elements times
    R x S (the data gradient: the input's, every tap tested)."""
    n, c, h, w, k, r, s, p, q = d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7], d[8]
    if family == L.CONV_DGRAD:
        return float(n) * c * h * w * r * s
    return float(n) * k * p * q * r * s


@njit(cache=True)
def depthwise_us(family, dtype_code, kernels, d, gpu, params, clock_share):
    """Time of one execution of a depthwise convolution row (us) on a GPU
    whose clock runs at `clock_share` of its boost clock."""
    instr = FORWARD_INSTR
    if family == L.CONV_DGRAD:
        instr = DGRAD_INSTR
    elif family == L.CONV_WGRAD:
        instr = WGRAD_INSTR
    rate = gpu[L.G_SMS] * ISSUE_PER_SM_CLOCK * gpu[L.G_CLOCK_MHZ] * 1e6 * clock_share
    flops, elems = flops_and_elems(family, d)
    if rate > 0.0:
        t_issue = taps(family, d) * instr / rate * 1e6
    else:  # a feature row without SMs or a clock (a CPU's): its FMA peak
        t_issue = flops / peak_flops(gpu, L.ELEMENTWISE, dtype_code, params) * 1e6
    t_mem = elems * row_elem_bytes(dtype_code) / (gpu[L.G_MEM_BW_GBS] * 1e9
                                                  * MEMORY_EFFICIENCY) * 1e6
    return max(t_issue, t_mem) + kernels * params[P_LAUNCH_US]
