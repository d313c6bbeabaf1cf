"""Shared helpers of the CLI subcommands."""

from __future__ import annotations

import argparse
from typing import Sequence


def shown(text: object, limit: int = 80) -> str:
    """An argument quoted in a one-line error: escaped, at most `limit` characters."""
    from predictor.text import printable

    return printable(repr(str(text)), limit)


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {shown(text)}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _in_range(text: str, check) -> int:
    """A positive integer argument checked against predictor.limits."""
    from predictor.errors import InvalidArgumentError

    try:
        return check(positive_int(text))
    except InvalidArgumentError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def batch_size_arg(text: str) -> int:
    """-b/--batch-size: a batch size in the supported range (predictor.limits)."""
    from predictor.limits import check_batch_size

    return _in_range(text, check_batch_size)


def seq_len_arg(text: str) -> int:
    """--seq-len: a sequence length in the supported range (predictor.limits)."""
    from predictor.limits import check_seq_len

    return _in_range(text, check_seq_len)


OPTIMIZER_HELP = ("optimizer step to include (default: adam): adam, adamw, sgd or none; "
                  "-loop for PyTorch's for-loop step (foreach=False), -fused for its fused "
                  "Adam/AdamW kernel (fused=True), +clip for clip_grad_norm_ before it, e.g. "
                  "adamw+clip, adam-loop, adamw-fused")


def optimizer_arg(text: str) -> str:
    """--optimizer: a name predictor.frontend.optimizers.check accepts, in its
    canonical form ("none" for none)."""
    from predictor.errors import InvalidArgumentError
    from predictor.frontend import optimizers

    try:
        return optimizers.check(text) or "none"
    except InvalidArgumentError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_step_arguments(p: argparse.ArgumentParser, inference_help: str) -> None:
    """What step of MODEL is traced: sequence length, optimizer, or inference."""
    p.add_argument("--seq-len", type=seq_len_arg, help="sequence length for text models")
    p.add_argument("--optimizer", default="adam", type=optimizer_arg, help=OPTIMIZER_HELP)
    p.add_argument("--inference", action="store_true", help=inference_help)
    p.add_argument("--loss", default=None, choices=["mean", "cross_entropy"],
                   help="the loss of the training step: mean of the first output, or "
                        "cross_entropy (class indices) over the last dim of every output; "
                        "default: the model's own (.loss, or the zoo model's), else mean "
                        "(an ONNX file's)")
    p.add_argument("--amp", default=None, choices=["bf16", "fp16", "fp8"],
                   help="mixed precision as torch.autocast('cuda', dtype) runs it (fp16 with a "
                        "GradScaler; fp8: bf16 autocast with every nn.Linear whose dims are "
                        "multiples of 16 in float8, torchao's tensorwise recipe, on GPUs with "
                        "float8 tensor cores); default: none")
    p.add_argument("--memory-format", default=None, type=memory_format_arg,
                   metavar="{channels_last,contiguous}",
                   help="train with the model and inputs in this memory format "
                        "(channels_last = NHWC, contiguous = NCHW; nhwc/nchw accepted); "
                        "default: as the model's tensors are (NCHW for zoo models). Half-precision "
                        "convolutions in NCHW pay cuDNN's layout transposes (not the forward "
                        "and data gradient of 1x1 stride-1 ones, which cuDNN runs as GEMMs)")


def memory_format_arg(text: str) -> str:
    """--memory-format: channels_last / contiguous (or nhwc / nchw)."""
    from predictor.errors import InvalidArgumentError
    from predictor.frontend.fx import check_memory_format

    try:
        return check_memory_format(text)
    except InvalidArgumentError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_precision_arguments(p: argparse.ArgumentParser) -> None:
    """How the traced step's floating-point ops run on the predicted GPU."""
    p.add_argument("--dtype", default=None, choices=["float32", "float16", "bfloat16"],
                   help="run every floating-point op in this dtype (default: as traced)")
    p.add_argument("--tf32", action="store_true",
                   help="fp32 matmuls use TF32 tensor cores (torch.backends.cuda.matmul.allow_tf32)")


