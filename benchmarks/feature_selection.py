"""Choose the learned models' features by leave-one-GPU-out validation.

    python -m benchmarks.feature_selection --group matmul --drop 6 --add l2
    python -m benchmarks.feature_selection --group elementwise --drop 6
    python -m benchmarks.feature_selection --group matmul --no-extra   # the five GPUs alone
    python -m benchmarks.feature_selection --group conv --no-board-levels

For one model group, trains on four GPUs and scores the fifth's *training*
shapes (never the test split), for each of the five GPUs, with the features of
``predictor.kernels.features`` as they are, with some columns zeroed
(``--drop``), or with candidate columns appended (``--add``). Prints the MAPE
per held-out GPU and per op, and the mean over held-out GPUs without the
power-throttled P4, the number the feature set was chosen by. Every training
set also holds the rows of the shipped weights' measured-kernel files (the
H200's, ``benchmarks.regression.EXTRA``; ``--no-extra`` leaves them out).

The held-out GPU is priced as the shipped weights price a GPU outside the
data: for the matmul and conv groups, the network's time times the median of
the training GPUs' offsets from it (``train.chip_corrections``, "other GPUs";
before 5 Dec 2026 this harness scored the network alone). ``--board-levels``
/ ``--no-board-levels`` fit the networks with or without a level per GPU
(``train.fit_group``'s `boards`; default: as the shipped recipe does for the
group, ``train.LEVEL_GROUPS``).

``--host-floors`` fits a floor per measuring machine (GPU file) rather than
one per timing harness, the held-out GPU getting the others' median;
``--oracle-floor`` is a bound: the held-out GPU at its own machine's floor,
fitted on its own rows.

``--oracle-dram`` is a bound, not a candidate: memory-bound rows get their
ideal time (and feature 1) at each GPU's own highest sustained DRAM fraction
(``benchmarks.accuracy.dram_fractions``, working sets of 16x the L2 and more)
instead of the spec sheet's bandwidth. It reads the held-out GPU's own data,
so it says how much a perfectly known per-GPU achievable bandwidth (a
published STREAM figure, say) could give at most.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from benchmarks import tiles as tiles_bench
from benchmarks.regression import add_extra_arguments, extra_files
from benchmarks.accuracy import _gpu_arrays, dram_fractions, family_of
from predictor import hardware
from predictor.calibration import datasets as D
from predictor.calibration import train as T
from predictor.kernels import features
from predictor.kernels import layout as L
from predictor.kernels.work import flops_and_elems, gemm_shape


def _gpu_column(s: D.OpSamples, col: int) -> np.ndarray:
    feats, index = _gpu_arrays(s)
    return feats[index, col]


# Base clocks (MHz) of the training boards the spec database has none for, for
# the "headroom" candidate only: TechPowerUp's GPU database as third-party
# listings quote it (P100 PCIe 16 GB: base 1190 / boost 1329; A100 PCIe: base
# 765 / boost 1410; V100 PCIe: base 1245 / boost 1380, the 16 GB board's, the
# 32 GB one runs the same boost). The P4's and T4's are in specs/gpus.toml.
BASE_CLOCK_MHZ = {"P100-PCIE-16GB": 1190, "V100-PCIE-32GB": 1245, "A100-PCIE-40GB": 765,
                  "A100-PCIE-80GB": 1065}


def _spec_value(gpu_id: str, key: str):
    spec = hardware.get(gpu_id).spec
    if key == "base_clock_mhz" and key not in spec:
        return BASE_CLOCK_MHZ[gpu_id]
    return spec[key]


def _spec_column(s: D.OpSamples, key: str, kind=float) -> np.ndarray:
    """A spec-sheet field of each sample's GPU."""
    values = {g: kind(_spec_value(g, key)) for g in set(s.gpu)}
    return np.array([values[g] for g in s.gpu], dtype=np.float64)


