"""Batch sizes and sequence lengths out of range (issue 19, F4).

The supported range is defined once (predictor.limits: both at most 2**31),
checked at every entry point, and inside it the arithmetic is exact: time per
batch doubling stays about x2 and memory exactly x2 up to 2**31, where a batch
of 2**37 used to saturate the memory and 2**42 the time.
"""

from __future__ import annotations

import dataclasses
import os
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import predictor
from predictor import engine, limits
from predictor.errors import InvalidArgumentError, PredictorError
from predictor.kernels import layout as L
from predictor.optable import Graph, OpTable

ROOT = Path(__file__).resolve().parents[1]
HUGE = (2**31 + 1, 2**52, 2**62, 2**63, 2**64, 10**30, 10**5000)


def cli(*args, limit_bytes=None, timeout=300) -> subprocess.CompletedProcess:
    def cap():
        if limit_bytes:
            resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))

    return subprocess.run([sys.executable, "-m", "predictor.cli", *args], capture_output=True,
                          text=True, timeout=timeout, preexec_fn=cap,
                          env={**os.environ, "PYTHONWARNINGS": "ignore",
                               "PYTHONPATH": str(ROOT)})


def one_line_exit_2(proc, needle: str) -> str:
    # A progress line ("predictor: tracing gnmt ...") may come first off a terminal.
    err = "\n".join(line for line in proc.stderr.strip().splitlines()
                    if not line.startswith("predictor: tracing "))
    assert proc.returncode == 2, (proc.returncode, err[-2000:])
    assert err and "\n" not in err and "Traceback" not in err, err[-2000:]
    assert needle in err, err
    return err


def wide_graph(slope: int) -> Graph:
    """An elementwise row of `slope` elements per sample (a huge sequence)."""
    ops = OpTable(np.array([L.ELEMENTWISE]), np.array([0]), np.array([0]), np.array([1]),
                  np.array([1]), np.array([[0] * 12]),
                  np.array([[slope, slope, slope, 0, slope] + [0] * 7]), np.array([0]), ["op"])
    return Graph("wide", ops, batch_size=1)


def test_the_range_is_defined_once():
    assert limits.MAX_BATCH_SIZE == limits.MAX_SEQ_LEN == 2**31
    assert limits.check_batch_size(2**31) == 2**31
    assert limits.check_batch_size(np.int64(8)) == 8
    for bad in (0, -1, True, 1.0, "8", None, *HUGE):
        with pytest.raises(InvalidArgumentError):
            limits.check_batch_size(bad)
        with pytest.raises(InvalidArgumentError):
            limits.check_seq_len(bad)


@pytest.mark.parametrize("b", HUGE, ids=lambda b: f"2^{b.bit_length() - 1}+")
def test_python_entry_points_refuse_huge_batches(resnet50_graph, b):
    g = resnet50_graph
    calls = [lambda: engine.predict(g, "T4", batch_size=b),
             lambda: engine.sweep(g, ["T4"], [64, b]),
             lambda: predictor.search(g, gpus="T4", batch_sizes=[64, b]),
             lambda: g.flops(b),
             lambda: predictor.trace("resnet50", batch_size=b),
             lambda: predictor.trace("gnmt", seq_len=b)]
    for call in calls:
        with pytest.raises(InvalidArgumentError, match="supported range"):
            call()


def test_time_doubles_and_memory_never_saturates_up_to_the_limit(resnet50_graph):
    """Before: time per doubling stopped being x2 from 2**42, memory
    saturated from 2**37 (int64 overflow); now the largest batch is 2**31 and
    every doubling up to it is x2 (time within the learned model's drift)."""
    bs = [2**k for k in range(10, 32)]
    res = engine.sweep(resnet50_graph, ["T4", "H100-SXM5-80GB"], bs)
    it = res.phase_ms.sum(-1)
    assert np.all(np.isfinite(it)) and np.all(it > 0)
    step = it[:, 1:] / it[:, :-1]
    assert step.min() > 1.9 and step.max() < 2.05, step
    # Memory is affine in the batch once the capped workspaces are full: each
    # doubling adds twice what the previous one added.
    mem = res.memory_bytes[0, 6:]
    assert np.all(np.diff(mem) > 0)
    added = np.diff(mem)
    assert np.allclose(added[1:] / added[:-1], 2.0, rtol=1e-6), added[1:] / added[:-1]


