"""Typed errors. Every failure a user can cause is one of these, so the CLI can
print one line and exit 2 instead of a traceback."""

from predictor.text import printable


# The longest message an error carries (a name from a file can be megabytes long).
MAX_MESSAGE_CHARS = 2000


class PredictorError(Exception):
    """Base class: a problem with the user's input, explained in one line.

    The message is made printable where it is raised: the names it quotes come
    from files and arguments, so control characters (terminal escapes, line
    breaks) are shown as escapes and its length is capped."""

    def __init__(self, *args, **kwargs):
        if args and isinstance(args[0], str):
            args = (printable(args[0], MAX_MESSAGE_CHARS), *args[1:])
        super().__init__(*args, **kwargs)


class UnknownModelError(PredictorError, KeyError):
    """A zoo name or factory path that does not resolve to a model."""

    def __str__(self) -> str:  # KeyError would quote the message
        return self.args[0] if self.args else ""


class UnknownGPUError(PredictorError, KeyError):
    """A GPU id that is not in the GPU database."""

    def __str__(self) -> str:
        return self.args[0] if self.args else ""


class SpecError(PredictorError, ValueError):
    """A GPU spec file that is missing fields or has impossible values."""


class TraceError(PredictorError, RuntimeError):
    """The model could not be traced (bad inputs, data-dependent control flow...)."""


class InvalidArgumentError(PredictorError, ValueError):
    """A bad batch size, dtype, optimizer name, etc."""


class FileFormatError(PredictorError, ValueError):
    """A file the tool reads (an ONNX model, a calibration, a saved graph) that is
    missing, truncated, corrupt or of an unsupported version; the message names
    the file and the problem."""


class WeightsError(PredictorError):
    """The shipped or user-given op-model weights file cannot be used."""


class CalibrationError(PredictorError, RuntimeError):
    """A calibration's measurements failed their sanity checks
    (``predictor.calibration.checks``): not saved."""


class WriteError(PredictorError, OSError):
    """A file could not be written (missing folder, no permission, disk full)."""


class MissingExtraError(PredictorError, ImportError):
    """An optional dependency is not installed; the message names the extra
    that installs it (``pip install 'dnn-predictor[onnx]'``)."""

    def __init__(self, package: str, extra: str, needed_for: str):
        super().__init__(f"{needed_for} need the {package} package: "
                         f"pip install 'dnn-predictor[{extra}]'", name=package)


class NotApplicableWarning(UserWarning):
    """An option that changes nothing for the step or some of the GPUs asked
    about (TF32 matmuls on a GPU without TF32 tensor cores). The Python API
    warns; the command line shows the same sentence as a note instead."""
