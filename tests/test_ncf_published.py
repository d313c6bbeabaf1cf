"""NVIDIA's published NCF throughput (benchmarks/ncf_published.py): the model
is NeuMF at the README's sizes, and each figure is priced near it."""

import math

import pytest

import predictor
from benchmarks import ncf_published as ncf
from benchmarks.amp_published import rank_correlations


def test_the_model_has_neumfs_parameters():
    users, items, f = ncf.USERS, ncf.ITEMS, ncf.FACTORS
    a, b, c, d = ncf.LAYERS
    want = (users + items) * (f + a // 2) + (a * b + b) + (b * c + c) + (c * d + d) + (d + f + 1)
    assert sum(p.numel() for p in ncf.NeuMFStep().parameters()) == want


def test_rows_are_priced_near_the_published_figures():
    known = set(predictor.gpus()["id"])
    rows = ncf.predict_rows()
    assert len(rows) == len(ncf.PUBLISHED)
    for r in rows:
        assert r["gpu"] in known
        assert math.isfinite(r["predicted"]) and r["predicted"] > 0
        assert r["error_pct"] == pytest.approx(100 * (r["predicted"] / r["published"] - 1))
        assert abs(r["error_pct"]) < 35, r


def test_lambdas_gpus_in_fp32_and_tf32_come_out_in_the_published_order():
    """Lambda's NCF figures at each GPU's largest batch (1.3 to 10 million
    samples): the fp32 / TF32 ranking across the ten GPUs holds (1.00 when
    measured); its mixed-precision column does not (0.73: its A100 80GB and
    H100 figures at 10 million samples lie below the A100 40GB PCIe's at 7.5
    million), so it is reported, not tested."""
    known = set(predictor.gpus()["id"])
    assert all(g in known and b > 0 for g, _, b, _ in ncf.LAMBDA)
    rows = ncf.predict_rows(ncf.LAMBDA)
    assert all(math.isfinite(r["predicted"]) and r["predicted"] > 0 for r in rows)
    assert rank_correlations(rows)["fp32/tf32"] >= 0.95
