"""The GPU database: load ``specs/gpus.toml`` (and user spec files), resolve
names and aliases, and hand the engine a feature matrix (one row per GPU,
columns in ``predictor.kernels.layout``)."""

from __future__ import annotations

import difflib
import functools
import math
import re
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from predictor.errors import InvalidArgumentError, SpecError, UnknownGPUError
from predictor.io import MiB, printable, read_text
from predictor.kernels import layout as L
from predictor.kernels.clocks import sustained_clock
from predictor.kernels.precision import GEFORCE_TC_FRACTION, TC_FRACTION
from predictor.kernels.roofline import FFMA_ISSUE_SHARE

# Fields every GPU needs for a prediction, with the feature column they fill.
REQUIRED = {
    "sms": L.G_SMS,
    "boost_clock_mhz": L.G_CLOCK_MHZ,
    "memory_bw_gbs": L.G_MEM_BW_GBS,
    "memory_gb": L.G_MEMORY_GB,
    "fp32_tflops": L.G_FP32_TFLOPS,
}
# Optional fields and the value used when a spec leaves them out.
OPTIONAL = {
    "l2_mb": (L.G_L2_MB, 4.0),
    "tf32_tflops": (L.G_TF32_TFLOPS, None),   # None: same as fp32
    "fp16_tflops": (L.G_FP16_TFLOPS, None),
    "bf16_tflops": (L.G_BF16_TFLOPS, None),
    "fp64_tflops": (L.G_FP64_TFLOPS, None),
    "fp8_tflops": (L.G_FP8_TFLOPS, None),
    "max_threads_per_sm": (L.G_MAX_THREADS_SM, 2048),
    "max_blocks_per_sm": (L.G_MAX_BLOCKS_SM, 32),
    "registers_per_sm": (L.G_REGS_SM, 65536),
    "shared_mem_per_sm_kb": (L.G_SMEM_SM_KB, 96),
    "tdp_w": (L.G_TDP_W, 300),
    # Not measured: the median of the GPUs that were (precision.TC_FRACTION).
    "tensor_core_matmul_fraction": (L.G_TC_FRACTION, TC_FRACTION),
}

# The GPUs `predictor predict` shows when none are named.
DEFAULT_GPUS = ("T4", "L4", "A10G", "V100-SXM2-32GB", "A100-SXM4-80GB", "H100-SXM5-80GB",
                "H200-SXM-141GB")


@dataclass(frozen=True)
class GPU:
    id: str
    name: str
    vendor: str
    features: np.ndarray = field(repr=False, compare=False)
    spec: dict = field(repr=False, compare=False)

    @property
    def memory_gb(self) -> float:
        return float(self.features[L.G_MEMORY_GB])

    @property
    def price_per_hour(self) -> float | None:
        """Cloud on-demand USD per GPU-hour (the default price basis); None when unknown."""
        return self.price("cloud").usd_per_hour

    def price(self, basis: str = "cloud") -> "Price":
        """This GPU's price on one basis (PRICE_BASES): cloud on-demand or marketplace."""
        if basis not in PRICE_BASES:
            from predictor.errors import InvalidArgumentError

            raise InvalidArgumentError(f"price basis must be one of {', '.join(PRICE_BASES)}, "
                                       f"got {basis!r}")
        prefix = PRICE_BASES[basis][0]
        usd = self.spec.get(f"{prefix}_usd_per_hour")
        source = self.spec.get(f"{prefix}_source")
        return Price(basis, None if usd is None else float(usd), self.spec.get(f"{prefix}_date"),
                     source, isinstance(source, str) and source.startswith("ESTIMATE"))

    def __getitem__(self, key: str) -> Any:
        return self.spec[key]


# Price bases: the spec fields' prefix and how the basis is described.
PRICE_BASES = {
    "cloud": ("price", "cloud on-demand"),
    "marketplace": ("marketplace", "marketplace"),
}


