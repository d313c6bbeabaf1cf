"""Numba kernels: flat functions over arrays (no torch, no classes).

The on-disk cache of the compiled kernels (``cache=True``) is set up here,
before any kernel module is imported:

- **Where.** numba's cache checks only the source file of the function it
  compiled, not the files of the functions it inlined, so an edit to
  ``work.py`` could leave a stale ``grid.py`` entry behind. The cache
  therefore lives in a folder named after a hash of every kernel source:
  ``$XDG_CACHE_HOME/dnn-predictor/numba/<hash>`` (``~/.cache`` without
  ``XDG_CACHE_HOME``); any change to any kernel starts a fresh cache.
- **Private.** numba's cache files are pickles: whoever can write them runs
  code in the next ``predictor`` process. The folders are created 0700, and a
  cache folder that belongs to another user or is writable by others is
  refused with a one-line warning (:class:`CacheWarning`); the kernels are
  then compiled into a private temporary folder, removed at exit.
- **Never fatal.** A cache entry that cannot be read (truncated, garbage, from
  an unknown numba) or written (read-only folder, full disk) is a miss with a
  one-line warning, never an exception; a damaged index is rewritten. The
  kernels' cache never falls back to numba's other locations (the package's
  own ``__pycache__``, which a read-only cache used to fill silently).

``NUMBA_CACHE_DIR`` set by the user wins (numba's own rules then apply).
Only this package's kernels are affected: other numba code in the process
keeps numba's behaviour.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import pickle
import shutil
import stat
import tempfile
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent


class CacheWarning(RuntimeWarning):
    """The kernels' compilation cache could not be used as it is (one line)."""


_warned: set[str] = set()


def _warn(message: str) -> None:
    """One line, once per process and message."""
    message = " ".join(message.split())
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, CacheWarning, stacklevel=3)


def _hash_dir(base: Path) -> Path:
    digest = hashlib.sha256()
    for src in sorted(HERE.glob("*.py")):
        digest.update(src.name.encode())
        digest.update(src.read_bytes())
    return base / "dnn-predictor" / "numba" / digest.hexdigest()[:16]


