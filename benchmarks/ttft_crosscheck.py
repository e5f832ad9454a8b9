"""Cross-check client-side TTFT against the server's own TTFT histogram (vLLM /metrics).

Two modes:

* live (default): start the real vLLM CPU server (harness/engine.py), run the Prometheus probe while a
  simple streaming client sends N unique-prompt /v1/completions requests at a fixed concurrency, write a
  small capture bundle (requests + metrics streams), then compare.
* ``--bundle DIR``: read an existing capture bundle (client TTFT from ``requests.jsonl``:
  ``first_token_ns - sent_ns`` of ok, non-warmup requests; server histogram from ``metrics.jsonl``).

The comparison: client P50/P90/P99 versus the server histogram's interpolated quantile and the bucket
(lo, hi] that holds it; the client value "agrees" when it lies in that bucket. A bucket-by-bucket CDF
table shows where the two distributions differ. Results go to stdout and (``--results``) a markdown file.

    python benchmarks/ttft_crosscheck.py --requests 300 --concurrency 16 --results benchmarks/results/ttft_crosscheck.md
    python benchmarks/ttft_crosscheck.py --bundle path/to/bundle
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import aiohttp  # noqa: E402

from diagnose.analysis import Window  # noqa: E402
from diagnose.errors import DiagnoseError  # noqa: E402
from diagnose.io.bundle import open_bundle  # noqa: E402
from diagnose.io.writer import BundleWriter  # noqa: E402
from diagnose.normalize import prometheus as prom  # noqa: E402
from diagnose.normalize.prom_hist import cross_check, empirical_cdf_at  # noqa: E402
from diagnose.probes.base import CaptureContext, Target  # noqa: E402
from diagnose.probes.prometheus import PrometheusProbe  # noqa: E402

WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa", "lambda", "mu", "nu", "xi", "omicron", "pi", "rho", "sigma", "tau", "upsilon", "phi", "chi", "psi", "omega", "red", "green", "blue", "cyan", "magenta", "yellow", "black", "white"]


async def _one(session: aiohttp.ClientSession, url: str, rid: int, prompt_words: int, max_tokens: int,
               rng: random.Random) -> dict[str, Any]:
    prompt = f"{rid} " + " ".join(rng.choice(WORDS) for _ in range(prompt_words))  # unique: no prefix-cache hits
    body = {"model": "tiny-llama", "prompt": prompt, "max_tokens": max_tokens, "stream": True, "ignore_eos": True}
    rec: dict[str, Any] = {"rid": rid, "phase": 0, "warmup": False, "api": "completions", "intended_ns": None,
                           "sent_ns": time.monotonic_ns(), "headers_ns": None, "first_token_ns": None,
                           "end_ns": None, "ok": False, "http_status": None, "error": None, "n_chunks": 0}
    try:
        async with session.post(f"{url}/v1/completions", json=body) as r:
            rec["headers_ns"] = time.monotonic_ns()
            rec["http_status"] = r.status
            async for raw in r.content:
                line = raw.strip()
                if not line.startswith(b"data:") or line == b"data: [DONE]":
                    continue
                chunk = json.loads(line[5:])
                if any(c.get("text") for c in chunk.get("choices") or []):
                    if rec["first_token_ns"] is None:
                        rec["first_token_ns"] = time.monotonic_ns()
                    rec["n_chunks"] += 1
            rec["ok"] = r.status == 200 and rec["first_token_ns"] is not None
    except aiohttp.ClientError as e:
        rec["error"] = "connect"
        rec["error_detail"] = str(e)
    rec["end_ns"] = time.monotonic_ns()
    return rec


async def live_capture(url: str, out: Path, n: int, concurrency: int, prompt_words: int, max_tokens: int,
                       interval_s: float) -> Path:
    writer = BundleWriter(out, target={"url": url, "engine": "vllm"}, overwrite=True,
                          workload={"mode": "concurrency", "concurrency": concurrency, "num_requests": n})
    ctx = CaptureContext(bundle=writer, target=Target(url=url, engine="vllm"), stop=asyncio.Event())
    probe = PrometheusProbe(interval_s=interval_s)
    probe_task = asyncio.create_task(probe.run(ctx))
    await asyncio.sleep(1.5 * interval_s)  # a baseline scrape before the first request
    reqs = writer.stream("requests", "client requests (benchmark client)")
    rng = random.Random(0)
    queue = list(range(n))
    t0 = time.monotonic_ns()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        async def worker() -> None:
            while queue:
                reqs.write(await _one(session, url, queue.pop(0), prompt_words, max_tokens, rng))
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    writer.stream("phases").write({"phase": 0, "name": f"c{concurrency}", "mode": "concurrency",
                                   "concurrency": concurrency, "rate": None, "start_ns": t0,
                                   "end_ns": time.monotonic_ns(), "warmup_requests": 0})
    ctx.stop.set()
    status = await probe_task
    writer.set_probe_status(status)
    writer.finish()
    print(f"probe: {status.state} {status.reason} {status.detail}", file=sys.stderr)
    return out


def compare(bundle_dir: Path) -> str:
    bundle = open_bundle(bundle_dir)
    anchor = bundle.anchor_mono_ns
    reqs = [r for r in bundle.iter_records("requests") if r.get("ok") and not r.get("warmup")
            and r.get("first_token_ns") is not None and r.get("sent_ns") is not None]
    if not reqs:
        raise DiagnoseError(f"{bundle_dir}: no successful measured requests with a first token in requests.jsonl")
    client_s = [(r["first_token_ns"] - r["sent_ns"]) / 1e9 for r in reqs]
    window = Window((min(r["sent_ns"] for r in reqs) - anchor) / 1e9, (max(r["end_ns"] for r in reqs) - anchor) / 1e9)
    tables = prom.tables(bundle)
    if not tables:
        raise DiagnoseError(f"{bundle_dir}: no Prometheus scrapes (metrics.jsonl) to compare with")
    les, cum = prom.hist_window(tables, "ttft_seconds", window)
    mean = prom.hist_mean(tables, "ttft_seconds", window)
    rows = cross_check(client_s, les, cum, total_sum=mean[0] * mean[1] if mean else None)
    if not rows:
        raise DiagnoseError(f"{bundle_dir}: the server TTFT histogram has no observations in the window")
    scr = tables["metrics_scrapes"]
    fmt = lambda x: "+Inf" if x == float("inf") else f"{x * 1e3:g}"  # noqa: E731
    lines = [f"Bundle: `{bundle_dir}`  ", f"Engine: {tables['metrics']['engine'].iloc[0]}; client requests: "
             f"{len(client_s)}; server TTFT observations in window: {cum[-1]:.0f}; scrapes: {len(scr)} "
             f"(scrape_ms p50 {scr['scrape_ms'].median():.1f}, max {scr['scrape_ms'].max():.1f}; "
             f"parse_ms p50 {scr['parse_ms'].median():.1f})", "",
             "| quantile | client TTFT ms | server histogram ms (interpolated) | server bucket (lo, hi] ms "
             "| client in server bucket | client's bucket ms |", "|---|---|---|---|---|---|"]
    client_mean = sum(client_s) / len(client_s)
    offset = client_mean - mean[0] if mean else 0.0
    for r in rows:
        lines.append(f"| P{r.q * 100:g} | {r.client * 1e3:.1f} | {r.server.value * 1e3:.1f} | "
                     f"({fmt(r.server.lo)}, {fmt(r.server.hi)}] | {'yes' if r.agrees else 'NO'} | "
                     f"({fmt(r.client_bucket[0])}, {fmt(r.client_bucket[1])}] |")
    if mean:
        lines.append(f"| mean | {client_mean * 1e3:.1f} | {mean[0] * 1e3:.1f} (exact: _sum/_count) | | | "
                     f"client - server {offset * 1e3:+.1f} ms |")
    client_cdf = empirical_cdf_at(client_s, les)
    ks = max(abs(c / cum[-1] - cc) for c, cc in zip(cum, client_cdf, strict=True))
    lines += ["", f"Largest gap between the two cumulative distributions at a bucket bound: {ks:.3f}.", "",
              "| bucket le ms | server cumulative fraction | client cumulative fraction |", "|---|---|---|"]
    for le, c, cc in zip(les, cum, client_cdf, strict=True):
        if c > 0 or cc > 0:  # from the first bucket either side reaches to where both are complete
            lines.append(f"| {fmt(le)} | {c / cum[-1]:.3f} | {cc:.3f} |")
            if c == cum[-1] and cc == 1:
                break
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bundle", type=Path, help="compare an existing capture bundle instead of running a server")
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--prompt-words", type=int, default=150)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--port", type=int, default=18301)
    ap.add_argument("--server-args", default="", help="extra vLLM flags, e.g. '--max-num-seqs 2'")
    ap.add_argument("--keep", type=Path, help="write the live capture bundle here (default: a temp dir)")
    ap.add_argument("--results", type=Path, help="also write the markdown result here")
    args = ap.parse_args()
    try:
        if args.bundle:
            report = compare(args.bundle)
            header = "Bundle comparison\n\n"
        else:
            from harness.engine import VllmServer, ensure_engine

            ensure_engine()
            out = args.keep or Path(tempfile.mkdtemp(prefix="ttft-crosscheck-")) / "bundle"
            with VllmServer(port=args.port, extra_args=args.server_args.split(), startup_timeout_s=600) as server:
                asyncio.run(live_capture(server.url, out, args.requests, args.concurrency, args.prompt_words,
                                         args.max_tokens, args.interval))
            load = os.getloadavg()[0]  # the 1-minute load average at the end of the capture
            report = compare(out)
            header = (f"Live run (machine: {os.cpu_count()} cores, load average {load:.1f} at the end): vLLM CPU 0.32.0 (tiny-llama), {args.requests} streamed /v1/completions at "
                      f"concurrency {args.concurrency}, ~{args.prompt_words}-word unique prompts, "
                      f"max_tokens {args.max_tokens}, scrape every {args.interval:g} s.\n"
                      f"Command: `python benchmarks/ttft_crosscheck.py --requests {args.requests} "
                      f"--concurrency {args.concurrency}"
                      + (f" --server-args '{args.server_args}'" if args.server_args else "") + "`\n\n")
    except DiagnoseError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    text = header + report
    try:
        print(text)
    except BrokenPipeError:
        pass
    if args.results:
        args.results.parent.mkdir(parents=True, exist_ok=True)
        with open(args.results, "a") as fh:
            fh.write(f"\n## {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n\n{text}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