@dataclass(frozen=True)
class Price:
    """One GPU's price on one basis: USD per GPU-hour (None: not known on
    that basis), its date (YYYY-MM) and source; `estimate` when the source
    says it was not read from a live listing."""

    basis: str
    usd_per_hour: float | None
    date: str | None
    source: str | None
    estimate: bool


def _normalise(name: str) -> str:
    """Case- and punctuation-insensitive key: 'Tesla V100-PCIE-32GB' == 'tesla v100 pcie 32gb'."""
    return re.sub(r"[\s_\-]+", "", str(name).strip().lower())


# Physically possible ranges (generous: 100x beyond any GPU made). A value
# outside them is a typo or a hostile file, and would overflow the integer
# arithmetic of the kernels (an SM count of 1e20 is not a GPU).
_RANGES = {
    "sms": (1, 1e5), "boost_clock_mhz": (1, 1e5), "memory_bw_gbs": (1e-3, 1e7),
    "memory_gb": (1e-3, 1e7), "l2_mb": (1e-3, 1e6), "max_threads_per_sm": (32, 1e5),
    "max_blocks_per_sm": (1, 1e4), "registers_per_sm": (1024, 1e8),
    "shared_mem_per_sm_kb": (1, 1e6), "tensor_core_matmul_fraction": (0.05, 2.0),
}
_TFLOPS_RANGE = (1e-6, 1e7)
# Optional numbers other modules read (prices, all-reduce bandwidth): when
# present they must be usable numbers too.
_OTHER_NUMBERS = {"price_usd_per_hour": (0, 1e6), "marketplace_usd_per_hour": (0, 1e6),
                  "interconnect_gbs": (1e-3, 1e7),
                  "nvlink_bridge_gbs": (0, 1e7), "tdp_w": (0, 1e6)}
_WHOLE = {"sms", "max_threads_per_sm", "max_blocks_per_sm", "registers_per_sm"}


