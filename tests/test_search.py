"""Design-space search: ranking by objective, the memory fit filter, the Pareto
front, prices and their overrides, training runs, data parallelism, the HTML
report (rendered in headless Chromium when it is installed) and the CLI."""

import json
import math
import shutil
import subprocess

import numpy as np
import pytest
import torch
import torch.nn as nn

import predictor
from predictor import hardware, parallel
from predictor import report as report_mod
from predictor.cli import main
from predictor.design_search import load_prices, parse_price

GPUS = ["T4", "L4", "A10G", "V100-SXM2-32GB", "A100-SXM4-80GB", "H100-SXM5-80GB", "MI300X"]
BATCHES = [1, 4, 16, 64, 256, 1024, 16384]


def _model():
    return nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1),
                         nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))


@pytest.fixture(scope="module")
def graph():
    return predictor.trace(_model(), (torch.randn(8, 3, 64, 64),))


@pytest.fixture(scope="module")
def saved_graph(graph, tmp_path_factory):
    return str(graph.save(tmp_path_factory.mktemp("g") / "small.npz"))


def _key(df, objective, run=False):
    if objective == "throughput":
        return -df["samples_per_s"]
    if objective == "cost":
        return df["run_cost_usd" if run else "usd_per_1m_samples"]
    return df["run_hours" if run else "hours_per_1m_samples"]


@pytest.mark.parametrize("objective", ["time", "cost", "throughput"])
def test_ranking_follows_objective(graph, objective):
    r = predictor.search(graph, objective=objective, gpus=GPUS, batch_sizes=BATCHES)
    t = r.to_pandas()
    assert len(t) == len(GPUS) * len(BATCHES)
    assert t["rank"].tolist() == list(range(1, len(t) + 1))
    ok = (t["fits"] & t["feasible"]).to_numpy()
    # Every fitting configuration ranks above every one that does not fit.
    assert not (np.diff(ok.astype(int)) > 0).any()
    key = _key(t[ok], objective).to_numpy()
    assert (np.diff(key) >= -1e-12 * np.abs(key[:-1])).all()
    best = r.best()
    assert best is not None and best["rank"] == 1


def test_fits_filter(graph):
    r = predictor.search(graph, gpus=GPUS, batch_sizes=BATCHES, objective="throughput")
    t = r.to_pandas()
    assert (t["fits"] == (t["memory_gb"] <= t["memory_limit_gb"])).all()
    assert not t["fits"].all(), "batch 16384 of 64x64 images should not fit a T4"
    fit = r.fitting()
    assert fit["fits"].all() and len(fit) == int(t["fits"].sum())
    # The largest batch that fits per GPU agrees with the table.
    for gpu, b in r.max_batch_sizes.items():
        rows = t[t["gpu"] == gpu]
        assert rows[rows["batch_size"] <= b]["fits"].all()
        assert not rows[rows["batch_size"] > b]["fits"].any()
    # A smaller headroom fraction never lets more configurations fit.
    tight = predictor.search(graph, gpus=GPUS, batch_sizes=BATCHES, max_memory_fraction=0.3)
    assert tight.to_pandas()["fits"].sum() < t["fits"].sum()


def test_nothing_fits(graph):
    r = predictor.search(graph, gpus=["T4"], batch_sizes=[1 << 16])
    assert r.best() is None and r.fitting().empty and r.pareto().empty


def test_pareto_front_non_dominated(graph):
    r = predictor.search(graph, objective="cost", gpus=GPUS, batch_sizes=BATCHES)
    front = r.pareto()
    assert not front.empty
    tc, cc = r.time_column, r.cost_column
    pts = front[[tc, cc]].to_numpy()
    for i, a in enumerate(pts):
        for j, b in enumerate(pts):
            if i != j:
                assert not (b[0] <= a[0] and b[1] <= a[1] and (b[0] < a[0] or b[1] < a[1]))
    # Every other fitting, priced configuration is weakly dominated by the front.
    for _, row in r.fitting().iterrows():
        assert ((pts[:, 0] <= row[tc] + 1e-12) & (pts[:, 1] <= row[cc] + 1e-12)).any()
    # Fastest first, cheapest last.
    assert (np.diff(pts[:, 0]) >= 0).all() and (np.diff(pts[:, 1]) < 0).all()


