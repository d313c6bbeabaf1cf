"""predictor.Space / predictor.explore / `predictor explore`: many candidate
models on the local process pool (and on Ray, when installed), streamed to
part files, resumed after a kill, failures recorded, constraints and ranking."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch

import predictor
from predictor.errors import InvalidArgumentError, MissingExtraError
from predictor.exploration import PARTS, Space, explore, read_parts

GPUS = ["T4", "H100-SXM5-80GB"]


def mlp(depth=1, width=16, fail=False, kill_marker=None, sleep=0.0):
    """A tiny family: `fail` raises, `kill_marker` kills the worker process the
    first time (the marker file records that it did)."""
    if fail:
        raise ValueError("this candidate cannot be built")
    if kill_marker is not None and not os.path.exists(kill_marker):
        Path(kill_marker).write_text(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGKILL)
    if sleep:
        time.sleep(sleep)
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers), (torch.zeros(4, width),)


def always_dies():
    os.kill(os.getpid(), signal.SIGKILL)


def part_keys(out: Path) -> list[str]:
    keys = []
    for p in sorted((out / PARTS).glob("part-*.jsonl")):
        keys += [json.loads(line)["key"] for line in p.read_text().splitlines()]
    return keys


# ---- Space --------------------------------------------------------------------

def test_space_grid_list_and_errors():
    s = Space(mlp, {"depth": [1, 2, 3], "width": (8, 16)})
    assert len(s) == 6 and s.configs[0] == {"depth": 1, "width": 8} \
        and s.configs[-1] == {"depth": 3, "width": 16}
    # An explicit list; equal configs are one candidate.
    s = Space(mlp, [{"depth": 1}, {"depth": 2}, {"depth": 1}])
    assert s.configs == [{"depth": 1}, {"depth": 2}]
    assert len(Space(mlp)) == 1
    bad = [
        (lambda: Space(3, {"a": [1]}), "factory"),
        (lambda: Space(mlp, {"depth": 3}), "must be a list"),
        (lambda: Space(mlp, {"depth": "abc"}), "must be a list"),
        (lambda: Space(mlp, {"depth": []}), "no value"),
        (lambda: Space(mlp, []), "no candidate"),
        (lambda: Space(mlp, [{"depth": float("nan")}]), "JSON"),
        (lambda: Space(mlp, [{"depth": object()}]), "JSON"),
        (lambda: Space(mlp, [{1: 2}]), "argument names"),
        (lambda: Space(mlp, [3]), "dict"),
        (lambda: Space(mlp, {"a": range(10**4), "b": range(10**4)}), "more than"),
    ]
    for make, words in bad:
        with pytest.raises(InvalidArgumentError, match=words) as exc:
            make()
        assert "\n" not in str(exc.value)


def test_explore_arguments_are_checked(tmp_path):
    s = Space(mlp)
    for kwargs, words in [({"objective": "speed"}, "objective"),
                          ({"executor": "dask"}, "executor"),
                          ({"constraints": {"latency": 3}}, "unknown constraint"),
                          ({"constraints": {"memory_fraction": 1.5}}, "memory_fraction"),
                          ({"constraints": {"latency_ms": "x"}}, "number"),
                          ({"gpus": ["NoSuchGPU"]}, "NoSuchGPU"),
                          ({"batch_sizes": [0]}, "positive"),
                          ({"workers": 0}, "workers"),
                          ({"chunk_size": 0}, "chunk_size")]:
        with pytest.raises(predictor.PredictorError, match=words):
            explore(s, **kwargs)
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(InvalidArgumentError, match="not a folder"):
        explore(s, out=f)


# ---- local executor, end to end ------------------------------------------------

@pytest.fixture(scope="module")
def local_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("explore") / "run"
    space = Space(mlp, [{"depth": 1, "width": 16}, {"depth": 2, "width": 16},
                        {"depth": 3, "width": 64}, {"fail": True},
                        {"depth": 2, "width": 16, "sleep": 0.0}])  # the same network as #2
    res = explore(space, gpus=GPUS, batch_sizes=[8, 32], objective="throughput",
                  constraints={"latency_ms": 1e9}, workers=2, out=out)
    return space, out, res


def test_local_end_to_end(local_run):
    space, out, res = local_run
    df = res.to_pandas()
    assert res.candidates == 5 and res.computed == 5 and res.reused == 0
    assert len(df) == 4 * 2 * 2  # ok candidates x GPUs x batch sizes
    for col in ("rank", "config", "params", "flops", "gpu", "batch_size", "iteration_ms",
                "samples_per_s", "memory_gb", "fits", "usd_per_1m_samples"):
        assert col in df.columns
    assert list(df["rank"]) == list(range(1, len(df) + 1))
    assert all(math.isfinite(x) and x > 0 for x in df["iteration_ms"])
    assert all(math.isfinite(x) and x > 0 for x in df["samples_per_s"])
    # Best first: fitting rows by samples/s, descending.
    ok = df[df["fits"] & df["feasible"]]
    assert len(ok) == len(df)
    assert list(ok["samples_per_s"]) == sorted(ok["samples_per_s"], reverse=True)
    # Params and FLOPs are the candidate's own: FLOPs grow with the batch.
    two = df[df["config"].apply(lambda c: c == {"depth": 2, "width": 16})]
    assert set(two["params"]) == {2 * (16 * 16 + 16)}
    f8 = two[two["batch_size"] == 8]["flops"].iloc[0]
    f32 = two[two["batch_size"] == 32]["flops"].iloc[0]
    assert f32 > 3 * f8  # forward and backward scale with the batch, the optimizer does not
    # The failing candidate: recorded with a one-line error, not fatal.
    assert res.failed == 1
    err = res.failures.iloc[0]["error"]
    assert "cannot be built" in err and "\n" not in err
    assert res.failures.iloc[0]["config"] == {"fail": True}
    # Streamed to atomically written part files: each candidate exactly once.
    keys = part_keys(out)
    assert len(keys) == 5 and len(set(keys)) == 5
    assert not list((out / PARTS).glob(".*"))  # no temp file left


def test_candidates_of_one_structure_share_a_trace(tmp_path):
    # `sleep` changes the config, not the network: one trace, then shared.
    space = Space(mlp, [{"depth": 2}, {"depth": 2, "sleep": 0.0}, {"depth": 2, "sleep": 1e-9}])
    res = explore(space, gpus=["T4"], batch_sizes=[8], workers=1, out=tmp_path / "a")
    assert res.graph_sources == {"traced": 1, "memory": 2}
    assert res.to_pandas()["iteration_ms"].nunique() == 1
    # Another process finds the traced graph in the run's graph folder.
    res = explore(Space(mlp, [{"depth": 2, "sleep": 2e-9}]), gpus=["T4"], batch_sizes=[8],
                  workers=1, graph_cache=tmp_path / "a" / "graphs")
    assert res.graph_sources == {"disk": 1}
    # Different shapes: different graphs.
    res = explore(Space(mlp, [{"depth": 2}, {"depth": 2, "width": 32}]), gpus=["T4"],
                  batch_sizes=[8], workers=1)
    assert res.graph_sources == {"traced": 2}


def test_amp_traces_each_candidate_under_autocast():
    """--amp: the candidates are traced under autocast, as predictor.trace(amp=)
    does, and an AMP graph is not shared with an fp32 one of the same model."""
    space = Space(mlp, [{"depth": 2, "width": 256}])
    res = explore(space, gpus=["H100-SXM5-80GB"], batch_sizes=[4096], workers=1, amp="bf16")
    g = predictor.trace(lambda: mlp(depth=2, width=256), amp="bf16")
    direct = predictor.search(g, gpus=["H100-SXM5-80GB"], batch_sizes=[4096]).table
    amp_ms = res.to_pandas()["iteration_ms"].iloc[0]
    assert amp_ms == pytest.approx(float(direct["iteration_ms"].iloc[0]), rel=1e-9)
    fp32 = explore(space, gpus=["H100-SXM5-80GB"], batch_sizes=[4096], workers=1)
    assert fp32.to_pandas()["iteration_ms"].iloc[0] != pytest.approx(amp_ms, rel=1e-3)
    with pytest.raises(InvalidArgumentError, match="unknown amp"):
        explore(space, gpus=["T4"], amp="int8")
    with pytest.raises(InvalidArgumentError, match="T4 has none"):
        explore(space, gpus=["T4"], amp="fp8")
    with pytest.raises(InvalidArgumentError, match="drop dtype"):
        explore(space, gpus=["T4"], amp="bf16", dtype="float16")


def test_local_matches_a_direct_search(local_run):
    space, out, res = local_run
    g = predictor.trace(lambda: mlp(depth=3, width=64))
    direct = predictor.search(g, gpus=GPUS, batch_sizes=[8, 32], objective="throughput").table
    df = res.to_pandas()
    mine = df[df["config"].apply(lambda c: c == {"depth": 3, "width": 64})]
    for b in (8, 32):
        assert set(mine[mine["batch_size"] == b]["flops"]) == {sum(g.flops(b).values())}
    assert set(mine["params"]) == {g.parameters}
    for gpu in GPUS:
        for b in (8, 32):
            a = mine[(mine["gpu"] == gpu) & (mine["batch_size"] == b)]["iteration_ms"].iloc[0]
            d = direct[(direct["gpu"] == gpu) & (direct["batch_size"] == b)]
            assert a == pytest.approx(float(d["iteration_ms"].iloc[0]), rel=1e-9)


def test_resume_recomputes_nothing_and_constraints_apply_on_read(local_run):
    space, out, res = local_run
    before = part_keys(out)
    # The same run again, ranked by latency under a latency bound and a memory fraction.
    ms = sorted(res.to_pandas()["iteration_ms"])
    bound = ms[len(ms) // 2]
    again = explore(space, gpus=GPUS, batch_sizes=[8, 32], objective="latency",
                    constraints={"latency_ms": bound, "memory_fraction": 0.5}, workers=2, out=out)
    assert again.computed == 0 and again.reused == 5
    assert part_keys(out) == before  # nothing new written
    df = again.to_pandas()
    assert (df["feasible"] == (df["iteration_ms"] <= bound)).all()
    assert df["feasible"].any() and not df["feasible"].all()
    # Rows that fit and meet the bound come first, least latency first.
    good = (df["fits"] & df["feasible"]).tolist()
    assert good == sorted(good, reverse=True)
    head = df[df["fits"] & df["feasible"]]
    assert list(head["iteration_ms"]) == sorted(head["iteration_ms"])
    assert (df["memory_limit_gb"] < 60).any()  # half of each GPU's memory
    # A tiny memory fraction: nothing fits.
    none = explore(space, gpus=GPUS, batch_sizes=[8, 32], workers=1, out=out,
                   constraints={"memory_fraction": 1e-6})
    assert none.computed == 0 and none.best() is None and not none.to_pandas()["fits"].any()
    # Recorded failures are computed again only when asked.
    retry = explore(space, gpus=GPUS, batch_sizes=[8, 32], workers=1, out=out, retry_failed=True)
    assert retry.computed == 1 and retry.failed == 1
    # Other settings are other candidates (the keys hash them).
    other = explore(Space(mlp, [{"depth": 1, "width": 16}]), gpus=["T4"], batch_sizes=[8],
                    workers=1, out=out)
    assert other.computed == 1 and len(other.to_pandas()) == 1


def test_a_killed_worker_is_retried_and_every_candidate_arrives_once(tmp_path):
    marker = tmp_path / "killed-once"
    space = Space(mlp, [{"depth": 1}, {"depth": 2, "kill_marker": str(marker)}, {"depth": 3},
                        {"depth": 4}])
    res = explore(space, gpus=["T4"], batch_sizes=[8], workers=2, out=tmp_path / "run",
                  chunk_size=2)
    assert marker.exists()  # the worker really died once
    assert res.failed == 0 and len(res.to_pandas()) == 4
    keys = part_keys(tmp_path / "run")
    assert sorted(keys) == sorted(set(keys)) and len(keys) == 4


def moved(width=8):
    """A factory that reads a value from a tensor: not possible on the meta device."""
    scale = int(torch.tensor(2).item())
    return mlp(width=width * scale // 2)


def test_a_factory_that_cannot_build_on_meta_is_built_under_a_fake_mode():  # x.item()
    res = explore(Space(moved, {"width": [8, 16]}), gpus=["T4"], batch_sizes=[8], workers=1)
    assert res.failed == 0 and len(res.to_pandas()) == 2
    direct = predictor.predict(predictor.trace(lambda: mlp(width=16)), "T4", batch_size=8)
    row = res.to_pandas().query("params == 16 * 16 + 16").iloc[0]
    assert row["iteration_ms"] == pytest.approx(direct.iteration_ms, rel=1e-9)


def test_many_part_files_are_merged_when_a_run_starts(tmp_path, monkeypatch):
    from predictor import exploration

    space = Space(mlp, [{"depth": d} for d in (1, 2, 3)] + [{"fail": True}])
    first = explore(space, gpus=["T4"], batch_sizes=[8], workers=1, out=tmp_path, flush_every=1)
    assert len(list((tmp_path / PARTS).glob("part-*.jsonl"))) == 4  # one per candidate
    monkeypatch.setattr(exploration, "COMPACT_ABOVE", 2)
    again = explore(space, gpus=["T4"], batch_sizes=[8], workers=1, out=tmp_path)
    assert again.computed == 0 and again.failed == 1
    files = list((tmp_path / PARTS).glob("part-*.jsonl"))
    assert len(files) == 1 and sorted(part_keys(tmp_path)) == sorted(read_parts(tmp_path))
    assert again.to_pandas().equals(first.to_pandas())


def test_a_candidate_that_always_kills_its_worker_is_recorded(tmp_path):
    space = Space(lambda **c: always_dies() if c.get("die") else mlp(**c),
                  [{"depth": 1}, {"die": True}, {"depth": 2}])
    res = explore(space, gpus=["T4"], batch_sizes=[8], workers=2, max_retries=1,
                  out=tmp_path / "run")
    assert res.failed == 1 and len(res.to_pandas()) == 2
    err = res.failures.iloc[0]["error"]
    assert "worker process died 2 times" in err and "\n" not in err


# ---- the command line: kill the driver, resume ----------------------------------

SPACE_PY = """
import os, time, torch, predictor