def _number(spec: dict, key: str, where: str) -> float:
    value = spec[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value <= 0:
        raise SpecError(f"{where}: field '{key}' must be a positive number, got {value!r}")
    lo, hi = _RANGES.get(key, _TFLOPS_RANGE if key.endswith("_tflops") else (0, math.inf))
    if not lo <= value <= hi:
        raise SpecError(f"{where}: field '{key}' = {value!r} is outside the possible range "
                        f"{lo:g}..{hi:g}")
    if key in _WHOLE and value != int(value):
        raise SpecError(f"{where}: field '{key}' must be a whole number, got {value!r}")
    return float(value)


# GPU names are printed in tables, plots and messages: one line of text.
MAX_NAME_CHARS = 100


def _check_name(value: str, key: str, where: str) -> None:
    if len(value) > MAX_NAME_CHARS:
        raise SpecError(f"{where}: field '{key}' is {len(value):,} characters long "
                        f"(at most {MAX_NAME_CHARS})")
    if printable(value) != value:
        raise SpecError(f"{where}: field '{key}' has control characters: {printable(value)}")


def chip_key(architecture, sms) -> float:
    """An exact integer (as float) naming a chip: boards of one architecture
    and SM count (an A100 PCIe 40GB and 80GB) run the same kernels the same
    way. 0 when the architecture is not known."""
    if not isinstance(architecture, str) or not architecture.strip():
        return 0.0
    import zlib

    return float(1 + zlib.crc32(f"{architecture.strip().lower()}:{int(sms)}".encode()))


def _check_compute_capability(value, where: str) -> None:
    """A spec's compute_capability: absent, a version such as "8.0" (or 8.0,
    8) between 1 and 99, or a vendor's target name such as "gfx942"; a
    number outside that (inf, nan, -1, a boolean) is an error naming the
    entry."""
    if value is None:
        return
    bad = isinstance(value, bool) or not isinstance(value, (str, int, float))
    if not bad:
        try:
            number = float(value)
        except ValueError:
            number = None  # a target name: no NVIDIA version
        bad = number is not None and not (1.0 <= number < 100.0)  # NaN fails too
    if bad:
        raise SpecError(f"{where}: field 'compute_capability' must be a version such as "
                        f"\"8.0\" (or a target name such as \"gfx942\"), got {value!r}")


def cc_major(compute_capability) -> int:
    """The major of a compute capability ("8.0", 8.0 or 8); 0 when there is
    none (an AMD gfx target: the GEMM tile rule then knows no architecture of
    it)."""
    try:
        return int(float(compute_capability))
    except (TypeError, ValueError, OverflowError):
        return 0


def pre_volta(spec: dict) -> float:
    """1.0 for an NVIDIA GPU of compute capability below 7.0 (Pascal and
    older SMs; see layout.G_PRE_VOLTA), else 0.0 (AMD too: its vector L1
    caches global loads)."""
    if str(spec.get("vendor", "nvidia")).lower() != "nvidia":
        return 0.0
    major = cc_major(spec.get("compute_capability"))
    return 1.0 if 0 < major < 7 else 0.0


def ffma_issue_share(spec: dict) -> float:
    """The share of the FP32 peak a GEMM's FFMA loop can issue (see
    roofline.FFMA_ISSUE_SHARE): below 1 on NVIDIA SMs from compute
    capability 7.0 whose four schedulers each feed 32 FP32 lanes (128 per
    SM: GA10x, AD10x, Hopper, Blackwell), 1 everywhere else (Volta, Turing
    and GA100 feed 16 lanes a scheduler; Maxwell and Pascal dual-issue; AMD
    and specs without the fields)."""
    if str(spec.get("vendor", "nvidia")).lower() != "nvidia":
        return 1.0
    try:
        cc = float(str(spec.get("compute_capability")))
        lanes = float(spec.get("fp32_cores_per_sm"))
    except (TypeError, ValueError):
        return 1.0
    return FFMA_ISSUE_SHARE if cc >= 7.0 and lanes / 4.0 >= 32.0 else 1.0


def is_geforce(spec: dict) -> bool:
    """Whether a spec names an NVIDIA GeForce board (by its marketed name)."""
    return str(spec.get("vendor", "nvidia")).lower() == "nvidia" \
        and "geforce" in str(spec.get("name", "")).lower()


def _gpu_from_spec(spec: dict, where: str) -> GPU:
    if not isinstance(spec, dict):
        raise SpecError(f"{where}: each [[gpu]] entry must be a table")
    gid = spec.get("id")
    if not isinstance(gid, str) or not gid.strip():
        raise SpecError(f"{where}: a [[gpu]] entry has no 'id'")
    _check_name(gid, "id", f"{where} [{printable(gid)}]")
    where = f"{where} [{gid}]"
    missing = [k for k in REQUIRED if k not in spec]
    if missing:
        raise SpecError(f"{where}: missing required field(s) {', '.join(missing)}")
    _check_compute_capability(spec.get("compute_capability"), where)
    f = np.zeros(L.N_GPU_FEATURES)
    for key, col in REQUIRED.items():
        f[col] = _number(spec, key, where)
    for key, (col, default) in OPTIONAL.items():
        if key in spec:
            f[col] = _number(spec, key, where)
        elif default is not None:
            f[col] = default
        else:
            f[col] = f[L.G_FP32_TFLOPS]
    if "tensor_core_matmul_fraction" not in spec and is_geforce(spec) \
            and spec.get("tensor_cores", True):
        # Not measured, GeForce: the measured GeForce boards' median, not the
        # others' (their rated fp32-accumulate tensor peak is a half-rate one
        # they all run above; precision.GEFORCE_TC_FRACTION).
        f[L.G_TC_FRACTION] = GEFORCE_TC_FRACTION
    if "fp64_tflops" not in spec:
        f[L.G_FP64_TFLOPS] = f[L.G_FP32_TFLOPS] / 32
    if spec.get("bf16_supported", True) is False:
        # No bf16 tensor cores: bf16 math runs at most at the fp32 rate.
        f[L.G_BF16_TFLOPS] = min(f[L.G_BF16_TFLOPS], f[L.G_FP32_TFLOPS])
    if str(spec.get("vendor", "nvidia")).lower() == "amd":
        # PyTorch on ROCm: no TF32/xf32 for fp32 convolutions or matmuls by
        # default (the allow_tf32 switches do not turn it on); rocBLAS and
        # MIOpen run fp32 on the matrix cores at the fp32 matrix rate.
        fp32 = _number(spec, "fp32_matrix_tflops", where) if "fp32_matrix_tflops" in spec \
            else f[L.G_FP32_TFLOPS]
        f[L.G_FP32_TFLOPS] = f[L.G_TF32_TFLOPS] = fp32
    # Multi-die packages (MI250: 2 GCDs) appear to PyTorch as one device per die.
    dies = spec.get("dies", 1)
    if isinstance(dies, bool) or not isinstance(dies, int) or not 1 <= dies <= f[L.G_SMS]:
        raise SpecError(f"{where}: field 'dies' must be a whole number from 1 to the SM count, "
                        f"got {dies!r}")
    for key, (lo, hi) in _OTHER_NUMBERS.items():
        value = spec.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not lo <= value <= hi):  # NaN fails too
            raise SpecError(f"{where}: field '{key}' must be a number in {lo:g}..{hi:g}, "
                            f"got {value!r}")
    aliases = spec.get("aliases", [])
    if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
        raise SpecError(f"{where}: field 'aliases' must be a list of names, got {aliases!r}")
    for a in aliases:
        _check_name(a, "aliases", where)
    for key in ("name", "vendor"):
        if key in spec:
            if not isinstance(spec[key], str):
                raise SpecError(f"{where}: field '{key}' must be text, got "
                                f"{printable(repr(spec[key]))}")
            _check_name(spec[key], key, where)
    if dies > 1:
        for col in (L.G_SMS, L.G_MEM_BW_GBS, L.G_MEMORY_GB, L.G_FP32_TFLOPS, L.G_TF32_TFLOPS,
                    L.G_FP16_TFLOPS, L.G_BF16_TFLOPS, L.G_FP64_TFLOPS, L.G_FP8_TFLOPS):
            f[col] /= dies
    f[L.G_CHIP] = chip_key(spec.get("architecture"), f[L.G_SMS])
    f[L.G_FFMA_ISSUE] = ffma_issue_share(spec)
    f[L.G_CC_MAJOR] = cc_major(spec.get("compute_capability"))
    f[L.G_PRE_VOLTA] = pre_volta(spec)
    return GPU(id=gid, name=str(spec.get("name", gid)), vendor=str(spec.get("vendor", "nvidia")),
               features=f, spec=dict(spec))


