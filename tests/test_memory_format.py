"""Convolutions' memory format: cuDNN's NCHW<->NHWC transposes around a
tensor-core convolution in NCHW, and trace(memory_format=) / --memory-format."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
import torch

import predictor
from predictor import cli, overhead
from predictor.errors import InvalidArgumentError
from predictor.kernels import layout as L
from predictor.overhead import HOST_LAUNCH_US

# These tests ask for TF32 matmuls on every GPU, those without TF32 included.
pytestmark = pytest.mark.filterwarnings("ignore::predictor.errors.NotApplicableWarning")

TC_GPUS = ("V100-SXM2-16GB", "A100-SXM4-80GB", "H100-SXM5-80GB")
BATCH = 8


class Net(torch.nn.Module):
    """Two 3x3 convolutions (16 -> 32 -> 32 channels) and a classifier."""

    def __init__(self):
        super().__init__()
        self.c1 = torch.nn.Conv2d(16, 32, 3, padding=1, bias=False)
        self.bn = torch.nn.BatchNorm2d(32)
        self.c2 = torch.nn.Conv2d(32, 32, 3, padding=1, bias=False)
        self.fc = torch.nn.Linear(32, 10)

    def forward(self, x):
        h = self.c2(torch.relu(self.bn(self.c1(x))))
        return self.fc(h.mean((2, 3)))


def _trace(amp="fp16", model=None, x=None, **kw):
    model = Net() if model is None else model
    x = torch.zeros(BATCH, 16, 32, 32) if x is None else x
    return predictor.trace(model, (x,), amp=amp, loss_fn=lambda out: out.float().mean(), **kw)


def _transposes(graph) -> np.ndarray:
    """Mask of the layout-transpose rows of a graph's OpTable."""
    ops = graph.ops
    d = ops.dims(graph.batch_size)
    return (ops.family == L.COPY) & (d[:, L.MEM_LAYOUT] > 0)


def _per_phase(graph) -> dict:
    ops, m = graph.ops, _transposes(graph)
    return {L.PHASE_NAMES[p]: int(ops.count[m & (ops.phase == p)].sum()) for p in range(3)}


@pytest.fixture(scope="module")
def nchw():
    return _trace()


@pytest.fixture(scope="module")
def nhwc():
    return _trace(memory_format="channels_last")


def test_nchw_amp_conv_has_the_transposes(nchw):
    # Forward: input, filter, output of both convolutions. Backward: the dgrad
    # of c2 (grad_out, filter, grad_in; c1's input needs no gradient) and both
    # wgrads (grad_out, input, grad_w).
    assert _per_phase(nchw) == {"forward": 6, "backward": 9, "optimizer": 0}
    ops, m = nchw.ops, _transposes(nchw)
    assert set(ops.dtype[m].tolist()) == {L.F16}
    # Each moves a whole tensor: its bytes read and written once.
    d = ops.dims(BATCH)[m]
    assert (d[:, L.MEM_READ] == d[:, L.MEM_WRITTEN]).all()
    sizes = set(d[:, L.MEM_READ].tolist())
    assert {BATCH * 16 * 32 * 32, BATCH * 32 * 32 * 32, 32 * 16 * 9, 32 * 32 * 9} == sizes


class Pointwise(torch.nn.Module):
    """A 3x3 convolution, then a 1x1 of stride 1 and a 1x1 of stride 2."""

    def __init__(self):
        super().__init__()
        self.c1 = torch.nn.Conv2d(16, 32, 3, padding=1, bias=False)
        self.pw = torch.nn.Conv2d(32, 64, 1, bias=False)
        self.down = torch.nn.Conv2d(64, 64, 1, stride=2, bias=False)

    def forward(self, x):
        return self.down(self.pw(self.c1(x))).float().mean((2, 3))


def test_pointwise_stride_one_convolutions_run_as_gemms_on_nchw(tmp_path):
    # A 1x1 filter has the same bytes in both formats and is never moved.
    # Forward: c1's input, filter and output, down's input and output (5);
    # pw none (it would move 2). Backward: down's dgrad (grad_out, grad_in;
    # pw's none, c1 has no input gradient) and the three wgrads (c1 3, pw 2,
    # down 2): 9 (pw's dgrad would move 2 more).
    g = _trace(model=Pointwise())
    assert _per_phase(g) == {"forward": 5, "backward": 9, "optimizer": 0}
    # The same from an ONNX export, its backward synthesised.
    pytest.importorskip("onnx")
    import warnings

    path = tmp_path / "pointwise.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Pointwise(), (torch.zeros(BATCH, 16, 32, 32),), str(path),
                          dynamo=False, input_names=["x"], output_names=["y"],
                          dynamic_axes={"x": {0: "b"}})
    assert _per_phase(predictor.trace(str(path), batch_size=BATCH, amp="fp16")) \
        == {"forward": 5, "backward": 9, "optimizer": 0}


