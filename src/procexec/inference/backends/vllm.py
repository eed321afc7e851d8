"""The in-process vLLM backend: one offline engine (``vllm.LLM``) per job, CPU or GPU, one code path.

Why the shape below:

* The device is chosen before vLLM is imported, because the CPU settings from
  ``shared/docs/engine-notes.md`` are environment variables that vLLM and
  OpenMP read at import time, and it is chosen without ``torch.cuda``
  (``procexec.inference.device``: such a call made before vLLM's import
  poisons the fork that starts vLLM's engine on a GPU).  A GPU job runs its
  preflight (driver, nvcc, caches) before any GPU memory is taken.
* Engine keyword arguments are checked against vLLM's own ``EngineArgs``
  (names and types) before anything is loaded, so a misspelled
  ``engine_kwargs`` key fails in seconds instead of after a queue wait.
* Requests are token ids (``procexec.inference.tokenizer`` renders them), so
  the ids hashed into the store key are exactly the ids the engine sees.
* All of a job's requests are queued at once (``LLMEngine.add_request``) and
  ``llm_engine.step()`` is driven here instead of ``LLM.generate``: each
  request is handed to ``on_finished`` the moment it completes, so the job can
  persist it before the others are done.
* An interrupt keeps the tokens so far (``unfinished``) at no cost while
  running: requests stay ``FINAL_ONLY`` (no per-step outputs) and the tokens
  are read from the engine's output processor, which accumulates them anyway
  (``request_states[...].detokenizer.output_token_ids``, vLLM 0.32).  SIGINT
  and SIGTERM are held while a step runs (``HeldInterrupts``), so that state
  is never read halfway through a step (a request's final token taken in, its
  finish not yet recorded).
"""

from __future__ import annotations

import functools
import os
import platform
import signal
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from procexec.errors import ProcexecError
from procexec.inference import device as device_probe
from procexec.inference.backend import BackendSpec, Completion, Request, Sampling
from procexec.inference.prompting import PromptRenderer
from procexec.inference.settings import engine_identity
from procexec.inference.tokenizer import Messages, RenderedPrompt, spell_new_tokens
from procexec.io.jsonl import read_json

CPU_ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "OMP_NUM_THREADS": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "TORCHDYNAMO_DISABLE": "1",
}
CPU_KV_CACHE_BYTES = 256 * 1024 * 1024  # without a cap vLLM-CPU reserves ~15 GiB


def cpu_kv_cache_bytes(model_ref: str, max_model_len: int) -> int:
    """256 MiB, or room for two full-length float32 sequences if that is more (vLLM refuses less than one).

    SmolLM2 at 8192 tokens needs ~0.35 GiB; a hub id (no local config) gets the default.
    """
    config_path = Path(model_ref) / "config.json"
    if not config_path.is_file():
        return CPU_KV_CACHE_BYTES
    cfg = read_json(config_path, what="model config")
    heads = cfg.get("num_attention_heads", 1)
    head_dim = cfg.get("head_dim") or cfg.get("hidden_size", 0) // heads
    per_token = 2 * cfg.get("num_hidden_layers", 1) * cfg.get("num_key_value_heads", heads) * head_dim * 4
    return max(CPU_KV_CACHE_BYTES, 2 * per_token * max_model_len)


def prepare_device() -> str:
    """The job's device ('cuda' or 'cpu'), found without torch; the CPU gets the engine notes' settings.

    Runs before vLLM is imported: the CPU settings are read at import time, and on a GPU no
    ``torch.cuda`` call may come before vLLM's own environment (``procexec.inference.device``).
    """
    device = device_probe.select_device()
    if device == "cpu":
        for name, value in CPU_ENV.items():
            os.environ.setdefault(name, value)
        import torch

        # torch may be imported already, so OpenMP may have read its thread count: set it explicitly.
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    return device


def engine_settings(model: dict[str, Any], device: str, model_ref: str) -> dict[str, Any]:
    """Keyword arguments for ``vllm.LLM`` (recorded verbatim in every record's provenance)."""
    settings: dict[str, Any] = {
        "model": model_ref,
        "tokenizer_mode": model["tokenizer_mode"],
        "trust_remote_code": model["trust_remote_code"],
        "max_model_len": model["max_model_len"],
        "seed": 0,
        # Sampling is exactly what the config says: no defaults from the model's generation_config.json.
        "generation_config": "vllm",
    }
    if not Path(model_ref).is_dir():  # a hub id: pin what is fetched
        settings["revision"] = model["revision"]
    if device == "cpu":
        settings.update(
            dtype="float32",
            enforce_eager=True,
            kv_cache_memory_bytes=cpu_kv_cache_bytes(model_ref, model["max_model_len"]),
        )
    else:
        settings.update(dtype=model["dtype"], tensor_parallel_size=model["tensor_parallel_size"])
    if model.get("speculative_config") is not None:  # off unless set (docs/decisions.md)
        settings["speculative_config"] = dict(model["speculative_config"])
    settings.update(model["engine_kwargs"])
    return settings