def _parse(text: str, where: str) -> list[GPU]:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"{where}: not a valid TOML spec file ({exc})") from exc
    except RecursionError:  # tomllib recurses once per nested array or table
        raise SpecError(f"{where}: not a GPU spec file (arrays or tables nested too deeply)") \
            from None
    entries = data.get("gpu")
    if not isinstance(entries, list) or not entries:
        raise SpecError(f"{where}: no [[gpu]] tables found")
    return [_gpu_from_spec(e, where) for e in entries]


class GPUDatabase:
    """GPUs by id, with alias lookup and close-name suggestions."""

    def __init__(self, gpus: Iterable[GPU]):
        self._gpus: dict[str, GPU] = {}
        self._index: dict[str, str] = {}
        for gpu in gpus:
            self.add(gpu)

    def add(self, gpu: GPU) -> None:
        """Add (or replace, for a user spec with the same id) one GPU."""
        old = self._gpus.get(gpu.id)
        if old is not None:
            self._index = {k: v for k, v in self._index.items() if v != old.id}
        self._gpus[gpu.id] = gpu
        for name in [gpu.id, gpu.name, *gpu.spec.get("aliases", [])]:
            self._index[_normalise(name)] = gpu.id

    def ids(self) -> list[str]:
        return list(self._gpus)

    def __iter__(self):
        return iter(self._gpus.values())

    def __len__(self) -> int:
        return len(self._gpus)

    def get(self, name: str | GPU) -> GPU:
        if isinstance(name, GPU):
            return name
        limited = _POWER_LIMIT.match(str(name).strip())
        if limited:
            return power_limited(self.get(limited["name"]), float(limited["watts"]))
        gid = self._index.get(_normalise(name))
        if gid is None:
            close = difflib.get_close_matches(_normalise(name), list(self._index), n=8, cutoff=0.4)
            ids = list(dict.fromkeys(self._index[c] for c in close))[:5]
            hint = f"; did you mean {', '.join(ids)}?" if ids else ""
            raise UnknownGPUError(
                f"unknown GPU {name!r}{hint} (`predictor gpus` lists all {len(self)})")
        return self._gpus[gid]

    def resolve(self, names: str | Iterable[str] | None) -> list[GPU]:
        """'all', a comma-separated string, or a list -> GPUs (default set for None)."""
        if names is None:
            return [self._gpus[g] for g in DEFAULT_GPUS if g in self._gpus]
        if isinstance(names, str):
            if names.strip().lower() == "all":
                return list(self._gpus.values())
            names = [n for n in names.split(",") if n.strip()]
        out = [self.get(n.strip() if isinstance(n, str) else n) for n in names]
        if not out:
            raise UnknownGPUError("no GPU named; give ids such as H100-SXM5-80GB or 'all'")
        return list(dict.fromkeys(out))

    def features(self, gpus: list[GPU]) -> np.ndarray:
        return np.ascontiguousarray(np.stack([g.features for g in gpus]))


