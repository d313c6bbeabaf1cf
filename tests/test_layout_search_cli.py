"""`predictor search MODEL --n-gpus N --global-batch B`: every layout ranked,
with a column for every choice, JSON/CSV like the other commands, one-line
errors, and the HTML report's time split and memory per GPU."""

from __future__ import annotations

import io
import json

import pandas as pd
import pytest

from predictor.cli import main

from test_llama import llama_graph  # the same module object pytest imported (one trace)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    path = tmp_path_factory.mktemp("g") / "llama2l.npz"
    llama_graph().save(path)
    return str(path)


def _run(argv, capsys):
    try:
        rc = main(argv)
    except SystemExit as e:
        rc = e.code
    out = capsys.readouterr()
    return rc, out.out, out.err


ARGS = ["--n-gpus", "8", "--global-batch", "16", "--max-micro-batch", "4",
        "--zero", "0,3", "--checkpoint", "none,full"]


def test_json_rows_carry_every_choice(saved, capsys):
    rc, out, _ = _run(["search", saved, *ARGS, "--json"], capsys)
    assert rc == 0
    data = json.loads(out)
    assert data["n_gpus"] == 8 and data["global_batch"] == 16 and data["amp"] == "bf16"
    rows = data["layouts"]
    assert rows and [r["rank"] for r in rows] == list(range(1, len(rows) + 1))
    for r in rows:
        assert r["gpu"] == "H100-SXM5-80GB" and r["dp"] * r["tp"] * r["pp"] == 8
        assert r["micro_batch"] * r["microbatches"] * r["dp"] == 16
        assert r["zero"] in (0, 3) and r["checkpoint"] in (None, "full")
        assert r["micro_batch"] <= 4
        assert r["iteration_ms"] == pytest.approx(r["compute_ms"] + r["comm_ms"]
                                                  + r["bubble_ms"] + r["optimizer_ms"])
        assert r["iteration_ms"] > 0 and r["memory_gb"] > 0
        assert r["fits"] == (r["memory_gb"] <= r["memory_limit_gb"])
    fit = [r["iteration_ms"] for r in rows if r["fits"]]
    assert fit == sorted(fit) and all(r["fits"] for r in rows[:len(fit)])
    # every (tp, pp) that divides 8 with tp within a node
    assert {(r["tp"], r["pp"]) for r in rows} == {(1, 1), (2, 1), (4, 1), (8, 1), (1, 2),
                                                 (2, 2), (4, 2)}


def test_table_and_csv(saved, capsys):
    rc, out, _ = _run(["search", saved, *ARGS, "--top", "5"], capsys)
    assert rc == 0
    for col in ("dp", "tp", "pp", "micro", "mbs", "zero", "ckpt", "compute", "comm", "bubble",
                "GiB/GPU", "fits", "tokens/s"):
        assert col in out
    rc, out, _ = _run(["search", saved, *ARGS, "--csv"], capsys)
    df = pd.read_csv(io.StringIO(out))
    assert rc == 0 and {"dp", "tp", "pp", "microbatches", "micro_batch", "zero", "checkpoint",
                        "iteration_ms", "comm_ms", "bubble_ms", "memory_gb", "fits"} <= set(df)


def test_cost_objective_and_several_gpus(saved, capsys):
    rc, out, _ = _run(["search", saved, *ARGS, "--gpus", "H100-SXM5-80GB,A100-SXM4-80GB",
                       "--objective", "cost", "--json"], capsys)
    rows = json.loads(out)["layouts"]
    assert rc == 0 and {r["gpu"] for r in rows} == {"H100-SXM5-80GB", "A100-SXM4-80GB"}
    cost = [r["usd_per_step"] for r in rows if r["fits"]]
    assert cost == sorted(cost)


@pytest.mark.parametrize("extra, match", [
    (["--n-gpus", "8"], "both --n-gpus and --global-batch"),
    (["--n-gpus", "8", "--global-batch", "16", "-b", "1,2"], "--batch-sizes cannot"),
    (["--n-gpus", "8", "--global-batch", "16", "--zero", "5"], "--zero"),
    (["--n-gpus", "8", "--global-batch", "16", "--checkpoint", "some"], "--checkpoint"),
    (["--n-gpus", "0", "--global-batch", "16"], "n-gpus"),
])
def test_errors_are_one_line(saved, capsys, extra, match):
    rc, _, err = _run(["search", saved, *extra], capsys)
    assert rc == 2 and err.strip().count("\n") == 0 and match in err


def test_report_shows_time_split_and_memory_per_gpu(saved, capsys, tmp_path):
    pytest.importorskip("matplotlib")
    rc, out, _ = _run(["search", saved, *ARGS, "--report", str(tmp_path)], capsys)
    assert rc == 0
    text = (tmp_path / "report.html").read_text()
    data = json.loads((tmp_path / "layouts.json").read_text())
    assert text.count("data:image/png;base64,") == 2
    for label in ("compute ms", "comm ms", "bubble ms", "GiB/GPU", "Best layout"):
        assert label in text
    best = data["layouts"][0]
    assert set(best["memory_parts_gb"]) == {"model_states", "activations", "weight_copies",
                                            "transient", "gathered_params", "context_workspace"}
    assert sum(best["memory_parts_gb"].values()) == pytest.approx(best["memory_gb"])


def test_huge_and_empty_searches_answer_quickly(saved, capsys):
    import time

    t = time.time()
    rc, out, _ = _run(["search", saved, "--n-gpus", "1048576", "--global-batch", "1073741824",
                       "--json"], capsys)
    rows = json.loads(out)["layouts"]
    assert rc == 0 and rows and all(r["dp"] * r["tp"] * r["pp"] == 1048576 for r in rows)
    # 1009 GPUs (prime) cannot split a global batch of 4: no layout, said in the table
    rc, out, _ = _run(["search", saved, "--n-gpus", "1009", "--global-batch", "4"], capsys)
    assert rc == 0 and "0 layouts" in out and "no layout: no dp x tp x pp of 1,009 GPUs" in out
    assert time.time() - t < 60


def test_too_many_layouts_is_one_line(saved, capsys, monkeypatch):
    from predictor import layouts

    monkeypatch.setattr(layouts, "MAX_LAYOUTS", 10)
    rc, _, err = _run(["search", saved, *ARGS], capsys)
    assert rc == 2 and "narrow the search" in err and err.strip().count("\n") == 0
