"""Requests overlapping the engine profiler's window are left out of the statistics (the profiler slows the
engine): diagnose/capture/profiler_window.py, normalize/client.py, normalize/otel.py, the report's note."""

from __future__ import annotations

import html
import math
from pathlib import Path
from typing import Any

import pytest

from diagnose.analysis import Window
from diagnose.capture.profiler_window import overlaps, profiler_windows
from diagnose.io.bundle import open_bundle
from diagnose.io.manifest import Manifest, read_manifest
from diagnose.io.writer import BundleWriter
from diagnose.model import ProbeStatus
from diagnose.normalize import client, otel
from diagnose.pipeline import analyze_bundle
from diagnose.reports.formatting import fmt_text
from diagnose.reports.render import render_html
from diagnose.reports.sections import build_sections
from diagnose.reports.sections.otel import sections as otel_sections
from diagnose.reports.view_model import build_view

MS = 1_000_000
WHOLE = Window(-math.inf, math.inf)
N_TOKENS = 10

# (rid, sent, first token, end) in ms after t0. Profiler window: /start_profile at 1000 ms, /stop_profile
# sent at 1300 ms and answered at 1500 ms. x1..x3 overlap [1000, 1500] (x3 only through the stop time).
REQUESTS = [
    ("a1", 0, 50, 400), ("a2", 400, 450, 800),
    ("x1", 800, 1050, 1100), ("x2", 1100, 1300, 1400), ("x3", 1450, 1700, 1800),
    ("b1", 1600, 1650, 2000), ("b2", 2000, 2060, 2400),
]
EXCLUDED = {"x1", "x2", "x3"}


def _typed(m: dict[str, Any]) -> Manifest:
    return read_manifest(m, "manifest.json")


def _bundle(tmp: Path, *, window: bool, spans: bool = False) -> Path:
    bw = BundleWriter(tmp / ("with" if window else "without"))
    t0 = bw.anchor_mono_ns + 1000 * MS
    reqs: list[dict[str, Any]] = [{
        "rid": "w", "phase": 1, "warmup": True, "api": "completions", "sent_ns": t0 - 500 * MS,
        "first_token_ns": t0 - 450 * MS, "end_ns": t0 - 100 * MS, "ok": True, "error": None,
        "output_tokens_usage": N_TOKENS, "output_tokens_chunks": N_TOKENS, "trace_id": None}]
    chunks, span_recs = [], []
    for i, (rid, sent, first, end) in enumerate(REQUESTS):
        tid = f"{i + 1:032x}"
        reqs.append({"rid": rid, "phase": 1, "warmup": False, "api": "completions", "sent_ns": t0 + sent * MS,
                     "first_token_ns": t0 + first * MS, "end_ns": t0 + end * MS, "ok": True, "error": None,
                     "http_status": 200, "output_tokens_usage": N_TOKENS, "output_tokens_chunks": N_TOKENS,
                     "prompt_tokens": 32, "trace_id": tid, "span_id": tid[:16]})
        step = (end - first) / (N_TOKENS - 1)
        chunks.append({"rid": rid, "t_ns": [t0 + int((first + k * step) * MS) for k in range(N_TOKENS)],
                       "tok": [1] * N_TOKENS})
        if spans:  # server TTFT = client TTFT - 2 ms, of which queue 5 ms and prefill 10 ms
            start_unix = bw.anchor_unix_ns + (t0 + (sent + 1) * MS - bw.anchor_mono_ns)
            ttft_s, e2e_s = (first - sent - 2) / 1e3, (end - sent - 2) / 1e3
            span_recs.append({
                "trace_id": tid, "span_id": tid[:16], "name": "llm_request", "kind": "SERVER",
                "start_unix_ns": start_unix, "end_unix_ns": start_unix + int(e2e_s * 1e9), "source": "grpc",
                "attributes": {"gen_ai.latency.time_to_first_token": ttft_s, "gen_ai.latency.e2e": e2e_s,
                               "gen_ai.latency.time_in_queue": 0.005, "gen_ai.latency.time_in_model_prefill": 0.010,
                               "gen_ai.latency.time_in_model_decode": e2e_s - ttft_s},
                "resource": {"service.name": "vllm"}})
    bw.stream("phases").write({"phase": 1, "name": "c=2", "mode": "closed", "role": "measure", "concurrency": 2,
                               "start_ns": t0, "end_ns": t0 + 2400 * MS})
    bw.stream("requests").write_many(reqs)
    bw.stream("chunks").write_many(chunks)
    if span_recs:
        bw.stream("spans").write_many(span_recs)
    bw.set_probe_status(ProbeStatus("load", "ok"))
    if window:
        bw.set_probe_status(ProbeStatus("profiler", "ok", "", {
            "engine": "vllm", "iterations": 8, "window_start_ns": t0 + 1000 * MS, "window_end_ns": t0 + 1300 * MS,
            "stop_done_ns": t0 + 1500 * MS}))
    bw.finish()
    return bw.path


