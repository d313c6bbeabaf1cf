"""The cost model shared by the search examples (optuna_search.py, ray_tune_search.py).

A small family of CIFAR-sized image classifiers, a residual CNN or a ViT of a
given depth and width, scored as ``accuracy proxy x predicted samples/s`` on a
T4 at a batch size, and infeasible (score 0) when the predicted peak memory of
a training step exceeds a limit. The predictor is the whole cost model: each
(arch, depth, width) is traced once (fake tensors, no GPU) and predicted at any
batch size from that graph.

The accuracy proxy is a stand-in, not an accuracy: a saturating function of the
parameter count and the depth (bigger and deeper is better, with diminishing
returns). A real search replaces ``accuracy_proxy`` with a zero-cost proxy or
a short training run; nothing else changes.
"""

from __future__ import annotations

import functools
import math
import warnings

import torch
import torch.nn as nn

import predictor

# The search space: every example samples from these lists.
SPACE = {
    "arch": ["resnet", "vit"],
    "depth": [2, 4, 6, 8],
    "width": [32, 64, 96, 128],
    "batch": [64, 128, 256, 512],
}
GPU = "T4"
MEMORY_LIMIT_GB = 4.0   # the budget of peak training memory (a T4 has 15 GiB usable)
IMAGE = 32              # CIFAR-sized inputs, 10 classes


class _Block(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(width, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
            nn.Conv2d(width, width, 3, padding=1, bias=False), nn.BatchNorm2d(width))

    def forward(self, x):
        return torch.relu(x + self.body(x))


class ResNet(nn.Module):
    def __init__(self, depth: int, width: int, classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, padding=1, bias=False),
                                  nn.BatchNorm2d(width), nn.ReLU())
        self.blocks = nn.Sequential(*[_Block(width) for _ in range(depth)])
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)).mean(dim=(2, 3)))


class ViT(nn.Module):
    def __init__(self, depth: int, width: int, classes: int = 10, patch: int = 4):
        super().__init__()
        self.patch = nn.Conv2d(3, width, patch, stride=patch)
        self.pos = nn.Parameter(torch.zeros(1, (IMAGE // patch) ** 2, width))
        layer = nn.TransformerEncoderLayer(width, nhead=4, dim_feedforward=4 * width,
                                           batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        tokens = self.patch(x).flatten(2).transpose(1, 2) + self.pos
        return self.head(self.encoder(tokens).mean(dim=1))


def factory(arch: str, depth: int, width: int, batch: int = 64):
    """``(model, example_inputs)``, as ``predictor.trace`` and ``predictor.Space`` take."""
    cls = {"resnet": ResNet, "vit": ViT}[arch]
    return cls(depth, width), (torch.zeros(batch, 3, IMAGE, IMAGE),)


def accuracy_proxy(params: int, depth: int) -> float:
    """In (0, 1): saturating in parameters (scale 1 M) and in depth (scale 4)."""
    return (1 - math.exp(-params / 1e6)) ** 0.5 * (1 - math.exp(-depth / 4)) ** 0.5


@functools.lru_cache(maxsize=None)
def _graph(arch: str, depth: int, width: int):
    # Traced once per architecture: the graph is valid at every batch size.
    model = functools.partial(factory, arch, depth, width)
    model.__name__ = f"{arch}-d{depth}-w{width}"
    with warnings.catch_warnings():
        # nn.TransformerEncoder probes its fast path with data_ptr(), which
        # fake tensors warn about; the traced step is the ordinary path.
        warnings.filterwarnings("ignore", message="Accessing the data pointer of FakeTensor")
        return predictor.trace(model, loss_fn=lambda out: out.float().mean())


def evaluate(config: dict, gpu: str = GPU, memory_limit_gb: float = MEMORY_LIMIT_GB) -> dict:
    """The search's metrics for one config: score (0 when over the memory
    limit), accuracy proxy, predicted samples/s, iteration ms, peak GiB, fits."""
    g = _graph(config["arch"], int(config["depth"]), int(config["width"]))
    p = predictor.predict(g, gpu, batch_size=int(config["batch"]))
    acc = accuracy_proxy(g.parameters, int(config["depth"]))
    fits = p.memory_gb is not None and p.memory_gb <= memory_limit_gb and bool(p.fits)
    return {"score": acc * p.throughput if fits else 0.0, "accuracy_proxy": acc,
            "samples_per_s": p.throughput, "iteration_ms": p.iteration_ms,
            "memory_gb": p.memory_gb, "fits": fits, "params": g.parameters}
