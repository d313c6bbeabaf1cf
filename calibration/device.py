"""Who the local device is, as the engine needs to know it.

A calibration's measurements are scaled by a ratio of model predictions, so the
engine needs the device the measurements came from as a GPU feature row
(columns ``G_*`` of ``predictor.kernels.layout``):

- a CUDA GPU is looked up in the GPU database by its reported name (and its
  SM count, to tell apart variants that share a name); its spec id is what
  ``predict(..., gpu=)`` takes;
- a CPU is not in the database: its id is ``"cpu"`` and its row is built from
  what is measured here — the peak FP32 rate of a large matmul, the bandwidth
  of a large triad (``a = b + s * c``) and the fixed cost of one tiny op (the
  dispatcher and allocator overhead every op pays).
"""

from __future__ import annotations

import math
import os
import platform
import statistics
import time
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from predictor.errors import InvalidArgumentError, UnknownGPUError
from predictor.kernels import layout as L

CPU_ID = "cpu"


@dataclass
class DeviceInfo:
    """The device a calibration was measured on."""

    kind: str                  # "cpu" | "cuda"
    id: str                    # spec id usable as predict(gpu=...); "cpu" for a CPU
    name: str                  # what the device calls itself
    features: np.ndarray = field(repr=False)  # origin feature row (layout G_*)
    threads: int = 1           # torch intra-op threads during the measurement
    peak_gflops: float | None = None    # measured (CPU)
    bandwidth_gbs: float | None = None  # measured (CPU)
    op_overhead_us: float | None = None  # measured fixed cost of one op (CPU)
    # Fresh memory: allocations at least this large are mapped anew by the C
    # allocator on every call (glibc: above its mmap threshold) and pay a page
    # fault per page on first touch; measured cost per MiB (CPU).
    alloc_threshold_bytes: float | None = None
    alloc_us_per_mib: float | None = None
    clock: str = "wall"        # timer the CPU measurements used

    @property
    def is_cpu(self) -> bool:
        return self.kind == "cpu"

    def to_json(self) -> dict:
        out = asdict(self)
        # By column name, so that a file outlives a change of the column layout.
        out["features"] = {name: float(self.features[col]) for name, col in feature_columns().items()}
        return out

    @staticmethod
    def from_json(data: dict) -> "DeviceInfo":
        data = dict(data)
        named = data.pop("features")
        if not isinstance(named, dict):
            raise ValueError("device features must be a table of G_* columns")
        feats = np.zeros(L.N_GPU_FEATURES)
        missing = []
        for name, col in feature_columns().items():
            if name in named:
                feats[col] = float(named[name])
            else:
                missing.append(col)
        if missing and data.get("kind") == "cuda":
            # Columns added since the file was written: the database knows them.
            from predictor import hardware

            try:
                ref = hardware.get(str(data.get("id"))).features
                feats[missing] = ref[missing]
            except UnknownGPUError:
                pass
        if not np.all(np.isfinite(feats)) or feats[L.G_SMS] <= 0 or feats[L.G_MEM_BW_GBS] <= 0:
            raise ValueError("device feature row is not finite and positive")
        known = set(DeviceInfo.__dataclass_fields__)
        return DeviceInfo(features=feats, **{k: v for k, v in data.items() if k in known})


def feature_columns() -> dict[str, int]:
    """The GPU feature columns by name (``G_SMS`` -> its column)."""
    return {k: v for k, v in vars(L).items()
            if k.startswith("G_") and isinstance(v, int) and 0 <= v < L.N_GPU_FEATURES}