def _sigs(tables: dict[str, Any], window: Window = WHOLE) -> dict[str, float]:
    return {s.name: s.value for s in client.signals(tables, window)}


def test_requests_in_the_profiler_window_are_excluded_and_the_rest_kept(tmp_path: Path) -> None:
    t = client.tables(open_bundle(_bundle(tmp_path, window=True)))
    r = t["requests"].set_index("rid")
    assert {rid for rid in r.index if r.loc[rid, "profiled"]} == EXCLUDED
    assert list(t["client_excluded"]["reason"]) == ["profiler"]
    s = _sigs(t)
    assert s["requests_total"] == 7 and s["requests_measured"] == 4
    assert s["requests_excluded_profiler"] == 3
    assert s["profiler_window_s"] == pytest.approx(0.5)
    # TTFT of the kept requests only: 50, 50, 50, 60 (the excluded ones took 200-250 ms)
    assert s["ttft_max_ms"] == pytest.approx(60) and s["ttft_p50_ms"] == pytest.approx(50)
    assert s["e2e_max_ms"] == pytest.approx(400)
    # pooled ITL only from kept requests: 350/9 and 340/9 ms gaps; x1's 50/9 ms gaps are out
    assert s["itl_p50_ms"] == pytest.approx(350 / 9) and s["itl_max_ms"] == pytest.approx(350 / 9)
    # throughput: 40 tokens over the kept requests' stretches on either side of the window, 0.8 s + 0.8 s
    assert s["output_tps"] == pytest.approx(40 / 1.6)
    assert s["request_rps"] == pytest.approx(4 / 1.6)
    # the phase window excludes them the same way
    ph = _sigs(t, Window(0.0, math.inf, 1, "c=2"))
    assert ph["requests_measured"] == 4 and ph["requests_excluded_profiler"] == 3
    assert ph["output_tps"] == pytest.approx(s["output_tps"])


def test_the_report_says_how_many_requests_were_excluded(tmp_path: Path) -> None:
    a = analyze_bundle(_bundle(tmp_path, window=True))
    assert a.signals["requests_excluded_profiler"].value == 3
    view = build_view(a)
    note = "3 requests overlapping the profiler window (0.5 s) excluded from statistics"
    run = view["percentiles"]["windows"][0]
    assert run["note"].startswith(note), run["note"]
    assert run["rows"][0]["values"]["max"] == pytest.approx(60)
    assert view["charts"]["ttft"]["n"] == 4  # the TTFT histogram leaves them out too
    checks = {row[0]: row[1] for s in build_sections(a.tables) if s.id == "client_self_check" for row in s.payload.rows}
    assert checks["requests overlapping the profiler window, excluded from statistics"] == 3
    assert note in html.unescape(render_html(a))
    timeline = view["charts"]["timeline"]  # the window is shaded on the timeline, with its label
    band = [b for b in timeline["bands"] if b["label"] == "profiler on (excluded)"]
    assert len(band) == 1 and band[0]["end"] - band[0]["start"] == pytest.approx(0.5)
    assert "profiler on (excluded)" in render_html(a)


def test_a_bundle_without_profiler_window_is_unchanged(tmp_path: Path) -> None:
    a = analyze_bundle(_bundle(tmp_path, window=False))
    t = a.tables
    assert not t["requests"]["profiled"].any() and t["client_excluded"].empty
    s = {k: v.value for k, v in a.signals.items()}
    assert "requests_excluded_profiler" not in s and "profiler_window_s" not in s
    assert s["requests_measured"] == 7 and s["ttft_max_ms"] == pytest.approx(250)
    assert s["output_tps"] == pytest.approx(70 / 2.4)  # span = last end - first send, as always
    view = build_view(a)
    assert "profiler" not in view["percentiles"]["windows"][0]["note"]
    assert view["charts"]["ttft"]["n"] == 7
    assert "profiler window" not in render_html(a)
    assert not [b for b in view["charts"]["timeline"]["bands"] if "profiler" in b["label"]]


