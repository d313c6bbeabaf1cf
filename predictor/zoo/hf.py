"""Hugging Face transformer models, built from configs written here.

No file or hub access: the config values are in this module and the models
are built with ``from_config`` (random init), eager attention, no KV cache;
the Llama models with PyTorch's fused causal attention (``sdpa`` with
``is_causal`` and no mask tensor, as Llama is trained: flash attention on the GPU).
``transformers`` is imported lazily so ``import predictor.zoo`` stays fast.

Training heads: BERT uses ``BertForPreTraining`` (MLM + NSP heads, loss is the
sum of both cross entropies, as in BERT pre-training); the causal LMs use
their ``...ForCausalLM`` / ``LMHeadModel`` with token cross entropy. BERT
inference uses ``BertForSequenceClassification`` (2 labels).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from .base import check_batch, check_seq, token_loss, zeros_target

# --------------------------------------------------------------------------- configs

BERT_SIZES = {
    # name: (hidden, layers, heads, intermediate)
    "bert-large": (1024, 24, 16, 4096),
    "bert-base": (768, 12, 12, 3072),
}

GPT2_SIZES = {
    # name: (n_embd, n_layer, n_head, n_positions)
    "gpt2": (768, 12, 12, 1024),
    "gpt2-large": (1280, 36, 20, 1024),
    # GPT-3 shapes as GPT-2 architecture, using the reference (NeuSight)
    # configs: gpt3-xl is 3072/24 layers/24 heads (not the GPT-3 paper's
    # 2048-wide 1.3B model), gpt3-2.7b is the paper's 2560/32/32.
    "gpt3-xl": (3072, 24, 24, 2048),
    "gpt3-2.7b": (2560, 32, 32, 2048),
}

OPT_1_3B = dict(
    vocab_size=50272,
    hidden_size=2048,
    ffn_dim=8192,
    num_hidden_layers=24,
    num_attention_heads=32,
    max_position_embeddings=2048,
    word_embed_proj_dim=2048,
    do_layer_norm_before=True,
    dropout=0.1,
    attention_dropout=0.0,
    activation_dropout=0.0,
    activation_function="relu",
    layerdrop=0.0,
    init_std=0.02,
    enable_bias=True,
    pad_token_id=1,
    bos_token_id=2,
    eos_token_id=2,
)


LLAMA_SIZES = {
    # name: (hidden, intermediate, layers, heads, kv heads, vocab, max positions, rope theta)
    # Llama 2 (Touvron et al. 2023, the released configs); Llama 3 (Dubey et al. 2024).
    "llama2-7b": (4096, 11008, 32, 32, 32, 32000, 4096, 10000.0),
    "llama2-13b": (5120, 13824, 40, 40, 40, 32000, 4096, 10000.0),
    "llama2-70b": (8192, 28672, 80, 64, 8, 32000, 4096, 10000.0),
    "llama3-8b": (4096, 14336, 32, 32, 8, 128256, 8192, 500000.0),
    "llama3-70b": (8192, 28672, 80, 64, 8, 128256, 8192, 500000.0),
}


def llama_config(name: str, layers: int | None = None):
    """A Llama config of the released sizes (`layers` overrides the depth: tests)."""
    from transformers import LlamaConfig

    hidden, inter, n_layers, heads, kv, vocab, n_pos, theta = LLAMA_SIZES[name]
    return LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=inter,
        num_hidden_layers=layers or n_layers, num_attention_heads=heads,
        num_key_value_heads=kv, hidden_act="silu", max_position_embeddings=n_pos,
        rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": theta},
        tie_word_embeddings=False, attention_bias=False, attention_dropout=0.0,
        mlp_bias=False, use_cache=False,
    )


def bert_config(name: str):
    from transformers import BertConfig

    hidden, layers, heads, inter = BERT_SIZES[name]
    return BertConfig(
        vocab_size=30522,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=inter,
        hidden_act="gelu",
        hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1,
        max_position_embeddings=512,
        type_vocab_size=2,
        initializer_range=0.02,
        layer_norm_eps=1e-12,
        pad_token_id=0,
        use_cache=False,
    )


def gpt2_config(name: str):
    from transformers import GPT2Config

    n_embd, n_layer, n_head, n_pos = GPT2_SIZES[name]
    return GPT2Config(
        vocab_size=50257,
        n_positions=n_pos,
        n_embd=n_embd,
        n_layer=n_layer,
        n_head=n_head,
        activation_function="gelu_new",
        resid_pdrop=0.1,
        embd_pdrop=0.1,
        attn_pdrop=0.1,
        layer_norm_epsilon=1e-5,
        initializer_range=0.02,
        bos_token_id=50256,
        eos_token_id=50256,
        use_cache=False,
    )


def opt_config():
    from transformers import OPTConfig

    return OPTConfig(use_cache=False, **OPT_1_3B)


def max_positions(name: str) -> int:
    if name in BERT_SIZES:
        return 512
    if name in GPT2_SIZES:
        return GPT2_SIZES[name][3]
    if name in LLAMA_SIZES:
        return LLAMA_SIZES[name][6]
    return OPT_1_3B["max_position_embeddings"]


# --------------------------------------------------------------------------- builders


def _from_config(auto_cls_name: str, config, attn: str = "eager") -> nn.Module:
    import transformers

    auto_cls = getattr(transformers, auto_cls_name)
    model = auto_cls.from_config(config, attn_implementation=attn)
    model.config.use_cache = False
    return model


def build_bert_pretraining(name: str) -> nn.Module:
    return _from_config("AutoModelForPreTraining", bert_config(name))


def build_bert_classifier(name: str) -> nn.Module:
    cfg = bert_config(name)
    cfg.num_labels = 2
    return _from_config("AutoModelForSequenceClassification", cfg)


def _position_ids_hook(module: nn.Module, args: tuple, kwargs: dict):
    """Pass explicit ``position_ids`` (0..S-1 per row) when the caller gives none.

    Without them, transformers builds positions with ``torch.arange`` inside
    ``forward`` and then checks their *values* for packed sequences
    (``masking_utils.find_packed_sequence_indices``), skipping the check only
    for fake/proxied tensors. When ``make_fx`` runs outside the FakeTensorMode,
    that arange is a real tensor and the check fails the trace. Deriving the
    positions from ``input_ids`` keeps them fake, so the check is skipped
    exactly as under a fake-mode trace. Same positions as the default.
    """
    if kwargs.get("position_ids") is None and kwargs.get("past_key_values") is None:
        ids = args[0] if args else kwargs.get("input_ids")
        if isinstance(ids, torch.Tensor) and ids.dim() == 2:
            pos = torch.arange(ids.shape[1], device=ids.device)
            kwargs["position_ids"] = torch.zeros_like(ids) + pos
    return args, kwargs


def _causal_lm(config, attn: str = "eager") -> nn.Module:
    model = _from_config("AutoModelForCausalLM", config, attn)
    model.register_forward_pre_hook(_position_ids_hook, with_kwargs=True)
    return model


def build_gpt2(name: str) -> nn.Module:
    return _causal_lm(gpt2_config(name))


def build_opt() -> nn.Module:
    return _causal_lm(opt_config())


CAUSAL_SDPA = "predictor_causal_sdpa"


def _register_causal_sdpa() -> str:
    """An attention implementation that is transformers' SDPA with no mask
    tensor: causal attention through SDPA's ``is_causal`` (flash attention on
    the GPU). On unpacked sequences with no padding, transformers itself skips
    the mask this way on a GPU, but under fake tensors it cannot read the
    position ids to rule out packed sequences and materialises a
    (batch, 1, seq, seq) mask per layer, which a training run does not have."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(CAUSAL_SDPA, sdpa_attention_forward)
    AttentionMaskInterface.register(CAUSAL_SDPA, lambda *args, **kwargs: None)
    return CAUSAL_SDPA


