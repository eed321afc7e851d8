"""The in-process vLLM backend: one offline engine (``vllm.LLM``) per job, CPU or GPU, one code path.

Why the shape below:

* The device, its CPU settings and the engine arguments are ``procexec.engine.arguments``'s
  (shared with the job's own server and ``check-model``).  A GPU job runs its
  preflight (driver, nvcc) before any GPU memory is taken; the compile caches
  are arranged next (``procexec.engine.caches``) and published when it closes.
* Requests are token ids (``procexec.engine.tokenizer`` renders them), so
  the ids hashed into the store key are exactly the ids the engine sees.
* A job's requests are queued (``LLMEngine.add_request``) as fast as the
  scheduler takes them and ``llm_engine.step()`` is driven here instead of
  ``LLM.generate``: each request is handed to ``on_finished`` the moment it
  completes, so the job can persist it before the others are done, and the
  continuation the job returns for it runs next (no barrier between attempts).
* An interrupt keeps the tokens so far (``unfinished``) at no cost while
  running: requests stay ``FINAL_ONLY`` (no per-step outputs) and the tokens
  are read from the engine's output processor, which accumulates them anyway
  (``request_states[...].detokenizer.output_token_ids``, vLLM 0.32).  SIGINT
  and SIGTERM are held while a step runs (``HeldInterrupts``), so that state
  is never read halfway through a step (a request's final token taken in, its
  finish not yet recorded).
"""

from __future__ import annotations

import collections
import gc
import os
import platform
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from procexec.config.keys import engine_identity
from procexec.config.model import ModelBase
from procexec.engine import device as device_probe
from procexec.engine.arguments import check_engine_args, engine_settings, prepare_device
from procexec.engine.caches import JobCaches, arrange_caches
from procexec.engine.prompting import PromptRenderer
from procexec.engine.tokenizer import Messages, RenderedPrompt, spell_new_tokens
from procexec.errors import ProcexecError
from procexec.generation.backend import Backend, BackendSpec, Completion, OnFinished, Request, Sampling
from procexec.generation.engine_stats import COUNTERS, EngineStats, engine_counters, startup_line


