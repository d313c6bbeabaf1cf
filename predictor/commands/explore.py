"""`predictor explore SPACE.py`: trace and sweep every candidate model of a
design space, in parallel, streaming results to --out and resuming there."""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import sys

from predictor.commands.common import (OPTIMIZER_HELP, add_format_arguments, add_spec_argument,
                                       console, fmt, load_specs, optimizer_arg,
                                       parse_batch_sizes, positive_int, precision_fields,
                                       print_notes_stderr, tf32_note)
from predictor.commands.search import _constraints, _fraction, _prices
from predictor.text import precision_words

NAME = "explore"

SPACE_EXAMPLE = '''# space.py
import torch, predictor

def build(depth, width):
    layers = [torch.nn.Linear(width, width) for _ in range(depth)]
    return torch.nn.Sequential(*layers), (torch.zeros(32, width),)

space = predictor.Space(build, {"depth": [2, 4, 8], "width": [256, 512]})'''


def add_parser(sub) -> None:
    p = sub.add_parser(
        NAME, help="trace and sweep many candidate models (a design space) in parallel",
        description="Trace every candidate of the design space in SPACE.py once and predict it "
                    "on every GPU and batch size, on this machine's cores (--executor local) "
                    "or a Ray cluster (--executor ray). With --out DIR the results stream "
                    "to DIR as they arrive; the same command again resumes, computing only "
                    "the candidates missing there.",
        epilog="SPACE.py defines `space = predictor.Space(factory, {...})` (SPACE.py:NAME for "
               "another name), where factory(**config) returns (model, example_inputs), e.g.\n\n"
               + SPACE_EXAMPLE + "\n\nexamples: predictor explore space.py --gpus T4,H100 "
               "-b 8,32,128 --out runs/nas1 | predictor explore space.py --executor ray "
               "--address auto --out runs/nas1 --constraint latency_ms=20",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("space", metavar="SPACE.py[:NAME]",
                   help="a Python file defining a predictor.Space named `space` (or NAME)")
    p.add_argument("--gpus", "--gpu", default="T4",
                   help="comma-separated GPU ids or aliases, NAME@WATTSW for a board under a "
                        "power limit (T4@50W), or 'all' (default: T4)")
    p.add_argument("-b", "--batch-sizes", type=parse_batch_sizes, default=None, metavar="LIST",
                   help="per-GPU batch sizes, e.g. 8,32 or 1..256 (default: each candidate's "
                        "example-input batch)")
    p.add_argument("--objective", default="throughput",
                   choices=["throughput", "latency", "cost"],
                   help="throughput: most samples/s; latency: least ms per iteration; cost: "
                        "least USD per 1M samples (default: throughput)")
    p.add_argument("--constraint", action="append", default=[], metavar="NAME=VALUE",
                   help="e.g. latency_ms=20, max_params=1e8, min_throughput=1000, "
                        "max_usd_per_1m_samples=2 (repeatable)")
    p.add_argument("--max-memory-fraction", type=_fraction, default=0.9, metavar="F",
                   help="a row fits when its peak memory is at most F of the GPU's (default 0.9)")
    p.add_argument("--executor", default="local", choices=["local", "ray"],
                   help="local: a process pool on this machine; ray: Ray tasks (pip install "
                        "'dnn-predictor[ray]') (default: local)")
    p.add_argument("--workers", type=positive_int, default=None, metavar="N",
                   help="worker processes (local) or CPUs of a local Ray instance "
                        "(default: this machine's cores)")
    p.add_argument("--address", default=None, metavar="ADDR",
                   help="the Ray cluster to join, e.g. 'auto' (default: start a local one)")
    p.add_argument("--out", metavar="DIR",
                   help="stream results to DIR/parts/*.jsonl and resume from them")
    p.add_argument("--retry-failed", action="store_true",
                   help="compute again the candidates recorded as failed in --out")
    p.add_argument("--chunk-size", type=positive_int, default=1, metavar="N",
                   help="candidates per task (default 1)")
    p.add_argument("--inference", action="store_true",
                   help="predict a no-grad forward pass instead of a training step")
    p.add_argument("--optimizer", default="adam", type=optimizer_arg, help=OPTIMIZER_HELP)
    p.add_argument("--amp", default=None, choices=["bf16", "fp16", "fp8"],
                   help="trace each candidate under mixed precision as "
                        "torch.autocast('cuda', dtype) runs it (fp16 with a GradScaler; fp8: "
                        "bf16 with float8 nn.Linear layers); default: none")
    p.add_argument("--dtype", default=None, choices=["float32", "float16", "bfloat16"],
                   help="run every floating-point op in this dtype (default: as traced)")
    p.add_argument("--tf32", action="store_true",
                   help="fp32 matmuls use TF32 tensor cores (torch.backends.cuda.matmul.allow_tf32)")
    p.add_argument("--price", action="append", default=[], metavar="GPU=USD|FILE",
                   help="override a GPU's price in USD per GPU-hour (repeatable)")
    p.add_argument("--top", type=positive_int, default=15, metavar="N",
                   help="rows to print (default 15)")
    p.add_argument("--all", action="store_true",
                   help="also print rows that do not fit or miss a constraint")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="no progress bar (it is shown only when stderr is a terminal)")
    add_spec_argument(p)
    add_format_arguments(p, csv_help="print every row as CSV")


