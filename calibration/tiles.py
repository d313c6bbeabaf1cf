"""Learn the GEMM tile choice (`predictor.kernels.tiles`) from the kernel names
of the NeuSight per-kernel files, and write ``predictor/weights/gemm_tiles.json``.

    python -m calibration.tiles --data ../shared/data/neusight [--out DIR]

Reads ``train/{linear,bmm}/*.csv`` only (never the test split). Each row gives
a GEMM's shape, its GPU and the kernel cuBLAS ran; the kernel name gives the
tile (`tiles.parse_kernel_name`). The rule is a conditional logit over the
candidate tiles (a score per candidate, the highest wins), fitted by
full-batch L-BFGS on the cross-entropy with every (GPU, op) weighed alike and
an L2 penalty that keeps the per-architecture biases small, so the shared
part carries what transfers to an architecture not in the data.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from predictor import hardware, tiles
from predictor.calibration import datasets as D
from predictor.errors import InvalidArgumentError
from predictor.kernels import layout as L
from predictor.kernels import tiles as T

COMMAND = "python -m calibration.tiles --data ../shared/data/neusight"
# L2 penalties (per unit weight of the mean loss) on the shared weights and
# biases, and on the per-architecture biases.
L2_SHARED = 1e-4
L2_ARCH = 1e-3


@dataclass
class TileSamples:
    """GEMMs with the tile their kernel used, as arrays."""

    op: np.ndarray        # object[n]: linear / bmm
    gpu: np.ndarray       # object[n]: spec id
    cc_major: np.ndarray  # int64[n]
    sms: np.ndarray       # int64[n]
    bt: np.ndarray
    m: np.ndarray
    n: np.ndarray
    k: np.ndarray
    b_t: np.ndarray       # int64[n]: 1 for x @ W^T (linear), 0 for bmm
    tile_m: np.ndarray    # int64[n], 0 when the name gives no tile
    tile_n: np.ndarray
    cand: np.ndarray      # int64[n]: index into tiles.CANDIDATES, -1 if none
    split: np.ndarray     # int64[n]: grid z over batch (split-K factor)

    def __len__(self) -> int:
        return len(self.op)

    def subset(self, mask) -> "TileSamples":
        return TileSamples(*(getattr(self, f)[mask] for f in self.__dataclass_fields__))


def cc_major(gpu_id: str) -> int:
    """Compute capability major of a spec (0 when the spec has none)."""
    return tiles.cc_major(hardware.get(gpu_id).spec.get("compute_capability"))


def load(data: str | Path, ops=("linear", "bmm")) -> TileSamples:
    """The training files' GEMMs with their kernels' tiles."""
    data = Path(data)
    if not (data / "train").is_dir():
        raise InvalidArgumentError(
            f"{data}: not a NeuSight data folder (expected train/ inside)")
    parts = []
    for op in ops:
        for f in sorted((data / "train" / op).glob("*.csv")):
            df = pd.read_csv(f)
            _, dims = D._rows(op, df)
            gid = hardware.get(df["Device"].iloc[0]).id
            parsed = T.parse_kernel_names(df["Kernel Name"])
            n = len(df)
            bt = dims[:, 0]
            parts.append(dict(
                op=np.full(n, op, dtype=object), gpu=np.full(n, gid, dtype=object),
                cc_major=np.full(n, cc_major(gid), dtype=np.int64),
                sms=np.full(n, int(hardware.get(gid).spec["sms"]), dtype=np.int64),
                bt=bt, m=dims[:, 1], n=dims[:, 2], k=dims[:, 3],
                b_t=np.full(n, 1 if op == "linear" else 0, dtype=np.int64),
                tile_m=parsed[:, 0], tile_n=parsed[:, 1],
                cand=T.candidate_index(parsed[:, 0], parsed[:, 1]),
                split=np.maximum(df["Grid z"].to_numpy(np.int64) // np.maximum(bt, 1), 1)))
    if not parts:
        raise InvalidArgumentError(f"{data}: no train/linear or train/bmm files")
    return TileSamples(**{k: np.concatenate([p[k] for p in parts]) for k in parts[0]})



def tile_samples(samples: D.OpSamples) -> TileSamples:
    """The GEMM rows of measured ops (``datasets.OpSamples``, matmul rows
    only) as TileSamples, each on its own GPU; `cand` is the tile its kernel
    named (-1 where none)."""
    gpus = sorted(set(samples.gpu))
    cc = {g: cc_major(g) for g in gpus}
    sms = {g: int(hardware.get(g).spec["sms"]) for g in gpus}
    b_t = ((samples.dims[:, L.GEMM_LAYOUT] & L.GEMM_B_T) != 0).astype(np.int64)
    cand = samples.tile.astype(np.int64)
    named = cand >= 0
    tile_m = np.where(named, T.CANDIDATES[cand, 0], 0)
    tile_n = np.where(named, T.CANDIDATES[cand, 1], 0)
    return TileSamples(
        op=np.where(b_t == 1, "linear", "bmm").astype(object), gpu=samples.gpu,
        cc_major=np.array([cc[g] for g in samples.gpu], dtype=np.int64),
        sms=np.array([sms[g] for g in samples.gpu], dtype=np.int64),
        bt=samples.dims[:, 0], m=samples.dims[:, 1], n=samples.dims[:, 2], k=samples.dims[:, 3],
        b_t=b_t, tile_m=tile_m, tile_n=tile_n, cand=cand,
        split=np.ones(len(samples), dtype=np.int64))


def from_samples(samples: D.OpSamples) -> TileSamples:
    """The GEMMs of measured ops whose kernel named its tile, as TileSamples:
    what the batched-GEMM model's tile rule is fitted on, so that a model
    trained without a GPU's measurements has a rule that never saw that
    GPU's kernels either."""
    return tile_samples(samples.subset((samples.family == L.MATMUL) & (samples.tile >= 0)))


