"""A small headless-Chromium driver over the DevTools protocol (CDP), for tests that look at a report as a
person does: console errors, what lies in the first screen, a screenshot.

Chromium is Debian's `chromium` package (harness/ensure_chromium.sh installs it; .ci/run calls that). The
browser listens on a port it picks itself (--remote-debugging-port=0, read back from DevToolsActivePort);
aiohttp (a dependency of diagnose) carries the websocket.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

VIEWPORT = (1280, 800)


def chromium_path() -> str | None:
    """$DIAGNOSE_CHROMIUM, else the first of chromium / chromium-browser / google-chrome on PATH."""
    env = os.environ.get("DIAGNOSE_CHROMIUM")
    if env:
        return env if Path(env).exists() else None
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        p = shutil.which(name)
        if p:
            return p
    return None


class CdpError(RuntimeError):
    pass


class Browser:
    """One headless Chromium with one page; every call is synchronous (it runs a private event loop)."""

    def __init__(self, executable: str, viewport: tuple[int, int] = VIEWPORT, timeout_s: float = 60.0) -> None:
        self.viewport = viewport
        self.timeout_s = timeout_s
        self._profile = tempfile.mkdtemp(prefix="diagnose-chromium-")
        self._log = open(Path(self._profile) / "chromium.log", "wb")  # noqa: SIM115 - closed in close()
        w, h = viewport
        self._proc = subprocess.Popen(
            [executable, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--no-first-run", "--no-default-browser-check", "--disable-extensions", "--disable-sync",
             "--disable-background-networking", "--mute-audio", "--hide-scrollbars",
             f"--window-size={w},{h}", "--remote-debugging-port=0", "--remote-allow-origins=*",
             f"--user-data-dir={self._profile}", "about:blank"],
            stdout=self._log, stderr=subprocess.STDOUT)
        self._loop = asyncio.new_event_loop()
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.events: list[dict[str, Any]] = []
        try:
            self._run(self._connect())
            self.send("Page.enable")
            self.send("Runtime.enable")
            self.send("Log.enable")
            self.send("Emulation.setDeviceMetricsOverride", width=w, height=h, deviceScaleFactor=1, mobile=False)
        except BaseException:
            self.close()
            raise

    # -- plumbing -------------------------------------------------------------------------------------
    def _run(self, coro: Any) -> Any:
        return self._loop.run_until_complete(asyncio.wait_for(coro, self.timeout_s))

    def _port(self) -> int:
        f = Path(self._profile) / "DevToolsActivePort"
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise CdpError(f"chromium exited with status {self._proc.returncode}: {self.log_tail()}")
            with contextlib.suppress(OSError, ValueError, IndexError):
                return int(f.read_text().splitlines()[0])
            time.sleep(0.05)
        raise CdpError(f"chromium did not open its DevTools port within {self.timeout_s:.0f} s: {self.log_tail()}")

    async def _connect(self) -> None:
        port = self._port()
        self._session = aiohttp.ClientSession()
        async with self._session.get(f"http://127.0.0.1:{port}/json/list") as r:
            targets = await r.json()
        pages = [t for t in targets if t.get("type") == "page"]
        if not pages:
            raise CdpError(f"chromium has no page target: {targets}")
        self._ws = await self._session.ws_connect(pages[0]["webSocketDebuggerUrl"], max_msg_size=0)
        self._reader = self._loop.create_task(self._read())

    async def _read(self) -> None:
        async for msg in self._ws:
            if msg.type != aiohttp.WSMsgType.TEXT:
                continue
            data = json.loads(msg.data)
            fut = self._pending.pop(data["id"], None) if "id" in data else None
            if fut is not None and not fut.done():
                fut.set_result(data)
            elif "method" in data:
                self.events.append(data)
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(CdpError(f"DevTools connection closed: {self.log_tail()}"))

    async def _send(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        i = next(self._ids)
        fut: asyncio.Future[dict[str, Any]] = self._loop.create_future()
        self._pending[i] = fut
        await self._ws.send_str(json.dumps({"id": i, "method": method, "params": params}))
        data = await fut
        if "error" in data:
            raise CdpError(f"{method}: {data['error']}")
        result = data.get("result", {})
        assert isinstance(result, dict)
        return result

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        out: dict[str, Any] = self._run(self._send(method, params))
        return out

    async def _wait_event(self, method: str, start: int) -> None:
        while not any(e["method"] == method for e in self.events[start:]):
            await asyncio.sleep(0.02)

    def log_tail(self, n: int = 1500) -> str:
        try:
            return (Path(self._profile) / "chromium.log").read_bytes()[-n:].decode("utf-8", "replace")
        except OSError:
            return ""

    # -- what tests use -------------------------------------------------------------------------------
    def open(self, path: Path, settle_s: float = 0.3) -> None:
        """Navigate to a local file and wait for its load event (and ``settle_s`` for late console output)."""
        self.events.clear()
        start = len(self.events)
        res = self.send("Page.navigate", url=path.resolve().as_uri())
        if res.get("errorText"):
            raise CdpError(f"cannot open {path}: {res['errorText']}")
        self._run(self._wait_event("Page.loadEventFired", start))
        self._run(asyncio.sleep(settle_s))

    def console_errors(self) -> list[str]:
        """Console errors, uncaught exceptions and browser log errors (CSP, failed loads) since open()."""
        out: list[str] = []
        for e in self.events:
            p = e.get("params", {})
            if e["method"] == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                out.append("console." + p["type"] + ": " + " ".join(
                    str(a.get("value", a.get("description", ""))) for a in p.get("args", [])))
            elif e["method"] == "Runtime.exceptionThrown":
                d = p.get("exceptionDetails", {})
                out.append("uncaught: " + str((d.get("exception") or {}).get("description") or d.get("text")))
            elif e["method"] == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                ent = p["entry"]
                out.append(f"log ({ent.get('source')}): {ent.get('text')} {ent.get('url', '')}".rstrip())
        return out

    def evaluate(self, expression: str) -> Any:
        res = self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in res:
            raise CdpError(f"evaluate failed: {res['exceptionDetails']}")
        return res.get("result", {}).get("value")

    def screenshot(self, out: Path) -> Path:
        """The first screen (the viewport, not the full page) as PNG."""
        res = self.send("Page.captureScreenshot", format="png", captureBeyondViewport=False)
        out.write_bytes(base64.b64decode(res["data"]))
        return out

    def close(self) -> None:
        with contextlib.suppress(Exception):
            if getattr(self, "_ws", None) is not None:
                self._run(self._ws.close())
        with contextlib.suppress(Exception):
            if getattr(self, "_session", None) is not None:
                self._run(self._session.close())
        with contextlib.suppress(Exception):
            reader = getattr(self, "_reader", None)
            if reader is not None:
                reader.cancel()
                self._loop.run_until_complete(asyncio.gather(reader, return_exceptions=True))
        self._loop.close()
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=10)
        self._log.close()
        shutil.rmtree(self._profile, ignore_errors=True)
