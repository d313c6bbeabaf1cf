"""What a new user hits in the first hour (issue 16): units and columns of the
tables, the breakdown's GPU and header, the factory called once."""

from __future__ import annotations

import sys

import pytest

import predictor
import predictor.errors
import torch
from predictor import cli
from predictor.text import flops_text

CONV_FACTORY = '''
import torch, torch.nn as nn

def build():
    with open(__file__ + ".calls", "a") as fh:
        fh.write("x")
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 14 * 14, 10))
    model.scale = torch.ones(10)   # a plain tensor attribute, built in the factory's mode
    return model, (torch.randn(4, 3, 16, 16),)
'''


@pytest.fixture()
def conv_factory(tmp_path):
    path = tmp_path / "small_cnn.py"
    path.write_text(CONV_FACTORY)
    return path


def _calls(path) -> int:
    p = path.with_name(path.name + ".calls")
    return len(p.read_text()) if p.exists() else 0


# ---- units and columns ------------------------------------------------------

@pytest.mark.parametrize("flops,text", [
    (0, "0.00 FLOP/iter"), (999, "999 FLOP/iter"), (5.79e6, "5.79 MFLOP/iter"),
    (4.11e9, "4.11 GFLOP/iter"), (12.34e12, "12.3 TFLOP/iter"), (1.5e15, "1.50 PFLOP/iter"),
])
def test_flops_have_adaptive_units(flops, text):
    assert flops_text(flops) == text


def test_small_model_title_has_no_zero_tflops(conv_factory, capsys):
    assert cli.main(["predict", f"{conv_factory}:build", "--gpus", "T4"]) == 0
    out = capsys.readouterr().out
    assert "0.00 TFLOP" not in out and "MFLOP/iter" in out
    assert "bwd ms" in out and "opt ms" in out


def test_inference_table_has_no_backward_or_optimizer_columns(conv_factory, capsys):
    assert cli.main(["predict", f"{conv_factory}:build", "--gpus", "T4", "--inference"]) == 0
    out = capsys.readouterr().out
    assert "fwd ms" in out and "bwd ms" not in out and "opt ms" not in out


def test_one_gpu_is_singular(conv_factory, capsys):
    assert cli.main(["sweep", f"{conv_factory}:build", "--gpus", "T4", "-b", "4"]) == 0
    out = capsys.readouterr().out
    assert "1 GPU ×" in out and "1 GPUs" not in out and "1 batch size =" in out



@pytest.mark.parametrize("command,extra", [
    ("predict", []), ("sweep", ["-b", "4"]), ("search", ["-b", "4"]),
])
def test_gpu_in_the_singular_is_gpus(conv_factory, capsys, command, extra):
    # `--gpu T4` is what one types for one GPU; argparse's prefix matching
    # would call it ambiguous beside --gpus-per-node.
    assert cli.main([command, f"{conv_factory}:build", "--gpu", "T4", "--json", *extra]) == 0
    out = capsys.readouterr().out
    assert '"T4"' in out and "H100" not in out

# ---- the breakdown ----------------------------------------------------------

def test_breakdown_header_says_ms_is_a_total_over_count(conv_factory, capsys):
    assert cli.main(["predict", f"{conv_factory}:build", "--gpus", "T4,H100",
                     "--breakdown", "3"]) == 0
    out = capsys.readouterr().out
    assert "ms total = count × ms each" in out and "ms each" in out


def test_breakdown_gpu_chooses_the_gpu(conv_factory, capsys):
    for asked, shown in (("t4", "T4"), ("h100", "H100-SXM5-80GB")):
        assert cli.main(["predict", f"{conv_factory}:build", "--gpus", "T4,H100",
                         "--breakdown-gpu", asked]) == 0
        assert f"slowest ops on {shown} " in capsys.readouterr().out


def test_breakdown_gpu_not_predicted_is_one_line(conv_factory, capsys):
    with pytest.raises(SystemExit) as exc:
        sys.exit(cli.main(["predict", f"{conv_factory}:build", "--gpus", "T4",
                           "--breakdown-gpu", "A100-SXM4-80GB"]))
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "--breakdown-gpu" in err and "\n" not in err
    assert _calls(conv_factory) == 0  # refused before tracing


# ---- the user's factory -----------------------------------------------------

