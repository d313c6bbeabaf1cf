"""What the predict and sweep outputs say, in every format: tokens/s, memory
and fits, arguments that do not apply, piped output, best(), precision notes."""

from __future__ import annotations

import json

import numpy as np
import pytest

import predictor
from predictor import cli

pytest.importorskip("transformers")

SEQ = 16

FACTORY = f'''
import torch, transformers

def build():
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=1000,
                                  n_positions=128, bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(cfg), (torch.zeros(2, {SEQ}, dtype=torch.long),)
'''


@pytest.fixture(scope="module")
def lm_factory(tmp_path_factory):
    path = tmp_path_factory.mktemp("lm") / "tiny_lm.py"
    path.write_text(FACTORY)
    return f"{path}:build"


@pytest.fixture(scope="module")
def lm_graph(lm_factory):
    return predictor.trace(lm_factory)


@pytest.fixture(scope="module")
def lm_saved(lm_graph, tmp_path_factory):
    path = tmp_path_factory.mktemp("lmg") / "tiny_lm.npz"
    lm_graph.save(path)
    return str(path)


# ---- tokens/s ---------------------------------------------------------------

def test_seq_len_of_a_user_model_is_its_token_inputs(lm_graph):
    assert lm_graph.seq_len == SEQ
    p = predictor.predict(lm_graph, "T4")
    assert p.seq_len == SEQ and p.tokens_per_s == pytest.approx(p.throughput * SEQ)
    assert p.to_dict()["tokens_per_s"] == pytest.approx(p.tokens_per_s)
    s = predictor.sweep(lm_graph, ["T4", "L4"], [2, 8])
    assert s.seq_len == SEQ
    np.testing.assert_allclose(s.tokens_per_s, s.throughput * SEQ)
    df = s.to_pandas()
    np.testing.assert_allclose(df["tokens_per_s"], df["throughput"] * SEQ)


def test_no_tokens_without_a_sequence_dim():
    g = predictor.trace("dcgan", batch_size=4)
    assert g.seq_len is None
    p = predictor.predict(g, "T4")
    assert p.tokens_per_s is None and "tokens_per_s" not in p.to_dict()
    s = predictor.sweep(g, ["T4"], [4])
    assert s.tokens_per_s is None and "tokens_per_s" not in s.to_pandas()


