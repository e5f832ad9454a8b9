"""Profiler capture against the real vLLM CPU engine (marker: engine): ``attach --profile-iterations``
triggers /start_profile for a bounded window and the worker's torch trace lands in the bundle. The same
server exports its spans over OTLP/HTTP (OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf), so the HTTP
receiver path is exercised for real too. A server started without --profiler-config answers 404: the
profiler probe is unavailable with the fix, and the capture completes with the other probes."""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from diagnose.io.bundle import open_bundle
from diagnose.io.writer import BundleWriter
from diagnose.probes.base import CaptureContext, Target
from diagnose.probes.profiler import ProfilerProbe
from harness.engine import free_port
from tests.engine.test_otel_vllm import attach, check_join

pytestmark = pytest.mark.engine


def test_worker_trace_lands_in_the_bundle(start_vllm: Callable[..., object], tmp_path: Path) -> None:
    prof = tmp_path / "prof"
    grpc_port, http_port = free_port(), free_port()
    server = start_vllm(
        profiler_dir=prof,
        otlp_traces_endpoint=f"http://127.0.0.1:{http_port}/v1/traces",
        env={"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"},
    )
    p = attach(
        server.url,  # type: ignore[attr-defined]
        tmp_path / "b",
        "--otlp",
        "--otlp-grpc-port",
        str(grpc_port),
        "--otlp-http-port",
        str(http_port),
        "--profile-iterations",
        "8",
        "--profiler-dir",
        str(prof),
    )
    assert p.returncode == 0, p.stderr[-2000:]
    b = open_bundle(tmp_path / "b")
    st = {s.name: s for s in b.probe_statuses()}
    assert st["profiler"].state == "ok", st["profiler"]
    assert st["load"].state == "ok"
    traces = {k: v for k, v in b.manifest["artifacts"].items() if v["kind"] == "torch_trace"}
    worker = [v for v in traces.values() if v["role"] == "worker"]
    assert len(worker) == 1 and worker[0]["rank"] == 0 and worker[0]["iterations"] == 8
    events = orjson.loads(gzip.decompress((b.path / worker[0]["file"]).read_bytes()))["traceEvents"]
    names = {e.get("name", "") for e in events}
    assert any(n.startswith("aten::") for n in names), sorted(names)[:20]
    assert any(v["role"] == "frontend" for v in traces.values())
    # the spans came over OTLP/HTTP and join like the gRPC ones
    assert st["otel"].detail["exports"]["http"] > 0 and st["otel"].detail["exports"]["grpc"] == 0
    check_join(tmp_path / "b")


def test_server_without_profiler_config_is_unavailable_404(vllm_server: object, tmp_path: Path) -> None:
    async def main() -> object:
        bw = BundleWriter(tmp_path / "b")
        ctx = CaptureContext(
            bundle=bw,
            target=Target(url=vllm_server.url, engine="vllm"),  # type: ignore[attr-defined]
            stop=asyncio.Event(),
        )
        task = asyncio.create_task(ProfilerProbe(tmp_path / "prof", start_after_s=0.1).run(ctx))
        await asyncio.sleep(2)
        ctx.stop.set()
        return await asyncio.wait_for(task, 60)

    st = asyncio.run(main())
    assert st.state == "unavailable", st  # type: ignore[attr-defined]
    assert "404" in st.reason and "--profiler-config" in st.reason  # type: ignore[attr-defined]
