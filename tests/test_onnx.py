"""The ONNX frontend against the fx frontend: the same model exported with
``torch.onnx.export`` must give the same op families, the same GEMM FLOPs
(within 1 %) and the same predicted times (within 5 %), for training (backward
and optimizer synthesised from the ONNX forward) and for inference.

Models: the zoo's ResNet-50, and BERT with bert-large's layer shapes (hidden
1024, 16 heads, FFN 4096) but 2 layers and a 4096-token vocabulary, so that
exporting it stays fast in CI: every layer of the real bert-large is one of
these. ``benchmarks/onnx_vs_fx.py`` runs the full-size models.
"""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

import predictor
from predictor.families import TensorMeta
from predictor.errors import FileFormatError, InvalidArgumentError
from predictor.frontend import training_synthesis as synthesis
from predictor.frontend.onnx import trace_onnx
from predictor.kernels import layout as L

pytestmark = pytest.mark.filterwarnings("ignore")

GPUS = ("T4", "A100-SXM4-80GB", "H100-SXM5-80GB")


def export(model: torch.nn.Module, inputs: tuple, path, names: list[str], outputs: list[str],
           dynamic: dict, opset: int = 17) -> str:
    model.train()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, inputs, str(path), dynamo=False, input_names=names,
                          output_names=outputs, dynamic_axes=dynamic, opset_version=opset,
                          training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=True)
    return str(path)


def by_family(graph, batch: int) -> dict:
    """(phase, family) -> [count, FLOPs] at `batch`."""
    ops = graph.ops
    flops, _ = ops.work(batch)
    out: dict = {}
    for i in range(len(ops)):
        key = (L.PHASE_NAMES[ops.phase[i]], L.FAMILY_NAMES[ops.family[i]])
        c = out.setdefault(key, [0, 0.0])
        c[0] += int(ops.count[i])
        c[1] += float(flops[i] * ops.count[i])
    return out


def gemm_flops(graph, batch: int) -> float:
    fams = by_family(graph, batch)
    gemm = {"matmul", "conv", "conv_dgrad", "conv_wgrad", "attention", "attention_bwd"}
    return sum(v[1] for (_, f), v in fams.items() if f in gemm)


def assert_agree(fx_graph, onnx_graph, batches=(1, 8, 64)):
    b0 = batches[-1]
    a, c = by_family(fx_graph, b0), by_family(onnx_graph, b0)
    assert set(a) == set(c), f"families differ: {sorted(set(a) ^ set(c))}"
    for key in a:
        assert a[key][0] == c[key][0], f"{key}: {a[key][0]} ops (fx) vs {c[key][0]} (onnx)"
    for b in batches:
        gf, go = gemm_flops(fx_graph, b), gemm_flops(onnx_graph, b)
        assert go == pytest.approx(gf, rel=0.01)
        for gpu in GPUS:
            pf = predictor.predict(fx_graph, gpu, batch_size=b)
            po = predictor.predict(onnx_graph, gpu, batch_size=b)
            assert po.iteration_ms == pytest.approx(pf.iteration_ms, rel=0.05), (gpu, b)
            assert np.isfinite(po.iteration_ms) and po.iteration_ms > 0
    assert onnx_graph.parameters == fx_graph.parameters
    assert onnx_graph.trainable_parameters == fx_graph.trainable_parameters
    assert onnx_graph.unsupported == {}
    assert_same_memory(fx_graph, onnx_graph, batches)


def assert_same_memory(fx_graph, onnx_graph, batches, rel=0.02):
    """The ONNX memory pass (liveness from the synthesised step) against the
    fx one (liveness from the traced step): the same peak, phase and state."""
    from predictor.optable import OPTIMIZER_STATE, PARAMETERS

    mf, mo = fx_graph.memory, onnx_graph.memory
    assert mo is not None and mo.training == mf.training
    for b in batches:
        peak_f, peak_o = mf.peak([b])[0][0], mo.peak([b])[0][0]
        assert peak_o == pytest.approx(peak_f, rel=rel), b
        assert mo.breakdown(b)["peak_phase"] == mf.breakdown(b)["peak_phase"]
    for cat in (PARAMETERS, OPTIMIZER_STATE):
        assert mo.category_bytes(cat) == pytest.approx(mf.category_bytes(cat), rel=1e-3)
    for gpu in GPUS:
        m_f = predictor.predict(fx_graph, gpu, batch_size=batches[-1]).memory_gb
        m_o = predictor.predict(onnx_graph, gpu, batch_size=batches[-1]).memory_gb
        assert m_o == pytest.approx(m_f, rel=rel)