def test_factory_file_is_called_once_per_trace(conv_factory):
    g = predictor.trace(f"{conv_factory}:build")
    assert _calls(conv_factory) == 1
    assert g.parameters == 8 * 3 * 9 + 8 + 8 * 14 * 14 * 10 + 10
    predictor.trace(f"{conv_factory}:build", mode="inference")
    assert _calls(conv_factory) == 2


def test_factory_callable_is_called_once_per_trace():
    import torch
    import torch.nn as nn

    calls = []

    def build():
        calls.append(1)
        return nn.Linear(16, 4), (torch.randn(8, 16),)

    g = predictor.trace(build)
    assert len(calls) == 1 and g.batch_size == 8 and g.parameters == 68


# ---- prices: bases, estimates, what search ranked by ------------------------

def test_gpu_price_bases():
    from predictor import hardware

    h100 = hardware.get("H100-SXM5-80GB").price("cloud")
    assert h100.usd_per_hour == 2.99 and h100.date == "2025-01" and not h100.estimate
    v32 = hardware.get("V100-PCIE-32GB")
    assert v32.price_per_hour is None  # no cloud on-demand price: empty, not $0.25
    m = v32.price("marketplace")
    assert m.usd_per_hour == 0.25 and m.estimate
    with pytest.raises(predictor.InvalidArgumentError, match="price basis"):
        v32.price("spot")


