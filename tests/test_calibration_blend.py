"""Calibrated mode's blend of the measured ratio with the pure prediction:
``log t = w log(measured f_t / f_o) + (1 - w) log f_t`` (predictor.calibrated,
fitted by predictor.calibration.blend)."""

import json

import numpy as np
import pytest
import torch
import torch.nn as nn

import predictor
from predictor import calibrated, hardware
from predictor.calibration.device import DeviceInfo
from predictor.calibration.file import Calibration, graph_fingerprint
from predictor.errors import WeightsError
from predictor.kernels import layout as L
from predictor.kernels.features import GROUP_NAMES, G_NONE, group_of

# ------------------------------------------------------------------ math --


def test_blend_math_endpoints_and_positivity():
    rng = np.random.default_rng(0)
    cal = rng.uniform(1.0, 1e4, 200)
    f_o = rng.uniform(1.0, 1e4, 200)
    f_t = rng.uniform(1.0, 1e4, 200)
    # The kernels compute cal' * f_t / f_o.
    plain = calibrated.blend(cal, f_o, np.ones(200)) * f_t / f_o
    np.testing.assert_allclose(plain, cal * f_t / f_o, rtol=1e-12)
    pure = calibrated.blend(cal, f_o, np.zeros(200)) * f_t / f_o
    np.testing.assert_allclose(pure, f_t, rtol=1e-12)
    w = rng.uniform(0, 1, 200)
    mixed = calibrated.blend(cal, f_o, w) * f_t / f_o
    np.testing.assert_allclose(np.log(mixed),
                               w * np.log(cal * f_t / f_o) + (1 - w) * np.log(f_t), rtol=1e-9)
    assert np.isfinite(mixed).all() and (mixed > 0).all()
    # Between the two predictions it blends.
    lo, hi = np.minimum(plain, pure), np.maximum(plain, pure)
    assert ((mixed >= lo * (1 - 1e-12)) & (mixed <= hi * (1 + 1e-12))).all()
    # Unmeasured rows (0) and rows without a model time stay as they are.
    out = calibrated.blend(np.array([0.0, 5.0, 5.0]), np.array([3.0, 0.0, 2.0]), 0.5)
    assert out[0] == 0.0 and out[1] == 5.0 and out[2] == pytest.approx(np.sqrt(10.0))


def test_boards_of_one_chip_are_alike():
    assert calibrated.alike("A100-PCIE-40GB", "A100-PCIE-80GB")
    assert calibrated.alike("V100-PCIE-32GB", "Tesla V100-PCIE-32GB")
    assert not calibrated.alike("V100-PCIE-32GB", "A100-PCIE-40GB")
    assert not calibrated.alike("P4", "P100-PCIE-16GB")  # one architecture, two chips
    assert not calibrated.alike("V100-PCIE-32GB", None)
    # One SM design, other chips or boards: Habitat's wave scaling holds.
    assert calibrated.alike("A100-SXM4-80GB", "A30")
    assert calibrated.alike("H100-PCIE-80GB", "H100-SXM5-80GB")
    assert calibrated.alike("L4", "RTX-4090")
    assert not calibrated.alike("A100-SXM4-80GB", "A10")  # 8.0 against 8.6
    assert not calibrated.alike("T4", "V100-PCIE-32GB")


# ------------------------------------------------------------ the file --

def test_shipped_blend_file_is_read():
    w = calibrated.blend_weights()
    assert w.shape == (L.N_FAMILIES,) and ((w >= 0) & (w <= 1)).all()
    for fam in range(L.N_FAMILIES):
        if group_of(fam) == G_NONE:
            assert w[fam] == 1.0  # analytical-only families: the plain ratio
    from importlib import resources

    doc = json.loads(resources.files("predictor").joinpath(
        "weights", calibrated.BLEND_FILE).read_text())
    # One weight per family's group: batched GEMMs share the matmul family's.
    assert set(doc["weights"]) == {GROUP_NAMES[group_of(f)] for f in range(L.N_FAMILIES)
                                   if group_of(f) != G_NONE}
    assert "train-models" in doc["command"]
    assert w[L.MATMUL] == pytest.approx(doc["weights"]["matmul"])


@pytest.mark.parametrize("text", [
    "{not json", json.dumps({"format": 1}), json.dumps({"format": 2, "weights": {}}),
    json.dumps({"format": 1, "weights": {"matmul": 1.5}}),
    json.dumps({"format": 1, "weights": {"gemm": 0.5}}),
    json.dumps({"format": 1, "weights": {"matmul": "x"}}),
    json.dumps({"format": 1, "weights": [0.5]}),
])
def test_corrupt_blend_file_is_refused_naming_it(tmp_path, text):
    path = tmp_path / calibrated.BLEND_FILE
    path.write_text(text)
    with pytest.raises(WeightsError) as err:
        calibrated.read_blend(path)
    message = str(err.value)
    assert str(path) in message and len(message.splitlines()) == 1


