"""`diagnose attach`: capture evidence from a live OpenAI-compatible server into a bundle."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import click

from diagnose.bundle import BundleWriter
from diagnose.errors import InputError
from diagnose.model import ProbeStatus
from diagnose.probes.base import Probe, Target
from diagnose.realtime import RealtimePriority
from diagnose.workload import Phase, WorkloadSpec, build_phases, parse_duration, parse_slo


def _event_loop_policy() -> None:
    try:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux/macOS
        pass


def build_workload(*, concurrency: str | None, rate: str | None, max_concurrency: int | None, duration: str | None,
                   num_requests: int | None, warmup: int, baseline: int, arrival: str, burstiness: float,
                   input_tokens: int, output_tokens: int, ignore_eos: bool, api: str, shared_prefix: float,
                   seed: int, timeout: str, model: str | None, store_text: bool) -> WorkloadSpec:
    mode, phases = build_phases(concurrency, rate, max_concurrency)
    if num_requests is not None and num_requests <= 0:
        raise InputError("--num-requests must be positive")
    if not 0.0 <= shared_prefix < 1.0:
        raise InputError("--shared-prefix must be a fraction in [0, 1)")
    if input_tokens <= 0 or output_tokens <= 0:
        raise InputError("--input-tokens and --output-tokens must be positive")
    if burstiness <= 0:
        raise InputError("--burstiness must be positive (1 = Poisson, < 1 burstier)")
    dur = parse_duration(duration) if duration else (None if num_requests else 30.0)
    if baseline > 0:
        base = Phase(index=0, name="baseline c=1", concurrency=1, num_requests=baseline, role="baseline")
        phases = (base, *(Phase(index=p.index + 1, name=p.name, concurrency=p.concurrency, rate=p.rate,
                                max_concurrency=p.max_concurrency, num_requests=p.num_requests,
                                duration_s=p.duration_s, role=p.role) for p in phases))
    return WorkloadSpec(
        mode=mode, phases=phases, duration_s=dur, num_requests=num_requests, warmup_requests=warmup,
        arrival=arrival,  # type: ignore[arg-type]
        burstiness=burstiness, input_tokens=input_tokens, output_tokens=output_tokens, ignore_eos=ignore_eos,
        api=api,  # type: ignore[arg-type]
        shared_prefix_fraction=shared_prefix, seed=seed, request_timeout_s=parse_duration(timeout), model=model,
        store_text=store_text,
    )


def _api_key(api_key_env: str | None) -> str | None:
    if api_key_env:
        key = os.environ.get(api_key_env)
        if not key:
            raise InputError(f"--api-key-env {api_key_env}: that environment variable is not set")
        return key
    return os.environ.get("OPENAI_API_KEY") or None


@click.command()
@click.option("--url", required=True, help="Server base URL, e.g. http://127.0.0.1:8000 (no /v1).")
@click.option("-o", "--output", type=click.Path(path_type=Path), help="Bundle directory (default: ./diagnose-<time>).")
@click.option("--force", is_flag=True, help="Replace the output directory if it exists.")
@click.option("--api-key-env", metavar="VAR", help="Read the API key from this environment variable "
              "(default: OPENAI_API_KEY when set). The key is never written to disk.")
@click.option("--model", help="Model name (default: the first model of /v1/models).")
@click.option("--api", type=click.Choice(["completions", "chat"]), default="completions", show_default=True)
@click.option("--concurrency", "-c", help="Closed loop: requests kept in flight; a list or ladder sweeps (1,4,16 or 1:64:x2).")
@click.option("--rate", "-r", help="Open loop: requests per second; a list or ladder sweeps (2,4,8).")
@click.option("--arrival", type=click.Choice(["poisson", "gamma", "constant"]), default="poisson", show_default=True)
@click.option("--burstiness", type=float, default=1.0, show_default=True, help="Gamma shape (1 = Poisson, <1 burstier).")
@click.option("--max-concurrency", type=int, help="Open loop: cap on requests in flight.")
@click.option("--duration", "-d", help="Per load level (e.g. 30s, 2m). Default 30s unless --num-requests.")
@click.option("--num-requests", "-n", type=int, help="Per load level, instead of a duration.")
@click.option("--warmup", type=int, default=2, show_default=True, help="Warm-up requests per level, excluded from statistics.")
@click.option("--baseline", type=int, default=8, show_default=True,
              help="Sequential requests at concurrency 1 first, as the run's own reference (0: none).")
@click.option("--input-tokens", type=int, default=128, show_default=True)
@click.option("--output-tokens", type=int, default=64, show_default=True)
@click.option("--ignore-eos/--no-ignore-eos", default=True, show_default=True,
              help="Ask the engine to generate exactly --output-tokens (where it supports it).")
@click.option("--shared-prefix", type=float, default=0.0, show_default=True,
              help="Fraction of each prompt shared by all requests (prompts are otherwise unique).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--timeout", default="60s", show_default=True, help="Per-request timeout.")
@click.option("--slo", help="Service-level objective, e.g. ttft_p99=500ms,itl_p99=50ms (goodput and judgements use it).")
@click.option("--metrics-interval", default="1s", show_default=True, help="Prometheus scrape interval.")
@click.option("--no-metrics", is_flag=True, help="Do not scrape /metrics.")
@click.option("--otlp", is_flag=True, help="Run an OTLP receiver (start the engine with --otlp-traces-endpoint pointing at it).")
@click.option("--otlp-grpc-port", type=int, default=4317, show_default=True)
@click.option("--otlp-http-port", type=int, default=4318, show_default=True)
@click.option("--otlp-export", metavar="URL", help="Also export one client span per request to this OTLP/HTTP collector.")
@click.option("--pyspy", is_flag=True, help="Sample host stacks of every engine process with py-spy.")
@click.option("--pid", type=int, help="Server PID for --pyspy (default: found from the listening port).")
@click.option("--pyspy-rate", type=int, default=10, show_default=True,
              help="py-spy samples per second (10 Hz costs about 0.04 of a core; 50 Hz about 4x that).")
@click.option("--pyspy-blocking", is_flag=True,
              help="Pause each process while sampling (exact stacks, more cost); default is nonblocking.")
@click.option("--nvml/--no-nvml", default=True, show_default=True, help="Sample GPU counters (unavailable without a driver).")
@click.option("--nvml-interval", default="100ms", show_default=True)
@click.option("--profile-iterations", type=int, help="Trigger the engine's profiler for this many engine steps.")
@click.option("--profiler-dir", type=click.Path(path_type=Path), help="The engine's profiler output directory.")
@click.option("--profile-client", is_flag=True, help="Profile the load client itself with pyinstrument.")
@click.option("--observe", is_flag=True, help="Send no requests: only observe a server carrying real traffic.")
@click.option("--store-text", is_flag=True, help="Store prompt and output text in the bundle (off by default).")
@click.option("--progress/--no-progress", default=None, help="Live progress line (default: only on a terminal).")
@click.option("--realtime", is_flag=True,
              help="Run the load client's event loop at real-time priority (SCHED_RR 1; needs root or "
                   "CAP_SYS_NICE), so a CPU-bound engine on the same machine cannot starve it and invalidate the "
                   "run. Threads and processes the capture starts inherit it (like chrt -r 1). If not permitted, "
                   "the capture runs at normal priority and the bundle says so.")
@click.option("--report", type=click.Path(path_type=Path), help="Also analyse the bundle into this HTML report.")
def attach(**o: Any) -> None:
    """Capture evidence from a live server: load + metrics (+ spans, host stacks, GPU counters, profiler)."""
    _event_loop_policy()
    url = str(o["url"]).rstrip("/")
    if url.endswith("/v1"):
        url = url[:-3]
    if not url.startswith(("http://", "https://")):
        raise InputError(f"--url {o['url']!r}: expected http://HOST:PORT")
    target = Target(url=url, api_key=_api_key(o["api_key_env"]), pid=o["pid"])
    slo = parse_slo(o["slo"])
    workload: WorkloadSpec | None = None
    if o["observe"]:
        if o["concurrency"] or o["rate"]:
            raise InputError("--observe sends no requests: drop --concurrency/--rate")
    else:
        workload = build_workload(
            concurrency=o["concurrency"], rate=o["rate"], max_concurrency=o["max_concurrency"], duration=o["duration"],
            num_requests=o["num_requests"], warmup=o["warmup"], baseline=o["baseline"], arrival=o["arrival"],
            burstiness=o["burstiness"], input_tokens=o["input_tokens"], output_tokens=o["output_tokens"],
            ignore_eos=o["ignore_eos"], api=o["api"], shared_prefix=o["shared_prefix"], seed=o["seed"],
            timeout=o["timeout"], model=o["model"], store_text=o["store_text"])
    out = o["output"] or Path(time.strftime("diagnose-%Y%m%d-%H%M%S"))
    # set on this thread before the loop starts, so every thread and process the capture starts inherits it
    rt = RealtimePriority() if o["realtime"] else None
    if rt is not None:
        rt.apply()
    try:
        code = asyncio.run(_attach(target, workload, out, o, slo, rt))
    finally:
        if rt is not None:
            rt.restore()
    if code:
        raise click.exceptions.Exit(code)


async def _attach(target: Target, workload: WorkloadSpec | None, out: Path, o: dict[str, Any],
                  slo: dict[str, float], rt: RealtimePriority | None = None) -> int:
    from diagnose.capture import check_target, run_capture

    def log(msg: str) -> None:
        click.echo(msg, err=True)

    info = await check_target(target)
    target.engine = info.name
    target.engine_version = info.version
    target.model = (workload.model if workload else None) or (info.models[0] if info.models else None)
    if workload is not None and target.model is None:
        raise InputError(f"{target.url}/v1/models lists no model: pass --model")
    options = {"slo": slo, "store_text": bool(o["store_text"]), "observe": bool(o["observe"]),
               "metrics_interval_s": parse_duration(o["metrics_interval"]) if not o["no_metrics"] else None}
    if rt is not None:
        options["realtime"] = dict(rt.info)
        if not rt.info["applied"]:
            log(f"warning: {rt.info['reason']}")
    bundle = BundleWriter(out, overwrite=o["force"], options=options,
                          workload=workload.to_json() if workload else {"mode": "observe"},
                          target={"url": target.url, "engine": info.name, "engine_version": info.version,
                                  "model": target.model, "models": list(info.models),
                                  "engine_evidence": list(info.evidence), "engine_config": info.config})
    probes = build_probes(workload, o, bundle)
    duration = parse_duration(o["duration"]) if (o["observe"] and o["duration"]) else None
    if o["observe"] and duration is None:
        duration = 30.0
    log(f"capturing {info.name} {info.version or ''} at {target.url} (model {target.model}) into {out}")
    result = await run_capture(bundle, target, probes, duration_s=duration, options=options, log=log)
    if rt is not None:
        rt.restore()  # the capture is over: the report below runs at normal priority
        _note_realtime(bundle, result.statuses, rt.info)
    for name, st in sorted(result.statuses.items()):
        detail = f": {st.reason}" if st.reason else ""
        log(f"  {name:12} {st.state}{detail}")
    log(f"bundle: {out}" + (" (partial)" if result.interrupted else ""))
    if o["report"]:
        from diagnose.cli.analyze import run_analysis, verdict_line
        from diagnose.reports.render import write_report

        analysis = run_analysis(out)
        write_report(analysis, o["report"])
        log(f"{verdict_line(analysis)}\nreport: {o['report']}")
    if result.interrupted:
        return 130
    if result.load_failed:
        return 1
    return 0


def _note_realtime(bundle: BundleWriter, statuses: dict[str, ProbeStatus], info: dict[str, Any]) -> None:
    """The load probe's status says whether its loop ran at real-time priority (and why not)."""
    st = statuses.get("load")
    if st is None:
        return
    reason = st.reason if info["applied"] else "; ".join(x for x in (st.reason, str(info["reason"])) if x)
    st = ProbeStatus(st.name, st.state, reason, {**st.detail, "realtime": dict(info)})
    statuses["load"] = st
    bundle.set_probe_status(st)


