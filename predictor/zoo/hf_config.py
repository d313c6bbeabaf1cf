"""A Hugging Face config as a model: ``predictor predict path/to/config.json``.

A ``config.json`` (the file the hub shows beside the weights: no weights and
no network are needed) or a ``transformers.PretrainedConfig`` object becomes a
:class:`ZooModel`:

- **the model** is built with ``from_config`` (random init) in the class the
  config's ``architectures`` names (``Qwen2ForCausalLM``, ``BertForMaskedLM``,
  ``ViTForImageClassification``, ...), else the causal-LM class of its
  ``model_type`` (text) or its image-classification class (images), else the
  bare model; no KV cache; in fp32 whatever the config's ``torch_dtype`` (how
  the released weights are stored), so ``amp=`` / ``dtype=`` choose the
  precision;
- **attention**: the config's ``attn_implementation`` when it names one;
  else a causal LM runs the zoo's Llama attention (SDPA with ``is_causal``
  and no mask tensor: flash attention on the GPU, as such models train), a
  text encoder ``sdpa``, an image model its default; a model that cannot run
  SDPA runs its eager attention;
- **inputs**: a text model ``input_ids`` of (batch, seq), seq at most the
  config's ``max_position_embeddings``; an image model ``pixel_values`` of
  (batch, channels, size, size) at its ``image_size``;
- **loss**: cross entropy over the head's logits (a causal or masked LM's
  vocabulary per token, a classifier's labels); BERT's pre-training heads sum
  both, as the zoo's BERT; a bare model (no head) the mean of its output;
- **repeated blocks**: the ModuleList of ``num_hidden_layers`` blocks is
  found on a 2-block copy, so the trace covers 3 blocks and assembles the
  rest (``predictor.frontend.blocks``), as for the zoo's transformers.

Refused in one line naming the file: encoder-decoder models (their decoder
inputs), mixture-of-experts models (routing by value), configs with neither a
vocabulary nor image channels. ``transformers`` is imported when a config is
read, not before.
"""
from __future__ import annotations

import contextlib
import copy
import functools
import json
import os
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from predictor.errors import FileFormatError, InvalidArgumentError
from predictor.io import printable, read_regular

from . import hf
from .base import ZooModel, check_batch, check_seq, token_loss

MAX_CONFIG_BYTES = 1 << 20     # config.json files are a few KB
DEFAULT_SEQ = 2048             # the sequence length when neither the user nor the config gives one
DEFAULT_BATCH = 1
# The layer counts a config may give, and their bound (the deepest released
# transformers have a few hundred layers).
LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
MAX_LAYERS = 4096
# The expert counts of mixture-of-experts configs (Mixtral, Qwen-MoE, DeepSeek, DBRX).
MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
# Image models: the input when the config gives no image_size, and bounds.
DEFAULT_IMAGE_SIZE = 224
DEFAULT_IMAGE_BATCH = 32
MAX_IMAGE_SIZE = 8192
MAX_CHANNELS = 64


def is_config_path(spec: Any) -> bool:
    """Whether a model spec names a config file (``*.json``)."""
    return isinstance(spec, (str, os.PathLike)) and str(spec).lower().endswith(".json")


def is_config(obj: Any) -> bool:
    """Whether `obj` is a ``transformers.PretrainedConfig`` (without importing
    transformers when nothing could be one)."""
    import sys

    mod = sys.modules.get("transformers")
    return mod is not None and isinstance(obj, mod.PretrainedConfig)


