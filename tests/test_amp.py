"""Mixed precision: tracing under CUDA's autocast policy and pricing tensor cores."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import predictor
from predictor import zoo
from predictor.errors import InvalidArgumentError, NotApplicableWarning
from predictor.frontend import autocast
from predictor.kernels import layout as L
from predictor.kernels import precision
from predictor.kernels.roofline import default_params

# Tensor-core rows read the weights only for a power-limited board's clock.
NO_WEIGHTS = np.zeros(0)


class Block(torch.nn.Module):
    def __init__(self, d=64):
        super().__init__()
        self.ln = torch.nn.LayerNorm(d)
        self.fc1 = torch.nn.Linear(d, 4 * d)
        self.fc2 = torch.nn.Linear(4 * d, d)
        self.head = torch.nn.Linear(d, 10)

    def forward(self, x):
        h = self.fc2(torch.nn.functional.gelu(self.fc1(self.ln(x))))
        return torch.log_softmax(self.head(h), dim=-1)


def _trace(amp, d=64, **kw):
    return predictor.trace(Block(d), (torch.zeros(8, d),), amp=amp,
                           loss_fn=lambda out: out.mean(), **kw)


def _rows(graph, family):
    ops = graph.ops
    return [(int(d), int(p), int(c)) for f, d, p, c in zip(ops.family, ops.dtype, ops.phase,
                                                             ops.count) if f == family]


def test_policy_covers_every_cuda_autocast_op():
    # Every aten op CUDA autocast has a kernel for has a rule here: a torch
    # release that adds one fails this test instead of tracing it wrongly.
    cuda = {n.split("::", 1)[1] for n in torch._C._dispatch_get_all_op_names()
            if n.startswith("aten::")
            and torch._C._dispatch_has_kernel_for_dispatch_key(n, "AutocastCUDA")}
    missing = cuda - set(autocast.policy())
    assert not missing, sorted(missing)


def test_trace_follows_cuda_policy():
    g = _trace("bf16")
    assert g.amp == "bf16"
    # Matmuls in bf16 (forward and backward), layer norm and log_softmax in fp32.
    assert {d for d, _, _ in _rows(g, L.MATMUL)} == {L.BF16}
    assert {d for d, _, _ in _rows(g, L.LAYER_NORM)} == {L.F32}
    sm = _rows(g, L.SOFTMAX)
    assert sm and all(d in (L.BF16, L.F32) for d, _, _ in sm)
    # The optimizer updates fp32 master weights.
    assert {d for d, _, _ in _rows(g, L.OPTIMIZER)} == {L.F32}
    # Casts are kernels: each of the 6 matmul weights and biases cast once per step
    # (the weight-cast cache), plus activations and the gradients cast back.
    # (A cast's row has the narrower dtype of the two, families.narrowest_float.)
    fwd_casts = sum(c for d, p, c in _rows(g, L.COPY) if d == L.BF16 and p == L.FORWARD)
    assert fwd_casts >= 6
    assert not g.unsupported


def test_fp16_adds_grad_scaler_kernels():
    g16 = _trace("fp16")
    g = _trace("bf16")
    assert not g16.unsupported
    opt16 = sum(c for _, p, c in _rows(g16, L.OPTIMIZER) if p == L.OPTIMIZER_PHASE)
    opt = sum(c for _, p, c in _rows(g, L.OPTIMIZER) if p == L.OPTIMIZER_PHASE)
    assert opt16 >= opt + 2  # unscale (foreach) + update_scale


def test_registrations_are_removed_after_the_trace():
    _trace("bf16")
    assert not torch._C._dispatch_has_kernel_for_dispatch_key("aten::softmax.int", "AutocastCPU")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = torch.nn.functional.layer_norm(torch.zeros(2, 4).bfloat16(), (4,))
    assert y.dtype == torch.bfloat16  # CPU autocast's own policy again


def test_amp_names_and_errors():
    assert autocast.check("BF16") == "bf16" and autocast.check("float16") == "fp16"
    assert autocast.check(None) is None and autocast.check("none") is None
    assert autocast.check("float8") == "fp8"
    with pytest.raises(InvalidArgumentError, match="unknown amp"):
        autocast.check("int8")


def test_amp_faster_than_fp32_on_tensor_core_gpus_and_saved():
    # Big enough that the kernels, not the host's dispatch of the casts, set the time.
    g32, g = _trace(None, d=2048, batch_size=8192), _trace("bf16", d=2048, batch_size=8192)
    for gpu in ("A100-SXM4-80GB", "H100-SXM5-80GB"):
        assert predictor.predict(g, gpu).iteration_ms < predictor.predict(g32, gpu).iteration_ms
    with pytest.raises(InvalidArgumentError, match="amp"):
        predictor.predict(g, "A100-SXM4-80GB", dtype="float16")
    with pytest.warns(UserWarning, match="V100"):
        p = predictor.predict(g, "V100-SXM2-32GB")
    assert np.isfinite(p.iteration_ms) and p.iteration_ms > 0


def test_saved_graph_keeps_amp(tmp_path):
    g = _trace("fp16")
    path = g.save(tmp_path / "g.npz")
    assert predictor.Graph.load(path).amp == "fp16"


def _gpu(name):
    from predictor import hardware

    return hardware.get(name).features


def _gemm(m, n, k):
    d = np.zeros(L.MAX_DIMS, dtype=np.int64)
    d[:5] = (1, m, n, k, L.GEMM_B_T)
    return d


def test_tensor_core_time_physics():
    p = default_params()
    a100 = _gpu("A100-SXM4-80GB")
    t = precision.tensor_core_us(L.MATMUL, L.BF16, 1, _gemm(8192, 8192, 8192), a100, p, NO_WEIGHTS)
    # Never faster than the board's measured fraction of the bf16 peak allows.
    ideal = 2 * 8192 ** 3 / (a100[L.G_BF16_TFLOPS] * 1e12) * 1e6
    frac = a100[L.G_TC_FRACTION]
    assert frac == pytest.approx(0.869)
    assert ideal / frac <= t < ideal / frac * 1.2
    # The alignment rule: one element off a multiple of 8 costs the fallback kernel.
    t_odd = precision.tensor_core_us(L.MATMUL, L.BF16, 1, _gemm(8192, 8191, 8192), a100, p, NO_WEIGHTS)
    assert t_odd > 1.5 * t
    # Tile quantisation: 129 rows take two row tiles, like 256.
    t129 = precision.tensor_core_us(L.MATMUL, L.BF16, 1, _gemm(129, 8192, 8192), a100, p, NO_WEIGHTS)
    t256 = precision.tensor_core_us(L.MATMUL, L.BF16, 1, _gemm(256, 8192, 8192), a100, p, NO_WEIGHTS)
    assert t129 == pytest.approx(t256)


def test_tensor_core_gemm_splits_the_reduction_to_fill_the_waves():
    """A weight-gradient GEMM (1024 x 1024 output, K = 43008: BERT-large's at
    112 x 384 tokens) has 64 output tiles for the A100's 108 SMs: one slice a
    tile would idle 41 % of the GPU for the whole reduction. Split, it runs
    within a few percent of the forward GEMM of the same FLOPs."""
    p = default_params()
    a100 = _gpu("A100-SXM4-80GB")
    wgrad = precision.tensor_core_us(L.MATMUL, L.F16, 1, _gemm(1024, 1024, 43008), a100, p, NO_WEIGHTS)
    fwd = precision.tensor_core_us(L.MATMUL, L.F16, 1, _gemm(43008, 1024, 1024), a100, p, NO_WEIGHTS)
    ideal = 2 * 1024 * 1024 * 43008 / (a100[L.G_FP16_TFLOPS] * 1e12 * a100[L.G_TC_FRACTION]) * 1e6
    assert ideal < wgrad < 1.1 * ideal
    assert wgrad < 1.1 * fwd
    # The rule itself: 64 tiles on 108 SMs take 5 slices (320 blocks, 3 waves
    # of 108, 99 % full), not 1 (59 %); a GPU already full is not split.
    per_k, partial = 1e-2, 5.0
    assert precision.split_k(64, 108, 43008, 32, per_k, partial) == 5
    assert precision.split_k(1080, 108, 43008, 32, per_k, partial) == 1
    # A short reduction cannot be split below SPLIT_K_MIN elements a slice.
    assert precision.split_k(1, 108, 300, 32, per_k, partial) == 1
    # Splitting never loses against one slice under its own cost model.
    def cost(tiles, n):
        waves = -(-tiles * n // 108)
        k_slice = -(-8192 // n)
        return waves * (-(-k_slice // 32) * 32 * per_k + (partial if n > 1 else 0.0))

    for tiles in (1, 7, 50, 100, 109, 250):
        assert cost(tiles, precision.split_k(tiles, 108, 8192, 32, per_k, partial)) \
            <= cost(tiles, 1)


def test_split_rule_fills_waves_as_cublas_launches_do(data_dir):
    """The rule against the training files' own fp32 cuBLAS launches (their
    grids record the output tiles and the split): on GEMMs of fewer tiles than
    SMs and a long reduction, the last wave under the rule's split is as full
    as under the recorded one (median per GPU within 0.1), and fuller than
    one slice a tile leaves it."""
    import pandas as pd

    for name, gpu_id in (("NVIDIA_A100-PCIE-40GB", "A100-PCIE-40GB"),
                         ("Tesla_V100-PCIE-32GB", "V100-PCIE-32GB"), ("Tesla_T4", "T4")):
        g = _gpu(gpu_id)
        sms = int(g[L.G_SMS])
        df = pd.read_csv(data_dir / "train" / "linear" / f"{name}.csv")
        tile = df["Kernel Name"].str.extract(r"sgemm_(\d+)x(\d+)").astype(float)
        tiles = (df["Grid x"] * df["Grid y"]).to_numpy()
        k = df["N"].to_numpy()  # the files' reduction dim (benchmarks/README.md)
        rows = (tiles < sms) & (k >= 2048) & tile[0].notna().to_numpy()
        assert rows.sum() > 200
        per_sm_flops = g[L.G_FP32_TFLOPS] * 1e12 / sms
        per_sm_bw = g[L.G_MEM_BW_GBS] * 1e9 / sms

        def fill(t, s):
            return t * s / (np.ceil(t * s / sms) * sms)

        ours = []
        for t, kk, a, b in zip(tiles[rows], k[rows], tile[0][rows], tile[1][rows]):
            s = precision.split_k(int(t), sms, int(kk), 8, 2 * a * b / per_sm_flops * 1e6,
                                  2 * a * b * 4 / per_sm_bw * 1e6)
            ours.append(fill(t, s))
        recorded = np.median(fill(tiles[rows], df["Grid z"].to_numpy()[rows]))
        assert abs(np.median(ours) - recorded) < 0.1, gpu_id
        assert np.median(ours) > np.median(fill(tiles[rows], 1)) + 0.05, gpu_id


def test_rows_mixing_float_widths_count_their_bytes():
    """Under autocast, casts and fp16 + fp32 adds meet two widths in one
    kernel. A row's element counts are in its own dtype (the lowering's
    ``_row_dtype``: the narrowest floating one), so each tensor counts its
    bytes over that dtype's width: a cast of N fp32 elements to fp16 moves
    6N bytes (not 8N), an fp16 + fp32 add into fp32 moves 10N (not 6N)."""
    from predictor.families import TensorMeta, extract

    aten = torch.ops.aten
    n = 4096
    f32, f16 = TensorMeta((8, n), torch.float32), TensorMeta((8, n), torch.float16)
    (fam, dims, _), = extract(aten._to_copy.default, (f32,), {"dtype": torch.float16}, f16)[0]
    assert fam == L.COPY and dims[0] == 2 * 8 * n and dims[1] == 8 * n  # fp16 units
    (fam, dims, _), = extract(aten._to_copy.default, (f16,), {"dtype": torch.float32}, f32)[0]
    assert dims[0] == 8 * n and dims[1] == 2 * 8 * n  # fp16 units
    (fam, dims, _), = extract(aten.add.Tensor, (f16, f32), {}, f32)[0]
    assert fam == L.ELEMENTWISE and dims[0] == 3 * 8 * n and dims[1] == 2 * 8 * n
    # One width: counts unchanged; an index tensor keeps its element count.
    (_, dims, _), = extract(aten.add.Tensor, (f32, f32), {}, f32)[0]
    assert (dims[0], dims[1]) == (2 * 8 * n, 8 * n)
    idx = TensorMeta((8,), torch.int64)
    (_, dims, _), = extract(aten.index_select.default, (f16, 0, idx), {}, f16)[0]
    assert (dims[0], dims[1]) == (8 * n + 8, 8 * n)


def test_fp16_softmax_writes_fp32_and_its_backward_reads_it():
    """Under fp16 autocast softmax runs as one half_to_float kernel: fp16 in,
    fp32 out (12 MB written for 8 x 4096 x 96 elements, not 6); its backward
    reads the fp32 gradient and output and writes an fp16 gradient."""
    from predictor.families import TensorMeta, extract

    aten = torch.ops.aten
    shape = (8, 4096, 96)
    n = 8 * 4096 * 96
    f32, f16 = TensorMeta(shape, torch.float32), TensorMeta(shape, torch.float16)
    (fam, dims, _), = extract(aten._softmax.default, (f16, -1, True), {}, f32)[0]
    assert fam == L.SOFTMAX and (dims[0], dims[1]) == (n, 2 * n)  # fp16 units
    (fam, dims, _), = extract(aten._softmax_backward_data.default,
                              (f32, f32, -1, torch.float16), {}, f16)[0]
    assert fam == L.SOFTMAX_BWD and (dims[0], dims[1]) == (4 * n, n)
    # One width: as before.
    (_, dims, _), = extract(aten._softmax.default, (f32, -1, False), {}, f32)[0]
    assert (dims[0], dims[1]) == (n, n)
    # Traced: the head's log_softmax on the fp16 Linear output.
    g = _trace("fp16")
    d = g.ops.dims(8)[g.ops.family == L.SOFTMAX]
    assert len(d) and (d[:, L.MEM_WRITTEN] == 2 * d[:, L.MEM_READ]).all()
    # Calibration on a CUDA GPU times the half_to_float kernel for such rows.
    from calibration.measure import RowContext, _half_to_float

    for fam, dims, dt, wide in ((L.SOFTMAX, (n, 2 * n, 0, 96, n // 96), torch.float16, True),
                                (L.SOFTMAX_BWD, (4 * n, n, 0, 96, n // 96), torch.float16, True),
                                (L.SOFTMAX, (n, n, 0, 96, n // 96), torch.float16, False),
                                (L.SOFTMAX, (n, n, 0, 96, n // 96), torch.float32, False)):
        for device, expect in (("cuda", wide), ("cpu", False)):
            ctx = RowContext(fam, dt, 1, dims, "_softmax", 1, torch.device(device))
            assert _half_to_float(ctx, dims[0], dims[1], n) == expect


def test_which_rows_use_tensor_cores():
    p = default_params()
    for gpu, dtype, expect in (("V100-SXM2-32GB", L.F16, precision.TENSOR_CORE),
                               ("V100-SXM2-32GB", L.BF16, precision.AS_FP32),
                               ("T4", L.BF16, precision.AS_FP32),
                               ("P100-PCIE-16GB", L.F16, precision.AS_IS),
                               ("A10G", L.F16, precision.TENSOR_CORE),
                               ("A100-SXM4-80GB", L.BF16, precision.TENSOR_CORE),
                               ("A100-SXM4-80GB", L.F32, precision.AS_IS)):
        assert precision.mode_of(L.MATMUL, dtype, _gpu(gpu), p) == expect, (gpu, dtype)
    p[precision.P_TF32_MATMUL] = 1.0
    assert precision.mode_of(L.MATMUL, L.F32, _gpu("A100-SXM4-80GB"), p) == precision.TENSOR_CORE
    assert precision.mode_of(L.MATMUL, L.F32, _gpu("V100-SXM2-32GB"), p) == precision.AS_IS
    assert precision.mode_of(L.MATMUL, L.F32, _gpu("T4"), p) == precision.AS_IS
    # Boards whose TF32 rate only equals their fp32 one still run TF32 on
    # tensor cores (precision.has_tf32); ROCm's fp32 stays as it is.
    for gpu in ("RTX-3090", "RTX-4090", "A10G"):
        assert precision.mode_of(L.MATMUL, L.F32, _gpu(gpu), p) == precision.TENSOR_CORE, gpu
    assert precision.mode_of(L.MATMUL, L.F32, _gpu("MI250X"), p) == precision.AS_IS
    # Half-precision memory-bound rows: the fp32 model at the same bytes.
    d = np.array([1000, 1000, 1000, 10, 100, 0, 0, 0, 0, 0, 0, 0], dtype=np.int64)
    out = np.empty_like(d)
    precision.fp32_dims(L.ELEMENTWISE, L.BF16, d, out)
    assert list(out[:5]) == [500, 500, 500, 10, 50]


def test_tf32_matmul_switch_speeds_up_fp32_matmuls():
    g = _trace(None, d=2048, batch_size=8192)
    off = predictor.predict(g, "A100-SXM4-80GB")
    on = predictor.predict(g, "A100-SXM4-80GB", tf32_matmul=True)
    assert on.iteration_ms < off.iteration_ms
    # On a GeForce board TF32's rated peak is its fp32 one, but the tensor
    # cores reach more of it than the FFMA loop does.
    off = predictor.predict(g, "RTX-3090")
    on = predictor.predict(g, "RTX-3090", tf32_matmul=True)
    assert on.iteration_ms < 0.8 * off.iteration_ms
    t4 = predictor.predict(g, "T4")
    # No TF32 tensor cores on a T4: the same prediction, and a warning saying so.
    with pytest.warns(NotApplicableWarning, match="do not apply on T4"):
        same = predictor.predict(g, "T4", tf32_matmul=True)
    assert same.iteration_ms == pytest.approx(t4.iteration_ms)
    with warnings.catch_warnings():
        warnings.simplefilter("error", NotApplicableWarning)
        predictor.predict(g, "A100-SXM4-80GB", tf32_matmul=True)


# ---------------------------------------------------------------- ONNX under autocast

def _summary(graph):
    out: dict = {}
    for f, d, p, c in zip(graph.ops.family, graph.ops.dtype, graph.ops.phase, graph.ops.count):
        out[(int(p), int(f), int(d))] = out.get((int(p), int(f), int(d)), 0) + int(c)
    return out


@pytest.fixture(scope="module")
def block_onnx(tmp_path_factory):
    pytest.importorskip("onnx")
    path = tmp_path_factory.mktemp("amp") / "block.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Block(256), (torch.zeros(8, 256),), str(path), dynamo=False,
                          input_names=["x"], output_names=["y"], dynamic_axes={"x": {0: "b"}})
    return str(path)


@pytest.mark.parametrize("amp", ["bf16", "fp16"])
def test_onnx_under_autocast_matches_the_fx_trace(block_onnx, amp):
    # The same fp32 model, exported to ONNX and traced by the fx frontend under
    # autocast: the same kernels in the same dtypes in every phase (casts, the
    # fp32 layer norm and log_softmax, the GradScaler with fp16), so the same time.
    go = predictor.trace(block_onnx, batch_size=4096, amp=amp)
    gf = _trace(amp, d=256, batch_size=4096)
    assert go.amp == amp and not go.unsupported
    assert _summary(go) == _summary(gf)
    half = L.BF16 if amp == "bf16" else L.F16
    assert {d for d, _, _ in _rows(go, L.MATMUL)} == {half}
    assert {d for d, _, _ in _rows(go, L.OPTIMIZER)} == {L.F32}
    for gpu in ("A100-SXM4-80GB", "H100-SXM5-80GB", "V100-SXM2-32GB"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # bf16 on V100
            assert predictor.predict(go, gpu).iteration_ms == pytest.approx(
                predictor.predict(gf, gpu).iteration_ms, rel=1e-9)
    g32 = predictor.trace(block_onnx, batch_size=4096)
    assert predictor.predict(go, "A100-SXM4-80GB").iteration_ms \
        < predictor.predict(g32, "A100-SXM4-80GB").iteration_ms
    # Peak memory: the half copies of the weights (held by the cast cache),
    # half activations and fp32 gradients and optimizer state, as fx traces them.
    for b in (64, 4096, 65536):
        assert go.memory.peak([b])[0][0] == pytest.approx(gf.memory.peak([b])[0][0], rel=0.02)
    assert go.memory.peak([4096])[0][0] < g32.memory.peak([4096])[0][0]


def test_onnx_amp_refuses_a_half_precision_file(tmp_path):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    w = helper.make_tensor("w", TensorProto.FLOAT16, (8, 8), np.zeros(64, np.float16).tobytes(),
                           raw=True)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, ["b", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, ["b", 8])], initializer=[w])
    path = tmp_path / "half.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    with pytest.raises(InvalidArgumentError, match="FLOAT16 weights"):
        predictor.trace(str(path), amp="bf16")
    assert np.isfinite(predictor.predict(predictor.trace(str(path)), "A100-SXM4-80GB")
                       .iteration_ms)


# ---------------------------------------------------------------- every zoo model

# Ops the fp32 traces of these models already price from bytes (not added by amp).
FP32_GAPS = {"mv", "masked_fill_", "leaky_relu_backward"}
# Zoo models with recurrent layers: under autocast each LSTM layer traces as one
# fused layer kernel in the autocast dtype, on every CPU (autocast._lstm_layers).
RECURRENT = {"gnmt"}
GEMM_HEAVY = {"resnet50", "inception_v3", "transformer", "gnmt", "bert-large", "bert-base",
              "gpt2", "gpt2-large", "gpt3-xl", "gpt3-2.7b", "opt-1.3b"}
# Same code path as a model traced here (GPT2LMHeadModel as gpt2, BertForPreTraining
# as bert-large): left out to keep the file short, as in test_zoo.py.
SAME_PATH = {"gpt3-xl", "gpt3-2.7b", "bert-base"}
# Llama (6.7 B+ parameters): traced under autocast at two layers in tests/test_llama.py.
SAME_PATH |= {"llama2-7b", "llama2-13b", "llama2-70b", "llama3-8b", "llama3-70b"}
BIG = {"inception_v3", "bert-large", "gpt2-large", "opt-1.3b"}


def _zoo_params():
    return [pytest.param(n, marks=pytest.mark.slow) if n in BIG else n
            for n in zoo.names() if n not in SAME_PATH]


@pytest.mark.parametrize("name", _zoo_params())
def test_every_zoo_model_under_autocast(name):
    # bf16 in training, fp16 (with its GradScaler) in training and inference:
    # traced with nothing unsupported that fp32 has not, finite positive times on
    # GPUs with and without bf16 tensor cores, and on A100/H100 faster than fp32
    # for the models whose time is in GEMMs. gnmt's LSTM in half precision is the
    # case torch's CPU code decomposes (no oneDNN kernel for it on most CPUs): it
    # must trace as its fused layers all the same.
    entry = zoo.get(name)
    seq = entry.default_seq_len and min(entry.default_seq_len, 128)
    traced = {(amp, mode): predictor.trace(name, amp=amp, mode=mode, seq_len=seq)
              for amp, mode in ((None, "train"), ("bf16", "train"), ("fp16", "train"),
                                ("fp16", "inference"))}
    for (amp, mode), g in traced.items():
        assert g.amp == amp
        assert set(g.unsupported) <= FP32_GAPS, (amp, mode, g.unsupported)
        for gpu in ("A100-SXM4-80GB", "H100-SXM5-80GB", "V100-SXM2-32GB", "T4"):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # bf16 on V100 and T4
                p = predictor.predict(g, gpu)
            assert np.isfinite(p.iteration_ms) and p.iteration_ms > 0, (amp, mode, gpu)
            assert np.all(np.isfinite(p.memory_gb)) and np.all(p.memory_gb > 0)
    if name in GEMM_HEAVY:
        for gpu in ("A100-SXM4-80GB", "H100-SXM5-80GB"):
            t32 = predictor.predict(traced[(None, "train")], gpu).iteration_ms
            for amp in ("bf16", "fp16"):
                assert predictor.predict(traced[(amp, "train")], gpu).iteration_ms < t32, \
                    (amp, gpu)


class Recurrent(torch.nn.Module):
    def __init__(self, layers=2, bidirectional=True, batch_first=True, bias=True):
        super().__init__()
        self.lstm = torch.nn.LSTM(32, 64, num_layers=layers, bidirectional=bidirectional,
                                  batch_first=batch_first, dropout=0.1, bias=bias)
        self.head = torch.nn.Linear(128 if bidirectional else 64, 10)

    def forward(self, x):
        return self.head(self.lstm(x)[0])


@pytest.mark.parametrize("amp", ["bf16", "fp16"])
@pytest.mark.parametrize("bidirectional,batch_first,bias", [(True, True, True),
                                                            (False, False, False)])
def test_half_lstm_traces_as_its_fused_layers_on_any_cpu(amp, bidirectional, batch_first, bias):
    # torch's CPU lstm runs oneDNN's layer kernel in bf16 only on CPUs with bf16
    # instructions, and in fp16 only without grad; elsewhere it decomposes every
    # time step into GEMMs and pointwise ops. The trace must hold one LSTM layer
    # kernel per layer and direction, forward and backward, in the autocast
    # dtype, as under fp32, whatever CPU traces it.
    model = Recurrent(bidirectional=bidirectional, batch_first=batch_first, bias=bias)
    x = torch.zeros((4, 7, 32) if batch_first else (7, 4, 32))
    g32 = predictor.trace(model, (x,), loss_fn=lambda out: out.float().mean())
    g = predictor.trace(model, (x,), amp=amp, loss_fn=lambda out: out.float().mean())
    assert not g.unsupported, g.unsupported
    dtype = L.BF16 if amp == "bf16" else L.F16
    layers = 2 * (2 if bidirectional else 1)
    for family in (L.LSTM, L.LSTM_BWD):
        rows, rows32 = _rows(g, family), _rows(g32, family)
        assert sum(c for _, _, c in rows) == sum(c for _, _, c in rows32) == layers
        assert {d for d, _, _ in rows} == {dtype}
    for gpu in ("A100-SXM4-80GB", "V100-SXM2-32GB"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # bf16 on the V100
            t = predictor.predict(g, gpu).iteration_ms
        assert np.isfinite(t) and t > 0


def test_tensor_core_fraction_per_gpu():
    """A board with a published matmul measurement runs at its own fraction of
    the tensor-core peak; one without runs at TC_FRACTION, the median of the
    measured boards; a row with no fraction (a CPU, an old calibration file)
    falls back to TC_FRACTION rather than dividing by zero."""
    import tomllib
    from importlib import resources

    p = default_params()
    d = _gemm(8192, 8192, 8192)
    with resources.files("predictor.specs").joinpath("gpus.toml").open("rb") as fh:
        specs = tomllib.load(fh)["gpu"]
    measured = {}
    for g in specs:
        # GeForce boards' rated tensor peak is the half-rate fp32-accumulate
        # one and they boost above it (fractions of 1.0-1.15): not the same
        # quantity, so the median is over the other boards.
        if "tensor_core_matmul_fraction" in g and "GeForce" not in g["name"]:
            # One value per published measurement (boards a source names together
            # share one).
            measured[g["sources"]["tensor_core_matmul_fraction"]] = g["tensor_core_matmul_fraction"]
    assert len(measured) >= 8
    assert precision.TC_FRACTION == pytest.approx(float(np.median(list(measured.values()))), abs=0.01)

    def tflops(gpu):
        t = precision.tensor_core_us(L.MATMUL, L.BF16, 1, d, gpu, p, NO_WEIGHTS)
        return 2 * 8192 ** 3 / (t * 1e-6) / 1e12

    rtx4090, l40s = _gpu("RTX-4090"), _gpu("L40S")
    # Same chip (AD102-class), same rated bf16 peak per SM and clock: the GeForce
    # board holds its peak, the 350 W data-centre board does not.
    assert tflops(rtx4090) / rtx4090[L.G_BF16_TFLOPS] > 0.9
    assert tflops(l40s) / l40s[L.G_BF16_TFLOPS] < 0.76
    a30 = _gpu("A30")
    assert a30[L.G_TC_FRACTION] == precision.TC_FRACTION
    zeroed = a30.copy()
    zeroed[L.G_TC_FRACTION] = 0.0
    assert precision.tensor_core_us(L.MATMUL, L.BF16, 1, d, zeroed, p, NO_WEIGHTS) == \
        precision.tensor_core_us(L.MATMUL, L.BF16, 1, d, a30, p, NO_WEIGHTS)
    # the 150 W A10 at its own measured fraction, well below the median
    assert _gpu("A10")[L.G_TC_FRACTION] == pytest.approx(0.448)


def test_geforce_boards_without_a_measurement_take_the_geforce_median():
    """A GeForce board's rated tensor peak is its half-rate fp32-accumulate
    one, which the measured GeForce boards all exceed: one without a
    measurement takes their median, not the data-centre boards'."""
    import tomllib
    from importlib import resources

    from predictor import hardware

    with resources.files("predictor.specs").joinpath("gpus.toml").open("rb") as fh:
        specs = tomllib.load(fh)["gpu"]
    geforce = [g["tensor_core_matmul_fraction"] for g in specs
               if "tensor_core_matmul_fraction" in g and "GeForce" in g["name"]]
    assert len(geforce) >= 4 and min(geforce) > 1.0
    assert precision.GEFORCE_TC_FRACTION == pytest.approx(float(np.median(geforce)), abs=0.01)
    for gid in ("RTX-2080-TI", "RTX-3070", "RTX-3080"):
        gpu = hardware.get(gid)
        assert "tensor_core_matmul_fraction" not in gpu.spec and hardware.is_geforce(gpu.spec)
        assert gpu.features[L.G_TC_FRACTION] == precision.GEFORCE_TC_FRACTION
    for gid in ("A30", "QUADRO-RTX-8000"):   # not GeForce, not measured
        assert hardware.get(gid).features[L.G_TC_FRACTION] == precision.TC_FRACTION
    assert hardware.get("RTX-4090").features[L.G_TC_FRACTION] == pytest.approx(1.008)


