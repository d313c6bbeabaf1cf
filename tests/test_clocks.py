"""GEMMs and convolutions on another board of a training chip run at the clock
that board's power sustains (``kernels.clocks``): the measured boards
themselves are priced as before, a board with more power per SM runs faster
up to its rated boost, one rated higher at the same power does not."""

import numpy as np
import pytest

from predictor import hardware, opmodel, reference
from predictor.calibration.train import pack
from predictor.engine import model_params
from predictor.kernels import layout as L
from predictor.kernels.clocks import clock_ratio, with_board_clock
from predictor.kernels.features import G_BMM, G_CONV, G_ELEMENTWISE, G_MATMUL
from predictor.kernels.mlp import HEADER, group_aux
from predictor.kernels.optime import op_time_us
from random_nets import random_net

# The shipped weights' measured boards: the matmul group's GEMMs, the conv
# group's convolutions (GA100's from the 80GB board; the H200's convolutions
# ran in TF32 and are not in the data).
GEMM_BOARDS = ("A100-PCIE-40GB", "H200-SXM-141GB", "P100-PCIE-16GB", "P4", "T4",
               "V100-PCIE-32GB")
CONV_BOARDS = ("A100-PCIE-80GB", "P100-PCIE-16GB", "P4", "T4", "V100-PCIE-32GB")



def _gpu(gid, **over):
    f = hardware.get(gid).features.copy()
    for k, v in over.items():
        f[getattr(L, k)] = v
    return f


def _gemm(m, n, k):
    d = np.zeros(L.MAX_DIMS, dtype=np.int64)
    d[:4] = (1, m, n, k)
    d[L.GEMM_LAYOUT] = L.GEMM_B_T
    return d


def _records(*boards):
    """Board records as train.board_records writes them: (chip, W/SM, boost, c)."""
    out = []
    for gid, c in boards:
        f = hardware.get(gid).features
        out += [f[L.G_CHIP], f[L.G_TDP_W] / f[L.G_SMS], f[L.G_CLOCK_MHZ], c]
    return out


def _weights(gemm_boards, conv_boards=()):
    return pack({G_MATMUL: random_net(G_MATMUL, 0, [20, 132] + _records(*gemm_boards)),
                 G_CONV: random_net(G_CONV, 1, [20, 108] + _records(*conv_boards)),
                 G_ELEMENTWISE: random_net(G_ELEMENTWISE, 3)})


@pytest.fixture(scope="module")
def shipped():
    mlp = opmodel.weights()
    if len(group_aux(mlp, G_MATMUL)) <= 2:
        pytest.skip("the shipped weights carry no board records")
    return mlp


def test_the_measured_boards_are_priced_as_their_own_kernels_say(shipped):
    for gid in GEMM_BOARDS:
        gpu = hardware.get(gid).features
        assert clock_ratio(shipped, G_MATMUL, gpu) == pytest.approx(1.0, abs=1e-12), gid
        assert clock_ratio(shipped, G_BMM, gpu) == pytest.approx(1.0, abs=1e-12), gid
    for gid in CONV_BOARDS:
        assert clock_ratio(shipped, G_CONV, hardware.get(gid).features) \
            == pytest.approx(1.0, abs=1e-12), gid


def test_gpus_of_other_chips_and_other_groups_are_untouched(shipped):
    for gid in ("L4", "H100-PCIE-80GB", "RTX-4090", "MI300X", "B200"):
        gpu = hardware.get(gid).features
        for g in (G_MATMUL, G_BMM, G_CONV):
            assert clock_ratio(shipped, g, gpu) == 1.0, gid
    a100 = hardware.get("A100-SXM4-80GB").features
    assert clock_ratio(shipped, G_ELEMENTWISE, a100) == 1.0


def test_more_power_per_sm_runs_faster_up_to_the_rated_boost():
    mlp = _weights([("A100-PCIE-40GB", 0.8)], [("A100-PCIE-80GB", 0.0)])
    pcie40 = hardware.get("A100-PCIE-40GB").features
    sxm = hardware.get("A100-SXM4-80GB").features  # 400 W to 250 W, the same 1410 MHz
    # The 40GB board sustains 0.8 x 1410 MHz; 1.6x the power per SM would take
    # it to 1.6^(1/3) x that = 1319 MHz, under the boost: the ratio is that.
    assert clock_ratio(mlp, G_MATMUL, sxm) == pytest.approx(1.6 ** (1 / 3), rel=1e-9)
    assert clock_ratio(mlp, G_MATMUL, pcie40) == 1.0
    # At c = 0.9 the same power reaches past the boost: capped there.
    capped = _weights([("A100-PCIE-40GB", 0.9)])
    assert clock_ratio(capped, G_MATMUL, sxm) == pytest.approx(1 / 0.9, rel=1e-9)
    # Convolutions from the 300 W 80GB board: the 250 W 40GB runs them slower.
    ratio = clock_ratio(mlp, G_CONV, pcie40)
    assert ratio == pytest.approx((250 / 300) ** (1 / 3), rel=1e-9)
    assert reference.clock_ratio(list(mlp), G_CONV, list(pcie40)) == pytest.approx(ratio)


