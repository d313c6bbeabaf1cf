"""The model zoo: named models the predictor can build, feed and train.

``get(name)`` looks a model up (case-insensitive, with aliases),
``load_factory("file.py:fn")`` wraps a user's model, ``resolve(spec)`` does
either. Every ``build``/``make_inputs`` is safe to call inside
``FakeTensorMode`` (no real allocation, no value-dependent code), accepts any
batch size, and builds from configs in code (no downloads).

Model notes (deviations from the reference implementations are in each
module's docstring): Inception v3 includes torchvision's auxiliary classifier
(loss CE + 0.4 x aux CE in training; skipped in eval); DCGAN models the
generator and discriminator updates as one combined step; GNMT uses
full-length sentences (no padding masks); BERT's training loss is MLM + NSP;
``gpt3-xl`` follows the reference GPT-2-style config (n_embd 3072, 24 layers,
24 heads), which is larger than the GPT-3 paper's 1.3B "XL".
"""

from __future__ import annotations

import difflib
import functools

from predictor.errors import UnknownModelError

from . import hf, hf_config, seq2seq, vision
from .base import ZooModel, classification_loss, token_loss
from .factory import default_loss, load_factory

__all__ = ["ZooModel", "ZOO", "names", "get", "load_factory", "resolve", "default_loss"]


def _bert(name: str, title: str, params: str, batch: int) -> ZooModel:
    return ZooModel(
        name=name,
        description=f"{title} (Devlin et al. 2018), BertForPreTraining MLM+NSP, seq 512, {params} params",
        family="text",
        build=functools.partial(hf.build_bert_pretraining, name),
        make_inputs=hf.token_inputs(name, 512, 1),
        loss_fn=hf.bert_pretraining_loss,
        default_batch_size=batch,
        default_seq_len=512,
        inference_fn=functools.partial(hf.build_bert_classifier, name),
    )


def _gpt(name: str, title: str, params: str, batch: int) -> ZooModel:
    seq = hf.max_positions(name)
    return ZooModel(
        name=name,
        description=f"{title}, GPT2LMHeadModel, seq {seq}, {params} params",
        family="text",
        build=functools.partial(hf.build_gpt2, name),
        make_inputs=hf.token_inputs(name, seq, 0),
        loss_fn=hf.causal_lm_loss,
        default_batch_size=batch,
        default_seq_len=seq,
    )


def _llama(name: str, title: str, params: str) -> ZooModel:
    seq = hf.max_positions(name)
    return ZooModel(
        name=name,
        description=f"{title}, LlamaForCausalLM (SDPA attention), seq {seq}, {params} params",
        family="text",
        build=functools.partial(hf.build_llama, name),
        make_inputs=hf.token_inputs(name, seq, 0),
        loss_fn=hf.causal_lm_loss,
        default_batch_size=1,
        default_seq_len=seq,
    )


_MODELS = [
    ZooModel(
        name="resnet50",
        description="ResNet-50 v1.5 (He et al. 2015, torchvision), 224x224 ImageNet, 25.6 M params",
        family="vision",
        build=vision.build_resnet50,
        make_inputs=vision.resnet50_inputs,
        loss_fn=classification_loss,
        default_batch_size=64,
    ),
    ZooModel(
        name="inception_v3",
        description="Inception v3 (Szegedy et al. 2015, torchvision, with aux head), 299x299 ImageNet, 27.2 M params",
        family="vision",
        build=vision.build_inception_v3,
        make_inputs=vision.inception_v3_inputs,
        loss_fn=vision.inception_v3_loss,
        default_batch_size=64,
    ),
    ZooModel(
        name="transformer",
        description="Transformer base (Vaswani et al. 2017), 6+6 layers d512, shared 32k vocab, seq 50, 60.5 M params",
        family="seq2seq",
        build=seq2seq.build_transformer,
        make_inputs=seq2seq.transformer_inputs,
        loss_fn=token_loss,
        default_batch_size=64,
        default_seq_len=50,
    ),
    ZooModel(
        name="gnmt",
        description="GNMT v2 (Wu et al. 2016; MLPerf/NVIDIA), 4+4 LSTM 1024, Bahdanau attention, 32k vocab, seq 50, 160.7 M params",
        family="seq2seq",
        build=seq2seq.build_gnmt,
        make_inputs=seq2seq.gnmt_inputs,
        loss_fn=token_loss,
        default_batch_size=64,
        default_seq_len=50,
    ),
    ZooModel(
        name="dcgan",
        description="DCGAN (Radford et al. 2015) 64x64, G and D trained in one combined step, 6.3 M params",
        family="gan",
        build=vision.build_dcgan,
        make_inputs=vision.dcgan_inputs,
        loss_fn=vision.dcgan_loss,
        default_batch_size=64,
        inference_fn=vision.build_dcgan_inference,
    ),
    _bert("bert-large", "BERT-Large", "336 M", 8),
    _bert("bert-base", "BERT-Base", "110 M", 16),
    _gpt("gpt2-large", "GPT-2 Large (Radford et al. 2019)", "774 M", 4),
    _gpt("gpt2", "GPT-2 small (Radford et al. 2019)", "124 M", 8),
    _gpt("gpt3-xl", "GPT-3 XL shape as GPT-2 (reference config: d3072, 24 layers, 24 heads)", "2.88 B", 2),
    _gpt("gpt3-2.7b", "GPT-3 2.7B (Brown et al. 2020) as GPT-2 (d2560, 32 layers, 32 heads)", "2.65 B", 2),
    ZooModel(
        name="opt-1.3b",
        description="OPT-1.3B (Zhang et al. 2022), OPTForCausalLM, seq 2048, 1.32 B params",
        family="text",
        build=hf.build_opt,
        make_inputs=hf.token_inputs("opt-1.3b", 2048, 2),
        loss_fn=hf.causal_lm_loss,
        default_batch_size=2,
        default_seq_len=2048,
    ),
    _llama("llama2-7b", "Llama 2 7B (Touvron et al. 2023)", "6.74 B"),
    _llama("llama2-13b", "Llama 2 13B (Touvron et al. 2023)", "13.0 B"),
    _llama("llama2-70b", "Llama 2 70B (Touvron et al. 2023, GQA 8 KV heads)", "69.0 B"),
    _llama("llama3-8b", "Llama 3 8B (Dubey et al. 2024, GQA 8 KV heads, 128k vocab)", "8.03 B"),
    _llama("llama3-70b", "Llama 3 70B (Dubey et al. 2024, GQA 8 KV heads, 128k vocab)", "70.6 B"),
]

