"""The supported range of batch sizes and sequence lengths, defined once.

Every entry point (the CLI's ``-b``/``--batch-sizes`` and ``--seq-len``, and
``trace``, ``predict``, ``sweep``, ``search`` in Python) checks its numbers
here, so a batch of 2**63 is a one-line error instead of an ``OverflowError``
traceback, and a batch of 2**52 is refused instead of being ranked first.

Inside the range the arithmetic is exact: the kernels count elements, thread
blocks and bytes in int64, and a configuration whose largest count would pass
``MAX_COUNT`` (a single op or the step's memory beyond 2**61 elements or bytes,
which only a huge batch *and* a huge sequence length together reach) is refused
in one line too (``predictor.optable.Graph.check_extent``), so no count can
wrap around or saturate. Times stay x2 per batch doubling up to ``MAX_BATCH_SIZE``
and memory never saturates (``tests/test_hostile.py``).
"""

from __future__ import annotations

from typing import Any

from predictor.errors import InvalidArgumentError

MAX_BATCH_SIZE = 2**31
MAX_SEQ_LEN = 2**31
# The largest element, thread-block or byte count one configuration may reach:
# a sum of three such int64 counts (an op's operands) stays below 2**63.
MAX_COUNT = 2**61


def _integer(value: Any) -> int | None:
    """`value` as a Python int when it is an integer (numpy ones included), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy is a core dependency
        return None
    if isinstance(value, np.integer):
        return int(value)
    return None


def check_batch_size(value: Any, what: str = "batch size") -> int:
    """`value` as an int in 1..MAX_BATCH_SIZE, else a one-line InvalidArgumentError."""
    return _check(value, what, MAX_BATCH_SIZE)


def check_seq_len(value: Any, what: str = "sequence length") -> int:
    """`value` as an int in 1..MAX_SEQ_LEN, else a one-line InvalidArgumentError."""
    return _check(value, what, MAX_SEQ_LEN)


def _check(value: Any, what: str, maximum: int) -> int:
    n = _integer(value)
    if n is None or n <= 0:
        shown = repr(value) if n is None or n.bit_length() <= 128 else \
            f"a negative number of {n.bit_length():,} bits"
        raise InvalidArgumentError(f"{what} must be a positive integer, got {shown}")
    if n > maximum:
        # str() of an int of more than 4,300 digits raises: show its size instead.
        shown = str(n) if n.bit_length() <= 128 else f"of {n.bit_length():,} bits"
        raise InvalidArgumentError(
            f"{what} {shown} is outside the supported range 1..{maximum} "
            f"(2**{maximum.bit_length() - 1})")
    return n
