"""--otlp-export: client spans go out with the SDK's real OTLP exporters to a real (loopback) receiver."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any

import pytest

from diagnose.io.bundle import open_bundle
from diagnose.io.writer import BundleWriter
from diagnose.model import ProbeStatus
from diagnose.probes.base import CaptureContext, Target
from diagnose.probes.otel import OtlpReceiverProbe
from diagnose.probes.otel_export import OtlpExportProbe, RequestTail, resolve_endpoint


def _req(i: int, bw: BundleWriter, ok: bool = True) -> dict[str, Any]:
    sent = bw.anchor_mono_ns + 1_000_000_000 + i * 10_000_000
    return {"rid": f"r-{i}", "phase": 0, "warmup": i == 0, "api": "completions", "sent_ns": sent,
            "first_token_ns": sent + 20_000_000 if ok else None, "end_ns": sent + 120_000_000, "ok": ok,
            "http_status": 200 if ok else 503, "error": None if ok else "http_5xx", "prompt_tokens": 100,
            "max_tokens": 16, "output_tokens_usage": 16 if ok else None,
            "trace_id": f"{i + 1:032x}", "span_id": f"{i + 1:016x}", "prompt_text": "never exported"}


async def _run(tmp_path: Path, protocol: str) -> tuple[ProbeStatus, ProbeStatus, BundleWriter, BundleWriter]:
    rx_bw = BundleWriter(tmp_path / "rx")
    rx_ctx = CaptureContext(bundle=rx_bw, target=Target(url=""), stop=asyncio.Event())
    rx = OtlpReceiverProbe(grpc_port=0, http_port=0, drain_s=0.2)
    rx_task = asyncio.create_task(rx.run(rx_ctx))
    while "otel_receiver" not in rx_ctx.shared:
        await asyncio.sleep(0.01)
    ep = rx_ctx.shared["otel_receiver"][protocol]
    bw = BundleWriter(tmp_path / "cap")
    ctx = CaptureContext(bundle=bw, target=Target(url="http://127.0.0.1:9"), stop=asyncio.Event())
    probe = OtlpExportProbe(ep, protocol=protocol, interval_s=0.2)
    task = asyncio.create_task(probe.run(ctx))
    reqs = bw.stream("requests")
    reqs.write(_req(0, bw))
    await asyncio.sleep(0.5)  # exported while the capture runs
    reqs.write_many([_req(1, bw), _req(2, bw, ok=False)])
    ctx.stop.set()
    reqs.write(_req(3, bw))  # written just after stop: still exported
    st = await asyncio.wait_for(task, 20)
    rx_ctx.stop.set()
    rx_st = await asyncio.wait_for(rx_task, 20)
    rx_bw.finish()
    bw.finish()
    return st, rx_st, bw, rx_bw


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_client_spans_carry_the_traceparent_ids(tmp_path: Path, protocol: str) -> None:
    st, rx_st, bw, rx_bw = asyncio.run(_run(tmp_path, protocol))
    assert st.state == "ok", st
    assert st.detail["exported"] == 4 and st.detail["failed"] == 0
    spans = {s["trace_id"]: s for s in open_bundle(rx_bw.path).records("spans")}
    assert set(spans) == {f"{i + 1:032x}" for i in range(4)}
    s1 = spans[f"{2:032x}"]
    assert s1["span_id"] == f"{2:016x}" and s1["parent_span_id"] is None and s1["kind"] == "CLIENT"
    assert s1["name"] == "POST /v1/completions"
    assert s1["resource"]["service.name"] == "diagnose-client"
    # monotonic times map to wall clock through the bundle's anchor
    sent_unix = bw.anchor_unix_ns + 1_000_000_000 + 10_000_000
    assert s1["start_unix_ns"] == sent_unix and s1["end_unix_ns"] == sent_unix + 120_000_000
    assert s1["attributes"]["diagnose.ttft_ms"] == pytest.approx(20.0)
    assert s1["attributes"]["gen_ai.usage.completion_tokens"] == 16
    assert s1["events"] == [{"name": "first_token", "time_unix_ns": sent_unix + 20_000_000}]
    failed = spans[f"{3:032x}"]
    assert failed["status"]["code"] == "ERROR" and failed["attributes"]["error.type"] == "http_5xx"
    assert b"never exported" not in (rx_bw.path / "spans.jsonl").read_bytes()


def test_unreachable_collector_is_a_failed_probe(tmp_path: Path) -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()

    async def main() -> ProbeStatus:
        bw = BundleWriter(tmp_path / "cap")
        ctx = CaptureContext(bundle=bw, target=Target(url="http://127.0.0.1:9"), stop=asyncio.Event())
        probe = OtlpExportProbe(f"http://127.0.0.1:{port}/v1/traces", interval_s=0.1, timeout_s=1.0)
        task = asyncio.create_task(probe.run(ctx))
        bw.stream("requests").write(_req(1, bw))
        await asyncio.sleep(0.3)
        ctx.stop.set()
        return await asyncio.wait_for(task, 30)

    st = asyncio.run(main())
    assert st.state == "failed"
    assert f"127.0.0.1:{port}/v1/traces" in st.reason and st.detail["failed"] == 1


@pytest.mark.parametrize("url,expected", [
    ("http://collector:4318/v1/traces", ("http", "http://collector:4318/v1/traces")),
    ("http://collector:4318", ("http", "http://collector:4318/v1/traces")),
    ("http://collector:4317", ("grpc", "http://collector:4317")),
    ("grpc://collector:9999", ("grpc", "http://collector:9999")),
    ("https://otel.example/custom/v1/traces", ("http", "https://otel.example/custom/v1/traces")),
])
def test_resolve_endpoint(url: str, expected: tuple[str, str]) -> None:
    assert resolve_endpoint(url) == expected


def test_resolve_endpoint_rejects_non_urls() -> None:
    with pytest.raises(ValueError, match="not a URL"):
        resolve_endpoint("collector:4318")


def test_request_tail_reads_whole_lines_only(tmp_path: Path) -> None:
    p = tmp_path / "requests.jsonl"
    p.write_bytes(b'{"rid": 1}\n{"rid": 2}\n{"rid"')
    tail = RequestTail(p)
    assert [r["rid"] for r in tail.read()] == [1, 2]
    with open(p, "ab") as fh:
        fh.write(b': 3}\nnot json\n')
    assert [r["rid"] for r in tail.read()] == [3]
    assert tail.read() == []