def load(path: str | os.PathLike):
    """The ``PretrainedConfig`` of a ``config.json``; a one-line error naming
    the file for anything else."""
    p = printable(os.fspath(path), 300)
    raw = read_regular(path, MAX_CONFIG_BYTES, "Hugging Face config file (config.json)")
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise FileFormatError(f"{p}: not a JSON file ({printable(str(exc), 200)})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("model_type"), str):
        raise FileFormatError(f"{p}: not a Hugging Face config (no \"model_type\")")
    for key in LAYER_KEYS:   # a config builds per-layer lists: bound them first
        n = doc.get(key)
        if n is not None and (isinstance(n, bool) or not isinstance(n, int)
                              or not 1 <= n <= MAX_LAYERS):
            raise FileFormatError(
                f"{p}: {key} must be a whole number of layers in 1..{MAX_LAYERS:,}, got "
                f"{printable(repr(n), 80)}")
    import transformers

    # The weights' storage dtype does not apply (see _build).
    fields = {k: v for k, v in doc.items()
              if k not in ("model_type", "transformers_version", "torch_dtype", "dtype")}
    try:
        return transformers.AutoConfig.for_model(doc["model_type"], **fields)
    except ValueError as exc:
        if "Unrecognized model" in str(exc) or doc["model_type"] not in \
                transformers.CONFIG_MAPPING:
            raise FileFormatError(
                f"{p}: model_type {printable(doc['model_type'], 80)!r} is unknown to "
                f"transformers {transformers.__version__}") from None
        raise FileFormatError(f"{p}: {printable(' '.join(str(exc).split()), 300)}") from None
    except Exception as exc:  # noqa: BLE001 - the config class's own validation of the file
        raise FileFormatError(f"{p}: {printable(' '.join(str(exc).split()), 300)}") from None


def _architectures(config) -> list[str]:
    """The class names the config's ``architectures`` lists (other entries ignored)."""
    archs = getattr(config, "architectures", None)
    return [a for a in archs if isinstance(a, str)] if isinstance(archs, (list, tuple)) else []


def _is_vision(config) -> bool:
    """An image model: pixels in (``num_channels``), and no token vocabulary
    or a type transformers classifies images with (BEiT's vocabulary is of
    the visual tokens its pre-training predicts, not of its inputs)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES

    vocab = getattr(config, "vocab_size", None)
    channels = getattr(config, "num_channels", None)
    if not isinstance(channels, int) or isinstance(channels, bool) or channels <= 0:
        return False
    return not (isinstance(vocab, int) and vocab > 0) \
        or getattr(config, "model_type", None) in MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES


def _model_class(config):
    """(class or Auto class name, causal LM?) for `config`."""
    import transformers
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES,
    )

    archs = _architectures(config)
    cls = getattr(transformers, archs[0], None) if archs else None
    if cls is not None and isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel):
        name = cls.__name__
        return cls, name.endswith("ForCausalLM") or name.endswith("LMHeadModel")
    if _is_vision(config):
        if config.model_type in MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES:
            return "AutoModelForImageClassification", False
        return "AutoModel", False
    if config.model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and not getattr(
            config, "is_encoder_decoder", False):
        return "AutoModelForCausalLM", True
    return "AutoModel", False


def _build(config, layers: int | None = None) -> nn.Module:
    cfg = copy.deepcopy(config)
    if layers is not None:
        cfg.num_hidden_layers = layers
    # An Auto class with several heads for one model type (DeiT's with and
    # without its distillation teacher) iterates `architectures`, which a
    # config built in code leaves None: no architecture named, its default.
    if getattr(cfg, "architectures", None) is None:
        cfg.architectures = []
    # A config's dtype is how its released weights are stored, not how the
    # model trains: fp32 weights (amp= or dtype= choose the precision).
    attr = "dtype" if "dtype" in vars(cfg) else "torch_dtype"   # transformers 5 / 4
    if vars(cfg).get(attr) is not None:
        setattr(cfg, attr, None)
    cls, causal = _model_class(cfg)
    # Causal LMs: the zoo's fused causal attention; text encoders: PyTorch's
    # fused attention; image models: their default. A model that cannot run
    # SDPA (disentangled attention) runs its eager attention.
    vision = _is_vision(cfg)
    attn = hf._register_causal_sdpa() if causal else None if vision else "sdpa"
    # ... unless the config names one ("attn_implementation": "eager": the
    # scores as their own matmul, softmax and matmul kernels).
    attn = getattr(cfg, "_attn_implementation", None) or attn
    if isinstance(cls, str):
        import transformers

        cls = getattr(transformers, cls)
    # Image models' initialisers (a truncated normal) read values back, which
    # fake tensors cannot: their weights are left uninitialised (never read).
    with _no_init() if vision else contextlib.nullcontext():
        try:
            model = _instantiate(cls, copy.deepcopy(cfg), attn)
        except ValueError as exc:
            if attn is None or "attention implementation" not in str(exc):
                raise
            model = _instantiate(cls, cfg, "eager")
    model.config.use_cache = False
    if causal:
        model.register_forward_pre_hook(hf._position_ids_hook, with_kwargs=True)
    return model


def _instantiate(cls, cfg, attn: str | None) -> nn.Module:
    """`cls` (a model class or an Auto class) from `cfg`, with attention `attn`."""
    kwargs = {} if attn is None else {"attn_implementation": attn}
    make = cls.from_config if hasattr(cls, "_model_mapping") else cls._from_config
    return make(cfg, **kwargs)


def _no_init():
    """transformers' ``no_init_weights`` (weights are never read: only shapes
    matter), or nothing where this version has none."""
    for where in ("transformers.initialization", "transformers.modeling_utils"):
        try:
            module = __import__(where, fromlist=["no_init_weights"])
        except ImportError:
            continue
        if hasattr(module, "no_init_weights"):
            return module.no_init_weights()
    return contextlib.nullcontext()


def _head_loss(out: Any) -> torch.Tensor:
    """Token cross entropy over the head's logits (both of BERT's pre-training
    heads); a bare model's mean output."""
    if hasattr(out, "keys"):
        keys = set(out.keys())
        if {"prediction_logits", "seq_relationship_logits"} <= keys:
            return hf.bert_pretraining_loss(out)
        if "logits" in keys:
            return token_loss(out["logits"])
        first = next(v for v in out.values() if isinstance(v, torch.Tensor))
    else:
        first = out[0] if isinstance(out, (tuple, list)) else out
    return first.float().mean()


