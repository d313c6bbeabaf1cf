"""Hostile inputs, round two: names with markup, maths or control characters
(F1), deep nesting (F2), special files and sizes (F3), saved-graph memory
fields (F5), calibration numbers (F6), prices and run lengths (F7).

Every case ends in a correct answer or a one-line ``PredictorError`` naming
the file (CLI: exit 2), never a traceback, a hang, or a non-finite or
non-positive time. The file inputs are in ``tests/data/fuzz/`` (replayed by
``test_robustness.py::test_fuzz_regressions`` too); special files (FIFOs,
devices) cannot live in git and are made here. ``_write_corpus`` rebuilt the
corpus files (``python tests/test_hostile.py``).
"""

from __future__ import annotations

import io
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from benchmarks.fuzz_loaders import SPECIAL_FILES, make_special_file, time_limit
import predictor
from predictor import hardware
from predictor.errors import PredictorError
from predictor.kernels import layout as L
from predictor.optable import Graph, OpTable

DATA = Path(__file__).parent / "data" / "fuzz"
ROOT = Path(__file__).resolve().parents[1]


def assert_clear_error(exc: BaseException, path) -> str:
    msg = str(exc)
    assert isinstance(exc, PredictorError), f"{type(exc).__name__}: {msg}"
    assert Path(path).name in msg, f"the error does not name the file: {msg}"
    assert "\n" not in msg.strip() and "\x1b" not in msg and len(msg) < 2000, msg
    return msg


def refused(loader, path, *args, **kw) -> str:
    with time_limit(60), pytest.raises(PredictorError) as info:
        loader(path, *args, **kw)
    return assert_clear_error(info.value, path)


def tiny_graph() -> Graph:
    """The graph every calibration of the corpus belongs to."""
    ops = OpTable(np.array([L.MATMUL, L.ELEMENTWISE]), np.array([0, 1]), np.array([0, 0]),
                  np.array([1, 3]), np.array([1, 1]),
                  np.array([[1, 0, 512, 512] + [0] * 8, [0, 0, 0, 64] + [0] * 8]),
                  np.array([[0, 64, 0, 0] + [0] * 8, [4096, 4096, 4096, 0, 64] + [0] * 7]),
                  np.array([0, 0]), ["op"])
    return Graph("tiny", ops, batch_size=4)


# ======================================================= the corpus, replayed ==

def _use_calibration(path):
    """Load against the tiny graph, predict at small and large batches on the
    calibrated device: every time finite and positive."""
    from predictor.calibration.file import load

    g = tiny_graph()
    cal = load(path, g)
    for b in (1, 4, 1024, 1 << 20):
        yield predictor.predict(g, cal.device, batch_size=b, calibration=cal).iteration_ms
    if not cal.is_cpu:
        res = predictor.sweep(g, [cal.device, "A100-SXM4-80GB"], [1, 8, 64], calibration=cal)
        yield from (float(t) for t in res.phase_ms.sum(axis=-1).ravel())


def _use_spec(path):
    try:
        for gpu in hardware.load_specs(path):
            yield predictor.predict(tiny_graph(), gpu.id).iteration_ms
    finally:
        hardware._user_gpus.clear()


def _use_graph(path):
    g = Graph.load(path)
    yield predictor.predict(g, "A100-SXM4-80GB").iteration_ms
    if g.memory is not None:
        assert g.memory.breakdown(8)["peak_phase"] in L.PHASE_NAMES
        yield 1.0


def _use_prices(path):
    from predictor.design_search import load_prices, search

    prices = load_prices(path)
    res = search(tiny_graph(), gpus="T4", batch_sizes=[8],
                 prices={k: v for k, v in prices.items() if k == "T4"})
    for v in res.table["usd_per_1m_samples"]:
        yield float(v) if v == v else 1.0  # unpriced: NaN by design


def _use_onnx(path):
    g = predictor.trace(str(path), batch_size=2)
    for name in [g.name, *g.unsupported, *g.ops.op_names]:
        assert "\x1b" not in name and len(name) <= 200, name[:80]
    yield predictor.predict(g, "T4").iteration_ms


USE = {"calibration": _use_calibration, "spec": _use_spec, "graph": _use_graph,
       "prices": _use_prices, "onnx": _use_onnx}
ROUND2 = ("calibration-r2-", "spec-r2-", "graph-r2-", "prices-r2-", "onnx-r2-")


@pytest.mark.parametrize("path", sorted(p for p in DATA.glob("*") if p.name.startswith(ROUND2)),
                         ids=lambda p: p.name)
