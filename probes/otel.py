"""OTLP trace receiver on loopback: the engine's own request spans, stored to the ``spans`` stream.

The engine exports to us because the user starts it with ``--otlp-traces-endpoint`` pointing here:
gRPC on 127.0.0.1:4317 and OTLP/HTTP on 127.0.0.1:4318 (``POST /v1/traces``, protobuf or JSON, optionally
gzip or deflate) by default, the standard OTLP ports, so a vLLM started with
``--otlp-traces-endpoint http://127.0.0.1:4317`` needs nothing else. Both ports are configurable
(0 = any free port; the bound ports are in the probe status and ``ctx.shared["otel_receiver"]``).

Garbage sent to either endpoint is rejected (HTTP 400 / gRPC INVALID_ARGUMENT), counted in the status and
never stops the receiver. The gRPC server runs in its own threads and HTTP decoding runs in a worker
thread, so the load client's event loop is not held up by span decoding.

When the capture stops, the receiver keeps listening for up to ``drain_s`` seconds (engines batch their
exports: vLLM's BatchSpanProcessor sends every 5 s) and ends early once every successful request of the
bundle's ``requests`` stream has its server span.
"""

from __future__ import annotations

import asyncio
import threading
import time
import zlib
from concurrent import futures
from pathlib import Path
from typing import Any

import orjson

from diagnose.capture.overhead import cost, is_local
from diagnose.io.otlp import OtlpDecodeError, decode_request, parse_json, parse_protobuf
from diagnose.model import ProbeStatus
from diagnose.probes.base import CaptureContext, Options, ProbeOption, ProbeSetup, ProbeSpec

DEFAULT_GRPC_PORT = 4317
DEFAULT_HTTP_PORT = 4318
MAX_BODY_BYTES = 64 * 1024 * 1024
_GRPC_SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"


