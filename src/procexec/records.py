"""Typed records shared by every stage; the one place their fields are defined.

Each record round-trips through one strict-JSON object per line (see
``docs/file-formats.md`` for the field-by-field description).  ``refuse_invalid``
checks the types of its fields, then their domains (``check``: ids consistent
with dataset/length/index, counts >= 0, attempts >= 1, finish reasons and
semantics from their sets, finite inputs, exact values in the executor's text
form).  A ``GenerationRecord`` is checked when it is constructed
(``CheckedRecord``), so no invalid generation exists to be stored, written or
scored; ``from_json`` checks every record it reads, adds the required fields'
presence and names the file and line on failure, so a hand-edited or truncated
file is refused before any expensive work -- and before it can skew a metric.
Lists of up to 10^5 tokens are checked at C speed.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import types
import typing
from collections.abc import Container, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from procexec.errors import ProcexecError

R = TypeVar("R", bound="Record")

# The operator vocabulary, defined here only: each task variant's name (in dataset ids, configs, score
# rows), the symbol its procedures use ("mixed" draws each step's among the four) and the paper's label.
OPERATOR_SYMBOLS = {"add": "+", "sub": "-", "mul": "*", "div": "/"}
OPERATORS = (*OPERATOR_SYMBOLS, "mixed")  # the paper's order (Table 4, figures)
OPERATOR_LABELS = dict(zip(OPERATORS, ("Add", "Subtract", "Multiply", "Divide", "Mixed")))
INPUT_TYPES = ("int", "float")
# Dataset ids as procexec.benchmark.suite.DatasetSpec.id writes them: OPERATOR_TYPE_LOW-HIGH_kK.
DATASET_ID = re.compile(
    rf"({'|'.join(OPERATORS)})_({'|'.join(INPUT_TYPES)})_(0|[1-9][0-9]*)-([1-9][0-9]*)_k([1-9][0-9]*)"
)
MODEL_KEY = re.compile(r"[a-z0-9][a-z0-9._-]*")  # as the config schema allows
SEMANTICS = ("default", "appendix-a")
EDGE_CASES = ("division_by_zero", "overflow", "nan", "inf")
FINISH_REASONS = ("stop", "length", "abort", "repetition")  # repetition: vLLM's repetition detection
LOOP_BASES = ("tokens", "chars")  # what a loop repeats: token ids, or the text's characters (no ids)
MAX_TOKENS = 1 << 24  # a bound on any token count a record holds: 16.7M, 64x the longest context of the study
# Exact values as procexec.benchmark.executor.format_value writes them: all digits of an int,
# repr of a float (1.5, 1e+16, 2.5e-07, inf, -inf, nan).  ASCII only.
_VALUE = r"-?(?:(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:e[+-][0-9]+)?|inf)|nan"
VALUE_TEXT = re.compile(_VALUE)
INT_TEXT = re.compile(r"-?(?:0|[1-9][0-9]*)")
_TRACE_TEXT = re.compile(rf"(?:{_VALUE})(?:,(?:{_VALUE}))*")  # a trace joined by commas: one C-speed match


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


class InvalidRecord(ProcexecError):
    """A record's fields fail its checks: one line, located by whoever knows where the record came from."""

    def at(self, where: str) -> InvalidRecord:
        """The same problem, prefixed by where the record came from (a file and line, the generation)."""
        return InvalidRecord(f"{where}: {self}") if where else self


class Record:
    """Mixin for the dataclasses below: their checks, strict JSON (de)serialisation."""

    def refuse_invalid(self) -> None:
        """Raise ``InvalidRecord`` on the first problem: a field of the wrong type, then one outside its
        domain (``check``)."""
        values = self.to_json()
        # a class is hashable (python/mypy#11470)
        for name, annotation, _ in _hints(type(self)):  # type: ignore[arg-type]
            value = values[name]
            if not _type_ok(value, annotation):
                expected = getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "")
                raise InvalidRecord(f"field '{name}' has {type(value).__name__} {value!r:.60}, expected {expected}")
        problem = self.check(values)
        if problem:
            raise InvalidRecord(problem)

    def to_json(self) -> dict[str, Any]:
        """Shallow field dict (not ``dataclasses.asdict``, whose deep copies dominate writing)."""
        # self is one of the dataclasses below (mypy sees the mixin only)
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}  # type: ignore[arg-type]

    @classmethod
    def from_json(cls: type[R], obj: dict[str, Any], where: str = "") -> R:
        """The record of one JSON object (unknown fields ignored); a problem is one line led by ``where``."""
        values: dict[str, Any] = {}
        # a class is hashable (python/mypy#11470)
        for name, _, required in _hints(cls):  # type: ignore[arg-type]
            if name in obj:
                values[name] = obj[name]
            elif required:
                raise InvalidRecord(f"{cls.__name__} record is missing field '{name}'").at(where)
        try:
            record = cls(**values)
            if not isinstance(record, CheckedRecord):  # one made here was checked as it was constructed
                record.refuse_invalid()
        except InvalidRecord as exc:
            raise exc.at(where) from None
        return record

    @classmethod
    def check(cls, values: dict[str, Any]) -> str | None:
        """The first domain problem of type-checked field values (``None``: none)."""
        return None


