"""The end-to-end accuracy harness (benchmarks/e2e.py) on a small label subset.

The full run (every label, all GPUs) is `python -m benchmarks.e2e`; here one
BERT-large inference label on one GPU goes through the whole harness: trace
with the measured protocol, cache, predict, table, summary, breakdown, plot
and CSV. Skips without the measured data.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from benchmarks import e2e

GPU = "Tesla_V100-PCIE-32GB"


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("graphs"))


@pytest.fixture(scope="module")
def one_label(data_dir):
    labels = e2e.discover(data_dir, gpus=[GPU], models=["bert_large"], modes=["inf"])
    return [lab for lab in labels if lab.batch == 8]


@pytest.fixture(scope="module")
def results(data_dir, one_label, cache):
    return e2e.evaluate(data_dir, one_label, cache_dir=cache, log=lambda *a: None)


def test_discover_skips_switch_and_fusion(data_dir):
    labels = e2e.discover(data_dir)
    assert labels, "no labels found"
    assert not any(lab.model == "switchxl4" for lab in labels)
    assert not any("fusion" in lab.path.name for lab in labels)
    modes = {lab.mode for lab in labels}
    assert modes <= {"train", "inf"}
    for lab in labels:
        assert lab.e2e_ms > 0 and lab.fw_ms > 0
        assert math.isclose(lab.e2e_ms, lab.fw_ms + lab.bw_ms, rel_tol=1e-6)


def test_every_label_gpu_is_in_the_database(data_dir):
    from predictor import hardware

    for gpu_dir in {lab.gpu_dir for lab in e2e.discover(data_dir)}:
        assert hardware.get(gpu_dir.replace("_", " ")).id


def test_harness_numbers_are_finite(results):
    (r,) = results
    assert r.gpu_id == "V100-PCIE-32GB"
    assert np.isfinite([r.pred_fw, r.pred_bw, r.pred_e2e, r.err, r.overhead]).all()
    assert r.pred_fw > 0 and r.pred_bw == 0.0
    # An analytical or learned model may be off, but not by an order of magnitude.
    assert 0.3 < r.pred_e2e / r.label.e2e_ms < 3.0


def test_inference_graph_has_no_loss_and_no_dropout(results):
    p = results[0].prediction
    ops = set(p.ops["op"])
    assert not ops & {"_log_softmax", "nll_loss_forward", "native_dropout", e2e.ACCUMULATE_OP}


def test_second_evaluation_hits_the_cache(data_dir, one_label, cache, results):
    again = e2e.evaluate(data_dir, one_label, cache_dir=cache, log=lambda *a: None)
    assert again[0].cached
    assert again[0].pred_e2e == pytest.approx(results[0].pred_e2e, rel=1e-12)


def test_breakdown_covers_the_measured_families(results):
    bd = e2e.breakdown_frame(results)
    assert not bd.empty
    cats = set(bd.category)
    assert {"linear", "bmm+copy", "softmax", "layer_norm"} <= cats
    lin = bd[bd.category == "linear"].iloc[0]
    assert lin.measured_fw > 0 and lin.predicted_fw > 0
    # The per-node files cover the model: their sum is close to the measured e2e.
    assert 0.8 < bd.nodes_over_e2e.iloc[0] < 1.5


def test_main_writes_table_plot_and_csv(data_dir, cache, results, tmp_path, capsys):
    png, csv = tmp_path / "e2e.png", tmp_path / "e2e.csv"
    rc = e2e.main(["--data", str(data_dir), "--gpus", GPU, "--models", "bert_large",
                   "--modes", "inf", "--cache-dir", cache, "--plot", str(png), "--csv", str(csv)])
    assert rc == 0
    out = capsys.readouterr().out
    assert "bert_large" in out and "mean|err|%" in out and "targets" in out
    assert png.stat().st_size > 1000
    import pandas as pd

    df = pd.read_csv(csv)
    assert len(df) == 2 and np.isfinite(df.err_pct).all()


def test_fit_overhead_gives_positive_microseconds(data_dir, capsys):
    fit = e2e.fit_overhead(data_dir)
    assert 0.5 < fit["dispatch_us"] < 50 and 0.5 < fit["launch_us"] < 50


def test_bad_data_folder_is_one_line_error(tmp_path, capsys):
    assert e2e.main(["--data", str(tmp_path)]) == 2
    assert "no labels" in capsys.readouterr().err


def test_protocol_edits_of_a_graph():
    """as_measured drops the loss forward and adds one accumulate add per parameter."""
    from predictor.kernels import layout as L
    from predictor.optable import Graph, OpTable

    def table(rows, names):
        n = len(rows)
        d = np.zeros((n, L.MAX_DIMS), np.int64)
        d[:, :5] = [10, 5, 0, 5, 1]
        col = lambda j: np.array([r[j] for r in rows], np.int64)  # noqa: E731
        return OpTable(col(0), col(1), np.zeros(n, np.int64), col(2), np.ones(n, np.int64), d,
                       np.zeros_like(d), col(3), names)

    names = ["addmm", "_log_softmax", "nll_loss_forward", "_log_softmax_backward_data"]
    t = table([(L.MATMUL, L.FORWARD, 3, 0), (L.SOFTMAX, L.FORWARD, 1, 1),
               (L.LOSS, L.FORWARD, 1, 2), (L.SOFTMAX_BWD, L.BACKWARD, 1, 3)], names)
    g = Graph("toy", t, batch_size=1, host_ops=[10, 6, 0])
    m = e2e.as_measured(g, [(4, 8), (8,), (4, 8)])
    got = {(m.ops.op_names[o], int(p)) for o, p in zip(m.ops.op, m.ops.phase)}
    assert ("_log_softmax", L.FORWARD) not in got and ("nll_loss_forward", L.FORWARD) not in got
    assert ("_log_softmax_backward_data", L.BACKWARD) in got
    acc = np.asarray(m.ops.op_names, dtype=object)[m.ops.op] == e2e.ACCUMULATE_OP
    assert m.ops.count[acc].sum() == 3 and (m.ops.phase[acc] == L.BACKWARD).all()
    assert m.host_ops == [8, 9, 0]


def test_label_gemms_reads_linear_modules_and_addmm_nodes(tmp_path):
    """The per-node files' forward GEMMs: an nn.Linear module over a [B, S, in]
    input as x @ W^T of B*S rows, an addmm node as x @ W; short nodes and other
    nodes are left out; a board's rows only where it is asked for."""
    import csv

    from predictor.calibration import datasets as D
    from predictor.kernels import layout as L

    (tmp_path / "train").mkdir()
    cols = ["op", "target", "Name", "input_shapes", "output_shape", "fw_latency"]
    nodes = [
        ("call_module", "bert.encoder.layer.0.intermediate.dense", "dense",
         "[[8, 512, 1024]]", "(8, 512, 4096)", 3.0),
        ("call_function", "<built-in method addmm>", "addmm_2",
         "[[5120], [1024, 1280], [1280, 5120]]", "(1024, 5120)", 1.2),
        ("call_module", "bert.encoder.layer.0.output.LayerNorm", "ln",
         "[[8, 512, 1024]]", "(8, 512, 1024)", 0.2),
        ("call_module", "bert.encoder.layer.0.attention.self.key", "key",
         "[[1, 4, 8]]", "(1, 4, 8)", 0.01),
    ]
    for board in ("Tesla_T4", "Tesla_V100-PCIE-32GB"):
        (tmp_path / "labels" / board).mkdir(parents=True)
        with open(tmp_path / "labels" / board / "m-inf-512-8.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(cols)
            w.writerows(nodes)
    s = D.load_label_gemms(tmp_path)
    assert len(s) == 4 and set(s.gpu) == {"T4", "V100-PCIE-32GB"}
    assert (s.family == L.MATMUL).all() and (s.harness == D.LABEL_GEMM_HARNESS).all()
    t4 = s.subset(s.gpu == "T4")
    assert t4.dims[:, :4].tolist() == [[1, 4096, 4096, 1024], [1, 1024, 5120, 1280]]
    assert t4.dims[:, L.GEMM_LAYOUT].tolist() == [L.GEMM_B_T, 0]
    assert t4.latency_ms.tolist() == [3.0, 1.2]
    assert set(D.load_label_gemms(tmp_path, gpus={"T4"}).gpu) == {"T4"}


def test_label_gemms_option_needs_logo(tmp_path, capsys):
    with pytest.raises(SystemExit):
        e2e.main(["--data", str(tmp_path), "--label-gemms", "2"])
    assert "--logo only" in capsys.readouterr().err
