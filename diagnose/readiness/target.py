"""The target as the readiness checks talk to it: reachable or not, its model, one streamed request, and the
engine's own view of its in-flight work.

The in-flight state comes from where each engine publishes it:

* **llama.cpp**: ``GET /slots``, the busy slots (``is_processing``) by id; when the server runs with
  ``--no-slots``, its ``llamacpp:requests_processing`` and ``llamacpp:requests_deferred`` gauges;
* **vLLM** (and servers that publish its names): ``vllm:num_requests_running`` and
  ``vllm:num_requests_waiting`` on ``/metrics``, with the KV cache's usage (``vllm:kv_cache_usage_perc``, older
  builds ``vllm:gpu_cache_usage_perc``).

A server that publishes neither cannot be checked for leaked work: the cancellation check is then not run and
says why. Every call here is bounded by its own timeout; nothing is retried.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from diagnose.errors import TargetError
from diagnose.probes.http_client import HttpClient, RequestFailed
from diagnose.probes.slots import read_to_end
from diagnose.probes.sse import StreamResult
from diagnose.readiness.record import Recorder

CALL_TIMEOUT_S = 5.0
MAX_BODY = 8 << 20  # of a /metrics or /slots answer: far past any real one
VLLM_RUNNING = "vllm:num_requests_running"
VLLM_WAITING = "vllm:num_requests_waiting"
VLLM_KV = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
LLAMA_PROCESSING = "llamacpp:requests_processing"
LLAMA_DEFERRED = "llamacpp:requests_deferred"


@dataclass(frozen=True)
class State:
    """One reading of the engine's in-flight work (``t_s``: seconds on the check's clock)."""

    t_s: float
    in_flight: int
    running: float | None = None
    waiting: float | None = None
    kv_usage: float | None = None
    busy_slots: tuple[int, ...] | None = None

    def as_dict(self) -> dict[str, float | list[int]]:
        """Its fields as readiness.json keeps a sample: those not read left out, ``t_s`` rounded."""
        d: dict[str, float | list[int]] = {"t_s": round(self.t_s, 4), "in_flight": self.in_flight}
        for k in ("running", "waiting", "kv_usage"):
            if getattr(self, k) is not None:
                d[k] = getattr(self, k)
        if self.busy_slots is not None:
            d["busy_slots"] = list(self.busy_slots)
        return d


def _metric_sums(text: str, names: set[str]) -> dict[str, float]:
    """The sum over label sets of each named sample in a Prometheus text exposition (unparsable text: {})."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    try:
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                if s.name in names and math.isfinite(s.value):
                    out[s.name] = out.get(s.name, 0.0) + float(s.value)
    except (ValueError, TypeError, IndexError):
        return {}
    return out


