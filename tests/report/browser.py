"""Drive Debian's headless ``chromium`` over the DevTools protocol on a pipe (no extra package).

``--remote-debugging-pipe`` makes chromium read protocol commands from fd 3 and write replies and
events to fd 4, one JSON message per NUL-terminated chunk. That is enough to load a page, collect
every console message, uncaught exception and network request, run a line of JavaScript and take
a screenshot, all with the system browser and the standard library.

Also runnable, to refresh the README's screenshot:

    python -m tests.report.browser report.html docs/report.png [--width 1400 --height 1000]
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

__all__ = ["Browser", "BrowserError", "find_chromium", "png_pixels"]

_CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


class BrowserError(RuntimeError):
    """The browser did not answer in time, or answered with an error."""


def find_chromium() -> str | None:
    """The chromium executable (``KVPOLICY_CHROMIUM`` first), or None."""
    explicit = os.environ.get("KVPOLICY_CHROMIUM")
    if explicit:
        return explicit if Path(explicit).exists() else None
    for name in _CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    return None


class Browser:
    """One headless chromium with one page, driven over a pipe. Use as a context manager."""

    def __init__(self, executable: str, *, width: int = 1400, height: int = 1000, timeout_s: float = 60.0) -> None:
        self.timeout_s = timeout_s
        self.width, self.height = width, height
        self.console: list[dict[str, Any]] = []
        self.exceptions: list[str] = []
        self.log_entries: list[dict[str, Any]] = []
        self.requests: list[str] = []
        self._profile = tempfile.TemporaryDirectory(prefix="kvpolicy-chromium-")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        args = [
            executable, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--no-default-browser-check",
            "--disable-extensions", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--disable-dev-shm-usage", "--hide-scrollbars", "--mute-audio", "--remote-debugging-pipe",
            f"--user-data-dir={self._profile.name}", f"--window-size={width},{height}", "about:blank",
        ]

        def wire() -> None:
            # chromium reads commands on fd 3 and writes to fd 4; copy both above 10 first so that
            # placing one cannot overwrite the other.
            high_r = fcntl.fcntl(to_browser_r, fcntl.F_DUPFD, 10)
            high_w = fcntl.fcntl(from_browser_w, fcntl.F_DUPFD, 10)
            os.dup2(high_r, 3)
            os.dup2(high_w, 4)

        self._process = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            pass_fds=(3, 4), preexec_fn=wire,
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer = b""
        self._next_id = 0
        self._events: list[dict[str, Any]] = []
        self._session: str | None = None
        try:
            targets = self.send("Target.getTargets")["targetInfos"]
            page = next((t for t in targets if t["type"] == "page"), None)
            target = page["targetId"] if page else self.send("Target.createTarget", url="about:blank")["targetId"]
            self._session = self.send("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
            for domain in ("Page", "Runtime", "Log", "Network"):
                self.send(f"{domain}.enable")
            self.send("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)
        except BaseException:
            self.close()  # never leave a browser running behind a failed start
            raise

    # -- protocol --------------------------------------------------------------------------------

    def _read_message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrowserError("chromium did not answer in time")
            ready, _, _ = select.select([self._from_browser], [], [], left)
            if not ready:
                continue
            chunk = os.read(self._from_browser, 1 << 20)
            if not chunk:
                err = self._process.stderr.read().decode(errors="replace")[-2000:] if self._process.stderr else ""
                raise BrowserError(f"chromium closed the pipe (exit {self._process.poll()}): {err}")
            self._buffer += chunk
        raw, _, self._buffer = self._buffer.partition(b"\0")
        message = json.loads(raw)
        self._record(message)
        return message

    def _record(self, message: dict[str, Any]) -> None:
        method = message.get("method")
        params = message.get("params", {})
        if method == "Runtime.consoleAPICalled":
            text = " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", []))
            self.console.append({"type": params.get("type"), "text": text})
        elif method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            self.exceptions.append(details.get("exception", {}).get("description") or details.get("text", "exception"))
        elif method == "Log.entryAdded":
            entry = params.get("entry", {})
            self.log_entries.append({"level": entry.get("level"), "text": entry.get("text"), "url": entry.get("url")})
        elif method == "Network.requestWillBeSent":
            self.requests.append(params.get("request", {}).get("url", ""))
        if method:
            self._events.append(message)

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        """Send one command and wait for its result (events met meanwhile are recorded)."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if self._session is not None and not method.startswith(("Target.", "Browser.")):
            message["sessionId"] = self._session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + self.timeout_s
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def wait_for(self, method: str, timeout_s: float | None = None) -> dict[str, Any]:
        """Wait for an event (one already received counts)."""
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        while True:
            for index, event in enumerate(self._events):
                if event.get("method") == method:
                    return self._events.pop(index)
            self._read_message(deadline)

    # -- page ------------------------------------------------------------------------------------

    def open(self, path: str | Path) -> None:
        """Load a local file and wait for its load event."""
        self._events.clear()
        self.send("Page.navigate", url=Path(path).resolve().as_uri())
        self.wait_for("Page.loadEventFired")

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (exceptions raise BrowserError)."""
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression!r} threw: {result['exceptionDetails']}")
        return result["result"].get("value")

    def screenshot(self, path: str | Path, *, full_page: bool = False) -> bytes:
        """A PNG of the viewport (or the whole page), written to ``path``; returns its bytes."""
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            size = self.send("Page.getLayoutMetrics")["cssContentSize"]
            params["clip"] = {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}
            params["captureBeyondViewport"] = True
        data = base64.b64decode(self.send("Page.captureScreenshot", **params)["data"])
        Path(path).write_bytes(data)
        return data

    def errors(self) -> list[str]:
        """Console errors, uncaught exceptions and error log entries seen so far."""
        found = [f"console.{m['type']}: {m['text']}" for m in self.console if m["type"] in ("error", "assert")]
        found += [f"exception: {text}" for text in self.exceptions]
        found += [f"log: {e['text']} ({e['url']})" for e in self.log_entries if e["level"] == "error"]
        return found

    def close(self) -> None:
        """Close the browser (killed if it does not exit within five seconds)."""
        self.timeout_s = min(self.timeout_s, 5.0)
        try:
            self.send("Browser.close")
        except (BrowserError, OSError, ValueError):
            pass
        try:
            self._process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait(timeout=5)
        for fd in (self._to_browser, self._from_browser):
            try:
                os.close(fd)
            except OSError:
                pass
        if self._process.stderr:
            self._process.stderr.close()
        self._profile.cleanup()

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def png_pixels(data: bytes) -> tuple[int, int, list[bytes]]:
    """Decode an 8-bit RGB/RGBA PNG (what chromium writes): width, height, rows of pixel bytes."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    offset, idat, header = 8, b"", None
    while offset < len(data):
        length, kind = struct.unpack(">I4s", data[offset:offset + 8])
        chunk = data[offset + 8:offset + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", chunk)
        elif kind == b"IDAT":
            idat += chunk
        offset += 12 + length
    if header is None:
        raise ValueError("PNG without IHDR")
    width, height, depth, colour, _, _, interlace = header
    if depth != 8 or colour not in (2, 6) or interlace:
        raise ValueError(f"unsupported PNG (depth {depth}, colour type {colour}, interlace {interlace})")
    channels = 3 if colour == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * channels
    rows: list[bytes] = []
    previous = bytearray(stride)
    for y in range(height):
        kind = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for x in range(stride):
            left = line[x - channels] if x >= channels else 0
            up = previous[x]
            corner = previous[x - channels] if x >= channels else 0
            if kind == 1:
                line[x] = (line[x] + left) & 0xFF
            elif kind == 2:
                line[x] = (line[x] + up) & 0xFF
            elif kind == 3:
                line[x] = (line[x] + ((left + up) >> 1)) & 0xFF
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                line[x] = (line[x] + (left if pa <= pb and pa <= pc else up if pb <= pc else corner)) & 0xFF
        rows.append(bytes(line) if channels == 3 else bytes(b for i, b in enumerate(line) if i % 4 != 3))
        previous = line
    return width, height, rows


def main(argv: list[str]) -> int:
    """``python -m tests.report.browser PAGE.html OUT.png [--width W --height H]``."""
    import argparse

    parser = argparse.ArgumentParser(description="Screenshot an HTML file with headless chromium.")
    parser.add_argument("page")
    parser.add_argument("png")
    parser.add_argument("--width", type=int, default=1400)
    parser.add_argument("--height", type=int, default=1000)
    parser.add_argument("--scroll-to", help="CSS selector to scroll into view first")
    args = parser.parse_args(argv)
    executable = find_chromium()
    if executable is None:
        print("no chromium found (apt-get install chromium)", file=sys.stderr)
        return 2
    with Browser(executable, width=args.width, height=args.height) as browser:
        browser.open(args.page)
        if args.scroll_to:
            browser.evaluate(f"document.querySelector({json.dumps(args.scroll_to)}).scrollIntoView()")
        browser.screenshot(args.png)
        for error in browser.errors():
            print(error, file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
