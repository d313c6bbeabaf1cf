"""The ZooModel record and small helpers shared by the zoo modules.

Every ``build`` and ``make_inputs`` in the zoo is called by the tracer inside a
``FakeTensorMode``: they must only construct tensors with shape-driven
constructors (``torch.zeros``/``ones``/``full``/``randn``/``empty``) and must not
branch on tensor values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F

from predictor.errors import InvalidArgumentError
from predictor.limits import check_batch_size, check_seq_len


@dataclass(frozen=True)
class ZooModel:
    """A model the predictor knows how to build, feed and train.

    name:               canonical name, e.g. ``"resnet50"``.
    description:        one line for ``predictor zoo``.
    family:             ``"vision" | "text" | "gan" | "seq2seq"`` (``"custom"`` for factories).
    build:              () -> nn.Module (training module). Called inside FakeTensorMode.
    make_inputs:        (batch_size, seq_len or None) -> tuple of example inputs
                        (positional), or a dict of them (keyword: a user
                        factory's inputs by name).
    loss_fn:            output of ``model(*inputs)`` (``model(**inputs)``) -> scalar
                        loss (None: no training loss).
    default_batch_size: batch size used when the user gives none.
    default_seq_len:    sequence length used when the user gives none (None for vision).
    batch_dim:          dimension of every input tensor that is the batch.
    inference_fn:       () -> nn.Module for inference when it differs from the
                        training module (e.g. another HF head); None means
                        ``build()`` put in ``.eval()``.
    prebuilt:           (FakeTensorMode, nn.Module): a model already built under
                        that fake mode (a user factory's one call), which the
                        tracer uses instead of calling ``build()`` again; None
                        for the zoo's own models.
    stack:              (path, layers, build(k)): the ModuleList at `path` holds
                        `layers` identical blocks and ``build(k)`` builds the
                        model with k of them, so the tracer may trace 3 and
                        assemble the rest (a model from a Hugging Face config);
                        None: the zoo's own stacks are known by name
                        (``predictor.frontend.blocks.zoo_stack``).
    source:             the file the model was read from (a config.json), which
                        a failed trace names; None for the others.
    """

    name: str
    description: str
    family: str
    build: Callable[[], torch.nn.Module]
    make_inputs: Callable[[int, "int | None"], "tuple | dict"]
    loss_fn: "Callable[[Any], torch.Tensor] | None"
    default_batch_size: int
    default_seq_len: "int | None" = None
    batch_dim: int = 0
    inference_fn: "Callable[[], torch.nn.Module] | None" = None
    prebuilt: "tuple[Any, torch.nn.Module] | None" = None
    stack: "tuple[str, int, Callable[[int], torch.nn.Module]] | None" = None
    source: "str | None" = None


def check_batch(batch_size: int) -> int:
    return check_batch_size(batch_size)


def check_seq(seq_len: "int | None", default: int, maximum: "int | None", model: str) -> int:
    """The sequence length to use: the default when None, else validated."""
    if seq_len is None:
        return default
    seq_len = check_seq_len(seq_len)
    if maximum is not None and seq_len > maximum:
        raise InvalidArgumentError(
            f"sequence length {seq_len} exceeds {model}'s maximum of {maximum} positions"
        )
    return seq_len


def zeros_target(shape, device) -> torch.Tensor:
    """Class-index targets (all class 0); value-free so it works under FakeTensorMode."""
    return torch.zeros(shape, dtype=torch.long, device=device)


def classification_loss(logits: torch.Tensor) -> torch.Tensor:
    """Cross entropy of (N, C) logits against class-0 targets."""
    return F.cross_entropy(logits, zeros_target(logits.shape[0], logits.device))


def token_loss(logits: torch.Tensor) -> torch.Tensor:
    """Cross entropy of (B, S, V) logits flattened to (B*S, V) against token-0 targets."""
    v = logits.shape[-1]
    flat = logits.reshape(-1, v)
    return F.cross_entropy(flat, zeros_target(flat.shape[0], logits.device))
