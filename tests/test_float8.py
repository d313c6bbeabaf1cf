"""amp="fp8": bf16 autocast with float8 nn.Linear layers (torchao's tensorwise
recipe, predictor.frontend.float8), traced, priced on float8 tensor cores and
refused where there are none."""

import sys
import warnings
from pathlib import Path

import pytest
import torch

import predictor
from predictor.errors import InvalidArgumentError
from predictor.kernels import layout as L

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))


def _mlp(d_in=1024, hidden=4096, d_out=1000):
    """An eligible layer (dims multiples of 16) and an ineligible one (1000 is not)."""
    def build():
        m = torch.nn.Sequential(torch.nn.Linear(d_in, hidden), torch.nn.GELU(),
                                torch.nn.Linear(hidden, d_out))
        return m, (torch.randn(8, d_in),)
    return build


def _rows(graph, op):
    t = graph.ops
    return [i for i in range(len(t.family)) if t.op_names[t.op[i]] == op]


@pytest.fixture(scope="module")
def fp8_train():
    return predictor.trace(_mlp(), batch_size=8, amp="fp8", optimizer="adamw")


def test_eligible_linears_run_three_float8_gemms(fp8_train):
    g = fp8_train
    scaled = _rows(g, "_scaled_mm")
    assert len(scaled) == 3  # forward, input gradient, weight gradient
    assert all(g.ops.dtype[i] == L.F8 and g.ops.family[i] == L.MATMUL for i in scaled)
    assert sorted(L.PHASE_NAMES[g.ops.phase[i]] for i in scaled) == \
        ["backward", "backward", "forward"]
    # The 4096 -> 1000 layer stays a bf16 GEMM (1000 is not a multiple of 16).
    bf16_gemms = [i for i in range(len(g.ops.family))
                  if g.ops.family[i] == L.MATMUL and g.ops.dtype[i] == L.BF16]
    assert len(bf16_gemms) == 3
    # Each float8 layer's amax reductions: input, weight, output gradient.
    assert len(_rows(g, "linalg_vector_norm")) == 3
    inf = predictor.trace(_mlp(), batch_size=8, amp="fp8", mode="inference")
    assert len(_rows(inf, "_scaled_mm")) == 1


def test_inference_stores_eligible_weights_in_float8():
    """In inference the eligible layer's weight is stored in float8 (one byte
    a parameter) and only its input is scaled and cast each call; the other
    layer's weight stays fp32 (autocast's bf16 copy made each call)."""
    from predictor import memory

    inf = predictor.trace(_mlp(), batch_size=8, amp="fp8", mode="inference")
    assert len(_rows(inf, "linalg_vector_norm")) == 1  # the input's amax only
    params = inf.memory.category_bytes(memory.PARAMETERS)
    assert params == 1024 * 4096 * 1 + 4096 * 4 + 4096 * 1000 * 4 + 1000 * 4
    # A weight tied to an embedding is not converted (the lookup reads it).
    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(64, 32)
            self.head = torch.nn.Linear(32, 64, bias=False)
            self.head.weight = self.emb.weight

        def forward(self, ids):
            return self.head(self.emb(ids))

    tied = predictor.trace(Tied(), (torch.zeros(2, 8, dtype=torch.long),), amp="fp8",
                           mode="inference")
    assert tied.memory.category_bytes(memory.PARAMETERS) == 64 * 32 * 4
    assert len(_rows(tied, "_scaled_mm")) == 1


def test_float8_gemm_is_priced_on_float8_tensor_cores(fp8_train):
    p = predictor.predict(fp8_train, "H100-SXM5-80GB", batch_size=4096)
    ops = p.ops
    scaled = ops[ops.op == "_scaled_mm"]
    assert (scaled.dtype == "float8").all() and (scaled.basis == "analytical").all()
    # Forward GEMM 4096 x 4096 x 1024: at most the float8 peak, at least the
    # bf16 tensor cores' achievable rate would give.
    flops = 2 * 4096 * 4096 * 1024
    fwd = scaled[scaled.phase == "forward"].ms_each.iloc[0] * 1e-3
    assert flops / fwd <= 1979e12 and flops / fwd > 989e12 * 0.8


