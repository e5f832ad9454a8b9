"""What each probe costs the real vLLM CPU server: throughput and ITL P99 with and without it, alternating.

One server (tracing on: ``--otlp-traces-endpoint`` at the receiver's port, ``--profiler-config``), then
blocks of the same closed-loop load (the real load probe, ``run_capture``) alternating without / with the
probe in ABBA order (off,on / on,off ...), so drift hits both arms alike. Each block uses a fresh prompt
seed (no prefix-cache carry-over). Per block: output tok/s, ITL P99 and TTFT P50 of the measured requests,
this process's CPU seconds (the receiver and the load client run in it), the engine's CPU per output token,
the probe's own CPU where it reports it (py-spy), and the client's loop lag P99. The client runs at SCHED_RR 1
(``--realtime``, the default; like ``attach --realtime``): at normal priority the CPU engine starved it on the
2-core test machine (loop lag P99 0.4-1.6 s), and every extra thing in this process then slowed the closed
loop, so the blocks measured the client rather than the server. Pairs with a starved block are left out.

Probes, each at its default settings (what ``diagnose attach`` uses unless told otherwise), every arm under
attach's default overhead budget (``--overhead-budget 1%``, diagnose/capture/overhead.py) unless ``--budget`` says else:
  attach      what ``diagnose attach`` runs with no probe flags: the /metrics scraper (1 s, adapting to the
              budget), the /proc counters (``host``) and NVML (unavailable without a GPU)
  prometheus  the /metrics scraper alone (on by default in attach), 1 s interval
  prometheus_nobudget  the same at a fixed 1 s, no budget: what attach did before the budget (issue 17)
  otel        the OTLP receiver (``--otlp``) against nothing listening: the engine's exporter is refused
              and drops its spans in the off arm, so the difference is the receiver plus the engine's own
              export work (which ``otel_sink`` separates)
  pyspy       host stacks of every engine process (``--pyspy``), 10 Hz, nonblocking
  otel_sink   the OTLP receiver against a null sink on the same port (drops the exports undecoded): the
              engine's export succeeds in both arms, so this is the receiver's own cost
  defaults    prometheus + otel + pyspy together
  profiler    the engine profiler trigger (``--profile-iterations``): deliberately costly for its window

    python benchmarks/overhead.py [--pairs 6] [--block-s 12] [--concurrency 8] [--budget 1%]
        [--probes attach prometheus_nobudget pyspy otel defaults] [--results benchmarks/results/overhead.md]

Per pair the summary also gives what the probes measured they cost (diagnose/capture/overhead.py, the share of one
core the report states), the median over the "on" blocks, beside the throughput and CPU ratios.
Each median of pair ratios (throughput, engine CPU per output token) comes with a distribution-free
confidence interval (``median_ci``: order statistics, coverage from the binomial distribution), so a run
says whether it can tell a 1% cost from noise at all.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from diagnose.capture.overhead import DEFAULT_BUDGET, parse_budget, probe_cost  # noqa: E402
from diagnose.capture.realtime import RealtimePriority  # noqa: E402
from diagnose.capture.run import run_capture  # noqa: E402
from diagnose.capture.workload import Phase, WorkloadSpec  # noqa: E402
from diagnose.io.bundle import open_bundle  # noqa: E402
from diagnose.io.writer import BundleWriter  # noqa: E402
from diagnose.model import ProbeStatus  # noqa: E402
from diagnose.probes.base import CaptureContext, Probe, Target  # noqa: E402
from diagnose.probes.load import LoadProbe  # noqa: E402
from diagnose.probes.nvml import NvmlProbe  # noqa: E402
from diagnose.probes.otel import OtlpReceiverProbe  # noqa: E402
from diagnose.probes.profiler import ProfilerProbe  # noqa: E402
from diagnose.probes.prometheus import PrometheusProbe  # noqa: E402
from diagnose.probes.pyspy import PySpyProbe  # noqa: E402
from harness.engine import VllmServer, ensure_engine  # noqa: E402

LAG_VALID_MS = 50.0  # client loop lag P99 above this: the block measured a starved client


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def block_metrics(path: Path) -> dict[str, float]:
    b = open_bundle(path)
    every = [r for r in b.records("requests") if r.get("ok")]
    tokens_all = sum(int(r.get("output_tokens_usage") or r.get("output_tokens_chunks") or 0) for r in every)
    reqs = [r for r in every if not r.get("warmup")]
    if not reqs:
        return {"tps": float("nan"), "itl_p99_ms": float("nan"), "ttft_p50_ms": float("nan"), "requests": 0}
    rids = {r["rid"] for r in reqs}
    gaps = [np.diff(np.asarray(c["t_ns"], dtype=np.int64)) / 1e6 for c in b.records("chunks") if c.get("rid") in rids]
    tokens = sum(int(r.get("output_tokens_usage") or r.get("output_tokens_chunks") or 0) for r in reqs)
    span_s = (max(r["end_ns"] for r in reqs) - min(r["sent_ns"] for r in reqs)) / 1e9
    ttft = [(r["first_token_ns"] - r["sent_ns"]) / 1e6 for r in reqs if r.get("first_token_ns")]
    pooled = np.concatenate(gaps) if gaps else np.array([np.nan])
    lags = [r["loop_lag_ms"] for r in b.records("client_health") if r.get("loop_lag_ms") is not None]
    return {"tps": tokens / span_s, "itl_p99_ms": float(np.percentile(pooled, 99)),
            "ttft_p50_ms": float(np.median(ttft)), "requests": len(reqs), "tokens_all": tokens_all,
            "requests_all": len(every),
            "loop_lag_p99_ms": float(np.percentile(lags, 99)) if lags else float("nan")}


def engine_cpu_s(server: VllmServer) -> float:
    """CPU seconds used so far by the engine's processes (API server, EngineCore, Worker)."""
    total = 0.0
    for p in server.processes():
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except Exception:  # noqa: BLE001 - a process that just exited counts as 0
            continue
    return total


