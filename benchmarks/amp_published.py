"""Predicted against published single-GPU training throughput, fp32/TF32 and AMP
(and, apart, NVIDIA's published ResNet-50 inference throughput).

    python -m benchmarks.amp_published
    python -m benchmarks.amp_published --models bert-large-squad
    python -m benchmarks.amp_published --bert-amp autocast

A reported check, not a fit: nothing in the predictor is tuned to these
figures. Each row: (model, GPU, precision, batch size per GPU, published
samples/s, source). Precision "tf32" is fp32 with TF32 matmuls and convolutions
(what NVIDIA's "TF32" columns run), "fp32" is fp32 on a GPU without TF32, "amp"
is each script's mixed precision: torch.autocast fp16 with a GradScaler for
ResNet-50, apex O2 (a 16-bit model with fp32 master weights) for BERT's SQuAD
runs (`program`; `--bert-amp autocast` traces those rows under autocast
instead). BERT's step clips its gradients, and its fp32 optimizer updates one
parameter at a time, as run_squad.py's do (`bert_optimizer`).

Two publishers: NVIDIA's own DeepLearningExamples READMEs (A100, V100) and
Lambda's PyTorch benchmark tables (github.com/lambdal/deeplearning-benchmark,
which run the same DeepLearningExamples scripts on 1 GPU of each of its
machines: ResNet-50 v1.5, and BERT-large and BERT-base SQuAD fine-tuning at
sequence 384).
The summary gives the mean |error| and the Spearman rank correlation across
GPUs for each publisher, model and precision (a ranking is only taken within
one publisher: the two run different batch sizes and software).
"""

from __future__ import annotations

import argparse
import csv
import functools
from pathlib import Path

import numpy as np

# The SQuAD fine-tuning runs (run_squad.py), by the BERT size they train.
SQUAD_MODELS = {"bert-large-squad": "large", "bert-base-squad": "base"}

RN50 = ("NVIDIA DeepLearningExamples, PyTorch/Classification/ConvNets/resnet50v1.5/README.md, "
        "'Training performance results', 1 GPU, pytorch-21.03 NGC container")

# NVIDIA's ResNet-50 AMP runs train channels-last: DeepLearningExamples'
# PyTorch/Classification/ConvNets/configs.yml sets `memory_format: nhwc` for
# resnet50 AMP on DGX1V, DGX2V, DGXA100 and T4 (its TF32/FP32 runs keep the
# default, NCHW). Lambda's configuration (pytorch/scripts/config_v1/
# config_pytorch_*.sh: --amp, no --memory-format) trains in NCHW, PyTorch's
# default. The memory format matters only to half-precision convolutions
# (cuDNN's layout transposes; predictor.families._layout_transposes).
def memory_format(model: str, precision: str, source: str) -> str | None:
    """The memory format a published run trains in (None: NCHW, the default)."""
    if model == "resnet50" and precision == "amp" and publisher(source) == "NVIDIA":
        return "channels_last"
    return None


# DeepLearningExamples' BERT fine-tuning does not run torch.autocast: with
# --fp16/--amp, PyTorch/LanguageModeling/BERT/run_squad.py calls apex's
# amp.initialize(model, optimizer, opt_level="O2", keep_batchnorm_fp32=False),
# which casts the whole model to fp16 (layer norm, softmax and the attention
# mask included) and keeps fp32 master weights for apex's FusedAdam; without
# it the model stays fp32 (BertAdam, unfused). The faithful trace of those AMP
# rows is a 16-bit model with fp32 master weights, `o2_graph` of the fp32
# trace (its forward and backward in fp16, its optimizer in fp32, and O2's
# two per-step copies between them). `program` says which.
# Both paths of run_squad.py clip the gradients every step (its GradientClipper,
# apex's multi-tensor L2 norm and scale: `+clip`); the fp32 path's BertAdam
# (DeepLearningExamples' optimization.py) updates one parameter at a time, a
# kernel per operation (`-loop`: PyTorch's for-loop AdamW, 8 kernels a
# parameter where BertAdam runs 9 to 11, without its own second norm), the
# AMP path's FusedAdam all at once: one multi-tensor kernel that reads each
# parameter, its gradient and both moments and writes three of them, as
# PyTorch's fused AdamW does (`-fused`; PyTorch's multi-tensor `adamw`
# runs a pass per operation, about three times the bytes).
def bert_optimizer(how: str) -> str:
    """The optimizer a BERT SQuAD row's step is traced with."""
    return "adamw-loop+clip" if how == "fp32" else "adamw-fused+clip"


