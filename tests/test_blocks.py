"""Repeated blocks traced once and replicated (predictor.frontend.blocks):
the Graph assembled from a 3-block trace is the full trace's, field by field,
and so are its predictions; where it cannot be exact it declines."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
import torch.nn as nn

import predictor
from predictor.frontend import blocks, fx
from predictor.zoo import hf

GPU = "H100-SXM5-80GB"


def trace_stack(stack: blocks.Stack, inputs, *, loss_fn=None, optimizer="adam", mode="train",
                amp=None, name="m"):
    """The replicated Graph of ``stack.build(stack.layers)`` fed `inputs`, or
    None where replication declines; ``fx.trace(lambda:
    stack.build(stack.layers), inputs, ..., replicate=False)`` is its full trace."""
    from predictor.frontend import autocast, optimizers
    optimizer = optimizers.check(optimizer) if mode == "train" else None
    amp = autocast.check(amp)
    spec = fx._spec_for(lambda: stack.build(stack.layers), inputs, loss_fn, 0, None, None, name)
    return blocks.replicated(spec, stack, mode, optimizer, amp,
                             fx._small_tracer(mode, optimizer, amp, fx.SENTINEL_BATCH))


def _differences(a, b, path="graph") -> list[str]:
    """Every field where a and b differ (trace_seconds aside)."""
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        if type(a) is not type(b):
            return [f"{path}: {type(a).__name__} vs {type(b).__name__}"]
        out = []
        for f in dataclasses.fields(a):
            if f.name != "trace_seconds":
                out += _differences(getattr(a, f.name), getattr(b, f.name), f"{path}.{f.name}")
        return out
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        if a is None or b is None:
            return [] if a is b else [f"{path}: None vs array"]
        a, b = np.asarray(a), np.asarray(b)
        ok = a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b)
        return [] if ok else [f"{path}: {a.shape} vs {b.shape}"]
    return [] if a == b else [f"{path}: {str(a)[:120]} vs {str(b)[:120]}"]


def _rel(x, y) -> float:
    x, y = np.asarray(x, float), np.asarray(y, float)
    assert x.shape == y.shape
    return float(np.max(np.abs(x - y) / np.maximum(np.abs(y), 1e-300), initial=0.0))


def _same_predictions(a, b) -> None:
    pa, pb = predictor.predict(a, GPU), predictor.predict(b, GPU)
    assert _rel([pa.forward_ms, pa.backward_ms, pa.optimizer_ms, pa.overhead_ms],
                [pb.forward_ms, pb.backward_ms, pb.optimizer_ms, pb.overhead_ms]) <= 1e-9
    assert _rel(pa.op_us, pb.op_us) <= 1e-9
    assert _rel(pa.memory_gb, pb.memory_gb) <= 1e-9
    if a.layout is not None:
        layout = predictor.Parallel(tp=2, pp=2, microbatches=4)
        qa = predictor.predict(a, GPU, parallel=layout, checkpoint="full")
        qb = predictor.predict(b, GPU, parallel=layout, checkpoint="full")
        assert _rel([qa.iteration_ms, qa.memory_gb], [qb.iteration_ms, qb.memory_gb]) <= 1e-9


def _check(stack: blocks.Stack, inputs, loss_fn, **kw):
    """The replicated Graph equals the full trace's, and predicts the same."""
    rep = trace_stack(stack, inputs, loss_fn=loss_fn, **kw)
    assert rep is not None, "replication declined"
    full = fx.trace(lambda: stack.build(stack.layers), inputs, loss_fn=loss_fn, name="m",
                    replicate=False, **kw)
    assert _differences(rep, full) == []
    assert rep.ops.count.sum() > 0 and rep.memory.n_steps == full.memory.n_steps
    _same_predictions(rep, full)
    return rep, full


# ------------------------------------------------------------ small stacks --

def _gpt2(k: int, width: int = 64):
    cfg = hf.gpt2_config("gpt2")
    cfg.n_layer, cfg.n_embd, cfg.n_head = k, width, 2
    return hf._causal_lm(cfg)


def _bert(head: str, k: int):
    cfg = hf.bert_config("bert-base")
    cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads = k, 64, 2
    cfg.intermediate_size = 128
    if head == "AutoModelForSequenceClassification":
        cfg.num_labels = 2
    return hf._from_config(head, cfg)


