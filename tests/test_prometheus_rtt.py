"""The Prometheus probe charges the server only the server's time (issue 36, client defect 2): behind a proxy
that adds a round trip, the network's time is measured (the fastest of a few pings) and taken out of each
scrape's cost, so the overhead budget does not stretch the interval for time the server never spent."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from aiohttp import web

import diagnose.probes.prometheus as prom
from diagnose.capture.overhead import RTT_SIGNIFICANT_MS
from diagnose.io.writer import BundleWriter
from diagnose.model import ProbeStatus
from diagnose.probes.base import CaptureContext, Target
from tests.servers.proxy import delaying_proxy

METRICS = "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 3\n"
ONE_WAY_S = 0.04  # the proxy holds every chunk this long in each direction: an 80 ms round trip




def run_behind_proxy(tmp_path: Path, one_way_s: float, seconds: float, budget: float,
                     monkeypatch: pytest.MonkeyPatch) -> ProbeStatus:
    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=METRICS, content_type="text/plain")

    async def main() -> ProbeStatus:
        app = web.Application()
        app.router.add_get("/metrics", metrics)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        try:
            async with delaying_proxy(port, one_way_s) as pport:
                url = f"http://127.0.0.1:{pport}"
                bw = BundleWriter(tmp_path / "b", target={"url": url})
                ctx = CaptureContext(bundle=bw, target=Target(url=url), stop=asyncio.Event(),
                                     options={"overhead_budget": budget})
                probe = prom.PrometheusProbe(interval_s=0.2, settle_s=0.0)
                task = asyncio.create_task(probe.run(ctx))
                await asyncio.sleep(seconds)
                ctx.stop.set()
                status = await asyncio.wait_for(task, 20)
                bw.set_probe_status(status)
                bw.finish()
                return status
        finally:
            await runner.cleanup()

    return asyncio.run(main())


def test_a_proxys_round_trip_is_not_charged_to_the_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    st = run_behind_proxy(tmp_path, ONE_WAY_S, 2.5, 0.05, monkeypatch)
    d = st.detail
    assert st.state == "ok", st.reason
    assert d["round_trip_ms"] >= 2 * ONE_WAY_S * 1e3 * 0.95  # the network's, measured
    assert d["scrape_ms_p50"] >= 2 * ONE_WAY_S * 1e3 * 0.95  # each exchange took the round trip and more...
    c = d["cost"]
    # ...but the server rendered the page in a few ms: that is what it is charged, and the 5% budget (which a
    # scrape of 80 ms every 0.2 s would exceed eight times over) leaves the interval as asked
    assert c["target_ms"] / d["scrapes_ok"] < 20, c
    assert c.get("adapted") is None and d["interval_s_max"] <= 0.2 * 1.01, d
    assert d["scrapes_ok"] >= 8
    assert "less the network's" in c["basis"]


def test_on_loopback_nothing_is_taken_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    st = run_behind_proxy(tmp_path, 0.0, 0.8, 0.05, monkeypatch)
    d = st.detail
    assert st.state == "ok" and d["round_trip_ms"] is not None and d["round_trip_ms"] < RTT_SIGNIFICANT_MS
    assert "loopback (time to first byte + transfer)" in d["cost"]["basis"]


def test_the_server_time_of_one_exchange() -> None:
    from diagnose.capture.overhead import server_ms

    ms = 1_000_000
    assert server_ms(0, 5 * ms, 9 * ms, None) == 9.0  # not measured: the whole exchange
    assert server_ms(0, 5 * ms, 9 * ms, 1.0) == 9.0  # a loopback round trip: nothing taken out
    assert server_ms(0, 83 * ms, 200 * ms, 80.0) == pytest.approx(3.0)  # headers less the round trip
    assert server_ms(0, 70 * ms, 90 * ms, 80.0) == 0.0  # never negative


