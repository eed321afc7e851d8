"""The vLLM backend: one offline engine (``vllm.LLM``) per job, CPU or GPU, one code path.

Why the shape below:

* The device is chosen before vLLM is imported, because the CPU settings from
  ``shared/docs/engine-notes.md`` are environment variables that vLLM and
  OpenMP read at import time.
* Prompts are rendered here with the model's own chat template (through vLLM's
  tokenizer loader, so ``tokenizer_mode: mistral`` and remote code behave as
  in the engine) and submitted as token ids: the ids we hash and count are
  exactly the ids the engine sees.
* All of a job's requests are queued at once (``LLMEngine.add_request``) so the engine
  schedules the whole batch, and ``llm_engine.step()`` is driven here instead
  of ``LLM.generate``: each request is handed to ``on_finished`` the moment it
  completes, so the caller can persist it before the others are done.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from procexec.errors import ProcexecError

CPU_ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "OMP_NUM_THREADS": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "TORCHDYNAMO_DISABLE": "1",
    "HF_HUB_OFFLINE": "1",
}
CPU_KV_CACHE_BYTES = 256 * 1024 * 1024  # without a cap vLLM-CPU reserves ~15 GiB


def cpu_kv_cache_bytes(model_ref: str, max_model_len: int) -> int:
    """256 MiB, or room for two full-length float32 sequences if that is more (vLLM refuses less than one).

    SmolLM2 at 8192 tokens needs ~0.35 GiB; a hub id (no local config) gets the default.
    """
    config_path = Path(model_ref) / "config.json"
    if not config_path.is_file():
        return CPU_KV_CACHE_BYTES
    cfg = json.loads(config_path.read_text())
    heads = cfg.get("num_attention_heads", 1)
    head_dim = cfg.get("head_dim") or cfg.get("hidden_size", 0) // heads
    per_token = 2 * cfg.get("num_hidden_layers", 1) * cfg.get("num_key_value_heads", heads) * head_dim * 4
    return max(CPU_KV_CACHE_BYTES, 2 * per_token * max_model_len)


def select_device() -> str:
    """'cuda' when torch sees a GPU, else 'cpu' (and apply the CPU settings of the engine notes)."""
    import torch

    if torch.cuda.is_available():
        return "cuda"
    for name, value in CPU_ENV.items():
        os.environ.setdefault(name, value)
    # torch is imported already, so OpenMP has read its thread count: set it explicitly.
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    return "cpu"


def engine_settings(model: dict[str, Any], device: str, model_ref: str) -> dict[str, Any]:
    """Keyword arguments for ``vllm.LLM`` (recorded verbatim in every record's provenance)."""
    settings: dict[str, Any] = {
        "model": model_ref,
        "tokenizer_mode": model["tokenizer_mode"],
        "trust_remote_code": model["trust_remote_code"],
        "max_model_len": model["max_model_len"],
        "seed": 0,
    }
    if model["source"] == "hf":
        settings["revision"] = model["revision"]
    if device == "cpu":
        settings.update(
            dtype="float32",
            enforce_eager=True,
            kv_cache_memory_bytes=cpu_kv_cache_bytes(model_ref, model["max_model_len"]),
        )
    else:
        settings.update(dtype=model["dtype"], tensor_parallel_size=model["tensor_parallel_size"])
    settings.update(model["engine_kwargs"])
    return settings


def load_tokenizer(settings: dict[str, Any]) -> Any:
    """vLLM's tokenizer for the model (HF fast/slow or Mistral), loaded without starting the engine."""
    from vllm.tokenizers import get_tokenizer

    try:
        return get_tokenizer(
            settings["model"],
            tokenizer_mode=settings["tokenizer_mode"],
            trust_remote_code=settings["trust_remote_code"],
            revision=settings.get("revision"),
        )
    except OSError as exc:
        raise ProcexecError(f"cannot load the tokenizer of '{settings['model']}': {exc}") from None


@dataclass(frozen=True)
class RenderedPrompt:
    token_ids: list[int]
    sha256: str  # of the rendered prompt text (of the token ids when the template yields ids)
    system_folded: bool


def _template_rejects_system(exc: Exception) -> bool:
    import jinja2

    return isinstance(exc, jinja2.TemplateError) and "system" in str(exc).lower()


def render(
    tokenizer: Any,
    messages_for: Callable[[bool], list[dict[str, str]]],
    system_role: bool,
    chat_template_kwargs: dict[str, Any],
) -> RenderedPrompt:
    """Apply the model's chat template; fold the system text into the user turn if it is refused.

    ``messages_for(system_role)`` builds the messages (``procexec.prompts.chat_messages``).
    """

    def apply(messages: list[dict[str, str]]) -> Any:
        return tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, **chat_template_kwargs
        )

    folded = not system_role
    try:
        rendered = apply(messages_for(not folded))
    except Exception as exc:
        if folded or not _template_rejects_system(exc):
            raise
        folded = True
        rendered = apply(messages_for(False))
    if isinstance(rendered, str):
        # The template already holds BOS etc.; adding special tokens again would double them.
        ids = list(tokenizer.encode(rendered, add_special_tokens=False))
        digest = hashlib.sha256(rendered.encode("utf-8")).hexdigest()
    else:  # Mistral tokenizers render straight to ids
        ids = [int(i) for i in rendered]
        digest = hashlib.sha256(",".join(map(str, ids)).encode()).hexdigest()
    return RenderedPrompt(ids, digest, folded)