def _opt(k: int):
    cfg = hf.opt_config()
    cfg.num_hidden_layers, cfg.hidden_size, cfg.ffn_dim = k, 64, 128
    cfg.num_attention_heads, cfg.word_embed_proj_dim = 2, 64
    return hf._causal_lm(cfg)


def _llama(k: int):
    from predictor.zoo.hf import _causal_lm, _register_causal_sdpa, llama_config
    cfg = llama_config("llama3-8b", k)
    cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads = 64, 128, 4
    cfg.num_key_value_heads, cfg.head_dim, cfg.vocab_size = 2, 16, 1000
    return _causal_lm(cfg, attn=_register_causal_sdpa())


TOKENS = (torch.zeros(2, 16, dtype=torch.long),)


def test_gpt2_train_adam_matches_the_full_trace():
    rep, full = _check(blocks.Stack("transformer.h", 6, _gpt2), TOKENS, hf.causal_lm_loss)
    # the optimizer's per-parameter rows hold the 6-block parameter count
    assert rep.parameters == full.parameters == sum(
        p.numel() for p in _gpt2(6).parameters())
    assert rep.layout.n_blocks == 6 and len(rep.layout.column_parallel) == 12
    # the comparison can fail: one block fewer is another graph
    five = fx.trace(lambda: _gpt2(5), TOKENS, loss_fn=hf.causal_lm_loss, name="m",
                    replicate=False)
    assert len(_differences(rep, five)) > 5


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_gpt2_other_optimizers(optimizer):
    _check(blocks.Stack("transformer.h", 5, _gpt2), TOKENS, hf.causal_lm_loss,
           optimizer=optimizer)


@pytest.mark.parametrize("optimizer", ["adamw-loop", "adamw-loop+clip"])
def test_a_for_loop_or_clipped_step_traces_in_full(optimizer):
    # Ops one per parameter outside every per-parameter list (a for-loop
    # step), or sized by the parameter count (the clip's stacked norms).
    spec = fx._spec_for(lambda: _gpt2(6), TOKENS, hf.causal_lm_loss, 0, None, None, "m")
    assert blocks.replicated(spec, blocks.Stack("transformer.h", 6, _gpt2), "train",
                             optimizer, None, None) is None
    assert blocks.replicated(spec, blocks.Stack("transformer.h", 6, _gpt2), "train",
                             "adamw+clip", None, None) is None
    g = fx.trace(lambda: _gpt2(6), TOKENS, loss_fn=hf.causal_lm_loss, name="m",
                 optimizer=optimizer)
    from predictor.kernels import layout as L
    opt = g.ops.phase == L.OPTIMIZER_PHASE
    # the parameter update (addcdiv_) writes every trainable element once
    d = g.ops.dims(2)
    upd = [i for i in np.nonzero(opt)[0] if g.ops.op_names[g.ops.op[i]] == "addcdiv_"]
    assert sum(int(d[i][L.MEM_WRITTEN]) * int(g.ops.count[i]) for i in upd) \
        == g.trainable_parameters


def test_gpt2_inference_and_mixed_precision():
    stack = blocks.Stack("transformer.h", 5, _gpt2)
    _check(stack, TOKENS, None, mode="inference")
    _check(stack, TOKENS, hf.causal_lm_loss, amp="bf16")
    _check(stack, TOKENS, hf.causal_lm_loss, amp="fp16")   # with the GradScaler's state


def test_bert_pretraining_and_classifier():
    stack = blocks.Stack("bert.encoder.layer", 5, lambda k: _bert("AutoModelForPreTraining", k))
    _check(stack, TOKENS, hf.bert_pretraining_loss)
    clf = blocks.Stack("bert.encoder.layer", 5,
                       lambda k: _bert("AutoModelForSequenceClassification", k))
    _check(clf, TOKENS, None, mode="inference")


def test_opt_and_llama():
    _check(blocks.Stack("model.decoder.layers", 5, _opt), TOKENS, hf.causal_lm_loss)
    _check(blocks.Stack("model.layers", 5, _llama), TOKENS, hf.causal_lm_loss)


def test_zoo_gpt2_is_replicated_and_identical():
    spec = fx._spec_for("gpt2", None, None, 0, None, None, None)
    rep = blocks.replicated(spec, blocks.zoo_stack("gpt2"), "train", "adam", None,
                            fx._small_tracer("train", "adam", None, fx.SENTINEL_BATCH))
    assert rep is not None
    full = predictor.trace("gpt2", replicate=False)
    assert _differences(rep, full) == []
    _same_predictions(rep, full)
    assert rep.source is spec


