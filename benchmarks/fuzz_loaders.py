"""Fuzz every file loader for a bounded time.

    python -m benchmarks.fuzz_loaders --seconds 600                  # all loaders
    python -m benchmarks.fuzz_loaders --seconds 120 --targets onnx,graph
    python -m benchmarks.fuzz_loaders --engine atheris --seconds 300  # pip install atheris

Loaders: ONNX models (``predictor.trace("x.onnx")``), GPU spec files
(``hardware.load_specs``), saved graphs (``Graph.load``), calibration files
(``predictor.calibration.file.load``), price files (``search.load_prices``)
and Hugging Face configs (``predictor.trace("config.json")``).
Inputs are valid seed files (built here, small) mutated two ways: structure-
aware (a dim set to 0, -1 or 2^62; an op renamed; an input rewired into a
cycle; a spec field set to NaN; an array cast to another dtype ...) and raw
bytes (flips, truncation, splices); hostile names (rich markup, mathtext,
terminal escapes, 100k characters), nesting beyond the parsers' recursion
limit, absurd memory-profile and calibration numbers, absurd prices; and, once
per target, special files (a FIFO, /dev/zero through a link, a folder). Every
input must either load, and then
predict a finite positive time, or raise a one-line ``PredictorError`` that
names the file, within ``--case-timeout`` seconds. Anything else is a
finding: an exception from deep inside, a multi-line or anonymous message, a
non-finite prediction, a hang, or the process dying (each target runs in a
child process, so a segfault or abort is caught and its input kept).

Findings go to ``--out`` (one ``.bin`` input plus a ``.txt`` report each);
every one found so far is a regression test: its input is in ``tests/data/fuzz/``
and ``tests/test_robustness.py::test_fuzz_regressions`` replays it (the round-two
inputs, ``*-r2-*``, also ``tests/test_hostile.py`` with the field each refusal names).
The default engine is hypothesis (mutations drawn, failures shrunk); atheris
(coverage-guided libFuzzer) drives the same mutations from its byte stream.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import math
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

TARGETS = ("onnx", "spec", "graph", "calibration", "prices", "sizes", "cache", "hfconfig")
INTERESTING_INTS = (0, 1, -1, 2, 3, 7, 1009, 2**15, 2**31 - 1, 2**31, 2**32, 2**40, 2**62,
                    -2**31, -2**63)
INTERESTING_FLOATS = (0.0, -0.0, -1.0, 1e-300, 1e308, float("inf"), float("-inf"),
                      float("nan"), 0.5, 1e20)
# Names that once crashed or garbled the output: rich markup, mathtext, terminal
# control sequences, a name longer than any line.
HOSTILE_STRINGS = ("[/x]", "D$\\foo$", "\x1b[2J\x1b]0;T\x07", "<script>x</script>", "x" * 100_000)
# Deeper than the parsers' recursion limit (tomllib and json recurse per level).
DEEP = 5000


class Finding(Exception):
    """An input a loader handled badly."""


# ------------------------------------------------------------ choices ----

class Chooser:
    """What the mutators draw from: a hypothesis `data`, an atheris byte stream,
    or a seeded random generator."""

    def __init__(self, draw_int):
        self._int = draw_int

    def int(self, lo: int, hi: int) -> int:
        return self._int(lo, hi)

    def choice(self, seq):
        seq = list(seq)
        return seq[self.int(0, len(seq) - 1)]

    def chance(self, k: int = 2) -> bool:
        return self.int(0, k - 1) == 0

    def bytes(self, n: int) -> bytes:
        return bytes(self.int(0, 255) for _ in range(n))


def random_chooser(seed: int) -> Chooser:
    rng = random.Random(seed)
    return Chooser(lambda lo, hi: rng.randint(lo, hi))


# ------------------------------------------------------------ seeds ----

def _seed_onnx(work: Path) -> list[bytes]:
    """Small valid models: a conv net, an MLP, a transformer block with shape
    arithmetic, an LSTM (exported by torch.onnx)."""
    import warnings

    import torch

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(50, 16)
            self.qkv = torch.nn.Linear(16, 48)
            self.out = torch.nn.Linear(16, 16)
            self.norm = torch.nn.LayerNorm(16)

        def forward(self, ids):
            x = self.emb(ids)
            b, s, _ = x.shape
            q, k, v = self.qkv(x).view(b, s, 3, 2, 8).permute(2, 0, 3, 1, 4)
            att = torch.softmax(q @ k.transpose(-1, -2) / 8 ** 0.5, -1)
            y = (att @ v).transpose(1, 2).reshape(b, s, 16)
            return self.norm(x + torch.nn.functional.gelu(self.out(y)))

    class LSTM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = torch.nn.LSTM(8, 16)
            self.fc = torch.nn.Linear(16, 4)

        def forward(self, x):
            return self.fc(self.lstm(x)[0])

    models = [
        (torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8),
                             torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                             torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                             torch.nn.Linear(8, 10)),
         (torch.randn(2, 3, 16, 16),), {0: "batch"}),
        (torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Dropout(0.1),
                             torch.nn.Linear(64, 10), torch.nn.LogSoftmax(-1)),
         (torch.randn(2, 32),), {0: "batch"}),
        (Block(), (torch.zeros(2, 5, dtype=torch.long),), {0: "batch", 1: "seq"}),
        (LSTM(), (torch.randn(6, 2, 8),), {0: "seq", 1: "batch"}),
    ]
    out = []
    for i, (m, args, dyn) in enumerate(models):
        path = work / f"seed{i}.onnx"
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            torch.onnx.export(m, args, str(path), dynamo=False, input_names=["x"],
                              output_names=["y"], dynamic_axes={"x": dyn}, opset_version=17,
                              training=torch.onnx.TrainingMode.TRAINING)
        out.append(path.read_bytes())
    return out


def _seed_spec(work: Path) -> list[bytes]:
    from importlib import resources

    text = resources.files("predictor.specs").joinpath("gpus.toml").read_text()
    blocks = text.split("[[gpu]]")
    small = "[[gpu]]".join(blocks[:3])  # the header and two GPUs
    minimal = ("[[gpu]]\nid = 'X1'\nsms = 80\nboost_clock_mhz = 1500\nmemory_bw_gbs = 900\n"
               "memory_gb = 32\nfp32_tflops = 15.7\naliases = ['x one']\n")
    return [small.encode(), minimal.encode()]


def _small_graph(work: Path):
    from predictor.frontend.onnx import trace_onnx

    path = work / "seed0.onnx"
    if not path.exists():
        path.write_bytes(_seed_onnx(work)[0])
    return trace_onnx(path, batch_size=4)


def _seed_graph(work: Path) -> list[bytes]:
    g = _small_graph(work)
    g.save(work / "seed.npz")
    out = [(work / "seed.npz").read_bytes()]
    g.mode = "inference"
    g.save(work / "seed2.npz")
    return out + [(work / "seed2.npz").read_bytes()]


def _seed_calibration(work: Path) -> list[bytes]:
    from predictor import hardware
    from predictor.calibration.device import DeviceInfo
    from predictor.calibration.file import Calibration, graph_fingerprint

    g = _small_graph(work)
    n = len(g.ops)
    dev = DeviceInfo(kind="cuda", id="T4", name="Tesla T4", features=hardware.get("T4").features)
    cal = Calibration(model=g.name, fingerprint=graph_fingerprint(g), device_info=dev,
                      batch_sizes=np.array([4], dtype=np.int64),
                      measured_us=np.linspace(1.0, 50.0, n)[None, :],
                      iteration_ms=np.array([2.0]), ops_ms=np.array([1.5]),
                      unmeasured_ms=np.array([0.0]),
                      settings={"torch": __import__("torch").__version__})
    cal.save(work / "seed.cal.npz")
    return [(work / "seed.cal.npz").read_bytes()]


def _seed_prices(work: Path) -> list[bytes]:
    return [b"[prices]\nT4 = 0.35\n\"H100-SXM5-80GB\" = 2.49\n",
            json.dumps({"A100-SXM4-80GB": 1.8, "L4": 0.7}).encode()]


def _seed_sizes(work: Path) -> list[bytes]:
    """Batch sizes (the CLI's -b syntax) on line 1, a sequence length on line 2."""
    return [b"8\n4\n", b"1,2,4..1024\n16\n", b"2147483648\n2147483648\n"]


# A cache entry: one selector byte (which cache), then the entry's bytes.
CACHE_KINDS = ("graph", "numba-index", "numba-data")


def _seed_cache(work: Path) -> list[bytes]:
    from predictor import cache

    g = _small_graph(work)
    out = []
    for identity in ("m", "another model"):
        key = cache.graph_key(identity, batch_size=4, seq_len=None, mode="train", optimizer=None)
        path = cache.store(key, g, "case", work / "graph-cache")
        out.append(bytes([0]) + path.read_bytes())
        path.unlink()
    folder = _numba_cache(work)
    for p in sorted(folder.glob("memory._round_up-*")):
        out.append(bytes([1 if p.suffix == ".nbi" else 2]) + p.read_bytes())
    return out


def _seed_hfconfig(work: Path) -> list[bytes]:
    """Hugging Face config.json files of a small causal LM and a small BERT."""
    qwen = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 64,
            "intermediate_size": 128, "num_hidden_layers": 6, "num_attention_heads": 2,
            "num_key_value_heads": 1, "max_position_embeddings": 512, "vocab_size": 1000,
            "rope_theta": 10000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16"}
    bert = {"architectures": ["BertForMaskedLM"], "model_type": "bert", "hidden_size": 64,
            "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
            "max_position_embeddings": 128, "vocab_size": 500}
    return [json.dumps(qwen).encode(), json.dumps(bert).encode()]


SEEDS = {"onnx": _seed_onnx, "spec": _seed_spec, "graph": _seed_graph,
         "calibration": _seed_calibration, "prices": _seed_prices, "sizes": _seed_sizes,
         "cache": _seed_cache, "hfconfig": _seed_hfconfig}
SUFFIX = {"onnx": ".onnx", "spec": ".toml", "graph": ".npz", "calibration": ".npz",
          "prices": ".toml", "sizes": ".txt", "cache": ".bin", "hfconfig": ".json"}


# ------------------------------------------------------------ mutators ----

def mutate_bytes(data: bytes, c: Chooser) -> bytes:
    b = bytearray(data)
    for _ in range(c.int(1, 4)):
        op = c.int(0, 5)
        n = len(b)
        if op == 0 and n:                       # flip bits
            i = c.int(0, n - 1)
            b[i] ^= 1 << c.int(0, 7)
        elif op == 1 and n:                     # interesting byte
            b[c.int(0, n - 1)] = c.choice((0, 1, 0x7F, 0x80, 0xFF))
        elif op == 2:                           # truncate
            b = b[:c.int(0, n)]
        elif op == 3:                           # insert random bytes
            i = c.int(0, n)
            b[i:i] = c.bytes(c.int(1, 16))
        elif op == 4 and n:                     # duplicate a chunk
            i = c.int(0, n - 1)
            j = c.int(i, min(n, i + 256))
            b[j:j] = b[i:j]
        elif op == 5 and n:                     # delete a chunk
            i = c.int(0, n - 1)
            del b[i:c.int(i, min(n, i + 64))]
    return bytes(b)


def _interesting_int(c: Chooser, old: int = 0) -> int:
    return c.choice(INTERESTING_INTS + (old + 1, old - 1, old * 1009))


def mutate_onnx(data: bytes, c: Chooser) -> bytes:
    import onnx

    m = onnx.ModelProto()
    m.ParseFromString(data)
    g = m.graph
    names = [i.name for i in g.input] + [i.name for i in g.initializer] + \
        [o for n in g.node for o in n.output]
    ops = ["Relu", "Conv", "MatMul", "Gemm", "Reshape", "Transpose", "Softmax", "Gather",
           "Concat", "Slice", "LSTM", "BatchNormalization", "LayerNormalization", "Loop", "If",
           "NonZero", "Einsum", "Resize", "Expand", "Split", "TopK", "NoSuchOp", "Attention",
           *HOSTILE_STRINGS]
    for _ in range(c.int(1, 3)):
        op = c.int(0, 10)
        if op == 0 and len(g.input):            # an input dim
            dims = c.choice(g.input).type.tensor_type.shape.dim
            if len(dims):
                d = c.choice(dims)
                if c.chance():
                    d.dim_value = _interesting_int(c, d.dim_value)
                else:
                    d.dim_param = c.choice(("batch", "other", ""))
        elif op == 1 and len(g.initializer):    # an initializer's dims
            init = c.choice(g.initializer)
            if len(init.dims):
                init.dims[c.int(0, len(init.dims) - 1)] = _interesting_int(c)
            else:
                init.dims.append(_interesting_int(c))
        elif op == 2 and len(g.node):           # rename an op
            node = c.choice(g.node)
            node.op_type = c.choice(ops)
        elif op == 3 and len(g.node):           # rewire an input (cycles, self-loops)
            node = c.choice(g.node)
            if len(node.input):
                node.input[c.int(0, len(node.input) - 1)] = c.choice(names + ["", "ghost"])
        elif op == 4 and len(g.node):           # an int attribute
            node = c.choice(g.node)
            ints = [a for a in node.attribute if a.type in (onnx.AttributeProto.INT,
                                                            onnx.AttributeProto.INTS)]
            if ints:
                a = c.choice(ints)
                if a.type == onnx.AttributeProto.INT:
                    a.i = _interesting_int(c, a.i)
                elif len(a.ints):
                    a.ints[c.int(0, len(a.ints) - 1)] = _interesting_int(c)
        elif op == 5:                           # the opset / IR version
            if c.chance() and len(m.opset_import):
                m.opset_import[0].version = c.choice((1, 6, 12, 13, 17, 20, 23, 99, 0))
            else:
                m.ir_version = c.choice((0, 1, 3, 8, 10, 99))
        elif op == 6 and len(g.node) > 1:       # drop or duplicate a node
            i = c.int(0, len(g.node) - 1)
            if c.chance():
                del g.node[i]
            else:
                g.node.append(g.node[i])
        elif op == 7:                           # element types
            target = c.choice(list(g.input) + list(g.output)) if len(g.input) else None
            if target is not None:
                target.type.tensor_type.elem_type = c.int(0, 25)
        elif op == 8 and len(g.initializer):    # initializer data
            init = c.choice(g.initializer)
            if c.chance():
                init.raw_data = init.raw_data[:c.int(0, len(init.raw_data))]
            else:
                init.data_type = c.int(0, 25)
        elif op == 9 and len(g.node):           # swap two nodes (order)
            i, j = c.int(0, len(g.node) - 1), c.int(0, len(g.node) - 1)
            a, b = onnx.NodeProto(), onnx.NodeProto()
            a.CopyFrom(g.node[i])
            b.CopyFrom(g.node[j])
            g.node[i].CopyFrom(b)
            g.node[j].CopyFrom(a)
        elif op == 10 and len(g.output):        # outputs
            g.output[0].name = c.choice(names + ["ghost"])
    return m.SerializeToString()


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(i) for i in v) + "]"
    return json.dumps(str(v))