def test_rounded_datasheet_peaks_still_mean_tensor_cores():
    """The RTX 3090's datasheet rounds fp16 to 71.0 against fp32 35.6 (2x is
    71.2): its half-precision convolutions and matmuls still run on tensor
    cores."""
    p = default_params()
    g = _gpu("RTX-3090")
    assert precision.tensor_core_peak(L.MATMUL, L.F16, g, p) > 0
    assert precision.tensor_core_peak(L.MATMUL, L.BF16, g, p) > 0
    assert precision.mode_of(L.CONV, L.F16, g, p) == precision.TENSOR_CORE
    # P100's packed fp16 (2x fp32, no bf16) is still not a tensor core.
    assert precision.tensor_core_peak(L.MATMUL, L.F16, _gpu("P100-PCIE-16GB"), p) == 0


class _Scalar(torch.nn.Module):
    """A head of one output per sample: under autocast its [batch] output
    is cast between bf16 and fp32 (a GAN discriminator, a regression head)."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 1)

    def forward(self, x):
        return torch.sigmoid(self.fc(x)).squeeze(-1)


@pytest.mark.parametrize("amp", ["bf16", "fp16"])
def test_casts_of_per_sample_tensors_keep_the_step_batch_scalable(amp):
    # A cast of b fp32 elements to 16 bits, counted in fp32 units, wrote
    # ceil(b / 2): not affine in the batch, and the whole step lost its batch
    # scaling (`sweep dcgan --amp bf16` failed). Counted in the narrowest
    # dtype (families.narrowest_float) every count is whole.
    g = predictor.trace(_Scalar(), (torch.zeros(8, 16),), amp=amp,
                        loss_fn=lambda o: torch.nn.functional.mse_loss(o.float(),
                                                                        torch.ones_like(o.float())))
    assert g.batch_scalable
    assert predictor.trace("dcgan", batch_size=8, amp=amp).batch_scalable
    res = predictor.sweep(g, ["A100-SXM4-80GB"], [7, 8, 1024])
    assert np.all(np.isfinite(res.iteration_ms)) and np.all(np.diff(res.iteration_ms[0]) >= 0)


def test_a_rows_dtype_is_its_narrowest_floating_one():
    from predictor.families import TensorMeta, narrowest_float

    f32, b16 = TensorMeta((3,), torch.float32), TensorMeta((3,), torch.bfloat16)
    idx = TensorMeta((3,), torch.int64)
    assert narrowest_float([f32, b16]) == torch.bfloat16
    assert narrowest_float([idx, f32]) == torch.float32
    assert narrowest_float([idx]) is None


def test_an_op_without_16_bit_kernels_under_amp_is_one_line_with_the_fix():
    class Spectral(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(16, 16)

        def forward(self, x):  # torch.fft has no bf16 kernels, on CUDA either
            return torch.fft.rfft(self.fc(x), dim=-1).abs().sum()

    from predictor.errors import TraceError

    with pytest.raises(TraceError, match=r"\.float\(\)") as exc:
        predictor.trace(Spectral(), (torch.zeros(4, 16),), amp="bf16", loss_fn=lambda o: o)
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize("amp", ["bf16", "fp16"])
def test_inference_peak_holds_autocasts_cached_weight_copies(amp):
    """Under autocast the 16-bit copy of each fp32 parameter stays in the cast
    cache until the autocast region ends, used again or not; in inference
    nothing else holds it. The predicted peak equals torch's MemTracker on
    the same step (fake tensors, CUDA's policy), byte for byte."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    def build():
        return torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(),
                                   torch.nn.Linear(2048, 2048), torch.nn.GELU(),
                                   torch.nn.Linear(2048, 512))

    def measured(batch):
        with autocast.CudaAutocast(amp) as policy, FakeTensorMode(allow_non_fake_inputs=True):
            model = build().eval()

            def step(x):
                with torch.no_grad(), policy.region():
                    out = model(x)
                del out

            step(torch.zeros(batch, 512))
            x = torch.zeros(batch, 512)
            tracker = MemTracker()
            tracker.track_external(model, x)
            with tracker:
                step(x)
            snap = tracker.get_tracker_snapshot("peak")
        return max(d["Total"] for d in snap.values())

    g = predictor.trace(build(), (torch.zeros(8, 512),), mode="inference", amp=amp)
    f32 = predictor.trace(build(), (torch.zeros(8, 512),), mode="inference")
    for b in (8, 64):
        peak = int(g.memory.peak([b], rounding=False, workspaces=False)[0][0])
        assert peak == measured(b)
        # fp32 weights and every 16-bit copy at once: above the fp32 step's peak.
        assert peak > int(f32.memory.peak([b], rounding=False, workspaces=False)[0][0])


