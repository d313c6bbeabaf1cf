"""A GPU under a power limit ("H100-SXM5-80GB@500W"): hardware.power_limited
and kernels.clocks.power_limit_share."""

from __future__ import annotations

import json
import sys

import pytest

import predictor
from predictor import cli, hardware
from predictor.errors import InvalidArgumentError, UnknownGPUError
from predictor.kernels import layout as L
from predictor.kernels.clocks import POWER_EXPONENT, power_limit_share

GEMM = [(8192, 8192), (8192, 8192)]


@pytest.mark.parametrize("name", ["H100-SXM5-80GB@500W", "h100 sxm5 80gb @ 500 w", "H100@500w",
                                  "H100-SXM5-80GB@500.0W"])
def test_names_with_a_power_limit_resolve(name):
    gpu = hardware.get(name)
    assert gpu.id == "H100-SXM5-80GB@500W"
    assert gpu.name.endswith("at 500 W") and gpu.spec["power_limit_w"] == 500.0
    base = hardware.get("H100-SXM5-80GB")
    share = gpu.spec["power_limit_clock_share"]
    assert 0.5 < share < 1.0
    for col in (L.G_FP32_TFLOPS, L.G_BF16_TFLOPS, L.G_FP8_TFLOPS):
        assert gpu.features[col] == pytest.approx(base.features[col] * share)
    # Memory does not run on the SM clock; the board keeps its rated power.
    for col in (L.G_MEM_BW_GBS, L.G_SMS, L.G_CLOCK_MHZ, L.G_TDP_W, L.G_CHIP, L.G_MEMORY_GB):
        assert gpu.features[col] == base.features[col]


def test_the_rated_power_is_the_board_itself():
    assert hardware.get("A100-SXM4-80GB@400W") is hardware.get("A100-SXM4-80GB")


@pytest.mark.parametrize("name,needle", [
    ("H100-SXM5-80GB@800W", "outside 175-700 W"),
    ("H100-SXM5-80GB@100W", "outside 175-700 W"),
    ("T4@0W", "outside"),
])
def test_limits_outside_the_range_are_refused(name, needle):
    with pytest.raises(InvalidArgumentError, match=needle):
        hardware.get(name)


def test_an_unknown_board_under_a_limit_names_close_ones():
    with pytest.raises(UnknownGPUError, match="did you mean"):
        hardware.get("H100-SXM9@300W")


def test_a_chip_without_a_clock_record_slows_by_the_cube_root():
    """The L4's chip trained no op model: its clock falls as the cube root."""
    l4 = hardware.get("L4")
    assert l4.features[L.G_TDP_W] == 72
    share = power_limit_share(predictor.opmodel.weights(), l4.features, 54.0)
    assert share == pytest.approx((54 / 72) ** POWER_EXPONENT)


def test_a_record_with_headroom_loses_less_than_the_cube_root():
    """An A100 SXM4 holds its boost clock at 400 W with power to spare (its
    chip's record: the 250 W PCIe board at 0.92 of boost), so at 300 W it
    runs what the 300 W A100 PCIe 80GB does: the same clock, on the same chip."""
    sxm = hardware.get("A100-SXM4-80GB")
    share = power_limit_share(predictor.opmodel.weights(), sxm.features, 300.0)
    assert (300 / 400) ** POWER_EXPONENT < share < 1.0
    capped = predictor.predict_op("mm", GEMM, "A100-SXM4-80GB@300W")
    pcie = predictor.predict_op("mm", GEMM, "A100-PCIE-80GB")
    assert capped == pytest.approx(pcie, rel=0.03)
    assert capped > predictor.predict_op("mm", GEMM, "A100-SXM4-80GB")


@pytest.mark.parametrize("gpu,watts", [("H100-SXM5-80GB", 350), ("L4", 54), ("T4", 50)])
def test_compute_slows_by_the_clock_and_memory_does_not(gpu, watts):
    capped = hardware.get(f"{gpu}@{watts}W")
    share = capped.spec["power_limit_clock_share"]
    # Tensor-core GEMMs are priced from the peak: exactly the clock's share.
    bf16 = [predictor.predict_op("mm", GEMM, g, dtype="bfloat16") for g in (gpu, capped)]
    if gpu != "T4":
        assert bf16[1] / bf16[0] == pytest.approx(1 / share, rel=0.01)
    # fp32 GEMMs go through the networks, which see the lower peak as their
    # input too: within a few percent of the clock's share, never faster.
    fp32 = [predictor.predict_op("mm", GEMM, g) for g in (gpu, capped)]
    assert fp32[1] > fp32[0]
    assert fp32[1] / fp32[0] == pytest.approx(1 / share, rel=0.05)
    add = [predictor.predict_op("add", GEMM, g) for g in (gpu, capped)]
    assert add[1] / add[0] == pytest.approx(1.0, abs=0.02)


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


def test_gpus_lists_a_limited_board_with_its_scaled_peaks(capsys):
    assert cli.main(["gpus", "T4", "T4@50W", "--json"]) == 0
    rows = {r["id"]: r for r in json.loads(capsys.readouterr().out)}
    assert set(rows) == {"T4", "T4@50W"}
    share = hardware.get("T4@50W").spec["power_limit_clock_share"]
    assert rows["T4@50W"]["fp32_tflops"] == pytest.approx(rows["T4"]["fp32_tflops"] * share)
    assert rows["T4@50W"]["memory_bw_gbs"] == rows["T4"]["memory_bw_gbs"]
    assert rows["T4@50W"]["chip_in_training_data"]
