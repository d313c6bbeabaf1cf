"""Data checks for specs/gpus.toml.

The file is read with ``tomllib`` directly (not through the project's loader)
so these checks hold whatever the loader does.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

SPECS_PATH = Path(__file__).resolve().parents[1] / "specs" / "gpus.toml"


def _load() -> list[dict]:
    with SPECS_PATH.open("rb") as fh:
        data = tomllib.load(fh)
    return data["gpu"]


GPUS = _load()
BY_ID = {g["id"]: g for g in GPUS}

REQUIRED_IDS = [
    "P4", "P100-PCIE-16GB", "P100-SXM2-16GB", "T4",
    "V100-PCIE-16GB", "V100-PCIE-32GB", "V100-SXM2-16GB", "V100-SXM2-32GB",
    "A10", "A10G", "A30", "A40",
    "A100-PCIE-40GB", "A100-PCIE-80GB", "A100-SXM4-40GB", "A100-SXM4-80GB",
    "L4", "L40S", "RTX-3090", "RTX-4090", "RTX-A6000", "RTX-6000-ADA",
    "H100-PCIE-80GB", "H100-SXM5-80GB", "H200-SXM-141GB", "B200",
    "MI100", "MI210", "MI250", "MI300X",
]

STR_FIELDS = ["id", "name", "vendor", "architecture", "compute_capability", "memory_type",
              "interconnect"]
INT_FIELDS = ["sms", "fp32_cores_per_sm", "registers_per_sm", "max_threads_per_sm",
              "max_blocks_per_sm", "max_warps_per_sm", "warp_size", "pcie_gen"]
NUM_FIELDS = ["boost_clock_mhz", "memory_gb", "memory_bw_gbs", "l2_mb",
              "fp32_tflops", "tf32_tflops", "fp16_tflops", "bf16_tflops", "fp64_tflops",
              "shared_mem_per_sm_kb", "interconnect_gbs", "tdp_w"]
OPTIONAL_INT_FIELDS = ["dies", "xcds"]
OPTIONAL_NUM_FIELDS = ["base_clock_mhz", "fp8_tflops", "fp64_tensor_tflops", "fp32_matrix_tflops",
                       "nvlink_bridge_gbs", "infinity_cache_mb"]
BOOL_FIELDS = ["tensor_cores"]
OPTIONAL_BOOL_FIELDS = ["tf32_tensor_cores", "bf16_supported", "fast_fp16"]

VENDORS = {"nvidia", "amd"}
ARCHITECTURES = {"pascal", "volta", "turing", "ampere", "ada", "hopper", "blackwell",
                 "cdna1", "cdna2", "cdna3"}


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _keys(g: dict) -> set[str]:
    return {g["id"].lower()} | {a.lower() for a in g["aliases"]}


ids = pytest.mark.parametrize("gpu", GPUS, ids=[g["id"] for g in GPUS])
NVIDIA = [g for g in GPUS if g["vendor"] == "nvidia"]
nvidia_ids = pytest.mark.parametrize("gpu", NVIDIA, ids=[g["id"] for g in NVIDIA])


def test_file_parses_and_is_an_array_of_gpu_tables():
    assert isinstance(GPUS, list) and len(GPUS) >= 27
    assert all(isinstance(g, dict) for g in GPUS)


def test_required_ids_present():
    missing = [i for i in REQUIRED_IDS if i not in BY_ID]
    assert not missing, f"missing GPUs: {missing}"


@ids
def test_required_fields_and_types(gpu):
    problems = []
    for f in STR_FIELDS:
        if not (isinstance(gpu.get(f), str) and gpu[f].strip()):
            problems.append(f"{f}: want non-empty string, got {gpu.get(f)!r}")
    for f in INT_FIELDS:
        if not (_is_int(gpu.get(f)) and gpu[f] > 0):
            problems.append(f"{f}: want positive int, got {gpu.get(f)!r}")
    for f in NUM_FIELDS:
        if not (_is_num(gpu.get(f)) and gpu[f] > 0):
            problems.append(f"{f}: want positive number, got {gpu.get(f)!r}")
    for f in OPTIONAL_INT_FIELDS:
        if f in gpu and not (_is_int(gpu[f]) and gpu[f] > 0):
            problems.append(f"{f}: want positive int, got {gpu[f]!r}")
    for f in OPTIONAL_NUM_FIELDS:
        if f in gpu and not (_is_num(gpu[f]) and gpu[f] > 0):
            problems.append(f"{f}: want positive number, got {gpu[f]!r}")
    for f in BOOL_FIELDS:
        if not isinstance(gpu.get(f), bool):
            problems.append(f"{f}: want bool, got {gpu.get(f)!r}")
    for f in OPTIONAL_BOOL_FIELDS:
        if f in gpu and not isinstance(gpu[f], bool):
            problems.append(f"{f}: want bool, got {gpu[f]!r}")
    aliases = gpu.get("aliases")
    if not (isinstance(aliases, list) and aliases and all(isinstance(a, str) and a.strip() for a in aliases)):
        problems.append(f"aliases: want non-empty list of non-empty strings, got {aliases!r}")
    if not isinstance(gpu.get("sources"), dict):
        problems.append("sources: missing [gpu.sources] table")
    assert not problems, "\n".join(problems)


@ids
def test_enumerations_and_formats(gpu):
    assert gpu["vendor"] in VENDORS
    assert gpu["architecture"] in ARCHITECTURES
    if gpu["vendor"] == "nvidia":
        assert re.fullmatch(r"\d+\.\d", gpu["compute_capability"]), gpu["compute_capability"]
        assert gpu["warp_size"] == 32
    else:
        assert re.fullmatch(r"gfx9[0-9a-f]+", gpu["compute_capability"]), gpu["compute_capability"]
        assert gpu["warp_size"] == 64
        assert gpu.get("dies") in (1, 2)
    assert gpu["max_warps_per_sm"] * gpu["warp_size"] == gpu["max_threads_per_sm"]
    assert gpu["pcie_gen"] in (3, 4, 5, 6)


@ids
def test_every_numeric_field_has_a_source(gpu):
    sources = gpu["sources"]
    numeric = [k for k, v in gpu.items() if _is_num(v)]
    missing = [k for k in numeric if not (isinstance(sources.get(k), str) and sources[k].strip())]
    assert not missing, f"{gpu['id']}: numeric fields without a source: {missing}"
    stray = [k for k in sources if k not in gpu]
    assert not stray, f"{gpu['id']}: sources for fields that do not exist: {stray}"


def test_ids_and_aliases_unique_case_insensitively():
    owner: dict[str, str] = {}
    clashes = []
    for g in GPUS:
        for key in _keys(g):
            if key in owner and owner[key] != g["id"]:
                clashes.append(f"{key!r}: {owner[key]} and {g['id']}")
            owner[key] = g["id"]
    assert not clashes, "aliases mapping to two GPUs:\n" + "\n".join(clashes)
    lowered_ids = [g["id"].lower() for g in GPUS]
    assert len(lowered_ids) == len(set(lowered_ids)), "duplicate ids"


@pytest.mark.parametrize("alias,gpu_id", [
    # strings torch.cuda.get_device_name() returns
    ("Tesla P4", "P4"),
    ("Tesla P100-PCIE-16GB", "P100-PCIE-16GB"),
    ("Tesla P100-SXM2-16GB", "P100-SXM2-16GB"),
    ("Tesla T4", "T4"),
    ("Tesla V100-PCIE-16GB", "V100-PCIE-16GB"),
    ("Tesla V100-PCIE-32GB", "V100-PCIE-32GB"),
    ("Tesla V100-SXM2-16GB", "V100-SXM2-16GB"),
    ("Tesla V100-SXM2-32GB", "V100-SXM2-32GB"),
    ("NVIDIA A10", "A10"),
    ("NVIDIA A10G", "A10G"),
    ("NVIDIA A30", "A30"),
    ("NVIDIA A40", "A40"),
    ("NVIDIA A100-PCIE-40GB", "A100-PCIE-40GB"),
    ("NVIDIA A100 80GB PCIe", "A100-PCIE-80GB"),
    ("NVIDIA A100-SXM4-40GB", "A100-SXM4-40GB"),
    ("NVIDIA A100-SXM4-80GB", "A100-SXM4-80GB"),
    ("NVIDIA L4", "L4"),
    ("NVIDIA L40S", "L40S"),
    ("NVIDIA GeForce RTX 3090", "RTX-3090"),
    ("NVIDIA GeForce RTX 4090", "RTX-4090"),
    ("NVIDIA RTX A6000", "RTX-A6000"),
    ("NVIDIA RTX 6000 Ada Generation", "RTX-6000-ADA"),
    ("NVIDIA H100 PCIe", "H100-PCIE-80GB"),
    ("NVIDIA H100 80GB HBM3", "H100-SXM5-80GB"),
    ("NVIDIA H200", "H200-SXM-141GB"),
    ("NVIDIA B200", "B200"),
    ("AMD Instinct MI100", "MI100"),
    ("AMD Instinct MI210", "MI210"),
    ("AMD Instinct MI250X / MI250", "MI250"),
    ("AMD Instinct MI300X", "MI300X"),
    # required friendly names
    ("h100", "H100-SXM5-80GB"),
    ("a100", "A100-SXM4-80GB"),
    ("A100 80GB PCIe", "A100-PCIE-80GB"),
    ("h200", "H200-SXM-141GB"),
    ("v100", "V100-SXM2-32GB"),
    ("t4", "T4"),
])
def test_alias_resolves(alias, gpu_id):
    matches = [g["id"] for g in GPUS if alias.lower() in _keys(g)]
    assert matches == [gpu_id]


@nvidia_ids
def test_fp32_peak_consistent_with_sm_count_and_clock(gpu):
    # NVIDIA: peak FP32 = SMs x FP32 cores/SM x 2 FLOP (FMA) x boost clock.
    # (AMD datasheets count packed/dual-issue FP32 differently, e.g. MI300X.)
    computed = gpu["sms"] * gpu["fp32_cores_per_sm"] * 2 * gpu["boost_clock_mhz"] / 1e6
    assert gpu["fp32_tflops"] == pytest.approx(computed, rel=0.03), (
        f"{gpu['id']}: fp32_tflops {gpu['fp32_tflops']} vs computed {computed:.2f}")


@ids
def test_reduced_precision_at_least_fp32(gpu):
    fp32 = gpu["fp32_tflops"]
    assert gpu["bf16_tflops"] >= fp32
    assert gpu["tf32_tflops"] >= fp32
    if gpu.get("fast_fp16", True):
        assert gpu["fp16_tflops"] >= fp32
    else:  # P4: native fp16 is slower than fp32; it must say so explicitly
        assert gpu["fp16_tflops"] < fp32
    if "fp8_tflops" in gpu:
        assert gpu["fp8_tflops"] >= gpu["fp16_tflops"]
    assert gpu["fp64_tflops"] <= fp32
    if "fp64_tensor_tflops" in gpu:
        assert gpu["fp64_tensor_tflops"] >= gpu["fp64_tflops"]
    if "fp32_matrix_tflops" in gpu:
        assert gpu["fp32_matrix_tflops"] >= fp32


@ids
def test_capability_flags_consistent(gpu):
    if gpu.get("tf32_tensor_cores", True) is False:
        assert gpu["tf32_tflops"] == gpu["fp32_tflops"]
    if gpu.get("bf16_supported", True) is False:
        assert gpu["bf16_tflops"] == gpu["fp32_tflops"]
    if not gpu["tensor_cores"]:
        assert gpu.get("tf32_tensor_cores") is False
        assert gpu["fp16_tflops"] <= 2 * gpu["fp32_tflops"] * 1.01  # datasheet rounding


def test_architectures_without_tf32_or_bf16_are_flagged():
    for gid in ["P4", "P100-PCIE-16GB", "P100-SXM2-16GB", "T4",
                "V100-PCIE-16GB", "V100-PCIE-32GB", "V100-SXM2-16GB", "V100-SXM2-32GB"]:
        assert BY_ID[gid]["tf32_tensor_cores"] is False, gid
        assert BY_ID[gid]["bf16_supported"] is False, gid
    assert BY_ID["P4"]["fast_fp16"] is False
    for gid in ["P100-PCIE-16GB", "P100-SXM2-16GB"]:
        g = BY_ID[gid]
        assert g["fp16_tflops"] == pytest.approx(2 * g["fp32_tflops"], rel=0.01)


def test_mi250_is_a_two_die_package_and_others_are_one():
    assert BY_ID["MI250"]["dies"] == 2
    for gid in ["MI100", "MI210", "MI300X"]:
        assert BY_ID[gid]["dies"] == 1


@pytest.mark.parametrize("field", ["fp16_tflops", "memory_bw_gbs"])
def test_generation_ordering(field):
    chain = ["H100-SXM5-80GB", "A100-SXM4-80GB", "V100-SXM2-32GB", "T4"]
    values = [BY_ID[g][field] for g in chain]
    assert values == sorted(values, reverse=True) and len(set(values)) == len(values), (
        f"{field}: {dict(zip(chain, values))}")


def test_known_reference_points():
    t4 = BY_ID["T4"]  # the training dataset's own T4 record
    assert (t4["sms"], t4["fp32_cores_per_sm"], t4["boost_clock_mhz"]) == (40, 64, 1590)
    assert t4["memory_bw_gbs"] == 320 and t4["fp32_tflops"] == 8.1 and t4["l2_mb"] == 4
    assert BY_ID["A100-SXM4-80GB"]["shared_mem_per_sm_kb"] == 164
    assert BY_ID["H100-SXM5-80GB"]["shared_mem_per_sm_kb"] == 228
    assert BY_ID["V100-SXM2-32GB"]["shared_mem_per_sm_kb"] == 96
    assert BY_ID["T4"]["max_threads_per_sm"] == 1024
    assert BY_ID["RTX-4090"]["max_blocks_per_sm"] == 24
    assert BY_ID["A10"]["max_threads_per_sm"] == 1536


def test_h200_differs_from_h100_only_in_memory():
    h100, h200 = BY_ID["H100-SXM5-80GB"], BY_ID["H200-SXM-141GB"]
    for f in ["sms", "fp32_tflops", "fp16_tflops", "bf16_tflops", "tf32_tflops", "fp8_tflops"]:
        assert h100[f] == h200[f], f
    assert h200["memory_gb"] > h100["memory_gb"]
    assert h200["memory_bw_gbs"] > h100["memory_bw_gbs"]


def _dataset_gpu_records() -> list[Path]:
    import os

    root = Path(os.environ.get("PREDICTOR_DATA", SPECS_PATH.parents[2] / "shared" / "data" / "neusight"))
    return sorted((root / "gpus").glob("*.json")) if (root / "gpus").is_dir() else []


@pytest.mark.skipif(not _dataset_gpu_records(), reason="training dataset's gpus/*.json not available")
def test_agrees_with_training_dataset_spec_records():
    """The measured dataset ships its authors' own spec records; ours must agree."""
    import json

    for path in _dataset_gpu_records():
        rec = json.loads(path.read_text())
        matches = [g for g in GPUS if rec["Device"].lower() in _keys(g)]
        assert len(matches) == 1, f"{rec['Device']} does not resolve to exactly one GPU"
        g = matches[0]
        assert g["sms"] * g["fp32_cores_per_sm"] == rec["Num_Sm"] * rec["Core_Per_SM"], g["id"]
        assert g["memory_bw_gbs"] == pytest.approx(rec["Mem_Bw"], rel=0.01), g["id"]
        assert g["l2_mb"] == pytest.approx(rec["L2Cache"], rel=0.01), g["id"]
        assert g["fp32_tflops"] * 1000 == pytest.approx(rec["SingleFLOPs"], rel=0.01), g["id"]
        # Not compared: rec["Freq"] (Tesla_P100-PCIE-16GB.json says 1380 MHz, but its own
        # SingleFLOPs of 9519 implies 1328 MHz) and rec["Dev_Mem"] (usable GiB, not marketed GB).


