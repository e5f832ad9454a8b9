"""Cost of host sampling (the pyspy probe) on the real vLLM CPU server: throughput and ITL P99 with and
without it, alternating in the same run.

One server is started (harness.engine.VllmServer, loopback port from 18500-18599). For each setting, ``rounds``
pairs of segments run a closed-loop streaming load (unique prompts, ``--output-tokens`` tokens, ignore_eos);
in each pair one segment runs the probe and one does not, the order flipping every round so drift cancels.
Reported per setting: median over rounds of (with / without) for output tok/s and ITL P99, and py-spy's own
CPU seconds per wall second. Writes benchmarks/results/overhead_host.{json,md}.

    .venv/bin/python benchmarks/overhead_host.py --rounds 4 --segment-s 15
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from diagnose.io.writer import BundleWriter  # noqa: E402
from diagnose.probes.base import CaptureContext, Target  # noqa: E402
from diagnose.probes.pyspy import PySpyProbe  # noqa: E402
from harness.engine import VllmServer  # noqa: E402

SETTINGS: dict[str, dict[str, Any]] = {
    "default (10 Hz, nonblocking, 30 s windows, /proc 1 s, dump 15 s)": {},
    "20 Hz, 10 s windows, dump 5 s (first default)": {"rate_hz": 20, "window_s": 10, "dump_interval_s": 5},
    "50 Hz (the attach CLI's --pyspy-rate default)": {"rate_hz": 50},
}


async def one_request(session: aiohttp.ClientSession, url: str, out_tokens: int, rng: random.Random,
                      gaps: list[float], counts: list[int]) -> None:
    prompt = " ".join(f"w{rng.randrange(10**6)}" for _ in range(120))
    body = {"model": "tiny-llama", "prompt": prompt, "max_tokens": out_tokens, "stream": True, "ignore_eos": True}
    last = None
    async with session.post(url + "/v1/completions", json=body) as r:
        async for line in r.content:
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            now = time.monotonic()
            if last is not None:
                gaps.append(now - last)
            last = now
            counts[0] += 1


async def segment(url: str, seconds: float, concurrency: int, out_tokens: int, seed: int,
                  probe_kw: dict[str, Any] | None, pid: int) -> dict[str, Any]:
    gaps: list[float] = []
    counts = [0]
    rng = random.Random(seed)
    status = None
    probe_task = None
    tmp = tempfile.TemporaryDirectory()
    ctx = None
    if probe_kw is not None:
        ctx = CaptureContext(bundle=BundleWriter(Path(tmp.name) / "b"), target=Target(url=url, pid=pid),
                             stop=asyncio.Event())
        probe_task = asyncio.create_task(PySpyProbe(**probe_kw).run(ctx))
        await asyncio.sleep(0.5)
    end = time.monotonic() + seconds
    t0 = time.monotonic()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as s:
        async def worker() -> None:
            while time.monotonic() < end:
                await one_request(s, url, out_tokens, rng, gaps, counts)
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.monotonic() - t0
    if probe_task is not None and ctx is not None:
        ctx.stop.set()
        status = await probe_task
        ctx.bundle.finish()
    tmp.cleanup()
    gaps.sort()
    res = {"tok_s": counts[0] / elapsed, "itl_p99_ms": 1000 * gaps[int(0.99 * (len(gaps) - 1))] if gaps else None,
           "elapsed_s": elapsed}
    if status is not None:
        res["pyspy_cpu_s"] = status.detail.get("pyspy_cpu_s")
        res["pyspy_samples"] = status.detail.get("samples")
        res["probe_state"] = status.state
        res["probe_reason"] = status.reason
    return res


async def main_async(a: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"settings": {}, "args": vars(a)}
    with VllmServer(port=a.port, startup_timeout_s=900) as server:
        assert server.pid is not None
        await segment(server.url, 5, a.concurrency, a.output_tokens, 999, None, server.pid)  # warm-up
        seed = 0
        for name, kw in SETTINGS.items():
            rounds = []
            for r in range(a.rounds):
                pair = {}
                for on in ((False, True) if r % 2 == 0 else (True, False)):
                    seed += 1
                    pair["on" if on else "off"] = await segment(server.url, a.segment_s, a.concurrency,
                                                                a.output_tokens, seed, kw if on else None, server.pid)
                rounds.append(pair)
                print(name, r, json.dumps(pair), flush=True)
            thr = [p["on"]["tok_s"] / p["off"]["tok_s"] for p in rounds]
            itl = [p["on"]["itl_p99_ms"] / p["off"]["itl_p99_ms"] for p in rounds]
            cost = [p["on"]["pyspy_cpu_s"] / p["on"]["elapsed_s"] for p in rounds]
            out["settings"][name] = {
                "kwargs": kw, "rounds": rounds,
                "throughput_ratio_median": statistics.median(thr), "throughput_ratios": thr,
                "itl_p99_ratio_median": statistics.median(itl), "itl_p99_ratios": itl,
                "pyspy_cores_median": statistics.median(cost),
                "tok_s_off_median": statistics.median(p["off"]["tok_s"] for p in rounds),
                "tok_s_on_median": statistics.median(p["on"]["tok_s"] for p in rounds),
            }
    return out


def write_md(res: dict[str, Any], path: Path) -> None:
    a = res["args"]
    lines = [
        "# py-spy probe overhead on the real vLLM CPU server",
        "",
        f"Command: `.venv/bin/python benchmarks/overhead_host.py --rounds {a['rounds']} --segment-s {a['segment_s']} "
        f"--concurrency {a['concurrency']}` ({res.get('when', '')}; 2-core machine shared with other jobs).",
        f"Load: closed loop, concurrency {a['concurrency']}, unique ~120-word prompts, {a['output_tokens']} output "
        "tokens, streamed. Each round = one segment with the probe and one without, order flipped every round.",
        "",
        "| setting | tok/s without | tok/s with | throughput with/without (median) | ITL P99 with/without (median) "
        "| py-spy CPU (cores) |",
        "|---|---|---|---|---|---|",
    ]
    for name, s in res["settings"].items():
        lines.append(f"| {name} | {s['tok_s_off_median']:.0f} | {s['tok_s_on_median']:.0f} | "
                     f"{s['throughput_ratio_median']:.3f} | {s['itl_p99_ratio_median']:.3f} | "
                     f"{s['pyspy_cores_median']:.3f} |")
    lines += ["", "Per-round ratios (throughput): " + "; ".join(
        f"{n}: {', '.join(f'{x:.3f}' for x in s['throughput_ratios'])}" for n, s in res["settings"].items()), ""]
    path.write_text("\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=18520)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--segment-s", type=float, default=15.0)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--output-tokens", type=int, default=64)
    ap.add_argument("--only", help="run only the settings whose name contains this text")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "overhead_host")
    a = ap.parse_args()
    if a.only:
        for k in [k for k in SETTINGS if a.only not in k]:
            del SETTINGS[k]
    res = asyncio.run(main_async(a))
    res["when"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    a.out.parent.mkdir(parents=True, exist_ok=True)
    Path(str(a.out) + ".json").write_text(json.dumps(res, indent=2, default=str))
    write_md(res, Path(str(a.out) + ".md"))
    print(Path(str(a.out) + ".md").read_text())


if __name__ == "__main__":
    main()