def mutate_spec(data: bytes, c: Chooser) -> bytes:
    import tomllib

    try:
        doc = tomllib.loads(data.decode())
    except Exception:  # noqa: BLE001 - a mutated seed: fall back to bytes
        return mutate_bytes(data, c)
    gpus = doc.get("gpu") or [{}]
    for _ in range(c.int(1, 3)):
        gpu = c.choice(gpus)
        keys = list(gpu) or ["sms"]
        key = c.choice(keys + ["dies", "aliases", "max_threads_per_sm", "max_blocks_per_sm"])
        op = c.int(0, 4)
        if op == 0:
            gpu.pop(key, None)
        elif op == 1:
            gpu[key] = c.choice(INTERESTING_FLOATS)
        elif op == 2:
            gpu[key] = _interesting_int(c)
        elif op == 3:
            gpu[key] = c.choice(("", "x", [], [1, 2], ["a", 3], True, *HOSTILE_STRINGS,
                                 list(HOSTILE_STRINGS[:3])))
        else:
            gpus.append(dict(gpu))
    if c.chance(8):  # arrays nested beyond the parser's recursion limit
        return b"x = " + b"[" * DEEP + b"]" * DEEP + b"\n" + data
    lines = []
    for gpu in gpus:
        lines.append("[[gpu]]")
        lines += [f"{json.dumps(str(k))} = {_toml_value(v)}" for k, v in gpu.items()
                  if not isinstance(v, dict)]
    return "\n".join(lines).encode()


