"""llama.cpp's ``/slots``: what each of the server's fixed slots (``-np``) holds, sampled through the capture.

llama-server runs a fixed number of slots, each with its own share of the context (``-c`` split between
them). Its Prometheus metrics say how many requests are processing and deferred, not how full each slot's
context is; ``GET /slots`` does (``n_ctx``, ``is_processing``, ``n_prompt_tokens``, ``next_token[].n_decoded``).
The probe samples it at the metrics interval while the server is llama.cpp (any other engine: left out of
the capture, ``applies``) and writes one ``slots`` record per sample::

    {"t_ns": ..., "ms": 0.4, "interval_s": 0.5,
     "slots": [{"id": 0, "n_ctx": 2048, "busy": true, "tokens": 168, "decoded": 40}, ...]}

``tokens`` is what the slot's context holds: ``n_past`` where a build reports it, else ``n_prompt_tokens``,
which in current builds (llama.cpp's ``server_slot::to_json``: ``prompt.tokens.size()``) counts the prompt and
every token generated so far. An idle slot keeps its last request's numbers (``busy`` false).

Only those numbers are kept: older builds put the prompt and the generated text in ``/slots``, and nothing
of them reaches the bundle. A server started with ``--no-slots`` answers 501: the probe is unavailable and
says so. Its cost is the server's time for each exchange (``cost``, diagnose/capture/overhead.py); under a budget
the interval grows as the Prometheus probe's does.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import statistics
import time
from typing import Any, TypedDict

import aiohttp
import orjson

from diagnose.capture.overhead import (
    PING_PATH,
    budget_of,
    cost,
    is_local,
    network_basis,
    round_trip_ms,
    server_ms,
)
from diagnose.capture.workload import parse_duration
from diagnose.model import ProbeStatus
from diagnose.probes.base import CaptureContext, Options, ProbeOption, ProbeSetup, ProbeSpec, wait_tick

NAME = "slots"
MAX_BYTES = 4 << 20  # a /slots answer of 4 MiB is far past any real slot count
COST_MIN = 3  # samples before the budget reads their cost


def _int(v: Any) -> int | None:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0 else None


class SlotRow(TypedDict):
    """One slot of a ``/slots`` answer, numbers only (a record of the ``slots`` stream holds a list of them)."""

    id: int | None
    n_ctx: int | None
    busy: bool
    tokens: int | None  # held in its KV cache: n_past, else the prompt's tokens
    decoded: int | None


def slot_rows(doc: Any) -> list[SlotRow] | None:
    """The numbers of each slot of a ``/slots`` answer (None when it is not a list of slots)."""
    if not isinstance(doc, list):
        return None
    out: list[SlotRow] = []
    for s in doc:
        if not isinstance(s, dict):
            return None
        nxt = s.get("next_token")
        first = nxt[0] if isinstance(nxt, list) and nxt and isinstance(nxt[0], dict) else (
            nxt if isinstance(nxt, dict) else {})
        held = _int(s.get("n_past"))
        out.append({"id": _int(s.get("id")), "n_ctx": _int(s.get("n_ctx")), "busy": bool(s.get("is_processing")),
                    "tokens": held if held is not None else _int(s.get("n_prompt_tokens")),
                    "decoded": _int(first.get("n_decoded"))})
    return out


async def read_to_end(content: aiohttp.StreamReader, limit: int) -> bytes:
    """An aiohttp answer's body read to its end, or its first ``limit`` bytes: ``read(n)`` gives only what has
    arrived so far (an answer in several pieces came back cut). Used here and by ``diagnose readiness``."""
    body = bytearray()
    while len(body) < limit and (part := await content.read(limit - len(body))):
        body += part
    return bytes(body)


class SlotsProbe:
    """Samples ``<target>/slots`` every ``interval_s`` seconds (llama.cpp only)."""

    name = NAME

    def __init__(self, interval_s: float = 1.0, timeout_s: float | None = None) -> None:
        self.interval_s = float(interval_s)
        self.timeout_s = float(timeout_s) if timeout_s else max(2.0, 2.0 * self.interval_s)
        self.rtt_ms: float | None = None  # the network's round trip to the server (diagnose/capture/overhead.py)

    def applies(self, ctx: CaptureContext) -> bool:
        """Only llama.cpp serves /slots: on any other engine the capture leaves this probe out."""
        return ctx.target.engine == "llamacpp"

    def available(self, ctx: CaptureContext) -> tuple[bool, str]:
        if not (self.interval_s > 0 and math.isfinite(self.interval_s)):
            return False, f"sampling interval must be a positive number of seconds, got {self.interval_s}"
        return True, ""

    async def _sample(self, session: aiohttp.ClientSession, url: str, headers: dict[str, str], shown: str
                      ) -> tuple[bytes | None, float, str]:
        """(the answer or None, the exchange's ms, why not); ``shown``: the URL as messages may name it."""
        t0 = time.monotonic_ns()
        try:
            async with session.get(url, headers=headers, timeout=aiohttp.ClientTimeout(total=self.timeout_s)) as r:
                th = time.monotonic_ns()
                if r.status != 200:
                    return None, (time.monotonic_ns() - t0) / 1e6, f"GET {shown} answered HTTP {r.status}"
                raw = await read_to_end(r.content, MAX_BYTES + 1)  # one byte past the limit: too long
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            return None, (time.monotonic_ns() - t0) / 1e6, f"GET {shown}: {type(e).__name__} ({getattr(e, 'os_error', None) or 'no answer'})"
        ms = server_ms(t0, th, time.monotonic_ns(), self.rtt_ms)  # the network's round trip left out
        if len(raw) > MAX_BYTES:
            return None, ms, f"GET {shown}: answer over {MAX_BYTES} bytes"
        return raw, ms, ""

    async def run(self, ctx: CaptureContext) -> ProbeStatus:
        url, shown = ctx.target.endpoint("/slots"), ctx.target.safe_url + "/slots"
        budget = budget_of(ctx.shared, ctx.options)
        writer = None
        ok = failed = 0
        last_error = ""
        exchange_ms: list[float] = []
        intervals: list[float] = []
        n_slots = 0
        own_s, t_start = 0.0, time.monotonic()
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as session:
            self.rtt_ms = await round_trip_ms(session, ctx.target.endpoint(PING_PATH), ctx.target.headers(),
                                              self.timeout_s)
            next_t = time.monotonic()
            interval = self.interval_s
            while True:
                raw, ms, why = await self._sample(session, url, ctx.target.headers(), shown)
                c0 = time.thread_time()
                rows = None
                if raw is not None:
                    with contextlib.suppress(orjson.JSONDecodeError):
                        rows = slot_rows(orjson.loads(raw))
                    why = "" if rows is not None else f"GET {shown}: not a list of slots"
                if rows is None:
                    failed += 1
                    last_error = why
                    if ok == 0 and ("HTTP 4" in why or "HTTP 501" in why):  # --no-slots: 501
                        return ProbeStatus(self.name, "unavailable", f"no /slots on this server: {why}")
                else:
                    ok += 1
                    exchange_ms.append(ms)
                    n_slots = max(n_slots, len(rows))
                    if writer is None:
                        writer = ctx.bundle.stream(NAME, "llama.cpp /slots samples (numbers only, no text)")
                    writer.write({"t_ns": time.monotonic_ns(), "ms": round(ms, 3), "interval_s": interval,
                                  "slots": rows})
                own_s += time.thread_time() - c0
                if ctx.stop.is_set():
                    break
                if budget is not None and len(exchange_ms) >= COST_MIN:
                    budget.want(self.name, statistics.median(exchange_ms[-9:]) / 1e3 / self.interval_s)
                    interval = self.interval_s / budget.factor(self.name)
                intervals.append(interval)
                next_t = await wait_tick(ctx.stop, next_t, interval)
        window_s = time.monotonic() - t_start
        coarse = [i for i in intervals if i > self.interval_s * 1.001]
        adapted = (f"the overhead budget made the /slots interval {statistics.median(coarse):.2g} s in {len(coarse)} "
                   f"of {len(intervals)} ticks (asked {self.interval_s:g} s)") if coarse else None
        detail: dict[str, Any] = {
            "samples": ok, "failed": failed, "slots": n_slots,
            "exchange_ms_p50": round(statistics.median(exchange_ms), 3) if exchange_ms else None,
            "round_trip_ms": None if self.rtt_ms is None else round(self.rtt_ms, 3),
            "cost": cost(sum(exchange_ms), own_s, window_s, is_local(ctx.target.url),
                         network_basis(self.rtt_ms, "/slots", "server: the /slots exchanges (whole request)")
                         + "; own: decoding and writing the samples",
                         adapted=adapted, interval_asked_s=self.interval_s),
        }
        if ok == 0:
            return ProbeStatus(self.name, "failed", f"no /slots sample succeeded: {last_error}", detail=detail)
        reason = f"{ok} samples of {n_slots} slots" + (f", {failed} failed ({last_error})" if failed else "")
        if adapted:
            reason += f"; {adapted}"
        return ProbeStatus(self.name, "ok", reason, detail=detail)


def _build(o: Options, setup: ProbeSetup) -> SlotsProbe:
    return SlotsProbe(interval_s=parse_duration(o["metrics_interval"]))


SPEC = ProbeSpec(
    name=NAME, title="llama.cpp slots (/slots)",
    enabled=lambda o: bool(o["slots"]) and not o["no_metrics"], build=_build,
    options=(
        ProbeOption("--slots/--no-slots", flag=True, default=True, show_default=True,
                    help="Sample llama.cpp's /slots (each slot's context use) at the metrics interval; other "
                         "engines: not run."),
    ),
)