def test_otel_decomposition_leaves_out_the_profiled_requests(tmp_path: Path) -> None:
    t = otel.tables(open_bundle(_bundle(tmp_path, window=True, spans=True)))
    rb = t["request_breakdown"].set_index("rid")
    assert {rid for rid in rb.index if isinstance(rid, str) and rb.loc[rid, "profiled"]} == EXCLUDED
    sig = {s.name: s.value for s in otel.signals(t, WHOLE)}
    assert sig["span_requests_count"] == 4
    assert sig["span_ttft_p99_ms"] < 60  # the kept requests' server TTFT is 48-58 ms
    shares = {s.id: s for s in otel_sections(t)}["otel_ttft_shares"].payload
    assert fmt_text(shares.note).startswith("4 requests.")
    assert "3 requests overlapping the profiler window excluded" in fmt_text(shares.note)
    t2 = otel.tables(open_bundle(_bundle(tmp_path, window=False, spans=True)))
    assert {s.name: s.value for s in otel.signals(t2, WHOLE)}["span_requests_count"] == 7


def test_window_sources_and_overlap_rule() -> None:
    detail = {"window_start_ns": 100, "window_end_ns": 200, "stop_done_ns": 300}
    assert profiler_windows(_typed({"probes": {"profiler": {"detail": detail}}})) == [(100.0, 300.0)]
    # no stop answer recorded: up to the stop request; interrupted before that: to the end of the capture
    assert profiler_windows(_typed({"probes": {"profiler": {"detail": {"window_start_ns": 100, "window_end_ns": 200}}}})) \
        == [(100.0, 200.0)]
    assert profiler_windows(_typed({"probes": {"profiler": {"detail": {"window_start_ns": 100}}}})) == [(100.0, math.inf)]
    # an older bundle: the window stamped on the torch_trace artifacts
    arts = {"profiler/a.pt.trace.json.gz": {"kind": "torch_trace", "window_start_ns": 10, "window_end_ns": 20},
            "profiler/a.profiler_out.txt": {"kind": "torch_profiler_table", "window_start_ns": 10}}
    assert profiler_windows(_typed({"artifacts": arts})) == [(10.0, 20.0)]
    # the profiler never started (404, unavailable): no window
    assert profiler_windows(_typed({"probes": {"profiler": {"state": "unavailable", "detail": {"start_ms": 3.0}}}})) == []
    assert profiler_windows(_typed({})) == []
    w = [(100.0, 200.0)]
    assert overlaps(50, 100, w) and overlaps(200, 250, w) and overlaps(120, 130, w) and overlaps(50, 250, w)
    assert not overlaps(50, 99, w) and not overlaps(201, 300, w)
    assert not overlaps(math.nan, 150, w)


def test_prometheus_signals_leave_out_scrapes_in_the_profiler_window() -> None:
    import pandas as pd

    from diagnose.analysis import Window
    from diagnose.normalize import prometheus as prom

    rows = []
    for t in range(1, 11):  # a scrape a second; the profiler ran over [4.5, 6.5]: queue piled up, preemptions
        inside = 4.5 <= t <= 7
        base = {"t_s": float(t), "t0_s": float(t - 1) if t > 1 else float("nan"), "engine": "vllm", "dp": "",
                "unit": "", "agg": "sum", "metric": "m"}
        rows.append({**base, "signal": "queue_depth", "kind": "gauge", "value": 40.0 if inside else 1.0,
                     "delta": float("nan")})
        rows.append({**base, "signal": "preemptions", "kind": "counter", "value": float(t),
                     "delta": (5.0 if inside else 0.0) if t > 1 else float("nan")})
    tables = {"metrics": pd.DataFrame(rows)}
    w = Window(0.0, 11.0)

    def sig(t: dict) -> dict[str, float]:
        return {s.name: s.value for s in prom.signals(t, w)}

    before = sig(tables)
    assert before["queue_depth_max"] == 40.0 and before["preemptions_total"] == 15.0
    tables["client_excluded"] = pd.DataFrame([{"reason": "profiler", "start_s": 4.5, "end_s": 6.5}])
    after = sig(tables)
    assert after["queue_depth_max"] == 1.0 and after["preemptions_total"] == 0.0
    assert len(prom.without_excluded(tables)["metrics"]) == 2 * 7  # scrapes 5, 6 and 7 (interval 6-7) left out