async def run_block(server: VllmServer, out: Path, seed: int, args: argparse.Namespace,
                    extra: list[Probe], options: dict[str, Any] | None = None) -> dict[str, Any]:
    url = server.url
    spec = WorkloadSpec(mode="concurrency", phases=(Phase(0, f"c{args.concurrency}", concurrency=args.concurrency),),
                        duration_s=args.block_s, warmup_requests=2, input_tokens=args.input_tokens,
                        output_tokens=args.output_tokens, seed=seed)
    bw = BundleWriter(out, target={"url": url}, workload=spec.to_json(), options=dict(options or {}))
    target = Target(url=url, engine="vllm")
    c0, e0, t0 = cpu_s(), engine_cpu_s(server), time.monotonic()
    res = await run_capture(bw, target, [LoadProbe(spec, progress=False), *extra], options=options)
    m = block_metrics(out)
    m["cpu_s"] = cpu_s() - c0
    m["engine_cpu_s"] = engine_cpu_s(server) - e0
    m["engine_cpu_ms_per_token"] = m["engine_cpu_s"] * 1e3 / max(1, m.get("tokens_all", 0))
    m["wall_s"] = time.monotonic() - t0
    m["statuses"] = {k: (v.state, v.reason[:80]) for k, v in res.statuses.items()}
    spy = res.statuses.get("pyspy")
    if spy is not None and spy.detail.get("pyspy_cpu_s") is not None:
        m["pyspy_cores"] = float(spy.detail["pyspy_cpu_s"]) / max(1e-9, m["wall_s"])
    m["detail"] = {k: v.detail for k, v in res.statuses.items() if k != "load"}
    pc = probe_cost({"probes": {k: v.to_json() for k, v in res.statuses.items()}, "options": options or {}}) \
        if extra else None  # what the bundle's manifest holds, without reading it again
    if pc is not None:
        m["probe_cost"] = pc["share"]
        m["probe_own_cpu"] = pc["own_share"]
        m["probe_cost_adapted"] = pc["adapted"]
    return m