def o2_graph(graph):
    """`graph` (an fp32 trace) as apex's O2 runs it: every floating-point row
    of the forward and backward passes in fp16 (the 16-bit model), the
    optimizer's rows in fp32 on the master weights, and the two passes O2
    adds each step over every trainable parameter, each one multi-tensor
    kernel (apex's `multi_tensor_scale`): the scaled fp16 gradients
    unscaled into the fp32 master gradients, and the updated master weights
    cast back into the fp16 model. Priced as `predict(dtype="float16")`
    would, the optimizer ran on fp16 weights and those passes were free:
    1 % of a BERT-large step, a tenth of a Transformer-XL one on a V100,
    whose 267,735-word embedding outweighs its layers."""
    import dataclasses

    from predictor import families
    from predictor.kernels import layout as L

    ops = graph.ops
    model = ops.with_dtype(L.F16)
    dtype = np.where(ops.phase == L.OPTIMIZER_PHASE, ops.dtype, model.dtype)
    ops = dataclasses.replace(model, dtype=dtype)
    n = max(int(graph.trainable_parameters), 1)
    half = (n + 1) // 2  # n fp16 elements, in fp32 units
    kernels = max(-(-n // families._MTA_ELEMS_PER_LAUNCH), 1)
    for name, read, written in (("o2_unscale_grads", half, n), ("o2_master_to_model", n, half)):
        _, dims, _ = families.memory_row(L.OPTIMIZER, read, written, n, n, 1)
        ops = ops.with_rows(name, [(L.OPTIMIZER, L.OPTIMIZER_PHASE, L.F32, dims, kernels, 1)])
    return dataclasses.replace(graph, ops=ops)


def program(model: str, precision: str, bert_amp: str = "o2") -> str:
    """How a published run's step is traced: 'o2' (DeepLearningExamples'
    BERT AMP: a 16-bit model; `bert_amp`="autocast" traces it under autocast
    instead), 'autocast' (the other AMP runs), 'fp32'."""
    if precision != "amp":
        return "fp32"
    return bert_amp if model in SQUAD_MODELS else "autocast"


BERT = ("NVIDIA DeepLearningExamples, PyTorch/LanguageModeling/BERT/README.md, 'Fine-tuning "
        "NVIDIA DGX A100 (8x A100 80GB)' and 'Fine-tuning NVIDIA DGX-1 With 32G', SQuAD v1.1, "
        "1 GPU, pytorch:21.11-py3 NGC container")

PUBLISHED = [
    ("resnet50", "A100-SXM4-80GB", "tf32", 256, 938.0, RN50),
    ("resnet50", "A100-SXM4-80GB", "amp", 256, 2470.0, RN50),
    ("resnet50", "V100-SXM2-16GB", "fp32", 256, 367.0, RN50),
    ("resnet50", "V100-SXM2-16GB", "amp", 256, 1200.0, RN50),
    ("resnet50", "V100-SXM2-32GB", "fp32", 256, 356.0, RN50),
    ("resnet50", "V100-SXM2-32GB", "amp", 256, 1156.0, RN50),
    # BERT-large fine-tuned on SQuAD v1.1 (sequence length 384, run_squad.py).
    ("bert-large-squad", "A100-SXM4-80GB", "tf32", 32, 61.5, BERT),
    ("bert-large-squad", "A100-SXM4-80GB", "amp", 32, 110.5, BERT),
    ("bert-large-squad", "V100-SXM2-32GB", "fp32", 8, 12.0, BERT),
    ("bert-large-squad", "V100-SXM2-32GB", "amp", 16, 52.0, BERT),
]

_LAMBDA = ("https://github.com/lambdal/deeplearning-benchmark/blob/"
           "0235381f1bf0c4550a981f7e81f90e72f175756f/pytorch/{}")

# Lambda's A10 and H100 SXM5 rows came later, in its CSV tables, with no
# batch-size rows: the batch each ran is the one its own log prints
# (pytorch/results/LambdaCloud_A10_v1/ and H100_80GB_SXM5_v1/, February 2023,
# the same scripts and container).
_LAMBDA_LATER = ("https://github.com/lambdal/deeplearning-benchmark/blob/"
                 "0551cb70ffdc155dc4cb2c10dddebb65651c3883/pytorch/{}")
LAMBDA_LATER_AMP = ("Lambda, " + _LAMBDA_LATER.format("pytorch-train-throughput-fp16.csv")
                    + " (1-GPU rows 'LambdaCloud A10' and 'H100 80GB SXM5'; batch per GPU "
                    "from each run's log)")
LAMBDA_LATER_FP32 = ("Lambda, " + _LAMBDA_LATER.format("pytorch-train-throughput-fp32.csv")
                     + " (1-GPU rows 'LambdaCloud A10' and 'H100 80GB SXM5'; batch per GPU "
                     "from each run's log)")


# Lambda's 2024-2025 runs (its "v2" harness: pytorch/results_v2/, NGC
# pytorch 24.10 on the GH200, 25.06 on the B200) are in the tables of
# pytorch/csv_v1_v2/. The GH200's batch sizes are in the batch-size tables;
# the B200's, which have no row there, in each run's log (the same batches as
# config_v2/config_pytorch_192GB.sh). The B200 has no fp32 row in any stored
# version of the fp32 table: its TF32 figures are the closing throughput its
# runs' logs print, the line the tables are compiled from.
_LAMBDA_V2 = "https://github.com/lambdal/deeplearning-benchmark/blob/{}/pytorch/{}"
LAMBDA_V2_AMP = ("Lambda, " + _LAMBDA_V2.format("705355b8376c965282b2453ea72cf17b6a0aca65",
                                                 "csv_v1_v2/pytorch-train-throughput-fp16.csv")
                 + " (1-GPU rows 'LambdaCloud 1x GH200 96GB' and 'LambdaCloud 1x B200 192GB SXM5'; "
                 "the GH200's batch from csv_v1_v2/pytorch-train-bs-fp16.csv at 848edec, the "
                 "B200's from its run's log)")
LAMBDA_V2_FP32 = ("Lambda, " + _LAMBDA_V2.format("d743970e0ee27f08672655dc0292f99c2529945a",
                                                  "csv_v1_v2/pytorch-train-throughput-fp32.csv")
                  + " (1-GPU row 'LambdaCloud 1x GH200 96GB'; batch from "
                  "csv_v1_v2/pytorch-train-bs-fp32.csv at e3c3fe3)")
LAMBDA_V2_B200_LOG = ("Lambda, " + _LAMBDA_V2.format(
    "200af3b7ce8ee1f55c7ed6eaee0df2cafe2d7886",
    "results_v2/LambdaOD_test_1xB200_192GB_129-213-83-251_v2/")
    + " (the 1x B200 runs' fp32 logs: the closing throughput each prints, and its batch; "
    "no published fp32 row)")


def lambda_source(column: str) -> str:
    """The source of one column of Lambda's tables (both precisions), as the
    GNMT and NCF harnesses cite it."""
    return ("Lambda, " + _LAMBDA.format("pytorch-train-throughput-fp16.json") + " and "
            + _LAMBDA.format("pytorch-train-throughput-fp32.json")
            + f" (1-GPU rows, column {column}; batch per GPU from pytorch-train-bs-fp16.json and "
            "pytorch-train-bs-fp32.json); the A10 and H100 SXM5 rows from "
            + _LAMBDA_LATER.format("pytorch-train-throughput-fp16.csv") + " and -fp32.csv, "
            "batch from each run's log; NGC pytorch-22.10")

LAMBDA_AMP = ("Lambda, " + _LAMBDA.format("pytorch-train-throughput-fp16.json")
              + " (1-GPU rows; batch per GPU from "
              + _LAMBDA.format("pytorch-train-bs-fp16.json") + ")")
LAMBDA_FP32 = ("Lambda, " + _LAMBDA.format("pytorch-train-throughput-fp32.json")
               + " (1-GPU rows; batch per GPU from "
               + _LAMBDA.format("pytorch-train-bs-fp32.json") + ")")


# Lambda's fp16 columns are DeepLearningExamples' AMP runs; its fp32 columns run
# in NGC containers with TF32 on, so they are "tf32" on Ampere and newer. The
# GPUs taken are those with both a throughput and a batch size (a batch-size
# row, or for the two later boards the run's log) and in specs/gpus.toml (the
# Quadro RTX 8000 joined it on 5 Dec 2026).
# "LambdaCloud V100 16GB" is taken as the SXM2 part (Lambda Cloud's V100
# instances; its fp32 ResNet-50, 369 images/s, matches NVIDIA's DGX-1 V100
# 16GB, 367).
PUBLISHED += [
    # (model, GPU, precision, batch, samples/s, source)
    ("resnet50", "V100-SXM2-16GB", "amp", 256, 833.0, LAMBDA_AMP),
    ("resnet50", "RTX-3090", "amp", 448, 905.0, LAMBDA_AMP),
    ("resnet50", "A100-PCIE-40GB", "amp", 720, 1396.0, LAMBDA_AMP),
    ("resnet50", "A100-PCIE-80GB", "amp", 1280, 1527.0, LAMBDA_AMP),
    ("resnet50", "A100-SXM4-80GB", "amp", 1280, 1582.0, LAMBDA_AMP),
    ("resnet50", "RTX-6000-ADA", "amp", 928, 1146.0, LAMBDA_AMP),
    ("resnet50", "RTX-A6000", "amp", 928, 916.0, LAMBDA_AMP),
    ("resnet50", "RTX-4090", "amp", 448, 1301.0, LAMBDA_AMP),
    ("resnet50", "H100-PCIE-80GB", "amp", 1280, 1866.0, LAMBDA_AMP),
    ("bert-large-squad", "V100-SXM2-16GB", "amp", 16, 57.0, LAMBDA_AMP),
    ("bert-large-squad", "RTX-3090", "amp", 28, 52.0, LAMBDA_AMP),
    ("bert-large-squad", "A100-PCIE-40GB", "amp", 48, 117.0, LAMBDA_AMP),
    ("bert-large-squad", "A100-PCIE-80GB", "amp", 112, 140.0, LAMBDA_AMP),
    ("bert-large-squad", "A100-SXM4-80GB", "amp", 112, 152.0, LAMBDA_AMP),
    ("bert-large-squad", "RTX-6000-ADA", "amp", 64, 79.0, LAMBDA_AMP),
    ("bert-large-squad", "RTX-A6000", "amp", 64, 68.0, LAMBDA_AMP),
    ("bert-large-squad", "RTX-4090", "amp", 28, 93.0, LAMBDA_AMP),
    ("bert-large-squad", "H100-PCIE-80GB", "amp", 112, 203.0, LAMBDA_AMP),
    ("resnet50", "V100-SXM2-16GB", "fp32", 128, 369.0, LAMBDA_FP32),
    ("resnet50", "RTX-3090", "tf32", 224, 513.0, LAMBDA_FP32),
    ("resnet50", "A100-PCIE-40GB", "tf32", 360, 882.0, LAMBDA_FP32),
    ("resnet50", "A100-PCIE-80GB", "tf32", 640, 1014.0, LAMBDA_FP32),
    ("resnet50", "A100-SXM4-80GB", "tf32", 640, 1066.0, LAMBDA_FP32),
    ("resnet50", "RTX-6000-ADA", "tf32", 496, 647.0, LAMBDA_FP32),
    ("resnet50", "RTX-A6000", "tf32", 496, 514.0, LAMBDA_FP32),
    ("resnet50", "RTX-4090", "tf32", 224, 721.0, LAMBDA_FP32),
    ("resnet50", "H100-PCIE-80GB", "tf32", 640, 1197.0, LAMBDA_FP32),
    ("bert-large-squad", "V100-SXM2-16GB", "fp32", 8, 12.0, LAMBDA_FP32),
    ("bert-large-squad", "RTX-3090", "tf32", 16, 24.0, LAMBDA_FP32),
    ("bert-large-squad", "A100-PCIE-40GB", "tf32", 28, 53.0, LAMBDA_FP32),
    ("bert-large-squad", "A100-PCIE-80GB", "tf32", 64, 70.0, LAMBDA_FP32),
    ("bert-large-squad", "A100-SXM4-80GB", "tf32", 64, 75.0, LAMBDA_FP32),
    ("bert-large-squad", "RTX-6000-ADA", "tf32", 32, 44.0, LAMBDA_FP32),
    ("bert-large-squad", "RTX-A6000", "tf32", 32, 33.0, LAMBDA_FP32),
    ("bert-large-squad", "RTX-4090", "tf32", 16, 44.0, LAMBDA_FP32),
    ("bert-large-squad", "H100-PCIE-80GB", "tf32", 64, 97.0, LAMBDA_FP32),
    # BERT-base, the same run_squad.py fine-tuning and 100 steps (Lambda's
    # PyTorch_bert_base_squad_* parameters), at its own batch sizes.
    ("bert-base-squad", "V100-SXM2-16GB", "amp", 48, 189.0, LAMBDA_AMP),
    ("bert-base-squad", "RTX-3090", "amp", 96, 172.0, LAMBDA_AMP),
    ("bert-base-squad", "A100-PCIE-40GB", "amp", 160, 368.0, LAMBDA_AMP),
    ("bert-base-squad", "A100-PCIE-80GB", "amp", 320, 415.0, LAMBDA_AMP),
    ("bert-base-squad", "A100-SXM4-80GB", "amp", 320, 443.0, LAMBDA_AMP),
    ("bert-base-squad", "RTX-6000-ADA", "amp", 192, 255.0, LAMBDA_AMP),
    ("bert-base-squad", "RTX-A6000", "amp", 192, 198.0, LAMBDA_AMP),
    ("bert-base-squad", "RTX-4090", "amp", 96, 297.0, LAMBDA_AMP),
    ("bert-base-squad", "H100-PCIE-80GB", "amp", 320, 567.0, LAMBDA_AMP),
    ("bert-base-squad", "V100-SXM2-16GB", "fp32", 24, 42.0, LAMBDA_FP32),
    ("bert-base-squad", "RTX-3090", "tf32", 48, 85.0, LAMBDA_FP32),
    ("bert-base-squad", "A100-PCIE-40GB", "tf32", 80, 179.0, LAMBDA_FP32),
    ("bert-base-squad", "A100-PCIE-80GB", "tf32", 172, 224.0, LAMBDA_FP32),
    ("bert-base-squad", "A100-SXM4-80GB", "tf32", 172, 239.0, LAMBDA_FP32),
    ("bert-base-squad", "RTX-6000-ADA", "tf32", 96, 136.0, LAMBDA_FP32),
    ("bert-base-squad", "RTX-A6000", "tf32", 96, 101.0, LAMBDA_FP32),
    ("bert-base-squad", "RTX-4090", "tf32", 48, 137.0, LAMBDA_FP32),
    ("bert-base-squad", "H100-PCIE-80GB", "tf32", 172, 292.0, LAMBDA_FP32),
    # The Quadro RTX 8000 (Turing: fp16 tensor cores, no TF32 or bf16), from
    # the same files, added with it to the GPU database.
    ("resnet50", "QUADRO-RTX-8000", "amp", 928, 651.0, LAMBDA_AMP),
    ("bert-large-squad", "QUADRO-RTX-8000", "amp", 64, 50.0, LAMBDA_AMP),
    ("bert-base-squad", "QUADRO-RTX-8000", "amp", 192, 146.0, LAMBDA_AMP),
    ("resnet50", "QUADRO-RTX-8000", "fp32", 496, 274.0, LAMBDA_FP32),
    ("bert-large-squad", "QUADRO-RTX-8000", "fp32", 32, 12.0, LAMBDA_FP32),
    ("bert-base-squad", "QUADRO-RTX-8000", "fp32", 96, 41.0, LAMBDA_FP32),
    # The A10 (GA102 at 150 W) and the H100 SXM5 (GH100, 700 W), from Lambda's
    # later tables: added as they were, without looking at them first.
    ("resnet50", "A10", "amp", 448, 638.0, LAMBDA_LATER_AMP),
    ("bert-large-squad", "A10", "amp", 28, 42.0, LAMBDA_LATER_AMP),
    ("bert-base-squad", "A10", "amp", 80, 135.0, LAMBDA_LATER_AMP),
    ("resnet50", "A10", "tf32", 224, 349.0, LAMBDA_LATER_FP32),
    ("bert-large-squad", "A10", "tf32", 12, 19.0, LAMBDA_LATER_FP32),
    ("bert-base-squad", "A10", "tf32", 48, 70.0, LAMBDA_LATER_FP32),
    ("resnet50", "H100-SXM5-80GB", "amp", 1280, 2616.0, LAMBDA_LATER_AMP),
    ("bert-large-squad", "H100-SXM5-80GB", "amp", 112, 301.0, LAMBDA_LATER_AMP),
    ("bert-base-squad", "H100-SXM5-80GB", "amp", 320, 812.0, LAMBDA_LATER_AMP),
    ("resnet50", "H100-SXM5-80GB", "tf32", 640, 1753.0, LAMBDA_LATER_FP32),
    ("bert-large-squad", "H100-SXM5-80GB", "tf32", 64, 141.0, LAMBDA_LATER_FP32),
    ("bert-base-squad", "H100-SXM5-80GB", "tf32", 172, 408.0, LAMBDA_LATER_FP32),
    # The GH200 (an H100 with 96 GB of HBM3 at 4 TB/s) and the B200
    # (Blackwell, no board of which any check had priced), from Lambda's v2
    # tables and logs: added as they were, without looking at them first.
    ("resnet50", "GH200-96GB", "amp", 1360, 2844.0, LAMBDA_V2_AMP),
    ("bert-large-squad", "GH200-96GB", "amp", 152, 296.0, LAMBDA_V2_AMP),
    ("bert-base-squad", "GH200-96GB", "amp", 384, 838.0, LAMBDA_V2_AMP),
    ("resnet50", "GH200-96GB", "tf32", 720, 2063.0, LAMBDA_V2_FP32),
    ("bert-large-squad", "GH200-96GB", "tf32", 80, 131.0, LAMBDA_V2_FP32),
    ("bert-base-squad", "GH200-96GB", "tf32", 208, 398.0, LAMBDA_V2_FP32),
    ("resnet50", "B200", "amp", 3328, 3076.0, LAMBDA_V2_AMP),
    ("bert-large-squad", "B200", "amp", 256, 523.0, LAMBDA_V2_AMP),
    ("bert-base-squad", "B200", "amp", 768, 1405.0, LAMBDA_V2_AMP),
    ("resnet50", "B200", "tf32", 1664, 2967.0, LAMBDA_V2_B200_LOG),
    ("bert-large-squad", "B200", "tf32", 128, 281.0, LAMBDA_V2_B200_LOG),
    ("bert-base-squad", "B200", "tf32", 384, 855.0, LAMBDA_V2_B200_LOG),
]


# Inference: the same README's "Inference performance results" (pytorch-21.03
# NGC container, 1 GPU: DGX-1 V100 16GB and T4; "Throughput Avg" at the
# largest batch sizes, where the GPU rather than the host sets the pace). A
# separate check from the training table above: its mean is not folded into
# the training figures' mean. T4 is a GPU of the per-kernel data (fp32), but
# no half-precision kernel of it is: its AMP rows check the tensor-core model.
RN50_INF = ("NVIDIA DeepLearningExamples, PyTorch/Classification/ConvNets/resnet50v1.5/README.md, "
            "'Inference performance results', 1 GPU, pytorch-21.03 NGC container")
PUBLISHED_INFERENCE = [
    ("resnet50", "V100-SXM2-16GB", "fp32", 64, 1200.0, RN50_INF),
    ("resnet50", "V100-SXM2-16GB", "fp32", 128, 1229.0, RN50_INF),
    ("resnet50", "V100-SXM2-16GB", "fp32", 256, 1261.0, RN50_INF),
    ("resnet50", "V100-SXM2-16GB", "amp", 64, 2984.0, RN50_INF),
    ("resnet50", "V100-SXM2-16GB", "amp", 128, 3249.0, RN50_INF),
    ("resnet50", "V100-SXM2-16GB", "amp", 256, 3382.0, RN50_INF),
    ("resnet50", "T4", "fp32", 64, 428.0, RN50_INF),
    ("resnet50", "T4", "fp32", 128, 426.0, RN50_INF),
    ("resnet50", "T4", "fp32", 256, 415.0, RN50_INF),
    ("resnet50", "T4", "amp", 64, 1165.0, RN50_INF),
    ("resnet50", "T4", "amp", 128, 1190.0, RN50_INF),
    ("resnet50", "T4", "amp", 256, 1198.0, RN50_INF),
]


def publisher(source: str) -> str:
    return source.split(",", 1)[0].split()[0]


def spearman(a, b) -> float:
    """Spearman rank correlation (ties get their mean rank); nan under 3 points."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    if a.size < 3:
        return float("nan")

    def ranks(x):
        order = np.argsort(x, kind="mergesort")
        r = np.empty(x.size)
        r[order] = np.arange(x.size, dtype=float)
        for v in np.unique(x):
            tie = x == v
            r[tie] = r[tie].mean()
        return r

    ra, rb = ranks(a), ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    den = np.sqrt((ra * ra).sum() * (rb * rb).sum())
    return float((ra * rb).sum() / den) if den > 0 else float("nan")


def program_group(precision: str) -> str:
    """The group a row is ranked in across GPUs: fp32 and TF32 together (one
    program, TF32 where the GPU has it), mixed precision apart."""
    return "fp32/tf32" if precision in ("fp32", "tf32") else precision


def summary(rows) -> list[dict]:
    """Mean |error| and the rank correlation across GPUs per publisher, model, precision."""
    out = []
    keys = dict.fromkeys((publisher(r["source"]), r["model"], program_group(r["precision"]))
                         for r in rows)
    for pub, model, prec in keys:
        g = [r for r in rows if publisher(r["source"]) == pub and r["model"] == model
             and program_group(r["precision"]) == prec]
        out.append({"publisher": pub, "model": model, "precision": prec, "gpus": len(g),
                    "mean_abs_error_pct": float(np.mean([abs(r["error_pct"]) for r in g])),
                    "spearman": spearman([r["published"] for r in g],
                                         [r["predicted"] for r in g])})
    return out


def rank_correlations(rows: list[dict]) -> dict[str, float]:
    """Spearman's correlation of predicted with published throughput across
    the GPUs of `rows` (one publisher's table of one model), per
    `program_group`, or per the rows' own "group" where they name one (a
    published column whose runs trained in different precisions)."""
    def group(r):
        return r.get("group") or program_group(r["precision"])

    out = {}
    for name in dict.fromkeys(group(r) for r in rows):
        sel = [r for r in rows if group(r) == name]
        out[name] = spearman([r["published"] for r in sel], [r["predicted"] for r in sel])
    return out


def print_lambda_summary(nvidia: list[dict], lam: list[dict]) -> None:
    """The closing lines of a harness with NVIDIA's and Lambda's tables (GNMT,
    NCF): the rankings across Lambda's GPUs, the mean |error| of both."""
    for name, rho in rank_correlations(lam).items():
        print(f"Spearman across Lambda's GPUs, {name}: {rho:.2f}")
    both = nvidia + lam
    print(f"\nall: mean |error| {np.mean([abs(r['error_pct']) for r in both]):.1f} % "
          f"over {len(both)} figures")

SQUAD_SEQ = 384


def _bert_squad(size: str):
    """A factory of BERT-`size` with a span head (BertForQuestionAnswering),
    as run_squad.py trains it."""
    from predictor.zoo import hf

    def build():
        return hf._from_config("AutoModelForQuestionAnswering", hf.bert_config(f"bert-{size}"))
    return build


def _squad_inputs(batch: int) -> dict:
    import torch

    ids = torch.zeros(batch, SQUAD_SEQ, dtype=torch.long)
    return {"input_ids": ids, "token_type_ids": ids, "attention_mask": torch.ones_like(ids)}


def _squad_loss(out):
    """(cross entropy of the start positions + of the end positions) / 2."""
    import torch
    import torch.nn.functional as F

    start, end = out["start_logits"], out["end_logits"]
    target = start.new_zeros(start.shape[0], dtype=torch.long)
    return (F.cross_entropy(start, target) + F.cross_entropy(end, target)) / 2


def _trace(model: str, batch: int, amp, fmt=None, mode: str = "train",
           optimizer: str = "adamw+clip"):
    import predictor

    if model in SQUAD_MODELS:
        return predictor.trace(_bert_squad(SQUAD_MODELS[model]), _squad_inputs,
                               loss_fn=_squad_loss, batch_size=batch, amp=amp,
                               optimizer=optimizer, name=model, memory_format=fmt, mode=mode)
    return predictor.trace(model, batch_size=batch, amp=amp, memory_format=fmt, mode=mode)


def run(models=None, table=None, mode: str = "train", bert_amp: str = "o2") -> list[dict]:
    """Predicted against published throughput for each row of `table`
    (default PUBLISHED, training steps; PUBLISHED_INFERENCE with
    mode="inference"). `bert_amp` traces BERT's SQuAD AMP rows as their
    scripts run them ('o2', `program`) or under torch.autocast ('autocast')."""
    import predictor

    graphs: dict = {}
    out = []
    for model, gpu, prec, batch, published, source in (PUBLISHED if table is None else table):
        if models is not None and model not in models:
            continue
        how = program(model, prec, bert_amp)
        amp = "fp16" if how == "autocast" else None
        fmt = memory_format(model, prec, source)
        opt = bert_optimizer(how)
        key = (model, amp, fmt, opt if model in SQUAD_MODELS else None)
        if key not in graphs:
            graphs[key] = _trace(model, batch, amp, fmt, mode, opt)
        graph = o2_graph(graphs[key]) if how == "o2" else graphs[key]
        p = predictor.predict(graph, gpu, batch_size=batch,
                              tf32_matmul=True if prec == "tf32" else None)
        predicted = batch / p.iteration_ms * 1e3
        by_family = p.by_family()["ms"]
        out.append({"model": model, "gpu": gpu, "precision": prec, "batch": batch,
                    "program": how, "memory_format": fmt or "contiguous",
                    "published": published, "predicted": predicted,
                    "step_ms": p.iteration_ms,
                    "memory_bound_ms": float(by_family.drop(TENSOR_FAMILIES, errors="ignore").sum()),
                    "error_pct": 100.0 * (predicted - published) / published, "source": source})
    return out


# Lambda's BERT SQuAD runs stop after 100 optimizer steps (`max_steps` "100"
# in pytorch/scripts/config_v1/config_pytorch_*.sh), and run_squad.py divides
# batch x 100 by the wall time of its whole training loop, the first steps'
# start-up included. Their logs also print a progress bar whose rate
# (tqdm's smoothed iterations per second) gives each run's own step time:
# copied for iterations 15, 50 and 100 to LAMBDA_BERT_LOGS.
LAMBDA_BERT_STEPS = 100
LAMBDA_BERT_LOGS = Path(__file__).resolve().parent / "data" / "lambda_bert" / "tqdm_rates.tsv"
# Lambda's result folders (pytorch/results/<folder>/) of its single-GPU rows.
LAMBDA_FOLDERS = {
    "QuadroRTX8000_v1": "QUADRO-RTX-8000", "LambdaCloud_V100_16GB_v1": "V100-SXM2-16GB",
    "3090_v1": "RTX-3090", "LambdaCloud_A100_40GB_PCIe_v1": "A100-PCIE-40GB",
    "A100_80GB_PCIe_v1": "A100-PCIE-80GB", "A100_80GB_SXM4_v1": "A100-SXM4-80GB",
    "AdaA6000_v1": "RTX-6000-ADA", "A6000_v1": "RTX-A6000", "4090_v1": "RTX-4090",
    "H100_80GB_PCIe5_v1": "H100-PCIE-80GB", "LambdaCloud_A10_v1": "A10",
    "H100_80GB_SXM5_v1": "H100-SXM5-80GB",
    # pytorch/results_v2/: the GH200's runs are filed under two names.
    "LambdaOD_1x_GH200_96GB_192-222-57-0_v2": "GH200-96GB",
    "LambdaOD_1x_1xGH200_96GB_192-222-57-0_v2": "GH200-96GB",
    "LambdaOD_test_1xB200_192GB_129-213-83-251_v2": "B200",
}
def lambda_precision(gpu: str, fp16: bool) -> str:
    """The precision a Lambda run's column is on `gpu`: "amp" for its fp16
    column, "tf32" for its fp32 one where the GPU runs fp32 matmuls on TF32
    tensor cores (``kernels.precision.has_tf32``; NGC containers turn TF32 on),
    "fp32" elsewhere."""
    from predictor import hardware
    from predictor.kernels import precision

    if fp16:
        return "amp"
    return "tf32" if precision.has_tf32(hardware.get(gpu).features) else "fp32"


def _seconds_per_step(rate: str) -> float:
    """tqdm's printed rate ('1.43it/s' or '1.27s/it') as seconds a step."""
    if rate.endswith("it/s"):
        return 1.0 / float(rate[:-4])
    if rate.endswith("s/it"):
        return float(rate[:-4])
    raise ValueError(f"not a tqdm rate: {rate!r}")


@functools.lru_cache(maxsize=None)
def lambda_bert_logs() -> dict:
    """{(model, GPU, precision, batch): {"step_s": at iteration 100, "early_step_s": at
    15, "e2e_s", "published"}} from Lambda's BERT logs (precision "fp32" or
    "tf32" as the PUBLISHED rows name it)."""
    out = {}
    lines = [ln for ln in LAMBDA_BERT_LOGS.read_text().splitlines() if not ln.startswith("#")]
    for row in csv.DictReader(lines, delimiter="\t"):
        gpu = LAMBDA_FOLDERS[row["folder"]]
        size = "large" if "large" in row["subfolder"] else "base"
        prec = lambda_precision(gpu, row["subfolder"].endswith("FP16"))
        out[(f"bert-{size}-squad", gpu, prec, int(row["train_batch_size"]))] = {
            "step_s": _seconds_per_step(row["rate_iter100"]),
            "early_step_s": _seconds_per_step(row["rate_iter15"]),
            "e2e_s": float(row["e2e_train_time"]),
            "published": float(row["training_sequences_per_second"]),
        }
    return out


def logged_steps(rows) -> list[dict]:
    """For Lambda's BERT SQuAD rows with a log: the run's own step time (at
    iteration 100) against the predicted step, how much slower its steps ran
    at iteration 100 than at 15 (`drift_pct`), and the seconds of its timed
    loop outside 100 such steps (`outside_s`, the start-up)."""
    logs = lambda_bert_logs()
    out = []
    for r in rows:
        log = logs.get((r["model"], r["gpu"], r["precision"], r["batch"]))
        if log is None or publisher(r["source"]) != "Lambda":
            continue
        step_s = r["batch"] / r["predicted"]
        out.append({"model": r["model"], "gpu": r["gpu"], "precision": r["precision"],
                    "batch": r["batch"], "logged_ms": 1e3 * log["step_s"],
                    "predicted_ms": 1e3 * step_s,
                    "step_error_pct": 100.0 * (step_s / log["step_s"] - 1),
                    "drift_pct": 100.0 * (log["step_s"] / log["early_step_s"] - 1),
                    "outside_s": log["e2e_s"] - LAMBDA_BERT_STEPS * log["step_s"]})
    return out


# Lambda's earlier runs of the same BERT fine-tuning and ResNet-50 training
# (2020-2022, NGC containers of those years), on boards its later tables
# dropped or never had: the GTX 1080 Ti (Pascal GP102) and four TU102 boards,
# whose fp32 steps no chip of the op models' data ran, and Turing and Ampere
# boards in TF32 and half precision. Their tables' rows were not kept beside
# the logs, so each run's own logged rate is the figure (`published` below):
# BERT's batch / logged step (the progress bar's rate at the last of
# iterations 100, 50 and 15 it reached), ResNet-50's closing compute
# images/s.
LAMBDA_EARLY_LOGS = LAMBDA_BERT_LOGS.parent / "early_runs.tsv"
LAMBDA_EARLY_RN50 = LAMBDA_BERT_LOGS.parent.parent / "lambda_resnet50" / "early_runs.tsv"
LAMBDA_EARLY_FOLDERS = {
    "1080Ti": "GTX-1080-TI", "2080Ti": "RTX-2080-TI", "TitanRTX": "TITAN-RTX",
    "QuadroRTX6000": "QUADRO-RTX-6000", "LambdaCloud_1xQuadroRTX6000": "QUADRO-RTX-6000",
    "QuadroRTX8000": "QUADRO-RTX-8000", "3070": "RTX-3070", "3080": "RTX-3080", "3090": "RTX-3090",
    # A100 40GB boards: "A100_p4" is one GPU of an AWS p4d (SXM4 40GB); "A100_SXM4"
    # ran on 4 Nov 2020, before the 80GB part was announced.
    "A100_PCIe": "A100-PCIE-40GB", "A100_SXM4": "A100-SXM4-40GB", "A100_p4": "A100-SXM4-40GB",
    "A6000": "RTX-A6000", "LambdaCloud_A6000": "RTX-A6000", "A5000": "RTX-A5000",
    "A4000": "RTX-A4000", "A40": "A40", "A100_80GB_SXM4": "A100-SXM4-80GB",
    "A100_80GB_PCIe": "A100-PCIE-80GB",
}
LAMBDA_EARLY = ("Lambda, https://github.com/lambdal/deeplearning-benchmark pytorch/results/<folder>/ "
                "(2020-2022 runs' logs; the figure is each run's logged samples/s, not a table's)")


def standing_of(gpu: str, precision: str) -> str:
    """The standing (``predictor.expected_error.standing``) a prediction of a
    `precision` ("fp32", "tf32" or "amp") row on `gpu` quotes."""
    from predictor import engine, expected_error, hardware
    from predictor.kernels import layout as L

    tf32 = precision == "tf32"
    gemm = None if precision == "fp32" else (L.F32 if tf32 else L.F16)
    return expected_error.standing(hardware.get(gpu), gemm, engine.model_params(tf32_matmul=tf32))



def _tsv_rows(path: Path) -> list[dict]:
    lines = [ln for ln in path.read_text().splitlines() if not ln.startswith("#")]
    return list(csv.DictReader(lines, delimiter="\t"))


@functools.lru_cache(maxsize=None)
def lambda_early_table() -> tuple:
    """Lambda's 2020-2022 BERT and ResNet-50 runs as rows of `PUBLISHED`'s
    shape, the figure each run's logged samples/s (BERT: batch / logged
    step; ResNet-50: the closing compute images/s); repeated runs of one
    configuration (same board, program and batch) averaged."""
    rates: dict = {}

    def add(model, folder, half, batch, rate):
        gpu = LAMBDA_EARLY_FOLDERS[folder]
        rates.setdefault((model, gpu, lambda_precision(gpu, half), batch), []).append(rate)

    for row in _tsv_rows(LAMBDA_EARLY_LOGS):
        size = "large" if "large" in row["subfolder"] else "base"
        step = next(row[k] for k in ("rate_iter100", "rate_iter50", "rate_iter15") if row[k] != "-")
        batch = int(row["train_batch_size"])
        add(f"bert-{size}-squad", row["folder"], row["fp16"] == "yes", batch,
            batch / _seconds_per_step(step))
    for row in _tsv_rows(LAMBDA_EARLY_RN50):
        add("resnet50", row["folder"], row["amp"] == "yes", int(row["batch_size"]),
            float(row["compute_ips"]))
    return tuple((model, gpu, prec, batch, float(np.mean(r)), LAMBDA_EARLY)
                 for (model, gpu, prec, batch), r in rates.items())


def early_logged_steps(models=None, table=None) -> list[dict]:
    """`run` on `table` (default `lambda_early_table()`), each row with the
    standing a prediction of it quotes (``predictor.expected_error.standing``)
    and the error of its predicted step against the logged one
    (`step_error_pct`, positive: predicted slow)."""
    rows = run(models, table=lambda_early_table() if table is None else table)
    for r in rows:
        r["standing"] = standing_of(r["gpu"], r["precision"])
        r["step_error_pct"] = 100.0 * (r["published"] / r["predicted"] - 1)
    return rows


def print_by_standing(rows: list[dict], errors, what: str) -> None:
    """Mean and worst |error| (%) of `rows` per standing, `errors` row by row."""
    for kind in dict.fromkeys(r["standing"] for r in rows):
        e = np.abs([x for r, x in zip(rows, errors) if r["standing"] == kind])
        print(f"{kind}: mean |error| {e.mean():.1f} %, worst {e.max():.1f} % over {len(e)} {what}")


# The families whose rows run GEMMs (on tensor cores where the precision has
# them); every other family's rows are priced by the bytes they move.
TENSOR_FAMILIES = ["conv", "conv_dgrad", "conv_wgrad", "matmul", "attention", "attention_bwd"]


def implied_memory_factor(rows) -> list[dict]:
    """For Lambda's ResNet-50 rows: the factor on the predicted time of the
    rows priced by their bytes (every family but `TENSOR_FAMILIES`) that the
    published figure implies if the GEMM rows were priced right,
    `(published step - GEMM ms) / memory-bound ms`. A diagnostic, not a fit:
    it says where a board's error would have to sit, beside what could put it
    there (the DRAM type and the L2's size)."""
    from predictor import hardware

    out = []
    for r in rows:
        if r["model"] != "resnet50" or publisher(r["source"]) != "Lambda":
            continue
        spec = hardware.get(r["gpu"]).spec
        published_ms = 1e3 * r["batch"] / r["published"]
        gemm_ms = r["step_ms"] - r["memory_bound_ms"]
        out.append({"gpu": r["gpu"], "precision": r["precision"], "batch": r["batch"],
                    "memory": spec.get("memory_type", "?"), "l2_mb": float(spec.get("l2_mb", 0)),
                    "step_ms": r["step_ms"], "memory_bound_ms": r["memory_bound_ms"],
                    "published_ms": published_ms,
                    "factor": (published_ms - gemm_ms) / r["memory_bound_ms"]})
    return out


def print_rows(rows) -> None:
    """One Markdown table row per predicted figure."""
    print("| publisher | model | GPU | precision | traced as | memory format | batch "
          "| published samples/s | predicted | error |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        fmt = "NHWC" if r["memory_format"] == "channels_last" else "NCHW"
        print(f"| {publisher(r['source'])} | {r['model']} | {r['gpu']} | {r['precision']} | "
              f"{r['program']} | {fmt} | {r['batch']} | {r['published']:,g} | "
              f"{r['predicted']:,.1f} | "
              f"{r['error_pct']:+.1f} % |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=None,
                    help="comma-separated models of the table (default: all)")
    ap.add_argument("--bert-amp", choices=("o2", "autocast"), default="o2",
                    help="trace BERT's SQuAD AMP rows as DeepLearningExamples runs them (apex "
                         "O2: a 16-bit model, the default) or under torch.autocast")
    args = ap.parse_args(argv)
    models = None if args.models is None else args.models.split(",")
    known = sorted({row[0] for row in PUBLISHED} | {row[0] for row in PUBLISHED_INFERENCE})
    unknown = [m for m in models or () if m not in known]
    if unknown:
        ap.error(f"no published figures for {', '.join(unknown)}; the table has "
                 f"{', '.join(known)}")
    rows = run(models, bert_amp=args.bert_amp)
    print_rows(rows)
    print("\n| publisher | model | precision | GPUs | mean abs error | Spearman across GPUs |")
    print("| --- | --- | --- | --- | --- | --- |")
    for s in summary(rows):
        print(f"| {s['publisher']} | {s['model']} | {s['precision']} | {s['gpus']} | "
              f"{s['mean_abs_error_pct']:.1f} % | {s['spearman']:.2f} |")
    err = np.array([abs(r["error_pct"]) for r in rows])
    print(f"\nmean |error| {err.mean():.1f} % over {len(rows)} figures")
    for model in dict.fromkeys(r["model"] for r in rows):
        e = np.array([abs(r["error_pct"]) for r in rows if r["model"] == model])
        print(f"{model}: mean |error| {e.mean():.1f} % over {len(e)} figures")
    logged = logged_steps(rows)
    if logged:
        print("\nLambda's BERT SQuAD runs, their logged steps (the progress bar's rate at "
              "iteration 100) against the predicted ones; drift: the logged step at 100 "
              "against at 15; outside: the timed loop less 100 logged steps:\n")
        print("| model | GPU | precision | batch | logged step ms | predicted | error | drift "
              "| outside s |")
        print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        for r in logged:
            print(f"| {r['model']} | {r['gpu']} | {r['precision']} | {r['batch']} | "
                  f"{r['logged_ms']:.0f} | {r['predicted_ms']:.0f} | {r['step_error_pct']:+.1f} % | "
                  f"{r['drift_pct']:+.1f} % | {r['outside_s']:.1f} |")
    factors = implied_memory_factor(rows)
    if factors:
        print("\nLambda's ResNet-50 runs: the factor on the bytes-priced rows' time that each "
              "published figure implies if the GEMM rows were priced right:\n")
        print("| GPU | precision | batch | DRAM | L2 MB | predicted step ms | of it bytes-priced "
              "| published step ms | implied factor |")
        print("| --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |")
        for r in factors:
            print(f"| {r['gpu']} | {r['precision']} | {r['batch']} | {r['memory']} | "
                  f"{r['l2_mb']:g} | {r['step_ms']:.1f} | {r['memory_bound_ms']:.1f} | "
                  f"{r['published_ms']:.1f} | {r['factor']:.2f} |")
    early = early_logged_steps(models)
    if early:
        print("\nLambda's 2020-2022 runs of the same BERT fine-tuning and ResNet-50 training (a "
              "separate check, not in the means above): each run's logged step against the "
              "predicted one, by the standing its prediction quotes:\n")
        print("| model | GPU | precision | batch | logged step ms | predicted | error | standing |")
        print("| --- | --- | --- | ---: | ---: | ---: | ---: | --- |")
        for r in early:
            print(f"| {r['model']} | {r['gpu']} | {r['precision']} | {r['batch']} | "
                  f"{1e3 * r['batch'] / r['published']:.0f} | {r['step_ms']:.0f} | "
                  f"{r['step_error_pct']:+.1f} % | {r['standing']} |")
        print_by_standing(early, [r["step_error_pct"] for r in early], "configurations")
    inf = run(models, table=PUBLISHED_INFERENCE, mode="inference")
    if inf:
        print("\nInference (a separate check, not in the means above):\n")
        print_rows(inf)
        e = np.array([abs(r["error_pct"]) for r in inf])
        print(f"\ninference: mean |error| {e.mean():.1f} % over {len(inf)} figures")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
