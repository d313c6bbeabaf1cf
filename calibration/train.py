"""Train the learned per-op efficiency models from measured kernels.

For each model group (matmul, conv, elementwise, softmax, layer norm) a small
network maps the features of ``predictor.kernels.features`` to an efficiency
eta in (0, eta_max]; the predicted time of an isolated op is

    t = floor + ideal_roofline_time / eta

where `floor` is the fixed cost every isolated measurement carries (launch and
event overhead, tens of microseconds in the data; inside a graph the engine
uses the per-kernel launch cost instead). The loss is the squared log ratio of
predicted to measured time, i.e. relative error, the quantity reported.

Each group's shipped network is distilled from an ensemble: ENSEMBLE
networks fitted from different seeds, then one fitted to their geometric
mean on the measured shapes and on the same shapes on every GPU of the spec
database (`fit_distilled`), so that what is predicted for a GPU outside the
data does not hang on one seed. Training uses torch (on CPU, seeded, in
float64 so that another CPU gives the same weights: TRAIN_DTYPE; the
ensemble's fits run side by side, one process per core); prediction uses
only the flat weight array and the numba forward pass in
``predictor.kernels.mlp``.

    predictor train-models --data ../shared/data/neusight --out predictor/weights
"""

from __future__ import annotations

import functools
import json
import multiprocessing
import os
import warnings
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from predictor import hardware
from predictor.opmodel import MAX_CHIP_CORRECTION
from predictor.calibration import tiles as C
from predictor.calibration.datasets import OpSamples, load_train
from predictor.kernels import layout as L
from predictor.kernels.features import (G_BMM, G_CONV, G_MATMUL, GROUP_NAMES, N_FEATURES,
                                        N_GROUPS, feature_table, group_of,
                                        improvement_directions, shift_features)
from predictor.kernels.mlp import (OTHER_CHIPS, HEADER, chip_correction, floor_us, has_group,
                                  layer_offsets)
from predictor.kernels.optime import isolated_times_us
from predictor.kernels.roofline import P_TF32_CONV, default_params

# Winograd and FFT convolutions do up to 2.25x fewer multiplies than the direct
# formula counts for 3x3 filters, so a conv can beat "100 %" of the direct roofline.
ETA_MAX = {G_CONV: 2.5}
HIDDEN = (32, 32)
# Groups whose learned model ships: all. Leave-one-GPU-out on the test
# shapes (python -m benchmarks.accuracy, mean over held-out GPUs except P4)
# puts the learned models ahead of the analytical one for conv (23.0 vs
# 51.2 %), linear (27.3 vs 30.1 %), softmax (21.3 vs 22.7 %) and layer norm
# (20.7 vs 25.1 %) and behind for bmm (32.2 vs 24.7 %) and elementwise (11.3
# vs 10.2 %); a trial with matmul, elementwise and softmax analytical made the
# end-to-end harness much worse (20.8 % / 35.9 % mean error, inference /
# training, against 9.0 % / 10.3 % all learned; see benchmarks/README.md).
# The batched-GEMM group (G_BMM, NeuSight's per-SM inputs) took bmm from 30.0
# to 16.4 % on the same protocol (benchmarks/README.md, "Batched GEMMs: a
# model group of their own").
SHIPPED_GROUPS = tuple(range(N_GROUPS))
MONOTONE_WEIGHT = 50.0
WEIGHTS_FILE = "opmodels.npz"


def training_params() -> np.ndarray:
    """The dataset was measured in fp32 with TF32 off for matmul and conv alike."""
    p = default_params()
    p[P_TF32_CONV] = 0.0
    return p


@dataclass
class GroupModel:
    group: int
    mean: np.ndarray
    std: np.ndarray
    layers: list  # [(W1, b1), (W2, b2), (w3, b3)]
    floor_us: float
    eta_max: float
    # The numbers the group's features need beside the op and the GPU (packed
    # as its auxiliary numbers): the batched-GEMM group's tile rule, the
    # matmul and conv groups' SM range (`sm_range`).
    aux: np.ndarray | None = None
    # The floors of the other timing harnesses (1, 2, ...; `fit_group`); not
    # packed: inside a graph the engine uses no floor.
    harness_floors_us: tuple = ()
    # Each training GPU's level on the network's logit (`fit_group`'s
    # `boards`); not packed: the distilled network learns the measured GPUs
    # at their levels (`fit_distilled_groups`).
    board_levels: dict | None = None
    # Each measuring host's floor (`fit_group`'s `hosts`): {GPU: floor us} of
    # the dataset's harness; not packed (the floor the weights keep is their
    # median).
    host_floors_us: dict | None = None

    def times_us(self, x: np.ndarray, ideal: np.ndarray, level=0.0) -> np.ndarray:
        """The isolated-op time (us) of feature rows `x` with ideal times
        `ideal`, in numpy (any feature width; either output head of
        `fit_group`), on boards of `level` (per row or one; added to the
        logit, as `fit_group` fits `board_levels`). No per-chip correction."""
        z = (x - self.mean) / self.std
        (w1, b1), (w2, b2), (w3, b3) = self.layers
        h = np.tanh(np.tanh(z @ w1.T + b1) @ w2.T + b2)
        if np.ndim(w3) == 2:  # head "waves": eta_max * sigmoid(z0) * (1 - sigmoid(z1) / waves)
            out = h @ w3.T + b3
            waves = np.maximum(np.exp2(x[:, 5]), 1.0)
            eta = (1.0 / (1.0 + np.exp(-(out[:, 0] + level)))) \
                * (1.0 - 1.0 / (1.0 + np.exp(-out[:, 1])) / waves)
        else:
            eta = 1.0 / (1.0 + np.exp(-(h @ w3 + b3 + level)))
        return self.floor_us + ideal / (self.eta_max * eta)

    def flat(self) -> np.ndarray:
        """This group's weights laid out as ``predictor.kernels.mlp.layer_offsets``
        says (from offset 0)."""
        (w1, b1), (w2, b2), (w3, b3) = self.layers
        parts = [np.ravel(p) for p in (self.mean, self.std, w1, b1, w2, b2, w3, b3)]
        *starts, end = layer_offsets.py_func(0, len(self.mean), w1.shape[0], w2.shape[0])
        if [b - a for a, b in zip(starts, [*starts[1:], end])] != [p.size for p in parts]:
            raise ValueError("network shapes do not match the weight layout")
        out = np.empty(end, dtype=np.float64)
        for start, part in zip(starts, parts):
            out[start:start + part.size] = part
        return out