def test_tf32_gemms_copy_operands_that_are_not_k_major():
    """TF32 tensor-core instructions read both operands K-major only: a
    weight gradient (A a transposed view) or an `x @ W` (B row-major) first
    copies that operand, a read and a write of it at the DRAM bandwidth.
    16-bit GEMMs transpose on the way and pay nothing."""
    from predictor import hardware, opmodel, reference
    from predictor.kernels.optime import op_time_us
    from predictor.kernels.roofline import P_ETA_M

    f = hardware.get("H200-SXM-141GB").features
    p, mlp = default_params(), opmodel.weights()
    p[precision.P_TF32_MATMUL] = 1.0
    m, n, k = 1024, 1024, 8192

    def t(layout, dtype=L.F32):
        d = np.zeros(L.MAX_DIMS)
        d[:5] = (1, m, n, k, layout)
        return op_time_us(L.MATMUL, dtype, 1, d, f, p, mlp), d

    copy = 2 * 4 * m * k / (f[L.G_MEM_BW_GBS] * 1e9 * p[P_ETA_M + L.COPY]) * 1e6
    k_major, _ = t(L.GEMM_B_T)
    assert t(L.GEMM_A_T | L.GEMM_B_T)[0] == pytest.approx(k_major + copy)  # A copied
    assert t(0)[0] == pytest.approx(k_major + copy)                         # B copied
    both, d = t(L.GEMM_A_T)
    assert both == pytest.approx(k_major + 2 * copy)
    assert reference.op_time_us(L.MATMUL, L.F32, 1, [int(v) for v in d], list(f), p, mlp) \
        == pytest.approx(both, rel=1e-9)
    assert t(L.GEMM_A_T, L.BF16)[0] == pytest.approx(t(L.GEMM_B_T, L.BF16)[0])


