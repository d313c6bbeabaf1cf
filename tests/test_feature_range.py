"""Rows of real steps described to the learned networks inside, or near, what
they were trained on (benchmarks/feature_range.py)."""

import pytest

import predictor
from benchmarks import feature_range as fr


@pytest.mark.parametrize("model,amp", [("transformer", None), ("gpt2", "bf16"), ("dcgan", None)])
def test_no_row_is_described_hundreds_of_deviations_outside_the_training_inputs(model, amp):
    """A fill's read-to-write ratio of 0 (log2 0) sat 208 standard
    deviations outside the elementwise network's training inputs, and
    priced fills at a third of the DRAM bandwidth; what is left beyond 20
    (copies' and memory-bound convolutions' intensity against the ridge
    point) is listed in benchmarks/README.md."""
    found = fr.outliers(predictor.trace(model, amp=amp, optimizer="adamw"))
    assert found
    worst = max(found, key=lambda r: abs(r["z"]))
    assert abs(worst["z"]) < 50, worst
    beyond = [r for r in found if abs(r["z"]) > 20]
    assert all(fr.FEATURE_NAMES[r["input"]] == "intensity vs ridge" for r in beyond), beyond


def test_the_summary_groups_and_orders_by_the_worst_input():
    found = [{"network": "elementwise", "family": "fill", "op": "zeros", "input": 10, "z": -9.0,
              "model": "a"},
             {"network": "elementwise", "family": "fill", "op": "zeros", "input": 10, "z": -30.0,
              "model": "b"},
             {"network": "conv", "family": "conv", "op": "convolution", "input": 2, "z": 12.0,
              "model": "a"},
             {"network": "conv", "family": "conv", "op": "convolution", "input": 2, "z": 3.0,
              "model": "c"}]
    rows = fr.summarise(found, 8.0)
    assert [(r["op"], r["cases"], r["worst_z"], r["models"]) for r in rows] == [
        ("zeros", 2, -30.0, ["a", "b"]), ("convolution", 1, 12.0, ["a"])]
