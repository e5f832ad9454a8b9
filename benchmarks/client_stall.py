#!/usr/bin/env python3
"""Long-run loop-stall benchmark of the load client (issue 18): event-loop lag P99 and MAX over a long capture.

Each arm runs one capture as ``diagnose attach`` does (the load probe and the Prometheus probe on one uvloop
event loop, SCHED_RR 1 like ``attach --realtime``) in a child process pinned to the client core, against the
ground-truth server (../shared/tools/truth_server.py, pinned to the other core) or against ``--url`` (a real
engine). Two loads: closed loop at concurrency 256 and open loop at 300 req/s (Poisson). Two clients, in the
same run, alternated per load:

  new   this tree's load probe (I/O off the loop, bounded flush, phase-boundary GC; stall causes recorded)
  old   the load probe of ``--old-ref`` (default: c7ebd27, the commit before the fix): its probes/load.py and
        probes/load_monitor.py are read from git and loaded in place of this tree's

From each capture's ``client_health`` stream (one sample per 0.1 s, each the worst of ten 10 ms timer wakes):
loop-lag P50, P99 and max, the number of samples over 5 ms, the largest gap between samples, the stall causes
the new client recorded, and how far the records on disk lagged behind the finished requests (sampled every
second: records are flushed continuously, not at the end).

    python benchmarks/client_stall.py --seconds 300 --out benchmarks/results/client_stall.md
        [--loads c256,r300] [--arms new,old] [--url http://127.0.0.1:8000 (a running engine)]
        [--output-tokens 64] [--server-core 0] [--client-core 1] [--no-realtime] [--new-ref COMMIT]

Needs root (or CAP_SYS_NICE) for SCHED_RR; without it the arms run at normal priority and the table says so.
The worker mode (``--worker``) runs one capture in this process and prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import types
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TRUTH = ROOT.parent / "shared" / "tools" / "truth_server.py"  # ../shared beside the checkout
OLD_REF = "c7ebd27"
STALL_MS = 5.0


# -- worker (one capture, in a child process) ---------------------------------------------------------
def _load_ref(ref: str) -> None:
    """Replaces this tree's load probe (and its monitor) with the one of git ``ref``, before anything imports
    them. The rest of the package (bundle writer, HTTP client, workload) is this tree's."""
    for name, path in (("diagnose.probes.load_monitor", "probes/load_monitor.py"), ("diagnose.probes.load", "probes/load.py")):
        src = subprocess.run(["git", "-C", str(ROOT), "show", f"{ref}:{path}"], check=True, capture_output=True,
                             text=True).stdout
        mod = types.ModuleType(name)
        mod.__file__ = f"<{ref}>/{path}"
        mod.__package__ = "diagnose.probes"
        sys.modules[name] = mod
        exec(compile(src, mod.__file__, "exec"), mod.__dict__)  # noqa: S102 - our own code at another commit


async def _capture(url: str, load: str, seconds: float, out_tokens: int, model: str | None) -> dict[str, Any]:
    from diagnose.capture.run import run_capture
    from diagnose.capture.workload import WorkloadSpec, build_phases
    from diagnose.io.bundle import open_bundle
    from diagnose.io.writer import BundleWriter
    from diagnose.probes import load as load_mod
    from diagnose.probes.base import Target
    from diagnose.probes.load import LoadProbe
    from diagnose.probes.prometheus import PrometheusProbe

    conc, rate = (load[1:], None) if load.startswith("c") else (None, load[1:])
    mode, phases = build_phases(conc, rate)
    spec = WorkloadSpec(mode=mode, phases=phases, duration_s=seconds, input_tokens=128, output_tokens=out_tokens,
                        warmup_requests=2, model=model)
    d = Path(tempfile.mkdtemp(prefix="client_stall_"))
    bw = BundleWriter(d / "b")
    probe = LoadProbe(spec, progress=False)
    backlog: list[int] = []

    runs: list[Any] = []
    init = load_mod._LoadRun.__init__

    def spy(self: Any, *a: Any, **k: Any) -> None:  # keeps the run object, for its counters
        init(self, *a, **k)
        runs.append(self)

    load_mod._LoadRun.__init__ = spy

    async def watch_backlog() -> None:
        """Finished requests not yet on disk, every second (the load run's counters vs the stream's)."""
        while True:
            await asyncio.sleep(1.0)
            sw = bw._streams.get("requests")
            if sw is not None and runs:
                backlog.append(int(runs[0].stats.done) - int(sw.records))

    w = asyncio.ensure_future(watch_backlog())
    t0 = time.monotonic()
    result = await run_capture(bw, Target(url=url, model=model), [probe, PrometheusProbe(interval_s=1.0)])
    wall = time.monotonic() - t0
    maxrss_mb = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)  # before reading the bundle back
    w.cancel()
    b = open_bundle(d / "b")
    health = b.records("client_health")
    lags = sorted(float(h["loop_lag_ms"]) for h in health if isinstance(h.get("loop_lag_ms"), (int, float)))
    ts = [int(h["t_ns"]) for h in health]
    gaps = [(b2 - a2) / 1e6 for a2, b2 in zip(ts, ts[1:], strict=False)]
    worst = sorted(health, key=lambda h: -(h.get("loop_lag_ms") or 0.0))[:8]
    reqs = b.records("requests")
    st = result.statuses.get("load")
    import shutil

    shutil.rmtree(d, ignore_errors=True)

    def pct(q: float) -> float:
        return lags[min(len(lags) - 1, int(round(q / 100 * (len(lags) - 1))))] if lags else float("nan")

    return {"load": load, "samples": len(lags), "lag_p50_ms": pct(50), "lag_p99_ms": pct(99),
            "lag_max_ms": lags[-1] if lags else float("nan"), "over_5ms": sum(x > STALL_MS for x in lags),
            "max_gap_ms": max(gaps) if gaps else float("nan"), "requests": len(reqs),
            "health_t0_ns": ts[0] if ts else None,
            "ok": sum(1 for r in reqs if r.get("ok")), "wall_s": wall,
            "backlog_max": max(backlog) if backlog else None, "backlog_samples": len(backlog),
            "worst": [{"t_s": round((int(h["t_ns"]) - ts[0]) / 1e9, 1),
                       **{k: h.get(k) for k in ("loop_lag_ms", "stall_cause", "gc_pause_ms", "gc_generation",
                                                "flush_max_ms", "flush_records", "in_flight", "cpu_percent",
                                                "off_cpu_ms", "run_wait_ms", "steal_ms", "major_faults")}}
                      for h in worst],
            "stalls": (st.detail.get("client_stalls") if st is not None else None),
            "status": st.reason if st is not None else "?",
            "realtime": os.sched_getscheduler(0) == os.SCHED_RR,
            "maxrss_mb": maxrss_mb}