SENDER = r"""
import sys, time
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind
proto, endpoint, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
if proto == "grpc":
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    exp = OTLPSpanExporter(endpoint=endpoint, insecure=True)
else:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    exp = OTLPSpanExporter(endpoint=endpoint)
tp = TracerProvider(resource=Resource.create({"service.name": "vllm", "vllm.process_id": "1"}))
tp.add_span_processor(BatchSpanProcessor(exp, max_queue_size=max(n + 1, 512), max_export_batch_size=512))
tr = tp.get_tracer("vllm.tracing.otel")
attrs = {"gen_ai.latency.time_to_first_token": 0.04, "gen_ai.latency.e2e": 0.3, "gen_ai.latency.time_in_queue": 0.001,
         "gen_ai.latency.time_in_model_prefill": 0.02, "gen_ai.latency.time_in_model_decode": 0.25,
         "gen_ai.latency.time_in_model_inference": 0.27, "gen_ai.usage.prompt_tokens": 128,
         "gen_ai.usage.completion_tokens": 64, "gen_ai.request.id": "cmpl-0123456789abcdef-0",
         "gen_ai.request.top_p": 1.0, "gen_ai.request.max_tokens": 64, "gen_ai.request.temperature": 1.0,
         "gen_ai.request.n": 1}
for i in range(n):
    tr.start_span("llm_request", kind=SpanKind.SERVER, attributes=attrs).end()
tp.force_flush(60_000)
tp.shutdown()
"""


async def receiver_cost(n: int, proto: str) -> dict[str, float]:
    """This process's CPU per span while another process exports ``n`` vLLM-shaped spans to our receiver
    (batches of 512, like vLLM's BatchSpanProcessor), minus the receiver's idle CPU over the same time."""
    tmp = Path(tempfile.mkdtemp(prefix="otel-rx-"))
    bw = BundleWriter(tmp / "b")
    ctx = CaptureContext(bundle=bw, target=Target(url=""), stop=asyncio.Event())
    probe = OtlpReceiverProbe(grpc_port=0, http_port=0, drain_s=0.0)
    task = asyncio.create_task(probe.run(ctx))
    while "otel_receiver" not in ctx.shared:
        await asyncio.sleep(0.01)
    ep = ctx.shared["otel_receiver"][proto]
    c0, t0 = cpu_s(), time.monotonic()
    await asyncio.sleep(2.0)
    idle_per_s = (cpu_s() - c0) / (time.monotonic() - t0)
    c0, t0 = cpu_s(), time.monotonic()
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", SENDER, proto, ep, str(n))
    await proc.wait()
    while probe.counters.spans < n and time.monotonic() - t0 < 120:
        await asyncio.sleep(0.05)
    wall = time.monotonic() - t0
    busy = cpu_s() - c0 - idle_per_s * wall
    got = probe.counters.spans
    ctx.stop.set()
    await task
    bw.finish()
    return {"spans": got, "cpu_us_per_span": busy * 1e6 / max(1, got), "idle_cpu_per_s": idle_per_s,
            "bytes_per_span": (tmp / "b" / "spans.jsonl").stat().st_size / max(1, got)}


class NullOtlpSink:
    """The "off" arm of kind ``otel_sink``: a gRPC server on the receiver's port that accepts the engine's OTLP
    trace exports and drops them undecoded. The engine's exporter then succeeds in both arms, so the
    difference is diagnose's receiver alone (decode, join fields, write), not the engine's own export work."""

    name = "otel_sink"

    def __init__(self, port: int) -> None:
        self.port = port
        self.exports = 0

    def available(self, ctx: CaptureContext) -> tuple[bool, str]:
        return True, ""

    async def run(self, ctx: CaptureContext) -> ProbeStatus:
        import grpc

        async def export(request: bytes, context: object) -> bytes:
            self.exports += 1
            return b""  # an empty ExportTraceServiceResponse

        server = grpc.aio.server()
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            "opentelemetry.proto.collector.trace.v1.TraceService",
            {"Export": grpc.unary_unary_rpc_method_handler(export)}),))  # no deserializer: raw bytes
        server.add_insecure_port(f"127.0.0.1:{self.port}")
        await server.start()
        try:
            await ctx.stop.wait()
        finally:
            await server.stop(0)
        return ProbeStatus(self.name, "ok", f"{self.exports} exports dropped", {"exports": self.exports})


def off_arm(kind: str, args: argparse.Namespace) -> list[Probe]:
    return [NullOtlpSink(args.grpc_port)] if kind == "otel_sink" else []  # type: ignore[list-item]


