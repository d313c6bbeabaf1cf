"""Large fp32 matmuls against a public table of measured throughput.

    python -m benchmarks.matmul_published
    python -m benchmarks.matmul_published --within-chip   # boards of the training chips
    python -m benchmarks.matmul_published --sizes         # every size, not the best one

The predictor's fp32 GEMM model on GPUs it never saw (and on boards of its
training data's chips) against the community table of
github.com/zzc0721/torch-performance-test-data (`database.md`, commit
0785868): each row is the best of `torch.mm` on square fp32 matrices of
1,024, 2,048, 4,096, 8,192 and 10,240 (30 back-to-back calls after 6
warm-up calls, `test.py`), in TFLOP/s. The predicted figure is the same
maximum over the same five sizes of the per-op time the engine uses in a
graph (`kernels.optime.op_time_us`, `x @ W` layout, fp32 with TF32 off as
PyTorch's default). A reported check, not a fit: nothing was tuned to it.

Rows used: the boards the GPU database names unambiguously, with
PyTorch's default fp32 matmuls. Left out: an H100 row at 403.7 TFLOP/s (TF32
tensor cores: 6x the FP32 peak), the "A100 40GB" row (PCIe or SXM not
said), the 48 GB RTX 4090 / 4090D boards (modified cards) and GPUs not in
the database. Where several contributors measured one board the median is
taken.
"""

from __future__ import annotations

import argparse

import numpy as np

from predictor import hardware, opmodel
from predictor.kernels import layout as L
from predictor.kernels.clocks import clock_ratio
from predictor.kernels.features import G_CONV, G_MATMUL, SM_RANGE_FIELDS
from predictor.kernels.mlp import HEADER
from predictor.kernels.optime import op_time_us
from predictor.kernels.roofline import default_params

# (GPU id in specs/gpus.toml, measured TFLOP/s per contributor row, the
# table's device name). L4: the repository's issue 120 (its database.md
# row is the same run's best). P4: the stock-clock run of issue 9 (4.55);
# database.md lists the same contributor's run overclocked to 1,500 MHz
# (4.96), which is not the board as sold.
PUBLISHED = (
    ("H100-SXM5-80GB", (52.11,), "NVIDIA H100 80GB HBM3"),
    ("H200-SXM-141GB", (51.34,), "NVIDIA H200"),
    ("B200", (66.24,), "NVIDIA B200 180GB"),
    ("A100-SXM4-80GB", (19.18,), "NVIDIA A100 SXM4 80GB"),
    ("L40S", (46.88,), "NVIDIA L40S"),
    ("L4", (15.38,), "NVIDIA L4"),
    ("RTX-4090", (55.01, 54.77, 46.48, 54.67), "NVIDIA (GeForce) RTX 4090 24GB"),
    ("RTX-3090", (24.46, 24.84, 24.79), "NVIDIA (GeForce) RTX 3090 24GB"),
    ("RTX-A6000", (23.92,), "NVIDIA RTX A6000"),
    ("V100S-PCIE-32GB", (13.55,), "NVIDIA Tesla V100S 32GB"),
    ("T4", (4.17, 4.43), "NVIDIA Tesla T4 16GB"),
    ("P4", (4.55,), "NVIDIA Tesla P4 8GB"),
)
# Boards that joined the GPU database on 5 Dec 2026, after every rule the
# table above checks (the FFMA issue share, the median chip's offset, board
# clocks): a check none of those rules was made with. Same source and
# protocol. Left out: the RTX 5090 D v2 (another SKU), laptop parts and the
# RTX PRO 6000 Server Edition (its clocks are not the Workstation's).
LATER = (
    ("RTX-5090", (69.16, 67.57), "NVIDIA RTX 5090 32GB"),
    ("RTX-PRO-6000-BLACKWELL", (77.24,), "NVIDIA RTX PRO 6000 Workstation 96G"),
    ("RTX-3080-TI", (24.37,), "NVIDIA RTX 3080 Ti 12GB"),
    ("RTX-4070-SUPER", (24.60, 25.07), "NVIDIA RTX 4070 SUPER 12GB"),
    ("P40", (10.07,), "NVIDIA Tesla P40 24GB"),
)
SIZES = (1024, 2048, 4096, 8192, 10240)

