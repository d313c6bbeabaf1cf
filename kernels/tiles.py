"""Which output tile a GEMM kernel runs with: kernel names parsed, and a small
learned choice rule for unseen shapes and GPUs, with an analytical fallback.

Orientation. Tiles here are (tile_m, tile_n) over a row-major output of M
rows and N columns, the way the OpTable's GEMM rows (`work.gemm_shape`) and
the training loader (`calibration.datasets`) write it. cuBLAS names its
kernels column-major: `volta_sgemm_32x128_tn` tiles cuBLAS's m (our N, the
output columns) by 32 and cuBLAS's n (our M, the rows) by 128, so it is
(tile_m, tile_n) = (128, 32) here. Every launch grid of the training files
agrees: grid x = ceil(N / 32), grid y = ceil(M / 128), grid z = batch x
split-K (`tests/test_tiles.py` checks it on the data).

The choice rule scores each candidate tile of `CANDIDATES` for one GEMM on
one GPU with a linear function of a few physical quantities (how much of the
GPU one wave of the tile fills, how full its last wave is, how much of the
tile lies outside the output, the tile's area against the reduction length)
plus a bias per candidate and B layout, and a bias per candidate, layout and
architecture (compute capability major) where the training data had one; the
highest score wins. Its parameters are one flat array
(`predictor/weights/gemm_tiles.json`, written by
`python -m calibration.tiles --data ../shared/data/neusight`). Without
weights the analytical fallback picks the largest candidate tile that still
fills every SM with at least one wave, else the smallest. `predictor.tiles`
reads the shipped rule and gives the tile of one GEMM (`predict_tile`) or of
OpTable rows.

Everything is numba over scalars and arrays: no Python object per op.
"""

from __future__ import annotations

import math
import re

import numpy as np
from numba import njit

# Candidate output tiles (tile_m over the rows, tile_n over the columns): every
# tile the cuBLAS sgemm kernels of the training data use, turned row-major.
CANDIDATES = np.array([
    (32, 32),     # *_sgemm_32x32_sliced1x4
    (32, 64),     # *_sgemm_64x32_sliced1x4
    (32, 128),    # *_sgemm_128x32[_sliced1x4]
    (128, 32),    # *_sgemm_32x128
    (64, 64),     # *_sgemm_64x64
    (64, 128),    # *_sgemm_128x64
    (128, 128),   # *_sgemm_128x128
], dtype=np.int64)
N_CAND = CANDIDATES.shape[0]

# Kernel classes of `parse_kernel_name`.
K_UNKNOWN = 0
K_SGEMM = 1         # cuBLAS <arch>_sgemm_AxB[_slicedKxL]_{nn,nt,tn,tt}
K_LEGACY_SGEMM = 2  # pre-Maxwell style sgemm_AxBxK_NN[_vec]
K_GCGEMM = 3        # complex GEMM of the FFT convolutions (<arch>_gcgemm_AxB_..)
K_CUTLASS = 4       # cutlass_*_AxB_KxS_* and *_xmma_gemm_*_tilesizeAxBxK_*
K_CONV = 5          # cuDNN's implicit/explicit/precomputed convolve_sgemm
K_GEMV = 6          # gemv kernels: one row or column of output per block
KERNEL_CLASSES = ("unknown", "sgemm", "legacy_sgemm", "gcgemm", "cutlass", "conv", "gemv")

_SGEMM = re.compile(r"(?:^|_)(?:maxwell|volta|turing|ampere|ada|hopper|sm\d+)_"
                    r"(s|h|d|c|z|gc|hc|sc)gemm_(\d+)x(\d+)(?:_sliced(\d+)x(\d+))?_(nn|nt|tn|tt)\b",
                    re.IGNORECASE)
_LEGACY = re.compile(r"^sgemm_(\d+)x(\d+)x(\d+)_(NN|NT|TN|TT)(?:_vec)?$", re.IGNORECASE)
_CUTLASS = re.compile(r"cutlass.*?_(\d+)x(\d+)_(\d+)x(\d+)_(nn|nt|tn|tt)", re.IGNORECASE)
_XMMA = re.compile(r"xmma_gemm.*?tilesize(\d+)x(\d+)x(\d+)", re.IGNORECASE)


