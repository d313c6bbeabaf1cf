"""The compiled sweep engine against its plain-Python reference, the sweep API
and the `predictor sweep` command."""

from __future__ import annotations

import json
import subprocess
import sys
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import predictor
from predictor import cli, engine, hardware, reference
from predictor.commands.common import parse_batch_sizes
from predictor.calibration.train import GroupModel, pack
from predictor.errors import FileFormatError
from predictor.kernels.features import G_BMM, G_CONV, G_ELEMENTWISE, N_FEATURES, N_GROUPS
from predictor.tiles import shipped_params
from predictor.kernels import layout as L
from predictor.kernels import grid
from predictor.kernels.grid import evaluate_grid, evaluate_ops
from predictor.optable import Graph, OpTable

# These tests ask for TF32 matmuls on every GPU, those without TF32 included.
pytestmark = pytest.mark.filterwarnings("ignore::predictor.errors.NotApplicableWarning")

RTOL = 1e-6
ALL_GPUS = hardware.database().ids()
DTYPE_CODES = {None: None, "float32": L.F32, "float16": L.F16, "bfloat16": L.BF16,
               "float64": L.F64}


# ---- random OpTables ----------------------------------------------------------------
# Shapes stay small enough that no int64 product overflows at batch 2**20: one
# dim per row scales with the batch (slope <= 8), the other dims <= 1024
# (spatial dims <= 256), the memory-bound families' element counts <= 2**30.

_SMALL = st.integers(0, 1024)
_POS = st.integers(1, 1024)


@st.composite
def _row(draw):
    family = draw(st.integers(0, L.N_FAMILIES - 1))
    base = np.zeros(L.MAX_DIMS, dtype=np.int64)
    slope = np.zeros(L.MAX_DIMS, dtype=np.int64)
    # GEMM-like rows have no empty dims (an empty GEMM launches no kernel).
    if family == L.MATMUL:
        base[:4] = [draw(_POS) for _ in range(4)]
        scaling = draw(st.sampled_from([0, 1]))
    elif family in (L.CONV, L.CONV_DGRAD, L.CONV_WGRAD):
        n, c = draw(_POS), draw(_POS)
        h, w, p, q = (draw(st.integers(1, 256)) for _ in range(4))
        r, s = draw(st.integers(1, 7)), draw(st.integers(1, 7))
        groups = draw(st.sampled_from([0, 1, 2, 4, 32, c]))
        k = max(draw(_POS), groups)
        base[:11] = [n, c, h, w, k, r, s, p, q, groups, draw(st.integers(1, 2))]
        scaling = 0
    elif family in (L.ATTENTION, L.ATTENTION_BWD):
        base[:7] = [draw(_SMALL), draw(st.integers(1, 64)), draw(_POS), draw(_POS),
                    draw(st.integers(1, 256)), draw(st.integers(1, 256)),
                    draw(st.integers(0, 1))]
        scaling = 0
    elif family in (L.LSTM, L.LSTM_BWD):
        base[:4] = [draw(st.integers(1, 512)), draw(_SMALL), draw(_POS), draw(_POS)]
        scaling = 1
    else:  # memory-bound: read, written, flops, inner, outer
        base[:5] = [draw(st.integers(0, 2**30)) for _ in range(5)]
        for j in range(5):
            if draw(st.booleans()):
                slope[j] = draw(st.integers(0, 2**10))
        scaling = None
    if scaling is not None and draw(st.booleans()):
        slope[scaling] = draw(st.integers(1, 8))
    return (family, draw(st.integers(0, 2)), draw(st.integers(0, len(L.DTYPE_NAMES) - 1)),
            draw(st.integers(1, 200)), draw(st.integers(0, 4)), base, slope)


def _table(rows) -> OpTable:
    cols = list(zip(*rows))
    ints = [np.asarray(c, dtype=np.int64) for c in cols[:5]]
    return OpTable(*ints, np.stack(cols[5]), np.stack(cols[6]),
                   np.zeros(len(rows), dtype=np.int64), ["aten.test"])


def _graph(ops: OpTable, name: str = "random") -> Graph:
    return Graph(name=name, ops=ops, batch_size=1)


