"""`predictor predict MODEL`: iteration time on a set of GPUs."""

from __future__ import annotations

import argparse
import json

from predictor.commands.common import (ERROR_COLUMN_NOTE, add_calibration_argument,
                                       add_format_arguments, add_precision_arguments,
                                       add_spec_argument, add_step_arguments, batch_size_arg,
                                       console, error_cell, json_records, load_graph, load_specs,
                                       notes, positive_int, precision_fields, precision_text,
                                       print_notes_stderr, step_text, targets, trace_from_args,
                                       unknown_fits)

NAME = "predict"


def add_parser(sub) -> None:
    p = sub.add_parser(
        NAME, help="predict iteration time of a model on GPUs",
        description="Trace one training step of MODEL (forward, loss, backward, optimizer) "
                    "and predict its time on each GPU.",
        epilog="MODEL is a zoo name (`predictor zoo`), a Hugging Face config "
               "(path/to/config.json: the model is built from it, no weights), "
               "path/to/file.py:factory or "
               "package.module:factory (the factory returns (model, example_inputs)), or an "
               "exported ONNX model (model.onnx: its first input dim is the batch, other "
               "symbolic dims take --seq-len), or a graph saved with `predictor sweep MODEL "
               "--save-graph G.npz` (-b then picks its batch).")
    p.add_argument("model", metavar="MODEL",
                   help="zoo name, config.json, factory spec, .onnx file or saved graph (.npz)")
    p.add_argument("-b", "--batch-size", type=batch_size_arg,
                   help="batch size (default: the model's)")
    p.add_argument("--gpus", "--gpu", default=None,
                   help="comma-separated GPU ids or aliases, NAME@WATTSW for a board under a "
                        "power limit (H100-SXM5-80GB@500W), or 'all' (default: a common set)")
    add_step_arguments(p, "predict a no-grad forward pass only")
    add_precision_arguments(p)
    add_spec_argument(p)
    add_calibration_argument(p)
    p.add_argument("--breakdown", type=positive_int, nargs="?", const=10, metavar="N",
                   help="also show the N slowest ops on the fastest GPU (default 10)")
    p.add_argument("--breakdown-gpu", metavar="GPU",
                   help="show the breakdown on this GPU (one of --gpus) instead of the fastest; "
                        "implies --breakdown")
    lay = p.add_argument_group(
        "parallel layout (predictor.Parallel; -b is then the micro-batch per GPU)")
    lay.add_argument("--dp", type=positive_int, help="data-parallel degree")
    lay.add_argument("--tp", type=positive_int, help="tensor-parallel degree (Megatron)")
    lay.add_argument("--pp", type=positive_int, help="pipeline stages (1F1B)")
    lay.add_argument("--microbatches", type=positive_int,
                     help="micro-batches per optimizer step")
    lay.add_argument("--interleave", type=positive_int, help="virtual stages per GPU")
    lay.add_argument("--sequence-parallel", action="store_true", default=None,
                     help="Megatron sequence parallelism (needs --tp > 1)")
    lay.add_argument("--zero", type=int, choices=(0, 1, 2, 3),
                     help="ZeRO stage (3: FSDP full sharding)")
    lay.add_argument("--fsdp", action="store_true", default=None, help="the same as --zero 3")
    lay.add_argument("--checkpoint", choices=("full", "selective"),
                     help="activation recomputation")
    lay.add_argument("--gpus-per-node", type=positive_int, help="GPUs per node (default 8)")
    lay.add_argument("--inter-node-gbs", type=float,
                     help="network between nodes, GB/s per GPU per direction "
                          "(default: the system's, specs/network.toml)")
    add_format_arguments(p)


_LAYOUT_ARGS = ("dp", "tp", "pp", "microbatches", "interleave", "sequence_parallel", "zero",
                "fsdp", "gpus_per_node", "inter_node_gbs")


