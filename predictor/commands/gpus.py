"""`predictor gpus`: the GPU database."""

from __future__ import annotations

import argparse

from predictor.commands.common import (add_format_arguments, add_spec_argument, console, fmt,
                                       load_specs)

NAME = "gpus"


def add_parser(sub) -> None:
    g = sub.add_parser(NAME, help="list the GPUs in the spec database",
                       description="List known GPUs with their main specs.")
    add_spec_argument(g)
    add_format_arguments(g, json_help="print JSON")


def run(args: argparse.Namespace) -> int:
    from rich.table import Table

    from predictor import hardware

    load_specs(args.spec)
    df = hardware.gpus()
    if args.json:
        print(df.to_json(orient="records", indent=2))
        return 0
    if args.csv:
        print(df.to_csv(index=False), end="")
        return 0
    table = Table(title=f"{len(df)} GPUs (dense peak TFLOP/s; indicative $/GPU-hour)",
                  title_justify="left")
    cols = [("id", "id"), ("memory_gb", "GB"), ("memory_bw_gbs", "GB/s"),
            ("fp32_tflops", "fp32"), ("tf32_tflops", "tf32"), ("bf16_tflops", "bf16"),
            ("price_usd_per_hour", "$/h")]
    for key, label in cols:
        table.add_column(label, justify="left" if key == "id" else "right", no_wrap=True)
    for row in df.to_dict(orient="records"):
        table.add_row(*[fmt(row[k]) for k, _ in cols])
    console().print(table)
    return 0
