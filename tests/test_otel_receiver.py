"""The OTLP receiver probe: real OpenTelemetry SDK exporters (gRPC and HTTP) send to it over loopback."""

from __future__ import annotations

import asyncio
import gzip
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import orjson
import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind

from diagnose.io.bundle import open_bundle
from diagnose.io.writer import BundleWriter
from diagnose.model import ProbeStatus
from diagnose.probes.base import CaptureContext, Target
from diagnose.probes.otel import OtlpReceiverProbe, expected_trace_ids


def _ctx(tmp_path: Path) -> CaptureContext:
    bw = BundleWriter(tmp_path / "b", target={"url": "http://127.0.0.1:1"})
    return CaptureContext(bundle=bw, target=Target(url="http://127.0.0.1:1"), stop=asyncio.Event())


async def _with_receiver(tmp_path: Path, body: Callable[[OtlpReceiverProbe, CaptureContext], Awaitable[Any]],
                         **kw: Any) -> tuple[ProbeStatus, Any, CaptureContext]:
    ctx = _ctx(tmp_path)
    probe = OtlpReceiverProbe(grpc_port=kw.pop("grpc_port", 0), http_port=kw.pop("http_port", 0),
                              drain_s=kw.pop("drain_s", 0.5), **kw)
    task = asyncio.create_task(probe.run(ctx))
    for _ in range(200):
        if "otel_receiver" in ctx.shared or task.done():
            break
        await asyncio.sleep(0.01)
    result = None if task.done() else await body(probe, ctx)
    ctx.stop.set()
    status = await asyncio.wait_for(task, 20)
    ctx.bundle.finish()
    return status, result, ctx


