"""`predictor zoo`: the built-in models."""

from __future__ import annotations

import argparse

from predictor.commands.common import console

NAME = "zoo"


def add_parser(sub) -> None:
    sub.add_parser(NAME, help="list the built-in models", description="List the model zoo.")


def run(args: argparse.Namespace) -> int:
    from rich.table import Table

    from predictor import zoo

    table = Table(title="model zoo (no downloads: built from code and configs)",
                  title_justify="left")
    for col in ("name", "family", "batch", "seq", "description"):
        table.add_column(col, no_wrap=col != "description")
    for name in zoo.names():
        m = zoo.get(name)
        table.add_row(m.name, m.family, str(m.default_batch_size),
                      str(m.default_seq_len or "-"), m.description)
    out = console()
    out.print(table)
    out.print("Other models: a Hugging Face text model's config.json (path/to/config.json), "
              "a factory (path/to/file.py:build returning (model, example_inputs)), or an "
              "exported .onnx file.", markup=False, style="dim")
    return 0
