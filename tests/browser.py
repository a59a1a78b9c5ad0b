"""Open a self-contained HTML file in a real headless Chromium and report what rendered.

Report tests need more than the HTML's text: a script that throws, an image that fails to load
or a chart that draws nothing all leave the file looking right to a parser. ``render_page`` opens
the file the way a reader's browser does and returns the console's errors, the headings, the
page's height and a full-page screenshot.

Chromium is driven over the Chrome DevTools Protocol through ``--remote-debugging-pipe``: it
reads commands from file descriptor 3 and writes answers and events to descriptor 4, each a JSON
message ended by a NUL byte. A pipe needs no port and no websocket client, so this module uses
the standard library only. ``find_chromium`` returns None where no browser is installed, and the
tests that need one skip.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image

# The names Chromium's packages install it under (Debian and Ubuntu, then Google's builds).
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")

# The viewport's height before the page is measured; the screenshot covers the whole page anyway.
VIEWPORT_HEIGHT = 800

# A page counts as non-blank when more than this fraction of its screenshot's pixels differ from
# its most common colour (the background). Measured at 1280 x 800: a blank page scores 0, a
# two-letter paragraph 0.01 %, a one-letter heading beside a broken-image icon 0.06 %, an h1
# "Training" 0.18 %, a chart several percent. 0.1 % counts one real heading as something shown
# while a stray word, border or icon on an otherwise empty page does not.
NON_BLANK_FRACTION = 0.001

# Lines of Chromium's stderr quoted in an error. Its D-Bus complaints (no system bus in a
# container) are left out of the quote: they appear on every start and explain nothing.
STDERR_TAIL_LINES = 20

# Seconds to wait for a browser to exit: once it closed its pipe, or once it has been killed.
REAP_TIMEOUT = 10.0

# Run in the page once it has loaded: waits for web fonts, so the screenshot shows the final
# text, then returns the h1/h2/h3 texts in document order with their whitespace collapsed.
HEADINGS_SCRIPT = """
document.fonts.ready.then(() => Array.from(
    document.querySelectorAll("h1, h2, h3"),
    (heading) => heading.textContent.replace(/\\s+/g, " ").trim(),
))
"""


class BrowserError(RuntimeError):
    """Chromium failed, crashed or stopped answering while a page was being rendered."""


@dataclass(frozen=True)
class RenderedPage:
    """What a page showed in Chromium: its errors, headings, height and full-page screenshot.

    ``console_errors`` holds, in the order they happened, ``console.error`` calls, uncaught
    exceptions and the browser's own error entries (a resource that failed to load), each naming
    what went wrong and where (the script's ``url:line:column`` or the resource's URL).
    """

    console_errors: list[str]
    headings: list[str]
    screenshot: Path
    height: int

    @property
    def non_blank(self) -> bool:
        """Whether the screenshot shows something: more than ``NON_BLANK_FRACTION`` of its
        pixels differ from its most common colour, the page's background."""
        with Image.open(self.screenshot) as image:
            rgb = image.convert("RGB")
        pixel_count = rgb.width * rgb.height
        background_count = max(rgb.getcolors(maxcolors=pixel_count))[0]
        return (pixel_count - background_count) / pixel_count > NON_BLANK_FRACTION


def find_chromium() -> str | None:
    """The Chromium binary to render pages with, or None when there is none.

    ``$HORIZON_CHROMIUM`` (a path or a name on PATH) overrides the search; pointing it at a file
    that does not exist, e.g. ``HORIZON_CHROMIUM=/nonexistent``, runs the tests as on a machine
    without a browser. Otherwise the first of ``CHROMIUM_NAMES`` found on PATH.
    """
    configured = os.environ.get("HORIZON_CHROMIUM")
    if configured:
        return shutil.which(configured)
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found is not None:
            return found
    return None


def render_page(
    path: str | os.PathLike[str],
    screenshot: str | os.PathLike[str],
    width: int = 1280,
    timeout: float = 60.0,
) -> RenderedPage:
    """Open the HTML file ``path`` in headless Chromium ``width`` CSS pixels wide, wait for its
    load event and report what rendered; the full-page screenshot is written to ``screenshot``
    as a PNG ``width`` pixels wide.

    ``timeout`` bounds the whole visit, the browser's start included: a slow CI machine starts
    Chromium in seconds, a hung one never answers. On a timeout or a crash it raises
    ``BrowserError`` naming what it was waiting for and quoting Chromium's stderr. The browser
    and its temporary profile are removed whatever happens.
    """
    binary = find_chromium()
    if binary is None:
        raise BrowserError(
            f"no Chromium found: set $HORIZON_CHROMIUM or install one of {CHROMIUM_NAMES}"
        )
    page_url = Path(path).resolve().as_uri()
    with tempfile.TemporaryDirectory(prefix="horizon-chromium-") as scratch:
        stderr_path = Path(scratch) / "stderr.log"
        with _launch(binary, Path(scratch) / "profile", stderr_path, timeout) as browser:
            return _visit(browser, page_url, Path(screenshot), width)