class CheckedRecord(Record):
    """A record checked when it is constructed, whoever constructs it (the job that makes a generation,
    ``dataclasses.replace``, a reader), so none that fails its checks exists.  Examples and References
    are checked when read: the executor's tests run it on inputs no dataset holds (inf, 10**400 beside 2.5)."""

    def __post_init__(self) -> None:
        self.refuse_invalid()


def _position_problem(values: dict[str, Any]) -> str | None:
    """id == "{dataset}:{length}:{index}", a well-formed dataset id, length >= 1, index >= 0."""
    dataset, length, index = values["dataset"], values["length"], values["index"]
    if DATASET_ID.fullmatch(dataset) is None:
        return f"field 'dataset' {dataset!r:.60} is not a dataset id (e.g. add_int_1-10_k1)"
    if length < 1:
        return f"field 'length' is {length}, must be at least 1"
    if index < 0:
        return f"field 'index' is {index}, must be at least 0"
    if values["id"] != f"{dataset}:{length}:{index}":
        return f"field 'id' {values['id']!r:.80} is not '{dataset}:{length}:{index}' (dataset:length:index)"
    return None


def _value_problem(name: str, text: str | None) -> str | None:
    if text is not None and VALUE_TEXT.fullmatch(text) is None:
        return f"field '{name}' {text!r:.60} is not an exact value (digits, a float repr, inf, -inf or nan)"
    return None


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
    operator: str  # one of OPERATORS
    lookback: int  # k
    seed: int  # global seed the example was derived from
    spec_version: str

    @classmethod
    def check(cls, values: dict[str, Any]) -> str | None:
        problem = _position_problem(values)
        if problem:
            return problem
        # a match: _position_problem refused a dataset that is no dataset id
        operator, type_, low, high, k = DATASET_ID.fullmatch(values["dataset"]).groups()  # type: ignore[union-attr]
        expected = {"operator": operator, "input_type": type_, "input_range": f"{low}-{high}", "lookback": int(k)}
        for name, value in expected.items():
            if values[name] != value:
                return f"field '{name}' is {values[name]!r:.40}, but dataset {values['dataset']} says {value!r}"
        for name in ("x", "y"):
            value = values[name]
            if type_ == "int" and type(value) is not int:
                return f"field '{name}' is {value!r}, expected an integer (an int dataset)"
            if type(value) is float and not math.isfinite(value):
                return f"field '{name}' is {value!r}, expected a finite number"
        if values["seed"] < 0:
            return f"field 'seed' is {values['seed']}, must be at least 0"
        return None


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

    @classmethod
    def check(cls, values: dict[str, Any]) -> str | None:
        problem = _position_problem(values)
        if problem:
            return problem
        if values["semantics"] not in SEMANTICS:
            return f"field 'semantics' is {values['semantics']!r:.40}, expected one of {', '.join(SEMANTICS)}"
        problem = _value_problem("final", values["final"]) or _value_problem(
            "appendix_a_final", values["appendix_a_final"]
        )
        if problem:
            return problem
        if values["final_type"] not in INPUT_TYPES:
            return f"field 'final_type' is {values['final_type']!r:.40}, expected int or float"
        if values["final_type"] == "int" and INT_TEXT.fullmatch(values["final"]) is None:
            return f"field 'final' {values['final']!r:.60} is not an integer although final_type is int"
        final_float = values["final_float"]
        if final_float is not None and not math.isfinite(final_float):
            return f"field 'final_float' is {final_float!r}, expected a finite number or null"
        trace, length = values["trace"], values["length"]
        longest = length + 2
        if not 2 <= len(trace) <= longest or (values["semantics"] == "default" and len(trace) != longest):
            return f"field 'trace' has {len(trace)} values, expected {longest} (S1..S{longest})"
        if _TRACE_TEXT.fullmatch(",".join(trace)) is None:
            bad = next(v for v in trace if VALUE_TEXT.fullmatch(v) is None)
            return f"field 'trace' holds {bad!r:.60}, not an exact value"
        unknown = set(values["edge_cases"]) - set(EDGE_CASES)
        if unknown:
            return f"field 'edge_cases' holds {sorted(unknown)[0]!r:.40}, expected a subset of {', '.join(EDGE_CASES)}"
        return None


@dataclass(frozen=True)
class Loop:
    """The repetition loop a generation ends in: found by ``procexec.scoring.loops``, carried by its record."""

    period: int  # elements in one repeated block
    span: int  # elements of the periodic tail (from its start to the end of the generation)
    basis: str  # one of LOOP_BASES

    @property
    def repeats(self) -> int:
        return self.span // self.period

    def to_json(self) -> dict[str, Any]:
        return {"period": self.period, "span": self.span, "basis": self.basis}


