"""A GPU under a power limit ("H100-SXM5-80GB@500W"): hardware.power_limited
and kernels.clocks.power_limit_share."""

from __future__ import annotations

import json
import sys

import pytest

import predictor
from predictor import cli, hardware, opmodel
from predictor.errors import InvalidArgumentError, UnknownGPUError
from predictor.kernels import layout as L
from predictor.kernels.clocks import POWER_EXPONENT, power_limit_share

GEMM = [(8192, 8192), (8192, 8192)]


def _share(gpu) -> float:
    """The clock a board's power limit leaves it, with the shipped weights."""
    return power_limit_share(opmodel.weights(), hardware.get(gpu).features)


@pytest.mark.parametrize("name", ["H100-SXM5-80GB@500W", "h100 sxm5 80gb @ 500 w", "H100@500w",
                                  "H100-SXM5-80GB@500.0W"])
def test_names_with_a_power_limit_resolve(name):
    gpu = hardware.get(name)
    assert gpu.id == "H100-SXM5-80GB@500W"
    assert gpu.name.endswith("at 500 W") and gpu.spec["power_limit_w"] == 500.0
    assert gpu.features[L.G_POWER_LIMIT_W] == 500.0
    base = hardware.get("H100-SXM5-80GB")
    assert base.features[L.G_POWER_LIMIT_W] == 0.0
    # The row is the board's own but for the limit: its peaks, bandwidth and
    # rated power are what the spec sheet says; the kernels slow the clock.
    others = [c for c in range(L.N_GPU_FEATURES) if c != L.G_POWER_LIMIT_W]
    assert (gpu.features[others] == base.features[others]).all()
    share = _share(gpu)
    assert share == pytest.approx((500 / 700) ** POWER_EXPONENT, rel=1e-6)


def test_the_rated_power_is_the_board_itself():
    assert hardware.get("A100-SXM4-80GB@400W") is hardware.get("A100-SXM4-80GB")


@pytest.mark.parametrize("name,needle", [
    ("H100-SXM5-80GB@800W", "outside 175-700 W"),
    ("H100-SXM5-80GB@100W", "outside 175-700 W"),
    ("T4@0W", "outside"),
    ("T4@60W@50W", "already under a power limit"),
])
def test_limits_outside_the_range_are_refused(name, needle):
    with pytest.raises(InvalidArgumentError, match=needle):
        hardware.get(name)


def test_an_unknown_board_under_a_limit_names_close_ones():
    with pytest.raises(UnknownGPUError, match="did you mean"):
        hardware.get("H100-SXM9@300W")


def test_a_chip_without_a_clock_record_slows_by_the_cube_root():
    """The L4's chip trained no op model: its clock falls as the cube root."""
    assert hardware.get("L4").features[L.G_TDP_W] == 72
    assert _share("L4@54W") == pytest.approx((54 / 72) ** POWER_EXPONENT)
    assert _share("L4") == 1.0


def test_a_record_with_headroom_loses_less_than_the_cube_root():
    """An A100 SXM4 holds its boost clock at 400 W with power to spare (its
    chip's record: the 250 W PCIe board at 0.92 of boost), so at 300 W it
    runs what the 300 W A100 PCIe 80GB does: the same clock, on the same chip."""
    share = _share("A100-SXM4-80GB@300W")
    assert (300 / 400) ** POWER_EXPONENT < share < 1.0
    capped = predictor.predict_op("mm", GEMM, "A100-SXM4-80GB@300W")
    pcie = predictor.predict_op("mm", GEMM, "A100-PCIE-80GB")
    assert capped == pytest.approx(pcie, rel=0.01)
    assert capped > predictor.predict_op("mm", GEMM, "A100-SXM4-80GB")


@pytest.mark.parametrize("gpu,watts", [("H100-SXM5-80GB", 350), ("L4", 54), ("T4", 50)])
def test_compute_slows_by_the_clock_and_memory_does_not(gpu, watts):
    capped = hardware.get(f"{gpu}@{watts}W")
    share = _share(capped)
    assert share < 1.0
    # Compute-bound GEMMs, fp32 (the networks' efficiency on the board's
    # sustained clock) and on tensor cores, take exactly the clock's share.
    dtypes = ("float32",) if gpu == "T4" else ("float32", "bfloat16")
    for dtype in dtypes:
        t = [predictor.predict_op("mm", GEMM, g, dtype=dtype) for g in (gpu, capped)]
        assert t[1] / t[0] == pytest.approx(1 / share, rel=1e-3), dtype
    add = [predictor.predict_op("add", GEMM, g) for g in (gpu, capped)]
    assert add[1] == add[0]


