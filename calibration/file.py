"""The calibration: measured op times on one device, and the file that keeps them.

A calibration belongs to one traced graph (a fingerprint of its OpTable) and
one device (a spec id and the feature row the engine scales from). On disk it
is one ``.npz``: the measured arrays plus a JSON header that says what they
are, so the file is self-describing and readable with numpy alone:

    header            JSON (utf-8 bytes): format name and version, model,
                      graph fingerprint, device, torch / CUDA / cuDNN versions,
                      dtype settings, batch sizes, real-iteration times, the
                      overhead model, unmeasured rows, creation time
    measured_us       float64 [batch sizes, rows]  one execution of each row
                      (0: not measured; the model predicts that row)

The device's feature row is stored in the header by column name, so a file
survives a change of the feature layout.

Files are written atomically (``predictor.io``). Loading refuses, with a
one-line :class:`FileFormatError` naming the file, anything it cannot trust: a
truncated or corrupt file, another format version, a calibration made under
another torch major version (other kernels), or one made for another graph.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import io
import json
import math
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from predictor.calibration.device import DeviceInfo, feature_columns
from predictor.errors import FileFormatError
from predictor.io import MiB, atomic_writer, printable, read_regular
from predictor.kernels import layout as L

FORMAT = "dnn-predictor-calibration"
VERSION = 1

# OpTable columns that define a graph's identity (batch size excluded: one
# calibration serves every batch size of a batch-scalable graph).
_FINGERPRINT_COLUMNS = ("family", "phase", "dtype", "count", "kernels", "dbase", "dslope", "op")


def graph_fingerprint(graph) -> str:
    """A short hash of the graph's ops, the same for the same model traced at
    any batch size, different for another model, sequence length or optimizer."""
    h = hashlib.sha256()
    ops = graph.ops
    for name in _FINGERPRINT_COLUMNS:
        arr = np.array(getattr(ops, name), dtype=np.int64)
        if name in ("dbase", "dslope") and arr.ndim == 2 and arr.shape[1] > L.MEM_GENERIC:
            # Which elementwise or pooling kernel PyTorch picks
            # (layout.MEM_GENERIC, and a max pool's window elements) follows
            # from the ops themselves and changes how they are priced, not
            # what was measured: calibrations made before the columns existed
            # still match.
            fam = np.asarray(ops.family)
            arr[(fam == L.COPY) | (fam == L.ELEMENTWISE), L.MEM_GENERIC] = 0
            pool = (fam == L.POOL) | (fam == L.POOL_BWD)
            arr[pool, L.MEM_GENERIC:L.MEM_WINDOW_ELEMS + 1] = 0
        arr = np.ascontiguousarray(arr)
        h.update(name.encode())
        h.update(str(arr.shape).encode())
        h.update(arr.tobytes())
    h.update("\0".join(ops.op_names).encode())
    h.update(f"{graph.mode}|{graph.optimizer}|{graph.batch_scalable}".encode())
    if not graph.batch_scalable:
        h.update(f"|batch={graph.batch_size}".encode())
    return h.hexdigest()[:20]


def torch_major(version: str) -> int | None:
    try:
        return int(str(version).split(".")[0])
    except ValueError:
        return None


@dataclass
class OverheadModel:
    """The real iteration against the sum of its per-op times:

        real(b) = (1 + scale) * ops(b) + fixed_ms

    `fixed_ms` is what every iteration pays whatever the batch (Python,
    dispatch, launch gaps), `scale` what grows with the work (cache misses
    between ops, allocator traffic). Fitted by least squares on relative
    errors over the calibrated batch sizes (so the small batch, where the
    fixed part shows, weighs as much as the large ones); with one batch size
    `scale` is 0."""

    fixed_ms: float = 0.0
    scale: float = 0.0
    points: int = 0  # batch sizes it was fitted on (0: no real iteration measured)

    def __call__(self, ops_ms):
        ops_ms = np.asarray(ops_ms)
        # A negative fixed part (a real step faster than its per-op sum: the
        # per-op timings include a sync each) extrapolated to a smaller batch
        # could exceed the ops themselves; the step never takes less than half
        # its per-op sum, so the iteration stays positive.
        return np.maximum(self.scale * ops_ms + self.fixed_ms, -0.5 * ops_ms)

    @staticmethod
    def fit(ops_ms: np.ndarray, real_ms: np.ndarray) -> "OverheadModel":
        ok = np.isfinite(real_ms) & (real_ms > 0) & np.isfinite(ops_ms) & (ops_ms > 0)
        s, r = np.asarray(ops_ms)[ok], np.asarray(real_ms)[ok]
        if s.size == 0:
            return OverheadModel()
        if s.size == 1 or np.ptp(s) < 0.05 * s.mean():
            return OverheadModel(fixed_ms=float(np.mean(r - s)), points=int(s.size))
        slope, icpt = np.polyfit(s, r, 1, w=1.0 / r)
        # A negative fixed cost or a shrinking slope is noise, not overhead:
        # fall back to a proportional gap, which extrapolates conservatively.
        if icpt < 0 or slope <= 0:
            return OverheadModel(scale=float(np.sum(r) / np.sum(s) - 1), points=int(s.size))
        return OverheadModel(fixed_ms=float(icpt), scale=float(slope - 1), points=int(s.size))

    def to_json(self) -> dict:
        return {"fixed_ms": self.fixed_ms, "scale": self.scale, "points": self.points}


@dataclass
class Calibration:
    """Measured op times of one graph on one device (see the module docstring)."""

    model: str
    fingerprint: str
    device_info: DeviceInfo
    batch_sizes: np.ndarray          # int64 [k]
    measured_us: np.ndarray          # float64 [k, rows]; 0 = not measured
    iteration_ms: np.ndarray         # float64 [k]; real step, NaN = not measured
    ops_ms: np.ndarray               # float64 [k]; per-op sum (model for unmeasured rows)
    unmeasured_ms: np.ndarray        # float64 [k]; the model's share of ops_ms
    overhead: OverheadModel = field(default_factory=OverheadModel)
    skipped: dict[str, int] = field(default_factory=dict)   # reason -> rows
    settings: dict = field(default_factory=dict)            # torch/CUDA versions, dtypes, ...
    notes: list[str] = field(default_factory=list)          # what could not be measured, why
    created: str = ""
    path: Path | None = field(default=None, compare=False)  # where it was loaded from

    # ---- identity ---------------------------------------------------------
    @property
    def device(self) -> str:
        """The spec id of the device (``"cpu"`` for a CPU): the `gpu` argument
        of ``predict`` that reproduces the measurements."""
        return self.device_info.id

    @property
    def origin(self) -> np.ndarray:
        return self.device_info.features

    @property
    def is_cpu(self) -> bool:
        return self.device_info.is_cpu

    @property
    def rows(self) -> int:
        return int(self.measured_us.shape[1])

    @property
    def measured_rows(self) -> int:
        """Rows with a measurement at one calibrated batch size at least."""
        return int((self.measured_us > 0).any(axis=0).sum())

    def where(self) -> str:
        return str(self.path) if self.path is not None else f"calibration of {self.model}"

    def check_graph(self, graph) -> None:
        """Refuse a graph other than the one this calibration measured."""
        fp = graph_fingerprint(graph)
        if fp != self.fingerprint or len(graph.ops) != self.rows:
            raise FileFormatError(
                f"{self.where()}: calibrated for model {self.model!r} (graph {self.fingerprint}), "
                f"not for {graph.name!r} (graph {fp}); its ops differ (another model, sequence "
                f"length, dtype or optimizer): run `predictor calibrate` for this one")

    # ---- what the kernels take -------------------------------------------
    def kernel_args(self, batch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(cal_us, cal_batch, origin) for a prediction at `batch`: each row is
        scaled from its measurement at the calibrated batch size nearest to
        `batch` (in ratio), so interpolation stays local."""
        k = self.batch_sizes.shape[0]
        dist = np.abs(np.log(self.batch_sizes.astype(np.float64) / float(batch)))
        order = np.argsort(dist, kind="stable")
        cal_us = np.zeros(self.rows)
        cal_batch = np.zeros(self.rows, dtype=np.int64)
        for j in order[::-1]:  # nearest last, so it wins
            have = self.measured_us[j] > 0
            cal_us[have] = self.measured_us[j][have]
            cal_batch[have] = self.batch_sizes[j]
        assert k > 0
        return cal_us, cal_batch, np.ascontiguousarray(self.origin, dtype=np.float64)

    # ---- summaries -------------------------------------------------------
    def summary(self) -> dict:
        gap = [(float(r) - float(s)) if math.isfinite(r) else None
               for r, s in zip(self.iteration_ms, self.ops_ms)]
        return {
            "model": self.model,
            "device": self.device,
            "device_name": self.device_info.name,
            "batch_sizes": [int(b) for b in self.batch_sizes],
            "rows": self.rows,
            "measured_rows": self.measured_rows,
            "skipped": dict(self.skipped),
            "ops_ms": [float(x) for x in self.ops_ms],
            "unmeasured_ms": [float(x) for x in self.unmeasured_ms],
            "iteration_ms": [float(x) if math.isfinite(x) else None for x in self.iteration_ms],
            "gap_ms": gap,
            "overhead": self.overhead.to_json(),
            "settings": dict(self.settings),
        }

    def __repr__(self) -> str:
        bs = ",".join(str(int(b)) for b in self.batch_sizes)
        return (f"Calibration({self.model} on {self.device} ({self.device_info.name}), batch {bs}: "
                f"{self.measured_rows}/{self.rows} rows measured, per-op sum "
                f"{', '.join(f'{x:.2f}' for x in self.ops_ms)} ms, real iteration "
                f"{', '.join(f'{x:.2f}' for x in self.iteration_ms)} ms)")

    # ---- file -------------------------------------------------------------
    def header(self) -> dict:
        return {
            "format": FORMAT,
            "version": VERSION,
            "model": self.model,
            "graph_fingerprint": self.fingerprint,
            "rows": self.rows,
            "device": self.device_info.to_json(),
            "batch_sizes": [int(b) for b in self.batch_sizes],
            "iteration_ms": [float(x) if math.isfinite(x) else None for x in self.iteration_ms],
            "ops_ms": [float(x) for x in self.ops_ms],
            "unmeasured_ms": [float(x) for x in self.unmeasured_ms],
            "overhead": self.overhead.to_json(),
            "skipped": dict(self.skipped),
            "settings": dict(self.settings),
            "notes": list(self.notes),
            "created": self.created,
            "measured_us_sha256": hashlib.sha256(
                np.ascontiguousarray(self.measured_us, dtype=np.float64).tobytes()).hexdigest(),
        }

    def save(self, path) -> Path:
        """Write the calibration to `path` (.npz), atomically."""
        path = Path(path)
        text = json.dumps(self.header(), indent=1, sort_keys=True)
        with atomic_writer(path, "wb") as f:
            np.savez(f, header=np.frombuffer(text.encode("utf-8"), dtype=np.uint8),
                     measured_us=np.ascontiguousarray(self.measured_us, dtype=np.float64))
        return path


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()


