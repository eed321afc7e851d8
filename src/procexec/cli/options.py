"""The argument types the subcommands share.

Every numeric option has its range in its type, so a value outside it is a
one-line usage error (exit 2) before any work starts.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable

from procexec.config.model import Config

# ASCII only, like the answer grammar: int() and float() would also take "٣", "1_000" or "infinity".
_INT = re.compile(r"[+-]?[0-9]+")
_FLOAT = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def int_range(low: int, high: int | None = None) -> Callable[[str], int]:
    """argparse type: an integer in [low, high] (no upper bound without ``high``)."""

    def parse(text: str) -> int:
        if _INT.fullmatch(text.strip()) is None:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer")
        value = int(text)
        if value < low or (high is not None and value > high):
            bound = f"at least {low}" if high is None else f"between {low} and {high}"
            raise argparse.ArgumentTypeError(f"{value} must be {bound}")
        return value

    parse.__name__ = "integer"  # argparse names the type in its messages
    return parse


def float_range(low: float, high: float) -> Callable[[str], float]:
    """argparse type: a finite number in [low, high]."""

    def parse(text: str) -> float:
        if _FLOAT.fullmatch(text.strip()) is None:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number")
        value = float(text)
        if not math.isfinite(value) or not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text} must be a number between {low:g} and {high:g}")
        return value

    parse.__name__ = "number"
    return parse


positive_int = int_range(1)  # counts: shards, examples per length, workers
seed_int = int_range(0)  # seeds: numpy and the config schema want them non-negative


def add_config_option(parser: argparse.ArgumentParser, required: bool = True, what: str = "workflow config") -> None:
    """``--config FILE [FILE ...]``: the files the workflow was run with (``config.yaml`` then each
    ``--configfile``), merged as Snakemake merges them, so a demo's status reads the demo's config."""
    parser.add_argument(
        "--config",
        nargs="+",
        metavar="FILE",
        required=required,
        help=f"{what}; several files merge in order, as snakemake --configfile merges them "
        "(e.g. --config config.yaml config/demo.yaml)",
    )


def load_config(paths: list[str]) -> Config:
    """The files of ``--config`` read strictly, merged and validated (``procexec.config.load_merged``), each
    model's layout planned for ``cluster.hardware`` (``procexec.cluster.layouts.planned``): the reader of
    ``check-config`` and of the workflow's jobs (no second one)."""
    from procexec.cluster.layouts import load_planned

    return load_planned(paths)