def precision_fields(amp: str | None, dtype: str | None, tf32: bool) -> dict:
    """The precision keys of every command's --json: the --dtype asked for
    ("as traced" without one), the autocast dtype, and TF32 matmuls."""
    return {"dtype": dtype or "as traced", "amp": amp, "tf32_matmul": bool(tf32)}


def precision_text(graph, dtype: str | None = None, tf32: bool = False) -> str:
    """``predictor.text.precision_words`` for a traced step: "float32" for
    one traced mostly in it."""
    from predictor import dtypes
    from predictor.kernels import layout as L

    from predictor.text import precision_words

    traced = "float32" if dtypes.mostly(graph, (L.F32,)) else "dtype as traced"
    return precision_words(getattr(graph, "amp", None), dtype, tf32, traced)


def optimizer_text(graph) -> str:
    """A training step's optimizer where it is not the default Adam
    ("adamw+clip", "no optimizer"), else ""."""
    if graph.mode != "train" or graph.optimizer == "adam":
        return ""
    return graph.optimizer or "no optimizer"


def step_text(graph) -> str:
    """The traced step for a title: its mode, with `optimizer_text`
    ("train, adamw+clip")."""
    opt = optimizer_text(graph)
    return f"{graph.mode}, {opt}" if opt else graph.mode


def add_spec_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--spec", action="append", default=[], metavar="FILE",
                   help="extra GPU spec file (TOML, same layout as the built-in one)")


def add_format_arguments(p: argparse.ArgumentParser, json_help: str = "print a JSON object",
                         csv_help: str = "print CSV") -> None:
    """--json or --csv on standard output, not both."""
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help=json_help)
    fmt.add_argument("--csv", action="store_true", help=csv_help)


# Width of a console that is not a terminal: output piped to a file or another
# program gets every value in full, never cut or wrapped at 80 columns.
PIPE_WIDTH = 100_000


def console(stderr: bool = False):
    """A rich console on stdout (or stderr): a terminal's width on a TTY, else
    unlimited, so that tables are never truncated (no "…") when piped."""
    import sys

    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        tty = False
    # markup=False: names from users and files ("[/x]") are printed as written.
    return Console(stderr=stderr, highlight=False, markup=False,
                   width=None if tty else PIPE_WIDTH)


def load_specs(files: Sequence[str]) -> None:
    from predictor import hardware

    for f in files:
        hardware.load_specs(f)


NO_MEMORY_NOTE = ("peak memory is not predicted for this graph (it carries no memory profile; "
                  "trace the model again for one): whether it fits in a GPU's memory is not "
                  "checked (fits: empty in --json and --csv)")


def unknown_fits(table, graph):
    """`table` (a DataFrame or a list of row dicts) with its `fits` empty
    (None: null in JSON, blank in CSV) where the graph has no memory
    profile: the result objects count such configurations as fitting, so
    that they rank, but a machine format must not say they were checked."""
    from predictor.memory import has_profile

    if has_profile(graph):
        return table
    if isinstance(table, list):
        return [dict(row, fits=None) if "fits" in row else row for row in table]
    if "fits" not in table:
        return table
    table = table.copy()
    table["fits"] = None
    return table