def make_probes(kind: str, args: argparse.Namespace, prof: Path, server: VllmServer,
                toggled: bool = False) -> list[Probe]:
    """The probes of one "on" arm, each at its defaults (the receiver on the ports the engine exports to;
    ``toggled``: no drain wait for late spans when the window ends)."""
    if kind == "defaults":
        return [p for k in ("prometheus", "otel", "pyspy") for p in make_probes(k, args, prof, server, toggled)]
    if kind == "attach":  # attach with no probe flags (diagnose.probes.*.SPEC: enabled by default)
        return [PrometheusProbe(), PySpyProbe(pid=server.pid, stacks=False), NvmlProbe()]
    if kind in ("prometheus", "prometheus_nobudget"):
        return [PrometheusProbe()]
    if kind in ("otel", "otel_sink"):
        return [OtlpReceiverProbe(grpc_port=args.grpc_port, http_port=args.http_port,
                                  **({"drain_s": 0.0} if toggled else {}))]
    if kind == "pyspy":
        return [PySpyProbe(pid=server.pid)]
    return [ProfilerProbe(prof)]


async def main_async(args: argparse.Namespace) -> str:
    tmp = Path(tempfile.mkdtemp(prefix="overhead-"))
    prof = tmp / "prof"
    load0 = os.getloadavg()[0]
    server = VllmServer(port=args.port, otlp_traces_endpoint=f"http://127.0.0.1:{args.grpc_port}",
                        profiler_dir=prof, log_path=tmp / "server.log", startup_timeout_s=900)
    await asyncio.to_thread(server.start)
    rows: list[dict[str, Any]] = []
    try:
        await run_block(server, tmp / "warmup", 999, args, [])  # compile/warm caches, discarded
        seed = 0
        for kind in args.probes:
            for pair in range(args.pairs):
                order = (False, True) if pair % 2 == 0 else (True, False)
                for on in order:
                    seed += 1
                    extra = make_probes(kind, args, prof, server) if on else off_arm(kind, args)
                    opts = {"overhead_budget": None if kind == "prometheus_nobudget" else args.budget}
                    m = await run_block(server, tmp / f"{kind}-{seed}", seed, args, extra, opts)
                    m.update(probe=kind, on=on, pair=pair)
                    rows.append(m)
                    cost_txt = (f", probe cost {m['probe_cost']:.2%} (own CPU {m['probe_own_cpu']:.2%})"
                                if "probe_cost" in m else "")
                    print(f"{kind} pair {pair} {'on ' if on else 'off'}: {m['tps']:.0f} tok/s{cost_txt}, "
                          f"ITL P99 {m['itl_p99_ms']:.1f} ms, TTFT P50 {m['ttft_p50_ms']:.1f} ms, "
                          f"cpu {m['cpu_s']:.1f} s, engine cpu {m['engine_cpu_s']:.1f} s, {m['statuses']}", flush=True)
    finally:
        await asyncio.to_thread(server.stop)
    return report(rows, args, load0, os.getloadavg()[0])


