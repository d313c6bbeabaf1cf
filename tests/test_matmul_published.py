"""The public matmul-throughput check (benchmarks/matmul_published.py) runs
without data or a GPU: every row names a GPU of the database, and the
predicted throughput is finite, positive and below the GPU's fp32 peak."""

import math

import pytest

from benchmarks import matmul_published as M
from predictor import hardware
from predictor.kernels import layout as L


def test_every_row_is_a_known_gpu_with_a_sane_prediction():
    rows = M.rows()
    assert len(rows) == len(M.PUBLISHED)
    for r in rows:
        peak = hardware.get(r["gpu"]).features[L.G_FP32_TFLOPS]
        assert math.isfinite(r["predicted"]) and 0 < r["predicted"] <= peak
        assert 0 < r["measured"] <= peak  # fp32 rows only: no TF32 figure slipped in
    text = M.table(rows)
    assert "outside the data" in text and text.count("\n| ") == len(rows) + 1


def test_within_chip_rows_pair_each_board_with_its_chips_training_board():
    """The within-chip check: every board has a training board of its own
    chip; dropping the board records gives each board its chip's measured
    efficiency on its own peak (the clock ratio not applied); both
    predictions are finite and positive."""
    rows = M.within_chip_rows()
    assert [r["gpu"] for r in rows] == [b for b, *_ in M.WITHIN_CHIP]
    for r in rows:
        chip = hardware.get(r["gpu"]).features[L.G_CHIP]
        assert hardware.get(r["origin"]).features[L.G_CHIP] == chip
        assert r["origin"] != r["gpu"]
        for key in ("before", "shipped"):
            assert math.isfinite(r[key]) and r[key] > 0
        assert r["shipped"] == pytest.approx(r["before"], rel=0.2)
        if r["m"] == 1.0:
            assert r["shipped"] == pytest.approx(r["before"], rel=1e-12)
    plain = M.without_board_clocks(M.opmodel.weights())
    assert M.opmodel.layout_problem(plain) is None
    text = M.within_chip_table(rows)
    assert text.count("\n| ") == len(rows) + 1 and "mean |error|" in text


def test_boards_added_later_are_new_to_the_table():
    first = {g for g, *_ in M.PUBLISHED}
    rows = M.rows(M.LATER)
    assert [r["gpu"] for r in rows] == [g for g, *_ in M.LATER]
    assert not first & {r["gpu"] for r in rows}
    for r in rows:
        peak = hardware.get(r["gpu"]).features[L.G_FP32_TFLOPS]
        assert math.isfinite(r["predicted"]) and 0 < r["predicted"] <= peak
        assert 0 < r["measured"] <= peak
    assert "outside the data" in M.table(rows)


def test_per_size_rows_cover_every_size_with_sane_predictions():
    rows = M.size_rows()
    assert [r["gpu"] for r in rows] == [g for g, _ in M.PER_SIZE]
    for (gpu_id, runs), r in zip(M.PER_SIZE, rows):
        assert all(len(run) == len(M.SIZES) for run in runs), gpu_id
        peak = hardware.get(gpu_id).features[L.G_FP32_TFLOPS]
        for meas, pred in zip(r["measured"], r["predicted"]):
            assert 0 < meas <= peak and 0 < pred <= peak and math.isfinite(pred)
        assert r["long error %"] >= 0
    # The best-of prediction is the per-size prediction's maximum.
    r = next(r for r in rows if r["gpu"] == "L4")
    assert max(r["predicted"]) == pytest.approx(M.predicted_tflops("L4"))
    text = M.size_table(rows)
    assert text.count("\n| ") == len(rows) + 1 and "outside the data" in text


def test_half_precision_per_size_rows_price_tensor_cores():
    rows = M.size_rows(half=True)
    assert [r["gpu"] for r in rows] == [g for g, _, _ in M.PER_SIZE_HALF]
    for (gpu_id, dtype, runs), r in zip(M.PER_SIZE_HALF, rows):
        assert dtype in M.HALF and all(len(run) == len(M.SIZES) for run in runs)
        gpu = hardware.get(gpu_id).features
        assert r["peak"] == gpu[L.G_BF16_TFLOPS if dtype == "bf16" else L.G_FP16_TFLOPS]
        # Tensor cores: far above the fp32 CUDA-core peak at the largest size.
        assert r["predicted"][-1] > 1.5 * gpu[L.G_FP32_TFLOPS]
        assert all(math.isfinite(p) and p > 0 for p in r["predicted"])
