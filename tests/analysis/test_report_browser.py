"""Acceptance in a real browser: headless Chromium opens the report from disk.

Driven over the DevTools protocol on ``--remote-debugging-pipe`` (JSON messages
separated by NUL on file descriptors 3 and 4), so only the standard library is needed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from report_fixtures import build_pipeline

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [pytest.mark.browser, pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed")]


def _to_3_and_4(read_end: int, write_end: int) -> None:
    """In the child: CDP pipe ends on fds 3 (commands in) and 4 (replies out), whatever they were."""
    high_r, high_w = os.dup(read_end), os.dup(write_end)
    os.dup2(high_r, 3)
    os.dup2(high_w, 4)


class Browser:
    """Minimal CDP client: one page session, events buffered while waiting for replies."""

    def __init__(self, profile: Path) -> None:
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()
        os.set_inheritable(to_chrome_r, True)
        os.set_inheritable(from_chrome_w, True)
        args = [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--allow-file-access-from-files",
            f"--user-data-dir={profile}",
            "--remote-debugging-pipe",
            "about:blank",
        ]
        self.proc = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            # close_fds runs after preexec_fn and keeps only pass_fds: so 3 and 4 must be listed.
            pass_fds=(3, 4, to_chrome_r, from_chrome_w),
            preexec_fn=lambda: _to_3_and_4(to_chrome_r, from_chrome_w),
        )
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._buffer = b""
        self._next = 0
        self.events: list[dict[str, Any]] = []
        self.session: str | None = None

    def _read(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            if time.monotonic() > deadline:
                raise TimeoutError("no message from chromium")
            chunk = os.read(self._from_chrome, 1 << 16)
            if not chunk:
                raise RuntimeError("chromium closed the pipe")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def call(self, method: str, params: dict[str, Any] | None = None, timeout: float = 60) -> dict[str, Any]:
        self._next += 1
        message: dict[str, Any] = {"id": self._next, "method": method, "params": params or {}}
        if self.session and not method.startswith("Target."):
            message["sessionId"] = self.session
        os.write(self._to_chrome, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self._next:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]
            self.events.append(reply)

    def wait_for(self, method: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not any(e.get("method") == method for e in self.events):
            self.events.append(self._read(deadline))

    def close(self) -> None:
        try:
            self.call("Browser.close", timeout=10)
        finally:
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
            os.close(self._to_chrome)
            os.close(self._from_chrome)


CHECK_IMAGES = """
Promise.all([...document.images].map(img => {
  img.loading = 'eager';
  return img.decode().then(() => [img.getAttribute('src'), img.naturalWidth],
                           () => [img.getAttribute('src'), 0]);
}))
"""


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    paths = build_pipeline(tmp_path_factory.mktemp("browser-report"), REPO)
    browser = Browser(tmp_path_factory.mktemp("chromium-profile"))
    try:
        target = browser.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        browser.session = browser.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            browser.call(f"{domain}.enable")
        browser.call("Page.navigate", {"url": paths["report"].resolve().as_uri()})
        browser.wait_for("Page.loadEventFired")
        images = browser.call(
            "Runtime.evaluate", {"expression": CHECK_IMAGES, "awaitPromise": True, "returnByValue": True}
        )["result"]["value"]
        state = browser.call(
            "Runtime.evaluate",
            {
                "expression": "({title: document.title, pwned: window.__pwned === undefined ? null : window.__pwned,"
                " marks: document.querySelectorAll('mark.divergent').length,"
                " shown: [...document.querySelectorAll('pre.generation')].some("
                "   p => p.textContent.includes('<script>document.title'))})",
                "returnByValue": True,
            },
        )["result"]["value"]
    finally:
        browser.close()
    return {"images": images, "state": state, "events": browser.events}


def test_every_image_loads(loaded: dict[str, Any]) -> None:
    assert len(loaded["images"]) > 20
    broken = [src for src, width in loaded["images"] if width <= 0]
    assert not broken


def test_no_console_errors(loaded: dict[str, Any]) -> None:
    errors = [
        e
        for e in loaded["events"]
        if e.get("method") == "Runtime.exceptionThrown"
        or (e.get("method") == "Runtime.consoleAPICalled" and e["params"]["type"] == "error")
        or (e.get("method") == "Log.entryAdded" and e["params"]["entry"]["level"] == "error")
    ]
    assert not errors


def test_hostile_generation_shows_as_text_and_never_runs(loaded: dict[str, Any]) -> None:
    state = loaded["state"]
    assert state["pwned"] is None
    assert "pwned" not in state["title"]
    assert state["shown"]
    assert state["marks"] >= 1