def test_large_linears_gain_and_small_ones_lose():
    """The float8 GEMM halves the tensor-core time; the casts add memory
    traffic that does not shrink with it: large layers gain, small lose."""
    def ratio(d, batch):
        def build():
            return torch.nn.Sequential(torch.nn.Linear(d, 4 * d, bias=False),
                                       torch.nn.Linear(4 * d, d, bias=False)), \
                (torch.randn(8, d),)
        t = {amp: predictor.predict(predictor.trace(build, batch_size=8, amp=amp,
                                                    optimizer="none"),
                                    "H100-SXM5-80GB", batch_size=batch).iteration_ms
             for amp in ("bf16", "fp8")}
        return t["bf16"] / t["fp8"]

    assert ratio(4096, 8192) > 1.15
    assert ratio(256, 256) < 1.0


def test_gpus_without_float8_are_refused_by_name(fp8_train):
    with pytest.raises(InvalidArgumentError, match=r"A100-SXM4-80GB has none.*H100-SXM5-80GB"):
        predictor.predict(fp8_train, "A100-SXM4-80GB")
    with pytest.raises(InvalidArgumentError, match="T4"):
        predictor.sweep(fp8_train, ["T4", "H100-SXM5-80GB"], [64])
    # The default set and 'all' keep the GPUs that have float8 tensor cores.
    from predictor import hardware

    for asked in (None, "all"):
        with pytest.warns(UserWarning, match=r"amp='fp8': .*A100-SXM4-80GB.* left out"):
            res = predictor.sweep(fp8_train, asked, [64])
        assert res.gpus and all(hardware.has_float8(hardware.get(g)) for g in res.gpus)
        assert "MI300X" in res.gpus or asked is None
    # `predictor gpus` lists the float8 rate where there are float8 tensor cores.
    table = predictor.gpus().set_index("id")["fp8_tflops"]
    assert table["H100-SXM5-80GB"] == pytest.approx(1978.9)
    assert set(table.dropna().index) == {g.id for g in hardware.database()
                                         if hardware.has_float8(g)}
    assert "A100-SXM4-80GB" in table.index and "A100-SXM4-80GB" not in table.dropna().index
    with pytest.raises(InvalidArgumentError, match="V100-SXM2-32GB has none"):
        predictor.predict(fp8_train, "V100-SXM2-32GB", batch_size=8,
                          parallel=predictor.Parallel(dp=2))


def test_memory_matches_memtracker_on_the_same_step():
    """The float8 inputs and weights kept for backward, and every transient
    cast and layout copy, as torch's MemTracker counts them on the same step."""
    from memory_validation import measure_step

    build = _mlp(256, 1024, 200)
    g = predictor.trace(build, batch_size=8, amp="fp8")
    for batch in (8, 64):
        measured = measure_step(lambda: build()[0], lambda b: (torch.randn(b, 256),),
                                lambda out: out.float().mean(), batch, amp="fp8")
        peak = int(g.memory.peak([batch], rounding=False, workspaces=False)[0][0])
        assert peak == pytest.approx(measured, rel=0.02)


def test_fp8_where_it_does_not_apply(tmp_path):
    onnx = pytest.importorskip("onnx")  # noqa: F841
    model = torch.nn.Sequential(torch.nn.Linear(16, 16))
    path = tmp_path / "m.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation
        torch.onnx.export(model, (torch.zeros(2, 16),), str(path), dynamo=False)
    with pytest.raises(InvalidArgumentError, match="ONNX graph"):
        predictor.trace(str(path), amp="fp8")
    g = predictor.trace(_mlp(64, 64, 64), batch_size=4, amp="fp8")
    with pytest.raises(InvalidArgumentError, match="calibrate the amp='bf16' trace"):
        predictor.calibrate(g, device="cpu")


