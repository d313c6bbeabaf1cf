"""What a new user hits in the first hour (issue 16): units and columns of the
tables, the breakdown's GPU and header, the factory called once."""

from __future__ import annotations

import sys

import pytest

import predictor
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