# Sizes beyond which a file is not a calibration: the file itself, its JSON
# header unpacked (a few kB for a zoo model) and its measured times unpacked
# (8 bytes per row and batch size). Checked before anything is unpacked.
MAX_FILE_BYTES = 256 * MiB
MAX_HEADER_BYTES = 16 * MiB
MAX_MEASURED_BYTES = 1024 * MiB


def load(path, graph=None) -> Calibration:
    """Read a calibration file; with `graph`, also check it belongs to that graph."""
    data = io.BytesIO(read_regular(path, MAX_FILE_BYTES, "calibration file"))
    path = Path(path)
    shown = printable(path, 300)
    try:
        with zipfile.ZipFile(data) as zf:  # sizes from the zip directory, before inflating
            sizes = {i.filename: i.file_size for i in zf.infolist()}
    except (OSError, zipfile.BadZipFile, EOFError, ValueError, NotImplementedError):
        # Not a zip: numpy would try it as a pickle and say so, which reads as
        # advice to unpickle it.
        raise FileFormatError(f"{shown}: not a readable calibration file (truncated or corrupt: "
                              "not an .npz archive)") from None
    for name, cap in (("header.npy", MAX_HEADER_BYTES), ("measured_us.npy", MAX_MEASURED_BYTES)):
        if sizes.get(name, 0) > cap:
            raise FileFormatError(f"{shown}: {name[:-4]} unpacks to {sizes[name]:,} bytes, too "
                                  f"large for a calibration (at most {cap:,})")
    try:
        data.seek(0)
        with np.load(data, allow_pickle=False) as z:
            names = set(z.files)
            missing = {"header", "measured_us"} - names
            if missing:
                raise FileFormatError(f"{shown}: not a calibration file (no "
                                      f"{', '.join(sorted(missing))} inside)")
            raw_header = z["header"]
            measured = z["measured_us"]
    except FileFormatError:
        raise
    except (OSError, ValueError, EOFError, KeyError, MemoryError, NotImplementedError,
            zipfile.BadZipFile, zipfile.LargeZipFile) as exc:
        raise FileFormatError(f"{path}: not a readable calibration file (truncated or corrupt: "
                              f"{type(exc).__name__}: {_short(exc)})") from None
    try:
        header = json.loads(raw_header.tobytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, AttributeError) as exc:
        raise FileFormatError(f"{path}: corrupt calibration header ({_short(exc)})") from None
    except RecursionError:  # json recurses once per nested array or object
        raise FileFormatError(f"{path}: corrupt calibration header (nested too deeply)") \
            from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise FileFormatError(f"{path}: not a dnn-predictor calibration file")
    version = header.get("version")
    if not isinstance(version, int) or version < 1:
        raise FileFormatError(f"{path}: calibration has no valid format version ({version!r})")
    if version > VERSION:
        raise FileFormatError(f"{path}: calibration format version {version} is newer than this "
                              f"dnn-predictor reads ({VERSION}); upgrade dnn-predictor")
    if version != VERSION:
        raise FileFormatError(f"{path}: calibration format version {version} is no longer "
                              f"supported (this dnn-predictor reads {VERSION}); calibrate again")
    try:
        cal = _from_header(header, measured, path)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError) as exc:
        raise FileFormatError(f"{path}: inconsistent calibration file ({_short(exc)})") from None
    check_ranges(cal, path)
    made_with = str(cal.settings.get("torch", ""))
    if torch_major(made_with) != torch_major(torch.__version__):
        raise FileFormatError(
            f"{path}: measured under torch {made_with or '?'}, this is torch {torch.__version__}; "
            "another major version runs other kernels: calibrate again")
    if graph is not None:
        cal.check_graph(graph)
    return cal


