"""The measurements behind issue 10's failure classes that are not a rule's own (its cases are in
tests/rules/cases, each named "failure class N"): like-with-like load ratios (2), the arrival process (3), the
engine's time-weighted queue and batch (the gauges' artefact) and the cross-layer in-flight check (8)."""

from __future__ import annotations

from pathlib import Path

import pytest

from diagnose.model import Phase, Signal
from diagnose.normalize import derived
from diagnose.pipeline import analyze

SAMPLES = Path(__file__).parent.parent / "sample_traces"


def _s(name: str, v: float) -> Signal:
    return Signal(name, v, "", "client")


def test_class_2_an_open_loop_is_compared_with_a_concurrency_baseline_by_requests_in_flight() -> None:
    base = Phase(0, "baseline c=1", "baseline", 0.0, 10.0, mode="concurrency", concurrency=1)
    top = Phase(1, "rate=23/s", "measure", 10.0, 40.0, mode="rate", rate=23)
    per = {0: {"client_in_flight_mean": _s("client_in_flight_mean", 1.0), "ttft_p50_ms": _s("ttft_p50_ms", 50)},
           1: {"client_in_flight_mean": _s("client_in_flight_mean", 6.5), "ttft_p50_ms": _s("ttft_p50_ms", 610)}}
    out = derived.signals({}, [base, top], per, {})
    # today's code said "23x load" (23 req/s over concurrency 1)
    assert out["load_vs_baseline_ratio"].value == pytest.approx(6.5)
    assert "requests in flight" in out["load_vs_baseline_ratio"].description
    # concurrency against concurrency stays the offered ratio
    c16 = Phase(1, "c=16", "measure", 10.0, 40.0, mode="concurrency", concurrency=16)
    assert derived.signals({}, [base, c16], per, {})["load_vs_baseline_ratio"].value == pytest.approx(16)


def test_class_3_the_arrival_process_is_measured_and_a_closed_loop_has_none() -> None:
    bursty = analyze(SAMPLES / "vllm_cpu_bursty").signals
    assert bursty["workload_open_loop"].value == 1
    assert 2.5 < bursty["arrival_gap_cv_ratio"].value < 4.0  # gamma, burstiness 0.1: 1/sqrt(0.1) = 3.16
    healthy = analyze(SAMPLES / "vllm_cpu_healthy").signals
    assert healthy["workload_open_loop"].value == 0 and "arrival_gap_cv_ratio" not in healthy


def test_class_8_in_flight_requests_split_by_layer_add_up() -> None:
    """The healthy sample (closed loop, concurrency 2, no queue): the client's 2 in flight are the engine's
    running batch plus a small remainder in the API server; the queue-bound sample: most wait in the engine."""
    s = analyze(SAMPLES / "vllm_cpu_healthy").signals
    client, waiting, running = (s[n].value for n in ("client_in_flight_mean", "queue_depth_mean",
                                                     "running_requests_mean"))
    assert client == pytest.approx(2.0, abs=0.1)
    assert s["api_server_in_flight_mean"].value == pytest.approx(max(0.0, client - waiting - running))
    assert 0 <= s["api_server_in_flight_share_ratio"].value < 0.15
    q = analyze(SAMPLES / "vllm_cpu_queue_bound").signals
    assert q["queue_depth_mean"].value > 0.5 * q["client_in_flight_mean"].value
    assert q["running_requests_mean"].value <= 2.0 + 1e-9  # --max-num-seqs 2, time-weighted
    assert "Little's law" in q["running_requests_mean"].description
