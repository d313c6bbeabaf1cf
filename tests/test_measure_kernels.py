"""The per-kernel measurement script for another training GPU
(benchmarks/measure_kernels.py) and the loader that trains on its files
(predictor.calibration.datasets.load_measured): runs on the CPU, no data."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from benchmarks import measure_kernels as K
from predictor.calibration import datasets as D
from predictor.errors import InvalidArgumentError
from predictor.kernels import layout as L


def _families(rows, which):
    return [L.FAMILY_NAMES[f] for p, f, _, _ in rows if p == which]


def test_a_training_step_is_lowered_forward_and_backward():
    rows = K.lowered_rows("linear", {"B": 2, "M": 8, "N": 16, "K": 4})
    # x[B*M, N] @ W[K, N]^T, then dX = dY @ W and dW = dY^T @ X.
    fwd = [d for p, f, d, _ in rows if p == "forward"]
    assert fwd == [(1, 16, 4, 16, L.GEMM_B_T)]
    bwd = sorted(d for p, f, d, _ in rows if p == "backward")
    assert bwd == sorted([(1, 16, 16, 4, 0), (1, 4, 16, 16, L.GEMM_A_T)])
    conv = K.lowered_rows("conv", {"B": 2, "Input_Channel": 3, "Output_Channel": 8,
                                   "Kernel_Szie": 3, "Input_Size": 16, "Stride": 1, "Padding": 1})
    assert _families(conv, "forward") == ["conv"]
    assert sorted(_families(conv, "backward")) == ["conv_dgrad", "conv_wgrad"]
    ln = K.lowered_rows("ln", {"B": 4, "H": 64})
    assert _families(ln, "forward") == ["layer_norm"]
    assert _families(ln, "backward") == ["layer_norm_bwd"]
    sm = K.lowered_rows("softmax", {"B": 4, "H": 64})
    assert _families(sm, "backward") == ["softmax_bwd"]


def _tiny_dataset(root, gpu="Tesla T4"):
    """A train/ folder of one GPU's few shapes per op, in the dataset's columns."""
    rng = np.random.default_rng(0)
    for op in D.OPS:
        cols = K.SHAPE_COLUMNS.get(op, ("B", "H"))
        n = 3
        if op == "conv":
            shape = {"B": [1, 2, 2], "Input_Channel": [3, 4, 8], "Output_Channel": [4, 8, 8],
                     "Kernel_Szie": [3, 1, 3], "Input_Size": [8, 16, 12], "Stride": [1, 2, 1],
                     "Padding": [1, 0, 1]}
        else:
            shape = {c: rng.integers(2, 40, n) for c in cols}
        df = pd.DataFrame({"OPName": op, "Latency": 0.01, "Device": gpu, **shape})
        (root / "train" / op).mkdir(parents=True)
        df.to_csv(root / "train" / op / f"{gpu.replace(' ', '_')}.csv", index=False)
    return root


def test_measure_on_the_cpu_and_train_on_the_file(tmp_path):
    data = _tiny_dataset(tmp_path / "data")
    written = []
    df = K.measure(data, torch.device("cpu"), seconds=30, per_op=2, seed=0, repeats=1,
                   shapes_from="Tesla_T4", write=written.append, log=lambda s: None)
    assert len(written) == len(D.OPS)  # rewritten after every op file
    assert set(df["Pass"]) == {"forward", "backward"}
    assert (df["Latency"] > 0).all() and np.isfinite(df["Latency"]).all()
    assert {"matmul", "conv_dgrad", "conv_wgrad", "softmax_bwd", "layer_norm_bwd"} \
        <= set(df["Family"])
    # As if measured on a GPU of the database: the loader trains on its rows.
    path = tmp_path / "NVIDIA_H200.csv"
    df.assign(Device="NVIDIA H200").to_csv(path, index=False)
    s = D.load_measured([path])
    assert len(s) == len(df) and set(s.gpu) == {"H200-SXM-141GB"}
    assert "linear_backward" in set(s.op) and "linear" in set(s.op)
    row = df.index[(df["OPName"] == "linear") & (df["Pass"] == "forward")][0]
    assert s.family[row] == L.MATMUL and s.dims[row, L.GEMM_LAYOUT] == L.GEMM_B_T
    both = D.load_train(data, extra=[path])
    assert set(both.gpu) == {"T4", "H200-SXM-141GB"}
    assert len(both) == len(D.load_train(data)) + len(df)
    only = D.load_train(data, ops=("softmax",), extra=[path])
    assert set(only.op) == {"softmax", "softmax_backward"}
    # predictor train-models --extra trains on them and says so in the weights.
    from predictor import cli, opmodel

    assert cli.main(["train-models", "--data", str(data), "--extra", str(path),
                     "--out", str(tmp_path / "w"), "--epochs", "1", "--blend"]) == 0
    _, meta = opmodel.read_weights(tmp_path / "w" / "opmodels.npz")
    assert meta["extra"] == ["NVIDIA_H200.csv"] and "H200-SXM-141GB" in meta["gpus"]
    import json

    blend = json.loads((tmp_path / "w" / "calibration_blend.json").read_text())
    assert blend["extra"] == ["NVIDIA_H200.csv"]
    assert set(blend["gpus"]) == {"H200-SXM-141GB", "T4"}  # paired on the shapes they share


def test_train_models_verify_retrains_and_compares_weight_by_weight(tmp_path, capsys):
    """`train-models --verify` retrains with the weights file's own recipe
    and says in one line whether every weight came back within tolerance."""
    from predictor import cli, opmodel
    from predictor.calibration import train as T

    data = _tiny_dataset(tmp_path / "data")
    out = tmp_path / "w"
    common = ["train-models", "--data", str(data), "--out", str(out), "--epochs", "1"]
    assert cli.main([*common, "--ensemble", "1"]) == 0
    capsys.readouterr()
    assert cli.main([*common, "--ensemble", "1", "--verify"]) == 0
    said = capsys.readouterr().out
    assert said.startswith("reproduced:") and "tolerance 1e-06" in said
    # One weight moved by more than the tolerance is caught and counted.
    mlp, meta = opmodel.read_weights(out / T.WEIGHTS_FILE)
    assert meta["train_dtype"] == T.TRAIN_DTYPE == "float64"
    mlp[-1] += 1e-4
    T.save(out / T.WEIGHTS_FILE, mlp, meta)
    assert cli.main([*common, "--ensemble", "1", "--verify"]) == 1
    said = capsys.readouterr().out
    assert said.startswith("differs: 1 of ") and "largest 0.0001" in said
    # Another recipe than the file's is refused in one line, before any training.
    assert cli.main([*common, "--ensemble", "2", "--verify"]) == 2
    err = capsys.readouterr().err.strip()
    assert "another recipe" in err and "--ensemble 2 (the file's: 1)" in err and "\n" not in err
    assert cli.main([*common, "--ensemble", "1", "--verify", "--blend"]) == 2
    assert "opmodels.npz only" in capsys.readouterr().err


def test_bad_measured_files_name_the_file(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(InvalidArgumentError, match="bad.csv: not a measured-kernel file"):
        D.load_measured([bad])
    cols = {c: [0] for c in D.MEASURED_COLUMNS}
    pd.DataFrame({**cols, "Family": ["matmul"], "Device": ["Imaginary GPU 9000"],
                  "Latency": [0.1]}).to_csv(bad, index=False)
    with pytest.raises(InvalidArgumentError, match="bad.csv: unknown GPU"):
        D.load_measured([bad])
    pd.DataFrame({**cols, "Family": ["teleport"], "Device": ["Tesla T4"],
                  "Latency": [0.1]}).to_csv(bad, index=False)
    with pytest.raises(InvalidArgumentError, match="bad.csv: unknown op family teleport"):
        D.load_measured([bad])
    with pytest.raises(InvalidArgumentError, match="missing.csv: not readable"):
        D.load_measured([tmp_path / "missing.csv"])


def test_the_script_refuses_a_missing_device_or_data_in_one_line(tmp_path, capsys):
    data = _tiny_dataset(tmp_path / "data")
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit):
            K.main(["--data", str(data), "--device", "cuda"])
        assert "CUDA is not available" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        K.main(["--data", str(tmp_path / "nowhere"), "--device", "cpu"])
    assert "not a NeuSight data folder" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        K.main(["--data", str(data), "--device", "cpu", "--ops", "linear,teleport"])
    assert "unknown op file(s) teleport" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        K.main(["--data", str(data), "--device", "cpu", "--models", "gpt2:4"])
    assert "'gpt2:4' is not NAME:BATCHxSEQ" in capsys.readouterr().err
    assert K.main(["--data", str(data), "--device", "cpu", "--ops", "softmax", "--per-op", "1",
                   "--seconds", "5", "--shapes-from", "Tesla_T4", "--models", "none",
                   "--out", str(tmp_path)]) == 0
    out = list(tmp_path.glob("*.csv"))
    assert len(out) == 1 and set(pd.read_csv(out[0])["Family"]) == {"softmax", "softmax_bwd"}


def test_the_gpu_session_script_rehearses_on_the_cpu(tmp_path):
    """benchmarks/gpu_session.sh, the one run a lent GPU gets, end to end with
    DEVICE=cpu: every step runs and leaves its output, so the GPU's minutes
    are not spent finding a broken script."""
    data = _tiny_dataset(tmp_path / "data", gpu="Tesla V100-PCIE-32GB")
    root = Path(__file__).resolve().parent.parent
    out = tmp_path / "out"
    # The interpreter running the tests is the one the script's python3 must be.
    bindir = tmp_path / "bin"
    bindir.mkdir()
    shim = bindir / "python3"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    shim.chmod(0o755)
    env = {**os.environ, "DEVICE": "cpu", "NEUSIGHT": str(data), "OUT": str(out),
           "KERNEL_SECONDS": "5", "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(["bash", str(root / "benchmarks" / "gpu_session.sh")], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    kernels = list((out / "kernels").glob("*.csv"))
    assert len(kernels) == 1 and len(pd.read_csv(kernels[0])) > 0
    for log in ("measure_kernels.log", "calibration_gpu.log", "memory_gpu.log",
                "profile_gpu.log", "diffusion.log"):
        assert (out / log).stat().st_size > 0, log
    assert (out / "calibration_gpu.json").exists()
    assert list((out / "profile").glob("*.csv"))
    assert (out / "diffusion" / "sd15.json").exists()


def test_rows_that_ran_in_tf32_are_not_trained_as_fp32(tmp_path):
    """PyTorch runs convolutions in TF32 by default: on a GPU with TF32 such a
    row is a tensor-core kernel, left out of the fp32 training rows (and kept
    alone with tf32=True); on a T4 TF32 does not exist and the row is fp32.
    The TF32 columns, where a file has them, say what ran."""
    cols = {c: [0, 0, 0] for c in D.MEASURED_COLUMNS}
    base = {**cols, "OPName": ["conv", "conv", "linear"], "Pass": "forward",
            "Family": ["conv", "conv_wgrad", "matmul"], "Latency": [0.1, 0.2, 0.3]}
    old = tmp_path / "old.csv"   # no TF32 columns: PyTorch's defaults
    pd.DataFrame({**base, "Device": "NVIDIA H200"}).to_csv(old, index=False)
    said = []
    s = D.load_measured([old], log=said.append)
    assert list(s.family) == [L.MATMUL]
    assert said == ["old.csv: 2 convolution/matmul rows ran in TF32 (tensor cores), "
                    "not fp32: left out"]
    assert sorted(D.load_measured([old], tf32=True).latency_ms) == [0.1, 0.2]
    t4 = tmp_path / "t4.csv"
    pd.DataFrame({**base, "Device": "Tesla T4"}).to_csv(t4, index=False)
    assert len(D.load_measured([t4])) == 3
    new = tmp_path / "new.csv"   # measured as the script now measures: TF32 off
    pd.DataFrame({**base, "Device": "NVIDIA H200", "TF32 Matmul": False,
                  "TF32 Conv": False}).to_csv(new, index=False)
    assert len(D.load_measured([new])) == 3
    both = tmp_path / "both.csv"
    pd.DataFrame({**base, "Device": "NVIDIA H200", "TF32 Matmul": True,
                  "TF32 Conv": False}).to_csv(both, index=False)
    assert list(D.load_measured([both]).family) == [L.CONV, L.CONV_WGRAD]


def test_the_script_measures_fp32_with_tf32_off():
    assert K.fp32_math() == (False, False)
    assert not torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = True  # PyTorch's default, for the tests after


def test_each_timing_harness_has_its_own_floor():
    """The same kernels timed by two harnesses whose fixed costs differ (25 us
    and 5 us per measurement): one network, a floor per harness, the
    dataset's (harness 0) kept as the model's floor."""
    from predictor.calibration import train as T
    from predictor.kernels.features import N_FEATURES

    rng = np.random.default_rng(0)
    n = 1200
    x = rng.normal(size=(n, N_FEATURES))
    ideal = np.exp(rng.uniform(np.log(2.0), np.log(2000.0), n))   # us
    x[:, 0] = x[:, 1] = np.log2(ideal)
    harness = np.repeat([0, 1], n // 2)
    target = np.where(harness == 0, 25.0, 5.0) + ideal / 0.5
    m = T.fit_group(0, x, ideal, target, harness=harness, epochs=60, batch=64)
    assert m.floor_us == pytest.approx(25.0, rel=0.25)
    assert len(m.harness_floors_us) == 1
    assert m.harness_floors_us[0] == pytest.approx(5.0, rel=0.5)
    one = T.fit_group(0, x, ideal, target, epochs=2, batch=64)
    assert one.harness_floors_us == ()



def test_each_measuring_host_can_have_its_own_floor():
    """fit_group's `hosts` (benchmarks.feature_selection --host-floors): the
    same kernels timed on three machines whose fixed costs differ (10, 20 and
    40 us): a floor per host, the model keeping their median."""
    from predictor.calibration import train as T
    from predictor.kernels.features import N_FEATURES

    rng = np.random.default_rng(1)
    n = 1800
    x = rng.normal(size=(n, N_FEATURES))
    ideal = np.exp(rng.uniform(np.log(2.0), np.log(2000.0), n))   # us
    x[:, 0] = x[:, 1] = np.log2(ideal)
    hosts = np.repeat(np.array(["a", "b", "c"], dtype=object), n // 3)
    floor = {"a": 10.0, "b": 20.0, "c": 40.0}
    target = np.array([floor[h] for h in hosts]) + ideal / 0.5
    m = T.fit_group(0, x, ideal, target, hosts=hosts, epochs=60, batch=64)
    assert set(m.host_floors_us) == {"a", "b", "c"}
    for h, f in floor.items():
        assert m.host_floors_us[h] == pytest.approx(f, rel=0.3)
    assert m.floor_us == pytest.approx(float(np.median(list(m.host_floors_us.values()))))
    assert T.fit_group(0, x, ideal, target, epochs=2, batch=64).host_floors_us is None

def test_the_shipped_models_on_the_measured_h200():
    """The committed H200 file scores op models on it per family and pass:
    every fp32 family of the file is there, the TF32 convolutions apart, and
    the shipped linear model keeps its figure (9.1 % forward since it trained
    on the file; 8.4 % for the five GPUs' weights before, benchmarks/README.md)."""
    from benchmarks import accuracy as A

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "NVIDIA_H200.csv"
    df = A.unseen_scores([path])
    assert set(df.family) == {"linear", "bmm", "elementwise", "softmax", "layer_norm",
                              "conv (TF32)"}
    assert set(df["pass"]) == {"forward", "backward"}
    linear = df[(df.family == "linear") & (df["pass"] == "forward")].iloc[0]
    assert linear.n > 200 and linear.mape < 15.0


def test_e2e_extra_needs_logo(capsys):
    from benchmarks import e2e as E

    with pytest.raises(SystemExit):
        E.main(["--data", str(Path(__file__).parent), "--extra", "x.csv"])
    assert "apply to --logo only" in capsys.readouterr().err


def test_unseen_takes_other_weights_and_refuses_a_bad_file_in_one_line(tmp_path, capsys):
    from benchmarks import accuracy as A
    from predictor import opmodel

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "NVIDIA_H200.csv"
    import shutil

    weights = tmp_path / "w.npz"
    shutil.copy(Path(opmodel.__file__).parent / "weights" / "opmodels.npz", weights)
    assert A.main(["--unseen", str(path), "--weights", str(weights)]) == 0
    assert "w.npz on measured kernels" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        A.main(["--unseen", str(path), "--weights", str(tmp_path / "missing.npz")])
    assert "missing.npz: not a readable op-model weights file" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        A.main(["--weights", str(weights)])
    assert "--weights applies to --unseen only" in capsys.readouterr().err


def test_model_gemms_are_a_zoo_models_own_aligned_gemms_forward_and_backward():
    rows = K.model_gemm_rows("gpt2", 2, 64)
    assert {p for p, _, _, _ in rows} == {"forward", "backward"}
    assert all(f == L.MATMUL for _, f, _, _ in rows)
    assert len(set(rows)) == len(rows)
    dims = [d for _, _, d, _ in rows]
    # GPT-2's Conv1D layers are x @ W over the 2 x 64 tokens; attention's
    # batched GEMMs run per head (12 heads of 64).
    assert (1, 128, 2304, 768, 0) in [d[:5] for d in dims]
    assert (24, 64, 64, 64) in [d[:4] for d in dims]
    assert K.parse_models("none") == ()
    assert K.parse_models("gpt2:1x32,bert-base:2x16") == (("gpt2", 1, 32), ("bert-base", 2, 16))
    for bad in ("gpt2", "gpt2:0x32", "nosuch:1x32", "gpt2:1x"):
        with pytest.raises(ValueError, match="NAME:BATCHxSEQ"):
            K.parse_models(bad)
    # None of them is a model of the dataset's whole-model labels.
    labels = {"bert-large", "gpt2-large", "gpt3-xl", "gpt3-2.7b", "opt-1.3b"}
    assert not labels & {m for m, _, _ in K.MODEL_GEMMS}


def test_model_gemms_are_timed_after_the_op_files_and_train_as_linear_and_bmm_rows(tmp_path):
    data = _tiny_dataset(tmp_path / "data")
    df = K.measure(data, torch.device("cpu"), seconds=60, per_op=1, seed=0, repeats=1,
                   shapes_from="Tesla_T4", ops=("softmax",), models=(("gpt2", 1, 16),),
                   max_elements=2e5, model_max_elements=1e6, log=lambda s: None)
    model = df[df["Model"].notna()]
    assert len(model) > 0 and set(model["Model"]) == {"gpt2 1x16"}
    assert set(model["Family"]) == {"matmul"}
    assert set(model["OPName"]) == {"linear", "bmm"}
    assert ((model["OPName"] == "bmm") == (model["d0"] > 1)).all()
    assert set(df.loc[df["Model"].isna(), "Family"]) == {"softmax", "softmax_bwd"}
    path = tmp_path / "NVIDIA_H200.csv"
    df.assign(Device="NVIDIA H200").to_csv(path, index=False)
    s = D.load_train(data, ops=("linear", "bmm"), extra=[path])
    assert (s.gpu == "H200-SXM-141GB").sum() == len(model)
    # A model that does not trace costs only itself, said in one line.
    said = []
    again = K.measure(data, torch.device("cpu"), seconds=60, per_op=1, seed=0, repeats=1,
                      shapes_from="Tesla_T4", ops=("softmax",),
                      models=(("gpt2", 1, 10**9), ("gpt2", 1, 16)), max_elements=2e5,
                      model_max_elements=1e6, log=said.append)
    assert any(line.startswith("  gpt2: not traced (") for line in said)
    assert set(again.loc[again["Model"].notna(), "Model"]) == {"gpt2 1x16"}


def _two_boards(n=1200, ratio=1.5):
    """Kernels whose efficiency follows one feature, measured on two boards
    that run every shape `ratio` times slower / faster than their middle;
    the fast board measured only the upper half of that feature's range."""
    from predictor.kernels.features import N_FEATURES

    rng = np.random.default_rng(1)
    x = np.zeros((n, N_FEATURES))
    x[:, 7] = rng.normal(size=n)
    ideal = np.exp(rng.uniform(np.log(5.0), np.log(50000.0), n))   # us
    x[:, 0] = x[:, 1] = np.log2(ideal)
    eta = 0.3 + 0.4 / (1.0 + np.exp(-x[:, 7]))
    boards = np.where((np.arange(n) % 2 == 0) | (x[:, 7] < 0.0), "slow", "fast")
    target = 20.0 + ideal / eta * np.where(boards == "slow", ratio, 1.0 / ratio)
    return x, ideal, target, boards


def test_a_level_per_board_is_fitted_beside_the_network_and_left_out_of_it():
    """fit_group's `boards`: each board gets a level of its own, centred, and
    the returned network is the boards' middle: each board sits its level
    off it (the per-chip corrections measure that), and within a board the
    shape effect is fitted. Without the levels, one network has to fit the
    slow board alone where the fast one has no measurement and both where it
    has: the shape effect bends at the edge of the fast board's range."""
    from predictor.calibration import train as T

    x, ideal, target, boards = _two_boards()
    m = T.fit_group(0, x, ideal, target, boards=boards, epochs=40, batch=64)
    assert m.floor_us == pytest.approx(20.0, rel=0.25)
    r = np.log((target - 20.0) / (m.times_us(x, ideal) - m.floor_us))
    slow, fast = np.median(r[boards == "slow"]), np.median(r[boards == "fast"])
    assert slow == pytest.approx(np.log(1.5), abs=0.1)
    assert fast == pytest.approx(-np.log(1.5), abs=0.1)
    assert np.median(np.abs(r[boards == "slow"] - slow)) < 0.05
    assert np.median(np.abs(r[boards == "fast"] - fast)) < 0.05
    one = T.fit_group(0, x, ideal, target, epochs=40, batch=64)
    r = np.log((target - 20.0) / (one.times_us(x, ideal) - one.floor_us))
    assert np.median(np.abs(r[boards == "slow"] - np.median(r[boards == "slow"]))) > 0.1


def test_one_board_has_no_level_to_fit():
    """A single board's centred level is 0: the same network as without `boards`."""
    from predictor.calibration import train as T

    x, ideal, target, _ = _two_boards(n=400)
    a = T.fit_group(0, x, ideal, target, boards=np.full(len(x), "T4"), epochs=3, batch=64)
    b = T.fit_group(0, x, ideal, target, epochs=3, batch=64)
    for la, lb in zip(a.layers, b.layers):
        for p, q in zip(la, lb):
            assert np.array_equal(p, q)
    assert a.floor_us == b.floor_us


def test_distillation_targets_keep_each_measured_board_at_its_level():
    """at_board_levels: a measured GPU's rows at its own level, another board of
    a levelled chip at that chip's, every other GPU at the median board's (0);
    a model without levels is its plain times."""
    import dataclasses

    from predictor.calibration import train as T

    x, ideal, target, boards = _two_boards(n=400)
    m = T.fit_group(0, x, ideal, target, epochs=3, batch=64)
    rows = np.arange(4)
    assert np.array_equal(T.at_board_levels(m, x[rows], ideal[rows], ["T4"] * 4),
                          m.times_us(x[rows], ideal[rows]))
    levelled = dataclasses.replace(m, board_levels={"T4": 0.3, "A100-PCIE-40GB": -0.2})
    gpus = ["T4", "A100-PCIE-80GB", "H100-SXM5-80GB", "T4"]
    got = T.at_board_levels(levelled, x[rows], ideal[rows], gpus)
    want = m.times_us(x[rows], ideal[rows], np.array([0.3, -0.2, 0.0, 0.3]))
    assert np.array_equal(got, want)
