"""A small client for the Prometheus HTTP query API (``/api/v1/query``, ``/api/v1/query_range``,
``/api/v1/label/<name>/values``), on aiohttp.

Any server that speaks this API answers it: Prometheus, Thanos Query, Mimir / Cortex (under their
``/prometheus`` prefix: pass it as part of the URL), VictoriaMetrics. Every failure becomes one
:class:`~diagnose.errors.TargetError` whose message names the server, the endpoint and what went wrong
(unreachable, HTTP status with the server's own error text, a body that is not the API's JSON); nothing here
raises anything else for a bad server or a bad query.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from diagnose.errors import TargetError

#: Prometheus refuses a range query of more than 11,000 points per series
MAX_POINTS = 11_000


@dataclass
class QueryLog:
    """What was asked, for the bundle's provenance: one entry per API call."""

    entries: list[dict[str, Any]] = field(default_factory=list)


def fmt_duration(seconds: float) -> str:
    """A PromQL duration (whole milliseconds), e.g. ``3600s`` or ``1500ms``."""
    ms = max(1, round(seconds * 1000))
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


class PrometheusAPI:
    """One Prometheus-compatible query endpoint. Use inside ``async with``."""

    def __init__(self, url: str, *, timeout_s: float = 30.0, headers: dict[str, str] | None = None) -> None:
        url = url.rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise TargetError(f"--prometheus {url!r}: expected http://HOST:PORT (the Prometheus server)")
        self.url = url
        self.timeout_s = timeout_s
        self.headers = dict(headers or {})
        self.log = QueryLog()
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> PrometheusAPI:
        self._session = aiohttp.ClientSession(headers=self.headers)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    # -- endpoints ------------------------------------------------------------------------------------
    async def query(self, promql: str, at_s: float) -> list[dict[str, Any]]:
        """An instant query at unix time ``at_s``: its vector ``[{metric: {...}, value: [t, "v"]}]``."""
        data = await self._get("/api/v1/query", {"query": promql, "time": _ts(at_s)}, promql)
        return _result(data, ("vector", "scalar"), self.url, promql)

    async def query_range(self, promql: str, start_s: float, end_s: float, step_s: float) -> list[dict[str, Any]]:
        """A range query: its matrix ``[{metric: {...}, values: [[t, "v"], ...]}]``. The step is raised so
        that no series has more than :data:`MAX_POINTS` points."""
        step_s = max(step_s, (end_s - start_s) / (MAX_POINTS - 1), 0.001)
        data = await self._get("/api/v1/query_range", {"query": promql, "start": _ts(start_s), "end": _ts(end_s),
                                                       "step": _ts(step_s)}, promql)
        return _result(data, ("matrix",), self.url, promql)

    async def label_values(self, label: str, match: str, start_s: float, end_s: float) -> list[str]:
        """The values of ``label`` on the series that ``match`` selects between the two times."""
        data = await self._get(f"/api/v1/label/{label}/values",
                               {"match[]": match, "start": _ts(start_s), "end": _ts(end_s)}, match)
        if not isinstance(data, list) or not all(isinstance(v, str) for v in data):
            raise TargetError(f"{self.url}/api/v1/label/{label}/values: expected a list of strings, got "
                              f"{type(data).__name__}")
        return list(data)

    # -- transport ------------------------------------------------------------------------------------
    async def _get(self, path: str, params: dict[str, str], what: str) -> Any:
        if self._session is None:
            raise RuntimeError("PrometheusAPI used outside `async with`")
        where = f"{self.url}{path}"
        t0 = time.monotonic()
        try:
            async with self._session.get(where, params=params,
                                         timeout=aiohttp.ClientTimeout(total=self.timeout_s)) as r:
                status = r.status
                body = await r.read()
        except aiohttp.ClientConnectorError as e:
            os_err = getattr(e, "os_error", None)
            why = ("connection refused (is Prometheus running and listening there?)"
                   if isinstance(os_err, ConnectionRefusedError) else str(getattr(os_err, "strerror", None) or e))
            raise TargetError(f"cannot reach Prometheus at {self.url}: {why}") from e
        except asyncio.TimeoutError as e:
            raise TargetError(f"{where}: no answer within {self.timeout_s:.0f} s") from e
        except aiohttp.ClientError as e:
            raise TargetError(f"cannot talk to Prometheus at {self.url}: {type(e).__name__}: {e}") from e
        except ValueError as e:  # a malformed URL
            raise TargetError(f"--prometheus {self.url!r}: {e}") from e
        self.log.entries.append({"path": path, "query": what, "http_status": status,
                                 "ms": round((time.monotonic() - t0) * 1e3, 2), "bytes": len(body)})
        payload = _json(body)
        if status >= 400 or payload is None or payload.get("status") != "success":
            err = ""
            if payload is not None:
                err = f"{payload.get('errorType') or 'error'}: {payload.get('error') or '(no error text)'}"
            elif body:
                err = "the answer is not the query API's JSON: " + body[:120].decode("utf-8", "replace").strip()
            raise TargetError(f"{where} answered HTTP {status}" + (f": {err}" if err else "")
                              + (f" (query {what})" if what else ""))
        return payload.get("data")


def _ts(x: float) -> str:
    return f"{x:.3f}"


def _json(body: bytes) -> dict[str, Any] | None:
    import orjson

    try:
        v = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return v if isinstance(v, dict) else None


def _result(data: Any, types: tuple[str, ...], url: str, promql: str) -> list[dict[str, Any]]:
    if not isinstance(data, dict) or data.get("resultType") not in types or not isinstance(data.get("result"), list):
        got = data.get("resultType") if isinstance(data, dict) else type(data).__name__
        raise TargetError(f"{url}: query {promql!r} gave {got!r}, expected {' or '.join(types)}")
    if data["resultType"] == "scalar":
        return [{"metric": {}, "value": data["result"]}]
    return [r for r in data["result"] if isinstance(r, dict) and isinstance(r.get("metric"), dict)]


def value_of(point: Any) -> float:
    """The float of one ``[t, "v"]`` point (NaN for anything else; Prometheus writes NaN and Inf as text)."""
    try:
        return float(point[1])
    except (TypeError, ValueError, IndexError):
        return math.nan