def test_round_two_corpus(path, tmp_path):
    target = tmp_path / ("case" + "".join(path.suffixes))
    target.write_bytes(path.read_bytes())
    with time_limit(120):
        try:
            for ms in USE[path.name.split("-")[0]](target):
                assert math.isfinite(ms) and ms > 0, ms
        except PredictorError as exc:
            assert_clear_error(exc, target)


def test_every_fuzz_input_predicts_finite_positive_with_its_loader(tmp_path):
    """F6: predictions over every calibration of the corpus (the older ones
    belong to other graphs: a clear error is the answer there)."""
    for path in sorted(DATA.glob("calibration-*")):
        target = tmp_path / ("case" + "".join(path.suffixes))
        target.write_bytes(path.read_bytes())
        try:
            for ms in _use_calibration(target):
                assert math.isfinite(ms) and ms > 0, (path.name, ms)
        except PredictorError as exc:
            assert_clear_error(exc, target)


EXPECTED_REFUSAL = {
    "spec-r2-nested-arrays.toml": "nested too deeply",
    "spec-r2-id-control-chars.toml": "control characters",
    "spec-r2-id-too-long.toml": "characters long",
    "spec-r2-compute-capability-inf.toml": "compute_capability",
    "prices-r2-nested.json": "nested too deeply",
    "prices-r2-nested.toml": "nested too deeply",
    "prices-r2-price-1e308.toml": "price",
    "calibration-r2-header-nested.npz": "nested too deeply",
    "calibration-r2-header-bomb.npz": "too large",
    "calibration-r2-fixed-ms-minus-1e6.npz": "overhead.fixed_ms",
    "calibration-r2-fixed-ms-nan.npz": "overhead.fixed_ms",
    "calibration-r2-fixed-ms-inf.npz": "overhead.fixed_ms",
    "calibration-r2-scale-minus-5.npz": "overhead.scale",
    "calibration-r2-scale-1e308.npz": "overhead.scale",
    "calibration-r2-fp32-tflops-zero.npz": "G_FP32_TFLOPS",
    "calibration-r2-fp32-tflops-negative.npz": "G_FP32_TFLOPS",
    "calibration-r2-op-overhead-nan.npz": "device.op_overhead_us",
    "calibration-r2-op-overhead-negative.npz": "device.op_overhead_us",
    "calibration-r2-alloc-us-nan.npz": "device.alloc_us_per_mib",
    "calibration-r2-alloc-threshold-negative.npz": "device.alloc_threshold_bytes",
    "calibration-r2-kind-cuda-on-cpu.npz": "device.kind",
    "calibration-r2-measured-1e308.npz": "measured_us",
    "graph-r2-n-steps-2e40.npz": "memory.n_steps",
    "graph-r2-phase-marks-text.npz": "memory.phase_marks",
    "graph-r2-phase-marks-decreasing.npz": "memory.phase_marks",
    "graph-r2-name-control-chars.npz": "control characters",
}


@pytest.mark.parametrize("name,needle", sorted(EXPECTED_REFUSAL.items()))
def test_round_two_refusals_name_the_field(name, needle, tmp_path):
    target = tmp_path / ("case" + "".join(Path(name).suffixes))
    target.write_bytes((DATA / name).read_bytes())
    with time_limit(120), pytest.raises(PredictorError) as info:
        for _ in USE[name.split("-")[0]](target):
            pass
    assert needle in assert_clear_error(info.value, target)


def test_valid_negative_overhead_stays_positive(tmp_path):
    """A negative fixed overhead within bounds (the real step faster than its
    per-op sum) still predicts a positive time at batch 1."""
    path = DATA / "calibration-r2-fixed-ms-negative-in-range.npz"
    for ms in _use_calibration(path):
        assert math.isfinite(ms) and ms > 0


# ============================================================ special files ==

def _loaders():
    from predictor.calibration.file import load as load_calibration
    from predictor.design_search import load_prices

    return {"spec.toml": hardware.load_specs, "prices.toml": load_prices,
            "graph.npz": Graph.load, "cal.npz": load_calibration,
            "model.onnx": lambda p: predictor.trace(str(p), batch_size=2)}


@pytest.mark.parametrize("kind", SPECIAL_FILES)
def test_every_loader_refuses_special_files(tmp_path, kind):
    """F3: a FIFO hung, /dev/zero (or a link to it) read until memory ran out."""
    for name, loader in _loaders().items():
        path = tmp_path / f"{kind}-{name}"
        make_special_file(path, kind)
        try:
            msg = refused(loader, path)
        finally:
            hardware._user_gpus.clear()
        assert "FIFO" in msg or "device" in msg or "folder" in msg, msg