def _learned_weights(seed: int, groups=range(N_GROUPS), hidden=(12, 8)) -> np.ndarray:
    """Random networks in the shipped weight layout (what training writes), so
    the learned path is tested whether or not trained weights are present."""
    rng = np.random.default_rng(seed)
    models = {}
    for g in groups:
        n_in, (h1, h2) = N_FEATURES, hidden
        layers = [(rng.normal(0, 0.4, (h1, n_in)), rng.normal(0, 0.3, h1)),
                  (rng.normal(0, 0.4, (h2, h1)), rng.normal(0, 0.3, h2)),
                  (rng.normal(0, 0.4, h2), float(rng.normal(0, 0.3)))]
        # The batched-GEMM group's tiles from the shipped tile rule (the
        # analytical fallback where none ships).
        models[g] = GroupModel(g, rng.normal(0, 3, n_in), rng.uniform(0.5, 4, n_in), layers,
                               float(rng.uniform(1, 20)), float(rng.uniform(0.6, 2.5)),
                               shipped_params() if g == G_BMM else None)
    return pack(models)


NO_MLP = np.zeros(0)
WEIGHTS = {"analytical": NO_MLP, "learned": _learned_weights(0),
           "some learned": _learned_weights(1, groups=(G_CONV, G_ELEMENTWISE))}


def _reference(graph, gpus, batches, dtype=None, tf32_matmul=None, tf32_conv=None, mlp=NO_MLP):
    db = hardware.database()
    feats = [g.features for g in db.resolve(gpus)]
    params = engine.model_params(tf32_matmul, tf32_conv)
    return reference.sweep(graph, feats, batches, params, mlp, dtype_code=DTYPE_CODES[dtype])


def _kernel_grid(graph, gpus, batches, dtype=None, tf32_matmul=None, tf32_conv=None,
                 mlp=NO_MLP):
    """The GPU-kernel part of a sweep: evaluate_grid on the engine's inputs."""
    db = hardware.database()
    code = DTYPE_CODES[dtype]
    ops = graph.ops if code is None else graph.ops.with_dtype(code)
    feats = db.features(db.resolve(gpus))
    out = np.zeros((feats.shape[0], len(batches), len(L.PHASE_NAMES)))
    evaluate_grid(ops.family, ops.phase, ops.dtype, ops.count, ops.kernels, ops.dbase,
                  ops.dslope, np.asarray(batches, dtype=np.int64), feats,
                  engine.model_params(tf32_matmul, tf32_conv), mlp, np.zeros(0),
                  np.zeros(0, dtype=np.int64), np.zeros(L.N_GPU_FEATURES), out)
    return out


def _check(graph, gpus, batches, dtype=None, tf32_matmul=None, tf32_conv=None, mlp=NO_MLP):
    """engine.sweep end to end (with `mlp` as the engine's learned weights), and
    its kernel part alone, against the reference."""
    with mock.patch.object(engine, "_mlp", lambda: mlp):
        res = engine.sweep(graph, gpus, batches, dtype=dtype, tf32_matmul=tf32_matmul,
                           tf32_conv=tf32_conv)
    ref = _reference(graph, gpus, batches, dtype, tf32_matmul, tf32_conv, mlp)
    assert res.phase_ms.shape == ref.phase_ms.shape
    np.testing.assert_allclose(res.phase_ms, ref.phase_ms, rtol=RTOL, atol=1e-300)
    grid = _kernel_grid(graph, gpus, batches, dtype, tf32_matmul, tf32_conv, mlp)
    np.testing.assert_allclose(grid, ref.gpu_phase_ms, rtol=RTOL, atol=1e-300)
    assert np.isfinite(res.phase_ms).all() and (res.phase_ms >= 0).all()
    return res


# ---- the oracle --------------------------------------------------------------------

@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.lists(_row(), min_size=1, max_size=24),
       batches=st.lists(st.integers(1, 2**20), min_size=1, max_size=24),
       gpus=st.lists(st.sampled_from(ALL_GPUS), min_size=1, max_size=len(ALL_GPUS),
                     unique=True),
       dtype=st.sampled_from(sorted(DTYPE_CODES, key=str)),
       tf32=st.tuples(st.sampled_from([None, False, True]), st.sampled_from([None, False, True])),
       weights=st.sampled_from(sorted(WEIGHTS)))