def build_llama(name: str, layers: int | None = None) -> nn.Module:
    return _causal_lm(llama_config(name, layers), attn=_register_causal_sdpa())


# --------------------------------------------------------------------------- inputs / losses


def token_inputs(name: str, default_seq: int, fill: int):
    """make_inputs for a single ``input_ids`` (B, S) int64 tensor filled with ``fill``."""

    def make_inputs(batch_size: int, seq_len: int | None = None) -> tuple:
        b = check_batch(batch_size)
        s = check_seq(seq_len, default_seq, max_positions(name), name)
        return (torch.full((b, s), fill, dtype=torch.long),)

    return make_inputs


def _get(out: Any, key: str, index: int) -> torch.Tensor:
    if isinstance(out, dict) or hasattr(out, "keys"):
        return out[key]
    if isinstance(out, (tuple, list)):
        return out[index]
    return getattr(out, key)


def bert_pretraining_loss(out: Any) -> torch.Tensor:
    """MLM cross entropy over the vocabulary + next-sentence cross entropy."""
    mlm = token_loss(_get(out, "prediction_logits", 0))
    nsp_logits = _get(out, "seq_relationship_logits", 1)
    nsp = F.cross_entropy(nsp_logits, zeros_target(nsp_logits.shape[0], nsp_logits.device))
    return mlm + nsp


def causal_lm_loss(out: Any) -> torch.Tensor:
    """Token cross entropy of logits (B, S, V) viewed as (B*S, V) against zeros."""
    return token_loss(_get(out, "logits", 0))
