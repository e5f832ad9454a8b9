"""The profiler probe's control flow and faults, against a fault-injecting stand-in for the engine's
profiler endpoints (``FaultyProfilerEngine``: 404, slow stop, auto-stop files, exiting engine). The real
vLLM path is tests/engine/test_profiler_vllm.py."""

from __future__ import annotations

import asyncio
import gzip
import socket
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web

from diagnose.io.bundle import open_bundle
from diagnose.io.writer import BundleWriter
from diagnose.model import ProbeStatus
from diagnose.probes.base import CaptureContext, Target
from diagnose.probes.profiler import ProfilerProbe, classify


class FaultyProfilerEngine:
    """Serves /start_profile and /stop_profile like vLLM, writing trace files into ``out_dir``;
    ``mode`` injects a fault: "ok", "404", "slow_stop", "start_500", "auto_stop" (worker file at start)."""

    def __init__(self, out_dir: Path, mode: str = "ok", stop_delay_s: float = 30.0) -> None:
        self.out_dir = out_dir
        self.mode = mode
        self.stop_delay_s = stop_delay_s
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.runner: web.AppRunner | None = None
        self.url = ""

    def _write(self, name: str) -> None:
        payload = {"traceEvents": [{"ph": "X", "name": "aten::mm", "ts": 1, "dur": 2, "pid": 1, "tid": 1}]}
        (self.out_dir / name).write_bytes(gzip.compress(orjson.dumps(payload)))

    async def start_profile(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.calls.append(("start", body))
        if self.mode == "404":
            raise web.HTTPNotFound()
        if self.mode == "start_500":
            return web.Response(status=500, text="engine core error")
        self.prefix = body.get("profile_prefix", "")
        if self.mode == "auto_stop":
            self._write(f"{self.prefix}_rank0.{time.time_ns()}.pt.trace.json.gz")
        return web.Response(status=200)

    async def stop_profile(self, request: web.Request) -> web.Response:
        self.calls.append(("stop", {}))
        if self.mode == "slow_stop":
            await asyncio.sleep(self.stop_delay_s)
        if self.mode != "auto_stop":
            self._write(f"{self.prefix}_rank0.{time.time_ns()}.pt.trace.json.gz")
        self._write(f"{self.prefix}_vm_1.async_llm.{time.time_ns()}.pt.trace.json.gz")
        (self.out_dir / f"{self.prefix}_rank0.profiler_out.txt").write_text("Name  Self CPU\n")
        return web.Response(status=200)

    async def __aenter__(self) -> FaultyProfilerEngine:
        app = web.Application()
        app.router.add_post("/start_profile", self.start_profile)
        app.router.add_post("/stop_profile", self.stop_profile)
        self.runner = web.AppRunner(app, shutdown_timeout=0.5)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.runner is not None
        await self.runner.cleanup()


def _ctx(tmp_path: Path, url: str) -> CaptureContext:
    bw = BundleWriter(tmp_path / "bundle", target={"url": url})
    return CaptureContext(bundle=bw, target=Target(url=url, engine="vllm"), stop=asyncio.Event())


async def _capture(tmp_path: Path, mode: str, capture_s: float = 3.0, **kw: Any
                   ) -> tuple[ProbeStatus, CaptureContext, FaultyProfilerEngine, float]:
    prof = tmp_path / "prof"
    prof.mkdir(exist_ok=True)
    (prof / "old_rank0.123.pt.trace.json.gz").write_bytes(b"from an earlier run")
    async with FaultyProfilerEngine(prof, mode) as eng:
        ctx = _ctx(tmp_path, eng.url)
        probe = ProfilerProbe(prof, start_after_s=0.1, window_s=kw.pop("window_s", 0.5), settle_s=1.5, **kw)
        t0 = time.monotonic()
        task = asyncio.create_task(probe.run(ctx))
        await asyncio.wait([task], timeout=capture_s)
        ctx.stop.set()
        status = await asyncio.wait_for(task, 30)
        elapsed = time.monotonic() - t0
    ctx.bundle.set_probe_status(status)
    ctx.bundle.finish()
    return status, ctx, eng, elapsed


def test_collects_worker_and_frontend_traces_of_this_capture_only(tmp_path: Path) -> None:
    status, ctx, eng, _ = asyncio.run(_capture(tmp_path, "ok", iterations=7))
    assert status.state == "ok", status
    start = eng.calls[0]
    assert start[0] == "start" and start[1]["max_iterations"] == 7
    assert start[1]["profile_prefix"].startswith("diagnose-")
    assert [c[0] for c in eng.calls] == ["start", "stop"]
    b = open_bundle(ctx.bundle.path)
    arts = b.manifest["artifacts"]
    traces = {k: v for k, v in arts.items() if v["kind"] == "torch_trace"}
    assert {v["role"] for v in traces.values()} == {"worker", "frontend"}
    assert all("old_rank0" not in k for k in arts)  # files of earlier runs are left alone
    worker = next(v for v in traces.values() if v["role"] == "worker")
    assert worker["rank"] == 0 and worker["iterations"] == 7
    assert worker["window_end_ns"] > worker["window_start_ns"]
    # the stop's answer time closes the span the analysis excludes (docs/profiler-capture.md)
    assert status.detail["stop_done_ns"] >= status.detail["window_end_ns"] == worker["window_end_ns"]
    assert worker["stop_done_ns"] == status.detail["stop_done_ns"]
    data = gzip.decompress((b.path / worker["file"]).read_bytes())
    assert orjson.loads(data)["traceEvents"][0]["name"] == "aten::mm"
    assert any(v["kind"] == "torch_profiler_table" for v in arts.values())
    assert status.detail["bytes"] > 0 and len(status.detail["files"]) == 2


def test_auto_stop_ends_the_window_early(tmp_path: Path) -> None:
    status, _, eng, elapsed = asyncio.run(_capture(tmp_path, "auto_stop", capture_s=0.3, window_s=20.0))
    assert status.state == "ok"
    assert status.detail["window_end_ns"] - status.detail["window_start_ns"] < 5e9
    assert elapsed < 10


def test_missing_endpoint_404_is_unavailable_with_the_fix(tmp_path: Path) -> None:
    status, ctx, _, _ = asyncio.run(_capture(tmp_path, "404"))
    assert status.state == "unavailable"
    assert "404" in status.reason and "--profiler-config" in status.reason
    assert open_bundle(ctx.bundle.path).manifest["probes"]["profiler"]["state"] == "unavailable"


def test_slow_stop_is_bounded_and_recorded(tmp_path: Path) -> None:
    status, _, _, elapsed = asyncio.run(_capture(tmp_path, "slow_stop", capture_s=0.5, stop_timeout_s=1.0))
    assert elapsed < 8  # the engine's stop takes 30 s; the capture does not wait for it
    assert "/stop_profile: no answer within 1 s" in status.reason
    assert status.state == "failed"  # the stand-in writes its files only after the 30 s stop
    assert "no new trace file appeared" in status.reason


def test_start_error_is_failed_with_the_answer(tmp_path: Path) -> None:
    status, _, _, _ = asyncio.run(_capture(tmp_path, "start_500"))
    assert status.state == "failed"
    assert "HTTP 500" in status.reason and "engine core error" in status.reason


def test_engine_gone_is_failed_not_raised(tmp_path: Path) -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    url = f"http://127.0.0.1:{port}"

    async def main() -> ProbeStatus:
        ctx = _ctx(tmp_path, url)
        task = asyncio.create_task(ProfilerProbe(tmp_path, start_after_s=0.05).run(ctx))
        await asyncio.sleep(0.3)
        ctx.stop.set()
        return await asyncio.wait_for(task, 10)

    status = asyncio.run(main())
    assert status.state == "failed"
    assert "cannot connect" in status.reason and "did the engine exit?" in status.reason


def test_capture_shorter_than_the_delay_is_skipped(tmp_path: Path) -> None:
    async def main() -> ProbeStatus:
        ctx = _ctx(tmp_path, "http://127.0.0.1:1")
        ctx.stop.set()
        return await ProfilerProbe(tmp_path, start_after_s=5).run(ctx)

    status = asyncio.run(main())
    assert status.state == "skipped" and "before the profile window" in status.reason


def test_no_dir_is_unavailable_and_sglang_body(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path, "http://127.0.0.1:1")
    ok, why = ProfilerProbe(None).available(ctx)
    assert not ok and "--profiler-dir" in why
    f = tmp_path / "file"
    f.write_text("x")
    assert not ProfilerProbe(f).available(ctx)[0]
    p = ProfilerProbe(tmp_path, iterations=5)
    assert p._start_body("sglang", "pre") == {"num_steps": 5, "output_dir": str(tmp_path), "profile_prefix": "pre"}
    assert p._start_body("vllm", "pre") == {"max_iterations": 5, "profile_prefix": "pre"}
    with pytest.raises(ValueError):
        ProfilerProbe(tmp_path, iterations=0)


@pytest.mark.parametrize("name,role,rank", [
    ("diagnose-1_rank0.1796017050265002311.pt.trace.json.gz", "worker", 0),
    ("diagnose-1_vm_11352.async_llm.1796017050687636406.pt.trace.json.gz", "frontend", None),
    ("pre-1700000000.1-TP-3.trace.json.gz", "worker", 3),
])
def test_classify(name: str, role: str, rank: int | None) -> None:
    assert classify(name) == (role, rank)
