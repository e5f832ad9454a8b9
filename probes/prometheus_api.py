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
import base64
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypedDict

import aiohttp

from diagnose.capture.redact import Redactor, excerpt, safe_url, url_secrets
from diagnose.errors import InputError, TargetError

#: Prometheus refuses a range query of more than 11,000 points per series
MAX_POINTS = 11_000
#: an answer larger than this is refused, unread past it (a runaway selector, or a server that never stops)
MAX_RESPONSE_BYTES = 64 << 20
#: no answer (whole, body included) within this many seconds is an error
TIMEOUT_S = 30.0
#: a value beyond this is not a measurement (the bundle's records are bounded the same way)
VALUE_ABS_MAX = 1e18
ERROR_CHARS = 200  # of an error body, after redaction


class QueryLogEntry(TypedDict):
    """One API call: its path, the query (or match) asked, the answer's status, time and size."""

    path: str
    query: str
    http_status: int
    ms: float
    bytes: int


@dataclass
class QueryLog:
    """What was asked, for the bundle's provenance: one entry per API call."""

    entries: list[QueryLogEntry] = field(default_factory=list)


@dataclass
class Tally:
    """What the answers held: usable values, and those skipped (NaN or infinite, outside the quantity's
    physical range, or an entry or point of the wrong shape)."""

    usable: int = 0
    non_finite: int = 0
    out_of_range: int = 0
    malformed: int = 0

    def to_json(self) -> dict[str, int]:
        return {"non_finite": self.non_finite, "out_of_range": self.out_of_range, "malformed": self.malformed}

    @property
    def skipped(self) -> int:
        return self.non_finite + self.out_of_range + self.malformed

    def describe(self) -> str:
        """E.g. ``3 NaN or infinite, 1 outside their range, 2 malformed entries`` (the non-zero parts)."""
        parts = [f"{n} {what}" for n, what in ((self.non_finite, "NaN or infinite"),
                                                (self.out_of_range, "outside their range"),
                                                (self.malformed, "malformed entries or points")) if n]
        return ", ".join(parts)


def fmt_duration(seconds: float) -> str:
    """A PromQL duration (whole milliseconds), e.g. ``3600s`` or ``1500ms``."""
    ms = max(1, round(seconds * 1000))
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def _mib(n: int) -> str:
    return f"{n / (1 << 20):g} MiB"


