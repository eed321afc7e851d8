"""A trace simulator (NOT a model): step-by-step outputs with injected, labelled failures.

It writes what a careful model would write ("Step 1: S3 = S1 + S2 = 5 + 8 = 13"
... ``<answer>..</answer>``) from the reference trace, and injects one failure
per example whose class and step are recorded in
``provenance["simulated_failure"]``.  Scoring tests, benchmarks and report
fixtures use it to check that extraction and trace alignment recover what was
injected.  Deterministic: a pure function of (example, reference, seed, options).
"""

from __future__ import annotations

import random
import re

from procexec.benchmark.executor import apply, format_value, parse_value
from procexec.benchmark.procedure import parse_rows
from procexec.records import Example, GenerationRecord, Reference
from procexec.scoring.extract import values_agree

MODEL_KEY = "simulator"
FAILURES = (
    "none",
    "arithmetic_slip",
    "wrong_operand",
    "skipped_step",
    "early_stop",
    "missing_answer",
    "repeated_answer",
    "truncation",
)
STEP_FAILURES = ("arithmetic_slip", "wrong_operand", "skipped_step", "early_stop", "truncation")
# What trace alignment should report as first_error_class for each injected failure.
ALIGNMENT_CLASS = {
    "arithmetic_slip": "arithmetic_slip",
    "wrong_operand": "wrong_operand",
    "skipped_step": "skipped",
    "early_stop": "skipped",
    "truncation": "skipped",
}

# Thinking-style filler: no "S<j> =" claims, no "Step k" markers, no tags.
_FILLER = (
    "Okay, I need to execute this procedure exactly as written.",
    "Each variable depends on earlier ones, so I have to keep every intermediate value.",
    "Let me be careful with the signs here.",
    "Division gives a fraction, so I should keep enough precision.",
    "I will not skip or reorder anything.",
    "Hmm, let me double-check that multiplication before moving on.",
    "The operands come from the previous variables listed in the procedure.",
    "Right, that matches what I had before.",
    "I should write the result with the same variable names.",
    "Let me recompute that carefully to be sure.",
    "So far everything is consistent.",
    "The final answer has to go inside the answer tags.",
)
_TOKEN = re.compile(r"\s*(?:\w{1,4}|[^\w\s])")


def _operand(value: int | float) -> str:
    text = format_value(value)
    return f"({text})" if text.startswith("-") else text


def _line(
    number: int, target: int, left: int, op: str, right: int, a: int | float, b: int | float, value: int | float
) -> str:
    return (
        f"Step {number}: S{target} = S{left} {op} S{right} = {_operand(a)} {op} {_operand(b)} = {format_value(value)}"
    )


def _slip(value: int | float, rnd: random.Random) -> int | float:
    """A value that disagrees with ``value`` under both match rules."""
    k = rnd.choice((-1, 1)) * rnd.randint(1, 9)
    if type(value) is int:
        return value + k * max(1, abs(value) // 1000)
    if value != value or value in (float("inf"), float("-inf")):
        return float(k)
    return value + k * max(1.0, abs(value) * 0.01)


def _wrong_operand(
    target: int, left: int, op: str, right: int, own: list, trace: list, rnd: random.Random
) -> tuple[int | float, int | float] | None:
    """Replace the left operand by another earlier variable so alignment sees a wrong operand."""
    a, b = own[left - 1], own[right - 1]
    candidates = [j for j in range(1, target) if j != left]
    rnd.shuffle(candidates)
    for j in candidates:
        c = own[j - 1]
        value = apply(op, c, b, set())
        operands_look_right = values_agree(c, a) or (op in "+*" and values_agree(b, a) and values_agree(c, b))
        if not operands_look_right and not values_agree(value, trace[target - 1]):
            return c, value
    return None


def _filler(rnd: random.Random, chars: int) -> str:
    parts: list[str] = []
    size = 0
    while size < chars:
        sentence = rnd.choice(_FILLER)
        parts.append(sentence + ("\n" if rnd.random() < 0.2 else " "))
        size += len(parts[-1])
    return "".join(parts).rstrip()


def synthetic_token_offsets(text: str) -> list[int]:
    """Synthetic tokenisation (leading whitespace + up to 4 word characters, or one symbol)."""
    return [m.start() for m in _TOKEN.finditer(text)]


def simulate(
    example: Example,
    reference: Reference,
    seed: int = 0,
    failure: str | None = None,
    step: int | None = None,
    failure_rate: float = 0.5,
    target_chars: int = 8000,
) -> GenerationRecord:
    """One simulated generation; ``failure``/``step`` default to a seeded random draw."""
    rnd = random.Random(f"{seed}:{example.id}")
    rows = parse_rows(example.procedure)
    n = len(rows)
    if failure is None:
        failure = rnd.choice(FAILURES[1:]) if rnd.random() < failure_rate else "none"
    if failure not in FAILURES:
        raise ValueError(f"unknown failure {failure!r}")
    if failure in STEP_FAILURES:
        step = step or rnd.randint(1, n)
    else:
        step = None

    trace = [parse_value(v) for v in reference.trace]
    own = list(trace)
    lines: list[str] = []
    cut = None
    for number, (target, left, op, right) in enumerate(rows, start=1):
        if number == step and failure == "early_stop":
            break
        a, b = own[left - 1], own[right - 1]
        value = trace[target - 1] if a is trace[left - 1] and b is trace[right - 1] else apply(op, a, b, set())
        if number == step and failure == "skipped_step":
            continue
        if number == step and failure == "wrong_operand":
            swapped = _wrong_operand(target, left, op, right, own, trace, rnd)
            if swapped is None:  # no other variable gives a different value: inject a slip instead
                failure = "arithmetic_slip"
            else:
                a, value = swapped
        if number == step and failure == "arithmetic_slip":
            value = _slip(trace[target - 1], rnd)
        if number == step and failure == "truncation":
            cut = sum(len(line) + 1 for line in lines) + len(f"Step {number}: S{target} =")
        own[target - 1] = value
        lines.append(_line(number, target, left, op, right, a, b, value))

    # early stop: the last value reached, S{step+1}
    last = own[step] if step is not None and failure == "early_stop" else own[-1]
    body = "\n".join(lines) + "\n\n"
    if failure == "missing_answer":
        body += f"The final result is {format_value(last)}."
    elif failure == "repeated_answer":
        body += (
            f"<answer>{format_value(_slip(last, rnd))}</answer>\n\n"
            f"Wait, let me re-check the last step.\n\n<answer>{format_value(last)}</answer>"
        )
    elif failure != "truncation":
        body += f"<answer>{format_value(last)}</answer>"
    think = "<think>\n" + _filler(rnd, max(0, target_chars - len(body) - 20)) + "\n</think>\n\n"
    text = think + body
    if cut is not None:
        text = text[: len(think) + cut]
    offsets = synthetic_token_offsets(text)
    return GenerationRecord(
        id=example.id,
        model=MODEL_KEY,
        dataset=example.dataset,
        length=example.length,
        index=example.index,
        attempt=1,
        text=text,
        num_generated_tokens=len(offsets),
        finish_reason="length" if failure == "truncation" else "stop",
        token_offsets=offsets,
        provenance={
            "engine": "simulator",
            "note": "simulated trace with injected failures; not a language model",
            "seed": seed,
            "simulated_failure": {"class": failure, "step": step},
        },
    )
