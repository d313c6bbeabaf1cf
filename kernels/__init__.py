"""Numba kernels: flat functions over arrays (no torch, no classes).

numba's on-disk cache (``cache=True``) checks only the source file of the
function it compiled, not the files of the functions it inlined, so an edit to
``work.py`` could leave a stale ``grid.py`` entry behind. The cache therefore
lives in a folder named after a hash of every kernel source: any change to any
kernel starts a fresh cache. ``NUMBA_CACHE_DIR`` set by the user wins.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def _cache_dir() -> str:
    here = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for src in sorted(here.glob("*.py")):
        digest.update(src.name.encode())
        digest.update(src.read_bytes())
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return os.path.join(base, "dnn-predictor", "numba", digest.hexdigest()[:16])


if "NUMBA_CACHE_DIR" not in os.environ:
    _dir = _cache_dir()
    try:
        os.makedirs(_dir, exist_ok=True)
        os.environ["NUMBA_CACHE_DIR"] = _dir
        import numba.core.config as _numba_config

        _numba_config.CACHE_DIR = _dir
    except OSError:  # read-only home: numba falls back to its own locations
        pass
