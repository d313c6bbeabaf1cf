"""Sanity check of the data-parallel model against published 1 -> N GPU scaling.

Lambda's PyTorch training benchmarks publish ResNet-50 throughput on 1, 2, 4
and 8 GPUs of one server (github.com/lambdal/deeplearning-benchmark,
``pytorch/pytorch-train-throughput-fp32.csv``, per-GPU batch sizes in
``pytorch/pytorch-train-bs-fp32.csv``; NVIDIA's ResNet-50 v1.5 in NGC PyTorch
22.10). Their measured scaling efficiency (throughput on N GPUs / N x one
GPU) is compared with the predictor's for the same per-GPU batch size:
``predictor.search(..., gpus_per_node=N)``. Only the efficiency is compared:
the absolute throughput depends on the per-op time model, not on this one.

    python benchmarks/ddp_scaling.py
"""

from __future__ import annotations

import sys

import predictor

# (our GPU id, Lambda's row, per-GPU batch, N, images/s on 1 GPU, images/s on N GPUs)
LAMBDA_RESNET50_FP32 = [
    ("V100-SXM2-16GB", "LambdaCloud V100 16GB", 128, 8, 369.0, 2817.0),
    ("A100-SXM4-80GB", "A100 80GB SXM4", 640, 8, 1066.0, 7397.0),
    ("A100-PCIE-80GB", "A100 80GB PCIe", 640, 2, 1014.0, 1957.0),
    ("H100-PCIE-80GB", "H100 80GB PCIe Gen5", 640, 8, 1197.0, 9397.0),
    # Lambda's tables list no batch size for the H100 SXM5; its 1-GPU run's log
    # (pytorch/results/H100_80GB_SXM5_v1/PyTorch_resnet50_FP32/) prints 640.
    ("H100-SXM5-80GB", "H100 80GB SXM5", 640, 8, 1753.0, 13856.0),
    ("RTX-6000-ADA", "RTX 6000 Ada", 496, 8, 647.0, 5126.0),
]


def main() -> int:
    graph = predictor.trace("resnet50", batch_size=64)
    print(f"{'GPU':<16}{'batch':>6}{'N':>3}{'Lambda eff.':>13}{'predicted eff.':>16}"
          f"{'exposed comm ms':>17}{'iteration ms':>14}")
    for gpu, _row, batch, n, one, many in LAMBDA_RESNET50_FP32:
        res = predictor.search(graph, gpus=[gpu], batch_sizes=[batch], gpus_per_node=n)
        row = res.to_pandas().iloc[0]
        measured = many / (n * one)
        print(f"{gpu:<16}{batch:>6}{n:>3}{measured:>13.1%}{row['scaling_efficiency']:>16.1%}"
              f"{row['comm_ms']:>17.2f}{row['iteration_ms']:>14.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