def notes(graph, gpus: Sequence = (), dtype: str | None = None,
          left_out: Sequence[str] = (), tf32: bool = False) -> list[str]:
    """One-line notes every output format shows (table: under it; --json: a
    "notes" list; --csv: on stderr): how the step was traced, the GPUs asked
    for whose chip the op models were not trained on, ops of shapes no
    measured kernel covers (``opmodel.unmeasured_shape_notes``), and bf16
    asked of GPUs without bf16 tensor cores; an amp="fp8" step's `float8_note`
    and the GPUs of the set asked for it `left_out` (no float8 tensor cores);
    --tf32 where it does not apply (`tf32_note`); 16-bit GEMMs with an odd dim
    (`odd_gemm_note`)."""
    from predictor import opmodel
    from predictor.kernels import layout as L

    from predictor.memory import has_profile

    out = list(getattr(graph, "notes", None) or [])
    if not has_profile(graph):
        out.append(NO_MEMORY_NOTE)
    fp8 = float8_note(graph)
    out += [fp8] if fp8 else []
    if left_out:
        out.append(f"amp fp8: {', '.join(left_out)} left out (no float8 tensor cores)")
    bf16 = _runs_in(graph, dtype, "bfloat16", "bf16", L.BF16)
    outside = opmodel.outside_training_data([g for g in gpus if g.vendor in ("nvidia", "amd")])
    if outside:
        trained = ", ".join(opmodel.shipped()[1].get("gpus", []))
        out.append(f"{', '.join(sorted(outside))}: not a chip of the op models' training data "
                   f"({trained}); predicted from the spec sheet, so expect larger errors than "
                   "on those (README, 'How accurate'); calibrating on a GPU of its architecture "
                   "and compute capability narrows them")
    out += opmodel.unmeasured_shape_notes(graph)
    lacking = [g.id for g in gpus if bf16 and g.spec.get("bf16_supported", True) is False]
    if lacking:
        out.append(f"no bf16 tensor cores on {', '.join(lacking)}: bfloat16 matmuls and "
                   "convolutions are predicted at the fp32 rate there, other ops at "
                   "bfloat16's halved memory traffic")
    fp16 = _runs_in(graph, dtype, "float16", "fp16", L.F16)
    lacking = [g.id for g in gpus if fp16 and not _has_fp16_tensor_cores(g)]
    if lacking:
        out.append(f"no fp16 tensor cores on {', '.join(lacking)}: float16 matmuls and "
                   "convolutions are predicted at the GPU's CUDA-core half-precision rate there "
                   "(at most twice fp32), other ops at float16's halved memory traffic")
    t = tf32_note(graph, gpus, dtype) if tf32 else None
    out += [t] if t else []
    odd = odd_gemm_note(graph, dtype)
    out += [odd] if odd else []
    return out


def odd_gemm_note(graph, dtype: str | None = None) -> str | None:
    """A note naming the odd dims of the step's 16-bit GEMMs (at its traced
    batch), or None: such a GEMM's rows are 2-byte aligned, which cuBLAS
    serves with its align1 kernels at their own rate per SM clock
    (``kernels.precision.odd_dims``), several times slower than the
    tensor cores on a data-centre GPU; a multiple of 8 there, a padded
    vocabulary of 50,264 for GPT-2's 50,257, runs the fast ones."""
    from predictor import dtypes
    from predictor.kernels import precision

    ops = graph.ops
    code = dtypes.parse(dtype)
    if code is not None:
        ops = ops.with_dtype(code)
    odd = {int(v) for family, dt, d in zip(ops.family, ops.dtype, ops.dims(graph.batch_size))
           for v in precision.odd_dims(int(family), int(dt), d)} - {0}
    if not odd:
        return None
    named = ", ".join(f"{v:,}" for v in sorted(odd)[:4]) + (", ..." if len(odd) > 4 else "")
    return (f"16-bit GEMMs with an odd dim ({named} at batch {graph.batch_size}) run cuBLAS's "
            "2-byte-aligned kernels, priced at their own rate per SM clock: several times "
            "slower than aligned ones on an A100 or H100; a multiple of 8 there (a padded "
            "vocabulary) runs the fast kernels (benchmarks/README.md, 'A 267,735-word "
            "language model')")


def _runs_in(graph, dtype: str | None, name: str, amp: str, code: int) -> bool:
    """Whether the step's matmuls run in the 16-bit dtype `name`: asked with
    --dtype, traced under autocast `amp`, or most of its rows in `code`."""
    from predictor import dtypes

    return dtype == name or dtype is None and (
        getattr(graph, "amp", None) == amp or dtypes.mostly(graph, (code,)))