def worker_main(args: argparse.Namespace) -> None:
    if args.arm == "old":
        _load_ref(args.old_ref)
    elif args.new_ref:
        _load_ref(args.new_ref)
    import uvloop

    from diagnose.capture.realtime import RealtimePriority

    rt = RealtimePriority() if args.realtime else None
    if rt is not None:
        rt.apply()
    try:
        res = uvloop.run(_capture(args.url, args.load, args.seconds, args.output_tokens, args.model))
    finally:
        if rt is not None:
            rt.restore()
    res["arm"] = args.arm
    print(json.dumps(res))


# -- orchestration ------------------------------------------------------------------------------------
def _wait_http(url: str, timeout_s: float = 30.0) -> None:
    t_end = time.monotonic() + timeout_s
    while time.monotonic() < t_end:
        try:
            with urllib.request.urlopen(url + "/v1/models", timeout=5):
                return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"server at {url} did not answer within {timeout_s:.0f} s")


def _reset(url: str) -> None:
    try:
        req = urllib.request.Request(url + "/truth/reset", data=b"{}", headers={"Content-Type": "application/json"})
        urllib.request.urlopen(req, timeout=30).read()
    except OSError:
        pass  # a real engine has no /truth


def _run_arm(args: argparse.Namespace, url: str, load: str, arm: str) -> dict[str, Any]:
    cmd = ["taskset", "-c", str(args.client_core), sys.executable, __file__, "--worker", "--arm", arm, "--load", load,
           "--url", url, "--seconds", str(args.seconds), "--output-tokens", str(args.output_tokens),
           "--old-ref", args.old_ref, *(["--new-ref", args.new_ref] if args.new_ref else [])]
    if args.model:
        cmd += ["--model", args.model]
    if not args.realtime:
        cmd.append("--no-realtime")
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.seconds + 240)
    if p.returncode != 0:
        raise SystemExit(f"worker {arm} {load} failed ({p.returncode}): {p.stderr[-2000:]}")
    res: dict[str, Any] = json.loads(p.stdout.strip().splitlines()[-1])
    print(f"{load} {arm}: lag P99 {res['lag_p99_ms']:.2f} ms max {res['lag_max_ms']:.2f} ms, "
          f">5 ms {res['over_5ms']}/{res['samples']}, {res['requests']} requests", file=sys.stderr, flush=True)
    return res


def _fmt(x: Any, nd: int = 2) -> str:
    return "-" if x is None else (f"{x:.{nd}f}" if isinstance(x, float) else str(x))