def check_gpus(model: ModelBase, device: str) -> None:
    """Tensor parallelism must fit the GPUs this job can see (the config check only sees the config)."""
    if device != "cuda":
        return
    visible = device_probe.visible_gpu_count()
    if model.tensor_parallel_size > visible:
        raise ProcexecError(
            f"models.{model.key}.tensor_parallel_size: {model.tensor_parallel_size} "
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


class JobVllmBackend(Backend):
    """What the backends that run vLLM inside the job share (in process, or as the job's own server):
    the device and its preflight, the engine settings, the model's tokenizer and its prompts."""

    supports_continuation = True

    def __init__(self, spec: BackendSpec):
        self.model, self.model_ref, self.manifest = spec.model, spec.model_ref, spec.manifest
        self.template_date = spec.template_date
        self.cache_dir = spec.cache_dir
        self.caches: JobCaches | None = None

    def _prepare(self, device: str) -> None:
        """The device checks (the GPU preflight, tensor parallelism against the visible GPUs), then the
        compile caches: where they are goes to the job's log in one line."""
        self.device = device
        if device == "cuda":
            device_probe.gpu_preflight(self.model, self.model_ref)
        check_gpus(self.model, device)
        self.caches = arrange_caches(self.model.key, device, self.cache_dir, os.environ)
        if self.caches is not None:
            print(f"[procexec infer {self.model.key}] {self.caches.line}", file=sys.stderr, flush=True)

    def _publish_caches(self, engine_started: bool) -> None:
        """The seeded caches' new entries to the shared folder, once the engine has stopped writing them; only
        after an engine that came up: one stopped while compiling may leave a half-written file (vLLM's
        ``vllm_compile_cache.py``) that every later job would read."""
        if self.caches is None or not engine_started:
            return
        published = self.caches.publish()
        if published:
            print(
                f"[procexec infer {self.model.key}] caches: published {', '.join(published)}",
                file=sys.stderr,
                flush=True,
            )

    def _configure(self) -> None:
        """The engine settings (checked against vLLM's EngineArgs) and the tokenizer, no weights loaded."""
        self.settings = engine_settings(self.model, self.device, self.model_ref)
        check_engine_args(self.settings, f"models.{self.model.key}")
        self.renderer = PromptRenderer.load(self.model, self.model_ref, self.template_date)

    def identity(self) -> dict[str, Any]:
        return {**engine_identity(self.model, self.manifest), "device": self.device, "dtype": self.settings["dtype"]}

    def max_model_len(self) -> int:
        return int(self.settings["max_model_len"])

    def render(self, messages_for: Callable[[bool], Messages]) -> RenderedPrompt:
        return self.renderer.render(messages_for)

    def vocabulary(self) -> int | None:
        return None if self.renderer.tokenizer is None else len(self.renderer.tokenizer)


class VLLMBackend(JobVllmBackend):
    """vLLM's offline engine, started lazily: a job whose every generation is stored never loads weights.

    A completion leaves the step loop with vLLM's text and no token offsets: ``finish`` detokenises
    (on the store's writer thread), so the loop goes straight on to the next step.
    """

    finish_off_loop = True

    def __init__(self, spec: BackendSpec):
        super().__init__(spec)
        self._llm: Any = None
        self._submitted = 0
        self._unfinished: list[tuple[Any, list[int]]] = []
        self.load_time_s: float | None = None
        self._steps = 0  # engine steps completed by the running generate
        self._counters_at_start = EngineStats()  # the process's counters when this engine started
        self._generating = False

    def open(self) -> None:
        """The device (chosen before vLLM is imported), its preflight, the engine settings, the tokenizer."""
        tiktoken = self.manifest.get("tiktoken")
        if tiktoken:  # gpt-oss's Harmony vocabularies, staged with the model: no download in the GPU job
            os.environ.setdefault("TIKTOKEN_ENCODINGS_BASE", tiktoken["dir"])
            os.environ.setdefault("TIKTOKEN_RS_CACHE_DIR", tiktoken["dir"])
        self._prepare(prepare_device())
        if self.caches is not None:  # the engine runs in this process
            os.environ.update(self.caches.env)
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

    def generate(self, requests: Sequence[Request], sampling: Sampling, on_finished: OnFinished) -> None:
        """Queue requests as the scheduler can take them, then step the engine, reporting each one as it finishes.

        vLLM's own queue is first-come, so the requests wait here instead: in the engine are at most
        ``max_num_seqs`` (what its scheduler runs at once), of which at most ``headroom`` not yet started
        (what one step's prefill budget can start).  A continuation ``on_finished`` returns goes first, so it
        waits behind those few, not behind every attempt-1 request of the shard.
        """
        if not requests:
            return
        engine = self._engine().llm_engine
        scheduler = engine.vllm_config.scheduler_config
        shortest = min(len(request.prompt_ids) for request in requests)
        headroom = max(1, -(-int(scheduler.max_num_batched_tokens) // max(1, shortest)))
        waiting = collections.deque(requests)
        by_id: dict[str, tuple[Request, float]] = {}  # in the engine: the request, when it was queued
        unstarted: dict[str, str] = {}  # in the engine, no token out yet: our id -> vLLM's internal id
        self._unfinished = []
        self._steps, self._generating = 0, True
        try:
            with HeldInterrupts() as interrupts:
                while waiting or engine.has_unfinished_requests():
                    self._forget_started(engine, unstarted)
                    while waiting and len(by_id) < scheduler.max_num_seqs and len(unstarted) < headroom:
                        request = waiting.popleft()
                        request_id, internal_id = self._add_request(engine, request, sampling)
                        by_id[request_id], unstarted[request_id] = (request, time.monotonic()), internal_id
                    for output in engine.step():
                        if output.finished:
                            unstarted.pop(output.request_id, None)
                            request, queued = by_id.pop(output.request_id)
                            follow = on_finished(self._completion(request, output, queued))
                            waiting.extendleft(reversed(follow))
                    self._steps += 1
                    interrupts.check()
        except BaseException:
            self._unfinished = self._tokens_so_far(engine, {rid: request for rid, (request, _) in by_id.items()})
            for request_id in by_id:  # leave the engine clean if the caller goes on (tests, benchmarks)
                engine.abort_request([request_id])
            raise
        finally:
            self._generating = False
        if by_id:
            raise RuntimeError(f"vLLM finished without returning {len(by_id)} request(s)")

    @staticmethod
    def _forget_started(engine: Any, unstarted: dict[str, str]) -> None:
        """Take out of ``unstarted`` the requests that have a token out (the output processor's state, which
        ``_tokens_so_far`` reads too), or whose progress cannot be read (never held back for it)."""
        states = engine.output_processor.request_states
        for request_id, internal_id in list(unstarted.items()):
            state = states.get(internal_id)
            if state is None or state.detokenizer is None or state.detokenizer.output_token_ids:
                del unstarted[request_id]

    def _add_request(self, engine: Any, request: Request, sampling: Sampling) -> tuple[str, str]:
        """Hand ``request`` to the engine (its final output only: no per-token partial outputs); its id and
        vLLM's internal one (``LLMEngine.add_request``'s, the output processor's key)."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        sent = self.request_sampling(request, sampling)  # what the record states, as SamplingParams
        guard = sent.pop("repetition_detection", None)
        if guard is not None:  # vllm/sampling_params.py (0.32)
            from vllm.sampling_params import RepetitionDetectionParams

            guard = RepetitionDetectionParams(**guard)
        params = SamplingParams(**sent, repetition_detection=guard, output_kind=RequestOutputKind.FINAL_ONLY)
        request_id = f"procexec-{self._submitted}"
        self._submitted += 1
        return request_id, engine.add_request(request_id, {"prompt_token_ids": request.engine_ids()}, params)

    def finish(self, request: Request, completion: Completion) -> None:
        """The text spelled from the ids with this model's tokenizer, as every record's, and its token offsets."""
        assert completion.token_ids is not None  # _completion: the engine's ids, always
        spelled, completion.token_offsets = spell_new_tokens(
            self.renderer.tokenizer, request.prompt_ids, request.prefix_ids, completion.token_ids
        )
        completion.details["token_offsets_match_text"] = spelled == completion.text
        completion.text = spelled

    def unfinished(self) -> list[tuple[Any, list[int]]]:
        return self._unfinished

    def progress(self) -> int | None:
        """Engine steps completed by the running ``generate`` (a step that never returns: a hung engine).  The
        stall's signal is not held like SIGTERM (``HeldInterrupts``): a hung step would never let it through."""
        return self._steps if self._generating else None

    def engine_stats(self) -> EngineStats:
        """How this engine started (the seconds to build it), its counters since (speculation, preemptions) and
        its KV pool (``CacheConfig.kv_cache_size_tokens``, vLLM 0.32)."""
        if self._llm is None:
            return EngineStats()
        return counters_since(self._llm, self._counters_at_start) + EngineStats(
            starts=1,
            startup_s=self.load_time_s or 0.0,
            kv_capacity_tokens=int(self._llm.llm_engine.vllm_config.cache_config.kv_cache_size_tokens or 0),
        )

    def close(self) -> None:
        self._llm = None
        self._publish_caches(engine_started=self.load_time_s is not None)

    # ---------------------------------------------------------------- internals

    def start(self) -> None:
        self._engine()

    def _engine(self) -> Any:
        if self._llm is None:
            import vllm

            started = time.monotonic()
            # What the process holds (vLLM, torch, transformers: about two million objects) left out of the
            # collector's scans: vLLM's start collects the whole heap six times, 0.27-0.4 s each (1.9 of a tiny
            # model's 10 CPU s job; tests/generation/test_backend_vllm.py 51 -> 37 s).  vLLM unfreezes and
            # collects at shutdown (EngineCore.shutdown), so what is frozen here is still freed.
            gc.freeze()
            try:  # vLLM counts drafts and preemptions only with its statistics on (get_metrics)
                self._llm = vllm.LLM(**self.settings, disable_log_stats=False)
            except (OSError, ValueError) as exc:
                raise ProcexecError(f"vLLM could not start model '{self.settings['model']}': {exc}") from None
            self.load_time_s = time.monotonic() - started
            self._counters_at_start = counters_since(self._llm, EngineStats())
            print(
                f"[procexec infer {self.model.key}] {startup_line(self.engine_stats(), self.max_model_len())}",
                file=sys.stderr,
                flush=True,
            )
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

    def _completion(self, request: Request, output: Any, queued: float) -> Completion:
        out = output.outputs[0]
        ids = [*request.resumed_ids, *out.token_ids]
        return Completion(
            tag=request.tag,
            text=out.text,
            token_ids=ids,
            token_offsets=None,
            finish_reason=str(out.finish_reason),
            num_generated_tokens=len(ids),
            wall_time_s=time.monotonic() - queued,
            details={"num_cached_tokens": int(output.num_cached_tokens or 0)},
        )


def counters_since(llm: Any, before: EngineStats) -> EngineStats:
    """An ``LLM``'s counters (speculative decoding, preemptions) less ``before``: vLLM's metrics are the process's,
    summed over every engine it started (``LLM.get_metrics``, with ``disable_log_stats=False``)."""
    totals: dict[str, float] = {}
    for metric in llm.get_metrics():
        name = metric.name.removesuffix("_total")
        if name in COUNTERS:
            totals[name] = totals.get(name, 0) + (getattr(metric, "value", 0) or 0)
    now = engine_counters(totals)
    return EngineStats(**{field: getattr(now, field) - getattr(before, field) for field in COUNTERS.values()})
