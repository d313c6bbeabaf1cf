"""`predictor search MODEL`: which GPU and batch size, ranked by time, cost or
throughput, among the configurations that fit in memory; optionally an HTML
report with plots."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from predictor.commands.common import (add_format_arguments, add_precision_arguments,
                                       add_spec_argument, add_step_arguments, console, load_graph,
                                       load_specs, notes, parse_batch_sizes, positive_int,
                                       print_notes_stderr)

NAME = "search"


def _float_in(text: str, ok, expected: str) -> float:
    """An argparse type: a float for which ok(value) holds."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
    if not ok(value):
        raise argparse.ArgumentTypeError(f"expected {expected}, got {value}")
    return value


def _fraction(text: str) -> float:
    return _float_in(text, lambda v: 0 < v <= 1, "a number in (0, 1]")


def _positive_float(text: str) -> float:
    return _float_in(text, lambda v: v > 0 and math.isfinite(v), "a positive number")


def add_parser(sub) -> None:
    p = sub.add_parser(
        NAME, help="rank GPUs x batch sizes by time, cost or throughput (memory-aware)",
        description="Trace one training step of MODEL once, predict its time and peak memory "
                    "for every (GPU, batch size), and rank the configurations that fit in "
                    "memory by the objective. With --samples/--epochs or --iterations the "
                    "ranking is for that training run (total hours, total cost).",
        epilog="examples: predictor search resnet50 --objective cost --samples 1281167 "
               "--epochs 90 | predictor search gpt2-large --gpus A100-SXM4-80GB,H100-SXM5-80GB "
               "--batch-sizes 1..64 --price H100-SXM5-80GB=2.49 --report out/ | "
               "predictor search resnet50 --gpus-per-node 8 --gpus A100-SXM4-80GB. "
               "MODEL is a zoo name, a factory spec or a saved graph (.npz).")
    p.add_argument("model", metavar="MODEL", help="zoo name, factory spec or saved graph (.npz)")
    p.add_argument("--objective", default="time", choices=["time", "cost", "throughput"],
                   help="time: least hours; cost: least USD; throughput: most samples/s "
                        "(default: time)")
    p.add_argument("--gpus", default="all",
                   help="comma-separated GPU ids or aliases, or 'all' (default: all)")
    p.add_argument("-b", "--batch-sizes", type=parse_batch_sizes, default=None, metavar="LIST",
                   help="per-GPU batch sizes: comma-separated sizes and doubling ranges A..B "
                        "(default: 1..2048)")
    run = p.add_argument_group("training run (default: per 1M samples)")
    run.add_argument("--samples", type=positive_int, metavar="N",
                     help="samples per epoch (the dataset size)")
    run.add_argument("--epochs", type=_positive_float, metavar="E", help="epochs (default 1)")
    run.add_argument("--iterations", type=positive_int, metavar="N",
                     help="a fixed number of iterations instead of samples x epochs")
    p.add_argument("--price", action="append", default=[], metavar="GPU=USD|FILE",
                   help="override a GPU's price in USD per GPU-hour (repeatable), or read "
                        "prices from a TOML/JSON file of GPU = USD")
    p.add_argument("--price-basis", default="cloud", choices=["cloud", "marketplace"],
                   help="which prices of the GPU database to use: cloud on-demand list prices "
                        "(default) or marketplace hosts' (RunPod Community, Vast.ai); a GPU "
                        "without a price on that basis has none (see `predictor gpus`)")
    p.add_argument("--gpus-per-node", type=positive_int, default=1, metavar="N",
                   help="train data-parallel (DDP) on N GPUs of each type; batch sizes are "
                        "per GPU (default 1)")
    p.add_argument("--max-memory-fraction", type=_fraction, default=0.9, metavar="F",
                   help="a configuration fits when its peak memory is at most F of the GPU's "
                        "memory (default 0.9)")
    p.add_argument("--constraint", action="append", default=[], metavar="NAME=VALUE",
                   help="e.g. max_hours=24, max_cost_usd=500, min_throughput=1000, "
                        "max_usd_per_hour=3 (repeatable)")
    p.add_argument("--top", type=positive_int, default=15, metavar="N",
                   help="rows to print (default 15)")
    p.add_argument("--all", action="store_true",
                   help="also print configurations that do not fit or miss a constraint")
    p.add_argument("--report", metavar="DIR",
                   help="write DIR/report.html (plots, self-contained) and DIR/search.json")
    add_step_arguments(p, "rank a no-grad forward pass instead of a training step")
    add_precision_arguments(p)
    add_spec_argument(p)
    add_format_arguments(p, csv_help="print every configuration as CSV")


def _prices(items: list[str]) -> dict[str, float]:
    from predictor.design_search import load_prices, parse_price

    out: dict[str, float] = {}
    for item in items:
        if "=" in item:
            gid, price = parse_price(item)
            out[gid] = price
        else:
            out.update(load_prices(item))
    return out


def _constraints(items: list[str]) -> dict[str, float]:
    from predictor.errors import InvalidArgumentError

    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        try:
            out[key.strip()] = float(value)
        except ValueError:
            sep = ""
        if not sep:
            raise InvalidArgumentError(f"constraint {item!r}: expected NAME=NUMBER, "
                                       "e.g. max_hours=24")
    return out


