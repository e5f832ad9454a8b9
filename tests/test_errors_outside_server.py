"""Time between client and server (issue 34 item 2, rule LAT009): with 40 ms added each way between the client
and an engine whose own TTFT is ~40 ms, about two thirds of the client's TTFT passes outside the engine. The
verdict must name that time, with its experiment (measure from beside the server, bypass the proxy), and not
blame prefill or the API server; with no delay the rule stays quiet."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

from aiohttp import web

from diagnose.io.bundle import open_bundle
from diagnose.io.writer import BundleWriter
from diagnose.normalize import otel
from diagnose.pipeline import analyze
from tests.servers.proxy import delaying_proxy
from tests.test_otel_join import ALL, MS, _span


def _bundle(tmp: Path, one_way_ms: float, n: int = 40) -> Path:
    """n requests at 10 per second (one phase, TTFT SLO 100 ms): the engine queues none, prefills 30 ms, its
    frontend 5 ms (server TTFT 35-39 ms); the request reaches it ``one_way_ms`` after the client sent it and
    every chunk reaches the client ``one_way_ms`` after the engine wrote it."""
    bw = BundleWriter(tmp / "b", options={"slo": {"ttft_p90_ms": 100.0}})
    t0 = bw.anchor_mono_ns + 1000 * MS
    reqs, spans = [], []
    for i in range(n):
        sent = t0 + i * 100 * MS
        tid = f"{i + 1:032x}"
        queue, prefill, frontend, decode = 0.0, 30.0, 5.0 + (i % 5), 200.0
        ttft = queue + prefill + frontend
        e2e = ttft + decode
        first = sent + int((one_way_ms + ttft + one_way_ms + 0.5) * MS)
        reqs.append({"rid": f"r{i}", "phase": 0, "warmup": False, "ok": True, "api": "completions",
                     "sent_ns": sent, "first_token_ns": first, "end_ns": first + int(decode * MS),
                     "http_status": 200, "prompt_tokens": 200, "max_tokens": 64, "output_tokens_usage": 64,
                     "output_tokens_chunks": 64, "n_chunks": 64, "finish_reason": "length",
                     "trace_id": tid, "span_id": f"{i + 1:016x}"})
        arrival_unix = bw.anchor_unix_ns + (sent - bw.anchor_mono_ns) + int(one_way_ms * MS)
        spans.append(_span(tid, arrival_unix, ttft=ttft / 1e3, e2e=e2e / 1e3, queue=queue / 1e3,
                           prefill=prefill / 1e3, decode=decode / 1e3))
    bw.stream("requests").write_many(reqs)
    bw.stream("spans").write_many(spans)
    bw.stream("phases").write_many([{"phase": 0, "name": "rate=10", "mode": "rate", "rate": 10.0,
                                     "start_ns": t0, "end_ns": t0 + n * 100 * MS + 500 * MS}])
    bw.finish()
    return bw.path


def test_the_join_measures_the_time_between_client_and_server(tmp_path: Path) -> None:
    sigs = {s.name: s.value for s in otel.signals(otel.tables(open_bundle(_bundle(tmp_path, 40.0))), ALL)}
    assert sigs["ttft_client_network_p50_ms"] == 80.5  # 40 ms each way + the client's 0.5 ms
    assert 0.66 <= sigs["ttft_client_network_share_ratio"] <= 0.71


def test_forty_ms_each_way_leads_the_verdict_as_time_between_client_and_server(tmp_path: Path) -> None:
    a = analyze(_bundle(tmp_path, 40.0))
    v = a.verdict
    assert v.top_rule == "LAT009", (v.headline, [(f.rule_id, f.severity) for f in a.findings])
    assert v.headline.startswith("Most likely: Time between client and server: 6") and "80 ms per request" in \
        v.headline, v.headline
    assert v.cause.startswith("the network round trip") and "beside the server" in v.experiment, v
    ids = [f.rule_id for f in a.findings]
    for blamed in ("LAT007", "LAT008"):  # prefill, the API server: never before it
        assert blamed not in ids or ids.index(blamed) > ids.index("LAT009"), ids


def test_no_delay_leaves_the_rule_quiet(tmp_path: Path) -> None:
    a = analyze(_bundle(tmp_path, 0.2))
    assert "LAT009" not in [f.rule_id for f in a.findings]
    assert a.signals["ttft_client_network_p50_ms"].value < 1.0


# -- a real delaying proxy in front of a server with the engine's own TTFT histogram ----------------------------
DELAY_S = 0.04  # each way
ENGINE_TTFT_S = 0.04


class _Engine:
    """An OpenAI-style streaming server that takes ENGINE_TTFT_S to its first token and exposes that as vLLM's
    TTFT histogram (its own start point: the request's arrival in the handler)."""

    def __init__(self) -> None:
        self.ttft: list[float] = []

    async def completions(self, request: web.Request) -> web.StreamResponse:
        t0 = time.monotonic()
        body = await request.json()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await asyncio.sleep(ENGINE_TTFT_S)
        n = int(body.get("max_tokens") or 8)
        for i in range(n):
            choice = {"index": 0, "text": " tok", "finish_reason": "length" if i == n - 1 else None}
            await resp.write(b"data: " + json.dumps({"id": "c", "choices": [choice]}).encode() + b"\n\n")
            if i == 0:
                self.ttft.append(time.monotonic() - t0)
            await asyncio.sleep(0.005)
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def metrics(self, request: web.Request) -> web.Response:
        bounds = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
        lbl = 'model_name="tiny"'
        lines = ["# TYPE vllm:time_to_first_token_seconds histogram"]
        for b in bounds:
            lines.append(f'vllm:time_to_first_token_seconds_bucket{{{lbl},le="{b}"}} {sum(t <= b for t in self.ttft)}')
        lines += [f'vllm:time_to_first_token_seconds_bucket{{{lbl},le="+Inf"}} {len(self.ttft)}',
                  f"vllm:time_to_first_token_seconds_sum{{{lbl}}} {sum(self.ttft)}",
                  f"vllm:time_to_first_token_seconds_count{{{lbl}}} {len(self.ttft)}",
                  "# TYPE vllm:num_requests_running gauge", f"vllm:num_requests_running{{{lbl}}} 0",
                  "# TYPE vllm:num_requests_waiting gauge", f"vllm:num_requests_waiting{{{lbl}}} 0"]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "tiny", "object": "model"}]})


