"""Predicted against published multi-GPU training of Llama models (torchtitan).

    python -m benchmarks.large_model_published                      # traces each model once
    python -m benchmarks.large_model_published --graphs /tmp/graphs  # keeps the traces there
    python -m benchmarks.large_model_published --bf16-module         # torchtitan's program

A reported check, not a fit: nothing in the predictor is tuned to these
figures. Each row is one published configuration: the zoo's Llama model traced
under bf16 autocast, predicted with the published layout (FSDP: ``zero=3``,
whose mixed precision is FSDP's: 16-bit all-gathers, fp32 gradient
reduce-scatter), local batch, sequence length and activation checkpointing,
against the published tokens/s per GPU and (where given) peak memory per GPU.

Activation checkpointing as torchtitan names it, and what is predicted:

- ``none`` and ``full``: the same (``checkpoint=None`` / ``"full"``);
- ``selective layer`` (torchtitan's ``selective_ac_option = "2"``): every
  second block is checkpointed whole; predicted from no and full
  recomputation, half the blocks each way: the mean step time, the mean memory;
- ``selective op``: torchtitan saves the outputs of attention and of every
  other matmul and recomputes the rest of each block's forward (its
  ``_save_list`` policy in ``parallelize_llama.py``), which is about half of a
  block's forward time: predicted as ``selective layer``.

What differs between the measured runs and the prediction, and is not
corrected for: torchtitan's Llama is its own module (bf16 parameters under
FSDP's mixed precision, not autocast over Hugging Face's LlamaForCausalLM,
whose RMSNorm and residual stream run in fp32); the H100 figures are
Grand Teton H100s with 96 GB HBM2e at a 500 W power limit, predicted as
H100-SXM5-80GB (700 W), which the source says peaks higher. ``--bf16-module``
predicts torchtitan's program instead: the fp32 trace with every op in bf16
(``dtype="bfloat16"``: bf16 activations, norms included), model states
2 + 2 + 12 bytes per parameter, all sharded by FSDP as under autocast.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

H100_SRC = ("pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md (Dec 2024; "
            "Grand Teton, 8 H100 96GB HBM2e per host at 500 W, 400 Gb/s RDMA per GPU)")
A100_SRC = ("pytorch/torchtitan docs/performance.md at 0413364 (64 A100 80GB, FSDP2, "
            "'WPS' = tokens/s per GPU)")

# model, seq, GPUs, local batch, published AC, published tokens/s/GPU, GiB/GPU, GPU, source
PUBLISHED = [
    ("llama3-8b", 8192, 8, 2, "selective op", 5762.0, 82.4, "H100-SXM5-80GB@500W",
     H100_SRC + ", Table 1 (FSDP, no torch.compile)"),
    ("llama3-8b", 8192, 128, 2, "selective op", 5605.0, 67.0, "H100-SXM5-80GB@500W",
     H100_SRC + ", Table 3 (FSDP, no torch.compile)"),
    ("llama3-8b", 8192, 64, 1, "selective layer", 2904.0, None, "A100-SXM4-80GB", A100_SRC),
    ("llama3-8b", 8192, 64, 1, "selective op", 2973.0, None, "A100-SXM4-80GB", A100_SRC),
    ("llama3-70b", 8192, 64, 1, "full", 331.0, None, "A100-SXM4-80GB", A100_SRC),
    ("llama2-13b", 4096, 64, 2, "none", 2162.0, None, "A100-SXM4-80GB", A100_SRC),
    ("llama2-13b", 4096, 64, 2, "selective layer", 1914.0, None, "A100-SXM4-80GB", A100_SRC),
    ("llama2-13b", 4096, 64, 2, "selective op", 1904.0, None, "A100-SXM4-80GB", A100_SRC),
    ("llama2-70b", 4096, 64, 1, "selective op", 355.0, None, "A100-SXM4-80GB", A100_SRC),
    ("llama2-70b", 4096, 64, 2, "full", 353.0, None, "A100-SXM4-80GB", A100_SRC),
]


def graph(name: str, seq: int, folder: str | None, amp: str | None = "bf16"):
    """The zoo model's training step under bf16 autocast, or in fp32 with
    `amp=None` (traced once, kept in `folder`)."""
    import predictor

    if folder:
        path = Path(folder) / f"{name}-s{seq}-{amp or 'fp32'}.npz"
        if path.exists():
            return predictor.Graph.load(path)
    g = predictor.trace(name, seq_len=seq, amp=amp)
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        g.save(path)
    return g


def predict(g, gpu: str, n: int, local_batch: int, ac: str, dtype=None):
    """(tokens/s per GPU, GiB per GPU) for FSDP over `n` GPUs."""
    import predictor

    def one(ck):
        p = predictor.predict(g, gpu, batch_size=local_batch, checkpoint=ck, dtype=dtype,
                              parallel=predictor.Parallel(dp=n, fsdp=True))
        return p.tokens_per_s / n, p.memory_gb

    if ac == "full":
        return one("full")
    if ac.startswith("selective"):
        (t0, m0), (t1, m1) = one(None), one("full")
        # half the blocks recomputed: the mean time per step, the mean memory
        return 2.0 / (1.0 / t0 + 1.0 / t1), (m0 + m1) / 2.0
    return one(None)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graphs", help="folder to keep the traced graphs in (reused when there)")
    ap.add_argument("--bf16-module", action="store_true",
                    help="the fp32 trace run in bf16 (torchtitan's bf16 module) instead of autocast")
    args = ap.parse_args(argv)
    amp, dtype = (None, "bfloat16") if args.bf16_module else ("bf16", None)
    rows = []
    cache = {}
    for name, seq, n, lb, ac, tps, mem, gpu, src in PUBLISHED:
        key = (name, seq)
        if key not in cache:
            cache[key] = graph(name, seq, args.graphs, amp)
        t, m = predict(cache[key], gpu, n, lb, ac, dtype)
        rows.append((name, seq, gpu, n, lb, ac, tps, t, mem, m, src))
    print("| model | seq | GPU (predicted as) | GPUs | local batch | AC | published tok/s/GPU "
          "| predicted | error | published GiB/GPU | predicted | error |")
    print("| --- | ---: | --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    terr, merr = [], []
    for name, seq, gpu, n, lb, ac, tps, t, mem, m, _ in rows:
        e = (t - tps) / tps * 100
        terr.append(abs(e))
        if mem is not None:
            me = (m - mem) / mem * 100
            merr.append(abs(me))
            mcols = f"{mem:.1f} | {m:.1f} | {me:+.1f} %"
        else:
            mcols = "– | " + f"{m:.1f} | –"
        print(f"| {name} | {seq} | {gpu} | {n} | {lb} | {ac} | {tps:,.0f} | {t:,.0f} | "
              f"{e:+.1f} % | {mcols} |")
    print()
    print(f"time: mean |error| {sum(terr) / len(terr):.1f} % over {len(terr)} runs "
          f"(worst {max(terr):.1f} %)")
    if merr:
        print(f"memory: mean |error| {sum(merr) / len(merr):.1f} % over {len(merr)} runs")
    print()
    for src in dict.fromkeys(r[-1] for r in rows):
        print(f"source: {src}")
    assert all(math.isfinite(r[7]) and r[7] > 0 for r in rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