@functools.cache
def _engine_field_types() -> dict[str, Any]:
    """EngineArgs' field annotations (a string where vLLM only names the type for type checkers)."""
    import dataclasses

    from vllm.engine.arg_utils import EngineArgs

    return {f.name: f.type for f in dataclasses.fields(EngineArgs)}


def check_engine_args(settings: dict[str, Any], where: str) -> None:
    """Refuse keys that vLLM's ``EngineArgs`` does not have, or values of the wrong type, naming the key.

    Types are checked with pydantic (a vLLM dependency) against EngineArgs' own annotations.
    """
    import pydantic

    types = _engine_field_types()
    for name, value in settings.items():
        if name not in types:
            raise ProcexecError(f"{where}: '{name}' is not a vLLM {_vllm_version()} engine argument")
        if isinstance(types[name], str):
            continue
        try:
            adapter = pydantic.TypeAdapter(types[name])
            # A dict for a config-object field (kernel_config={...}) is what EngineArgs converts itself.
            adapter.validate_python(value, strict=not isinstance(value, dict))
        except pydantic.ValidationError as exc:
            problem = exc.errors()[0]["msg"] if exc.errors() else str(exc)
            raise ProcexecError(f"{where}: '{name}' = {value!r}: {problem}") from None
        except pydantic.PydanticSchemaGenerationError:
            continue  # an annotation pydantic cannot check (a callable, a class): the name was checked


def _vllm_version() -> str:
    import vllm

    return vllm.__version__


def check_gpus(model: dict[str, Any], device: str) -> None:
    """Tensor parallelism must fit the GPUs this job can see (the config check only sees the config)."""
    if device != "cuda":
        return
    visible = device_probe.visible_gpu_count()
    if model["tensor_parallel_size"] > visible:
        raise ProcexecError(
            f"models.{model['key']}.tensor_parallel_size: {model['tensor_parallel_size']} "
            f"is larger than the {visible} GPU(s) visible to this job"
        )