def test_a_memory_bound_gemm_slows_by_its_compute_share_only():
    """A GEMM that waits on DRAM (a matrix-vector product) loses at most a
    little: only its compute share runs on the SM clock."""
    gemv = [(65536, 8192), (8192, 1)]
    t = [predictor.predict_op("mm", gemv, g) for g in ("H100-SXM5-80GB", "H100-SXM5-80GB@350W")]
    assert t[0] <= t[1] < t[0] / _share("H100-SXM5-80GB@350W")


def test_the_cli_takes_a_limited_gpu_in_every_format(capsys):
    assert cli.main(["predict", "dcgan", "-b", "8", "--gpus", "T4,T4@50W", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    rows = {r["gpu"]: r for r in out["predictions"]}
    assert rows["T4@50W"]["iteration_ms"] > rows["T4"]["iteration_ms"]
    with pytest.raises(SystemExit) as exc:
        sys.exit(cli.main(["predict", "dcgan", "--gpus", "T4@500W"]))
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "outside 17.5-70 W" in err and "\n" not in err and "Traceback" not in err


def test_gpus_lists_a_limited_board(capsys):
    assert cli.main(["gpus", "T4", "T4@50W", "--json"]) == 0
    rows = {r["id"]: r for r in json.loads(capsys.readouterr().out)}
    assert set(rows) == {"T4", "T4@50W"}
    assert rows["T4@50W"]["power_limit_w"] == 50 and rows["T4"]["power_limit_w"] is None
    assert rows["T4@50W"]["fp32_tflops"] == rows["T4"]["fp32_tflops"]
    assert rows["T4@50W"]["chip_in_training_data"]


def test_a_copy_bound_by_its_elements_slows_with_the_clock():
    """PyTorch's non-vectorised copies run at a rate per SM clock
    (kernels.roofline.generic_kernel_us): under a limit, at the clock it
    leaves; the kernels and the reference implementation agree."""
    import numpy as np

    from predictor import reference
    from predictor.kernels.optime import op_time_us
    from predictor.kernels.roofline import P_LAUNCH_US, default_params

    elems, inner = 1 << 26, 64
    d = np.zeros(L.MAX_DIMS, dtype=np.int64)
    d[:5] = (elems, elems, 0, inner, elems // inner)
    d[L.MEM_GENERIC] = L.COPY_STRIDED
    params, mlp = default_params(), opmodel.weights()
    times = []
    for name in ("H200-SXM-141GB", "H200-SXM-141GB@400W"):
        f = hardware.get(name).features
        t = op_time_us(L.COPY, L.BF16, 1, d, f, params, mlp)
        assert reference.op_time_us(L.COPY, L.BF16, 1, list(d), list(f), params, mlp) \
            == pytest.approx(t, rel=1e-9)
        times.append(t - params[P_LAUNCH_US])
    assert times[1] / times[0] == pytest.approx(1 / _share("H200-SXM-141GB@400W"), rel=1e-9)


@pytest.mark.parametrize("dtype", [L.F32, L.BF16])
def test_the_reference_agrees_on_a_limited_board(dtype):
    import numpy as np

    from predictor import reference
    from predictor.kernels.optime import op_time_us
    from predictor.kernels.roofline import default_params

    params, mlp = default_params(), opmodel.weights()
    d = np.zeros(L.MAX_DIMS, dtype=np.int64)
    d[:4] = (1, 4096, 4096, 4096)
    for name in ("A100-SXM4-80GB@300W", "L4@40W", "H100-SXM5-80GB@500W"):
        f = hardware.get(name).features
        t = op_time_us(L.MATMUL, dtype, 1, d, f, params, mlp)
        assert reference.op_time_us(L.MATMUL, dtype, 1, list(d), list(f), params, mlp) \
            == pytest.approx(t, rel=1e-9), name