def mutate_npz(data: bytes, c: Chooser) -> bytes:
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except Exception:  # noqa: BLE001
        return mutate_bytes(data, c)
    for _ in range(c.int(1, 3)):
        key = c.choice(sorted(arrays))
        a = arrays[key]
        op = c.int(0, 4)
        if key == "header" and op < 3 and c.chance(8):  # nested beyond json's recursion limit
            arrays[key] = np.frombuffer(b"[" * DEEP + b"]" * DEEP, dtype=np.uint8)
        elif key == "header" and op < 3:
            try:
                header = json.loads(a.tobytes().decode())
                _mutate_json(header, c)
                arrays[key] = np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)
            except Exception:  # noqa: BLE001
                arrays[key] = np.frombuffer(mutate_bytes(a.tobytes(), c), dtype=np.uint8)
        elif op == 0 and a.size:
            flat = a.reshape(-1).copy()
            i = c.int(0, flat.size - 1)
            with contextlib.suppress(OverflowError, ValueError):
                flat[i] = c.choice(INTERESTING_FLOATS) if a.dtype.kind == "f" \
                    else _interesting_int(c) % (1 << 62) * c.choice((1, -1))
            arrays[key] = flat.reshape(a.shape)
        elif op == 1:
            arrays[key] = a.astype(c.choice((np.float64, np.int32, np.uint8, np.bool_)))
        elif op == 2:
            arrays[key] = a.reshape(-1)[:c.int(0, a.size)]
        elif op == 3:
            arrays.pop(key)
        else:
            arrays[key] = np.zeros((c.int(0, 3),) * c.int(0, 3), dtype=a.dtype)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def _mutate_json(obj, c: Chooser, depth: int = 0) -> None:
    if isinstance(obj, dict) and obj:
        key = c.choice(sorted(obj, key=str))
        if depth < 4 and isinstance(obj[key], (dict, list)) and c.chance():
            _mutate_json(obj[key], c, depth + 1)
        elif key == "n_steps" or key == "phase_marks":  # the memory kernel's sizes
            obj[key] = c.choice((2**40, -1, 2**22 + 1, {"__tuple__": ["x", 3]},
                                 {"__tuple__": [30, 5]}, {"__tuple__": [1, 2, 3, 4]}, "x"))
        else:
            obj[key] = c.choice((None, -1, 0, 2**62, 1e308, -1e6, -5, float("nan"),
                                 float("inf"), "x", [], {}, True, [1, "a"], *HOSTILE_STRINGS))
    elif isinstance(obj, list) and obj:
        i = c.int(0, len(obj) - 1)
        if depth < 4 and isinstance(obj[i], (dict, list)) and c.chance():
            _mutate_json(obj[i], c, depth + 1)
        else:
            obj[i] = c.choice((None, -1, 0, 2**62, "x", {}))


