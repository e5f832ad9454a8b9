"""Client metric definitions (diagnose/normalize/client.py, docs/metrics.md) on bundles with known timestamps."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from diagnose.analysis import Window
from diagnose.io.bundle import open_bundle
from diagnose.io.writer import BundleWriter
from diagnose.normalize import client
from diagnose.reports.sections.client import sections as client_sections
from diagnose.reports.sections.model import Quantity
from diagnose.rules.engine import evaluate
from diagnose.rules.spec import load_rules, load_thresholds

MS = 1_000_000
WHOLE = Window(-math.inf, math.inf)


def req(rid: str, sent: float, end: float, *, first: float | None = None, ok: bool = True, error: str | None = None,
        warmup: bool = False, n: int | None = None, intended: float | None = None, phase: int = 0,
        status: int | None = 200) -> dict[str, Any]:
    return {"rid": rid, "phase": phase, "warmup": warmup, "api": "completions", "sent_ns": sent, "end_ns": end,
            "intended_ns": intended, "capped": False, "headers_ns": first, "first_token_ns": first, "ok": ok,
            "http_status": status, "error": error, "error_detail": None, "prompt_tokens": 32,
            "prompt_tokens_source": "tokenize", "prompt_tokens_usage": 32 if ok else None, "max_tokens": n,
            "output_tokens_usage": n, "output_tokens_chunks": n or 0, "n_chunks": 0, "finish_reason": None}


def make_bundle(tmp: Path, requests: list[dict[str, Any]], chunks: list[dict[str, Any]],
                health: list[dict[str, Any]] = (), phases: list[dict[str, Any]] = (),  # type: ignore[assignment]
                slo: dict[str, float] | None = None) -> tuple[dict[str, Any], int]:
    bw = BundleWriter(tmp / "b", options={"slo": slo or {}},
                      workload={"warmup_requests": 2, "shared_prefix_fraction": 0.25})
    t0 = bw.anchor_mono_ns + 1_000_000_000
    fix = [{k: (t0 + v * MS if k.endswith("_ns") and v is not None else v) for k, v in r.items()} for r in requests]
    bw.stream("requests").write_many(fix)
    bw.stream("chunks").write_many([{"rid": c["rid"], "t_ns": [t0 + x * MS for x in c["t"]], "tok": c["tok"]}
                                    for c in chunks])
    if health:
        bw.stream("client_health").write_many([{**h, "t_ns": t0 + h["t"] * MS} for h in health])
    if phases:
        bw.stream("phases").write_many([{**p, "start_ns": t0 + p["start"] * MS, "end_ns": t0 + p["end"] * MS}
                                        for p in phases])
    bw.finish()
    return client.tables(open_bundle(tmp / "b")), t0


def sigs(tables: dict[str, Any], window: Window = WHOLE) -> dict[str, float]:
    return {s.name: s.value for s in client.signals(tables, window)}


BASIC_REQS = [
    req("w", 0, 200, first=100, warmup=True, n=5),
    req("r1", 0, 20, first=10, n=5, intended=-1),
    req("r2", 5, 60, first=30, n=5, intended=3),
    req("r3", 10, 11, ok=False, error="http_5xx", status=500, intended=7),
    req("r4", 12, 100, ok=False, error="incomplete", status=None, intended=8),
    req("r5", 15, 16, ok=False, error="http_429", status=429, intended=10),
]
BASIC_CHUNKS = [{"rid": "w", "t": [100, 150], "tok": [1, 4]},
                {"rid": "r1", "t": [10, 12, 14, 16, 18], "tok": [1, 1, 1, 1, 1]},
                {"rid": "r2", "t": [30, 40, 60], "tok": [1, 2, 2]}]


def test_latency_definitions(tmp_path: Path) -> None:
    tables, _ = make_bundle(tmp_path, BASIC_REQS, BASIC_CHUNKS)
    r = tables["requests"].set_index("rid")
    assert r.loc["r1", "ttft_ms"] == pytest.approx(10) and r.loc["r1", "e2e_ms"] == pytest.approx(20)
    assert r.loc["r1", "tpot_ms"] == pytest.approx(2.5)  # (20 - 10) / (5 - 1)
    assert r.loc["r2", "tpot_ms"] == pytest.approx(7.5)  # (55 - 25) / 4 and r.loc["r2", "itl_mean_ms"] == pytest.approx(15)
    s = sigs(tables)
    assert r.loc["r2", "ttft_ms"] == pytest.approx(25) and r.loc["r2", "e2e_ms"] == pytest.approx(55)
    assert s["ttft_p50_ms"] == pytest.approx(17.5) and s["ttft_max_ms"] == pytest.approx(25)
    assert s["itl_p50_ms"] == pytest.approx(2) and s["itl_max_ms"] == pytest.approx(20)  # pooled [2,2,2,2,10,20]
    assert s["itl_req_mean_p50_ms"] == pytest.approx(8.5)
    assert s["tpot_p50_ms"] == pytest.approx(5) and "tpot_max_ms" not in s
    assert s["e2e_p50_ms"] == pytest.approx(37.5) and s["e2e_max_ms"] == pytest.approx(55)


def test_throughput_errors_and_counts(tmp_path: Path) -> None:
    tables, _ = make_bundle(tmp_path, BASIC_REQS, BASIC_CHUNKS)
    s = sigs(tables)
    assert s["requests_total"] == 5 and s["requests_measured"] == 2  # warm-up never counted
    assert s["error_rate_ratio"] == pytest.approx(2 / 4)  # incomplete is neither ok nor failed
    assert s["http_429_ratio"] == pytest.approx(1 / 4)
    assert s["output_tps"] == pytest.approx(10 / 0.1)  # span: first send 0 ms .. last end 100 ms
    assert s["request_rps"] == pytest.approx(2 / 0.1)
    assert s["output_tps_per_req_p50"] == pytest.approx((5 / 0.020 + 5 / 0.055) / 2)
    assert s["prompt_tokens_mean"] == 32 and s["output_tokens_mean"] == 5
    assert s["client_schedule_lag_p99_ms"] == pytest.approx(4.96)  # lags 1..5 ms, linear interpolation
    assert "goodput_ratio" not in s and not any(k.startswith("slo_") for k in s)
    assert s["warmup_requests"] == 2 and s["workload_shared_prefix_ratio"] == 0.25  # from the workload spec


def test_goodput_under_slo(tmp_path: Path) -> None:
    tables, _ = make_bundle(tmp_path, BASIC_REQS, BASIC_CHUNKS, slo={"ttft_p99_ms": 20.0, "itl_p99_ms": 15.0})
    s = sigs(tables)
    assert s["slo_ttft_p99_ms"] == 20 and s["slo_itl_p99_ms"] == 15
    assert s["goodput_ratio"] == pytest.approx(1 / 4)  # only r1 meets both; failed requests never do
    assert s["goodput_rps"] == pytest.approx(1 / 0.1)
    tables2, _ = make_bundle(tmp_path / "x", BASIC_REQS, BASIC_CHUNKS, slo={"ttft_max_ms": 50.0, "itl_p50_ms": 12.0})
    assert sigs(tables2)["goodput_ratio"] == pytest.approx(1 / 4)  # r2's own gap P50 is 15 ms > 12


def test_multi_token_chunks_and_usage_fallback(tmp_path: Path) -> None:
    reqs = [req("a", 0, 50, first=10, n=None), req("b", 0, 50, first=10, n=9)]
    reqs[0]["output_tokens_chunks"] = 6
    chunks = [{"rid": "a", "t": [10, 30, 50], "tok": [1, 2, 3]}, {"rid": "b", "t": [10, 50], "tok": [1, 8]}]
    tables, _ = make_bundle(tmp_path, reqs, chunks)
    r = tables["requests"].set_index("rid")
    assert r.loc["a", "output_tokens"] == 6 and r.loc["b", "output_tokens"] == 9  # usage wins when reported
    assert r.loc["a", "tpot_ms"] == pytest.approx(40 / 5) and r.loc["b", "tpot_ms"] == pytest.approx(40 / 8)
    assert list(tables["itl"]["tok"]) == [2, 3, 8]


def _client_bound(tables: dict[str, Any], **overrides: float) -> bool:
    """Whether rule VAL001 judges the client a bottleneck, with the thresholds of rules/thresholds.yaml."""
    sigs = {s.name: s for s in client.signals(tables, WHOLE)}
    val = [s for s in load_rules() if s.id == "VAL001"]
    res = evaluate(val, sigs, load_thresholds(overrides=overrides))
    return any(f.rule_id == "VAL001" for f in res.findings)


def test_self_check_client_bound_criterion(tmp_path: Path) -> None:
    calm = [{"t": i * 100, "loop_lag_ms": 0.3, "in_flight": 4, "cpu_percent": 40.0} for i in range(20)]
    tables, _ = make_bundle(tmp_path / "a", BASIC_REQS, BASIC_CHUNKS, health=calm)
    s = sigs(tables)
    assert not _client_bound(tables) and s["client_cpu_max_percent"] == 40
    assert s["client_loop_lag_p99_ms"] == pytest.approx(0.3)
    assert "client_bound_ratio" not in s  # the normaliser computes raw figures; rule VAL001 judges them
    hot = [{**h, "cpu_percent": 97.0 if i % 3 == 0 else 50.0} for i, h in enumerate(calm)]  # 35% of samples
    tables, _ = make_bundle(tmp_path / "b", BASIC_REQS, BASIC_CHUNKS, health=hot)
    cpu = {s.name: s for s in client.signals(tables, WHOLE)}["client_cpu_max_percent"]
    assert [v for _, v in cpu.series] == [h["cpu_percent"] for h in hot]  # every sample, for the rule's hold
    assert _client_bound(tables)
    # the gates are thresholds (rules/thresholds.yaml), so --threshold moves them
    assert not _client_bound(tables, client_cpu_bound_share=0.4)
    assert not _client_bound(tables, client_cpu_bound_percent=98)
    laggy = [{**h, "loop_lag_ms": 25.0} for h in calm]
    tables, _ = make_bundle(tmp_path / "c", BASIC_REQS, BASIC_CHUNKS, health=laggy)
    assert _client_bound(tables)
    assert not _client_bound(tables, client_loop_lag_max_ms=30)
    section = {x.id: x for x in client_sections(tables)}["client_self_check"]
    assert ("event-loop lag P99", Quantity(25.0, "ms", 2), "ms") in section.payload.rows
    assert "VAL001" in str(section.payload.note) and "client_cpu_bound_percent" in str(section.payload.note)


def test_sweep_signals_and_phase_windows(tmp_path: Path) -> None:
    reqs, chunks = [], []
    for ph, ttft, n_req in ((0, 10, 4), (1, 40, 4)):
        for i in range(n_req):
            sent = ph * 1000 + i * 100
            reqs.append({**req(f"p{ph}-{i}", sent, sent + ttft + 20, first=sent + ttft, n=3, phase=ph)})
            chunks.append({"rid": f"p{ph}-{i}", "t": [sent + ttft, sent + ttft + 10, sent + ttft + 20], "tok": [1, 1, 1]})
    phases = [{"phase": 0, "name": "c=1", "concurrency": 1, "start": 0, "end": 900},
              {"phase": 1, "name": "c=4", "concurrency": 4, "start": 1000, "end": 1900}]
    tables, _ = make_bundle(tmp_path, reqs, chunks, phases=phases)
    s = sigs(tables)
    assert s["sweep_levels"] == 2 and s["sweep_load_growth_ratio"] == 4
    assert s["sweep_ttft_p50_growth_ratio"] == pytest.approx(4)
    assert s["sweep_itl_p50_growth_ratio"] == pytest.approx(1)
    p1 = sigs(tables, Window(1.0, 1.9, 1, "c=4"))
    assert p1["ttft_p50_ms"] == pytest.approx(40) and p1["requests_measured"] == 4 and "sweep_levels" not in p1
    # the per-level figures are shown once, by the view's "By load level" table (not a second client section)
    assert "client_sweep" not in {x.id for x in client_sections(tables)}


def test_truncated_stream_and_missing_streams(tmp_path: Path) -> None:
    make_bundle(tmp_path, BASIC_REQS, BASIC_CHUNKS)
    with open(tmp_path / "b" / "requests.jsonl", "ab") as fh:
        fh.write(b'{"rid": "cut", "sent_ns": 12')  # a capture killed mid-write
    b = open_bundle(tmp_path / "b")
    tables = client.tables(b)
    assert len(tables["requests"]) == len(BASIC_REQS)
    assert any("unreadable" in w for w in b.warnings)
    assert sigs(tables)["requests_measured"] == 2
    empty = BundleWriter(tmp_path / "e")
    empty.finish()
    assert client.tables(open_bundle(tmp_path / "e")) == {}
    assert client.signals({}, WHOLE) == []


def test_ttft_cold_ratio_compares_within_the_first_phase(tmp_path: Path) -> None:
    reqs, chunks = [], []
    for i, ttft in enumerate([100, 90, 80, 10, 12, 10]):  # phase 0: three cold, three warm
        reqs.append(req(f"a{i}", i * 200, i * 200 + ttft + 5, first=i * 200 + ttft, n=2, warmup=i == 0))
        chunks.append({"rid": f"a{i}", "t": [i * 200 + ttft, i * 200 + ttft + 5], "tok": [1, 1]})
    for i in range(6):  # phase 1 at a higher load: slower, but not cold
        sent = 2000 + i * 10
        reqs.append(req(f"b{i}", sent, sent + 300, first=sent + 290, n=2, phase=1))
        chunks.append({"rid": f"b{i}", "t": [sent + 290, sent + 300], "tok": [1, 1]})
    tables, _ = make_bundle(tmp_path, reqs, chunks)
    assert sigs(tables)["ttft_cold_ratio"] == pytest.approx(90 / 10)
    tables2, _ = make_bundle(tmp_path / "x", reqs[3:], chunks[3:])  # too few in the first phase: absent
    assert "ttft_cold_ratio" not in sigs(tables2)
