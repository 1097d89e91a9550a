"""Command line: ``python -m relattn demo`` and ``python -m relattn info``."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import warnings

from . import __version__
from .backends import namespace_of_module
from .demo import BACKENDS, SCHEMES, Config, available, demo, read_text


def info() -> int:
    """Print the array libraries relattn finds, with versions and devices."""
    print(f"relattn {__version__}, Python {sys.version.split()[0]}")
    for name, module in BACKENDS.items():
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m relattn", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("demo", help="Transformer-XL encoder over real text, checked")
    run.add_argument(
        "--backend",
        default="numpy",
        choices=[*BACKENDS, "all"],
        help="array library to run on; 'all' runs every installed one (default: numpy)",
    )
    run.add_argument(
        "--scheme",
        default="all",
        choices=[*SCHEMES, "all"],
        help="position scheme: " + "; ".join(f"{n}: {c.description}" for n, c in SCHEMES.items()),
    )
    run.add_argument("--text", help="UTF-8 text file (default: the Zen of Python)")
    run.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    defaults = Config()
    for field in ("segment", "memory", "d_model", "heads", "layers", "clamp_len", "radius", "seed"):
        run.add_argument(f"--{field.replace('_', '-')}", type=int, default=getattr(defaults, field))
    commands.add_parser("info", help="array libraries found, with versions and devices")
    args = parser.parse_args(argv)

    if args.command == "info":
        return info()
    if args.dtype == "float64":
        os.environ.setdefault("JAX_ENABLE_X64", "1")  # read when JAX is first imported
    names = available(list(BACKENDS)) if args.backend == "all" else [args.backend]
    config = Config(
        segment=args.segment,
        memory=args.memory,
        d_model=args.d_model,
        heads=args.heads,
        layers=args.layers,
        clamp_len=args.clamp_len,
        radius=args.radius,
        seed=args.seed,
    )
    text, name = read_text(args.text)
    if not text:
        parser.error(f"--text {args.text} is empty")
    schemes = list(SCHEMES) if args.scheme == "all" else [args.scheme]
    ok = demo(names, text, name, config, args.dtype, schemes)
    print("\nall checks passed" if ok else "\nSOME CHECKS FAILED", file=sys.stdout)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