def _with_twin_fractions(gpus: list[GPU], pool: Iterable[GPU]) -> list[GPU]:
    """`gpus`, each without a measured tensor-core fraction of its own taking
    a twin's: a GPU of `pool` of the same chip (architecture and SM count)
    whose spec has one, at the clock this board's power sustains by the
    cube-root rule of kernels.clocks, the twin taken to run at its rated
    boost: ``fraction x min(b_t, b_o x (w_t / w_o)^(1/3)) / b_t``, w the board
    power per SM. An RTX 6000 Ada (300 W) gets the L40S's (350 W) 0.743 x 0.956
    = 0.710, an L40 (300 W) 0.714; a board with no measured twin keeps the
    default `_gpu_from_spec` gave it (precision.TC_FRACTION, or a GeForce
    board's GEFORCE_TC_FRACTION)."""
    measured = [g for g in pool if "tensor_core_matmul_fraction" in g.spec
                and g.features[L.G_CHIP] != 0.0]
    out = []
    for g in gpus:
        f = g.features
        twins = [t for t in measured if t.features[L.G_CHIP] == f[L.G_CHIP] and t.id != g.id]
        if "tensor_core_matmul_fraction" in g.spec or not twins \
                or not (f[L.G_TDP_W] > 0 and f[L.G_CLOCK_MHZ] > 0):
            out.append(g)
            continue
        # The twin nearest in board power: its clock says the most about this one's.
        o = min(twins, key=lambda t: (abs(t.features[L.G_TDP_W] - f[L.G_TDP_W]), t.id)).features
        # (plain Python: the database loads without compiling a kernel)
        sustained = sustained_clock.py_func(f[L.G_CLOCK_MHZ], f[L.G_TDP_W] / f[L.G_SMS],
                                            o[L.G_CLOCK_MHZ], o[L.G_TDP_W] / o[L.G_SMS])
        row = f.copy()
        row[L.G_TC_FRACTION] = o[L.G_TC_FRACTION] * sustained / f[L.G_CLOCK_MHZ]
        out.append(GPU(id=g.id, name=g.name, vendor=g.vendor, features=row, spec=g.spec))
    return out


