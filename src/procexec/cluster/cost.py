"""What inference costs: decoded tokens and GPU-hours, from a stated output-length and truncation model.

One model for two readers: ``benchmarks/gpu_hours.py`` (the study's GPU-hour
account, ``regenerate`` against ``continue``) and the workflow (each inference
shard's SLURM runtime from its share of the work).  Every number here is an
assumption, stated in ``docs/cluster.md`` with its source; measure one shard
and set ``throughput_tok_s`` in ``config.yaml`` to replace the guess.

The output model, per procedure length L (5..95 steps):

* a generation that stops on its own has ``mean_tokens(L)`` tokens;
* ``truncation(L)`` of them hit ``max_new_tokens`` instead (reasoning models
  on long procedures: peers report 19-37% capped at 95 steps);
* a truncated one, given more room (the rerun), needs ``rerun_extra`` tokens
  more on average, as far as the context allows.
"""

from __future__ import annotations

from dataclasses import dataclass


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
REASONING = OutputModel(base_tokens=2000, tokens_per_step=100, truncation_at_5=0.02, truncation_at_95=0.30,
                        rerun_extra=12000)
# Instruction models without a thinking phase (MI-7, the demo's SmolLM2): short answers, rarely capped.
INSTRUCT = OutputModel(base_tokens=300, tokens_per_step=20, truncation_at_5=0.0, truncation_at_95=0.01,
                       rerun_extra=2000)


@dataclass(frozen=True)
class DecodeTokens:
    attempt1: float
    attempt2: float

    @property
    def total(self) -> float:
        return self.attempt1 + self.attempt2


def expected_decode(length: int, output: OutputModel, max_new_tokens: int, context_room: int,
                    policy: str) -> DecodeTokens:
    """Expected tokens decoded for one example of ``length`` steps.

    ``context_room`` is what attempt 2 may use in all (max_context - prompt); a
    rerun happens only when it exceeds ``max_new_tokens`` (else it would repeat
    attempt 1).  ``regenerate`` decodes attempt 1's tokens again, ``continue``
    does not, ``off`` has no attempt 2.
    """
    p = output.truncation(length)
    first = (1 - p) * min(output.mean_tokens(length), max_new_tokens) + p * max_new_tokens
    if policy == "off" or context_room <= max_new_tokens:
        return DecodeTokens(first, 0.0)
    extra = min(output.rerun_extra, context_room - max_new_tokens)
    rerun = extra if policy == "continue" else max_new_tokens + extra
    return DecodeTokens(first, p * rerun)


def output_model(model: dict) -> OutputModel:
    """The output model of a configured model (``reasoning: false`` for instruction models)."""
    return REASONING if model.get("reasoning", True) else INSTRUCT


def shard_runtime_minutes(model: dict, inference: dict, lengths: list[int], examples_per_length: int,
                          datasets: int, shards: int, cap: int, prompt_tokens: int = 700) -> int:
    """SLURM runtime of one inference shard: its share of the expected decode at the model's throughput.

    1.5 x (15 minutes of start-up + expected decode time), at least 30 minutes and
    at most ``cap`` (the partition's limit: a shard the limit stops resumes on the next run).
    """
    max_new = int(model.get("max_new_tokens", inference["max_new_tokens"]))
    room = int(model.get("max_context", model["max_model_len"])) - prompt_tokens
    out = output_model(model)
    tokens = sum(expected_decode(length, out, max_new, room, inference["truncation_rerun"]).total
                 for length in lengths) * examples_per_length * datasets / shards
    minutes = 1.5 * (15 + tokens / float(model["throughput_tok_s"]) / 60)
    return int(min(cap, max(30, round(minutes))))