def _nbytes(s: D.OpSamples) -> np.ndarray:
    return np.array([flops_and_elems(int(f), d)[1] * 4.0 for f, d in zip(s.family, s.dims)])


# Candidate columns, computed from the samples (fp32 throughout).
CANDIDATES = {
    # Working set against the L2 cache, log2.
    "l2": lambda s: np.log2(np.maximum(_nbytes(s), 1.0)
                            / (_gpu_column(s, L.G_L2_MB) * 1048576.0)),
    # Board power, clamped to 50-250 W, log2 of the fraction of 250 W.
    "power": lambda s: np.log2(np.clip(_gpu_column(s, L.G_TDP_W), 50.0, 250.0) / 250.0),
    # Board power per peak FP32 TFLOP/s, log2: how far a power cap holds the
    # clock below boost under full load.
    "wpf": lambda s: np.log2(_gpu_column(s, L.G_TDP_W) / _gpu_column(s, L.G_FP32_TFLOPS)),
    # Clock headroom under the power cap, log2 of base over boost clock: the
    # clock a board guarantees at its TDP under full load, against the one
    # its peak FLOP/s are quoted at.
    "headroom": lambda s: np.log2(_spec_column(s, "base_clock_mhz")
                                  / _gpu_column(s, L.G_CLOCK_MHZ)),
    # 1 from Volta on (compute capability 7.0+: an INT32 pipe beside the FP32
    # one, so address arithmetic does not take FMA issue slots; global loads
    # cached in L1), else 0: one minus the GPU column layout.G_PRE_VOLTA,
    # which the softmax and layer-norm networks read as feature 13 (there,
    # ``--drop 13`` is the set without it).
    "sm70": lambda s: 1.0 - _gpu_column(s, L.G_PRE_VOLTA),
    # 1 where the DRAM is HBM behind a memory controller of Volta or later,
    # else 0 (GDDR boards, and the P100's HBM2 behind Pascal's controller):
    # the training kernels' highest sustained fraction of the spec sheet's
    # bandwidth is 0.86-0.91 on the first kind, 0.75-0.77 on the second
    # (`python -m benchmarks.accuracy --bandwidth`).
    "hbmv": lambda s: _spec_column(s, "memory_type", lambda t: float(str(t).startswith("HBM")))
                      * (1.0 - _gpu_column(s, L.G_PRE_VOLTA)),
    # FP32 lanes per SM over 64, log2: shared-memory bandwidth per SM is 128
    # bytes a clock on every NVIDIA GPU since Maxwell, so a 128-lane SM has
    # half the operand bandwidth per FMA of a 64-lane one.
    "lanes": lambda s: np.log2(_spec_column(s, "fp32_cores_per_sm") / 64.0),
    # A power cap's hold on long kernels: log2 of board power (clamped to
    # 50-250 W) over 250 W, times how far the kernel's ideal compute time
    # runs past 1 ms (log2, 0 below). The 70-75 W boards' GEMM efficiency
    # falls once a kernel runs for milliseconds (`python -m
    # benchmarks.accuracy --duration`); every 250 W board's rises. 0 for
    # boards of 250 W and more, and for short kernels.
    "throttle": lambda s: (np.log2(np.clip(_gpu_column(s, L.G_TDP_W), 50.0, 250.0) / 250.0)
                           * np.maximum(T.features(s)[0][:, 0] - 10.0, 0.0)),
    # DRAM bytes each SM must have served per clock to hold the bandwidth,
    # log2 (bandwidth over SMs x boost clock): by Little's law the loads an SM
    # keeps in flight bound what a memory-bound kernel sustains.
    "bwsm": lambda s: np.log2(_gpu_column(s, L.G_MEM_BW_GBS) * 1e9
                              / (_gpu_column(s, L.G_SMS) * _gpu_column(s, L.G_CLOCK_MHZ) * 1e6)),
    # The ridge point (peak FLOP/s over bandwidth), log2 flop/byte.
    "ridge": lambda s: np.log2(_gpu_column(s, L.G_FP32_TFLOPS) * 1e3
                               / _gpu_column(s, L.G_MEM_BW_GBS)),
    # Under the tile the learned tile rule predicts (kernels.tiles, fitted
    # without the held-out GPU; benchmarks.tiles): how full the last wave is,
    # 1 / waves, and log2 waves capped at 4 (matmul rows only, else 0).
    "tile": lambda s: tiles_bench.predicted_tile_columns(s)[0],
    "tileinv": lambda s: tiles_bench.predicted_tile_columns(s)[1],
    "tilewaves": lambda s: tiles_bench.predicted_tile_columns(s)[2],
    # The last wave's fullness under the tile the kernel name records (an
    # oracle: how much knowing the tile could give at best).
    "truetile": lambda s: tiles_bench.predicted_tile_columns(s, truth=True)[0],
    # NeuSight's per-SM inputs for batched GEMMs under the predicted tile
    # (benchmarks/neusight_method.py): one tile's compute and bytes time on one
    # SM, log2 us (0 for other rows).
    "smtilec": lambda s: tiles_bench.per_sm_tile_columns(s)[0],
    "smtileb": lambda s: tiles_bench.per_sm_tile_columns(s)[1],
    # A convolution's GEMM-dim alignment (columns 11 and 13) with the batch
    # in the pixel dim of its implicit GEMM (M of a forward or dgrad, K of a
    # wgrad), as the features had it before they took one image's alignment
    # (`features.conv_alignment_dims`). Use with --drop 11,13.
    "conv11batch": lambda s: _conv_alignment(s)[0],
    "conv13batch": lambda s: _conv_alignment(s)[1],
    # cuDNN's Winograd F(4x4, 3x3), the algorithm of most of the training
    # convolutions (every one is 3x3, stride 1; the kernel names record fused
    # and non-fused Winograd, implicit GEMM and FFT): log2 of the output-tile
    # quantisation (ceil(P/4) * 4 / P)^2, log2 of the transforms' bytes time
    # over the transformed GEMM's compute time, and log2 of that compute time
    # (us). 0 for other rows. Tried 3 Dec 2026, not shipped (`--group conv`,
    # seed 0 / 1): 22.9 / 23.0 -> winoq,winot 23.0 / 23.5, all three 22.8.
    # The share of the output tiles' area that is the GEMM's output under each
    # candidate tile of `features.TILES` (tile quantisation along m and n): a
    # random shape wastes up to half of it, an aligned one none, and an
    # aligned shape looks like a lucky random one rather than lying outside
    # the training range as the power-of-two alignment columns (11-13) do.
    "pad32": lambda s: _tile_padding(s, 32, 32),
    "pad64": lambda s: _tile_padding(s, 64, 64),
    "pad128x64": lambda s: _tile_padding(s, 128, 64),
    "pad128": lambda s: _tile_padding(s, 128, 128),
    "pad256": lambda s: _tile_padding(s, 256, 128),
    # NeuSight's per-SM inputs for convolutions: one 128 x 128 tile of the
    # implicit GEMM (its reduction whole), its FLOPs over the per-SM fp32 peak
    # and its fp32 bytes over the per-SM DRAM bandwidth, log2 us (0 for other
    # rows). SM by SM, a GPU with more SMs looks like those trained on.
    "smconvc": lambda s: _conv_tile_per_sm(s)[0],
    "smconvb": lambda s: _conv_tile_per_sm(s)[1],
    "winoq": lambda s: _winograd_columns(s)[0],
    "winot": lambda s: _winograd_columns(s)[1],
    "winoc": lambda s: _winograd_columns(s)[2],
}