# ---------------------------------------------------------------- ResNet-50 --

@pytest.fixture(scope="module")
def resnet50_onnx(tmp_path_factory):
    from predictor.zoo import vision

    path = tmp_path_factory.mktemp("onnx") / "resnet50.onnx"
    return export(vision.build_resnet50(), (torch.randn(2, 3, 224, 224),), path, ["images"],
                  ["logits"], {"images": {0: "batch"}, "logits": {0: "batch"}})


def test_resnet50_training_matches_fx(resnet50_onnx, resnet50_graph):
    g = predictor.trace(resnet50_onnx, batch_size=64, loss_fn="cross_entropy")
    assert g.mode == "train" and g.batch_size == 64 and g.batch_scalable
    assert_agree(resnet50_graph, g)
    # conv -> dgrad (not for the first layer) + wgrad, as autograd runs them.
    fams = by_family(g, 64)
    assert fams[("backward", "conv_dgrad")][0] == fams[("forward", "conv")][0] - 1
    assert fams[("backward", "conv_wgrad")][0] == fams[("forward", "conv")][0]


def test_resnet50_inference_matches_fx(resnet50_onnx):
    fx = predictor.trace("resnet50", batch_size=64, mode="inference")
    g = predictor.trace(resnet50_onnx, batch_size=64, mode="inference")
    assert_agree(fx, g)
    assert set(L.PHASE_NAMES[p] for p in g.ops.phase) == {"forward"}


def test_batch_from_symbolic_dim_rescales(resnet50_onnx):
    g8 = trace_onnx(resnet50_onnx, batch_size=8, mode="inference")
    g64 = trace_onnx(resnet50_onnx, batch_size=64, mode="inference")
    p8 = predictor.predict(g8, "A100-SXM4-80GB", batch_size=64)
    p64 = predictor.predict(g64, "A100-SXM4-80GB")
    assert p8.iteration_ms == pytest.approx(p64.iteration_ms, rel=1e-12)
    assert trace_onnx(resnet50_onnx, mode="inference").batch_size == 1  # no flag: batch 1


# --------------------------------------------------------------------- BERT --

def _bert_module():
    from predictor.zoo import hf

    cfg = hf.bert_config("bert-large")
    cfg.num_hidden_layers = 2
    cfg.vocab_size = 4096
    return hf._from_config("AutoModelForPreTraining", cfg)


@pytest.fixture(scope="module")
def bert_onnx(tmp_path_factory):
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("onnx") / "bert.onnx"
    dyn = {"input_ids": {0: "batch", 1: "sequence"}, "mlm": {0: "batch", 1: "sequence"},
           "nsp": {0: "batch"}}
    # Opset 17: GELU is written out with Erf, which the frontend fuses back.
    return export(_bert_module(), (torch.zeros(2, 16, dtype=torch.long),), path, ["input_ids"],
                  ["mlm", "nsp"], dyn, opset=17)


@pytest.mark.parametrize("mode", ["train", "inference"])
def test_bert_matches_fx(bert_onnx, mode):
    from predictor.zoo import hf

    ids = torch.zeros(8, 128, dtype=torch.long)
    fx = predictor.trace(_bert_module, (ids,), loss_fn=hf.bert_pretraining_loss, mode=mode)
    g = predictor.trace(bert_onnx, batch_size=8, seq_len=128, mode=mode, loss_fn="cross_entropy")
    assert_agree(fx, g, batches=(1, 8, 32))
    fams = by_family(g, 8)
    assert fams[("forward", "elementwise")][0] == by_family(fx, 8)[("forward", "elementwise")][0]
    if mode == "train":
        # The tied MLM decoder is one parameter: its two gradients are added.
        assert g.parameters < sum(int(np.prod(t.dims))
                                  for t in onnx.load(bert_onnx).graph.initializer)


