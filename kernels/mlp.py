"""Forward pass of the small per-group networks from one flat weight array.

Layout of `mlp` (float64), written by ``predictor.calibration.train``:

    [0]                      number of groups G
    [1 + 10*g : 11 + 10*g]   header of group g: offset, n_in, h1, h2, eta_max,
                             floor_us, corr_offset, n_corr, aux_offset, n_aux
                             (offset 0: no model for the group)
    [offset ...]             mean[n_in], std[n_in], W1[h1, n_in], b1[h1],
                             W2[h2, h1], b2[h2], w3[h2], b3
    [corr_offset ...]        n_corr pairs (chip key, log correction): the
                             group's per-chip corrections, key OTHER_CHIPS
                             for chips outside the data (see chip_correction)
    [aux_offset ...]         n_aux numbers the group's features need beside
                             the GPU and the op: for the batched-GEMM group,
                             the GEMM tile rule its tiles come from
                             (predictor.kernels.tiles; see group_aux)

The output is an efficiency in (0, eta_max]: a sigmoid of the last layer,
scaled. eta_max is 1 except where an algorithm does fewer FLOPs than the
direct formula counts (Winograd convolutions).
"""

from __future__ import annotations

import math

from numba import njit

HEADER = 10


@njit(cache=True)
def layer_offsets(off, n_in, h1, h2):
    """Where each array of a group's network starts in the flat weight array,
    for a group whose weights start at `off`: (mean, std, W1, b1, W2, b2, w3,
    b3, end), `end` one past b3. The one definition of the layout above, for
    the forward passes, the layout check and the writer."""
    mean = off
    std = mean + n_in
    w1 = std + n_in
    b1 = w1 + h1 * n_in
    w2 = b1 + h1
    b2 = w2 + h2 * h1
    w3 = b2 + h2
    b3 = w3 + h2
    return mean, std, w1, b1, w2, b2, w3, b3, b3 + 1


@njit(cache=True)
def has_group(mlp, group):
    if mlp.shape[0] == 0 or group < 0 or group >= int(mlp[0]):
        return False
    return mlp[1 + HEADER * group] > 0


@njit(cache=True)
def group_aux(mlp, group):
    """The group's auxiliary numbers (an empty view when it has none)."""
    if mlp.shape[0] == 0 or group < 0 or group >= int(mlp[0]):
        return mlp[:0]
    h = 1 + HEADER * group
    off = int(mlp[h + 8])
    return mlp[off:off + int(mlp[h + 9])]


@njit(cache=True)
def floor_us(mlp, group):
    """The fixed per-op cost of an isolated measurement of this group (us)."""
    return mlp[1 + HEADER * group + 5]


@njit(cache=True)
def efficiency(mlp, group, x, hidden):
    """eta in (0, eta_max] for one feature vector `x` (`hidden`: scratch, >= h1)."""
    h = 1 + HEADER * group
    off = int(mlp[h])
    n_in = int(mlp[h + 1])
    h1 = int(mlp[h + 2])
    h2 = int(mlp[h + 3])
    eta_max = mlp[h + 4]
    mean, std, w1, b1, w2, b2, w3, b3, _ = layer_offsets(off, n_in, h1, h2)
    # tanh activations: cheap, smooth, and bounded for inputs far outside training.
    z = mlp[b3]
    for j in range(h1):
        s = mlp[b1 + j]
        row = w1 + j * n_in
        for i in range(n_in):
            s += mlp[row + i] * (x[i] - mlp[mean + i]) / mlp[std + i]
        hidden[j] = math.tanh(s)
    for j in range(h2):
        s = mlp[b2 + j]
        row = w2 + j * h1
        for i in range(h1):
            s += mlp[row + i] * hidden[i]
        z += mlp[w3 + j] * math.tanh(s)
    return eta_max / (1.0 + math.exp(-z))


# The key of the correction for every chip the weights hold none for (chip
# keys are 0, "not known", or 1 + a CRC-32: never negative).
OTHER_CHIPS = -1.0


@njit(cache=True)
def chip_correction(mlp, group, chip):
    """The group's log time correction for `chip`: its own, for a chip the
    weights were trained on; else the one for other chips (OTHER_CHIPS), if
    the weights hold one; else 0.

    The networks see no feature that names a GPU, so that they carry over to
    GPUs outside the data; on the GPUs in the data that leaves each chip's own
    systematic offset (a V100 runs large fp32 GEMMs at 0.95 of peak where the
    GPUs around it run 0.5-0.8). The correction is that offset, measured on
    the chip's own training kernels: it applies to boards of that chip only.
    A chip outside the data gets the median of the training chips' offsets:
    the networks are fitted to the mean of the training GPUs, which one
    outlier (the V100) pulls away from the typical GPU."""
    h = 1 + HEADER * group
    off = int(mlp[h + 6])
    other = 0.0
    for i in range(int(mlp[h + 7])):
        key = mlp[off + 2 * i]
        if key == chip and chip != 0.0:
            return mlp[off + 2 * i + 1]
        if key == OTHER_CHIPS:
            other = mlp[off + 2 * i + 1]
    return other


@njit(cache=True)
def chip_efficiency(mlp, group, x, hidden, chip):
    """`efficiency` with the chip's correction applied, still at most eta_max."""
    return with_chip(mlp, group, efficiency(mlp, group, x, hidden), chip)


@njit(cache=True)
def with_chip(mlp, group, eta, chip):
    """An efficiency of the group's network with the chip's correction applied
    (still at most eta_max)."""
    c = chip_correction(mlp, group, chip)
    if c == 0.0:
        return eta
    return min(eta * math.exp(-c), mlp[1 + HEADER * group + 4])