def test_the_h200_profile_counts_resnet50s_transposes():
    """The H200's ResNet-50 bf16 step in NCHW (batch 128) ran 158 nchwToNhwc
    and 68 nhwcToNchw kernels; the trace gives its 1x1 stride-1 forward and
    data-gradient convolutions none."""
    import pandas as pd
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "data" / "h200" / \
        "profile" / "resnet50-b128-bf16.csv"
    prof = pd.read_csv(path)
    real = prof.calls[prof.kernel.str.contains("nchwToNhwc|nhwcToNchw")].sum()
    assert real == 158 + 68
    g = predictor.trace("resnet50", batch_size=128, amp="bf16", optimizer="adam")
    traced = int(g.ops.count[_transposes(g)].sum())
    assert traced == pytest.approx(real, rel=0.05)


def test_channels_last_has_none(nhwc):
    assert not _transposes(nhwc).any()
    # The same from the tensors' own strides, no option given.
    model = Net().to(memory_format=torch.channels_last)
    x = torch.zeros(BATCH, 16, 32, 32).to(memory_format=torch.channels_last)
    assert not _transposes(_trace(model=model, x=x)).any()
    # ... and back to NCHW when asked.
    assert _per_phase(_trace(model=model, x=x, memory_format="contiguous"))["forward"] == 6


def test_transposes_priced_on_tensor_cores_only(nchw, nhwc):
    m = _transposes(nchw)
    for gpu in TC_GPUS:
        p, q = predictor.predict(nchw, gpu), predictor.predict(nhwc, gpu)
        assert np.isfinite(p.iteration_ms) and p.iteration_ms > 0
        assert np.isfinite(q.iteration_ms) and q.iteration_ms > 0
        assert (p.op_us[m] > 0).all(), gpu
        assert p.iteration_ms > q.iteration_ms, gpu
        df = p.ops
        rows = df[df["shape"].str.contains("NHWC transpose")]
        assert len(rows) == m.sum() and (rows["basis"] == "learned").all()
    # P100 has no fp16 tensor cores: its convolutions run NCHW kernels, no
    # transposes on the GPU (the host model, which does not know the GPU,
    # counts their launches in half precision: at most 15 of them here).
    p, q = predictor.predict(nchw, "P100-PCIE-16GB"), predictor.predict(nhwc, "P100-PCIE-16GB")
    assert (p.op_us[m] == 0).all()
    assert 0 <= p.iteration_ms - q.iteration_ms <= 15 * HOST_LAUNCH_US * 1e-3 + 1e-9


def test_fp32_unchanged(nchw):
    # fp32 convolutions (TF32 or not) are priced by the fp32 model, learned
    # from measured NCHW convolutions: no transposes added.
    assert not _transposes(_trace(amp=None)).any()
    assert not _transposes(_trace(amp=None, memory_format="channels_last")).any()
    # A model in half precision (no autocast) has them too; predicted in
    # fp32 they cost nothing, on the GPU or the host.
    half = _trace(amp=None, model=Net().half(), x=torch.zeros(BATCH, 16, 32, 32).half())
    m = _transposes(half)
    assert _per_phase(half) == _per_phase(nchw)
    for gpu in TC_GPUS + ("T4", "P100-PCIE-16GB"):
        for tf32 in (None, True):
            p = predictor.predict(half, gpu, dtype="float32", tf32_matmul=tf32)
            assert np.isfinite(p.iteration_ms) and p.iteration_ms > 0
            assert (p.op_us[m] == 0).all(), gpu
    ops = half.ops.with_dtype(L.F32)
    launches = np.bincount(ops.phase[~m], weights=(ops.count * ops.kernels)[~m], minlength=3)
    assert overhead.kernels_per_phase(ops) == pytest.approx(launches)
    assert overhead.kernels_per_phase(half.ops).sum() == pytest.approx(launches.sum() + 15)