def build(depth, width, fail=False):
    if fail:
        raise RuntimeError("no such block")
    time.sleep(float(os.environ.get("SPACE_SLEEP", "0")))
    layers = [torch.nn.Linear(width, width) for _ in range(depth)]
    return torch.nn.Sequential(*layers), (torch.zeros(8, width),)

space = predictor.Space(build, [{"depth": d, "width": w} for d in (1, 2, 3, 4) for w in (8, 16, 24)]
                        + [{"depth": 1, "width": 8, "fail": True}])
"""


def _cli(args, env=None, **kw):
    return subprocess.run([sys.executable, "-m", "predictor.cli", *args], capture_output=True,
                          text=True, env={**os.environ, **(env or {})}, **kw)


def test_cli_driver_killed_then_resumed(tmp_path):
    from predictor.commands.explore import load_space

    space_py = tmp_path / "space.py"
    space_py.write_text(SPACE_PY)
    out = tmp_path / "run"
    args = ["explore", str(space_py), "--gpus", "T4", "-b", "8", "--workers", "1", "--out",
            str(out), "-q"]
    proc = subprocess.Popen([sys.executable, "-m", "predictor.cli", *args],
                            env={**os.environ, "SPACE_SLEEP": "0.4"}, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not list((out / PARTS).glob("part-*.jsonl")):
            time.sleep(0.1)
        os.kill(proc.pid, signal.SIGKILL)  # the driver, mid-run
        proc.wait(30)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # its workers too
        except ProcessLookupError:
            pass
    done = part_keys(out)
    assert 0 < len(done) < 13, len(done)
    # The same run, resumed (here through the API: the keys are the same).
    space = load_space(str(space_py))
    res = explore(space, gpus=["T4"], batch_sizes=[8], workers=2, out=out)
    assert res.reused == len(done) and res.computed == 13 - len(done)
    keys = part_keys(out)
    assert len(keys) == 13 and len(set(keys)) == 13
    assert res.failed == 1 and len(res.to_pandas()) == 12
    # The command again: all 13 read back, a table and the failure in one line each.
    r = _cli(args[:-1] + ["--top", "3"])
    assert r.returncode == 0, r.stderr
    assert "0 computed" in r.stdout and "13 read from" in r.stdout
    assert "no such block" in r.stdout
    assert "cand/s" not in r.stderr  # no progress bar when stderr is not a terminal
    r = _cli(args + ["--json"])
    data = json.loads(r.stdout)
    assert data["computed"] == 0 and len(data["rows"]) == 12 and len(data["failures"]) == 1
    r = _cli(args + ["--csv"])
    assert r.returncode == 0 and len(r.stdout.strip().splitlines()) == 13


# ---- the local pool's workers: sessions of their own, bound to the driver ----------

POOL_DRIVER_PY = """
import json, os, signal, sys, time, torch
from predictor.exploration import Space, explore