# -- toggle mode: one continuous load, the probe switched on and off in windows -----------------------------
async def toggle_probe(server: VllmServer, kind: str, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """One long closed-loop load run (the real load probe); the probe runs in windows ``off,on,on,off,...``
    of ``args.window_s`` (its own capture context, started and stopped each time: the start and stop costs
    are charged to the "on" windows). Output tokens per window are counted from the chunk stamps, so there
    is no per-block ramp-up and the two arms are interleaved every few seconds."""
    n = args.windows
    total_s = args.warm_s + n * args.window_s + 2.0
    spec = WorkloadSpec(mode="concurrency", phases=(Phase(0, f"c{args.concurrency}", concurrency=args.concurrency),),
                        duration_s=total_s, warmup_requests=0, input_tokens=args.input_tokens,
                        output_tokens=args.output_tokens, seed=hash(kind) % 1000)
    out = tmp / f"toggle-{kind}"
    bw = BundleWriter(out, target={"url": server.url}, workload=spec.to_json())
    target = Target(url=server.url, engine="vllm")
    load = asyncio.ensure_future(run_capture(bw, target, [LoadProbe(spec, progress=False)]))
    await asyncio.sleep(args.warm_s)
    windows: list[tuple[int, int, bool]] = []
    states: list[str] = []
    spy_cores: list[float] = []
    for i in range(n):
        on = i % 4 in (1, 2)
        t0 = time.monotonic_ns()
        if on:
            pbw = BundleWriter(tmp / f"probe-{kind}-{i}")
            pctx = CaptureContext(bundle=pbw, target=Target(url=server.url, engine="vllm", pid=server.pid),
                                  stop=asyncio.Event())
            probes = make_probes(kind, args, tmp, server, toggled=True)
            tasks = [asyncio.ensure_future(p.run(pctx)) for p in probes]
            await asyncio.sleep(args.window_s)
            pctx.stop.set()
            sts = await asyncio.gather(*tasks)
            pbw.finish()
            states += [f"{st.name} {st.state}" for st in sts]
            for st in sts:
                if st.detail.get("pyspy_cpu_s") is not None:
                    spy_cores.append(float(st.detail["pyspy_cpu_s"]) / args.window_s)
        else:
            await asyncio.sleep(args.window_s)
        windows.append((t0, time.monotonic_ns(), on))
    await load
    per_request = [np.asarray(c["t_ns"], dtype=np.int64) for c in open_bundle(out).records("chunks")]
    stamps = np.sort(np.concatenate(per_request or [np.zeros(0, np.int64)]))
    gaps_by: dict[bool, list[np.ndarray]] = {True: [], False: []}
    for t in per_request:
        for a, b, on in windows:
            sel = t[(t >= a) & (t < b)]
            if len(sel) > 1:
                gaps_by[on].append(np.diff(sel) / 1e6)
    tps = [((np.searchsorted(stamps, b) - np.searchsorted(stamps, a)) / ((b - a) / 1e9), on) for a, b, on in windows]
    # pair each "on" window with its neighbouring "off" windows (off,on,on,off: both ons against both offs)
    ratios = []
    for q in range(0, n - 3, 4):
        off = (tps[q][0] + tps[q + 3][0]) / 2
        ratios.append(((tps[q + 1][0] + tps[q + 2][0]) / 2) / off)
    itl = {on: float(np.percentile(np.concatenate(g), 99)) if g else float("nan") for on, g in gaps_by.items()}
    return {"kind": kind, "window_tps": tps, "ratios": ratios, "ratio_median": statistics.median(ratios),
            "ratio_mean": statistics.fmean(ratios), "itl_p99_on": itl[True], "itl_p99_off": itl[False],
            "tps_on": statistics.fmean(x for x, on in tps if on), "tps_off": statistics.fmean(x for x, on in tps if not on),
            "states": sorted(set(states)), "pyspy_cores": statistics.median(spy_cores) if spy_cores else None}


async def toggle_main(args: argparse.Namespace) -> str:
    tmp = Path(tempfile.mkdtemp(prefix="overhead-toggle-"))
    load0 = os.getloadavg()[0]
    server = VllmServer(port=args.port, otlp_traces_endpoint=f"http://127.0.0.1:{args.grpc_port}",
                        log_path=tmp / "server.log", startup_timeout_s=900)
    await asyncio.to_thread(server.start)
    res = []
    try:
        await run_block(server, tmp / "warmup", 999, args, [])
        for kind in args.probes:
            r = await toggle_probe(server, kind, args, tmp)
            res.append(r)
            print(f"{kind}: on/off {r['ratio_median']:.3f} (mean {r['ratio_mean']:.3f}; "
                  f"{', '.join(f'{x:.3f}' for x in r['ratios'])}); {r['states']}; windows "
                  + " ".join(f"{x:.0f}{'*' if on else ''}" for x, on in r["window_tps"]), flush=True)
    finally:
        await asyncio.to_thread(server.stop)
    out = ["# What each probe costs the real vLLM CPU server: toggled within one run", "",
           f"Command: `python benchmarks/overhead.py --mode toggle --windows {args.windows} --window-s {args.window_s:g} "
           f"--concurrency {args.concurrency} --probes {' '.join(args.probes)}` "
           f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}); load average {load0:.1f} at start, "
           f"{os.getloadavg()[0]:.1f} at the end on {os.cpu_count()} cores.", "",
           f"One closed-loop load (concurrency {args.concurrency}, {args.input_tokens}-token unique prompts, "
           f"{args.output_tokens} output tokens) per probe, {args.warm_s:g} s warm-up, then {args.windows} windows of "
           f"{args.window_s:g} s in the order off,on,on,off,...; the probe is started and stopped in each \"on\" "
           "window (its start and stop are charged to it). Output tokens per window from the chunk stamps. Ratio "
           "per quad = mean of its two on windows / mean of its two off windows.", "",
           "| probe | throughput on/off: median of quads | mean | per-quad ratios | tok/s on / off (means) | "
           "ITL P99 on / off ms | py-spy's own CPU (cores) | statuses |", "|---|---|---|---|---|---|---|---|"]
    for r in res:
        spy = f"{r['pyspy_cores']:.3f}" if r["pyspy_cores"] is not None else "-"
        out.append(f"| {r['kind']} | {r['ratio_median']:.3f} ({(r['ratio_median'] - 1) * 100:+.1f}%) | "
                   f"{r['ratio_mean']:.3f} | {', '.join(f'{x:.3f}' for x in r['ratios'])} | "
                   f"{r['tps_on']:.0f} / {r['tps_off']:.0f} | {r['itl_p99_on']:.1f} / {r['itl_p99_off']:.1f} | {spy} | "
                   f"{', '.join(r['states'])} |")
    return "\n".join(out) + "\n"


