"""Replay every reproducer of the hostile-inputs audit, round two (issue 19).

    python -m benchmarks.hostile_r2            # prints one line per reproducer and the count

Each reproducer is the command or call the issue quotes, run on the inputs it
describes (made here, in a temporary folder; the files of F1-F3 and F5-F7 are
those of ``tests/data/fuzz/*-r2-*``). A reproducer is handled when it gives a
one-line error with exit status 2 (``PredictorError`` in Python), or a correct
answer (the check says which). Anything else (a traceback, several lines, a
hang, a wrong number) is counted as not handled.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "fuzz"


def cli(*args, env=None, cwd=None, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "predictor.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          env={**os.environ, "PYTHONWARNINGS": "ignore", **(env or {})})


def one_line_2(proc) -> bool:
    lines = [x for x in proc.stderr.strip().splitlines()
             if not x.startswith(("predictor: tracing ", "predictor: warning: "))]
    return proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr \
        and "\x1b" not in lines[0] and len(lines[0]) < 2100


def ok(proc) -> bool:
    return proc.returncode == 0 and "Traceback" not in proc.stderr


def cases(tmp: Path):
    """(class, description, check) for every reproducer of the issue."""
    import numpy as np

    import predictor
    from predictor.optable import Graph

    r50 = tmp / "r50.npz"
    predictor.trace("resnet50").save(r50)
    deep = "[" * 10**5 + "]" * 10**5
    (tmp / "d.toml").write_text("x=" + deep)
    (tmp / "d.json").write_text(deep)
    mk = (tmp / "m.toml")
    mk.write_text((DATA / "spec-r2-id-markup.toml").read_text())
    yield "F1", "predict '[/x]'", lambda: one_line_2(cli("predict", "[/x]"))
    yield "F1", "gpus --spec with id '[/x]'", lambda: ok(cli("gpus", "--spec", mk))
    yield "F1", "search --spec with id '[/x]'", lambda: ok(
        cli("search", r50, "-b", "8", "--gpus", "[/x]", "--spec", mk))
    yield "F1", "saved graph named '[/x]'", lambda: "[/x]" in cli(
        "sweep", DATA / "graph-r2-name-markup.npz", "--gpus", "T4").stdout
    yield "F1", "ONNX op type '[/x]'", lambda: ok(
        cli("predict", DATA / "onnx-r2-op-type-markup.onnx", "-b", "2", "--gpus", "T4"))
    yield "F1", "search --report with id 'D$\\foo$'", lambda: ok(
        cli("search", r50, "-b", "8", "--gpus", "dd", "--spec",
            DATA / "spec-r2-id-mathtext.toml", "--report", tmp / "out"))
    yield "F1", "ONNX op type with terminal escapes", lambda: "\x1b" not in cli(
        "predict", DATA / "onnx-r2-op-type-control-chars.onnx", "-b", "2", "--gpus",
        "T4").stdout + cli("predict", DATA / "onnx-r2-op-type-control-chars.onnx", "-b", "2",
                           "--gpus", "T4").stderr
    yield "F1", "a 100 kB op type in messages", lambda: max(map(len, (cli(
        "predict", DATA / "onnx-r2-op-type-long.onnx", "-b", "2", "--gpus", "T4").stderr + "\n")
        .splitlines())) < 2100
    yield "F2", "gpus --spec d.toml ([ x 10^5)", lambda: one_line_2(cli("gpus", "--spec",
                                                                       tmp / "d.toml"))
    yield "F2", "--price d.toml", lambda: one_line_2(
        cli("search", r50, "-b", "8", "--gpus", "T4", "--price", tmp / "d.toml"))
    yield "F2", "--price d.json", lambda: one_line_2(
        cli("search", r50, "-b", "8", "--gpus", "T4", "--price", tmp / "d.json"))
    yield "F2", "calibration header [ x 10^5", lambda: one_line_2(
        cli("sweep", r50, "--calibration", DATA / "calibration-r2-header-nested.npz"))
    yield "F3", "gpus --spec /dev/zero", lambda: one_line_2(cli("gpus", "--spec", "/dev/zero",
                                                               timeout=60))
    z = tmp / "z.npz"
    z.symlink_to("/dev/zero")
    yield "F3", "sweep z.npz -> /dev/zero", lambda: one_line_2(cli("sweep", z, timeout=60))
    f = tmp / "f.npz"
    os.mkfifo(f)
    yield "F3", "sweep f.npz (FIFO)", lambda: one_line_2(cli("sweep", f, timeout=60))
    yield "F3", "calibration inflating to a 1 GiB header", lambda: one_line_2(
        cli("sweep", r50, "--calibration", DATA / "calibration-r2-header-bomb.npz", timeout=60))
    for args in (("sweep", r50, "-b", "4611686018427387904", "--gpus", "T4", "--json"),
                 ("search", r50, "-b", "64,4503599627370496", "--gpus", "T4"),
                 ("sweep", r50, "-b", "9223372036854775808", "--gpus", "T4"),
                 ("search", r50, "-b", "9223372036854775808", "--gpus", "T4"),
                 ("predict", "resnet50", "-b", "9223372036854775808", "--gpus", "T4"),
                 ("predict", "gnmt", "-b", "1", "--seq-len", "2147483648", "--gpus", "T4")):
        yield "F4", " ".join(map(str, args)).replace(str(r50), "r50.npz"), \
            lambda a=args: one_line_2(cli(*a))

    def api(call):
        try:
            call()
        except predictor.PredictorError as exc:
            return "\n" not in str(exc)
        return False

    g = Graph.load(r50)
    yield "F4", "predict(batch_size=2**63)", lambda: api(
        lambda: predictor.predict(g, "T4", batch_size=2**63))

    def doubling():
        bs = [2**k for k in range(20, 32)]
        res = predictor.sweep(g, ["T4"], bs)
        t = res.phase_ms.sum(-1)[0]
        m = np.diff(res.memory_bytes[0])
        return bool(np.all((t[1:] / t[:-1] > 1.9) & (t[1:] / t[:-1] < 2.05))
                    and np.allclose(m[1:] / m[:-1], 2.0, rtol=1e-6))
    yield "F4", "time x2 and memory x2 per doubling up to 2**31", doubling
    yield "F5", "memory.n_steps = 2**40", lambda: one_line_2(
        cli("sweep", DATA / "graph-r2-n-steps-2e40.npz", "--gpus", "T4"))
    yield "F5", "phase_marks unchecked", lambda: one_line_2(
        cli("sweep", DATA / "graph-r2-phase-marks-text.npz", "--gpus", "T4"))
    for name in sorted(p.name for p in DATA.glob("calibration-r2-*.npz")
                       if "valid" not in p.name and "header" not in p.name
                       and "in-range" not in p.name):
        yield "F6", name, lambda n=name: one_line_2(
            cli("predict", "resnet50", "--calibration", DATA / n))
    yield "F7", "--price T4=1e308", lambda: one_line_2(
        cli("search", r50, "-b", "8", "--gpus", "T4", "--price", "T4=1e308"))
    yield "F7", "--samples 1000 --epochs 1e308", lambda: one_line_2(
        cli("search", r50, "-b", "8", "--gpus", "T4", "--samples", "1000", "--epochs", "1e308"))

    def report():
        out = tmp / "rep"
        p = cli("search", r50, "-b", "8", "--gpus", "dd", "--spec",
                DATA / "spec-r2-id-script.toml", "--report", out)
        if not ok(p):
            return False
        text = (out / "report.html").read_text()
        start = text.index('id="search-data">') + len('id="search-data">')
        block = text[start:text.index("</script>", start)]
        return "<" not in block and json.loads(block) == json.loads(
            (out / "search.json").read_text())
    yield "F8", "id '<script>x</script>', price_source '<!--'", report

    def numba_cache(damage):
        xdg = tmp / f"xdg-{damage}"
        env = {"XDG_CACHE_HOME": str(xdg), "NUMBA_CACHE_DIR": ""}
        first = cli("sweep", r50, "-b", "8", "--gpus", "T4", "--json", env=env)
        (folder,) = (xdg / "dnn-predictor" / "numba").iterdir()
        if damage == "others-writable":
            folder.chmod(0o777)
        for p in folder.glob("*.nbi" if damage == "garbage-index" else "*.nbc"):
            if damage == "garbage-index":
                p.write_bytes(b"garbage")
            elif damage == "truncated-data":
                p.write_bytes(p.read_bytes()[:50])
        again = cli("sweep", r50, "-b", "8", "--gpus", "T4", "--json", env=env)
        warns = [x for x in again.stderr.splitlines() if x.strip()]
        private = (xdg / "dnn-predictor").stat().st_mode & 0o777 == 0o700
        return ok(first) and ok(again) and private and len(warns) <= 1 and \
            json.loads(again.stdout)["grid"] == json.loads(first.stdout)["grid"]
    for damage in ("garbage-index", "truncated-data", "others-writable"):
        yield "F9", f"numba cache: {damage}", lambda d=damage: numba_cache(d)

    def trace_cache():
        from predictor import cache
        key = cache.graph_key("resnet50", batch_size=64, seq_len=None, mode="train",
                              optimizer="adam")
        other = cache.store("x" * 64, g, "planted", tmp / "gc")
        other.rename(cache._file(key, "planted", tmp / "gc"))
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return cache.load(key, "planted", tmp / "gc") is None
    yield "F9", "trace cache: a graph of another key", trace_cache
    yield "F9", "trace cache honours XDG_CACHE_HOME", lambda: subprocess.run(
        [sys.executable, "-c", "from predictor import cache; print(cache.cache_dir())"],
        capture_output=True, text=True,
        env={**os.environ, "XDG_CACHE_HOME": str(tmp / "x"), "PREDICTOR_CACHE_DIR": ""}
    ).stdout.strip() == str(tmp / "x" / "dnn-predictor" / "graphs")
    real = tmp / "real.csv"
    real.write_text("old")
    link = tmp / "link.csv"
    link.symlink_to(real)

    def symlink():
        p = cli("sweep", r50, "-b", "8", "--gpus", "T4", "--csv", link)
        return ok(p) and link.is_symlink() and real.read_text() != "old"
    yield "F10", "--csv through a symlink", symlink

    def monotone():
        from tests.test_batch_monotone import MAX_DROP
        inc = predictor.trace("inception_v3")
        a, b = (predictor.predict(inc, "P100-PCIE-16GB", batch_size=n).iteration_ms
                for n in (255, 256))
        return b / a - 1 >= -MAX_DROP
    yield "F11", "inception_v3 P100-PCIE 255 -> 256 within the monotonicity bound", monotone


def main() -> int:
    handled = total = 0
    with tempfile.TemporaryDirectory(prefix="hostile-r2-") as tmp:
        for klass, what, check in cases(Path(tmp)):
            total += 1
            try:
                good = bool(check())
            except Exception as exc:  # noqa: BLE001 - a reproducer that still breaks
                good = False
                what += f" ({type(exc).__name__}: {str(exc)[:100]})"
            handled += good
            print(f"{klass:4} {'ok ' if good else 'NOT'} {what}", flush=True)
    print(f"{handled} of {total} reproducers handled")
    return 0 if handled == total else 1


if __name__ == "__main__":
    sys.exit(main())