# The lowest power limit taken, as a share of the board's rated power: below
# it the cube-root clock law is far outside what was checked, and drivers
# refuse limits that low (an H100 SXM's floor is 200 of its 700 W).
POWER_LIMIT_MIN_SHARE = 0.25
# "GPU@300W": a GPU id or alias at a power limit (watts).
_POWER_LIMIT = re.compile(r"^(?P<name>.*?\S)\s*@\s*(?P<watts>[0-9]+(?:\.[0-9]*)?)\s*w$",
                          re.IGNORECASE)


def has_power_limit(name) -> bool:
    """Whether a GPU name carries a power limit ("T4@50W")."""
    return isinstance(name, str) and _POWER_LIMIT.match(name.strip()) is not None


def power_limited(gpu: GPU, watts: float) -> GPU:
    """`gpu` run under a power limit of `watts` (``nvidia-smi -pl``, or a
    cluster's cap): id ``<id>@<watts>W``, its row's G_POWER_LIMIT_W set. The
    SM clock falls under the limit, and its compute throughput with it
    (fp32 GEMMs and convolutions, tensor cores; kernels.clocks.
    power_limit_share: the cube root of the power, or the chip's measured
    clock record where the op models have one); memory bandwidth and
    memory-bound kernels stay, since DRAM does not run on the SM clock. Limits
    from a quarter of the rated power up to the rated power are taken; above
    it the clock a board would sustain is not known."""
    rated = float(gpu.features[L.G_TDP_W])
    if not (isinstance(watts, (int, float)) and not isinstance(watts, bool)
            and math.isfinite(watts)):
        raise InvalidArgumentError(f"power limit must be a number of watts, got {watts!r}")
    if rated <= 0:
        raise InvalidArgumentError(f"{gpu.id} has no rated board power to limit")
    if gpu.features[L.G_POWER_LIMIT_W] > 0:
        raise InvalidArgumentError(f"{gpu.id} is already under a power limit: give one limit")
    lo = POWER_LIMIT_MIN_SHARE * rated
    if not lo <= watts <= rated:
        raise InvalidArgumentError(
            f"power limit {watts:g} W for {gpu.id} is outside {lo:g}-{rated:g} W (a quarter of "
            f"its rated {rated:g} W up to the rated power)")
    if watts == rated:
        return gpu
    row = gpu.features.copy()
    row[L.G_POWER_LIMIT_W] = watts
    spec = dict(gpu.spec, power_limit_w=float(watts))
    spec.pop("aliases", None)
    return GPU(id=f"{gpu.id}@{watts:g}W", name=f"{gpu.name} at {watts:g} W", vendor=gpu.vendor,
               features=row, spec=spec)


@functools.lru_cache(maxsize=1)
def _builtin() -> tuple[GPU, ...]:
    text = resources.files("predictor.specs").joinpath("gpus.toml").read_text(encoding="utf-8")
    gpus = _parse(text, "predictor/specs/gpus.toml")
    return tuple(_with_twin_fractions(gpus, gpus))


_user_gpus: list[GPU] = []
# A spec file larger than this is not one (the built-in database is ~40 kB).
MAX_SPEC_FILE_BYTES = 16 * MiB


def database() -> GPUDatabase:
    """The built-in GPUs plus any loaded with :func:`load_specs`."""
    return GPUDatabase([*_builtin(), *_user_gpus])


