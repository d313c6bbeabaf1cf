"""File and text safety: atomic writes, bounded reads of regular files, and
user strings made safe to print or plot.

Atomic file writes: a reader (or a crash) never sees half a file.

Every file the tool writes (calibrations, cached graphs, reports, exported
tables) goes through these helpers: the data is written to a temporary file in
the *same folder* (so the final rename never crosses a file system), flushed
and fsync'ed, then renamed over the target with ``os.replace`` (atomic on POSIX
and Windows). A writer killed at any point leaves either the previous file or
the new one, never a mix; at worst a stray ``.<name>.*.tmp`` file stays behind.

Where the path leads (``resolve_target``): a symlink is followed to its
target, the temporary file is made beside the *target* and renamed over it, so
the link stays a link and the file it names is updated. A dangling symlink
gets its target created (as ``open(path, "w")`` and the shell's ``>`` would).
A symlink loop is a one-line ``WriteError`` naming the path. A target that is
not a regular file (a pipe or FIFO, a character device such as ``/dev/null``
or a terminal, ``/dev/stdout`` and other ``/dev/fd/N``, ``/proc/*/fd/N``
paths) is written directly: no temporary file, no rename, nothing replaced,
nothing truncated. The process's own descriptors (``/dev/stdout``,
``/dev/fd/1``) are written through a duplicate, so with ``> out.txt`` the
table lands in order with the rest of the output instead of over it. A
folder, a block device or a socket is refused.

    from predictor.io import atomic_write_bytes, atomic_write_text, atomic_writer

    atomic_write_text("report.json", json.dumps(out))   # missing folders are created
    with atomic_writer("table.npz") as f:   # for writers that want a file object
        np.savez(f, a=a)

Reads: ``read_regular(path, max_bytes, what)`` (every loader) refuses FIFOs,
devices, folders and files over the cap before reading. Text (from
``predictor.text``): ``printable`` (control characters escaped, length capped),
``markup_safe`` (for rich) and ``plain_text_figures`` (matplotlib draws labels
as written, never as mathtext).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
import sys
import tempfile
from pathlib import Path
from typing import IO, Iterator

from predictor.errors import FileFormatError, PredictorError, WriteError
# The text guards live in predictor.text (errors need them too); re-exported here.
from predictor.text import MAX_NAME_CHARS, markup_safe, plain_text_figures, printable  # noqa: F401


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


# Paths whose links are the kernel's view of open files: /proc/<pid>/fd/N reads
# as "pipe:[123]" or the name of a file someone else opened; written in place.
_STREAM_PREFIXES = ("/proc/", "/dev/fd/")
_STREAM_NAMES = {"/dev/stdin": 0, "/dev/stdout": 1, "/dev/stderr": 2}
_OWN_FD = re.compile(r"/(?:proc/(self|\d+)/fd|dev/fd)/(\d+)")


def _own_fd(p: str) -> int | None:
    """The descriptor number when `p` names one of this process's open files
    (/dev/stdout, /dev/fd/N, /proc/self/fd/N): written through a duplicate, so
    it lands where the process's own output is, not over it."""
    if p in _STREAM_NAMES:
        return _STREAM_NAMES[p]
    m = _OWN_FD.fullmatch(p)
    if m and m.group(1) in (None, "self", str(os.getpid())):
        return int(m.group(2))
    return None
_MAX_LINKS = 40  # as the kernel's ELOOP limit