def _serve(ready: threading.Event, stop: list[asyncio.AbstractEventLoop], urls: list[str]) -> None:
    async def main() -> None:
        eng = _Engine()
        app = web.Application()
        app.router.add_post("/v1/completions", eng.completions)
        app.router.add_get("/metrics", eng.metrics)
        app.router.add_get("/v1/models", eng.models)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

        async with delaying_proxy(port, DELAY_S) as proxy_port:  # DELAY_S each way, every chunk
            urls.append(f"http://127.0.0.1:{proxy_port}")
            ready.set()
            await asyncio.Event().wait()  # until the loop is stopped

    loop = asyncio.new_event_loop()
    stop.append(loop)
    with contextlib.suppress(RuntimeError):
        loop.run_until_complete(main())


def test_a_real_delaying_proxy_is_named_as_time_between_client_and_server(tmp_path: Path) -> None:
    """The load client through a proxy that holds every byte 40 ms each way, in front of a server whose own
    TTFT (40 ms) its Prometheus histogram reports: the gap to the histogram names the time between client and
    server (no spans: the engine-neutral histogram path)."""
    ready, loops, urls = threading.Event(), [], []  # type: ignore[var-annotated]
    th = threading.Thread(target=_serve, args=(ready, loops, urls), daemon=True)
    th.start()
    assert ready.wait(10)
    try:
        p = subprocess.run([sys.executable, "-m", "diagnose", "attach", "--url", urls[0], "-c", "2", "-d", "4s",
                            "--output-tokens", "8", "--input-tokens", "16", "--baseline", "0", "--warmup", "2",
                            "--slo", "ttft_p90=100ms", "--metrics-interval", "250ms", "--no-nvml", "--no-host",
                            "-o", str(tmp_path / "b")], capture_output=True, text=True, timeout=120)
    finally:
        loops[0].call_soon_threadsafe(loops[0].stop)
        th.join(5)
    assert p.returncode == 0, p.stdout + p.stderr
    a = analyze(tmp_path / "b")
    s = {k: v.value for k, v in a.signals.items()}
    assert s["server_ttft_client_gap_mean_ms"] >= 75, s  # the proxy holds every byte at least 40 ms each way
    assert s["server_ttft_client_gap_share_ratio"] >= 0.5, s
    ids = [f.rule_id for f in a.findings]
    served = [f.rule_id for f in a.findings if f.family != "validity"]
    assert served[0] == "LAT009", ids  # before any latency or scheduler rule: not prefill, not the API server
    # on a loaded machine (two cores shared by the whole test tier) the client's own lag can make the run
    # invalid: then the verdict must say so, and otherwise name the time between client and server
    if "VAL001" in ids:
        assert a.verdict.level == "invalid", a.verdict.headline
    else:
        assert a.verdict.top_rule == "LAT009", (a.verdict.headline, ids)
        assert a.verdict.headline.startswith("Most likely: Time between client and server:"), a.verdict.headline
