"""The one prompt renderer: what every backend sends and ``show-prompt`` shows, so the two never drift apart.

A prompt is rendered with the model's own tokenizer to the token ids the engine
receives (``procexec.engine.tokenizer.render_prompt``), except on an
endpoint's chat route, where the server renders the chat turns itself: there
the prompt is the turns, hashed with the template kwargs.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from procexec.config.keys import canonical_sha256
from procexec.config.model import ModelBase, OpenAIModel
from procexec.engine.tokenizer import Messages, RenderedPrompt, choose_messages, model_tokenizer, render_prompt


def server_renders(model: ModelBase) -> bool:
    """An endpoint's chat route: the server renders the turns, so no tokenizer is needed here."""
    return isinstance(model, OpenAIModel) and model.openai_api == "chat"


@dataclass(frozen=True)
class PromptRenderer:
    """A model's prompts: its template settings, its tokenizer (None when the server renders) and the pinned date.

    It holds the two template settings, not the whole entry: a harness renders as procexec does without a config.
    """

    system_role: bool  # the template has a system role (else the system prompt is folded into the user turn)
    chat_template_kwargs: dict[str, Any]
    tokenizer: Any
    template_date: dt.date

    @classmethod
    def load(cls, model: ModelBase, model_ref: str, template_date: dt.date) -> PromptRenderer:
        """The renderer of a configured model at ``model_ref``, its tokenizer loaded unless the server renders."""
        tokenizer = None if server_renders(model) else model_tokenizer(model, model_ref)
        return cls(model.system_role, model.chat_template_kwargs, tokenizer, template_date)

    def render(self, messages_for: Callable[[bool], Messages], keep_text: bool = False) -> RenderedPrompt:
        """The prompt for one example (``messages_for(system_role)`` builds its chat turns); ``keep_text`` also
        renders the template's text."""
        if self.tokenizer is not None:
            return render_prompt(
                self.tokenizer,
                messages_for,
                self.system_role,
                self.chat_template_kwargs,
                self.template_date,
                keep_text=keep_text,
            )
        kwargs = dict(self.chat_template_kwargs)
        messages, _, folded = choose_messages(lambda m: m, messages_for, self.system_role)
        digest = canonical_sha256({"messages": messages, "chat_template_kwargs": kwargs})
        return RenderedPrompt(None, digest, folded, messages=messages, template_kwargs=kwargs)
