"""Hugging Face models as users bring them: the default configs of the common
families (tiny: 2 layers, hidden 64, built from transformers config classes, no
downloads), traced in training and inference mode and predicted."""

from __future__ import annotations

import pytest
import torch

import predictor
from predictor.frontend import fx

transformers = pytest.importorskip("transformers")

BATCH, SEQ = 2, 16


def _gpt2():
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=2, n_embd=64, n_head=2, vocab_size=1000, n_positions=128,
        bos_token_id=0, eos_token_id=0))


def _llama():
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=2,
        num_key_value_heads=2, vocab_size=1000))


def _mistral():
    return transformers.MistralForCausalLM(transformers.MistralConfig(
        num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=2,
        num_key_value_heads=2, vocab_size=1000))


def _opt():
    return transformers.OPTForCausalLM(transformers.OPTConfig(
        num_hidden_layers=2, hidden_size=64, ffn_dim=128, num_attention_heads=2,
        vocab_size=1000, word_embed_proj_dim=64))


def _bert():
    return transformers.BertForMaskedLM(transformers.BertConfig(
        num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=2,
        vocab_size=1000))


def _t5():
    return transformers.T5ForConditionalGeneration(transformers.T5Config(
        num_layers=2, num_decoder_layers=2, d_model=64, d_ff=128, d_kv=32, num_heads=2,
        vocab_size=1000))


def _vit():
    return transformers.ViTForImageClassification(transformers.ViTConfig(
        num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=2,
        image_size=32, patch_size=8))


def _tokens():
    return (torch.zeros(BATCH, SEQ, dtype=torch.long),)


# name -> (model factory, example inputs, builds a KV cache by default)
FAMILIES = {
    "gpt2": (_gpt2, _tokens, True),
    "llama": (_llama, _tokens, True),
    "mistral": (_mistral, _tokens, True),
    "opt": (_opt, _tokens, True),
    "bert": (_bert, _tokens, False),
    "t5": (_t5, lambda: {"input_ids": torch.zeros(BATCH, SEQ, dtype=torch.long),
                         "decoder_input_ids": torch.zeros(BATCH, 8, dtype=torch.long)}, True),
    "vit": (_vit, lambda: (torch.zeros(BATCH, 3, 32, 32),), False),
}


@pytest.mark.parametrize("mode", ["train", "inference"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_default_config_traces_and_predicts(family, mode):
    build, inputs, caches = FAMILIES[family]
    g = predictor.trace(build(), inputs(), mode=mode)
    assert g.mode == mode and g.batch_size == BATCH
    assert g.batch_scalable
    p = predictor.predict(g, "A100-SXM4-80GB")
    assert p.iteration_ms > 0 and p.forward_ms > 0
    assert (p.backward_ms > 0) == (mode == "train")
    # HF's SDPA attention with a mask runs aten._safe_softmax: priced as a softmax.
    assert "_safe_softmax" not in g.unsupported
    # An inference trace of a model that would build a KV cache says it did not.
    assert (fx.NO_CACHE_NOTE in g.notes) == (mode == "inference" and caches)


def test_causal_lm_inference_is_traced_without_the_cache():
    """use_cache=False: the inference graph is the forward pass alone, so the
    training graph's forward and the inference graph run the same matmuls."""
    train = predictor.trace(_gpt2(), _tokens(), mode="train")
    infer = predictor.trace(_gpt2(), _tokens(), mode="inference")
    fwd = train.ops.phase == 0
    assert infer.flops()["forward"] == pytest.approx(train.flops()["forward"], rel=0.05)
    assert int(infer.ops.count.sum()) <= int(train.ops.count[fwd].sum()) + 5


def test_cache_asked_for_explicitly_is_dropped_from_the_outputs():
    inputs = {"input_ids": torch.zeros(BATCH, SEQ, dtype=torch.long), "use_cache": True}
    g = predictor.trace(_gpt2(), inputs, mode="inference")
    assert any(n.startswith("dropped the DynamicCache") for n in g.notes)
    assert fx.NO_CACHE_NOTE not in g.notes


def test_non_tensor_output_error_names_the_cause():
    """A step that returns a non-tensor object fails in make_fx with
    NotImplementedError("argument of type: ..."): the hint names that, not the
    inputs' shapes."""
    hint = fx._hint(NotImplementedError("argument of type: <class 'Foo'>"))
    assert "not a tensor" in hint and "shapes" not in hint
    assert "shapes" in fx._hint(RuntimeError("size mismatch"))


FACTORY = '''
import torch, transformers

def build():
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=1000,
                                  n_positions=128, bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(cfg), (torch.zeros(2, 16, dtype=torch.long),)
'''


@pytest.fixture(scope="module")
def gpt2_factory(tmp_path_factory):
    path = tmp_path_factory.mktemp("hf") / "tiny_gpt2.py"
    path.write_text(FACTORY)
    return f"{path}:build"


def test_cli_says_the_cache_was_left_out(gpt2_factory, capsys):
    import json

    from predictor import cli

    assert cli.main(["predict", gpt2_factory, "--inference", "--gpus", "T4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["notes"] == [fx.NO_CACHE_NOTE]
    assert cli.main(["predict", gpt2_factory, "--inference", "--gpus", "T4"]) == 0
    assert "use_cache=False" in capsys.readouterr().out
    assert cli.main(["predict", gpt2_factory, "--inference", "--gpus", "T4", "--csv"]) == 0
    captured = capsys.readouterr()
    assert "use_cache=False" in captured.err and "use_cache" not in captured.out


def test_safe_softmax_is_a_softmax_and_its_masking():
    from predictor import families
    from predictor.kernels import layout as L

    x = families.TensorMeta((2, 4, 16, 16), torch.float32)
    fn = families.lookup(torch.ops.aten._safe_softmax.default)
    assert fn is not None
    rows = fn(x, -1, None)
    assert [r[0] for r in rows] == [L.SOFTMAX, L.ELEMENTWISE, L.REDUCTION, L.ELEMENTWISE]
    assert rows[0] == families.lookup(torch.ops.aten._softmax.default)(x, -1, False)[0]
    g = predictor.trace(_gpt2(), _tokens(), mode="train")
    assert "_safe_softmax" not in g.unsupported
    assert "softmax" in g.family_counts()