def write_md(results: list[dict[str, Any]], args: argparse.Namespace, out: Path, target: str) -> None:
    lines = ["# Load-client loop stalls over a long capture (benchmarks/client_stall.py, issue 18)", "",
             f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on this 2-core machine shared with "
             f"other sessions; target {target}; {args.seconds:.0f} s per capture, {args.output_tokens}-token outputs, "
             f"load + Prometheus probes on one uvloop loop, client pinned to core {args.client_core} at "
             f"{'SCHED_RR 1 (attach --realtime)' if args.realtime else 'normal priority'}; `old` = the load probe "
             f"of {args.old_ref} loaded in place of this tree's, in the same run.", "",
             "Loop lag = how late a 10 ms timer wakes (each 0.1 s health sample keeps the worst of its ten wakes). "
             "Backlog = finished requests not yet on disk, sampled every second (max). Max RSS = the client "
             "process's peak resident memory by the end of the capture.", "",
             "| load | client | samples | lag P50 ms | lag P99 ms | lag MAX ms | samples > 5 ms | max sample gap ms | "
             "requests ok | backlog max | max RSS MB | realtime |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['load']} | {r['arm']} | {r['samples']} | {_fmt(r['lag_p50_ms'])} | {_fmt(r['lag_p99_ms'])} "
                     f"| **{_fmt(r['lag_max_ms'])}** | {r['over_5ms']} | {_fmt(r['max_gap_ms'], 1)} | {r['ok']} "
                     f"| {_fmt(r['backlog_max'])} | {_fmt(r.get('maxrss_mb'), 0)} | {r['realtime']} |")
    lines += ["", "Ratios (old / new, same run):", ""]
    for load in dict.fromkeys(r["load"] for r in results):
        by = {r["arm"]: r for r in results if r["load"] == load}
        if "new" in by and "old" in by:
            n, o = by["new"], by["old"]
            lines.append(f"- {load}: lag MAX {o['lag_max_ms']:.2f} / {n['lag_max_ms']:.2f} ms = "
                         f"{o['lag_max_ms'] / max(1e-9, n['lag_max_ms']):.2f}x; lag P99 {o['lag_p99_ms']:.2f} / "
                         f"{n['lag_p99_ms']:.2f} ms = {o['lag_p99_ms'] / max(1e-9, n['lag_p99_ms']):.2f}x; "
                         f"samples > 5 ms {o['over_5ms']} / {n['over_5ms']}")
    lines += ["", "Worst samples and recorded causes (new client: `stall_cause`, GC pause, flush slice):", ""]
    for r in results:
        w = "; ".join(f"{x['loop_lag_ms']} ms" + (f" at {x['t_s']} s" if "t_s" in x else "") + (f" ({x['stall_cause']}, gc {x['gc_pause_ms']} ms gen "
                                                    f"{x['gc_generation']}, flush {x['flush_max_ms']} ms/"
                                                    f"{x['flush_records']} rec)" if "stall_cause" in x and
                                                   x.get("gc_pause_ms") is not None else "")
                      for x in r["worst"][:3])
        lines.append(f"- {r['load']} {r['arm']}: {w}")
        if r.get("stalls"):
            lines.append(f"  - run summary: {json.dumps(r['stalls'])}")
    out.write_text("\n".join(lines) + "\n")
    out.with_suffix(".json").write_text(json.dumps(results, indent=1) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--arm", default="new", choices=["new", "old"])
    ap.add_argument("--arms", default="new,old")
    ap.add_argument("--load", default="c256")
    ap.add_argument("--loads", default="c256,r300")
    ap.add_argument("--url", default=None, help="a running server (default: start the truth server)")
    ap.add_argument("--model", default=None)
    ap.add_argument("--seconds", type=float, default=300.0)
    ap.add_argument("--output-tokens", type=int, default=64)
    ap.add_argument("--old-ref", default=OLD_REF)
    ap.add_argument("--new-ref", default=None, help="load the new arm's probe from this commit too (default: the tree)")
    ap.add_argument("--truth-server", default=str(TRUTH))
    ap.add_argument("--ttft-ms", type=float, default=50.0)
    ap.add_argument("--itl-ms", type=float, default=5.0)
    ap.add_argument("--port", type=int, default=18291)
    ap.add_argument("--server-core", type=int, default=0)
    ap.add_argument("--client-core", type=int, default=1)
    ap.add_argument("--no-realtime", dest="realtime", action="store_false")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "client_stall.md")
    args = ap.parse_args()
    if args.worker:
        worker_main(args)
        return
    server: subprocess.Popen[bytes] | None = None
    url = args.url
    target = f"{url} (a running engine)" if url else f"the truth server (TTFT {args.ttft_ms:g} ms, ITL {args.itl_ms:g} ms)"
    if url is None:
        if not Path(args.truth_server).is_file():
            raise SystemExit(f"truth server not found: {args.truth_server} (give --truth-server PATH)")
        url = f"http://127.0.0.1:{args.port}"
        server = subprocess.Popen(["taskset", "-c", str(args.server_core), sys.executable, args.truth_server,
                                   "--port", str(args.port), "--ttft-ms", str(args.ttft_ms), "--itl-ms",
                                   str(args.itl_ms)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    results: list[dict[str, Any]] = []
    try:
        _wait_http(url)
        for load in args.loads.split(","):
            for arm in args.arms.split(","):
                _reset(url)
                results.append(_run_arm(args, url, load, arm))
                write_md(results, args, args.out, target)  # partial results survive an interrupted run
    finally:
        if server is not None:
            server.terminate()
            server.wait(10)
    print(args.out.read_text())


if __name__ == "__main__":
    main()