def test_loaders_cap_sizes_before_reading(tmp_path, monkeypatch):
    from predictor import design_search, optable
    from predictor.calibration import file as calfile

    monkeypatch.setattr(hardware, "MAX_SPEC_FILE_BYTES", 1000)
    monkeypatch.setattr(design_search, "MAX_PRICE_FILE_BYTES", 1000)
    monkeypatch.setattr(optable, "MAX_GRAPH_FILE_BYTES", 1000)
    monkeypatch.setattr(calfile, "MAX_FILE_BYTES", 1000)
    from predictor.calibration.file import load as load_calibration
    from predictor.design_search import load_prices

    for name, loader in (("s.toml", hardware.load_specs), ("p.toml", load_prices),
                         ("g.npz", Graph.load), ("c.npz", load_calibration)):
        path = tmp_path / name
        path.write_bytes(b"#" * 2000)
        assert "too large" in refused(loader, path)


# ================================================================== the CLI ==

def cli(*args, cwd=None, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "predictor.cli", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=cwd,
                          env={**os.environ, "PYTHONWARNINGS": "ignore",
                               "PYTHONPATH": str(ROOT)})


def _one_line_exit_2(proc, needle=None) -> str:
    err = proc.stderr.strip()
    assert proc.returncode == 2, (proc.returncode, err[-2000:])
    assert err and "\n" not in err and "Traceback" not in err and "\x1b" not in err, err[-500:]
    if needle:
        assert needle in err, err
    return err


def test_cli_markup_names(tmp_path):
    """F1: rich markup in a model name or a GPU id is printed as written."""
    _one_line_exit_2(cli("predict", "[/x]"), "[/x]")
    spec = DATA / "spec-r2-id-markup.toml"
    proc = cli("gpus", "--spec", str(spec))
    assert proc.returncode == 0 and "[/x]" in proc.stdout, proc.stderr[-2000:]


def test_cli_mathtext_names_in_plots_and_reports(tmp_path):
    """F1: a GPU id with $...$ in a plot label is drawn as text, not parsed as maths."""
    g = tmp_path / "g.npz"
    tiny_graph().save(g)
    spec = DATA / "spec-r2-id-mathtext.toml"
    proc = cli("search", str(g), "-b", "8", "--gpus", "dd", "--spec", str(spec),
               "--report", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "out" / "report.html").stat().st_size > 0
    proc = cli("sweep", str(g), "-b", "8,16", "--gpus", "dd", "--spec", str(spec),
               "--plot", str(tmp_path / "s.png"))
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_cli_control_characters_and_long_names(tmp_path):
    """F1: control characters are escaped and long names cut in messages."""
    err = _one_line_exit_2(cli("predict", "\x1b[2J\x1b]0;T\x07" + "x" * 100_000))
    assert "\\x1b" in err and len(err) < 2100


def test_cli_special_files_and_nesting(tmp_path):
    """F2, F3 through the CLI: one line, exit 2."""
    fifo = tmp_path / "f.npz"
    os.mkfifo(fifo)
    _one_line_exit_2(cli("sweep", str(fifo), "--gpus", "T4", timeout=120), "FIFO")
    zero = tmp_path / "z.npz"
    zero.symlink_to("/dev/zero")
    _one_line_exit_2(cli("sweep", str(zero), "--gpus", "T4", timeout=120), "device")
    _one_line_exit_2(cli("gpus", "--spec", "/dev/zero", timeout=120), "device")
    _one_line_exit_2(cli("gpus", "--spec", str(DATA / "spec-r2-nested-arrays.toml")),
                     "nested too deeply")


def test_cli_prices_and_run_length_are_bounded(tmp_path):
    """F7: --price capped like spec files; --epochs and --samples bounded."""
    g = tmp_path / "g.npz"
    tiny_graph().save(g)
    _one_line_exit_2(cli("search", str(g), "-b", "8", "--gpus", "T4", "--price", "T4=1e308"),
                     "1e308")
    _one_line_exit_2(cli("search", str(g), "-b", "8", "--gpus", "T4", "--samples", "1000",
                         "--epochs", "1e308"), "epochs")
    _one_line_exit_2(cli("search", str(g), "-b", "8", "--gpus", "T4", "--price",
                         str(DATA / "prices-r2-nested.json")), "nested too deeply")


