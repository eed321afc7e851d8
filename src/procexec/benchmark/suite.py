"""Deterministic generation of the benchmark suite (spec section 1).

Every example is a pure function of (dataset id, length, index, global seed):
its random stream is seeded from a SHA-256 of those four values, so any
subset can be regenerated in any order, by any number of processes, on any
machine, and come out byte-identical.  Only ``Random.random()`` is used, the
one method whose sequence Python guarantees across versions for a given seed.
"""

from __future__ import annotations

import functools
import hashlib
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import yaml

from procexec import SPEC_VERSION
from procexec.benchmark.procedure import HEADER, LET_LINES
from procexec.errors import ProcexecError
from procexec.records import DATASET_ID, OPERATOR_SYMBOLS, Example

_MIXED = tuple(OPERATOR_SYMBOLS.values())


@dataclass(frozen=True)
class InputSetting:
    """How x and y are drawn: uniform ints in [low, high] or floats rounded to 3 decimals."""

    type: str
    low: int
    high: int

    @property
    def range_label(self) -> str:
        return f"{self.low}-{self.high}"


@dataclass(frozen=True)
class DatasetSpec:
    operator: str  # one of procexec.records.OPERATORS
    setting: InputSetting
    lookback: int

    @property
    def id(self) -> str:
        return f"{self.operator}_{self.setting.type}_{self.setting.range_label}_k{self.lookback}"

    @classmethod
    def from_id(cls, dataset_id: str) -> DatasetSpec:
        m = DATASET_ID.fullmatch(dataset_id)
        if m is None:
            raise ProcexecError(
                f"unknown dataset id {dataset_id!r}; expected OPERATOR_TYPE_LOW-HIGH_kK "
                "such as 'add_int_1-10_k1' or 'mixed_float_10-100_k5'"
            )
        operator, type_, low, high, k = m.groups()
        if int(low) >= int(high):
            raise ProcexecError(f"dataset id {dataset_id!r}: range low must be below high")
        return cls(operator, InputSetting(type_, int(low), int(high)), int(k))


def _rng(seed: int, dataset_id: str, length: int, index: int) -> random.Random:
    material = f"procexec/v1|{seed}|{dataset_id}|{length}|{index}".encode()
    return random.Random(int.from_bytes(hashlib.sha256(material).digest()[:16], "big"))


def _draw_input(rnd: Callable[[], float], setting: InputSetting) -> int | float:
    span = setting.high - setting.low
    if setting.type == "int":
        return setting.low + int(rnd() * (span + 1))
    return round(setting.low + span * rnd(), 3)


@functools.lru_cache(maxsize=8)
def _text_pieces(last: int) -> tuple[list[str], list[str]]:
    """Cached "Step i: S{i+2} = " heads and "Sj" names up to S{last}."""
    heads = [f"Step {t - 2}: S{t} = " for t in range(last + 1)]
    names = [f"S{j}" for j in range(last + 1)]
    return heads, names


@functools.cache
def _ordered_pairs(size: int) -> tuple[tuple[int, int], ...]:
    """Ordered pairs of distinct offsets 0..size-1: two draws without replacement, in draw order."""
    return tuple((i, j) for i in range(size) for j in range(size) if i != j)


def _draw_procedure(rnd: Callable[[], float], length: int, operator: str, lookback: int) -> str:
    """Operands from the look-back window W_t(k) (spec "Operand choice") and the operator.

    One uniform draw per step picks the ordered operand pair and, for
    ``mixed``, the operator, uniformly among all combinations.  The text is
    written directly (same bytes as ``procedure.render``; a test checks it):
    this loop runs 2.75 million times for the full suite.
    """
    ops = _MIXED if operator == "mixed" else (OPERATOR_SYMBOLS[operator],)
    n_ops = len(ops)
    heads, names = _text_pieces(length + 2)
    lines = [HEADER, *LET_LINES]
    for target in range(3, length + 3):
        low = max(1, target - lookback)
        size = target - low
        if size >= 2:
            pairs = _ordered_pairs(size)
            pick, op = divmod(int(rnd() * len(pairs) * n_ops), n_ops)
            first, second = pairs[pick]
            first += low
            second += low
        else:  # k = 1: S_{t-1} and an input other than S_{t-1}, in random order
            previous = target - 1
            pairs = (
                ((previous, 1), (1, previous))
                if previous == 2
                else ((previous, 1), (1, previous), (previous, 2), (2, previous))
            )
            pick, op = divmod(int(rnd() * len(pairs) * n_ops), n_ops)
            first, second = pairs[pick]
        lines.append(f"{heads[target]}{names[first]} {ops[op]} {names[second]}")
    lines.append(f"Final Step: Return S{length + 2}")
    return "\n".join(lines)


