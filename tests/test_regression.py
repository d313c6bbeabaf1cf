"""The accuracy gate's comparison logic (benchmarks/regression.py), on
synthetic figures: no data, no training."""

import json

import numpy as np
import pandas as pd
import pytest

from benchmarks import regression as R
from predictor.errors import FileFormatError

SHIPPED = {"accuracy.logo.linear": 27.3, "accuracy.in-dist.bmm": 20.2, "e2e.logo.all": 14.8}


def _status(rows, name):
    return next(r.status for r in rows if r.name == name)


def _write(path, figures, **extra):
    path.write_text(json.dumps({"command": "x", "date": "2026-11-30", "figures": figures,
                                **extra}))
    return path


def test_a_regression_beyond_the_tolerance_fails():
    rows = R.compare(SHIPPED, {**SHIPPED, "accuracy.logo.linear": 27.3 + 2.5})
    assert _status(rows, "accuracy.logo.linear") == "WORSE"
    assert [r.name for r in rows if r.failed] == ["accuracy.logo.linear"]
    assert "FAILED" in R.verdict(rows, 2.0)


def test_a_regression_within_the_tolerance_passes():
    rows = R.compare(SHIPPED, {**SHIPPED, "e2e.logo.all": 14.8 + 1.5})
    assert _status(rows, "e2e.logo.all") == "ok"
    assert not any(r.failed for r in rows)
    assert R.verdict(rows, 2.0).startswith("ok")


def test_an_improvement_passes():
    rows = R.compare(SHIPPED, {**SHIPPED, "accuracy.in-dist.bmm": 20.2 - 5.0})
    assert _status(rows, "accuracy.in-dist.bmm") == "better"
    assert not any(r.failed for r in rows)


def test_the_tolerance_is_a_parameter():
    now = {**SHIPPED, "accuracy.logo.linear": 27.3 + 1.5}
    assert any(r.failed for r in R.compare(SHIPPED, now, tolerance=1.0))
    assert not any(r.failed for r in R.compare(SHIPPED, now, tolerance=2.0))


def test_a_new_figure_is_reported_not_failed():
    rows = R.compare(SHIPPED, {**SHIPPED, "e2e.logo.H100-SXM5-80GB.inf": 99.0})
    assert _status(rows, "e2e.logo.H100-SXM5-80GB.inf") == "new"
    assert not any(r.failed for r in rows)
    assert "1 new" in R.verdict(rows, 2.0)
    assert "e2e.logo.H100-SXM5-80GB.inf" in R.format_table(rows)


def test_a_shipped_figure_no_longer_produced_fails():
    now = {k: v for k, v in SHIPPED.items() if k != "e2e.logo.all"}
    rows = R.compare(SHIPPED, now)
    assert _status(rows, "e2e.logo.all") == "MISSING"
    assert any(r.failed for r in rows)


def test_the_table_shows_shipped_now_and_change():
    table = R.format_table(R.compare(SHIPPED, {**SHIPPED, "accuracy.logo.linear": 29.8}))
    line = next(x for x in table.splitlines() if x.startswith("accuracy.logo.linear"))
    assert line.split() == ["accuracy.logo.linear", "27.30", "29.80", "+2.50", "WORSE"]
    table = R.format_table(R.compare(SHIPPED, {**SHIPPED, "new.figure": 1.0}))
    lines = table.splitlines()
    assert len({len(x) - len(x.split()[-1]) for x in lines if x[0] != "-"}) == 1  # aligned


def test_figures_round_trip_through_the_file(tmp_path):
    path = tmp_path / "figures" / "shipped.json"
    R.write_figures(path, {"a": 1.234567, "b": 2.0}, "python -m benchmarks.regression --update")
    doc = json.loads(path.read_text())
    assert doc["figures"] == {"a": 1.23, "b": 2.0}
    assert doc["command"] == "python -m benchmarks.regression --update"
    assert doc["date"]
    assert R.load_figures(path) == {"a": 1.23, "b": 2.0}


@pytest.mark.parametrize("content", [
    "{\"figures\": {\"a\": 1.0",                       # truncated
    "[1, 2]",                                          # not an object
    "{\"command\": \"x\"}",                            # no figures
    "{\"figures\": {\"a\": \"12 %\"}}",                # not a number
    "{\"figures\": {\"a\": NaN}}",                     # not finite
    "\udcff".encode("utf-8", "surrogateescape"),       # not UTF-8
])
def test_a_corrupt_file_is_an_error_naming_it(tmp_path, content):
    path = tmp_path / "shipped.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    with pytest.raises(FileFormatError) as info:
        R.load_figures(path)
    message = str(info.value)
    assert str(path) in message and "\n" not in message