def test_counts_beyond_int64_are_refused_not_wrapped():
    """A huge sequence with a huge batch would pass 2**63 in the kernels'
    int64 counts: refused in one line; the same graph at a small batch works."""
    g = wide_graph(2**40)
    assert engine.predict(g, "T4", batch_size=1).iteration_ms > 0
    for call in (lambda: engine.predict(g, "T4", batch_size=2**31),
                 lambda: engine.sweep(g, ["T4"], [1, 2**31]),
                 lambda: g.flops(2**31)):
        with pytest.raises(InvalidArgumentError, match="counts exactly"):
            call()


@pytest.mark.parametrize("args", [
    ("sweep", "{g}", "-b", "4611686018427387904", "--gpus", "T4", "--json"),
    ("search", "{g}", "-b", "64,4503599627370496", "--gpus", "T4"),
    ("sweep", "{g}", "-b", "9223372036854775808", "--gpus", "T4"),
    ("search", "{g}", "-b", "9223372036854775808", "--gpus", "T4"),
    ("sweep", "{g}", "-b", "1..9223372036854775808", "--gpus", "T4"),
    ("predict", "resnet50", "-b", "9223372036854775808", "--gpus", "T4"),
    ("predict", "gnmt", "--seq-len", "2147483649"),
    ("calibrate", "resnet50", "-b", "9223372036854775808", "-o", "x.npz"),
])
def test_cli_refuses_huge_batches_and_lengths(tmp_path, args):
    g = tmp_path / "g.npz"
    wide_graph(8).save(g)
    one_line_exit_2(cli(*(a.format(g=g) for a in args)), "supported range")


def test_cli_quotes_absurd_arguments_in_one_short_line(tmp_path):
    """A 5,000-digit or escape-laden -b is quoted short and escaped."""
    for text in ("9" * 5000, "1.." + "9" * 5000, "\x1b[2J" + "x" * 5000):
        err = one_line_exit_2(cli("sweep", "g.npz", "-b", text), "batch")
        assert len(err) < 400 and "\x1b" not in err, err


def test_example_inputs_are_fake(tmp_path):
    """`predict gnmt --seq-len 2**31` made a real 16 GiB input and was killed by
    the OOM killer; now the inputs are fake tensors and the trace fails in one
    line (a (B, T, T) attention overflows torch's own int64 sizes) in 8 GiB of
    address space."""
    proc = cli("predict", "gnmt", "-b", "1", "--seq-len", str(2**31), "--gpus", "T4",
               limit_bytes=8 << 30)
    one_line_exit_2(proc, "overflow")


def test_trace_checks_inputs_on_fake_tensors(monkeypatch):
    import torch
    from torch._subclasses.fake_tensor import FakeTensor

    from predictor import zoo
    from predictor.frontend import fx

    seen = []
    entry = zoo.resolve("gnmt")
    real = entry.make_inputs

    def spy(b, s):
        out = real(b, s)
        seen.append(all(isinstance(t, FakeTensor) for t in out if isinstance(t, torch.Tensor)))
        return out

    spied = dataclasses.replace(entry, make_inputs=spy)
    monkeypatch.setattr(zoo, "resolve", lambda name: spied)
    # 2**24, not 2**31: were the inputs real again, this would take 128 MiB, not 16 GiB.
    fx._spec_for("gnmt", None, None, 0, 1, 2**24, None)
    assert seen == [True]
    with pytest.raises(PredictorError):
        fx._spec_for("gnmt", None, None, 0, 1, 2**31 + 1, None)