def parse_kernel_name(name: str) -> tuple[int, int, int, int]:
    """(tile_m, tile_n, sliced, kernel class) of a GEMM kernel name, the tile
    row-major as the module docstring says (0, 0 when the name gives none);
    `sliced` is the number of warps a block splits its reduction over
    (`sliced1x4`: 4), 1 otherwise. Anything else: (0, 0, 1, K_UNKNOWN)."""
    s = str(name).strip()
    m = _SGEMM.search(s)
    if m:
        a, b = int(m.group(2)), int(m.group(3))
        sliced = int(m.group(4)) * int(m.group(5)) if m.group(4) else 1
        cls = K_GCGEMM if m.group(1).lower() == "gc" else K_SGEMM
        return b, a, sliced, cls
    m = _LEGACY.match(s)
    if m:
        return int(m.group(2)), int(m.group(1)), 1, K_LEGACY_SGEMM
    m = _XMMA.search(s)
    if m:
        return int(m.group(2)), int(m.group(1)), 1, K_CUTLASS
    m = _CUTLASS.search(s)
    if m:
        return int(m.group(2)), int(m.group(1)), 1, K_CUTLASS
    low = s.lower()
    if "convolve_sgemm" in low:
        return 0, 0, 1, K_CONV
    if "gemv" in low:
        return 0, 0, 1, K_GEMV
    return 0, 0, 1, K_UNKNOWN


def parse_kernel_names(names) -> np.ndarray:
    """`parse_kernel_name` over many names: int64[n, 4] (tile_m, tile_n,
    sliced, class); one parse per distinct name."""
    names = list(names)
    cache: dict[str, tuple[int, int, int, int]] = {}
    out = np.empty((len(names), 4), dtype=np.int64)
    for i, nm in enumerate(names):
        key = str(nm)
        if key not in cache:
            cache[key] = parse_kernel_name(key)
        out[i] = cache[key]
    return out


def candidate_index(tile_m: np.ndarray, tile_n: np.ndarray) -> np.ndarray:
    """Index into CANDIDATES of each (tile_m, tile_n); -1 where none matches."""
    tile_m = np.asarray(tile_m, dtype=np.int64)
    tile_n = np.asarray(tile_n, dtype=np.int64)
    out = np.full(tile_m.shape, -1, dtype=np.int64)
    for c in range(N_CAND):
        out[(tile_m == CANDIDATES[c, 0]) & (tile_n == CANDIDATES[c, 1])] = c
    return out


# ------------------------------------------------------------ physics --

@njit(cache=True)
def _cdiv(a, b):
    """ceil(a / b) in float64: huge dims must not wrap around in int64."""
    return math.ceil(float(a) / float(b))


@njit(cache=True)
def blocks_per_sm(tile_m, tile_n):
    """Thread blocks of a tile resident per SM, as `features.TILES` counts
    them: 4 up to 32x64, 2 up to 128x64, 1 above (register file bound)."""
    area = tile_m * tile_n
    if area <= 2048:
        return 4
    if area <= 8192:
        return 2
    return 1


@njit(cache=True)
def tile_count(bt, m, n, tile_m, tile_n):
    """Thread blocks of a GEMM under one tile (no split-K), at least 1 (float)."""
    return max(max(bt, 1) * _cdiv(max(m, 1), tile_m) * _cdiv(max(n, 1), tile_n), 1.0)


@njit(cache=True)
def tile_waves(sms, bt, m, n, tile_m, tile_n):
    """Waves of a GEMM under one tile on a GPU of `sms` SMs (float)."""
    slots = max(int(sms), 1) * blocks_per_sm(tile_m, tile_n)
    return _cdiv(tile_count(bt, m, n, tile_m, tile_n), slots)


@njit(cache=True)
def _lg(x):
    return math.log2(max(x, 1e-30))


N_TILE_FEATURES = 6
TILE_FEATURE_NAMES = ("fill", "last_wave", "padding", "area_vs_k", "aspect", "log_waves")


@njit(cache=True)
def candidate_features(sms, bt, m, n, k, tile_m, tile_n, out):
    """Fill out[:N_TILE_FEATURES] for one candidate tile of one GEMM."""
    m = max(m, 1)
    n = max(n, 1)
    k = max(k, 1)
    tiles = tile_count(bt, m, n, tile_m, tile_n)
    slots = max(int(sms), 1) * blocks_per_sm(tile_m, tile_n)
    waves = _cdiv(tiles, slots)
    out[0] = min(tiles / slots, 1.0)                       # one wave's share of the GPU
    out[1] = tiles / (waves * slots)                       # how full the last wave is
    out[2] = (m / (_cdiv(m, tile_m) * tile_m)) * (n / (_cdiv(n, tile_n) * tile_n))
    # A bigger tile reuses each operand load over more FMAs, which pays when
    # the reduction is long; log2 area x log2 k, scaled to about [0, 1].
    out[3] = _lg(tile_m * tile_n) * _lg(k) / 196.0
    # Tall tiles for tall outputs: log2 tile aspect x log2 output aspect (clipped).
    out[4] = _lg(tile_m / tile_n) * min(max(_lg(m / n), -4.0), 4.0) / 8.0
    out[5] = min(_lg(waves), 8.0) / 8.0


