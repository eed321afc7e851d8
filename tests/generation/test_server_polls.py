"""The job server's ``/metrics`` polls (the watchdog's progress, the shard's counters) cost the job no set-up each."""

from __future__ import annotations

import datetime as dt
import http.server
import ssl
import subprocess
import threading
import types

import pytest

from procexec.config import prepare
from procexec.generation.backend import BackendSpec
from procexec.generation.backends.vllm_server import VLLMServerBackend

METRICS = 'vllm:generation_tokens_total{engine="0"} 5.0\nvllm:num_requests_running{engine="0"} 1.0\n'


class Metrics(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: a client that keeps its connection is served on it
    disable_nagle_algorithm = True  # TCP_NODELAY, as vLLM's server: else each reply waits 40 ms
    served: list[str] = []

    def do_GET(self) -> None:
        Metrics.served.append(self.path)
        body = METRICS.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        return


@pytest.fixture
def polled(tiny_raw_config, monkeypatch):
    """A server backend whose "server" answers ``/metrics`` (a thread) and whose process runs (``sleep``); the
    SSL contexts built while it is polled are counted."""
    raw = dict(tiny_raw_config)
    raw["models"] = {**raw["models"], "srv": {**raw["models"]["tiny"], "backend": "vllm-server"}}
    model = prepare(raw).models["srv"]
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    running = subprocess.Popen(["sleep", "60"])
    backend = VLLMServerBackend(BackendSpec(model, "unused", {}, dt.date(2026, 1, 1)))
    backend.base_url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    backend.server = types.SimpleNamespace(proc=running)
    backend.client = object()  # the endpoint client, there once the server answers
    contexts = []
    build = ssl.create_default_context
    monkeypatch.setattr(ssl, "create_default_context", lambda *a, **k: contexts.append(1) or build(*a, **k))
    Metrics.served = []
    yield backend, contexts
    running.kill()
    running.wait()
    httpd.shutdown()


def test_the_watchdogs_polls_reuse_one_client(polled):
    backend, contexts = polled
    assert [backend.progress() for _ in range(5)] == [5.0] * 5
    assert Metrics.served == ["/metrics"] * 5 and len(contexts) <= 1
    backend.server.proc.kill()
    backend.server.proc.wait()
    assert backend.progress() == "no answer from /metrics"  # a server gone does not progress


def test_a_poll_after_the_backend_closed_is_no_answer_not_a_traceback(polled):
    """The watchdog's thread polls while the main thread closes the backend (a SIGTERM): the poll reads as no
    answer, never httpx's "Cannot send a request, as the client has been closed" traceback (seen in CI)."""
    backend, _ = polled
    assert backend.progress() == 5.0  # the polls' client exists
    backend.client = types.SimpleNamespace(close=lambda: None)
    backend.server.stop = lambda: None  # the process runs on: only the close decides
    backend.close()
    assert backend.progress() == "no answer from /metrics"


def test_a_processs_clients_share_one_tls_context_that_verifies(monkeypatch):
    """Building a TLS context reads the whole CA bundle (~25 ms of CPU): a job's clients (its endpoint's, the
    ``/metrics`` polls') share one, httpx's default, which verifies the server and its name."""
    from procexec.generation.backends.openai import http_client, tls_context

    tls_context.cache_clear()
    contexts = []
    build = ssl.create_default_context
    monkeypatch.setattr(ssl, "create_default_context", lambda *a, **k: contexts.append(1) or build(*a, **k))
    clients = [http_client(timeout=1.0) for _ in range(3)]
    assert len(contexts) == 1
    assert tls_context().verify_mode == ssl.CERT_REQUIRED and tls_context().check_hostname
    for client in clients:
        client.close()