ZOO: "dict[str, ZooModel]" = {m.name: m for m in _MODELS}

# Extra spellings (compared after _key() normalization) -> canonical name.
_ALIASES = {
    "resnet": "resnet50",
    "inception": "inception_v3",
    "inceptionv3": "inception_v3",
    "transformerbase": "transformer",
    "gpt2small": "gpt2",
    "gpt2124m": "gpt2",
    "gpt3xl": "gpt3-xl",
    "gpt327": "gpt3-2.7b",
    "gpt327b": "gpt3-2.7b",
    "opt13": "opt-1.3b",
    "opt13b": "opt-1.3b",
    "llama7b": "llama2-7b",
    "llama27b": "llama2-7b",
    "llama213b": "llama2-13b",
    "llama70b": "llama2-70b",
    "llama270b": "llama2-70b",
    "llama38b": "llama3-8b",
    "llama370b": "llama3-70b",
}


def _key(name: str) -> str:
    """Case-, dash-, underscore-, dot- and space-insensitive lookup key."""
    return "".join(ch for ch in name.strip().lower() if ch not in "-_. ")


_LOOKUP: "dict[str, str]" = {_key(n): n for n in ZOO}
_LOOKUP.update(_ALIASES)


def names() -> "list[str]":
    """Canonical zoo names, in display order."""
    return list(ZOO)


def get(name: str) -> ZooModel:
    """The zoo model called ``name`` (case-insensitive; aliases like ``bert_large``,
    ``gpt3_27``, ``opt_13``). Unknown names raise UnknownModelError with close matches."""
    canonical = _LOOKUP.get(_key(str(name)))
    if canonical is not None:
        return ZOO[canonical]
    query = str(name).strip().lower()
    spellings = {n.lower(): n for n in ZOO}
    spellings.update({k: v for k, v in _LOOKUP.items()})
    close: list[str] = []
    for cand in difflib.get_close_matches(query, list(spellings), n=6, cutoff=0.5) + difflib.get_close_matches(
        _key(query), list(spellings), n=6, cutoff=0.5
    ):
        if spellings[cand] not in close:
            close.append(spellings[cand])
    hint = f"did you mean {', '.join(close[:3])}? " if close else ""
    raise UnknownModelError(
        f"unknown model '{name}': {hint}available: {', '.join(names())} "
        "(run `predictor zoo` for details, pass a factory as path/to/file.py:factory, or a "
        "Hugging Face config as path/to/config.json)"
    )


def resolve(spec) -> ZooModel:
    """A zoo name, else a Hugging Face config (``config.json``, or a
    ``PretrainedConfig`` object), else a factory spec (``file.py:fn`` /
    ``pkg.mod:fn``)."""
    if hf_config.is_config(spec):
        return hf_config.entry(spec)
    if hf_config.is_config_path(spec):
        return hf_config.entry_from_file(spec)
    try:
        return get(spec)
    except UnknownModelError:
        if ":" in str(spec):
            return load_factory(str(spec))
        raise