def generate_example(spec: DatasetSpec, length: int, index: int, seed: int) -> Example:
    if length < 1:
        raise ProcexecError(f"bad length {length}: a procedure needs at least one step")
    if index < 0:
        raise ProcexecError(f"bad index {index}")
    rnd = _rng(seed, spec.id, length, index).random
    x = _draw_input(rnd, spec.setting)
    y = _draw_input(rnd, spec.setting)
    return Example(
        id=f"{spec.id}:{length}:{index}",
        dataset=spec.id,
        length=length,
        index=index,
        x=x,
        y=y,
        procedure=_draw_procedure(rnd, length, spec.operator, spec.lookback),
        input_type=spec.setting.type,
        input_range=spec.setting.range_label,
        operator=spec.operator,
        lookback=spec.lookback,
        seed=seed,
        spec_version=SPEC_VERSION,
    )


def parse_example_id(example_id: str) -> tuple[DatasetSpec, int, int]:
    """``"add_int_1-10_k1:5:0"`` -> (dataset spec, length, index), as ``Example.id`` writes it."""
    parts = example_id.split(":")
    if len(parts) != 3 or not all(p.isascii() and p.isdigit() for p in parts[1:]):
        raise ProcexecError(f"example id {example_id!r}: expected DATASET:LENGTH:INDEX such as 'add_int_1-10_k1:5:0'")
    return DatasetSpec.from_id(parts[0]), int(parts[1]), int(parts[2])


def generate_dataset(
    spec: DatasetSpec, lengths: tuple[int, ...] | list[int], examples_per_length: int, seed: int
) -> list[Example]:
    """All examples of one dataset, ordered by (length as configured, index)."""
    return [generate_example(spec, length, index, seed) for length in lengths for index in range(examples_per_length)]


#: The paper's suite, packaged: the suite-only commands read it outside a checkout (no config.yaml there).
SUITE_FILE = Path(__file__).resolve().parents[1] / "data" / "suite.yaml"


def default_suite() -> dict[str, Any]:
    """config.yaml's ``suite:`` section as the package ships it (tests/config/test_config.py holds the two equal)."""
    return yaml.safe_load(SUITE_FILE.read_text(encoding="utf-8"))


class InputRangeFields(Protocol):
    """One of a suite's ``inputs`` (procexec.config.model.InputRange)."""

    @property
    def type(self) -> str: ...
    @property
    def low(self) -> int: ...
    @property
    def high(self) -> int: ...


class FamilyFields(Protocol):
    """One of a suite's operator ``families`` (procexec.config.model.Family)."""

    @property
    def operators(self) -> Sequence[str]: ...
    @property
    def lookbacks(self) -> Sequence[int]: ...


class SuiteGrid(Protocol):
    """What ``expand_suite`` reads of a suite: procexec.config.model.Suite (config.yaml's ``suite:``) has it."""

    @property
    def inputs(self) -> Sequence[InputRangeFields]: ...
    @property
    def families(self) -> Mapping[str, FamilyFields]: ...
    @property
    def datasets(self) -> Sequence[str] | None: ...


def expand_suite(suite: SuiteGrid, subset: bool = True) -> list[DatasetSpec]:
    """All dataset specs of a suite in a stable order (families, inputs, operators, k).

    With ``subset`` the optional ``suite.datasets`` list narrows the result.
    """
    settings = [InputSetting(s.type, s.low, s.high) for s in suite.inputs]
    specs = [
        DatasetSpec(operator=op, setting=setting, lookback=k)
        for family in suite.families.values()
        for setting in settings
        for op in family.operators
        for k in family.lookbacks
    ]
    if subset and suite.datasets:
        wanted = set(suite.datasets)
        specs = [s for s in specs if s.id in wanted]
    return specs