def load_space(text: str):
    """The predictor.Space named by SPACE.py[:NAME]."""
    from predictor.errors import InvalidArgumentError
    from predictor.candidate import one_line
    from predictor.exploration import Space
    from predictor.io import printable

    path, sep, attr = text.rpartition(":")
    if not sep or not attr.isidentifier() or not path.endswith(".py"):
        path, attr = text, "space"
    shown = printable(path, 300)
    if not os.path.isfile(path):
        raise InvalidArgumentError(f"space file not found: {shown}")
    full = os.path.abspath(path)
    name = "_predictor_space_" + hashlib.sha1(full.encode()).hexdigest()[:12]
    folder = os.path.dirname(full)
    if folder not in sys.path:  # like `python space.py`: its siblings are importable
        sys.path.insert(0, folder)
    try:
        spec = importlib.util.spec_from_file_location(name, full)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {full} as a Python module")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001 - any error in user code
        sys.modules.pop(name, None)
        raise InvalidArgumentError(f"could not import space file {shown}: {one_line(exc)}") from None
    if not hasattr(module, attr):
        raise InvalidArgumentError(f"{shown} defines no {attr!r} (a predictor.Space); e.g. "
                                   "space = predictor.Space(build, {'depth': [2, 4]})")
    obj = getattr(module, attr)
    if not isinstance(obj, Space) and callable(obj):
        try:
            obj = obj()
        except Exception as exc:  # noqa: BLE001
            raise InvalidArgumentError(f"{shown}:{attr}() raised {one_line(exc)}") from None
    if not isinstance(obj, Space):
        raise InvalidArgumentError(f"{shown}:{attr} is a {type(obj).__name__}, not a "
                                   "predictor.Space")
    return obj


def _stderr_is_terminal() -> bool:
    """The progress bar goes to a terminal only: stderr piped or captured
    carries notes and one-line errors, nothing timed."""
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def run(args: argparse.Namespace) -> int:
    from predictor import hardware
    from predictor.exploration import explore

    load_specs(args.spec)
    gpus = hardware.database().resolve(args.gpus)  # fail on a bad GPU before importing
    constraints = _constraints(args.constraint)
    constraints.setdefault("memory_fraction", args.max_memory_fraction)
    prices = _prices(args.price)
    space = load_space(args.space)
    res = explore(space, gpus=[g.id for g in gpus], batch_sizes=args.batch_sizes,
                  objective=args.objective, constraints=constraints, executor=args.executor,
                  workers=args.workers, address=args.address, out=args.out,
                  mode="inference" if args.inference else "train",
                  optimizer=None if args.optimizer == "none" else args.optimizer,
                  dtype=args.dtype, amp=args.amp, tf32_matmul=args.tf32 or None,
                  prices=prices or None, chunk_size=args.chunk_size,
                  retry_failed=args.retry_failed,
                  progress=not args.quiet and _stderr_is_terminal())
    lines = _notes(args, gpus)
    if args.json:
        print(json.dumps({"space": space.name, "candidates": res.candidates,
                          **precision_fields(args.amp, args.dtype, args.tf32),
                          "notes": lines,
                          "computed": res.computed, "reused": res.reused,
                          "failed": res.failed, "objective": res.objective,
                          "rows": json.loads(res.table.to_json(orient="records")),
                          "failures": json.loads(res.failures.to_json(orient="records"))},
                         indent=2))
        return 0
    if args.csv:
        df = res.to_pandas()
        df["config"] = [json.dumps(c, sort_keys=True) for c in df["config"]]
        print(df.to_csv(index=False), end="")
        print_notes_stderr(lines)
        return 0
    print_table(space, res, args.top, args.all, precision_words(args.amp, args.dtype, args.tf32))
    if lines:
        console().print("\n".join(lines))
    return 0