def _stack_path(config) -> str | None:
    """The path of the ModuleList holding the blocks, found on a 2-block copy
    built on the meta device (no memory)."""
    try:
        with torch.device("meta"):
            small = _build(config, 2)
    except Exception:  # noqa: BLE001 - a config that cannot shrink: trace it whole
        return None
    lists = [name for name, m in small.named_modules()
             if isinstance(m, nn.ModuleList) and len(m) == 2
             and type(m[0]) is type(m[1]) and any(True for _ in m[0].parameters())]
    return lists[0] if len(lists) == 1 else None


def _name_of(config, path: str | os.PathLike | None) -> str:
    if path is not None:
        p = Path(path)
        # .../Qwen2-7B/config.json -> Qwen2-7B; my-model.json -> my-model
        return (p.parent.name or p.stem) if p.stem == "config" else p.stem
    archs = _architectures(config)
    return str(getattr(config, "name_or_path", "") or (archs[0] if archs else config.model_type))


def entry(config, name: str | None = None, path: str | os.PathLike | None = None) -> ZooModel:
    """The :class:`ZooModel` of a ``PretrainedConfig`` (see the module docstring)."""
    where = printable(os.fspath(path), 300) if path is not None else "the config"
    vocab = getattr(config, "vocab_size", None)
    vision = _is_vision(config)
    if not vision and (not isinstance(vocab, int) or isinstance(vocab, bool) or vocab < 1):
        raise InvalidArgumentError(
            f"{where}: a {printable(config.model_type, 80)} config with neither a vocab_size "
            "(text) nor num_channels (images); wrap the model in a factory "
            "(path/to/file.py:build, README 'Your own model')")
    experts = [getattr(config, k, None) for k in MOE_KEYS]
    if any(isinstance(n, int) and not isinstance(n, bool) and n > 1 for n in experts):
        raise InvalidArgumentError(
            f"{where}: a mixture-of-experts model routes each token by its values, which a "
            "static trace cannot follow; mixture-of-experts layers are not modelled")
    if getattr(config, "is_encoder_decoder", False):
        raise InvalidArgumentError(
            f"{where}: {printable(config.model_type, 80)} is an encoder-decoder model, which "
            "takes decoder inputs too; wrap it in a factory that returns them (path/to/file.py:"
            "build, README 'Your own model')")
    title = _name_of(config, path) if name is None else name
    inputs = _image_inputs(config, where) if vision else _token_inputs(config, title)
    make_inputs, default_seq, what = inputs
    layers = getattr(config, "num_hidden_layers", None)
    path_in_model = _stack_path(config) if isinstance(layers, int) and layers > 4 else None
    cls, _ = _model_class(config)
    head = cls if isinstance(cls, str) else cls.__name__
    return ZooModel(
        name=title,
        description=f"{head} from a Hugging Face config ({config.model_type}, {what})",
        family="vision" if vision else "text",
        build=functools.partial(_build, config),
        make_inputs=make_inputs,
        loss_fn=_head_loss,
        default_batch_size=DEFAULT_IMAGE_BATCH if vision else DEFAULT_BATCH,
        default_seq_len=default_seq,
        stack=(path_in_model, layers, functools.partial(_build, config))
        if path_in_model else None,
        source=os.fspath(path) if path is not None else None,
    )