def resolve_target(path: str | os.PathLike
                   ) -> tuple[Path, os.stat_result | None, bool, int | None]:
    """Where a write to `path` lands: (the real path with every symlink
    followed, its stat or None when it does not exist yet, whether to write it
    directly instead of replacing it, the descriptor to duplicate when it is
    one of this process's open files such as /dev/stdout). A one-line `WriteError` naming `path`
    for a symlink loop, a folder, a block device or a socket."""
    shown = printable(os.fspath(path), 300)
    p = os.path.abspath(os.fspath(path))
    try:
        for _ in range(_MAX_LINKS):
            parent, name = os.path.split(p)
            p = os.path.join(os.path.realpath(parent), name)
            if p.startswith(_STREAM_PREFIXES) or p in _STREAM_NAMES:
                own = _own_fd(p)
                st = os.fstat(own) if own is not None else os.stat(p)
                if stat.S_ISDIR(st.st_mode):
                    raise WriteError(f"{shown}: is a folder, cannot write a file there")
                return Path(p), st, True, own
            try:
                st = os.lstat(p)
            except FileNotFoundError:
                return Path(p), None, False, None  # missing, or the target of a dangling link
            if not stat.S_ISLNK(st.st_mode):
                break
            # Relative to the link's own (real) folder; the next round resolves it.
            p = os.path.join(os.path.dirname(p), os.readlink(p))
        else:
            raise WriteError(f"{shown}: symlink loop, cannot write "
                             f"(more than {_MAX_LINKS} links)")
    except WriteError:
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise WriteError(f"{shown}: symlink loop, cannot write "
                             f"({exc.strerror or exc})") from None
        raise WriteError(f"{shown}: cannot write ({exc.strerror or exc})") from None
    if stat.S_ISREG(st.st_mode):
        return Path(p), st, False, None
    if stat.S_ISFIFO(st.st_mode) or stat.S_ISCHR(st.st_mode):
        return Path(p), st, True, None
    raise WriteError(f"{shown}: is {_kind(st.st_mode)}, cannot write a file there")


def _file_of(fd: int, mode: str, encoding: str | None) -> IO:
    """The writer's file object over `fd`: bytes for "wb", text (UTF-8 by
    default, newlines as written) for "w"."""
    if mode == "w":
        return os.fdopen(fd, "w", encoding=encoding or "utf-8", newline="")
    return os.fdopen(fd, "wb")


@contextlib.contextmanager
def _direct_writer(shown: str, real: Path, st: os.stat_result, own: int | None, mode: str,
                   encoding: str | None) -> Iterator[IO]:
    """Write a stream (pipe, FIFO, terminal, /dev/stdout) in place: opened
    without O_CREAT or O_TRUNC (appending where it is an open regular file);
    this process's own descriptor (`own`) through a duplicate, after
    flushing Python's stdout and stderr, so the output stays in order."""
    flags = os.O_WRONLY | getattr(os, "O_CLOEXEC", 0)
    if stat.S_ISREG(st.st_mode):
        flags |= os.O_APPEND
    try:
        if own is not None:
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            fd = os.dup(own)
        else:
            fd = os.open(real, flags)
    except OSError as exc:
        raise WriteError(f"{shown}: cannot write ({exc.strerror or exc})") from exc
    try:
        f = _file_of(fd, mode, encoding)
    except BaseException:
        os.close(fd)
        raise
    try:
        with f:
            yield f
    except OSError as exc:
        if isinstance(exc, PredictorError):
            raise
        raise WriteError(f"{shown}: cannot write ({exc.strerror or exc})") from exc


@contextlib.contextmanager
def atomic_writer(path: str | os.PathLike, mode: str = "wb", *,
                  encoding: str | None = None) -> Iterator[IO]:
    """A file object whose content replaces `path` only when the block exits
    without an exception. `mode` is "wb" or "w" (text, UTF-8 by default).
    Symlinks are followed (the target is replaced, the link kept); pipes,
    FIFOs and devices are written directly (see the module docstring)."""
    if mode not in ("wb", "w"):
        raise ValueError(f"atomic_writer mode must be 'wb' or 'w', got {mode!r}")
    shown = printable(os.fspath(path), 300)
    real, st, direct, own = resolve_target(path)
    if direct:
        assert st is not None
        with _direct_writer(shown, real, st, own, mode, encoding) as f:
            yield f
        return
    folder = real.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{real.name}.", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise WriteError(f"{shown}: cannot write ({exc.strerror or exc})") from exc
    try:
        with _file_of(fd, mode, encoding) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        # Keep the permissions an ordinary open() would give (mkstemp uses 0600).
        try:
            keep = os.stat(real).st_mode & 0o7777
        except FileNotFoundError:
            umask = os.umask(0)
            os.umask(umask)
            keep = 0o666 & ~umask
        os.chmod(tmp, keep)
        os.replace(tmp, real)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError) and not isinstance(exc, PredictorError):
            raise WriteError(f"{shown}: cannot write ({exc.strerror or exc})") from exc
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


