"""Prometheus probe: scrape the server's /metrics at a fixed interval during the capture.

Each scrape is parsed with prometheus_client's text-format parser (in a worker thread, so the load
generator's event loop is not blocked) and written as one ``metrics`` record
``{t_ns, scrape_ms, parse_ms, bytes, samples: [[name, {labels}, value], ...]}``; ``t_ns`` is the midpoint of
the HTTP exchange, ``scrape_ms`` its duration (the cost the server sees). Each metric family's type and help
are written once to ``metric_families`` as ``{name, type, help}``.

Bundle size: only engine-relevant families are kept (``diagnose.engines.is_engine_relevant``: the engine
namespaces ``vllm:``, ``sglang:``, ``tgi_``, ``llamacpp:``, ``trtllm_``, ``nv_``, ``dynamo_`` plus
``process_cpu_seconds_total``, ``process_resident_memory_bytes``, ``process_start_time_seconds``), never
``*_created`` samples. The filter runs on the raw text before parsing, which also makes parsing cheaper.
``keep_all=True`` keeps everything.

Failure handling: connection refused, an HTTP error or a body that is not Prometheus text on the *first*
scrape means the probe is ``unavailable`` (the capture goes on without server metrics). Later failures are
counted by category; the probe ends ``ok`` (with the counts in ``detail``) or ``failed`` when no scrape
succeeded at all. After ``ctx.stop`` is set one last scrape is taken so counters cover the whole window.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from diagnose.probes.base import CaptureContext
from prometheus_client.parser import text_string_to_metric_families

from diagnose.engines import is_engine_relevant
from diagnose.model import ProbeStatus


class ScrapeError(Exception):
    """One scrape failed; ``category`` is one of refused, connect, timeout, http_<status>, not_prometheus."""

    def __init__(self, category: str, message: str) -> None:
        super().__init__(message)
        self.category = category


def prefilter(text: str) -> str:
    """Keep only the lines (samples and their # HELP / # TYPE) of engine-relevant metrics."""
    out: list[str] = []
    for line in text.splitlines():
        if not line:
            continue
        if line[0] == "#":
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE") and not is_engine_relevant(parts[2]):
                continue
        else:
            brace = line.find("{")
            name = line[:brace] if brace >= 0 else line.split(" ", 1)[0]
            if not is_engine_relevant(name):
                continue
        out.append(line)
    out.append("")
    return "\n".join(out)


def parse_scrape(text: str, keep_all: bool = False) -> tuple[list[list[Any]], list[dict[str, str]]]:
    """Prometheus text -> (samples as [name, labels, value], families as {name, type, help}).

    Raises ScrapeError("not_prometheus") when the text does not parse."""
    body = text if keep_all else prefilter(text)
    samples: list[list[Any]] = []
    families: list[dict[str, str]] = []
    try:
        for fam in text_string_to_metric_families(body):
            families.append({"name": fam.name, "type": fam.type, "help": fam.documentation})
            for s in fam.samples:
                if s.name.endswith("_created") and not keep_all:
                    continue
                v = float(s.value)
                samples.append([s.name, dict(s.labels), v if math.isfinite(v) else None])
        if not samples and body is not text:
            # nothing engine-relevant: make sure the unfiltered body is Prometheus text at all
            for _ in text_string_to_metric_families(text):
                pass
    except (ValueError, TypeError, IndexError, KeyError) as e:
        raise ScrapeError("not_prometheus", f"response is not Prometheus text format ({e})") from e
    return samples, families


@dataclass
class _Stats:
    ok: int = 0
    failed: int = 0
    by_category: dict[str, int] = field(default_factory=dict)
    last_error: str = ""
    scrape_ms: list[float] = field(default_factory=list)
    parse_ms: list[float] = field(default_factory=list)
    bytes_in: int = 0
    samples_last: int = 0

    def fail(self, e: ScrapeError) -> None:
        self.failed += 1
        self.by_category[e.category] = self.by_category.get(e.category, 0) + 1
        self.last_error = str(e)

    def detail(self) -> dict[str, Any]:
        def pct(xs: list[float], q: float) -> float | None:
            if not xs:
                return None
            ys = sorted(xs)
            return round(ys[min(len(ys) - 1, int(q * len(ys)))], 3)

        return {
            "scrapes_ok": self.ok, "scrapes_failed": self.failed, "failures": dict(self.by_category),
            "last_error": self.last_error, "scrape_ms_p50": pct(self.scrape_ms, 0.5),
            "scrape_ms_max": max(self.scrape_ms) if self.scrape_ms else None,
            "parse_ms_p50": pct(self.parse_ms, 0.5), "bytes_received": self.bytes_in,
            "samples_per_scrape": self.samples_last,
        }


class PrometheusProbe:
    """Scrapes ``<target.url><path>`` every ``interval_s`` seconds until the capture stops."""

    name = "prometheus"

    def __init__(self, interval_s: float = 1.0, path: str = "/metrics", timeout_s: float | None = None,
                 keep_all: bool = False, settle_s: float = 0.2) -> None:
        self.interval_s = float(interval_s)
        self.path = path if path.startswith("/") else "/" + path
        self.timeout_s = float(timeout_s) if timeout_s else max(2.0, 2.0 * self.interval_s)
        self.keep_all = keep_all
        self.settle_s = max(0.0, float(settle_s))

    def available(self, ctx: CaptureContext) -> tuple[bool, str]:
        if not (self.interval_s > 0 and math.isfinite(self.interval_s)):
            return False, f"scrape interval must be a positive number of seconds, got {self.interval_s}"
        if not ctx.target.url.startswith(("http://", "https://")):
            return False, f"target URL {ctx.target.url!r} is not http(s)"
        return True, ""

    async def _fetch(self, session: aiohttp.ClientSession, url: str, headers: dict[str, str]) -> tuple[str, int, int]:
        """GET url -> (text, t0_ns, t1_ns); raises ScrapeError."""
        t0 = time.monotonic_ns()
        try:
            async with session.get(url, headers=headers, timeout=aiohttp.ClientTimeout(total=self.timeout_s)) as r:
                if r.status != 200:
                    raise ScrapeError(f"http_{r.status}", f"GET {url} answered HTTP {r.status}")
                raw = await r.read()
        except aiohttp.ClientConnectorError as e:
            refused = isinstance(e.os_error, ConnectionRefusedError)
            raise ScrapeError("refused" if refused else "connect", f"GET {url}: {e.os_error or e}") from e
        except asyncio.TimeoutError as e:
            raise ScrapeError("timeout", f"GET {url}: no answer within {self.timeout_s:g} s") from e
        except aiohttp.ClientError as e:
            raise ScrapeError("connect", f"GET {url}: {type(e).__name__}: {e}") from e
        t1 = time.monotonic_ns()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ScrapeError("not_prometheus", f"GET {url}: body is not UTF-8 text") from e
        return text, t0, t1

    async def run(self, ctx: CaptureContext) -> ProbeStatus:
        url = ctx.target.url.rstrip("/") + self.path
        headers = {"Accept": "text/plain;version=0.0.4", **ctx.target.headers()}
        stats = _Stats()
        seen_families: set[str] = set()
        writers: dict[str, Any] = {}

        def write(samples: list[list[Any]], families: list[dict[str, str]], t0: int, t1: int, parse_ms: float,
                  nbytes: int) -> None:
            if not writers:
                writers["fam"] = ctx.bundle.stream("metric_families", "Prometheus metric families {name, type, help}")
                writers["m"] = ctx.bundle.stream("metrics", f"Prometheus scrapes of {self.path} every {self.interval_s:g} s")
            new = [f for f in families if f["name"] not in seen_families]
            seen_families.update(f["name"] for f in new)
            writers["fam"].write_many(new)
            writers["m"].write({"t_ns": (t0 + t1) // 2, "scrape_ms": round((t1 - t0) / 1e6, 3),
                                "parse_ms": round(parse_ms, 3), "bytes": nbytes, "samples": samples})

        async def scrape(session: aiohttp.ClientSession) -> None:
            text, t0, t1 = await self._fetch(session, url, headers)
            p0 = time.perf_counter()
            samples, families = await asyncio.to_thread(parse_scrape, text, self.keep_all)
            parse_ms = (time.perf_counter() - p0) * 1e3
            write(samples, families, t0, t1, parse_ms, len(text))
            stats.ok += 1
            stats.scrape_ms.append((t1 - t0) / 1e6)
            stats.parse_ms.append(parse_ms)
            stats.bytes_in += len(text)
            stats.samples_last = len(samples)

        connector = aiohttp.TCPConnector(limit=1)
        async with aiohttp.ClientSession(connector=connector) as session:
            try:
                await scrape(session)
            except ScrapeError as e:
                if e.category in ("refused", "connect", "not_prometheus") or e.category.startswith("http_4"):
                    return ProbeStatus(self.name, "unavailable", f"no Prometheus metrics at {url}: {e}",
                                       detail={"category": e.category})
                stats.fail(e)
            start = time.monotonic()
            k = 1
            while True:
                if not ctx.stop.is_set():
                    delay = start + k * self.interval_s - time.monotonic()
                    if delay < 0:  # a slow scrape: skip the ticks it overran instead of bursting
                        k += int(-delay // self.interval_s) + 1
                        continue
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(ctx.stop.wait(), timeout=delay)
                    k += 1
                final = ctx.stop.is_set()
                if final and self.settle_s > 0:  # let the server record the last requests' observations
                    await asyncio.sleep(self.settle_s)
                try:  # the scrape after stop closes the window for counters and histograms
                    await scrape(session)
                except ScrapeError as e:
                    stats.fail(e)
                if final:
                    break
        detail = stats.detail()
        if stats.ok == 0:
            return ProbeStatus(self.name, "failed", f"no scrape of {url} succeeded: {stats.last_error}", detail=detail)
        reason = f"{stats.ok} scrapes" + (f", {stats.failed} failed ({stats.last_error})" if stats.failed else "")
        return ProbeStatus(self.name, "ok", reason, detail=detail)