def mutate_prices(data: bytes, c: Chooser) -> bytes:
    """A price set to an absurd number or a hostile name, or nesting beyond
    the parsers' recursion limit."""
    if c.chance(4):
        return b"T4 = " + b"[" * DEEP + b"]" * DEEP if data.startswith(b"[") \
            else b"[" * DEEP + b"]" * DEEP
    value = c.choice(INTERESTING_FLOATS)
    name = c.choice(("T4", *HOSTILE_STRINGS[:4]))
    if data.lstrip().startswith(b"{"):
        return json.dumps({name: value if math.isfinite(value) else str(value)}).encode()
    return f"{json.dumps(name)} = {_toml_value(value)}\n".encode()


def mutate_sizes(data: bytes, c: Chooser) -> bytes:
    """A batch list or sequence length out of range, negative, huge, or not a number."""
    lines = data.decode(errors="replace").split("\n") + ["", ""]
    huge = str(c.choice((2**31 + 1, 2**37, 2**42, 2**52, 2**62, 2**63, 2**64, 10**30,
                         10**4000)))
    value = c.choice([*(str(v) for v in INTERESTING_INTS), huge, f"1..{huge}", f"{huge}..1",
                      "1e308", "nan", "0x10", "-0", " 8 ", "8,,16", "..", *HOSTILE_STRINGS[:3]])
    line = c.int(0, 1)
    if c.chance():
        lines[line] = value
    else:
        lines[line] = f"{lines[line]},{value}"
    return "\n".join(lines[:2]).encode()