def layout_from_args(args):
    """(Parallel or None, checkpoint) from the layout options."""
    given = {k: getattr(args, k, None) for k in _LAYOUT_ARGS}
    given = {k: v for k, v in given.items() if v is not None}
    ck = getattr(args, "checkpoint", None)
    if not given and ck is None:
        return None, None
    from predictor.layouts import Parallel

    return Parallel(**given), ck


def run(args: argparse.Namespace) -> int:
    from predictor import engine

    load_specs(args.spec)
    gpus, cal = targets(args)  # fail on a bad GPU or calibration before tracing
    par, ck = layout_from_args(args)
    if par is not None and cal is not None:
        from predictor.errors import InvalidArgumentError

        raise InvalidArgumentError("parallel layouts are predicted in pure mode only "
                                   "(drop --calibration)")
    chosen = breakdown_device(args.breakdown_gpu, gpus)
    if chosen is not None and not args.breakdown:
        args.breakdown = 10
    if args.model.lower().endswith(".npz"):   # a saved graph, at -b or its own batch
        batch = args.batch_size
        graph = load_graph(args)
        graph.batch_size = graph.check_batch(batch)
    else:
        graph = trace_from_args(args)
    if par is not None:
        return run_layout(args, graph, gpus, par, ck)
    if cal is not None:
        cal.check_graph(graph)
    res = engine.sweep(graph, gpus, [graph.batch_size], dtype=args.dtype,
                       tf32_matmul=args.tf32 or None, calibration=cal)
    df = unknown_fits(res.to_pandas().sort_values("iteration_ms", ignore_index=True), graph)
    lines = (notes(graph, gpus, args.dtype, getattr(args, "left_out_gpus", ()),
                  getattr(args, "tf32", False))
             + memory_notes(res))
    if cal is not None:
        from predictor.calibrated import extrapolation_note, transfer_note

        lines += [n for n in (extrapolation_note(cal, [graph.batch_size]),
                              transfer_note(cal, graph.ops, gpus)) if n]
    breakdown = None
    if args.breakdown:
        if chosen is None:
            chosen = next(g for g in gpus if g.id == df["gpu"][0])  # the fastest
        breakdown = engine.predict(graph, chosen, dtype=args.dtype,
                                   tf32_matmul=args.tf32 or None, calibration=cal)
        if args.csv:
            lines.append("--breakdown: the per-op rows are in the table and in --json "
                         "(\"breakdown\"), not in --csv")
    if args.json:
        out = {
            "model": graph.name, "batch_size": graph.batch_size, "seq_len": graph.seq_len,
            "mode": graph.mode, "optimizer": graph.optimizer,
            **precision_fields(getattr(graph, "amp", None), args.dtype, args.tf32),
            "parameters": graph.parameters, "flops_per_iteration": graph.flops(),
            "unsupported_ops": graph.unsupported, "notes": lines,
            "predictions": json_records(df.drop(columns="batch_size")),
        }
        if breakdown is not None:
            ops = breakdown.ops.head(args.breakdown).drop(columns=["dims"])
            out["breakdown"] = {"gpu": breakdown.gpu, "ops": json_records(ops)}
        print(json.dumps(out, indent=2))
        return 0
    precision = precision_text(graph, args.dtype, args.tf32)
    if args.csv:
        df.insert(0, "model", graph.name)
        df["mode"] = graph.mode
        df["optimizer"] = graph.optimizer or ""
        df["precision"] = precision
        print(df.to_csv(index=False), end="")
        print_notes_stderr(lines)
        return 0
    print_table(graph, df, lines, res.max_memory_fraction, precision)
    if breakdown is not None:
        print_breakdown(breakdown, args.breakdown)
    return 0