def _token_inputs(config, title: str):
    """(make_inputs, default sequence, description) of a text model:
    ``input_ids`` of (batch, seq), seq at most the config's positions."""
    vocab = config.vocab_size
    max_pos = getattr(config, "max_position_embeddings", None)
    max_pos = max_pos if isinstance(max_pos, int) and max_pos > 0 else None
    default_seq = min(DEFAULT_SEQ, max_pos) if max_pos else DEFAULT_SEQ
    fill = 1 if vocab > 1 else 0

    def make_inputs(batch_size: int, seq_len: int | None = None) -> tuple:
        b = check_batch(batch_size)
        s = check_seq(seq_len, default_seq, max_pos, title)
        return (torch.full((b, s), fill, dtype=torch.long),)

    layers = getattr(config, "num_hidden_layers", None)
    return make_inputs, default_seq, f"{layers} layers, vocabulary {vocab:,}"


def _image_inputs(config, where: str):
    """(make_inputs, None, description) of an image model: ``pixel_values`` of
    (batch, channels, size, size) at the config's ``image_size`` (224 when it
    has none)."""
    size = getattr(config, "image_size", None)
    size = size[0] if isinstance(size, (list, tuple)) and size else size
    if not isinstance(size, int) or isinstance(size, bool) or not 1 <= size <= MAX_IMAGE_SIZE:
        size = DEFAULT_IMAGE_SIZE
    channels = config.num_channels
    if channels > MAX_CHANNELS:
        raise InvalidArgumentError(f"{where}: num_channels {channels:,} is beyond {MAX_CHANNELS:,}")

    def make_inputs(batch_size: int, seq_len: int | None = None) -> tuple:
        return (torch.randn(check_batch(batch_size), channels, size, size),)

    return make_inputs, None, f"{channels}x{size}x{size} images"


@functools.lru_cache(maxsize=16)
def _entry_from_file(path: str, mtime_ns: int, size: int) -> ZooModel:
    return entry(load(path), path=path)


def entry_from_file(path: str | os.PathLike) -> ZooModel:
    """:func:`entry` of a ``config.json`` (read once per version of the file)."""
    try:
        st = os.stat(path)
        key = (st.st_mtime_ns, st.st_size)
    except OSError:
        key = (0, 0)   # load() says what is wrong with it
    return _entry_from_file(os.fspath(path), *key)