def features(samples: OpSamples, params: np.ndarray | None = None,
             tiles: np.ndarray | None = None):
    """(features, ideal us, group, target us) for measured samples; with a
    GEMM tile rule `tiles`, batched GEMMs as the batched-GEMM group sees them
    (``features.bmm_features``), else as the matmul group does."""
    params = training_params() if params is None else params
    ids = sorted(set(samples.gpu))
    db = hardware.database()
    gpus = db.features([db.get(i) for i in ids])
    index = np.array([ids.index(g) for g in samples.gpu], dtype=np.int64)
    dtype = np.zeros(len(samples), dtype=np.int64)
    rule = np.zeros(0) if tiles is None else np.ascontiguousarray(tiles, dtype=np.float64)
    x, ideal, group = feature_table(samples.family.astype(np.int64), dtype,
                                      np.ascontiguousarray(samples.dims), gpus, index, params,
                                      rule, tiles is not None)
    return x, ideal, group, samples.latency_ms * 1e3


def row_groups(samples: OpSamples, bmm: bool = True) -> np.ndarray:
    """The group of each sample (``features.row_group``): batched GEMMs are
    G_BMM rows where `bmm`, else G_MATMUL rows."""
    families, index = np.unique(samples.family, return_inverse=True)
    group = np.array([group_of(int(f)) for f in families], dtype=np.int64)[index]
    if bmm:
        group[(samples.family == L.MATMUL) & (samples.dims[:, 0] > 1)] = G_BMM
    return group


def doubled(samples: OpSamples, seed: int = 0) -> OpSamples:
    """Each sample with twice the work along one randomly chosen dim (a GEMM
    dim, a conv's batch or channels, or a memory-bound op's element count):
    training penalises predicting such an op faster than the original."""
    rng = np.random.default_rng(seed)
    dims = samples.dims.copy()
    n = len(samples)
    gemm = samples.family == L.MATMUL
    conv = np.isin(samples.family, (L.CONV, L.CONV_DGRAD, L.CONV_WGRAD))
    mem = ~(gemm | conv)
    rows = np.arange(n)
    col = rng.integers(0, 4, n)
    dims[rows[gemm], col[gemm]] *= 2
    conv_cols = np.array([0, 1, 4])[rng.integers(0, 3, n)]  # batch, in or out channels
    dims[rows[conv], conv_cols[conv]] *= 2
    for c in (L.MEM_READ, L.MEM_WRITTEN, L.MEM_FLOPS, L.MEM_OUTER):
        dims[mem, c] *= 2
    return replace(samples, dims=dims)


def gemm_probes(samples: OpSamples, seed: int = 0) -> OpSamples:
    """Unmeasured GEMMs around the measured ones, for the doubled-work penalty
    only: each sample with one of its dims redrawn log-uniformly below its
    value (the data has few GEMMs with a dim under ~20, models have many), and
    half of the `x @ W^T` ones with B untransposed (the data's row-major GEMMs
    are all batched; an unbatched `x @ W` is what GPT-2's Conv1D runs)."""
    rng = np.random.default_rng(seed)
    dims = samples.dims.copy()
    n = len(samples)
    rows = np.arange(n)
    col = rng.integers(0, 4, n)
    top = np.maximum(dims[rows, col], 1).astype(np.float64)
    dims[rows, col] = np.maximum(1, np.exp(rng.uniform(0.0, np.log(top)))).astype(np.int64)
    flip = rng.random(n) < 0.5
    dims[flip, L.GEMM_LAYOUT] = 0
    return replace(samples, dims=dims)


# The arithmetic of training. In float32 the weights depend on the CPU that
# fits them: torch picks its kernels by instruction set (AVX2, AVX-512), whose
# sums round differently, and a 60-epoch fit grows those last bits into
# weight differences of 0.17 (the same data, seed and code, on one machine
# with ATEN_CPU_CAPABILITY=avx2 against its default AVX-512 path). In float64
# the rounding is 2**29 times finer.
TRAIN_DTYPE = "float64"


