"""Per-kernel fp32 times on the local GPU, forward and backward, on the shapes
of the NeuSight training files: the measurements of another training GPU.

    python -m benchmarks.measure_kernels --data ../shared/data/neusight --seconds 240
    python -m benchmarks.measure_kernels --device cpu --per-op 2 --out /tmp/kernels  # smoke test

For each op file of ``train/`` (linear, bmm, conv, softmax, ln and the
elementwise ops) a seeded sample of one training GPU's shapes (``--shapes-from``)
is lowered through the op-family registry (``predictor.families``) as a
training step runs it: the forward, and the backward autograd runs for it (a
linear's and a bmm's two GEMMs with their operand layouts, conv dgrad and
wgrad, softmax and layer-norm backward, the elementwise ops' backward
kernels). Every resulting row is timed on the device by
``predictor.calibration.measure`` (warm-up, CUDA events, the median of
``--repeats`` samples), the way ``predictor calibrate`` times a graph's rows.

After the op files, the GEMM rows of a training step of a few zoo
transformers (``--models``, ``MODEL_GEMMS``: BERT-base, GPT-2, the
Transformer base, Llama 2 7B and 13B, Llama 3 8B at one batch and sequence
each) are timed the same way: model shapes, aligned as real layers are, which
the training files' random shapes never are. They are written as ``linear``
rows (unbatched) and ``bmm`` rows (batched), with the model in ``Model``.

The time budget (``--seconds``) is shared between the op files and the model
GEMMs by weight (GEMMs and convolutions most); an op file's sample is cut
short when its share is spent, and what is left of it passes to the files
after it.

Output: ``<device name>.csv`` in ``--out`` (default ``benchmarks/data``), one
line per measured row: the source op and its shape columns as the source file
names them, the pass (forward / backward), the row's family and dims (d0-d11)
and kernel count as the lowering writes them, the latency (ms, one execution),
the device, torch and CUDA versions, and whether matmuls and convolutions ran
in TF32 (``TF32 Matmul``, ``TF32 Conv``: both off, as the dataset measured
them; a file without the columns ran PyTorch's defaults, TF32 convolutions).
It is rewritten atomically after every op file, so a run cut off by a
timeout keeps what it measured.
``predictor train-models --extra FILE`` trains on the file's rows beside the
dataset's (``predictor.calibration.datasets.load_measured``).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

import predictor
from predictor.calibration import measure as M
from predictor.calibration.datasets import BINARY, OPS
from predictor.io import atomic_write_text
from predictor.kernels import layout as L
from predictor.opmodel import record_rows
from predictor.zoo import ZOO

# Share of the time budget per op file (each elementwise file gets ELEMENTWISE_WEIGHT).
WEIGHTS = {"linear": 3.0, "bmm": 3.0, "conv": 3.0, "softmax": 1.0, "ln": 1.0}
ELEMENTWISE_WEIGHT = 0.3
SHAPE_COLUMNS = {
    "linear": ("B", "M", "N", "K"), "bmm": ("B", "M", "N", "K"),
    "conv": ("B", "Input_Channel", "Output_Channel", "Kernel_Szie", "Input_Size", "Stride",
             "Padding"),
}
# The scalar of the tensor-with-scalar ops (addu, mulu, divu, powu).
SCALAR = 2.0
# Model GEMMs: the zoo's transformers' own matmuls (each forward GEMM, both
# gradient GEMMs, attention's batched ones) at one batch and sequence each,
# (zoo name, batch, sequence). Their dims are what real layers run, multiples
# of 64 and more; the NeuSight training files' shapes are random and none is
# aligned so in all three dims, and at equal work the aligned shapes of its
# test split run 5-30 % faster on every GPU (`python -m benchmarks.accuracy
# --splits`), which no training row can teach. No model here is one of the
# dataset's whole-model labels (BERT-large, GPT-2 large, GPT-3 XL and 2.7B,
# OPT-1.3B), so the labels' own GEMM shapes stay out of training.
# Timed in this order, the largest GEMMs among the first, so that a budget
# spent early still leaves some of each kind.
MODEL_GEMMS = (("llama2-7b", 1, 2048), ("bert-base", 8, 512), ("gpt2", 4, 1024),
               ("llama3-8b", 1, 2048), ("transformer", 64, 50), ("llama2-13b", 1, 1024))
# Their share of the time budget, against the op files' weights (3 for a
# GEMM or convolution file): tracing the six takes tens of seconds of it.
MODEL_WEIGHT = 4.0


def step(op: str, shape: dict, device: torch.device):
    """(forward callable, its inputs) of one source row on `device`, the
    tensors requiring grad, laid out as the data's README and launch records say."""
    def t(*s):
        return torch.randn(*s, device=device, requires_grad=True)

    if op in ("linear", "bmm"):
        b, m, n, k = (int(shape[c]) for c in SHAPE_COLUMNS[op])
        if op == "linear":  # x[B*M, N] @ W[K, N]^T
            x, w = t(b * m, n), t(k, n)
            return (lambda: F.linear(x, w)), (x, w)
        a, bb = t(b, m, n), t(b, n, k)  # a[B, M, N] @ b[B, N, K]
        return (lambda: torch.bmm(a, bb)), (a, bb)
    if op == "conv":
        b, c, k, r, h, st, pad = (int(shape[c]) for c in SHAPE_COLUMNS[op])
        x, w = t(b, c, h, h), t(k, c, r, r)
        return (lambda: F.conv2d(x, w, None, st, pad)), (x, w)
    b, h = int(shape["B"]), int(shape["H"])
    x = t(b, h)
    if op == "softmax":
        return (lambda: torch.softmax(x, -1)), (x,)
    if op == "ln":
        g, beta = t(h), t(h)
        return (lambda: F.layer_norm(x, (h,), g, beta)), (x, g, beta)
    if op in BINARY:
        y = t(b, h)
        fn = {"add": torch.add, "mul": torch.mul, "div": torch.div, "pow": torch.pow}[op]
        return (lambda: fn(x, y)), (x, y)
    if op in ("addu", "mulu", "divu", "powu"):
        fn = {"addu": torch.add, "mulu": torch.mul, "divu": torch.div, "powu": torch.pow}[op]
        return (lambda: fn(x, SCALAR)), (x,)
    fn = {"relu": torch.relu, "tanh": torch.tanh, "gelu": F.gelu}[op]
    return (lambda: fn(x)), (x,)