def report(rows: list[dict[str, Any]], args: argparse.Namespace, load0: float, load1: float) -> str:
    out = [
        "# What each probe costs the real vLLM CPU server (vLLM CPU 0.32.0, tiny model)", "",
        f"Command: `python benchmarks/overhead.py --pairs {args.pairs} --block-s {args.block_s:g} "
        f"--concurrency {args.concurrency} --probes {' '.join(args.probes)}` "
        f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}). "
        f"Closed loop, {args.input_tokens}-token unique prompts, {args.output_tokens} output tokens, "
        f"{args.block_s:g} s blocks, ABBA alternation on one server, overhead budget "
        f"{'off' if args.budget is None else f'{args.budget:.2%}'} (except prometheus_nobudget). Load average "
        f"{load0:.1f} at start, {load1:.1f} at the end on {os.cpu_count()} cores.", "",
        f"The load client runs at {'SCHED_RR 1 (like attach --realtime)' if args.realtime else 'normal priority'}; "
        f"a block whose client loop lag P99 exceeds {LAG_VALID_MS:g} ms measured a starved client, not the "
        "server, and its pair is left out of the summary.", "",
        "| probe | pair | arm | output tok/s | ITL P99 ms | TTFT P50 ms | requests | client loop lag P99 ms | "
        "client CPU s | engine CPU s | probe status |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        st = ", ".join(f"{k} {v[0]}" for k, v in r["statuses"].items() if k != "load") or "-"
        out.append(f"| {r['probe']} | {r['pair']} | {'on' if r['on'] else 'off'} | {r['tps']:.0f} | "
                   f"{r['itl_p99_ms']:.1f} | {r['ttft_p50_ms']:.1f} | {r['requests']} | "
                   f"{r.get('loop_lag_p99_ms', float('nan')):.1f} | {r['cpu_s']:.2f} | "
                   f"{r['engine_cpu_s']:.1f} | "
                   f"{st} {_detail(r)} |")
    out += ["", "| probe | throughput on/off (median of pairs) | per-pair ratios | ITL P99 on/off | engine CPU per "
            "output token on/off | this process's CPU s on - off | py-spy's own CPU (cores) | cost on the server "
            "measured by the probes (share of a core, median of on blocks) | diagnose's own CPU measured by the "
            "probes (same) | valid pairs |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    cis: list[tuple[str, tuple[float, float, float], tuple[float, float, float], int]] = []
    for kind in args.probes:
        pairs = []
        for p in range(args.pairs):
            arm = {r["on"]: r for r in rows if r["probe"] == kind and r["pair"] == p}
            if len(arm) == 2 and all(_valid(a) for a in arm.values()):
                pairs.append(arm)
        if not pairs:
            continue
        tps_r = [a[True]["tps"] / a[False]["tps"] for a in pairs]
        ecpu_r = [a[True]["engine_cpu_ms_per_token"] / a[False]["engine_cpu_ms_per_token"] for a in pairs]
        tps = statistics.median(tps_r)
        itl = statistics.median(a[True]["itl_p99_ms"] / a[False]["itl_p99_ms"] for a in pairs)
        cpu = statistics.median(a[True]["cpu_s"] - a[False]["cpu_s"] for a in pairs)
        ecpu = statistics.median(ecpu_r)
        cis.append((kind, median_ci(tps_r), median_ci(ecpu_r), len(pairs)))
        ratios = ", ".join(f"{a[True]['tps'] / a[False]['tps']:.3f}" for a in pairs)
        spy = [a[True]["pyspy_cores"] for a in pairs if "pyspy_cores" in a[True]]
        spy_txt = f"{statistics.median(spy):.3f}" if spy else "-"
        pcs = [a[True]["probe_cost"] for a in pairs if "probe_cost" in a[True]]
        pc_txt = f"{statistics.median(pcs):.2%}" if pcs else "-"
        owns = [a[True]["probe_own_cpu"] for a in pairs if "probe_own_cpu" in a[True]]
        own_txt = f"{statistics.median(owns):.2%}" if owns else "-"
        out.append(f"| {kind} | {tps:.3f} ({(tps - 1) * 100:+.1f}%) | {ratios} | {itl:.3f} | {ecpu:.3f} | {cpu:+.2f} | "
                   f"{spy_txt} | {pc_txt} | {own_txt} | {len(pairs)} of {args.pairs} |")
    if cis:
        out += ["", "Confidence intervals of the two medians (distribution-free: order statistics of the per-pair "
                "ratios, coverage from the binomial distribution; not an assumption of normal noise):", "",
                "| probe | throughput on/off: CI of the median | coverage | engine CPU per output token on/off: CI of "
                "the median | coverage | pairs |", "|---|---|---|---|---|---|"]
        for kind, t_ci, e_ci, n in cis:
            out.append(f"| {kind} | {(t_ci[0] - 1) * 100:+.1f}% to {(t_ci[1] - 1) * 100:+.1f}% | {t_ci[2]:.1%} | "
                       f"{(e_ci[0] - 1) * 100:+.1f}% to {(e_ci[1] - 1) * 100:+.1f}% | {e_ci[2]:.1%} | {n} |")
    adapted = sorted({x for r in rows for x in r.get("probe_cost_adapted", [])})
    if adapted:
        out += ["", "What the budget changed (from the probes' statuses, distinct lines):", ""]
        out += [f"- {x}" for x in adapted[:12]]
    return "\n".join(out) + "\n"


def median_ci(values: list[float], level: float = 0.95) -> tuple[float, float, float]:
    """(low, high, coverage): the narrowest pair of order statistics x(k), x(n-k+1) that holds the median with
    at least ``level`` probability whatever the noise's distribution (P = 1 - 2 * Binomial(n, 1/2).cdf(k - 1));
    with too few values for ``level``, the widest there is (min, max) and its coverage."""
    def binom_half_cdf(k: int, n: int) -> float:  # P(Binomial(n, 1/2) <= k), exactly
        return sum(math.comb(n, i) for i in range(k + 1)) / 2.0 ** n

    xs = sorted(values)
    n = len(xs)
    best = (xs[0], xs[-1], 1.0 - 2.0 * binom_half_cdf(0, n))
    for k in range(2, n // 2 + 1):
        cov = 1.0 - 2.0 * binom_half_cdf(k - 1, n)
        if cov < level:
            break
        best = (xs[k - 1], xs[n - k], cov)
    return best


def _valid(r: dict[str, Any]) -> bool:
    lag = r.get("loop_lag_p99_ms", float("nan"))
    return math.isnan(lag) or lag <= LAG_VALID_MS  # no health ticks recorded: cannot tell, kept


def micro_report(micro: dict[str, dict[str, float]], args: argparse.Namespace) -> str:
    out = ["", "## Receiver CPU per span (contention-robust)", "",
           f"Another process exports {args.micro_spans:,} vLLM-shaped `llm_request` spans (13 attributes, batches "
           "of 512 like vLLM's BatchSpanProcessor) to the receiver; this process's CPU over the run, minus its idle "
           "CPU, per span received (decode + normalise + write to spans.jsonl). At the highest request rate "
           "measured on this machine (~61 requests/s: c=32, 64 output tokens, ~3900 tok/s, docs/ENGINES) the "
           "receiver's share of one core is rate x cost.", "",
           "| transport | spans | CPU us/span | bytes/span on disk | share of a core at 61 req/s |",
           "|---|---|---|---|---|"]
    for proto, m in micro.items():
        out.append(f"| {proto} | {int(m['spans']):,} | {m['cpu_us_per_span']:.0f} | {m['bytes_per_span']:.0f} | "
                   f"{m['cpu_us_per_span'] * 61 / 1e6:.2%} |")
    return "\n".join(out) + "\n"


def _detail(r: dict[str, Any]) -> str:
    parts = []
    for k, d in r["detail"].items():
        if "spans" in d:
            parts.append(f"{k}: {d['spans']} spans, {d.get('requests_with_spans')}/{d.get('requests_expected')} joined")
        elif "files" in d:
            parts.append(f"{k}: {len(d['files'])} traces, start {d.get('start_ms')} ms, stop {d.get('stop_ms')} ms")
        elif "samples" in d:
            parts.append(f"{k}: {d['samples']} samples")
    return f"({'; '.join(parts)})" if parts else ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--block-s", type=float, default=12.0)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--input-tokens", type=int, default=128)
    ap.add_argument("--output-tokens", type=int, default=64)
    ap.add_argument("--port", type=int, default=18410)
    ap.add_argument("--grpc-port", type=int, default=18460)
    ap.add_argument("--http-port", type=int, default=18461)
    ap.add_argument("--probes", nargs="+", default=["attach", "prometheus_nobudget", "pyspy", "otel"],
                    choices=["attach", "prometheus", "prometheus_nobudget", "otel", "otel_sink", "pyspy", "defaults",
                             "profiler"])
    ap.add_argument("--budget", type=parse_budget, default=DEFAULT_BUDGET,
                    help="the overhead budget every arm runs under, as attach's --overhead-budget (default 1%%)")
    ap.add_argument("--no-micro", action="store_true", help="skip the receiver's CPU-per-span measurement")
    ap.add_argument("--micro-spans", type=int, default=20000, help="spans for the receiver CPU measurement")
    ap.add_argument("--results", type=Path, default=None)
    ap.add_argument("--mode", choices=["blocks", "toggle"], default="blocks",
                    help="blocks: separate load runs per arm (ABBA); toggle: one load run per probe, the probe "
                         "switched on and off in windows")
    ap.add_argument("--windows", type=int, default=16, help="toggle mode: windows per probe (a multiple of 4)")
    ap.add_argument("--window-s", type=float, default=8.0, help="toggle mode: seconds per window")
    ap.add_argument("--warm-s", type=float, default=6.0, help="toggle mode: load before the first window")
    ap.add_argument("--realtime", action=argparse.BooleanOptionalAction, default=True,
                    help="run this process (the load client) at SCHED_RR 1, like attach --realtime (default on: "
                         "on a 2-core machine the CPU engine starves a normal-priority client, loop lag P99 "
                         "0.4-1.6 s, and the blocks then measure the client, not the probe)")
    args = ap.parse_args()
    rt = RealtimePriority() if args.realtime else None
    if rt is not None:
        info = rt.apply()
        if not info["applied"]:
            print(f"warning: {info['reason']}", file=sys.stderr)
    if args.mode == "toggle":
        ensure_engine()
        text = asyncio.run(toggle_main(args))
        print(text)
        if args.results:
            args.results.parent.mkdir(parents=True, exist_ok=True)
            args.results.write_text(text)
        return
    micro = ({} if args.no_micro else
             {proto: asyncio.run(receiver_cost(args.micro_spans, proto)) for proto in ("grpc", "http")})
    if micro:
        print(micro_report(micro, args), flush=True)
    ensure_engine()
    text = asyncio.run(main_async(args)) + (micro_report(micro, args) if micro else "")
    print(text)
    if args.results:
        args.results.parent.mkdir(parents=True, exist_ok=True)
        args.results.write_text(text)


if __name__ == "__main__":
    main()
