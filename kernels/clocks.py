"""The clock a GEMM sustains on another board of a training chip.

The op models learn, per chip, the GEMM and convolution efficiency of the
board whose kernels were measured (``kernels.mlp.chip_correction``). Another
board of the same chip (same architecture and SM count) is described by its
own spec sheet, so the model gives it the measured board's efficiency on
its own rated peak, i.e. the measured board's clock as a fraction of its
rated boost. But under a full GEMM the clock follows the board's power, not
its rated boost. On a public table of large fp32 `torch.mm` throughput
(benchmarks/matmul_published.py, ``--within-chip``):

- the A100 SXM4 80GB (400 W) runs at 0.98 of its peak, where the 250 W A100
  PCIe 40GB of the training data runs at 0.78-0.81 of the same peak;
- a V100S PCIe (the V100 PCIe's chip at the same 250 W, rated at 1601 MHz to
  its 1380) measures 13.55 TFLOP/s, what the V100 PCIe runs at its own
  1380 MHz.

So a GEMM or convolution row on a board t of a training chip takes the
sustained clock

    f_t = min(b_t, f_r * (w_t / w_r) ** (1/3))

where b is a board's rated boost clock, w its board power per SM, and r the
chip's reference board: the one whose GEMM kernels trained the matmul
network, sustaining f_r = c_r * b_r. Dynamic power goes as f V^2 with V
rising with f, so power goes as f^3; the exponent is that textbook figure,
not fitted. c_r is the reference board's best GEMM efficiency over the best
of any training board (the 90th percentile of its large compute-bound
training GEMMs': 1 for the V100 PCIe; below 1 where a board runs its GEMMs
short of its peak, which this takes for a clock below its boost: the A100
PCIe 40GB's 0.92, the H200's 0.91, the T4's 0.56). The row's efficiency
is scaled by the ratio of sustained to rated clock, target over the board
its group's kernels came from (o: the reference board for GEMMs; for
convolutions the board of the conv data, the 300 W A100 PCIe 80GB on
GA100), in proportion to the row's compute share (DRAM bandwidth does not
follow the SM clock):

    eta * (1 + (m - 1) * min(t_compute / t_memory, 1)),
    m = (f_t / b_t) / (f_o / b_o)

On the measured boards themselves m is 1, so no figure measured on them
moves. The weights carry what this needs: after the SM range of the matmul
and conv groups' auxiliary numbers, records of (chip key, board power per
SM, rated boost MHz, clock fraction c) per chip of the group's data; c is
the reference board's in the matmul group's records and unused (0) in the
conv group's (``calibration.train.board_records``). Weights without records
leave every row as it was.
"""

from __future__ import annotations

from numba import njit

from predictor.kernels import layout as L
from predictor.kernels.features import (BOARD_FIELDS, G_BMM, G_CONV, G_MATMUL, SM_RANGE_FIELDS,
                                        roofline_us)
from predictor.kernels.mlp import HEADER, group_aux
from predictor.kernels.roofline import column_or

POWER_EXPONENT = 1.0 / 3.0


@njit(cache=True)
def _record(aux, chip):
    """Index of `chip`'s record in a group's auxiliary numbers, -1 if none."""
    n = (aux.shape[0] - SM_RANGE_FIELDS) // BOARD_FIELDS
    for i in range(n):
        j = SM_RANGE_FIELDS + BOARD_FIELDS * i
        if aux[j] == chip:
            return j
    return -1


@njit(cache=True)
def reference_clock(mlp, chip):
    """(f_r, w_r): the clock (MHz) and board power per SM of the board whose
    GEMM kernels of `chip` trained the matmul network (its record's c_r x
    b_r); f_r = 0 where the weights hold no usable record of the chip."""
    if chip == 0.0 or mlp.shape[0] == 0:
        return 0.0, 0.0
    ref = group_aux(mlp, G_MATMUL)
    r = _record(ref, chip)
    if r < 0:
        return 0.0, 0.0
    w_r, b_r, c_r = ref[r + 1], ref[r + 2], ref[r + 3]
    if not (w_r > 0.0 and b_r > 0.0 and c_r > 0.0):
        return 0.0, 0.0
    return c_r * b_r, w_r


