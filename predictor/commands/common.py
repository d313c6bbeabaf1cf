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


def add_step_arguments(p: argparse.ArgumentParser, inference_help: str) -> None:
    """What step of MODEL is traced: sequence length, optimizer, or inference."""
    p.add_argument("--seq-len", type=positive_int, help="sequence length for text models")
    p.add_argument("--optimizer", default="adam", choices=["adam", "adamw", "sgd", "none"],
                   help="optimizer step to include (default: adam)")
    p.add_argument("--inference", action="store_true", help=inference_help)


def add_precision_arguments(p: argparse.ArgumentParser) -> None:
    """How the traced step's floating-point ops run on the predicted GPU."""
    p.add_argument("--dtype", default=None, choices=["float32", "float16", "bfloat16"],
                   help="run every floating-point op in this dtype (default: as traced)")
    p.add_argument("--tf32", action="store_true",
                   help="fp32 matmuls use TF32 tensor cores (torch.backends.cuda.matmul.allow_tf32)")


def add_spec_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--spec", action="append", default=[], metavar="FILE",
                   help="extra GPU spec file (TOML, same layout as the built-in one)")


def add_format_arguments(p: argparse.ArgumentParser, json_help: str = "print a JSON object",
                         csv_help: str = "print CSV") -> None:
    """--json or --csv on standard output, not both."""
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help=json_help)
    fmt.add_argument("--csv", action="store_true", help=csv_help)


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