def run(args: argparse.Namespace) -> int:
    from predictor import hardware
    from predictor.design_search import search

    load_specs(args.spec)
    gpus = hardware.database().resolve(args.gpus)  # fail on a bad GPU before tracing
    prices = _prices(args.price)
    constraints = _constraints(args.constraint)
    if args.report and Path(args.report).exists() and not Path(args.report).is_dir():
        from predictor.errors import InvalidArgumentError

        raise InvalidArgumentError(f"--report {args.report}: exists and is not a folder")
    graph = load_graph(args)
    result = search(graph, objective=args.objective, gpus=gpus,
                    batch_sizes=args.batch_sizes, max_memory_fraction=args.max_memory_fraction,
                    constraints=constraints, prices=prices, samples=args.samples,
                    epochs=args.epochs, iterations=args.iterations,
                    gpus_per_node=args.gpus_per_node, dtype=args.dtype,
                    tf32_matmul=args.tf32 or None, price_basis=args.price_basis)
    report = None
    if args.report:
        from predictor.report import write_report

        with console(stderr=True).status("writing the report ...", spinner="dots"):
            report = write_report(result, args.report, graph)
    lines = notes(graph, gpus, args.dtype)
    if args.json:
        print(json.dumps({**result.to_dict(), "notes": lines}, indent=2))
        return 0
    if args.csv:
        df = result.to_pandas()
        df.insert(0, "model", graph.name)
        print(df.to_csv(index=False), end="")
        print_notes_stderr(lines)
        return 0
    print_table(graph, result, args.top, args.all, report, lines)
    return 0


def print_table(graph, result, top: int, show_all: bool, report, lines=()) -> None:
    from rich.table import Table

    from predictor.commands.common import fmt

    df = result.to_pandas() if show_all else result.fitting()
    shown = df.head(top)
    n = result.gpus_per_node
    basis = {"cloud": "cloud on-demand", "marketplace": "marketplace"}[result.price_basis]
    title = (f"{graph.name} · {graph.mode} · objective {result.objective}"
             + (f" ({basis} prices)" if result.objective == "cost" else "")
             + f" · {result.run.describe()}" + (f" · {n} GPUs per node (DDP)" if n > 1 else ""))
    table = Table(title=title, title_justify="left")
    cols = [("#", "rank"), ("GPU", "gpu"), ("batch/GPU", "batch_size"),
            ("iter ms", "iteration_ms"), ("samples/s", "samples_per_s"),
            ("$/hour", "usd_per_hour"), ("$/1M samples", "usd_per_1m_samples")]
    if result.run.given:
        cols += [("run hours", "run_hours"), ("run $", "run_cost_usd")]
    if n > 1:
        cols += [("comm ms", "comm_ms"), ("scaling", "scaling_efficiency")]
    cols += [("mem GiB", "memory_gb"), ("limit GiB", "memory_limit_gb")]
    if show_all:
        cols += [("fits", "fits")]
    for label, _ in cols:
        table.add_column(label, justify="left" if label == "GPU" else "right", no_wrap=True)
    for rec in shown.to_dict(orient="records"):
        cells = []
        for _, key in cols:
            v = rec.get(key)
            if key == "gpu":
                cells.append(f"{v} x{n}" if n > 1 else str(v))
            elif key == "scaling_efficiency":
                cells.append(f"{v:.1%}")
            elif key == "fits":
                ok = rec["fits"] and rec["feasible"]
                cells.append("yes" if ok else ("no (memory)" if not rec["fits"] else "no (limits)"))
            elif key in ("rank", "batch_size"):
                cells.append(f"{int(v):,}")
            elif key == "usd_per_1m_samples" or key == "run_cost_usd":
                cells.append(fmt(v) if v == v else "no price")
            else:
                cells.append(fmt(v))
        table.add_row(*cells, style=None if rec["fits"] and rec["feasible"] else "dim")
    out = console()
    if not out.is_terminal:
        out.width = max(out.width, 200)  # a pipe or a file: never squeeze the columns
    out.print(table)
    total = len(result.table)
    fitting = len(result.fitting())
    note = [f"{total:,} configurations, {fitting:,} fit in {result.max_memory_fraction:.0%} of "
            f"GPU memory and meet the constraints; showing {len(shown)}"
            + ("" if show_all else " (--all shows the rest)") + "."]
    gpus_shown = list(dict.fromkeys(shown["gpu"]))[:8]
    if gpus_shown:
        note.append("largest batch per GPU that fits: " + ", ".join(
            f"{g} {result.max_batch_sizes.get(g)}" for g in gpus_shown))
    note.append(("ranked by cost at " if result.objective == "cost" else "prices: ")
                + result.price_basis_text()
                + "; --price-basis cloud|marketplace chooses, --price GPU=USD overrides")
    if result.best() is None:
        note.append("nothing fits: try smaller batch sizes, --dtype bfloat16, or more GPUs")
    if report is not None:
        note.append(f"report: {report}")
    note.extend(lines)
    out.print("\n".join(note), style="dim")