def breakdown_device(name, gpus):
    """The device --breakdown-gpu names among those predicted (None when not given)."""
    if name is None:
        return None
    from predictor import hardware
    from predictor.errors import InvalidArgumentError

    by_id = {g.id.lower(): g for g in gpus}
    gid = name.strip().lower()
    if gid not in by_id:
        try:
            gid = hardware.get(name).id.lower()
        except Exception:  # noqa: BLE001 - an unknown name is reported below
            pass
    if gid not in by_id:
        from predictor.io import printable

        raise InvalidArgumentError(f"--breakdown-gpu {printable(repr(name))} is not one of the "
                                   f"devices predicted ({', '.join(g.id for g in gpus)}); "
                                   "add it to --gpus")
    return by_id[gid]


def memory_notes(res) -> list[str]:
    """A warning when the model fits on none of the GPUs predicted."""
    if res.memory_bytes is None or res.fits.any():
        return []
    return [f"does not fit on any of these GPUs: peak {res.memory_gb.min():,.1f} GiB or more, "
            f"above {res.max_memory_fraction:.0%} of each GPU's memory (the times assume it ran; "
            "try a smaller batch)"]


def print_table(graph, df, lines=(), fraction: float = 0.9,
                precision: str = "dtype as traced") -> None:
    from rich.table import Table

    from predictor.text import flops_text

    flops = sum(graph.flops().values())
    title = (f"{graph.name} · {step_text(graph)} · batch {graph.batch_size}"
             + (f" · seq {graph.seq_len}" if graph.seq_len else "")
             + f" · {graph.parameters / 1e6:,.1f} M params · {flops_text(flops)} · {precision}")
    table = Table(title=title, title_justify="left")
    table.add_column("GPU", no_wrap=True)
    tokens = "tokens_per_s" in df  # the input has a sequence dim (graph.seq_len)
    memory = bool(df["memory_gb"].notna().any())  # peak memory modelled
    # An inference step has no backward pass or optimizer step: no columns of 0.00.
    train = graph.mode == "train"
    phases = ("iter ms", "fwd ms", "bwd ms", "opt ms") if train else ("iter ms", "fwd ms")
    errors = "error_p90_pct" in df and bool(df["error_p90_pct"].notna().any())
    for label in phases + (("±err",) if errors else ()) + ("host ms", "samples/s") \
            + (("tokens/s",) if tokens else ()) + (("peak GiB", "fits") if memory else ()):
        table.add_column(label, justify="right", no_wrap=True)
    for row in df.itertuples():
        # host ms: CPU dispatch/launch time the GPU waits for (included in the phases).
        host = getattr(row, "overhead_ms", 0.0)
        fits = bool(row.fits)
        table.add_row(row.gpu, f"{row.iteration_ms:,.2f}", f"{row.forward_ms:,.2f}",
                      *((f"{row.backward_ms:,.2f}", f"{row.optimizer_ms:,.2f}") if train else ()),
                      *((error_cell(row.error_p90_pct),) if errors else ()),
                      f"{host:,.2f}", f"{row.throughput:,.1f}",
                      *((f"{row.tokens_per_s:,.0f}",) if tokens else ()),
                      *((f"{row.memory_gb:,.1f}", "yes" if fits else "NO") if memory else ()),
                      style=None if fits or not memory else "red")
    out = console()
    out.print(table)
    n_ops = int(graph.ops.count.sum())
    note = f"{n_ops:,} ops ({len(graph.ops):,} distinct) traced in {graph.trace_seconds:.1f} s."
    if graph.unsupported:
        names = ", ".join(f"{k}×{v}" for k, v in sorted(graph.unsupported.items()))
        note += (f"\n{sum(graph.unsupported.values())} op(s) without a family model, "
                 f"estimated from bytes moved: {names}")
    if memory and not df["fits"].all() and df["fits"].any():
        note += (f"\nfits NO: the predicted peak is above {fraction:.0%} of the GPU's "
                 "memory (an out-of-memory error)")
    if errors:
        note += f"\n{ERROR_COLUMN_NOTE}"
    for line in lines:
        note += f"\n{line}"
    out.print(note, style="dim")


