"""`predictor calibrate MODEL -o FILE`: time the model's ops (and its real
training step) on this machine's GPU, or its CPU, once; `predict` and
`sweep` then scale those measurements with `--calibration FILE`."""

from __future__ import annotations

import argparse
import json

from predictor.commands.common import (add_spec_argument, add_step_arguments, batch_size_arg,
                                       console, load_specs, positive_int, trace_from_args)

NAME = "calibrate"


def _batch_list(text: str) -> list[int]:
    out = []
    for item in str(text).split(","):
        if item.strip():
            out.append(batch_size_arg(item.strip()))
    if not out:
        raise argparse.ArgumentTypeError(f"no batch size in {text!r}")
    return out


def add_parser(sub) -> None:
    p = sub.add_parser(
        NAME, help="measure a model's ops on this machine's GPU (or CPU) for calibrated predictions",
        description="Trace one training step of MODEL, run every distinct op on this machine's "
                    "device with random tensors of its shapes (CUDA when present, else the CPU), "
                    "time the real step too, and write a calibration file. "
                    "`predictor predict|sweep MODEL --calibration FILE` then scales the measured "
                    "times to other batch sizes and to GPUs of this GPU's architecture; on GPUs "
                    "of another architecture each op group's measurements count as far as the "
                    "shipped blend weights say (with the shipped weights, convolutions only; "
                    "those runs say which in one line).",
        epilog="Example: predictor calibrate resnet50 --batch-size 64 -o resnet50.cal.npz && "
               "predictor sweep resnet50 --calibration resnet50.cal.npz --gpus all. "
               "A CPU calibration predicts that CPU only (other batch sizes, --gpus cpu).")
    p.add_argument("model", metavar="MODEL", help="zoo name, config.json or factory spec")
    p.add_argument("-o", "--output", required=True, metavar="FILE",
                   help="calibration file to write (.npz)")
    p.add_argument("-b", "--batch-size", type=batch_size_arg,
                   help="batch size to trace and calibrate at (default: the model's)")
    p.add_argument("--calibrate-at", type=_batch_list, metavar="LIST",
                   help="batch sizes to measure, comma-separated (default: B/4, B and 2B)")
    add_step_arguments(p, "calibrate a no-grad forward pass")
    p.add_argument("--device", default=None,
                   help="cpu, cuda or cuda:N (default: cuda when present, else cpu)")
    p.add_argument("--repeats", type=positive_int,
                   help="timing samples per op, median (default 15 on CUDA, 5 on a CPU)")
    p.add_argument("--iterations", type=positive_int, default=5,
                   help="timed real iterations per batch size, median (default 5)")
    p.add_argument("--no-iteration", action="store_true",
                   help="do not run the real step (no overhead model)")
    p.add_argument("--threads", type=positive_int,
                   help="torch CPU threads while measuring (default on a CPU: half the cores, at "
                        "least 1, so that other work on the machine does not fight the "
                        "measurement; on CUDA: torch's)")
    p.add_argument("--keep", action="store_true",
                   help="save the calibration even when its sanity checks fail (time that does "
                        "not grow with the batch, noisy iterations, a degenerate fit)")
    p.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                   help="CPU timer: wall time, or process CPU time (robust on a shared machine "
                        "with --threads 1)")
    p.add_argument("--spec-id", metavar="ID",
                   help="the GPU's id in the spec database when its name is not recognised")
    add_spec_argument(p)
    p.add_argument("--json", action="store_true", help="print the calibration summary as JSON")


def run(args: argparse.Namespace) -> int:
    import predictor

    load_specs(args.spec)
    if getattr(args, "amp", None) == "fp8":
        from predictor.errors import InvalidArgumentError

        raise InvalidArgumentError("--amp fp8: calibration does not run torchao's float8 "
                                   "kernels; calibrate the step with --amp bf16")
    threads = args.threads if args.threads is not None else default_threads(args.device)
    graph = trace_from_args(args)
    cal = predictor.calibrate(
        graph, device=args.device, repeats=args.repeats, batch_sizes=args.calibrate_at,
        iterations=args.iterations, measure_iteration=not args.no_iteration,
        spec_id=args.spec_id, clock=args.clock, threads=threads, progress=not args.json)
    problems = getattr(cal, "problems", [])
    if problems and not args.keep:
        from predictor.errors import CalibrationError

        raise CalibrationError(f"not saved: {problems[0]} (--keep saves it anyway)")
    for line in problems:
        import sys

        print(f"predictor: warning: calibration check failed, saved anyway (--keep): {line}",
              file=sys.stderr)
    path = cal.save(args.output)
    if args.json:
        out = cal.summary()
        out["file"] = str(path)
        print(json.dumps(out, indent=2))
        return 0
    print_summary(cal, str(path))
    return 0


def default_threads(device: str | None) -> int | None:
    """Torch threads for a CPU calibration: half the cores (at least 1, at
    most torch's own count), leaving room for the rest of the machine; None
    (torch's setting) for a CUDA device."""
    import os

    import torch

    wants_cuda = device is not None and str(device).startswith("cuda") or \
        device is None and torch.cuda.is_available()
    if wants_cuda:
        return None
    return max(1, min(torch.get_num_threads(), (os.cpu_count() or 2) // 2))


def print_summary(cal, path: str) -> None:
    from rich.table import Table

    s = cal.summary()
    info = cal.device_info
    out = console()
    title = f"{s['model']} calibrated on {s['device']} ({info.name})"
    table = Table(title=title, title_justify="left")
    for label in ("batch", "per-op sum ms", "model share ms", "real iteration ms", "gap ms"):
        table.add_column(label, justify="right", no_wrap=True)
    for b, ops, unm, it, gap in zip(s["batch_sizes"], s["ops_ms"], s["unmeasured_ms"],
                                    s["iteration_ms"], s["gap_ms"]):
        table.add_row(str(b), f"{ops:,.2f}", f"{unm:,.2f}",
                      "-" if it is None else f"{it:,.2f}", "-" if gap is None else f"{gap:+,.2f}")
    out.print(table)
    ov = cal.overhead
    lines = [f"{s['measured_rows']}/{s['rows']} distinct ops measured"]
    if info.is_cpu:
        lines.append(f"CPU: {info.peak_gflops:,.1f} GFLOP/s fp32, {info.bandwidth_gbs:,.1f} GB/s, "
                     f"{info.op_overhead_us:.1f} us per op, {info.threads} thread(s)")
    if ov.points:
        lines.append(f"iteration = (1 {ov.scale:+.3f}) x per-op sum {ov.fixed_ms:+.2f} ms "
                     f"(fitted on {ov.points} batch size(s): host overhead, allocator, caches)")
    for reason, n in sorted(s["skipped"].items()):
        lines.append(f"not measured ({n} rows, the model predicts them): {reason}")
    for note in cal.notes:
        if not note.endswith("the model predicts them"):
            lines.append(note)
    lines.append(f"wrote {path}")
    out.print("\n".join(lines), style="dim")