def test_sweep_matches_reference_on_random_tables(rows, batches, gpus, dtype, tf32, weights):
    res = _check(_graph(_table(rows)), gpus, batches, dtype, *tf32, mlp=WEIGHTS[weights])
    assert res.gpus == list(dict.fromkeys(gpus))
    assert list(res.batch_sizes) == batches


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.lists(_row(), min_size=1, max_size=16),
       batches=st.lists(st.integers(1, 2**20), min_size=1, max_size=6),
       data=st.data())
def test_calibrated_grid_matches_reference(rows, batches, data):
    """Measured rows scale by the model's ratio destination / origin."""
    ops = _table(rows)
    n = len(ops)
    cal_us = np.asarray(data.draw(st.lists(st.sampled_from([0.0, 0.5, 13.0, 4e4]),
                                           min_size=n, max_size=n)))
    cal_batch = np.asarray(data.draw(st.lists(st.integers(1, 4096), min_size=n, max_size=n)),
                           dtype=np.int64)
    db = hardware.database()
    gpus = db.features(db.resolve(data.draw(st.lists(st.sampled_from(ALL_GPUS), min_size=1,
                                                     max_size=8, unique=True))))
    origin = db.get(data.draw(st.sampled_from(ALL_GPUS))).features
    # Every calibrated row needs a positive model time at its calibration point.
    ops.kernels[cal_us > 0] = np.maximum(ops.kernels[cal_us > 0], 1)
    params = engine.model_params()
    mlp = WEIGHTS[data.draw(st.sampled_from(sorted(WEIGHTS)))]
    b = np.asarray(batches, dtype=np.int64)
    out = np.zeros((gpus.shape[0], len(b), 3))
    evaluate_grid(ops.family, ops.phase, ops.dtype, ops.count, ops.kernels, ops.dbase, ops.dslope,
                  b, gpus, params, mlp, cal_us, cal_batch, origin, out)
    ref = reference.evaluate_grid(ops.family, ops.phase, ops.dtype, ops.count, ops.kernels,
                                  ops.dbase, ops.dslope, b, gpus, params, mlp, cal_us, cal_batch,
                                  origin)
    np.testing.assert_allclose(out, ref, rtol=RTOL, atol=1e-300)
    per_op = np.zeros(n)
    evaluate_ops(ops.family, ops.dtype, ops.kernels, ops.dbase, ops.dslope, b[0], gpus[0], params,
                 mlp, cal_us, cal_batch, origin, per_op)
    plain = reference._plain(ops.family, ops.dtype, ops.kernels, ops.dbase, ops.dslope)
    want = [reference.row_time_us(i, *plain, int(b[0]), list(gpus[0]), params, mlp,
                                  cal_us.tolist(), cal_batch.tolist(), list(origin))
            for i in range(n)]
    np.testing.assert_allclose(per_op, want, rtol=RTOL, atol=1e-300)


