"""The output model, per procedure length L (5..95 steps), and the tokens each phase decodes:

* a generation that stops on its own has ``mean_tokens(L)`` tokens;
* ``truncation(L)`` of them hit ``max_new_tokens`` instead (reasoning models
  on long procedures: peers report 19-37% capped at 95 steps);
* a truncated one, given more room (the rerun), needs ``rerun_extra`` tokens
  more on average, as far as the context allows;
* ``looping(L)`` of them are in a repetition loop that never ends: a greedy
  loop repeats until the budget, so its rerun (the loop's *tail*) runs to the
  model's ``max_context``, as the job's attempt 2 asks (``procexec.generation.planning``,
  ``Planner.rerun_of``: requested = max_context - prompt), or, with the repetition
  guard, until the guard stops it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from procexec.cluster.cost.catalog import Catalog
from procexec.cluster.cost.throughput import Deployment, Layout, decode_rate
from procexec.config.model import Inference, ModelBase


@dataclass(frozen=True)
class OutputModel:
    base_tokens: float  # mean output of an untruncated generation at L = 0 ...
    tokens_per_step: float  # ... growing linearly with the procedure length
    truncation_at_5: float
    truncation_at_95: float
    rerun_extra: float  # mean tokens a truncated generation needs beyond max_new_tokens
    loop_share: float = 0.0  # examples (over all lengths) whose generation ends in a loop that never stops

    def mean_tokens(self, length: int) -> float:
        return self.base_tokens + self.tokens_per_step * length

    def truncation(self, length: int) -> float:
        share = min(max((length - 5) / 90, 0.0), 1.0)
        return self.truncation_at_5 + (self.truncation_at_95 - self.truncation_at_5) * share

    def looping(self, length: int) -> float:
        """The share of ``length``-step examples in a loop: ``loop_share`` spread over the lengths as the
        truncations are (a loop is a truncation that never ends; their mean over 5..95 steps is the mean of
        the ends), and never more than the truncated share."""
        mean = (self.truncation_at_5 + self.truncation_at_95) / 2
        truncated = self.truncation(length)
        return 0.0 if mean <= 0 else min(self.loop_share * truncated / mean, truncated)


#: Loops: the share of examples whose greedy generation ends in a repetition loop, the point and the interval's
#: ends.  Assumed: no measurement of these models' loops on these procedures exists before the pilot (the paper
#: reports none); that greedy decoding loops is the model cards' own warning (Qwen3-4B-Thinking-2507 and
#: DeepSeek-R1's distills: greedy decoding or a low temperature "can lead to endless repetitions").  1% is
#: issue 37's unit of account, 0-2% the range its interval covers; a pilot measures each model's share
#: (``procexec cost --measured``).
LOOP_SHARE = 0.01
LOOP_SHARE_RANGE = (0.0, 0.02)

# Reasoning models (thinking traces of thousands of tokens): 2.5k tokens at 5 steps to 11.5k at 95,
# 2% truncated at 5 steps rising to 30% at 95 (peers: 19-37% capped at 95 steps).
REASONING = OutputModel(
    base_tokens=2000,
    tokens_per_step=100,
    truncation_at_5=0.02,
    truncation_at_95=0.30,
    rerun_extra=12000,
    loop_share=LOOP_SHARE,
)
# Instruction models without a thinking phase (MI-7, the demo's SmolLM2): short answers, rarely capped.
# Their loops: the same stated share, at most their truncations (0.5% on average).
INSTRUCT = OutputModel(
    base_tokens=300,
    tokens_per_step=20,
    truncation_at_5=0.0,
    truncation_at_95=0.01,
    rerun_extra=2000,
    loop_share=LOOP_SHARE,
)


def output_model(model: ModelBase) -> OutputModel:
    """The output model of a configured model (``reasoning: false`` for instruction models)."""
    return REASONING if model.reasoning else INSTRUCT


#: The token volume the interval of a stated projection covers: (tokens factor, reasoning models' truncation at
#: 95 steps) at its low and high end.  Truncation: the peers' 19-37% capped at 95 steps.  Tokens per generation
#: x0.5-x1.5: assumed (nothing measures these models on these procedures before the pilot; the paper reports no
#: token counts).
TOKEN_VOLUME_RANGE = ((0.5, 0.19), (1.5, 0.37))


def varied_output(output: OutputModel, tokens_factor: float, truncation_at_95: float, loop_share: float) -> OutputModel:
    """``output`` with its generations ``tokens_factor`` times as long, ``loop_share`` of its examples looping
    and, for a reasoning model, the given truncation at 95 steps (an instruction model's, under 2%, is kept)."""
    return replace(
        output,
        base_tokens=output.base_tokens * tokens_factor,
        tokens_per_step=output.tokens_per_step * tokens_factor,
        truncation_at_95=truncation_at_95 if output is REASONING else output.truncation_at_95,
        loop_share=loop_share,
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
        self, deployment: Deployment, catalog: Catalog, efficiency: float | None = None, layout: Layout | None = None
    ) -> float:
        return self.tokens / decode_rate(deployment, catalog, self.context, efficiency, layout) if self.tokens else 0.0


@dataclass(frozen=True)
class Phases:
    """What one example (or a sum of them) decodes: attempt 1, the reruns of truncated generations that end
    on their own, and the loops' tails."""

    first: Work
    rerun: Work
    tail: Work

    @staticmethod
    def merge(phases: list[Phases]) -> Phases:
        return Phases(*(Work.merge([getattr(p, name) for p in phases]) for name in ("first", "rerun", "tail")))

    def seconds(
        self, deployment: Deployment, catalog: Catalog, efficiency: float | None = None, layout: Layout | None = None
    ) -> float:
        """Decode seconds on the deployment's GPUs; a loop's tail at the layout's acceptance in a loop."""
        own = layout or deployment.layout
        return (
            self.first.seconds(deployment, catalog, efficiency, own)
            + self.rerun.seconds(deployment, catalog, efficiency, own)
            + self.tail.seconds(deployment, catalog, efficiency, own.in_loop())
        )

    @property
    def tokens(self) -> float:
        return self.first.tokens + self.rerun.tokens + self.tail.tokens


def stated_work(
    length: int,
    output: OutputModel,
    max_new_tokens: int,
    context_room: int,
    policy: str,
    prompt_tokens: int = PROMPT_TOKENS,
    guard_tokens: int | None = None,
) -> Phases:
    """Attempt 1, reruns and loop tails of one example of ``length`` steps under the stated output model.

    ``context_room`` is what attempt 2 may use in all (max_context - prompt); a rerun happens only when it
    exceeds ``max_new_tokens`` (else it would repeat attempt 1).  ``regenerate`` decodes attempt 1's tokens
    again, ``continue`` does not, ``off`` has no attempt 2.  A loop's rerun decodes the whole room, or, with the
    repetition guard, ``guard_tokens`` of the loop after attempt 1's (a regeneration: attempt 1's again first).
    """
    p, q = output.truncation(length), output.looping(length)
    short = min(output.mean_tokens(length), max_new_tokens)
    first = Work.of([(1 - p, short, prompt_tokens), (p, max_new_tokens, prompt_tokens)])
    if policy == "off" or context_room <= max_new_tokens:
        return Phases(first, Work(0.0, 0.0), Work(0.0, 0.0))
    extra = min(output.rerun_extra, context_room - max_new_tokens)
    loop = context_room - max_new_tokens if guard_tokens is None else min(guard_tokens, context_room - max_new_tokens)
    if policy == "continue":
        after = prompt_tokens + max_new_tokens
        return Phases(first, Work.of([(p - q, extra, after)]), Work.of([(q, loop, after)]))
    return Phases(
        first,
        Work.of([(p - q, max_new_tokens + extra, prompt_tokens)]),
        Work.of([(q, max_new_tokens + loop, prompt_tokens)]),
    )


def attempt1_budget(model: ModelBase, inference: Inference) -> int:
    """Attempt 1's token budget: the model's own, else inference's (as the job's ``JobSettings``)."""
    return model.max_new_tokens or inference.max_new_tokens


def stated_phases(
    model: ModelBase,
    inference: Inference,
    lengths: list[int],
    prompt_tokens: int = PROMPT_TOKENS,
    output: OutputModel | None = None,
    guard_tokens: int | None = None,
) -> Phases:
    """Attempt 1, reruns and loop tails of one example per length, summed over ``lengths``, each at its mean
    context (``output``: another output model than the model's own, for the interval's token volume;
    ``guard_tokens``: the loops' tails cut by the repetition guard)."""
    max_new = attempt1_budget(model, inference)
    room = model.max_context - prompt_tokens
    out = output or output_model(model)
    policy = inference.truncation_rerun
    return Phases.merge([stated_work(int(L), out, max_new, room, policy, prompt_tokens, guard_tokens) for L in lengths])