def ends_looping(loop: Loop | dict[str, Any] | None, finish_reason: str | None) -> bool:
    """The ``looping`` verdict of status, the store's index and the score row: the generation ends in a
    repetition loop, or vLLM's repetition guard stopped it (a guard's loop may be shorter than ours)."""
    return loop is not None or finish_reason == "repetition"


def _loop_problem(provenance: dict[str, Any]) -> str | None:
    """``provenance.loop``, when there: null or ``{period, span, basis}`` with 1 <= period <= span."""
    if "loop" not in provenance or provenance["loop"] is None:
        return None
    loop = provenance["loop"]
    if not (
        isinstance(loop, dict)
        and set(loop) == {"period", "span", "basis"}
        and all(type(loop[n]) is int for n in ("period", "span"))
        and 1 <= loop["period"] <= loop["span"]
        and loop["basis"] in LOOP_BASES
    ):
        return (
            f"field 'provenance.loop' is {loop!r:.80}, expected null or {{period, span, basis}} "
            f"(1 <= period <= span, basis {' or '.join(LOOP_BASES)})"
        )
    return None


@dataclass(frozen=True)
class Missing:
    """The first expected example without a generation (its file and line, its id), and how many lack one."""

    where: str
    id: str
    count: int


def first_missing(expected: Iterable[tuple[str, str]], present: Container[str]) -> Missing | None:
    """The one "every example has a generation" check (``collect``'s shards, ``score``'s generations file,
    ``import-harness``'s logs): the first ``(where, id)`` of ``expected`` whose id is not ``present``."""
    missing = [(where, rid) for where, rid in expected if rid not in present]
    return Missing(*missing[0], len(missing)) if missing else None


@dataclass(frozen=True)
class GenerationRecord(CheckedRecord):
    """One model generation for one example (one attempt)."""

    id: str
    model: str  # model key in config.yaml
    dataset: str
    length: int
    index: int
    attempt: int  # 1 = first pass; 2 = the truncation rerun (the one scored)
    text: str  # raw generated text, thinking included
    # null: unknown (a harness log that keeps neither, procexec.harness.importer); never guessed
    num_generated_tokens: int | None
    finish_reason: str | None  # "stop" | "length" | "abort" | "repetition" (vLLM repetition detection) | null
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
    # hf id, revision, engine, sampling, versions, wall time, cache key; and ``loop``, the loop verdict
    provenance: dict[str, Any] = field(default_factory=dict)

    @property
    def judged(self) -> bool:
        """Whether the record carries its loop verdict (``provenance.loop``): every record a job made since
        the verdict was kept does; an older one, or one made elsewhere (harness, simulator), is judged by
        its reader (``procexec.scoring.loops.record_loop``)."""
        return "loop" in self.provenance

    @property
    def loop(self) -> Loop | None:
        """The loop the generation ends in, as judged once when the record was made (None: none, or not
        ``judged``)."""
        found = self.provenance.get("loop")
        return None if found is None else Loop(**found)

    @property
    def looping(self) -> bool | None:
        """``ends_looping`` of the carried verdict; None when the record carries none (not ``judged``)."""
        return ends_looping(self.provenance["loop"], self.finish_reason) if self.judged else None

    @classmethod
    def check(cls, values: dict[str, Any]) -> str | None:
        problem = _position_problem(values)
        if problem:
            return problem
        if MODEL_KEY.fullmatch(values["model"]) is None:
            return f"field 'model' {values['model']!r:.60} is not a model key (lower-case letters, digits, . _ -)"
        if values["attempt"] < 1:
            return f"field 'attempt' is {values['attempt']}, must be at least 1"
        if values["finish_reason"] not in (*FINISH_REASONS, None):
            return (
                f"field 'finish_reason' is {values['finish_reason']!r:.40}, expected one of "
                f"{', '.join(FINISH_REASONS)} or null (unknown)"
            )
        tokens = values["num_generated_tokens"]
        for name in ("num_generated_tokens", "prompt_tokens"):
            if not 0 <= (values.get(name) or 0) <= MAX_TOKENS:
                return f"field '{name}' is {values[name]:.3g}, must be 0..{MAX_TOKENS:,} (no context is longer)"
        ids, offsets = values.get("token_ids"), values.get("token_offsets")
        if ids is not None and len(ids) != tokens:
            return f"field 'token_ids' has {len(ids)} entries but num_generated_tokens is {tokens}"
        # Offsets follow the ids when both are there (an endpoint's chat route has offsets from its
        # logprobs but no ids, and counts tokens from its usage report: no length rule then).
        if ids is not None and offsets is not None and len(offsets) != len(ids):
            return f"field 'token_offsets' has {len(offsets)} entries but token_ids has {len(ids)}"
        if offsets and (offsets[0] < 0 or offsets != sorted(offsets)):
            return "field 'token_offsets' must be non-negative and non-decreasing (character offsets into 'text')"
        continued = values.get("continues_attempt")
        if continued is not None and not 1 <= continued < values["attempt"]:
            return f"field 'continues_attempt' is {continued}: an attempt continues an earlier one (1..attempt-1)"
        return _loop_problem(values.get("provenance") or {})