# Per size (`--sizes`): the same script's per-size fp32 TFLOP/s at SIZES, as
# contributors posted them in the repository's issues and pull requests
# (github.com/zzc0721/torch-performance-test-data, number in the comment).
# The best-of table above keeps one figure per board, the fastest size; the
# sizes show how a board's efficiency moves as the GEMM runs longer (a 10,240
# square GEMM runs 30-200 ms), which is where a power cap shows. Several
# contributors of one board: the median per size.
PER_SIZE = (
    ("L4", ((12.87, 15.38, 12.53, 10.66, 11.11),)),                       # 120
    ("A10G", ((17.75, 21.73, 23.37, 23.23, 22.43),)),                     # 126
    ("A40", ((17.05, 21.44, 23.01, 23.73, 22.82),)),                      # 185
    ("RTX-4090", ((45.89, 53.84, 53.02, 53.41, 51.43),)),                 # 78
    ("RTX-5090", ((47.76, 69.83, 64.50, 66.91, 65.46),                    # 124
                  (43.12, 70.47, 64.04, 65.92, 64.91),                    # 96
                  (47.84, 69.16, 65.03, 66.34, 65.22),                    # pull 15
                  (43.28, 56.84, 55.13, 56.06, 55.47))),                  # 200
    ("RTX-3080-TI", ((18.23, 21.64, 25.02, 25.56, 25.05),)),              # 144
    ("TITAN-RTX", ((8.48, 8.93, 11.91, 10.75, 8.63),)),                   # 127
    ("RTX-A4000", ((10.32, 9.79, 9.08, 11.90, 10.91),)),                  # 97 (a VM)
    ("A100-PCIE-40GB", ((8.99, 9.69, 15.52, 17.56, 16.67),)),             # 108
    ("H100-SXM5-80GB", ((37.39, 49.58, 51.88, 51.81, 49.61),)),           # 79
    ("V100-SXM2-16GB", ((10.56, 12.71, 13.85, 14.38, 14.51),)),           # 140
    ("P100-PCIE-16GB", ((5.37, 6.78, 8.16, 8.63, 8.57),                   # 174
                        (3.51, 4.75, 7.81, 8.12, 7.97))),                 # 164
    ("P100-SXM2-16GB", ((5.48, 7.38, 9.04, 9.50, 9.49),)),                # 180
    ("P4", ((3.06, 3.53, 4.55, 4.01, 4.19),)),                            # 9 (stock clocks)
)


# The same runs' half-precision rows (bf16; fp16 where the board has no bf16
# tensor cores): the tensor-core model (kernels.precision) at each size. The
# boards whose fraction came from these runs carry their best size by
# construction; the other sizes, and the other boards, are a check.
PER_SIZE_HALF = (
    ("L4", "bf16", ((54.42, 70.89, 54.91, 59.40, 56.90),)),               # 120
    ("A10G", "bf16", ((47.92, 60.57, 62.48, 66.59, 69.47),)),             # 126
    ("A40", "bf16", ((82.35, 95.47, 115.16, 110.64, 122.29),)),           # 185
    ("RTX-4090", "bf16", ((126.84, 164.81, 151.50, 160.17, 158.54),)),    # 78
    ("RTX-5090", "bf16", ((93.44, 171.53, 182.19, 234.66, 236.99),        # 124
                          (94.16, 170.77, 181.17, 234.89, 240.05),        # 96
                          (93.60, 173.87, 183.71, 236.03, 235.27),        # pull 15
                          (95.10, 130.68, 134.08, 174.68, 178.86))),      # 200
    ("RTX-3080-TI", "bf16", ((55.14, 69.27, 71.56, 71.35, 77.72),)),      # 144
    ("RTX-A4000", "bf16", ((23.19, 62.78, 59.95, 56.10, 55.93),)),        # 97 (a VM)
    ("A100-PCIE-40GB", "bf16", ((94.89, 138.46, 234.14, 215.26, 211.72),)),  # 108
    ("H100-SXM5-80GB", "bf16", ((176.62, 676.59, 788.72, 797.51, 719.72),)),  # 79
    ("V100-SXM2-16GB", "fp16", ((57.30, 78.23, 95.73, 97.36, 89.37),)),   # 140
    ("TITAN-RTX", "fp16", ((62.55, 66.32, 40.35, 53.86, 45.52),)),        # 127
)


def predicted_tflops(gpu_id: str, gpu: np.ndarray | None = None) -> float:
    """Best predicted TFLOP/s of a square fp32 `torch.mm` over SIZES (on the
    feature row `gpu` where given: a board the database does not hold)."""
    gpu = hardware.get(gpu_id).features if gpu is None else gpu
    return predicted_tflops_with(gpu, opmodel.weights())


def predicted_tflops_with(gpu: np.ndarray, mlp: np.ndarray) -> float:
    """`predicted_tflops` under the op-model weights `mlp`."""
    return max(predicted_by_size(gpu, mlp))


def predicted_by_size(gpu: np.ndarray, mlp: np.ndarray, dtype: int = L.F32) -> list[float]:
    """Predicted TFLOP/s of a square `torch.mm` of `dtype` at each of SIZES."""
    params = default_params()
    out = []
    for n in SIZES:
        d = np.zeros(L.MAX_DIMS, dtype=np.int64)
        d[:4] = (1, n, n, n)  # batch, M, N, K; B not transposed (torch.mm(a, b))
        t_us = op_time_us(L.MATMUL, dtype, 1, d, gpu, params, mlp)
        out.append(2.0 * n ** 3 / (t_us * 1e-6) / 1e12)
    return out