class _DevToolsPipe:
    """A running Chromium and the two pipes its DevTools Protocol speaks over.

    No read waits past ``timeout`` seconds after the start. Events (messages without an ``id``)
    are kept in ``events``, in arrival order, for the caller to read once the page has loaded.
    """

    def __init__(
        self,
        process: subprocess.Popen[bytes],
        to_browser: int,
        from_browser: int,
        stderr: Path,
        timeout: float,
    ) -> None:
        self.process = process
        self.to_browser = to_browser
        self.from_browser = from_browser
        self.stderr = stderr
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout
        self.events: list[dict[str, Any]] = []
        self._received = bytearray()
        self._answers: dict[int, dict[str, Any]] = {}
        self._last_id = 0

    def __enter__(self) -> _DevToolsPipe:
        return self

    def __exit__(self, *exc_info: object) -> None:
        """Kill the whole browser (its renderer and GPU processes share its process group) and
        reap it, so that the profile folder can be removed."""
        with contextlib.suppress(ProcessLookupError):  # every process has exited already
            os.killpg(self.process.pid, signal.SIGKILL)
        try:
            self.process.wait(timeout=REAP_TIMEOUT)
        finally:
            os.close(self.to_browser)
            os.close(self.from_browser)

    def call(
        self, method: str, params: dict[str, Any] | None = None, session: str | None = None
    ) -> dict[str, Any]:
        """Send one command (to the page's ``session`` when given) and return its result."""
        self._last_id += 1
        command_id = self._last_id
        message: dict[str, Any] = {"id": command_id, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        try:
            os.write(self.to_browser, json.dumps(message).encode() + b"\0")
        except BrokenPipeError:
            raise self.failure(
                f"Chromium {self.exit_status()} before it was sent {method}"
            ) from None
        while command_id not in self._answers:
            self._receive(f"the answer to {method}")
        answer = self._answers.pop(command_id)
        if "error" in answer:
            raise BrowserError(f"Chromium refused {method}: {answer['error'].get('message')}")
        return answer.get("result", {})

    def wait_for_event(self, method: str, session: str) -> None:
        """Read until the page's ``session`` sends the event ``method``."""
        checked = 0
        while True:
            for event in self.events[checked:]:
                if event.get("method") == method and event.get("sessionId") == session:
                    return
            checked = len(self.events)
            self._receive(f"the event {method}")

    def _receive(self, awaited: str) -> None:
        """Read at least one whole message, failing when the deadline passes or the browser
        exits or crashes first."""
        while b"\0" not in self._received:
            remaining = self.deadline - time.monotonic()
            readable, _, _ = select.select([self.from_browser], [], [], max(remaining, 0))
            if not readable:
                raise self.failure(f"timed out after {self.timeout:g} s waiting for {awaited}")
            chunk = os.read(self.from_browser, 1 << 20)
            if not chunk:
                raise self.failure(f"Chromium {self.exit_status()} before {awaited}")
            self._received += chunk
        *messages, self._received = self._received.split(b"\0")
        for raw in messages:
            message = json.loads(raw)
            if "id" in message:
                self._answers[message["id"]] = message
                continue
            if message.get("method") in ("Inspector.targetCrashed", "Target.targetCrashed"):
                raise self.failure(f"the page crashed in Chromium before {awaited}")
            self.events.append(message)

    def exit_status(self) -> str:
        """How the browser ended, once its pipe has closed: it may take a moment to exit."""
        try:
            return f"exited with status {self.process.wait(timeout=REAP_TIMEOUT)}"
        except subprocess.TimeoutExpired:
            return "closed its DevTools pipe"

    def failure(self, problem: str) -> BrowserError:
        """An error stating ``problem`` and quoting the tail of Chromium's stderr."""
        text = self.stderr.read_text(encoding="utf-8", errors="replace")
        lines = [line for line in text.splitlines() if "dbus" not in line.lower()]
        tail = "\n".join(lines[-STDERR_TAIL_LINES:]) or "(nothing but D-Bus noise)"
        return BrowserError(f"{problem}; Chromium's stderr ends:\n{tail}")


def _launch(binary: str, profile: Path, stderr_path: Path, timeout: float) -> _DevToolsPipe:
    """Start Chromium headless with a fresh profile, its DevTools Protocol on two pipes.

    ``subprocess``'s ``pass_fds`` keeps a descriptor at its own number, and Chromium wants
    exactly 3 and 4, so the pipes are handed over as the shell's stdin and stdout and renumbered
    by its redirections (``preexec_fn`` could renumber them too, but is unsafe with threads).
    The browser gets a process group of its own, which the clean-up kills as a whole.
    """
    flags = [
        "--headless",
        "--disable-gpu",
        f"--user-data-dir={profile}",
        "--remote-debugging-pipe",
        "--no-first-run",
        "--disable-background-networking",  # the page is a file: no update or metrics checks
        "--hide-scrollbars",  # a scrollbar would narrow the layout and show in the screenshot
    ]
    if os.geteuid() == 0:
        flags.append("--no-sandbox")  # Chromium refuses to run as root with its sandbox
    renumbering_shell = ["/bin/sh", "-c", 'exec "$@" 3<&0 4>&1 0</dev/null 1>/dev/null', "sh"]
    commands_read, commands_write = os.pipe()
    answers_read, answers_write = os.pipe()
    try:
        with stderr_path.open("wb") as stderr:
            process = subprocess.Popen(
                [*renumbering_shell, binary, *flags, "about:blank"],
                stdin=commands_read,
                stdout=answers_write,
                stderr=stderr,
                start_new_session=True,
            )
    except BaseException:
        for descriptor in (commands_write, answers_read):
            os.close(descriptor)
        raise
    finally:
        os.close(commands_read)
        os.close(answers_write)
    return _DevToolsPipe(process, commands_write, answers_read, stderr_path, timeout)


def _visit(browser: _DevToolsPipe, page_url: str, screenshot: Path, width: int) -> RenderedPage:
    """Open ``page_url`` in a new tab of ``browser`` and collect what it rendered."""
    target = browser.call("Target.createTarget", {"url": "about:blank"})["targetId"]
    session = browser.call("Target.attachToTarget", {"targetId": target, "flatten": True})[
        "sessionId"
    ]
    for domain in ("Runtime", "Log", "Page"):
        browser.call(f"{domain}.enable", session=session)
    browser.call(
        "Emulation.setDeviceMetricsOverride",
        {"width": width, "height": VIEWPORT_HEIGHT, "deviceScaleFactor": 1, "mobile": False},
        session,
    )
    navigation = browser.call("Page.navigate", {"url": page_url}, session)
    if "errorText" in navigation:
        raise BrowserError(f"Chromium could not open {page_url}: {navigation['errorText']}")
    browser.wait_for_event("Page.loadEventFired", session)
    headings = browser.call(
        "Runtime.evaluate",
        {"expression": HEADINGS_SCRIPT, "awaitPromise": True, "returnByValue": True},
        session,
    )["result"]["value"]
    content = browser.call("Page.getLayoutMetrics", session=session)["cssContentSize"]
    height = max(1, round(content["height"]))
    captured = browser.call(
        "Page.captureScreenshot",
        {
            "format": "png",
            "captureBeyondViewport": True,
            "clip": {"x": 0, "y": 0, "width": width, "height": height, "scale": 1},
        },
        session,
    )
    screenshot.write_bytes(base64.b64decode(captured["data"]))
    errors = [
        error
        for event in browser.events
        if event.get("sessionId") == session
        and (error := _error_text(event["method"], event["params"])) is not None
    ]
    return RenderedPage(
        console_errors=errors, headings=headings, screenshot=screenshot, height=height
    )


def _error_text(method: str, params: dict[str, Any]) -> str | None:
    """The line ``console_errors`` holds for one DevTools event, or None when it is no error."""
    if method == "Runtime.consoleAPICalled" and params["type"] == "error":
        words = [_console_word(argument) for argument in params["args"]]
        frames = params.get("stackTrace", {}).get("callFrames", [])
        where = f" at {_location(frames[0])}" if frames else ""
        return f"console.error: {' '.join(words)}{where}"
    if method == "Runtime.exceptionThrown":
        details = params["exceptionDetails"]
        exception = details.get("exception", {})
        thrown = exception.get("description") or _console_word(exception) or details["text"]
        summary = thrown.partition("\n")[0]  # an Error's description goes on with its stack
        return f"uncaught exception: {summary} at {_location(details)}"
    if method == "Log.entryAdded" and params["entry"]["level"] == "error":
        entry = params["entry"]
        where = f" at {entry['url']}" if entry.get("url") else ""
        return f"{entry['source']} error: {entry['text']}{where}"
    return None


def _console_word(argument: dict[str, Any]) -> str:
    """A DevTools remote object as the console shows it: a string as itself, a number, boolean
    or null as JSON, NaN or a BigInt as written, an object or an error by its description,
    undefined as its type."""
    if "value" in argument:
        value = argument["value"]
        return value if isinstance(value, str) else json.dumps(value)
    for key in ("unserializableValue", "description", "type"):
        if key in argument:
            return str(argument[key])
    return ""


def _location(place: dict[str, Any]) -> str:
    """``url:line:column``, counted from 1, of a DevTools call frame or exception."""
    return f"{place.get('url') or '(inline)'}:{place['lineNumber'] + 1}:{place['columnNumber'] + 1}"
