"""Where the time went, where no single source says it alone (diagnose/normalize/attribution.py): the decode
time split into steady steps, stalls and preemption, and the slow requests' TTFT split from the server's
histograms; both in the report's "Where the time went"."""

from __future__ import annotations

import functools
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from diagnose.analysis import Analysis
from diagnose.model import Window
from diagnose.normalize import attribution
from diagnose.normalize.client import REQUEST_COLUMNS
from diagnose.pipeline import analyze
from diagnose.reports.view_model import build_view

SAMPLES = Path(__file__).resolve().parent.parent / "sample_traces"
ALL = Window(-math.inf, math.inf)


def _tables(gaps_by_rid: dict[int, list[float]]) -> dict[str, pd.DataFrame]:
    rows = [{c: None for c in REQUEST_COLUMNS} | {"rid": rid, "phase": 1, "warmup": False, "ok": True, "error": None,
                                                  "sent_s": float(rid), "end_s": float(rid) + 1.0, "profiled": False}
            for rid in gaps_by_rid]
    itl = pd.DataFrame([{"rid": rid, "phase": 1, "t_s": float(rid), "itl_ms": g, "tok": 1.0}
                        for rid, gaps in gaps_by_rid.items() for g in gaps])
    return {"requests": pd.DataFrame(rows, columns=REQUEST_COLUMNS), "itl": itl}


def _named(sigs: list) -> dict[str, float]:  # type: ignore[type-arg]
    return {s.name: s.value for s in sigs}


def test_decode_time_split_steady_stalls_and_preemption(monkeypatch: pytest.MonkeyPatch) -> None:
    """Gaps of 10 ms, two stalls of 50 ms (40 ms past the 20 ms line) and one of 1010 ms: with one preemption
    counted, the longest gap's excess is preemption's and the two 50 ms ones are stalls; shares add up to 1."""
    gaps = {1: [10.0] * 40 + [50.0, 50.0], 2: [10.0] * 40 + [1010.0]}
    monkeypatch.setattr(attribution, "counter_increase", lambda tables, sig, window: 1.0)
    s = _named(attribution.decode_time_split(_tables(gaps), ALL))
    total = 800.0 + 100.0 + 1010.0
    assert s["decode_time_preemption_ratio"] == pytest.approx(990.0 / total)
    assert s["decode_time_stall_ratio"] == pytest.approx(60.0 / total)
    assert sum(s.values()) == pytest.approx(1.0)


def test_without_preemptions_every_stall_is_a_stall(monkeypatch: pytest.MonkeyPatch) -> None:
    gaps = {1: [10.0] * 40 + [50.0, 1010.0]}
    monkeypatch.setattr(attribution, "counter_increase", lambda tables, sig, window: 0.0)
    s = _named(attribution.decode_time_split(_tables(gaps), ALL))
    assert s["decode_time_preemption_ratio"] == 0.0
    assert s["decode_time_stall_ratio"] == pytest.approx((30.0 + 990.0) / 1460.0)
    # an engine that counts no preemptions (llama.cpp): no preemption figure at all, not a zero
    monkeypatch.setattr(attribution, "counter_increase", lambda tables, sig, window: None)
    s = _named(attribution.decode_time_split(_tables(gaps), ALL))
    assert "decode_time_preemption_ratio" not in s and sum(s.values()) == pytest.approx(1.0)


def test_no_gaps_no_split() -> None:
    assert attribution.decode_time_split({"requests": pd.DataFrame(columns=REQUEST_COLUMNS)}, ALL) == []


@functools.cache
def _sample(name: str) -> Analysis:
    return analyze(SAMPLES / name)


def _rows(a: Analysis) -> dict[str, dict[str, float]]:
    v = build_view(a)["verdict"]
    return {r["label"]: {p["signal"]: p["value"] for p in r["parts"]} for r in v.get("attribution") or []}


def test_kv_pressure_sample_puts_a_third_of_the_decode_time_in_preemption() -> None:
    """The KV-pressure capture (96 preemptions): the preempted requests' long gaps are preemption's, and the
    report's decode-time row adds up to 1."""
    a = _sample("vllm_cpu_kv_pressure")
    assert a.signals["preemptions_total"].value > 50
    row = _rows(a)["decode time, all token gaps"]
    assert row["decode_time_preemption_ratio"] > 0.2 > row["decode_time_stall_ratio"]
    assert sum(row.values()) == pytest.approx(1.0, abs=1e-6)


def test_queue_bound_sample_slow_requests_waited_in_the_queue_by_the_histograms() -> None:
    """No spans in the queue-bound capture: the slow requests' TTFT split comes from the server's histograms,
    mostly queue, with the range the buckets allow named in its description."""
    a = _sample("vllm_cpu_queue_bound")
    assert "ttft_tail_queue_share_ratio" not in a.signals
    row = _rows(a)["TTFT of the slow requests, server histograms"]
    assert row["server_ttft_tail_queue_ratio"] > 0.8
    assert sum(row.values()) == pytest.approx(1.0, abs=1e-6)
    assert "range" in a.signals["server_ttft_tail_queue_ratio"].description


def test_the_histogram_tail_row_gives_way_to_joined_spans() -> None:
    """With joined spans the slow requests' split is theirs (per request), not the histograms' estimate."""
    from diagnose.model import Signal
    from diagnose.reports.view_model import _attribution

    sigs = {n: Signal(n, v, "ratio", "server") for n, v in (
        ("ttft_tail_queue_share_ratio", 0.5), ("ttft_tail_prefill_share_ratio", 0.3),
        ("ttft_tail_frontend_share_ratio", 0.1), ("ttft_tail_client_network_share_ratio", 0.1),
        ("server_ttft_tail_queue_ratio", 0.6), ("server_ttft_tail_prefill_ratio", 0.3),
        ("server_ttft_tail_outside_ratio", 0.1))}
    labels = [r["label"] for r in _attribution(sigs)]
    assert labels == ["TTFT of the slow requests, joined spans"]
    del sigs["ttft_tail_queue_share_ratio"], sigs["ttft_tail_prefill_share_ratio"]
    assert [r["label"] for r in _attribution(sigs)] == ["TTFT of the slow requests, server histograms"]


def test_llama_sample_has_a_decode_split_without_preemption() -> None:
    a = _sample("llama_slots_saturated")
    row = _rows(a)["decode time, all token gaps"]
    assert set(row) == {"decode_time_steady_ratio", "decode_time_stall_ratio"}
    assert np.isclose(sum(row.values()), 1.0)
