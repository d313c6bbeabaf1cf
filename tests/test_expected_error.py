"""The error band each prediction quotes (predictor.expected_error) and the
command that derives it (benchmarks.expected_error)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import predictor
from benchmarks import expected_error as bench
from predictor import cli, expected_error, opmodel
from predictor.errors import WeightsError


def _doc(**standings) -> dict:
    return {"format": expected_error.FORMAT,
            "standings": {k: {"p90_abs_error_pct": v} for k, v in standings.items()}}


def test_a_file_reads_back_its_figures(tmp_path):
    path = tmp_path / "e.json"
    path.write_text(json.dumps(_doc(trained=9.9, unseen=24.0)))
    assert expected_error.read(path) == {"trained": 9.9, "unseen": 24.0}


@pytest.mark.parametrize("content", [
    "{not json",
    json.dumps({"format": 99, "standings": {}}),
    json.dumps(_doc(trained=-1.0)),
    json.dumps(_doc(somewhere=5.0)),
    json.dumps({"format": 1, "standings": {"trained": {}}}),
])
def test_a_damaged_file_is_an_error_naming_it(tmp_path, content):
    path = tmp_path / "damaged.json"
    path.write_text(content)
    with pytest.raises(WeightsError, match="damaged.json"):
        expected_error.read(path)


def test_standing_follows_the_data_the_tensor_cores_and_calibration():
    from predictor import engine, hardware
    from predictor.kernels import layout as L

    fp32, tf32 = engine.model_params(), engine.model_params(tf32_matmul=True)
    t4, v100, a100 = (hardware.get(g) for g in ("T4", "V100-PCIE-32GB", "A100-SXM4-80GB"))
    trained = opmodel.shipped()[1].get("gpus", [])
    if trained:
        assert expected_error.standing(hardware.get(trained[0])) == "trained"
    assert expected_error.standing(hardware.get("H100-SXM5-80GB")) == "unseen"
    assert expected_error.standing(t4, L.F16, fp32) == "tensor cores"
    # bf16 on a T4 runs emulated at the fp32 rate: nothing of the kind was measured.
    assert expected_error.standing(t4, L.BF16, fp32) == "emulated"
    # TF32 asked of a Volta board: plain fp32 GEMMs, the fp32 standing.
    assert expected_error.standing(v100, L.F32, tf32) == ("trained" if trained else "unseen")
    assert expected_error.standing(a100, L.F32, tf32) == "tensor cores"
    assert expected_error.standing(t4, L.F16, fp32, calibrated=True) == "calibrated"


def test_the_gemm_dtype_is_half_precision_or_tf32():
    from predictor.kernels import layout as L

    g = predictor.trace("gpt2", batch_size=1, seq_len=32)
    assert expected_error.gemm_dtype(g) is None
    assert expected_error.gemm_dtype(g, dtype="bf16") == L.BF16
    assert expected_error.gemm_dtype(g, dtype="float32") is None
    assert expected_error.gemm_dtype(g, tf32_matmul=True) == L.F32
    amp = predictor.trace("gpt2", batch_size=1, seq_len=32, amp="bf16")
    assert expected_error.gemm_dtype(amp) == L.BF16
    assert expected_error.gemm_dtype(amp, tf32_matmul=True) == L.BF16


def test_every_prediction_carries_its_standing_and_band():
    g = predictor.trace("gpt2", batch_size=1, seq_len=32)
    df = predictor.sweep(g, gpus=["T4", "H100-SXM5-80GB"], batch_sizes=[1, 2]).to_pandas()
    assert list(df["standing"]) == ["trained"] * 2 + ["unseen"] * 2
    amp = predictor.sweep(g, gpus=["T4", "H100-SXM5-80GB"], dtype="bf16").to_pandas()
    assert list(amp["standing"]) == ["emulated", "tensor cores"]
    figures = expected_error.shipped()
    for row in df.itertuples():
        want = figures.get(row.standing)
        assert (np.isnan(row.error_p90_pct) if want is None else row.error_p90_pct == want)
    p = predictor.predict(g, "H100-SXM5-80GB")
    assert p.standing == "unseen" and p.to_dict()["error_p90_pct"] == figures.get("unseen")


def test_the_shipped_bands_widen_away_from_the_data():
    figures = expected_error.shipped()
    if not figures:
        pytest.skip("the package ships no expected-error figures")
    assert figures["trained"] < figures["unseen"]
    assert set(figures) <= set(expected_error.STANDINGS)


def test_held_out_share_counts_a_gpu_against_the_others_band():
    # GPU a: errors 1..9 %; b: 10 x 2 %; c: one 50 %.
    gpus = ["a"] * 9 + ["b"] * 10 + ["c"]
    err = [float(i) for i in range(1, 10)] + [2.0] * 10 + [-50.0]
    shares, overall = bench.held_out(gpus, err)
    assert shares["c"] == 0.0  # 50 % lies outside the others' 90th percentile
    assert shares["b"] == 1.0
    band_a = bench.p90([2.0] * 10 + [50.0])
    assert shares["a"] == pytest.approx(np.mean(np.arange(1, 10) <= band_a))
    assert overall == pytest.approx((shares["a"] * 9 + 10 + 0) / 20)


def test_tables_and_json_quote_the_band(capsys):
    if not expected_error.shipped():
        pytest.skip("the package ships no expected-error figures")
    args = ["predict", "gpt2", "-b", "1", "--seq-len", "32", "--gpus", "T4,H100"]
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    assert "±err" in out and "90 % of measured iterations" in out
    assert cli.main(args + ["--json"]) == 0
    rows = {r["gpu"]: r for r in json.loads(capsys.readouterr().out)["predictions"]}
    assert rows["T4"]["standing"] == "trained"
    assert rows["H100-SXM5-80GB"]["error_p90_pct"] == expected_error.shipped()["unseen"]
    assert cli.main(["sweep", "gpt2", "-b", "1,2", "--seq-len", "32", "--gpus", "T4,H100"]) == 0
    assert "±err" in capsys.readouterr().out


def test_the_gpu_list_quotes_the_fp32_band(capsys):
    assert cli.main(["gpus", "--json"]) == 0
    rows = {r["id"]: r for r in json.loads(capsys.readouterr().out)}
    figures = expected_error.shipped()
    assert rows["H100-SXM5-80GB"]["fp32_error_p90_pct"] == figures.get("unseen")
    assert rows["T4"]["fp32_error_p90_pct"] == figures.get("trained")


def test_a_sweep_plot_shades_the_bands_and_labels_its_log_axes_plainly(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from predictor import plots

    figures = []
    save = plots._save_atomically
    monkeypatch.setattr(plots, "_save_atomically",
                        lambda fig, path, fmt: (figures.append(fig), save(fig, path, fmt))[1])
    g = predictor.trace("gpt2", batch_size=1, seq_len=32)
    res = predictor.sweep(g, gpus=["T4", "H100-SXM5-80GB"], batch_sizes=[1, 2, 4])
    assert plots.plot_sweep(res, tmp_path / "s.png").stat().st_size > 0
    (fig,) = figures
    ax_t = fig.axes[0]
    assert len(ax_t.collections) == (2 if expected_error.shipped() else 0)  # one band a GPU
    fig.canvas.draw()
    labels = [t.get_text() for ax in fig.axes for t in ax.get_yticklabels() + ax.get_xticklabels()]
    assert labels and not any("$" in t for t in labels)


def test_the_published_standing_reads_every_harness_table(monkeypatch):
    """`--published-only` gathers the tensor-core rows of every published
    harness, each table as that harness now names it: a renamed table is an
    error here, not at the next `--write`. The harnesses' pricing is stubbed
    (each prices its rows in its own test); the tables are the real ones."""
    from benchmarks import (amp_published, diffusion_published, gnmt_published, ncf_published,
                            tacotron2_published, timm_published, transformer_published,
                            transformerxl_published, waveglow_published)

    seen = []

    def rows(name):
        def priced(table=None, *args, **kwargs):
            table = list(table) if table is not None else []
            seen.append((name, len(table)))
            return [{"gpu": "A100-SXM4-80GB", "precision": "amp", "error_pct": 10.0},
                    {"gpu": "V100-SXM2-16GB", "precision": "fp32", "error_pct": 50.0}]
        return priced

    monkeypatch.setattr(amp_published, "run", rows("amp"))
    monkeypatch.setattr(timm_published, "run", rows("timm"))
    monkeypatch.setattr(gnmt_published, "predict_rows", rows("gnmt"))
    monkeypatch.setattr(ncf_published, "predict_rows", rows("ncf"))
    monkeypatch.setattr(transformer_published, "predict_rows", rows("transformer"))
    monkeypatch.setattr(transformerxl_published, "predict_rows", rows("transformer-xl"))
    monkeypatch.setattr(waveglow_published, "predict_rows", rows("waveglow"))
    monkeypatch.setattr(tacotron2_published, "predict_rows", rows("tacotron2"))
    monkeypatch.setattr(diffusion_published, "predict_rows", rows("diffusion"))
    gpus, err = bench.from_published()
    assert ("gnmt", len(gnmt_published.LAMBDA)) in seen
    assert ("ncf", len(ncf_published.LAMBDA_COLUMNS)) in seen
    # each table's AMP row on an A100 is a tensor-core one; an fp32 row is not
    # (timm's two tables and the diffusion check's rows are all half
    # precision: their V100 rows count too)
    assert ("timm", len(timm_published.DEPTHWISE_PUBLISHED)) in seen
    assert len(seen) == 12 and gpus.count("A100-SXM4-80GB") == 12
    assert sorted(err) == [10.0] * 12 + [50.0] * 3


def test_the_unseen_standing_takes_fp32_rows_on_boards_outside_the_data():
    """fp32 figures on a board the op models never saw join the `unseen`
    labels; fp32 on a training board and any half-precision row do not."""
    rows = [{"gpu": "V100-SXM2-16GB", "precision": "fp32", "error_pct": -22.0},
            {"gpu": "GTX-1080-TI", "precision": "fp32", "error_pct": -20.8},
            {"gpu": "V100-PCIE-32GB", "precision": "fp32", "error_pct": 5.0},
            {"gpu": "A100-SXM4-80GB", "precision": "tf32", "error_pct": 10.0},
            {"gpu": "GTX-1080-TI", "precision": "amp", "error_pct": -43.0}]
    gpus, err = bench.from_published_fp32(rows)
    assert gpus == ["V100-SXM2-16GB", "GTX-1080-TI"] and list(err) == [-22.0, -20.8]
    gpus, err = bench.from_published(rows)
    assert gpus == ["A100-SXM4-80GB"] and list(err) == [10.0]
