"""User strings made safe to print and plot.

Names come from files and arguments (model names, GPU ids, ONNX op types): in
messages they are shown with control characters (terminal escapes, line
breaks) made visible as \\x.. and cut to a length a line can hold; on a rich
console they are never parsed as markup; in a matplotlib figure never as
mathtext. This module imports nothing from the package (errors use it).
"""

from __future__ import annotations

import contextlib
import re
from typing import Iterator


_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
MAX_NAME_CHARS = 200


def printable(text: object, limit: int = MAX_NAME_CHARS) -> str:
    """`text` safe to print on one line: at most `limit` characters of it
    (then "..."), control characters written as escapes."""
    s = str(text)
    cut = len(s) > limit
    s = _CONTROL.sub(lambda m: ascii(m.group())[1:-1], s[:limit])  # escapes lengthen it
    if cut or len(s) > limit:
        s = s[:max(limit - 3, 1)] + "..."
    return s


def markup_safe(text: object, limit: int = MAX_NAME_CHARS) -> str:
    """`printable(text)` escaped for rich markup (``[/x]`` is shown, not parsed)."""
    from rich.markup import escape

    return escape(printable(text, limit))


@contextlib.contextmanager
def plain_text_figures() -> Iterator[None]:
    """matplotlib settings under which no text is parsed as mathtext or TeX
    (a GPU id ``D$\\foo$`` is drawn as written): figures are created and saved
    inside this block."""
    import matplotlib

    with matplotlib.rc_context({"text.usetex": False, "text.parse_math": False}):
        yield


def plain_log_ticks(ax) -> None:
    """An axes' log axes labelled with plain numbers (1, 2, 5, 10, 0.5), no
    minor labels: matplotlib's own log labels are mathtext, which
    `plain_text_figures` would draw as raw '$\\mathdefault{10^{3}}$'."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    for axis in (ax.xaxis, ax.yaxis):
        if axis.get_scale() == "log":
            if axis is ax.yaxis or axis.get_transform().base == 10:
                axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            axis.set_minor_formatter(NullFormatter())


def precision_words(amp: str | None, dtype: str | None, tf32: bool,
                    traced: str = "dtype as traced") -> str:
    """How a step's floating-point ops run, as titles and report headers say
    it: "amp bf16" under autocast, the dtype asked for, else `traced`;
    " + TF32 matmuls" with TF32."""
    text = f"amp {amp}" if amp else (dtype or traced)
    return text + (" + TF32 matmuls" if tf32 else "")


def flops_text(flops: float, per: str = "iter") -> str:
    """FLOPs with a unit that keeps three significant figures: '4.11 GFLOP/iter',
    '12.3 TFLOP/iter', never '0.00 TFLOP/iter' for a small model."""
    value, unit = float(flops), "FLOP"
    for prefix in ("k", "M", "G", "T", "P", "E"):
        if abs(value) < 1000:
            break
        value, unit = value / 1000, prefix + "FLOP"
    digits = 2 if abs(value) < 10 else 1 if abs(value) < 100 else 0
    return f"{value:,.{digits}f} {unit}/{per}"
