"""Calibration: timing ops on the local device, the calibration file, and
calibrated predictions (measured x model ratio)."""

import json
import zipfile

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import predictor
from predictor import hardware
from predictor import calibrated
from predictor.calibration.device import DeviceInfo, cpu_features, match_gpu
from predictor.calibration.file import (FORMAT, VERSION, Calibration, OverheadModel,
                                        graph_fingerprint, load)
from predictor.calibration.measure import measure_table
from predictor.cli import main
from predictor.errors import FileFormatError, InvalidArgumentError
from predictor.kernels import layout as L

CPU = torch.device("cpu")


def _cnn():
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Conv2d(8, 8, 3, stride=2, padding=1),
                         nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(32, 5))


class _Mixed(nn.Module):
    """One of most kernel families: embedding, attention, layer norm, LSTM, dropout."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(50, 16)
        self.norm = nn.LayerNorm(16)
        self.qkv = nn.Linear(16, 48)
        self.lstm = nn.LSTM(16, 16)
        self.out = nn.Linear(16, 50)

    def forward(self, ids):
        x = self.norm(self.emb(ids))
        q, k, v = self.qkv(x).view(*x.shape[:2], 3, 2, 8).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + F.dropout(a.transpose(1, 2).reshape(x.shape), 0.1, self.training)
        y, _ = self.lstm(x.transpose(0, 1))
        return torch.log_softmax(self.out(y), -1)


@pytest.fixture(scope="module")
def cnn_graph():
    torch.manual_seed(0)
    return predictor.trace(_cnn(), (torch.randn(2, 3, 16, 16),))


@pytest.fixture(scope="module")
def cnn_cal(cnn_graph):
    # One thread: CPU timings of multi-threaded ops are erratic on a loaded CI box.
    return predictor.calibrate(cnn_graph, device="cpu", repeats=2, batch_sizes=[2, 4],
                               iterations=2, threads=1, progress=False)


@pytest.fixture(scope="module")
def saved(cnn_cal, tmp_path_factory):
    path = tmp_path_factory.mktemp("cal") / "cnn.cal.npz"
    cnn_cal.save(path)
    return path


# ---------------------------------------------------------------- measuring --

def test_every_row_of_mixed_model_is_materialised():
    torch.manual_seed(0)
    g = predictor.trace(_Mixed(), (torch.randint(0, 50, (2, 6)),))
    fams = {L.FAMILY_NAMES[f] for f in g.ops.family}
    assert {"embedding", "attention", "attention_bwd", "layer_norm", "lstm", "lstm_bwd",
            "dropout", "optimizer", "matmul", "softmax"} <= fams
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        times = measure_table(g.ops, 3, CPU, repeats=1, min_sample_s=1e-4, progress=False)
    finally:
        torch.set_num_threads(threads)
    assert times.skipped == {}
    assert times.measured == len(g.ops)
    assert np.all(np.isfinite(times.us)) and np.all(times.us > 0)


def test_calibration_measures_ops_and_iteration(cnn_graph, cnn_cal):
    cal = cnn_cal
    assert cal.device == "cpu" and cal.is_cpu
    assert list(cal.batch_sizes) == [2, 4]
    assert cal.measured_rows == len(cnn_graph.ops) and not cal.skipped
    assert np.all(cal.ops_ms > 0) and np.all(np.isfinite(cal.iteration_ms))
    assert cal.overhead.points == 2
    info = cal.device_info
    assert info.peak_gflops > 0 and info.bandwidth_gbs > 0 and info.op_overhead_us > 0
    assert cal.settings["torch"] == torch.__version__
    assert cal.fingerprint == graph_fingerprint(cnn_graph)


def test_fingerprint_ignores_batch_size_but_not_the_model(cnn_graph):
    torch.manual_seed(0)
    other_batch = predictor.trace(_cnn(), (torch.randn(7, 3, 16, 16),))
    assert graph_fingerprint(other_batch) == graph_fingerprint(cnn_graph)
    other_size = predictor.trace(_cnn(), (torch.randn(2, 3, 20, 20),))
    assert graph_fingerprint(other_size) != graph_fingerprint(cnn_graph)


# ---------------------------------------------------- calibrated predictions --

def test_prediction_at_calibrated_batch_reproduces_measurements(cnn_graph, cnn_cal):
    for j, b in enumerate(cnn_cal.batch_sizes):
        p = predictor.predict(cnn_graph, "cpu", calibration=cnn_cal, batch_size=int(b))
        measured = cnn_cal.measured_us[j]
        have = measured > 0
        np.testing.assert_allclose(p.op_us[have], measured[have], rtol=1e-9)
        # Every row measured here: the per-op part is the measured sum.
        assert p.iteration_ms - p.overhead_ms == pytest.approx(cnn_cal.ops_ms[j], rel=1e-9)
        assert set(p.ops["basis"]) == {"calibrated"}


def test_overhead_model_reproduces_real_iteration_at_one_batch(cnn_graph):
    cal = predictor.calibrate(cnn_graph, device="cpu", repeats=1, batch_sizes=[3], iterations=1,
                              threads=1, progress=False)
    p = predictor.predict(cnn_graph, "cpu", calibration=cal, batch_size=3)
    assert p.iteration_ms == pytest.approx(cal.iteration_ms[0], rel=1e-9)
    assert cal.overhead.points == 1 and cal.overhead.scale == 0.0


def test_sweep_matches_predict_and_grows_with_batch(cnn_graph, cnn_cal):
    s = predictor.sweep(cnn_graph, None, [2, 4, 16, 64], calibration=cnn_cal)
    assert s.gpus == ["cpu"]
    it = s.iteration_ms[0]
    assert np.all(np.isfinite(it)) and np.all(it > 0)
    assert it[1] < it[2] < it[3]  # scaled from the same batch-4 measurements
    p = predictor.predict(cnn_graph, "cpu", calibration=cnn_cal, batch_size=16)
    assert p.iteration_ms == pytest.approx(it[2], rel=1e-9)


def test_cpu_calibration_refuses_other_devices(cnn_graph, cnn_cal):
    with pytest.raises(InvalidArgumentError, match="measured on a CPU"):
        predictor.predict(cnn_graph, "H100-SXM5-80GB", calibration=cnn_cal)
    with pytest.raises(InvalidArgumentError, match="measured on a CPU"):
        predictor.sweep(cnn_graph, "all", [2], calibration=cnn_cal)


def test_calibration_of_another_graph_is_refused(cnn_cal):
    other = predictor.trace(nn.Sequential(nn.Linear(4, 4)), (torch.randn(2, 4),))
    with pytest.raises(FileFormatError, match="calibrated for model"):
        predictor.predict(other, "cpu", calibration=cnn_cal)


def test_dtype_override_is_refused(cnn_graph, cnn_cal):
    with pytest.raises(InvalidArgumentError, match="dtype"):
        predictor.predict(cnn_graph, "cpu", calibration=cnn_cal, dtype="float16")


def _gpu_calibration(graph, gpu_id="V100-PCIE-32GB", batch=2, tf32_conv=True):
    """A calibration as a CUDA run would make it (no GPU needed): every row but
    the first 'measured' at a random multiple of the pure-mode prediction."""
    gpu = hardware.get(gpu_id)
    info = DeviceInfo(kind="cuda", id=gpu.id, name=gpu.name, features=gpu.features.copy())
    pure = predictor.predict(graph, gpu.id, batch_size=batch).op_us
    us = pure * np.random.default_rng(1).uniform(0.5, 2.0, pure.shape)
    us[0] = 0.0  # one row left unmeasured
    return Calibration(
        model=graph.name, fingerprint=graph_fingerprint(graph), device_info=info,
        batch_sizes=np.array([batch]), measured_us=us[None, :], iteration_ms=np.array([np.nan]),
        ops_ms=np.array([float((us * graph.ops.count).sum() * 1e-3)]),
        unmeasured_ms=np.zeros(1), settings={"torch": torch.__version__, "tf32_matmul": False,
                                             "tf32_conv": tf32_conv})


def test_gpu_calibration_scales_by_model_ratio(cnn_graph, monkeypatch):
    # The plain ratio (w = 1); tests/test_calibration_blend.py covers the blend.
    monkeypatch.setattr("predictor.calibrated.blend_weights", lambda: np.ones(L.N_FAMILIES))
    cal = _gpu_calibration(cnn_graph)
    measured = cal.measured_us[0]
    pure_origin = predictor.predict(cnn_graph, cal.device, batch_size=2).op_us
    pure = predictor.predict(cnn_graph, "H100-SXM5-80GB", batch_size=8)
    calibrated = predictor.predict(cnn_graph, "H100-SXM5-80GB", calibration=cal, batch_size=8)
    # t = measured x f(target, 8) / f(origin, 2): the model's bias cancels.
    np.testing.assert_allclose(calibrated.op_us[1:],
                               measured[1:] * pure.op_us[1:] / pure_origin[1:], rtol=1e-9)
    assert calibrated.op_us[0] == pytest.approx(pure.op_us[0], rel=1e-9)  # unmeasured
    assert L.BASIS_NAMES[calibrated.op_basis[0]] != "calibrated"
    assert (calibrated.op_basis[1:] == L.BASIS_CALIBRATED).all()
    assert (calibrated.ops["basis"] == "calibrated").sum() == len(cnn_graph.ops) - 1
    on_origin = predictor.predict(cnn_graph, cal.device, calibration=cal, batch_size=2)
    np.testing.assert_allclose(on_origin.op_us[1:], measured[1:], rtol=1e-9)
    s = predictor.sweep(cnn_graph, ["H100-SXM5-80GB", cal.device], [2, 8], calibration=cal)
    assert s.iteration_ms[0, 1] == pytest.approx(calibrated.iteration_ms, rel=1e-9)


def test_gpu_calibration_refuses_other_tf32_setting(cnn_graph):
    cal = _gpu_calibration(cnn_graph, tf32_conv=False)
    with pytest.raises(InvalidArgumentError, match="tf32_conv"):
        predictor.predict(cnn_graph, "A100-SXM4-80GB", calibration=cal)
    predictor.predict(cnn_graph, "A100-SXM4-80GB", calibration=cal, tf32_conv=False)


# --------------------------------------------------------------------- file --

def test_round_trip(cnn_graph, cnn_cal, saved):
    back = load(saved, cnn_graph)
    assert back.path == saved
    np.testing.assert_array_equal(back.measured_us, cnn_cal.measured_us)
    np.testing.assert_array_equal(back.batch_sizes, cnn_cal.batch_sizes)
    np.testing.assert_array_equal(back.origin, cnn_cal.origin)
    np.testing.assert_allclose(back.iteration_ms, cnn_cal.iteration_ms)
    assert back.overhead == cnn_cal.overhead
    assert back.device_info.peak_gflops == cnn_cal.device_info.peak_gflops
    assert back.settings == cnn_cal.settings
    a = predictor.sweep(cnn_graph, "cpu", [2, 5, 32], calibration=cnn_cal)
    b = predictor.sweep(cnn_graph, "cpu", [2, 5, 32], calibration=back)
    np.testing.assert_array_equal(a.phase_ms, b.phase_ms)
    # Self-describing: the header is plain JSON.
    with np.load(saved) as z:
        header = json.loads(z["header"].tobytes())
    assert header["format"] == FORMAT and header["version"] == VERSION
    assert header["device"]["id"] == "cpu" and header["settings"]["torch"] == torch.__version__


def _rewrite(src, dst, edit):
    with np.load(src) as z:
        arrays = {k: z[k] for k in z.files}
    header = json.loads(arrays["header"].tobytes())
    edit(header, arrays)
    arrays["header"] = np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)
    with open(dst, "wb") as f:
        np.savez(f, **arrays)
    return dst


@pytest.mark.parametrize("case,match", [
    ("truncated", "truncated or corrupt"),
    ("random", "truncated or corrupt"),
    ("empty", "truncated or corrupt"),
    ("version", "format version 99 is newer"),
    ("torch_major", "another major version"),
    ("not_calibration", "not a dnn-predictor calibration"),
    ("checksum", "checksum"),
    ("missing", "no such calibration file"),
])
def test_bad_files_name_the_file(saved, tmp_path, case, match):
    bad = tmp_path / f"{case}.npz"
    data = saved.read_bytes()
    if case == "truncated":
        bad.write_bytes(data[: len(data) // 2])
    elif case == "random":
        bad.write_bytes(np.random.default_rng(0).bytes(4096))
    elif case == "empty":
        bad.write_bytes(b"")
    elif case == "version":
        _rewrite(saved, bad, lambda h, a: h.update(version=99))
    elif case == "torch_major":
        _rewrite(saved, bad, lambda h, a: h["settings"].update(torch="1.13.1"))
    elif case == "not_calibration":
        _rewrite(saved, bad, lambda h, a: h.update(format="something-else"))
    elif case == "checksum":
        def corrupt(h, a):
            a["measured_us"] = a["measured_us"] * 2
        _rewrite(saved, bad, corrupt)
    with pytest.raises(FileFormatError, match=match) as err:
        load(bad)
    assert str(bad) in str(err.value)
    assert "pickle" not in str(err.value)  # numpy's advice for a file that is not a zip


def test_other_model_file_is_refused_by_name(saved):
    other = predictor.trace(nn.Sequential(nn.Linear(4, 4)), (torch.randn(2, 4),))
    with pytest.raises(FileFormatError, match="calibrated for model") as err:
        load(saved, other)
    assert str(saved) in str(err.value)


def test_save_is_atomic(cnn_cal, tmp_path, monkeypatch):
    path = tmp_path / "c.npz"
    cnn_cal.save(path)
    before = path.read_bytes()

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(np, "savez", boom)
    with pytest.raises(OSError):
        cnn_cal.save(path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["c.npz"]
    assert zipfile.is_zipfile(path)


# ------------------------------------------------------------------- pieces --

def test_overhead_fit():
    ops = np.array([10.0, 20.0])
    exact = OverheadModel.fit(ops, 1.1 * ops + 2.0)
    assert exact.scale == pytest.approx(0.1) and exact.fixed_ms == pytest.approx(2.0)
    one = OverheadModel.fit(ops[:1], np.array([13.0]))
    assert one.fixed_ms == pytest.approx(3.0) and one.scale == 0.0
    noisy = OverheadModel.fit(ops, np.array([10.5, 23.0]))  # negative intercept: proportional
    assert noisy.fixed_ms == 0.0 and noisy.scale == pytest.approx(33.5 / 30 - 1)
    assert OverheadModel.fit(ops, np.array([np.nan, np.nan])).points == 0


def test_kernel_args_pick_nearest_calibrated_batch(cnn_cal):
    us, b, origin = cnn_cal.kernel_args(3)
    assert set(b) <= {2, 4}
    us16, b16, _ = cnn_cal.kernel_args(16)
    assert set(b16) == {4}
    np.testing.assert_array_equal(us16, cnn_cal.measured_us[1])
    assert origin.shape == (L.N_GPU_FEATURES,)


def test_fresh_memory_cost_only_above_threshold(cnn_graph):
    feats = cpu_features(50.0, 10.0, 1)
    info = DeviceInfo(kind="cpu", id="cpu", name="x", features=feats, op_overhead_us=5.0,
                      alloc_threshold_bytes=32 * 2**20, alloc_us_per_mib=800.0)
    assert not calibrated.fresh_memory_us(cnn_graph.ops, 2, info).any()
    big = calibrated.fresh_memory_us(cnn_graph.ops, 4096, info)
    assert big.max() > 0
    first_conv = int(np.flatnonzero(cnn_graph.ops.family == L.CONV)[0])
    # 4096 x 8 x 16 x 16 fp32 outputs = 32 MiB exactly
    assert big[first_conv] == pytest.approx(32 * 800.0)


def test_match_gpu_names():
    assert match_gpu("Tesla V100-PCIE-32GB", 80).id == hardware.get("Tesla V100-PCIE-32GB").id
    h100 = hardware.get("H100-SXM5-80GB")
    assert match_gpu("NVIDIA H100 80GB HBM3", int(h100.features[L.G_SMS]), 79.6).id == h100.id
    assert match_gpu("Some Unknown Accelerator", 10) is None


# ---------------------------------------------------------------------- CLI --

FACTORY = """
import torch, torch.nn as nn