def test_price_override(graph):
    base = predictor.search(graph, objective="cost", gpus=GPUS, batch_sizes=[64])
    cheap = predictor.search(graph, objective="cost", gpus=GPUS, batch_sizes=[64],
                             prices={"h100": 0.01})  # an alias resolves to the id
    row = cheap.to_pandas().set_index("gpu").loc["H100-SXM5-80GB"]
    assert row["usd_per_hour"] == 0.01
    assert cheap.best()["gpu"] == "H100-SXM5-80GB"
    assert cheap.price_info["H100-SXM5-80GB"]["source"] == "override"
    spec = hardware.get("H100-SXM5-80GB").price_per_hour
    assert base.price_info["H100-SXM5-80GB"]["usd_per_gpu_hour"] == spec
    with pytest.raises(predictor.InvalidArgumentError, match="price"):
        predictor.search(graph, gpus=GPUS, batch_sizes=[64], prices={"T4": -1})
    with pytest.raises(predictor.UnknownGPUError):
        predictor.search(graph, gpus=GPUS, batch_sizes=[64], prices={"no-such-gpu": 1.0})


def test_price_parsing_and_files(tmp_path):
    assert parse_price("H100-SXM5-80GB=2.49") == ("H100-SXM5-80GB", 2.49)
    for bad in ("H100", "=2", "T4=cheap"):
        with pytest.raises(predictor.InvalidArgumentError):
            parse_price(bad)
    toml = tmp_path / "p.toml"
    toml.write_text('T4 = 0.1\n"A100-SXM4-80GB" = 1.5\n')
    assert load_prices(toml) == {"T4": 0.1, "A100-SXM4-80GB": 1.5}
    js = tmp_path / "p.json"
    js.write_text(json.dumps({"prices": {"L4": 0.5}}))
    assert load_prices(js) == {"L4": 0.5}
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(predictor.InvalidArgumentError, match="not a valid JSON"):
        load_prices(bad)
    with pytest.raises(predictor.InvalidArgumentError, match="cannot read"):
        load_prices(tmp_path / "missing.toml")


def test_training_run(graph):
    r = predictor.search(graph, objective="cost", gpus=["T4", "L4"], batch_sizes=[16, 64],
                         samples=50_000, epochs=3)
    t = r.to_pandas()
    iters = np.ceil(50_000 * 3 / t["global_batch"])
    assert np.allclose(t["run_iterations"], iters)
    assert np.allclose(t["run_hours"], iters * t["iteration_ms"] / 3.6e6)
    assert np.allclose(t["run_cost_usd"], t["run_hours"] * t["usd_per_hour"])
    fixed = predictor.search(graph, gpus=["T4"], batch_sizes=[16], iterations=1000)
    row = fixed.to_pandas().iloc[0]
    assert row["run_hours"] == pytest.approx(1000 * row["iteration_ms"] / 3.6e6)
    with pytest.raises(predictor.InvalidArgumentError, match="not both"):
        predictor.search(graph, gpus=["T4"], batch_sizes=[16], samples=10, iterations=5)
    with pytest.raises(predictor.InvalidArgumentError, match="epochs needs samples"):
        predictor.search(graph, gpus=["T4"], batch_sizes=[16], epochs=2)


def test_constraints(graph):
    r = predictor.search(graph, gpus=GPUS, batch_sizes=[64],
                         constraints={"max_usd_per_hour": 1.0})
    t = r.to_pandas()
    assert (t["feasible"] == (t["usd_per_hour"] <= 1.0)).all()
    assert (r.fitting()["usd_per_hour"] <= 1.0).all()
    with pytest.raises(predictor.InvalidArgumentError, match="unknown constraint"):
        predictor.search(graph, gpus=GPUS, batch_sizes=[64], constraints={"max_fun": 1})
    with pytest.raises(predictor.InvalidArgumentError, match="needs a run"):
        predictor.search(graph, gpus=GPUS, batch_sizes=[64], constraints={"max_hours": 1})
    with pytest.raises(predictor.InvalidArgumentError, match="objective"):
        predictor.search(graph, objective="speed")


def test_data_parallel(graph):
    one = predictor.search(graph, gpus=["A100-SXM4-80GB", "T4"], batch_sizes=[16, 256])
    eight = predictor.search(graph, gpus=["A100-SXM4-80GB", "T4"], batch_sizes=[16, 256],
                             gpus_per_node=8)
    a = one.to_pandas().set_index(["gpu", "batch_size"]).sort_index()
    b = eight.to_pandas().set_index(["gpu", "batch_size"]).sort_index()
    assert (b["global_batch"] == 8 * a["global_batch"]).all()
    assert np.allclose(b["usd_per_hour"], 8 * a["usd_per_hour"])
    assert (b["comm_ms"] > 0).all() and np.allclose(b["compute_ms"], a["iteration_ms"])
    assert ((b["scaling_efficiency"] > 0) & (b["scaling_efficiency"] <= 1)).all()
    # DDP buckets hold a copy of the gradients.
    assert (b["memory_gb"] > a["memory_gb"]).all()
    with pytest.raises(predictor.InvalidArgumentError, match="gpus_per_node"):
        predictor.search(graph, gpus=["T4"], batch_sizes=[1], gpus_per_node=0)


