"""Shared helpers of the CLI subcommands."""

from __future__ import annotations

import argparse
from typing import Sequence


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def console(stderr: bool = False):
    from rich.console import Console

    return Console(stderr=stderr, highlight=False)


def load_specs(files: Sequence[str]) -> None:
    from predictor import hardware

    for f in files:
        hardware.load_specs(f)


def fmt(value) -> str:
    if value is None or value != value:
        return "-"
    if isinstance(value, float):
        return f"{value:,.1f}" if value >= 10 else f"{value:,.2f}"
    return str(value)