HALF = {"bf16": L.BF16, "fp16": L.F16}


def size_rows(half: bool = False) -> list[dict]:
    """One row per PER_SIZE board (PER_SIZE_HALF's with `half`): measured
    (the contributors' median per size) and predicted TFLOP/s at each size,
    and the mean |error| over the sizes of 4,096 and up (kernels of
    milliseconds and more)."""
    chips = opmodel.measured_chips()
    mlp = opmodel.weights()
    out = []
    table = PER_SIZE_HALF if half else [(g, "fp32", runs) for g, runs in PER_SIZE]
    for gpu_id, dtype, runs in table:
        gpu = hardware.get(gpu_id).features
        meas = np.median(np.asarray(runs, dtype=np.float64), axis=0)
        pred = np.asarray(predicted_by_size(gpu, mlp, HALF.get(dtype, L.F32)))
        err = (pred / meas - 1.0) * 100.0
        long = np.asarray(SIZES) >= 4096
        peak = gpu[L.G_BF16_TFLOPS if dtype == "bf16" else L.G_FP16_TFLOPS] if half \
            else gpu[L.G_FP32_TFLOPS]
        out.append({"gpu": gpu_id, "in data": "chip" if gpu[L.G_CHIP] in chips else "no",
                    "dtype": dtype, "runs": len(runs), "peak": float(peak),
                    "measured": meas.tolist(), "predicted": pred.tolist(),
                    "error %": err.tolist(),
                    "long error %": float(np.mean(np.abs(err[long])))})
    return out


def size_table(rs: list[dict]) -> str:
    head = ", ".join(f"{n:,}" for n in SIZES)
    lines = [f"| GPU | chip in training data | runs | measured / peak at {head} | "
             f"predicted / peak | mean abs error, 4,096 and up |",
             "| --- | --- | ---: | --- | --- | ---: |"]
    for r in rs:
        m = " ".join(f"{x / r['peak']:.2f}" for x in r["measured"])
        p = " ".join(f"{x / r['peak']:.2f}" for x in r["predicted"])
        lines.append(f"| {r['gpu']} | {r['in data']} | {r['runs']} | {m} | {p} | "
                     f"{r['long error %']:.1f} % |")
    unseen = [r["long error %"] for r in rs if r["in data"] == "no"]
    seen = [r["long error %"] for r in rs if r["in data"] != "no"]
    lines += ["", f"mean |error| at 4,096 and up: {np.mean(unseen):.1f} % on {len(unseen)} "
                  f"GPUs outside the data, {np.mean(seen):.1f} % on {len(seen)} boards of its chips"]
    return "\n".join(lines)


def rows(published=PUBLISHED) -> list[dict]:
    """One row per board of `published` (PUBLISHED or LATER)."""
    # The chips of the per-kernel training data (the shipped weights' own).
    chips = opmodel.measured_chips()
    trained = {g for g, _, _ in published if hardware.get(g).features[L.G_CHIP] in chips}
    out = []
    for gpu_id, measured, name in published:
        meas = float(np.median(measured))
        pred = predicted_tflops(gpu_id)
        peak = float(hardware.get(gpu_id).features[L.G_FP32_TFLOPS])
        out.append({"gpu": gpu_id, "in data": "chip" if gpu_id in trained else "no",
                    "rows": len(measured), "measured": meas, "predicted": pred,
                    "measured/peak": meas / peak, "predicted/peak": pred / peak,
                    "error %": (pred / meas - 1.0) * 100.0})
    return out