def test_report_embedded_json_holds_no_markup(tmp_path):
    """F8: a GPU id "<script>x</script>" with price_source "<!--" left the
    embedded JSON block unclosed, swallowing the rest of the page."""
    g = tmp_path / "g.npz"
    tiny_graph().save(g)
    proc = cli("search", str(g), "-b", "8", "--gpus", "dd", "--spec",
               str(DATA / "spec-r2-id-script.toml"), "--report", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = (tmp_path / "out" / "report.html").read_text()
    start = text.index('id="search-data">') + len('id="search-data">')
    block = text[start:text.index("</script>", start)]
    assert "<" not in block and ">" not in block and "\u2028" not in block
    data = json.loads(block)
    assert data == json.loads((tmp_path / "out" / "search.json").read_text())
    assert "<script>x</script>" in json.dumps(data, ensure_ascii=False)
    assert text.rstrip().endswith("</html>")


def test_api_run_bounds():
    from predictor.design_search import search
    from predictor.errors import InvalidArgumentError

    g = tiny_graph()
    for kw in ({"samples": 1000, "epochs": 1e308}, {"samples": 10**30},
               {"iterations": 10**30}, {"prices": {"T4": 1e308}}, {"prices": {"T4": -1.0}}):
        with pytest.raises(InvalidArgumentError):
            search(g, gpus="T4", batch_sizes=[8], **kw)
    res = search(g, gpus="T4", batch_sizes=[8], samples=10**15, epochs=1e6,
                 prices={"T4": 1e6})
    assert np.all(np.isfinite(res.table["run_cost_usd"]))


# ============================================================== the corpus ==

def _npz(arrays: dict) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def _calibrations() -> dict[str, bytes]:
    import torch

    from predictor.calibration.device import DeviceInfo, cpu_features
    from predictor.calibration.file import Calibration, OverheadModel, graph_fingerprint

    g = tiny_graph()
    n = len(g.ops)

    def make(kind="cpu"):
        if kind == "cpu":
            dev = DeviceInfo(kind="cpu", id="cpu", name="Test CPU", threads=4,
                             features=cpu_features(200.0, 20.0, 4), peak_gflops=200.0,
                             bandwidth_gbs=20.0, op_overhead_us=5.0,
                             alloc_threshold_bytes=128 * 1024.0, alloc_us_per_mib=30.0)
        else:
            dev = DeviceInfo(kind="cuda", id="T4", name="Tesla T4",
                             features=hardware.get("T4").features.copy())
        return Calibration(model="tiny", fingerprint=graph_fingerprint(g), device_info=dev,
                           batch_sizes=np.array([4, 64], dtype=np.int64),
                           measured_us=np.array([[20.0, 5.0], [200.0, 40.0]])[:, :n],
                           iteration_ms=np.array([0.2, 0.9]), ops_ms=np.array([0.04, 0.36]),
                           unmeasured_ms=np.array([0.0, 0.0]),
                           overhead=OverheadModel(fixed_ms=0.15, scale=0.5, points=2),
                           settings={"torch": torch.__version__}, created="2026-01-01")

    def header(edit, kind="cpu"):
        cal = make(kind)
        h = cal.header()
        edit(h)
        return _npz({"header": np.frombuffer(json.dumps(h).encode(), np.uint8),
                     "measured_us": cal.measured_us})

    def dev(key, value):
        return lambda h: h["device"].__setitem__(key, value)

    def feat(key, value):
        return lambda h: h["device"]["features"].__setitem__(key, value)

    def ov(key, value):
        return lambda h: h["overhead"].__setitem__(key, value)

    def measured(h):
        h["measured_us_sha256"] = None

    out = {
        "fixed-ms-minus-1e6": header(ov("fixed_ms", -1e6)),
        "fixed-ms-nan": header(ov("fixed_ms", float("nan"))),
        "fixed-ms-inf": header(ov("fixed_ms", float("inf"))),
        "fixed-ms-negative-in-range": header(ov("fixed_ms", -0.3), "cuda"),
        "scale-minus-5": header(ov("scale", -5)),
        "scale-1e308": header(ov("scale", 1e308)),
        "fp32-tflops-zero": header(feat("G_FP32_TFLOPS", 0.0), "cuda"),
        "fp32-tflops-negative": header(feat("G_FP32_TFLOPS", -15.0), "cuda"),
        "op-overhead-nan": header(dev("op_overhead_us", float("nan"))),
        "op-overhead-negative": header(dev("op_overhead_us", -5.0)),
        "alloc-us-nan": header(dev("alloc_us_per_mib", float("nan"))),
        "alloc-threshold-negative": header(dev("alloc_threshold_bytes", -1.0)),
        "kind-cuda-on-cpu": header(dev("kind", "cuda")),
        "valid-cpu": header(lambda h: None),
        "valid-cuda": header(lambda h: None, "cuda"),
    }
    cal = make()
    big = cal.measured_us.copy()
    big[0, 0] = 1e308
    h = cal.header()
    h["measured_us_sha256"] = None
    out["measured-1e308"] = _npz({"header": np.frombuffer(json.dumps(h).encode(), np.uint8),
                                  "measured_us": big})
    out["header-nested"] = _npz({"header": np.frombuffer(b"[" * 5000 + b"]" * 5000, np.uint8),
                                 "measured_us": cal.measured_us})
    buf = io.BytesIO()  # 17 MiB of header in a few kB
    np.savez_compressed(buf, header=np.zeros(17 << 20, np.uint8), measured_us=cal.measured_us)
    out["header-bomb"] = buf.getvalue()
    return {f"calibration-r2-{k}.npz": v for k, v in out.items()}


def _graphs(base: Path) -> dict[str, bytes]:
    with np.load(base) as z:
        arrays = {k: z[k].copy() for k in z.files}

    def edit(fn):
        a = dict(arrays)
        h = json.loads(a["header"].tobytes().decode())
        fn(h["graph"]["fields"])
        a["header"] = np.frombuffer(json.dumps(h).encode(), np.uint8)
        return _npz(a)

    def mem(key, value):
        return lambda f: f["memory"]["fields"].__setitem__(key, value)

    return {
        "graph-r2-n-steps-2e40.npz": edit(mem("n_steps", 2**40)),
        "graph-r2-phase-marks-text.npz": edit(mem("phase_marks", {"__tuple__": ["x", 3]})),
        "graph-r2-phase-marks-decreasing.npz": edit(mem("phase_marks", {"__tuple__": [30, 5]})),
        "graph-r2-name-control-chars.npz": edit(lambda f: f.__setitem__("name",
                                                                         "\x1b[2J\x1b]0;T\x07")),
        "graph-r2-name-markup.npz": edit(lambda f: f.__setitem__("name", "[/x] D$\\foo$")),
    }


def _texts() -> dict[str, bytes]:
    gpu = ("[[gpu]]\nid = {id}\naliases = [\"dd\"]\nsms = 80\nboost_clock_mhz = 1500\n"
           "memory_bw_gbs = 900\nmemory_gb = 32\nfp32_tflops = 15.7\n"
           "price_usd_per_hour = 1.5\n")
    deep = "[" * 5000 + "]" * 5000  # far beyond the parsers' recursion limit
    return {
        "spec-r2-nested-arrays.toml": f"x = {deep}\n".encode(),
        "spec-r2-id-markup.toml": gpu.format(id='"[/x]"').encode(),
        "spec-r2-id-mathtext.toml": gpu.format(id='"D$\\\\foo$"').encode(),
        "spec-r2-id-control-chars.toml": gpu.format(id='"\\u001b[2J\\u001b]0;T\\u0007"').encode(),
        "spec-r2-id-too-long.toml": gpu.format(id='"' + "x" * 5000 + '"').encode(),
        "spec-r2-compute-capability-inf.toml":
            (gpu.format(id='"cc"') + "compute_capability = inf\n").encode(),
        "prices-r2-nested.json": deep.encode(),
        "prices-r2-nested.toml": f"T4 = {deep}\n".encode(),
        "prices-r2-price-1e308.toml": b"T4 = 1e308\n",
        "prices-r2-valid.toml": b"[prices]\nT4 = 0.35\n",
    }


def _onnx() -> dict[str, bytes]:
    from onnx import TensorProto, helper

    def model(op_type: str, name: str = "n") -> bytes:
        vi = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["b", 4]) for n in "xy"]
        g = helper.make_graph([helper.make_node("Relu", ["x"], ["h"]),
                               helper.make_node(op_type, ["h"], ["y"], name=name)],
                              "g", vi[:1], vi[1:])
        return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]) \
            .SerializeToString()

    return {"onnx-r2-op-type-control-chars.onnx": model("\x1b[2J\x1b]0;T\x07"),
            "onnx-r2-op-type-markup.onnx": model("[/x]"),
            "onnx-r2-op-type-long.onnx": model("Q" * 100_000)}


def _write_corpus(base_graph: Path) -> None:
    for name, data in {**_calibrations(), **_graphs(base_graph), **_texts(),
                       **_onnx()}.items():
        (DATA / name).write_bytes(data)


if __name__ == "__main__":  # python tests/test_hostile.py SAVED_GRAPH_WITH_MEMORY.npz
    _write_corpus(Path(sys.argv[1]))