def _from_header(header: dict, measured: np.ndarray, path: Path) -> Calibration:
    measured = np.asarray(measured, dtype=np.float64)
    batch_sizes = np.asarray(header["batch_sizes"], dtype=np.int64)
    rows = int(header["rows"])
    if measured.ndim != 2 or measured.shape != (batch_sizes.shape[0], rows) or rows < 0:
        raise ValueError(f"measured_us has shape {measured.shape}, header says "
                         f"({batch_sizes.shape[0]}, {rows})")
    if batch_sizes.ndim != 1 or batch_sizes.shape[0] == 0 or np.any(batch_sizes <= 0) \
            or np.any(batch_sizes > 2**31):
        raise ValueError("calibrated batch sizes must be whole numbers in 1..2^31")
    if not np.all(np.isfinite(measured)) or np.any(measured < 0):
        raise ValueError("measured times must be finite and non-negative")
    digest = hashlib.sha256(np.ascontiguousarray(measured).tobytes()).hexdigest()
    if header.get("measured_us_sha256") not in (None, digest):
        raise ValueError("measured times do not match their checksum")
    device = DeviceInfo.from_json(header["device"])

    def floats(key):
        vals = header[key]
        arr = np.array([np.nan if v is None else float(v) for v in vals], dtype=np.float64)
        if arr.shape != batch_sizes.shape:
            raise ValueError(f"{key} has {arr.shape[0]} values for {batch_sizes.shape[0]} batch sizes")
        return arr

    ov = header.get("overhead") or {}
    if not isinstance(ov, dict):
        raise ValueError("overhead must be a table")
    return Calibration(
        model=str(header["model"]), fingerprint=str(header["graph_fingerprint"]),
        device_info=device, batch_sizes=batch_sizes, measured_us=measured,
        iteration_ms=floats("iteration_ms"), ops_ms=floats("ops_ms"),
        unmeasured_ms=floats("unmeasured_ms"),
        overhead=OverheadModel(float(ov.get("fixed_ms", 0.0)), float(ov.get("scale", 0.0)),
                               int(ov.get("points", 0))),
        skipped={str(k): int(v) for k, v in dict(header.get("skipped", {})).items()},
        settings=dict(header.get("settings", {})), notes=list(header.get("notes", [])),
        created=str(header.get("created", "")), path=path)


