"""Speculative decoding judged on a model's own outputs: what drafting accepts, what it speeds, what it changes.

One function (``speculative_figures``) computes the figures for both places that show them:
``benchmarks/bench_speculative.py`` (two engines on the same prompt ids) and the pilot's report
(``pilot_speculative``: the pilot's slice of a model generated plain and with drafting, into two
stores; ``procexec speculative-pilot`` compares their shards, and ``procexec report --speculative``
hands the files' rows to the report, which reads no store).  A generation is identical when its
token ids (attempt 1, then attempt 2 where there is one) equal plain greedy's; for the others the
first differing position says how early the drafted engine's numerics flipped an argmax.

The figures file is a typed format (``PilotFigures``): every figure of its type and range, the counts
consistent with each other (identical of at most the generations compared, one first difference per other
generation, shares in [0, 1], accepted of at most the drafted tokens), read back one file per model the
config runs; each problem one line naming the file and the figure.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from procexec.errors import ProcexecError, validation_problems
from procexec.generation.collect import model_records
from procexec.generation.engine_stats import EngineStats, read_stats
from procexec.generation.store import writer_stage
from procexec.io.jsonl import read_json
from procexec.records import MODEL_KEY

Count = Annotated[StrictInt, Field(ge=0)]
Rate = Annotated[float, Field(ge=0)] | None  # tokens per second, a ratio (rounded); None: not measured
Share = Annotated[float, Field(ge=0, le=1)] | None


def _inconsistent(field: str, problem: str) -> PydanticCustomError:
    return PydanticCustomError("figures", "{problem}", {"field": field, "problem": problem})


def _phrase(error: dict[str, Any]) -> tuple[tuple[Any, ...], str] | None:
    """A consistency error as the figure it names (``validation_problems``' phrasing)."""
    return ((error["ctx"]["field"],), error["ctx"]["problem"]) if error["type"] == "figures" else None


class PilotFigures(BaseModel):
    """One model's figures as ``procexec speculative-pilot --out`` writes them (strict: a number is no text)."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    model: Annotated[str, Field(pattern=MODEL_KEY.pattern)]
    speculative_config: dict[str, Any] | None
    generations: Count
    acceptance_rate: Share
    mean_acceptance_length: Annotated[float, Field(ge=1)] | None  # 1 + accepted / drafts
    drafts: Count
    draft_tokens: Count
    accepted_tokens: Count
    plain_tok_s: Rate
    speculative_tok_s: Rate
    speed_ratio: Rate
    identical: Count
    identical_share: Share
    first_difference_at: list[Count]

    @model_validator(mode="after")
    def _consistent(self) -> PilotFigures:
        differ = self.generations - self.identical
        if differ < 0:
            raise _inconsistent("identical", f"{self.identical} of {self.generations} generations compared")
        if len(self.first_difference_at) != differ:
            raise _inconsistent(
                "first_difference_at", f"{len(self.first_difference_at)} positions for {differ} generations that differ"
            )
        share = round(self.identical / self.generations, 3) if self.generations else None
        if self.identical_share != share:
            raise _inconsistent(
                "identical_share", f"{self.identical_share} is not {self.identical} / {self.generations}"
            )
        if self.accepted_tokens > self.draft_tokens:
            raise _inconsistent("accepted_tokens", f"{self.accepted_tokens} of {self.draft_tokens} drafted")
        return self


def first_difference(a: Sequence[int], b: Sequence[int]) -> int:
    """The first position where two id sequences differ (the shorter's length when one extends the other)."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _rounded(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def speculative_figures(
    plain: Sequence[Sequence[int]], drafted: Sequence[Sequence[int]], plain_run: EngineStats, drafted_run: EngineStats
) -> dict[str, Any]:
    """The figures of one model: ``plain[i]`` and ``drafted[i]`` are the same prompt's token ids without and with
    drafting; each run's decoded tokens and seconds give its rate, ``drafted_run``'s counters the acceptance."""
    differ = [first_difference(a, b) for a, b in zip(plain, drafted, strict=True) if list(a) != list(b)]
    plain_rate, drafted_rate = plain_run.tokens_per_s, drafted_run.tokens_per_s
    return {
        "generations": len(plain),
        "acceptance_rate": _rounded(drafted_run.acceptance_rate, 3),
        "mean_acceptance_length": _rounded(drafted_run.mean_acceptance_length, 3),
        "drafts": drafted_run.drafts,
        "draft_tokens": drafted_run.draft_tokens,
        "accepted_tokens": drafted_run.accepted_tokens,
        "plain_tok_s": _rounded(plain_rate, 2),
        "speculative_tok_s": _rounded(drafted_rate, 2),
        "speed_ratio": None if not plain_rate or drafted_rate is None else round(drafted_rate / plain_rate, 3),
        "identical": len(plain) - len(differ),
        "identical_share": round(1 - len(differ) / len(plain), 3) if plain else None,
        "first_difference_at": differ,
    }


def _generations(shards: Sequence[Path], model: str) -> tuple[dict[str, list[int]], Any]:
    """Example id -> its token ids, attempt 1 then attempt 2, from a model's shard files; and the
    ``speculative_config`` their engine ran with (``provenance.engine``)."""
    attempts: dict[str, dict[int, list[int]]] = {}
    spec = None
    for shard in shards:
        for where, record in model_records(shard, model):
            if record.token_ids is None:
                raise ProcexecError(f"{where}: {record.id} has no token ids to compare (an endpoint's record?)")
            attempts.setdefault(record.id, {})[record.attempt] = record.token_ids
            spec = (record.provenance.get("engine") or {}).get("speculative_config")
    return {rid: [t for _, ids in sorted(by.items()) for t in ids] for rid, by in attempts.items()}, spec


def _stage_stats(store_dir: Path, stage: str, flag: str) -> EngineStats:
    """The engine statistics a study stage's shards kept in a store (``procexec.generation.engine_stats``); a store
    without any (no folder, or another study stage's) is refused, naming ``flag``: its rates would be no figure."""
    files = sorted((store_dir / "stats").glob("*.json")) if store_dir.is_dir() else []
    kept = [p for p in files if writer_stage(p.stem) == stage]
    if not kept:
        what = "is not a folder" if not store_dir.is_dir() else f"holds no engine statistics of the {stage}"
        raise ProcexecError(f"{flag} {store_dir}: {what} (the store the shards were generated into)")
    return sum((read_stats(p) for p in kept), EngineStats())


def pilot_figures(
    model: str, plain_shards: Sequence[Path], drafted_shards: Sequence[Path], plain_store: Path, drafted_store: Path
) -> PilotFigures:
    """One model's figures from the pilot's two halves: their shards paired by example, their stores' pilot
    statistics (decode rates; the speculative half's draft counters)."""
    plain_stats = _stage_stats(plain_store, "pilot", "--plain-store")
    drafted_stats = _stage_stats(drafted_store, "pilot", "--speculative-store")
    (plain, _), (drafted, spec) = _generations(plain_shards, model), _generations(drafted_shards, model)
    if not plain or not drafted:
        flag, shards = ("--plain", plain_shards) if not plain else ("--speculative", drafted_shards)
        raise ProcexecError(f"{flag} {' '.join(map(str, shards))}: no record of model {model} to compare")
    if set(plain) != set(drafted):
        lacking = sorted(set(plain) ^ set(drafted))
        raise ProcexecError(
            f"model {model}: the pilot's plain and speculative shards hold different examples ({len(lacking)}, "
            f"e.g. {lacking[0]})"
        )
    ids = sorted(plain)
    figures = speculative_figures([plain[i] for i in ids], [drafted[i] for i in ids], plain_stats, drafted_stats)
    return PilotFigures.model_validate({"model": model, "speculative_config": spec, **figures})


def read_pilot_figures(paths: Sequence[str | Path], run_models: Iterable[str]) -> list[dict[str, Any]]:
    """The report's rows: each file ``procexec speculative-pilot`` wrote, one per model of ``run_models`` at most,
    by model; a file that is not such figures is refused in one line naming it and the figure (--speculative)."""
    run = set(run_models)
    rows: dict[str, tuple[str | Path, PilotFigures]] = {}
    for path in paths:
        obj = read_json(path, what="speculative pilot figures (procexec speculative-pilot --out)")
        try:
            figures = PilotFigures.model_validate(obj)
        except ValidationError as exc:
            raise ProcexecError(
                f"{path}: not the figures of procexec speculative-pilot "
                f"({validation_problems(exc, phrase=_phrase, whole='the file')[0]}) (--speculative)"
            ) from None
        if figures.model not in run:
            raise ProcexecError(f"{path}: the figures of model {figures.model!r}, which the config does not run")
        if figures.model in rows:
            raise ProcexecError(f"{path}: a second file of model {figures.model} (the first: {rows[figures.model][0]})")
        rows[figures.model] = (path, figures)
    return [figures.model_dump() for _, (_, figures) in sorted(rows.items())]