class PrometheusAPI:
    """One Prometheus-compatible query endpoint. Use inside ``async with``.

    Credentials in the URL (``http://user:password@host``) are sent as Basic auth and never shown: ``url`` is
    the URL without them (and with secret-looking query values replaced), and every error message is redacted
    of them, of their Basic token and of any header value given, also where the server echoes them."""

    def __init__(self, url: str, *, timeout_s: float | None = None, headers: dict[str, str] | None = None,
                 max_bytes: int | None = None) -> None:
        from yarl import URL

        given = url.strip()
        self.redactor = Redactor([*url_secrets(given), *(headers or {}).values()])
        shown = self.redactor.text(safe_url(given.rstrip("/")))
        if not given.startswith(("http://", "https://")):
            raise InputError(f"--prometheus {shown!r}: expected http://HOST:PORT (the Prometheus server)")
        try:
            u = URL(given.rstrip("/"))
            host, port = u.host, u.port
        except (ValueError, TypeError) as e:
            raise InputError(f"--prometheus {shown!r}: {self.redactor.text(str(e))}") from None
        if not host:
            raise InputError(f"--prometheus {shown!r}: expected http://HOST:PORT (the Prometheus server)")
        if port is not None and not 1 <= port <= 65535:
            raise InputError(f"--prometheus {shown!r}: port {port} is out of range (1-65535)")
        authorization: str | None = None  # Basic credentials from the URL's userinfo, sent as a header
        if u.user is not None or u.password is not None:
            user, password = u.user or "", u.password or ""
            token = base64.b64encode(f"{user}:{password}".encode()).decode()
            authorization = f"Basic {token}"  # (aiohttp's BasicAuth and auth= are deprecated for aiohttp 4)
            self.redactor.add(f"{user}:{password}", token, u.raw_user, u.raw_password)
            u = u.with_user(None)
        self._base = u
        self.url = shown
        self.timeout_s = float(timeout_s if timeout_s is not None else TIMEOUT_S)
        self.max_bytes = int(max_bytes if max_bytes is not None else MAX_RESPONSE_BYTES)
        self.headers = dict(headers or {})
        if authorization is not None:
            self.headers["Authorization"] = authorization
        self.log = QueryLog()
        self.tally = Tally()
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
        return self._result(data, ("vector", "scalar"), promql)

    async def query_range(self, promql: str, start_s: float, end_s: float, step_s: float) -> list[dict[str, Any]]:
        """A range query: its matrix ``[{metric: {...}, values: [[t, "v"], ...]}]``. The step is raised so
        that no series has more than :data:`MAX_POINTS` points."""
        step_s = max(step_s, (end_s - start_s) / (MAX_POINTS - 1), 0.001)
        data = await self._get("/api/v1/query_range", {"query": promql, "start": _ts(start_s), "end": _ts(end_s),
                                                       "step": _ts(step_s)}, promql)
        return self._result(data, ("matrix",), promql)

    async def label_values(self, label: str, match: str, start_s: float, end_s: float) -> list[str]:
        """The values of ``label`` on the series that ``match`` selects between the two times."""
        data = await self._get(f"/api/v1/label/{label}/values",
                               {"match[]": match, "start": _ts(start_s), "end": _ts(end_s)}, match)
        if not isinstance(data, list):
            raise self._error(f"{self.url}/api/v1/label/{label}/values: expected a list of strings, got "
                              f"{type(data).__name__}")
        out = [v for v in data if isinstance(v, str)]
        self.tally.malformed += len(data) - len(out)
        return out

    # -- values ---------------------------------------------------------------------------------------
    def point(self, p: Any, scale: float = 1.0, lo: float = -VALUE_ABS_MAX, hi: float = VALUE_ABS_MAX,
              t_range: tuple[float, float] | None = None) -> tuple[float, float] | None:
        """``(t, value * scale)`` of one ``[t, "v"]`` point, or None (counted in :attr:`tally`) when it is not
        a pair of a time and a number, the time is outside ``t_range``, the value is NaN or infinite, or it
        is outside ``[lo, hi]`` (its quantity's physical range)."""
        if not isinstance(p, (list, tuple)) or len(p) != 2:
            self.tally.malformed += 1
            return None
        t, v = _number(p[0]), _number(p[1])
        if t is None or v is None or not math.isfinite(t) or (t_range and not t_range[0] <= t <= t_range[1]):
            self.tally.malformed += 1
            return None
        v *= scale
        if not math.isfinite(v):
            self.tally.non_finite += 1
            return None
        if not lo <= v <= hi or abs(v) > VALUE_ABS_MAX:
            self.tally.out_of_range += 1
            return None
        self.tally.usable += 1
        return t, v

    def points(self, entry: Mapping[str, object], **kw: Any) -> list[tuple[float, float]]:
        """The usable points of one range-query series (see :meth:`point`)."""
        values = entry.get("values")
        if not isinstance(values, list):
            self.tally.malformed += 1
            return []
        return [x for p in values if (x := self.point(p, **kw)) is not None]

    def _result(self, data: Any, types: tuple[str, ...], promql: str) -> list[dict[str, Any]]:
        if not isinstance(data, dict) or data.get("resultType") not in types or not isinstance(data.get("result"),
                                                                                               list):
            got = data.get("resultType") if isinstance(data, dict) else type(data).__name__
            got = excerpt(str(got), 40)
            raise self._error(f"{self.url}: query {promql!r} gave {got!r} with a result of the wrong shape, "
                              f"expected {' or '.join(types)}")
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        out = []
        for r in data["result"]:
            m = r.get("metric") if isinstance(r, dict) else None
            if isinstance(m, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in m.items()):
                out.append(r)
            else:
                self.tally.malformed += 1
        return out

    # -- transport ------------------------------------------------------------------------------------
    def _error(self, msg: str) -> TargetError:
        return TargetError(self.redactor.text(msg))

    async def _get(self, path: str, params: dict[str, str], what: str) -> Any:
        if self._session is None:
            raise RuntimeError("PrometheusAPI used outside `async with`")
        where = f"{self.url.split('?', 1)[0].rstrip('/')}{path}"
        target = self._base.with_path(self._base.path.rstrip("/") + path)
        t0 = time.monotonic()
        try:
            async with self._session.get(target, params=params,
                                         timeout=aiohttp.ClientTimeout(total=self.timeout_s)) as r:
                status = r.status
                if r.content_length is not None and r.content_length > self.max_bytes:
                    raise self._too_big(where, status, f"it declares {r.content_length} bytes")
                buf = bytearray()
                async for chunk in r.content.iter_chunked(1 << 16):
                    buf += chunk
                    if len(buf) > self.max_bytes:
                        raise self._too_big(where, status, "reading stopped there")
                body = buf  # parsed as it is: no copy of up to max_bytes
        except asyncio.TimeoutError:  # aiohttp's connect and read timeouts are TimeoutErrors too
            raise self._error(f"{where}: no answer within {self.timeout_s:g} s (query "
                              f"{excerpt(what, ERROR_CHARS)})") from None
        except aiohttp.ClientConnectorError as e:
            raise self._unreachable(e) from None
        except aiohttp.ClientError as e:
            raise self._error(f"cannot talk to Prometheus at {self.url}: {type(e).__name__}: {e}") from None
        except ValueError as e:  # a malformed URL
            raise self._error(f"--prometheus {self.url!r}: {e}") from None
        self.log.entries.append({"path": path, "query": what, "http_status": status,
                                 "ms": round((time.monotonic() - t0) * 1e3, 2), "bytes": len(body)})
        payload = _json(body)
        if status >= 400 or payload is None or payload.get("status") != "success":
            err = ""
            if payload is not None:
                err = f"{payload.get('errorType') or 'error'}: {payload.get('error') or '(no error text)'}"
            elif body:
                err = "the answer is not the query API's JSON: " + body[:4096].decode("utf-8", "replace")
            err = excerpt(self.redactor.text(err), ERROR_CHARS) if err else ""
            raise self._error(f"{where} answered HTTP {status}" + (f": {err}" if err else "")
                              + (f" (query {excerpt(what, ERROR_CHARS)})" if what else ""))
        return payload.get("data")

    def _unreachable(self, e: aiohttp.ClientConnectorError) -> TargetError:
        os_err = getattr(e, "os_error", None)
        why = ("connection refused (is Prometheus running and listening there?)"
               if isinstance(os_err, ConnectionRefusedError) else str(getattr(os_err, "strerror", None) or e))
        return self._error(f"cannot reach Prometheus at {self.url}: {why}")

    def _too_big(self, where: str, status: int, how: str) -> TargetError:
        return self._error(f"{where} answered HTTP {status}: the answer is larger than {_mib(self.max_bytes)} "
                           f"({how}): narrow --selector or shorten --since")


def _number(x: Any) -> float | None:
    """A JSON number or a numeric string (Prometheus writes values, NaN and Inf as text) as a float; None for
    anything else."""
    if isinstance(x, bool):
        return None
    if isinstance(x, (int, float)):
        return float(x)
    if isinstance(x, str) and len(x) < 64:
        try:
            return float(x)
        except ValueError:
            return None
    return None


def _ts(x: float) -> str:
    return f"{x:.3f}"


def _json(body: bytes | bytearray) -> dict[str, Any] | None:
    import orjson

    try:
        v = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return v if isinstance(v, dict) else None