# ---- reading: regular files of bounded size ------------------------------------
# Every loader reads its file through `read_regular`: a FIFO, a device
# (/dev/zero), a socket, or a symlink to one is refused before a byte is read
# (it would hang or never end), and a file larger than the loader's cap is
# refused from its size, before it is read into memory.

MiB = 1 << 20


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def check_regular(path: str | os.PathLike, max_bytes: int, what: str,
                  error: type[PredictorError] = FileFormatError) -> int:
    """The size of `path` when it is a regular file (after symlinks) of at most
    `max_bytes`; else a one-line `error` naming the file. For readers that
    take a path (and open it themselves)."""
    p = printable(os.fspath(path), 300)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise error(f"{p}: no such {what}") from None
    except OSError as exc:
        raise error(f"{p}: cannot read {what} ({exc.strerror or exc})") from None
    _check_stat(st, p, max_bytes, what, error)
    return st.st_size


def _a(what: str) -> str:
    return f"an {what}" if what[:1].lower() in "aeiou" else f"a {what}"


def _check_stat(st: os.stat_result, p: str, max_bytes: int, what: str, error) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise error(f"{p}: is {_kind(st.st_mode)}, not {_a(what)}")
    if st.st_size > max_bytes:
        raise error(f"{p}: {st.st_size:,} bytes, too large for {_a(what)} "
                    f"(at most {max_bytes:,})")


def read_regular(path: str | os.PathLike, max_bytes: int, what: str,
                 error: type[PredictorError] = FileFormatError, *,
                 missing: str | None = None) -> bytes:
    """The bytes of `path`, a regular file (after symlinks) of at most
    `max_bytes`; else a one-line `error` naming the file and the problem (no
    such file (`missing`: what to say then), a folder, a FIFO or device, too
    large, unreadable). Opened non-blocking, so a FIFO is refused instead of
    waited on."""
    p = printable(os.fspath(path), 300)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise error(f"{p}: {missing or 'no such ' + what}") from None
    except IsADirectoryError:
        raise error(f"{p}: is a folder, not {_a(what)}") from None
    except OSError as exc:
        raise error(f"{p}: cannot read {what} ({exc.strerror or exc})") from None
    try:
        _check_stat(os.fstat(fd), p, max_bytes, what, error)
    except BaseException:
        os.close(fd)
        raise
    with os.fdopen(fd, "rb", buffering=0) as f:
        try:
            chunks, left = [], max_bytes + 1
            while left > 0:  # a file growing while read still stops at the cap
                chunk = f.read(min(left, 64 * MiB))
                if not chunk:
                    break
                chunks.append(chunk)
                left -= len(chunk)
        except OSError as exc:
            raise error(f"{p}: cannot read {what} ({exc.strerror or exc})") from None
    data = b"".join(chunks)
    if len(data) > max_bytes:
        raise error(f"{p}: too large for {_a(what)} (at most {max_bytes:,} bytes)")
    return data


def read_text(path: str | os.PathLike, max_bytes: int, what: str,
              error: type[PredictorError] = FileFormatError, *,
              missing: str | None = None) -> str:
    """`read_regular`, decoded as UTF-8; text that is not UTF-8 is a one-line
    `error` naming the file and the first bad byte."""
    data = read_regular(path, max_bytes, what, error, missing=missing)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{printable(os.fspath(path), 300)}: cannot read {what} (not UTF-8 text: "
                    f"{exc.reason} at byte {exc.start})") from None