def fit_group(group: int, x: np.ndarray, ideal: np.ndarray, target_us: np.ndarray, *,
              x_more: np.ndarray | None = None, ideal_more: np.ndarray | None = None,
              probes: tuple | None = None, harness: np.ndarray | None = None,
              seed: int = 0, epochs: int = 60, hidden=HIDDEN, batch: int = 2048,
              progress=None, head: str = "sigmoid", boards=None, hosts=None) -> GroupModel:
    """Fit one group's network and floor by minimising squared log error.

    `harness`: per sample, the timing harness that measured it
    (``OpSamples.harness``); each has a floor of its own, since the fixed cost
    of a measurement belongs to how it was timed, not to the kernel. The
    model keeps the dataset's (harness 0) as `floor_us`, the others in
    `harness_floors_us`.

    `x_more`, `ideal_more`: the same samples with twice the work (see
    `doubled`); predictions for them must not be faster. `probes`: (x, ideal,
    x_more, ideal_more) of unmeasured ops, one per sample, under the same
    doubled-work penalty (see `gemm_probes`).

    `head`: "sigmoid", the shipped output, eta = eta_max * sigmoid(z); or
    "waves" (benchmarks.feature_selection only: not packable), NeuSight's
    shape of a utilisation that one wave's start-up lowers, eta = eta_max *
    sigmoid(z0) * (1 - sigmoid(z1) / waves), waves from feature 5 (log2).

    `boards`: per sample, the GPU that measured it. Given, each GPU gets a
    level of its own, a bias on the network's logit fitted beside it, and the
    returned network is the median board's (its levels in `board_levels`):
    the network learns what the shapes do on every GPU, the levels what sets one board apart
    (its sustained clock, its library's kernels), which no input can tell it
    for a GPU it has not seen (see LEVEL_GROUPS).

    `hosts`: per sample, the GPU (and so the machine) that measured it.
    Given, each harness gets a floor per host: a measurement's fixed cost is
    the machine's as much as the harness's (the dataset's smallest softmax
    kernels take 33 us on the A100's, P4's and T4's, 40 on the V100's and 57
    on the P100's), and a floor shared by all hosts leaves the network to
    explain a slow floor as a slow GPU. The model keeps each harness's median
    host floor; a host outside the data gets that. Not the shipped recipe
    (benchmarks/README.md, "The measuring host's floor")."""
    import torch

    if head not in ("sigmoid", "waves"):
        raise ValueError(f"unknown output head {head!r}; choose sigmoid or waves")
    # One thread: these networks are too small for intra-op parallelism to pay,
    # and on a busy machine OpenMP's spinning threads slow training a hundredfold.
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    dt = getattr(torch, TRAIN_DTYPE)
    rng = np.random.default_rng(seed)
    mean = x.mean(axis=0)
    std = x.std(axis=0)
    std[std < 1e-6] = 1.0
    eta_max = ETA_MAX.get(group, 1.0)
    xt = torch.tensor((x - mean) / std, dtype=dt)
    it = torch.tensor(ideal, dtype=dt)
    yt = torch.tensor(np.log(target_us), dtype=dt)
    # Feature-space steps of "this GPU, better" (see features.improvement_directions).
    # (Extra columns past N_FEATURES, candidates in benchmarks.feature_selection, stay put.)
    better = [(torch.tensor((shift_features(x, np.pad(v, (0, x.shape[1] - len(v)))) - mean)
                            / std, dtype=dt), sc, sm)
              for v, sc, sm in improvement_directions()]
    # The compute and memory parts of the ideal time, recovered from features 0 and 1.
    t_c = torch.tensor(np.exp2(x[:, 0]), dtype=dt)
    t_m = torch.tensor(np.exp2(x[:, 1]), dtype=dt)
    if x_more is not None:
        xm = torch.tensor((x_more - mean) / std, dtype=dt)
        im = torch.tensor(ideal_more, dtype=dt)
    if probes is not None:
        xp, ip, xpm, ipm = (torch.tensor((v - mean) / std if v.ndim == 2 else v,
                                         dtype=dt) for v in probes)
    h1, h2 = hidden
    net = torch.nn.Sequential(torch.nn.Linear(x.shape[1], h1), torch.nn.Tanh(),
                              torch.nn.Linear(h1, h2), torch.nn.Tanh(),
                              torch.nn.Linear(h2, 2 if head == "waves" else 1)).to(dt)
    log_waves_mean, log_waves_std = float(mean[5]), float(std[5])
    harness = np.zeros(len(x), np.int64) if harness is None else np.asarray(harness, np.int64)
    n_harness = int(harness.max()) + 1
    # One floor per (harness, host) where hosts are given, else per harness.
    if hosts is not None:
        host_names, host_code = np.unique(np.asarray(hosts, dtype=str), return_inverse=True)
        pairs, floor_of = np.unique(np.stack([harness, host_code], axis=1), axis=0,
                                    return_inverse=True)
        floor_of = floor_of.ravel()
        floor_harness, floor_host = pairs[:, 0], host_names[pairs[:, 1]]
    else:
        floor_of, floor_harness = harness, np.arange(n_harness)
    hidx = torch.tensor(floor_of.astype(np.int64))
    # Each floor starts below its harness's fastest measurements.
    floor_raw = torch.nn.Parameter(torch.tensor([float(np.log(np.expm1(max(np.percentile(
        target_us[floor_of == h] if (floor_of == h).any() else target_us, 1) * 0.8, 1.0))))
        for h in range(len(floor_harness))], dtype=dt))
    params = list(net.parameters()) + [floor_raw]
    if boards is not None:
        names, codes = np.unique(np.asarray(boards, dtype=str), return_inverse=True)
        board_idx = torch.tensor(codes.astype(np.int64))
        level = torch.nn.Parameter(torch.zeros(len(names), dtype=dt))
        params.append(level)
    # Each sample's weight in the loss: its measured time over the median's,
    # to the power TIME_WEIGHT (0: every kernel alike), mean 1.
    if TIME_WEIGHT:
        w = (target_us / np.median(target_us)) ** TIME_WEIGHT
        wt = torch.tensor(w / w.mean(), dtype=dt)
    opt = torch.optim.Adam(params, lr=3e-3)
    n = len(xt)
    steps = max(1, epochs * ((n + batch - 1) // batch))
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=steps)

    def predicted(xs, ideal_s, floor, level=0.0):
        """The model's time (us) of ops with normalised features `xs`, on
        boards of level `level` (added to the network's logit)."""
        z = net(xs)
        if head == "waves":
            waves = torch.exp2(xs[:, 5] * log_waves_std + log_waves_mean)
            eta = torch.sigmoid(z[:, 0] + level) \
                * (1.0 - torch.sigmoid(z[:, 1]) / torch.clamp(waves, 1.0))
        else:
            eta = torch.sigmoid(z.squeeze(-1) + level)
        return floor + ideal_s / (eta_max * eta)

    def not_above(t, limit):
        """Penalty on `t` exceeding `limit` (the monotonicity constraints)."""
        return MONOTONE_WEIGHT * torch.relu(torch.log(t) - torch.log(limit)).mean()

    step = 0
    for _ in range(epochs):
        order = torch.tensor(rng.permutation(n))
        for s in range(0, n, batch):
            idx = order[s:s + batch]
            floor = torch.nn.functional.softplus(floor_raw)[hidx[idx]]
            bias = (level - level.mean())[board_idx[idx]] if boards is not None else 0.0
            pred = predicted(xt[idx], it[idx], floor, bias)
            sq = (torch.log(pred) - yt[idx]) ** 2
            loss = (sq * wt[idx]).mean() if TIME_WEIGHT else sq.mean()
            # The same op on a better GPU must not be predicted slower.
            for x_better, sc, sm in better:
                ideal2 = torch.maximum(t_c[idx] * sc, t_m[idx] * sm)
                loss = loss + not_above(predicted(x_better[idx], ideal2, floor, bias), pred)
            # Twice the work must not be predicted faster.
            if x_more is not None:
                loss = loss + not_above(pred, predicted(xm[idx], im[idx], floor, bias))
            if probes is not None:
                loss = loss + not_above(predicted(xp[idx], ip[idx], floor, bias),
                                        predicted(xpm[idx], ipm[idx], floor, bias))
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            step += 1
        if progress is not None:
            progress()
    lin = [m for m in net if isinstance(m, torch.nn.Linear)]
    # An input at its training mean (0 once normalised) in every row the
    # loss saw never moved its first-layer weights off their random start:
    # they shaped no fitted time, yet a row that differs there at prediction
    # would be priced through them (the conv data holds only 3x3 stride-1
    # kernels, so a 1x1 or strided convolution's kernel-size and stride
    # inputs met random weights: ResNet-50's convolutions 3-6 % off by
    # chance). Zeroed, the network answers every training row exactly as
    # fitted and ignores what its data never varied.
    seen = [xt, *(v[0] for v in better)]
    if x_more is not None:
        seen.append(xm)
    if probes is not None:
        seen += [xp, xpm]
    unseen = ~torch.stack([v.abs().amax(dim=0) > 1e-9 for v in seen]).any(dim=0)
    with torch.no_grad():
        lin[0].weight[:, unseen] = 0.0
    layers = [(lin[0].weight.detach().double().numpy(), lin[0].bias.detach().double().numpy()),
              (lin[1].weight.detach().double().numpy(), lin[1].bias.detach().double().numpy()),
              (lin[2].weight.detach().double().numpy().ravel(),
               float(lin[2].bias.detach().double().numpy()[0]))] if head != "waves" else \
        [(m.weight.detach().double().numpy(), m.bias.detach().double().numpy()) for m in lin]
    floors = [float(f) for f in torch.nn.functional.softplus(floor_raw).detach()]
    host_floors = None
    if hosts is not None:
        host_floors = {str(name): f for name, f, h in zip(floor_host, floors, floor_harness)
                       if h == 0}
        floors = [float(np.median([f for f, fh in zip(floors, floor_harness) if fh == h]))
                  if (floor_harness == h).any() else 1.0 for h in range(n_harness)]
    board_levels = None
    if boards is not None:
        # The returned network is the median board's: the logit's constant
        # moves from the levels into the output bias, exactly.
        lv = (level - level.mean()).detach().double().numpy()
        mid = float(np.median(lv))
        w3, b3 = layers[2]
        if head == "waves":
            b3 = b3.copy()
            b3[0] += mid
        else:
            b3 += mid
        layers[2] = (w3, b3)
        board_levels = {str(n): float(v - mid) for n, v in zip(names, lv)}
    return GroupModel(group, mean, std, layers, floors[0], eta_max,
                      harness_floors_us=tuple(floors[1:]), board_levels=board_levels,
                      host_floors_us=host_floors)


# Groups whose ensemble networks are fitted with a level per GPU (`fit_group`'s
# `boards`): none. Tried for the GEMM, batched-GEMM and convolution groups
# (benchmarks/README.md, "A level per board, fitted beside the networks"):
# leave-one-GPU-out on the held-out GPUs' training shapes preferred it
# (`python -m benchmarks.feature_selection --group G --board-levels`), but
# through the regression gate the end-to-end figures did not improve (all
# labels leave-one-GPU-out 10.40 -> 10.54 %) and the in-distribution ones got
# worse (4.57 -> 5.33 %, 90th percentile 8.2 -> 11.6 %).
LEVEL_GROUPS: tuple = ()

# The loss weighs a sample by (its time / the median's) ** TIME_WEIGHT: 0,
# every kernel alike.
TIME_WEIGHT = 0.0

# Networks fitted per group, each from its own seed, before distillation.
# Networks fitted to a few GPUs agree where the data is and disagree where a
# GPU lies outside it: a single network's leave-one-GPU-out error moves with
# its seed (held-out P4 softmax 10.9-42.0 % over seeds 0-4), and the mean of
# several is steadier (benchmarks/README.md, "Ensembles distilled into one
# network").
ENSEMBLE = 4
# Rows per GPU of the spec database on which the shipped network is fitted to
# the ensemble's mean (see `fit_distilled`).
DISTIL_ROWS_PER_GPU = 600


def training_workers() -> int:
    """Processes that fit an ensemble's networks side by side: one per core,
    or PREDICTOR_TRAIN_WORKERS."""
    try:
        return max(1, int(os.environ.get("PREDICTOR_TRAIN_WORKERS", "") or os.cpu_count() or 1))
    except ValueError:
        return max(1, os.cpu_count() or 1)


# The GPUs of the spec database the distillation draws its rows on: the
# database when the recipe was fixed (Pascal to Blackwell, and CDNA 1-3).
# Fixed, so that a GPU joining the database (the RTX 5090 and others on 5 Dec
# 2026, or a user's --spec) changes no op model and no figure: with the
# whole database, each new GPU changed every draw after it (benchmarks/
# README.md, "The shipped weights, retrained"). A deliberate retrain may
# widen it; the weights, the regression figures and this list move together.
DISTIL_GPUS = (
    "P4", "P100-PCIE-16GB", "P100-SXM2-16GB", "T4", "V100-PCIE-16GB", "V100-PCIE-32GB",
    "V100S-PCIE-32GB", "V100-SXM2-16GB", "V100-SXM2-32GB", "A10", "A10G", "A40", "RTX-3090",
    "RTX-A6000", "RTX-A5000", "A30", "A100-PCIE-40GB", "A100-PCIE-80GB", "A100-SXM4-40GB",
    "A100-SXM4-80GB", "L4", "L40S", "L40", "RTX-4090", "RTX-6000-ADA", "H100-PCIE-80GB",
    "H100-SXM5-80GB", "H200-SXM-141GB", "B200", "MI100", "MI210", "MI250", "MI250X", "MI300X",
)


def spec_gpu_rows(samples: OpSamples, per_gpu: int, seed: int = 0) -> OpSamples:
    """`per_gpu` of the shapes of `samples`, drawn at random, on each GPU of
    DISTIL_GPUS (not measured: latency NaN)."""
    rng = np.random.default_rng(seed)
    parts = []
    for gid in DISTIL_GPUS:
        idx = rng.choice(len(samples), size=min(per_gpu, len(samples)), replace=False)
        sub = samples.subset(np.sort(idx))
        parts.append(replace(sub, gpu=np.full(len(sub), gid, dtype=object),
                             latency_ms=np.full(len(sub), np.nan)))
    return OpSamples.concat(parts)


def probe_features(group: int, samples: OpSamples, seed: int, featurize) -> tuple | None:
    """The doubled-work probes of `fit_group` for a group's samples (GEMMs only)."""
    if group != G_MATMUL:
        return None
    probe = gemm_probes(samples, seed)
    x_p, ideal_p, _, _ = featurize(probe)
    x_pm, ideal_pm, _, _ = featurize(doubled(probe, seed + 1))
    return x_p, ideal_p, x_pm, ideal_pm


def fit_distilled(group: int, samples: OpSamples, *, seed: int = 0, epochs: int = 60,
                  ensemble: int = ENSEMBLE, featurize=None, progress=None,
                  levels=LEVEL_GROUPS) -> GroupModel:
    """One group's network: `ensemble` networks fitted to the measurements
    of `samples` (all of this group) from different seeds, then one network
    of the same size fitted to their geometric mean, on the measured shapes
    and on the same shapes on every GPU of the spec database
    (`spec_gpu_rows`). The ensemble's mean is what generalises; the one
    network keeps prediction as fast as a single network's. The GPUs of the
    spec database enter through their spec-sheet features only (no
    measurement of theirs), so that the distilled network follows the
    ensemble where the GPUs users ask about lie, not just where the data is.
    `featurize`: samples -> (features, ideal, group, target), `features` by
    default. `ensemble=1` is a single network (no distillation)."""
    return fit_distilled_groups([(group, samples, featurize)], seed=seed, epochs=epochs,
                                ensemble=ensemble, progress=progress, levels=levels)[group]


def fit_distilled_groups(plan, *, seed: int = 0, epochs: int = 60, ensemble: int = ENSEMBLE,
                         progress=None, levels=LEVEL_GROUPS) -> dict[int, GroupModel]:
    """`fit_distilled` for several groups, `plan` [(group, samples,
    featurize)]. The ensemble's networks of the groups in `levels` are fitted
    with a level per GPU (`fit_group`'s `boards`); the distilled network
    learns their mean with the measured GPUs at their levels and every other
    GPU at the median board's (`at_board_levels`). Every fit of every group
    runs on one pool of processes (`training_workers`): the ensembles' networks first, then each group's
    distilled network as its ensemble is done, so that no core waits while
    one group distils. Each fit is seeded and single-threaded, so the result
    does not depend on where or in which order it runs."""
    def finished():
        if progress is not None:
            for _ in range(epochs):
                progress()

    prepared = []
    for group, samples, featurize in plan:
        featurize = featurize or features
        x, ideal, _, target = featurize(samples)
        x_more, ideal_more, _, _ = featurize(doubled(samples, seed))
        probes = probe_features(group, samples, seed, featurize)
        harness = samples.harness if samples.harness.any() else None
        boards = samples.gpu if group in levels else None
        fits = [dict(x_more=x_more, ideal_more=ideal_more, probes=probes, harness=harness,
                     seed=seed + group + 101 * k, epochs=epochs, boards=boards)
                for k in range(ensemble)]
        prepared.append((group, samples, featurize, (x, ideal, target), fits))

    def distill_inputs(group, samples, featurize, teachers):
        # The teachers' times carry the dataset harness's floor (`times_us`),
        # so the distilled network learns every row in that one convention.
        both = OpSamples.concat([samples, spec_gpu_rows(samples, DISTIL_ROWS_PER_GPU, seed)])
        xa, ia, _, _ = featurize(both)
        ta = np.exp(np.mean([np.log(at_board_levels(t, xa, ia, both.gpu)) for t in teachers],
                            axis=0))
        xam, iam, _, _ = featurize(doubled(both, seed))
        return (group, xa, ia, ta), dict(x_more=xam, ideal_more=iam,
                                         probes=probe_features(group, both, seed, featurize),
                                         seed=seed + group, epochs=epochs)

    workers = min(ensemble * len(plan), training_workers())
    if workers > 1 and "fork" in multiprocessing.get_all_start_methods():
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
            teacher_jobs = [[pool.submit(fit_group, group, *data, **kw) for kw in fits]
                            for group, _, _, data, fits in prepared]
            out, distil_jobs, teachers_of = {}, {}, {}
            for (group, samples, featurize, _, _), jobs in zip(prepared, teacher_jobs):
                teachers = [job.result() for job in jobs]
                for _ in teachers:
                    finished()
                if ensemble == 1:
                    out[group] = teachers[0]
                    continue
                args, kw = distill_inputs(group, samples, featurize, teachers)
                distil_jobs[group] = pool.submit(fit_group, *args, **kw)
                teachers_of[group] = teachers
            for group, job in distil_jobs.items():
                out[group] = with_harness_floors(job.result(), teachers_of[group])
                finished()
        return out
    out = {}
    for group, samples, featurize, data, fits in prepared:
        teachers = [fit_group(group, *data, progress=progress, **kw) for kw in fits]
        if ensemble == 1:
            out[group] = teachers[0]
            continue
        args, kw = distill_inputs(group, samples, featurize, teachers)
        out[group] = with_harness_floors(fit_group(*args, progress=progress, **kw), teachers)
    return out


def at_board_levels(model: GroupModel, x: np.ndarray, ideal: np.ndarray, gpus) -> np.ndarray:
    """`model.times_us` with each row at its GPU's level where the model has
    one (`board_levels`), a board of a levelled chip at that chip's: what
    the distilled network learns, so that the GPUs of the data keep their
    own levels (the per-chip corrections then measure little) and every
    other GPU gets the median board's network."""
    if not model.board_levels:
        return model.times_us(x, ideal)
    db = hardware.database()
    chip_of = {g: float(db.get(g).features[L.G_CHIP]) for g in set(gpus) | set(model.board_levels)}
    by_chip = {}
    for g, v in model.board_levels.items():
        by_chip.setdefault(chip_of[g], []).append(v)
    names, rows = np.unique(np.asarray(gpus, dtype=str), return_inverse=True)
    per_gpu = np.array([model.board_levels.get(g, float(np.mean(by_chip.get(chip_of[g], [0.0]))))
                        for g in names])
    return model.times_us(x, ideal, per_gpu[rows])


def with_harness_floors(student: GroupModel, teachers: list[GroupModel]) -> GroupModel:
    """The distilled `student` with its teachers' mean floor per other timing
    harness (the student learns the dataset harness's times only)."""
    floors = [t.harness_floors_us for t in teachers if t.harness_floors_us]
    if floors:
        student.harness_floors_us = tuple(float(f) for f in np.mean(floors, axis=0))
    return student


def pack(models: dict[int, GroupModel],
         corrections: dict[int, dict[float, float]] | None = None) -> np.ndarray:
    """The flat weight array read by ``predictor.kernels.mlp``; `corrections`:
    per group, {chip key: log time correction} (see `chip_corrections`)."""
    corrections = corrections or {}
    header = np.zeros(1 + HEADER * N_GROUPS)
    header[0] = N_GROUPS
    body = []
    offset = len(header)
    for g in range(N_GROUPS):
        m = models.get(g)
        if m is None:
            continue
        flat = m.flat()
        h = 1 + HEADER * g
        header[h:h + 6] = (offset, len(m.mean), m.layers[0][0].shape[0],
                           m.layers[1][0].shape[0], m.eta_max, m.floor_us)
        body.append(flat)
        offset += len(flat)
    for g in range(N_GROUPS):
        table = corrections.get(g)
        if g not in models or not table:
            continue
        pairs = np.array([v for chip in sorted(table) for v in (chip, table[chip])])
        h = 1 + HEADER * g
        header[h + 6:h + 8] = (offset, len(table))
        body.append(pairs)
        offset += len(pairs)
    for g, m in models.items():
        if m.aux is not None and len(m.aux):
            h = 1 + HEADER * g
            header[h + 8:h + 10] = (offset, len(m.aux))
            body.append(np.asarray(m.aux, dtype=np.float64))
            offset += len(m.aux)
    return np.concatenate([header, *body]) if body else header


# A chip needs this many measured kernels of a group for its own correction.
MIN_CHIP_SAMPLES = 50
# Chips outside the data get the median of the training chips' corrections
# (``kernels.mlp.chip_correction``) where at least this many chips have one,
# in the groups where leave-one-GPU-out validation preferred that to none
# (held-out GPUs' test shapes, mean except P4, seed 0, with it in all five
# groups: linear 27.3 -> 27.2, bmm 30.5 -> 30.4, conv 23.0 -> 22.8 %; not for
# elementwise 11.3 -> 11.9, softmax 21.3 -> 22.5, layer norm 20.7 -> 24.5;
# shipped for the two, end to end 16.8 -> 16.5 %).
MIN_CHIPS_FOR_OTHERS = 3
OTHER_CHIPS_GROUPS = (G_MATMUL, G_CONV)


def chip_corrections(samples: OpSamples, mlp: np.ndarray,
                     harness_floors: dict | None = None) -> dict[int, dict[float, float]]:
    """Per group and chip of the training data, the chip's systematic log time
    offset from the networks (which see no feature naming the GPU): the median
    of log((measured - floor) / (predicted - floor)) over the chip's kernels
    that take at least twice the floor. A median, so that a few odd
    measurements do not move it; unweighted, since weighting by time hands the
    offset to a handful of the largest kernels of the sweep (P100 GEMMs: +0.38
    time-weighted against +0.07 unweighted). Boards of one chip pool their
    kernels (``hardware.chip_key``). Under the key OTHER_CHIPS, for every chip
    outside the data, see `with_other_chips`.

    Each network's offset is measured over the rows it was fitted on: the
    matmul network's over every GEMM, batched ones included, since it prices
    both operand layouts (an unbatched `x @ W` from the batched rows, the
    data's only `*_nn` kernels) though the batched-GEMM network prices the
    batched rows themselves. A row of another timing harness
    (``OpSamples.harness``) takes that harness's floor, `harness_floors`
    {group: (floor of harness 1, ...)}, for the measured side."""
    ids = sorted(set(samples.gpu))
    db = hardware.database()
    gpus = db.features([db.get(i) for i in ids])
    index = np.array([ids.index(g) for g in samples.gpu], dtype=np.int64)
    chip = gpus[index, L.G_CHIP]

    def predicted_us(weights):
        return isolated_times_us(samples.family.astype(np.int64),
                                 np.zeros(len(samples), np.int64),
                                 np.ascontiguousarray(samples.dims), gpus, index,
                                 training_params(), weights)

    served = predicted_us(mlp)
    meas_us = samples.latency_ms * 1e3
    fitted_on = row_groups(samples, bmm=False)
    batched = row_groups(samples, bmm=True) == G_BMM
    out: dict[int, dict[float, float]] = {}
    for g in range(N_GROUPS):
        if not len(mlp) or mlp[1 + HEADER * g] == 0:
            continue
        rows = batched if g == G_BMM else fitted_on == g
        pred_us = served
        if g == G_MATMUL and has_group(mlp, G_BMM):
            without_bmm = mlp.copy()
            without_bmm[1 + HEADER * G_BMM] = 0  # every GEMM by the matmul network
            pred_us = predicted_us(without_bmm)
        floor = floor_us(mlp, g)
        # Each row's measured side loses its own harness's floor.
        floors = np.array((floor,) + tuple((harness_floors or {}).get(g, ())))
        h = samples.harness
        meas_floor = np.where(h < len(floors), floors[np.minimum(h, len(floors) - 1)], floor)
        for c in sorted(set(chip[rows]) - {0.0}):
            sel = rows & (chip == c) & (meas_us > 2 * meas_floor) & (pred_us > floor)
            if sel.sum() < MIN_CHIP_SAMPLES:
                continue
            r = float(np.median(np.log((meas_us[sel] - meas_floor[sel])
                                       / (pred_us[sel] - floor))))
            if abs(r) > MAX_CHIP_CORRECTION:
                # The weights file holds corrections up to this bound (beyond it a
                # file is read as damaged): a network this far off a chip is said,
                # and the chip keeps the largest correction the file can hold.
                names = ", ".join(i for i, k in zip(ids, gpus[:, L.G_CHIP]) if k == c)
                warnings.warn(f"{GROUP_NAMES[g]} op model: measured times on {names} are "
                              f"{np.exp(r):.3g}x its prediction; correction capped at "
                              f"{np.exp(MAX_CHIP_CORRECTION):g}x")
                r = float(np.clip(r, -MAX_CHIP_CORRECTION, MAX_CHIP_CORRECTION))
            out.setdefault(g, {})[float(c)] = r
    return with_other_chips(out)


def with_other_chips(corrections: dict[int, dict[float, float]]) -> dict[int, dict[float, float]]:
    """`corrections` with, per group of OTHER_CHIPS_GROUPS, the median of its
    chips' corrections under OTHER_CHIPS (where at least MIN_CHIPS_FOR_OTHERS
    chips have one)."""
    for g, table in corrections.items():
        if g not in OTHER_CHIPS_GROUPS:
            continue
        own = [c for chip, c in table.items() if chip != OTHER_CHIPS]
        if len(own) >= MIN_CHIPS_FOR_OTHERS:
            table[OTHER_CHIPS] = float(np.median(own))
    return corrections


def tile_rule(samples: OpSamples) -> np.ndarray:
    """The GEMM tile rule of the batched-GEMM group, fitted on the GEMMs of
    `samples` whose kernels named their tile (``calibration.tiles``); the
    analytical fallback (no parameters) where none did."""
    s = C.from_samples(samples)
    return C.fit(s) if len(s) else np.zeros(0)


def sm_range(samples: OpSamples) -> np.ndarray:
    """[fewest, most] SMs of the GPUs of `samples`: the range a GEMM or conv
    network carries (``features.sm_range``), outside which it describes a
    GPU as one of as many SMs as the nearest end of the range."""
    db = hardware.database()
    sms = [db.get(g).features[L.G_SMS] for g in sorted(set(samples.gpu))]
    return np.array([min(sms), max(sms)], dtype=np.float64)


# A GEMM whose best efficiency says how close to its rated clock a board runs
# (board_records): at least this much work, compute-bound at the spec's peaks.
CLOCK_GEMM_FLOPS = 1e9
CLOCK_PERCENTILE = 90.0


def _gemm_efficiency_p90(samples: OpSamples) -> dict[str, float]:
    """Per board, the 90th percentile of its fp32 GEMMs' efficiency (time at
    the spec sheet's compute peak over the measured time), over GEMMs of at
    least CLOCK_GEMM_FLOPS that are compute-bound."""
    from predictor.kernels.features import roofline_us
    from predictor.kernels.work import flops_and_elems

    db = hardware.database()
    params = default_params()
    out = {}
    for gid in sorted(set(samples.gpu)):
        gpu = db.get(gid).features
        rows = np.flatnonzero((samples.gpu == gid) & (samples.family == L.MATMUL))
        effs = []
        for i in rows:
            d = samples.dims[i]
            flops, _ = flops_and_elems(L.MATMUL, d)
            t_c, t_m = roofline_us(L.MATMUL, L.F32, d, gpu, params)
            if flops >= CLOCK_GEMM_FLOPS and t_c >= t_m:
                effs.append(t_c / (samples.latency_ms[i] * 1e3))
        if effs:
            out[gid] = float(np.percentile(effs, CLOCK_PERCENTILE))
    return out


def board_records(samples: OpSamples, group: int) -> list[float]:
    """The board records of `group`'s auxiliary numbers (kernels.clocks): per
    chip of the group's rows, the board most of them came from, as (chip
    key, board power per SM, rated boost MHz, clock fraction). For the matmul
    group the fraction is the board's GEMM efficiency (`_gemm_efficiency_p90`)
    over the best board's, at most 1: a board short of the best is taken to
    run below its rated clock; for the conv group it is 0 (the chip's matmul
    record gives the clock)."""
    db = hardware.database()
    fractions = _gemm_efficiency_p90(samples) if group == G_MATMUL else {}
    best = max(fractions.values(), default=0.0)
    boards: dict[float, tuple[int, str]] = {}
    for gid in sorted(set(samples.gpu)):
        chip = float(db.get(gid).features[L.G_CHIP])
        n = int((samples.gpu == gid).sum())
        if chip != 0.0 and (chip not in boards or n > boards[chip][0]):
            boards[chip] = (n, gid)
    out: list[float] = []
    for chip in sorted(boards):
        gid = boards[chip][1]
        f = db.get(gid).features
        if not (f[L.G_TDP_W] > 0 and f[L.G_SMS] > 0 and f[L.G_CLOCK_MHZ] > 0):
            continue
        c = 0.0
        if group == G_MATMUL:
            if gid not in fractions or best <= 0:
                continue
            c = min(fractions[gid] / best, 1.0)
        out += [chip, float(f[L.G_TDP_W] / f[L.G_SMS]), float(f[L.G_CLOCK_MHZ]), c]
    return out


def train(samples: OpSamples, *, seed: int = 0, epochs: int = 60, groups=None,
          progress=None, chips: bool = True, ensemble: int = ENSEMBLE,
          group_cache: dict | None = None) -> np.ndarray:
    """Fit every group present in `samples`; returns the packed weights, with
    the per-chip corrections of the chips in `samples` unless `chips` is False.
    `ensemble`: networks per group before distillation (`fit_distilled`).
    `group_cache`: a dict that keeps each group's network by the rows it was
    fitted on, so that trainings on sample sets that share a group's rows
    (leave-one-GPU-out sets of a GPU without files of that op) fit it once."""
    # The matmul network is fitted on batched GEMMs too: they are the data's
    # only `x @ W` kernels, and it prices unbatched ones.
    fitted_on = row_groups(samples, bmm=False)
    batched = row_groups(samples) == G_BMM
    models, plan, auxes, keys = {}, [], {}, {}
    for g in range(N_GROUPS):
        if groups is not None and g not in groups:
            continue
        mask = batched if g == G_BMM else fitted_on == g
        if mask.sum() < 50:
            continue
        key = None
        if group_cache is not None:
            # The batched-GEMM group depends on every GEMM row (its tile rule).
            rows = samples.family == L.MATMUL if g == G_BMM else mask
            key = (g, samples.subset(rows).fingerprint(), seed, epochs, ensemble)
            if key in group_cache:
                models[g] = group_cache[key]
                continue
        featurize, aux = None, None
        if g == G_BMM:
            aux = tile_rule(samples)
            featurize = functools.partial(features, tiles=aux)
        elif g in (G_MATMUL, G_CONV):
            aux = np.concatenate([sm_range(samples.subset(mask)),
                                  board_records(samples.subset(mask), g)])
        plan.append((g, samples.subset(mask), featurize))
        auxes[g], keys[g] = aux, key
    fitted = fit_distilled_groups(plan, seed=seed, epochs=epochs, ensemble=ensemble,
                                  progress=progress)
    for g, m in fitted.items():
        m.aux = auxes[g]
        models[g] = m
        if keys[g] is not None:
            group_cache[keys[g]] = m
    if not chips:
        return pack(models)
    return pack(models, chip_corrections(samples, pack(models), {
        g: m.harness_floors_us for g, m in models.items() if m.harness_floors_us}))


def corrections_by_gpu(mlp: np.ndarray, gpu_ids) -> dict[str, dict[str, float]]:
    """The packed per-chip corrections as {group: {GPU id: log correction}}
    (for the weights file's description; boards of one chip share a value)."""
    out = {}
    for g in range(N_GROUPS):
        if len(mlp) and mlp[1 + HEADER * g] > 0:
            row = {gid: round(float(chip_correction(mlp, g, hardware.get(gid).features[L.G_CHIP])),
                              4) for gid in gpu_ids}
            out[GROUP_NAMES[g]] = {k: v for k, v in row.items() if v != 0.0}
            other = round(float(chip_correction(mlp, g, 0.0)), 4)
            if other != 0.0:
                out[GROUP_NAMES[g]]["other GPUs"] = other
    return out


def save(path: str | Path, mlp: np.ndarray, meta: dict) -> None:
    """Write the weights atomically (npz with a JSON description)."""
    import io

    from predictor.io import atomic_write_bytes

    buf = io.BytesIO()
    np.savez(buf, mlp=mlp, meta=np.frombuffer(json.dumps(meta, sort_keys=True).encode(),
                                              dtype=np.uint8))
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, buf.getvalue())


