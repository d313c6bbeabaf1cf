"""A recurrent layer as the kernels cuDNN runs for it.

A recurrent row (family LSTM or LSTM_BWD, dims [T, B, I, H, gates]: one layer,
one direction, T steps of a batch of B, input width I, hidden width H; 4 gates
for an LSTM, 3 for a GRU, 1 for a plain RNN) is not one kernel. cuDNN's standard algorithm, the one PyTorch runs for fp32 layers and
for most half-precision ones (`_select_rnn_algo` in ATen's cudnn/RNN.cpp),
does what NVIDIA's description of it says (Appleyard, "Optimizing Recurrent
Neural Networks in cuDNN 5", 2016): the input projections of every step in
one GEMM, then step after step a GEMM of the previous hidden state and one
pointwise kernel for the gates. Its backward pass runs the steps in reverse
(pointwise, then the recurrent GEMM of the data gradient), then the input's
data gradient and both weight gradients as three GEMMs over every step.
Where a step's GEMM would read the weights in the slower order, the same
description has cuDNN transpose them once per call and run every step on
the transposed copy ("pre-transposing the weight matrix", its
optimization 4): so the backward pass also copies W_hh into [H, gates x H]
once, and its recurrent GEMM reads the weights K-major as the forward's
does.

`lstm_kernels` writes those kernels out as rows of the families the learned
models price (``kernels.optime.recurrent_us`` sums them), so an LSTM is
priced from the same measured GEMMs and elementwise kernels as everything
else, on tensor cores where its GEMMs run there, instead of from a
hand-chosen efficiency. The GEMMs' operands are laid out as cuDNN holds
them: PyTorch's `weight_ih` and `weight_hh` ([4H, I], [4H, H], row-major)
are views into cuDNN's own weight buffer, so the forward GEMMs read the
weights K-major (`x @ W^T`, GEMM_B_T), the input's data gradient reads them
N-major (`dgates @ W_ih`, one GEMM) and each step's data gradient reads the
transposed copy of W_hh K-major. The pointwise kernel is described as an elementwise
op over the [B, gates x H] pre-activations that reads two such tensors and
writes one: for an LSTM it moves the gates, the cell state, h and the gates
saved for the backward pass, 11 HB elements forward and 14 HB backward,
against this description's 12 HB.
"""

from __future__ import annotations

from numba import njit

from predictor.kernels import layout as L
from predictor.kernels.work import rnn_gates

# Kernel kinds one row expands to: at most six (the backward pass).
MAX_KERNELS = 6


@njit(cache=True)
def _gemm(j, m, n, k, layout, count, fam, dims, counts):
    """Write kernel j: a GEMM [m, k] @ [k, n] with operand `layout`, run `count` times."""
    for c in range(dims.shape[1]):
        dims[j, c] = 0
    dims[j, 0], dims[j, 1], dims[j, 2], dims[j, 3] = 1, m, n, k
    dims[j, L.GEMM_LAYOUT] = layout
    fam[j] = L.MATMUL
    counts[j] = count


@njit(cache=True)
def _gates(j, b, g, count, fam, dims, counts):
    """Write kernel j: the pointwise kernel of one step over the [b, g] gates."""
    for c in range(dims.shape[1]):
        dims[j, c] = 0
    n = b * g
    dims[j, L.MEM_READ], dims[j, L.MEM_WRITTEN], dims[j, L.MEM_FLOPS] = 2 * n, n, n
    dims[j, L.MEM_INNER], dims[j, L.MEM_OUTER] = g, b
    fam[j] = L.ELEMENTWISE
    counts[j] = count


@njit(cache=True)
def _transpose(j, rows, cols, fam, dims, counts):
    """Write kernel j: one copy of a [rows, cols] matrix into its transpose."""
    for c in range(dims.shape[1]):
        dims[j, c] = 0
    n = rows * cols
    dims[j, L.MEM_READ], dims[j, L.MEM_WRITTEN] = n, n
    dims[j, L.MEM_INNER], dims[j, L.MEM_OUTER] = cols, rows
    fam[j] = L.COPY
    counts[j] = 1


@njit(cache=True)
def is_recurrent(family):
    return family == L.LSTM or family == L.LSTM_BWD


@njit(cache=True)
def lstm_kernels(family, d, fam, dims, counts):
    """Fill fam[:n], dims[:n] and counts[:n] with the kernels of one recurrent
    row (each run counts[j] times per execution of the row); returns n.
    Kernels with an empty dim are left out."""
    t, b, i, h = d[0], d[1], d[2], d[3]
    if t <= 0 or b <= 0 or h <= 0:
        return 0
    g = rnn_gates(d) * h  # the gates' width: 4H for an LSTM
    n = 0
    if family == L.LSTM:
        if i > 0:  # x @ W_ih^T, every step at once
            _gemm(n, t * b, g, i, L.GEMM_B_T, 1, fam, dims, counts)
            n += 1
        _gemm(n, b, g, h, L.GEMM_B_T, t, fam, dims, counts)  # h @ W_hh^T, each step
        n += 1
        _gates(n, b, g, t, fam, dims, counts)
        return n + 1
    _gates(n, b, g, t, fam, dims, counts)  # the gates' gradient, each step
    n += 1
    _transpose(n, g, h, fam, dims, counts)  # W_hh^T, once per call
    n += 1
    _gemm(n, b, h, g, L.GEMM_B_T, t, fam, dims, counts)  # dgates @ W_hh, each step, K-major
    n += 1
    if i > 0:
        _gemm(n, t * b, i, g, 0, 1, fam, dims, counts)  # dx = dgates @ W_ih
        n += 1
        _gemm(n, g, i, t * b, L.GEMM_A_T, 1, fam, dims, counts)  # dW_ih = dgates^T @ x
        n += 1
    _gemm(n, g, h, t * b, L.GEMM_A_T, 1, fam, dims, counts)  # dW_hh = dgates^T @ h
    return n + 1