@settings(max_examples=4, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(rows=st.lists(_row(), min_size=80, max_size=90), weights=st.sampled_from(sorted(WEIGHTS)))
def test_parallel_grid_matches_reference(rows, weights):
    """A grid large enough for the threaded path, with uneven GPU blocks."""
    graph = _graph(_table(rows))
    graph.ops.dslope[:, 0] += 1  # every row scales with the batch size
    batches = [1, 7, 2**20, 64, 1000]  # few batch sizes: the GPUs are split into blocks too
    assert len(graph.ops) * len(ALL_GPUS) * len(batches) >= grid._MIN_PARALLEL_WORK
    _check(graph, ALL_GPUS, batches, mlp=WEIGHTS[weights])


@pytest.mark.parametrize("dtype,weights", [(None, "analytical"), ("float16", "analytical"),
                                           (None, "learned")])
def test_resnet50_sweep_matches_reference(resnet50_graph, dtype, weights):
    batches = [1, 3, 64, 1000, 2**20]
    _check(resnet50_graph, "all", batches, dtype, mlp=WEIGHTS[weights])


@pytest.fixture(scope="module")
def mixed_graph():
    """A small model with every kind of family: conv, LSTM, attention, norms."""
    import torch
    import torch.nn as nn

    class Mixed(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2), nn.BatchNorm2d(8),
                                      nn.ReLU(), nn.MaxPool2d(2))
            self.proj = nn.Linear(8 * 3 * 3, 32)
            self.lstm = nn.LSTM(32, 32, batch_first=True)
            self.qkv = nn.Linear(32, 96)
            self.norm = nn.LayerNorm(32)
            self.head = nn.Linear(32, 10)

        def forward(self, x):
            b = x.shape[0]
            f = self.conv(x).flatten(1)
            seq = self.proj(f).unsqueeze(1).expand(b, 5, 32)
            seq, _ = self.lstm(seq)
            q, k, v = self.qkv(seq).view(b, 5, 3, 4, 8).permute(2, 0, 3, 1, 4)
            att = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            seq = self.norm(seq + att.transpose(1, 2).reshape(b, 5, 32))
            return self.head(nn.functional.dropout(seq.mean(1), 0.1))

    torch.manual_seed(0)
    return predictor.trace(Mixed(), (torch.randn(4, 3, 16, 16),))


def test_mixed_model_sweep_matches_reference(mixed_graph):
    fams = set(mixed_graph.ops.family.tolist())
    assert {L.CONV, L.LSTM, L.ATTENTION, L.LAYER_NORM, L.OPTIMIZER} <= fams
    batches = [1, 2, 5, 512, 2**20]
    for dtype, weights in ((None, "analytical"), ("bfloat16", "learned")):
        _check(mixed_graph, "all", batches, dtype, True, mlp=WEIGHTS[weights])


# ---- one engine: predict is a cell of the sweep --------------------------------------

def test_predict_is_one_cell_of_the_sweep(resnet50_graph):
    gpus, batches = ["T4", "A100-SXM4-80GB", "H100-SXM5-80GB"], [8, 64, 96]
    res = engine.sweep(resnet50_graph, gpus, batches, dtype="bfloat16")
    grid = _kernel_grid(resnet50_graph, gpus, batches, dtype="bfloat16", mlp=engine._mlp())
    for gi, gpu in enumerate(gpus):
        for bi, b in enumerate(batches):
            p = engine.predict(resnet50_graph, gpu, batch_size=b, dtype="bfloat16")
            assert (p.forward_ms, p.backward_ms, p.optimizer_ms) == tuple(res.phase_ms[gi, bi])
            assert p.iteration_ms == pytest.approx(res.iteration_ms[gi, bi], rel=1e-12)
            per_phase = np.bincount(p.op_table.phase, p.op_us * p.op_table.count * 1e-3,
                                    minlength=3)
            np.testing.assert_allclose(per_phase, grid[gi, bi], rtol=1e-12)


def test_sweep_result_views(resnet50_graph):
    res = predictor.sweep(resnet50_graph, ["T4", "H100-SXM5-80GB"], [16, 32, 64])
    assert res.iteration_ms.shape == res.throughput.shape == (2, 3)
    df = res.to_pandas()
    assert len(df) == 6 and set(df.gpu) == {"T4", "H100-SXM5-80GB"}
    best = res.best()
    assert list(best.columns[:2]) == ["gpu", "batch_size"] and len(best) == 2
    row = df[(df.gpu == "T4") & (df.batch_size == 32)].iloc[0]
    assert row.throughput == pytest.approx(32 / (row.iteration_ms / 1e3))


def test_best_is_among_configurations_that_fit(resnet50_graph):
    res = predictor.sweep(resnet50_graph, ["T4", "H100-SXM5-80GB"], [64, 256, 1024, 4096])
    assert res.memory_bytes is not None and not res.fits.all()
    best = res.best()
    assert best["fits"].all()
    unfiltered = res.best(fitting=False)
    assert (unfiltered["batch_size"] >= best.set_index("gpu").loc[unfiltered["gpu"],
                                                                   "batch_size"].values).all()
    with pytest.raises(predictor.InvalidArgumentError, match="objective"):
        res.best("cost")


