"""Command line: ``relattn demo`` and ``relattn info`` (or ``python -m relattn …``).

A bad flag value, or no command, ends the command with a usage line, one
``error:`` line that names the flag and the value, and exit status 2
(argparse's convention); a failed check of the demo with exit status 1.
``--version`` prints ``relattn`` and its version.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

from . import __version__
from .backends import MODULES, namespace_of_module
from .demo import (
    CHECKS,
    SCHEMES,
    WITH_MEMORY,
    Config,
    config_problem,
    demo,
    find_backends,
    read_text,
)

_SCHEME_NAMES = ", ".join(SCHEMES)
_HOW_MANY = {
    6: "six",
    7: "seven",
    8: "eight",
    9: "nine",
    10: "ten",
    11: "eleven",
    12: "twelve",
}.get(len(SCHEMES), str(len(SCHEMES)))
_WITH_MEMORY = ", ".join(WITH_MEMORY)
_LAYERED = ", ".join(n for n in SCHEMES if n not in ("complex", "disan"))

DEMO_SUMMARY = (
    f"{_HOW_MANY} position schemes ({_SCHEME_NAMES}) over real text, each checked "
    "against a NumPy float64 run and a naive twin"
)

DEMO_DESCRIPTION = (
    "Encode a real text (the Zen of Python, or --text FILE) as byte tokens, segment by "
    f"segment, with {_HOW_MANY} small encoders built from relattn calls with seeded "
    f"random weights, one per position scheme: {_SCHEME_NAMES}. On each backend, each "
    "encoder is checked against a NumPy float64 run of the same scheme and against its "
    "naive twin on the same backend (the formula computed directly: per-pair gathers, "
    "materialised relative tensors and biases, per-pair rotations, unchunked logits); "
    "one row per scheme and backend "
    "gives both differences and the time per segment. --check and --check-segments skip "
    "or shorten the checks (the NumPy float64 runs and the naive twins take most of the "
    "time of a long text); the report says what was skipped. While it runs, a progress bar "
    "per run goes to standard error when that is a terminal. Exit status: 0 if every check "
    "passes (or none runs), 1 if one fails, 2 for a bad flag value or an unusable backend."
)

#: What ``relattn`` with no command lists: each command and what it does.
COMMANDS = {
    "demo": "the position schemes over real text, checked",
    "info": "the array libraries found",
}


def program_name(argv0: str) -> str:
    """How the user ran the command line, for its usage lines.

    ``relattn`` when ``argv0`` is the console script (``.../bin/relattn``,
    ``relattn.exe``), else ``python -m relattn`` (``argv0`` is then the path
    of ``relattn/__main__.py``, or that of whatever called :func:`main`).
    """
    return "relattn" if Path(argv0).stem == "relattn" else "python -m relattn"


def _int_type(minimum: int, what: str) -> Callable[[str], int]:
    """An argparse ``type``: an integer of at least ``minimum``, else a one-line error."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be {what}, got {value}")
        return value

    parse.__name__ = what  # argparse names the type in some messages
    return parse


positive_int = _int_type(1, "a positive integer (at least 1)")
non_negative_int = _int_type(0, "a non-negative integer (at least 0)")

#: The demo's integer flags: the :class:`relattn.demo.Config` field, its type and help.
INT_FLAGS = {
    "segment": (positive_int, "tokens per segment"),
    "memory": (
        non_negative_int,
        f"{_WITH_MEMORY}: tokens kept from past segments, 0 for none",
    ),
    "d_model": (positive_int, "model width; a multiple of --heads"),
    "heads": (positive_int, "attention heads"),
    "layers": (positive_int, f"layers of the {_LAYERED} encoders"),
    "clamp_len": (non_negative_int, "Transformer-XL: distances beyond it share one encoding"),
    "radius": (non_negative_int, "Shaw: clipping radius K of the relative tables"),
    "seed": (non_negative_int, "seed of the random weights"),
}


def info() -> int:
    """Print the array libraries relattn finds, with versions and devices."""
    print(f"relattn {__version__}, Python {sys.version.split()[0]}")
    for name, module in MODULES.items():
        try:
            lib = importlib.import_module(module)
        except ImportError as e:
            print(f"  {name:<17} not installed ({e.name})")
            continue
        top = importlib.import_module(module.partition(".")[0])
        version = getattr(top, "__version__", "?")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                devices = namespace_of_module(lib).__array_namespace_info__().devices()
            where = ", ".join(str(d) for d in devices if d is not None) or "default"
        except Exception as e:  # a library without a usable device (e.g. CuPy with no GPU)
            where = f"no device ({type(e).__name__}: {e})"
        print(f"  {name:<17} {version:<12} {where}")
    return 0