def test_valid_blend_file_maps_groups_to_families(tmp_path):
    path = tmp_path / calibrated.BLEND_FILE
    path.write_text(json.dumps({"format": 1, "weights": {"matmul": 0.25, "conv": 0.5}}))
    w = calibrated.read_blend(path)
    assert w[L.MATMUL] == 0.25
    assert w[L.CONV] == w[L.CONV_DGRAD] == w[L.CONV_WGRAD] == 0.5
    assert w[L.SOFTMAX] == 1.0 and w[L.ATTENTION] == 1.0


# -------------------------------------------------- through the engine --

@pytest.fixture(scope="module")
def graph():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Flatten(),
                        nn.Linear(8 * 8 * 8, 16), nn.LayerNorm(16), nn.Softmax(-1))
    return predictor.trace(net, (torch.randn(2, 3, 8, 8),))


def _calibration(graph, gpu_id="V100-PCIE-32GB", batch=2):
    """A GPU calibration as a CUDA run would make it: rows 'measured' at a
    random multiple of the pure prediction (the first left unmeasured)."""
    gpu = hardware.get(gpu_id)
    info = DeviceInfo(kind="cuda", id=gpu.id, name=gpu.name, features=gpu.features.copy())
    pure = predictor.predict(graph, gpu.id, batch_size=batch).op_us
    us = pure * np.random.default_rng(1).uniform(0.5, 2.0, pure.shape)
    us[0] = 0.0
    return Calibration(
        model=graph.name, fingerprint=graph_fingerprint(graph), device_info=info,
        batch_sizes=np.array([batch]), measured_us=us[None, :], iteration_ms=np.array([np.nan]),
        ops_ms=np.array([float((us * graph.ops.count).sum() * 1e-3)]),
        unmeasured_ms=np.zeros(1), settings={"torch": torch.__version__, "tf32_matmul": False,
                                             "tf32_conv": True})


def test_engine_applies_the_blend_per_family(graph, monkeypatch):
    cal = _calibration(graph)
    w_fam = np.ones(L.N_FAMILIES)
    w_fam[L.MATMUL], w_fam[L.CONV], w_fam[L.ELEMENTWISE] = 0.0, 0.5, 0.3
    monkeypatch.setattr(calibrated, "blend_weights", lambda: w_fam)
    measured = cal.measured_us[0]
    f_o = predictor.predict(graph, cal.device, batch_size=2).op_us
    f_t = predictor.predict(graph, "H100-SXM5-80GB", batch_size=8).op_us
    got = predictor.predict(graph, "H100-SXM5-80GB", calibration=cal, batch_size=8)
    w = w_fam[graph.ops.family]
    want = f_t * (measured / f_o) ** w
    np.testing.assert_allclose(got.op_us[1:], want[1:], rtol=1e-9)
    assert got.op_us[0] == pytest.approx(f_t[0], rel=1e-9)  # unmeasured: pure
    assert (got.op_us > 0).all() and np.isfinite(got.op_us).all()
    # The sweep agrees with predict, on both sides of the chip boundary.
    s = predictor.sweep(graph, ["H100-SXM5-80GB", cal.device], [2, 8], calibration=cal)
    assert s.iteration_ms[0, 1] == pytest.approx(got.iteration_ms, rel=1e-9)
    on_origin = predictor.predict(graph, cal.device, calibration=cal, batch_size=2)
    np.testing.assert_allclose(on_origin.op_us[1:], measured[1:], rtol=1e-9)
    assert s.iteration_ms[1, 0] == pytest.approx(on_origin.iteration_ms, rel=1e-9)


def test_blend_zero_is_pure_and_same_chip_is_the_plain_ratio(graph, monkeypatch):
    cal = _calibration(graph, "A100-PCIE-40GB")
    monkeypatch.setattr(calibrated, "blend_weights", lambda: np.zeros(L.N_FAMILIES))
    pure = predictor.predict(graph, "V100-PCIE-32GB", batch_size=4).op_us
    got = predictor.predict(graph, "V100-PCIE-32GB", calibration=cal, batch_size=4).op_us
    np.testing.assert_allclose(got, pure, rtol=1e-9)
    # The 80 GB board is the same chip: Habitat's ratio, whatever w says.
    f_o = predictor.predict(graph, cal.device, batch_size=2).op_us
    f_t = predictor.predict(graph, "A100-PCIE-80GB", batch_size=4).op_us
    same = predictor.predict(graph, "A100-PCIE-80GB", calibration=cal, batch_size=4).op_us
    np.testing.assert_allclose(same[1:], cal.measured_us[0][1:] * f_t[1:] / f_o[1:], rtol=1e-9)


