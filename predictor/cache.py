"""An on-disk cache of traced Graphs.

Tracing dominates the cost of an evaluation (seconds to a minute for a large
transformer, against milliseconds to predict it on every GPU), so harnesses and
repeated CLI runs reuse traced graphs. A cached graph must never be stale: the
key is a hash of everything the graph depends on

- the model's identity (its config, its factory, the protocol that built it),
- batch size, sequence length, mode and optimizer,
- the torch and transformers versions (they decide which aten ops run),
- the predictor version and a hash of the *source* of every module that turns
  a model into a Graph (frontend, lowering, op-family registry, OpTable and
  memory pass, layout codes),

so any change to any of them is a different file, never a wrong hit. The key
is also stored inside the entry and checked on load: a file of another key (a
copy, a rename, a planted graph of another model) is a miss, never another
model's graph. Files are written atomically (``save_graph``: temp file, fsync,
``os.replace``) into a folder created 0700; a file that does not load, or holds
another key, is a miss with a one-line warning and is traced again.

Location: ``$PREDICTOR_CACHE_DIR``, else ``$XDG_CACHE_HOME/dnn-predictor/graphs``,
else ``~/.cache/dnn-predictor/graphs``.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import re
import warnings
from importlib import metadata
from pathlib import Path
from typing import Any, Callable

from predictor import __version__
from predictor.errors import InvalidArgumentError, PredictorError
from predictor.optable import load_graph_meta, save_graph

ENV_DIR = "PREDICTOR_CACHE_DIR"
DEFAULT_DIR = Path("~/.cache/dnn-predictor/graphs")
# The header field of a cache entry that holds its key.
KEY_FIELD = "cache_key"

# Every module whose code decides what a traced Graph contains.
GRAPH_SOURCES = (
    "predictor.frontend.fx",
    "predictor.frontend.blocks",
    "predictor.frontend.optimizers",
    "predictor.frontend.cuda_paths",
    "predictor.frontend.autocast",
    "predictor.frontend.float8",
    "predictor.frontend.memory_pass",
    "predictor.frontend.layout_pass",
    "predictor.frontend.construction",
    "predictor.frontend.devices",
    "predictor.dtypes",
    "predictor.lowering",
    "predictor.families",
    "predictor.optable",
    "predictor.memory",
    "predictor.kernels.layout",
)
# Libraries whose version changes the traced aten graph.
GRAPH_LIBRARIES = ("torch", "transformers", "torchvision")


def cache_dir() -> Path:
    """The cache folder (not created until something is stored):
    $PREDICTOR_CACHE_DIR, else $XDG_CACHE_HOME/dnn-predictor/graphs, else
    ~/.cache/dnn-predictor/graphs."""
    if os.environ.get(ENV_DIR):
        return Path(os.environ[ENV_DIR]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and os.path.isabs(xdg):  # the XDG spec ignores a relative path
        return Path(xdg) / "dnn-predictor" / "graphs"
    return DEFAULT_DIR.expanduser()


def _module_source(name: str) -> bytes:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.origin or not os.path.isfile(spec.origin):
        return f"<absent {name}>".encode()
    return Path(spec.origin).read_bytes()


@functools.lru_cache(maxsize=None)
def source_hash(modules: tuple[str, ...] = GRAPH_SOURCES) -> str:
    """sha256 over the source files of `modules` (name and bytes of each)."""
    h = hashlib.sha256()
    for name in modules:
        h.update(name.encode() + b"\0" + _module_source(name) + b"\0")
    return h.hexdigest()


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def environment() -> dict[str, Any]:
    """What, besides the model, decides the traced graph."""
    return {
        "predictor": __version__,
        "sources": source_hash(),
        "libraries": {lib: _version(lib) for lib in GRAPH_LIBRARIES},
    }


def graph_key(identity: Any, *, batch_size: int, seq_len: int | None, mode: str,
              optimizer: str | None, extra: Any = None) -> str:
    """The cache key (hex sha256) of one trace. `identity` is any JSON-able
    description of the model (a config dict, a zoo name with its source hash, a
    factory's qualified name); `extra` anything else the caller's protocol adds."""
    parts = {
        "identity": identity, "batch_size": batch_size, "seq_len": seq_len, "mode": mode,
        "optimizer": optimizer, "extra": extra, "environment": environment(),
    }
    try:
        text = json.dumps(parts, sort_keys=True, default=str)
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(f"cache identity is not JSON-able: {exc}") from None
    return hashlib.sha256(text.encode()).hexdigest()


def zoo_identity(name: str) -> dict[str, str]:
    """Identity of a zoo model: its canonical name and the zoo's source."""
    from predictor import zoo

    entry = zoo.get(name)
    sources = tuple(f"predictor.zoo.{m}" for m in ("base", "hf", "seq2seq", "vision", "factory"))
    return {"zoo": entry.name, "zoo_sources": source_hash(("predictor.zoo",) + sources)}


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)[:60] or "graph"


def _file(key: str, name: str, directory: str | Path | None) -> Path:
    base = Path(directory).expanduser() if directory is not None else cache_dir()
    return base / f"{_slug(name)}-{key[:32]}.npz"


def load(key: str, name: str = "graph", directory: str | Path | None = None):
    """The cached Graph for `key`, or None (absent, unreadable, or an entry of
    another key: a one-line warning for those two)."""
    path = _file(key, name, directory)
    if not path.is_file():
        return None
    try:
        graph, meta = load_graph_meta(path)
    except (PredictorError, OSError) as exc:  # unreadable or another format: trace again
        _warn(f"graph cache: {path.name} not used ({exc})")
        return None
    if meta.get(KEY_FIELD) != key:
        what = "holds no key (an older version's entry)" if KEY_FIELD not in meta else \
            f"holds another key's graph ({graph.name})"
        _warn(f"graph cache: {path.name} {what}; traced again")
        return None
    return graph


def _warn(message: str) -> None:
    from predictor.text import printable

    warnings.warn(printable(message, 500), RuntimeWarning, stacklevel=3)


def store(key: str, graph, name: str | None = None,
          directory: str | Path | None = None) -> Path | None:
    """Write `graph` under `key` (atomically); None when it cannot be saved."""
    path = _file(key, name or graph.name, directory)
    try:
        os.makedirs(path.parent, mode=0o700, exist_ok=True)
        return save_graph(graph, path, {KEY_FIELD: key})
    except (PredictorError, OSError) as exc:
        warnings.warn(f"graph cache: not stored ({exc})", RuntimeWarning, stacklevel=2)
        return None


def cached_trace(identity: Any, trace: Callable[[], Any], *, name: str, batch_size: int,
                 seq_len: int | None, mode: str, optimizer: str | None, extra: Any = None,
                 directory: str | Path | None = None, refresh: bool = False):
    """(graph, hit): the cached graph for this identity and configuration, or
    ``trace()``'s result, stored for next time. `refresh` traces anyway."""
    key = graph_key(identity, batch_size=batch_size, seq_len=seq_len, mode=mode,
                    optimizer=optimizer, extra=extra)
    if not refresh:
        graph = load(key, name, directory)
        if graph is not None and graph.mode == mode and graph.batch_size == batch_size \
                and graph.seq_len == seq_len:
            return graph, True
    graph = trace()
    store(key, graph, name, directory)
    return graph, False