class HeldInterrupts:
    """SIGINT and SIGTERM held until ``check`` (or the end of the block), then raised by their own handlers.

    Only the main thread receives signals; elsewhere nothing is held.  A signal held when the block ends
    on an error (vLLM's engine process stopped by the same SIGTERM) is raised instead of that error.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __enter__(self) -> HeldInterrupts:
        self.caught: int | None = None
        self.previous: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():
            self.previous = {signum: signal.signal(signum, self._hold) for signum in self.SIGNALS}
        return self

    def _hold(self, signum: int, frame: Any) -> None:
        self.caught = self.caught or signum

    def check(self) -> None:
        """Raise a held signal now (its handler's ``KeyboardInterrupt`` or ``Terminated``)."""
        caught, self.caught = self.caught, None
        if caught is not None:
            self._restore()
            signal.raise_signal(caught)

    def _restore(self) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        self.previous = {}

    def __exit__(self, *exc: Any) -> None:
        self._restore()
        self.check()


class JobEngine:
    """What the backends that run vLLM inside the job share (in process, or as the job's own server):
    the device and its preflight, the engine settings, the model's tokenizer and its prompts."""

    supports_continuation = True

    def __init__(self, spec: BackendSpec):
        self.model, self.model_ref, self.manifest = spec.model, spec.model_ref, spec.manifest
        self.template_date = spec.template_date

    def _prepare(self, device: str) -> None:
        """The device checks: the GPU preflight and tensor parallelism against the visible GPUs."""
        self.device = device
        if device == "cuda":
            device_probe.gpu_preflight(self.model, self.model_ref)
        check_gpus(self.model, device)

    def _configure(self) -> None:
        """The engine settings (checked against vLLM's EngineArgs) and the tokenizer, no weights loaded."""
        self.settings = engine_settings(self.model, self.device, self.model_ref)
        check_engine_args(self.settings, f"models.{self.model['key']}")
        self.renderer = PromptRenderer.load(self.model, self.model_ref, self.template_date)

    def identity(self) -> dict[str, Any]:
        return {**engine_identity(self.model, self.manifest), "device": self.device, "dtype": self.settings["dtype"]}

    def max_model_len(self) -> int:
        return int(self.settings["max_model_len"])

    def render(self, messages_for: Callable[[bool], Messages]) -> RenderedPrompt:
        return self.renderer.render(messages_for)


class VLLMBackend(JobEngine):
    """vLLM's offline engine, started lazily: a job whose every generation is stored never loads weights."""

    def __init__(self, spec: BackendSpec):
        super().__init__(spec)
        self._llm: Any = None
        self._submitted = 0
        self._unfinished: list[tuple[Any, list[int]]] = []
        self.load_time_s: float | None = None

    def open(self) -> None:
        """The device (chosen before vLLM is imported), its preflight, the engine settings, the tokenizer."""
        tiktoken = self.manifest.get("tiktoken")
        if tiktoken:  # gpt-oss's Harmony vocabularies, staged with the model: no download in the GPU job
            os.environ.setdefault("TIKTOKEN_ENCODINGS_BASE", tiktoken["dir"])
            os.environ.setdefault("TIKTOKEN_RS_CACHE_DIR", tiktoken["dir"])
        self._prepare(prepare_device())
        self._configure()

    def provenance(self) -> dict[str, Any]:
        import torch
        import transformers
        import vllm

        return {
            "backend": "vllm",
            "commit": self.manifest.get("commit"),
            "device": self.device,
            "engine": dict(self.settings),
            "vllm_version": vllm.__version__,
            "torch_version": torch.__version__,
            "transformers_version": transformers.__version__,
            "host": platform.node(),
            "engine_load_s": None if self.load_time_s is None else round(self.load_time_s, 3),
        }

    def generate(self, requests: Sequence[Request], sampling: Sampling,
                 on_finished: Callable[[Completion], None]) -> None:
        """Queue every request at once, then step the engine, reporting each one as it finishes."""
        if not requests:
            return
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        engine = self._engine().llm_engine
        by_id: dict[str, Request] = {}
        started = time.monotonic()
        for request in requests:
            guard = None
            if request.repetition_detection is not None:  # vllm/sampling_params.py (0.32)
                from vllm.sampling_params import RepetitionDetectionParams

                guard = RepetitionDetectionParams(**request.repetition_detection)
            params = SamplingParams(temperature=sampling.temperature, top_p=sampling.top_p,
                                    max_tokens=request.max_tokens, seed=sampling.seed, repetition_detection=guard,
                                    output_kind=RequestOutputKind.FINAL_ONLY)  # no per-token partial outputs
            request_id = f"procexec-{self._submitted}"
            self._submitted += 1
            prompt_ids = [*request.prompt.token_ids, *request.prefix_ids, *request.resumed_ids]
            engine.add_request(request_id, {"prompt_token_ids": prompt_ids}, params)
            by_id[request_id] = request
        self._unfinished = []
        try:
            with HeldInterrupts() as interrupts:
                while engine.has_unfinished_requests():
                    for output in engine.step():
                        if output.finished:
                            on_finished(self._completion(by_id.pop(output.request_id), output, started))
                    interrupts.check()
        except BaseException:
            self._unfinished = self._tokens_so_far(engine, by_id)
            for request_id in by_id:  # leave the engine clean if the caller goes on (tests, benchmarks)
                engine.abort_request([request_id])
            raise
        if by_id:
            raise RuntimeError(f"vLLM finished without returning {len(by_id)} request(s)")

    def unfinished(self) -> list[tuple[Any, list[int]]]:
        return self._unfinished

    def close(self) -> None:
        self._llm = None

    # ---------------------------------------------------------------- internals

    def _engine(self) -> Any:
        if self._llm is None:
            import vllm

            started = time.monotonic()
            try:
                self._llm = vllm.LLM(**self.settings)
            except (OSError, ValueError) as exc:
                raise ProcexecError(f"vLLM could not start model '{self.settings['model']}': {exc}") from None
            self.load_time_s = time.monotonic() - started
        return self._llm

    @staticmethod
    def _tokens_so_far(engine: Any, by_id: dict[str, Request]) -> list[tuple[Any, list[int]]]:
        """(tag, resumed + output ids) of each request of ``by_id`` the engine holds, from its output processor."""
        kept = []
        for state in engine.output_processor.request_states.values():
            request = by_id.get(state.external_req_id)
            if request is not None and state.detokenizer is not None:
                kept.append((request.tag, [*request.resumed_ids, *state.detokenizer.output_token_ids]))
        return kept

    def _completion(self, request: Request, output: Any, started: float) -> Completion:
        out = output.outputs[0]
        ids = [*request.resumed_ids, *out.token_ids]

        def offsets(completion: Completion) -> None:  # detokenising runs off the step loop
            spelled, completion.token_offsets = spell_new_tokens(self.renderer.tokenizer,
                                                                 request.prompt.token_ids, request.prefix_ids, ids)
            completion.details["token_offsets_match_text"] = spelled == completion.text
            completion.text = spelled

        return Completion(
            tag=request.tag,
            text=out.text,
            token_ids=ids,
            token_offsets=None,
            finish_reason=str(out.finish_reason),
            num_generated_tokens=len(ids),
            wall_time_s=time.monotonic() - started,
            details={"num_cached_tokens": int(output.num_cached_tokens or 0)},
            finalize=offsets,
        )
