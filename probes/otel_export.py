"""``--otlp-export URL``: send one client span per request to the user's own OTLP collector.

Each span reuses the trace id and span id the load probe put in that request's W3C ``traceparent`` header,
so in the user's tracing backend the engine's ``llm_request`` span (which honours the header) appears as
the child of diagnose's client span. The probe tails the bundle's ``requests`` stream while the capture
runs and exports in batches with the OpenTelemetry SDK's OTLP exporter (no prompt or output text).

Protocol: a URL whose path ends in ``/v1/traces`` (or with no path: ``/v1/traces`` is added) is OTLP/HTTP
protobuf; ``grpc://host:port`` or a URL on port 4317 is OTLP/gRPC. Pass ``protocol`` to force one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import orjson

from diagnose import __version__
from diagnose.errors import InputError
from diagnose.model import ProbeStatus
from diagnose.probes.base import CaptureContext, Options, ProbeOption, ProbeSetup, ProbeSpec

SPAN_NAME = {"chat": "POST /v1/chat/completions", "completions": "POST /v1/completions"}


def resolve_endpoint(url: str, protocol: str | None = None) -> tuple[str, str]:
    """(protocol "http" | "grpc", endpoint for that exporter) from the user's URL."""
    u = urlparse(url)
    if not u.scheme or not u.netloc:
        raise ValueError(f"--otlp-export {url!r} is not a URL (for example http://127.0.0.1:4318/v1/traces)")
    proto = protocol or ("grpc" if u.scheme == "grpc" or (u.port == 4317 and u.path in ("", "/")) else "http")
    if proto == "grpc":
        scheme = "https" if u.scheme == "https" else "http"
        return "grpc", f"{scheme}://{u.netloc}"
    path = u.path if u.path not in ("", "/") else "/v1/traces"
    return "http", f"{u.scheme}://{u.netloc}{path}"