def mutate_cache(data: bytes, c: Chooser) -> bytes:
    kind, body = data[:1], data[1:]
    if kind == b"\0":
        return kind + mutate_npz(body, c)
    # A numba entry: truncated, emptied, or a pickle of something else in front.
    return kind + c.choice((body[:c.int(0, max(len(body) - 1, 0))], b"",
                            b"\x80\x04\x95" + body, body + body))


def mutate_hfconfig(data: bytes, c: Chooser) -> bytes:
    """A field of the config set to an absurd value, or nesting beyond the
    parser's recursion limit."""
    if c.chance(8):
        return b"[" * DEEP + b"]" * DEEP
    doc = json.loads(data)
    _mutate_json(doc, c)
    return json.dumps(doc).encode()


STRUCTURED = {"onnx": mutate_onnx, "spec": mutate_spec, "graph": mutate_npz,
              "calibration": mutate_npz, "prices": mutate_prices, "sizes": mutate_sizes,
              "cache": mutate_cache, "hfconfig": mutate_hfconfig}


def make_input(target: str, seeds: list[bytes], c: Chooser) -> bytes:
    data = c.choice(seeds)
    if c.int(0, 3):
        try:
            data = STRUCTURED[target](data, c)
        except Exception:  # noqa: BLE001 - a mutation that does not apply
            pass
    if c.chance(3):
        data = mutate_bytes(data, c)
    return data


# ------------------------------------------------------------ the oracle ----

@contextlib.contextmanager
def time_limit(seconds: float):
    def boom(signum, frame):
        raise TimeoutError(f"no answer within {seconds:g} s")

    old = signal.signal(signal.SIGALRM, boom)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _clean_names(names, what: str) -> None:
    from predictor.io import printable

    for name in names:
        if printable(name) != name:
            raise Finding(f"{what}: a name with control characters or {len(name):,} characters "
                          f"is kept: {printable(name, 60)}")


def _finite_positive(ms: float, what: str) -> None:
    if not (math.isfinite(ms) and ms > 0):
        raise Finding(f"{what}: predicted {ms!r} ms")


def run_loader(target: str, path: Path, work: Path) -> None:
    """Load `path` with the target's loader and use what it returns."""
    import predictor
    from predictor import hardware

    if target == "onnx":
        for mode in ("train", "inference"):
            g = predictor.trace(str(path), batch_size=3, seq_len=4, mode=mode)
            _clean_names([g.name, *g.unsupported, *g.ops.op_names], "onnx")
            _finite_positive(predictor.predict(g, "T4").iteration_ms, f"onnx {mode}")
    elif target == "spec":
        try:
            gpus = hardware.load_specs(path)
            g = _graph_for(work)
            for gpu in gpus:
                _finite_positive(predictor.predict(g, gpu, batch_size=4).iteration_ms,
                                 f"spec {gpu.id}")
        finally:
            hardware._user_gpus.clear()
    elif target == "graph":
        from predictor.optable import Graph

        g = Graph.load(path)
        _clean_names([g.name, *g.unsupported, *g.ops.op_names], "graph")
        _finite_positive(predictor.predict(g, "A100-SXM4-80GB").iteration_ms, "graph")
        if g.memory is not None:
            g.memory.breakdown(8)
    elif target == "calibration":
        from predictor.calibration.file import load

        g = _graph_for(work)
        cal = load(path, g)
        targets = [cal.device] if cal.is_cpu else [cal.device, "A100-SXM4-80GB"]
        for gpu in targets:
            for b in (1, 4, 1 << 20):
                _finite_positive(predictor.predict(g, gpu, batch_size=b,
                                                   calibration=cal).iteration_ms,
                                 f"calibration on {gpu} at batch {b}")
    elif target == "prices":
        from predictor.design_search import load_prices

        for k, v in load_prices(path).items():
            if not (math.isfinite(v) and 0 <= v <= 1e6):
                raise Finding(f"price {k[:40]!r} = {v!r} accepted")
    elif target == "hfconfig":
        g = predictor.trace(str(path), batch_size=3, seq_len=8)
        _clean_names([g.name, *g.unsupported, *g.ops.op_names], "hfconfig")
        _finite_positive(predictor.predict(g, "T4").iteration_ms, "hfconfig")
    elif target == "sizes":
        _run_sizes(path, work)
    elif target == "cache":
        _run_cache(path, work)


