"""Peak-memory model: agreement with PyTorch's MemTracker on a small model,
monotonicity in the batch size, categories, fits and the largest batch that fits."""

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn
from hypothesis import given, settings
from hypothesis import strategies as st

import predictor
from predictor import memory
from predictor.kernels import layout as L

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))


class SmallNet(nn.Module):
    """Conv + batch norm + dropout + linear: every kind of saved tensor."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(inplace=True),
            nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten())
        self.head = nn.Sequential(nn.Dropout(0.1), nn.Linear(256, 64), nn.GELU(), nn.Linear(64, 10))

    def forward(self, x):
        return self.head(self.features(x))


def _inputs(b):
    return (torch.randn(b, 3, 24, 24),)


def _loss(out):
    return nn.functional.cross_entropy(out, torch.zeros(out.shape[0], dtype=torch.long))


@pytest.fixture(scope="module")
def small_graph():
    return predictor.trace(SmallNet(), _inputs(4), loss_fn=_loss)


@pytest.fixture(scope="module")
def small_sgd_graph():
    return predictor.trace(SmallNet(), _inputs(4), loss_fn=_loss, optimizer="sgd")


def test_profile_is_recorded(small_graph):
    prof = small_graph.memory
    assert prof is not None and len(prof) > 0 and prof.training
    assert prof.phase_marks and prof.n_steps > prof.phase_marks[-1]
    assert (prof.free >= prof.alloc).all()


@pytest.mark.parametrize("batch", [2, 16, 64])
def test_matches_memtracker(small_graph, batch):
    """The eager step under torch's MemTracker (fake tensors, CPU) and the
    static peak of the traced step agree (target: within 10 %)."""
    from memory_validation import measure_step

    measured = measure_step(SmallNet, _inputs, _loss, batch)
    predicted, _, _ = small_graph.memory.peak([batch], rounding=False, workspaces=False)
    assert predicted[0] == pytest.approx(measured, rel=0.10)


def _wide():
    """Weights far larger than the activations: the peak is the optimizer's."""
    return nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512))


def _wide_inputs(b):
    return (torch.randn(b, 512),)


@pytest.mark.parametrize("optimizer", ["adam", "adamw+clip", "adamw-loop", "sgd-loop+clip"])
def test_optimizer_variants_match_memtracker(optimizer):
    """The step's temporaries as torch.optim makes them (foreach=False for
    -loop, clip_grad_norm_ for +clip) on both sides, where they set the peak."""
    from memory_validation import measure_step

    loss = lambda out: out.sum()  # noqa: E731
    g = predictor.trace(_wide(), _wide_inputs(2), loss_fn=loss, optimizer=optimizer)
    measured = measure_step(_wide, _wide_inputs, loss, 2, optimizer=optimizer)
    predicted, _, step = g.memory.peak([2], rounding=False, workspaces=False)
    # Adam's state and temporaries put the peak in the optimizer step (plain
    # SGD updates in place: its peak stays the backward's)
    assert g.memory.phase_at(int(step[0])) == ("backward" if "sgd" in optimizer else "optimizer")
    assert predicted[0] == pytest.approx(measured, rel=0.01)


def test_a_for_loop_step_holds_one_parameter_s_temporaries_at_a_time():
    loss = lambda out: out.sum()  # noqa: E731
    peak = {o: predictor.trace(_wide(), _wide_inputs(2), loss_fn=loss, optimizer=o)
            .memory.peak([2], rounding=False, workspaces=False)[0][0] for o in ("adam", "adam-loop")}
    # foreach: sqrt(exp_avg_sq) of every parameter at once; the loop: one at a time
    assert peak["adam-loop"] < peak["adam"]


def test_categories(small_graph, small_sgd_graph):
    prof = small_graph.memory
    n_params = sum(p.numel() for p in SmallNet().parameters())
    assert prof.category_bytes(memory.PARAMETERS) == 4 * n_params
    assert prof.category_bytes(memory.OPTIMIZER_STATE) == 2 * 4 * n_params  # Adam: m and v
    assert prof.category_bytes(memory.GRADIENTS) == 4 * n_params
    assert small_sgd_graph.memory.category_bytes(memory.OPTIMIZER_STATE) == 0
    # Activations grow with the batch, parameters do not.
    assert prof.category_bytes(memory.ACTIVATIONS, 64) > prof.category_bytes(memory.ACTIVATIONS, 1)
    br = prof.breakdown(64)
    assert br["activations"] > 0 and br["peak_phase"] in L.PHASE_NAMES


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(1, 4096), min_size=2, max_size=12))
def test_peak_monotone_in_batch(small_graph, batches):
    b = np.sort(np.asarray(batches, dtype=np.int64))
    prof = small_graph.memory
    for rounding in (False, True):
        alloc, reserved, _ = prof.peak(b, rounding=rounding)
        assert (np.diff(alloc) >= 0).all() and (np.diff(reserved) >= 0).all()
        assert (reserved >= alloc).all() and (alloc > 0).all()
    dev = memory.device_bytes(prof, [predictor_gpu("T4"), predictor_gpu("H100")], b)
    assert (np.diff(dev, axis=1) >= 0).all()