class _Counters:
    """Thread-safe tallies shared by the gRPC threads and the HTTP handler."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.spans = 0
        self.exports = {"grpc": 0, "http": 0}
        self.rejected = {"grpc": 0, "http": 0}
        self.invalid_spans = 0
        self.text_attributes_dropped = 0
        self.last_errors: list[str] = []
        self.trace_ids: set[str] = set()
        self.first_span_mono_ns: int | None = None
        self.ingest_cpu_s = 0.0  # CPU decoding and writing the exports (the handlers' thread time: probe cost)

    def reject(self, transport: str, why: str) -> None:
        with self.lock:
            self.rejected[transport] += 1
            self.last_errors = (self.last_errors + [f"{transport}: {why}"])[-5:]


class OtlpReceiverProbe:
    """Probe "otel": an OTLP/gRPC + OTLP/HTTP trace receiver bound to loopback."""

    name = "otel"

    def __init__(self, grpc_port: int | None = DEFAULT_GRPC_PORT, http_port: int | None = DEFAULT_HTTP_PORT,
                 *, host: str = "127.0.0.1", drain_s: float = 7.0, keep_text: bool = False) -> None:
        if grpc_port is None and http_port is None:
            raise ValueError("the OTLP receiver needs a gRPC port, an HTTP port, or both")
        self.grpc_port = grpc_port
        self.http_port = http_port
        self.host = host
        self.drain_s = drain_s
        self.keep_text = keep_text
        self.counters = _Counters()
        self.bound: dict[str, int] = {}
        self._ctx: CaptureContext | None = None
        self._started = time.monotonic()

    def available(self, ctx: CaptureContext) -> tuple[bool, str]:
        try:
            import grpc  # noqa: F401
        except ImportError as e:  # pragma: no cover - grpcio is a dependency
            return False, f"grpcio is not installed ({e})"
        return True, ""

    # -- ingest ------------------------------------------------------------------------------------
    def _ingest(self, body: bytes, transport: str, encoding: str) -> None:
        """Decode one export and store its spans; raises OtlpDecodeError for garbage."""
        c0 = time.thread_time()
        try:
            self._ingest_now(body, transport, encoding)
        finally:
            with self.counters.lock:
                self.counters.ingest_cpu_s += time.thread_time() - c0

    def _ingest_now(self, body: bytes, transport: str, encoding: str) -> None:
        assert self._ctx is not None
        req = parse_json(body) if encoding == "json" else parse_protobuf(body)
        spans, invalid, dropped = decode_request(req, source=f"{transport}-{encoding}", keep_text=self.keep_text)
        if invalid and not spans:
            raise OtlpDecodeError(f"{invalid} span(s) with invalid trace/span ids")
        now = time.monotonic_ns()
        for s in spans:
            s["received_mono_ns"] = now
        self._ctx.bundle.stream("spans", "OpenTelemetry spans received from the engine").write_many(spans)
        c = self.counters
        with c.lock:
            c.spans += len(spans)
            c.exports[transport] += 1
            c.invalid_spans += invalid
            c.text_attributes_dropped += dropped
            c.trace_ids.update(s["trace_id"] for s in spans)
            if spans and c.first_span_mono_ns is None:
                c.first_span_mono_ns = now

    # -- gRPC --------------------------------------------------------------------------------------
    def _start_grpc(self) -> Any:
        import grpc
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

        ok_reply = ExportTraceServiceResponse().SerializeToString()

        def export(body: bytes, context: grpc.ServicerContext) -> bytes:
            try:
                self._ingest(body, "grpc", "protobuf")
            except OtlpDecodeError as e:
                self.counters.reject("grpc", str(e))
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
            return ok_reply

        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="diagnose-otlp"),
                             options=[("grpc.max_receive_message_length", MAX_BODY_BYTES),
                                      ("grpc.so_reuseport", 0)])
        handler = grpc.method_handlers_generic_handler(
            _GRPC_SERVICE, {"Export": grpc.unary_unary_rpc_method_handler(export)})
        server.add_generic_rpc_handlers((handler,))
        try:
            port = server.add_insecure_port(f"{self.host}:{self.grpc_port}")
        except RuntimeError:
            port = 0
        if not port:
            server.stop(None)
            raise OSError(f"cannot listen on {self.host}:{self.grpc_port} for OTLP/gRPC (port in use?)")
        server.start()
        self.bound["grpc"] = port
        return server

    # -- HTTP --------------------------------------------------------------------------------------
    async def _start_http(self) -> Any:
        from aiohttp import web
        from aiohttp.web_protocol import RequestPayloadError
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

        async def traces(request: web.Request) -> web.Response:
            ctype = (request.content_type or "").lower()
            encoding = "json" if "json" in ctype else "protobuf" if "protobuf" in ctype else ""
            if not encoding:
                self.counters.reject("http", f"unsupported content type {ctype!r}")
                return web.Response(status=415, text="use application/x-protobuf or application/json\n")
            try:
                body = await request.read()
                ce = request.headers.get("Content-Encoding", "identity").lower().strip()
                if ce in ("gzip", "deflate"):
                    body = await asyncio.to_thread(_decompress, body, ce)
                elif ce != "identity":
                    raise OtlpDecodeError(f"unsupported Content-Encoding {ce!r}")
                await asyncio.to_thread(self._ingest, body, "http", encoding)
            except OtlpDecodeError as e:
                self.counters.reject("http", str(e))
                return web.Response(status=400, text=f"rejected: {e}\n")
            except RequestPayloadError as e:
                self.counters.reject("http", f"unreadable body ({str(e).strip()[:120]})")
                return web.Response(status=400, text="rejected: unreadable body\n")
            except web.HTTPRequestEntityTooLarge:
                self.counters.reject("http", "body too large")
                raise
            if encoding == "json":
                return web.Response(body=b"{}", content_type="application/json")
            return web.Response(body=ExportTraceServiceResponse().SerializeToString(),
                                content_type="application/x-protobuf")

        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_post("/v1/traces", traces)
        runner = web.AppRunner(app, access_log=None, auto_decompress=False)  # we decompress, bounded
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.http_port, reuse_address=True)
        try:
            await site.start()
        except OSError as e:
            await runner.cleanup()
            raise OSError(f"cannot listen on {self.host}:{self.http_port} for OTLP/HTTP ({e.strerror or e})") from e
        server = getattr(site, "_server", None)
        sockets = getattr(server, "sockets", None) or []
        self.bound["http"] = int(sockets[0].getsockname()[1]) if sockets else int(self.http_port or 0)
        return runner

    # -- lifecycle ---------------------------------------------------------------------------------
    def endpoints(self) -> dict[str, str]:
        out = {}
        if "grpc" in self.bound:
            out["grpc"] = f"http://{self.host}:{self.bound['grpc']}"
        if "http" in self.bound:
            out["http"] = f"http://{self.host}:{self.bound['http']}/v1/traces"
        return out

    async def run(self, ctx: CaptureContext) -> ProbeStatus:
        self._ctx = ctx
        self._started = time.monotonic()
        problems: list[str] = []
        grpc_server: Any = None
        http_runner: Any = None
        if self.grpc_port is not None:
            try:
                grpc_server = await asyncio.to_thread(self._start_grpc)
            except OSError as e:
                problems.append(str(e))
        if self.http_port is not None:
            try:
                http_runner = await self._start_http()
            except OSError as e:
                problems.append(str(e))
        if grpc_server is None and http_runner is None:
            return ProbeStatus(self.name, "failed", "; ".join(problems), {"ports_wanted": self._wanted()})
        ctx.shared["otel_receiver"] = self.endpoints()
        try:
            await ctx.stop.wait()
            await self._drain(ctx)
        finally:
            if http_runner is not None:
                await http_runner.cleanup()
            if grpc_server is not None:
                await asyncio.to_thread(lambda: grpc_server.stop(0.5).wait(2.0))
        return self._status(ctx, problems)

    def _wanted(self) -> dict[str, int | None]:
        return {"grpc": self.grpc_port, "http": self.http_port}

    async def _drain(self, ctx: CaptureContext) -> None:
        """Wait for late spans: until every successful request has its span, or ``drain_s`` passes."""
        # No early exit when nothing has arrived yet: an engine whose exporter was failing (it started before
        # this receiver listened and is still in its retry back-off) sends its first batch late, and every
        # span that comes after the receiver closes is lost for good. At most drain_s more.
        deadline = time.monotonic() + self.drain_s
        while time.monotonic() < deadline:
            expected = await asyncio.to_thread(expected_trace_ids, ctx.bundle.path)
            if expected:
                with self.counters.lock:
                    missing = len(expected - self.counters.trace_ids)
                if missing == 0:
                    return
            await asyncio.sleep(0.25)

    def _status(self, ctx: CaptureContext, problems: list[str]) -> ProbeStatus:
        c = self.counters
        expected = expected_trace_ids(ctx.bundle.path)
        with c.lock:
            detail: dict[str, Any] = {
                "ports": dict(self.bound), "endpoints": self.endpoints(), "spans": c.spans,
                "exports": dict(c.exports), "rejected": dict(c.rejected), "invalid_spans": c.invalid_spans,
                "text_attributes_dropped": c.text_attributes_dropped, "last_errors": list(c.last_errors),
                "requests_expected": len(expected), "requests_with_spans": len(expected & c.trace_ids),
            }
            own = c.ingest_cpu_s
        window = time.monotonic() - self._started
        detail["cost"] = cost(0.0, own, window, is_local(ctx.target.url),
                              "own: decoding and writing the exports (handler thread CPU); the engine's own span "
                              "export is its tracing's cost, not counted (docs/probe-cost.md)",
                              cpu_us_per_span=round(own * 1e6 / c.spans, 1) if c.spans else None)
        notes = list(problems)
        if sum(detail["rejected"].values()):
            notes.append(f"rejected {sum(detail['rejected'].values())} malformed export(s)")
        if c.spans == 0:
            ep = self.endpoints()
            notes.append("no spans received: start the engine with --otlp-traces-endpoint "
                         f"{ep.get('grpc') or ep.get('http')}"
                         + (" (and OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf)" if "grpc" not in ep else ""))
        return ProbeStatus(self.name, "ok", "; ".join(notes), detail)


def _decompress(body: bytes, encoding: str) -> bytes:
    """gzip/deflate body, bounded to MAX_BODY_BYTES (a decompression bomb is rejected, not expanded)."""
    wbits = 16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS
    try:
        d = zlib.decompressobj(wbits)
        out = d.decompress(body, MAX_BODY_BYTES)
    except zlib.error as e:
        raise OtlpDecodeError(f"bad {encoding} body ({e})") from None
    if d.unconsumed_tail:
        raise OtlpDecodeError(f"{encoding} body expands beyond {MAX_BODY_BYTES} bytes")
    return out


def expected_trace_ids(bundle_path: Path) -> set[str]:
    """Trace ids of the successful requests recorded so far in the bundle's ``requests`` stream."""
    p = Path(bundle_path) / "requests.jsonl"
    out: set[str] = set()
    try:
        with open(p, "rb") as fh:
            for line in fh:
                try:
                    rec = orjson.loads(line)
                except orjson.JSONDecodeError:
                    continue
                if isinstance(rec, dict) and rec.get("ok") and rec.get("trace_id"):
                    out.add(str(rec["trace_id"]))
    except OSError:
        pass
    return out


# -- attach options -------------------------------------------------------------------------------------
def _build(o: Options, setup: ProbeSetup) -> OtlpReceiverProbe:
    return OtlpReceiverProbe(grpc_port=o["otlp_grpc_port"], http_port=o["otlp_http_port"])


SPEC = ProbeSpec(
    name="otel", title="Engine spans (OTLP receiver)",
    enabled=lambda o: bool(o["otlp"]), build=_build,
    options=(
        ProbeOption("--otlp", flag=True,
                    help="Run an OTLP receiver (start the engine with --otlp-traces-endpoint pointing at it)."),
        ProbeOption("--otlp-grpc-port", type=int, default=DEFAULT_GRPC_PORT, show_default=True),
        ProbeOption("--otlp-http-port", type=int, default=DEFAULT_HTTP_PORT, show_default=True),
    ),
)