class _Refused(Exception):
    """A one-line refusal that is not a PredictorError (argparse's), already checked."""


def _run_sizes(path: Path, work: Path) -> None:
    """Batch sizes and a sequence length as the CLI parses them (-b, --seq-len)
    and as the Python API takes them: refused in one line, or predicted
    finite, positive, with memory that grows with the batch (never saturates)."""
    import argparse

    from predictor import engine, limits
    from predictor.commands.common import parse_batch_sizes, seq_len_arg
    from predictor.errors import PredictorError

    from predictor.io import read_regular

    text = read_regular(path, 1 << 20, "sizes file").decode(errors="replace")
    lines = (text.split("\n") + ["", ""])[:2]
    g = _graph_for(work)
    try:
        batches = parse_batch_sizes(lines[0])
    except argparse.ArgumentTypeError as exc:
        _one_line(str(exc), "-b")
        batches = []
    if any(b > limits.MAX_BATCH_SIZE for b in batches):
        raise Finding(f"-b accepted {max(batches)} (above 2**31)")
    if batches:
        res = engine.sweep(g, ["T4"], batches)
        t = res.phase_ms.sum(axis=-1)[0]
        if not np.all(np.isfinite(t)) or not np.all(t > 0):
            raise Finding(f"sweep at {batches[:4]}...: times {t[:4]}")
        if res.memory_bytes is not None and np.any(np.diff(res.memory_bytes[0]) < 0):
            raise Finding(f"memory falls with the batch at {batches}")
    if lines[1].strip():
        try:
            seq = seq_len_arg(lines[1])
        except argparse.ArgumentTypeError as exc:
            _one_line(str(exc), "--seq-len")
            seq = None
        if seq is not None and seq > limits.MAX_SEQ_LEN:
            raise Finding(f"--seq-len accepted {seq}")
    # The Python entry points take the raw numbers.
    for token in lines[0].replace("..", ",").split(","):
        try:
            b = int(token.strip())
        except ValueError:
            continue
        try:
            p = engine.predict(g, "T4", batch_size=b)
        except PredictorError as exc:
            _one_line(str(exc), "predict")
            continue
        if not 0 < b <= limits.MAX_BATCH_SIZE:
            raise Finding(f"predict accepted batch_size={b}")
        _finite_positive(p.iteration_ms, f"predict at batch {b}")


def _one_line(msg: str, what: str) -> None:
    if "\n" in msg.strip() or "\x1b" in msg or len(msg) > 4000:
        raise Finding(f"{what}: a refusal of {len(msg):,} characters or several lines: "
                      f"{msg[:300]!r}")


def _numba_cache(work: Path) -> Path:
    """A private kernel cache under work/xdg, filled by one child process;
    returns its folder."""
    xdg = work / "xdg"
    if not (xdg / "dnn-predictor").exists():
        _kernel_child(xdg)
    (folder,) = (xdg / "dnn-predictor" / "numba").iterdir()
    return folder


_KERNEL_CHILD = (
    "import warnings; warnings.simplefilter('always');"
    "warnings.formatwarning = lambda m, c, f, l, line=None: f'{c.__name__}: {m}\\n';"
    "from predictor.kernels import memory; print(memory._round_up(3, 512))")


