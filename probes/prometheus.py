"""Prometheus probe: scrape the server's /metrics at a fixed interval during the capture.

Each scrape is fetched on its tick and parsed behind it, in order, with prometheus_client's text-format
parser in a child process (``probes/prometheus_worker.py``; a thread with ``parse_in="thread"`` or when the
child cannot run), so parsing neither blocks nor GIL-starves the load generator's event loop, and a parser
starved of CPU beside a saturating engine delays the writing, not the sampling (the backlog of fetched
scrapes is bounded: ``BACKLOG_BYTES``). Each is written as one ``metrics`` record
``{t_ns, scrape_ms, ttfb_ms, interval_s, parse_ms, bytes, samples: [[name, {labels}, value], ...]}``; ``t_ns``
is the midpoint of the HTTP exchange, ``scrape_ms`` its duration (the cost the server sees), ``ttfb_ms`` the
part of it until the answer's headers (the server rendering the page; the rest is the transfer),
``interval_s`` the interval the scrape was taken at. Each metric family's type and help are written once to
``metric_families`` as ``{name, type, help}``.

Cost (issue 17, diagnose/capture/overhead.py): the status detail's ``cost`` holds the server's time for the scrapes
(the sum of ``scrape_ms``) and this probe's own CPU (the parse worker's, or the parsing thread's, plus
decoding and writing here). Within a capture budget (``attach --overhead-budget``, default 1% of one core)
the interval adapts: a scrape costing ``c`` seconds of the server's time (the median of the last
``COST_WINDOW`` exchanges; the parsing CPU is diagnose's own, reported beside) wants ``c / interval`` of a core, and the
budget's ``factor()`` (1 while every adapting probe's want fits) divides the interval asked; the status and
each record's ``interval_s`` say when the budget made it coarser (docs/probe-cost.md).

Bundle size: only engine-relevant families are kept (``diagnose.engines.detect.is_engine_relevant``: the engine
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
import statistics
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp

from diagnose.capture.overhead import (
    PING_PATH,
    OverheadBudget,
    budget_of,
    cost,
    is_local,
    network_basis,
    round_trip_ms,
    server_ms,
)
from diagnose.capture.workload import parse_duration
from diagnose.io.writer import serialize_records
from diagnose.model import ProbeStatus
from diagnose.probes.base import CaptureContext, Options, ProbeOption, ProbeSetup, ProbeSpec, wait_tick
from diagnose.probes.prometheus_worker import ParseWorker, ScrapeError, WorkerGone, parse_scrape, prefilter

__all__ = ["PrometheusProbe", "ScrapeError", "parse_scrape", "prefilter"]

# A vLLM scrape is 50-300 KB; a 60 MB /metrics once took a 4 s capture to 93 s (issue 12, defect 14).
MAX_SCRAPE_BYTES = 8 << 20
STOP_CATEGORIES = ("too_large", "parse_timeout")  # recurring and costly: the probe stops scraping
# No answer from a parse for this long (wall clock) means a wedged parser, not a starved one: a parse that
# waits for the CPU beside a saturating engine took 1.3 s here with one CPU hog, and over 5 s in CI
PARSE_WALL_S = 60.0
# Scrapes fetched and waiting for the parser, at most (bytes of text): 600 vLLM scrapes of 55 KB; a tick that
# finds the backlog this full is not sampled (counted), so a parser that never catches up costs no more memory
BACKLOG_BYTES = 32 << 20
GONE_CATEGORIES = ("refused", "connect", "timeout")  # the server did not answer at all
GONE_AFTER = 3  # scrapes in a row: the server stopped answering (issue 12, defect 15)
COST_WINDOW = 9  # scrapes: the budget reads the median cost of this many recent ones
COST_MIN = 3  # scrapes before the budget reads their cost: one slow first exchange (the server busy starting
# the load) set the interval to 8.5 s for two ticks in benchmarks/results/overhead_budget.md, run 3


@dataclass
class _Stats:
    ok: int = 0
    failed: int = 0
    by_category: dict[str, int] = field(default_factory=dict)
    last_error: str = ""
    scrape_ms: list[float] = field(default_factory=list)
    parse_ms: list[float] = field(default_factory=list)
    parse_cpu_ms: list[float] = field(default_factory=list)
    bytes_in: int = 0
    samples_last: int = 0
    parse_note: str = ""
    parsed_in_worker: int = 0
    gone: str = ""  # the server stopped answering: when and how
    parse_stopped: str = ""  # a parse that cost too much or never answered: why the scraping stopped
    unparsed: int = 0  # scrapes fetched but not parsed (after such a stop, or still owed at the end)
    skipped_backlog: int = 0  # ticks not sampled because the parser was that far behind
    backlog_max: int = 0  # most scrapes waiting for the parser at once
    lag_ms: float = 0.0  # longest time from a scrape's fetch to its record on disk
    outages: list[str] = field(default_factory=list)  # it stopped answering and came back
    ttfb_ms: list[float] = field(default_factory=list)
    target_ms: float = 0.0  # the server's time for the scrapes (sum of the exchanges that got an answer)
    own_cpu_ms: float = 0.0  # this probe's CPU: parsing (worker or thread), decoding and writing here
    recent_server_ms: deque[float] = field(default_factory=lambda: deque(maxlen=COST_WINDOW))
    recent_own_ms: deque[float] = field(default_factory=lambda: deque(maxlen=COST_WINDOW))
    intervals: list[float] = field(default_factory=list)  # the interval each later tick was taken at
    budget: OverheadBudget | None = None
    colocated: bool = False
    # the network's round trip to the server (ms; the fastest of PINGS answers), None when not measured. Over
    # RTT_SIGNIFICANT_MS it is taken out of each scrape's time to first byte, and the transfer is the network's
    # too: the server's time for a scrape is then its time to first byte less the round trip (issue 36: behind
    # a proxy adding 80 ms, every scrape was charged 80 ms and more of the server's time, and a 1% budget
    # stretched a 1 s interval to 10 s)
    rtt_ms: float | None = None

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
            "parse_ms_p50": pct(self.parse_ms, 0.5), "parse_ms_max": max(self.parse_ms) if self.parse_ms else None,
            "parse_cpu_ms_p50": pct(self.parse_cpu_ms, 0.5), "bytes_received": self.bytes_in,
            "samples_per_scrape": self.samples_last, "parse_note": self.parse_note,
            "parsed_in_worker": self.parsed_in_worker, "parse_backlog_max": self.backlog_max,
            "parse_lag_ms_max": round(self.lag_ms, 1), "scrapes_unparsed": self.unparsed,
            "ticks_skipped_backlog": self.skipped_backlog, "ttfb_ms_p50": pct(self.ttfb_ms, 0.5),
            "interval_s_p50": pct(self.intervals, 0.5), "interval_s_max": max(self.intervals, default=None),
            "round_trip_ms": None if self.rtt_ms is None else round(self.rtt_ms, 3),
        }

    def per_scrape_s(self) -> float | None:
        """What one scrape costs the server now (s): the median of its recent exchanges; None before
        ``COST_MIN`` of them."""
        if len(self.recent_server_ms) < COST_MIN:
            return None
        return statistics.median(self.recent_server_ms) / 1e3


class PrometheusProbe:
    """Scrapes ``<target.url><path>`` every ``interval_s`` seconds until the capture stops."""

    name = "prometheus"

    def __init__(self, interval_s: float = 1.0, path: str = "/metrics", timeout_s: float | None = None,
                 keep_all: bool = False, settle_s: float = 0.2,
                 parse_in: Literal["process", "thread"] = "process", max_bytes: int = MAX_SCRAPE_BYTES,
                 parse_cpu_s: float | None = None, parse_wall_s: float | None = None,
                 backlog_bytes: int = BACKLOG_BYTES) -> None:
        self.interval_s = float(interval_s)
        self.path = path if path.startswith("/") else "/" + path
        self.timeout_s = float(timeout_s) if timeout_s else max(2.0, 2.0 * self.interval_s)
        self.keep_all = keep_all
        self.settle_s = max(0.0, float(settle_s))
        self.parse_in = parse_in
        self.max_bytes = int(max_bytes)
        # the cost limit is the parse's own CPU time (probes/prometheus_worker.py says why not wall time)
        self.parse_cpu_s = float(parse_cpu_s) if parse_cpu_s else max(2.0, 2.0 * self.interval_s)
        self.parse_wall_s = float(parse_wall_s) if parse_wall_s else max(PARSE_WALL_S, 10.0 * self.interval_s)
        self.backlog_bytes = int(backlog_bytes)

    def available(self, ctx: CaptureContext) -> tuple[bool, str]:
        if not (self.interval_s > 0 and math.isfinite(self.interval_s)):
            return False, f"scrape interval must be a positive number of seconds, got {self.interval_s}"
        if not ctx.target.url.startswith(("http://", "https://")):
            return False, f"target URL {ctx.target.safe_url!r} is not http(s)"
        return True, ""

    async def _fetch(self, session: aiohttp.ClientSession, url: str,
                     headers: dict[str, str]) -> tuple[str, int, int, int]:
        """GET url -> (text, t0_ns, headers_ns, t1_ns); raises ScrapeError."""
        t0 = time.monotonic_ns()
        try:
            async with session.get(url, headers=headers, timeout=aiohttp.ClientTimeout(total=self.timeout_s)) as r:
                th = time.monotonic_ns()
                if r.status != 200:
                    raise ScrapeError(f"http_{r.status}", f"GET {url} answered HTTP {r.status}")
                if r.content_length is not None and r.content_length > self.max_bytes:
                    raise ScrapeError("too_large", f"GET {url}: a {r.content_length}-byte answer is over the "
                                                   f"{self.max_bytes}-byte scrape limit")
                parts: list[bytes] = []
                n = 0
                async for part in r.content.iter_chunked(1 << 16):
                    n += len(part)
                    if n > self.max_bytes:
                        raise ScrapeError("too_large", f"GET {url}: the answer passed the {self.max_bytes}-byte "
                                                       "scrape limit (stopped reading)")
                    parts.append(part)
                raw = b"".join(parts)
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
        return text, t0, th, t1

    async def run(self, ctx: CaptureContext) -> ProbeStatus:
        url = ctx.target.endpoint(self.path)
        # identity: prometheus_client gzips at level 9 when asked (aiohttp asks by default), ~1.1 ms of the
        # server's CPU per 50 KB scrape, to save bandwidth that loopback does not need
        headers = {"Accept": "text/plain;version=0.0.4", "Accept-Encoding": "identity", **ctx.target.headers()}
        stats = _Stats(budget=budget_of(ctx.shared, ctx.options), colocated=is_local(ctx.target.url))
        started = time.monotonic()
        seen_families: set[str] = set()
        writers: dict[str, Any] = {}

        def serialise(samples: list[list[Any]], families: list[dict[str, str]], t: tuple[int, int, int, float],
                      parse_ms: float, nbytes: int) -> tuple[bytes, int, bytes]:
            """The scrape's records as stream lines (on the loop: orjson holds the GIL wherever it runs)."""
            t0, th, t1, interval = t
            new = [f for f in families if f["name"] not in seen_families]
            seen_families.update(f["name"] for f in new)
            line = serialize_records([{"t_ns": (t0 + t1) // 2, "scrape_ms": round((t1 - t0) / 1e6, 3),
                                       "ttfb_ms": round((th - t0) / 1e6, 3), "interval_s": round(interval, 3),
                                       "parse_ms": round(parse_ms, 3), "bytes": nbytes, "samples": samples}])
            return serialize_records(new), len(new), line

        def store(fam: bytes, n_fam: int, line: bytes) -> float:
            """Writes them, on a thread: a write() the kernel holds (a page under writeback, dirty-page
            throttling) and the first scrape's stream creation (a manifest written with fsync) would stall the
            event loop the load client stamps chunks on (issue 18: 3-17 ms off-CPU stalls, no run-queue wait).
            Returns its CPU time, ms."""
            c0 = time.thread_time()
            if not writers:
                every = f"every {self.interval_s:g} s" + (" or coarser, within the overhead budget"
                                                          if stats.budget is not None else "")
                writers["fam"] = ctx.bundle.stream("metric_families", "Prometheus metric families {name, type, help}")
                writers["m"] = ctx.bundle.stream("metrics", f"Prometheus scrapes of {self.path} {every}")
            if n_fam:
                writers["fam"].write_serialized(fam, n_fam)
            writers["m"].write_serialized(line, 1)
            return (time.thread_time() - c0) * 1e3

        worker: ParseWorker | None = None
        if self.parse_in == "process":
            worker = ParseWorker()
            try:
                await worker.start()
            except WorkerGone as e:
                stats.parse_note = str(e)
                worker = None

        async def parse(text: str) -> tuple[list[list[Any]], list[dict[str, str]], float]:
            try:
                return await asyncio.wait_for(parse_any(text), self.parse_wall_s)
            except asyncio.TimeoutError:
                nonlocal worker
                if worker is not None:  # the child is stuck in that parse: end it (a thread cannot be)
                    await worker.close(kill=True)
                    worker = None
                raise ScrapeError("parse_timeout", f"parsing a {len(text)}-byte scrape of {url} gave no answer "
                                                   f"within {self.parse_wall_s:g} s") from None

        async def parse_any(text: str) -> tuple[list[list[Any]], list[dict[str, str]], float]:
            nonlocal worker
            if worker is not None and worker.failed:
                # why, from the child itself (its exit status, the last line of its stderr)
                stats.parse_note = f"parse worker did not start ({await worker.why_not_started()}); parsing in a thread"
                await worker.close()
                worker = None
            if worker is not None and worker.ready:
                try:
                    out = await worker.parse(text, self.keep_all, self.parse_cpu_s)
                except WorkerGone as e:  # fall back to a thread for the rest of the capture
                    stats.parse_note = f"{e}; parsing in a thread since"
                    await worker.close()
                    worker = None
                else:
                    if "error" in out:
                        msg = str(out.get("message", ""))
                        raise ScrapeError(str(out["error"]), f"{msg} ({url})" if out["error"] == "parse_timeout" else msg)
                    stats.parsed_in_worker += 1
                    return out["samples"], out["families"], float(out.get("work_cpu_ms", out.get("cpu_ms", 0.0)))
            samples, families, cpu_ms = await asyncio.to_thread(_parse_timed, text, self.keep_all)
            if cpu_ms > self.parse_cpu_s * 1e3:  # a thread cannot be stopped mid-parse: judged once it is done
                raise ScrapeError("parse_timeout", f"parsing a {len(text)}-byte scrape used over {self.parse_cpu_s:g} "
                                                   f"s of CPU ({cpu_ms / 1e3:.1f} s; {url})")
            return samples, families, cpu_ms

        async def parse_and_write(text: str, t: tuple[int, int, int, float]) -> None:
            p0 = time.perf_counter()
            samples, families, cpu_ms = await parse(text)
            parse_ms = (time.perf_counter() - p0) * 1e3
            c0 = time.thread_time()
            fam, n_fam, line = serialise(samples, families, t, parse_ms, len(text))
            own_ms = cpu_ms + (time.thread_time() - c0) * 1e3
            t0, th, t1, _ = t
            # counted before the write is awaited: a capture cancelled meanwhile still has the thread write it
            stats.ok += 1
            stats.scrape_ms.append((t1 - t0) / 1e6)
            stats.ttfb_ms.append((th - t0) / 1e6)
            stats.parse_ms.append(parse_ms)
            stats.parse_cpu_ms.append(cpu_ms)
            own_ms += await asyncio.to_thread(store, fam, n_fam, line)  # in scrape order: awaited in turn
            stats.own_cpu_ms += own_ms
            stats.recent_own_ms.append(own_ms)
            stats.lag_ms = max(stats.lag_ms, (time.monotonic_ns() - t1) / 1e6)  # fetched -> written
            stats.bytes_in += len(text)
            stats.samples_last = len(samples)

        async def fetch(session: aiohttp.ClientSession, interval: float) -> tuple[str, tuple[int, int, int, float]]:
            text, t0, th, t1 = await self._fetch(session, url, headers)
            server = server_ms(t0, th, t1, stats.rtt_ms)
            stats.target_ms += server
            stats.recent_server_ms.append(server)
            return text, (t0, th, t1, interval)

        async def first(session: aiohttp.ClientSession) -> None:  # fetched and parsed in turn: it decides
            text, t = await fetch(session, self.interval_s)  # whether there are metrics at all
            await parse_and_write(text, t)

        # later scrapes: fetched on their ticks, parsed behind in order (a parser starved of CPU beside a
        # saturating engine delays the writing, never the sampling); the backlog is bounded in bytes
        backlog: asyncio.Queue[tuple[str, tuple[int, int, int, float]] | None] = asyncio.Queue()
        queued = {"bytes": 0}

        async def parser() -> None:
            while (item := await backlog.get()) is not None:
                text, t = item
                try:
                    if not stats.parse_stopped:
                        await parse_and_write(text, t)
                    else:
                        stats.unparsed += 1
                except ScrapeError as e:
                    stats.fail(e)
                    if e.category in STOP_CATEGORIES:  # every later parse would cost as much: stop here
                        stats.parse_stopped = f"{e}; scraping stopped"
                finally:
                    queued["bytes"] -= len(text)

        async def later(session: aiohttp.ClientSession, final: bool, interval: float) -> None:
            if queued["bytes"] >= self.backlog_bytes and not final:
                stats.skipped_backlog += 1  # the parser is this far behind: this tick is not sampled
                return
            text, t = await fetch(session, interval)
            queued["bytes"] += len(text)
            stats.backlog_max = max(stats.backlog_max, backlog.qsize() + 1)
            backlog.put_nowait((text, t))

        task = asyncio.create_task(parser())
        try:
            status = await self._loop(ctx, url, first, later, stats)
            backlog.put_nowait(None)
            try:  # the capture waits for the parses still owed, within the wedged-parser backstop
                await asyncio.wait_for(asyncio.shield(task), self.parse_wall_s)
            except asyncio.TimeoutError:
                stats.unparsed += backlog.qsize()
            return self._status(status, stats, url, time.monotonic() - started)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
            if worker is not None:
                await worker.close()

    async def _loop(self, ctx: CaptureContext, url: str, first: Callable[[aiohttp.ClientSession], Awaitable[None]],
                    later: Callable[[aiohttp.ClientSession, bool, float], Awaitable[None]],
                    stats: _Stats) -> ProbeStatus | None:
        """Scrape until the capture stops: a ProbeStatus when the probe ends early (no metrics there), else None
        and the final status is made from ``stats`` once the parses are done (``_status``)."""
        connector = aiohttp.TCPConnector(limit=1)
        async with aiohttp.ClientSession(connector=connector) as session:
            stats.rtt_ms = await round_trip_ms(session, ctx.target.endpoint(PING_PATH), ctx.target.headers(),
                                               self.timeout_s)
            try:
                await first(session)
            except ScrapeError as e:
                if e.category in ("refused", "connect", "not_prometheus") or e.category.startswith("http_4"):
                    return ProbeStatus(self.name, "unavailable", f"no Prometheus metrics at {url}: {e}",
                                       detail={"category": e.category})
                stats.fail(e)
                if e.category in STOP_CATEGORIES:
                    return ProbeStatus(self.name, "unavailable", f"no usable Prometheus metrics at {url}: {e}",
                                       detail={**stats.detail(), "category": e.category, "stopped": str(e)})
            t_start = time.monotonic()
            next_t = t_start  # the next tick; the interval is as asked or, within a budget, coarser
            interval = self.interval_s
            in_a_row = 0  # scrapes in a row the server did not answer (after it had answered)
            while not stats.parse_stopped:
                if not ctx.stop.is_set():
                    interval = self._interval_now(stats)
                    next_t = await wait_tick(ctx.stop, next_t, interval)  # a slow scrape skips the ticks it overran
                final = ctx.stop.is_set()
                if final and self.settle_s > 0:  # let the server record the last requests' observations
                    await asyncio.sleep(self.settle_s)
                try:  # the scrape after stop closes the window for counters and histograms
                    if not final:
                        stats.intervals.append(interval)
                    await later(session, final, interval)
                    in_a_row = 0
                    if stats.gone:  # it came back (a restart, a long pause): an outage, not the end
                        stats.outages.append(stats.gone)
                        stats.gone = ""
                        ctx.shared.pop("target_gone", None)
                except ScrapeError as e:
                    stats.fail(e)
                    if e.category in STOP_CATEGORIES:  # every later scrape would cost as much: stop here
                        stats.parse_stopped = f"{e}; scraping stopped"
                        break
                    # under load a busy server may answer /metrics late: only a refusal means gone then
                    gone_cats = GONE_CATEGORIES if ctx.options.get("observe") else GONE_CATEGORIES[:2]
                    if e.category in gone_cats and stats.ok:
                        in_a_row += 1
                        if in_a_row == GONE_AFTER and not final:
                            stats.gone = (f"the server stopped answering {time.monotonic() - t_start:.1f} s into "
                                          f"the capture ({GONE_AFTER} scrapes in a row failed; last: {e})")
                            ctx.shared.setdefault("target_gone", stats.gone)
                            if ctx.options.get("observe"):
                                ctx.stop.set()  # nothing else measures the server: the capture ends here
                                break
                if final:
                    break
        return None

    def _interval_now(self, stats: _Stats) -> float:
        """The interval for the next tick: as asked, or coarser when the budget needs it."""
        per = stats.per_scrape_s()
        if stats.budget is None or per is None:
            return self.interval_s
        stats.budget.want(self.name, per / self.interval_s)
        return self.interval_s / stats.budget.factor(self.name)

    def _cost(self, stats: _Stats, window_s: float) -> dict[str, Any]:
        coarse = [i for i in stats.intervals if i > self.interval_s * 1.001]
        adapted = None
        if coarse and stats.budget is not None:
            med = statistics.median(coarse)
            server = statistics.median(stats.recent_server_ms) if stats.recent_server_ms else 0.0
            own = statistics.median(stats.recent_own_ms) if stats.recent_own_ms else 0.0
            adapted = (f"the {stats.budget.share:.2%} overhead budget made the scrape interval {med:.2g} s in "
                       f"{len(coarse)} of {len(stats.intervals)} ticks (asked {self.interval_s:g} s): a scrape took "
                       f"{server:.3g} ms of the server's time (and {own:.3g} ms of diagnose's CPU to parse)")
        basis = network_basis(stats.rtt_ms, "/metrics",
                              "server: the /metrics exchanges on loopback (time to first byte + transfer)")
        return cost(stats.target_ms, stats.own_cpu_ms / 1e3, window_s, stats.colocated,
                    basis + "; own: the parser's CPU, decoding and writing", adapted=adapted, interval_asked_s=self.interval_s,
                    budget_share=stats.budget.share if stats.budget is not None else None)

    def _status(self, early: ProbeStatus | None, stats: _Stats, url: str, window_s: float) -> ProbeStatus:
        if early is not None:
            if stats.ok or stats.target_ms:
                early.detail["cost"] = self._cost(stats, window_s)
            return early
        detail = stats.detail()
        detail["cost"] = self._cost(stats, window_s)
        stopped = stats.parse_stopped
        if stopped:
            detail["stopped"] = stopped
        if stats.outages:
            detail["outages"] = list(stats.outages)
        if stats.gone:
            detail["server_gone"] = True
            return ProbeStatus(self.name, "failed", f"{stats.gone}; {stats.ok} scrapes before that", detail=detail)
        if stats.ok == 0:
            return ProbeStatus(self.name, "failed", f"no scrape of {url} succeeded: {stats.last_error}", detail=detail)
        reason = f"{stats.ok} scrapes" + (f", {stats.failed} failed ({stats.last_error})" if stats.failed else "")
        n_late, note = late_parses(stats.parse_ms, stats.parse_cpu_ms, self.interval_s)
        if n_late:  # the scrapes are still right (timed by the HTTP exchange) and on their ticks: parsed later
            detail["parses_over_interval"] = n_late
            reason += f"; {note}"
        if stats.skipped_backlog:
            reason += (f"; {stats.skipped_backlog} ticks not sampled: the parser was "
                       f"{self.backlog_bytes >> 20} MiB of scrapes behind")
        if stats.unparsed:
            reason += f"; {stats.unparsed} scrapes fetched but not parsed"
        if stopped:
            reason += f"; {stopped}"
        if detail["cost"].get("adapted"):
            reason += f"; {detail['cost']['adapted']}"
        return ProbeStatus(self.name, "ok", reason, detail=detail)