def test_gpus_listing_marks_estimates_and_bases(capsys):
    import json

    assert cli.main(["gpus"]) == 0
    out = capsys.readouterr().out
    assert "$/h cloud" in out and "$/h market" in out
    row = next(line for line in out.splitlines() if "V100-PCIE-32GB" in line)
    assert "~0.25" in row  # a marketplace estimate, marked
    row = next(line for line in out.splitlines() if "H200-SXM-141GB" in line)
    assert "~3.99" in row  # an approximate cloud reading, marked
    assert "estimates" in out and ".." not in out.split("$/h cloud:")[1]
    assert cli.main(["gpus", "--json"]) == 0
    rows = {r["id"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["V100-PCIE-32GB"]["price_usd_per_hour"] is None
    assert rows["V100-PCIE-32GB"]["marketplace_estimate"] is True
    assert rows["T4"]["price_estimate"] is False and rows["T4"]["price_date"] == "2025-01"



def test_gpus_lists_the_gpus_a_name_picks(capsys):
    """`predictor gpus h100 a100-sxm`: the GPU whose id a name is, else the
    GPUs whose ids contain it (case and dashes ignored), or the one an alias
    names; an unknown name is
    the database's one-line error. No "~ marks 0 estimates" when the rows
    shown have none."""
    import json

    assert cli.main(["gpus", "h100", "a100-sxm", "--json"]) == 0
    ids = [r["id"] for r in json.loads(capsys.readouterr().out)]
    assert ids and all("H100" in i or "A100-SXM" in i for i in ids)
    assert "A100-PCIE-40GB" not in ids and "H200-SXM-141GB" not in ids
    # A name that is an id picks that GPU alone, not every id containing it.
    assert cli.main(["gpus", "l4", "a10", "--json"]) == 0
    assert [r["id"] for r in json.loads(capsys.readouterr().out)] == ["A10", "L4"]
    assert cli.main(["gpus", "RTX 4090"]) == 0
    out = capsys.readouterr().out
    assert "1 GPU," in out and "RTX-4090" in out and "0 estimates" not in out
    with pytest.raises(SystemExit) as exc:
        sys.exit(cli.main(["gpus", "zzz"]))
    assert exc.value.code == 2
    assert "unknown GPU 'zzz'" in capsys.readouterr().err

def test_search_says_which_price_basis_it_ranked_by(conv_factory, capsys):
    import json

    g = predictor.trace(f"{conv_factory}:build")
    gpus = ["T4", "V100-PCIE-32GB", "RTX-4090"]
    cloud = predictor.search(g, objective="cost", gpus=gpus, batch_sizes=[4])
    assert cloud.price_basis == "cloud" and cloud.best()["gpu"] == "T4"
    assert "cloud on-demand" in cloud.price_basis_text()
    assert "no price on this basis: RTX-4090, V100-PCIE-32GB" in cloud.price_basis_text()
    market = predictor.search(g, objective="cost", gpus=gpus, batch_sizes=[4],
                              price_basis="marketplace")
    assert market.best()["gpu"] in ("RTX-4090", "V100-PCIE-32GB")
    assert market.price_info["T4"]["usd_per_gpu_hour"] is None  # never the cloud price
    assert "estimates: V100-PCIE-32GB" in market.price_basis_text()
    assert cli.main(["search", f"{conv_factory}:build", "--objective", "cost", "-b", "4",
                     "--gpus", ",".join(gpus)]) == 0
    out = " ".join(capsys.readouterr().out.split())  # the title wraps at the table's width
    assert "objective cost (cloud on-demand prices)" in out
    assert "ranked by cost at cloud on-demand USD per GPU-hour (2025-01)" in out
    assert "2025-01..2025-01" not in out
    assert cli.main(["search", f"{conv_factory}:build", "--objective", "cost", "-b", "4",
                     "--gpus", ",".join(gpus), "--price-basis", "marketplace", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["price_basis"] == "marketplace" and "marketplace" in data["price_basis_text"]


# ---- AMD: PyTorch on ROCm's fp32 defaults, one GCD per device ---------------

AMD = ("MI100", "MI210", "MI250", "MI250X", "MI300X")


@pytest.mark.parametrize("gid", AMD)
def test_amd_fp32_conv_and_matmul_run_at_the_fp32_matrix_rate(gid):
    from predictor import hardware
    from predictor.engine import model_params
    from predictor.kernels import layout as L
    from predictor.kernels.roofline import peak_flops

    g = hardware.get(gid)
    fp32 = g.spec["fp32_matrix_tflops"] / g.spec.get("dies", 1) * 1e12
    for tf32 in (None, True):  # the allow_tf32 switches do not turn xf32 on under ROCm
        params = model_params(tf32_matmul=tf32, tf32_conv=tf32)
        for family in (L.CONV, L.CONV_WGRAD, L.MATMUL):
            assert peak_flops(g.features, family, L.F32, params) == pytest.approx(fp32)
    # bf16 still runs on the matrix cores at the bf16 rate.
    bf16 = g.spec["bf16_tflops"] / g.spec.get("dies", 1) * 1e12
    assert peak_flops(g.features, L.MATMUL, L.BF16, model_params()) == pytest.approx(bf16)


def test_mi300x_fp32_conv_is_not_priced_at_its_tf32_peak():
    from predictor import hardware
    from predictor.engine import model_params
    from predictor.kernels import layout as L
    from predictor.kernels.roofline import peak_flops

    mi, h100 = hardware.get("MI300X"), hardware.get("H100-SXM5-80GB")
    conv = [peak_flops(g.features, L.CONV, L.F32, model_params()) for g in (mi, h100)]
    assert conv[0] == pytest.approx(163.4e12)        # not 653.7 (xf32)
    assert conv[1] == pytest.approx(494.7e12)        # cuDNN's TF32 default on the H100
    assert conv[0] < conv[1]


@pytest.mark.parametrize("gid", ["MI250", "MI250X"])
def test_mi250_is_one_gcd(gid):
    from predictor import hardware

    g = hardware.get(gid)
    assert g.memory_gb == 64 and "one GCD" in g.name and "package" in g.name
    row = hardware.gpus().set_index("id").loc[gid]
    assert row["memory_gb"] == 64 and row["memory_bw_gbs"] == pytest.approx(1638.4)
    assert row["sms"] == g.spec["sms"] // 2
    # The name ROCm gives one GCD resolves to it.
    assert hardware.get("AMD Instinct MI250X / MI250").id == "MI250"


# ---- ONNX: batch norm folded at export --------------------------------------

def _small_cnn():
    import torch.nn as nn

    return nn.Sequential(nn.Conv2d(3, 8, 3, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.Conv2d(8, 8, 3, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.Flatten(), nn.Linear(8 * 12 * 12, 10))


def _export(model, path, training: bool) -> str:
    import warnings

    import torch

    pytest.importorskip("onnx")
    model.train(training)
    kwargs = dict(dynamo=False, input_names=["x"], output_names=["y"],
                  dynamic_axes={"x": {0: "batch"}}, opset_version=17)
    if training:
        kwargs["training"] = torch.onnx.TrainingMode.TRAINING
        kwargs["do_constant_folding"] = False
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        try:
            torch.onnx.export(model, (torch.randn(2, 3, 16, 16),), str(path), **kwargs)
        except Exception as exc:  # noqa: BLE001 - an exporter this torch lacks
            pytest.skip(f"torch.onnx.export unavailable here: {exc}")
    return str(path)


def test_onnx_with_batch_norm_folded_says_so(tmp_path, capsys):
    folded = _export(_small_cnn(), tmp_path / "eval.onnx", training=False)
    kept = _export(_small_cnn(), tmp_path / "train.onnx", training=True)
    g_folded, g_kept = predictor.trace(folded), predictor.trace(kept)
    assert len(g_folded.notes) == 1 and "batch norm" in g_folded.notes[0]
    assert "dynamo=False, training=torch.onnx.TrainingMode.TRAINING" in g_folded.notes[0]
    assert "batch_norm" in " ".join(g_kept.ops.op_names) and g_kept.notes == []
    # Inference needs no batch norm statistics: nothing to say.
    assert predictor.trace(folded, mode="inference").notes == []
    assert cli.main(["predict", folded, "--gpus", "T4", "-b", "8"]) == 0
    out = capsys.readouterr().out
    assert "batch norm is folded" in " ".join(out.split())
    assert cli.main(["predict", folded, "--gpus", "T4", "-b", "8", "--csv"]) == 0
    assert "batch norm is folded" in capsys.readouterr().err


# ---- first run: the kernels' compile notice, progress without a terminal ----

def test_kernels_cached_looks_for_the_compiled_grid(tmp_path, monkeypatch):
    from predictor.commands import common

    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    assert not common.kernels_cached()
    (tmp_path / "kernels_x").mkdir()
    (tmp_path / "kernels_x" / "grid.evaluate_grid-176.py311.nbi").write_bytes(b"")
    assert common.kernels_cached()


def test_first_compile_notice_is_one_line_once(conv_factory, capsys, monkeypatch):
    from predictor.commands import common

    monkeypatch.setattr(common, "kernels_cached", lambda: False)
    monkeypatch.setattr(common, "_compile_noticed", False)
    assert cli.main(["predict", f"{conv_factory}:build", "--gpus", "T4"]) == 0
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if "compiling the numba kernels" in x]
    assert len(lines) == 1 and lines[0].startswith("predictor: first run:")
    assert cli.main(["predict", f"{conv_factory}:build", "--gpus", "T4"]) == 0
    assert "compiling" not in capsys.readouterr().err  # once per process
    monkeypatch.setattr(common, "kernels_cached", lambda: True)
    monkeypatch.setattr(common, "_compile_noticed", False)
    assert cli.main(["predict", f"{conv_factory}:build", "--gpus", "T4"]) == 0
    assert "compiling" not in capsys.readouterr().err


def test_progress_is_silent_without_a_terminal(capsys):
    # stderr that is not a terminal carries notes and one-line errors only.
    import time

    from predictor.commands.common import progress

    with progress("tracing slow-model ..."):
        time.sleep(0.05)
    assert capsys.readouterr().err == ""


def test_unknown_model_error_stays_one_line_before_the_first_compile(capsys, monkeypatch):
    from predictor.commands import common

    monkeypatch.setattr(common, "kernels_cached", lambda: False)
    monkeypatch.setattr(common, "_compile_noticed", False)
    with pytest.raises(SystemExit) as exc:
        sys.exit(cli.main(["predict", "no-such-model", "--gpus", "T4"]))
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "unknown model" in err and "\n" not in err and "compiling" not in err


def test_a_model_without_trainable_parameters_says_to_predict_inference(tmp_path, capsys):
    """A parameter-free or frozen model has no training step: one line that
    says so and what to run instead, not autograd's error about an empty
    list of inputs."""
    class Act(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x)

    frozen = torch.nn.Linear(4, 4).requires_grad_(False)
    for model in (Act(), frozen):
        with pytest.raises(predictor.errors.InvalidArgumentError, match="no trainable parameters"):
            predictor.trace(model, (torch.randn(2, 4),))
        graph = predictor.trace(model, (torch.randn(2, 4),), mode="inference")
        assert predictor.predict(graph, "T4").forward_ms > 0

    path = tmp_path / "act.py"
    path.write_text("import torch\n\nclass Act(torch.nn.Module):\n"
                    "    def forward(self, x):\n        return torch.relu(x)\n\n"
                    "def build():\n    return Act(), (torch.randn(2, 4),)\n")
    with pytest.raises(SystemExit) as exc:
        sys.exit(cli.main(["predict", f"{path}:build", "--gpus", "T4"]))
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "no trainable parameters" in err and "--inference" in err and "\n" not in err
    assert cli.main(["predict", f"{path}:build", "--gpus", "T4", "--inference"]) == 0


# ---- calibration: sanity checks, threads, extrapolation ---------------------

def test_flat_calibration_is_refused():
    from predictor.calibration import checks
    from predictor.calibration.file import OverheadModel

    # The busy-machine numbers: flat per-op sums, a fit to noise.
    batches, ops = [8, 32, 64], [615.0, 624.0, 616.0]
    model = [9.0, 35.0, 72.0]
    fit = OverheadModel.fit(__import__("numpy").asarray(ops), __import__("numpy").asarray(
        [580.0, 589.0, 581.0]))
    found = checks.problems(batches, ops, model, [[580.0] * 5] * 3, fit)
    assert any("hardly grows" in p and "8.0x" in p for p in found)
    assert all("\n" not in p for p in found)
    # The same model measured with --threads 1: sane.
    ok_ops = [8.9, 35.0, 72.0]
    fit = OverheadModel.fit(__import__("numpy").asarray(ok_ops),
                            __import__("numpy").asarray([10.0, 37.0, 75.0]))
    assert checks.problems(batches, ok_ops, model, [[10.0] * 5, [37.0] * 5, [75.0] * 5],
                           fit) == []


def test_falling_noisy_and_degenerate_calibrations_are_named():
    import numpy as np

    from predictor.calibration import checks
    from predictor.calibration.file import OverheadModel

    assert "falls" in checks.growth_problem([8, 32, 64], [10.0, 40.0, 30.0], [9, 35, 72])
    assert checks.growth_problem([8, 32, 64], [10.0, 40.0, 80.0], [9, 35, 72]) is None
    # A model that expects little growth (launch-bound) accepts little growth.
    assert checks.growth_problem([1, 2, 4], [5.0, 5.1, 5.2], [5.0, 5.05, 5.1]) is None
    assert "vary too much" in checks.spread_problem([8], [[10, 11, 30, 60, 9]])
    assert checks.spread_problem([8], [[10, 10.5, 11, 10.2, 9.9]]) is None
    bad = OverheadModel(fixed_ms=-35.17, scale=0.0, points=3)
    assert "degenerate" in checks.fit_problem(np.asarray([40.0, 60.0, 80.0]), bad)
    assert checks.fit_problem(np.asarray([40.0, 60.0, 80.0]),
                              OverheadModel(fixed_ms=2.0, scale=0.1, points=3)) is None


def test_calibrate_cli_refuses_a_failed_check(conv_factory, tmp_path, capsys, monkeypatch):
    import predictor.calibration.checks as checks

    monkeypatch.setattr(checks, "problems", lambda *a, **k: ["the measured time hardly grows"])
    out = tmp_path / "c.cal.npz"
    with pytest.raises(SystemExit) as exc:
        sys.exit(cli.main(["calibrate", f"{conv_factory}:build", "--device", "cpu",
                           "--repeats", "1", "--iterations", "1", "-o", str(out), "--json"]))
    assert exc.value.code == 2 and not out.exists()
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "not saved" in err and "--keep" in err
    assert cli.main(["calibrate", f"{conv_factory}:build", "--device", "cpu", "--repeats", "1",
                     "--iterations", "1", "-o", str(out), "--json", "--keep"]) == 0
    assert out.exists() and "saved anyway" in capsys.readouterr().err


def test_cpu_calibration_threads_default_to_half_the_cores(monkeypatch):
    import os

    import torch

    from predictor.commands.calibrate import default_threads

    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 16)
    assert default_threads("cpu") == 8
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    assert default_threads("cpu") == 1
    assert default_threads("cuda") is None


def test_extrapolation_note():
    from types import SimpleNamespace

    from predictor.calibrated import extrapolation_note

    cal = SimpleNamespace(batch_sizes=[16, 64, 128])
    assert extrapolation_note(cal, [16, 64, 200, 256]) is None
    note = extrapolation_note(cal, [64, 512])
    assert note.startswith("extrapolating the calibration: batch 512 is outside") and \
        "4.0x the largest" in note
    assert "1/8.0 of the smallest" in extrapolation_note(cal, [2])