# Ctrl-C as a terminal delivers it. A process started as a background job of a
# non-interactive shell (`pytest ... &`) inherits SIGINT ignored, and Python
# keeps an inherited SIG_IGN instead of raising KeyboardInterrupt: the driver
# would then sleep through the test's SIGINT.
signal.signal(signal.SIGINT, signal.default_int_handler)

def probe(i, folder):
    tmp = os.path.join(folder, f"{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        json.dump({"pid": os.getpid(), "sid": os.getsid(0)}, f)
    os.replace(tmp, os.path.join(folder, f"{os.getpid()}.json"))
    time.sleep(300)  # still running when the driver is stopped
    return torch.nn.Linear(4, 4), (torch.zeros(2, 4),)

if __name__ == "__main__":
    folder = sys.argv[1]
    explore(Space(probe, [{"i": i, "folder": folder} for i in range(4)]), gpus=["T4"],
            batch_sizes=[8], workers=2, chunk_size=1, out=os.path.join(folder, "run"))
"""


def _running(pid: int) -> bool:
    """Alive and not a zombie (an orphan may wait for its reaper)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.skipif(not hasattr(os, "setsid"), reason="no sessions on this platform")
@pytest.mark.parametrize("stop", [signal.SIGKILL, signal.SIGINT], ids=["killed", "ctrl-c"])
def test_local_workers_have_their_own_session_and_end_with_the_driver(tmp_path, stop):
    """Own sessions (own scheduling shares under autogroup), yet a worker never
    outlives its driver: killed (the kernel ends it) or interrupted (the driver
    kills its pool instead of waiting for the chunks in flight)."""
    script = tmp_path / "driver.py"
    script.write_text(POOL_DRIVER_PY)
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path)], start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    workers: list[dict] = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len(workers) < 2:
            workers = [json.loads(p.read_text()) for p in tmp_path.glob("*.json")]
            time.sleep(0.1)
        assert len(workers) == 2, "the pool's workers did not start"
        for w in workers:
            # A session leader each, not in the driver's session.
            assert w["sid"] == w["pid"] and w["sid"] != os.getsid(proc.pid), w
        os.kill(proc.pid, stop)
        proc.wait(60)  # an interrupted driver does not wait for its workers' chunks
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(_running(w["pid"]) for w in workers):
            time.sleep(0.1)
        assert not [w["pid"] for w in workers if _running(w["pid"])], "a worker outlived its driver"
    finally:
        for pid in [proc.pid] + [w["pid"] for w in workers]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait(30)