def predictor_gpu(name):
    from predictor import hardware

    return hardware.get(name)


def test_zoo_memory_monotone(resnet50_graph):
    b = np.asarray([1, 2, 8, 32, 64, 128, 256, 512])
    alloc, reserved, _ = resnet50_graph.memory.peak(b)
    assert (np.diff(alloc) > 0).all() and (np.diff(reserved) >= 0).all()
    res = predictor.sweep(resnet50_graph, ["T4", "A100-SXM4-80GB"], b.tolist())
    assert (np.diff(res.memory_gb, axis=1) > 0).all()


def test_rescaled_equals_retraced():
    """Sizes rescaled from the sentinel trace equal a trace at that batch."""
    torch.manual_seed(0)
    scaled = predictor.trace(SmallNet(), _inputs(4), loss_fn=_loss)
    exact = predictor.trace(SmallNet(), _inputs(12), loss_fn=_loss, batch_dim=None)
    a1, r1, _ = scaled.memory.peak([12])
    a2, r2, _ = exact.memory.peak([12])
    assert a1[0] == a2[0] and r1[0] == r2[0]


def test_allocator_rounding(small_graph):
    exact, _, _ = small_graph.memory.peak([3], rounding=False)
    rounded, reserved, _ = small_graph.memory.peak([3], rounding=True)
    assert rounded[0] >= exact[0] and rounded[0] % 512 == 0
    assert reserved[0] % (2 << 20) == 0


def test_dtype_override_shrinks(small_graph):
    fp32, _, _ = small_graph.memory.peak([64], rounding=False, workspaces=False)
    fp16, _, _ = small_graph.memory.peak([64], dtype_code=L.F16, rounding=False, workspaces=False)
    assert 0.45 * fp32[0] < fp16[0] < 0.6 * fp32[0]


def test_sweep_and_predict_report_memory(small_graph):
    res = predictor.sweep(small_graph, ["T4", "H100-SXM5-80GB"], [1, 64])
    df = res.to_pandas()
    assert {"memory_gb", "fits"} <= set(df.columns)
    assert df["fits"].all() and (df["memory_gb"] > memory.CUDA_CONTEXT_BYTES / 2**30).all()
    p = predictor.predict(small_graph, "T4", batch_size=64)
    assert p.memory_gb == pytest.approx(res.memory_gb[0, 1])
    assert p.fits is True and p.to_dict()["memory_gb"] == p.memory_gb
    # cuBLAS workspaces are larger on Hopper: the same step needs more memory there.
    assert res.memory_gb[1, 0] > res.memory_gb[0, 0]


def test_max_batch_size(resnet50_graph):
    frac = 0.9
    b = memory.max_batch_size(resnet50_graph, "T4", max_memory_fraction=frac)
    assert b is not None and b > 1
    res = predictor.sweep(resnet50_graph, ["T4"], [b, b + 1], max_memory_fraction=frac)
    assert res.fits[0].tolist() == [True, False]
    # A bigger GPU fits a bigger batch.
    assert memory.max_batch_size(resnet50_graph, "A100-SXM4-80GB") > b


def test_bad_fraction(small_graph):
    with pytest.raises(predictor.InvalidArgumentError, match="max_memory_fraction"):
        predictor.sweep(small_graph, ["T4"], [1], max_memory_fraction=1.5)


def test_inference_has_no_gradients():
    g = predictor.trace(SmallNet(), _inputs(4), mode="inference")
    prof = g.memory
    assert not prof.training
    assert prof.category_bytes(memory.GRADIENTS) == 0
    assert prof.category_bytes(memory.OPTIMIZER_STATE) == 0
    train = predictor.trace(SmallNet(), _inputs(4), loss_fn=_loss)
    assert prof.peak([64])[0][0] < train.memory.peak([64])[0][0]


def test_saved_graph_keeps_memory(small_graph, tmp_path):
    path = small_graph.save(tmp_path / "g.npz")
    back = predictor.Graph.load(path)
    assert back.memory is not None
    assert back.memory.peak([32])[0][0] == small_graph.memory.peak([32])[0][0]
