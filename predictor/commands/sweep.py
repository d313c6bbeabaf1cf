"""`predictor sweep MODEL`: every (GPU, batch size) at once; the best batch per
GPU, and optionally a plot and the full grid as CSV."""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

from predictor.commands.common import (ERROR_COLUMN_NOTE, add_calibration_argument,
                                       add_precision_arguments, add_spec_argument,
                                       add_step_arguments, console, error_cell, gpus_for,
                                       json_records, load_graph, load_specs, notes, optimizer_text,
                                       parse_batch_sizes, precision_fields, precision_text,
                                       print_notes_stderr, targets, unknown_fits)

NAME = "sweep"

DEFAULT_BATCHES = "1..1024"
def add_parser(sub) -> None:
    p = sub.add_parser(
        NAME, help="sweep batch sizes x GPUs; best batch per GPU, plot, CSV",
        description="Trace one training step of MODEL once, then predict it for every "
                    "(GPU, batch size) combination and show the best batch size per GPU "
                    "by throughput.",
        epilog="MODEL is a zoo name (`predictor zoo`), a Hugging Face config.json, "
               "path/to/file.py:factory, an .onnx file, "
               "package.module:factory, or a graph saved with --save-graph (.npz; "
               "no tracing, torch not needed). Example: predictor sweep resnet50 "
               "--gpus all --batch-sizes 1..1024 --plot sweep.png")
    p.add_argument("model", metavar="MODEL",
                   help="zoo name, config.json, factory spec, .onnx file or saved graph (.npz)")
    p.add_argument("-b", "--batch-sizes", type=parse_batch_sizes, default=DEFAULT_BATCHES,
                   metavar="LIST",
                   help="comma-separated sizes and doubling ranges A..B "
                        f"(default {DEFAULT_BATCHES}: 1,2,4,...,1024)")
    p.add_argument("--gpus", "--gpu", default=None,
                   help="comma-separated GPU ids or aliases, NAME@WATTSW for a board under a "
                        "power limit (H100-SXM5-80GB@500W), or 'all' (default: a common set)")
    add_step_arguments(p, "predict a no-grad forward pass only")
    add_precision_arguments(p)
    add_spec_argument(p)
    add_calibration_argument(p)
    p.add_argument("--plot", metavar="FILE", help="write a plot (.png, .svg or .pdf)")
    p.add_argument("--csv", metavar="FILE",
                   help="write every (GPU, batch size) as CSV; '-' prints it on standard "
                        "output instead of the table (notes on stderr)")
    p.add_argument("--save-graph", metavar="FILE",
                   help="save the traced graph (.npz) to sweep it again without tracing")
    p.add_argument("--json", action="store_true",
                   help="print a JSON object (best batch per GPU and the whole grid)")


def run(args: argparse.Namespace) -> int:
    from predictor import engine

    if args.csv == "-" and args.json:
        raise _bad_argument("--csv - and --json both print on standard output: choose one "
                            "(or write the CSV to a file)")
    if args.save_graph and not args.save_graph.lower().endswith(".npz"):
        # MODEL is read back as a saved graph by this suffix; a file without
        # it (or '-', which is no file) could not be given to predict or sweep.
        raise _bad_argument(f"--save-graph {args.save_graph}: name the file *.npz, the "
                            "suffix by which predict and sweep read a saved graph back")
    if args.plot and Path(args.plot).suffix.lower() not in (".png", ".svg", ".pdf"):
        raise _bad_argument(f"cannot plot to {args.plot}: use a .png, .svg or .pdf file name")
    load_specs(args.spec)
    gpus, cal = targets(args)  # fail on a bad GPU or calibration before tracing
    graph = load_graph(args)
    gpus = gpus_for(graph, gpus, args)
    if cal is not None:
        cal.check_graph(graph)
    if args.save_graph:
        graph.save(args.save_graph)
    start = time.perf_counter()
    res = engine.sweep(graph, gpus, args.batch_sizes, dtype=args.dtype,
                       tf32_matmul=args.tf32 or None, calibration=cal)
    seconds = time.perf_counter() - start
    df = res.to_pandas()
    best = res.best("throughput")
    _add_cost(best, res)
    lines = notes(graph, gpus, args.dtype, getattr(args, "left_out_gpus", ()),
                  getattr(args, "tf32", False))
    if cal is not None:
        from predictor.calibrated import extrapolation_note, transfer_note

        lines += [n for n in (extrapolation_note(cal, res.batch_sizes),
                              transfer_note(cal, graph.ops, res.gpus)) if n]
    df, best_out = unknown_fits(df, graph), unknown_fits(best, graph)
    if args.csv:
        from predictor.io import atomic_writer

        full = df.copy()
        full.insert(0, "model", graph.name)
        full["mode"] = graph.mode
        full["optimizer"] = graph.optimizer or ""
        full["precision"] = precision_text(graph, args.dtype, args.tf32)
        if args.csv == "-":
            print(full.to_csv(index=False), end="")
        else:
            with atomic_writer(args.csv, "w", encoding="utf-8") as fh:
                full.to_csv(fh, index=False)
    if args.plot:
        from predictor.plots import plot_sweep

        plot_sweep(res, args.plot, title=_title(graph, args))
    if args.csv == "-":   # the CSV was the output: the notes go beside it
        wrote = _wrote(args)
        print_notes_stderr(lines + ([wrote] if wrote else []))
        return 0
    if args.json:
        print(json.dumps({
            "model": graph.name, "mode": graph.mode, "optimizer": graph.optimizer,
            "seq_len": graph.seq_len,
            **precision_fields(getattr(graph, "amp", None), args.dtype, args.tf32),
            "batch_sizes": [int(b) for b in res.batch_sizes], "gpus": res.gpus,
            "best": json_records(best_out), "grid": json_records(df), "notes": lines,
        }, indent=2))
        return 0
    print_best(graph, args, res, best, seconds, lines)
    return 0