def resolve_device(device=None) -> torch.device:
    """None -> the first CUDA device when there is one, else the CPU."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise InvalidArgumentError(f"unknown device {device!r} ({exc})") from None
    if dev.type not in ("cpu", "cuda"):
        raise InvalidArgumentError(f"calibration runs on 'cpu' or 'cuda', not {dev.type!r}")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise InvalidArgumentError("device 'cuda' requested but this torch sees no CUDA GPU")
    return dev


def probe(device: torch.device, spec_id: str | None = None, clock: str = "wall") -> DeviceInfo:
    """Identify (and for a CPU, measure) the device."""
    if device.type == "cuda":
        return _probe_cuda(device, spec_id)
    return _probe_cpu(clock)


# --------------------------------------------------------------------- CUDA --

def _probe_cuda(device: torch.device, spec_id: str | None) -> DeviceInfo:
    from predictor import hardware

    props = torch.cuda.get_device_properties(device)
    db = hardware.database()
    if spec_id is not None:
        gpu = db.get(spec_id)
    else:
        gpu = match_gpu(props.name, props.multi_processor_count, props.total_memory / 2**30)
        if gpu is None:
            raise UnknownGPUError(
                f"this GPU ({props.name}, {props.multi_processor_count} SMs) is not in the spec "
                "database; add it with a spec file (`--spec`) and pass its id as spec_id= "
                "(CLI: --spec-id)")
    return DeviceInfo(kind="cuda", id=gpu.id, name=props.name, features=gpu.features.copy(),
                      threads=torch.get_num_threads())


def match_gpu(name: str, sms: int | None = None, memory_gib: float | None = None):
    """The database GPU a CUDA device name denotes, or None. Names such as
    'NVIDIA H100 80GB HBM3' or 'Tesla V100-PCIE-32GB' are matched by alias
    first, then by the SM count and memory size among the GPUs whose id or
    name shares the model number."""
    import re

    from predictor import hardware

    db = hardware.database()
    for cand in (name, re.sub(r"^(NVIDIA|Tesla|AMD)\s+", "", name)):
        try:
            gpu = db.get(cand)
        except UnknownGPUError:
            continue
        if sms is None or int(gpu.features[L.G_SMS]) == sms:
            return gpu
    model = re.search(r"\b([A-Z]{1,3}\d{2,4}[A-Z]?)\b", name.upper())
    if model is None:
        return None
    key = model.group(1)
    scored = []
    for gpu in db:
        text = f"{gpu.id} {gpu.name} {' '.join(gpu.spec.get('aliases', []))}".upper()
        if key not in re.split(r"[^A-Z0-9]+", text):
            continue
        score = 0.0
        if sms is not None:
            score += abs(gpu.features[L.G_SMS] - sms) * 10
        if memory_gib is not None:
            score += abs(gpu.features[L.G_MEMORY_GB] - memory_gib * 2**30 / 1e9)
        scored.append((score, gpu.id, gpu))
    if not scored:
        return None
    scored.sort(key=lambda s: (s[0], s[1]))
    best = scored[0]
    if sms is not None and int(best[2].features[L.G_SMS]) != sms:
        return None
    return best[2]


# ---------------------------------------------------------------------- CPU --

def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def _cpu_mhz() -> float:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.lower().startswith("cpu mhz"):
                    return float(line.split(":", 1)[1])
    except (OSError, ValueError):
        pass
    return 2000.0


def _ram_gb() -> float:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 1e9
    except (ValueError, OSError, AttributeError):
        return 16.0


def _median_seconds(fn, clock, repeats: int) -> float:
    fn()  # warm-up
    samples = []
    for _ in range(repeats):
        t0 = clock()
        fn()
        samples.append(clock() - t0)
    return statistics.median(samples)


def measure_cpu_peak_gflops(clock=time.perf_counter, n: int = 1536, repeats: int = 5) -> float:
    """FP32 GFLOP/s of an n x n x n matmul (the BLAS the convolutions also use)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    return 2 * n ** 3 / _median_seconds(lambda: torch.mm(a, b), clock, repeats) / 1e9


def measure_cpu_bandwidth_gbs(clock=time.perf_counter, elems: int = 1 << 24,
                              repeats: int = 5) -> float:
    """GB/s of a STREAM-style triad a = b + s * c over arrays far larger than the
    caches (3 x 64 MiB by default)."""
    a, b, c = torch.empty(elems), torch.rand(elems), torch.rand(elems)
    seconds = _median_seconds(lambda: torch.add(b, c, alpha=0.5, out=a), clock, repeats)
    return 3 * 4 * elems / seconds / 1e9


