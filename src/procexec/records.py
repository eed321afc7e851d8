"""Typed records shared by every stage; the one place their fields are defined.

Each record round-trips through one strict-JSON object per line (see
``docs/file-formats.md`` for the field-by-field description).  ``from_json``
checks required fields and types and names the file and line on failure, so a
hand-edited or truncated file is refused before any expensive work.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from dataclasses import dataclass, field
from typing import Any, TypeVar

from procexec.errors import ProcexecError

R = TypeVar("R", bound="Record")


def _type_ok(value: Any, annotation: Any) -> bool:
    origin = typing.get_origin(annotation)
    if annotation is Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_type_ok(value, arg) for arg in typing.get_args(annotation))
    if annotation is type(None):
        return value is None
    if origin is list:
        (item,) = typing.get_args(annotation) or (Any,)
        if not isinstance(value, list):
            return False
        if item in (int, str):  # token lists run to 10^5 items: check at C speed
            return set(map(type, value)) <= {item}
        return all(_type_ok(v, item) for v in value)
    if origin is dict:
        return isinstance(value, dict)
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, annotation)


@functools.cache
def _hints(cls: type) -> tuple[tuple[str, Any, bool], ...]:
    """(name, type, required) per field, computed once per class: ``get_type_hints``
    re-evaluates string annotations and would dominate reading large files."""
    hints = typing.get_type_hints(cls)
    return tuple(
        (f.name, hints[f.name], f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
        for f in dataclasses.fields(cls)
    )


class Record:
    """Mixin: strict JSON (de)serialisation for the dataclasses below."""

    def to_json(self) -> dict[str, Any]:
        """Shallow field dict (not ``dataclasses.asdict``, whose deep copies dominate writing)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}  # type: ignore[arg-type]

    @classmethod
    def from_json(cls: type[R], obj: dict[str, Any], where: str = "") -> R:
        values: dict[str, Any] = {}
        for name, annotation, required in _hints(cls):
            if name not in obj:
                if not required:
                    continue
                raise ProcexecError(f"{where + ': ' if where else ''}{cls.__name__} record is missing field '{name}'")
            value = obj[name]
            if not _type_ok(value, annotation):
                raise ProcexecError(
                    f"{where + ': ' if where else ''}field '{name}' has {type(value).__name__} {value!r:.60}, "
                    f"expected {annotation}"
                )
            values[name] = value
        return cls(**values)


@dataclass(frozen=True)
class Example(Record):
    """One benchmark item: a procedure and its two inputs (a dataset line)."""

    id: str  # "<dataset>:<length>:<index>", unique across the suite
    dataset: str  # e.g. "mixed_float_10-100_k5"
    length: int  # number of steps n
    index: int  # 0-based index within (dataset, length)
    x: int | float
    y: int | float
    procedure: str  # the exact procedure text (spec section 1)
    input_type: str  # "int" | "float"
    input_range: str  # "0-1" | "1-10" | "10-100"
    operator: str  # "add" | "sub" | "mul" | "div" | "mixed"
    lookback: int  # k
    seed: int  # global seed the example was derived from
    spec_version: str


@dataclass(frozen=True)
class Reference(Record):
    """The reference execution of one example."""

    id: str
    dataset: str
    length: int
    index: int
    semantics: str  # "default" | "appendix-a"
    final: str  # exact value as text: "1430...0", "3.25", "inf", "-inf", "nan"
    final_float: float | None  # float64 approximation; null when not finite
    final_type: str  # "int" | "float"
    trace: list[str]  # exact values of S1, S2, ..., S_{n+2} (appendix-a: computed ones only)
    edge_cases: list[str]  # subset of division_by_zero, overflow, nan, inf
    appendix_a_final: str | None  # what the paper's executor returns
    appendix_a_disagrees: bool  # True when appendix_a_final differs from the default final


@dataclass(frozen=True)
class GenerationRecord(Record):
    """One model generation for one example (one attempt)."""

    id: str
    model: str  # model key in config.yaml
    dataset: str
    length: int
    index: int
    attempt: int  # 1 = first pass; 2 = the truncation rerun (the one scored)
    text: str  # raw generated text, thinking included
    num_generated_tokens: int
    finish_reason: str  # "stop" | "length" | "abort"
    token_ids: list[int] | None = None
    # Character offset in ``text`` at which each generated token starts
    # (same length as token_ids); lets scoring map a character to a token index.
    token_offsets: list[int] | None = None
    prompt_sha256: str = ""
    prompt_tokens: int = 0
    system_folded: bool = False  # system text folded into the user turn (template has no system role)
    # Set on an attempt that continued an earlier one (truncation_rerun: continue): its text and token ids
    # are that attempt's followed by the new tokens.
    continues_attempt: int | None = None
    provenance: dict[str, Any] = field(default_factory=dict)  # hf id, revision, engine, sampling, versions, wall time, cache key
