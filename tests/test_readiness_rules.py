"""The readiness card judges through the rules engine (issue 37): each failing check names the rule that fired,
its summary is that rule's title and its fix the rule's experiment; a threshold moves the rule, not card code;
the readiness rules never judge a capture. The card's sentences for each case are in tests/test_readiness.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from diagnose.readiness import card
from diagnose.readiness import signals as rsig
from diagnose.rules.spec import load_rules
from tests.cli_inproc import diagnose

THR = {card.RELEASE: 5.0, card.COLD_RATIO: 3.0, card.OVER_WAIT: 2.0, card.RECOVERY: 10.0, card.RECOVERED_RATIO: 3.0,
       card.RESTART: 300.0, card.HEALTH_GAP: 5.0, card.AMPLIFICATION: 3.0}
ROOT = Path(__file__).resolve().parent.parent
OK_CANCEL = {"streams": 8, "aborted": 4, "kept": 4, "before": {"in_flight": 0}, "release_s": 0.2, "idle_s": 0.1,
             "kept_ok": 4, "kept_failed": [], "source": "slots"}
STEP = {"factor": 2.0, "rate_rps": 10.0, "done_rps": 5.0, "sent": 40, "planned": 40, "ok": 40, "rejected": 0,
        "rejected_with_retry_after": 0, "errors": 0, "client_capped": 0, "open_capped": 0, "ttft_p50_ms": 100.0,
        "ttft_p99_ms": 200.0, "e2e_p50_ms": 300.0}
ONE_X = STEP | {"factor": 1.0, "rate_rps": 5.0, "done_rps": 5.0}
OVER = {"capacity_rps": 5.0, "max_in_flight": 64, "recovery_s": 1.0, "steps": [ONE_X, STEP]}
FAIL = {"in_flight_at_crash": 3, "recovery_s": 40.0, "health_gap_s": 0.5, "retry_amplification": 0.8}


def _judged(c: dict[str, Any]) -> tuple[str, str | None]:
    return c["status"], c.get("rule")


@pytest.mark.parametrize(("m", "want"), [
    (OK_CANCEL, ("pass", None)),
    (OK_CANCEL | {"idle_s": None, "leaked": 2, "leaked_state": {"in_flight": 2, "busy_slots": [0, 3]}},
     ("fail", "RDY011")),
    (OK_CANCEL | {"release_s": None, "leaked_during": {"in_flight": 5, "running": 5.0, "waiting": 0.0}},
     ("fail", "RDY012")),
    (OK_CANCEL | {"release_s": 6.0}, ("fail", "RDY013")),
    (OK_CANCEL | {"idle_s": 7.0}, ("fail", "RDY014")),
    (OK_CANCEL | {"kept_failed": ["reset: connection reset"]}, ("fail", "RDY015")),
    (OK_CANCEL | {"idle_s": None, "stale_gauge": {"in_flight": 2}}, ("pass", "RDY016")),
])
def test_each_cancellation_outcome_is_a_rule(m: dict[str, Any], want: tuple[str, str | None]) -> None:
    c = card.cancellation(m, THR)
    assert _judged(c) == want, c
    if want[1]:
        assert c["fix"] == card.fix(want[1]) and c["fix"]


def test_the_failing_rule_writes_the_sentence_with_the_runs_numbers() -> None:
    c = card.cancellation(OK_CANCEL | {"idle_s": None, "leaked": 2, "leaked_state": {"in_flight": 2,
                                                                                     "busy_slots": [0, 3]}}, THR)
    assert c["summary"].startswith("leaked work: 2 request(s) still in flight on the engine 5 s after the last "
                                   "kept stream ended (slots 0, 3 still busy; 0 in flight before the check)"), c
    vllm = card.cancellation(OK_CANCEL | {"idle_s": None, "leaked": 3, "leaked_state": {
        "in_flight": 3, "running": 3.0, "waiting": 0.0, "kv_usage": 0.125}}, THR)
    assert "(running 3, waiting 0, KV cache 12.5%; 0 in flight before the check)" in vllm["summary"], vllm
    unknown = card.cancellation(OK_CANCEL | {"idle_s": None}, THR)  # nothing read at the end: said so
    assert unknown["summary"].startswith("leaked work: some request(s)") and "in-flight state not read" in \
        unknown["summary"], unknown


def test_a_threshold_moves_the_rule_not_the_card() -> None:
    m = {"first_vs_warm_ratio": 2.5, "first_ttft_ms": 50.0, "warm_ttft_p50_ms": 20.0}
    assert _judged(card.cold_start(m, THR, {})) == ("pass", None)
    tight = card.cold_start(m, THR | {card.COLD_RATIO: 2.0}, {})
    assert _judged(tight) == ("fail", "RDY022") and "2.5x the warm TTFT (at most 2x)" in tight["summary"]
    assert _judged(card.cold_start(m, THR, {"ttft_p99_ms": 40.0})) == ("fail", "RDY023")
    assert _judged(card.cold_start(m | {"first_request_failed": "http_503"}, THR, {})) == ("fail", "RDY021")


@pytest.mark.parametrize(("m", "want"), [
    (OVER, ("pass", None)),
    (OVER | {"steps": [ONE_X, STEP | {"errors": 3, "error_examples": ["timeout"]}]}, ("fail", "RDY031")),
    (OVER | {"steps": [ONE_X, STEP | {"ttft_p99_ms": 5000.0}]}, ("fail", "RDY032")),
    (OVER | {"steps": [ONE_X, STEP | {"ttft_p99_ms": 5000.0, "rejected": 4}]}, ("fail", "RDY033")),
    (OVER | {"steps": [ONE_X, STEP | {"open_capped": 9, "client_capped": 9}]}, ("fail", "RDY034")),
    (OVER | {"recovery_s": 30.0}, ("fail", "RDY035")),
    (OVER | {"recovery_s": None}, ("fail", "RDY035")),
    (OVER | {"steps": [ONE_X, STEP | {"rejected": 4, "rejected_with_retry_after": 1}]}, ("pass", "RDY036")),
    # the premise of the check, decided by the card: the top step kept up, so nothing was judged
    (OVER | {"recovery_s": 30.0, "steps": [ONE_X, STEP | {"done_rps": 10.0}]}, ("not run", None)),
])
def test_each_overload_outcome_is_a_rule(m: dict[str, Any], want: tuple[str, str | None]) -> None:
    c = card.overload(m, THR, {})
    assert _judged(c) == want, c
    if want[1]:
        assert c["fix"] == card.fix(want[1]) and c["fix"]


@pytest.mark.parametrize(("m", "want"), [
    (FAIL, ("pass", None)),
    (FAIL | {"restart_failed": "exited with status 1", "recovery_s": None}, ("fail", "RDY041")),
    (FAIL | {"recovery_s": None}, ("fail", "RDY041")),
    (FAIL | {"recovery_s": 400.0}, ("fail", "RDY042")),
    (FAIL | {"health_gap_s": 12.0}, ("fail", "RDY043")),
    (FAIL | {"retry_amplification": 7.5}, ("fail", "RDY044")),
    (FAIL | {"recovery_s": 400.0, "retry_amplification": 7.5}, ("fail", "RDY042")),  # one finding a check
])
def test_each_failure_outcome_is_a_rule(m: dict[str, Any], want: tuple[str, str | None]) -> None:
    assert _judged(card.failure(m, THR)) == want


def test_every_readiness_rule_judges_one_check_of_the_card() -> None:
    specs = [s for s in load_rules() if s.family == "readiness"]
    assert len(specs) == 19
    checks = {card.check_of(s) for s in specs}
    assert checks == {"RDY001", "RDY002", "RDY003", "RDY004"}
    assert {s.id for s in card.rules()} == {s.id for s in specs}
    # the signals they read are the readiness producer's alone
    from diagnose.signals.catalog import CATALOG

    read = {n for s in specs for n in s.all_signals}
    assert read and all(CATALOG[n].producer == rsig.__name__ for n in read), sorted(
        n for n in read if CATALOG[n].producer != rsig.__name__)


def test_a_capture_is_never_judged_by_the_readiness_rules(tmp_path: Path) -> None:
    import json

    out = tmp_path / "a.json"
    r = diagnose("analyze", str(ROOT / "sample_traces" / "vllm_cpu_queue_bound" / "bundle"), "-o",
                 str(tmp_path / "r.html"), "--json", str(out))
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    assert doc["findings"] and doc["not_evaluated"], sorted(doc)
    ids = [f["rule_id"] for f in doc["findings"]] + [n["rule_id"] for n in doc["not_evaluated"]]
    assert not [i for i in ids if i.startswith("RDY")], ids


def test_a_rule_text_formats_numbers_as_the_pages_do() -> None:
    from diagnose.model import Signal
    from diagnose.rules.engine import render_text

    sigs = {n: Signal(n, v, "ms", "client") for n, v in (("a", 1047.3), ("b", 0.4729), ("c", 17.5))}
    assert render_text("{a:v} / {b:v} / {c:v} / {a:.0f}", sigs, {}) == "1,047 / 0.47 / 17.5 / 1047"


@pytest.mark.parametrize(("asked", "summary"), [
    (("cancellation",), card.NOT_ASKED),
    (("cancellation", "cold-start"), "needs --launch COMMAND (diagnose times a server it starts itself)"),
])
def test_judged_again_the_card_knows_what_was_asked_from_the_document(tmp_path: Path, asked: tuple[str, ...],
                                                                      summary: str) -> None:
    from diagnose.readiness.run import rejudge, write

    target = {"model": "tiny", "engine": "vllm", "in_flight_source": "vllm_metrics"}
    doc = card.document("http://127.0.0.1:1", None, {}, THR, OK_CANCEL, None, target, asked=asked)
    assert doc["asked"] == sorted(asked)
    write(tmp_path / "first", doc)
    again = rejudge(tmp_path / "first", tmp_path / "again", {}, None, False)
    assert again["asked"] == sorted(asked)
    cold = next(c for c in again["checks"] if c["id"] == "RDY002")
    assert (cold["status"], cold["summary"]) == ("not run", summary)
