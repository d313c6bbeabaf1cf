"""The public matmul-throughput check (benchmarks/matmul_published.py) runs
without data or a GPU: every row names a GPU of the database, and the
predicted throughput is finite, positive and below the GPU's fp32 peak."""

import math

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
