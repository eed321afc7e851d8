"""A job server's ``serve_args`` parsed the way ``vllm serve`` parses them, with or without vLLM installed.

The submit host's driver venv has no vLLM (only ``.[workflow]``), yet ``check-config``, ``cost`` and the
DAG build read data parallel, expert parallel and ``max-num-seqs`` from ``serve_args``.  String matching
read ``--tensor_parallel_size`` or ``--max-model`` (both accepted by vLLM) as nothing.  So this module
rebuilds the argument structure of vLLM 0.32's ``serve`` subcommand from ``procexec/data/
vllm_serve_flags.json``: every option string of its parser with its ``dest``, ``nargs``, the kind of its
value converter and its ``choices`` (dumped from ``ServeSubcommand().subparser_init``; tests/config/test_serve_args.py
holds the file to the installed vLLM's parser and the two parsers to the same answers), so a value vLLM's
parser refuses (``--kv-cache-dtype no-such-dtype``, ``--max-num-batched-tokens 1.5K``) is refused here.
Values of a JSON-dataclass flag (``--compilation-config``) are vLLM's to validate at start.  Parsing mirrors
``FlexibleArgumentParser``: ``--a_b`` is ``--a-b`` (underscores in a long flag's name), argparse's
unique-prefix abbreviations, ``=`` forms, the last occurrence wins.  A number's range is vLLM's: the table
carries, per flag, the ``ge``/``gt``/``le``/``lt`` of the pydantic ``Field`` of the config dataclass field the
flag sets (``--stream-interval``: ``SchedulerConfig.stream_interval``, ``Field(default=1, ge=1)``,
vllm/config/scheduler.py:213; ``--gpu-memory-utilization``: ``CacheConfig``, ``gt=0, le=1``; 44 flags, the same
in the CUDA wheel), and ``FRONTEND_BOUNDS`` the checks ``vllm serve`` makes of its own flags before loading
(vllm/entrypoints/launchers/cli_args.py).  docs/decisions.md says why not vLLM's own parser.
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, NoReturn

FLAGS_FILE = Path(__file__).resolve().parents[1] / "data" / "vllm_serve_flags.json"

#: Ranges ``vllm serve`` checks itself before loading (``validate_parsed_serve_args``,
#: vllm/entrypoints/launchers/cli_args.py:496-497 and 528-533; the same in the CUDA wheel).
FRONTEND_BOUNDS: dict[str, dict[str, Any]] = {
    "sse_keep_alive_interval": {"ge": 0, "of": "validate_parsed_serve_args"},
    "grpc_port": {"ge": 0, "le": 65535, "of": "validate_grpc_port_arg"},
}
_WORDS = {"ge": "at least", "gt": "above", "le": "at most", "lt": "below"}


class ServeArgsError(ValueError):
    """``serve_args`` that ``vllm serve`` would refuse; the message is one line."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse would print usage and exit 2
        raise ServeArgsError(message)


@dataclass(frozen=True)
class ServeArgs:
    """What the workflow reads from ``serve_args``, as vLLM reads it; ``given``: the dests the list sets."""

    tensor_parallel_size: int | None
    data_parallel_size: int
    enable_expert_parallel: bool | None
    max_num_seqs: int | None
    given: frozenset[str]


@cache
def _flag_table() -> list[tuple[list[str], str, Any, str, list | None, dict[str, Any] | None]]:
    return [tuple(row) for row in json.loads(FLAGS_FILE.read_text(encoding="utf-8"))]


@cache
def _bounds() -> dict[str, dict[str, Any]]:
    """dest -> vLLM's range of its value (the table's, then the frontend's own checks)."""
    return {**{dest: bounds for _, dest, _, _, _, bounds in _flag_table() if bounds}, **FRONTEND_BOUNDS}


def _out_of_bounds(dest: str, value: Any) -> str | None:
    """``value`` where vLLM refuses it for ``dest``: the bound it breaks, in words (None: within)."""
    bounds = _bounds().get(dest)
    if bounds is None or not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    tests = {"ge": value >= bounds.get("ge", value), "gt": "gt" not in bounds or value > bounds["gt"]}
    tests |= {"le": value <= bounds.get("le", value), "lt": "lt" not in bounds or value < bounds["lt"]}
    broken = next((k for k, ok in tests.items() if not ok), None)
    return None if broken is None else f"must be {_WORDS[broken]} {bounds[broken]} (vLLM's {bounds['of']})"


def human_int(value: str) -> int:
    """vLLM's ``human_readable_int`` (vllm/utils/argparse_utils.py): ``25.6k`` is 25600, ``1K`` 1024, no ``1.5K``."""
    value = value.strip()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", value)
    if not match:
        return int(value)
    number, suffix = match.groups()
    if suffix.islower():
        return int(float(number) * 10 ** (3 + 3 * "kmgt".index(suffix)))
    return int(number) * 2 ** (10 + 10 * "KMGT".index(suffix))


def human_int_or_auto(value: str) -> int:
    """vLLM's ``human_readable_int_or_auto``: ``-1`` and ``auto`` (any case) mean -1, else ``human_int``."""
    return -1 if value.strip() == "-1" or value.strip().lower() == "auto" else human_int(value)


def backend_name(value: str) -> str:
    """vLLM's converter for the kernel-backend flags (``--moe-backend``): lower case, dashes as underscores."""
    return value.lower().replace("-", "_")


#: Each value converter of vLLM's serve parser the table names (``kind``), as vLLM converts; ``str`` also stands
#: for the converters whose values vLLM checks only at start (JSON dataclasses, ``--device-ids``).
CONVERTERS = {
    "str": str,
    "int": int,
    "float": float,
    "json": json.loads,
    "human int": human_int,
    "human int or auto": human_int_or_auto,
    "backend name": backend_name,
}