def test_zoo_stacks_cover_the_transformers():
    for name in ("gpt2", "gpt3-2.7b", "bert-large", "opt-1.3b", "llama2-7b"):
        stack = blocks.zoo_stack(name)
        assert stack is not None and stack.layers > 4, name
    for name in ("resnet50", "inception_v3", "dcgan", "gnmt", "transformer"):
        assert blocks.zoo_stack(name) is None, name


# --------------------------------------------------------------- declines --

class _Block(nn.Module):
    """A pre-norm MLP block (`extra`: a second one)."""

    def __init__(self, width: int, extra: bool, norm: bool = True):
        super().__init__()
        self.norm = nn.LayerNorm(width) if norm else nn.Identity()
        self.fc1, self.fc2 = nn.Linear(width, 2 * width), nn.Linear(2 * width, width)
        self.extra = nn.Linear(width, width) if extra else None

    def forward(self, x):
        x = x + self.fc2(torch.relu(self.fc1(self.norm(x))))
        return x + self.extra(x) if self.extra is not None else x


class _Net(nn.Module):
    """Blocks whose structure follows `pattern(i)`: alternating blocks are not
    one repeated block."""

    def __init__(self, k: int, pattern, norm: bool = True):
        super().__init__()
        self.inp = nn.Linear(8, 16)
        self.layers = nn.ModuleList(_Block(16, pattern(i), norm) for i in range(k))
        self.out = nn.Linear(16, 4)

    def forward(self, x):
        x = self.inp(x)
        for layer in self.layers:
            x = layer(x)
        return self.out(x)


FEATURES = (torch.zeros(4, 8),)


def test_identical_plain_blocks_replicate():
    _check(blocks.Stack("layers", 7, lambda k: _Net(k, lambda i: False, norm=False)),
           FEATURES, None)


@pytest.mark.parametrize("pattern", [lambda i: i % 2 == 1, lambda i: i == 0],
                         ids=["alternating", "first-differs"])
def test_blocks_that_differ_decline(pattern):
    stack = blocks.Stack("layers", 6, lambda k: _Net(k, pattern))
    assert trace_stack(stack, FEATURES) is None


def test_a_model_without_the_stack_declines():
    # no ModuleList at the path / too few blocks to gain anything
    assert trace_stack(blocks.Stack("nowhere", 6, lambda k: _Net(k, lambda i: False)),
                              FEATURES) is None
    assert trace_stack(blocks.Stack("layers", 4, lambda k: _Net(k, lambda i: False)),
                              FEATURES) is None


def test_a_zoo_model_without_repeated_blocks_traces_in_full():
    g = predictor.trace("dcgan", batch_size=2)
    full = predictor.trace("dcgan", batch_size=2, replicate=False)
    assert _differences(g, full) == []


def test_a_factory_named_like_a_zoo_model_is_not_replicated(tmp_path):
    # a user's factory called gpt2 is the user's model, not the zoo's GPT-2
    spec = fx._spec_for("gpt2", None, None, 0, None, None, None)
    path = tmp_path / "mine.py"
    path.write_text("import torch\n\ndef gpt2():\n"
                    "    return torch.nn.Linear(4, 4), torch.zeros(2, 4)\n")
    tracer = fx._small_tracer("train", "adam", None, fx.SENTINEL_BATCH)
    mine = fx._entry_of(f"{path}:gpt2")
    assert blocks.replicated_zoo(mine, spec, "train", "adam", None, tracer) is None
    # nor a record that merely carries a zoo model's name
    import dataclasses

    twin = dataclasses.replace(fx._entry_of("gpt2"))
    assert twin.name == "gpt2"
    assert blocks.replicated_zoo(twin, spec, "train", "adam", None, tracer) is None


def test_a_graph_field_it_does_not_know_makes_it_decline(monkeypatch):
    # a field added to Graph that replication does not scale would silently
    # be the 3-block model's: it declines instead
    monkeypatch.setattr(blocks, "_GRAPH_FIELDS", blocks._GRAPH_FIELDS - {"amp"})
    stack = blocks.Stack("layers", 6, lambda k: _Net(k, lambda i: False, norm=False))
    assert trace_stack(stack, FEATURES) is None
