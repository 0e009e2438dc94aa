"""``stallfree bench``: comparisons against the tools users would pick instead, same data, one run."""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path
from types import ModuleType
from typing import Any

from stallfree.commands.output import add_json_arguments, add_progress_argument, emit, human

__all__ = ["register"]

# Each name is a module stallfree.bench.<name> exposing `add_arguments(parser)` and `run(args, out) -> results`:
# it prints its table to `out` and returns what --json prints and --json-file writes.
BENCHMARKS = (
    "loader", "breakdown", "e2e", "resize", "clock", "ingest", "transforms", "train", "plan", "scale", "remote",
    "webdataset", "rebuilds", "ray", "stall", "packing", "balance",
)
# The benchmarks that build the Loader's graph in this process: its Numba kernels are loaded (or compiled, once
# after installing, with a line saying so) before their first timed batch.
LOADER_BENCHMARKS = ("loader", "breakdown", "e2e", "resize", "transforms", "webdataset", "remote", "ray", "stall")


def options(name: str, data: Path, **overrides: Any) -> argparse.Namespace:
    """``stallfree bench NAME DATA``'s options as its command line gives them, with ``overrides`` (for the demo).

    Raises:
        TypeError: an override the benchmark has no option for.
    """
    module = importlib.import_module(f"stallfree.bench.{name}")
    parser = argparse.ArgumentParser(prog=f"stallfree bench {name}")
    _add_arguments(parser, module)
    args = parser.parse_args([str(data)])
    unknown = sorted(set(overrides) - set(vars(args)))
    if unknown:
        raise TypeError(f"bench {name} has no option {', '.join(unknown)}")
    return argparse.Namespace(**{**vars(args), **overrides})


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``stallfree bench`` and one sub-command per benchmark."""
    parser = sub.add_parser(
        "bench",
        help="benchmark stallfree against the alternatives on the same data",
        description="Benchmarks that report medians and ratios against the alternative measured in the same run.",
        epilog="examples:\n  stallfree bench loader ./imagenet-subset/train --batches 30\n"
        "  stallfree bench loader ./imagenet-subset/train --json | jq .median",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    which = parser.add_subparsers(dest="benchmark", metavar="BENCHMARK", required=True)
    for name in BENCHMARKS:
        module = importlib.import_module(f"stallfree.bench.{name}")
        bench_parser = which.add_parser(
            name,
            help=module.__doc__.splitlines()[0] if module.__doc__ else name,
            description=module.__doc__,
            epilog=getattr(module, "EXAMPLES", None),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        _add_arguments(bench_parser, module)
        bench_parser.set_defaults(func=lambda args, module=module: _run(module, args))


def _add_arguments(parser: argparse.ArgumentParser, module: ModuleType) -> None:
    """The benchmark's own options and those every command has: one list for the command line and for the demo."""
    module.add_arguments(parser)
    add_json_arguments(parser)
    add_progress_argument(parser)


def _run(module: ModuleType, args: argparse.Namespace) -> int:
    if args.benchmark in LOADER_BENCHMARKS:
        from stallfree.commands.kernels import announce_compiles

        announce_compiles(args.progress)
    emit(args, module.run(args, human(args)))
    return 0
