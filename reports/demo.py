"""A synthetic (made-up, clearly not captured) Analysis for previewing the report and for its tests.

``python -m diagnose.reports.demo out.html`` writes a report of a three-level concurrency sweep with
findings, every Section kind (``demo_sections``) and probe statuses. ``hostile`` puts a given string into every
kind of captured text (model name, rule title, error detail, table cell, frame name, series name) so tests
can check that it only ever appears escaped.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import pandas as pd

from diagnose.analysis import Analysis
from diagnose.model import (
    Cause,
    Evidence,
    Experiment,
    Finding,
    NotEvaluated,
    Phase,
    ProbeStatus,
    Signal,
    Verdict,
    Window,
)
from diagnose.rules.verdict import decide

from .sections.model import (
    BarSeries,
    FlameGraph,
    Histogram,
    LineChart,
    LineSeries,
    Quantity,
    Section,
    Segment,
    StackedBars,
    Table,
    TextBlock,
    Waterfall,
    WaterfallRow,
)
from .view_types import FlameNode


def synthetic_analysis(*, levels: tuple[int, ...] = (1, 4, 16), per_level_s: float = 20.0, output_tokens: int = 64,
                       hostile: str = "", seed: int = 0, partial: bool = False, run_valid: bool = True) -> Analysis:
    rng = np.random.default_rng(seed)
    rows: list[dict[str, Any]] = []
    itl_rows: list[tuple[int, float, float]] = []
    phases: list[Phase] = []
    rid, t = 0, 1.0
    for pi, c in enumerate(levels):
        start = t
        slots = [start] * c
        while min(slots) < start + per_level_s:
            k = int(np.argmin(slots))
            sent = slots[k]
            ttft = float(rng.lognormal(np.log(12 + 9 * c), 0.35))
            gaps = rng.lognormal(np.log(1.2 + 0.3 * c), 0.5, output_tokens - 1)
            gaps[rng.random(gaps.size) < 0.01] *= 25  # rare long stalls (a scheduler hiccup)
            e2e = ttft + float(gaps.sum())
            err = rid % 97 == 5
            rows.append({"rid": rid, "phase": pi, "warmup": rid % 50 == 0 and sent - start < 1.0, "ok": not err,
                         "error": "http_5xx" if err else None,
                         "error_detail": (hostile or "upstream reset") if err else None,
                         "ttft_ms": ttft, "e2e_ms": e2e, "tpot_ms": float(gaps.mean()),
                         "itl_mean_ms": float(gaps.mean()), "output_tokens": output_tokens,
                         "sent_s": sent, "end_s": sent + e2e / 1000})
            ts = sent + (ttft + np.cumsum(gaps)) / 1000
            itl_rows.extend(zip([rid] * gaps.size, ts.tolist(), gaps.tolist(), strict=True))
            slots[k] = sent + e2e / 1000 + 0.002
            rid += 1
        t = max(slots)
        phases.append(Phase(phase=pi, name=f"c={c}", role="measure", start_s=start, end_s=t, mode="closed",
                            concurrency=float(c)))
    req = pd.DataFrame(rows)
    itl = pd.DataFrame(itl_rows, columns=["rid", "t_s", "itl_ms"])
    ts = np.arange(1.0, t, 1.0)
    level = np.interp(ts, [p.start_s for p in phases], [max((p.concurrency or 0) - 8, 0) for p in phases])
    qd = np.maximum(level + rng.normal(0, 0.7, ts.size), 0).round()
    metrics = pd.DataFrame({"t_s": np.concatenate([ts, ts]), "signal": ["queue_depth"] * ts.size + ["running"] * ts.size,
                            "value": np.concatenate([qd, np.minimum(8, ts * 0 + 8)])})
    tables = {"requests": req, "itl": itl, "metrics": metrics}
    signals = _signals(req, itl, None)
    phase_signals = [_signals(req, itl, i) for i in range(len(levels))]
    signals["slo_ttft_p99_ms"] = Signal("slo_ttft_p99_ms", 200.0, "ms", "client", "the SLO asked")
    model = f"tiny-llama{hostile}"
    manifest = {
        "schema_version": 1, "tool": {"name": "diagnose", "version": "0.1.0"},
        "capture": {"started_at": "2026-11-30T05:00:00.000+00:00", "ended_at": None if partial else "2026-11-30T05:01:10+00:00",
                    "complete": not partial, "interrupted": "SIGINT (Ctrl-C)" if partial else None,
                    "clock_anchor": {"unix_ns": 0, "monotonic_ns": 0}},
        "target": {"url": "http://127.0.0.1:8000", "engine": "vllm", "engine_version": "0.32.0", "model": model,
                   "headers": {"Authorization": "Bearer sk-secretsecret123"}, "flags": ["--max-num-seqs", "8"]},
        "host": {"hostname": "bench-1", "platform": "Linux-6.1-x86_64", "cpu_count": 2, "python": "3.11.7"},
        "workload": {"mode": "concurrency", "input_tokens": 128, "output_tokens": output_tokens, "api": "completions",
                     "phases": [{"index": i, "name": p.name, "concurrency": p.concurrency} for i, p in enumerate(phases)],
                     "note": "api_key=sk-abcdefgh12345678 passed by mistake"},
        "options": {"slo": {"ttft_p99_ms": 200.0}},  # the SLO its slo_ttft_p99_ms signal states
    }
    findings = _findings(signals, hostile)
    verdict = decide(findings, signals, partial=partial) if run_valid else Verdict(
        "invalid", "Run invalid: the load client was the bottleneck", "The client's event loop lagged.",
        judged=False, partial=partial)
    # the stage-2 products the pipeline makes (diagnose/pipeline.py): the per-phase CDFs and the sweep's marks
    from diagnose.io.manifest import read_manifest
    from diagnose.normalize.derived import slo_terms
    from diagnose.requests import mark_run
    from diagnose.signals.distributions import CDF_TABLE, phase_cdfs
    from diagnose.signals.sweep import sweep_marks

    mark_run(tables, Window(phases[0].start_s, phases[-1].end_s))
    tables[CDF_TABLE] = phase_cdfs(tables, phases)
    return Analysis(
        sweep=sweep_marks(phases, phase_signals, slo_terms(read_manifest(manifest, "demo manifest.json")),
                          verdict is None or verdict.judged),
        source=f"/tmp/capture{hostile}", manifest=manifest, tables=tables, signals=signals,
        phase_signals=phase_signals, phases=phases, findings=findings, verdict=verdict,
        run_window=Window(phases[0].start_s, phases[-1].end_s),
        not_evaluated=[NotEvaluated("GPU001", "gpu-underutilised", ("gpu_util_mean_ratio",)),
                       NotEvaluated("OTL001", "queue-dominates-ttft", ("ttft_queue_share_ratio", "join_matched_ratio"))],
        probe_statuses=[ProbeStatus("load", "ok", "", {"requests": len(req)}),
                        ProbeStatus("prometheus", "ok", "", {"scrapes": int(ts.size), "failed_scrapes": 0}),
                        ProbeStatus("otel", "unavailable", "server was not started with --otlp-traces-endpoint"),
                        ProbeStatus("pyspy", "failed", f"ptrace not permitted{hostile}")],
        warnings=[f"metrics: 2 scrapes took over 500 ms{hostile}"],
        partial=partial,
    )


def _signals(req: pd.DataFrame, itl: pd.DataFrame, phase: int | None) -> dict[str, Signal]:
    df = req[~req["warmup"] & req["ok"]]
    if phase is not None:
        df = df[df["phase"] == phase]
    gaps = itl[itl["rid"].isin(df["rid"])]["itl_ms"].to_numpy()
    out: dict[str, Signal] = {}
    for key, arr in (("ttft", df["ttft_ms"].to_numpy()), ("itl", gaps), ("tpot", df["tpot_ms"].to_numpy()),
                     ("e2e", df["e2e_ms"].to_numpy())):
        for p, q in (("p50", 50), ("p90", 90), ("p95", 95), ("p99", 99), ("max", 100)):
            if key == "tpot" and p == "max":
                continue
            out[f"{key}_{p}_ms"] = Signal(f"{key}_{p}_ms", float(np.percentile(arr, q)), "ms", "client")
    span = float(df["end_s"].max() - df["sent_s"].min())
    out["output_tps"] = Signal("output_tps", float(df["output_tokens"].sum()) / span, "tok/s", "client")
    out["request_rps"] = Signal("request_rps", len(df) / span, "req/s", "client")
    good = float((df["ttft_ms"] <= 200).mean())
    out["goodput_ratio"] = Signal("goodput_ratio", good, "ratio", "client")
    out["goodput_rps"] = Signal("goodput_rps", good * len(df) / span, "req/s", "client")
    sub = req if phase is None else req[req["phase"] == phase]
    out["error_rate_ratio"] = Signal("error_rate_ratio", float((~sub["ok"]).mean()), "ratio", "client")
    out["requests_measured"] = Signal("requests_measured", float(len(df)), "requests", "client")
    return out


def _findings(sig: dict[str, Signal], hostile: str) -> list[Finding]:
    ttft = sig["ttft_p99_ms"].value
    return [
        Finding("LAT001", "high-ttft-normal-itl", "latency", "warning",
                f"TTFT P99 {ttft:.0f} ms while ITL P99 is {sig['itl_p99_ms'].value:.1f} ms{hostile}",
                f"Requests wait before their first token: TTFT P99 is {ttft:.0f} ms against an SLO of 200 ms while "
                "decode is steady, which points at queueing or prefill.", 0.8, 0.6, 0.96,
                evidence=(Evidence("ttft_p99_ms", ttft, "ms", "client"),
                          Evidence("itl_p99_ms", sig["itl_p99_ms"].value, "ms", "client"),
                          Evidence("queue_depth_mean", 4.2, "requests", "server", f"Prometheus{hostile}")),
                causes=(Cause("queue wait: max-num-seqs too small for the offered concurrency",
                              "server queue time is most of TTFT", "queue time near zero",
                              Experiment("raise --max-num-seqs from 8 to 16",
                                         (("server_queue_time_p50_ms", "down"), ("ttft_p99_ms", "down")))),
                        Cause("long prefill of long prompts", "prefill time is most of TTFT", "prefill under 10 ms",
                              Experiment("enable chunked prefill", (("server_prefill_time_p99_ms", "down"),)))),
                sources=("client", "server"), runbook="docs/runbooks/LAT001.md"),
        Finding("SCL002", "throughput-plateau", "scaling", "info",
                "Throughput grows 2.1x from c=1 to c=16 while TTFT grows 6x",
                "The server saturates between c=4 and c=16.", 0.6, 0.3, 0.4,
                evidence=(Evidence("sweep_output_tps_growth_ratio", 2.1, "ratio", "client"),),
                causes=(Cause("compute saturation", experiment=Experiment("run one more level at c=8",
                                                                          (("output_tps", "flat"),))),)),
    ]


def demo_sections(hostile: str = "", seed: int = 0) -> list[Section]:
    """One section of every kind (the report shows them instead of those built from the tables)."""
    rng = np.random.default_rng(seed)

    def tree(depth: int, name: str) -> FlameNode:
        kids = [] if depth >= 7 else [tree(depth + 1, f"{name.split('/')[0]}/fn_{depth}_{i}") for i in range(3)]
        val = float(rng.integers(5, 40)) + sum(k["value"] for k in kids)
        return {"name": name, "value": val, "children": kids}

    root = tree(0, "all")
    root["children"].append({"name": f"evil_frame{hostile}", "value": 400.0, "children": []})
    root["value"] += 400.0
    return [
        Section("ttft_decomposition", "TTFT decomposition by percentile", StackedBars(
            ("P50", "P90", "P99"), (BarSeries("queue", (5.0, 40.0, 150.0)), BarSeries("prefill", (20.0, 25.0, 30.0)),
                                    BarSeries(f"frontend{hostile}", (2.0, 3.0, 9.0))),
            "ms", x_label="time", y_label="request percentile"), group="latency", order=10),
        Section("slow_requests", "Slowest requests", Waterfall(tuple(
            WaterfallRow(f"rid {i}", (Segment("queue", 0, 30 * i), Segment("prefill", 30 * i, 30 * i + 20),
                                      Segment("decode", 30 * i + 20, 30 * i + 200)))
            for i in range(1, 6)), "ms"), group="latency", order=20),
        Section("server_load", "Server queue, running and KV usage", LineChart(
            (LineSeries("running", tuple((float(i), 8.0) for i in range(60))),
             LineSeries("kv usage", tuple((float(i), min(i / 60, 1.0)) for i in range(60)), "right")),
            x_label="time since capture start (s)", y_label="requests", y2_label="KV usage (ratio)"), group="server"),
        Section("host_threads", "Per-thread CPU share", Table(
            ("process", "thread", "cpu share"), (("api_server", f"uvloop{hostile}", Quantity(0.41, "ratio")),
                                                 ("EngineCore", "busy loop", Quantity(0.97, "ratio"))),
            "py-spy, 100 Hz"), group="host"),
        Section("host_flame", "Host CPU flame graph (EngineCore)", FlameGraph(root, "samples"), group="host"),
        Section("step_hist", "Engine step time", Histogram(tuple(rng.lognormal(1.0, 0.4, 2000).tolist()), "ms",
                                                            x_label="step time", bins=30), group="trace"),
        Section("trace_note", "Trace notes", TextBlock(f"Kernel trace not captured.{hostile}"), group="trace"),
    ]


if __name__ == "__main__":  # pragma: no cover - a preview helper
    from pathlib import Path

    from diagnose.reports.render import render_html

    out = Path(sys.argv[1] if len(sys.argv) > 1 else "demo_report.html")
    out.write_text(render_html(synthetic_analysis(), demo_sections()), encoding="utf-8")
    print(out)
