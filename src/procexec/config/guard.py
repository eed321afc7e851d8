"""Which repetition guard a model's reruns carry, and the one a pilot evaluates when the config sets none.

One answer for every reader: the job (``procexec.generation.job_settings``), the cost projection, the pilot's
loops (``procexec loops``, ``procexec.analysis.loops``) and the workflow's report statement.
"""

from __future__ import annotations

from procexec.config.model import Inference, ModelBase, RepetitionGuard

#: The guard the pilot evaluates for a model whose config sets none (``inference.rerun_repetition_guard`` and
#: ``models.<key>.rerun_repetition_guard`` null): patterns up to 128 tokens, the most the config allows
#: (``procexec.config.model.GUARD_PATTERN_MAX``), each repeated 16 times.  16 keeps short legitimate repeats
#: (a run of zero digits, blank lines) apart from loops: a one-token pattern needs 16 identical tokens, a
#: 16-token one 256 (the span of ``procexec.scoring.loops``' token test).  A loop of period p <= 128 is cut
#: after at most 16 x p tokens of it, 2,048 at most.
CANDIDATE_GUARD: dict[str, int] = {"max_pattern_size": 128, "min_pattern_size": 1, "min_count": 16}


def configured_guard(model: ModelBase, inference: Inference) -> tuple[RepetitionGuard | None, str]:
    """The repetition guard a model's reruns carry outside the pilot, and the config key that sets it: the
    model's own (``models.KEY.rerun_repetition_guard``), else ``inference.rerun_repetition_guard``."""
    if model.rerun_repetition_guard is not None:
        return model.rerun_repetition_guard, f"models.{model.key}.rerun_repetition_guard"
    return inference.rerun_repetition_guard, "inference.rerun_repetition_guard"


def evaluated_guard(model: ModelBase, inference: Inference) -> tuple[dict[str, int], str]:
    """The repetition guard a model's reruns carry (``configured_guard``), else the one a pilot evaluates for it
    (``CANDIDATE_GUARD``), and where it comes from (a config key, or "candidate")."""
    guard, where = configured_guard(model, inference)
    return (dict(CANDIDATE_GUARD), "candidate") if guard is None else (guard.model_dump(), where)
