"""Lookup tables filled by decorator, refusing a key filed twice.

The op-family extractors, the backward rules, the ONNX op mappers and the
calibration's runner builders are each a table keyed by an op, filled by a
decorator at import time. A second registration under the same key used to
replace the first without a word, so a rule could vanish because a later one
reused its op. As ``torch/utils/flop_counter.py``'s ``register_flop_formula``
does, a :class:`Registry` refuses the second one: the import fails and names
the key and both functions.

This module imports nothing of the project, so every layer may use it.
"""

from __future__ import annotations

from typing import Any, Callable, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


def _name(value: Any) -> str:
    module = getattr(value, "__module__", None)
    qualname = getattr(value, "__qualname__", None)
    return f"{module}.{qualname}" if module and qualname else repr(value)


class Registry(dict):
    """A dict whose keys are set once: a second assignment raises instead of
    replacing the first entry. Reads are a plain dict's (``get``, ``[]``,
    ``in``), so lookups on the trace path cost nothing more."""

    def __init__(self, what: str) -> None:
        super().__init__()
        self.what = what  # what the table holds, for the error message

    def __setitem__(self, key: Any, value: Any) -> None:
        if key in self:
            raise self._twice(key, self[key], value)
        super().__setitem__(key, value)

    def update(self, *args: Any, **kwargs: Any) -> None:
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def setdefault(self, key: Any, default: Any = None) -> Any:
        if key not in self:
            self[key] = default
        return self[key]

    def register(self, *keys: Any) -> Callable[[F], F]:
        """A decorator filing the function under each key. Every key is
        checked before any is filed, so a refused registration leaves the
        table as it was."""

        def wrap(fn: F) -> F:
            seen: set = set()
            for key in keys:
                if key in self:
                    raise self._twice(key, self[key], fn)
                if key in seen:
                    raise self._twice(key, fn, fn)
                seen.add(key)
            for key in keys:
                self[key] = fn
            return fn

        return wrap

    def _twice(self, key: Any, first: Any, second: Any) -> RuntimeError:
        return RuntimeError(f"{self.what}: {key!r} registered twice "
                            f"({_name(first)}, then {_name(second)})")