def _notes(args: argparse.Namespace, gpus) -> list[str]:
    """The notes of the options asked for, the same for every candidate:
    --tf32 where it changes nothing (``engine.tf32_note``; the API's
    warning, which the command line shows as this note)."""
    if not args.tf32:
        return []
    from types import SimpleNamespace

    # Each candidate is traced in fp32 or under --amp: its dtypes follow from the options.
    note = tf32_note(SimpleNamespace(amp=args.amp, ops=None), gpus, args.dtype)
    return [note] if note else []


def print_table(space, res, top: int, show_all: bool,
                precision: str = "dtype as traced") -> None:
    from rich.table import Table

    df = res.to_pandas() if show_all else res.fitting()
    shown = df.head(top)
    table = Table(title=f"{space.name} · {res.candidates:,} candidates · {precision} · "
                        f"objective {res.objective}", title_justify="left")
    cols = ["#", "config", "params", "GFLOP/iter", "GPU", "batch", "iter ms", "samples/s",
            "mem GiB", "$/1M samples"] + (["fits"] if show_all else [])
    for c in cols:
        table.add_column(c, justify="left" if c in ("config", "GPU") else "right", no_wrap=True)
    for rec in shown.to_dict(orient="records"):
        ok = rec["fits"] and rec["feasible"]
        cells = [str(rec["rank"]), json.dumps(rec["config"], sort_keys=True),
                 f"{rec['params'] / 1e6:,.2f}M", fmt(rec["flops"] / 1e9), rec["gpu"],
                 str(rec["batch_size"]), fmt(rec["iteration_ms"]), fmt(rec["samples_per_s"]),
                 fmt(rec["memory_gb"]), fmt(rec["usd_per_1m_samples"])]
        if show_all:
            cells.append("yes" if ok else ("no (memory)" if not rec["fits"] else "no (limits)"))
        table.add_row(*cells, style=None if ok else "dim")
    out = console()
    if not out.is_terminal:
        out.width = max(out.width, 200)
    out.print(table)
    traced = res.graph_sources.get("traced", 0)
    shared = sum(v for k, v in res.graph_sources.items() if k != "traced")
    lines = [f"{res.candidates:,} candidates: {res.computed:,} computed in {res.seconds:.1f} s "
             f"({traced:,} traced, {shared:,} sharing a traced graph), {res.reused:,} read from "
             f"{res.out}" if res.out else
             f"{res.candidates:,} candidates computed in {res.seconds:.1f} s "
             f"({traced:,} traced, {shared:,} sharing a traced graph)",
             f"{len(res.fitting()):,} of {len(res.table):,} rows fit in memory and meet the "
             f"constraints; showing {len(shown)}" + ("" if show_all else " (--all shows the rest)")]
    if res.failed:
        lines.append(f"{res.failed:,} candidates failed:")
        for rec in res.failures.head(5).to_dict(orient="records"):
            lines.append(f"  {json.dumps(rec['config'], sort_keys=True)}: {rec['error']}")
        if res.failed > 5:
            lines.append(f"  ... and {res.failed - 5:,} more (--json lists them all)")
    out.print("\n".join(lines), style="dim")