def test_tokens_per_s_in_every_predict_format(lm_factory, capsys):
    assert cli.main(["predict", lm_factory, "--gpus", "T4,L4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["seq_len"] == SEQ
    for row in out["predictions"]:
        assert row["tokens_per_s"] == pytest.approx(row["throughput"] * SEQ)
    assert cli.main(["predict", lm_factory, "--gpus", "T4", "--csv"]) == 0
    header = capsys.readouterr().out.splitlines()[0].split(",")
    assert "tokens_per_s" in header
    assert cli.main(["predict", lm_factory, "--gpus", "T4"]) == 0
    assert "tokens/s" in capsys.readouterr().out


def test_breakdown_in_every_predict_format(lm_factory, capsys):
    # --breakdown is never silently dropped: the table prints it, --json
    # carries it, --csv (one table) says where it is.
    assert cli.main(["predict", lm_factory, "--gpus", "T4,L4", "--breakdown", "3",
                     "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    fastest = min(out["predictions"], key=lambda r: r["iteration_ms"])["gpu"]
    assert out["breakdown"]["gpu"] == fastest and len(out["breakdown"]["ops"]) == 3
    ms = [r["ms"] for r in out["breakdown"]["ops"]]
    assert ms == sorted(ms, reverse=True) and {"family", "shape", "basis"} <= set(
        out["breakdown"]["ops"][0])
    assert cli.main(["predict", lm_factory, "--gpus", "T4", "--breakdown", "3", "--csv"]) == 0
    got = capsys.readouterr()
    assert "breakdown" not in got.out and "--breakdown" in got.err
    assert cli.main(["predict", lm_factory, "--gpus", "T4", "--breakdown", "3"]) == 0
    assert "slowest ops on T4" in capsys.readouterr().out


def test_tokens_per_s_in_every_sweep_format(lm_saved, tmp_path, capsys):
    csv = tmp_path / "grid.csv"
    assert cli.main(["sweep", lm_saved, "--gpus", "T4", "-b", "2,4", "--json",
                     "--csv", str(csv)]) == 0
    out = json.loads(capsys.readouterr().out)
    for row in out["best"] + out["grid"]:
        assert row["tokens_per_s"] == pytest.approx(row["throughput"] * SEQ)
    assert "tokens_per_s" in csv.read_text().splitlines()[0].split(",")
    assert cli.main(["sweep", lm_saved, "--gpus", "T4", "-b", "2,4"]) == 0
    assert "tokens/s" in capsys.readouterr().out


# ---- peak memory and fits in the predict table ------------------------------

def test_predict_table_shows_peak_memory_and_fits(lm_factory, capsys):
    assert cli.main(["predict", lm_factory, "--gpus", "T4,L4"]) == 0
    out = capsys.readouterr().out
    assert "peak GiB" in out and "fits" in out and "yes" in out
    assert "does not fit" not in out


def test_predict_says_when_nothing_fits(lm_factory, capsys):
    args = ["predict", lm_factory, "--gpus", "T4,L4", "-b", "1000000"]
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    assert "NO" in out and "does not fit on any of these GPUs" in out
    assert cli.main(args + ["--json"]) == 0
    js = json.loads(capsys.readouterr().out)
    assert all(row["fits"] is False and row["memory_gb"] > 16 for row in js["predictions"])
    assert any("does not fit" in n for n in js["notes"])
    assert cli.main(args + ["--csv"]) == 0
    captured = capsys.readouterr()
    header = captured.out.splitlines()[0].split(",")
    assert "memory_gb" in header and "fits" in header
    assert "does not fit" in captured.err


# ---- output to a pipe ---------------------------------------------------------

def test_piped_output_is_never_cut(lm_saved):
    """stdout to a pipe (not a TTY): full width, no ellipsis, even with a
    terminal width of 80 in the environment."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "COLUMNS": "80"}
    proc = subprocess.run([sys.executable, "-m", "predictor.cli", "sweep", lm_saved, "--gpus",
                           "all", "-b", "2,4"], capture_output=True, text=True, timeout=300,
                          env=env)
    assert proc.returncode == 0, proc.stderr
    assert "…" not in proc.stdout
    assert max(len(line) for line in proc.stdout.splitlines()) > 80
    assert "H100-SXM5-80GB" in proc.stdout and "$/M samples" in proc.stdout


# ---- --seq-len where it does not apply ------------------------------------------

@pytest.mark.parametrize("command", ["predict", "sweep"])
@pytest.mark.parametrize("model", ["resnet50", "factory"])
def test_seq_len_is_refused_where_it_does_not_apply(command, model, lm_factory, capsys):
    import sys

    name = lm_factory if model == "factory" else model
    with pytest.raises(SystemExit) as exc:
        sys.exit(cli.main([command, name, "--seq-len", "1024", "--gpus", "T4"]))
    assert exc.value.code == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert "--seq-len" in err and "does not apply" in err and "\n" not in err
    assert "seq 1024" not in captured.out


def test_seq_len_that_disagrees_with_the_inputs_is_refused():
    import torch

    with pytest.raises(predictor.InvalidArgumentError, match="sequence length 8"):
        predictor.trace(torch.nn.Embedding(10, 4), (torch.zeros(2, 8, dtype=torch.long),),
                        seq_len=16)


# ---- SweepResult.best() ranks by its objective --------------------------------

def _two_gpu_sweep():
    """P4 best at batch 64 (6.4 ms: 10,000 samples/s), T4 best at batch 128
    (10 ms: 12,800 samples/s): faster iterations, lower throughput on the P4."""
    from predictor.results import SweepResult

    batches = np.array([64, 128])
    ms = np.array([[[6.4, 0, 0], [20.0, 0, 0]],     # P4 at 64, 128: 10,000, 6,400 samples/s
                   [[9.0, 0, 0], [10.0, 0, 0]]])    # T4 at 64, 128: 7,111, 12,800 samples/s
    return SweepResult(model="m", gpus=["P4", "T4"], batch_sizes=batches, phase_ms=ms)


def test_best_ranks_by_throughput_not_iteration_time():
    best = _two_gpu_sweep().best()
    assert list(best["gpu"]) == ["T4", "P4"]
    assert list(best["batch_size"]) == [128, 64]
    assert best["throughput"].is_monotonic_decreasing
    by_time = _two_gpu_sweep().best("time")
    assert list(by_time["gpu"]) == ["P4", "T4"] and by_time["iteration_ms"].is_monotonic_increasing


# ---- fits is a bool everywhere -------------------------------------------------

def test_fits_is_a_bool_in_every_output(lm_saved, lm_factory, lm_graph, capsys):
    assert cli.main(["sweep", lm_saved, "--gpus", "T4,L4", "-b", "2,4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert all(type(row["fits"]) is bool for row in out["best"] + out["grid"])
    assert all(type(row["batch_size"]) is int for row in out["grid"])
    assert cli.main(["predict", lm_factory, "--gpus", "T4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert all(type(row["fits"]) is bool for row in out["predictions"])
    assert type(predictor.predict(lm_graph, "T4").fits) is bool
    assert predictor.sweep(lm_graph, ["T4"], [2]).to_pandas()["fits"].dtype == bool


# ---- bfloat16 on GPUs without bf16 tensor cores ---------------------------------

BF16_GPUS = "V100-SXM2-32GB,T4,A100-SXM4-80GB"


def _bf16_note(lines):
    hits = [n for n in lines if "no bf16 tensor cores" in n]
    assert len(hits) == 1, lines
    assert "V100-SXM2-32GB" in hits[0] and "T4" in hits[0] and "A100" not in hits[0]
    return hits[0]


def test_bf16_without_tensor_cores_is_said_in_every_format(lm_factory, lm_saved, capsys):
    base = ["predict", lm_factory, "--gpus", BF16_GPUS, "--dtype", "bfloat16"]
    assert cli.main(base) == 0
    _bf16_note(capsys.readouterr().out.splitlines())
    assert cli.main(base + ["--json"]) == 0
    _bf16_note(json.loads(capsys.readouterr().out)["notes"])
    assert cli.main(base + ["--csv"]) == 0
    captured = capsys.readouterr()
    _bf16_note(captured.err.splitlines())
    assert "bf16" not in captured.out
    sweep = ["sweep", lm_saved, "--gpus", BF16_GPUS, "-b", "2", "--dtype", "bfloat16"]
    assert cli.main(sweep) == 0
    _bf16_note(capsys.readouterr().out.splitlines())
    assert cli.main(sweep + ["--json"]) == 0
    _bf16_note(json.loads(capsys.readouterr().out)["notes"])
    search = ["search", lm_saved, "--gpus", BF16_GPUS, "-b", "2", "--dtype", "bfloat16"]
    assert cli.main(search) == 0
    _bf16_note(capsys.readouterr().out.splitlines())
    assert cli.main(search + ["--json"]) == 0
    _bf16_note(json.loads(capsys.readouterr().out)["notes"])
    # fp32, or GPUs with bf16 tensor cores: nothing to say.
    assert cli.main(["predict", lm_factory, "--gpus", BF16_GPUS, "--json"]) == 0
    assert not any("bf16" in n for n in json.loads(capsys.readouterr().out)["notes"])
    assert cli.main(["predict", lm_factory, "--gpus", "A100-SXM4-80GB", "--dtype", "bfloat16",
                     "--json"]) == 0
    assert not any("bf16" in n for n in json.loads(capsys.readouterr().out)["notes"])


def test_no_bf16_tensor_core_peak_without_bf16_support():
    from predictor import hardware
    from predictor.kernels import layout as L

    for gid in ("V100-SXM2-32GB", "T4", "P100-PCIE-16GB"):
        f = hardware.get(gid).features
        assert f[L.G_BF16_TFLOPS] <= f[L.G_FP32_TFLOPS]
    spec = {"id": "X-NOBF16", "name": "x", "vendor": "nvidia", "sms": 80,
            "boost_clock_mhz": 1500, "memory_bw_gbs": 900, "memory_gb": 32,
            "fp32_tflops": 15.0, "bf16_tflops": 120.0, "bf16_supported": False}
    f = hardware._gpu_from_spec(spec, "test").features
    assert f[L.G_BF16_TFLOPS] == 15.0


# ---- GPUs outside the op models' training data --------------------------------

def test_gpus_outside_the_training_data_are_named_in_every_format(lm_factory, capsys):
    """A GPU whose chip none of the shipped weights' kernels ran on is named in
    one note (table, --json, --csv's stderr); GPUs of the data, and other
    boards of their chips (an A100 SXM4 is an A100 PCIe's chip), are not."""
    from predictor import opmodel

    if not opmodel.measured_chips():
        pytest.skip("no learned weights ship: no GPU's kernels trained them")
    args = ["predict", lm_factory, "--gpus", "H100-PCIE-80GB,L4,V100-PCIE-32GB,A100-SXM4-80GB"]

    def check(note):
        assert note.startswith("H100-PCIE-80GB, L4: not a chip of the op models' training data")
        assert "V100-PCIE-32GB)" in note and "\n" not in note

    assert cli.main(args) == 0
    out = capsys.readouterr().out
    check(next(line for line in out.splitlines() if "training data" in line))
    assert cli.main(args + ["--json"]) == 0
    check(next(n for n in json.loads(capsys.readouterr().out)["notes"] if "training data" in n))
    assert cli.main(args + ["--csv"]) == 0
    err = capsys.readouterr().err
    check(next(line for line in err.splitlines() if "training data" in line)
          .removeprefix("predictor: note: "))
    assert cli.main(["predict", lm_factory, "--gpus", "T4,A100-SXM4-80GB", "--json"]) == 0
    assert not any("training data" in n for n in json.loads(capsys.readouterr().out)["notes"])


# ---- shapes no measured kernel covers -------------------------------------------

LONG_SOFTMAX = '''
import torch

class Scores(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.proj = torch.nn.Linear(64, n)

    def forward(self, x):
        return torch.softmax(self.proj(x), dim=-1)

def long_rows():
    return Scores(16384), (torch.zeros(256, 64),)

def short_rows():
    return Scores(512), (torch.zeros(256, 64),)
'''


def test_softmax_rows_longer_than_any_measured_are_noted_in_every_format(tmp_path, capsys,
                                                                        lm_factory):
    """A softmax over rows longer than every measured one (the models price
    it up to 2x too fast) is named in one note, in the table, --json and
    --csv's stderr, with its row length and share of the step's bytes; rows
    within the measured range, and a small share of long ones (the tiny LM's
    loss over its 1,000-word vocabulary is within range anyway), are not."""
    from predictor import opmodel

    path = tmp_path / "scores.py"
    path.write_text(LONG_SOFTMAX)
    args = ["predict", f"{path}:long_rows", "--gpus", "T4"]

    def check(note):
        assert note.startswith("2 softmax ops over rows of up to 16,384 elements (")
        assert f"longer than any measured ({opmodel.LONGEST_MEASURED_SOFTMAX_ROW:,})" in note
        assert "\n" not in note

    assert cli.main(args) == 0
    check(next(line for line in capsys.readouterr().out.splitlines() if "softmax ops" in line))
    assert cli.main(args + ["--json"]) == 0
    check(next(n for n in json.loads(capsys.readouterr().out)["notes"] if "softmax" in n))
    assert cli.main(args + ["--csv"]) == 0
    check(next(line for line in capsys.readouterr().err.splitlines() if "softmax" in line)
          .removeprefix("predictor: note: "))
    for factory in (f"{path}:short_rows", lm_factory):
        assert cli.main(["predict", factory, "--gpus", "T4", "--json"]) == 0
        assert not any("softmax" in n for n in json.loads(capsys.readouterr().out)["notes"])


def test_a_small_share_of_long_softmax_rows_is_not_noted():
    """The note's threshold is the rows' share of the step's bytes moved."""
    from predictor import opmodel
    from predictor.kernels import layout as L
    from predictor.optable import Graph, OpTable

    def graph(long_count):
        d = np.zeros((2, L.MAX_DIMS), dtype=np.int64)
        d[:, L.MEM_INNER] = (50_000, 512)
        d[:, L.MEM_OUTER] = 64
        d[:, L.MEM_READ] = d[:, L.MEM_INNER] * 64
        d[:, L.MEM_WRITTEN] = d[:, L.MEM_INNER] * 64
        z = np.zeros(2, dtype=np.int64)
        ops = OpTable(np.array([L.SOFTMAX, L.ELEMENTWISE]), z, z + L.F32,
                      np.array([long_count, 10_000]), z + 1, d, np.zeros_like(d), z, ["x"])
        return Graph("g", ops, batch_size=1)

    assert "(33% of the step's bytes" in opmodel.unmeasured_shape_notes(graph(50))[0]
    assert not opmodel.unmeasured_shape_notes(graph(1))   # 1 % of the bytes


def test_odd_16_bit_gemm_dims_are_noted():
    """A 16-bit step with an odd GEMM dim (a 1,001-class head) gets one note
    naming it, in every format (the notes list); the same head of 1,000
    classes, or the odd one in fp32, gets none."""
    import torch

    from predictor.commands import common

    def head(n, amp):
        return predictor.trace(lambda: torch.nn.Sequential(torch.nn.Linear(64, 256),
                                                           torch.nn.Linear(256, n)),
                               lambda b: (torch.randn(b, 64),), batch_size=32, amp=amp)

    note = common.odd_gemm_note(head(1001, "bf16"))
    assert note and "(1,001 at batch 32)" in note and "\n" not in note
    assert note in common.notes(head(1001, "bf16"))
    assert common.odd_gemm_note(head(1000, "bf16")) is None
    assert common.odd_gemm_note(head(1001, None)) is None
    assert common.odd_gemm_note(head(1001, None), dtype="float16") is not None