class _SDPABlock(torch.nn.Module):
    """Self-attention with F.scaled_dot_product_attention (the Hugging Face default)."""

    def __init__(self, causal: bool):
        super().__init__()
        self.qkv, self.out, self.causal = torch.nn.Linear(512, 1536), torch.nn.Linear(512, 512), causal

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, 8, 64).permute(2, 0, 3, 1, 4)
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.out(y.transpose(1, 2).reshape(b, t, 512))


@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_export_is_one_attention_kernel(tmp_path, causal):
    # The exporter writes SDPA out as MatMul(q*s, k^T*s) [+ mask] Softmax MatMul;
    # PyTorch runs one fused kernel, and so does the prediction.
    torch.manual_seed(0)
    block = _SDPABlock(causal)
    path = export(block, (torch.randn(2, 16, 512),), tmp_path / "sdpa.onnx", ["x"], ["y"],
                  {"x": {0: "batch", 1: "seq"}})
    for mode in ("train", "inference"):
        fx = predictor.trace(block, (torch.randn(16, 512, 512),), mode=mode)
        g = trace_onnx(path, batch_size=16, seq_len=512, mode=mode)
        a, c = by_family(fx, 16), by_family(g, 16)
        assert c[("forward", "attention")] == a[("forward", "attention")]
        assert ("forward", "softmax") not in c and ("forward", "elementwise") not in c
        if mode == "train":
            assert c[("backward", "attention_bwd")] == a[("backward", "attention_bwd")]
        for gpu in GPUS:
            assert predictor.predict(g, gpu).iteration_ms == pytest.approx(
                predictor.predict(fx, gpu).iteration_ms, rel=0.05)
        # Peak memory: the saved q, k, v and the backward's fp32 dq accumulator.
        assert_same_memory(fx, g, (1, 16, 64))


def test_symbolic_sequence_needs_a_size(bert_onnx):
    with pytest.raises(InvalidArgumentError, match="sequence.*seq_len"):
        trace_onnx(bert_onnx, batch_size=4)
    g = trace_onnx(bert_onnx, batch_size=4, dims={"sequence": 64}, mode="inference")
    assert g.batch_size == 4


# ------------------------------------------------------- hand-built graphs --

def _model(nodes, inputs, outputs, inits=(), opset=17, domains=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    ops = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, 1) for d in domains]
    return helper.make_model(graph, opset_imports=ops)


def _w(name, *shape):
    return helper.make_tensor(name, TensorProto.FLOAT, shape,
                              np.random.default_rng(0).standard_normal(shape).astype(np.float32)
                              .ravel().tolist())


def _save(model, tmp_path, name="m.onnx"):
    path = tmp_path / name
    onnx.save(model, str(path))
    return str(path)


def test_unsupported_ops_are_listed_and_estimated(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 64])
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("FancyOp", ["h"], ["z"], domain="example.custom"),
             helper.make_node("Relu", ["z"], ["y"])]
    path = _save(_model(nodes, [x], [y], [_w("w", 64, 64)], domains=["example.custom"]), tmp_path)
    g = trace_onnx(path, batch_size=32)
    assert g.unsupported == {"example.custom.FancyOp": 1}
    unsupported = g.ops.family == L.UNSUPPORTED
    assert unsupported.any()
    # estimated from bytes moved, in both passes, never dropped
    assert set(g.ops.phase[unsupported]) == {L.FORWARD, L.BACKWARD}
    assert np.all(g.ops.work(32)[1][unsupported] > 0)
    p = predictor.predict(g, "T4")
    assert p.unsupported == {"example.custom.FancyOp": 1} and p.iteration_ms > 0