def _optional(converter: Any) -> Any:
    """vLLM's ``optional_type``: an empty value or ``None`` is None, anything else converted."""

    def optional(value: str) -> Any:
        return None if value in ("", "None") else converter(value)

    optional.__name__ = f"optional {converter.__name__}"  # argparse names it in "invalid ... value"
    return optional


def _converter(kind: str) -> Any:
    optional = kind.startswith("optional ")
    converter = CONVERTERS[kind.removeprefix("optional ")]
    return _optional(converter) if optional else converter


@cache
def _parser() -> _Parser:
    parser = _Parser(prog="vllm serve", add_help=False, allow_abbrev=True)
    for flags, dest, nargs, kind, choices, _ in _flag_table():
        if nargs == 0:
            negative = [f for f in flags if f.startswith("--no-")]
            parser.add_argument(
                *[f for f in flags if f not in negative],
                dest=dest,
                action="store_const",
                const=True,
                default=argparse.SUPPRESS,
            )
            if negative:
                parser.add_argument(*negative, dest=dest, action="store_const", const=False, default=argparse.SUPPRESS)
        else:
            parser.add_argument(
                *flags, dest=dest, nargs=nargs, type=_converter(kind), choices=choices, default=argparse.SUPPRESS
            )
    return parser


def _dashed(arg: str) -> str:
    """``FlexibleArgumentParser``: underscores in a ``--long_flag``'s name (up to ``=`` and a ``.``) are dashes."""
    if not arg.startswith("--"):
        return arg
    key, eq, value = arg.partition("=")
    return re.sub(r"(?<=--)[^.]*", lambda m: m.group(0).replace("_", "-"), key, count=1) + eq + value


def serve_values(serve_args: list[Any]) -> dict[str, Any]:
    """The settings ``serve_args`` give (by ``dest``), converted as ``vllm serve`` converts them; ServeArgsError
    (one line) for what its parser would refuse."""
    return vars(_parser().parse_args([_dashed(str(a)) for a in serve_args]))


def parse_serve_args(serve_args: list[Any]) -> ServeArgs:
    """``serve_args`` as ``vllm serve`` reads them; ServeArgsError (one line) for what it would refuse."""
    return _parsed(tuple(str(a) for a in serve_args))


@cache
def _parsed(serve_args: tuple[str, ...]) -> ServeArgs:
    """Once per distinct list: a DAG build asks for each model's layout about a hundred times (layouts, shard
    resources, capacity), and argparse over vLLM's 316 flags takes 0.16 ms a call (profiled: 122 calls a dry run
    of the fuzzed config, a seventh of its time)."""
    values = serve_values(list(serve_args))
    for dest, value in values.items():
        problem = _out_of_bounds(dest, value)
        if problem:
            raise ServeArgsError(f"{_flag_of(dest)} {value}: {problem}")
    return ServeArgs(
        values.get("tensor_parallel_size"),
        values.get("data_parallel_size") or 1,
        values.get("enable_expert_parallel"),
        values.get("max_num_seqs"),
        frozenset(values),
    )


#: ``dest`` of each vLLM server setting the job sets itself, or a model field sets (so that the store key and
#: the GPU checks see it): the model field to set instead, or None.
SET_BY_JOB = {
    "host": None,
    "port": None,
    "uds": None,
    "model": None,
    "served_model_name": None,
    "api_key": None,
    "tensor_parallel_size": "tensor_parallel_size",
    "max_model_len": "max_model_len",
    "dtype": "dtype",
    "tokenizer_mode": "tokenizer_mode",
    "trust_remote_code": "trust_remote_code",
    "revision": "revision",
    "seed": None,
    "generation_config": None,
    "speculative_config": "speculative_config",
}
#: Flags that would carry settings past the check: vLLM reads ``--config FILE``'s flags from the file.
UNCHECKABLE = {"config": "a file of flags the config check cannot read; list them in serve_args"}


def _flag_of(dest: str) -> str:
    return next(row[0][0] for row in _flag_table() if row[1] == dest)


def serve_args_problems(
    where: str, serve_args: list[Any], tensor_parallel_size: int | None, gpus: int | None
) -> list[str]:
    """A job server's ``serve_args`` (``where`` names the model): parsed as vLLM would, no setting the job
    owns, data x tensor parallel within its GPUs (once both are known: a layout left out is planned later)."""
    try:
        parsed = parse_serve_args(serve_args)
    except ServeArgsError as error:
        return [f"{where}.serve_args: {error} (as vllm serve parses it)"]
    problems = []
    for dest in sorted(parsed.given & SET_BY_JOB.keys()):
        field = SET_BY_JOB[dest]
        instead = f"set {where}.{field} instead" if field else "the job sets it"
        problems.append(f"{where}.serve_args: {_flag_of(dest)} is not a serve_args flag ({instead})")
    problems += [
        f"{where}.serve_args: {_flag_of(dest)} is not a serve_args flag ({why})"
        for dest, why in UNCHECKABLE.items()
        if dest in parsed.given
    ]
    if tensor_parallel_size is None or gpus is None:
        return problems
    need = parsed.data_parallel_size * tensor_parallel_size
    if gpus > 0 and need > gpus:
        problems.append(
            f"{where}.serve_args: data parallel {parsed.data_parallel_size} x tensor_parallel_size "
            f"{tensor_parallel_size} needs {need} GPUs, but gpus is {gpus}"
        )
    return problems