def test_allreduce_model():
    h100 = hardware.get("H100-SXM5-80GB")
    t4 = hardware.get("T4")
    g = 100e6  # bytes of gradients
    assert parallel.allreduce_ms(g, 1, h100) == 0.0
    # Ring volume 2(N-1)/N: 8 GPUs move 1.75x the gradients; NVLink beats PCIe.
    t8 = parallel.allreduce_ms(g, 8, h100)
    buckets = math.ceil(g / parallel.BUCKET_BYTES)
    latency_ms = buckets * 2 * 7 * parallel.HOP_LATENCY_US * 1e-3
    assert t8 == pytest.approx(1.75 * g / (450e9 * parallel.ALLREDUCE_EFFICIENCY) * 1e3
                               + latency_ms, rel=1e-9)
    assert parallel.allreduce_ms(g, 8, t4) > 10 * t8
    # A long backward hides everything but the last bucket; a short one hides little.
    k = math.ceil(g / parallel.BUCKET_BYTES)
    long_bwd = parallel.exposed_comm_ms(np.array([1e4]), g, 8, t4)[0]
    assert long_bwd == pytest.approx(parallel.allreduce_ms(g, 8, t4) / k)
    short_bwd = parallel.exposed_comm_ms(np.array([0.0]), g, 8, t4)[0]
    assert short_bwd == pytest.approx(parallel.allreduce_ms(g, 8, t4))


def test_report_files(graph, tmp_path):
    r = predictor.search(graph, objective="cost", gpus=GPUS, batch_sizes=BATCHES,
                         samples=100_000, epochs=2)
    path = report_mod.write_report(r, tmp_path / "rep", graph)
    text = path.read_text()
    assert text.startswith("<!DOCTYPE html>") and text.count("data:image/png;base64,") == 4
    assert "http://" not in text and "https://" not in text  # self-contained
    data = json.loads((tmp_path / "rep" / "search.json").read_text())
    assert len(data["configurations"]) == len(GPUS) * len(BATCHES)
    assert data["pareto"] and data["max_batch_sizes"]
    assert not list((tmp_path / "rep").glob(".*.tmp"))  # atomic writes leave no temp files


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


def test_report_renders_in_headless_chromium(graph, tmp_path):
    browser = _chromium()
    if browser is None:
        pytest.skip("chromium is not installed (Debian: apt-get install chromium)")
    r = predictor.search(graph, objective="time", gpus=GPUS, batch_sizes=BATCHES)
    html = report_mod.write_report(r, tmp_path / "rep", graph)
    shot = tmp_path / "shot.png"
    proc = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--hide-scrollbars",
         "--window-size=1200,2400", f"--screenshot={shot}", html.resolve().as_uri()],
        capture_output=True, timeout=180)
    assert shot.exists(), proc.stderr.decode(errors="replace")[-2000:]
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 50_000  # a page with plots, not blank


def test_cli_search(saved_graph, tmp_path, capsys):
    assert main(["search", saved_graph, "--gpus", "T4,L4,H100", "-b", "1..256",
                 "--objective", "cost", "--price", "L4=0.01", "--top", "5"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert "$/1M samples" in lines[2] and "mem GiB" in lines[2]
    assert "L4" in lines[4]  # the first row: the cheapest, at the overridden price
    assert main(["search", saved_graph, "--gpus", "T4,L4", "-b", "8,16", "--json",
                 "--samples", "1000", "--epochs", "2", "--gpus-per-node", "4"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["gpus_per_node"] == 4 and data["configurations"][0]["global_batch"] in (32, 64)
    assert main(["search", saved_graph, "--gpus", "T4", "-b", "8", "--csv"]) == 0
    assert capsys.readouterr().out.startswith("model,rank,gpu")
    prices = tmp_path / "prices.toml"
    prices.write_text("T4 = 9.0\n")
    rep = tmp_path / "rep"
    assert main(["search", saved_graph, "--gpus", "T4", "-b", "8", "--price", str(prices),
                 "--report", str(rep), "--constraint", "max_usd_per_hour=10"]) == 0
    assert (rep / "report.html").exists() and (rep / "search.json").exists()
    assert json.loads((rep / "search.json").read_text())["prices"]["T4"]["usd_per_gpu_hour"] == 9.0


@pytest.mark.parametrize("argv,message", [
    (["--price", "T4"], "cannot read price file"),
    (["--price", "T4=abc"], "is not a number"),
    (["--price", "nope=1"], "unknown GPU"),
    (["--constraint", "max_hours"], "NAME=NUMBER"),
    (["--constraint", "max_hours=3"], "needs a run"),
    (["--iterations", "10", "--samples", "5"], "not both"),
])
def test_cli_errors_are_one_line(saved_graph, capsys, argv, message):
    assert main(["search", saved_graph, "--gpus", "T4", "-b", "8", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