def load_specs(path: str | Path) -> list[GPU]:
    """Add the GPUs of a user spec file (same TOML layout as the built-in one)."""
    p = Path(path)
    text = read_text(p, MAX_SPEC_FILE_BYTES, "GPU spec file", SpecError,
                     missing="cannot read spec file (no such file)")
    gpus = _parse(text, printable(p))
    gpus = _with_twin_fractions(gpus, [*_builtin(), *_user_gpus, *gpus])
    _user_gpus.extend(gpus)
    return gpus


def get(name: str | GPU) -> GPU:
    return database().get(name)


def has_float8(gpu: GPU) -> bool:
    """Whether the GPU has float8 tensor cores (a float8 rate at least twice
    its fp32 one, as ``precision.tensor_core_peak`` requires; a spec without
    ``fp8_tflops`` has its fp32 rate there)."""
    f = gpu.features
    return bool(f[L.G_FP8_TFLOPS] >= 1.9 * f[L.G_FP32_TFLOPS])


def float8_gpus(chosen: list[GPU], asked, warn: bool = False) -> list[GPU]:
    """The GPUs an ``amp="fp8"`` step is predicted on: of a default set or
    'all' (`asked` None or "all"), those with float8 tensor cores (with
    `warn`, a warning naming the others); GPUs named one by one must all have
    them (InvalidArgumentError naming those that do not, and the ones that
    do)."""
    lacking = [g for g in chosen if not has_float8(g)]
    if not lacking:
        return chosen
    implicit = asked is None or (isinstance(asked, str) and asked.strip().lower() == "all")
    kept = [g for g in chosen if has_float8(g)]
    if implicit and kept:
        if warn:
            import warnings

            warnings.warn(f"amp='fp8': {', '.join(g.id for g in lacking)} left out (no float8 "
                          "tensor cores)", stacklevel=4)
        return kept
    capable = [g.id for g in database() if has_float8(g)]
    raise InvalidArgumentError(
        f"amp='fp8' runs float8 GEMMs (torch._scaled_mm), which need float8 tensor cores "
        f"(compute capability 8.9 or newer, or AMD CDNA3); {', '.join(g.id for g in lacking)} "
        f"{'has' if len(lacking) == 1 else 'have'} none: choose among {', '.join(capable)}, "
        "or use amp='bf16'")


def gpus(vendor: str | None = None, extra: Iterable[GPU] = ()):
    """All known GPUs as a pandas DataFrame (one row per GPU, as PyTorch sees
    one device: a multi-die package's figures divided by its dies), with the
    price on each basis, its date and whether it is an estimate; `extra`
    (e.g. boards under a power limit, `power_limited`) after them."""
    import pandas as pd

    rows = []
    for g in [*database(), *extra]:
        if vendor and g.vendor != vendor:
            continue
        s = g.spec
        dies = s.get("dies", 1)

        def per_device(key):
            v = s.get(key)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or dies <= 1:
                return v
            return v // dies if isinstance(v, int) and v % dies == 0 else v / dies

        row = {
            "id": g.id, "name": g.name, "vendor": g.vendor,
            "architecture": s.get("architecture"), "sms": per_device("sms"),
            "memory_gb": per_device("memory_gb"), "memory_bw_gbs": per_device("memory_bw_gbs"),
            "fp32_tflops": per_device("fp32_tflops"), "tf32_tflops": per_device("tf32_tflops"),
            "fp16_tflops": per_device("fp16_tflops"), "bf16_tflops": per_device("bf16_tflops"),
            # None: no float8 tensor cores (amp="fp8" is refused there).
            "fp8_tflops": per_device("fp8_tflops") if has_float8(g) else None,
            # None: the board at its rated power (power_limited).
            "power_limit_w": s.get("power_limit_w"),
        }
        for basis, (prefix, _) in PRICE_BASES.items():
            p = g.price(basis)
            row[f"{prefix}_usd_per_hour"] = p.usd_per_hour
            row[f"{prefix}_date"] = p.date
            row[f"{prefix}_estimate"] = p.estimate if p.usd_per_hour is not None else None
        rows.append(row)
    return pd.DataFrame(rows)