def _emit(exporter: Any, n: int) -> list[tuple[str, str]]:
    provider = TracerProvider(resource=Resource.create({"service.name": "vllm-test"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    ids = []
    for i in range(n):
        with tracer.start_as_current_span("llm_request", kind=SpanKind.SERVER) as sp:
            sp.set_attribute("gen_ai.latency.time_in_queue", 0.01 * i)
            sp.set_attribute("gen_ai.usage.prompt_tokens", 100 + i)
            sp.set_attribute("gen_ai.prompt", "secret prompt text")
            ctx = sp.get_span_context()
            ids.append((f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}"))
    provider.shutdown()
    return ids


def test_grpc_and_http_exports_are_stored_normalised(tmp_path: Path) -> None:
    async def body(probe: OtlpReceiverProbe, ctx: CaptureContext) -> list[tuple[str, str]]:
        ep = ctx.shared["otel_receiver"]
        a = await asyncio.to_thread(_emit, GrpcExporter(endpoint=ep["grpc"], insecure=True), 3)
        b = await asyncio.to_thread(_emit, HttpExporter(endpoint=ep["http"]), 2)
        return a + b

    status, ids, ctx = asyncio.run(_with_receiver(tmp_path, body))
    assert status.state == "ok", status
    assert status.detail["spans"] == 5
    assert status.detail["exports"]["grpc"] == 3 and status.detail["exports"]["http"] == 2
    spans = open_bundle(ctx.bundle.path).records("spans")
    assert sorted((s["trace_id"], s["span_id"]) for s in spans) == sorted(ids)
    s0 = next(s for s in spans if s["source"] == "grpc-protobuf")
    assert s0["name"] == "llm_request" and s0["kind"] == "SERVER"
    assert s0["resource"]["service.name"] == "vllm-test"
    assert isinstance(s0["attributes"]["gen_ai.usage.prompt_tokens"], int)
    assert s0["end_unix_ns"] >= s0["start_unix_ns"] > 1_600_000_000 * 10**9
    # prompt text never reaches the disk
    assert all("gen_ai.prompt" not in s["attributes"] for s in spans)
    assert b"secret prompt text" not in (ctx.bundle.path / "spans.jsonl").read_bytes()
    assert status.detail["text_attributes_dropped"] == 5


def _otlp_json(trace_hex: str, span_hex: str) -> dict[str, Any]:
    return {"resourceSpans": [{
        "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "eng"}}]},
        "scopeSpans": [{"scope": {"name": "vllm"}, "spans": [{
            "traceId": trace_hex, "spanId": span_hex, "parentSpanId": "00f067aa0ba902b7",
            "name": "llm_request", "kind": 2,
            "startTimeUnixNano": "1700000000000000000", "endTimeUnixNano": "1700000000500000000",
            "attributes": [{"key": "gen_ai.latency.e2e", "value": {"doubleValue": 0.5}},
                           {"key": "gen_ai.usage.completion_tokens", "value": {"intValue": "64"}}]}]}]}]}


def test_http_json_and_gzip_protobuf_and_garbage(tmp_path: Path) -> None:
    trace_hex, span_hex = "4bf92f3577b34da6a3ce929d0e0e4736", "a3ce929d0e0e4736"

    async def body(probe: OtlpReceiverProbe, ctx: CaptureContext) -> dict[str, int]:
        url = ctx.shared["otel_receiver"]["http"]
        codes: dict[str, int] = {}
        async with aiohttp.ClientSession() as s:
            async def post(key: str, data: bytes, ctype: str, **headers: str) -> None:
                async with s.post(url, data=data, headers={"Content-Type": ctype, **headers}) as r:
                    codes[key] = r.status
            await post("json", orjson.dumps(_otlp_json(trace_hex, span_hex)), "application/json")
            await post("garbage_pb", b"\xff\xfe\x00garbage" * 10, "application/x-protobuf")
            await post("garbage_json", b"{not json", "application/json")
            await post("wrong_shape", b"[1,2,3]", "application/json")
            await post("bad_ids", orjson.dumps(_otlp_json("zz" * 16, span_hex)), "application/json")
            await post("bad_gzip", b"not gzip", "application/x-protobuf", **{"Content-Encoding": "gzip"})
            await post("ctype", b"hello", "text/plain")
            from google.protobuf import json_format
            from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

            from diagnose.io.otlp import _fix_ids
            req = ExportTraceServiceRequest()
            json_format.ParseDict(_fix_ids(_otlp_json("11" * 16, "22" * 8)), req)
            await post("gzip_pb", gzip.compress(req.SerializeToString()), "application/x-protobuf",
                       **{"Content-Encoding": "gzip"})
        return codes

    status, codes, ctx = asyncio.run(_with_receiver(tmp_path, body))
    assert codes == {"json": 200, "garbage_pb": 400, "garbage_json": 400, "wrong_shape": 400, "bad_ids": 400,
                     "bad_gzip": 400, "ctype": 415, "gzip_pb": 200}
    assert status.state == "ok"
    assert status.detail["rejected"]["http"] == 6
    assert "rejected 6 malformed export(s)" in status.reason
    spans = open_bundle(ctx.bundle.path).records("spans")
    by_id = {s["trace_id"]: s for s in spans}
    assert set(by_id) == {trace_hex, "11" * 16}
    s = by_id[trace_hex]
    assert s["span_id"] == span_hex and s["parent_span_id"] == "00f067aa0ba902b7"
    assert s["attributes"] == {"gen_ai.latency.e2e": 0.5, "gen_ai.usage.completion_tokens": 64}
    assert s["end_unix_ns"] - s["start_unix_ns"] == 500_000_000
    assert s["source"] == "http-json" and by_id["11" * 16]["source"] == "http-protobuf"


def test_grpc_garbage_is_invalid_argument_and_receiver_keeps_working(tmp_path: Path) -> None:
    async def body(probe: OtlpReceiverProbe, ctx: CaptureContext) -> tuple[Any, int]:
        target = ctx.shared["otel_receiver"]["grpc"].removeprefix("http://")

        def call() -> Any:
            with grpc.insecure_channel(target) as ch:
                fn = ch.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export")
                try:
                    fn(b"\xff\xff\xff\xffgarbage", timeout=5)
                except grpc.RpcError as e:
                    return e.code()
            return None

        code = await asyncio.to_thread(call)
        ids = await asyncio.to_thread(_emit, GrpcExporter(endpoint=ctx.shared["otel_receiver"]["grpc"],
                                                          insecure=True), 1)
        return code, len(ids)

    status, (code, n), ctx = asyncio.run(_with_receiver(tmp_path, body))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert status.detail["rejected"]["grpc"] == 1
    assert status.detail["spans"] == n == 1


def test_port_in_use_fails_that_transport_only(tmp_path: Path) -> None:
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen()
    busy = blocker.getsockname()[1]
    try:
        async def body(probe: OtlpReceiverProbe, ctx: CaptureContext) -> dict[str, str]:
            return dict(ctx.shared["otel_receiver"])

        status, eps, _ = asyncio.run(_with_receiver(tmp_path, body, http_port=busy))
        assert status.state == "ok"
        assert set(eps) == {"grpc"}
        assert f"127.0.0.1:{busy}" in status.reason and "OTLP/HTTP" in status.reason

        status2, _, _ = asyncio.run(_with_receiver(tmp_path / "2", body, http_port=busy, grpc_port=busy))
        assert status2.state == "failed"
        assert "OTLP/gRPC" in status2.reason and "OTLP/HTTP" in status2.reason
    finally:
        blocker.close()


def test_no_spans_reason_names_the_engine_flag(tmp_path: Path) -> None:
    async def body(probe: OtlpReceiverProbe, ctx: CaptureContext) -> None:
        return None

    status, _, _ = asyncio.run(_with_receiver(tmp_path, body))
    assert status.state == "ok" and status.detail["spans"] == 0
    assert "--otlp-traces-endpoint http://127.0.0.1:" in status.reason


def test_drain_ends_when_every_request_has_its_span(tmp_path: Path) -> None:
    trace_hex = "ab" * 16

    async def body(probe: OtlpReceiverProbe, ctx: CaptureContext) -> float:
        ctx.bundle.stream("requests").write({"rid": 0, "ok": True, "trace_id": trace_hex})
        ctx.bundle.stream("requests").write({"rid": 1, "ok": False, "trace_id": "cd" * 16})
        assert expected_trace_ids(ctx.bundle.path) == {trace_hex}

        async def late() -> None:
            await asyncio.sleep(0.6)
            async with aiohttp.ClientSession() as s:
                await s.post(ctx.shared["otel_receiver"]["http"], data=orjson.dumps(_otlp_json(trace_hex, "01" * 8)),
                             headers={"Content-Type": "application/json"})
        asyncio.get_running_loop().create_task(late())
        return asyncio.get_running_loop().time()

    async def main() -> tuple[ProbeStatus, float]:
        status, started, _ = await _with_receiver(tmp_path, body, drain_s=10.0)
        return status, asyncio.get_running_loop().time() - started

    status, elapsed = asyncio.run(main())
    assert status.detail["requests_expected"] == 1 and status.detail["requests_with_spans"] == 1
    assert 0.5 < elapsed < 5.0  # waited for the late span, not the full 10 s drain


def test_a_first_batch_that_comes_after_the_stop_is_kept(tmp_path: Path) -> None:
    """An engine started before the receiver listened has its exporter in retry back-off: after a capture
    longer than twice the drain with no span yet, its first batch can still come after the stop."""
    trace_hex = "ef" * 16

    async def body(probe: OtlpReceiverProbe, ctx: CaptureContext) -> None:
        ctx.bundle.stream("requests").write({"rid": 0, "ok": True, "trace_id": trace_hex})
        await asyncio.sleep(2.3)  # > 2 x drain_s, nothing received

        async def late() -> None:
            await asyncio.sleep(0.3)  # after the stop
            async with aiohttp.ClientSession() as s:
                await s.post(ctx.shared["otel_receiver"]["http"], data=orjson.dumps(_otlp_json(trace_hex, "02" * 8)),
                             headers={"Content-Type": "application/json"})
        asyncio.get_running_loop().create_task(late())

    status, _, _ = asyncio.run(_with_receiver(tmp_path, body, drain_s=1.0))
    assert status.detail["spans"] == 1 and status.detail["requests_with_spans"] == 1, status


@pytest.mark.parametrize("ports", [(None, None)])
def test_needs_a_port(ports: tuple[None, None]) -> None:
    with pytest.raises(ValueError, match="needs a gRPC port"):
        OtlpReceiverProbe(grpc_port=ports[0], http_port=ports[1])