def _has_fp16_tensor_cores(gpu) -> bool:
    """Whether fp16 GEMMs run on tensor cores on `gpu` (the pricing's own rule,
    ``precision.tensor_core_peak``)."""
    from predictor.engine import model_params
    from predictor.kernels import layout as L
    from predictor.kernels.precision import tensor_core_peak

    return tensor_core_peak(L.MATMUL, L.F16, gpu.features, model_params()) > 0.0


def tf32_note(graph, gpus: Sequence, dtype: str | None = None) -> str | None:
    """The note for --tf32 where it changes nothing (``engine.tf32_note``:
    a half-precision step, or GPUs without TF32 tensor cores). The Python
    API's warning says the same; the command line shows it as a note."""
    from predictor import dtypes, engine

    return engine.tf32_note(graph, gpus, dtypes.parse(dtype))


def float8_note(graph) -> str | None:
    """The one-line note every output format shows for an ``amp="fp8"`` step
    (predictor.frontend.float8): how many linear layers run in float8 and
    what the pricing leaves out (None for any other step)."""
    if getattr(graph, "amp", None) != "fp8":
        return None
    from predictor.kernels import layout as L

    t = graph.ops
    layers = sum(int(t.count[i]) for i in range(len(t.family))
                 if t.op_names[t.op[i]] == "_scaled_mm" and t.phase[i] == L.FORWARD)
    if layers == 0:
        return ("amp fp8: no nn.Linear layer with both weight dims multiples of 16 (torchao "
                "converts no other), so the step is amp bf16's")
    stored = ", their weights stored in float8" if graph.mode == "inference" else ""
    return (f"amp fp8: {layers} nn.Linear layers in float8{stored} (torchao's tensorwise "
            "recipe: weights with a dim not a multiple of 16 stay bf16); casts priced as eager "
            "kernels, rowwise scaling and float8 attention or all-gathers not modelled; the "
            "±err band is the tensor-core model's on published AMP/TF32 runs "
            "(benchmarks/README, 'Float8 training')")


def print_notes_stderr(lines: Sequence[str]) -> None:
    """Notes beside machine-readable output on stdout: one line each on stderr."""
    import sys

    for line in lines:
        print(f"predictor: note: {line}", file=sys.stderr)


def plural(n: int, word: str, many: str | None = None) -> str:
    """'1 GPU', '2 GPUs' (``many`` for an irregular plural)."""
    return f"{n:,} {word if n == 1 else (many or word + 's')}"


def json_records(df) -> list[dict]:
    """JSON records of a results DataFrame: NaN and None as null, batch sizes
    as ints, flags (fits) as bools, other numbers as floats, text as is."""
    import math

    import numpy as np

    out = []
    for row in df.to_dict(orient="records"):
        out.append({k: (None if v is None or isinstance(v, float) and not math.isfinite(v)
                        else bool(v) if isinstance(v, (bool, np.bool_)) else
                        int(v) if k == "batch_size" else
                        float(v) if not isinstance(v, str) else v)
                    for k, v in row.items()})
    return out


def error_cell(p90) -> str:
    """The expected-error cell of a table: '±9 %', '-' where none was measured."""
    return "-" if p90 is None or p90 != p90 else f"±{p90:.0f} %"


# What the tables' "±err" column means (predictor.expected_error).
ERROR_COLUMN_NOTE = ("±err: 90 % of measured iterations predicted the same way were within this "
                     "(trained: fp32 on a board of the op models' data; unseen: fp32 on any other "
                     "board, measured on GPUs left out of training and published fp32 runs of "
                     "other boards; tensor cores: published "
                     "AMP/TF32 runs; -: nothing of the kind measured, as a calibrated prediction "
                     "or half precision without tensor cores for it); README, 'How accurate'")