# ------------------------------------------------------------- params --
# Flat parameter layout: [N_TILE_FEATURES weights | 2 x N_CAND layout biases |
# per architecture: its compute capability major, then 2 x N_CAND biases].
ARCH_STRIDE = 1 + 2 * N_CAND


def n_params(n_arch: int) -> int:
    return N_TILE_FEATURES + 2 * N_CAND + n_arch * ARCH_STRIDE


def tile_rule_problem(n: int) -> str | None:
    """What is wrong with a tile rule of `n` parameters (None: nothing): the
    shared weights and biases, then whole per-architecture blocks."""
    base = N_TILE_FEATURES + 2 * N_CAND
    if n < base or (n - base) % ARCH_STRIDE:
        return f"a GEMM tile rule of {n} numbers (expected {base} + a multiple of {ARCH_STRIDE})"
    return None


@njit(cache=True)
def _arch_offset(params, cc_major):
    """Offset of an architecture's biases in params, -1 when it has none."""
    base = N_TILE_FEATURES + 2 * N_CAND
    n_arch = (params.shape[0] - base) // ARCH_STRIDE
    for a in range(n_arch):
        off = base + a * ARCH_STRIDE
        if int(params[off]) == cc_major:
            return off + 1
    return -1


@njit(cache=True)
def fallback_tile(sms, bt, m, n):
    """Analytical choice: the largest candidate tile whose one wave still
    fills every SM (at least `sms` thread blocks), else the smallest."""
    best = 0
    best_area = 0
    for c in range(N_CAND):
        tm, tn = CANDIDATES[c, 0], CANDIDATES[c, 1]
        if tile_count(bt, m, n, tm, tn) >= max(int(sms), 1) and tm * tn > best_area:
            best, best_area = c, tm * tn
    return best


@njit(cache=True)
def choose_tile(params, cc_major, sms, bt, m, n, k, b_transposed, learned_arch_only):
    """Index into CANDIDATES of the tile one GEMM runs with on one GPU.

    `params` empty: the analytical fallback. An architecture without biases
    of its own gets the shared ones, or the fallback when
    `learned_arch_only`."""
    if params.shape[0] < N_TILE_FEATURES + 2 * N_CAND:
        return fallback_tile(sms, bt, m, n)
    off = _arch_offset(params, cc_major)
    if off < 0 and learned_arch_only:
        return fallback_tile(sms, bt, m, n)
    lay = 1 if b_transposed else 0
    f = np.empty(N_TILE_FEATURES)
    best = 0
    best_s = -np.inf
    for c in range(N_CAND):
        candidate_features(sms, bt, m, n, k, CANDIDATES[c, 0], CANDIDATES[c, 1], f)
        s = params[N_TILE_FEATURES + lay * N_CAND + c]
        for j in range(N_TILE_FEATURES):
            s += params[j] * f[j]
        if off >= 0:
            s += params[off + lay * N_CAND + c]
        if s > best_s:
            best, best_s = c, s
    return best


@njit(cache=True)
def choose_tiles(params, cc_major, sms, bt, m, n, k, b_transposed, learned_arch_only):
    """choose_tile over arrays (one GPU per row): int64[n] candidate indices."""
    out = np.empty(m.shape[0], dtype=np.int64)
    for i in range(m.shape[0]):
        out[i] = choose_tile(params, cc_major[i], sms[i], bt[i], m[i], n[i], k[i],
                             b_transposed[i], learned_arch_only)
    return out


@njit(cache=True)
def feature_tensor(sms, bt, m, n, k):
    """Features of every candidate for many GEMMs: float64[n, N_CAND, F]."""
    out = np.empty((m.shape[0], N_CAND, N_TILE_FEATURES))
    for i in range(m.shape[0]):
        for c in range(N_CAND):
            candidate_features(sms[i], bt[i], m[i], n[i], k[i], CANDIDATES[c, 0],
                               CANDIDATES[c, 1], out[i, c])
    return out


# ------------------------------------------------------------ weights --
TILES_FILE = "gemm_tiles.json"
TILES_FORMAT = 1


def learned_archs(params: np.ndarray) -> list[int]:
    """Compute capability majors the rule has biases of its own for."""
    base = N_TILE_FEATURES + 2 * N_CAND
    return [int(params[o]) for o in range(base, params.shape[0], ARCH_STRIDE)]