def build():
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Flatten(),
                          nn.Linear(4 * 8 * 8, 3))
    return model, (torch.randn(2, 3, 8, 8),)
"""


def test_cli_calibrate_then_predict(tmp_path, capsys):
    src = tmp_path / "tiny.py"
    src.write_text(FACTORY)
    out = tmp_path / "tiny.cal.npz"
    spec = f"{src}:build"
    assert main(["calibrate", spec, "-o", str(out), "--repeats", "1", "--iterations", "1",
                 "--calibrate-at", "2", "--threads", "1", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["device"] == "cpu" and summary["file"] == str(out) and out.exists()
    assert main(["predict", spec, "--calibration", str(out), "--json"]) == 0
    pred = json.loads(capsys.readouterr().out)
    assert [p["gpu"] for p in pred["predictions"]] == ["cpu"]
    assert main(["sweep", spec, "--calibration", str(out), "-b", "2,4,8", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["gpus"] == ["cpu"]
    assert main(["predict", spec, "--calibration", str(out), "--gpus", "T4"]) == 2
    err = capsys.readouterr().err
    assert "measured on a CPU" in err and len(err.strip().splitlines()) == 1


def test_cli_bad_calibration_file_is_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a calibration")
    assert main(["predict", "resnet50", "--calibration", str(bad)]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and len(err.strip().splitlines()) == 1


# ------------------------------------------------------------------- per op --

def test_predict_op_with_origin_scales_by_ratio():
    from predictor.opmodel import predict_op

    shapes = [(4096, 1024), (1024, 1024)]
    target = predict_op("linear", shapes, "H100-SXM5-80GB")
    origin = predict_op("linear", shapes, "V100-PCIE-32GB")
    scaled = predict_op("linear", shapes, "H100-SXM5-80GB", origin=("V100-PCIE-32GB", 2.5))
    assert scaled == pytest.approx(2.5 * target / origin, rel=1e-12)
    same = predict_op("linear", shapes, "V100-PCIE-32GB", origin=("Tesla V100-PCIE-32GB", 2.5))
    assert same == pytest.approx(2.5, rel=1e-12)
    for bad in (("cpu", 1.0), ("V100-PCIE-32GB", -1.0), ("V100-PCIE-32GB",), "V100"):
        with pytest.raises(InvalidArgumentError):
            predict_op("linear", shapes, "T4", origin=bad)


@pytest.mark.parametrize("amp,dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_real_step_of_an_autocast_trace_runs_under_autocast(amp, dtype, monkeypatch):
    """The real iteration a calibration times is the traced program: forward
    and loss under autocast (fp16 with a GradScaler). Timed in fp32 it was
    another program, and on dcgan the overhead fit between the per-op sums
    and it came out degenerate (the calibration was refused)."""
    from predictor.calibration.step import build_step

    g = predictor.trace(_cnn(), (torch.randn(2, 3, 16, 16),), amp=amp)
    step = build_step(g.source, g.mode, g.optimizer, 2, CPU, g.amp)
    seen = []
    linear = nn.Linear.forward

    def forward(self, x):  # the step's own (deep-copied) model runs through the class
        out = linear(self, x)
        seen.append(out.dtype)
        return out

    monkeypatch.setattr(nn.Linear, "forward", forward)
    step()
    step()
    assert seen and set(seen) == {dtype}


def test_a_gru_row_is_measured_as_a_gru():
    """A recurrent row with 3 gates is timed as an nn.GRU layer, 1 as an
    nn.RNN (calibration/measure.py reads the row's gates)."""
    from calibration import measure as M

    class Rec(nn.Module):
        def __init__(self, kind):
            super().__init__()
            self.rnn = kind(16, 24)

        def forward(self, x):
            return self.rnn(x)[0]

    for kind, gates in ((nn.GRU, 3), (nn.RNN, 1)):
        g = predictor.trace(Rec(kind), (torch.randn(5, 2, 16),), loss_fn="mean", batch_dim=1)
        rows = np.isin(g.ops.family, (L.LSTM, L.LSTM_BWD))
        assert set(g.ops.dims(2)[rows, 4]) == {gates}
        assert M._RECURRENT_LAYERS[gates] is kind
        times = measure_table(g.ops, 2, CPU, repeats=1, min_sample_s=1e-4, progress=False)
        assert times.skipped == {} and np.all(times.us > 0)