def test_h200_tf32_weight_gradients_priced_with_their_copies():
    """BERT-large b16 with TF32 matmuls on the H200, each row timed alone
    (benchmarks/data/h200/rows): the weight-gradient GEMMs, neither operand
    K-major, ran at 0.53-0.68 of their price without the copies. (The
    vocabulary head's, 30522 rows, misses alignment as well: not here.)"""
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "data" / "h200" / "rows" / \
        "bert-large-b16-tf32.npz"
    if not path.exists():
        pytest.skip(f"{path} is not in this checkout")
    from benchmarks.rows_gpu import CONFIGS, rows

    _, df = rows("bert-large-b16-tf32", CONFIGS["bert-large-b16-tf32"], path)
    sel = df[(df.family == "matmul") & df.dims.str.match(r"^1 \d+ \d+ \d+ 1$")
             & (df.measured_us > 50)]
    sel = sel[sel.dims.map(lambda s: all(int(v) % 128 == 0 for v in s.split()[1:4]))]
    assert len(sel) >= 3
    ratio = sel.predicted_us / sel.measured_us
    assert ((ratio > 0.85) & (ratio < 1.15)).all(), ratio.tolist()


def test_batched_tf32_gemms_pay_no_operand_copies():
    # The H200's attention GEMMs (256 x 512 x 512 x 64) took 90-101 us in
    # every layout, TF32 on.
    from predictor import hardware, opmodel
    from predictor.kernels.optime import op_time_us

    f = hardware.get("H200-SXM-141GB").features
    p, mlp = default_params(), opmodel.weights()
    p[precision.P_TF32_MATMUL] = 1.0
    times = set()
    for layout in (0, L.GEMM_A_T, L.GEMM_B_T):
        d = np.zeros(L.MAX_DIMS)
        d[:5] = (256, 512, 512, 64, layout)
        times.add(round(op_time_us(L.MATMUL, L.F32, 1, d, f, p, mlp), 6))
    assert len(times) == 1