# ---- physical bounds of every number in a calibration ----------------------------
# Generous (far beyond any device or model), so that no valid measurement is
# refused, and tight enough that every prediction scaled from the file stays
# finite and positive.

MAX_OP_US = 1e9           # one execution of one op: ~17 minutes
MAX_STEP_MS = 1e9         # one iteration: ~12 days
MAX_FIXED_MS = 1e6        # the fixed overhead of an iteration: ~17 minutes
MAX_SCALE = 1e3           # the real step at most 1001 x its per-op sum
_FEATURE_FIELD = {        # feature column -> the spec field whose range it has
    "G_SMS": "sms", "G_CLOCK_MHZ": "boost_clock_mhz", "G_MEM_BW_GBS": "memory_bw_gbs",
    "G_MEMORY_GB": "memory_gb", "G_FP32_TFLOPS": "fp32_tflops", "G_TF32_TFLOPS": "tf32_tflops",
    "G_FP16_TFLOPS": "fp16_tflops", "G_BF16_TFLOPS": "bf16_tflops",
}
_DEVICE_NUMBERS = {       # optional DeviceInfo numbers: (low, high, low inclusive)
    "peak_gflops": (0.0, 1e10, False), "bandwidth_gbs": (0.0, 1e7, False),
    "op_overhead_us": (0.0, 1e6, True), "alloc_threshold_bytes": (0.0, 2.0 ** 50, True),
    "alloc_us_per_mib": (0.0, 1e6, True),
}


