"""The workload charts of the report (issue 16, item 6): length distributions and arrivals over time, from the
client's requests or, for an observe-mode bundle, the server's histograms and counter."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from diagnose.pipeline import analyze
from diagnose.reports.render import render_html
from diagnose.reports.workload_charts import arrivals, lengths
from diagnose.requests import select
from tests.test_observed import _known, write_observe_bundle

SAMPLES = Path(__file__).resolve().parent.parent / "sample_traces"


def test_lengths_and_arrivals_of_an_open_loop_run() -> None:
    a = analyze(SAMPLES / "vllm_cpu_bursty")
    inp = lengths(a, "input")
    assert inp["kind"] == "histogram" and inp["markers"] == []
    ok = select(a.tables["requests"], a.run_window).ok  # type: ignore[arg-type]
    assert sum(b[2] for b in inp["bins"]) == len(ok) == inp["n"]
    out = lengths(a, "output")
    assert sum(b[2] for b in out["bins"]) == len(ok)
    arr = arrivals(a)
    assert arr["kind"] == "line_chart" and [s["name"] for s in arr["series"]] == ["scheduled", "sent"]
    counted = select(a.tables["requests"], a.run_window).counted  # type: ignore[arg-type]
    width = float(arr["title"].split("per second, ")[1].split(" s bins")[0])
    sent = sum(p[1] for p in arr["series"][1]["points"]) * width
    assert sent == pytest.approx(len(counted))
    # a replay's fidelity: the scheduled and sent curves agree where the client kept its schedule
    sched = np.array([p[1] for p in arr["series"][0]["points"]])
    assert abs(sched.sum() - np.array([p[1] for p in arr["series"][1]["points"]]).sum()) * width <= 1


def test_a_closed_loop_has_no_schedule_to_compare() -> None:
    a = analyze(SAMPLES / "vllm_cpu_healthy")
    assert [s["name"] for s in arrivals(a)["series"]] == ["sent"]


def test_the_charts_of_an_observe_bundle_come_from_the_server(tmp_path: Path) -> None:
    write_observe_bundle(tmp_path / "obs", _known())
    a = analyze(tmp_path / "obs")
    inp = lengths(a, "input")
    assert "the server's histogram buckets" in inp["title"] and inp["n"] == 120
    assert [b[:2] for b in inp["bins"]] == [[50.0, 100.0], [100.0, 200.0], [200.0, 500.0]]
    arr = arrivals(a)
    assert "finished per second" in arr["title"]
    rates = [p[1] for p in arr["series"][0]["points"]]
    assert np.median(rates) == pytest.approx(4.0)  # two requests every 0.5 s scrape
    html = render_html(a)
    for text in ("Input lengths (n=120", "Output lengths (n=120", "requests finished per second"):
        assert text in html


def test_no_rows_and_no_histograms_says_why(tmp_path: Path) -> None:
    write_observe_bundle(tmp_path / "obs", _known(20), lengths=False)
    a = analyze(tmp_path / "obs")
    assert lengths(a, "input") == {"kind": "unavailable", "title": "Input lengths",
                                   "reason": "no request rows and no server length histogram"}


def test_an_observe_bundle_with_the_engines_spans_charts_their_lengths(tmp_path: Path) -> None:
    reqs = _known()
    write_observe_bundle(tmp_path / "obs", reqs, spans=len(reqs))
    inp = lengths(analyze(tmp_path / "obs"), "input")
    assert "the engine's request spans" in inp["title"] and inp["n"] == 120
    assert sum(b[2] for b in inp["bins"]) == 120 and inp["bins"][0][0] == min(r[1] for r in reqs)


def test_spans_of_too_few_requests_leave_the_charts_on_the_server_histograms(tmp_path: Path) -> None:
    """The charts take the same source as the workload card: half the requests' spans do not stand for the
    traffic (observed.traffic_spans), so the buckets are the server's."""
    write_observe_bundle(tmp_path / "obs", _known(), spans=60)
    inp = lengths(analyze(tmp_path / "obs"), "input")
    assert "the server's histogram buckets" in inp["title"] and inp["n"] == 120
