"""Rows of real training steps whose learned-model inputs lie far outside what
the networks were trained on.

    python -m benchmarks.feature_range
    python -m benchmarks.feature_range --models gpt2,gnmt --z 5

A learned network is trusted only where its inputs resemble its training
rows. Every row a network prices is described by `kernels.features`; each
input is compared with the network's training inputs through the mean and
standard deviation the weights carry (`predictor/weights/opmodels.npz`), and
a row whose largest |z| exceeds `--z` is listed, grouped by network, family,
aten op and input. This is how fills were found priced at a third of the
DRAM bandwidth (a read-to-write ratio of 0: log2 0 lay 208 standard
deviations out) and how broadcast and gather rows were found described by
bytes they never move (benchmarks/README.md, "Rows outside the networks'
measured range"). Tensor-core rows (priced analytically) and analytical
families are not the networks' and are skipped.
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import numpy as np

MODELS = ("resnet50", "inception_v3", "transformer", "gnmt", "dcgan", "bert-base", "gpt2")
GPUS = ("V100-SXM2-16GB", "A100-SXM4-80GB", "T4", "H100-SXM5-80GB", "L4")
FEATURE_NAMES = ("log compute time", "log memory time", "intensity vs ridge", "log blocks/SM",
                 "wave utilisation", "log waves", "board power", "log size / batch",
                 "log M / inner", "log N / outer", "log K / read:write", "align M / inner",
                 "align N / flops per elem", "align K / pre-Volta", "GEMM intensity",
                 "layout / kernel", "stride", "tile 32", "tile 64", "tile 128x64", "tile 128",
                 "tile 256")


def _input_stats(mlp, group: int) -> tuple[np.ndarray, np.ndarray]:
    from predictor.kernels.mlp import HEADER, layer_offsets
    h = 1 + HEADER * group
    off, n_in, h1, h2 = (int(mlp[h + j]) for j in range(4))
    mean, std, *_ = layer_offsets(off, n_in, h1, h2)
    return np.asarray(mlp[mean:mean + n_in]), np.asarray(mlp[std:std + n_in])


def outliers(graph, gpus=GPUS, batch: int | None = None) -> list[dict]:
    """One dict per (row, GPU) of `graph` priced by a network with an input
    of largest |z|: row index, op, family, network, input, z."""
    from predictor import hardware, opmodel
    from predictor.kernels import layout as L
    from predictor.kernels import precision
    from predictor.kernels.features import (GROUP_NAMES, N_FEATURES, group_features,
                                            serving_group)
    from predictor.kernels.mlp import has_group
    from predictor.kernels.roofline import default_params

    mlp, params = opmodel.weights(), default_params()
    db = hardware.database()
    feats = db.features([db.get(g) for g in gpus])
    ops = graph.ops
    dims = ops.dims(batch or graph.batch_size or 1)
    stats, out = {}, []
    x = np.zeros(N_FEATURES)
    for i in range(len(ops)):
        fam, dt = int(ops.family[i]), int(ops.dtype[i])
        for gpu_id, gpu in zip(gpus, feats):
            d, code = dims[i].copy(), dt
            mode = precision.mode_of(fam, dt, gpu, params)
            if mode == precision.TENSOR_CORE:
                continue
            if mode == precision.AS_FP32:
                d32 = np.empty_like(d)
                precision.fp32_dims(fam, dt, d, d32)
                d, code = d32, L.F32
            group = serving_group(fam, d, mlp)
            if group < 0 or not has_group(mlp, group):
                continue
            group_features(group, fam, code, d, gpu, params, mlp, x)
            if group not in stats:
                stats[group] = _input_stats(mlp, group)
            mean, std = stats[group]
            z = (x[:mean.shape[0]] - mean) / std
            j = int(np.argmax(np.abs(z)))
            out.append({"row": i, "op": ops.op_names[int(ops.op[i])],
                        "family": L.FAMILY_NAMES[fam], "network": GROUP_NAMES[group],
                        "gpu": gpu_id, "input": j, "z": float(z[j])})
    return out


def summarise(found: list[dict], limit: float) -> list[dict]:
    """Rows beyond |z| > `limit`, grouped by (network, family, op, input)."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in found:
        if abs(r["z"]) > limit:
            groups[(r["network"], r["family"], r["op"], r["input"])].append(r)
    rows = []
    for (net, fam, op, j), rs in groups.items():
        zs = [r["z"] for r in rs]
        rows.append({"network": net, "family": fam, "op": op, "input": FEATURE_NAMES[j],
                     "cases": len(rs), "worst_z": max(zs, key=abs),
                     "models": sorted({r["model"] for r in rs})})
    return sorted(rows, key=lambda r: -abs(r["worst_z"]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(MODELS), help="zoo models, comma-separated")
    ap.add_argument("--z", type=float, default=8.0, help="list inputs beyond this |z| (default 8)")
    args = ap.parse_args(argv)
    import predictor

    found = []
    for model in args.models.split(","):
        for amp in (None, "bf16"):
            graph = predictor.trace(model, amp=amp, optimizer="adamw")
            for r in outliers(graph):
                r["model"] = f"{model}{'+' + amp if amp else ''}"
                found.append(r)
    rows = summarise(found, args.z)
    print(f"| network | family | aten op | input | (row, GPU) cases | worst z | models |")
    print("| --- | --- | --- | --- | ---: | ---: | --- |")
    for r in rows:
        print(f"| {r['network']} | {r['family']} | {r['op']} | {r['input']} | {r['cases']} | "
              f"{r['worst_z']:+.1f} | {', '.join(r['models'])} |")
    print(f"\n{len(rows)} groups beyond |z| > {args.z:g}; {len(found)} (row, GPU) pairs checked")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
