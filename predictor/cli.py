"""`predictor` command line.

Every error a user can cause prints one line on stderr and exits 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

from predictor import __version__
from predictor.errors import PredictorError

EXAMPLES = """examples:
  predictor predict resnet50 --batch-size 64
  predictor predict bert-large --gpus T4,A100-SXM4-80GB,H100-SXM5-80GB --json
  predictor predict gpt2-large --seq-len 512 --gpus all --csv
  predictor predict my_model.py:build --batch-size 32 --breakdown 15
  predictor gpus
  predictor zoo
"""


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


class _Parser(argparse.ArgumentParser):
    """argparse with the one-line error convention (exit 2)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="predictor",
        description="Predict how long one training iteration of a PyTorch model takes on GPUs "
                    "you do not have, from a static trace of the step (no GPU needed).",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"dnn-predictor {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    p = sub.add_parser(
        "predict", help="predict iteration time of a model on GPUs",
        description="Trace one training step of MODEL (forward, loss, backward, optimizer) "
                    "and predict its time on each GPU.",
        epilog="MODEL is a zoo name (`predictor zoo`), path/to/file.py:factory or "
               "package.module:factory (the factory returns (model, example_inputs)).")
    p.add_argument("model", metavar="MODEL", help="zoo name or factory spec")
    p.add_argument("-b", "--batch-size", type=_positive_int, help="batch size (default: the model's)")
    p.add_argument("--gpus", default=None,
                   help="comma-separated GPU ids or aliases, or 'all' (default: a common set)")
    p.add_argument("--seq-len", type=_positive_int, help="sequence length for text models")
    p.add_argument("--optimizer", default="adam", choices=["adam", "adamw", "sgd", "none"],
                   help="optimizer step to include (default: adam)")
    p.add_argument("--inference", action="store_true", help="predict a no-grad forward pass only")
    p.add_argument("--dtype", default=None, choices=["float32", "float16", "bfloat16"],
                   help="run every floating-point op in this dtype (default: as traced)")
    p.add_argument("--tf32", action="store_true",
                   help="fp32 matmuls use TF32 tensor cores (torch.backends.cuda.matmul.allow_tf32)")
    p.add_argument("--spec", action="append", default=[], metavar="FILE",
                   help="extra GPU spec file (TOML, same layout as the built-in one)")
    p.add_argument("--breakdown", type=_positive_int, nargs="?", const=10, metavar="N",
                   help="also show the N slowest ops on the first GPU (default 10)")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="print a JSON object")
    fmt.add_argument("--csv", action="store_true", help="print CSV")

    g = sub.add_parser("gpus", help="list the GPUs in the spec database",
                       description="List known GPUs with their main specs.")
    g.add_argument("--spec", action="append", default=[], metavar="FILE",
                   help="extra GPU spec file to include")
    gfmt = g.add_mutually_exclusive_group()
    gfmt.add_argument("--json", action="store_true", help="print JSON")
    gfmt.add_argument("--csv", action="store_true", help="print CSV")

    sub.add_parser("zoo", help="list the built-in models", description="List the model zoo.")
    return parser


def _console(stderr: bool = False):
    from rich.console import Console

    return Console(stderr=stderr, highlight=False)


def _load_specs(files: Sequence[str]) -> None:
    from predictor import hardware

    for f in files:
        hardware.load_specs(f)


def cmd_predict(args: argparse.Namespace) -> int:
    import predictor
    from predictor import engine

    _load_specs(args.spec)
    from predictor import hardware

    chosen = hardware.database().resolve(args.gpus)  # fail on a bad GPU before tracing
    mode = "inference" if args.inference else "train"
    optimizer = None if args.optimizer == "none" else args.optimizer
    status = _console(stderr=True)
    with status.status(f"tracing {args.model} ...", spinner="dots"):
        graph = predictor.trace(args.model, batch_size=args.batch_size, seq_len=args.seq_len,
                                optimizer=optimizer, mode=mode)
    res = engine.sweep(graph, [g.id for g in chosen], [graph.batch_size], dtype=args.dtype,
                       tf32_matmul=args.tf32 or None)
    df = res.to_pandas().sort_values("iteration_ms", ignore_index=True)
    if args.json:
        out = {
            "model": graph.name, "batch_size": graph.batch_size, "seq_len": graph.seq_len,
            "mode": mode, "optimizer": optimizer, "dtype": args.dtype or "as traced",
            "parameters": graph.parameters, "flops_per_iteration": graph.flops(),
            "unsupported_ops": graph.unsupported,
            "predictions": [
                {k: (float(v) if k.endswith("_ms") or k == "throughput" else v)
                 for k, v in row.items() if k != "batch_size"}
                for row in df.to_dict(orient="records")],
        }
        print(json.dumps(out, indent=2))
        return 0
    if args.csv:
        df.insert(0, "model", graph.name)
        print(df.to_csv(index=False), end="")
        return 0
    _print_predict_table(graph, df, mode)
    if args.breakdown:
        pred = engine.predict(graph, df["gpu"][0], dtype=args.dtype, tf32_matmul=args.tf32 or None)
        _print_breakdown(pred, args.breakdown)
    return 0


