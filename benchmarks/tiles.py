"""Leave-one-GPU-out accuracy of the GEMM tile choice (`predictor.kernels.tiles`).

    python -m benchmarks.tiles --data ../shared/data/neusight

For each of the five training GPUs: fits the tile rule on the other four
GPUs' training files (`calibration.tiles`), then scores the held-out GPU's
training GEMMs (never the test split) against the tile its kernel name
records. Two figures per (GPU, op): the exact tile, and the same wave count
under the predicted tile as under the true one (`tiles.tile_waves`, no
split-K). Compared with the analytical fallback (largest tile that still fills
every SM) and with the current behaviour, one 128x128 tile for every GEMM
(`kernels.work.TILE_M/TILE_N`). An architecture the four GPUs lack (the A100
held out: no other Ampere) gets the fallback, as a GPU outside the data
would; the "shared" column shows the rule's shared part there instead.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from numba import njit

from predictor import hardware
from predictor.calibration import tiles as C
from predictor.kernels import layout as L
from predictor.kernels import tiles as T
from predictor.kernels.work import TILE_M, TILE_N

METHODS = ("learned", "shared", "fallback", "fixed")


def waves(s: C.TileSamples, cand: np.ndarray) -> np.ndarray:
    return np.array([T.tile_waves(a, b, m, n, T.CANDIDATES[c, 0], T.CANDIDATES[c, 1])
                     for a, b, m, n, c in zip(s.sms, s.bt, s.m, s.n, cand)])


def logo(data, log=print) -> dict:
    """{(gpu, op): {method: (exact, same_waves, rows)}} over held-out GPUs."""
    s = C.load(data)
    s = s.subset(s.cand >= 0)
    fixed = int(T.candidate_index(np.array([TILE_M]), np.array([TILE_N]))[0])
    out = {}
    for held in sorted(set(s.gpu)):
        params = C.fit(s.subset(s.gpu != held))
        ev = s.subset(s.gpu == held)
        preds = {"learned": C.predict(params, ev),
                 "shared": C.predict(params, ev, learned_arch_only=False),
                 "fallback": C.predict(np.zeros(0), ev),
                 "fixed": np.full(len(ev), fixed)}
        true_w = waves(ev, ev.cand)
        for op in ("linear", "bmm"):
            o = ev.op == op
            out[(held, op)] = {k: (float(np.mean(p[o] == ev.cand[o])),
                                   float(np.mean(waves(ev.subset(o), p[o]) == true_w[o])),
                                   int(o.sum())) for k, p in preds.items()}
            log(f"  {held:<16} {op:<6} " + "  ".join(
                f"{k} {v[0]:.0%}/{v[1]:.0%}" for k, v in out[(held, op)].items()))
    return out


def table(res: dict) -> str:
    lines = ["| held-out GPU | op | rows | learned | shared | fallback | fixed 128x128 |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for (gpu, op), r in res.items():
        lines.append(f"| {gpu} | {op} | {r['fixed'][2]} | " +
                     " | ".join(f"{r[k][0]:.0%} / {r[k][1]:.0%}" for k in METHODS) + " |")
    for op in ("linear", "bmm"):
        rows = [r for (g, o), r in res.items() if o == op]
        lines.append(f"| mean | {op} | | " + " | ".join(
            f"{np.mean([r[k][0] for r in rows]):.0%} / {np.mean([r[k][1] for r in rows]):.0%}"
            for k in METHODS) + " |")
    return "\n".join(lines)


# ------------------------------------------ feature_selection candidates --
# The tile rule's data for the candidate columns below (feature_selection's
# validate sets it to its --data).
DATA = [Path("../shared/data/neusight")]
_RULES: dict[tuple, np.ndarray] = {}


def rule_without(held: tuple) -> np.ndarray:
    """The tile rule fitted on the training files without the GPUs `held`."""
    if held not in _RULES:
        s = C.load(DATA[0])
        _RULES[held] = C.fit(s.subset(~np.isin(s.gpu, list(held))))
    return _RULES[held]


_TRUE: dict[str, dict] = {}


def _true_tiles_gpus() -> list[str]:
    """The training files' GPUs."""
    return sorted({key[0] for key in _true_tiles()})


def _true_tiles() -> dict:
    """{(gpu, B transposed, batch, m, n, k): candidate index} of the training
    files' GEMMs, the tile their kernel name records (first row of a shape)."""
    key = str(DATA[0])
    if key not in _TRUE:
        s = C.load(DATA[0])
        table = {}
        for g, b, bt, m, n, k, c in zip(s.gpu, s.b_t, s.bt, s.m, s.n, s.k, s.cand):
            if c >= 0:
                table.setdefault((g, int(b), int(bt), int(m), int(n), int(k)), int(c))
        _TRUE[key] = table
    return _TRUE[key]