def test_a_graph_without_trainable_parameters_says_to_predict_inference(tmp_path):
    """No float initializer the loss depends on: no training step to
    synthesise, said in one line naming the file, as the fx path says it."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 64])
    path = _save(_model([helper.make_node("Relu", ["x"], ["y"])], [x], [y]), tmp_path)
    with pytest.raises(InvalidArgumentError, match="no trainable parameters") as exc:
        trace_onnx(path, batch_size=8)
    assert path in str(exc.value) and "\n" not in str(exc.value)
    assert predictor.predict(trace_onnx(path, batch_size=8, mode="inference"), "T4").forward_ms > 0


def test_attention_op_maps_to_the_attention_family(tmp_path):
    if onnx.defs.onnx_opset_version() < 23:
        pytest.skip("this onnx has no Attention op")
    shape = ["batch", 8, 128, 64]
    ins = [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in "qkv"]
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)
    nodes = [helper.make_node("Attention", ["q", "k", "v"], ["y"], is_causal=1)]
    path = _save(_model(nodes, ins, [y], opset=23), tmp_path)
    g = trace_onnx(path, batch_size=4, mode="inference")
    assert list(g.ops.family) == [L.ATTENTION]
    assert list(g.ops.dims(4)[0][:7]) == [4, 8, 128, 128, 64, 64, 1]


def _recurrent_traces(tmp_path, kind, **kw):
    """A 2-layer `kind` (nn.LSTM, nn.GRU, nn.RNN) with a linear head, traced
    from its ONNX export and by fx, both at batch 16 (dim 1)."""
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = kind(32, 64, num_layers=2, **kw)
            self.head = torch.nn.Linear(64, 10)

        def forward(self, x):
            return self.head(self.rnn(x)[0])

    torch.manual_seed(0)
    net = Net()
    path = export(net, (torch.randn(20, 2, 32),), tmp_path / "rnn.onnx", ["x"], ["y"],
                  {"x": {1: "batch"}, "y": {1: "batch"}})
    return trace_onnx(path, batch_size=16), predictor.trace(net, (torch.randn(20, 16, 32),),
                                                             batch_dim=1)


def test_lstm_matches_fx(tmp_path):
    g, fx = _recurrent_traces(tmp_path, torch.nn.LSTM)
    for fam in ("lstm", "lstm_bwd"):
        assert by_family(g, 16)[("forward" if fam == "lstm" else "backward", fam)][0] == 2
    lstm = g.ops.family == L.LSTM
    assert sorted(tuple(r[:4]) for r in g.ops.dims(16)[lstm]) == \
        sorted(tuple(r[:4]) for r in fx.ops.dims(16)[fx.ops.family == L.LSTM])
    assert g.parameters == fx.parameters
    # The fx trace keeps the buffers of the CPU's LSTM (mkldnn_rnn_layer's
    # workspace), the ONNX pass what cuDNN's backward reads: close, not equal.
    assert_same_memory(fx, g, (1, 16, 256), rel=0.12)


def test_static_batch_model_is_fixed_at_its_batch(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 32])
    shape = helper.make_tensor("s", TensorProto.INT64, [2], [2, 32])
    nodes = [helper.make_node("Reshape", ["x", "s"], ["r"]),  # a batch baked into the graph
             helper.make_node("Relu", ["r"], ["y"])]             # and some work to predict
    path = _save(_model(nodes, [x], [y], [shape]), tmp_path)
    g = trace_onnx(path, mode="inference")
    assert g.batch_size == 4 and not g.batch_scalable
    with pytest.raises(InvalidArgumentError, match="only runs at batch 4"):
        trace_onnx(path, batch_size=8, mode="inference")


def test_gelu_erf_pattern_is_one_kernel(tmp_path):
    net = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 16))
    path = export(net, (torch.randn(2, 16),), tmp_path / "gelu.onnx", ["x"], ["y"],
                  {"x": {0: "batch"}}, opset=17)
    assert "Erf" in {n.op_type for n in onnx.load(path).graph.node}
    g = trace_onnx(path, batch_size=8)
    names = {g.ops.op_names[i] for i in g.ops.op}
    assert "gelu" in names and "gelu_backward" in names and "erf" not in names


def test_cli_predicts_an_onnx_file(resnet50_onnx, capsys):
    from predictor import cli

    assert cli.main(["predict", resnet50_onnx, "-b", "16", "--gpus", "T4,H100", "--json"]) == 0
    import json

    out = json.loads(capsys.readouterr().out)
    assert out["batch_size"] == 16 and len(out["predictions"]) == 2
    assert all(p["iteration_ms"] > 0 for p in out["predictions"])


def test_loss_choice_and_errors(resnet50_onnx):
    with pytest.raises(InvalidArgumentError, match="loss"):
        trace_onnx(resnet50_onnx, loss="hinge")
    with pytest.raises(InvalidArgumentError, match="by name"):
        predictor.trace(resnet50_onnx, loss_fn=lambda y: y.sum())
    with pytest.raises(FileFormatError, match="no such ONNX file"):
        predictor.trace("does_not_exist.onnx")


# ------------------------------------------------ the shared backward rules --

def test_backward_rules_mirror_autograd():
    T = TensorMeta
    f32 = torch.float32
    aten = torch.ops.aten
    x, w, y = T((64, 128), f32), T((128, 256), f32), T((64, 256), f32)
    mm = synthesis.Call(aten.mm.default, (x, w), out=y)
    calls = synthesis.backward_calls(mm, (True, True))
    assert [c.op for c in calls] == [aten.mm.default, aten.mm.default]
    assert [c.out.shape for c in calls] == [(64, 128), (128, 256)]
    assert synthesis.backward_calls(mm, (False, True))[0].out.shape == (128, 256)
    assert synthesis.backward_calls(mm, (False, False)) == []
    # optimizer: the same foreach kernels as the traced step
    rows = synthesis.optimizer_rows([T((1000, 10), f32), T((10,), f32)], "adam")
    assert {r[0] for r in rows} == {L.OPTIMIZER} and len(rows) == 7
    assert synthesis.optimizer_rows([T((3,), f32)], None) == []


class _TwoHeads(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body, self.a, self.b = (torch.nn.Linear(64, 128), torch.nn.Linear(128, 10),
                                     torch.nn.Linear(128, 7))

    def forward(self, x):
        h = torch.relu(self.body(x))
        return self.a(h), self.b(h)


@pytest.mark.parametrize("loss", ["cross_entropy"])
def test_named_losses_agree_across_frontends(tmp_path, loss):
    """loss_fn="mean" / "cross_entropy" name the same loss for a PyTorch model
    and its ONNX export: the same kernels, time and peak memory."""
    torch.manual_seed(0)
    net = _TwoHeads()
    path = export(net, (torch.randn(2, 64),), tmp_path / "heads.onnx", ["x"], ["a", "b"],
                  {"x": {0: "batch"}, "a": {0: "batch"}, "b": {0: "batch"}})
    fx = predictor.trace(net, (torch.randn(32, 64),), loss_fn=loss)
    g = predictor.trace(path, batch_size=32, loss_fn=loss)
    assert_agree(fx, g, batches=(1, 32, 512))
    with pytest.raises(InvalidArgumentError, match="loss_fn must be a function"):
        predictor.trace(net, (torch.randn(32, 64),), loss_fn="xent")


def test_memory_pass_failure_is_a_note_not_a_crash(tmp_path, monkeypatch):
    """Peak memory is an addition to the time: if the memory pass fails on a
    file, the prediction stands and a note says why memory is missing."""
    from predictor.frontend import onnx_memory

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 64])
    path = _save(_model([helper.make_node("MatMul", ["x", "w"], ["y"])], [x], [y],
                        [_w("w", 64, 64)]), tmp_path)

    def broken(*args, **kwargs):
        raise ValueError("a storage of no size")

    monkeypatch.setattr(onnx_memory, "profile", broken)
    g = trace_onnx(path, batch_size=8)
    assert g.memory is None
    assert any("peak memory could not be derived" in n and "a storage of no size" in n
               for n in g.notes)
    assert predictor.predict(g, "T4").iteration_ms > 0


def test_predict_takes_a_saved_graph_at_another_batch(tmp_path, capsys):
    import json

    from predictor import cli

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 256])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 256])
    g = trace_onnx(_save(_model([helper.make_node("MatMul", ["x", "w"], ["y"])], [x], [y],
                                [_w("w", 256, 256)]), tmp_path), batch_size=8)
    saved = str(g.save(tmp_path / "g.npz"))
    assert cli.main(["predict", saved, "-b", "512", "--gpus", "T4", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["batch_size"] == 512 and doc["predictions"][0]["fits"] is True
    want = predictor.predict(g, "T4", batch_size=512).iteration_ms
    assert doc["predictions"][0]["iteration_ms"] == pytest.approx(want, rel=1e-6)
    # Options that change the trace cannot apply to a saved graph: one line.
    assert cli.main(["predict", saved, "--inference"]) == 2
    assert "cannot change a saved graph" in capsys.readouterr().err


def test_cli_loss_option(tmp_path, capsys):
    import json

    from predictor import cli

    torch.manual_seed(0)
    path = export(_TwoHeads(), (torch.randn(2, 64),), tmp_path / "heads.onnx", ["x"], ["a", "b"],
                  {"x": {0: "batch"}, "a": {0: "batch"}, "b": {0: "batch"}})
    ops = {}
    for loss in ("mean", "cross_entropy"):
        assert cli.main(["predict", path, "-b", "64", "--gpus", "T4", "--loss", loss,
                         "--json"]) == 0
        doc = json.loads(capsys.readouterr().out)
        ops[loss] = doc["flops_per_iteration"]
    assert ops["mean"] != ops["cross_entropy"]
    assert cli.main(["predict", path, "--inference", "--loss", "mean"]) == 2
    assert "--loss mean does not apply to --inference" in capsys.readouterr().err
    # Layouts need the traced PyTorch model; data parallelism alone has a way.
    assert cli.main(["predict", path, "--dp", "2"]) == 2
    err = capsys.readouterr().err
    assert "no layout analysis" in err and "--gpus-per-node N" in err and len(err.splitlines()) == 1


def _saved_bytes_by_autograd(fn, args) -> int:
    """Bytes of the tensors autograd saves for backward when `fn(*args)` runs."""
    saved: list[int] = []

    def pack(t):
        saved.append(t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*args)
    return sum(saved)


def _saved_bytes_by_rule(op, args, out, needs) -> int:
    call = synthesis.Call(op, tuple(_meta(a) for a in args), out=_meta(out))
    arg_pos, out_pos = synthesis.saved_for_backward(call, needs)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    return sum(args[i].numel() * args[i].element_size() for i in arg_pos) + \
        sum(outs[j].numel() * outs[j].element_size() for j in out_pos)


def _meta(x):
    if isinstance(x, torch.Tensor):
        return TensorMeta(tuple(x.shape), x.dtype)
    if isinstance(x, (tuple, list)):
        return type(x)(_meta(i) for i in x)
    return x


def test_saved_tensors_mirror_autograd():
    """What the memory pass of a synthesised step keeps for each op's backward
    is what autograd saves (derivatives.yaml), byte for byte."""
    aten = torch.ops.aten
    torch.manual_seed(0)

    def p(*shape):
        return torch.randn(*shape, requires_grad=True)

    x, w, b = p(8, 16), p(16, 32), p(32)
    img, k = p(2, 3, 8, 8), p(4, 3, 3, 3)
    idx = torch.randint(0, 16, (8, 5))
    cases = [
        (aten.mm.default, (x, w)),
        (aten.mm.default, (x, w.detach())),       # only x needs a gradient: w is kept
        (aten.mm.default, (x.detach(), p(16, 4))),
        (aten.addmm.default, (b, x, w)),
        (aten.bmm.default, (p(2, 8, 16), p(2, 16, 4))),
        (aten.convolution.default, (img, k, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)),
        (aten.relu.default, (x,)),
        (aten.gelu.default, (x,)),
        (aten.tanh.default, (x,)),
        (aten._softmax.default, (x, -1, False)),
        (aten._log_softmax.default, (x, -1, False)),
        (aten.native_layer_norm.default, (x, [16], p(16), p(16), 1e-5)),
        (aten.add.Tensor, (x, p(8, 16))),
        (aten.mul.Tensor, (x, p(8, 16))),
        (aten.div.Tensor, (x, p(8, 16))),
        (aten.embedding.default, (p(16, 32), idx)),
        (aten.native_dropout.default, (x, 0.5, True)),
        (aten.max_pool2d_with_indices.default, (img, [2, 2], [2, 2])),
        (aten.mean.dim, (x, [1])),
        (aten.clone.default, (x,)),
    ]
    for op, args in cases:
        needs = tuple(isinstance(a, torch.Tensor) and a.requires_grad for a in args)
        with torch.no_grad():
            out = op(*args)
        assert _saved_bytes_by_rule(op, args, out, needs) == \
            _saved_bytes_by_autograd(op, args), op


@pytest.mark.parametrize("command", [["predict"], ["sweep", "-b", "8,32"], ["search", "-b", "8,32"]])
def test_no_memory_profile_is_said_and_fits_is_empty(tmp_path, capsys, command):
    """A graph without a memory profile (saved without one): every output
    format says that peak memory is not predicted, and no format says the
    configuration fits."""
    import json

    from predictor import cli
    from predictor.commands.common import NO_MEMORY_NOTE

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 64])
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])]
    g = trace_onnx(_save(_model(nodes, [x], [y], [_w("w", 64, 64)]), tmp_path))
    assert g.memory is not None
    g.memory = None
    path = str(g.save(tmp_path / "no_profile.npz"))
    cmd, *rest = command
    base = [cmd, path, "--gpus", "T4,H100", *rest]
    assert cli.main(base + ["--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert NO_MEMORY_NOTE in doc["notes"]
    rows = {"predict": lambda d: d["predictions"], "sweep": lambda d: d["grid"] + d["best"],
            "search": lambda d: d["configurations"] + d["pareto"]}[cmd](doc)
    assert rows and all(r["fits"] is None for r in rows)
    csv_path = tmp_path / "out.csv"
    assert cli.main(base + ["--csv"] + ([str(csv_path)] if cmd == "sweep" else [])) == 0
    out = capsys.readouterr()
    text = csv_path.read_text() if cmd == "sweep" else out.out
    header, *lines = text.strip().splitlines()
    col = header.split(",").index("fits")
    assert lines and all(line.split(",")[col] == "" for line in lines)
    # (sweep --csv FILE writes the file and prints its table, notes under it)
    assert NO_MEMORY_NOTE in (out.out if cmd == "sweep" else out.err).replace("\n", " ")
    assert cli.main(base) == 0
    table = capsys.readouterr().out
    assert "peak memory is not predicted" in table and "that fits" not in table


@pytest.mark.parametrize("kind,kw,gates", [(torch.nn.GRU, {}, 3),
                                           (torch.nn.RNN, {"nonlinearity": "relu"}, 1)])
def test_gru_and_rnn_match_fx(tmp_path, kind, kw, gates):
    """ONNX GRU and RNN nodes lower as the fx trace lowers nn.GRU and nn.RNN:
    one cuDNN call, a recurrent row per layer with the layer's gates."""
    g, fx = _recurrent_traces(tmp_path, kind, **kw)
    assert not g.unsupported and not fx.unsupported
    for fam in (L.LSTM, L.LSTM_BWD):
        rows = lambda t: sorted(tuple(r[:5]) for r in t.ops.dims(16)[t.ops.family == fam])
        assert rows(g) == rows(fx) and {r[4] for r in rows(g)} == {gates}
    t_onnx = predictor.predict(g, "A100-SXM4-80GB", batch_size=16).ops
    t_fx = predictor.predict(fx, "A100-SXM4-80GB", batch_size=16).ops
    rec = ["lstm", "lstm_bwd"]
    assert t_onnx[t_onnx.family.isin(rec)].ms.sum() == \
        pytest.approx(t_fx[t_fx.family.isin(rec)].ms.sum(), rel=1e-9)
