"""NVIDIA's published NCF throughput (benchmarks/ncf_published.py): the model
is NeuMF at the README's sizes, and each figure is priced near it."""

import math

import pytest

import predictor
from benchmarks import ncf_published as ncf


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
