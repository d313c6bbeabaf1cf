"""Float8 training (``amp="fp8"``) against published float8-over-bf16 speedups.

    python -m benchmarks.fp8_published
    python -m benchmarks.fp8_published --graphs /tmp/graphs   # keeps the Llama traces

A reported check, not a fit: nothing in the predictor is tuned to these
figures. Every published figure here is a speedup of torchao's float8
training (tensorwise scaling) over the same job in bf16, measured with
torch.compile on both sides, so each row compares the ratio of two
predictions (the step traced with ``amp="fp8"`` and with ``amp="bf16"``,
everything else equal) with the published ratio:

- one ``nn.Linear``, forward and backward, bf16 weights and input, on an
  H100: torchao's README gives two shapes of its microbenchmark;
- Llama 3 8B pretraining in torchtitan (FSDP2 over 8 or 128 GPUs, sequence
  8192, selective activation checkpointing per op), on H100s and MI300Xs:
  tokens/s with and without float8. The Llama steps are the zoo's Hugging
  Face model under autocast, predicted with the published layout as
  ``benchmarks.large_model_published`` predicts torchtitan's bf16 runs.

The H100s of both sources are Meta's (Grand Teton: 96 GB HBM2e at 500 W),
predicted as the 700 W H100-SXM5-80GB, which peaks higher; a ratio of two
predictions on the same part carries less of that than either figure.
"""

from __future__ import annotations

import argparse
import math

from benchmarks import large_model_published as LMP

_AO = "https://github.com/pytorch/ao/blob/{}/torchao/float8/README.md"
AO_OLD = _AO.format("0cf1281a38bdd8c84b11549ffc49a63eb3a92d40") + \
    " ('Performance': float8 linear speedup over bf16 on NVIDIA H100, examples 1 and 2)"
AO_NEW = _AO.format("9519bebbc397d60274982a74c084f9dff18e61a6") + \
    " ('Training benchmarks': torchtitan, 8 GPUs, batch 1, sequence 8192, torch.compile, " \
    "FSDP2, per-op SAC; median tokens/s)"
TITAN = LMP.H100_SRC + " (torch.compile vs torch.compile + Float8)"

# (M, K, N) of the forward GEMM, published float8 speedup, source
LINEARS = [
    ((1024, 2048, 1024), 0.80, AO_OLD),
    ((4096, 8192, 16384), 1.39, AO_OLD),
]

# model, seq, GPUs, local batch, AC, bf16 tokens/s/GPU, float8 tokens/s/GPU, GPU, source
LLAMA = [
    ("llama3-8b", 8192, 8, 1, "selective op", 6150.0, 7689.5, "H100-SXM5-80GB",
     AO_NEW + ", NVIDIA H100 table"),
    ("llama3-8b", 8192, 8, 1, "selective op", 5376.5, 6166.0, "MI300X",
     AO_NEW + ", AMD MI300x table"),
    ("llama3-8b", 8192, 8, 2, "selective op", 6667.0, 8532.0, "H100-SXM5-80GB",
     TITAN + ", Table 1"),
    ("llama3-8b", 8192, 128, 2, "selective op", 6514.0, 8380.0, "H100-SXM5-80GB",
     TITAN + ", Table 3"),
]


def linear_speedup(m: int, k: int, n: int, gpu: str = "H100-SXM5-80GB") -> float:
    """Predicted bf16 / float8 time of one bf16 nn.Linear(k, n) over an [m, k]
    input, forward and backward of ``y.sum()`` (no optimizer step), as
    torchao's microbenchmark times it: its input requires grad, so the
    backward runs both GEMMs (the input here is a parameter of the module, the
    trace's inputs never requiring grad)."""
    import torch

    import predictor

    class Bench(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.x = torch.nn.Parameter(torch.empty(m, k, dtype=torch.bfloat16))
            self.layer = torch.nn.Linear(k, n, bias=False, dtype=torch.bfloat16)

        def forward(self, unused):
            return self.layer(self.x)

    t = {}
    for amp in ("bf16", "fp8"):
        g = predictor.trace(Bench(), (torch.zeros(1),), optimizer="none", amp=amp,
                            loss_fn=lambda y: y.sum(), name=f"linear-{amp}")
        t[amp] = predictor.predict(g, gpu).iteration_ms
    return t["bf16"] / t["fp8"]


def run(graphs: str | None = None, llama: bool = True) -> list[dict]:
    rows = []
    for (m, k, n), published, src in LINEARS:
        rows.append({"job": f"nn.Linear M={m} K={k} N={n}, fwd+bwd", "gpu": "H100-SXM5-80GB",
                     "published": published, "predicted": linear_speedup(m, k, n),
                     "source": src})
    if llama:
        cache = {}
        for name, seq, n, lb, ac, bf16, fp8, gpu, src in LLAMA:
            for amp in ("bf16", "fp8"):
                if (name, seq, amp) not in cache:
                    cache[name, seq, amp] = LMP.graph(name, seq, graphs, amp)
            t16, _ = LMP.predict(cache[name, seq, "bf16"], gpu, n, lb, ac)
            t8, _ = LMP.predict(cache[name, seq, "fp8"], gpu, n, lb, ac)
            rows.append({"job": f"{name} seq {seq}, FSDP {n} GPUs, local batch {lb}, {ac} AC",
                         "gpu": gpu, "published": fp8 / bf16, "predicted": t8 / t16,
                         "source": src, "bf16_published": bf16, "bf16_predicted": t16,
                         "fp8_published": fp8, "fp8_predicted": t8})
    for r in rows:
        r["error_pct"] = 100.0 * (r["predicted"] - r["published"]) / r["published"]
    assert all(math.isfinite(r["predicted"]) and r["predicted"] > 0 for r in rows)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graphs", help="folder to keep the Llama traces in (reused when there)")
    args = ap.parse_args(argv)
    rows = run(args.graphs)
    print("| job | GPU (predicted as) | published float8 speedup | predicted | error |")
    print("| --- | --- | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['job']} | {r['gpu']} | {r['published']:.3f} | {r['predicted']:.3f} | "
              f"{r['error_pct']:+.1f} % |")
    err = [abs(r["error_pct"]) for r in rows]
    print(f"\nmean |error| of the speedup {sum(err) / len(err):.1f} % over {len(rows)} figures "
          f"(worst {max(err):.1f} %)")
    print("\nThe Llama rows' tokens/s per GPU (published with torch.compile; predicted eager):")
    print("| job | GPU | bf16 published | bf16 predicted | float8 published | float8 predicted |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for r in rows:
        if "bf16_published" in r:
            print(f"| {r['job']} | {r['gpu']} | {r['bf16_published']:,.0f} | "
                  f"{r['bf16_predicted']:,.0f} | {r['fp8_published']:,.0f} | "
                  f"{r['fp8_predicted']:,.0f} |")
    print()
    for src in dict.fromkeys(r["source"] for r in rows):
        print(f"source: {src}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