class RequestTail:
    """Reads the records appended to a JSON-lines file since the last call (whole lines only)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def read(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
        except OSError:
            return []
        end = data.rfind(b"\n") + 1
        self.offset += end
        out = []
        for line in data[:end].splitlines():
            try:
                rec = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if isinstance(rec, dict):
                out.append(rec)
        return out


def client_span(rec: dict[str, Any], *, anchor_unix_ns: int, anchor_mono_ns: int, resource: Any,
                scope: Any) -> Any | None:
    """A ReadableSpan for one request record, or None when it has no usable ids/times."""
    from opentelemetry.sdk.trace import Event, ReadableSpan
    from opentelemetry.trace import SpanContext, SpanKind, TraceFlags
    from opentelemetry.trace.status import Status, StatusCode

    try:
        trace_id, span_id = int(rec["trace_id"], 16), int(rec["span_id"], 16)
        sent, end = int(rec["sent_ns"]), int(rec["end_ns"])
    except (KeyError, TypeError, ValueError):
        return None

    def unix(mono: int) -> int:
        return anchor_unix_ns + (mono - anchor_mono_ns)

    attrs: dict[str, str | int | float | bool] = {"diagnose.rid": str(rec.get("rid")), "diagnose.phase": int(rec.get("phase") or 0),
                             "diagnose.warmup": bool(rec.get("warmup")), "http.request.method": "POST"}
    for key, attr in (("http_status", "http.response.status_code"), ("max_tokens", "gen_ai.request.max_tokens"),
                      ("prompt_tokens", "gen_ai.usage.prompt_tokens"),
                      ("output_tokens_usage", "gen_ai.usage.completion_tokens")):
        if isinstance(rec.get(key), int):
            attrs[attr] = rec[key]
    events = []
    first = rec.get("first_token_ns")
    if isinstance(first, int):
        attrs["diagnose.ttft_ms"] = (first - sent) / 1e6
        events.append(Event("first_token", timestamp=unix(first)))
    status = Status(StatusCode.UNSET)
    if not rec.get("ok", False):
        attrs["error.type"] = str(rec.get("error") or "error")
        status = Status(StatusCode.ERROR, str(rec.get("error") or ""))
    ctx = SpanContext(trace_id=trace_id, span_id=span_id, is_remote=False, trace_flags=TraceFlags(1))
    return ReadableSpan(name=SPAN_NAME.get(str(rec.get("api")), "POST /v1/completions"), context=ctx, parent=None,
                        resource=resource, attributes=attrs, events=events, kind=SpanKind.CLIENT,
                        instrumentation_scope=scope, status=status, start_time=unix(sent), end_time=unix(end))


class OtlpExportProbe:
    """Probe "otel_export": client spans for every request, exported to ``endpoint`` as the capture runs."""

    name = "otel_export"

    def __init__(self, endpoint: str, *, protocol: str | None = None, service_name: str = "diagnose-client",
                 interval_s: float = 2.0, timeout_s: float = 2.0, connect_timeout_s: float = 1.0) -> None:
        self.protocol, self.endpoint = resolve_endpoint(endpoint, protocol)
        self.service_name = service_name
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.exported = 0
        self.failed = 0
        self.skipped = 0
        self.batches_failed = 0
        self.connect_timeout_s = connect_timeout_s
        self.dead = ""  # why the collector is given up on (the first failure): later batches are not sent

    def available(self, ctx: CaptureContext) -> tuple[bool, str]:
        return True, ""

    def _exporter(self) -> Any:
        if self.protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

            return GrpcExporter(endpoint=self.endpoint, insecure=self.endpoint.startswith("http://"),
                                timeout=self.timeout_s)
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

        return HttpExporter(endpoint=self.endpoint, timeout=self.timeout_s)

    def _export(self, exporter: Any, records: list[dict[str, Any]], ctx: CaptureContext, resource: Any,
                scope: Any) -> None:
        from opentelemetry.sdk.trace.export import SpanExportResult

        spans = [client_span(r, anchor_unix_ns=ctx.bundle.anchor_unix_ns, anchor_mono_ns=ctx.bundle.anchor_mono_ns,
                             resource=resource, scope=scope) for r in records]
        good = [s for s in spans if s is not None]
        self.skipped += len(spans) - len(good)
        if not good:
            return
        if self.dead:  # one failed batch costs up to the timeout: the rest are counted, not sent
            self.failed += len(good)
            return
        if exporter.export(good) == SpanExportResult.SUCCESS:
            self.exported += len(good)
        else:
            self.failed += len(good)
            self.batches_failed += 1
            self.dead = f"a batch of {len(good)} span(s) was refused or timed out after {self.timeout_s:g} s"

    async def _reachable(self) -> str:
        """'' when the collector accepts a TCP connection within ``connect_timeout_s``, else why not."""
        from yarl import URL

        u = URL(self.endpoint)
        host, port = u.host or "", u.port or (443 if u.scheme == "https" else 80)
        try:
            _, w = await asyncio.wait_for(asyncio.open_connection(host, port), self.connect_timeout_s)
        except asyncio.TimeoutError:
            return f"no answer from {host}:{port} within {self.connect_timeout_s:g} s"
        except OSError as e:
            return f"cannot connect to {host}:{port} ({e.strerror or e})"
        w.close()
        with contextlib.suppress(OSError):
            await w.wait_closed()
        return ""

    async def run(self, ctx: CaptureContext) -> ProbeStatus:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope

        resource = Resource.create({"service.name": self.service_name, "diagnose.version": __version__,
                                    "diagnose.target": ctx.target.safe_url})
        scope = InstrumentationScope("diagnose.load", __version__)
        detail: dict[str, str | int] = {"endpoint": self.endpoint, "protocol": self.protocol}
        why = await self._reachable()
        if why:  # a dead collector: counted span by span as usual, but nothing is sent (no retries, no wait)
            self.dead = f"collector unreachable: {why}"
        # the exporter logs every retry and failure itself: the probe's status says it once instead
        otel_log = logging.getLogger("opentelemetry")
        saved = (otel_log.level, otel_log.propagate)
        otel_log.setLevel(logging.CRITICAL + 1)
        otel_log.propagate = False
        try:
            return await self._run(ctx, resource, scope, detail)
        finally:
            otel_log.setLevel(saved[0])
            otel_log.propagate = saved[1]

    async def _run(self, ctx: CaptureContext, resource: Any, scope: Any, detail: dict[str, str | int]) -> ProbeStatus:
        exporter = None if self.dead else await asyncio.to_thread(self._exporter)
        tail = RequestTail(ctx.bundle.path / "requests.jsonl")
        try:
            while not ctx.stop.is_set():
                try:
                    await asyncio.wait_for(ctx.stop.wait(), self.interval_s)
                except asyncio.TimeoutError:
                    pass
                await self._step(exporter, tail, ctx, resource, scope)
            # the load probe writes its last records as it stops: read until the file is quiet
            quiet_since = time.monotonic()
            deadline = quiet_since + 5.0
            while time.monotonic() < deadline and time.monotonic() - quiet_since < 1.0:
                await asyncio.sleep(0.25)
                if await self._step(exporter, tail, ctx, resource, scope):
                    quiet_since = time.monotonic()
        finally:
            if exporter is not None:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(asyncio.to_thread(exporter.shutdown), self.timeout_s + 1.0)
        detail.update({"exported": self.exported, "failed": self.failed, "skipped_without_ids": self.skipped})
        if self.dead:
            detail["gave_up"] = self.dead
        if self.failed and not self.exported:
            return ProbeStatus(self.name, "failed", f"could not export client spans to {self.endpoint} "
                               f"({self.failed} span(s) not exported: {self.dead or 'refused or unreachable'})",
                               detail)
        reason = (f"{self.failed} span(s) could not be exported ({self.dead})" if self.failed else "")
        return ProbeStatus(self.name, "ok", reason, detail)

    async def _step(self, exporter: Any, tail: RequestTail, ctx: CaptureContext, resource: Any,
                    scope: Any) -> int:
        records = await asyncio.to_thread(tail.read)
        if records:
            await asyncio.to_thread(self._export, exporter, records, ctx, resource, scope)
        return len(records)


# -- attach options -------------------------------------------------------------------------------------
def _build(o: Options, setup: ProbeSetup) -> OtlpExportProbe:
    try:
        return OtlpExportProbe(endpoint=o["otlp_export"])
    except ValueError as e:  # not a URL
        raise InputError(str(e)) from None


SPEC = ProbeSpec(
    name="otel_export", title="Client spans (OTLP export)",
    enabled=lambda o: bool(o["otlp_export"]), build=_build,
    options=(
        ProbeOption("--otlp-export", metavar="URL",
                    help="Also export one client span per request to this OTLP/HTTP collector."),
    ),
)