def test_fp8_cli(capsys):
    import json

    from predictor import cli, hardware

    assert cli.main(["predict", "bert-base", "-b", "4", "--seq-len", "128", "--amp", "fp8",
                     "--gpus", "H100-SXM5-80GB,L4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["amp"] == "fp8" and [p["gpu"] for p in out["predictions"]] == \
        ["H100-SXM5-80GB", "L4"]
    # BERT-base: 6 linear layers a block (q, k, v, output, two MLP) x 12, the
    # pooler and the MLM transform; the 30,522-word decoder is not a multiple of 16.
    assert any("74 nn.Linear layers in float8" in n for n in out["notes"])
    assert cli.main(["predict", "bert-base", "-b", "4", "--seq-len", "128", "--amp", "fp8",
                     "--gpus", "A100-SXM4-80GB"]) != 0
    err = capsys.readouterr().err
    assert "A100-SXM4-80GB has none" in err and "Traceback" not in err
    assert cli.main(["calibrate", "bert-base", "--amp", "fp8", "-o", "x.cal.npz"]) != 0
    assert "calibrate the step with --amp bf16" in capsys.readouterr().err
    # A parallel layout over the default GPU set: those with float8 tensor
    # cores, and the same notes as the single-GPU table.
    assert cli.main(["predict", "bert-base", "-b", "4", "--seq-len", "128", "--amp", "fp8",
                     "--dp", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["amp"] == "fp8" and {p["gpu"] for p in out["predictions"]} == \
        {"L4", "H100-SXM5-80GB", "H200-SXM-141GB"}
    assert any("74 nn.Linear layers in float8" in n for n in out["notes"])
    assert "amp fp8: T4, A10G, V100-SXM2-32GB, A100-SXM4-80GB left out (no float8 tensor " \
        "cores)" in out["notes"]
    # sweep and search resolve their GPUs the same way.
    assert cli.main(["sweep", "bert-base", "--seq-len", "128", "--amp", "fp8",
                     "--batch-sizes", "8", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["gpus"] == ["L4", "H100-SXM5-80GB",
                                                          "H200-SXM-141GB"]
    assert cli.main(["search", "bert-base", "--seq-len", "128", "--amp", "fp8",
                     "--batch-sizes", "8", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["configurations"]
    assert rows and all(hardware.has_float8(hardware.get(r["gpu"])) for r in rows)


def test_saved_fp8_graph_keeps_the_float8_gpus(tmp_path, capsys):
    """A graph saved under amp="fp8" and swept without --amp: the default set
    keeps its float8 GPUs, as --amp fp8 does."""
    import json

    from predictor import cli

    path = predictor.trace(_mlp(), batch_size=8, amp="fp8").save(tmp_path / "mlp.npz")
    assert cli.main(["sweep", str(path), "--batch-sizes", "8", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["gpus"] == ["L4", "H100-SXM5-80GB",
                                                          "H200-SXM-141GB"]


def test_published_speedup_rows_are_well_formed():
    """benchmarks/fp8_published.py: every row on a GPU with float8 tensor
    cores, a positive published speedup and a source; the linear
    microbenchmark's large shape is predicted to gain and its small one to
    lose, as published (the Llama rows are the benchmark's to run)."""
    from benchmarks import fp8_published as fp

    from predictor import hardware

    for (m, k, n), speedup, src in fp.LINEARS:
        assert min(m, k, n) > 0 and speedup > 0 and src.startswith("https://")
    for name, seq, n, lb, ac, bf16, fp8, gpu, src in fp.LLAMA:
        assert hardware.has_float8(hardware.get(gpu)) and fp8 > bf16 > 0 and src
    assert fp.linear_speedup(4096, 8192, 16384) > 1.0 > fp.linear_speedup(1024, 2048, 1024)


@pytest.mark.parametrize("name", ["resnet50", "transformer", "gnmt", "bert-base", "gpt2"])
def test_zoo_models_under_fp8(name):
    """Zoo models trace under amp="fp8" in training and inference with nothing
    unsupported, three float8 GEMMs a converted layer in training; models without an eligible nn.Linear (ResNet-50's 1000-class
    head, GPT-2's Conv1D layers) are bf16 autocast's step, and say so."""
    from predictor.commands.common import float8_note
    from predictor import zoo

    seq = zoo.get(name).default_seq_len and 64
    per_mode = {}
    for mode in ("train", "inference"):
        g = predictor.trace(name, amp="fp8", mode=mode, seq_len=seq)
        assert not g.unsupported
        t = g.ops
        per_mode[mode] = sum(int(t.count[i]) for i in _rows(g, "_scaled_mm"))
        p = predictor.predict(g, "H100-SXM5-80GB")
        assert p.iteration_ms > 0 and p.memory_gb > 0
        if per_mode[mode] == 0:
            bf16 = predictor.trace(name, amp="bf16", mode=mode, seq_len=seq)
            assert predictor.predict(bf16, "H100-SXM5-80GB").iteration_ms == \
                pytest.approx(p.iteration_ms, rel=1e-9)
            assert "no nn.Linear layer" in float8_note(g)
    # (BERT's training step has its masked-LM head's linear, inference a classifier.)
    assert per_mode["train"] % 3 == 0 and (per_mode["train"] > 0) == (per_mode["inference"] > 0)
    assert (per_mode["train"] > 0) == (name in ("transformer", "gnmt", "bert-base"))