def fmt(value) -> str:
    if value is None or value != value:
        return "-"
    if isinstance(value, float):
        return f"{value:,.1f}" if value >= 10 else f"{value:,.2f}"
    return str(value)


# ---- MODEL: a trace or a saved graph -------------------------------------------

def trace_from_args(args: argparse.Namespace):
    """Trace MODEL as the common options say, with a spinner on stderr."""
    import predictor

    mode = "inference" if getattr(args, "inference", False) else "train"
    if mode == "inference" and getattr(args, "optimizer", "adam") != "adam":
        from predictor.errors import InvalidArgumentError

        raise InvalidArgumentError(f"--optimizer {args.optimizer} does not apply to --inference: "
                                   "an inference pass has no optimizer step")
    if mode == "inference" and getattr(args, "loss", None) is not None:
        from predictor.errors import InvalidArgumentError

        raise InvalidArgumentError(f"--loss {args.loss} does not apply to --inference: "
                                   "an inference pass has no loss")
    optimizer = None if getattr(args, "optimizer", "adam") == "none" else args.optimizer
    from predictor.io import markup_safe

    with progress(f"tracing {markup_safe(args.model)} ..."):
        graph = predictor.trace(args.model, batch_size=args.batch_size, seq_len=args.seq_len,
                                optimizer=optimizer, mode=mode, amp=getattr(args, "amp", None),
                                loss_fn=getattr(args, "loss", None),
                                memory_format=getattr(args, "memory_format", None))
    first_compile_notice()  # after the trace: a model that cannot be traced stays one line
    return graph


# ---- first-run notices and progress ------------------------------------------

def progress(message: str):
    """A spinner with `message` on stderr when it is a terminal. Nothing when
    it is not (a log, a pipe): there stderr carries only the notes and the
    one-line error a failure prints, so that a script sees exactly one line."""
    import contextlib

    err = console(stderr=True)
    if err.is_terminal:
        return err.status(message, spinner="dots")
    return contextlib.nullcontext()


def kernels_cached() -> bool:
    """Whether the numba kernels of this version were compiled into the on-disk
    cache by an earlier run (``predictor.kernels``' cache folder, or the
    user's ``NUMBA_CACHE_DIR``)."""
    import os
    from pathlib import Path

    from predictor import kernels

    user = os.environ.get("NUMBA_CACHE_DIR")
    try:
        if user:
            return any(Path(user).rglob("grid.evaluate_grid-*.nbi"))
        return any(kernels.default_dir().glob("grid.evaluate_grid-*.nbi"))
    except OSError:
        return False


_compile_noticed = False


def first_compile_notice() -> None:
    """One line on stderr, once per process, when the kernels have not been
    compiled yet: the first run compiles them (about 20 s of CPU time,
    measured on this project's 2-core CI box), later runs load them."""
    global _compile_noticed
    if _compile_noticed or kernels_cached():
        return
    _compile_noticed = True
    import sys

    print("predictor: first run: compiling the numba kernels (about 20 s of CPU time, once; "
          "later runs load them from the cache)", file=sys.stderr, flush=True)


def load_graph(args: argparse.Namespace):
    """A saved graph (MODEL ends in .npz) or a fresh trace."""
    if args.model.lower().endswith(".npz"):
        from predictor.errors import InvalidArgumentError
        from predictor.optable import Graph

        traced_as = [flag for flag, given in (("--seq-len", args.seq_len is not None),
                                              ("--optimizer", args.optimizer != "adam"),
                                              ("--inference", args.inference),
                                              ("--loss", getattr(args, "loss", None) is not None),
                                              ("--amp", getattr(args, "amp", None) is not None),
                                              ("--memory-format",
                                               getattr(args, "memory_format", None) is not None))
                     if given]
        if traced_as:
            raise InvalidArgumentError(f"{', '.join(traced_as)} cannot change a saved graph "
                                       f"({args.model}); trace the model again with them")
        graph = Graph.load(args.model)
        first_compile_notice()
        return graph

    args.batch_size = None
    return trace_from_args(args)


