"""The Prometheus probe and engine detection against the real vLLM CPU server (marker ``engine``)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from diagnose.analysis import Window
from diagnose.engines.detect import detect_engine
from diagnose.io.bundle import open_bundle
from diagnose.io.writer import BundleWriter
from diagnose.model import ProbeStatus
from diagnose.normalize import prometheus as prom
from diagnose.probes.base import CaptureContext, Target
from diagnose.probes.prometheus import PrometheusProbe

pytestmark = pytest.mark.engine

N_REQUESTS = 24
CONCURRENCY = 8
MAX_TOKENS = 32


async def _stream(session: aiohttp.ClientSession, url: str, i: int) -> tuple[int, int, int]:
    """One streamed completion: (sent_ns, first_token_ns, end_ns)."""
    body = {"model": "tiny-llama", "prompt": f"request {i}: " + "lorem ipsum dolor " * 40,
            "max_tokens": MAX_TOKENS, "stream": True, "ignore_eos": True}
    sent = time.monotonic_ns()
    first = 0
    async with session.post(f"{url}/v1/completions", json=body) as r:
        assert r.status == 200
        async for raw in r.content:
            line = raw.strip()
            if (line.startswith(b"data: {") and not first
                    and any(c.get("text") for c in json.loads(line[6:]).get("choices", []))):
                first = time.monotonic_ns()
    assert first
    return sent, first, time.monotonic_ns()


async def _capture(url: str, out: Path) -> tuple[ProbeStatus, list[tuple[int, int, int]], Any]:
    bw = BundleWriter(out, target={"url": url})
    ctx = CaptureContext(bundle=bw, target=Target(url=url), stop=asyncio.Event())
    async with aiohttp.ClientSession() as session:
        info = await detect_engine(url, session)
        task = asyncio.create_task(PrometheusProbe(interval_s=0.5).run(ctx))
        await asyncio.sleep(0.7)
        todo = list(range(N_REQUESTS))
        results: list[tuple[int, int, int]] = []

        async def worker() -> None:
            while todo:
                results.append(await _stream(session, url, todo.pop()))

        await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
        ctx.stop.set()
        status = await asyncio.wait_for(task, 30)
    bw.set_probe_status(status)
    bw.finish()
    return status, results, info


def test_probe_during_a_burst_of_streamed_requests(vllm_server: Any, tmp_path: Path) -> None:
    status, results, info = asyncio.run(_capture(vllm_server.url, tmp_path / "b"))
    assert info.name == "vllm" and info.models == ("tiny-llama",)
    assert info.version and info.version.startswith("0.32")
    assert status.state == "ok", status
    assert status.detail["scrapes_failed"] == 0 and status.detail["scrapes_ok"] >= 3

    bundle = open_bundle(tmp_path / "b")
    tables = prom.tables(bundle)
    anchor = bundle.anchor_mono_ns
    window = Window((min(r[0] for r in results) - anchor) / 1e9, (max(r[2] for r in results) - anchor) / 1e9)
    s = {x.name: x for x in prom.signals(tables, window)}

    # gauges: something ran, nothing beyond the offered concurrency
    assert 1 <= s["running_requests_max"].value <= CONCURRENCY
    assert 0 <= s["queue_depth_max"].value <= CONCURRENCY
    assert 0 <= s["kv_usage_max_ratio"].value <= 1
    # counters: exactly this burst (ignore_eos makes every request produce MAX_TOKENS tokens)
    assert prom.counter_increase(tables, "generation_tokens", window) == N_REQUESTS * MAX_TOKENS
    assert prom.counter_increase(tables, "finished_requests", window) == N_REQUESTS
    assert s["preemptions_total"].value == 0
    # histograms: one TTFT per request, quantiles inside their buckets
    est = prom.hist_quantile(tables, "ttft_seconds", 0.5, window)
    assert est is not None and est.count == N_REQUESTS
    assert s["server_ttft_p50_bucket_lo_ms"].value <= s["server_ttft_p50_ms"].value \
        <= s["server_ttft_p50_bucket_hi_ms"].value
    # the server's TTFT is a sub-interval of the client's: its mean cannot be larger (1 ms slack)
    client_mean_ms = sum((f - sent) / 1e6 for sent, f, _ in results) / len(results)
    assert 0 < s["server_ttft_mean_ms"].value <= client_mean_ms + 1.0
    assert 0 < s["server_itl_p50_ms"].value < 1000
    assert s["batch_tokens_per_step_mean"].value >= 1
    # probe cost is recorded per scrape
    assert (tables["metrics_scrapes"]["scrape_ms"] > 0).all()
