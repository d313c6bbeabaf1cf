"""`predictor search MODEL`: which GPU and batch size, ranked by time, cost or
throughput, among the configurations that fit in memory; optionally an HTML
report with plots."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from predictor.commands.common import (ERROR_COLUMN_NOTE, add_format_arguments,
                                       add_precision_arguments, add_spec_argument,
                                       add_step_arguments, console, error_cell, gpus_for,
                                       load_graph, load_specs, notes, parse_batch_sizes,
                                       positive_int, precision_fields,
                                       precision_text, print_notes_stderr, resolve_gpus, step_text,
                                       unknown_fits)

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
               "MODEL is a zoo name, a Hugging Face config.json, a factory spec, an .onnx "
               "file or a saved graph (.npz).")
    p.add_argument("model", metavar="MODEL",
                   help="zoo name, config.json, factory spec, .onnx file or saved graph (.npz)")
    p.add_argument("--objective", default="time", choices=["time", "cost", "throughput"],
                   help="time: least hours; cost: least USD; throughput: most samples/s "
                        "(default: time)")
    p.add_argument("--gpus", "--gpu", default="all",
                   help="comma-separated GPU ids or aliases, NAME@WATTSW for a board under a "
                        "power limit (H100-SXM5-80GB@500W), or 'all' (default: all)")
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
    p.add_argument("--gpus-per-node", type=positive_int, default=None, metavar="N",
                   help="train data-parallel (DDP) on N GPUs of each type; batch sizes are "
                        "per GPU (default 1); with --n-gpus: GPUs per node (default 8)")
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
    lay = p.add_argument_group(
        "parallel layouts (large models): with --n-gpus and --global-batch, rank every "
        "dp x tp x pp layout of N GPUs, with its micro-batch, ZeRO stage and recomputation")
    lay.add_argument("--n-gpus", type=positive_int, metavar="N",
                     help="GPUs in the job (of each type in --gpus; default type: H100-SXM5-80GB)")
    lay.add_argument("--global-batch", type=positive_int, metavar="B",
                     help="samples per optimizer step over all GPUs")
    lay.add_argument("--zero", default="0,1,2,3", metavar="LIST",
                     help="ZeRO stages to try (default 0,1,2,3; 3 is FSDP)")
    lay.add_argument("--checkpoint", default="none,selective,full", metavar="LIST",
                     help="recomputation to try (default none,selective,full)")
    lay.add_argument("--max-micro-batch", type=positive_int, default=64, metavar="N",
                     help="largest micro-batch per GPU to try (default 64)")
    lay.add_argument("--sequence-parallel", action="store_true",
                     help="Megatron sequence parallelism in every layout with tp > 1")
    lay.add_argument("--inter-node-gbs", type=_positive_float, metavar="GBS",
                     help="network between nodes, GB/s per GPU per direction "
                          "(default: the system's, specs/network.toml)")
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
    from predictor.design_search import search

    if args.n_gpus is not None or args.global_batch is not None:
        return run_layouts(args)
    if args.gpus_per_node is None:
        args.gpus_per_node = 1
    load_specs(args.spec)
    gpus = resolve_gpus(args)  # fail on a bad GPU before tracing
    prices = _prices(args.price)
    constraints = _constraints(args.constraint)
    if args.report and Path(args.report).exists() and not Path(args.report).is_dir():
        from predictor.errors import InvalidArgumentError

        raise InvalidArgumentError(f"--report {args.report}: exists and is not a folder")
    graph = load_graph(args)
    gpus = gpus_for(graph, gpus, args)
    result = search(graph, objective=args.objective, gpus=gpus,
                    batch_sizes=args.batch_sizes, max_memory_fraction=args.max_memory_fraction,
                    constraints=constraints, prices=prices, samples=args.samples,
                    epochs=args.epochs, iterations=args.iterations,
                    gpus_per_node=args.gpus_per_node, dtype=args.dtype,
                    tf32_matmul=args.tf32 or None, price_basis=args.price_basis)
    precision = precision_text(graph, args.dtype, args.tf32)
    report = None
    if args.report:
        from predictor.report import write_report

        with console(stderr=True).status("writing the report ...", spinner="dots"):
            report = write_report(result, args.report, graph, precision=precision)
    lines = notes(graph, gpus, args.dtype, getattr(args, "left_out_gpus", ()),
                  getattr(args, "tf32", False))
    if args.json:
        doc = result.to_dict()
        for key in ("configurations", "pareto"):
            doc[key] = unknown_fits(doc[key], graph)
        print(json.dumps({**doc,
                          **precision_fields(getattr(graph, "amp", None), args.dtype, args.tf32),
                          "notes": lines}, indent=2))
        return 0
    if args.csv:
        df = unknown_fits(result.to_pandas(), graph)
        df.insert(0, "model", graph.name)
        print(df.to_csv(index=False), end="")
        print_notes_stderr(lines)
        return 0
    print_table(graph, result, args.top, args.all, report, lines, precision)
    return 0


def print_table(graph, result, top: int, show_all: bool, report, lines=(),
                precision: str = "dtype as traced") -> None:
    from rich.table import Table

    from predictor.commands.common import fmt, plural

    df = result.to_pandas() if show_all else result.fitting()
    shown = df.head(top)
    n = result.gpus_per_node
    basis = {"cloud": "cloud on-demand", "marketplace": "marketplace"}[result.price_basis]
    title = (f"{graph.name} · {step_text(graph)} · {precision} · objective {result.objective}"
             + (f" ({basis} prices)" if result.objective == "cost" else "")
             + f" · {result.run.describe()}" + (f" · {n} GPUs per node (DDP)" if n > 1 else ""))
    table = Table(title=title, title_justify="left")
    errors = "error_p90_pct" in df and bool(df["error_p90_pct"].notna().any())
    cols = [("#", "rank"), ("GPU", "gpu"), ("batch/GPU", "batch_size"),
            ("iter ms", "iteration_ms")] + ([("±err", "error_p90_pct")] if errors else []) + [
            ("samples/s", "samples_per_s"),
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
            elif key == "error_p90_pct":
                cells.append(error_cell(v))
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
    from predictor.memory import has_profile

    memory = has_profile(graph)
    note = [f"{plural(total, 'configuration')}, {fitting:,} "
            + (f"fit in {result.max_memory_fraction:.0%} of GPU memory and " if memory else "")
            + f"meet the constraints; showing {len(shown)}"
            + ("" if show_all else " (--all shows the rest)") + "."]
    gpus_shown = list(dict.fromkeys(shown["gpu"]))[:8]
    if gpus_shown and memory:
        note.append("largest batch per GPU that fits: " + ", ".join(
            f"{g} {result.max_batch_sizes.get(g)}" for g in gpus_shown))
    note.append(("ranked by cost at " if result.objective == "cost" else "prices: ")
                + result.price_basis_text()
                + "; --price-basis cloud|marketplace chooses, --price GPU=USD overrides")
    if result.best() is None:
        note.append("nothing fits: try smaller batch sizes, --dtype bfloat16, or more GPUs")
    if report is not None:
        note.append(f"report: {report}")
    if errors:
        note.append(ERROR_COLUMN_NOTE + (" (one GPU's compute; communication is not in it)"
                                         if n > 1 else ""))
    note.extend(lines)
    out.print("\n".join(note), style="dim")


# ------------------------------------------------------------------ layouts --

LAYOUT_DEFAULT_GPU = "H100-SXM5-80GB"


def _choices(text: str, flag: str, parse) -> tuple:
    from predictor.errors import InvalidArgumentError

    out = []
    for item in (t.strip().lower() for t in str(text).split(",")):
        if not item:
            continue
        try:
            v = parse(item)
        except (ValueError, KeyError):
            from predictor.io import printable

            raise InvalidArgumentError(f"{flag}: {printable(repr(item), 40)} is not one of "
                                       "the choices") from None
        if v not in out:
            out.append(v)
    if not out:
        raise InvalidArgumentError(f"{flag}: no choice given")
    return tuple(out)


def _zero(item: str) -> int:
    if item not in ("0", "1", "2", "3"):
        raise ValueError(item)
    return int(item)


def _checkpoint(item: str):
    return {"none": None, "selective": "selective", "full": "full"}[item]


def layout_rows(args, graph, gpus) -> list[dict]:
    """Every layout of --n-gpus GPUs of each type, ranked (fitting first)."""
    from predictor import layouts
    from predictor.design_search import parse_price  # noqa: F401  (prices below)

    zeros = _choices(args.zero, "--zero", _zero)
    cks = _choices(args.checkpoint, "--checkpoint", _checkpoint)
    prices = _prices(args.price)
    rows = []
    for g in gpus:
        price = prices.get(g.id)
        if price is None:
            price = g.price(args.price_basis).usd_per_hour
        for r in layouts.search_layouts(
                graph, g, args.n_gpus, args.global_batch, dtype=args.dtype,
                gpus_per_node=args.gpus_per_node or 8, checkpoints=cks, zeros=zeros,
                max_micro_batch=args.max_micro_batch, inter_node_gbs=args.inter_node_gbs,
                max_memory_fraction=args.max_memory_fraction,
                sequence_parallel=args.sequence_parallel, tf32=(args.tf32 or None, None)):
            r["usd_per_hour"] = None if price is None else float(price) * args.n_gpus
            r["usd_per_step"] = None if price is None else \
                float(price) * args.n_gpus * r["iteration_ms"] / 3.6e6
            rows.append(r)
    if args.objective == "cost":
        key = lambda r: (not r["fits"], r["usd_per_step"] is None,  # noqa: E731
                         r["usd_per_step"] or 0.0, r["iteration_ms"])
    else:   # time and throughput rank alike: the global batch is fixed
        key = lambda r: (not r["fits"], r["iteration_ms"])  # noqa: E731
    rows.sort(key=key)
    for i, r in enumerate(rows, 1):
        r["rank"] = i
    return rows


def run_layouts(args: argparse.Namespace) -> int:
    from predictor.errors import InvalidArgumentError

    if args.n_gpus is None or args.global_batch is None:
        raise InvalidArgumentError("a layout search needs both --n-gpus and --global-batch")
    given = [flag for flag, on in (("--batch-sizes", args.batch_sizes is not None),
                                   ("--samples", args.samples is not None),
                                   ("--epochs", args.epochs is not None),
                                   ("--iterations", args.iterations is not None),
                                   ("--constraint", bool(args.constraint)),
                                   ("--inference", args.inference)) if on]
    if given:
        raise InvalidArgumentError(f"{', '.join(given)} cannot be used with --n-gpus "
                                   "(micro-batches are searched: --max-micro-batch)")
    load_specs(args.spec)
    if args.gpus == "all":
        args.gpus = LAYOUT_DEFAULT_GPU
    gpus = resolve_gpus(args)
    if args.report and Path(args.report).exists() and not Path(args.report).is_dir():
        raise InvalidArgumentError(f"--report {args.report}: exists and is not a folder")
    # argument errors before the trace
    _choices(args.zero, "--zero", _zero)
    _choices(args.checkpoint, "--checkpoint", _checkpoint)
    _prices(args.price)
    graph = load_graph(args)
    gpus = gpus_for(graph, gpus, args)
    with console(stderr=True).status("pricing layouts ...", spinner="dots"):
        rows = layout_rows(args, graph, gpus)
    lines = notes(graph, gpus, args.dtype, getattr(args, "left_out_gpus", ()),
                  getattr(args, "tf32", False))
    meta = {"model": graph.name, "n_gpus": args.n_gpus, "global_batch": args.global_batch,
            "objective": args.objective, "gpus_per_node": args.gpus_per_node or 8,
            "max_memory_fraction": args.max_memory_fraction, "amp": getattr(graph, "amp", None),
            "dtype": args.dtype, "seq_len": graph.seq_len}
    report = None
    if args.report:
        from predictor.report import write_layout_report

        with console(stderr=True).status("writing the report ...", spinner="dots"):
            report = write_layout_report(rows, meta, args.report, graph)
    if args.json:
        print(json.dumps({**meta, "notes": lines, "layouts": rows}, indent=2, default=str))
        return 0
    if args.csv:
        import pandas as pd

        df = pd.DataFrame(rows)
        if len(df):
            df = df.drop(columns=["stage_memory_gb", "memory_parts_gb"])
        print(df.to_csv(index=False), end="")
        print_notes_stderr(lines)
        return 0
    print_layout_table(graph, rows, meta, args.top, args.all, report, lines)
    return 0


LAYOUT_COLUMNS = [("#", "rank"), ("GPU", "gpu"), ("dp", "dp"), ("tp", "tp"), ("pp", "pp"),
                  ("micro", "micro_batch"), ("mbs", "microbatches"), ("zero", "zero"),
                  ("ckpt", "checkpoint"), ("iter ms", "iteration_ms"),
                  ("compute", "compute_ms"), ("comm", "comm_ms"), ("bubble", "bubble_ms"),
                  ("opt", "optimizer_ms")]


def print_layout_table(graph, rows, meta, top: int, show_all: bool, report, lines=()) -> None:
    from rich.table import Table

    from predictor.commands.common import fmt

    shown = [r for r in rows if show_all or r["fits"]][:top]
    tokens = graph.seq_len is not None
    title = (f"{graph.name} · {step_text(graph)} · {meta['n_gpus']} GPUs · global batch "
             f"{meta['global_batch']}" + (f" · seq {graph.seq_len}" if tokens else "")
             + (f" · amp {meta['amp']}" if meta["amp"] else "")
             + f" · objective {meta['objective']}")
    table = Table(title=title, title_justify="left")
    cols = list(LAYOUT_COLUMNS) + [("tokens/s" if tokens else "samples/s",
                                    "tokens_per_s" if tokens else "samples_per_s")]
    if meta["objective"] == "cost":
        cols.append(("$/step", "usd_per_step"))
    cols += [("GiB/GPU", "memory_gb"), ("fits", "fits")]
    for label, _ in cols:
        table.add_column(label, justify="left" if label in ("GPU", "ckpt") else "right",
                         no_wrap=True)
    for r in shown:
        cells = []
        for _, key in cols:
            v = r.get(key)
            if key == "checkpoint":
                cells.append(v or "none")
            elif key == "fits":
                cells.append("yes" if v else "no")
            elif key in ("rank", "dp", "tp", "pp", "micro_batch", "microbatches", "zero"):
                cells.append(f"{int(v):,}")
            elif v is None:
                cells.append("no price")
            else:
                cells.append(fmt(v))
        table.add_row(*cells, style=None if r["fits"] else "dim")
    out = console()
    if not out.is_terminal:
        out.width = max(out.width, 200)
    out.print(table)
    fitting = sum(1 for r in rows if r["fits"])
    note = [f"{len(rows):,} layouts, {fitting:,} fit in {meta['max_memory_fraction']:.0%} of GPU "
            f"memory; showing {len(shown)}" + ("" if show_all else " (--all shows the rest)")
            + ". micro: micro-batch per GPU; mbs: micro-batches per step (per pipeline); "
              "comm: exposed TP + PP + DP communication; bubble: 1F1B pipeline bubble."]
    if not rows:
        note.append(f"no layout: no dp x tp x pp of {meta['n_gpus']:,} GPUs (tp within a node, "
                    f"pp at most the model's {graph.layout.n_blocks} blocks) splits a global "
                    f"batch of {meta['global_batch']:,} into whole micro-batches")
    elif not fitting:
        note.append("no layout fits: try more GPUs, --checkpoint full, or a smaller "
                    "--max-micro-batch")
    if report is not None:
        note.append(f"report: {report}")
    note.extend(lines)
    out.print("\n".join(note), style="dim")