def lowered_rows(op: str, shape: dict) -> list[tuple[str, int, tuple, int]]:
    """(pass, family, dims, kernels) of every kernel row a training step runs
    for one source row: recorded on meta tensors, lowered by the registry."""
    fwd, inputs = step(op, shape, torch.device("meta"))
    out = [("forward", *r) for r in record_rows(fwd)]
    y = fwd()
    grad = torch.empty_like(y)
    out += [("backward", *r) for r in record_rows(
        lambda: torch.autograd.grad(y, inputs, grad, allow_unused=True))]
    seen, rows = set(), []
    for p, fam, dims, kernels in out:
        key = (p, int(fam), tuple(int(d) for d in dims), int(kernels))
        if key not in seen:
            seen.add(key)
            rows.append(key)
    return rows


def model_gemm_rows(name: str, batch: int, seq: int) -> list[tuple[str, int, tuple, int]]:
    """(pass, family, dims, kernels) of every distinct fp32 GEMM row of one
    training step of zoo model `name` at `batch` x `seq`, traced on fake
    tensors (no optimizer step: it runs no GEMM)."""
    g = predictor.trace(name, batch_size=batch, seq_len=seq, optimizer=None)
    ops = g.ops
    seen, rows = set(), []
    for i in range(len(ops.family)):
        if int(ops.family[i]) != L.MATMUL or int(ops.dtype[i]) != L.F32:
            continue
        dims = tuple(int(b) + int(sl) * batch for b, sl in zip(ops.dbase[i], ops.dslope[i]))
        key = (L.PHASE_NAMES[int(ops.phase[i])], L.MATMUL, dims, int(ops.kernels[i]))
        if key not in seen:
            seen.add(key)
            rows.append(key)
    return rows


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    from predictor.calibration.device import cpu_name

    return cpu_name()


