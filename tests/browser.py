"""A real headless Chromium driven over the DevTools protocol through a pipe, standard library only.

``chromium --remote-debugging-pipe`` reads protocol messages on file descriptor 3 and writes on 4,
each a JSON object ended by a NUL byte: no websocket client, no chromedriver, nothing to download.
Debian's ``chromium`` package is what CI installs (``.ci/run``).
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["Browser", "LabelServer", "Page", "answer", "find_chromium", "label_in_browser", "open_page"]

# What Chromium needs to run as root in a container, headless, and to stay off the network.
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--remote-debugging-pipe",
)


def find_chromium() -> str | None:
    """The Chromium binary on PATH (Debian: ``chromium``), if any."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


class Browser:
    """One Chromium process with a fresh profile; ``close()`` ends it and removes the profile."""

    def __init__(self, binary: str, *, timeout: float = 30.0) -> None:
        self.timeout = timeout
        self.profile = tempfile.mkdtemp(prefix="llama-jev-chromium-")
        to_chromium, self._from_us = os.pipe()
        self._to_us, from_chromium = os.pipe()

        def descriptors() -> None:  # in the child: the protocol's pipe ends at 3 and 4
            # moved above 9 first, so placing one cannot overwrite the other if it sat at 3 or 4
            reading, writing = (
                fcntl.fcntl(to_chromium, fcntl.F_DUPFD, 10),
                fcntl.fcntl(from_chromium, fcntl.F_DUPFD, 10),
            )
            os.dup2(reading, 3)
            os.dup2(writing, 4)

        self.process = subprocess.Popen(
            [binary, *FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=descriptors,
            pass_fds=(3, 4, to_chromium, from_chromium),
        )
        os.close(to_chromium)
        os.close(from_chromium)
        self._buffer = b""
        self._next_id = 0

    def send(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> dict[str, Any]:
        """Send one command and wait for its result (events in between are dropped)."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        os.write(self._from_us, json.dumps(message).encode("utf-8") + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                result: dict[str, Any] = reply.get("result", {})
                return result

    def _read(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("Chromium did not answer in time")
            ready, _, _ = select.select([self._to_us], [], [], left)
            if ready:
                chunk = os.read(self._to_us, 1 << 20)
                if not chunk:
                    raise RuntimeError("Chromium closed the protocol pipe (did it start?)")
                self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        message: dict[str, Any] = json.loads(raw)
        return message

    def page(self, width: int = 1280, height: int = 900) -> Page:
        """A new tab of ``width`` x ``height`` CSS pixels."""
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        self.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
            session,
        )
        return Page(self, session)

    def close(self) -> None:
        with contextlib.suppress(OSError, RuntimeError, TimeoutError):
            self.send("Browser.close")
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        for descriptor in (self._from_us, self._to_us):
            with contextlib.suppress(OSError):
                os.close(descriptor)
        shutil.rmtree(self.profile, ignore_errors=True)


class Page:
    """One tab: navigate, evaluate JavaScript, press keys, take screenshots."""

    def __init__(self, browser: Browser, session: str) -> None:
        self.browser = browser
        self.session = session

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page."""
        result = self.browser.send(
            "Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True}, self.session
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails'].get('text')}")
        return result["result"].get("value")

    def goto(self, url: str) -> None:
        self.browser.send("Page.navigate", {"url": url}, self.session)

    def wait_for(self, expression: str, *, timeout: float = 20.0) -> Any:
        """Poll ``expression`` until it is truthy; return its value."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                value = self.evaluate(expression)
            except RuntimeError:
                value = None  # the page is still loading
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"waited in vain for {expression}")
            time.sleep(0.05)

    def press(self, key: str) -> None:
        """One key press (down and up), as a person types it."""
        code = f"Key{key.upper()}" if key.isalpha() else key
        common = {"key": key, "code": code, "windowsVirtualKeyCode": ord(key.upper())}
        self.browser.send("Input.dispatchKeyEvent", {"type": "keyDown", "text": key, **common}, self.session)
        self.browser.send("Input.dispatchKeyEvent", {"type": "keyUp", **common}, self.session)

    def text(self) -> str:
        """Everything the page shows as text."""
        return str(self.evaluate("document.body.innerText"))

    def screenshot(self, path: Path) -> Path:
        data = self.browser.send("Page.captureScreenshot", {"format": "png"}, self.session)["data"]
        path.write_bytes(base64.b64decode(data))
        return path


# --- the labelling page, as a person uses it ---------------------------------------------------

ROOT = Path(__file__).resolve().parents[1]


class LabelServer:
    """``python -m llama_jev.label`` as a person starts it, in its own process."""

    def __init__(self, sheet: Path, out: Path, labeller: str = "ana", *extra: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "llama_jev.label", str(sheet), "--out", str(out), "--labeller", labeller, *extra],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        self.banner = self.process.stdout.readline()
        line = self.process.stdout.readline()
        assert line.startswith("open http://127.0.0.1:"), (self.banner, line, self.process.stderr)
        self.url = line.split()[1]

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
        for stream in (self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()


def open_page(page: Page, url: str) -> None:
    page.goto(url)
    page.wait_for("document.body.dataset.ready === 'true'")


def answer(page: Page, key: str) -> None:
    """Press ``key`` and wait until the server has saved it and the page moved on."""
    before = page.evaluate("document.body.dataset.position + '/' + document.getElementById('count').textContent")
    page.press(key)
    page.wait_for(
        "document.body.dataset.ready === 'true' && "
        f"document.body.dataset.position + '/' + document.getElementById('count').textContent !== {json.dumps(before)}"
    )


def label_in_browser(page: Page, url: str, truth: Callable[[str, str], bool]) -> int:
    """Answer every pair the page shows with ``truth(question, passage)``, by key; return how many."""
    open_page(page, url)
    answered = 0
    while not page.evaluate("document.getElementById('pair').hidden"):
        question = page.evaluate("document.getElementById('question').textContent")
        passage = page.evaluate("document.getElementById('passage').textContent")
        answer(page, "y" if truth(question, passage) else "n")
        answered += 1
    return answered