def fit(s: TileSamples, *, iters: int = 300) -> np.ndarray:
    """Fit the flat parameter array of `tiles.choose_tile` on samples whose
    tile is a candidate."""
    import torch

    keep = s.cand >= 0
    s = s.subset(keep)
    archs = sorted(set(int(a) for a in s.cc_major))
    x = torch.from_numpy(T.feature_tensor(s.sms, s.bt, s.m, s.n, s.k))
    y = torch.from_numpy(s.cand)
    lay = torch.from_numpy(s.b_t)
    arch = torch.from_numpy(np.searchsorted(archs, s.cc_major))
    # Every (GPU, op) weighs alike whatever its row count.
    key = pd.Series(s.gpu.astype(str)) + "/" + pd.Series(s.op.astype(str))
    counts = key.map(key.value_counts()).to_numpy(np.float64)
    wt = torch.from_numpy(1.0 / counts)
    wt = wt / wt.sum()
    w = torch.zeros(T.N_TILE_FEATURES, dtype=torch.float64, requires_grad=True)
    b = torch.zeros(2, T.N_CAND, dtype=torch.float64, requires_grad=True)
    ba = torch.zeros(len(archs), 2, T.N_CAND, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([w, b, ba], max_iter=iters, history_size=20,
                            line_search_fn="strong_wolfe", tolerance_grad=1e-9,
                            tolerance_change=1e-12)

    def closure():
        opt.zero_grad()
        score = x @ w + b[lay] + ba[arch, lay]
        loss = (wt * torch.nn.functional.cross_entropy(score, y, reduction="none")).sum()
        loss = loss + L2_SHARED * ((w ** 2).sum() + (b ** 2).sum()) + L2_ARCH * (ba ** 2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    out = [w.detach().numpy(), b.detach().numpy().ravel()]
    for i, a in enumerate(archs):
        out.append(np.array([float(a)]))
        out.append(ba[i].detach().numpy().ravel())
    return np.concatenate(out)


def predict(params: np.ndarray, s: TileSamples, *, learned_arch_only: bool = True) -> np.ndarray:
    """Candidate index chosen for every sample (the analytical fallback on an
    architecture the rule has no biases for, unless not `learned_arch_only`)."""
    return T.choose_tiles(np.asarray(params, dtype=np.float64), s.cc_major, s.sms, s.bt, s.m,
                          s.n, s.k, s.b_t, learned_arch_only)


def save(path: str | Path, params: np.ndarray, meta: dict) -> None:
    """Write the tile rule as JSON, atomically."""
    from predictor.io import atomic_write_bytes

    params = np.asarray(params, dtype=np.float64)
    doc = {"format": T.TILES_FORMAT,
           "candidates": T.CANDIDATES.tolist(),
           "features": list(T.TILE_FEATURE_NAMES),
           "params": [round(float(v), 8) for v in params], **meta}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="../shared/data/neusight")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "predictor"
                                         / "weights"),
                    help="folder to write gemm_tiles.json into")
    args = ap.parse_args(argv)
    try:
        s = load(args.data)
    except InvalidArgumentError as exc:
        print(f"error: {exc}")
        return 2
    params = fit(s)
    ok = s.cand >= 0
    acc = float(np.mean(predict(params, s)[ok] == s.cand[ok]))
    meta = {"command": COMMAND, "gpus": sorted(set(s.gpu)), "samples": int(ok.sum()),
            "fit_accuracy": round(acc, 4)}
    path = Path(args.out) / T.TILES_FILE
    save(path, params, meta)
    print(f"wrote {path}: {len(params)} parameters, {int(ok.sum())} GEMMs, "
          f"tile accuracy on the fitted data {acc:.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
