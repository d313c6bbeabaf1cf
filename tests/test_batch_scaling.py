"""A graph traced at one batch size and evaluated at another equals a graph
traced at that other batch size."""

import numpy as np
import pytest
import torch
import torch.nn as nn

import predictor
from predictor.frontend import fx


def _small_cnn():
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(32, 5))


def _table_at(graph, batch):
    t = graph.ops
    rows = sorted(zip(t.family.tolist(), t.phase.tolist(), t.count.tolist(),
                      map(tuple, t.dims(batch).tolist())))
    return rows


@pytest.mark.parametrize("make,inputs", [
    (_small_cnn, lambda b: (torch.randn(b, 3, 12, 12),)),
    (lambda: nn.TransformerEncoder(nn.TransformerEncoderLayer(32, 4, 64, batch_first=True), 2),
     lambda b: (torch.randn(b, 7, 32),)),
])
def test_rescaled_equals_retraced(make, inputs):
    torch.manual_seed(0)
    g8 = predictor.trace(make(), inputs(8))
    g32_exact = predictor.trace(make(), inputs(32), batch_dim=None)
    assert g8.batch_scalable and not g32_exact.batch_scalable
    assert _table_at(g8, 32) == _table_at(g32_exact, 32)
    p_scaled = predictor.predict(g8, "A100-SXM4-80GB", batch_size=32)
    p_exact = predictor.predict(g32_exact, "A100-SXM4-80GB")
    assert p_scaled.iteration_ms == pytest.approx(p_exact.iteration_ms, rel=1e-12)


def test_zoo_rescaled_equals_retraced():
    g = predictor.trace("gpt2", batch_size=2, seq_len=32)
    exact = predictor.trace("gpt2", batch_size=6, seq_len=32, batch_dim=None)
    assert _table_at(g, 6) == _table_at(exact, 6)


def test_graph_not_rescalable_refuses_other_batch():
    g = predictor.trace(_small_cnn(), (torch.randn(4, 3, 12, 12),), batch_dim=None)
    predictor.predict(g, "T4")  # its own batch works
    with pytest.raises(predictor.InvalidArgumentError, match="trace it again"):
        predictor.predict(g, "T4", batch_size=8)


def test_time_grows_with_batch(resnet50_graph):
    times = [predictor.predict(resnet50_graph, "V100-SXM2-32GB", batch_size=b).iteration_ms
             for b in (1, 8, 64, 256)]
    assert all(np.isfinite(times)) and all(t > 0 for t in times)
    assert times == sorted(times)


def test_sentinel_is_prime():
    n = fx.SENTINEL_BATCH
    assert n > 1000 and all(n % p for p in range(2, int(n ** 0.5) + 1))