def test_the_command_exits_2_with_one_line_on_a_corrupt_or_missing_file(tmp_path, capsys):
    now = _write(tmp_path / "now.json", SHIPPED)
    corrupt = tmp_path / "shipped.json"
    corrupt.write_text("{not json")
    for path in (corrupt, tmp_path / "missing.json"):
        assert R.main(["--shipped", str(path), "--now", str(now)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("error: ") and str(path) in err


def test_the_command_exit_status(tmp_path, capsys):
    shipped = _write(tmp_path / "shipped.json", SHIPPED)
    cases = [({**SHIPPED, "accuracy.logo.linear": 27.3 + 2.5}, 1),
             ({**SHIPPED, "accuracy.logo.linear": 27.3 + 1.5}, 0),
             ({**SHIPPED, "accuracy.logo.linear": 10.0, "e2e.in-dist.all": 8.0}, 0)]
    for i, (figures, code) in enumerate(cases):
        now = _write(tmp_path / f"now{i}.json", figures)
        assert R.main(["--shipped", str(shipped), "--now", str(now)]) == code
        out = capsys.readouterr().out
        assert "shipped" in out and "change" in out
    now = _write(tmp_path / "now.json", {**SHIPPED, "accuracy.logo.linear": 27.3 + 2.5})
    assert R.main(["--shipped", str(shipped), "--now", str(now), "--tolerance", "3"]) == 0


def test_accuracy_figures_are_the_learned_columns_of_the_accuracy_table():
    """Same selection and averaging as accuracy.table (P4 out of the LOGO mean)."""
    from benchmarks import accuracy as A

    rng = np.random.default_rng(0)
    rows = []
    for model in ("learned", "analytical"):
        for fam in A.FAMILIES:
            if fam != "conv":
                rows.append({"split": "test", "gpu": "all", "model": model, "family": fam,
                             "n": 10, "mape": rng.uniform(1, 50), "p90": 1.0})
            for gpu in ("A100-PCIE-40GB", "P4", "T4", "V100-PCIE-32GB"):
                rows.append({"split": "logo", "gpu": gpu, "model": model, "family": fam,
                             "n": 10, "mape": rng.uniform(1, 200), "p90": 1.0})
    df = pd.DataFrame(rows)
    figures = R.accuracy_figures(df)
    lines = A.table(df).splitlines()
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    for line in lines[2:]:
        cells = dict(zip(head, (c.strip() for c in line.strip("|").split("|"))))
        fam = cells["family"]
        assert f"{figures[f'accuracy.logo.{fam}']:.1f}" == cells["learned LOGO"]
        if fam == "conv":
            assert cells["learned test"] == "-" and "accuracy.in-dist.conv" not in figures
        else:
            assert f"{figures[f'accuracy.in-dist.{fam}']:.1f}" == cells["learned test"]
    assert len(figures) == 2 * len(A.FAMILIES) - 1


def test_e2e_figures_come_from_the_harness_summary():
    from benchmarks import e2e as E

    df = pd.DataFrame({"gpu": ["T4", "T4", "V100", "V100"], "mode": ["inf", "inf", "inf", "train"],
                       "err_pct": [10.0, -20.0, 4.0, -6.0]})
    summary = E.summary_frame(df)
    assert R.e2e_figures(summary, "logo") == pytest.approx(
        {"e2e.logo.T4.inf": 15.0, "e2e.logo.V100.inf": 4.0, "e2e.logo.V100.train": 6.0,
         "e2e.logo.all": 10.0})
    assert R.e2e_figures(summary, "in-dist") == pytest.approx(
        {"e2e.in-dist.inf": 34.0 / 3, "e2e.in-dist.train": 6.0, "e2e.in-dist.all": 10.0})


def test_training_is_shared_between_identical_sample_sets():
    from predictor.calibration import datasets as D
    from predictor.calibration import train as T

    calls = []

    def fake_train(samples, *, seed=0, epochs=60, groups=None, group_cache=None):
        calls.append((len(samples), seed, groups))
        return np.full(3, float(len(calls)))

    def samples(n, shift=0):
        return D.OpSamples(np.array(["add"] * n, dtype=object), np.zeros(n, np.int64),
                           np.arange(n * 11, dtype=np.int64).reshape(n, 11) + shift,
                           np.array(["T4"] * n, dtype=object), np.ones(n))

    train = R.trained_once(fake_train)
    a = train(samples(5), seed=0, epochs=60)
    b = train(samples(5), seed=0, epochs=60, groups=tuple(range(T.N_GROUPS)))  # every group = None
    assert a is b and len(calls) == 1
    train(samples(5, shift=1), seed=0, epochs=60)   # other samples
    train(samples(5), seed=1, epochs=60)            # other seed
    assert len(calls) == 3


def test_a_group_is_fitted_once_for_sample_sets_that_share_its_rows(monkeypatch):
    """Leave-one-GPU-out sets of a GPU without files of an op share that op's
    rows: with a group cache its network is fitted once."""
    from predictor.calibration import datasets as D
    from predictor.calibration import train as T
    from predictor.kernels import layout as L
    from predictor.kernels.features import G_CONV, G_ELEMENTWISE, N_FEATURES

    fitted = []

    def fake_fit(plan, **kw):
        out = {}
        for group, samples, _ in plan:
            fitted.append((group, len(samples)))
            out[group] = T.GroupModel(group, np.zeros(N_FEATURES), np.ones(N_FEATURES),
                                      [(np.zeros((2, N_FEATURES)), np.zeros(2)),
                                       (np.zeros((2, 2)), np.zeros(2)), (np.zeros(2), 0.0)],
                                      1.0, 1.0)
        return out

    monkeypatch.setattr(T, "fit_distilled_groups", fake_fit)

    def rows(family, gpu, n=60):
        dims = np.ones((n, L.MAX_DIMS), dtype=np.int64) * 8
        return D.OpSamples(np.array(["x"] * n, dtype=object), np.full(n, family, np.int64),
                           dims + np.arange(n)[:, None], np.array([gpu] * n, dtype=object),
                           np.ones(n))

    elem = D.OpSamples.concat([rows(L.ELEMENTWISE, "T4"), rows(L.ELEMENTWISE, "P4")])
    conv_a, conv_b = rows(L.CONV, "T4"), rows(L.CONV, "P4")
    cache = {}
    T.train(D.OpSamples.concat([elem, conv_a]), chips=False, group_cache=cache)
    T.train(D.OpSamples.concat([elem, conv_b]), chips=False, group_cache=cache)
    assert [g for g, _ in fitted].count(G_ELEMENTWISE) == 1
    assert [g for g, _ in fitted].count(G_CONV) == 2
    T.train(D.OpSamples.concat([elem, conv_a]), chips=False)  # no cache: fitted again
    assert [g for g, _ in fitted].count(G_ELEMENTWISE) == 2


def test_the_band_figure_is_the_90th_percentile_of_every_label():
    df = pd.DataFrame({"err_pct": [float(x) for x in range(-10, 0)]})
    assert R.band_figure(df, "logo") == pytest.approx({"e2e.logo.p90": 9.1})


def test_a_quoted_band_narrower_than_measured_fails():
    now = {"e2e.in-dist.p90": 9.9, "e2e.logo.p90": 25.0}
    problems = R.quoted_band_problems(now, {"trained": 9.9, "unseen": 20.2}, tolerance=2.0)
    assert len(problems) == 1 and "'unseen'" in problems[0] and "25" in problems[0]
    # Wider than measured (the models got better) is not a problem, nor a band not quoted.
    assert R.quoted_band_problems({"e2e.logo.p90": 15.0}, {"unseen": 20.2}) == []
    assert R.quoted_band_problems(now, {}) == []


def test_the_shipped_bands_are_the_shipped_figures():
    """The `trained` band is the gate's in-distribution p90; the `unseen`
    band, drawn from the leave-one-GPU-out labels and the published fp32
    figures on boards outside the data (benchmarks.expected_error), is no
    narrower than the gate's leave-one-GPU-out p90 alone."""
    from predictor import expected_error

    quoted = expected_error.shipped()
    figures = R.load_figures(R.SHIPPED)
    for name, standing in R.QUOTED_BANDS.items():
        if standing in quoted and name in figures:
            if standing == "unseen":
                assert quoted[standing] >= figures[name] - 0.05
            else:
                assert quoted[standing] == pytest.approx(figures[name], abs=0.05)