# ---- batch sizes ----------------------------------------------------------------

# A sweep far larger than any design space is a typo (1..10**9 in steps of 1).
MAX_BATCH_SIZES = 4096


def parse_batch_sizes(text: str) -> list[int]:
    """'1,2,4..1024' -> sorted distinct batch sizes. `a..b` doubles from a up
    to b (b included even when it is not a power-of-two multiple of a)."""
    out: set[int] = set()
    for item in (t.strip() for t in str(text).split(",")):
        if not item:
            continue
        if ".." in item:
            lo_text, _, hi_text = item.partition("..")
            lo, hi = _positive(lo_text, item), _positive(hi_text, item)
            if lo > hi:
                raise argparse.ArgumentTypeError(f"empty batch-size range {shown(item)} ({lo} > {hi})")
            b = lo
            while b < hi:
                out.add(b)
                b *= 2
            out.add(hi)
        else:
            out.add(_positive(item, item))
        if len(out) > MAX_BATCH_SIZES:
            raise argparse.ArgumentTypeError(f"more than {MAX_BATCH_SIZES} batch sizes")
    if not out:
        raise argparse.ArgumentTypeError(f"no batch size in {shown(text)}")
    return sorted(out)


def _positive(text: str, item: str) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"bad batch size {shown(item)}: expected N or A..B (doubling), e.g. 1,2,4..1024") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"batch sizes must be positive, got {value}")
    from predictor.errors import InvalidArgumentError
    from predictor.limits import check_batch_size

    try:
        return check_batch_size(value)
    except InvalidArgumentError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


# ---- --calibration, and the devices to predict ----------------------------------

def add_calibration_argument(p) -> None:
    p.add_argument("--calibration", metavar="FILE",
                   help="scale measured op times from `predictor calibrate` (a CPU calibration "
                        "predicts that CPU only: --gpus cpu, the default with it)")


def _float8_only(gpus: list, args: argparse.Namespace) -> list:
    """Of a default set or 'all', the GPUs with float8 tensor cores
    (``hardware.float8_gpus``: GPUs named one by one without them are an
    error); those left out go to ``args.left_out_gpus`` for the notes."""
    from predictor import hardware

    kept = hardware.float8_gpus(gpus, args.gpus)
    args.left_out_gpus = [g.id for g in gpus if g not in kept]
    return kept


def resolve_gpus(args: argparse.Namespace) -> list:
    """--gpus as GPU records (for --amp fp8, those with float8 tensor cores)."""
    from predictor import hardware

    gpus = hardware.database().resolve(args.gpus)
    return _float8_only(gpus, args) if getattr(args, "amp", None) == "fp8" else gpus


def gpus_for(graph, gpus: list, args: argparse.Namespace) -> list:
    """`gpus` for a loaded graph: a graph saved under amp="fp8" (no --amp on
    the command line) keeps the float8 GPUs as --amp fp8 does."""
    if getattr(graph, "amp", None) == "fp8" and getattr(args, "amp", None) != "fp8":
        return _float8_only(gpus, args)
    return gpus


def targets(args: argparse.Namespace) -> tuple[list, object]:
    """(devices, calibration), checked before tracing: the devices to predict as
    GPU records (--gpus resolved in the GPU database, or, with a CPU
    calibration, its CPU, the default, and nothing else) and the calibration
    named by --calibration (None without one), read once. Check it against the
    traced graph with ``calibration.check_graph(graph)``."""
    from predictor import hardware

    path = getattr(args, "calibration", None)
    if not path:
        return resolve_gpus(args), None
    from predictor import calibrated
    from predictor.calibration.file import load

    cal = load(path)
    if cal.is_cpu:
        return calibrated.resolve_targets(cal, args.gpus, hardware.database()), cal
    return hardware.database().resolve(args.gpus), cal
