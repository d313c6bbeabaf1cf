"""The compiled kernels' cache (predictor.kernels, issue 19 F9): private to the
user, and never fatal. Each case runs a fresh process that compiles one small
kernel against a cache under its own XDG_CACHE_HOME."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_PYCACHE = ROOT / "kernels" / "__pycache__"

RUN = """
import warnings
warnings.simplefilter("always")
warnings.formatwarning = lambda m, c, f, l, line=None: f"{c.__name__}: {m}\\n"
PATCH
from predictor.kernels import memory
print(memory._round_up(3, 512))
"""

# Writes that fail as on a full disk, and a cache folder numba cannot write.
ENOSPC = """
import errno
from numba.core import caching
def full(*a, **k):
    raise OSError(errno.ENOSPC, "No space left on device")
caching.IndexDataCacheFile._save_index = full
"""
READ_ONLY = """
import errno
from numba.core import caching
def ro(self):
    raise OSError(errno.EROFS, "Read-only file system")
caching._CacheLocator.ensure_cache_path = ro
"""


def run(xdg: Path, patch: str = "") -> tuple[str, list[str]]:
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    proc = subprocess.run([sys.executable, "-c", RUN.replace("PATCH", patch)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**env, "XDG_CACHE_HOME": str(xdg), "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0 and proc.stdout.strip() == "512", proc.stderr[-3000:]
    warns = [line for line in proc.stderr.splitlines() if line.startswith("CacheWarning")]
    assert len(warns) == len([line for line in proc.stderr.splitlines() if line.strip()]), \
        proc.stderr[-3000:]
    return proc.stderr, warns


def cache_folder(xdg: Path) -> Path:
    (folder,) = (xdg / "dnn-predictor" / "numba").iterdir()
    return folder


def package_entries() -> set[str]:
    if not PACKAGE_PYCACHE.is_dir():
        return set()
    return {p.name for p in PACKAGE_PYCACHE.iterdir() if p.suffix in (".nbi", ".nbc")}


@pytest.fixture
def xdg(tmp_path) -> Path:
    before = package_entries()
    yield tmp_path / "xdg"
    assert package_entries() == before, "the kernels' cache wrote into the package"


def test_created_private_and_reused(xdg):
    _, warns = run(xdg)
    assert warns == []
    folder = cache_folder(xdg)
    for f in (xdg, xdg / "dnn-predictor", folder.parent, folder):
        assert f.stat().st_mode & 0o777 == 0o700, f
    assert any(p.suffix == ".nbi" for p in folder.iterdir())
    _, warns = run(xdg)
    assert warns == []


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o702])
def test_writable_by_others_is_refused(xdg, mode):
    run(xdg)
    folder = cache_folder(xdg)
    before = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
    folder.chmod(mode)
    _, warns = run(xdg)
    assert len(warns) == 1 and "writable by other users" in warns[0], warns
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == before


def test_a_parent_writable_by_others_is_refused(xdg):
    run(xdg)
    (xdg / "dnn-predictor").chmod(0o777)
    _, warns = run(xdg)
    assert len(warns) == 1 and "writable by other users" in warns[0], warns


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                    reason="giving a folder to another user needs root")
def test_owned_by_another_user_is_refused(xdg):
    run(xdg)
    os.chown(cache_folder(xdg), 65534, 65534)
    _, warns = run(xdg)
    assert len(warns) == 1 and "another user" in warns[0], warns


@pytest.mark.parametrize("damage", ["garbage index", "truncated data", "empty index"])
def test_damaged_entries_are_a_miss_then_repaired(xdg, damage):
    run(xdg)
    folder = cache_folder(xdg)
    for p in folder.iterdir():
        if damage == "garbage index" and p.suffix == ".nbi":
            p.write_bytes(b"\x80\x04garbage" * 10)
        elif damage == "truncated data" and p.suffix == ".nbc":
            p.write_bytes(p.read_bytes()[:40])
        elif damage == "empty index" and p.suffix == ".nbi":
            p.write_bytes(b"")
    _, warns = run(xdg)
    assert len(warns) == 1 and "could not be read" in warns[0], warns
    _, warns = run(xdg)
    assert warns == [], "the damaged entry was not rewritten"


@pytest.mark.parametrize("patch,needle", [(ENOSPC, "No space left"),
                                          (READ_ONLY, "Read-only")])
def test_write_errors_are_a_warning(xdg, patch, needle):
    _, warns = run(xdg, patch)
    assert len(warns) == 1 and needle in warns[0], warns


def test_user_choice_wins(tmp_path):
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "mine"),
           "XDG_CACHE_HOME": str(tmp_path / "xdg"), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", RUN.replace("PATCH", "")], env=env,
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "mine").is_dir() and not (tmp_path / "xdg").exists()


def test_a_checkout_root_on_the_path_leaves_the_kernels_name_to_its_distribution(tmp_path):
    """From a checkout's root (`python -m`, `pytest`) this folder is importable
    as a top-level `kernels`, the name of Hugging Face's distribution, which
    transformers 5.25+ requires and imports: the installed one must win, and
    predictor.kernels stay ours."""
    fake = tmp_path / "site" / "kernels"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("REAL = 'the distribution'\n")
    code = ("import kernels, predictor.kernels as pk; from predictor.kernels import layout; "
            "print(kernels.REAL); print(pk.__name__, hasattr(pk, 'default_dir'))")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["the distribution", "predictor.kernels True"]
    # Without a distribution of that name the folder stays, and does nothing.
    proc = subprocess.run([sys.executable, "-c", "import kernels; print(kernels.__file__)"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert proc.returncode == 0, proc.stderr