def test_basis_says_calibrated_only_where_a_measurement_counts(graph, monkeypatch):
    """On another chip a row whose group has blend weight 0 is the model's
    time and says so; on the origin's chip every measured row is calibrated."""
    cal = _calibration(graph)
    w_fam = np.ones(L.N_FAMILIES)
    w_fam[L.MATMUL] = 0.0
    monkeypatch.setattr(calibrated, "blend_weights", lambda: w_fam)
    other = predictor.predict(graph, "H100-SXM5-80GB", calibration=cal, batch_size=8)
    pure = predictor.predict(graph, "H100-SXM5-80GB", batch_size=8)
    fam = graph.ops.family
    measured = cal.measured_us[0] > 0
    gemm = (fam == L.MATMUL) & measured
    assert gemm.any() and (~gemm & measured).any()
    np.testing.assert_array_equal(other.op_basis[gemm], pure.op_basis[gemm])
    assert (other.op_basis[gemm] != L.BASIS_CALIBRATED).all()
    assert (other.op_basis[~gemm & measured] == L.BASIS_CALIBRATED).all()
    assert (other.op_basis[~measured] == pure.op_basis[~measured]).all()
    same = predictor.predict(graph, cal.device, calibration=cal, batch_size=8)
    assert (same.op_basis[measured] == L.BASIS_CALIBRATED).all()


def test_transfer_note_names_what_another_chip_uses(graph, monkeypatch):
    cal = _calibration(graph)
    w_fam = np.ones(L.N_FAMILIES)
    w_fam[L.MATMUL] = 0.0
    w_fam[[L.CONV, L.CONV_DGRAD, L.CONV_WGRAD]] = 0.7
    monkeypatch.setattr(calibrated, "blend_weights", lambda: w_fam)
    note = calibrated.transfer_note(cal, graph.ops, ["H100-SXM5-80GB", cal.device])
    assert note.startswith(f"calibrated on {cal.device}: on another chip (H100-SXM5-80GB)")
    assert "GEMM ops get the model's time" in note
    assert "conv (weight 0.70) ops blend" in note
    assert "\n" not in note
    # Only the calibrated chip asked, or every weight 1: nothing to say.
    assert calibrated.transfer_note(cal, graph.ops, [cal.device]) is None
    monkeypatch.setattr(calibrated, "blend_weights", lambda: np.ones(L.N_FAMILIES))
    assert calibrated.transfer_note(cal, graph.ops, ["H100-SXM5-80GB"]) is None


# ---------------------------------------------------------------- data --

def test_blend_fit_on_measured_pairs(data_dir):
    """On two training GPUs' shared GEMM shapes the fitted w makes neither
    pair worse than the model alone, has the lowest mean error of the grid
    weights that do, and leaving a GPU out drops every pair it is in."""
    import pandas as pd

    from predictor.calibration import blend as B
    from predictor.calibration.datasets import load_train
    from predictor.opmodel import weights

    samples = load_train(data_dir, ops=("linear",))
    res = pd.concat([B.pair_residuals(samples, o, t, weights())
                     for o, t in (("V100-PCIE-32GB", "P100-PCIE-16GB"),
                                  ("T4", "A100-PCIE-40GB"))], ignore_index=True)
    assert len(res) > 500 and np.isfinite(res[["r_o", "r_t"]].to_numpy()).all()
    w = B.fit_weights(res)
    assert set(w) == {"matmul"} and w["matmul"] in B.WEIGHT_GRID

    def mape(v, part):
        return float(np.abs(np.expm1(v * part["r_o"] - part["r_t"])).mean() * 100)

    pairs = [p for _, p in res.groupby(["origin", "target"])]
    assert len(pairs) == 2
    for part in pairs:
        assert mape(w["matmul"], part) <= mape(0.0, part) + 1e-9
    safe = [v for v in B.WEIGHT_GRID if all(mape(v, p) <= mape(0.0, p) + 1e-9 for p in pairs)]
    best = min(safe, key=lambda v: np.mean([mape(v, p) for p in pairs]))
    assert w["matmul"] == pytest.approx(best)
    # Excluding a GPU drops every pair it is in: the V100 -> P100 pair alone.
    only = B.fit_weights(res, exclude={"T4"})
    sub = res[res["origin"] == "V100-PCIE-32GB"]
    grid = [v for v in B.WEIGHT_GRID if mape(v, sub) <= mape(0.0, sub) + 1e-9]
    assert only["matmul"] == pytest.approx(min(grid, key=lambda v: mape(v, sub)))
