"""Llama-family models: the zoo's released configs (parameter counts are in
tests/test_zoo.py) and the Llama code path traced at two layers, so that no
6.7 B+ model is traced in the default test run."""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
import torch

import predictor
from predictor.zoo import hf


@functools.lru_cache(maxsize=None)
def llama_graph(amp: str | None = "bf16", layers: int = 2, seq: int = 512):
    """A Llama-2-7B-shaped model cut to `layers` blocks (same widths, vocab, GQA)."""
    def factory():
        return hf.build_llama("llama2-7b", layers), (torch.zeros(1, seq, dtype=torch.long),)

    factory.__name__ = f"llama2-7b-{layers}l"
    return predictor.trace(factory, loss_fn=hf.causal_lm_loss, amp=amp)


def test_zoo_entries_and_aliases():
    from predictor import zoo

    for name, seq in (("llama2-7b", 4096), ("llama2-70b", 4096), ("llama3-8b", 8192),
                      ("llama3-70b", 8192)):
        e = zoo.get(name)
        assert e.default_seq_len == seq and e.default_batch_size == 1 and e.family == "text"
    assert zoo.get("Llama-2-7B").name == "llama2-7b" and zoo.get("llama_70b").name == "llama2-70b"
    assert zoo.get("llama3_8b").name == "llama3-8b"
    cfg = hf.llama_config("llama2-70b")
    assert (cfg.num_key_value_heads, cfg.num_attention_heads, cfg.num_hidden_layers) == (8, 64, 80)


def test_two_layer_llama_traces_with_megatron_pairs():
    g = llama_graph()
    lp = g.layout
    assert g.amp == "bf16" and lp.n_blocks == 2
    # q/k/v and gate/up are column-parallel, o_proj and down_proj row-parallel, per block
    col = {n.split(".")[-2] for n in lp.column_parallel}
    row = {n.split(".")[-2] for n in lp.row_parallel}
    assert col == {"q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"} and len(lp.column_parallel) == 10
    assert row == {"o_proj", "down_proj"} and len(lp.row_parallel) == 4
    assert set(lp.vocab_parallel) == {"lm_head.weight", "model.embed_tokens.weight"}
    assert not lp.unsharded_linears and not lp.kept_whole   # RoPE backward included
    # SDPA: the fused attention family, not matmul-softmax-matmul
    fams = {predictor.kernels.layout.FAMILY_NAMES[f] for f in np.unique(g.ops.family)}
    assert "attention" in fams
    # causal through SDPA's is_causal: no (batch, 1, seq, seq) mask tensor stored per layer
    assert not ((lp.act_flags & 2) > 0).any()
    assert not {"where", "le", "bitwise_and"} & set(g.ops.op_names)
    # 2 blocks (attention, MLP, two norms) + embedding and head + the final norm
    assert g.parameters == 2 * 202_383_360 + 2 * 131_072_000 + 4096


# ------------------------------------------------------ mixed precision x layouts

GIB = 2 ** 30


def _states(g, batch=1, **kw):
    p = predictor.predict(g, "H100-SXM5-80GB", batch_size=batch,
                          parallel=predictor.Parallel(**kw))
    return p, p.memory_parts_gb


@pytest.mark.parametrize("zero, per_param", [
    (0, 4 + 4 + 8), (1, 4 + 4 + 8 / 8), (2, 4 + (4 + 8) / 8), (3, (4 + 4 + 8) / 8)])
def test_autocast_model_states_follow_real_dtypes(zero, per_param):
    # autocast: fp32 weights (the master copy), fp32 gradients, Adam's two fp32 moments;
    # ZeRO-1 shards the moments, ZeRO-2 gradients too, ZeRO-3 everything
    g = llama_graph()
    _, parts = _states(g, dp=8, zero=zero)
    n = float(g.layout.param_numel.sum())
    assert parts["model_states"] * GIB == pytest.approx(n * per_param, rel=1e-9)


def test_autocast_half_copies_and_fsdp_gathers_half_weights():
    g = llama_graph()
    lp = g.layout
    _, ddp = _states(g, 16, dp=8)      # a batch whose peak is in backward, not the optimizer
    # the half copies autocast makes: every linear's weight (blocks and head), 2 bytes each
    linears = 2 * (4 * 4096 * 4096 + 3 * 4096 * 11008) + 32000 * 4096
    assert ddp["weight_copies"] * GIB == pytest.approx(2 * linears, rel=0.01)
    # FSDP's mixed precision: no copies, two blocks of 16-bit weights gathered
    _, fsdp = _states(g, 16, dp=8, fsdp=True)
    assert fsdp["weight_copies"] == 0
    largest = max(float(lp.param_numel[lp.param_group == b].sum()) for b in range(4))
    assert fsdp["gathered_params"] * GIB == pytest.approx(2 * largest * 2, rel=1e-9)
    # a 16-bit dtype= on an autocast graph would undo autocast's dtypes: refused
    with pytest.raises(predictor.errors.InvalidArgumentError, match="amp"):
        predictor.predict(g, "H100-SXM5-80GB", batch_size=1, dtype="bfloat16",
                          parallel=predictor.Parallel(dp=2))


def test_temporaries_shrink_with_tp_and_zero():
    g = llama_graph()
    one = _states(g, dp=1, tp=1, pp=1, microbatches=2)[1]["transient"]
    four = _states(g, tp=4)[1]["transient"]
    assert 0 < four < 0.6 * one
    # the optimizer step's temporaries follow the parameters a GPU updates
    from predictor.layouts import _Temporaries
    lp = g.layout
    size = g.memory.bytes_at(1).astype(float)
    t = _Temporaries(g.memory, lp, size, 1, False)
    groups = set(range(lp.n_blocks + 2))
    assert t.peaks(groups, 1 / 8)[1] == pytest.approx(t.peaks(groups, 1.0)[1] / 8)


def test_host_overhead_counted_per_stage():
    g = llama_graph()
    p = predictor.predict(g, "H100-SXM5-80GB", batch_size=1,
                          parallel=predictor.Parallel(tp=8))
    assert p.overhead_ms >= 0 and math.isfinite(p.iteration_ms)


def test_tied_embedding_copy_on_last_stage():
    g = predictor.trace("gpt2", seq_len=64)
    lp = g.layout
    assert lp.param_tied.tolist() == [1] + [0] * (len(lp.param_numel) - 1)   # wte
    par = predictor.Parallel(pp=2, microbatches=4)
    tied = predictor.predict(g, "H100-SXM5-80GB", batch_size=2, parallel=par)
    lp.param_tied = np.zeros_like(lp.param_tied)
    try:
        untied = predictor.predict(g, "H100-SXM5-80GB", batch_size=2, parallel=par)
    finally:
        lp.param_tied[0] = 1
    # fp32 Adam: weights, gradients and two moments of the 50257 x 768 table
    extra = (tied.stage_memory_gb[-1] - untied.stage_memory_gb[-1]) * GIB
    assert extra >= 16 * 50257 * 768 * 0.999
    assert tied.stage_memory_gb[0] == untied.stage_memory_gb[0]
    assert tied.dp_comm_ms > untied.dp_comm_ms == 0    # its gradient's all-reduce