def _tile_padding(s: D.OpSamples, tm: int, tn: int) -> np.ndarray:
    """The share of a GEMM's output tiles that is the output: m n over the
    tiles' area, under a tm x tn tile (0 for rows that are not GEMMs)."""
    out = np.zeros(len(s))
    for i, (f, d) in enumerate(zip(s.family, s.dims)):
        if f in (L.MATMUL, L.CONV, L.CONV_DGRAD, L.CONV_WGRAD):
            _, m, n, _ = gemm_shape(int(f), d)
            if m > 0 and n > 0:
                out[i] = m * n / (-(-m // tm) * tm * -(-n // tn) * tn)
    return out


def _winograd_columns(s: D.OpSamples) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The "winoq", "winot" and "winoc" candidates of 3x3 stride-1 forward
    convolutions: 36 GEMMs of (tiles x C) @ (C x K), tiles = N ceil(P/4)
    ceil(Q/4); the transforms write and read back 36 values a tile and
    channel on each side, plus the filter's, the input and the output."""
    quant, balance, compute = np.zeros(len(s)), np.zeros(len(s)), np.zeros(len(s))
    peak = _gpu_column(s, L.G_FP32_TFLOPS) * 1e12
    bw = _gpu_column(s, L.G_MEM_BW_GBS) * 1e9
    for i, (f, d) in enumerate(zip(s.family, s.dims)):
        if int(f) != L.CONV or d[5] != 3 or d[10] != 1:
            continue
        n, c, h, w, k, p, q = d[0], d[1], d[2], d[3], d[4], d[7], d[8]
        tiles = n * -(-p // 4) * -(-q // 4)
        quant[i] = np.log2(tiles * 16.0 / (n * p * q))
        flops = 2.0 * 36 * tiles * c * k
        nbytes = 4.0 * (72 * tiles * (c + k) + 36 * c * k + n * c * h * w + n * k * p * q)
        balance[i] = np.log2((nbytes / bw[i]) / (flops / peak[i]))
        compute[i] = np.log2(flops / peak[i] * 1e6)
    return quant, balance, compute


def _conv_tile_per_sm(s: D.OpSamples) -> tuple[np.ndarray, np.ndarray]:
    """The "smconvc" and "smconvb" candidates (0 for rows that are not
    convolutions)."""
    comp, mem = np.zeros(len(s)), np.zeros(len(s))
    peak = _gpu_column(s, L.G_FP32_TFLOPS) * 1e12
    bw = _gpu_column(s, L.G_MEM_BW_GBS) * 1e9
    sms = _gpu_column(s, L.G_SMS)
    for i, (f, d) in enumerate(zip(s.family, s.dims)):
        f = int(f)
        if f not in (L.CONV, L.CONV_DGRAD, L.CONV_WGRAD):
            continue
        _, _, _, k = gemm_shape(f, d)
        flops, nbytes = tiles_bench.tile_work(128, 128, k)
        comp[i] = np.log2(flops / (peak[i] / sms[i]) * 1e6)
        mem[i] = np.log2(nbytes / (bw[i] / sms[i]) * 1e6)
    return comp, mem


def _conv_alignment(s: D.OpSamples) -> tuple[np.ndarray, np.ndarray]:
    """Columns 11 and 13 of GEMM and convolution rows with the whole GEMM
    dims, the batch included (0 for other rows)."""
    c11 = np.zeros(len(s))
    c13 = np.zeros(len(s))
    for i, (f, d) in enumerate(zip(s.family, s.dims)):
        f = int(f)
        if f in (L.CONV, L.CONV_DGRAD, L.CONV_WGRAD, L.MATMUL):
            _, m, _, k = gemm_shape(f, d)
            c11[i] = features._pow2(m)
            c13[i] = features._pow2(k)
    return c11, c13


# Candidate columns computed from the shipped features themselves (column
# numbers as in ``predictor.kernels.features.row_features``).
FROM_FEATURES = {
    # 1 / waves: the tail of the last wave costs a fraction that falls as
    # 1 / waves and vanishes for a big op, where log waves grows without
    # bound and names the GPU (a GPU with fewer SMs has more waves).
    "invwaves": lambda x: np.exp2(-x[:, 5]),
    # SMs per thread block, capped at 1: how much of the GPU one wave leaves
    # idle when there are fewer blocks than SMs, 1 for every big op.
    "invblocks": lambda x: np.minimum(np.exp2(-x[:, 3]), 1.0),
    # log2 waves capped at 4 (16 waves): beyond a few waves the tail is noise.
    "capwaves": lambda x: np.minimum(x[:, 5], 4.0),
    # log2 ideal compute / memory time capped at 2^10 us: past a millisecond
    # launch and ramp-up costs are gone, and a longer time only names a
    # slower GPU.
    "capt0": lambda x: np.minimum(x[:, 0], 10.0),
    "capt1": lambda x: np.minimum(x[:, 1], 10.0),
    # log2 of the longer of the ideal compute and memory times: with column 1
    # dropped, a compute-bound op's inputs no longer carry the GPU's ridge
    # point (compute over memory time), which otherwise tells the GPUs apart.
    "tmax": lambda x: np.maximum(x[:, 0], x[:, 1]),
}


MEMORY_BOUND_GROUPS = (features.G_ELEMENTWISE, features.G_SOFTMAX, features.G_LAYER_NORM)


def own_dram_fractions(data: Path) -> dict[str, float]:
    """Each GPU's highest sustained DRAM bandwidth over its spec sheet's, on
    working sets of 16x its L2 and more (the `accuracy --bandwidth` row)."""
    df = dram_fractions(data)
    return df[df.bytes_over_l2 >= 16.0].groupby("gpu").fraction.max().to_dict()


def model_features(s: D.OpSamples, drop=(), add=(), dram=None, tiles=None):
    x, ideal, group, target = T.features(s, tiles=tiles)
    x = x.copy()
    if dram is not None:
        # Ideal memory time at the GPU's own achievable bandwidth (log2 feature 1).
        f = np.array([dram.get(g, 1.0) for g in s.gpu])
        mb = np.isin(group, MEMORY_BOUND_GROUPS)
        ideal = np.where(mb, ideal / f, ideal)
        x[mb, 1] -= np.log2(f[mb])
    extra = [FROM_FEATURES[a](x)[:, None] if a in FROM_FEATURES else CANDIDATES[a](s)[:, None]
             for a in add]
    x[:, list(drop)] = 0.0
    if extra:
        x = np.concatenate([x] + extra, axis=1)
    return x, ideal, group, target


def other_gpus_offset(model, x, ideal, target, gpus) -> float:
    """The log offset a GPU outside the data gets: the median over the
    training GPUs of each one's median log ratio of measured to predicted
    time (``train.chip_corrections`` per chip; here per GPU, on the rows
    given)."""
    log_ratio = np.log(target / model.times_us(x, ideal))
    gpus = np.asarray(gpus, dtype=str)
    return float(np.median([np.median(log_ratio[gpus == g]) for g in np.unique(gpus)]))


def validate(data: Path, group: int, *, drop=(), add=(), seed: int = 0, epochs: int = 60,
             log=print, head: str = "sigmoid", ensemble: int = 1,
             oracle_dram: bool = False, extra=(),
             board_levels: bool | None = None,
             host_floors: bool = False,
             oracle_floor: bool = False) -> dict[str, dict[str, float]]:
    """MAPE % per held-out GPU and op. `ensemble` > 1: the shipped recipe,
    that many networks distilled into one (``train.fit_distilled``; sigmoid
    head only); 1: a single network, about ensemble + 2 times faster.
    `extra`: measured-kernel files (``benchmarks.measure_kernels``) whose rows
    join every training set, as the shipped weights are trained; their GPUs
    are not held out (the five of the shared data are). `board_levels`: fit
    the networks with a level per GPU (``train.fit_group``'s `boards`);
    None, as the shipped recipe does for the group (``train.LEVEL_GROUPS``).
    The held-out GPU is priced by the level-free network times the median of
    the training GPUs' offsets from it, as a GPU outside the data is
    (``train.chip_corrections``, "other GPUs")."""
    train = D.load_train(data)
    five = sorted(set(train.gpu))
    if extra:
        train = D.OpSamples.concat([train, D.load_measured(extra, log=log)])
    tiles_bench.DATA[0] = Path(data)
    dram = own_dram_fractions(data) if oracle_dram else None
    featurize = lambda s: model_features(s, drop, add, dram)  # noqa: E731
    if board_levels is None:
        board_levels = group in T.LEVEL_GROUPS
    own_floor = None
    if oracle_floor:
        # A bound: every host's own floor, from one fit on every GPU's rows
        # (the held-out GPU's included), the networks of the folds fitted
        # with a floor per host.
        host_floors = True
        xa, ia, ga, ta = model_features(train, drop, add, dram, T.tile_rule(train)) \
            if group == features.G_BMM else featurize(train)
        ma = ga == group
        own_floor = T.fit_group(group, xa[ma], ia[ma], ta[ma], seed=seed + group, epochs=epochs,
                                harness=train.harness[ma] if train.harness.any() else None,
                                hosts=train.gpu[ma]).host_floors_us
        log("  each host's own floor (us): " +
            ", ".join(f"{g} {f:.1f}" for g, f in sorted(own_floor.items())))
    out = {}
    for held in five:
        fit_on = train.subset(train.gpu != held)
        ev = train.subset(train.gpu == held)
        if group == features.G_BMM:  # batched GEMMs under the tile rule of the training GEMMs
            tiles = T.tile_rule(fit_on)
            featurize = lambda s: model_features(s, drop, add, dram, tiles)  # noqa: E731
        x, ideal, g, t = featurize(fit_on)
        mask = g == group
        xe, ie, ge, te = featurize(ev)
        em = ge == group
        if mask.sum() < 50 or not em.any():
            continue
        t0 = time.perf_counter()
        if ensemble > 1:
            if head != "sigmoid":
                raise ValueError("the distilled recipe has the sigmoid head only")
            model = T.fit_distilled(group, fit_on.subset(mask), seed=seed, epochs=epochs,
                                    ensemble=ensemble, featurize=featurize,
                                    levels=(group,) if board_levels else ())
        else:
            xm, im, _, _ = featurize(T.doubled(fit_on, seed))
            probes = T.probe_features(group, fit_on.subset(mask), seed, featurize)
            harness = fit_on.harness[mask] if fit_on.harness.any() else None
            model = T.fit_group(group, x[mask], ideal[mask], t[mask], x_more=xm[mask],
                                ideal_more=im[mask], probes=probes, seed=seed + group,
                                epochs=epochs, head=head, harness=harness,
                                boards=fit_on.gpu[mask] if board_levels else None,
                                hosts=fit_on.gpu[mask] if host_floors else None)
        offset = np.exp(other_gpus_offset(model, x[mask], ideal[mask], t[mask], fit_on.gpu[mask])) \
            if group in T.OTHER_CHIPS_GROUPS else 1.0
        pred = model.times_us(xe[em], ie[em])
        if own_floor is None:
            pred = pred * offset
        else:  # the held-out host's own floor for the model's median one
            pred = (pred - model.floor_us) * offset + own_floor[held]
        err = np.abs(pred - te[em]) / te[em] * 100.0
        fams = family_of(ev.op[em])
        out[held] = {f: float(err[fams == f].mean()) for f in sorted(set(fams))}
        # and by time: |predicted - measured| summed over the family's kernels
        # over their measured time, the error of the time they add up to
        out[held].update({f"{f} by time": float(np.abs(pred - te[em])[fams == f].sum()
                                                / te[em][fams == f].sum() * 100.0)
                          for f in sorted(set(fams))})
        log(f"  {held:<16} {time.perf_counter() - t0:5.1f} s  " +
            "  ".join(f"{k} {v:.1f}" for k, v in out[held].items()))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="../shared/data/neusight")
    ap.add_argument("--group", choices=features.GROUP_NAMES, required=True)
    ap.add_argument("--drop", default="", help="feature columns to zero, comma-separated")
    ap.add_argument("--add", default="", help="candidate columns to append: " +
                    ", ".join([*CANDIDATES, *FROM_FEATURES]))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--epochs", type=int, default=60)
    ap.add_argument("--head", choices=("sigmoid", "waves"), default="sigmoid",
                    help="the networks' output: the shipped eta_max * sigmoid, or NeuSight's "
                    "shape eta_max * sigmoid(z0) * (1 - sigmoid(z1) / waves)")
    ap.add_argument("--ensemble", type=int, default=1,
                    help="networks distilled into one, as the shipped weights are trained "
                    f"(train.ENSEMBLE = {T.ENSEMBLE}); default 1, a single network")
    add_extra_arguments(ap)
    ap.add_argument("--board-levels", action=argparse.BooleanOptionalAction, default=None,
                    help="fit the networks with a level per GPU (default: as the shipped "
                         "recipe does for the group, train.LEVEL_GROUPS: " +
                         (", ".join(features.GROUP_NAMES[g] for g in T.LEVEL_GROUPS) or "none") + ")")
    ap.add_argument("--oracle-dram", action="store_true",
                    help="a bound: memory-bound rows priced at each GPU's own highest "
                         "sustained DRAM fraction (reads the held-out GPU's data)")
    ap.add_argument("--host-floors", action="store_true",
                    help="fit a floor per measuring host (GPU) rather than one per timing "
                         "harness; the held-out GPU gets the training hosts' median")
    ap.add_argument("--oracle-floor", action="store_true",
                    help="a bound: --host-floors, and the held-out GPU priced with its own "
                         "host's floor (fitted on its data) for the training hosts' median")
    ap.add_argument("--time-weight", type=float, default=None,
                    help="weigh each sample in the loss by (its time / the median's) to this "
                         "power (default: train.TIME_WEIGHT, the shipped recipe's)")
    args = ap.parse_args(argv)
    if args.time_weight is not None:
        T.TIME_WEIGHT = args.time_weight
    if args.ensemble < 1:
        ap.error("--ensemble must be at least 1")
    if args.ensemble > 1 and args.head != "sigmoid":
        ap.error("--ensemble applies to the sigmoid head only")
    drop = [int(c) for c in args.drop.split(",") if c]
    add = [a for a in args.add.split(",") if a]
    for a in add:
        if a not in CANDIDATES and a not in FROM_FEATURES:
            ap.error(f"unknown candidate {a!r}; choose from "
                     f"{', '.join([*CANDIDATES, *FROM_FEATURES])}")
    group = features.GROUP_NAMES.index(args.group)
    levels = args.board_levels if args.board_levels is not None else group in T.LEVEL_GROUPS
    res = validate(Path(args.data), group, drop=drop, add=add,
                   seed=args.seed, epochs=args.epochs, head=args.head, ensemble=args.ensemble,
                   oracle_dram=args.oracle_dram, extra=extra_files(args),
                   board_levels=levels, host_floors=args.host_floors,
                   oracle_floor=args.oracle_floor)
    keys = sorted({k for r in res.values() for k in r})
    mean = {k: np.mean([r[k] for g, r in res.items() if g != "P4" and k in r]) for k in keys}
    oracle = " oracle-dram" if args.oracle_dram else ""
    print(f"{args.group} drop={drop or '-'} add={add or '-'} head={args.head} ensemble={args.ensemble} seed={args.seed} time-weight={T.TIME_WEIGHT:g}{oracle} board-levels={'on' if levels else 'off'}{' host-floors' if args.host_floors else ''}{' oracle-floor' if args.oracle_floor else ''}: "
          "mean over held-out GPUs except P4: " +
          "  ".join(f"{k} {v:.1f}" for k, v in mean.items()))
    if "P4" in res:
        print("  held-out P4 (not in the mean): " +
              "  ".join(f"{k} {v:.1f}" for k, v in res["P4"].items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