def _rule_for(gpus: list[str]) -> np.ndarray:
    """The tile rule for samples of `gpus` as feature_selection holds GPUs
    out: samples of one GPU get a rule fitted without it, samples of four of
    the five training GPUs one fitted without the fifth."""
    every = sorted(set(_true_tiles_gpus())) if len(gpus) > 1 else gpus
    held = tuple(gpus) if len(gpus) == 1 else tuple(g for g in every if g not in gpus)
    return rule_without(held)


def predicted_tile_columns(s, truth: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(wave utilisation, 1 / waves, log2 waves capped at 4) under the
    predicted tile of every matmul row of OpSamples `s` (0 elsewhere), the rule
    fitted leave-one-GPU-out: samples of one GPU get a rule fitted without it,
    samples of four of the five training GPUs one fitted without the fifth,
    as feature_selection's validation holds them out. `truth`: the tile
    the kernel name records where the sample is a measured shape (an oracle
    no prediction has; the rule's tile for the doubled and probe shapes)."""
    gpus = sorted(set(s.gpu))
    params = _rule_for(gpus)
    util = np.zeros(len(s))
    inv = np.zeros(len(s))
    lw = np.zeros(len(s))
    mm = np.flatnonzero(s.family == L.MATMUL)
    if mm.size == 0:
        return util, inv, lw
    d = s.dims[mm]
    c, sms, b_t = _chosen_tiles(s, mm, params)
    if truth:
        known = _true_tiles()
        c = np.array([known.get((g, int(b), int(r[0]), int(r[1]), int(r[2]), int(r[3])), ci)
                      for g, b, r, ci in zip(s.gpu[mm], b_t, d, c)], dtype=np.int64)
    tiles, slots = _tiles_and_slots(sms, d[:, 0], d[:, 1], d[:, 2], c)
    w = np.ceil(tiles / slots)
    util[mm] = tiles / (w * slots)
    inv[mm] = 1.0 / w
    lw[mm] = np.minimum(np.log2(w), 4.0)
    return util, inv, lw


def per_sm_tile_columns(s) -> tuple[np.ndarray, np.ndarray]:
    """NeuSight's per-SM inputs for the batched GEMM rows of OpSamples `s`
    under the predicted tile (the rule fitted leave-one-GPU-out, as
    `predicted_tile_columns`), log2 us: one tile's FLOPs over the per-SM fp32
    peak, and its fp32 bytes (A and B panels, C tile) over the per-SM DRAM
    bandwidth. 0 for every other row (unbatched GEMMs keep their features)."""
    gpus = sorted(set(s.gpu))
    params = _rule_for(gpus)
    comp = np.zeros(len(s))
    mem = np.zeros(len(s))
    mm = np.flatnonzero((s.family == L.MATMUL) & (s.dims[:, 0] > 1))
    if mm.size == 0:
        return comp, mem
    c, sms, _ = _chosen_tiles(s, mm, params)
    spec = {g: hardware.get(g).spec for g in gpus}
    peak = np.array([float(spec[g]["fp32_tflops"]) * 1e12 for g in s.gpu[mm]])
    bw = np.array([float(spec[g]["memory_bw_gbs"]) * 1e9 for g in s.gpu[mm]])
    flops, nbytes = tile_work(T.CANDIDATES[c, 0], T.CANDIDATES[c, 1], s.dims[mm, 3])
    comp[mm] = np.log2(flops / (peak / sms) * 1e6)
    mem[mm] = np.log2(nbytes / (bw / sms) * 1e6)
    return comp, mem


def tile_work(tile_m, tile_n, k) -> tuple[np.ndarray, np.ndarray]:
    """(FLOPs, bytes) of one fp32 GEMM tile of `tile_m` x `tile_n` outputs
    over a reduction of `k`: its A and B panels read, its C tile written."""
    tm, tn, kk = (np.asarray(v, dtype=np.float64) for v in (tile_m, tile_n, k))
    return 2.0 * tm * tn * kk, 4.0 * (tm * kk + tn * kk + tm * tn)


def _chosen_tiles(s, rows: np.ndarray, params: np.ndarray):
    """(candidate index, SM count, B-transposed flag) of the matmul `rows` of
    OpSamples `s` under the tile rule `params`, each on its own GPU."""
    ts = C.tile_samples(s.subset(rows))
    return C.predict(params, ts), ts.sms, ts.b_t


@njit(cache=True)
def _tiles_and_slots(sms, bt, m, n, cand):
    tiles = np.empty(m.shape[0])
    slots = np.empty(m.shape[0])
    for i in range(m.shape[0]):
        tm, tn = T.CANDIDATES[cand[i], 0], T.CANDIDATES[cand[i], 1]
        tiles[i] = T.tile_count(bt[i], m[i], n[i], tm, tn)
        slots[i] = max(sms[i], 1) * T.blocks_per_sm(tm, tn)
    return tiles, slots


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="../shared/data/neusight")
    args = ap.parse_args(argv)
    if not (Path(args.data) / "train").is_dir():
        print(f"error: {args.data}: not a NeuSight data folder (expected train/ inside)")
        return 2
    res = logo(args.data)
    print("exact tile / same wave count, per held-out GPU (training files only):")
    print(table(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
