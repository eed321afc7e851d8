"""An OpenAI-compatible endpoint as a backend: a ``vllm serve`` of one's own, or a provider's API.

Two routes (``openai_api`` in the model's config):

* ``completions`` (default): the prompt is rendered here with the model's own
  tokenizer (``procexec.engine.tokenizer``) and sent as token ids to
  ``/v1/completions``, so the prompt is exactly the one hashed into the store
  key; vLLM servers return the output token ids (``return_token_ids``), from
  which token offsets are computed with the same detokenizer as in-process.
  Truncated generations can be continued (prompt + attempt-1 ids).
* ``chat``: the chat turns go to ``/v1/chat/completions`` and the server
  renders them; the record says so (``prompt_route: chat``), the prompt hash
  covers the messages and template kwargs, and answer positions use the
  tokens the server reports in ``logprobs`` (else characters).

Replies are streamed (``stream: true``, the default; ``stream: false`` for a
provider without streaming): the HTTP read timeout, ``request_timeout_s``, then
bounds the wait for the next event, not the whole generation, so a generation
of hours at tens of tokens per second never outlives it while a server that
stops sending is still noticed.  The events are put back together into the
reply a non-streamed request gets (``procexec.generation.backends.replies.Stream``) and
checked as one.  The token ids received so far are what an interrupt keeps
(``unfinished``).

Requests run ``max_concurrency`` at a time.  To a data-parallel vLLM server (the job's own) each request names
the engine that runs it (``X-data-parallel-rank``, ``RankRouter``): a prompt sent before goes where its KV blocks
are, so a continuation finds its attempt 1's in the prefix cache.  429, 5xx, connection failures and
timeouts are retried with exponential backoff and full jitter, honouring
``Retry-After``; any other HTTP error, or a request that keeps failing, stops
the job with one clear error (what finished is already in the store).  The API
key is read from the environment variable the config names and is only ever
put in the ``Authorization`` header.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import email.utils
import functools
import random
import socket
import ssl
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from procexec.config import endpoint_key
from procexec.config.keys import engine_identity
from procexec.config.model import OpenAIModel
from procexec.engine.prompting import PromptRenderer
from procexec.engine.tokenizer import Messages, RenderedPrompt, spell_new_tokens
from procexec.errors import ProcexecError
from procexec.generation.backend import Backend, BackendSpec, Completion, OnFinished, Request, Sampling
from procexec.generation.backends.replies import (
    ChatReply,
    CompletionChoice,
    CompletionReply,
    MalformedReply,
    ModelList,
    Stream,
    Usage,
    parse,
)

BACKOFF_BASE_S = 0.5
BACKOFF_CAP_S = 60.0
RETRY_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})


class EndpointError(ProcexecError):
    """The endpoint refused or kept failing a request."""


def http_client(**settings: Any) -> Any:
    """An ``httpx.Client`` with ``settings``, its TLS context the process's one (``tls_context``)."""
    import httpx

    return httpx.Client(verify=tls_context(), **settings)


@functools.cache
def tls_context() -> ssl.SSLContext:
    """httpx's default TLS context (certifi's CA bundle, or SSL_CERT_FILE / SSL_CERT_DIR), built once: building
    one reads the whole bundle, 25 ms of CPU that every client would spend again."""
    import httpx

    return httpx.create_ssl_context()


def retry_after_seconds(header: str | None) -> float | None:
    """``Retry-After`` as seconds (a number or an HTTP date), None when absent or unreadable."""
    if not header:
        return None
    try:
        return max(0.0, float(header))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(header)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def backoff_seconds(retry: int, rng: random.Random) -> float:
    """Full jitter: uniform on [0, min(cap, base * 2^retry)] (retry counts from 0)."""
    return rng.uniform(0.0, min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2**retry))