def print_breakdown(pred, n: int) -> None:
    from rich.table import Table

    df = pred.ops.head(n)
    table = Table(title=f"slowest ops on {pred.gpu} (per iteration: ms total = count × ms each)",
                  title_justify="left")
    # The predicted sgemm tile of fp32 matmuls (predictor.kernels.tiles), when any is shown.
    tiles = "tile" in df and bool(df["tile"].astype(bool).any())
    for col in ("family", "phase", "shape") + (("tile",) if tiles else ()) + (
            "count", "ms each", "ms total", "share", "basis"):
        table.add_column(col, justify="right" if col in ("count", "ms each", "ms total", "share")
                         else "left", no_wrap=col != "shape")
    for row in df.itertuples():
        table.add_row(row.family, row.phase, row.shape, *((row.tile,) if tiles else ()),
                      str(row.count), f"{row.ms_each:,.4f}", f"{row.ms:,.3f}",
                      f"{row.share:.1%}", row.basis)
    console().print(table)


def run_layout(args, graph, gpus, par, ck) -> int:
    """One row per GPU type: the layout's time split and memory per GPU."""
    from predictor import layouts

    preds = [layouts.predict_parallel(graph, g, graph.batch_size, par, ck, dtype=args.dtype,
                                      tf32=(args.tf32 or None, None)) for g in gpus]
    lines = notes(graph, gpus, args.dtype, getattr(args, "left_out_gpus", ()),
                  getattr(args, "tf32", False))
    preds.sort(key=lambda p: p.iteration_ms)
    lp = graph.layout
    sharded = (f"tensor-parallel: {len(lp.column_parallel)} column- and {len(lp.row_parallel)} "
               f"row-parallel linears, vocab-parallel: {', '.join(lp.vocab_parallel) or 'none'}; "
               f"not sharded: {len(lp.unsharded_linears)} linears"
               + (f", ops run whole: {lp.kept_whole}" if lp.kept_whole else ""))
    if args.json:
        print(json.dumps({"model": graph.name, "layout": par.describe(), "checkpoint": ck,
                          **precision_fields(getattr(graph, "amp", None), args.dtype, args.tf32),
                          "sharded": preds[0].sharded if preds else {}, "notes": lines,
                          "predictions": [p.to_dict() for p in preds]}, indent=2))
        return 0
    if args.csv:
        import pandas as pd

        print(pd.DataFrame([p.to_dict() for p in preds]).drop(
            columns=["stage_memory_gb", "memory_parts_gb"]).to_csv(index=False), end="")
        print_notes_stderr(lines)
        return 0
    from rich.table import Table

    title = (f"{graph.name} · {par.gpus} GPUs · {par.describe()} · micro-batch "
             f"{graph.batch_size} · global batch {graph.batch_size * par.microbatches * par.dp}"
             f" · checkpoint {ck or 'none'} · {precision_text(graph, args.dtype, args.tf32)}")
    table = Table(title=title, title_justify="left")
    tokens = graph.seq_len is not None
    for label in ("GPU", "iter ms", "compute ms", "comm ms", "bubble ms", "opt ms",
                  "samples/s") + (("tokens/s/GPU",) if tokens else ()) + ("GiB/GPU", "fits"):
        table.add_column(label, justify="left" if label == "GPU" else "right", no_wrap=True)
    for p in preds:
        table.add_row(p.gpu, f"{p.iteration_ms:,.1f}", f"{p.compute_ms:,.1f}",
                      f"{p.comm_ms:,.1f}", f"{p.bubble_ms:,.1f}", f"{p.optimizer_ms:,.1f}",
                      f"{p.throughput:,.1f}",
                      *((f"{p.tokens_per_s / par.gpus:,.0f}",) if tokens else ()),
                      f"{p.memory_gb:,.1f}", "yes" if p.fits else "no")
    out = console()
    out.print(table)
    out.print(sharded)
    for line in lines:
        out.print(line, markup=False, style="dim")
    return 0