def default_dir() -> Path:
    """The cache folder the kernels use when it is safe (not created here)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return _hash_dir(Path(base))


def private_problem(path: Path) -> str | None:
    """Why the folder `path` cannot hold the cache safely (None: it can): it
    is not a folder, belongs to another user, or others can write to it."""
    try:
        st = os.stat(path)
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a folder"
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        return f"belongs to another user (uid {st.st_uid})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"is writable by other users (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def _parent_problem(path: Path) -> str | None:
    """A folder above ours that others may write to lets them swap ours
    (unless it is sticky, like /tmp: then only the owner may rename)."""
    try:
        st = os.stat(path)
    except OSError:
        return None  # mkdir below reports it
    if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
        return f"is inside {path}, which everyone may write to"
    return None


def prepare(target: Path) -> tuple[str | None, bool]:
    """Create `target` and its two dnn-predictor folders 0700 and check them.
    (problem or None, writable)."""
    top = target.parent.parent  # .../dnn-predictor
    try:
        os.makedirs(top.parent, mode=0o700, exist_ok=True)  # XDG_CACHE_HOME: 0700 if new
    except OSError as exc:
        return f"cannot be created ({exc.strerror or exc})", False
    problem = _parent_problem(top.parent)
    if problem:
        return problem, False
    for folder in (top, target.parent, target):
        try:
            folder.mkdir(mode=0o700)
        except FileExistsError:
            pass
        except OSError as exc:
            if not folder.is_dir():
                return f"cannot be created ({exc.strerror or exc})", False
        problem = private_problem(folder)
        if problem:
            return (problem if folder == target else f"is inside {folder}, which {problem}"), False
        try:
            if stat.S_IMODE(folder.stat().st_mode) & 0o077:
                folder.chmod(0o700)  # made by an older version (0755): private from now on
        except OSError:
            pass
    return None, os.access(target, os.W_OK | os.X_OK)


def _private_temp_dir() -> str:
    path = tempfile.mkdtemp(prefix="dnn-predictor-numba-")  # 0700
    atexit.register(shutil.rmtree, path, True)
    return path


# What an unreadable cache entry raises while it is unpickled and rebuilt.
_READ_ERRORS = (OSError, EOFError, pickle.UnpicklingError, ValueError, TypeError, KeyError,
                IndexError, AttributeError, ImportError, OverflowError, MemoryError)


def _install(cache_dir: str) -> bool:
    """Point numba's cache of this package's files at `cache_dir`, with read
    and write errors turned into warned misses. False on a numba without the
    hooks used here (then the environment variable alone is set)."""
    try:
        from numba.core import caching
    except ImportError:  # pragma: no cover - numba is a core dependency
        return False
    impl = getattr(caching, "CacheImpl", None) or getattr(caching, "_CacheImpl", None)
    base = getattr(caching, "_CacheLocator", None)
    mixin = getattr(caching, "_SourceFileBackedLocatorMixin", None)
    cache_cls = getattr(caching, "Cache", None)
    if impl is None or base is None or mixin is None or cache_cls is None \
            or not isinstance(getattr(impl, "_locator_classes", None), list):
        return False

    class KernelCacheLocator(mixin, base):
        """This package's kernel files, cached in one private folder."""

        def __init__(self, py_func, py_file):
            self._py_file = py_file
            self._lineno = py_func.__code__.co_firstlineno
            self._cache_path = cache_dir

        def get_cache_path(self):
            return self._cache_path

        @classmethod
        def from_function(cls, py_func, py_file):
            try:
                ours = Path(py_file).resolve().parent == HERE
            except (OSError, ValueError):
                ours = False
            return cls(py_func, py_file) if ours else None

    def ours(cache) -> bool:
        return isinstance(getattr(getattr(cache, "_impl", None), "_locator", None),
                          KernelCacheLocator)

    load, save = cache_cls.load_overload, cache_cls.save_overload

    def load_overload(self, sig, target_context):
        if not ours(self):
            return load(self, sig, target_context)
        try:
            return load(self, sig, target_context)
        except _READ_ERRORS as exc:
            _warn(f"numba cache {cache_dir}: an entry could not be read "
                  f"({type(exc).__name__}); compiling instead, and the entry is rewritten")
            try:
                self._cache_file.flush()  # an empty index: the damaged entry is gone
            except OSError:
                pass
            return None

    def save_overload(self, sig, data):
        if not ours(self):
            return save(self, sig, data)
        try:
            return save(self, sig, data)
        except _READ_ERRORS as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else \
                type(exc).__name__
            _warn(f"numba cache {cache_dir}: not saved ({reason}); the kernels will be "
                  "compiled again next time")
            return None

    cache_cls.load_overload, cache_cls.save_overload = load_overload, save_overload
    impl._locator_classes.insert(0, KernelCacheLocator)
    return True


def _give_the_name_back() -> None:
    """Imported as the top-level ``kernels`` rather than ``predictor.kernels``,
    this folder is on the path only because a checkout's root is (``python
    -m`` or ``pytest`` run there). That name belongs to Hugging Face's
    ``kernels`` distribution, which transformers 5.25 and later requires and
    imports by it: with this folder in its place, ``import transformers``
    fails from a checkout. Put the installed distribution in this module's
    place; without one, this module stays, with no side effects."""
    import importlib.machinery
    import importlib.util
    import sys

    root = HERE.parent

    def is_root(entry: str) -> bool:
        try:
            return Path(entry or os.getcwd()).resolve() == root
        except (OSError, ValueError):
            return False

    spec = importlib.machinery.PathFinder.find_spec(
        __name__, [p for p in sys.path if isinstance(p, str) and not is_root(p)])
    if spec is None or spec.loader is None:
        return
    ours = sys.modules[__name__]
    module = importlib.util.module_from_spec(spec)
    sys.modules[__name__] = module  # what the import statement returns
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules[__name__] = ours
        raise


def _setup() -> None:
    if os.environ.get("NUMBA_CACHE_DIR"):
        return  # the user's choice; numba's own rules apply
    target = default_dir()
    problem, _ = prepare(target)
    if problem:
        chosen = _private_temp_dir()
        why = "" if problem.startswith("cannot") else \
            " (its files are pickles: whoever writes them runs code here)"
        _warn(f"numba cache {target} {problem}: not used{why}; compiling into {chosen} "
              "for this process")
    else:
        # Read-only: its entries are still read; a save fails with one warning.
        chosen = str(target)
    if not _install(chosen):  # pragma: no cover - another numba
        os.environ["NUMBA_CACHE_DIR"] = chosen
        import numba.core.config as numba_config

        numba_config.CACHE_DIR = chosen


if __name__ == "kernels":
    _give_the_name_back()
else:
    _setup()
