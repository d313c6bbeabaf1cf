"""Atomic file writes: a reader (or a crash) never sees half a file.

Every file the tool writes (calibrations, cached graphs, reports, exported
tables) goes through these helpers: the data is written to a temporary file in
the *same folder* (so the final rename never crosses a file system), flushed
and fsync'ed, then renamed over the target with ``os.replace`` (atomic on POSIX
and Windows). A writer killed at any point leaves either the previous file or
the new one, never a mix; at worst a stray ``.<name>.*.tmp`` file stays behind.

    from predictor.io import atomic_write_bytes, atomic_write_text, atomic_writer

    atomic_write_text("report.json", json.dumps(out))   # missing folders are created
    with atomic_writer("table.npz") as f:   # for writers that want a file object
        np.savez(f, a=a)
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import IO, Iterator

from predictor.errors import PredictorError, WriteError


def _fsync_dir(folder: Path) -> None:
    """Make the rename itself durable (POSIX; a no-op where folders cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_writer(path: str | os.PathLike, mode: str = "wb", *,
                  encoding: str | None = None) -> Iterator[IO]:
    """A file object whose content replaces `path` only when the block exits
    without an exception. `mode` is "wb" or "w" (text, UTF-8 by default)."""
    if mode not in ("wb", "w"):
        raise ValueError(f"atomic_writer mode must be 'wb' or 'w', got {mode!r}")
    target = Path(path)
    folder = target.parent if str(target.parent) else Path(".")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise WriteError(f"{target}: cannot write ({exc.strerror or exc})") from exc
    try:
        if mode == "w":
            f = os.fdopen(fd, "w", encoding=encoding or "utf-8", newline="")
        else:
            f = os.fdopen(fd, "wb")
        with f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        # Keep the permissions an ordinary open() would give (mkstemp uses 0600).
        if target.exists():
            os.chmod(tmp, target.stat().st_mode & 0o7777)
        else:
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, target)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError) and not isinstance(exc, PredictorError):
            raise WriteError(f"{target}: cannot write ({exc.strerror or exc})") from exc
        raise
    _fsync_dir(folder)


# The name predictor.atomic uses for the same context manager.
atomic_write = atomic_writer


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write `data` to `path` atomically (see the module docstring)."""
    with atomic_writer(path, "wb") as f:
        f.write(data)


def atomic_write_text(path: str | os.PathLike, text: str, encoding: str = "utf-8") -> None:
    """Write `text` to `path` atomically (see the module docstring)."""
    with atomic_writer(path, "w", encoding=encoding) as f:
        f.write(text)
