"""The learned efficiency models over a block of GPUs at once: the sweep's form
of ``predictor.kernels.mlp.efficiency``.

A sweep asks the same network the same question for one op on many GPUs. Run
one (op, GPU) pair at a time, the forward pass is a chain of dependent
multiply-adds with a division in every one of them (the input normalisation).
Here the block of GPUs is the innermost loop of every layer: each GPU has its
own accumulator, so the loops are independent element-wise updates that LLVM
vectorises, the normalisation is done once per input, not once per weight,
and tanh is a vectorised polynomial instead of a libm call per element.

Same weight layout as ``mlp.py`` (written by ``predictor.calibration.train``);
the same numbers up to rounding (the tests hold the sweep to the plain-Python
reference at 1e-6 relative, and to the one-op form through predict's per-op
breakdown).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from predictor.kernels.mlp import HEADER, layer_offsets


# 1/k! for the Taylor series of exp on |r| <= 40/128 (truncation < 1e-16).
_F2, _F3, _F4, _F5, _F6, _F7 = 1 / 2, 1 / 6, 1 / 24, 1 / 120, 1 / 720, 1 / 5040
_F8, _F9, _F10, _F11, _F12 = 1 / 40320, 1 / 362880, 1 / 3628800, 1 / 39916800, 1 / 479001600


@njit(cache=True, error_model="numpy")
def tanh_inplace(v, n):
    """v[:n] = tanh(v[:n]), vectorised.

    libm's tanh is a call per element (~25 ns here) that no loop vectoriser can
    widen. This is 1 - 2 / (e^{2x} + 1) with e^{2x} = (e^r)^128, r = 2x/128:
    a Taylor polynomial and seven squarings, only multiplies and adds, so the
    loop runs four elements per instruction (~3.5 ns each). |x| is clamped at
    20, where tanh is 1 to double precision. Absolute error < 2e-14 against
    libm over the whole line, which is what the next layer sees (a weighted
    sum). error_model="numpy": no zero-division check in the loop (it would
    stop the vectoriser; p + 1 >= 1 anyway).
    """
    for k in range(n):
        r = min(max(v[k], -20.0), 20.0) * (2.0 / 128.0)
        p = _F12
        p = p * r + _F11
        p = p * r + _F10
        p = p * r + _F9
        p = p * r + _F8
        p = p * r + _F7
        p = p * r + _F6
        p = p * r + _F5
        p = p * r + _F4
        p = p * r + _F3
        p = p * r + _F2
        p = p * r + 1.0
        p = p * r + 1.0
        p = p * p
        p = p * p
        p = p * p
        p = p * p
        p = p * p
        p = p * p
        p = p * p
        v[k] = 1.0 - 2.0 / (p + 1.0)


@njit(cache=True)
def block_scratch(mlp, n):
    """(inputs, hidden, accumulators) scratch for blocks of up to n GPUs, sized
    for the widest network in `mlp`."""
    width = 1
    if mlp.shape[0] > 0:
        for group in range(int(mlp[0])):
            h = 1 + HEADER * group
            if mlp[h] > 0:
                width = max(width, int(mlp[h + 1]), int(mlp[h + 2]), int(mlp[h + 3]))
    return np.empty((width, n)), np.empty((width, n)), np.empty((2, n))


@njit(cache=True, error_model="numpy", fastmath={"contract"})
def efficiency_block(mlp, group, x, n, eta, zbuf, hbuf, acc):
    """eta[k] = the group's efficiency for feature vector x[k] (k < n).

    x: float[>= n, >= n_in] features (one row per GPU); eta: float[>= n];
    zbuf, hbuf, acc: scratch from `block_scratch`. error_model="numpy" keeps
    zero-division checks out of the loops so that they vectorise (the
    weights' std are positive and 1 + exp(-z) >= 1); "contract" lets each
    multiply-add be one fused instruction.
    """
    h = 1 + HEADER * group
    off = int(mlp[h])
    n_in = int(mlp[h + 1])
    h1 = int(mlp[h + 2])
    h2 = int(mlp[h + 3])
    eta_max = mlp[h + 4]
    mean, std, w1, b1, w2, b2, w3, b3, _ = layer_offsets(off, n_in, h1, h2)
    for i in range(n_in):  # normalised inputs, one row per feature
        m = mlp[mean + i]
        s = mlp[std + i]
        for k in range(n):
            zbuf[i, k] = (x[k, i] - m) / s
    for j in range(h1):  # first tanh layer
        row = w1 + j * n_in
        bias = mlp[b1 + j]
        for k in range(n):
            hbuf[j, k] = bias
        for i in range(n_in):
            w = mlp[row + i]
            for k in range(n):
                hbuf[j, k] += w * zbuf[i, k]
        tanh_inplace(hbuf[j], n)
    out = acc[0]
    layer = acc[1]
    for k in range(n):
        out[k] = mlp[b3]
    for j in range(h2):  # second tanh layer, folded into the output unit
        row = w2 + j * h1
        bias = mlp[b2 + j]
        for k in range(n):
            layer[k] = bias
        for i in range(h1):
            w = mlp[row + i]
            for k in range(n):
                layer[k] += w * hbuf[i, k]
        tanh_inplace(layer, n)
        w = mlp[w3 + j]
        for k in range(n):
            out[k] += w * layer[k]
    for k in range(n):
        eta[k] = eta_max / (1.0 + math.exp(-out[k]))