def test_cli_errors_are_one_line(tmp_path, capsys):
    from predictor.cli import main

    space_py = tmp_path / "space.py"
    space_py.write_text(SPACE_PY)
    broken = tmp_path / "broken.py"
    broken.write_text("import nothing_here_at_all\n")
    for args, words in [(["explore", str(tmp_path / "none.py")], "not found"),
                        (["explore", f"{space_py}:other"], "defines no 'other'"),
                        (["explore", f"{space_py}:build"], "raised"),
                        (["explore", str(broken)], "could not import"),
                        (["explore", str(space_py), "--gpus", "NoSuchGPU"], "NoSuchGPU"),
                        (["explore", str(space_py), "--constraint", "speed=3"], "constraint"),
                        (["explore", str(space_py), "--executor", "ray", "--address",
                          "127.0.0.1:1"], "cannot reach")]:
        assert main(args) == 2, args
        err = capsys.readouterr().err
        lines = err.strip().splitlines()
        assert len(lines) == 1 and words in lines[0], (args, err)


def test_cli_tf32_note_where_it_changes_nothing(tmp_path, capsys):
    """--tf32 over a GPU without TF32 tensor cores: the note in --json and on
    stderr beside --csv, and no warning line."""
    from predictor.cli import main

    space_py = tmp_path / "space.py"
    space_py.write_text(SPACE_PY)
    base = ["explore", str(space_py), "--gpus", "T4,A100-SXM4-80GB", "-b", "8", "--tf32"]
    assert main(base + ["--json"]) == 0
    notes = json.loads(capsys.readouterr().out)["notes"]
    assert len(notes) == 1 and "do not apply on T4:" in notes[0] and "A100" not in notes[0]
    assert main(base + ["--csv"]) == 0
    err = capsys.readouterr().err
    assert "predictor: note: TF32 matmuls" in err and "warning" not in err