def table(rs: list[dict]) -> str:
    lines = ["| GPU | chip in training data | rows | measured TFLOP/s | predicted | "
             "measured / peak | predicted / peak | error |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rs:
        lines.append(f"| {r['gpu']} | {r['in data']} | {r['rows']} | {r['measured']:.2f} | "
                     f"{r['predicted']:.2f} | {r['measured/peak']:.2f} | "
                     f"{r['predicted/peak']:.2f} | {r['error %']:+.1f} % |")
    unseen = [abs(r["error %"]) for r in rs if r["in data"] == "no"]
    seen = [abs(r["error %"]) for r in rs if r["in data"] != "no"]
    parts = [f"{np.mean(unseen):.1f} % on {len(unseen)} GPUs outside the data"] if unseen else []
    parts += [f"{np.mean(seen):.1f} % on {len(seen)} chips of the data"] if seen else []
    lines.append("")
    lines.append("mean |error|: " + ", ".join(parts))
    return "\n".join(lines)


# Within-chip check: boards of a chip whose own GEMM kernels trained the
# weights, at another board power or rated clock than the board measured.
# (board, measured TFLOP/s, the table's device name). The V100S PCIe is the
# V100 PCIe 32GB's GV100 with its 80 SMs at the same 250 W, rated 1601 MHz;
# measured by zzc0208 (database.md, "NVIDIA Tesla V100S 32GB").
WITHIN_CHIP = (
    ("A100-SXM4-80GB", 19.18, "NVIDIA A100 SXM4 80GB"),
    ("H100-SXM5-80GB", 52.11, "NVIDIA H100 80GB HBM3"),
    ("V100S-PCIE-32GB", 13.55, "NVIDIA Tesla V100S 32GB"),
)
# The boards whose fp32 GEMM kernels trained the shipped matmul network.
GEMM_TRAINING_BOARDS = ("A100-PCIE-40GB", "H200-SXM-141GB", "P100-PCIE-16GB", "P4", "T4",
                        "V100-PCIE-32GB")


def without_board_clocks(mlp: np.ndarray) -> np.ndarray:
    """`mlp` with the matmul and conv groups' board records dropped (their
    SM range kept): every board of a chip at its measured board's efficiency
    on its own rated peak, as before kernels.clocks."""
    out = mlp.copy()
    for g in (G_MATMUL, G_CONV):
        h = 1 + HEADER * g
        if out[h + 9] > SM_RANGE_FIELDS:
            out[h + 9] = SM_RANGE_FIELDS
    return out


def within_chip_rows() -> list[dict]:
    """Each WITHIN_CHIP board against the training board of its chip: the
    prediction without the board's own sustained clock (the chip's measured
    board's efficiency on this board's rated peak) and the shipped one, whose
    GEMMs run at the clock this board's power per SM sustains
    (kernels.clocks, with the clock ratio m it applies)."""
    mlp = opmodel.weights()
    plain = without_board_clocks(mlp)
    boards = {b: hardware.get(b).features for b in GEMM_TRAINING_BOARDS}
    out = []
    for board, meas, name in WITHIN_CHIP:
        gpu = hardware.get(board).features
        origin = next(b for b in boards if boards[b][L.G_CHIP] == gpu[L.G_CHIP])
        o = boards[origin]
        q = (gpu[L.G_TDP_W] / gpu[L.G_SMS]) / (o[L.G_TDP_W] / o[L.G_SMS])
        before = predicted_tflops_with(gpu, plain)
        shipped = predicted_tflops_with(gpu, mlp)
        out.append({"gpu": board, "device": name, "origin": origin, "power per SM": q,
                    "boost": gpu[L.G_CLOCK_MHZ], "origin boost": o[L.G_CLOCK_MHZ],
                    "m": clock_ratio(mlp, G_MATMUL, gpu), "measured": meas,
                    "before": before, "shipped": shipped,
                    "before error %": (before / meas - 1.0) * 100.0,
                    "shipped error %": (shipped / meas - 1.0) * 100.0})
    return out


def within_chip_table(rs: list[dict]) -> str:
    lines = ["| board | chip's training board | power per SM (x the training board's) | "
             "rated boost MHz (training board's) | clock ratio m | measured TFLOP/s | "
             "at the measured board's efficiency | error | shipped (its own clock) | error |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rs:
        lines.append(f"| {r['gpu']} | {r['origin']} | {r['power per SM']:.2f} | "
                     f"{r['boost']:.0f} ({r['origin boost']:.0f}) | {r['m']:.3f} | "
                     f"{r['measured']:.2f} | {r['before']:.2f} | {r['before error %']:+.1f} % | "
                     f"{r['shipped']:.2f} | {r['shipped error %']:+.1f} % |")
    before = np.mean([abs(r["before error %"]) for r in rs])
    after = np.mean([abs(r["shipped error %"]) for r in rs])
    lines += ["", f"mean |error|: {before:.1f} % at the measured board's efficiency, "
                  f"{after:.1f} % shipped"]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", action="store_true",
                    help="only the per-size check: each board's measured and predicted "
                         "efficiency at every matrix size (where a power cap shows)")
    ap.add_argument("--within-chip", action="store_true",
                    help="only boards of the training GPUs' chips at another power or clock, "
                         "with and without the clock their power sustains")
    args = ap.parse_args(argv)
    if args.sizes:
        print(size_table(size_rows()))
        print("\nHalf precision on tensor cores (bf16; fp16 on boards without bf16 tensor "
              "cores), against the dtype's dense peak:\n")
        print(size_table(size_rows(half=True)))
        return 0
    if args.within_chip:
        print(within_chip_table(within_chip_rows()))
        return 0
    print(table(rows()))
    print("\nBoards added to the database after the rules above (5 Dec 2026):\n")
    print(table(rows(LATER)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
