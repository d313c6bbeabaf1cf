"""`predictor` command line: one module per subcommand in predictor.commands.

Every error a user can cause prints one line on stderr and exits 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Sequence

from predictor import __version__
from predictor.errors import PredictorError
from predictor.io import printable

MAX_ERROR_CHARS = 2000

# Subcommand modules, in the order `--help` lists them.
COMMANDS = ("predict", "sweep", "search", "explore", "calibrate", "gpus", "zoo",
            "train-models")

EXAMPLES = """examples:
  predictor predict resnet50 --batch-size 64
  predictor predict bert-large --gpus T4,A100-SXM4-80GB,H100-SXM5-80GB --json
  predictor predict gpt2-large --seq-len 512 --gpus all --csv
  predictor predict my_model.py:build --batch-size 32 --breakdown 15
  predictor sweep resnet50 --gpus all --batch-sizes 1..1024 --plot sweep.png
  predictor search resnet50 --objective cost --samples 1281167 --epochs 90 --report out/
  predictor explore space.py --gpus T4,H100 -b 8,32 --out runs/nas1 --executor local
  predictor calibrate resnet50 --batch-size 64 -o resnet50.cal.npz
  predictor sweep resnet50 --calibration resnet50.cal.npz --gpus all
  predictor gpus
  predictor zoo
"""


class _Parser(argparse.ArgumentParser):
    """argparse with the one-line error convention (exit 2)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def build_parser() -> tuple[argparse.ArgumentParser, dict]:
    parser = _Parser(
        prog="predictor",
        description="Predict how long one training iteration of a PyTorch model takes on GPUs "
                    "you do not have, from a static trace of the step (no GPU needed).",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"dnn-predictor {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    modules = {}
    for name in COMMANDS:
        mod = importlib.import_module(f"predictor.commands.{name.replace('-', '_')}")
        mod.add_parser(sub)
        modules[mod.NAME] = mod
    return parser, modules


def _one_line_warning(message, category, filename, lineno, line=None) -> str:
    """Warnings as one line, like errors (no source line under them)."""
    return f"predictor: warning: {printable(str(message), MAX_ERROR_CHARS)}\n"


def main(argv: Sequence[str] | None = None) -> int:
    import warnings

    warnings.formatwarning = _one_line_warning
    from predictor.errors import NotApplicableWarning

    # Every output format carries these as notes (commands.common.notes).
    warnings.filterwarnings("ignore", category=NotApplicableWarning)
    parser, modules = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return modules[args.command].run(args)
    except PredictorError as exc:
        # One line: control characters shown as escapes, a huge name cut short.
        print(f"predictor: error: {printable(exc, MAX_ERROR_CHARS)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("predictor: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `predictor ... | head`
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
