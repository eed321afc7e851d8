"""The pilot's loops: each model's reruns against the repetition guard, and the report's "Loops" section.

``procexec loops`` (one model, its pilot's generation files) writes ``loop_figures``: the loops, their tails,
where the guard would have stopped each rerun (``procexec.scoring.guard``) and what the text cut there
scores differently (escapes).  The report joins them with ``procexec cost --measured --json``'s projection
of the full stage with and without the guard (``loop_rows``).  docs/decisions.md ("Loops") states the rule
the figures serve: a model's reruns may be guarded in the full stage only when its pilot saw enough loops
and none escaped.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from procexec.config.guard import configured_guard
from procexec.config.model import Config
from procexec.errors import ProcexecError
from procexec.io.jsonl import read_json, read_jsonl
from procexec.records import Example, GenerationRecord, Reference
from procexec.scoring.files import read_records
from procexec.scoring.guard import GuardEffect, guard_effect
from procexec.scoring.loops import record_loop

#: The decision rule's threshold (docs/decisions.md, "Loops"): a pilot with fewer looping reruns says too
#: little about escapes to guard a model's full stage (0 escapes in 10 bounds the escape rate below ~26% at 95%
#: confidence: 1 - 0.05 ** (1 / 10)).
MIN_PILOT_LOOPS = 10


def file_effects(
    generations: Path, references: Path, dataset: Path, guard: Mapping[str, int]
) -> tuple[int, int, list[GuardEffect]]:
    """One dataset's generations: (attempts 1, those ending in a loop, each rerun against ``guard``)."""
    refs, examples = read_records(references, Reference), read_records(dataset, Example)
    attempts1 = loops1 = 0
    effects = []
    for line, obj in read_jsonl(generations):
        record = GenerationRecord.from_json(obj, f"{generations}:{line}")
        if record.id not in refs or record.id not in examples:
            raise ProcexecError(f"{generations}:{line}: id {record.id!r} is not in {references} and {dataset}")
        if record.attempt == 1:
            attempts1 += 1
            loops1 += record_loop(record) is not None
            continue
        effects.append(guard_effect(record, refs[record.id][1], examples[record.id][1], guard))
    return attempts1, loops1, effects


def loop_figures(
    model: str,
    guard: Mapping[str, int],
    guard_source: str,
    generations: Sequence[str | Path],
    references_dir: str | Path,
    datasets_dir: str | Path,
) -> dict[str, Any]:
    """One model's pilot against ``guard``: per rerun where the guard stops it and what the cut changes; in sum,
    the loops, their tails' tokens, the guard's stops, the tokens it saves and the escapes."""
    examples = attempt1_loops = 0
    effects: list[GuardEffect] = []
    for path in map(Path, generations):
        dataset = path.name.removesuffix(".gz").removesuffix(".jsonl")
        counts = file_effects(
            path, Path(references_dir) / f"{dataset}.jsonl", Path(datasets_dir) / f"{dataset}.jsonl", guard
        )
        examples, attempt1_loops = examples + counts[0], attempt1_loops + counts[1]
        effects += counts[2]
    loops = [e for e in effects if e.looping]
    stops = [e for e in effects if e.stop is not None]
    return {
        "model": model,
        "guard": dict(guard),
        "guard_source": guard_source,
        "examples": examples,
        "attempt1_loops": attempt1_loops,
        "reruns": len(effects),
        "loops": len(loops),  # reruns that end in a loop: decoded to the context under the paper's rule
        "tail_tokens": sum(e.new_tokens for e in loops),
        "guard_stops": len(stops),
        "guard_stops_in_loops": sum(e.looping for e in stops),
        "saved_tokens": sum(e.saved_tokens for e in stops),
        "escapes": sum(e.escape for e in stops),
        "answer_position_moved": sum(e.answer_position_moved for e in stops),
        "unmeasured": sum(not e.measurable for e in effects),  # no token ids or offsets to cut at
        "stopped": [e.to_json() for e in stops],
    }


def guard_verdict(figures: Mapping[str, Any]) -> str:
    """What the pilot's evidence allows for this model's full stage (docs/decisions.md, "Loops")."""
    if figures["escapes"]:
        return f"keep the paper's rule: {figures['escapes']} rerun(s) escaped the guard"
    if figures["unmeasured"]:
        return f"keep the paper's rule: {figures['unmeasured']} rerun(s) could not be cut (no token ids or offsets)"
    if figures["loops"] < MIN_PILOT_LOOPS:
        return f"keep the paper's rule: {figures['loops']} loop(s), fewer than {MIN_PILOT_LOOPS} to judge escapes by"
    return "the guard may be enabled: no escape in its loops"


def read_loop_figures(paths: Sequence[str | Path]) -> list[dict[str, Any]]:
    """The report's input: each file ``procexec loops`` wrote (one lacking a figure is refused in one line)."""
    needed = {"model", "guard", "guard_source", "examples", "reruns", "loops", "tail_tokens", "guard_stops", "escapes"}
    rows = [read_json(path, what="loop figures (procexec loops --out)") for path in paths]
    for path, row in zip(paths, rows, strict=True):
        lacking = sorted(needed - set(row))
        if lacking:
            raise ProcexecError(f"{path}: not the figures of procexec loops (no {', '.join(lacking)}) (--loops)")
    return sorted(rows, key=lambda row: row["model"])


def loop_rows(
    figures: Sequence[Mapping[str, Any]], cost: Mapping[str, Any] | None, abbrevs: Mapping[str, str]
) -> list[dict[str, Any]]:
    """The "Loops" section's rows: each model's pilot figures beside its cost projection (``procexec cost
    --measured --json``'s ``models``: the pilot's tails' GPU-hours, the full stage with and without the guard)."""
    projected = {row["model"]: row for row in (cost or {}).get("models", [])}
    rows = []
    for f in figures:
        p = projected.get(f["model"], {})
        measured = p.get("measured") or {}
        rows.append(
            {
                **f,
                "abbrev": abbrevs.get(f["model"], f["model"]),
                "loop_share": f["loops"] / f["examples"] if f["examples"] else None,
                "tail_gpu_hours": measured.get("pilot_tail_gpu_hours"),
                "unguarded_gpu_hours": p.get("unguarded_gpu_hours"),
                "guarded_gpu_hours": p.get("guarded_gpu_hours"),
                "verdict": guard_verdict(f),
            }
        )
    return rows


def read_cost(path: str | Path | None) -> dict[str, Any] | None:
    """``procexec cost --json``'s output, as the report reads it (None: not given)."""
    if path is None:
        return None
    cost = read_json(path, what="a projection (procexec cost --json)")
    if not isinstance(cost, dict) or not isinstance(cost.get("models"), list):
        raise ProcexecError(f"{path}: not the output of procexec cost --json (no models) (--cost)")
    return cost


def guarded_models(config: Config, figures: Sequence[Mapping[str, Any]], keys: Sequence[str]) -> dict[str, Any]:
    """The models whose reruns this study stage ran guarded (none in the pilot, which reruns unguarded): each one's
    guard, the config key that set it, and the pilot's evidence (``loop_figures``) where it was given."""
    if (config.stage or "full") == "pilot":
        return {}
    evidence = {f["model"]: {**f, "verdict": guard_verdict(f)} for f in figures}
    out = {}
    for key in keys:
        model = config.models.get(key)
        guard, where = (
            (None, "") if model is None or not model.generates_here else configured_guard(model, config.inference)
        )
        if guard is not None:
            out[key] = {"guard": guard.model_dump(), "source": where, "evidence": evidence.get(key)}
    return out