def late_parses(wall_ms: list[float], cpu_ms: list[float], interval_s: float) -> tuple[int, str]:
    """(how many parses took longer than the interval, a line saying so and why: waiting for the CPU when
    their CPU time is under half their wall time, else slow parsing itself)."""
    late = [(w, c) for w, c in zip(wall_ms, cpu_ms, strict=True) if w > interval_s * 1e3]
    if not late:
        return 0, ""
    cpu = sum(c for _, c in late) / len(late)
    why = "waiting for the CPU" if cpu < 0.5 * sum(w for w, _ in late) / len(late) else "parsing itself was slow"
    return len(late), (f"{len(late)} parses took longer than the {interval_s:g} s interval, {why} (their CPU mean "
                       f"{cpu:.0f} ms, wall max {max(w for w, _ in late):.0f} ms): the scrapes kept their ticks and were parsed behind")


def _parse_timed(text: str, keep_all: bool) -> tuple[list[list[Any]], list[dict[str, str]], float]:
    """parse_scrape in a worker thread, with the CPU time that thread spent on it (ms)."""
    c0 = time.thread_time()
    samples, families = parse_scrape(text, keep_all)
    return samples, families, (time.thread_time() - c0) * 1e3


# -- attach options -------------------------------------------------------------------------------------
def _interval_s(o: Options) -> float | None:
    return None if o["no_metrics"] else parse_duration(o["metrics_interval"])


def _build(o: Options, setup: ProbeSetup) -> PrometheusProbe:
    return PrometheusProbe(interval_s=parse_duration(o["metrics_interval"]))


SPEC = ProbeSpec(
    name="prometheus", title="Server metrics (Prometheus /metrics)",
    enabled=lambda o: not o["no_metrics"], build=_build,
    record=lambda o: {"metrics_interval_s": _interval_s(o)},
    options=(
        ProbeOption("--metrics-interval", default="1s", show_default=True, help="Prometheus scrape interval."),
        ProbeOption("--no-metrics", flag=True, help="Do not scrape /metrics."),
    ),
)