def build_probes(workload: WorkloadSpec | None, o: dict[str, Any], bundle: BundleWriter) -> list[Probe]:
    probes: list[Probe] = []
    if workload is not None:
        from diagnose.probes.load import LoadProbe

        probes.append(LoadProbe(workload, progress=o["progress"]))
    if not o["no_metrics"]:
        from diagnose.probes.prometheus import PrometheusProbe

        probes.append(PrometheusProbe(interval_s=parse_duration(o["metrics_interval"])))
    if o["otlp"]:
        from diagnose.probes.otel import OtlpReceiverProbe

        probes.append(OtlpReceiverProbe(grpc_port=o["otlp_grpc_port"], http_port=o["otlp_http_port"]))
    if o["pyspy"]:
        from diagnose.probes.pyspy import PySpyProbe

        probes.append(PySpyProbe(pid=o["pid"], rate=o["pyspy_rate"], nonblocking=not o["pyspy_blocking"]))
    if o["nvml"]:
        from diagnose.probes.nvml import NvmlProbe

        probes.append(NvmlProbe(interval_s=parse_duration(o["nvml_interval"])))
    if o["profile_iterations"]:
        if not o["profiler_dir"]:
            raise InputError("--profile-iterations needs --profiler-dir (the engine's torch_profiler_dir)")
        from diagnose.probes.profiler import ProfilerProbe

        probes.append(ProfilerProbe(iterations=o["profile_iterations"], profiler_dir=o["profiler_dir"]))
    if o["profile_client"]:
        from diagnose.probes.pyinstrument_probe import ClientProfilerProbe

        probes.append(ClientProfilerProbe())
    if o["otlp_export"]:
        from diagnose.probes.otel_export import OtlpExportProbe

        probes.append(OtlpExportProbe(endpoint=o["otlp_export"]))
    return probes