def train_from_data(data: str | Path, out: str | Path, *, seed: int = 0, epochs: int = 60,
                    progress=None, extra=(), ensemble: int = ENSEMBLE,
                    log=None) -> tuple[np.ndarray, dict]:
    """Train on every training file of the dataset, and the measured-kernel
    files `extra` (``datasets.load_measured``; `log` hears the rows it leaves
    out), and write the weights."""
    samples = load_train(data, extra=extra, log=log)
    mlp = train(samples, seed=seed, epochs=epochs, progress=progress, groups=SHIPPED_GROUPS,
                ensemble=ensemble)
    meta = {"format": 1, "seed": seed, "epochs": epochs, "ensemble": ensemble,
            "distil_rows_per_gpu": DISTIL_ROWS_PER_GPU if ensemble > 1 else 0,
            "hidden": list(HIDDEN), "train_dtype": TRAIN_DTYPE,
            "shipped_groups": [GROUP_NAMES[g] for g in SHIPPED_GROUPS],
            "features": N_FEATURES, "groups": list(GROUP_NAMES),
            "gpus": sorted(set(samples.gpu)), "samples": int(len(samples)),
            "chip_corrections": corrections_by_gpu(mlp, sorted(set(samples.gpu)))}
    if extra:
        meta["extra"] = [Path(f).name for f in extra]
    save(Path(out) / WEIGHTS_FILE, mlp, meta)
    return mlp, meta
