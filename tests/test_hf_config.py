"""A Hugging Face config as a model (``predictor.zoo.hf_config``): a
``config.json`` path or a ``PretrainedConfig`` traces like a zoo model, its
repeated blocks traced once, and every bad file is one line naming it."""

from __future__ import annotations

import json

import pytest

import predictor
from predictor.errors import PredictorError

QWEN_LIKE = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 256,
    "intermediate_size": 512, "num_hidden_layers": 8, "num_attention_heads": 4,
    "num_key_value_heads": 2, "max_position_embeddings": 4096, "vocab_size": 4096,
    "tie_word_embeddings": True, "torch_dtype": "bfloat16", "transformers_version": "4.40.1",
    "use_cache": True,
}
BERT_LIKE = {
    "architectures": ["BertForMaskedLM"], "model_type": "bert", "hidden_size": 128,
    "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 2,
    "max_position_embeddings": 512, "vocab_size": 1000,
}


def _write(tmp_path, doc, folder="tiny-qwen") -> str:
    d = tmp_path / folder
    d.mkdir(parents=True, exist_ok=True)
    path = d / "config.json"
    path.write_text(json.dumps(doc) if isinstance(doc, dict) else doc)
    return str(path)


def test_config_file_traces_with_its_blocks_once(tmp_path):
    path = _write(tmp_path, QWEN_LIKE)
    g = predictor.trace(path, batch_size=2, seq_len=256, amp="bf16")
    full = predictor.trace(path, batch_size=2, seq_len=256, amp="bf16", replicate=False)
    assert g.name == "tiny-qwen" and g.seq_len == 256 and g.amp == "bf16"
    # fp32 master weights, whatever dtype the released weights are stored in
    assert g.parameter_bytes == 4 * g.parameters
    # The 3-block trace assembled for 8 blocks is the full trace.
    assert len(g.ops) == len(full.ops) and g.parameters == full.parameters
    for gpu in ("A100-SXM4-80GB", "H100-SXM5-80GB"):
        assert predictor.predict(g, gpu).iteration_ms == pytest.approx(
            predictor.predict(full, gpu).iteration_ms, rel=1e-9)
    assert g.memory.peak([2])[0][0] == full.memory.peak([2])[0][0]
    # Defaults: batch 1, the config's positions up to 2048.
    assert predictor.trace(path, mode="inference").seq_len == 2048


def test_config_object_and_heads():
    from transformers import AutoConfig

    cfg = AutoConfig.for_model(**BERT_LIKE)
    g = predictor.trace(cfg, batch_size=4, seq_len=128)
    assert g.name == "BertForMaskedLM" and g.seq_len == 128 and g.parameters > 0
    assert predictor.predict(g, "T4").iteration_ms > 0


