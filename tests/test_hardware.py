"""The spec loader: ids, aliases, close-name errors, user spec files."""

import numpy as np
import pytest

import predictor
from predictor import hardware
from predictor.errors import SpecError, UnknownGPUError
from predictor.kernels import layout as L


@pytest.mark.parametrize("alias,gid", [
    ("h100", "H100-SXM5-80GB"), ("H100", "H100-SXM5-80GB"), ("a100", "A100-SXM4-80GB"),
    ("A100 80GB PCIe", "A100-PCIE-80GB"), ("NVIDIA A100 80GB PCIe", "A100-PCIE-80GB"),
    ("Tesla V100-PCIE-32GB", "V100-PCIE-32GB"), ("tesla t4", "T4"), ("NVIDIA L4", "L4"),
    ("p100-pcie-16gb", "P100-PCIE-16GB"), ("NVIDIA H100 80GB HBM3", "H100-SXM5-80GB"),
    ("a100_pcie_40gb", "A100-PCIE-40GB"),
])
def test_aliases(alias, gid):
    assert hardware.get(alias).id == gid


def test_at_least_25_gpus_with_features():
    db = hardware.database()
    assert len(db) >= 25
    feats = db.features(list(db))
    assert feats.shape == (len(db), L.N_GPU_FEATURES)
    flags = (L.G_CC_MAJOR, L.G_PRE_VOLTA, L.G_POWER_LIMIT_W)
    positive = [c for c in range(L.N_GPU_FEATURES) if c not in flags]
    assert np.isfinite(feats).all() and (feats[:, positive] > 0).all()
    # The compute capability major where the spec has one (AMD gfx targets: 0).
    for g, row in zip(db, feats):
        nvidia = g.vendor == "nvidia"
        assert (row[L.G_CC_MAJOR] >= 6) if nvidia else row[L.G_CC_MAJOR] == 0, g.id


def test_unknown_gpu_lists_close_names():
    with pytest.raises(UnknownGPUError) as err:
        hardware.get("H10O")
    msg = str(err.value)
    assert "H100" in msg and "\n" not in msg


def test_resolve_all_and_lists():
    db = hardware.database()
    assert len(db.resolve("all")) == len(db)
    assert [g.id for g in db.resolve("t4, h100")] == ["T4", "H100-SXM5-80GB"]
    assert len(db.resolve(None)) >= 5


def test_multi_die_package_is_one_torch_device():
    mi250 = hardware.get("MI250")
    assert mi250.features[L.G_SMS] == mi250.spec["sms"] / mi250.spec.get("dies", 1)


def test_gpus_dataframe():
    df = predictor.gpus()
    assert {"id", "memory_gb", "fp32_tflops", "price_usd_per_hour"} <= set(df.columns)
    assert len(df) == len(hardware.database())


USER_SPEC = """
[[gpu]]
id = "MY-ACCEL"
name = "My Accelerator"
aliases = ["myaccel"]
sms = 100
boost_clock_mhz = 1800
memory_gb = 48
memory_bw_gbs = 2000
fp32_tflops = 40
bf16_tflops = 400
"""


def test_user_spec_file(tmp_path, monkeypatch):
    monkeypatch.setattr(hardware, "_user_gpus", [])
    f = tmp_path / "mine.toml"
    f.write_text(USER_SPEC)
    hardware.load_specs(f)
    gpu = hardware.get("myaccel")
    assert gpu.id == "MY-ACCEL" and gpu.memory_gb == 48
    g = predictor.trace(__import__("torch").nn.Linear(64, 64),
                        (__import__("torch").randn(32, 64),))
    assert predictor.predict(g, "MY-ACCEL").iteration_ms > 0


