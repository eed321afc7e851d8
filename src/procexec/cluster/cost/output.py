"""The output model, per procedure length L (5..95 steps), and the tokens each phase decodes:

* a generation that stops on its own has ``mean_tokens(L)`` tokens;
* ``truncation(L)`` of them hit ``max_new_tokens`` instead (reasoning models
  on long procedures: peers report 19-37% capped at 95 steps);
* a truncated one, given more room (the rerun), needs ``rerun_extra`` tokens
  more on average, as far as the context allows.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from procexec.cluster.cost.catalog import Catalog
from procexec.cluster.cost.throughput import Engine, Layout, decode_rate
from procexec.config.model import Inference, ModelBase


@dataclass(frozen=True)
class OutputModel:
    base_tokens: float  # mean output of an untruncated generation at L = 0 ...
    tokens_per_step: float  # ... growing linearly with the procedure length
    truncation_at_5: float
    truncation_at_95: float
    rerun_extra: float  # mean tokens a truncated generation needs beyond max_new_tokens

    def mean_tokens(self, length: int) -> float:
        return self.base_tokens + self.tokens_per_step * length

    def truncation(self, length: int) -> float:
        share = min(max((length - 5) / 90, 0.0), 1.0)
        return self.truncation_at_5 + (self.truncation_at_95 - self.truncation_at_5) * share


# Reasoning models (thinking traces of thousands of tokens): 2.5k tokens at 5 steps to 11.5k at 95,
# 2% truncated at 5 steps rising to 30% at 95 (peers: 19-37% capped at 95 steps).
REASONING = OutputModel(
    base_tokens=2000, tokens_per_step=100, truncation_at_5=0.02, truncation_at_95=0.30, rerun_extra=12000
)
# Instruction models without a thinking phase (MI-7, the demo's SmolLM2): short answers, rarely capped.
INSTRUCT = OutputModel(
    base_tokens=300, tokens_per_step=20, truncation_at_5=0.0, truncation_at_95=0.01, rerun_extra=2000
)


def output_model(model: ModelBase) -> OutputModel:
    """The output model of a configured model (``reasoning: false`` for instruction models)."""
    return REASONING if model.reasoning else INSTRUCT


#: The token volume the interval of a stated projection covers: (tokens factor, reasoning models' truncation at
#: 95 steps) at its low and high end.  Truncation: the peers' 19-37% capped at 95 steps.  Tokens per generation
#: x0.5-x1.5: assumed (nothing measures these models on these procedures before the pilot; the paper reports no
#: token counts).
TOKEN_VOLUME_RANGE = ((0.5, 0.19), (1.5, 0.37))


def varied_output(output: OutputModel, tokens_factor: float, truncation_at_95: float) -> OutputModel:
    """``output`` with its generations ``tokens_factor`` times as long and, for a reasoning model, the given
    truncation at 95 steps (an instruction model's, under 2%, is kept)."""
    return replace(
        output,
        base_tokens=output.base_tokens * tokens_factor,
        tokens_per_step=output.tokens_per_step * tokens_factor,
        truncation_at_95=truncation_at_95 if output is REASONING else output.truncation_at_95,
    )


PROMPT_TOKENS = 700  # the Appendix B prompt plus a 95-step procedure is ~600-1,000 tokens


@dataclass(frozen=True)
class Work:
    """Decoded tokens of one phase and their token-weighted mean in-flight context."""

    tokens: float
    context: float

    @staticmethod
    def of(pieces: list[tuple[float, float, float]]) -> Work:
        """From (weight, tokens decoded, context before the first of them) pieces: each token at its own context."""
        tokens = sum(w * n for w, n, _ in pieces)
        if tokens <= 0:
            return Work(0.0, 0.0)
        return Work(tokens, sum(w * n * (c + n / 2) for w, n, c in pieces) / tokens)

    @staticmethod
    def merge(works: list[Work]) -> Work:
        tokens = sum(w.tokens for w in works)
        return Work(tokens, sum(w.tokens * w.context for w in works) / tokens if tokens > 0 else 0.0)

    def seconds(
        self, engine: Engine, catalog: Catalog, efficiency: float | None = None, layout: Layout | None = None
    ) -> float:
        return self.tokens / decode_rate(engine, catalog, self.context, efficiency, layout) if self.tokens else 0.0


def stated_work(
    length: int,
    output: OutputModel,
    max_new_tokens: int,
    context_room: int,
    policy: str,
    prompt_tokens: int = PROMPT_TOKENS,
) -> tuple[Work, Work]:
    """(attempt 1, rerun) of one example of ``length`` steps under the stated output model.

    ``context_room`` is what attempt 2 may use in all (max_context - prompt); a rerun happens only when it
    exceeds ``max_new_tokens`` (else it would repeat attempt 1).  ``regenerate`` decodes attempt 1's tokens
    again, ``continue`` does not, ``off`` has no attempt 2.
    """
    p = output.truncation(length)
    short = min(output.mean_tokens(length), max_new_tokens)
    first = Work.of([(1 - p, short, prompt_tokens), (p, max_new_tokens, prompt_tokens)])
    if policy == "off" or context_room <= max_new_tokens:
        return first, Work(0.0, 0.0)
    extra = min(output.rerun_extra, context_room - max_new_tokens)
    if policy == "continue":
        return first, Work.of([(p, extra, prompt_tokens + max_new_tokens)])
    return first, Work.of([(p, max_new_tokens + extra, prompt_tokens)])


def attempt1_budget(model: ModelBase, inference: Inference) -> int:
    """Attempt 1's token budget: the model's own, else inference's (as the job's ``JobSettings``)."""
    return model.max_new_tokens or inference.max_new_tokens


def stated_phases(
    model: ModelBase,
    inference: Inference,
    lengths: list[int],
    prompt_tokens: int = PROMPT_TOKENS,
    output: OutputModel | None = None,
) -> tuple[Work, Work]:
    """(attempt 1, reruns) of one example per length, summed over ``lengths``, each at its mean context
    (``output``: another output model than the model's own, for the interval's token volume)."""
    max_new = attempt1_budget(model, inference)
    room = model.max_context - prompt_tokens
    out = output or output_model(model)
    works = [stated_work(int(L), out, max_new, room, inference.truncation_rerun, prompt_tokens) for L in lengths]
    return Work.merge([w for w, _ in works]), Work.merge([r for _, r in works])
