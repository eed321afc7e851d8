"""A small in-test backend (a ``Backend`` subclass): the job's planning, keys, store and truncation policy
without vLLM.

Each prompt has one scripted output (bytes of a text derived from the prompt),
so the tokens after any prefix are fixed: a continuation gives exactly what a
regeneration gives, as greedy decoding does on a deterministic engine.
"""

from __future__ import annotations

import collections
import hashlib
from collections.abc import Callable, Sequence
from typing import Any

from procexec.engine.tokenizer import Messages, RenderedPrompt, choose_messages, ids_sha256
from procexec.generation.backend import Backend, Completion, OnFinished, Request, Sampling


class ScriptedBackend(Backend):
    supports_continuation = True

    def __init__(
        self,
        context: int = 100_000,
        script_tokens: Callable[[str], int] | None = None,
        answer: Callable[[RenderedPrompt], str] | None = None,
        version: int = 1,
        fail_after: int | None = None,
        answer_first: bool = False,
    ):
        self.context = context
        self.script_tokens = script_tokens or (lambda digest: 40 + int(digest[:4], 16) % 60)
        self.answer = answer  # the answer tagged into the script: at its end, or its start with answer_first
        self.answer_first = answer_first
        self.version = version
        self.fail_after = fail_after  # raise KeyboardInterrupt after this many completions (an interrupt)
        self.decoded = 0
        self.requests: list[Request] = []
        self.finished = 0

    def identity(self) -> dict[str, Any]:
        return {"backend": "scripted", "version": self.version}

    def max_model_len(self) -> int:
        return self.context

    def render(self, messages_for: Callable[[bool], Messages]) -> RenderedPrompt:
        ids, messages, folded = choose_messages(
            lambda turns: list("\n".join(t["content"] for t in turns).encode("utf-8")), messages_for, True
        )
        return RenderedPrompt(ids, ids_sha256(ids), folded)

    def script(self, prompt: RenderedPrompt) -> str:
        """The whole output this prompt would get with an unlimited budget."""
        n = self.script_tokens(prompt.sha256)
        tail = f"<answer>{self.answer(prompt)}</answer>" if self.answer else ""
        body = "".join(f"Step {i}: S{i + 2} = {i * 7 % 13}\n" for i in range(1, n))
        if self.answer_first:
            return (tail + body)[:n]
        return body[: max(0, n - len(tail))] + tail

    def provenance(self) -> dict[str, Any]:
        return {"backend": "scripted"}

    def generate(self, requests: Sequence[Request], sampling: Sampling, on_finished: OnFinished) -> None:
        """One request at a time, in order; the requests ``on_finished`` returns go first, as an engine's do."""
        waiting = collections.deque(requests)
        while waiting:
            if self.fail_after is not None and self.finished >= self.fail_after:
                raise KeyboardInterrupt
            request = waiting.popleft()
            self.requests.append(request)
            waiting.extendleft(reversed(on_finished(self.complete(request))))
            self.finished += 1

    def complete(self, request: Request) -> Completion:
        """The scripted completion of ``request``: what its script holds after its prefix, up to its budget."""
        script = self.script(request.prompt)
        start = len(request.prefix_ids)
        assert list(script[:start].encode()) == request.prefix_ids  # a continuation extends its own output
        piece = script[start : start + request.max_tokens]
        self.decoded += len(piece)
        return Completion(
            tag=request.tag,
            text=piece,
            token_ids=list(piece.encode()),
            token_offsets=list(range(len(piece))),
            finish_reason="length" if start + len(piece) < len(script) else "stop",
            num_generated_tokens=len(piece),
            wall_time_s=0.0,
            details={"digest": hashlib.sha256(piece.encode()).hexdigest()[:8]},
        )