def _print_predict_table(graph, df, mode: str) -> None:
    from rich.table import Table

    flops = sum(graph.flops().values())
    title = (f"{graph.name} · {mode} · batch {graph.batch_size}"
             + (f" · seq {graph.seq_len}" if graph.seq_len else "")
             + f" · {graph.parameters / 1e6:,.1f} M params · {flops / 1e12:,.2f} TFLOP/iter")
    table = Table(title=title, title_justify="left")
    table.add_column("GPU")
    table.add_column("iteration ms", justify="right")
    table.add_column("forward ms", justify="right")
    table.add_column("backward ms", justify="right")
    table.add_column("optimizer ms", justify="right")
    table.add_column("samples/s", justify="right")
    for row in df.itertuples():
        table.add_row(row.gpu, f"{row.iteration_ms:,.2f}", f"{row.forward_ms:,.2f}",
                      f"{row.backward_ms:,.2f}", f"{row.optimizer_ms:,.2f}",
                      f"{row.throughput:,.1f}")
    console = _console()
    console.print(table)
    n_ops = int(graph.ops.count.sum())
    note = (f"{n_ops:,} ops ({len(graph.ops):,} distinct) traced in {graph.trace_seconds:.1f} s; "
            "per-op times: analytical roofline + wave quantization.")
    if graph.unsupported:
        names = ", ".join(f"{k}×{v}" for k, v in sorted(graph.unsupported.items()))
        note += f"\n{sum(graph.unsupported.values())} op(s) without a family model, estimated " \
                f"from bytes moved: {names}"
    console.print(note, style="dim")


def _print_breakdown(pred, n: int) -> None:
    from rich.table import Table

    df = pred.ops.head(n)
    table = Table(title=f"slowest ops on {pred.gpu}", title_justify="left")
    for col in ("family", "op", "phase", "dims", "count", "ms", "share", "basis"):
        table.add_column(col, justify="right" if col in ("count", "ms", "share") else "left")
    for row in df.itertuples():
        table.add_row(row.family, row.op, row.phase, str(row.dims), str(row.count),
                      f"{row.ms:,.3f}", f"{row.share:.1%}", row.basis)
    _console().print(table)


def cmd_gpus(args: argparse.Namespace) -> int:
    from predictor import hardware

    _load_specs(args.spec)
    df = hardware.gpus()
    if args.json:
        print(df.to_json(orient="records", indent=2))
        return 0
    if args.csv:
        print(df.to_csv(index=False), end="")
        return 0
    from rich.table import Table

    table = Table(title=f"{len(df)} GPUs", title_justify="left")
    cols = [("id", "id"), ("name", "name"), ("memory_gb", "GB"), ("memory_bw_gbs", "GB/s"),
            ("fp32_tflops", "fp32 TF"), ("tf32_tflops", "tf32 TF"), ("bf16_tflops", "bf16 TF"),
            ("price_usd_per_hour", "$/h")]
    for key, label in cols:
        table.add_column(label, justify="left" if key in ("id", "name") else "right")
    for row in df.to_dict(orient="records"):
        table.add_row(*[_fmt(row[k]) for k, _ in cols])
    _console().print(table)
    return 0


def _fmt(value) -> str:
    if value is None or value != value:
        return "-"
    if isinstance(value, float):
        return f"{value:,.1f}" if value >= 10 else f"{value:,.2f}"
    return str(value)


def cmd_zoo(args: argparse.Namespace) -> int:
    from rich.table import Table

    from predictor import zoo

    table = Table(title="model zoo", title_justify="left")
    for col in ("name", "family", "batch", "seq", "description"):
        table.add_column(col)
    for name in zoo.names():
        m = zoo.get(name)
        table.add_row(m.name, m.family, str(m.default_batch_size),
                      str(m.default_seq_len or "-"), m.description)
    _console().print(table)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    handlers = {"predict": cmd_predict, "gpus": cmd_gpus, "zoo": cmd_zoo}
    try:
        return handlers[args.command](args)
    except PredictorError as exc:
        print(f"predictor: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("predictor: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