@pytest.mark.parametrize("batches,message", [([], "no batch size"), ([0], "positive"),
                                             ([4, -1], "positive"), ([2.5], "positive")])
def test_sweep_bad_batches(resnet50_graph, batches, message):
    with pytest.raises(predictor.InvalidArgumentError, match=message):
        engine.sweep(resnet50_graph, ["T4"], batches)


# ---- graphs on disk ---------------------------------------------------------------

def test_graph_save_load_roundtrip(resnet50_graph, tmp_path):
    path = resnet50_graph.save(tmp_path / "r50.npz")
    loaded = Graph.load(path)
    for name in ("family", "phase", "dtype", "count", "kernels", "dbase", "dslope", "op"):
        a, b = getattr(resnet50_graph.ops, name), getattr(loaded.ops, name)
        assert a.dtype == b.dtype and np.array_equal(a, b), name
    assert loaded.ops.op_names == resnet50_graph.ops.op_names
    for name in ("name", "batch_size", "mode", "optimizer", "seq_len", "parameters",
                 "unsupported", "batch_scalable"):
        assert getattr(loaded, name) == getattr(resnet50_graph, name), name
    a = engine.sweep(resnet50_graph, "all", [1, 64]).phase_ms
    assert np.array_equal(a, engine.sweep(loaded, "all", [1, 64]).phase_ms)
    assert [p.name for p in tmp_path.iterdir()] == ["r50.npz"]  # no temp file left


@pytest.mark.parametrize("content", [b"", b"not a zip", b"PK\x03\x04broken"])
def test_graph_load_rejects_other_files(tmp_path, content):
    bad = tmp_path / "bad.npz"
    bad.write_bytes(content)
    with pytest.raises(FileFormatError, match="not a saved graph") as err:
        Graph.load(bad)
    # numpy reads a file that is not a zip as a pickle and suggests
    # allow_pickle: not advice to pass on about a file one did not write.
    assert "pickle" not in str(err.value)
    with pytest.raises(FileFormatError, match="no saved graph"):
        Graph.load(tmp_path / "missing.npz")


