"""Lambda's published Tacotron 2 throughput (benchmarks/tacotron2_published.py):
the decoder steps as the reference script's does, and each figure is priced
within the check's stated error."""

import math

import numpy as np
import pytest
import torch

import predictor
from benchmarks import tacotron2_published as taco
from benchmarks.amp_published import spearman


def test_the_step_is_a_loss_over_the_padded_batch(monkeypatch):
    monkeypatch.setattr(taco, "DECODER_STEPS", 5)
    monkeypatch.setattr(taco, "TEXT_LENGTH", 7)
    text, lengths, mel, gate = taco.inputs(2)
    assert mel.shape == (2, taco.N_MEL, 5) and text.shape == (2, 7)
    with torch.no_grad():
        loss = taco.Tacotron2Step()(text, lengths - 2, torch.randn_like(mel), gate)
    assert loss.ndim == 0 and math.isfinite(loss.item())


def test_each_decoder_step_runs_two_fused_cells_and_one_attention(monkeypatch):
    """Per mel frame: the attention and decoder LSTM cells as CUDA's fused
    kernels, one attention softmax and context bmm; each step's input frame
    taken with `decoder_inputs[t]`, whose gradient is a full-size tensor per
    step (ATen's select_backward), as the reference script's is."""
    steps = 4
    monkeypatch.setattr(taco, "DECODER_STEPS", steps)
    monkeypatch.setattr(taco, "TEXT_LENGTH", 9)
    g = taco.trace()
    assert g.unsupported == {}
    df = predictor.predict(g, "A100-SXM4-80GB", batch_size=8).ops
    fwd, bwd = df[df.phase == "forward"], df[df.phase == "backward"]
    count = lambda t, op: int(t[t.op == op]["count"].sum())
    assert count(fwd, "_thnn_fused_lstm_cell") == 2 * steps
    assert count(bwd, "_thnn_fused_lstm_cell_backward_impl") >= 2 * steps
    assert count(fwd, "_softmax") == steps and count(fwd, "bmm") == steps
    assert count(bwd, "select_backward") == steps


@pytest.fixture(scope="module")
def rows():
    return taco.predict_rows()


def test_rows_are_priced_within_the_checks_error(rows):
    known = set(predictor.gpus()["id"])
    assert len(rows) == len(taco.PUBLISHED)
    for r in rows:
        assert r["gpu"] in known
        assert math.isfinite(r["predicted"]) and r["predicted"] > 0
        assert r["error_pct"] == pytest.approx(100 * (r["predicted"] / r["published"] - 1))
        assert abs(r["error_pct"]) < 40, r
    assert np.mean([abs(r["error_pct"]) for r in rows]) < 20
    assert spearman([r["published"] for r in rows], [r["predicted"] for r in rows]) > 0.9