def token_offsets(tokenizer: Any, prompt_ids: Sequence[int], output_ids: Sequence[int]) -> tuple[list[int], str]:
    """Character offset at which each generated token starts, plus the text they spell.

    Mirrors vLLM's own incremental detokenizer (a ``DecodeStream`` primed with
    the prompt, special tokens skipped), so the text matches the engine's.
    A token that completes no character (a partial UTF-8 byte, a skipped
    special token) starts where the next character will.
    """
    from tokenizers import Tokenizer
    from tokenizers.decoders import DecodeStream

    offsets: list[int] = []
    pieces: list[str] = []
    length = 0
    backend = getattr(tokenizer, "_tokenizer", None)
    if isinstance(backend, Tokenizer):  # HF fast tokenizers: what vLLM's detokenizer uses
        stream = DecodeStream(ids=list(prompt_ids), skip_special_tokens=True)
        for token in output_ids:
            offsets.append(length)
            piece = stream.step(backend, token) or ""
            pieces.append(piece)
            length += len(piece)
        return offsets, "".join(pieces)
    from vllm.tokenizers.detokenizer_utils import detokenize_incrementally

    all_ids = list(prompt_ids)
    prev, prefix_offset, read_offset = None, 0, 0
    for token in output_ids:
        all_ids.append(token)
        new_tokens, piece, prefix_offset, read_offset = detokenize_incrementally(
            tokenizer, all_ids, prev, prefix_offset, read_offset, skip_special_tokens=True
        )
        prev = new_tokens if prev is None else prev + new_tokens
        offsets.append(length)
        pieces.append(piece)
        length += len(piece)
    return offsets, "".join(pieces)


@dataclass
class Request:
    """One generation to run: ``tag`` comes back with the result."""

    tag: Any
    prompt_ids: list[int]
    max_tokens: int


@dataclass
class Completion:
    tag: Any
    text: str
    token_ids: list[int]
    finish_reason: str
    num_cached_tokens: int
    wall_time_s: float  # from queueing the batch to this request finishing
    extra: dict[str, Any] = field(default_factory=dict)


class Engine:
    """A started vLLM engine (the expensive part: created once per job, lazily)."""

    def __init__(self, settings: dict[str, Any]):
        import vllm

        self.settings = settings
        self.vllm_version = vllm.__version__
        started = time.monotonic()
        try:
            self.llm = vllm.LLM(**settings)
        except (OSError, ValueError) as exc:
            raise ProcexecError(f"vLLM could not start model '{settings['model']}': {exc}") from None
        self.load_time_s = time.monotonic() - started
        self._submitted = 0

    def sampling(self, max_tokens: int, temperature: float, top_p: float) -> Any:
        from vllm import SamplingParams

        return SamplingParams(temperature=temperature, top_p=top_p, max_tokens=max_tokens, seed=0)

    def run(
        self,
        requests: Sequence[Request],
        temperature: float,
        top_p: float,
        on_finished: Callable[[Completion], None],
    ) -> None:
        """Queue every request at once, then step the engine, reporting each one as it finishes."""
        if not requests:
            return
        from vllm.sampling_params import RequestOutputKind

        engine = self.llm.llm_engine
        by_id: dict[str, Request] = {}
        started = time.monotonic()
        for number, request in enumerate(requests):
            params = self.sampling(request.max_tokens, temperature, top_p)
            params.output_kind = RequestOutputKind.FINAL_ONLY  # no per-token partial outputs
            request_id = f"procexec-{self._submitted + number}"
            engine.add_request(request_id, {"prompt_token_ids": request.prompt_ids}, params)
            by_id[request_id] = request
        self._submitted += len(requests)
        while engine.has_unfinished_requests():
            for output in engine.step():
                if not output.finished:
                    continue
                out = output.outputs[0]
                on_finished(
                    Completion(
                        tag=by_id.pop(output.request_id).tag,
                        text=out.text,
                        token_ids=list(out.token_ids),
                        finish_reason=str(out.finish_reason),
                        num_cached_tokens=int(output.num_cached_tokens or 0),
                        wall_time_s=time.monotonic() - started,
                    )
                )
        if by_id:
            raise RuntimeError(f"vLLM finished without returning {len(by_id)} request(s)")