def _kernel_child(xdg: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    return subprocess.run([sys.executable, "-c", _KERNEL_CHILD], capture_output=True, text=True,
                          timeout=600, env={**env, "XDG_CACHE_HOME": str(xdg)})


def _run_cache(path: Path, work: Path) -> None:
    """A damaged or planted cache entry: a graph-cache entry must load as the
    key's own graph or be a miss with a one-line warning; a numba entry must
    leave the next process working, with one-line CacheWarnings at most."""
    import warnings

    from predictor import cache

    from predictor.io import read_regular

    data = read_regular(path, 1 << 30, "cache entry")
    kind, body = (data[0] % len(CACHE_KINDS)) if data else 0, data[1:]
    if CACHE_KINDS[kind] == "graph":
        key = cache.graph_key("m", batch_size=4, seq_len=None, mode="train", optimizer=None)
        folder = work / "graph-cache"
        folder.mkdir(exist_ok=True)
        cache._file(key, "case", folder).write_bytes(body)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            g = cache.load(key, "case", folder)
        for w in caught:
            _one_line(str(w.message), "graph cache warning")
        if g is not None:
            from predictor.optable import load_graph_meta

            if load_graph_meta(cache._file(key, "case", folder))[1].get(cache.KEY_FIELD) != key:
                raise Finding("graph cache: an entry of another key was used")
            _finite_positive(__import__("predictor").predict(g, "T4").iteration_ms, "cache")
        return
    folder = _numba_cache(work)
    suffix = ".nbi" if CACHE_KINDS[kind] == "numba-index" else ".nbc"
    for p in folder.glob(f"memory._round_up-*{suffix}"):
        p.write_bytes(body)
    proc = _kernel_child(work / "xdg")
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    if proc.returncode != 0 or proc.stdout.strip() != "512" or \
            any(not x.startswith("CacheWarning: ") for x in lines):
        raise Finding(f"numba cache entry ({CACHE_KINDS[kind]}): exit {proc.returncode}, "
                      f"stderr {proc.stderr[-300:]!r}")


_GRAPH = None


def _graph_for(work: Path):
    global _GRAPH
    if _GRAPH is None:
        _GRAPH = _small_graph(work)
    return _GRAPH


def check(target: str, data: bytes, work: Path, timeout: float) -> None:
    """Raise Finding when the loader mishandles `data`."""
    path = work / f"case{SUFFIX[target]}"
    path.write_bytes(data)
    check_path(target, path, work, timeout)


def check_path(target: str, path: Path, work: Path, timeout: float) -> None:
    """Raise Finding when the loader mishandles the file at `path`."""
    from predictor.errors import PredictorError

    try:
        with time_limit(timeout):
            run_loader(target, path, work)
    except PredictorError as exc:
        msg = str(exc)
        if "\n" in msg.strip():
            raise Finding(f"multi-line error: {msg[:300]!r}") from exc
        if "\x1b" in msg or len(msg) > 4000:
            raise Finding(f"raw control characters or {len(msg):,} characters in the error: "
                          f"{msg[:300]!r}") from exc
        if target in ("sizes", "cache"):
            pass  # not a file the user named: the numbers or the cache are the subject
        elif path.name not in msg and target != "spec" or (target == "spec" and path.name
                                                              not in msg and "GPU" not in msg):
            raise Finding(f"the error does not name the file: {msg[:300]!r}") from exc
    except Finding:
        raise
    except TimeoutError as exc:
        raise Finding(f"hang: {exc}") from exc
    except RecursionError as exc:
        raise Finding("RecursionError") from exc
    except BaseException as exc:  # noqa: BLE001 - that is the point
        if isinstance(exc, KeyboardInterrupt):
            raise
        tb = traceback.format_exc(limit=-4)
        raise Finding(f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}\n{tb}") from exc


# ------------------------------------------------------------ engines ----

SPECIAL_FILES = ("fifo", "dev-zero-link", "dev-null-link", "folder")


def make_special_file(path: Path, kind: str) -> None:
    """Create at `path` one of SPECIAL_FILES: a FIFO, a folder, or a symlink
    to /dev/zero or /dev/null."""
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    else:
        path.symlink_to("/dev/zero" if kind == "dev-zero-link" else "/dev/null")


def check_special_files(target: str, work: Path, timeout: float) -> list[str]:
    """Every loader refuses a FIFO (would hang), /dev/zero or a link to it
    (would read forever), a folder; returns the findings."""
    import shutil

    findings = []
    for kind in SPECIAL_FILES:
        path = work / f"special-{kind}{SUFFIX[target]}"
        if path.is_symlink() or path.exists():
            shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
        make_special_file(path, kind)
        try:
            check_path(target, path, work, timeout)
        except Finding as exc:
            findings.append(f"{kind}: {exc}")
    return findings


def _record(out: Path, target: str, data: bytes, report: str) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    key = hashlib.sha1(report.split("\n")[0].encode() + target.encode()).hexdigest()[:10]
    stem = out / f"{target}-{key}"
    if not stem.with_suffix(".bin").exists():
        stem.with_suffix(".bin").write_bytes(data)
        stem.with_suffix(".txt").write_text(f"target: {target}\n{report}\n")
    return stem


# Modules whose coverage guides atheris: the loaders and validators. (Not the
# numba kernels, which cannot compile instrumented code, nor torch and numpy,
# which would take longer to instrument than most runs.)
LOADER_MODULES = ("predictor.frontend.onnx_load", "predictor.frontend.onnx_ops",
                  "predictor.frontend.onnx", "predictor.optable", "predictor.hardware",
                  "predictor.calibration.file", "predictor.design_search")


def _instrument_loaders() -> None:
    import importlib
    import inspect

    import atheris

    for name in LOADER_MODULES:
        with contextlib.suppress(ImportError):
            module = importlib.import_module(name)
            for obj in list(vars(module).values()):
                if inspect.isfunction(obj) and obj.__module__ == name:
                    atheris.instrument_func(obj)
                elif inspect.isclass(obj) and obj.__module__ == name:
                    for member in vars(obj).values():
                        fn = getattr(member, "__func__", member)
                        if inspect.isfunction(fn):
                            atheris.instrument_func(fn)


def worker(target: str, seconds: float, engine: str, out: Path, timeout: float,
           seed: int) -> int:
    """Fuzz one target until the time is up; returns the number of cases run."""
    work = Path(tempfile.mkdtemp(prefix=f"fuzz-{target}-"))
    if engine == "atheris":
        _instrument_loaders()
    seeds = SEEDS[target](work)
    current = out / f"current-{target}.bin"
    out.mkdir(parents=True, exist_ok=True)
    # Warm up on the valid seeds (numba compiles or loads its cache on the
    # first prediction): the case timeout is for the loaders, not the JIT.
    for data in seeds:
        with contextlib.suppress(Finding):
            check(target, data, work, timeout=600)
    deadline = time.monotonic() + seconds
    stats = {"cases": 0, "findings": 0}
    for finding in check_special_files(target, work, timeout):
        stats["findings"] += 1
        stem = _record(out, target, b"", f"special file: {finding}")
        print(f"[{target}] finding -> {stem}.txt: {finding.splitlines()[0][:160]}", flush=True)

    def one(data: bytes) -> None:
        current.write_bytes(data)  # kept if the process dies on this input
        stats["cases"] += 1
        check(target, data, work, timeout)

    def record(data: bytes, exc: Finding) -> None:
        stats["findings"] += 1
        stem = _record(out, target, data, str(exc))
        print(f"[{target}] finding -> {stem}.txt: {str(exc).splitlines()[0][:160]}",
              flush=True)

    if engine == "atheris":
        import atexit

        import atheris

        # libFuzzer ends the process itself at -max_total_time.
        atexit.register(lambda: print(f"[{target}] {stats['cases']} cases, "
                                      f"{stats['findings']} findings", flush=True))

        def test_one(buf: bytes) -> None:
            fdp = atheris.FuzzedDataProvider(buf)
            c = Chooser(lambda lo, hi: fdp.ConsumeIntInRange(lo, hi))
            data = make_input(target, seeds, c)
            try:
                one(data)
            except Finding as exc:
                record(data, exc)

        atheris.Setup([sys.argv[0], f"-max_total_time={max(int(seconds), 1)}",
                       "-rss_limit_mb=8192", f"-artifact_prefix={out}/"], test_one)
        atheris.Fuzz()
    elif engine == "hypothesis":
        from hypothesis import HealthCheck, Phase, given, settings
        from hypothesis import strategies as st

        from hypothesis.errors import HypothesisException

        # Chunks of 20 examples; the time budget is checked between chunks (a
        # check inside the test would make hypothesis's replays inconsistent).
        @settings(max_examples=20, deadline=None, database=None, derandomize=False,
                  suppress_health_check=list(HealthCheck), phases=[Phase.generate, Phase.shrink])
        @given(st.data())
        def prop(data):
            c = Chooser(lambda lo, hi: data.draw(st.integers(lo, hi)))
            buf = make_input(target, seeds, c)
            try:
                one(buf)
            except Finding as exc:
                exc.input = buf
                raise

        while time.monotonic() < deadline:
            try:
                prop()
            except Finding as exc:
                record(exc.input, exc)
            except HypothesisException as exc:  # e.g. a flaky replay: not the loaders' fault
                print(f"[{target}] hypothesis: {type(exc).__name__}", flush=True)
    else:  # plain random: no shrinking, fastest
        i = seed
        while time.monotonic() < deadline:
            data = make_input(target, seeds, random_chooser(i))
            i += 1
            try:
                one(data)
            except Finding as exc:
                record(data, exc)
    current.unlink(missing_ok=True)
    print(f"[{target}] {stats['cases']} cases, {stats['findings']} findings", flush=True)
    return stats["cases"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=300, help="total time budget")
    ap.add_argument("--targets", default=",".join(TARGETS))
    ap.add_argument("--engine", choices=("hypothesis", "atheris", "random"), default="hypothesis")
    ap.add_argument("--out", type=Path,
                    default=Path(tempfile.gettempdir()) / "dnn-predictor-fuzz",
                    help="where findings go (default: %(default)s)")
    ap.add_argument("--case-timeout", type=float, default=30.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args.worker, args.seconds, args.engine, args.out, args.case_timeout, args.seed)
        return 0
    targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    bad = [t for t in targets if t not in TARGETS]
    if bad:
        ap.error(f"unknown target(s) {bad}; choose from {', '.join(TARGETS)}")
    share = args.seconds / max(len(targets), 1)
    crashes = 0
    for target in targets:
        end = time.monotonic() + share
        restarts = 0
        while time.monotonic() < end - 1 and restarts < 20:
            cmd = [sys.executable, "-m", "benchmarks.fuzz_loaders", "--worker", target,
                   "--seconds", f"{end - time.monotonic():.1f}", "--engine", args.engine,
                   "--out", str(args.out), "--case-timeout", str(args.case_timeout),
                   "--seed", str(args.seed + restarts * 100003)]
            proc = subprocess.run(cmd, env={**os.environ, "PYTHONWARNINGS": "ignore"})
            current = args.out / f"current-{target}.bin"
            if proc.returncode == 0 or not current.exists():
                current.unlink(missing_ok=True)
                break
            # The worker died on an input: keep it as a hard-crash finding.
            crashes += 1
            data = current.read_bytes()
            stem = _record(args.out, target, data,
                           f"the process died (exit status {proc.returncode})")
            print(f"[{target}] process died (status {proc.returncode}) -> {stem}.bin", flush=True)
            current.unlink()
            restarts += 1
    findings = sorted(args.out.glob("*.txt")) if args.out.exists() else []
    print(f"done: {len(findings)} finding(s) in {args.out} ({crashes} process deaths)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