def test_an_unaligned_gemm_pays_hoppers_measured_factor_there_and_two_elsewhere():
    """A GEMM whose dims break the alignment rule (BERT's 30,522-class
    decoder) costs 3.1x its aligned twin on Hopper, which an H200 measured
    (kernels.precision.UNALIGNED_SLOWDOWN_HOPPER), as on data-centre
    Blackwell, whose tensor cores are TMA-fed too, and 2x on other GPUs
    (Ampere, GeForce Blackwell); an aligned one of the same tiles costs the
    same on both."""
    p = default_params()
    aligned, unaligned = _gemm(8192, 30520, 1024), _gemm(8192, 30522, 1024)
    assert precision.aligned(L.MATMUL, L.BF16, aligned)
    assert not precision.aligned(L.MATMUL, L.BF16, unaligned)
    for gid, factor in (("H100-SXM5-80GB", 3.1), ("H200-SXM-141GB", 3.1),
                        ("B200", 3.1), ("A100-SXM4-80GB", 2.0), ("RTX-5090", 2.0)):
        gpu = _gpu(gid)
        assert precision.unaligned_slowdown(gpu) == factor
        t_a = precision.tensor_core_us(L.MATMUL, L.BF16, 1, aligned, gpu, p, NO_WEIGHTS)
        t_u = precision.tensor_core_us(L.MATMUL, L.BF16, 1, unaligned, gpu, p, NO_WEIGHTS)
        # compute-bound at this size: the factor, give or take the launch
        assert t_u / t_a == pytest.approx(factor, rel=0.02), gid
    assert precision.UNALIGNED_SLOWDOWN_HOPPER > precision.UNALIGNED_SLOWDOWN


