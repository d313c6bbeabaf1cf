"""The hardware-aware search examples (examples/): the Optuna one runs a few
trials; Ray Tune's is not run here (a Ray Tune run takes most of a minute)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.fixture(scope="module")
def hw():
    sys.path.insert(0, str(EXAMPLES))
    try:
        yield importlib.import_module("hardware_aware")
    finally:
        sys.path.remove(str(EXAMPLES))


def test_memory_limit_makes_a_config_infeasible(hw):
    small = hw.evaluate({"arch": "resnet", "depth": 2, "width": 32, "batch": 64})
    big = hw.evaluate({"arch": "resnet", "depth": 8, "width": 128, "batch": 512})
    assert small["fits"] and small["score"] == pytest.approx(
        small["accuracy_proxy"] * small["samples_per_s"])
    assert small["memory_gb"] < hw.MEMORY_LIMIT_GB < big["memory_gb"]
    assert not big["fits"] and big["score"] == 0.0
    # Wider costs time: the predictor, not a constant, sets the throughput.
    wide = hw.evaluate({"arch": "resnet", "depth": 2, "width": 128, "batch": 64})
    assert wide["samples_per_s"] < small["samples_per_s"]


def test_optuna_example_finds_a_feasible_best(hw, capsys):
    pytest.importorskip("optuna", reason="optuna is not installed (pip install optuna)")
    optuna_search = importlib.import_module("optuna_search")
    best = optuna_search.main(["--trials", "5"])
    assert best["fits"] and best["memory_gb"] <= hw.MEMORY_LIMIT_GB and best["score"] > 0
    again = hw.evaluate({k: best[k] for k in hw.SPACE})
    assert again["score"] == pytest.approx(best["score"], rel=1e-12)
    assert "5 trials on T4" in capsys.readouterr().out