@pytest.mark.parametrize("text,match", [
    ("[[gpu]]\nid = 'X'\nsms = 10\n", "missing required"),
    ("[[gpu]]\nid = 'X'\nsms = -4\nboost_clock_mhz = 1\nmemory_gb = 1\nmemory_bw_gbs = 1\n"
     "fp32_tflops = 1\n", "positive number"),
    ("not = [valid toml", "not a valid TOML"),
    ("title = 'no gpus'\n", "no \\[\\[gpu\\]\\] tables"),
])
def test_bad_spec_files_name_the_file(tmp_path, monkeypatch, text, match):
    monkeypatch.setattr(hardware, "_user_gpus", [])
    f = tmp_path / "bad.toml"
    f.write_text(text)
    with pytest.raises(SpecError, match=match) as err:
        hardware.load_specs(f)
    assert "bad.toml" in str(err.value)


def test_missing_spec_file(tmp_path):
    with pytest.raises(SpecError, match="cannot read"):
        hardware.load_specs(tmp_path / "nope.toml")


def test_ffma_issue_share_only_on_32_lane_schedulers():
    """fp32 GEMMs on an SM whose schedulers each feed 32 FP32 lanes (GA10x,
    AD10x, Hopper, Blackwell) can issue at most FFMA_ISSUE_SHARE of the peak;
    the five training GPUs' SMs (Pascal, Volta, Turing, GA100) and AMD's keep
    the full peak, so the learned models' training inputs do not move."""
    from predictor.engine import model_params
    from predictor.kernels.roofline import FFMA_ISSUE_SHARE, peak_flops

    assert 0.9 < FFMA_ISSUE_SHARE < 0.93
    p = model_params()
    for gid in ("H100-SXM5-80GB", "L4", "RTX-3090", "RTX-4090", "B200", "A10G"):
        g = hardware.get(gid).features
        assert g[L.G_FFMA_ISSUE] == FFMA_ISSUE_SHARE, gid
        assert peak_flops(g, L.MATMUL, L.F32, p) == \
            pytest.approx(g[L.G_FP32_TFLOPS] * 1e12 * FFMA_ISSUE_SHARE)
        # TF32, half precision and memory-bound rows are not FFMA loops.
        assert peak_flops(g, L.MATMUL, L.BF16, p) == pytest.approx(g[L.G_BF16_TFLOPS] * 1e12)
        assert peak_flops(g, L.ELEMENTWISE, L.F32, p) == pytest.approx(g[L.G_FP32_TFLOPS] * 1e12)
    for gid in ("P4", "P100-PCIE-16GB", "T4", "V100-PCIE-32GB", "A100-PCIE-40GB",
                "A100-SXM4-80GB", "MI300X"):
        g = hardware.get(gid).features
        assert g[L.G_FFMA_ISSUE] == 1.0, gid
    # A row written before the column existed (shorter, or 0 there) keeps the peak.
    h100 = hardware.get("H100-SXM5-80GB").features
    old = h100[:L.G_FFMA_ISSUE].copy()
    zero = h100.copy()
    zero[L.G_FFMA_ISSUE] = 0.0
    for row in (old, zero):
        assert peak_flops(row, L.MATMUL, L.F32, p) == pytest.approx(h100[L.G_FP32_TFLOPS] * 1e12)


def test_pre_volta_flag_marks_pascal_and_older_only():
    """layout.G_PRE_VOLTA: 1 on NVIDIA SMs below compute capability 7.0 (the
    P100 and P4 among the training GPUs), 0 on Volta and later and on AMD."""
    db = hardware.database()
    for g in db:
        flag = g.features[L.G_PRE_VOLTA]
        assert flag in (0.0, 1.0), g.id
        assert flag == (1.0 if g.vendor == "nvidia" and g.features[L.G_CC_MAJOR] < 7 else 0.0), g.id
    for gid in ("P4", "P100-PCIE-16GB"):
        assert hardware.get(gid).features[L.G_PRE_VOLTA] == 1.0
    for gid in ("V100-PCIE-32GB", "T4", "A100-PCIE-40GB", "H100-SXM5-80GB", "MI300X"):
        assert hardware.get(gid).features[L.G_PRE_VOLTA] == 0.0
