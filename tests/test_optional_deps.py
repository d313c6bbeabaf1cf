"""onnx and matplotlib are extras (``pip install 'dnn-predictor[onnx]'``,
``[plot]``): prediction never needs them, and each place that does names the
extra in a one-line error when the package is missing."""

import subprocess
import sys

import pytest

from predictor import cli
from predictor.errors import MissingExtraError, PredictorError


def block(monkeypatch, package: str) -> None:
    """Make ``package`` (and its already-imported submodules) unimportable, and
    forget our modules that imported it, for this test only."""
    for name in list(sys.modules):
        if name == package or name.startswith(package + "."):
            monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, package, None)
    for name in ("predictor.frontend.onnx", "predictor.frontend.onnx_load",
                 "predictor.frontend.onnx_ops"):
        monkeypatch.delitem(sys.modules, name, raising=False)


def one_line(exc: pytest.ExceptionInfo, extra: str) -> str:
    msg = str(exc.value)
    assert isinstance(exc.value, PredictorError) and isinstance(exc.value, ImportError)
    assert "\n" not in msg and f"pip install 'dnn-predictor[{extra}]'" in msg, msg
    return msg


def test_onnx_missing(monkeypatch, capsys, tmp_path):
    block(monkeypatch, "onnx")
    import predictor

    with pytest.raises(MissingExtraError) as exc:
        predictor.trace(str(tmp_path / "model.onnx"), batch_size=2)
    assert one_line(exc, "onnx").startswith("ONNX files need the onnx package")
    for module in ("predictor.frontend.onnx_load", "predictor.frontend.onnx_ops"):
        with pytest.raises(MissingExtraError):
            __import__(module)
    assert cli.main(["predict", str(tmp_path / "model.onnx"), "--gpus", "T4"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "dnn-predictor[onnx]" in err, err


def test_matplotlib_missing(monkeypatch, tmp_path):
    block(monkeypatch, "matplotlib")
    from predictor.plots import plot_sweep
    from predictor.report import render_html

    with pytest.raises(MissingExtraError) as exc:
        plot_sweep(None, tmp_path / "sweep.png")
    assert one_line(exc, "plot").startswith("Plots need the matplotlib package")
    with pytest.raises(MissingExtraError) as exc:
        render_html(None)
    one_line(exc, "plot")


def test_prediction_needs_no_extra():
    """A whole predict run with onnx and matplotlib unimportable."""
    code = ("import sys\n"
            "sys.modules['onnx'] = sys.modules['matplotlib'] = None\n"
            "from predictor import cli\n"
            "sys.exit(cli.main(['predict', 'dcgan', '-b', '8', '--gpus', 'T4,H100', '--json']))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert '"iteration_ms"' in proc.stdout