def test_memory_format_names_and_errors():
    from predictor.frontend.fx import check_memory_format

    assert check_memory_format("NHWC") == "channels_last"
    assert check_memory_format("nchw") == "contiguous"
    assert check_memory_format(None) is None
    with pytest.raises(InvalidArgumentError, match="unknown memory format"):
        _trace(memory_format="nhcw")


def _cli_json(capsys, *extra):
    assert cli.main(["predict", "dcgan", "-b", "8", "--gpus", "A100-SXM4-80GB", "--amp", "fp16",
                     "--json", *extra]) == 0
    return json.loads(capsys.readouterr().out)["predictions"][0]["iteration_ms"]


def test_cli_memory_format(capsys):
    nchw = _cli_json(capsys)
    assert _cli_json(capsys, "--memory-format", "contiguous") == pytest.approx(nchw)
    nhwc = _cli_json(capsys, "--memory-format", "channels_last")
    assert 0 < nhwc < nchw
    assert _cli_json(capsys, "--memory-format", "nhwc") == pytest.approx(nhwc)


def test_cli_bad_memory_format_is_one_line(capsys):
    with pytest.raises(SystemExit) as exc:
        sys.exit(cli.main(["predict", "dcgan", "--memory-format", "chanels_last"]))
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "unknown memory format" in err and "\n" not in err and "Traceback" not in err


def test_calibration_leaves_the_transposes_to_the_model(nchw):
    # They run inside cuDNN's convolution call, on tensor-core GPUs only: not
    # measured (a zero model time on the calibrated device would divide the
    # ratio), priced by the model on each GPU.
    from predictor.calibration.measure import measure_table

    m = _transposes(nchw)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        t = measure_table(nchw.ops, 2, torch.device("cpu"), repeats=1, min_sample_s=1e-4,
                          progress=False)
    finally:
        torch.set_num_threads(threads)
    assert list(t.skipped) == ["copy: a convolution's layout transpose, priced by the model"]
    assert (t.us[m] == 0).all() and (t.us[~m] > 0).all()


def test_onnx_convolutions_are_nchw(tmp_path, nchw):
    # An ONNX graph is NCHW: under amp= its half-precision convolutions get
    # the same transposes as the fx trace; channels-last is refused in one line.
    import warnings

    pytest.importorskip("onnx")
    path = tmp_path / "net.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Net().train(), (torch.zeros(BATCH, 16, 32, 32),), str(path),
                          dynamo=False, input_names=["x"], output_names=["y"],
                          dynamic_axes={"x": {0: "b"}}, training=torch.onnx.TrainingMode.TRAINING)
    g = predictor.trace(str(path), batch_size=BATCH, amp="fp16")
    assert _per_phase(g) == _per_phase(nchw)
    with pytest.raises(InvalidArgumentError, match="ONNX graph is traced in NCHW"):
        predictor.trace(str(path), batch_size=BATCH, amp="fp16", memory_format="channels_last")


def test_fingerprint_tells_channels_last_apart():
    # explore() shares traced graphs by this fingerprint: a channels-last
    # model must not reuse an NCHW one's graph.
    from predictor import fingerprint

    x = torch.zeros(BATCH, 16, 32, 32)
    plain = fingerprint.structure(Net(), (x,))
    assert plain == fingerprint.structure(Net(), (x,))
    assert plain != fingerprint.structure(Net().to(memory_format=torch.channels_last),
                                          (x.to(memory_format=torch.channels_last),))


def test_the_real_step_stores_its_tensors_as_the_trace_did(nhwc):
    """Calibration times the real step of a channels-last trace with the
    model's weights and inputs in channels-last, as the trace priced them
    (and a trace without memory_format leaves them as they are)."""
    from predictor.calibration.step import build_step

    seen = {}

    class Spy(Net):
        def forward(self, x):
            seen["x"] = x.is_contiguous(memory_format=torch.channels_last)
            seen["w"] = self.c1.weight.is_contiguous(memory_format=torch.channels_last)
            return super().forward(x)

    g = _trace(model=Spy(), memory_format="channels_last")
    build_step(g.source, "train", None, 2, torch.device("cpu"))()
    assert seen == {"x": True, "w": True}
    g = _trace(model=Spy())
    build_step(g.source, "train", None, 2, torch.device("cpu"))()
    assert seen == {"x": False, "w": False}
