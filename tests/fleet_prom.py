"""A stand-in Prometheus query API for the fleet unit tests: replays answers recorded from a real Prometheus
(tests/data/fleet/*.json, recorded by tests/engine/test_fleet_vllm.py's recorder) or answers every call with
one fixed status and body (the failure tests).

Replay matches a call by its path and its query (``query`` or ``match[]``); the recorded points are shifted
by the difference between the call's time (``end`` or ``time``) and the recorded one, so a capture run now
sees the recorded fleet as if it had just happened.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from aiohttp import web

DATA = Path(__file__).parent / "data" / "fleet"


RECORDING = "two_vllm_one_loaded.json.gz"

# series diagnose asks for that were added after the recording was made (a real Prometheus would answer them;
# the recording has none): a query matches its recorded one with these left out of its name pattern
ADDED_SINCE_RECORDING = tuple(f"{name}_{part}" for name in ("vllm:request_prompt_tokens",
                                                          "vllm:request_generation_tokens")
                              for part in ("bucket", "sum", "count"))


def _as_recorded(query: str) -> str:
    """The query without the series added since the recording (``ADDED_SINCE_RECORDING``)."""
    for name in ADDED_SINCE_RECORDING:
        query = query.replace(f"|{name}|", "|")
    return query


def load_recording(name: str = RECORDING) -> dict[str, Any]:
    return dict(json.loads(gzip.decompress((DATA / name).read_bytes())))


def _shift(data: Any, delta: float) -> Any:
    if not isinstance(data, dict) or not isinstance(data.get("result"), list):
        return data
    out = []
    for r in data["result"]:
        r = dict(r)
        if "values" in r:
            r["values"] = [[float(t) + delta, v] for t, v in r["values"]]
        if "value" in r:
            r["value"] = [float(r["value"][0]) + delta, r["value"][1]]
        out.append(r)
    return {**data, "result": out}


class FakePrometheus:
    def __init__(self, recording: dict[str, Any] | None = None, *, status: int = 200, body: Any = None,
                 raw: bytes | None = None) -> None:
        self.calls: dict[tuple[str, str], dict[str, Any]] = {}
        for c in (recording or {}).get("calls", []):
            self.calls[(c["path"], c["query"])] = c
        self.status, self.body, self.raw = status, body, raw
        self.seen: list[tuple[str, str]] = []
        self.unmatched: list[tuple[str, str]] = []

    async def handle(self, request: web.Request) -> web.Response:
        q = request.query.get("query") or request.query.get("match[]") or ""
        self.seen.append((request.path, q))
        if request.path == "/api/v1/query" and q == "1" and self.status == 200 and self.raw is None:
            # the reachability check attach makes before it writes anything
            return web.json_response({"status": "success", "data": {"resultType": "scalar", "result": [0, "1"]}})
        if self.raw is not None:
            return web.Response(status=self.status, body=self.raw, content_type="text/plain")
        if self.body is not None or not self.calls:
            return web.json_response(self.body or {"status": "success", "data": []}, status=self.status)
        rec = self.calls.get((request.path, q)) or self.calls.get((request.path, _as_recorded(q)))
        if rec is None:
            self.unmatched.append((request.path, q))
            return web.json_response({"status": "success", "data": (
                [] if "/label/" in request.path else {"resultType": "matrix" if "range" in request.path else "vector",
                                                      "result": []})})
        at = float(request.query.get("end") or request.query.get("time") or rec.get("at") or 0.0)
        delta = at - float(rec.get("at") or at)
        return web.json_response({"status": "success", "data": _shift(rec["response"], delta)})


@contextmanager
def serve(fake: FakePrometheus) -> Iterator[str]:
    """Run ``fake`` on a free loopback port in a thread; yields its URL."""
    loop = asyncio.new_event_loop()
    app = web.Application()
    app.router.add_route("GET", "/{tail:.*}", fake.handle)
    # a handler still running at the end (the "slow" Prometheus sleeps 60 s) is cancelled after 1 s, not
    # waited for aiohttp's default 60 s: one hardening test took 60 s for that alone
    runner = web.AppRunner(app, shutdown_timeout=1.0)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    t = threading.Thread(target=loop.run_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        t.join(timeout=5)
        loop.run_until_complete(runner.cleanup())
        loop.close()


def recorded_bundle(out: Path, recording: dict[str, Any] | None = None) -> Path:
    """The fleet bundle a capture writes from a recording, over the recorded window (no time shift)."""
    from diagnose.fleet.capture import FleetWindow, capture_fleet
    from diagnose.io.writer import BundleWriter
    from diagnose.probes.prometheus_api import PrometheusAPI

    rec = recording or load_recording()
    end = max(float(c.get("at") or 0) for c in rec["calls"])
    win = FleetWindow(end - float(rec["since_s"]), end)

    async def run(url: str) -> None:
        async with PrometheusAPI(url) as api:
            bw = BundleWriter(out, overwrite=True, target={"url": url, "kind": "fleet"}, workload={"mode": "observe"})
            st = await capture_fleet(api, rec["selector"], win, bw)
            bw.set_probe_status(st)
            bw.finish()
            bw.update("capture", {"ended_unix_ns": int(end * 1e9)})

    with serve(FakePrometheus(rec)) as url:
        asyncio.run(run(url))
    return out