# ---- prices: one basis per column, dated, estimates marked ------------------

PRICE_COLUMNS = {"price": "cloud", "marketplace": "marketplace"}
# Providers whose own published on-demand rates make the cloud column, and the
# marketplaces whose hosts set the price.
CLOUD_PROVIDERS = ("AWS EC2 on-demand", "Azure", "Google Cloud", "Lambda on-demand",
                   "RunPod GPU pricing page, MI300X secure cloud", "Secure Cloud")
MARKETPLACES = ("Vast.ai", "community cloud", "community-cloud")


@ids
def test_prices_are_dated_sourced_and_on_one_basis(gpu):
    for prefix, basis in PRICE_COLUMNS.items():
        usd, date, src = (gpu.get(f"{prefix}_usd_per_hour"), gpu.get(f"{prefix}_date"),
                          gpu.get(f"{prefix}_source"))
        if usd is None:
            assert date is None and src is None, (prefix, date, src)
            continue
        assert _is_num(usd) and 0 < usd < 100
        assert re.fullmatch(r"\d{4}-(0[1-9]|1[0-2])", date), date
        assert gpu["sources"][f"{prefix}_usd_per_hour"] == src
        if basis == "cloud":
            assert any(p in src for p in CLOUD_PROVIDERS), src
            assert not any(m.lower() in src.lower() for m in MARKETPLACES), src
            assert "proxy" not in src and "placeholder" not in src, src
        else:
            assert any(m.lower() in src.lower() for m in MARKETPLACES), src
    if gpu.get("price_usd_per_hour") is None and gpu.get("marketplace_usd_per_hour") is None:
        assert gpu.get("price_note", "").startswith("No price: "), gpu["id"]


def test_no_cloud_price_is_a_marketplace_one():
    # Issue 16: V100-PCIE-32GB was $0.25/h (a Vast.ai estimate) beside $3.06 cloud prices.
    v = BY_ID["V100-PCIE-32GB"]
    assert "price_usd_per_hour" not in v and v["marketplace_usd_per_hour"] == 0.25
    for gid in ("RTX-3090", "RTX-4090", "A30", "RTX-A5000"):
        assert "price_usd_per_hour" not in BY_ID[gid], gid
    # Placeholders and proxies are not prices on any basis.
    for gid in ("MI100", "MI210", "MI250", "MI250X", "P100-SXM2-16GB"):
        assert "price_usd_per_hour" not in BY_ID[gid] and \
            "marketplace_usd_per_hour" not in BY_ID[gid], gid