def test_a_higher_rated_clock_at_the_same_power_is_not_faster():
    mlp = _weights([("V100-PCIE-32GB", 1.0)])
    v100s = _gpu("V100-PCIE-32GB", G_CLOCK_MHZ=1601.0, G_FP32_TFLOPS=16.4)
    ratio = clock_ratio(mlp, G_MATMUL, v100s)
    assert ratio == pytest.approx(1380.0 / 1601.0, rel=1e-9)
    params = model_params()
    d = _gemm(8192, 8192, 8192)
    t_pcie = op_time_us(L.MATMUL, L.F32, 1, d, hardware.get("V100-PCIE-32GB").features,
                        params, mlp)
    t_s = op_time_us(L.MATMUL, L.F32, 1, d, v100s, params, mlp)
    assert t_s == pytest.approx(t_pcie, rel=0.02)  # the same sustained clock: the same time


def test_only_the_compute_share_follows_the_clock():
    mlp = _weights([("A100-PCIE-40GB", 0.8)])
    sxm = hardware.get("A100-SXM4-80GB").features
    params = model_params()
    m = clock_ratio(mlp, G_MATMUL, sxm)
    big, thin = _gemm(8192, 8192, 8192), _gemm(65536, 4096, 2)  # compute-, memory-bound
    assert with_board_clock(mlp, G_MATMUL, 0.5, L.MATMUL, L.F32, big, sxm, params) \
        == pytest.approx(0.5 * m)
    slow = with_board_clock(mlp, G_MATMUL, 0.5, L.MATMUL, L.F32, thin, sxm, params)
    assert 0.5 <= slow < 0.5 * (1 + (m - 1) * 0.2)
    assert with_board_clock(mlp, G_MATMUL, 0.999, L.MATMUL, L.F32, big, sxm, params) \
        <= mlp[1 + HEADER * G_MATMUL + 4]  # never past the group's eta_max
    for d in (big, thin):
        assert reference.with_board_clock(list(mlp), G_MATMUL, 0.5, L.MATMUL, L.F32, list(d),
                                          list(sxm), list(params)) == pytest.approx(
            with_board_clock(mlp, G_MATMUL, 0.5, L.MATMUL, L.F32, d, sxm, params), rel=1e-12)


def test_weights_without_records_and_damaged_records():
    old = pack({G_MATMUL: random_net(G_MATMUL, 0, [20, 108])})
    assert clock_ratio(old, G_MATMUL, hardware.get("A100-SXM4-80GB").features) == 1.0
    assert opmodel.layout_problem(_weights([("A100-PCIE-40GB", 0.8)])) is None
    bad = _weights([("A100-PCIE-40GB", 1.5)])  # a clock fraction above 1
    assert "board record" in opmodel.layout_problem(bad)
    torn = pack({G_MATMUL: random_net(G_MATMUL, 0, [20, 108, 1.0, 2.0, 3.0])})
    assert "SM range" in opmodel.layout_problem(torn)


def test_a_board_without_a_measured_tensor_core_fraction_takes_its_twins(tmp_path, monkeypatch):
    """predictor.hardware: the measured twin's fraction at this board's
    sustained clock; measured boards and boards without a twin unchanged."""
    def frac(gid):
        return hardware.get(gid).features[L.G_TC_FRACTION]

    l40s = 0.743
    assert frac("L40S") == l40s and frac("RTX-A6000") == 0.797  # their own measurements
    ada = l40s * min(2505.0, 2520.0 * (300 / 350) ** (1 / 3)) / 2505.0
    assert frac("RTX-6000-ADA") == pytest.approx(ada, rel=1e-12)
    assert frac("RTX-6000-ADA") == pytest.approx(0.710, abs=5e-4)
    assert frac("L40") == pytest.approx(l40s * 2520.0 * (300 / 350) ** (1 / 3) / 2490.0)
    assert frac("A40") == 0.817  # its own measurement now (the RTX A6000's 0.797 as a twin before)
    # The V100S (250 W, rated 1601 MHz) takes the 300 W V100 SXM2's at the
    # clock its power sustains; the A30 has no measured twin: the median (the
    # A10 its own measurement now).
    v100s = 0.779 * min(1601.0, 1530.0 * (250 / 300) ** (1 / 3)) / 1601.0
    assert frac("V100S") == pytest.approx(v100s, rel=1e-12)
    assert frac("A30") == 0.80
    assert frac("A10") == 0.448
    # A user's spec of another board of the L40S's chip, at the L40S's power.
    spec = tmp_path / "twin.toml"
    spec.write_text('[[gpu]]\nid = "L40S-TWIN"\nname = "an L40S at 350 W"\n'
                    'architecture = "ada"\nsms = 142\nboost_clock_mhz = 2520\n'
                    'memory_bw_gbs = 864\nmemory_gb = 48\nfp32_tflops = 91.6\n'
                    'fp16_tflops = 362.05\nbf16_tflops = 362.05\ntdp_w = 350\n')
    monkeypatch.setattr(hardware, "_user_gpus", [])
    (twin,) = hardware.load_specs(spec)
    assert twin.features[L.G_TC_FRACTION] == pytest.approx(l40s)