def _bad_argument(message: str):
    from predictor.errors import InvalidArgumentError

    return InvalidArgumentError(message)


def _add_cost(best, res) -> None:
    """$ per million samples at the best batch (GPUs with a listed price)."""
    price = dict(zip(res.gpus, res.prices))
    best["usd_per_m_samples"] = [
        (price[g] / 3600 / t * 1e6) if price.get(g) else math.nan
        for g, t in zip(best["gpu"], best["throughput"])]


def _wrote(args) -> str:
    """'wrote plot: ..., CSV: ..., graph: ...' for the files the sweep
    wrote ('' for none; a CSV on standard output is not a file)."""
    files = [f"plot: {args.plot}" if args.plot else "",
             f"CSV: {args.csv}" if args.csv and args.csv != "-" else "",
             f"graph: {args.save_graph}" if args.save_graph else ""]
    return "wrote " + ", ".join(f for f in files if f) if any(files) else ""


def _title(graph, args) -> str:
    parts = [graph.name, "training step" if graph.mode == "train" else graph.mode]
    opt = optimizer_text(graph)
    if opt:
        parts[-1] += f" ({opt})"
    if graph.seq_len:
        parts.append(f"seq {graph.seq_len}")
    parts.append(precision_text(graph, args.dtype, args.tf32))
    return " · ".join(parts)


def print_best(graph, args, res, best, seconds: float, lines=()) -> None:
    from rich.table import Table

    from predictor.commands.common import fmt, plural

    memory = res.memory_bytes is not None
    largest = int(res.batch_sizes[-1])
    table = Table(title="best batch size per GPU by throughput"
                  + (" (among those that fit in memory)" if memory else ""), title_justify="left")
    table.add_column("GPU", no_wrap=True)
    tokens = "tokens_per_s" in best  # the input has a sequence dim (graph.seq_len)
    errors = "error_p90_pct" in best and bool(best["error_p90_pct"].notna().any())
    for label in ("batch", "ms/iter") + (("±err",) if errors else ()) + ("samples/s",) \
            + (("tokens/s",) if tokens else ()) + (("GiB",) if memory else ()) + ("$/M samples",):
        table.add_column(label, justify="right", no_wrap=True)
    best = best.sort_values("throughput", ascending=False, ignore_index=True)
    for row in best.itertuples():
        mark = "*" if int(row.batch_size) == largest and len(res.batch_sizes) > 1 else ""
        cells = [row.gpu, f"{int(row.batch_size)}{mark}", f"{row.iteration_ms:,.2f}",
                 *((error_cell(row.error_p90_pct),) if errors else ()), f"{row.throughput:,.1f}"]
        if tokens:
            cells.append(f"{row.tokens_per_s:,.0f}")
        if memory:
            cells.append(f"{row.memory_gb:,.1f}")
        table.add_row(*cells, fmt(row.usd_per_m_samples))
    out = console()
    out.print(_title(graph, args), style="bold")
    out.print(table)
    n = res.phase_ms.shape[0] * res.phase_ms.shape[1]
    note = (f"{plural(len(res.gpus), 'GPU')} × {plural(len(res.batch_sizes), 'batch size')} = "
            f"{plural(n, 'configuration')} "
            f"predicted in {seconds * 1e3:,.1f} ms (the first sweep of a process includes loading "
            "the compiled kernels); --csv/--json give the forward/backward/optimizer split")
    if (best["batch_size"] == largest).any() and len(res.batch_sizes) > 1:
        note += (f"\n* the largest batch swept ({largest}): throughput is still rising there"
                 + ("" if memory else "; check that it fits in the GPU's memory"))
    none_fit = [g for g in res.gpus if g not in set(best["gpu"])]
    if none_fit:
        note += (f"\nno batch size swept fits in memory on: {', '.join(none_fit)} "
                 f"(limit {res.max_memory_fraction:.0%} of the GPU's memory)")
    if errors:
        note += f"\n{ERROR_COLUMN_NOTE}"
    wrote = _wrote(args)
    if wrote:
        note += f"\n{wrote}"
    for line in lines:
        note += f"\n{line}"
    out.print(note, style="dim")