def fp32_math() -> tuple[bool, bool]:
    """Turn TF32 off for matmuls and convolutions, so that fp32 kernels run
    as the dataset's did; returns the (matmul, conv) TF32 settings now in force."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return (bool(torch.backends.cuda.matmul.allow_tf32), bool(torch.backends.cudnn.allow_tf32))


def source_shapes(data: Path, op: str, shapes_from: str, per_op: int, seed: int,
                  max_elements: float) -> pd.DataFrame:
    """A seeded sample of one training GPU's shapes for `op` (at most
    `per_op`, none with a tensor of more than `max_elements` elements)."""
    df = pd.read_csv(data / "train" / op / f"{shapes_from}.csv")
    cols = list(SHAPE_COLUMNS.get(op, ("B", "H")))
    df = df[cols].drop_duplicates().reset_index(drop=True)
    if op in ("linear", "bmm"):
        big = np.maximum.reduce([df.B * df.M * df.N, df.B * df.N * df.K, df.B * df.M * df.K])
    elif op == "conv":
        big = np.maximum(df.B * df.Input_Channel, df.B * df.Output_Channel) * df.Input_Size ** 2
    else:
        big = df.B * df.H
    df = df[big <= max_elements]
    return df.sample(n=min(per_op, len(df)), random_state=seed).reset_index(drop=True)


def measure(data: Path, device: torch.device, *, seconds: float, per_op: int, seed: int,
            repeats: int, shapes_from: str, ops=OPS, models=(), max_elements: float = float("inf"),
            model_max_elements: float | None = None, write=None, log=print) -> pd.DataFrame:
    """Time every lowered row of the sampled shapes, then the GEMM rows of the
    `models` (`MODEL_GEMMS` entries, after the op files, in their share of the
    budget; none with an operand of more than `model_max_elements` elements,
    default `max_elements`); `write(df)` after each op file and model."""
    if model_max_elements is None:
        model_max_elements = max_elements
    name = device_name(device)
    free = M.device_memory_bytes(device)
    # The dataset's kernels are plain fp32: PyTorch's default runs convolutions
    # in TF32 on tensor cores (cudnn.allow_tf32), a different kernel and rate.
    math = fp32_math()
    weights = {op: WEIGHTS.get(op, ELEMENTWISE_WEIGHT) for op in ops}
    model_weight = MODEL_WEIGHT if models else 0.0
    start = time.perf_counter()
    records: list[dict] = []
    skipped: Counter[str] = Counter()

    def timed(op: str, source: dict, p: str, fam: int, dims: tuple, kernels: int) -> None:
        got = M.measure_row(fam, L.F32, kernels, dims, f"{op}.{p}", 1, device,
                            2e-3, free, samples=repeats)
        if isinstance(got, str):
            skipped[got] += 1
            return
        d = list(dims) + [0] * (L.MAX_DIMS - len(dims))
        records.append({"OPName": op, **source, "Pass": p, "Family": L.FAMILY_NAMES[fam],
                        **{f"d{j}": d[j] for j in range(L.MAX_DIMS)},
                        "Kernels": kernels, "Latency": got / 1e3, "Device": name,
                        "TF32 Matmul": math[0], "TF32 Conv": math[1],
                        "Torch Version": torch.__version__,
                        "CUDA Version": torch.version.cuda or ""})

    for i, op in enumerate(ops):
        left = seconds - (time.perf_counter() - start)
        share = left * weights[op] / (sum(weights[o] for o in ops[i:]) + model_weight)
        until = time.perf_counter() + share
        shapes = source_shapes(data, op, shapes_from, per_op, seed, max_elements)
        done = 0
        for shape in shapes.to_dict(orient="records"):
            if time.perf_counter() > until:
                break
            for p, fam, dims, kernels in lowered_rows(op, shape):
                timed(op, shape, p, fam, dims, kernels)
            done += 1
        log(f"  {op:<8} {done:4d} of {len(shapes)} shapes in {share:6.1f} s budget")
        if write is not None:
            write(pd.DataFrame.from_records(records))
    until = start + seconds
    for model, batch, seq in models:
        if time.perf_counter() > until:
            log(f"  {model}: not measured, the time budget is spent")
            continue
        try:
            rows = model_gemm_rows(model, batch, seq)
        except Exception as exc:  # noqa: BLE001 - one model's trace must not cost the others
            log(f"  {model}: not traced ({type(exc).__name__}: {' '.join(str(exc).split())[:200]})")
            continue
        done = 0
        for p, fam, dims, kernels in rows:
            if time.perf_counter() > until:
                break
            # Unbatched GEMMs train as the linear file's rows, batched ones as bmm's.
            op = "linear" if dims[0] <= 1 else "bmm"
            if row_elements(dims) > model_max_elements:
                skipped["matmul: an operand larger than this run's tensors"] += 1
            else:
                timed(op, {"Model": f"{model} {batch}x{seq}"}, p, fam, dims, kernels)
            done += 1
        log(f"  {model:<12} {done:4d} of {len(rows)} GEMM rows (batch {batch} x {seq})")
        if write is not None:
            write(pd.DataFrame.from_records(records))
    for reason, n in sorted(skipped.items()):
        log(f"  not measured: {n} x {reason}")
    return pd.DataFrame.from_records(records)


def row_elements(dims: tuple) -> float:
    """Elements of a GEMM row's largest operand (A, B or C)."""
    bt, m, n, k = (float(x) for x in dims[:4])
    return bt * max(m * k, k * n, m * n)