def test_cli_predicts_a_config_file(tmp_path, capsys):
    from predictor import cli

    path = _write(tmp_path, BERT_LIKE, "bert-tiny")
    assert cli.main(["predict", path, "-b", "8", "--seq-len", "128", "--gpus", "T4",
                     "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["model"] == "bert-tiny" and doc["seq_len"] == 128
    assert doc["predictions"][0]["iteration_ms"] > 0 and doc["predictions"][0]["fits"]


@pytest.mark.parametrize("content, message", [
    ("not json", "not a JSON file"),
    ({"hidden_size": 8}, 'no "model_type"'),
    ({"model_type": "nonesuch"}, "unknown to transformers"),
    ({"model_type": "patchtst"}, "neither a vocab_size"),
    ({**QWEN_LIKE, "model_type": "mixtral", "num_local_experts": 4}, "mixture-of-experts"),
    ({"model_type": "t5", "vocab_size": 100, "d_model": 64, "num_layers": 2}, "encoder-decoder"),
    # a config class builds per-layer lists: a billion layers would hang it
    ({**QWEN_LIKE, "num_hidden_layers": 10**9}, "whole number of layers in 1..4,096"),
    ({**QWEN_LIKE, "num_hidden_layers": -3}, "whole number of layers"),
    ({**QWEN_LIKE, "hidden_size": "64"}, "hidden_size"),
    ({"model_type": "[red]x[/red]"}, r"model_type '\[red\]x\[/red\]' is unknown"),
])
def test_bad_config_files_are_one_line(tmp_path, content, message):
    path = _write(tmp_path, content, "bad")
    with pytest.raises(PredictorError, match=message) as err:
        predictor.trace(path)
    assert "\n" not in str(err.value) and "config.json" in str(err.value)


def test_image_model_config(tmp_path):
    path = _write(tmp_path, {"architectures": ["ViTForImageClassification"],
                             "model_type": "vit", "hidden_size": 64, "num_hidden_layers": 6,
                             "num_attention_heads": 2, "intermediate_size": 128,
                             "image_size": 64, "patch_size": 16, "num_channels": 3}, "vit-tiny")
    g = predictor.trace(path, batch_size=8)
    full = predictor.trace(path, batch_size=8, replicate=False)
    assert g.name == "vit-tiny" and g.seq_len is None and len(g.ops) == len(full.ops)
    assert predictor.predict(g, "A100-SXM4-80GB").iteration_ms == pytest.approx(
        predictor.predict(full, "A100-SXM4-80GB").iteration_ms, rel=1e-9)
    with pytest.raises(PredictorError, match="does not apply to vit-tiny"):
        predictor.trace(path, seq_len=128)


def test_sequence_beyond_the_positions_is_refused(tmp_path):
    path = _write(tmp_path, BERT_LIKE, "bert-tiny")
    with pytest.raises(PredictorError, match="exceeds bert-tiny's maximum of 512"):
        predictor.trace(path, seq_len=1024)


def test_constructor_constants_are_computed_for_real(tmp_path):
    """ConvNeXt's constructor turns a linspace of drop-path rates into Python
    floats (``tolist``): under fake tensors alone that is a data-dependent
    error. Built with its constants real (``frontend.construction``), it
    traces, and its weights are still never materialised."""
    path = _write(tmp_path, {"architectures": ["ConvNextForImageClassification"],
                             "model_type": "convnext", "hidden_sizes": [16, 32, 64, 128],
                             "depths": [1, 1, 2, 1], "image_size": 64, "num_channels": 3,
                             "drop_path_rate": 0.1}, "convnext-tiny")
    g = predictor.trace(path, batch_size=4)
    assert g.name == "convnext-tiny" and g.parameters > 0
    assert predictor.predict(g, "A100-SXM4-80GB").iteration_ms > 0


def test_real_constants_keep_parameters_fake():
    import torch
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    from predictor.frontend.construction import MAX_ELEMENTS, real_constants

    with FakeTensorMode(allow_non_fake_inputs=True), real_constants():
        rates = [x.tolist() for x in torch.linspace(0, 0.3, 4).split([1, 3])]
        layer = torch.nn.Linear(8, 8)
        ids = torch.arange(16)
        big = torch.arange(MAX_ELEMENTS + 1)
        on_meta = torch.linspace(0, 1, 4, device="meta")
        scaled = torch.ones(8) * 0.5
    assert rates[0] == [0.0] and rates[1] == pytest.approx([0.1, 0.2, 0.3])
    assert isinstance(layer.weight, FakeTensor) and isinstance(scaled, FakeTensor)
    assert not isinstance(ids, FakeTensor) and ids.tolist()[-1] == 15
    assert isinstance(big, FakeTensor)          # too large to compute: left fake
    assert on_meta.device.type == "meta"


@pytest.mark.parametrize("doc, name", [
    # a vocabulary of visual tokens (its pre-training targets), pixels in
    ({"model_type": "beit", "vocab_size": 8192, "hidden_size": 64, "num_hidden_layers": 2,
      "num_attention_heads": 2, "intermediate_size": 128, "image_size": 64, "patch_size": 16,
      "num_channels": 3}, "beit-tiny"),
    # two heads for one model type, no `architectures` to choose between them
    ({"model_type": "deit", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
      "intermediate_size": 128, "image_size": 64, "patch_size": 16, "num_channels": 3},
     "deit-tiny"),
])
def test_image_configs_that_read_like_text_or_name_no_head(tmp_path, doc, name):
    g = predictor.trace(_write(tmp_path, doc, name), batch_size=4)
    assert g.name == name and g.seq_len is None and g.parameters > 0
    assert predictor.predict(g, "A100-SXM4-80GB").iteration_ms > 0
