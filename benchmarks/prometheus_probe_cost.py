"""What the Prometheus probe costs: client-side parsing and bundle size, and (``--live``) server CPU.

1. Parse: prometheus_client's text parser on the whole real vLLM scrape (tests/data/metrics) versus on the
   probe's prefiltered text (engine families only, no ``_created``), median of ``--repeat`` runs; and the
   JSON bytes one ``metrics`` record takes in the bundle for each.
2. ``--live``: start the real vLLM CPU server (idle, after a short warm-up load so histograms are filled)
   and measure its API-server CPU time per /metrics request from ``process_cpu_seconds_total``: CPU over
   ``--scrapes`` back-to-back scrapes minus the idle CPU over an equally long pause.

    python benchmarks/prometheus_probe_cost.py [--live] [--results benchmarks/results/prometheus_probe_cost.md]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import aiohttp  # noqa: E402
import orjson  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from diagnose.probes.prometheus import parse_scrape, prefilter  # noqa: E402
from diagnose.probes.prometheus_worker import ParseWorker  # noqa: E402

SCRAPE = REPO / "tests" / "data" / "metrics" / "vllm_cpu_0.32_metrics_scrape.txt"


def parse_section(repeat: int) -> str:
    text = SCRAPE.read_text()
    steps = {"full": lambda: list(text_string_to_metric_families(text)), "probe": lambda: parse_scrape(text),
             "filter": lambda: prefilter(text)}
    times: dict[str, list[float]] = {k: [] for k in steps}
    for _ in range(repeat):  # interleaved, so a noisy neighbour hits both alike
        for k, fn in steps.items():
            t0 = time.perf_counter()
            fn()
            times[k].append((time.perf_counter() - t0) * 1e3)
    full_ms, probe_ms, filt_ms = (statistics.median(times[k]) for k in ("full", "probe", "filter"))
    kept, _ = parse_scrape(text)
    every, _ = parse_scrape(text, keep_all=True)
    b_kept = len(orjson.dumps({"samples": kept}))
    b_all = len(orjson.dumps({"samples": every}))
    return "\n".join([
        f"Input: real vLLM CPU 0.32 scrape, {len(text):,} bytes, {len(every)} samples. Median of {repeat} "
        f"interleaved runs; load average at start {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores.",
        "", "| step | ms per scrape | ratio |", "|---|---|---|",
        f"| parse whole text (prometheus_client) | {full_ms:.2f} | 1.00 |",
        f"| probe: prefilter + parse kept families | {probe_ms:.2f} | {probe_ms / full_ms:.2f} "
        f"({full_ms / probe_ms:.1f}x faster) |",
        f"| (of which the line prefilter) | {filt_ms:.2f} | |",
        "", "| stored per scrape | samples | JSON bytes | ratio |", "|---|---|---|---|",
        f"| everything (keep_all) | {len(every)} | {b_all:,} | 1.00 |",
        f"| engine families only (default) | {len(kept)} | {b_kept:,} | {b_kept / b_all:.2f} |", "",
        f"At a 1 s interval the default costs {b_kept / 1024:.0f} KiB of bundle per second of capture "
        f"({b_kept * 60 / 2**20:.1f} MiB per minute, before any compression).", ""])


async def _loop_lag(mode: str, seconds: float) -> list[float]:
    """Lateness (ms) of 1 ms sleeps on this event loop while scrapes are parsed every 0.2 s (``mode``:
    none, thread, or process = the probe's child-process worker)."""
    text = SCRAPE.read_text()
    lags: list[float] = []
    done = asyncio.Event()
    worker = ParseWorker()
    if mode == "process":
        await worker.start()
        while not worker.ready:
            await asyncio.sleep(0.05)

    async def ticker() -> None:
        while not done.is_set():
            t0 = time.perf_counter()
            await asyncio.sleep(0.001)
            lags.append((time.perf_counter() - t0 - 0.001) * 1e3)

    task = asyncio.create_task(ticker())
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        if mode == "thread":
            await asyncio.to_thread(parse_scrape, text)
        elif mode == "process":
            await worker.parse(text, False)
        await asyncio.sleep(0.2)
    done.set()
    await task
    await worker.close()
    return sorted(lags)


def lag_section(seconds: float) -> str:
    rows = ["| scrape parsing (every 0.2 s, 5x the default rate) | ticks | lag p50 ms | lag p99 ms | lag max ms |",
            "|---|---|---|---|---|"]
    for mode in ("none", "thread", "process", "none", "thread", "process"):
        lags = asyncio.run(_loop_lag(mode, seconds))
        rows.append(f"| {mode} | {len(lags)} | {lags[len(lags) // 2]:.2f} | {lags[int(0.99 * len(lags))]:.2f} | "
                    f"{lags[-1]:.2f} |")
    return "\n".join(["What parsing does to the load generator's event loop in the same process: lateness of "
                      "1 ms sleeps. A thread holds the GIL in 5 ms slices; the probe's default child process "
                      "does not.", "", *rows, ""])


async def _cpu(session: aiohttp.ClientSession, url: str) -> float:
    async with session.get(f"{url}/metrics") as r:
        text = await r.text()
    samples, _ = parse_scrape(text)
    return next(v for n, _l, v in samples if n == "process_cpu_seconds_total")


async def live_section(url: str, n: int) -> str:
    async with aiohttp.ClientSession() as session:
        for i in range(16):  # warm-up so every histogram has samples, as in a real capture
            body = {"model": "tiny-llama", "prompt": f"warm {i}", "max_tokens": 8, "stream": False}
            async with session.post(f"{url}/v1/completions", json=body) as r:
                await r.read()
        await asyncio.sleep(2)
        c0 = await _cpu(session, url)
        t0 = time.monotonic()
        scrape_ms = []
        for _ in range(n):
            s0 = time.perf_counter()
            async with session.get(f"{url}/metrics") as r:
                await r.read()
            scrape_ms.append((time.perf_counter() - s0) * 1e3)
        busy_s = time.monotonic() - t0
        c1 = await _cpu(session, url)
        await asyncio.sleep(busy_s)
        c2 = await _cpu(session, url)
    per_scrape_ms = ((c1 - c0) - (c2 - c1)) / (n + 1) * 1e3
    return "\n".join([
        f"Live: idle vLLM CPU 0.32.0 server (tiny-llama), {n} back-to-back /metrics GETs; API-server CPU from "
        "process_cpu_seconds_total (10 ms resolution), minus idle CPU over an equal pause.", "",
        "| measure | value |", "|---|---|",
        f"| scrape round trip p50 / max (ms) | {statistics.median(scrape_ms):.1f} / {max(scrape_ms):.1f} |",
        f"| API-server CPU per scrape (ms) | {per_scrape_ms:.1f} |",
        f"| share of one core at a 1 s interval | {per_scrape_ms / 1000:.2%} |",
        f"| idle API-server CPU over the pause (ms/s) | {(c2 - c1) / busy_s * 1e3:.1f} |", ""])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--live", action="store_true", help="also measure server CPU per scrape on a real vLLM")
    ap.add_argument("--scrapes", type=int, default=200)
    ap.add_argument("--port", type=int, default=18303)
    ap.add_argument("--results", type=Path)
    args = ap.parse_args()
    out = ["### Client side: parsing and bundle size", "", parse_section(args.repeat),
           "### Client side: event-loop lag while parsing", "", lag_section(3.0)]
    if args.live:
        from harness.engine import VllmServer, ensure_engine

        ensure_engine()
        with VllmServer(port=args.port, startup_timeout_s=600) as server:
            out += ["### Server side: CPU per scrape", "", asyncio.run(live_section(server.url, args.scrapes))]
    text = "\n".join(out)
    print(text)
    if args.results:
        args.results.parent.mkdir(parents=True, exist_ok=True)
        with open(args.results, "a") as fh:
            fh.write(f"\n## {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} "
                     f"(`python benchmarks/prometheus_probe_cost.py{' --live' if args.live else ''}`)\n\n{text}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
