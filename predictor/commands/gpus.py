"""`predictor gpus`: the GPU database."""

from __future__ import annotations

import argparse

from predictor.commands.common import (add_format_arguments, add_spec_argument, console,
                                       error_cell, fmt, load_specs, plural)

NAME = "gpus"


def add_parser(sub) -> None:
    g = sub.add_parser(NAME, help="list the GPUs in the spec database",
                       description="List known GPUs with their main specs and prices: cloud "
                                   "on-demand and marketplace USD per GPU-hour, each dated; "
                                   "'~' marks an estimate, '-' no price known on that basis.")
    g.add_argument("names", nargs="*", metavar="NAME",
                   help="only the GPUs NAME picks: the one whose id it is, else those whose "
                        "id contains it (case, '-' and spaces ignored), else the one it is an "
                        "alias of; e.g. `predictor gpus h100 a100 l4` (l4: the L4, not the L40); "
                        "NAME@WATTSW: that board under a power limit")
    add_spec_argument(g)
    add_format_arguments(g, json_help="print JSON")


def _key(name: str) -> str:
    return "".join(c for c in str(name).lower() if c.isalnum())


def matching(ids, names) -> list[str]:
    """The ids among `ids` that each of `names` picks: the id it spells (so
    `l4` is the L4 and `a10` the A10, not every id containing them), else
    those containing it, else the one it names (an alias; an unknown name
    raises the database's one-line error with the close names)."""
    from predictor import hardware

    keep = set()
    for name in names:
        key = _key(name)
        hits = {i for i in ids if key and key == _key(i)} \
            or {i for i in ids if key and key in _key(i)}
        keep |= hits or {hardware.get(name).id}
    return [i for i in ids if i in keep]


def price_cell(usd, estimate) -> str:
    """'2.99', '~0.99' for an estimate, '-' when there is no price on the basis."""
    if usd is None or usd != usd:
        return "-"
    return ("~" if estimate is True else "") + f"{usd:,.2f}"


def date_span(dates) -> str:
    """'2025-01', or '2024-06 to 2025-06' when the dates differ; '' for none."""
    ds = sorted({str(d) for d in dates if isinstance(d, str) and d})
    if not ds:
        return ""
    return ds[0] if len(ds) == 1 else f"{ds[0]} to {ds[-1]}"


def run(args: argparse.Namespace) -> int:
    from rich.table import Table

    from predictor import expected_error, hardware, opmodel

    load_specs(args.spec)
    # Boards under a power limit ("T4@50W") are listed as derived.
    limited = [hardware.get(n) for n in args.names if hardware.has_power_limit(n)]
    df = hardware.gpus(extra=limited)
    if args.names:
        df = df[df["id"].isin(matching(list(df["id"]), args.names))] \
            .reset_index(drop=True)
    # Whether the op models were trained on kernels measured on the GPU's chip
    # (else it is predicted from its spec sheet alone).
    outside = set(opmodel.outside_training_data([*hardware.database(), *limited]))
    df["chip_in_training_data"] = [gid not in outside for gid in df["id"]]
    # The band an fp32 prediction on the GPU quotes (predictor.expected_error).
    df["fp32_error_p90_pct"] = [
        expected_error.p90_pct(expected_error.standing(hardware.get(gid))) for gid in df["id"]]
    if args.json:
        print(df.to_json(orient="records", indent=2))
        return 0
    if args.csv:
        print(df.to_csv(index=False), end="")
        return 0
    cloud = date_span(df["price_date"])
    market = date_span(df["marketplace_date"])
    table = Table(title=f"{plural(len(df), 'GPU')}, one PyTorch device each (dense peak TFLOP/s; "
                        "USD per GPU-hour)", title_justify="left")
    cols = [("id", "id"), ("memory_gb", "GB"), ("memory_bw_gbs", "GB/s"),
            ("fp32_tflops", "fp32"), ("tf32_tflops", "tf32"), ("bf16_tflops", "bf16"),
            ("fp8_tflops", "fp8")]
    for key, label in cols:
        table.add_column(label, justify="left" if key == "id" else "right", no_wrap=True)
    table.add_column("$/h cloud", justify="right", no_wrap=True)
    table.add_column("$/h market", justify="right", no_wrap=True)
    table.add_column("trained on", justify="center", no_wrap=True)
    table.add_column("±err fp32", justify="right", no_wrap=True)
    for row in df.to_dict(orient="records"):
        table.add_row(*[fmt(row[k]) for k, _ in cols],
                      price_cell(row["price_usd_per_hour"], row["price_estimate"]),
                      price_cell(row["marketplace_usd_per_hour"], row["marketplace_estimate"]),
                      "chip" if row["chip_in_training_data"] else "-",
                      error_cell(row["fp32_error_p90_pct"]))
    out = console()
    out.print(table)
    n_est = int((df["price_estimate"] == True).sum()  # noqa: E712 - None for no price
                + (df["marketplace_estimate"] == True).sum())  # noqa: E712
    out.print(
        f"$/h cloud: cloud on-demand list prices{f' ({cloud})' if cloud else ''}; $/h market: "
        f"marketplace hosts{f' ({market})' if market else ''}. "
        + (f"~ marks {plural(n_est, 'estimate')} (not read from a live listing); " if n_est
           else "")
        + "- no price known on that basis. Sources: --json or specs/gpus.toml. "
        "`predictor search --objective cost` ranks "
        "by the cloud column (--price-basis marketplace for the other). trained on: 'chip' "
        "where the op models learned from kernels measured on the GPU's chip; '-' where "
        "it is predicted from its spec sheet alone (README, 'How accurate'). ±err fp32: 90 % "
        "of measured fp32 iterations predicted the same way were within this (the narrower "
        "band only on the boards whose own kernels trained the op models). fp8: float8 "
        "tensor cores, what --amp fp8 needs ('-': none)."
        + ("\nAMD: the tf32 column is the datasheet's; PyTorch on ROCm uses no TF32/xf32 for fp32 "
           "convolutions and matmuls by default, so they are predicted at the fp32 matrix rate."
           if (df["vendor"] == "amd").any() else ""), style="dim")
    return 0