def parse_models(text: str) -> tuple[tuple[str, int, int], ...]:
    """`--models`: NAME:BATCHxSEQ, comma-separated, or 'none'; ValueError
    naming the first bad entry."""
    if text.strip().lower() in ("", "none"):
        return ()
    out = []
    for entry in text.split(","):
        name, _, size = entry.strip().partition(":")
        batch, _, seq = size.partition("x")
        if name not in ZOO or not batch.isdigit() or not seq.isdigit() \
                or int(batch) < 1 or int(seq) < 1:
            raise ValueError(f"--models: {entry.strip()!r} is not NAME:BATCHxSEQ with NAME a "
                             "zoo model (`predictor zoo`) and BATCH, SEQ positive integers")
        out.append((name, int(batch), int(seq)))
    return tuple(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="../shared/data/neusight", type=Path,
                    help="the NeuSight data folder (its train/ files give the shapes)")
    ap.add_argument("--device", default="cuda", help="torch device (default cuda)")
    ap.add_argument("--seconds", type=float, default=240.0, help="time budget (default 240)")
    ap.add_argument("--per-op", type=int, default=600, help="shapes per op file at most")
    ap.add_argument("--repeats", type=int, default=3, help="samples per row (median)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shapes-from", default="Tesla_V100-PCIE-32GB",
                    help="the training GPU whose files give the shapes")
    ap.add_argument("--ops", default=",".join(OPS), help="op files, comma-separated")
    ap.add_argument("--models", default=",".join(f"{m}:{b}x{q}" for m, b, q in MODEL_GEMMS),
                    help="zoo models whose GEMM rows to time after the op files, "
                    "NAME:BATCHxSEQ comma-separated, or 'none' (default: %(default)s)")
    ap.add_argument("--out", default="benchmarks/data", type=Path, help="output folder")
    args = ap.parse_args(argv)
    ops = tuple(o for o in args.ops.split(",") if o)
    unknown = [o for o in ops if o not in OPS]
    if unknown:
        ap.error(f"unknown op file(s) {', '.join(unknown)}; choose from {', '.join(OPS)}")
    try:
        models = parse_models(args.models)
    except ValueError as exc:
        ap.error(str(exc))
    if not (args.data / "train").is_dir():
        ap.error(f"{args.data}: not a NeuSight data folder (expected train/ inside)")
    try:
        device = torch.device(args.device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("CUDA is not available on this machine")
    except RuntimeError as exc:
        ap.error(f"device {args.device!r}: {exc}")
    # A CPU smoke run keeps to small tensors (a model's small GEMMs among them).
    max_elements = float("inf") if device.type == "cuda" else 2e5
    model_max_elements = float("inf") if device.type == "cuda" else 1e6
    path = args.out / (device_name(device).replace(" ", "_").replace("/", "_") + ".csv")

    def write(df: pd.DataFrame) -> None:
        df = df.copy()
        for col in {c for cols in SHAPE_COLUMNS.values() for c in cols} | {"H"}:
            if col in df:  # whole numbers, blank where the op has no such column
                df[col] = df[col].astype("Int64")
        args.out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, df.to_csv(index=False))

    print(f"timing {', '.join(ops)} on {device_name(device)} for {args.seconds:g} s",
          file=sys.stderr)
    df = measure(args.data, device, seconds=args.seconds, per_op=args.per_op, seed=args.seed,
                 repeats=args.repeats, shapes_from=args.shapes_from, ops=ops, models=models,
                 max_elements=max_elements, model_max_elements=model_max_elements, write=write,
                 log=lambda s: print(s, file=sys.stderr))
    write(df)
    by = df.groupby(["Family", "Pass"]).size() if len(df) else pd.Series(dtype=int)
    print(f"wrote {path}: {len(df)} rows" + "".join(f"\n  {f} {p}: {n}" for (f, p), n in by.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