def test_an_unaligned_tf32_gemm_never_costs_more_than_its_fp32_kernels():
    """TF32 permits tensor cores; it does not oblige them. Where a GEMM's dims
    break the alignment rule the library's FFMA kernels stay candidates
    (kernels.precision.cuda_cores_compete), so the row costs the cheaper of
    the two prices: on a GeForce-class chip (TF32 peak = fp32 peak) the
    slowed tensor-core price of a large GEMM exceeds the fp32 one, and a
    GEMV (GNMT's attention score, N = 1) is never priced as 128 x 128
    tensor-core tiles. An aligned twin keeps the tensor-core price; the
    reference implementation agrees."""
    from predictor import hardware, opmodel, reference
    from predictor.kernels.optime import op_time_us

    mlp = opmodel.weights()
    tf32, fp32 = default_params(), default_params()
    tf32[precision.P_TF32_MATMUL] = 1.0
    gemv = np.zeros(L.MAX_DIMS, dtype=np.int64)
    gemv[:5] = (1, 1024, 1, 861184, L.GEMM_A_T)
    for gid in ("RTX-3090", "A10", "A100-SXM4-80GB", "H100-SXM5-80GB"):
        f = hardware.get(gid).features
        for d in (_gemm(8352, 31794, 1024), gemv):
            assert precision.cuda_cores_compete(L.MATMUL, L.F32, d)
            t = op_time_us(L.MATMUL, L.F32, 1, d, f, tf32, mlp)
            tc = precision.tensor_core_us(L.MATMUL, L.F32, 1, d, f, tf32, mlp)
            cuda = op_time_us(L.MATMUL, L.F32, 1, d, f, fp32, mlp)
            assert t == pytest.approx(min(tc, cuda), rel=1e-9), gid
            assert reference.op_time_us(L.MATMUL, L.F32, 1, [int(v) for v in d], list(f),
                                        tf32, mlp) == pytest.approx(t, rel=1e-9), gid
        aligned = _gemm(8352, 31792, 1024)
        assert not precision.cuda_cores_compete(L.MATMUL, L.F32, aligned)
        assert op_time_us(L.MATMUL, L.F32, 1, aligned, f, tf32, mlp) == pytest.approx(
            precision.tensor_core_us(L.MATMUL, L.F32, 1, aligned, f, tf32, mlp), rel=1e-9)
    # Where it decides: the GA102's classifier GEMM and every board's GEMV.
    f = hardware.get("RTX-3090").features
    big = _gemm(8352, 31794, 1024)
    assert op_time_us(L.MATMUL, L.F32, 1, big, f, fp32, mlp) \
        < precision.tensor_core_us(L.MATMUL, L.F32, 1, big, f, tf32, mlp)
    f = hardware.get("H100-SXM5-80GB").features
    assert op_time_us(L.MATMUL, L.F32, 1, gemv, f, fp32, mlp) \
        < precision.tensor_core_us(L.MATMUL, L.F32, 1, gemv, f, tf32, mlp)
    # A bf16 row keeps its tensor-core price: no fp32 kernel runs it.
    assert not precision.cuda_cores_compete(L.MATMUL, L.BF16, _gemm(8192, 30522, 1024))