def check_ranges(cal: Calibration, path) -> None:
    """Refuse, with a one-line FileFormatError naming the file and the field,
    any number of `cal` outside its physical range."""
    from predictor import hardware
    from predictor.kernels import layout as L

    where = printable(path, 300)

    def bad(name: str, msg: str) -> FileFormatError:
        return FileFormatError(f"{where}: field '{name}' {msg}")

    def number(name: str, value, lo: float, hi: float, lo_ok: bool = True) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
            raise bad(name, f"must be a number, got {printable(repr(value))}")
        v = float(value)
        if not (math.isfinite(v) and (lo <= v if lo_ok else lo < v) and v <= hi):
            raise bad(name, f"= {v!r} is outside the possible range {lo:g}..{hi:g}")

    m = cal.measured_us
    if m.size and float(m.max()) > MAX_OP_US:
        raise bad("measured_us", f"has {float(m.max())!r} us, beyond {MAX_OP_US:g}")
    for key in ("iteration_ms", "ops_ms", "unmeasured_ms"):
        arr = getattr(cal, key)
        vals = arr[np.isfinite(arr)] if key == "iteration_ms" else arr  # NaN: not measured
        if not np.all(np.isfinite(vals)) or (vals.size and (vals.min() < 0
                                                            or vals.max() > MAX_STEP_MS)):
            raise bad(key, f"must hold times in 0..{MAX_STEP_MS:g} ms")
    ov = cal.overhead
    # real = (1 + scale) * ops + fixed: a positive slope, and a fixed part no
    # more negative than the per-op sum it was fitted against.
    number("overhead.scale", ov.scale, -1.0, MAX_SCALE, lo_ok=False)
    lowest = -float(cal.ops_ms.max()) if cal.ops_ms.size else 0.0
    number("overhead.fixed_ms", ov.fixed_ms, max(lowest, -MAX_FIXED_MS), MAX_FIXED_MS)
    number("overhead.points", ov.points, 0, cal.batch_sizes.shape[0])

    info = cal.device_info
    if info.kind not in ("cpu", "cuda"):
        raise bad("device.kind", f"must be 'cpu' or 'cuda', got {printable(repr(info.kind))}")
    for key in ("id", "name"):
        value = getattr(info, key)
        if not isinstance(value, str) or not value or printable(value) != value:
            raise bad(f"device.{key}", f"must be one line of text, got {printable(repr(value))}")
    if (info.kind == "cpu") != (info.id == "cpu"):
        raise bad("device.kind", f"'{info.kind}' does not match device id "
                                 f"{printable(repr(info.id))} (a CPU's id is 'cpu')")
    if not isinstance(cal.model, str) or printable(cal.model) != cal.model:
        raise bad("model", f"must be one line of text, got {printable(repr(cal.model))}")
    number("device.threads", info.threads, 1, 1e5)
    for key, (lo, hi, lo_ok) in _DEVICE_NUMBERS.items():
        value = getattr(info, key)
        if value is not None:
            number(f"device.{key}", value, lo, hi, lo_ok)
    feats = info.features
    for name, col in feature_columns().items():
        field_ = _FEATURE_FIELD.get(name)
        if field_ is not None:
            lo, hi = hardware._RANGES.get(field_, hardware._TFLOPS_RANGE)
        elif col == L.G_CHIP:  # hardware.chip_key: 0 or 1 + a CRC-32
            lo, hi = 0.0, 2.0 ** 32 + 1
        else:  # columns the kernels do not divide by: 0 is allowed (not known)
            lo, hi = 0.0, 1e8
        number(f"device.features.{name}", feats[col], lo, hi)
    if info.kind == "cuda" and not 1 <= feats[L.G_SMS] == int(feats[L.G_SMS]):
        raise bad("device.features.G_SMS", f"must be a whole number, got {feats[L.G_SMS]!r}")


def _short(exc: BaseException, limit: int = 100) -> str:
    msg = " ".join(str(exc).split()) or type(exc).__name__
    return msg if len(msg) <= limit else msg[:limit - 3] + "..."