def test_ray_missing_says_how_to_install(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(MissingExtraError) as exc:
        explore(Space(mlp), gpus=["T4"], executor="ray")
    assert "pip install 'dnn-predictor[ray]'" in str(exc.value) and "\n" not in str(exc.value)


# ---- Ray (the [ray] extra) --------------------------------------------------------

@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install -e '.[ray]')")
    try:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
                 logging_level="ERROR")
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"a local Ray cluster cannot start here: {exc}")
    yield ray
    ray.shutdown()


def test_ray_end_to_end_with_a_killed_worker_and_a_bad_candidate(ray_cluster, tmp_path):
    pidfile, marker = tmp_path / "pid", tmp_path / "marker"
    killed = []

    def killer():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not pidfile.exists():
            time.sleep(0.05)
        time.sleep(0.2)
        if pidfile.exists():
            pid = int(pidfile.read_text())
            os.kill(pid, signal.SIGKILL)  # the Ray worker, mid-task
            killed.append(pid)

    space = Space(ray_victim, [{"depth": 1}, {"depth": 2, "pidfile": str(pidfile),
                                              "marker": str(marker)},
                               {"depth": 3}, {"fail": True}, {"depth": 4}])
    t = threading.Thread(target=killer)
    t.start()
    res = explore(space, gpus=GPUS, batch_sizes=[8, 16], executor="ray", out=tmp_path / "run")
    t.join()
    assert killed, "the worker was not killed"
    assert res.failed == 1 and "cannot be built" in res.failures.iloc[0]["error"]
    df = res.to_pandas()
    assert len(df) == 4 * 2 * 2 and (df["iteration_ms"] > 0).all()
    keys = part_keys(tmp_path / "run")
    assert len(keys) == 5 and len(set(keys)) == 5
    # Same numbers as the local executor; resuming recomputes nothing.
    local = explore(space, gpus=GPUS, batch_sizes=[8, 16], workers=1, out=tmp_path / "run")
    assert local.computed == 0
    other = explore(Space(mlp, [{"depth": 3}]), gpus=GPUS, batch_sizes=[8, 16], workers=1)
    a = df[df["config"].apply(lambda c: c == {"depth": 3})].sort_values(["gpu", "batch_size"])
    b = other.to_pandas().sort_values(["gpu", "batch_size"])
    assert list(a["iteration_ms"]) == pytest.approx(list(b["iteration_ms"]), rel=1e-9)


def ray_victim(depth=1, fail=False, pidfile=None, marker=None):
    """Waits to be killed the first time (writes its pid for the test to kill)."""
    if pidfile is not None and not os.path.exists(marker):
        Path(marker).write_text("")
        Path(pidfile).write_text(str(os.getpid()))
        time.sleep(60)
    return mlp(depth=depth, fail=fail)
