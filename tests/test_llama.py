"""Llama-family models: the zoo's released configs (parameter counts are in
tests/test_zoo.py) and the Llama code path traced at two layers, so that no
6.7 B+ model is traced in the default test run."""

from __future__ import annotations

import functools

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
    assert not lp.unsharded_linears
    # SDPA: the fused attention family, not matmul-softmax-matmul
    fams = {predictor.kernels.layout.FAMILY_NAMES[f] for f in np.unique(g.ops.family)}
    assert "attention" in fams
    # 2 blocks (attention, MLP, two norms) + embedding and head + the final norm
    assert g.parameters == 2 * 202_383_360 + 2 * 131_072_000 + 4096