def test_a_tf32_row_priced_on_cuda_cores_says_learned():
    """The op table's basis follows the kernels that priced a row: an
    unaligned TF32 GEMM whose fp32 price won (on an RTX 3090, a classifier of
    1,001 classes) is the learned fp32 model's; TF32 off, every fp32 GEMM
    is learned; an aligned twin on tensor cores stays analytical."""
    head = lambda n: torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.Linear(1024, n))
    rows = lambda b: torch.randn(b, 1024)
    unaligned = predictor.trace(lambda: head(1001), rows, batch_size=8192, name="u")
    aligned = predictor.trace(lambda: head(1000), rows, batch_size=8192, name="a")
    p = predictor.predict(unaligned, "RTX-3090", tf32_matmul=True)
    mm = p.ops[p.ops.family == "matmul"]
    assert (mm.basis == "learned").any() and (mm.basis == "analytical").any()
    assert (predictor.predict(unaligned, "RTX-3090").ops.query("family == 'matmul'").basis
            == "learned").all()
    q = predictor.predict(aligned, "RTX-3090", tf32_matmul=True)
    assert (q.ops[q.ops.family == "matmul"].basis == "analytical").all()


def test_an_odd_16_bit_gemm_runs_at_the_align1_kernels_rate():
    """A 16-bit GEMM with an odd dim the library reads (2-byte rows: an
    odd-sized vocabulary) runs CUTLASS's Turing-generation align1 kernel on
    any GPU, at ALIGN1_FLOP_PER_SM_CLOCK: what an RTX 4090 measured for it
    (median 111.45 TFLOP/s, pytorch/pytorch issue 181718), so it costs its
    aligned rate over that, 1.5x on the RTX 4090, about 5x on an A100 and 9x
    on an H100, where an even unaligned dim keeps the slowdown factor; not a
    GEMV, not TF32; the reference implementation agrees."""
    from predictor import hardware, opmodel, reference
    from predictor.kernels.optime import op_time_us

    f = hardware.get("RTX-4090").features
    assert precision.ALIGN1_FLOP_PER_SM_CLOCK * f[L.G_SMS] * f[L.G_CLOCK_MHZ] * 1e6 \
        == pytest.approx(111.45e12, rel=1e-3)
    p, mlp = default_params(), opmodel.weights()
    aligned, odd = _gemm(8192, 30528, 1024), _gemm(8192, 30521, 1024)
    assert precision.two_byte_rows(L.MATMUL, L.BF16, odd)
    assert not precision.two_byte_rows(L.MATMUL, L.BF16, _gemm(8192, 30522, 1024))
    assert not precision.two_byte_rows(L.MATMUL, L.F32, odd)
    gemv = _gemm(8192, 1, 1023)
    assert not precision.two_byte_rows(L.MATMUL, L.BF16, gemv)
    ratios = {}
    for gid in ("RTX-4090", "A100-SXM4-80GB", "H100-SXM5-80GB", "V100-SXM2-16GB"):
        g = hardware.get(gid).features
        t_a = precision.tensor_core_us(L.MATMUL, L.BF16 if gid != "V100-SXM2-16GB" else L.F16,
                                       1, aligned, g, p, NO_WEIGHTS)
        dtype = L.BF16 if gid != "V100-SXM2-16GB" else L.F16
        t_o = precision.tensor_core_us(L.MATMUL, dtype, 1, odd, g, p, NO_WEIGHTS)
        rate = precision.tensor_core_peak(L.MATMUL, dtype, g, p) / g[L.G_SMS] \
            * precision.tc_fraction(g)
        cap = precision.ALIGN1_FLOP_PER_SM_CLOCK * g[L.G_CLOCK_MHZ] * 1e6
        ratios[gid] = t_o / t_a
        assert t_o / t_a == pytest.approx(max(rate / cap, 1.0), rel=0.02), gid
        assert reference.op_time_us(L.MATMUL, dtype, 1, [int(v) for v in odd], list(g), p,
                                    mlp) == pytest.approx(op_time_us(L.MATMUL, dtype, 1, odd, g,
                                                                     p, mlp), rel=1e-9), gid
    assert 1.3 < ratios["RTX-4090"] < 1.7 and 4.5 < ratios["A100-SXM4-80GB"] < 6.0
    assert ratios["H100-SXM5-80GB"] > 8.0