def measure_op_overhead_us(clock=time.perf_counter, calls: int = 2000) -> float:
    """Microseconds one tiny out-of-place op costs (dispatch + allocation)."""
    x, y = torch.ones(4), torch.ones(4)
    for _ in range(100):
        torch.add(x, y)
    samples = []
    for _ in range(5):
        t0 = clock()
        for _ in range(calls):
            torch.add(x, y)
        samples.append((clock() - t0) / calls)
    return statistics.median(samples) * 1e6


# glibc's largest dynamic mmap threshold on 64-bit systems (4 MiB x sizeof(long)):
# in a loop that frees what it allocates, smaller blocks come back from the heap.
GLIBC_MMAP_THRESHOLD_MAX = 32 * 2**20


def allocator_threshold_bytes() -> float | None:
    """Allocation size above which the C allocator maps fresh pages each time."""
    fixed = os.environ.get("MALLOC_MMAP_THRESHOLD_")
    if fixed is not None:
        try:
            return float(int(fixed))
        except ValueError:
            pass
    if platform.system() == "Linux" and platform.libc_ver()[0] == "glibc":
        return float(GLIBC_MMAP_THRESHOLD_MAX)
    return None


def measure_fresh_memory_us_per_mib(clock=time.perf_counter, mib: int = 64,
                                    repeats: int = 5) -> float:
    """Microseconds per MiB that writing into freshly mapped memory costs over
    writing into memory already mapped (page faults, zeroing). The fresh pages
    come from an anonymous mmap, as the C allocator gets them above its
    threshold: measuring through malloc would depend on what the heap holds."""
    import mmap

    nbytes = mib * 2**20
    resident = np.ones(nbytes // 4, dtype=np.float32)

    def fresh() -> None:
        region = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        view = np.frombuffer(region, dtype=np.float32)
        view.fill(1.0)
        del view
        region.close()

    t_fresh = _median_seconds(fresh, clock, repeats)
    t_reused = _median_seconds(lambda: resident.fill(1.0), clock, repeats)
    return max(t_fresh - t_reused, 0.0) / mib * 1e6


def cpu_features(peak_gflops: float, bandwidth_gbs: float, threads: int) -> np.ndarray:
    """A feature row describing a CPU to the per-op model: one "SM" per thread
    (so wave quantization never bites and the roofline terms rule), every
    dtype at the measured FP32 rate (no tensor cores)."""
    f = np.zeros(L.N_GPU_FEATURES)
    tflops = max(peak_gflops, 1e-3) / 1e3
    f[L.G_SMS] = max(threads, 1)
    f[L.G_CLOCK_MHZ] = _cpu_mhz()
    f[L.G_MEM_BW_GBS] = max(bandwidth_gbs, 1e-3)
    f[L.G_L2_MB] = 1.0
    for col in (L.G_FP32_TFLOPS, L.G_TF32_TFLOPS, L.G_FP16_TFLOPS, L.G_BF16_TFLOPS,
                L.G_FP8_TFLOPS):
        f[col] = tflops
    f[L.G_FP64_TFLOPS] = tflops / 2
    f[L.G_MAX_THREADS_SM] = 2048
    f[L.G_MAX_BLOCKS_SM] = 32
    f[L.G_REGS_SM] = 65536
    f[L.G_SMEM_SM_KB] = 96
    f[L.G_MEMORY_GB] = _ram_gb()
    f[L.G_FFMA_ISSUE] = 1.0
    return f


def _probe_cpu(clock: str) -> DeviceInfo:
    from predictor.calibration.measure import host_clock

    now = host_clock(clock)
    threads = torch.get_num_threads()
    peak = measure_cpu_peak_gflops(now)
    bw = measure_cpu_bandwidth_gbs(now)
    overhead = measure_op_overhead_us(now)
    threshold = allocator_threshold_bytes()
    fresh = measure_fresh_memory_us_per_mib(now) if threshold is not None else None
    if not all(math.isfinite(v) and v > 0 for v in (peak, bw, overhead)):
        raise RuntimeError("CPU peak measurement returned a non-positive value")
    return DeviceInfo(kind="cpu", id=CPU_ID, name=cpu_name(), features=cpu_features(peak, bw, threads),
                      threads=threads, peak_gflops=peak, bandwidth_gbs=bw,
                      op_overhead_us=overhead, alloc_threshold_bytes=threshold,
                      alloc_us_per_mib=fresh, clock=clock)