class Target:
    """One server: its URL, the client the checks stream through and the one that reads its state."""

    def __init__(self, url: str, request_timeout_s: float = 120.0) -> None:
        self.url = url
        self.client = HttpClient(url, request_timeout_s=request_timeout_s, stall_timeout_s=min(60.0, request_timeout_s))
        # plain GETs (/v1/models, /slots, /metrics) through aiohttp, a connection each (llama-server closes
        # connections a client still holds)
        self._session: aiohttp.ClientSession | None = None
        self.model: str | None = None
        self.source: str | None = None  # where the in-flight state is read: slots, vllm_metrics, llamacpp_metrics
        self.options: dict[str, Any] = {}
        self.engine = "unknown"
        # every request a check sends is recorded here (diagnose/readiness/record.py; without a bundle: not)
        self.recorder = Recorder(None)

    async def close(self) -> None:
        await self.client.close()
        if self._session is not None:
            await self._session.close()

    async def get(self, path: str) -> tuple[int, bytes]:
        """A plain GET (at most ``MAX_BODY`` bytes read, ``CALL_TIMEOUT_S`` in all, a connection each: llama-server
        closes connections a client still holds); :class:`RequestFailed` when nothing answers."""
        if self._session is None:
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True, limit=2))
        try:
            async with self._session.get(f"{self.url}{path}",
                                         timeout=aiohttp.ClientTimeout(total=CALL_TIMEOUT_S)) as r:
                # to its end (one read of a 55 KB vLLM scrape on a loaded machine gave its start, no gauges)
                return r.status, await read_to_end(r.content, MAX_BODY)
        except asyncio.TimeoutError:
            raise RequestFailed("timeout", f"GET {path}: no answer in {CALL_TIMEOUT_S:g} s") from None
        except aiohttp.ClientConnectorError as e:
            refused = isinstance(e.os_error, ConnectionRefusedError)
            raise RequestFailed("refused" if refused else "connect",
                                f"connection refused by {e.host}:{e.port}" if refused else
                                f"cannot connect to {e.host}:{e.port}: {e.os_error.strerror or e}") from None
        except (aiohttp.ClientError, OSError) as e:
            raise RequestFailed("reset", f"GET {path}: {e}") from None

    async def connect(self) -> None:
        """Reach the server (``GET /v1/models``), learn its model and where its in-flight state is read; a
        :class:`TargetError` (exit 3, one line) when it does not answer."""
        try:
            status, body = await self.get("/v1/models")
        except RequestFailed as e:
            raise TargetError(f"cannot reach {self.url}: {e.detail}") from None
        if status != 200:
            raise TargetError(f"{self.url}/v1/models answered HTTP {status}: not an OpenAI-compatible server "
                              "ready to serve")
        try:
            self.model = str(orjson.loads(body)["data"][0]["id"])
        except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
            raise TargetError(f"{self.url}/v1/models: no model in its answer") from None
        await self._find_source()

    async def _find_source(self) -> None:
        from diagnose.probes.slots import slot_rows

        try:
            status, body = await self.get("/slots")
            if status == 200 and slot_rows(orjson.loads(body)) is not None:
                self.source, self.engine = "slots", "llama.cpp"
                return
        except (RequestFailed, orjson.JSONDecodeError):
            pass
        text = await self._metrics()
        if text is None:
            return
        got = _metric_sums(text, {VLLM_RUNNING, LLAMA_PROCESSING})
        if VLLM_RUNNING in got:
            self.source, self.engine = "vllm_metrics", "vllm"
        elif LLAMA_PROCESSING in got:
            self.source, self.engine = "llamacpp_metrics", "llama.cpp"

    async def _metrics(self) -> str | None:
        try:
            status, body = await self.get("/metrics")
        except RequestFailed:
            return None
        return body.decode("utf-8", "replace") if status == 200 else None

    async def state(self, t0: float) -> State | None:
        """The engine's in-flight work now (None when it could not be read this time), stamped when the answer
        arrived: a release is timed no earlier than it was seen (a busy vLLM CPU server takes 0.5 s to answer
        /metrics)."""
        if self.source == "slots":
            from diagnose.probes.slots import slot_rows

            try:
                status, body = await self.get("/slots")
                rows = slot_rows(orjson.loads(body)) if status == 200 else None
            except (RequestFailed, orjson.JSONDecodeError):
                rows = None
            if rows is None:
                return None
            t = time.monotonic() - t0
            busy = tuple(int(r["id"]) if r["id"] is not None else -1 for r in rows if r["busy"])
            return State(t, len(busy), busy_slots=busy)
        if self.source in ("vllm_metrics", "llamacpp_metrics"):
            text = await self._metrics()
            if text is None:
                return None
            t = time.monotonic() - t0
            if self.source == "vllm_metrics":
                m = _metric_sums(text, {VLLM_RUNNING, VLLM_WAITING, *VLLM_KV})
                run, wait = m.get(VLLM_RUNNING), m.get(VLLM_WAITING, 0.0)
                kv = next((m[k] for k in VLLM_KV if k in m), None)
            else:
                m = _metric_sums(text, {LLAMA_PROCESSING, LLAMA_DEFERRED})
                run, wait, kv = m.get(LLAMA_PROCESSING), m.get(LLAMA_DEFERRED, 0.0), None
            if run is None:
                return None
            return State(t, int(round(run + wait)), running=run, waiting=wait, kv_usage=kv)
        return None

    def body(self, prompt: str, max_tokens: int) -> bytes:
        return orjson.dumps({"model": self.model, "prompt": prompt, "max_tokens": max_tokens, "stream": True,
                             "temperature": 0, **self.options})

    async def negotiate(self) -> StreamResult:
        """One small streamed request, with ``ignore_eos`` (every stream runs its whole length) unless the server
        rejects it (400): then without. Returns the last try's result."""
        res = StreamResult()
        for opts in ({"ignore_eos": True, "stream_options": {"include_usage": True}}, {"ignore_eos": True}, {}):
            self.options = opts
            res = StreamResult()
            await self.client.stream("/v1/completions", self.body("hello", 2), res)
            if res.status != 400:
                return res
        return res

    async def stream(self, prompt: str, max_tokens: int, res: StreamResult, *, phase: int | None = None,
                     intended_ns: int | None = None, tags: Mapping[str, Any] | None = None) -> StreamResult:
        """One streamed request, recorded when it ends (or is closed: cancelled) in ``phase``, with ``tags`` added
        to its record. By default the phase is the recorder's current one when it is sent, and counted as one of
        its requests then; a caller that names ``phase`` has counted it (``recorder.sent``) when it decided to
        send it (the overload ramp: its task may first run after the step's phase has ended)."""
        if phase is None:
            ph = self.recorder.current
            self.recorder.sent(ph)
        else:
            ph = phase
        cut = True
        self.recorder.open += 1
        try:
            await self.client.stream("/v1/completions", self.body(prompt, max_tokens), res)
            cut = False
            return res
        finally:
            self.recorder.open -= 1
            self.recorder.request(ph, prompt, max_tokens, res, cut=cut, intended_ns=intended_ns, tags=tags)


def ttft_ms(res: StreamResult) -> float | None:
    return (res.t_ns[0] - res.sent_ns) / 1e6 if res.ok and res.t_ns else None


def failure(res: StreamResult) -> str:
    """A failed request in a few words: its category and detail, or its HTTP status."""
    if res.error:
        return f"{res.error}: {res.error_detail}" if res.error_detail else res.error
    return f"HTTP {res.status}"
