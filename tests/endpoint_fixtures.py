"""A real vLLM OpenAI-compatible server on 127.0.0.1, and a proxy that injects faults in front of it."""

from __future__ import annotations

import http.client
import http.server
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections import deque
from pathlib import Path

CPU_ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "OMP_NUM_THREADS": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "TORCHDYNAMO_DISABLE": "1",
    "HF_HUB_OFFLINE": "1",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class VLLMServer:
    """vLLM's own ``serve`` subcommand, run as ``python -m procexec.engine.serve`` (the ``vllm serve`` console
    script fails with vllm-cpu; procexec.engine.serve says why)."""

    def __init__(self, model_dir: Path, log: Path, served_name: str = "tiny", max_model_len: int = 2048):
        self.model_dir, self.log, self.served_name, self.max_model_len = model_dir, log, served_name, max_model_len
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self, timeout: float = 240) -> VLLMServer:
        cmd = [
            sys.executable,
            "-m",
            "procexec.engine.serve",
            str(self.model_dir),
            "--served-model-name",
            self.served_name,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--dtype",
            "float32",
            "--enforce-eager",
            "--kv-cache-memory-bytes",
            str(256 << 20),
            "--max-model-len",
            str(self.max_model_len),
            "--generation-config",
            "vllm",
        ]
        handle = open(self.log, "ab")
        self.proc = subprocess.Popen(
            cmd, stdout=handle, stderr=subprocess.STDOUT, env={**os.environ, **CPU_ENV}, start_new_session=True
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM server exited: {self.log.read_text()[-3000:]}")
            try:
                urllib.request.urlopen(f"{self.base_url}/models", timeout=2).read()
                return self
            except OSError:
                time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"vLLM server did not come up: {self.log.read_text()[-3000:]}")

    def stop(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            self.proc.wait(timeout=60)
        self.proc = None


def _first_choice(reply: dict) -> dict:
    return reply["choices"][0]


#: Ways to spoil a healthy reply (a proxy or provider fault): each returns the reply to send instead.
REPLY_MUTATIONS = {
    "choices-of-strings": lambda r: {**r, "choices": ["x"]},
    "no-choices": lambda r: {**r, "choices": []},
    "usage-a-string": lambda r: {**r, "usage": "n/a"},
    "text-a-number": lambda r: (_first_choice(r).update(text=5), r)[1],
    "content-a-number": lambda r: (
        _first_choice(r)["message" if "message" in _first_choice(r) else "delta"].update(content=5),
        r,
    )[1],
    "token-ids-strings": lambda r: (
        _first_choice(r).update(token_ids=[str(i) for i in _first_choice(r)["token_ids"]]),
        r,
    )[1],
    "token-id-outside-vocabulary": lambda r: (
        _first_choice(r).update(token_ids=[*_first_choice(r)["token_ids"][:-1], 10**9]),
        r,
    )[1],
    "negative-usage": lambda r: {**r, "usage": {"prompt_tokens": -1, "completion_tokens": 3}},
    "a-list": lambda r: [r],
    "another-model": lambda r: {**r, "model": "gpt-17"},
}


class FaultProxy:
    """Forwards to ``upstream`` except where the plan says otherwise.

    Plan entries, consumed one per POST: ``"pass"``, ``"429"`` (with Retry-After),
    ``"500"``, ``"stall"`` (accept, never answer), ``"always-500"`` (every
    POST from then on), ``"reply:NAME"`` (forward, then send the reply spoilt
    by ``REPLY_MUTATIONS[NAME]`` with status 200; in a stream, every event that
    carries a choice) and ``"stall-after:N"`` (a stream: forward N events, then
    send nothing more).  A streamed reply (server-sent events) is forwarded
    event by event, ``delay`` seconds apart.  Counts what it saw (``tokens``: the
    token ids of the streamed events it forwarded; ``hung_up``: the stalled
    requests whose client closed its end); keeps every Authorization header and
    every request body.
    """

    def __init__(self, upstream_port: int, plan: list[str] | None = None, retry_after: str = "0.2", delay: float = 0.0):
        self.upstream_port, self.retry_after, self.delay = upstream_port, retry_after, delay
        self.plan = deque(plan or [])
        self.seen: list[str] = []
        self.auth: list[str | None] = []
        self.bodies: list[dict] = []
        self.events = self.tokens = self.hung_up = 0
        self.stream_events: list[int] = []  # events forwarded by each streamed reply, in the order they opened
        self.lock = threading.Lock()
        self.stalled = threading.Event()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # TCP_NODELAY, as vLLM's server: else each reply waits 40 ms

            def log_message(self, *args):
                pass

            def _forward(self, body: bytes | None, mutate=None, events: int | None = None):
                conn = http.client.HTTPConnection("127.0.0.1", proxy.upstream_port, timeout=600)
                conn.request(
                    self.command,
                    self.path,
                    body=body,
                    headers={"Content-Type": "application/json", "Content-Length": str(len(body or b""))},
                )
                response = conn.getresponse()
                if response.getheader("Content-Type", "").startswith("text/event-stream"):
                    self._stream(response, mutate, events)
                    conn.close()
                    return
                data = response.read()
                if mutate is not None and response.status == 200:
                    data = json.dumps(mutate(json.loads(data))).encode()
                self.send_response(response.status)
                self.send_header("Content-Type", response.getheader("Content-Type", "application/json"))
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                conn.close()

            def _stream(self, response, mutate, events: int | None):
                """Server-sent events one by one (the connection closes after the last)."""
                self.send_response(response.status)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                self.close_connection = True
                sent = 0
                with proxy.lock:
                    stream = len(proxy.stream_events)
                    proxy.stream_events.append(0)
                for line in iter(response.readline, b""):
                    if line.startswith(b"data: {"):
                        if events is not None and sent == events:
                            proxy.hold(self.connection)
                            return
                        event = json.loads(line[6:])
                        with proxy.lock:
                            proxy.events += 1
                            proxy.stream_events[stream] += 1
                            proxy.tokens += sum(len(c.get("token_ids") or []) for c in event.get("choices", []))
                        if mutate is not None and event.get("choices"):
                            line = b"data: " + json.dumps(mutate(event)).encode() + b"\n"
                        sent += 1
                        time.sleep(proxy.delay)
                    try:
                        self.wfile.write(line)
                        self.wfile.flush()
                    except (BrokenPipeError, ConnectionResetError):  # the client went away (an interrupt)
                        return

            def _reply(self, status: int, headers: dict[str, str] | None = None):
                data = b'{"error": {"message": "injected"}}'
                self.send_response(status)
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                proxy.auth.append(self.headers.get("Authorization"))
                self._forward(None)

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with proxy.lock:
                    proxy.auth.append(self.headers.get("Authorization"))
                    action = proxy.plan[0] if proxy.plan else "pass"
                    if action != "always-500" and proxy.plan:
                        proxy.plan.popleft()
                    proxy.seen.append(action)
                    proxy.bodies.append(json.loads(body))
                if action == "pass":
                    self._forward(body)
                elif action.startswith("reply:"):
                    self._forward(body, REPLY_MUTATIONS[action.removeprefix("reply:")])
                elif action == "429":
                    self._reply(429, {"Retry-After": proxy.retry_after})
                elif action in ("500", "always-500"):
                    self._reply(500)
                elif action.startswith("stall-after:"):
                    self._forward(body, events=int(action.removeprefix("stall-after:")))
                elif action == "stall":
                    proxy.hold(self.connection)
                    self.close_connection = True

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def hold(self, connection: socket.socket) -> None:
        """Send nothing on ``connection`` until the proxy closes or the client closes its end (a hang-up)."""
        while not self.stalled.wait(0.05):
            if select.select([connection], [], [], 0)[0]:
                try:
                    ended = connection.recv(1, socket.MSG_PEEK) == b""
                except OSError:
                    ended = True
                if ended:
                    with self.lock:
                        self.hung_up += 1
                    return

    def __enter__(self) -> FaultProxy:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stalled.set()
        self.server.shutdown()
        self.server.server_close()