def _parser(prog: str) -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """The command line, and its ``demo`` sub-command (whose ``error`` reports bad flags)."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="relattn's command line: the demo, and the array libraries it finds.",
    )
    parser.add_argument("--version", action="version", version=f"relattn {__version__}")
    commands = parser.add_subparsers(dest="command")
    run = commands.add_parser("demo", help=DEMO_SUMMARY, description=DEMO_DESCRIPTION)
    run.add_argument(
        "--backend",
        default="numpy",
        choices=[*MODULES, "all"],
        metavar="NAME",
        help=f"array library to run on: {', '.join(MODULES)}, or all: every installed one "
        "with a usable device, the others listed as skipped with the reason (default: numpy)",
    )
    run.add_argument(
        "--scheme",
        default="all",
        choices=[*SCHEMES, "all"],
        metavar="NAME",
        help="position scheme, or all (the default): "
        + "; ".join(f"{n} ({c.description})" for n, c in SCHEMES.items()),
    )
    run.add_argument(
        "--text", metavar="FILE", help="UTF-8 text file to encode (default: the Zen of Python)"
    )
    run.add_argument(
        "--dtype",
        default="float32",
        choices=["float32", "float64"],
        help="dtype of the runs checked against NumPy float64 (default: float32)",
    )
    defaults = Config()
    for field, (kind, text) in INT_FLAGS.items():
        run.add_argument(
            f"--{field.replace('_', '-')}",
            type=kind,
            default=getattr(defaults, field),
            metavar="N",
            help=f"{text} (default: {getattr(defaults, field)})",
        )
    run.add_argument(
        "--check",
        default="all",
        choices=CHECKS,
        help="which checks run: all (the default): each backend's run against a NumPy float64 "
        "run of the same scheme and against its naive twin on the same backend; reference or "
        "naive: only that one; none: no check, the times only (the report says so)",
    )
    run.add_argument(
        "--check-segments",
        type=positive_int,
        metavar="N",
        help="check the first N segments only (default: every segment); each backend is still "
        "timed over the whole text",
    )
    run.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bars (by default one per run goes to standard error when that is a "
        "terminal; the report goes to standard output)",
    )
    commands.add_parser("info", help=f"{COMMANDS['info']}, with versions and devices")
    return parser, run


def _read_text(run: argparse.ArgumentParser, path: str | None) -> tuple[str, str]:
    """:func:`relattn.demo.read_text`, with any failure a one-line usage error."""
    try:
        text, name = read_text(path)
    except FileNotFoundError:
        run.error(f"--text {path}: no such file")
    except IsADirectoryError:
        run.error(f"--text {path}: a directory, not a file")
    except UnicodeDecodeError as e:
        byte = e.object[e.start : e.start + 1].hex()
        run.error(f"--text {path}: not UTF-8 text (byte 0x{byte} at offset {e.start})")
    except OSError as e:
        run.error(f"--text {path}: cannot read it ({e.strerror or e})")
    if not text:
        run.error(f"--text {path}: empty file")
    return text, name


def main(argv: list[str] | None = None) -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``); the exit status."""
    parser, run = _parser(program_name(sys.argv[0] if sys.argv else ""))
    args = parser.parse_args(argv)
    if args.command is None:
        commands = " or ".join(f"{name} ({what})" for name, what in COMMANDS.items())
        parser.error(f"a command is required: {commands}")
    if args.command == "info":
        return info()
    if args.check == "none" and args.check_segments is not None:
        run.error(
            f"--check-segments {args.check_segments}: no segment is checked with --check none"
        )

    schemes = list(SCHEMES) if args.scheme == "all" else [args.scheme]
    config = Config(**{field: getattr(args, field) for field in INT_FLAGS})
    problem = config_problem(config, schemes)
    if problem:
        run.error(problem)
    text, name = _read_text(run, args.text)

    if args.dtype == "float64":
        os.environ.setdefault("JAX_ENABLE_X64", "1")  # read when JAX is first imported
    names, skipped = find_backends(list(MODULES) if args.backend == "all" else [args.backend])
    if args.backend != "all" and skipped:
        run.error(f"--backend {args.backend}: {skipped[args.backend]}")
    for skip, why in skipped.items():
        print(f"skipped {skip}: {why}")
    if skipped:
        print()

    ok = demo(
        names,
        text,
        name,
        config,
        args.dtype,
        schemes,
        check=args.check,
        check_segments=args.check_segments,
        progress=not args.no_progress and sys.stderr.isatty(),
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