@njit(cache=True)
def sustained_clock(b, w, f_r, w_r):
    """The clock (MHz) a board of rated boost `b` and board power per SM `w`
    sustains, from a board of its chip sustaining `f_r` at `w_r` per SM."""
    return min(b, f_r * (w / w_r) ** POWER_EXPONENT)


@njit(cache=True)
def clock_ratio(mlp, group, gpu):
    """m: the board's sustained over rated clock against that of the board the
    group's kernels of its chip came from (1 where the weights hold no record
    for its chip or a field is missing), times what a power limit leaves of
    its clock (`power_limit_share`); 1 for a group that is not a GEMM or
    convolution group."""
    if group != G_MATMUL and group != G_BMM and group != G_CONV:
        return 1.0
    return board_ratio(mlp, group, gpu) * power_limit_share(mlp, gpu)


@njit(cache=True)
def board_ratio(mlp, group, gpu):
    """`clock_ratio` at the board's rated power."""
    chip = gpu[L.G_CHIP]
    f_r, w_r = reference_clock(mlp, chip)
    if f_r <= 0.0:
        return 1.0
    own = group_aux(mlp, G_CONV if group == G_CONV else G_MATMUL)
    o = _record(own, chip)
    if o < 0:
        return 1.0
    w_o, b_o = own[o + 1], own[o + 2]
    sms, b_t = gpu[L.G_SMS], gpu[L.G_CLOCK_MHZ]
    if not (w_o > 0.0 and b_o > 0.0 and sms > 0.0 and b_t > 0.0 and gpu[L.G_TDP_W] > 0.0):
        return 1.0
    f_t = sustained_clock(b_t, gpu[L.G_TDP_W] / sms, f_r, w_r)
    f_o = sustained_clock(b_o, w_o, f_r, w_r)
    return (f_t / b_t) / (f_o / b_o)


@njit(cache=True)
def with_board_clock(mlp, group, eta, family, dtype_code, d, gpu, params):
    """`eta` (a GEMM or convolution group's efficiency with its chip's
    correction) on this board's sustained clock, in proportion to the row's
    compute share; still at most the group's eta_max."""
    m = clock_ratio(mlp, group, gpu)
    if m == 1.0:
        return eta
    t_c, t_m = roofline_us(family, dtype_code, d, gpu, params)
    share = 1.0 if t_c >= t_m else (t_c / t_m if t_m > 0.0 else 1.0)
    return min(eta * (1.0 + (m - 1.0) * share), mlp[1 + HEADER * group + 4])


@njit(cache=True)
def power_limit_share(mlp, gpu):
    """The clock a board sustains under its power limit (G_POWER_LIMIT_W),
    over the clock it sustains at its rated power (G_TDP_W): what its compute
    throughput is multiplied by (1 without a limit, or with one at or above
    the rated power). Where the weights hold a record of its chip (the matmul
    group's), both clocks come from ``sustained_clock`` on that record, so a
    board that holds its boost clock with power to spare (an A100 SXM4 at
    400 W) loses less than the cube root: at 300 W it runs the clock of the
    300 W A100 PCIe 80GB. Elsewhere the board is taken to run at its power
    edge at its rated power, and its clock falls as the cube root of the
    power (the module docstring's f^3 law)."""
    limit = column_or(gpu, L.G_POWER_LIMIT_W, 0.0)
    rated = gpu[L.G_TDP_W]
    if not (limit > 0.0 and rated > 0.0 and limit < rated):
        return 1.0
    sms, b = gpu[L.G_SMS], gpu[L.G_CLOCK_MHZ]
    f_r, w_r = reference_clock(mlp, gpu[L.G_CHIP])
    if f_r <= 0.0 or sms <= 0.0 or b <= 0.0:
        return (limit / rated) ** POWER_EXPONENT
    return sustained_clock(b, limit / sms, f_r, w_r) / sustained_clock(b, rated / sms, f_r, w_r)