@dataclass(frozen=True)
class Connection:
    """How an OpenAI-compatible server is reached: what the client needs besides the model entry (an endpoint's
    own settings, or those of the job's own vLLM server)."""

    base_url: str
    served_model: str  # the model id requests name (and replies must name, with check_served_model)
    route: str  # "completions" (token ids in, token ids out) or "chat" (the server renders the prompt)
    max_concurrency: int  # requests in flight
    request_timeout_s: float  # streamed: the longest wait for the next event; else for the whole reply
    max_retries: int
    request_extra: dict[str, Any]  # sent with every request
    stream: bool = True
    check_served_model: bool = True
    api_key: str | None = field(default=None, repr=False)  # only ever put in the Authorization header
    data_parallel_size: int = 1  # a vLLM server's engines: each request names its engine (RankRouter)

    @classmethod
    def of_endpoint(cls, model: OpenAIModel) -> Connection:
        """An endpoint entry's own settings (``backend: openai``), its API key read from the variable it names."""
        return cls(
            base_url=model.base_url.rstrip("/"),
            served_model=model.served_name,
            route=model.openai_api,
            max_concurrency=model.max_concurrency,
            request_timeout_s=float(model.request_timeout_s),
            max_retries=model.max_retries,
            request_extra=dict(model.request_extra),
            stream=model.stream,
            check_served_model=model.served_model_check,
            api_key=endpoint_key(model),
        )


class RankRouter:
    """Which engine of a data-parallel vLLM server runs each request (its ``X-data-parallel-rank`` header).

    vLLM 0.32 routes a request without the header to the engine its load balancer finds least loaded
    (``vllm/v1/engine/core_client.py:1642-1697``): a continuation meets its attempt 1's KV blocks only by chance
    (with equally loaded engines, 1 / DP), else prefills the whole prompt and attempt 1 again.  With the header the API process sends
    it to that engine (``vllm/entrypoints/generate/base/serving.py:219-232``, read on the completions route at
    ``vllm/entrypoints/openai/completion/serving.py:150-151``; ``core_client.py:1648``).  A prompt this client
    sent before goes to the same engine; a new one to the engine with the fewest of this client's requests in
    flight (the job is the server's only client, so that is the engine's load), ties taken in turn.
    """

    def __init__(self, ranks: int):
        self.ranks = ranks
        self.in_flight = [0] * ranks
        self._rank_of: dict[int, int] = {}  # the prompt's token ids (hashed) -> the engine that prefilled it
        self._next = 0
        self._lock = threading.Lock()

    def take(self, prompt_ids: Sequence[int]) -> int:
        """The engine for a request of this prompt, counted in flight until ``release``."""
        key = hash(tuple(prompt_ids))
        with self._lock:
            rank = self._rank_of.get(key)
            if rank is None:
                rank = min(range(self.ranks), key=lambda r: (self.in_flight[r], (r - self._next) % self.ranks))
                self._next = (rank + 1) % self.ranks
                self._rank_of[key] = rank
            self.in_flight[rank] += 1
            return rank

    def release(self, rank: int) -> None:
        with self._lock:
            self.in_flight[rank] -= 1