def test_prediction_from_disk_does_not_import_torch(resnet50_graph, tmp_path):
    path = resnet50_graph.save(tmp_path / "r50.npz")
    code = f"""
import sys, predictor
from predictor.optable import Graph
g = Graph.load({str(path)!r})
s = predictor.sweep(g, "all", [1, 2, 4, 8])
p = predictor.predict(g, "T4", batch_size=32)
from predictor import cli
assert cli.main(["sweep", {str(path)!r}, "--gpus", "T4", "--batch-sizes", "1..8", "--json"]) == 0
assert s.iteration_ms.shape == (len(s.gpus), 4) and p.iteration_ms > 0
heavy = sorted(m for m in ("torch", "transformers", "onnx", "matplotlib") if m in sys.modules)
print("HEAVY", heavy, file=sys.stderr)
assert not heavy, heavy
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]


# ---- the command line ------------------------------------------------------------

@pytest.mark.parametrize("text,want", [
    ("1,2,4..1024", [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]),
    ("8", [8]),
    ("3..20", [3, 6, 12, 20]),
    ("64, 16 ,16,32", [16, 32, 64]),
    ("1..1", [1]),
])
def test_parse_batch_sizes(text, want):
    assert parse_batch_sizes(text) == want


@pytest.fixture(scope="module")
def saved_graph(resnet50_graph, tmp_path_factory):
    return str(resnet50_graph.save(tmp_path_factory.mktemp("graph") / "resnet50.npz"))


def test_sweep_command_table_plot_csv(saved_graph, tmp_path, capsys):
    png, csv = tmp_path / "sweep.png", tmp_path / "out" / "grid.csv"
    assert cli.main(["sweep", saved_graph, "--gpus", "T4,A100-SXM4-80GB,H100-SXM5-80GB",
                     "--batch-sizes", "1,2,4..64,96", "--plot", str(png), "--csv",
                     str(csv)]) == 0
    out = capsys.readouterr().out
    assert "best batch size per GPU" in out and "H100-SXM5-80GB" in out
    assert "3 GPUs × 8 batch sizes = 24 configurations" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
    lines = csv.read_text().splitlines()
    assert lines[0].startswith("model,gpu,batch_size,iteration_ms") and len(lines) == 1 + 24


def test_sweep_command_json(saved_graph, capsys):
    assert cli.main(["sweep", saved_graph, "--gpus", "T4,L4", "-b", "16..128",
                     "--dtype", "float16", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["batch_sizes"] == [16, 32, 64, 128] and out["gpus"] == ["T4", "L4"]
    assert out["dtype"] == "float16" and len(out["grid"]) == 8 and len(out["best"]) == 2
    for row in out["best"]:
        same = [r for r in out["grid"] if r["gpu"] == row["gpu"]]
        assert row["throughput"] == max(r["throughput"] for r in same)


def test_sweep_command_traces_a_zoo_model(tmp_path, capsys):
    saved = tmp_path / "dcgan.npz"
    assert cli.main(["sweep", "dcgan", "--gpus", "T4", "-b", "4,8", "--save-graph",
                     str(saved)]) == 0
    assert "dcgan" in capsys.readouterr().out and Graph.load(saved).name == "dcgan"


@pytest.mark.parametrize("args,needle", [
    (["-b", "0"], "positive"),
    (["-b", "8..2"], "empty batch-size range"),
    (["-b", "1,x"], "bad batch size"),
    (["-b", "1..99999999"], None),  # large but few sizes: fine
    (["--gpus", "H10"], "unknown GPU"),
    (["--plot", "out.jpg"], ".png, .svg or .pdf"),
    (["--seq-len", "128"], "cannot change a saved graph"),
])
def test_sweep_command_errors(saved_graph, args, needle, capsys):
    code = cli.main(["sweep", saved_graph, "--json", *args]) if needle is None else None
    if needle is None:
        assert code == 0
        return
    with pytest.raises(SystemExit) as exc:
        sys.exit(cli.main(["sweep", saved_graph, *args]))
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and "\n" not in err and "Traceback" not in err


def test_sweep_command_missing_graph_file(tmp_path, capsys):
    assert cli.main(["sweep", str(tmp_path / "nope.npz")]) == 2
    assert "no saved graph" in capsys.readouterr().err


@pytest.mark.parametrize("family", [L.CONV, L.CONV_DGRAD, L.CONV_WGRAD])
def test_conv_with_fewer_channels_than_groups_is_finite(family):
    """Channels per group that round down to 0 give a GEMM with no output tile;
    its wave quantization once divided 0 by 0 inside the learned features."""
    row = np.zeros(L.MAX_DIMS, dtype=np.int64)
    row[:11] = [8, 3, 32, 32, 64, 3, 3, 32, 32, 32, 1]  # 3 channels, 32 groups
    graph = _graph(_table([(family, 0, L.F32, 1, 1, row, np.zeros(L.MAX_DIMS, dtype=np.int64))]))
    for name in ("analytical", "learned"):
        _check(graph, ALL_GPUS, [1, 8, 64], mlp=WEIGHTS[name])


def test_backward_row_reductions_cannot_overflow():
    """A softmax or layer-norm backward row is priced as its forward over the
    same inner and outer dims; those are checked one by one, not their
    product, so a random table can make it pass int64 (8 x inner x outer).
    Both the kernel and the reference cap it alike (features.FORWARD_EQUIVALENT_CAP)."""
    from predictor.kernels import features as F

    d = np.zeros(L.MAX_DIMS, dtype=np.int64)
    d[L.MEM_INNER], d[L.MEM_OUTER] = 1081565511, 2**31
    for fam in (L.LAYER_NORM_BWD, L.SOFTMAX_BWD):
        kf, kd = F.forward_equivalent(fam, d.copy())
        rf, rd = reference.forward_equivalent(fam, d.copy())
        assert kf == rf and list(kd) == [int(x) for x in rd]
        assert 0 < kd[L.MEM_FLOPS] <= 2**61
