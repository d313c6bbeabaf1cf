"""The command line as a user runs it: tables, JSON, and one-line errors."""

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from predictor import cli


def run(*args, **kw):
    return subprocess.run([sys.executable, "-m", "predictor.cli", *args], capture_output=True,
                          text=True, timeout=600, **kw)


@pytest.fixture(scope="module")
def resnet_json():
    proc = run("predict", "resnet50", "--batch-size", "64", "--gpus",
               "T4,V100-PCIE-32GB,A100-SXM4-40GB,H100-SXM5-80GB", "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_predict_json_order(resnet_json):
    out = resnet_json
    assert out["model"] == "resnet50" and out["batch_size"] == 64
    preds = {p["gpu"]: p for p in out["predictions"]}
    t = [preds[g]["iteration_ms"] for g in ("H100-SXM5-80GB", "A100-SXM4-40GB",
                                            "V100-PCIE-32GB", "T4")]
    assert t == sorted(t) and t[0] > 0
    for p in out["predictions"]:
        total = p["forward_ms"] + p["backward_ms"] + p["optimizer_ms"]
        assert p["iteration_ms"] == pytest.approx(total)


def test_predict_table_and_csv(capsys):
    assert cli.main(["predict", "dcgan", "--batch-size", "8", "--gpus", "T4,h100"]) == 0
    out = capsys.readouterr().out
    assert "H100-SXM5-80GB" in out and "samples/s" in out
    assert cli.main(["predict", "dcgan", "-b", "8", "--gpus", "T4", "--csv",
                     "--inference"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("model,gpu,batch_size,iteration_ms") and len(lines) == 2


def test_titles_and_json_say_the_precision(capsys):
    """A prediction says what precision it was made in: the table's title and
    --json name autocast (and TF32 matmuls), not just the --dtype."""
    assert cli.main(["predict", "dcgan", "-b", "8", "--gpus", "A100-SXM4-80GB",
                     "--amp", "bf16"]) == 0
    assert "· amp bf16" in capsys.readouterr().out
    assert cli.main(["sweep", "dcgan", "-b", "8,16", "--gpus", "A100-SXM4-80GB",
                     "--tf32"]) == 0
    assert "float32 + TF32 matmuls" in capsys.readouterr().out
    assert cli.main(["predict", "dcgan", "-b", "8", "--gpus", "A100-SXM4-80GB",
                     "--amp", "fp16", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["amp"] == "fp16" and out["tf32_matmul"] is False
    assert cli.main(["predict", "dcgan", "-b", "8", "--gpus", "A100-SXM4-80GB",
                     "--amp", "bf16", "--csv"]) == 0
    header, row = capsys.readouterr().out.strip().splitlines()
    assert header.endswith(",precision") and row.endswith(",amp bf16")


def test_tf32_says_where_it_does_not_apply(capsys):
    """--tf32 on a GPU without TF32 tensor cores, or on a half-precision step,
    changes nothing: a note says so in the table, --json and --csv (stderr)."""
    assert cli.main(["predict", "dcgan", "-b", "8", "--gpus", "T4,A100-SXM4-80GB",
                     "--tf32", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    note = [n for n in out["notes"] if n.startswith("TF32 matmuls")]
    assert len(note) == 1 and "on T4:" in note[0] and "A100" not in note[0]
    assert cli.main(["predict", "dcgan", "-b", "8", "--gpus", "MI300X", "--tf32", "--csv"]) == 0
    err = capsys.readouterr().err
    # a note, not also the API's warning
    assert "do not apply on MI300X" in err and "warning" not in err
    assert cli.main(["predict", "dcgan", "-b", "8", "--gpus", "A100-SXM4-80GB", "--tf32",
                     "--amp", "bf16"]) == 0
    assert "change nothing here" in capsys.readouterr().out
    assert cli.main(["predict", "dcgan", "-b", "8", "--gpus", "A100-SXM4-80GB", "--tf32",
                     "--json"]) == 0
    assert not [n for n in json.loads(capsys.readouterr().out)["notes"]
                if n.startswith("TF32 matmuls")]


def test_options_that_change_nothing_say_so(capsys):
    """A memory format for a model without convolutions and fp16 on GPUs
    without fp16 tensor cores get a note; an optimizer for an inference pass
    is an error."""
    assert cli.main(["predict", "transformer", "-b", "2", "--gpus", "A100-SXM4-80GB",
                     "--memory-format", "nhwc", "--json"]) == 0
    notes = json.loads(capsys.readouterr().out)["notes"]
    assert any("changes nothing here" in n and "no convolutions" in n for n in notes)
    assert cli.main(["predict", "dcgan", "-b", "8", "--gpus", "P4,T4", "--dtype", "float16",
                     "--json"]) == 0
    notes = json.loads(capsys.readouterr().out)["notes"]
    fp16 = [n for n in notes if n.startswith("no fp16 tensor cores")]
    assert len(fp16) == 1 and "on P4:" in fp16[0] and "T4" not in fp16[0]
    assert cli.main(["predict", "dcgan", "-b", "8", "--gpus", "T4", "--inference",
                     "--optimizer", "sgd"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "does not apply to --inference" in err[0]


@pytest.mark.parametrize("args,needle", [
    (["predict", "no-such-model"], "unknown model"),
    (["predict", "resnet50", "--gpus", "H10"], "unknown GPU"),
    (["predict", "resnet50", "--batch-size", "0"], "positive integer"),
    (["predict", "resnet50", "--batch-size", "-3"], "positive integer"),
    (["predict", "gpt2", "--seq-len", "5000"], "exceeds"),
    (["predict", "missing_file.py:build"], "missing_file.py"),
    (["train-models", "--data", ".", "--ensemble", "0"], "positive integer"),
])
def test_errors_are_one_line_exit_2(args, needle, capsys):
    with pytest.raises(SystemExit) as exc:
        sys.exit(cli.main(args))
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and "\n" not in err and "Traceback" not in err


def test_factory_errors(tmp_path, capsys):
    f = tmp_path / "bad.py"
    f.write_text("def build():\n    raise RuntimeError('boom')\n"
                 "def wrong_shape():\n    import torch\n"
                 "    return torch.nn.Linear(4, 4), (torch.randn(2, 5),)\n")
    assert cli.main(["predict", f"{f}:build"]) == 2
    assert "boom" in capsys.readouterr().err
    assert cli.main(["predict", f"{f}:wrong_shape"]) == 2
    err = capsys.readouterr().err.strip()
    assert "could not trace" in err and "\n" not in err


def test_data_dependent_control_flow_is_a_trace_error(tmp_path, capsys):
    f = tmp_path / "dyn.py"
    f.write_text("import torch\nclass M(torch.nn.Module):\n"
                 "    def __init__(self):\n        super().__init__(); self.l = torch.nn.Linear(4, 4)\n"
                 "    def forward(self, x):\n        y = self.l(x)\n"
                 "        return y * 2 if y.sum() > 0 else y\n"
                 "def build():\n    return M(), (torch.randn(3, 4),)\n")
    assert cli.main(["predict", f"{f}:build"]) == 2
    assert "could not trace" in capsys.readouterr().err


def test_help_and_version():
    proc = run("--help")
    assert proc.returncode == 0 and "predict" in proc.stdout
    for sub in ("predict", "gpus", "zoo"):
        proc = run(sub, "--help")
        assert proc.returncode == 0 and "usage" in proc.stdout
    proc = run("--version")
    assert proc.returncode == 0 and "dnn-predictor" in proc.stdout


def test_gpus_and_zoo_listings(capsys):
    assert cli.main(["gpus", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) >= 25
    # Which GPUs' chips the op models were trained on (boards of one chip alike).
    trained = {r["id"]: r["chip_in_training_data"] for r in rows}
    from predictor import opmodel
    if opmodel.measured_chips():
        assert trained["V100-PCIE-32GB"] and trained["V100-SXM2-16GB"] and trained["A100-SXM4-80GB"]
        # The H200's kernels (benchmarks/data) are the H100 SXM's chip: GH100, 132 SMs.
        assert trained["H200-SXM-141GB"] and trained["H100-SXM5-80GB"]
        assert not trained["H100-PCIE-80GB"] and not trained["L4"] and not trained["MI300X"]
    assert cli.main(["gpus"]) == 0
    assert "trained on" in capsys.readouterr().out
    assert cli.main(["zoo"]) == 0
    out = capsys.readouterr().out
    for name in ("resnet50", "inception_v3", "transformer", "gnmt", "dcgan", "bert-large",
                 "gpt2-large", "gpt3-xl", "gpt3-2.7b", "opt-1.3b"):
        assert name in out


def test_train_models_keeps_the_shipped_weights_from_another_recipe(tmp_path, monkeypatch, capsys):
    """Without --out, train-models writes over the package's weights (and
    blend weights) only with each file's own recipe: another one is refused
    in one line naming what differs, and the shipped files are left as they
    were."""
    import shutil

    from predictor import opmodel
    from predictor.commands import train_models

    pkg = tmp_path / "pkg"
    (pkg / "weights").mkdir(parents=True)
    weights = Path(opmodel.__file__).resolve().parent / "weights"
    for name in ("opmodels.npz", "calibration_blend.json"):
        shutil.copy(weights / name, pkg / "weights" / name)
    monkeypatch.setattr(opmodel, "__file__", str(pkg / "opmodel.py"))
    (tmp_path / "data" / "train").mkdir(parents=True)
    _, meta = opmodel.read_weights(weights / "opmodels.npz")
    blend = json.loads((weights / "calibration_blend.json").read_text())
    before = {p.name: p.read_bytes() for p in (pkg / "weights").iterdir()}
    for extra, names in ((["--seed", str(meta["seed"] + 1)], "opmodels.npz"),
                         (["--epochs", "1"], "opmodels.npz"),
                         (["--blend-only", "--seed", str(blend["seed"] + 1)],
                          "calibration_blend.json")):
        assert cli.main(["train-models", "--data", str(tmp_path / "data"), *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert "replace the shipped " + names in err and "--replace-shipped" in err
        assert "\n" not in err and extra[-2] in err
    assert {p.name: p.read_bytes() for p in (pkg / "weights").iterdir()} == before
    # Each file's own recipe passes the guard (it reproduces the file).
    args = argparse.Namespace(extra=[f"/x/{n}" for n in meta.get("extra", [])], seed=meta["seed"],
                              epochs=meta["epochs"], blend=False, blend_only=False)
    train_models._refuse_another_recipe(pkg / "weights", args, meta["ensemble"])
    args = argparse.Namespace(extra=[f"/x/{n}" for n in blend.get("extra", [])],
                              seed=blend["seed"], epochs=blend["epochs"], blend=False,
                              blend_only=True)
    train_models._refuse_another_recipe(pkg / "weights", args, blend["ensemble"])