class OpenAIBackend(Backend):
    """Requests to ``base_url``; prompts rendered locally (completions route) or by the server (chat route)."""

    def __init__(self, spec: BackendSpec, connection: Connection | None = None):
        """``connection``: how to reach the server; by default the endpoint entry's own (``backend: openai``)."""
        self.spec = spec
        self.model = spec.model
        self.manifest = spec.manifest
        if connection is None:  # the registry builds this class bare for ``backend: openai`` entries only
            assert isinstance(spec.model, OpenAIModel), spec.model.backend_kind
            connection = Connection.of_endpoint(spec.model)
        self.connection = connection
        self._streams: dict[int, tuple[Request, Stream]] = {}  # the streams of requests in flight
        self._reading: set[Any] = set()  # the streamed replies being read (``close`` shuts their sockets)
        self._reading_lock = threading.Lock()
        self._rng = random.Random(0)
        self._stop = threading.Event()
        self._client: Any = None
        self.supports_continuation = self.connection.route == "completions"
        dp = self.connection.data_parallel_size
        self.router = RankRouter(dp) if dp > 1 and self.connection.route == "completions" else None

    def open(self) -> None:
        """Ask the endpoint for its models, load the tokenizer (completions route)."""
        import httpx

        key = self.connection.api_key
        self._headers = {"Authorization": f"Bearer {key}"} if key else {}
        timeout = self.connection.request_timeout_s
        self._client = http_client(
            base_url=self.connection.base_url,
            timeout=httpx.Timeout(timeout, connect=min(10.0, timeout)),
            limits=httpx.Limits(
                max_connections=self.connection.max_concurrency,
                max_keepalive_connections=self.connection.max_concurrency,
            ),
        )
        self.server = self._served_model_card()
        self.renderer = PromptRenderer.load(self.model, self.spec.model_ref, self.spec.template_date)
        self.tokenizer, self.vocab_size = self.renderer.tokenizer, None
        if self.tokenizer is not None:
            try:
                self.vocab_size = len(self.tokenizer)
            except TypeError:
                self.vocab_size = None

    # ---------------------------------------------------------------- Backend protocol

    def identity(self) -> dict[str, Any]:
        return engine_identity(self.model, self.manifest)

    def max_model_len(self) -> int:
        return self.model.max_model_len

    def vocabulary(self) -> int | None:
        return self.vocab_size

    def request_sampling(self, request: Request, sampling: Sampling) -> dict[str, Any]:
        """The job's sampling, then ``request_extra`` (it is sent after them, so its values are the ones sent)."""
        return {**super().request_sampling(request, sampling), **self.connection.request_extra}

    def render(self, messages_for: Callable[[bool], Messages]) -> RenderedPrompt:
        return self.renderer.render(messages_for)

    def provenance(self) -> dict[str, Any]:
        return {
            "backend": OpenAIModel.backend_kind,
            "commit": self.manifest.get("commit"),
            "endpoint": self.connection.base_url,
            "prompt_route": self.connection.route,
            "served_model": self.connection.served_model,
            "endpoint_max_model_len": self.server.get("max_model_len"),
        }

    def generate(self, requests: Sequence[Request], sampling: Sampling, on_finished: OnFinished) -> None:
        """At most ``max_concurrency`` requests in flight; completions are handed over in this thread, and the
        requests that follow from one (a continuation) are sent next, before the requests still waiting."""
        if not requests:
            return
        self._stop.clear()
        self._streams = {}
        waiting = collections.deque(requests)
        in_flight: set[concurrent.futures.Future[Completion]] = set()
        pool = concurrent.futures.ThreadPoolExecutor(
            self.connection.max_concurrency, thread_name_prefix="procexec-endpoint"
        )
        try:
            while waiting or in_flight:
                while waiting and len(in_flight) < self.connection.max_concurrency:
                    in_flight.add(pool.submit(self._run_one, waiting.popleft(), sampling, time.monotonic()))
                done, in_flight = concurrent.futures.wait(in_flight, return_when=concurrent.futures.FIRST_COMPLETED)
                for future in done:
                    waiting.extendleft(reversed(on_finished(future.result())))
        finally:
            self._stop.set()  # a failure (or an interrupt) stops every retry loop at its next wait
            for future in in_flight:
                future.cancel()
            pool.shutdown(wait=True, cancel_futures=True)

    def unfinished(self) -> list[tuple[Any, list[int]]]:
        """The token ids so far of each request still streaming (none on the chat route: it has no ids)."""
        kept = []
        for request, stream in list(self._streams.values()):
            ids = stream.tokens_so_far()
            if ids and (self.vocab_size is None or max(ids) < self.vocab_size):
                kept.append((request.tag, [*request.resumed_ids, *ids]))
        return kept

    def close(self) -> None:
        """Stop every stream and retry loop at its next event or wait, and close the connections.  The sockets of
        the replies being read are shut first: a close neither wakes a thread blocked reading one nor tells the
        server, so a stream whose server sent no more (its engine stopped, a stall) held on to the read timeout,
        and a vLLM server being stopped waited for it ("Waiting for connections to close") until the SIGKILL."""
        self._stop.set()
        with self._reading_lock:
            for response in self._reading:
                network = response.extensions.get("network_stream")
                sock = None if network is None else network.get_extra_info("socket")
                with contextlib.suppress(OSError):  # already closed
                    if sock is not None:
                        sock.shutdown(socket.SHUT_RDWR)
        if self._client is not None:
            self._client.close()

    # ---------------------------------------------------------------- HTTP

    def _served_model_card(self) -> dict[str, Any]:
        """``GET /v1/models``: the endpoint answers and serves the configured model (one clear error if not)."""
        import httpx

        where = f"models.{self.model.key}.base_url {self.connection.base_url}"
        try:
            response = self._client.get("/models", headers=self._headers)
        except httpx.HTTPError as exc:
            raise EndpointError(
                f"{where}: no OpenAI-compatible endpoint answers ({type(exc).__name__}: {exc})"
            ) from None
        if response.status_code in (401, 403):
            raise EndpointError(f"{where}: the endpoint refused the API key (HTTP {response.status_code})")
        if response.status_code != 200:
            raise EndpointError(f"{where}: GET /models answered HTTP {response.status_code}: {response.text[:200]}")
        try:
            listing = response.json()
        except ValueError:
            raise EndpointError(f"{where}: GET /models did not return an OpenAI model list (not JSON)") from None
        try:
            cards = parse(ModelList, listing, f"{where}: GET /models").data
        except MalformedReply as exc:
            raise EndpointError(str(exc)) from None
        for card in cards:
            if card.id == self.connection.served_model:
                served_len = card.max_model_len
                if served_len is not None and served_len < self.model.max_model_len:
                    raise ProcexecError(
                        f"{self.connection.base_url}/models: serves '{self.connection.served_model}' with "
                        f"max_model_len {served_len}, less than models.{self.model.key}.max_model_len "
                        f"{self.model.max_model_len}"
                    )
                return card.model_dump()
        names = ", ".join(sorted(c.id for c in cards)) or "none"
        raise ProcexecError(
            f"models.{self.model.key}.served_model: '{self.connection.served_model}' is not "
            f"served by {self.connection.base_url} (served: {names})"
        )

    def _body(self, request: Request, sampling: Sampling) -> tuple[str, dict[str, Any]]:
        body: dict[str, Any] = {
            "model": self.connection.served_model,
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            **self.request_sampling(request, sampling),  # the record's sampling: request_extra included
        }
        if self.connection.stream:
            body.update(stream=True, stream_options={"include_usage": True})
        if self.connection.route == "completions":
            body.update(prompt=request.engine_ids(), return_token_ids=True)
            path = "/completions"
        else:
            body.update(messages=request.prompt.messages, logprobs=True)
            if request.prompt.template_kwargs:
                body["chat_template_kwargs"] = request.prompt.template_kwargs
            path = "/chat/completions"
        return path, body

    def _post(
        self, path: str, body: dict[str, Any], read: Callable[[Any], Any], request: Request, headers: dict[str, str]
    ) -> tuple[Any, int]:
        """POST with retries; returns (``read(reply JSON)``, retries spent).

        ``read`` raises ``MalformedReply`` for a reply of the wrong shape (``StreamFailed`` for a
        stream that breaks off): retried like a 5xx (a proxy or a server fault), then one error; any
        other ``EndpointError`` from it stops at once.  A retry starts the generation again.
        """
        import httpx

        for retry in range(self.connection.max_retries + 1):
            wait: float | None = None
            try:
                with self._client.stream("POST", path, json=body, headers=headers) as response, self._read_by(response):
                    if response.status_code == 200:
                        try:
                            return read(self._reply(path, response, request)), retry
                        except ValueError:
                            reason = "a response that is not JSON"
                        except MalformedReply as exc:
                            reason = str(exc).removeprefix(f"{self.connection.base_url}{path}: ")
                    elif response.status_code in RETRY_STATUS:
                        reason = f"HTTP {response.status_code}"
                        wait = retry_after_seconds(response.headers.get("Retry-After"))
                    else:
                        raise EndpointError(
                            f"{self.connection.base_url}{path}: HTTP {response.status_code}: "
                            f"{response.read().decode('utf-8', 'replace')[:300]}"
                        )
            except httpx.HTTPError as exc:  # timeouts (also between two events), refused or dropped connections
                reason = type(exc).__name__
            if self._stop.is_set():
                raise EndpointError(f"{self.connection.base_url}{path}: stopped")
            if retry == self.connection.max_retries:
                raise EndpointError(
                    f"{self.connection.base_url}{path}: still failing after "
                    f"{self.connection.max_retries} retries (last: {reason}); finished generations "
                    "are kept, run again to resume"
                )
            wait = backoff_seconds(retry, self._rng) if wait is None else wait
            print(
                f"[procexec infer {self.model.key}] retry {retry + 1}/{self.connection.max_retries} after "
                f"{reason}: waiting {wait:.1f} s",
                file=sys.stderr,
                flush=True,
            )
            if self._stop.wait(wait):
                raise EndpointError(f"{self.connection.base_url}{path}: stopped")
        raise AssertionError("unreachable")

    @contextlib.contextmanager
    def _read_by(self, response: Any) -> Iterator[None]:
        """``response`` among the replies being read while the block runs (``close``)."""
        with self._reading_lock:
            self._reading.add(response)
        try:
            yield
        finally:
            with self._reading_lock:
                self._reading.discard(response)

    def _reply(self, path: str, response: Any, request: Request) -> Any:
        """The reply's JSON: put together from its stream event by event (each read waits at most
        ``request_timeout_s``; an interrupt stops it at the next event), or read whole when not streamed
        (``stream: false``, or a server that answers a streamed request with one JSON reply)."""
        if not (self.connection.stream and response.headers.get("content-type", "").startswith("text/event-stream")):
            response.read()
            return response.json()
        stream = Stream(self.connection.route == "chat", f"{self.connection.base_url}{path}")
        self._streams[id(request)] = (request, stream)
        for line in response.iter_lines():
            if self._stop.is_set():
                raise EndpointError(f"{self.connection.base_url}{path}: stopped")
            stream.feed(line)
            if stream.done:
                break
        return stream.reply()

    def _read(self, path: str, request: Request, obj: Any) -> Completion:
        """One reply as a Completion: typed (``procexec.generation.backends.replies``), then checked against the request."""
        url = f"{self.connection.base_url}{path}"
        kind: type[CompletionReply] | type[ChatReply] = (
            CompletionReply if self.connection.route == "completions" else ChatReply
        )
        reply = parse(kind, obj, url)
        served = self.connection.served_model
        if self.connection.check_served_model and reply.model is not None and reply.model != served:
            raise EndpointError(
                f"{url}: the reply comes from model '{reply.model:.80}', not models.{self.model.key}.served_model "
                f"'{self.connection.served_model}' (a provider that renames its models: set served_model_check: false)"
            )
        choice = reply.choices[0]
        usage = reply.usage or Usage()
        details: dict[str, Any] = {
            "served_model_reported": reply.model,
            "system_fingerprint": reply.system_fingerprint,
            "usage": {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens},
        }
        # Counts the request bounds: more than asked (or a prompt longer than the context) is no reply to it
        if usage.prompt_tokens is not None and not 0 <= usage.prompt_tokens <= self.max_model_len():
            raise MalformedReply(
                f"{url}: a malformed reply (usage.prompt_tokens: {usage.prompt_tokens:.3g} is more "
                f"than the context of {self.max_model_len()} tokens)"
            )
        if usage.completion_tokens is not None and not 0 <= usage.completion_tokens <= request.max_tokens:
            raise MalformedReply(
                f"{url}: a malformed reply (usage.completion_tokens: {usage.completion_tokens:.3g} "
                f"for a budget of max_tokens {request.max_tokens})"
            )
        if usage.prompt_tokens is not None:
            details["prompt_tokens"] = usage.prompt_tokens
        cached = None if usage.prompt_tokens_details is None else usage.prompt_tokens_details.cached_tokens
        if cached is not None:  # the prefix cache's share of the prompt (a continuation's prefill, for the stats)
            if usage.prompt_tokens is not None and cached > usage.prompt_tokens:
                raise MalformedReply(
                    f"{url}: a malformed reply (usage.prompt_tokens_details.cached_tokens: {cached:.3g} of a prompt "
                    f"of {usage.prompt_tokens} tokens)"
                )
            details["num_cached_tokens"] = cached
        if isinstance(choice, CompletionChoice):
            text = choice.text or ""
            ids, offsets = choice.token_ids, None
            if ids is not None:
                if len(ids) > request.max_tokens:
                    raise MalformedReply(
                        f"{url}: a malformed reply (choices.0.token_ids: {len(ids)} token ids for "
                        f"a budget of max_tokens {request.max_tokens})"
                    )
                if ids and self.vocab_size is not None and max(ids) >= self.vocab_size:
                    raise MalformedReply(
                        f"{url}: a malformed reply (choices.0.token_ids: token id {max(ids)} is "
                        f"outside the model's vocabulary of {self.vocab_size})"
                    )
                ids = [*request.resumed_ids, *ids]
                spelled, offsets = spell_new_tokens(self.tokenizer, request.prompt_ids, request.prefix_ids, ids)
                resumed = len(request.resumed_ids)
                new_text = spelled[offsets[resumed] :] if len(ids) > resumed else ""
                details["token_offsets_match_text"] = new_text == text  # the server spelled only the new ids
                text = spelled
        else:
            message = choice.message
            if message.reasoning or message.reasoning_content:
                raise EndpointError(
                    f"{url}: the endpoint splits the reasoning out of the answer (a server-side "
                    "reasoning parser is on); the benchmark scores the raw output: serve without "
                    "--reasoning-parser, or use openai_api: completions"
                )
            text = message.content or ""
            logprobs = None if choice.logprobs is None else choice.logprobs.model_dump()
            ids, offsets = None, _chat_offsets(logprobs, text)
        count = len(ids) if ids is not None else usage.completion_tokens
        if count is None:
            count = len(offsets) if offsets is not None else 0
        finish = _finish_reason(choice.finish_reason)
        new = count - len(request.resumed_ids)  # what this request decoded (max_tokens is what was left)
        if finish == "length" and new < request.max_tokens:
            # The server stopped on a limit of its own (its context, a provider's cap), not on this budget:
            # kept as a truncated generation, and the record says whose limit it was.  Unless the served
            # context it reports was not full: then no limit was reached, and the reply is no truncation.
            served_len = self.server.get("max_model_len")
            if served_len is not None and usage.prompt_tokens is not None and usage.prompt_tokens + new < served_len:
                raise MalformedReply(
                    f"{url}: a malformed reply (finish_reason 'length' after {new} of max_tokens "
                    f"{request.max_tokens} tokens, {usage.prompt_tokens + new} of the served "
                    f"context's {served_len} used: no limit was reached)"
                )
            details["length_limit"] = {"by": "server", "generated": new, "max_tokens": request.max_tokens}
        return Completion(
            tag=request.tag,
            text=text,
            token_ids=None if ids is None else list(ids),
            token_offsets=offsets,
            finish_reason=finish,
            num_generated_tokens=int(count),
            wall_time_s=0.0,
            details=details,
        )

    def _run_one(self, request: Request, sampling: Sampling, sent: float) -> Completion:
        path, body = self._body(request, sampling)
        headers, rank = self._headers, None
        if self.router is not None:
            rank = self.router.take(request.prompt_ids)
            headers = {**headers, "X-data-parallel-rank": str(rank)}
        try:
            completion, retries = self._post(path, body, lambda obj: self._read(path, request, obj), request, headers)
        finally:
            if rank is not None:
                assert self.router is not None
                self.router.release(rank)
        if rank is not None:
            completion.details["data_parallel_rank"] = rank
        self._streams.pop(id(request), None)
        completion.details["retries"] = retries
        completion.wall_time_s = time.monotonic() - sent
        return completion


def _finish_reason(reason: Any) -> str:
    """The server's finish reason in the records' vocabulary (stop | length | repetition | abort); vLLM's
    repetition guard finishes with ``repetition`` (``vllm/v1/engine/__init__.py``, ``FINISH_REASON_STRINGS``)."""
    if reason in ("length", "repetition"):
        return reason
    if reason in ("stop", "eos", "end_turn"):
        return "stop"
    return "abort"


def _chat_offsets(logprobs: Any, text: str) -> list[int] | None:
    """Token offsets from a chat response's ``logprobs.content`` (each token's UTF-8 ``bytes``).

    A token's offset is the number of whole characters before it, so a token
    that completes no character starts where the next one will (as in-process).
    None unless the tokens' bytes spell the text exactly.
    """
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    if not content:
        return None
    offsets, spelled = [], b""
    for token in content:  # one logprobs entry per output token
        raw = token.get("bytes")
        piece = bytes(raw) if isinstance(raw, list) else str(token.get("token") or "").encode("utf-8")
        offsets.append(len(spelled.decode("utf-8", errors="ignore")))
        spelled += piece
    try:
        return offsets if spelled.decode("utf-8") == text else None
    except UnicodeDecodeError:
        return None
